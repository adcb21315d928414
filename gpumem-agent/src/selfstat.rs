//! What the agent costs now (CPU time, resident memory), read from the
//! kernel for its status (gpumem_engine::model::agent).
use gpumem_engine::model::agent::{AgentStatus, BpfMapMemory, Usage};

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

/// The BPF maps this process holds open (each once, however many of its
/// descriptors refer to it) and the kernel memory each takes, largest first.
pub fn bpf_maps() -> Vec<BpfMapMemory> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let mut seen = std::collections::BTreeMap::new();
    for fd in fds.flatten() {
        let is_map = std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:bpf-map");
        let info =
            is_map.then(|| std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy())).ok()).flatten();
        let Some((id, bytes)) = info.as_deref().and_then(map_memory) else { continue };
        seen.entry(id).or_insert(bytes);
    }
    let mut maps: Vec<BpfMapMemory> = seen
        .into_iter()
        .map(|(id, bytes)| {
            let info = aya::maps::MapInfo::from_id(id).ok();
            let name =
                info.as_ref().and_then(|i| i.name_as_str()).filter(|n| !n.is_empty()).map_or_else(|| format!("id {id}"), str::to_string);
            BpfMapMemory { name, bytes }
        })
        .collect();
    maps.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    maps
}

/// A BPF map's id and kernel memory from its fdinfo (`map_id`, `memlock`).
fn map_memory(fdinfo: &str) -> Option<(u32, u64)> {
    let field = |name: &str| fdinfo.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim);
    Some((field("map_id")?.parse().ok()?, field("memlock")?.parse().ok()?))
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
        assert!(super::bpf_maps().is_empty(), "no map open");
        assert!(super::resident_bytes() > 0);
    }

    #[test]
    fn a_maps_id_and_kernel_memory_come_from_its_fdinfo() {
        // As this kernel writes it for a ring buffer.
        let fdinfo = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2072\nmap_type:\t27\nkey_size:\t0\nvalue_size:\t0\n\
                      max_entries:\t16777216\nmap_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t16855040\nmap_id:\t412\nfrozen:\t0\n";
        assert_eq!(super::map_memory(fdinfo), Some((412, 16855040)));
        assert_eq!(super::map_memory("memlock:\t12\n"), None, "no id");
        assert_eq!(super::map_memory("map_id:\tx\nmemlock:\t12\n"), None);
    }

    #[test]
    fn the_heap_in_use_grows_with_what_is_allocated() {
        // Counters are the process's: other tests' threads allocate and free
        // meanwhile, so 64 MiB is held and most of it must show.
        let before = super::heap().0;
        let held: Vec<u8> = vec![1; 64 << 20];
        assert!(super::heap().0 >= before + (48 << 20), "64 MiB held");
        drop(held);
    }
}
