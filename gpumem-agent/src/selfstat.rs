//! What the agent costs now (CPU time, resident memory), read from the
//! kernel for its status (gpumem_engine::model::agent).
use gpumem_engine::model::agent::{AgentStatus, Usage};

/// What the agent costs now.
pub fn usage() -> Usage {
    let (heap_in_use_bytes, heap_free_bytes) = heap();
    Usage {
        cpu_seconds: cpu_seconds(),
        resident_bytes: resident_bytes(),
        bpf_map_resident_bytes: bpf_map_resident_bytes(),
        heap_in_use_bytes,
        heap_free_bytes,
    }
}

/// The allocator's bytes in use and the free bytes it keeps (glibc 2.33+'s
/// mallinfo2, within the 2.34 floor), over all arenas.
pub fn heap() -> (u64, u64) {
    // SAFETY: mallinfo2 takes no argument and returns plain counters.
    let m = unsafe { libc::mallinfo2() };
    ((m.uordblks + m.hblkhd) as u64, m.fordblks as u64)
}

/// A status with nothing counted yet, naming this build.
pub fn status() -> AgentStatus {
    AgentStatus { revision: env!("GPUMEM_GIT_REVISION"), ..AgentStatus::default() }
}

/// CPU seconds this process has used, user plus system (getrusage).
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain old data; all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Resident bytes of this process now (/proc/self/statm); 0 if unreadable.
pub fn resident_bytes() -> u64 {
    gpumem_engine::procfs::own_resident_pages().map_or(0, |pages| pages * gpumem_engine::procfs::page_size())
}

/// Resident bytes of this process's mappings of BPF maps (/proc/self/smaps):
/// the event ring buffer mapped from the kernel, whose data pages appear twice
/// (the kernel maps them back to back so records can wrap). That is kernel
/// memory, fixed by the ring's size; the rest of the RSS is the agent's own.
pub fn bpf_map_resident_bytes() -> u64 {
    gpumem_engine::procfs::own_smaps_resident_kib("anon_inode:bpf-map") * 1024
}

/// Gives the allocator's free pages back to the kernel: glibc keeps what a
/// burst freed (decoding, symbolizing) in its arenas, so the agent's RSS
/// would stay at the burst's peak.
pub fn return_freed_memory() {
    // SAFETY: malloc_trim only walks glibc's own arenas; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bpf_map_share_is_part_of_the_resident_total() {
        // No BPF map is mapped by the test process: the share is 0, the total is not.
        assert_eq!(super::bpf_map_resident_bytes(), 0);
        assert!(super::resident_bytes() > 0);
    }

    #[test]
    fn the_heap_in_use_grows_with_what_is_allocated() {
        let before = super::heap().0;
        let held: Vec<u8> = vec![1; 8 << 20];
        assert!(super::heap().0 >= before + (8 << 20), "8 MiB held");
        drop(held);
    }
}
