//! What applying an event reports: for rendering, for OOM forensics and for
//! the counters the outputs show.

/// Memory released implicitly on one device (context destroyed, process exit).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Release {
    pub device: i32,
    pub bytes: u64,
    pub allocs: u64,
}

/// A process holding memory on a device, for OOM snapshots.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub bytes: u64,
    pub allocs: u64,
}

/// A CUDA allocation that failed with out-of-memory, and who held the device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CudaOom {
    pub device: i32,
    pub requested: u64,
    /// Free bytes the process's own last cuMemGetInfo_v2 reported for the device.
    pub reported_free: Option<u64>,
    /// Failed although at least the requested size was free: reported
    /// free by the process's own cuMemGetInfo, or cached by PyTorch's
    /// allocator in blocks none of which was large enough.
    pub fragmentation: bool,
    /// Where PyTorch's probes fired: the bytes its segments held unused,
    /// and the largest free block among them, when the request failed.
    pub reserved_unused: Option<u64>,
    pub largest_free_block: Option<u64>,
    /// Largest holders of the device, most first (at most `OOM_TOP_HOLDERS`).
    pub holders: Vec<Holder>,
}

pub const OOM_TOP_HOLDERS: usize = 5;

/// A host OOM kill as the state saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OomKill {
    /// The victim's GPU memory per device at that moment.
    pub holdings: Vec<Release>,
    /// The limited memory cgroup the kill happened in (filled by the
    /// pipeline's lookups); None for a host-wide kill or when unknown.
    pub memcg: Option<String>,
    /// The victim's host memory when chosen (resident, swap) and the pinned host memory it held.
    pub host: Option<crate::model::host::ProcessHost>,
    pub pinned_host_bytes: u64,
}

/// Out-of-memory counts kept for the summary and the exporter.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OomCounters {
    pub cuda_ooms: u64,
    pub fragmentation_ooms: u64,
    pub host_oom_kills: u64,
}

/// What applying one event did, for rendering. Returned for every event, so
/// the rare parts (OOMs) are boxed to keep it small to move.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Host OOM kill: the victim's GPU holdings per device at that moment.
    pub oom_kill: Option<Box<OomKill>>,
    /// A CUDA allocation failed with out-of-memory.
    pub cuda_oom: Option<Box<CudaOom>>,
    /// Device the event is attributed to (resolved from contexts if the call
    /// itself names none).
    pub device: i32,
    /// Bytes the event concerns (for a free: the size that was freed).
    pub size: u64,
    /// Implicit releases (ctx destroy, primary ctx release/reset, exit).
    pub released: Vec<Release>,
    /// A free/release of something not in the table (predates the trace).
    pub untracked: bool,
    /// Not recorded: a table was full, or the event could not be believed.
    pub dropped: bool,
    /// An explicit free of a tracked allocation or handle: how long it lived.
    pub lifetime_ns: Option<u64>,
    /// An import: the process whose memory it maps (None: not known).
    pub exporter: Option<u32>,
}
