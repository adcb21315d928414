//! The agent's own status: what it has attached, what the kernel side
//! counted, what failed, and what it costs (CPU time, resident memory).
use std::collections::BTreeMap;

use crate::{events::KernelCounters, probes::discover::ScanStats};

/// What the agent costs now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub bpf_map_resident_bytes: u64,
}

impl Usage {
    pub fn now() -> Usage {
        Usage { cpu_seconds: cpu_seconds(), resident_bytes: resident_bytes(), bpf_map_resident_bytes: bpf_map_resident_bytes() }
    }
}

/// The agent as outputs report it (the summary, /metrics, top's title).
#[derive(Clone, Debug, Default)]
pub struct AgentStatus {
    pub probes_attached: usize,
    /// As last read from the kernel's maps.
    pub kernel: KernelCounters,
    /// Calls whose thread died inside the driver: their saved entries removed.
    pub stale_calls_removed: u64,
    /// Operations that failed and are retried later, by name (their figures
    /// stay at the last success).
    pub errors: BTreeMap<&'static str, u64>,
    /// Cost of the /proc scans for new libcuda copies.
    pub discovery: ScanStats,
    pub usage: Usage,
    /// `serve`'s pinned state and what it adopted (None: not kept).
    pub continuity: Option<crate::runtime::continuity::Report>,
    /// The kernel's table of live entries, as last counted.
    pub kernel_table: Option<crate::probes::live::KernelTable>,
}

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
    crate::procfs::own_resident_pages().map_or(0, |pages| pages * crate::procfs::page_size())
}

/// Resident bytes of this process's mappings of BPF maps (/proc/self/smaps):
/// the event ring buffer mapped from the kernel, whose data pages appear twice
/// (the kernel maps them back to back so records can wrap). That is kernel
/// memory, fixed by the ring's size; the rest of the RSS is the agent's own.
pub fn bpf_map_resident_bytes() -> u64 {
    crate::procfs::own_smaps_resident_kib("anon_inode:bpf-map") * 1024
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
