//! The agent as outputs report it: what it attached, what the kernel side
//! counted, what it costs, its pinned state; filled by the agent, read by
//! summaries, /metrics and the daemon's status.
use std::collections::BTreeMap;

use super::lost::KernelCounters;

/// What the agent costs now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub bpf_map_resident_bytes: u64,
    /// The allocator's bytes in use (glibc's mallinfo2: arenas and mmapped chunks).
    pub heap_in_use_bytes: u64,
    /// Free bytes the allocator keeps in its arenas (not given back yet).
    pub heap_free_bytes: u64,
}

/// A BPF map's kernel memory (what the kernel charges for it: its fdinfo's
/// `memlock`), by the map's name.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BpfMapMemory {
    pub name: String,
    pub bytes: u64,
}

/// The agent as outputs report it (the summary, /metrics, top's title).
#[derive(Clone, Debug, Default)]
pub struct AgentStatus {
    /// The git revision this agent was built from (`gpumem_build_info`).
    pub revision: &'static str,
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
    pub continuity: Option<ContinuityReport>,
    /// The kernel's table of live entries, as last counted.
    pub kernel_table: Option<KernelTable>,
    /// The rings the agent reads.
    pub rings: Rings,
    /// Kernel memory of the BPF maps it holds open, largest first: made at
    /// load and fixed in size, read once.
    pub bpf_maps: Vec<BpfMapMemory>,
}

/// The kernel's rings the agent reads, by size: kernel memory, which the
/// agent maps twice (so that records can wrap) and which counts in its
/// resident memory from the start. Sized by `--ringbuf-bytes` and
/// `--stack-ring-bytes`, or by the host's class where those are not given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rings {
    pub events_bytes: u64,
    /// 4 KiB where no stacks are captured.
    pub stacks_bytes: u64,
    #[serde(default)]
    pub events_sizing: RingSizing,
    #[serde(default)]
    pub stacks_sizing: RingSizing,
}

/// How a ring's size was chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RingSizing {
    /// Given on the command line.
    #[default]
    Flag,
    /// By the host's class: this many online CPUs
    /// (`gpumem_common::ring_bytes_for_cpus`).
    OnlineCpus(u32),
    /// As `OnlineCpus`, with [`DEBUG_BUILD_ROOM`] times the room: a debug
    /// build drains about ten times slower than the release build the rule
    /// is measured for.
    OnlineCpusDebugBuild(u32),
}

/// How many times a release build's room a debug build's rings get.
pub const DEBUG_BUILD_ROOM: u32 = 8;

/// A ring's size and how it was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingSize {
    pub bytes: u32,
    pub sizing: RingSizing,
}

impl RingSize {
    /// The size given on the command line, or else the one for a host
    /// with this many online CPUs (and for a debug build, more).
    pub fn chosen(flag: Option<u32>, online_cpus: u32, debug_build: bool) -> RingSize {
        match (flag, debug_build) {
            (Some(bytes), _) => RingSize { bytes, sizing: RingSizing::Flag },
            (None, false) => {
                RingSize { bytes: gpumem_common::ring_bytes_for_cpus(online_cpus), sizing: RingSizing::OnlineCpus(online_cpus) }
            }
            (None, true) => RingSize {
                bytes: gpumem_common::ring_bytes_for_cpus(online_cpus.saturating_mul(DEBUG_BUILD_ROOM)),
                sizing: RingSizing::OnlineCpusDebugBuild(online_cpus),
            },
        }
    }
}

/// What finding libraries cost, for the summary: full scans of /proc (at
/// start, then a slow safety net) and the reads of single processes that
/// discovery signals (exec, dlopen) asked for.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScanStats {
    pub scans: u64,
    pub total_us: u64,
    pub max_us: u64,
    /// Processes whose maps the last scan read.
    pub last_processes: u64,
    /// Discovery signals received (exec, the loader's link-map hook).
    #[serde(default)]
    pub signals: u64,
    /// Processes read for them, and what that took.
    #[serde(default)]
    pub signal_reads: u64,
    #[serde(default)]
    pub signal_read_us: u64,
}

impl ScanStats {
    pub fn record(&mut self, took: std::time::Duration, processes: u64) {
        let us = took.as_micros() as u64;
        self.scans += 1;
        self.total_us += us;
        self.max_us = self.max_us.max(us);
        self.last_processes = processes;
    }
}

/// What `status` and the start-up lines say about it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ContinuityReport {
    /// The pin directory and layout; None: unpinned (see `unpinned_why`).
    pub pinned: Option<String>,
    pub layout: String,
    pub unpinned_why: Option<String>,
    /// Adopted from a previous agent: processes, entries, device bytes.
    pub adopted: Option<Adopted>,
    /// Links of the previous agent replaced by this one's.
    pub links_taken_over: usize,
    /// Returns that ran twice while the links overlapped (not losses: the
    /// first of each pair was delivered).
    pub duplicate_returns: u64,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Adopted {
    pub processes: usize,
    pub entries: usize,
    /// Entries of processes gone while no agent ran, removed.
    pub entries_of_exited: usize,
    /// Allocations whose stack came back from the state directory.
    pub stacks_restored: usize,
    /// Processes whose entries did not all fit in the kernel's table.
    pub processes_uncertain: usize,
    /// How long reading and replaying the table took.
    pub took_ms: f64,
}

/// The table's fill, for `status` and `/metrics`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct KernelTable {
    pub entries: u64,
    pub max_entries: u64,
    /// Kernel memory the entries take (key, value, element header).
    pub bytes: u64,
}
