//! What a session reads besides events, as a recording keeps it: lookups
//! about processes, NVML readings, XIDs and host-memory readings, each at
//! its time into the session.
use serde::{Deserialize, Serialize};

use super::container::ContainerInfo;

/// What the agent looked up about a process while it was alive: written
/// before the event that needed it, so that replay sees it at the same point.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Lookup {
    pub pid: u32,
    pub container: Option<ContainerInfo>,
    /// The limited memory cgroup of an OOM kill's victim (or trigger).
    pub memcg: Option<String>,
    /// An OOM kill's victim's host memory when it was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<super::host::ProcessHost>,
}

/// One NVML reading of one GPU, at `t_s` seconds into the session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NvmlPoint {
    pub t_s: f64,
    pub gpu: u32,
    pub uuid: String,
    pub name: String,
    pub used_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Volatile ECC counts.
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub gpu_temp_c: Option<u32>,
    pub memory_temp_c: Option<u32>,
    /// (pid, bytes) NVML lists on the GPU: a replay places memory on the
    /// GPUs the live session did (contexts made before the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<(u32, u64)>>,
}

impl NvmlPoint {
    pub fn from_sample(t_s: f64, g: &super::nvml::GpuSample) -> Self {
        NvmlPoint {
            t_s,
            gpu: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            used_bytes: g.memory.as_ref().map(|m| m.used),
            total_bytes: g.memory.as_ref().map(|m| m.total),
            ecc_corrected: g.ecc.as_ref().map(|e| e.corrected_volatile),
            ecc_uncorrected: g.ecc.as_ref().map(|e| e.uncorrected_volatile),
            gpu_temp_c: g.gpu_temp_c,
            memory_temp_c: g.memory_temp_c,
            processes: g.processes.clone(),
        }
    }
}

/// An XID event, at `t_s` seconds into the session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct XidPoint {
    pub t_s: f64,
    pub gpu: u32,
    pub xid: u64,
}

/// The host memory of the traced processes, the node's swap counters and
/// the containers' memory cgroups, as read `t_s` seconds into the session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HostPoint {
    pub t_s: f64,
    pub host: super::host::HostMemory,
}
