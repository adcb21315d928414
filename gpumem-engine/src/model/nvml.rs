//! What NVML says about each GPU, as the NVML thread sends it: readings,
//! XIDs, and why it is unavailable.
use std::collections::BTreeSet;

use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryInfo {
    pub total: u64,
    pub used: u64,
    pub free: u64,
    pub reserved: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EccCounts {
    pub corrected_volatile: u64,
    pub uncorrected_volatile: u64,
    pub corrected_aggregate: u64,
    pub uncorrected_aggregate: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RetiredPages {
    pub single_bit: u64,
    pub double_bit: u64,
    pub pending: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemappedRows {
    pub correctable: u64,
    pub uncorrectable: u64,
    pub pending: bool,
    pub failure: bool,
}

/// One reading of one GPU. None: not supported (see `unsupported`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuSample {
    pub index: u32,
    #[serde(rename = "UUID")]
    pub uuid: String,
    pub pci_bus_id: String,
    #[serde(rename = "modelName")]
    pub name: String,
    /// CLOCK_MONOTONIC seconds of the reading.
    pub t_s: f64,
    pub memory: Option<MemoryInfo>,
    /// (pid, bytes) as NVML sees them (host pids).
    pub processes: Option<Vec<(u32, u64)>>,
    pub ecc: Option<EccCounts>,
    /// Aggregate (corrected, uncorrected) ECC errors per memory location,
    /// for the locations the device reports.
    pub ecc_by_location: Option<std::collections::BTreeMap<&'static str, (u64, u64)>>,
    pub retired_pages: Option<RetiredPages>,
    pub remapped_rows: Option<RemappedRows>,
    pub gpu_temp_c: Option<u32>,
    pub memory_temp_c: Option<u32>,
    /// How the GPU reaches the host's pageable memory: "none", "hmm" or
    /// "ats" (NVML 570 and later). With HMM or ATS, memory a process gets
    /// from malloc or mmap can be used, and migrated into the GPU's memory,
    /// without any driver-API allocation: gpumem's per-process figures do
    /// not include it.
    pub addressing_mode: Option<&'static str>,
    /// The NUMA node that is this GPU's own memory, where the platform
    /// makes it one (NVML's nvmlDeviceGetNumaNodeId, on coherent platforms
    /// such as GH200 and GB200; unsupported elsewhere): the pages processes
    /// hold there are read from /proc/PID/numa_maps.
    pub numa_node: Option<u32>,
    /// Readings this device does not support.
    pub unsupported: BTreeSet<&'static str>,
    /// Its MIG instances, where MIG mode is on (empty otherwise): a process
    /// in one sees the instance as its CUDA device.
    pub mig: Vec<MigInstance>,
}

impl GpuSample {
    /// Whether the GPU reaches the host's pageable memory (HMM or ATS):
    /// memory the per-process figures cannot include.
    pub fn reaches_host_memory(&self) -> bool {
        matches!(self.addressing_mode, Some("hmm" | "ats"))
    }
}

/// One MIG instance (a MIG device of NVML) of a GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MigInstance {
    /// GPU instance and compute instance ids (dcgm-exporter's GPU_I_ID is the former).
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    #[serde(rename = "UUID")]
    pub uuid: String,
    /// The profile, as dcgm-exporter's GPU_I_PROFILE: `1g.18gb` (from NVML's name of the MIG device).
    pub profile: String,
    pub memory: Option<MemoryInfo>,
    /// (pid, bytes) NVML lists on this instance.
    pub processes: Option<Vec<(u32, u64)>>,
}

/// The profile a MIG device's name ends with (`NVIDIA H200 MIG 1g.18gb` → `1g.18gb`).
pub fn mig_profile(name: &str) -> String {
    name.rsplit_once("MIG ")
        .map_or(String::new(), |(_, p)| p.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '+').take(32).collect())
}

/// What the NVML thread reports.
#[derive(Clone, Debug)]
pub enum Message {
    /// A reading of every GPU, taken at `at_s` (CLOCK_MONOTONIC seconds).
    Reading {
        gpus: Vec<GpuSample>,
        at_s: f64,
    },
    /// NVML cannot be used, and why; readings resume when it answers.
    Unavailable(String),
    Xid(XidEvent),
}

impl Message {
    /// What it is, in a word (`nvml-reading`, `nvml-unavailable`, `nvml-xid`).
    pub fn name(&self) -> &'static str {
        match self {
            Message::Reading { .. } => "nvml-reading",
            Message::Unavailable(_) => "nvml-unavailable",
            Message::Xid(_) => "nvml-xid",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct XidEvent {
    pub gpu: u32,
    #[serde(rename = "UUID")]
    pub uuid: String,
    pub xid: u64,
    pub meaning: &'static str,
    /// CLOCK_MONOTONIC nanoseconds when the agent received it.
    pub ts_ns: u64,
    /// (pid, bytes) holding memory on the GPU at that moment.
    pub processes: Vec<(u32, u64)>,
}

/// What an XID means, for the ones that concern memory and a few others
/// (NVIDIA's XID catalogue, "XID Errors" in the GPU deployment guide).
pub fn meaning(xid: u64) -> &'static str {
    match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after previous errors",
        48 => "double-bit ECC error (DBE)",
        61 => "internal micro-controller breakpoint/warning",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping recording failure",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => "see NVIDIA's XID catalogue",
    }
}
