//! The host side of GPU memory trouble, as read: each traced process's
//! resident and swapped-out memory, the node's swap traffic, the memory
//! cgroups of their containers.
use std::collections::BTreeMap;

/// One process's host memory, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessHost {
    pub resident_bytes: u64,
    pub swap_bytes: u64,
}

/// A memory cgroup's usage and limit, bytes (None: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupMemory {
    pub usage_bytes: u64,
    pub limit_bytes: Option<u64>,
    /// A traced process in it (whose container and pod name it).
    pub pid: u32,
}

/// One device memory region of a cgroup's `dmem` controller, bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DmemRegion {
    /// As the kernel names it: `drm/<PCI bus id>/vram0`.
    pub region: String,
    pub usage_bytes: u64,
    /// dmem.max (None: `max`, no limit), dmem.low and dmem.min (protections).
    pub limit_bytes: Option<u64>,
    pub low_bytes: Option<u64>,
    pub min_bytes: Option<u64>,
}

/// A cgroup's GPU memory regions, and a traced process in it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupGpuMemory {
    pub regions: Vec<DmemRegion>,
    pub pid: u32,
}

/// A process's pages on one GPU's NUMA node (the GPU's own memory on
/// coherent platforms), bytes: memory it got from malloc or mmap that sits
/// in the GPU's memory with no driver call, which its per-process GPU
/// figures do not include.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuNodeBytes {
    pub gpu: u32,
    pub node: u32,
    pub bytes: u64,
}

/// What one refresh read (a recording's host frame holds one).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostMemory {
    /// Live traced processes, by pid.
    pub processes: BTreeMap<u32, ProcessHost>,
    /// Bytes swapped in and out since boot (None: no /proc/vmstat).
    pub swap_in_bytes: Option<u64>,
    pub swap_out_bytes: Option<u64>,
    /// The memory cgroups of traced processes' containers, by cgroup path.
    pub cgroups: BTreeMap<String, CgroupMemory>,
    /// The GPU memory (cgroup v2 `dmem`) of traced processes' cgroups, by
    /// cgroup path, where the kernel has the controller.
    #[serde(default)]
    pub gpu_cgroups: BTreeMap<String, CgroupGpuMemory>,
    /// Each live traced process's pages on the GPUs' NUMA nodes, by pid,
    /// where NVML names such nodes (read at most every
    /// `GPU_NODE_READ_EVERY`: the kernel walks the process's page tables).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_node_bytes: BTreeMap<u32, Vec<GpuNodeBytes>>,
    /// Reads of numa_maps cut at their bound (a process with more mappings
    /// than it holds): those processes' figures are lower bounds.
    #[serde(default)]
    pub gpu_node_reads_cut: u64,
    /// When numa_maps were last read (live only).
    #[serde(skip)]
    pub gpu_nodes_read_at: Option<std::time::Instant>,
    /// Whether it was ever refreshed (what outputs show before is nothing, not zeros).
    #[serde(skip)]
    pub refreshed: bool,
}
