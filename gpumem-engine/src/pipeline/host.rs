//! The host side of GPU memory trouble: the traced processes' resident and
//! swapped-out host memory, the node's swap traffic, and the memory cgroups
//! of their containers (usage against limit). When VRAM is full, frameworks
//! spill to pinned and managed host memory and the host swaps; read with
//! VRAM on one time axis, this tells a GPU leak from a host-side one.
//! Read from /proc and cgroupfs when refreshed (serve: every few seconds).

use std::time::{Duration, Instant};

use crate::{
    model::host::{CgroupGpuMemory, CgroupMemory, GpuNodeBytes, HostMemory, ProcessHost},
    procfs,
    state::State,
};

/// How often each process's numa_maps is read: the kernel walks the page
/// tables of every mapping for it, under the process's mmap lock, which a
/// process of hundreds of GiB pays in tens of milliseconds.
pub const GPU_NODE_READ_EVERY: Duration = Duration::from_secs(30);

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
    /// Reads every live traced process's, the node's and their cgroups';
    /// `gpu_nodes`: (GPU index, the NUMA node that is its memory).
    pub fn refresh(&mut self, state: &State, gpu_nodes: &[(u32, u32)]) {
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
        self.refresh_gpu_nodes(state, gpu_nodes);
        self.refreshed = true;
    }

    /// The live traced processes' pages on the GPUs' NUMA nodes: each new
    /// process's read at once, all again when `GPU_NODE_READ_EVERY` has
    /// passed (kept in between); never read where no GPU is a NUMA node.
    fn refresh_gpu_nodes(&mut self, state: &State, gpu_nodes: &[(u32, u32)]) {
        if gpu_nodes.is_empty() {
            self.gpu_node_bytes.clear();
            return;
        }
        let live = |pid: &u32| state.processes.get(pid).is_some_and(|p| !p.exited);
        self.gpu_node_bytes.retain(|pid, _| live(pid));
        if self.gpu_nodes_read_at.is_none_or(|at| at.elapsed() >= GPU_NODE_READ_EVERY) {
            self.gpu_nodes_read_at = Some(Instant::now());
            self.gpu_node_bytes.clear();
        }
        let nodes: Vec<u32> = gpu_nodes.iter().map(|&(_, node)| node).collect();
        let unread: Vec<u32> =
            state.processes.iter().map(|(&pid, _)| pid).filter(|pid| live(pid) && !self.gpu_node_bytes.contains_key(pid)).collect();
        for pid in unread {
            let Some((bytes, cut)) = procfs::numa_maps::read(pid, &nodes) else { continue };
            self.gpu_node_reads_cut += u64::from(cut);
            let per_gpu = gpu_nodes.iter().zip(bytes).map(|(&(gpu, node), bytes)| GpuNodeBytes { gpu, node, bytes });
            self.gpu_node_bytes.insert(pid, per_gpu.collect());
        }
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
