//! Distributions of allocation sizes, allocation lifetimes and call
//! latencies. `observe` is the one place that decides what an event
//! contributes; each observation is counted twice, in an hdrhistogram (the
//! CLI's percentiles) and in fixed Prometheus buckets (the exporter's
//! histograms), so the two agree on the same data.
use std::collections::BTreeMap;

use gpumem_common::{api, ApiClass, Event};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{events::Kind, names::api_name, state::Applied};

/// What kind of memory an allocation is, as a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryKind {
    Device,
    HostPinned,
    VmmPhysical,
    /// PyTorch tensors (its allocator's probes), carved from device memory.
    Tensor,
}

impl MemoryKind {
    pub const ALL: [MemoryKind; 4] = [MemoryKind::Device, MemoryKind::HostPinned, MemoryKind::VmmPhysical, MemoryKind::Tensor];

    pub fn label(self) -> &'static str {
        match self {
            MemoryKind::Device => "device",
            MemoryKind::HostPinned => "host_pinned",
            MemoryKind::VmmPhysical => "vmm_physical",
            MemoryKind::Tensor => "tensor",
        }
    }
}

/// What one event contributes to the distributions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub api: u32,
    /// Time spent in the call (entry to return).
    pub latency_ns: u64,
    /// A successful allocation: its kind and size.
    pub allocation: Option<(MemoryKind, u64)>,
    /// An explicit free of a tracked allocation: its kind and how long it lived.
    pub lifetime: Option<(MemoryKind, u64)>,
}

/// None for events that are not calls (process exit, OOM kill, unknown ids).
pub fn observe(ev: &Event, kind: &Kind, applied: &Applied) -> Option<Observation> {
    let class = match kind {
        Kind::Cuda(info) => Some(info.class),
        Kind::Rm(_) | Kind::Uvm(_) => None,
        Kind::TensorAlloc => {
            return Some(Observation { api: ev.api, latency_ns: 0, allocation: Some((MemoryKind::Tensor, ev.size)), lifetime: None })
        }
        Kind::TensorFree => {
            let lifetime = applied.lifetime_ns.map(|l| (MemoryKind::Tensor, l));
            return Some(Observation { api: ev.api, latency_ns: 0, allocation: None, lifetime });
        }
        Kind::Exit | Kind::OomKill(_) | Kind::Unknown => return None,
    };
    let memory = match class {
        Some(ApiClass::DeviceAlloc | ApiClass::DeviceFree) => Some(MemoryKind::Device),
        Some(ApiClass::HostAlloc | ApiClass::HostFree) => Some(MemoryKind::HostPinned),
        Some(ApiClass::VmmCreate | ApiClass::VmmRelease) => Some(MemoryKind::VmmPhysical),
        _ => None,
    };
    let is_alloc = matches!(class, Some(ApiClass::DeviceAlloc | ApiClass::HostAlloc | ApiClass::VmmCreate));
    Some(Observation {
        api: ev.api,
        latency_ns: ev.latency_ns,
        allocation: memory.filter(|_| is_alloc && ev.result == 0).map(|k| (k, ev.size)),
        lifetime: memory.filter(|_| !is_alloc).zip(applied.lifetime_ns),
    })
}

/// Allocation sizes: powers of 4 from 256 B to 64 GiB (15 buckets). CUDA
/// rounds small allocations up to 512 B and caching allocators carve 2 MiB
/// and 20 MiB segments; a factor of 4 separates those classes while keeping
/// each label set to 16 series.
pub const SIZE_BOUND_BYTES: [u64; 15] = {
    let mut b = [0u64; 15];
    let mut i = 0;
    while i < 15 {
        b[i] = 256 << (2 * i);
        i += 1;
    }
    b
};

pub fn size_bounds() -> Vec<f64> {
    SIZE_BOUND_BYTES.iter().map(|&b| b as f64).collect()
}

/// Allocation lifetimes in seconds: per-step temporaries live milliseconds,
/// cached blocks minutes to the life of the job (a day or more); the buckets
/// follow the units people reason in (ms, s, min, h, day).
pub const LIFETIME_BOUNDS: [f64; 12] = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 4.0 * 3600.0, 12.0 * 3600.0, 86400.0];

/// Call latency in seconds: powers of 4 from 1 µs to 4 s (12 buckets). A
/// uprobe alone costs 1–20 µs, a cached allocation a few µs, a synchronising
/// cuMemFree or a fresh cuMemAlloc of GiBs milliseconds to seconds.
pub fn latency_bounds() -> Vec<f64> {
    (0..12).map(|i| 1e-6 * 4f64.powi(i)).collect()
}

/// The size class of an allocation for reports: the smallest size bound that
/// holds it, or u64::MAX above the largest.
pub fn size_bucket(size: u64) -> u64 {
    SIZE_BOUND_BYTES.iter().copied().find(|&b| size <= b).unwrap_or(u64::MAX)
}

/// Counts per fixed bucket, as a Prometheus histogram keeps them: a value
/// falls in the first bucket whose bound is at least the value, or in +Inf.
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    pub bounds: Vec<f64>,
    /// One count per bound, then the +Inf bucket (not cumulative).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Buckets {
    pub fn new(bounds: Vec<f64>) -> Self {
        let counts = vec![0; bounds.len() + 1];
        Buckets { bounds, counts, sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        self.add(i, v);
    }

    /// Counts `v` in bucket `i` (found by the caller).
    fn add(&mut self, i: usize, v: f64) {
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
}

/// 2 significant digits: 1 % resolution, a few tens of KiB per histogram.
const SIGFIG: u8 = 2;
/// Largest values kept exactly; larger ones are recorded at the bound.
const MAX_SIZE: u64 = 1 << 44;
const MAX_NS: u64 = 7 * 24 * 3600 * 1_000_000_000;

/// One distribution, counted both ways.
#[derive(Clone, Debug)]
pub struct Distribution {
    hdr: Histogram<u64>,
    pub buckets: Buckets,
    /// Prometheus buckets are in base units: bytes, or seconds for ns values.
    scale: f64,
    /// Each bound in recorded units: the largest value that `observe` puts
    /// at or below it (so a value's bucket is found in integers, as the
    /// scaled comparison would find it).
    raw_bounds: Vec<u64>,
}

impl Distribution {
    fn new(max: u64, bounds: Vec<f64>, scale: f64) -> Self {
        let raw_bounds = bounds.iter().map(|&b| raw_bound(b, scale)).collect();
        Distribution {
            hdr: Histogram::new_with_bounds(1, max, SIGFIG).expect("valid bounds"),
            buckets: Buckets::new(bounds),
            scale,
            raw_bounds,
        }
    }

    fn record(&mut self, v: u64) {
        // Value 0 (a zero-byte allocation) is recorded as 1: the bound's floor.
        self.hdr.saturating_record(v.max(1));
        // The bounds are sorted and few (12 to 15), and most values fall in
        // the first few (latencies of microseconds): a scan from the start
        // finds the same bucket as a binary search, in fewer steps.
        let i = self.raw_bounds.iter().position(|&r| r >= v).unwrap_or(self.raw_bounds.len());
        self.buckets.add(i, v as f64 * self.scale);
    }

    /// Each value is the lowest of its hdrhistogram bucket (within 1 % below
    /// the true value), so that a 64 MiB allocation reads 64 MiB.
    fn percentiles(&self) -> Percentiles {
        let h = &self.hdr;
        let q = |q: f64| h.lowest_equivalent(h.value_at_quantile(q));
        Percentiles { count: h.len(), p50: q(0.5), p90: q(0.9), p99: q(0.99), max: h.lowest_equivalent(h.max()) }
    }
}

/// The largest `v` with `v as f64 * scale <= bound` (0 if none): where
/// `Buckets::observe` of a scaled value would stop.
fn raw_bound(bound: f64, scale: f64) -> u64 {
    let fits = |v: u64| v as f64 * scale <= bound;
    if !fits(0) {
        return 0;
    }
    let mut v = (bound / scale).clamp(0.0, u64::MAX as f64) as u64;
    while v > 0 && !fits(v) {
        v -= 1;
    }
    while v < u64::MAX && fits(v + 1) {
        v += 1;
    }
    v
}

/// Percentiles of one distribution, for summaries.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

/// Sizes and lifetimes per kind of memory, latencies per API.
#[derive(Clone, Debug, Default)]
pub struct Distributions {
    sizes: [Option<Distribution>; KINDS],
    lifetimes: [Option<Distribution>; KINDS],
    /// Indexed by API id (ids are small and dense).
    latencies: Vec<Option<Distribution>>,
}

const KINDS: usize = MemoryKind::ALL.len();

fn slot(kind: MemoryKind) -> usize {
    kind as usize
}

impl Distributions {
    pub fn record(&mut self, o: &Observation) {
        let i = o.api as usize;
        if i >= self.latencies.len() {
            self.latencies.resize_with((api::MAX as usize + 1).max(i + 1), || None);
        }
        // Probes inside PyTorch's allocator are points, not calls: no latency.
        if !matches!(o.api, api::TENSOR_ALLOC | api::TENSOR_FREE) {
            self.latencies[i].get_or_insert_with(|| Distribution::new(MAX_NS, latency_bounds(), 1e-9)).record(o.latency_ns);
        }
        if let Some((kind, size)) = o.allocation {
            self.sizes[slot(kind)].get_or_insert_with(|| Distribution::new(MAX_SIZE, size_bounds(), 1.0)).record(size);
        }
        if let Some((kind, ns)) = o.lifetime {
            self.lifetimes[slot(kind)].get_or_insert_with(|| Distribution::new(MAX_NS, LIFETIME_BOUNDS.to_vec(), 1e-9)).record(ns);
        }
    }

    /// Allocation sizes per kind of memory, in bytes.
    pub fn sizes(&self) -> impl Iterator<Item = (MemoryKind, &Buckets)> {
        by_kind(&self.sizes)
    }

    /// Allocation lifetimes per kind of memory, in seconds.
    pub fn lifetimes(&self) -> impl Iterator<Item = (MemoryKind, &Buckets)> {
        by_kind(&self.lifetimes)
    }

    /// Call latencies per API id, in seconds.
    pub fn latencies(&self) -> impl Iterator<Item = (u32, &Buckets)> {
        self.latencies.iter().enumerate().filter_map(|(api, d)| Some((api as u32, &d.as_ref()?.buckets)))
    }

    pub fn summary(&self) -> DistributionSummary {
        let kinds = |ds: &[Option<Distribution>; KINDS]| -> BTreeMap<&'static str, Percentiles> {
            MemoryKind::ALL.iter().filter_map(|&k| Some((k.label(), ds[slot(k)].as_ref()?.percentiles()))).collect()
        };
        DistributionSummary {
            allocation_size_bytes: kinds(&self.sizes),
            allocation_lifetime_ns: kinds(&self.lifetimes),
            api_latency_ns: self
                .latencies
                .iter()
                .enumerate()
                .filter_map(|(a, d)| Some((api_name(a as u32), d.as_ref()?.percentiles())))
                .collect(),
        }
    }
}

fn by_kind(ds: &[Option<Distribution>; KINDS]) -> impl Iterator<Item = (MemoryKind, &Buckets)> {
    MemoryKind::ALL.into_iter().filter_map(move |k| Some((k, &ds[slot(k)].as_ref()?.buckets)))
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DistributionSummary {
    pub allocation_size_bytes: BTreeMap<&'static str, Percentiles>,
    pub allocation_lifetime_ns: BTreeMap<&'static str, Percentiles>,
    pub api_latency_ns: BTreeMap<&'static str, Percentiles>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{testing::ev, Limits, State};

    #[test]
    fn integer_bucketing_puts_each_value_where_the_scaled_comparison_does() {
        for (bounds, scale) in [(latency_bounds(), 1e-9), (LIFETIME_BOUNDS.to_vec(), 1e-9), (size_bounds(), 1.0)] {
            let mut fast = Distribution::new(MAX_NS, bounds.clone(), scale);
            let mut slow = Buckets::new(bounds.clone());
            let edges = bounds.iter().map(|&b| (b / scale) as u64);
            for v in edges.flat_map(|e| [e.saturating_sub(1), e, e + 1, e * 3 / 2]).chain([0, 1, u64::MAX / 2]) {
                fast.record(v);
                slow.observe(v as f64 * scale);
            }
            assert_eq!(fast.buckets, slow, "bounds {bounds:?}");
        }
    }

    #[test]
    fn allocations_frees_and_failures_contribute_what_they_should() {
        let mut s = State::new(Limits::default());
        let mut d = Distributions::default();
        let mut feed = |e: Event| {
            let kind = Kind::of(&e);
            let applied = s.apply_kind(&e, &kind, None);
            let o = observe(&e, &kind, &applied);
            if let Some(o) = &o {
                d.record(o);
            }
            o
        };
        let a = feed(Event { addr: 1, size: 4096, latency_ns: 2_000, ts_ns: 10, ..ev(api::CU_MEM_ALLOC_V2) }).unwrap();
        assert_eq!(a.allocation, Some((MemoryKind::Device, 4096)));
        let failed = feed(Event { size: 1 << 40, result: 2, latency_ns: 5_000, ..ev(api::CU_MEM_ALLOC_V2) }).unwrap();
        assert_eq!(failed.allocation, None, "a failed allocation has no size to count");
        let f = feed(Event { addr: 1, ts_ns: 3_000_010, latency_ns: 1_000, ..ev(api::CU_MEM_FREE_V2) }).unwrap();
        assert_eq!(f.lifetime, Some((MemoryKind::Device, 3_000_000)));
        assert_eq!(feed(ev(api::PROCESS_EXIT)), None);
        let sum = d.summary();
        assert_eq!(sum.allocation_size_bytes["device"].count, 1);
        // A power of two is the lowest value of its bucket: exact.
        assert_eq!(sum.allocation_size_bytes["device"].max, 4096);
        assert_eq!(sum.api_latency_ns["cuMemAlloc_v2"].count, 2);
        // Within hdrhistogram's 1 % resolution.
        let p50 = sum.allocation_lifetime_ns["device"].p50;
        assert!((2_970_000..=3_000_000).contains(&p50), "{p50}");
        // The same observations in the Prometheus buckets: 4096 B is in the 4 KiB bucket.
        let (kind, sizes) = d.sizes().next().unwrap();
        assert_eq!((kind, sizes.count, sizes.sum), (MemoryKind::Device, 1, 4096.0));
        assert_eq!(sizes.counts[2], 1, "256, 1024, 4096: the third bound");
        let lat: Vec<(u32, u64)> = d.latencies().map(|(a, b)| (a, b.count)).collect();
        assert_eq!(lat, [(api::CU_MEM_ALLOC_V2, 2), (api::CU_MEM_FREE_V2, 1)]);
    }

    #[test]
    fn buckets_are_inclusive_upper_bounds_with_an_infinite_last() {
        let mut b = Buckets::new(vec![1.0, 4.0]);
        for v in [0.5, 1.0, 1.5, 4.0, 9.0] {
            b.observe(v);
        }
        assert_eq!((b.counts, b.count, b.sum), (vec![2, 2, 1], 5, 16.0));
        assert_eq!(size_bucket(1), 256);
        assert_eq!(size_bucket(256), 256);
        assert_eq!(size_bucket(257), 1024);
        assert_eq!(size_bucket(3 << 20), 4 << 20);
        assert_eq!(size_bucket(1 << 40), u64::MAX);
    }
}
