//! The host side of GPU memory trouble: the traced processes' resident and
//! swapped-out host memory, the node's swap traffic, and the memory cgroups
//! of their containers (usage against limit). When VRAM is full, frameworks
//! spill to pinned and managed host memory and the host swaps; read with
//! VRAM on one time axis, this tells a GPU leak from a host-side one.
//! Read from /proc and cgroupfs when refreshed (serve: every few seconds).

use crate::{
    model::host::{CgroupGpuMemory, CgroupMemory, HostMemory, ProcessHost},
    procfs,
    state::State,
};

/// The usage file beside a memory cgroup's limit file (v1 and v2).
fn usage_file(limit_file: &str) -> String {
    match limit_file.strip_suffix("memory.limit_in_bytes") {
        Some(dir) => format!("{dir}memory.usage_in_bytes"),
        None => limit_file.strip_suffix("memory.max").map_or_else(String::new, |dir| format!("{dir}memory.current")),
    }
}

fn read_bytes(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A process's host memory now, from /proc/PID/status.
pub fn of_process(pid: u32) -> Option<ProcessHost> {
    let s = procfs::read_status(pid).ok()?;
    Some(ProcessHost { resident_bytes: s.resident_bytes?, swap_bytes: s.swap_bytes.unwrap_or(0) })
}

impl HostMemory {
    /// Reads every live traced process's, the node's and their cgroups'.
    pub fn refresh(&mut self, state: &State) {
        self.processes.clear();
        self.cgroups.clear();
        self.gpu_cgroups.clear();
        for (&pid, p) in state.processes.iter().filter(|(_, p)| !p.exited) {
            if let Some(h) = of_process(pid) {
                self.processes.insert(pid, h);
            }
            if let Some(path) = p.container.as_ref().and_then(|c| c.dmem_cgroup.as_ref()) {
                if !self.gpu_cgroups.contains_key(path) {
                    if let Some(regions) = super::dmem::regions(&format!("{}{path}", super::dmem::cgroup2_root())) {
                        self.gpu_cgroups.insert(path.clone(), CgroupGpuMemory { regions, pid });
                    }
                }
            }
            let Some((path, limit_file)) = p.container.as_ref().and_then(|c| c.memory_limit_file.as_ref()) else { continue };
            if self.cgroups.contains_key(path) {
                continue;
            }
            if let Some(usage) = read_bytes(&usage_file(limit_file)) {
                // Unlimited is v1's huge number or v2's "max".
                let limit = std::fs::read_to_string(limit_file)
                    .ok()
                    .filter(|l| crate::model::container::is_limited(l.trim()))
                    .and_then(|l| l.trim().parse().ok());
                self.cgroups.insert(path.clone(), CgroupMemory { usage_bytes: usage, limit_bytes: limit, pid });
            }
        }
        let swap = procfs::swap_bytes_since_boot();
        (self.swap_in_bytes, self.swap_out_bytes) = (swap.map(|s| s.0), swap.map(|s| s.1));
        self.refreshed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_files_sit_beside_the_limit_files() {
        assert_eq!(
            usage_file("/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes"),
            "/sys/fs/cgroup/memory/kubepods/pod1/memory.usage_in_bytes"
        );
        assert_eq!(usage_file("/sys/fs/cgroup/unified/kubepods/memory.max"), "/sys/fs/cgroup/unified/kubepods/memory.current");
    }

    #[test]
    fn this_process_has_resident_memory_as_proc_says() {
        let h = of_process(std::process::id()).unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let rss_kib: u64 =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
        assert!(h.resident_bytes > 0 && h.resident_bytes.abs_diff(rss_kib * 1024) < 16 << 20);
    }
}
