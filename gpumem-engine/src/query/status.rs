//! A running daemon's own status: what it has attached and kept, what the
//! kernel side counted, its pinned state.
use serde::{Deserialize, Serialize};

use super::Asked;
use crate::{
    model::{
        agent::{ContinuityReport, KernelTable},
        degraded::Degraded,
        lost::{ProbeExits, TablesFull},
    },
    pipeline::Pipeline,
};

/// What only a daemon knows of itself.
#[derive(Clone, Debug)]
pub struct Serving {
    pub pid: u32,
    pub up_s: f64,
    /// Where its metrics are scraped (`http://ADDR/metrics`).
    pub metrics: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub version: String,
    pub pid: u32,
    pub up_s: f64,
    pub metrics: String,
    pub probes_attached: usize,
    pub processes: usize,
    pub continuity: Option<ContinuityReport>,
    pub kernel_table: Option<KernelTable>,
    pub kernel_tables_full: TablesFull,
    pub lost_events: u64,
    /// The eBPF programs' early exits, by reason.
    #[serde(default)]
    pub probe_exits: ProbeExits,
    /// Processes served less than exactly (the most recent), and why.
    #[serde(default)]
    pub degraded: Vec<Degraded>,
    /// What its memory is.
    #[serde(default)]
    pub memory: Memory,
}

/// A daemon's memory: resident (of it, the rings mapped from the kernel),
/// the allocator's bytes in use by owner (estimates) and what it keeps free.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Memory {
    pub resident_bytes: u64,
    pub ring_mapping_bytes: u64,
    pub heap_in_use_bytes: u64,
    pub heap: crate::heap::Parts,
    /// The bytes in use no part accounts for.
    pub heap_unattributed_bytes: u64,
    pub heap_free_bytes: u64,
    /// The caches, their bounds and what each let go.
    #[serde(default)]
    pub caches: Vec<crate::heap::Cache>,
    /// The rings' sizes (kernel memory).
    #[serde(default)]
    pub rings: crate::model::agent::Rings,
    /// Every BPF map's kernel memory, largest first.
    #[serde(default)]
    pub bpf_maps: Vec<crate::model::agent::BpfMapMemory>,
}

/// The status of the daemon that asks (its facts in `at.serving`).
pub fn of(p: &Pipeline, at: &Asked<'_>) -> DaemonStatus {
    let a = at.agent;
    let s = at.serving.cloned().unwrap_or(Serving { pid: std::process::id(), up_s: at.duration_s, metrics: String::new() });
    DaemonStatus {
        version: crate::VERSION.to_string(),
        pid: s.pid,
        up_s: s.up_s,
        metrics: s.metrics,
        probes_attached: a.probes_attached,
        processes: p.state.processes.len(),
        continuity: a.continuity.clone(),
        kernel_table: a.kernel_table.clone(),
        kernel_tables_full: a.kernel.tables_full.clone(),
        lost_events: a.kernel.lost.total(),
        probe_exits: a.kernel.exits.clone(),
        degraded: p.degraded.recent.iter().cloned().collect(),
        memory: {
            let heap = p.heap();
            Memory {
                resident_bytes: a.usage.resident_bytes,
                ring_mapping_bytes: a.usage.bpf_map_resident_bytes,
                heap_in_use_bytes: a.usage.heap_in_use_bytes,
                heap_unattributed_bytes: heap.unattributed(a.usage.heap_in_use_bytes),
                heap,
                heap_free_bytes: a.usage.heap_free_bytes,
                caches: p.stacks.caches(),
                rings: a.rings,
                bpf_maps: a.bpf_maps.clone(),
            }
        },
    }
}
