//! The agent's own cost: CPU time and resident memory.

/// CPU seconds this process has used, user plus system (getrusage).
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Resident bytes of this process now (/proc/self/statm); 0 if unreadable.
pub fn resident_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |pages| pages * page)
}

/// Resident bytes of this process's mappings of BPF maps (/proc/self/smaps):
/// the event ring buffer mapped from the kernel, whose data pages appear twice
/// (the kernel maps them back to back so records can wrap). That is kernel
/// memory, fixed by the ring's size; the rest of the RSS is the agent's own.
pub fn bpf_map_resident_bytes() -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
    let mut in_bpf_map = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("Rss:") if in_bpf_map => kib += words.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
            // A mapping's header line starts with its address range.
            Some(first) if first.contains('-') && first.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') => {
                in_bpf_map = line.ends_with("anon_inode:bpf-map");
            }
            _ => {}
        }
    }
    kib * 1024
}

#[cfg(test)]
mod tests {
    #[test]
    fn bpf_map_share_is_part_of_the_resident_total() {
        // No BPF map is mapped by the test process: the share is 0, the total is not.
        assert_eq!(super::bpf_map_resident_bytes(), 0);
        assert!(super::resident_bytes() > 0);
    }
}
