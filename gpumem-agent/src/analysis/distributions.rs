//! Distributions of allocation sizes, allocation lifetimes and call
//! latencies. `observe` is the one place that decides what an event
//! contributes; the CLI's percentiles (hdrhistogram, here) and the
//! exporter's Prometheus histograms are both fed from it, so the two agree
//! on the same data.
use std::collections::BTreeMap;

use gpumem_common::{api, api_info, ApiClass, Event};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{export::names::api_name, state::Applied};

/// What kind of memory an allocation is, as a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryKind {
    Device,
    HostPinned,
    VmmPhysical,
}

impl MemoryKind {
    pub fn label(self) -> &'static str {
        match self {
            MemoryKind::Device => "device",
            MemoryKind::HostPinned => "host_pinned",
            MemoryKind::VmmPhysical => "vmm_physical",
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

/// None for events that are not calls (process exit, OOM kill).
pub fn observe(ev: &Event, applied: &Applied) -> Option<Observation> {
    if ev.api == api::PROCESS_EXIT || ev.api == api::OOM_KILL {
        return None;
    }
    let class = api_info(ev.api).map(|i| i.class);
    let kind = match class {
        Some(ApiClass::DeviceAlloc | ApiClass::DeviceFree) => Some(MemoryKind::Device),
        Some(ApiClass::HostAlloc | ApiClass::HostFree) => Some(MemoryKind::HostPinned),
        Some(ApiClass::VmmCreate | ApiClass::VmmRelease) => Some(MemoryKind::VmmPhysical),
        _ => None,
    };
    let is_alloc = matches!(class, Some(ApiClass::DeviceAlloc | ApiClass::HostAlloc | ApiClass::VmmCreate));
    Some(Observation {
        api: ev.api,
        latency_ns: ev.latency_ns,
        allocation: kind.filter(|_| is_alloc && ev.result == 0).map(|k| (k, ev.size)),
        lifetime: kind.filter(|_| !is_alloc).and_then(|k| applied.lifetime_ns.map(|l| (k, l))),
    })
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

impl Percentiles {
    /// Each value is the lowest of its hdrhistogram bucket (within 1 % below
    /// the true value), so that a 64 MiB allocation reads 64 MiB.
    fn of(h: &Histogram<u64>) -> Self {
        let q = |q: f64| h.lowest_equivalent(h.value_at_quantile(q));
        Percentiles { count: h.len(), p50: q(0.5), p90: q(0.9), p99: q(0.99), max: h.lowest_equivalent(h.max()) }
    }
}

/// 2 significant digits: 1 % resolution, a few tens of KiB per histogram.
const SIGFIG: u8 = 2;

fn histogram(max: u64) -> Histogram<u64> {
    Histogram::new_with_bounds(1, max, SIGFIG).expect("valid bounds")
}

/// hdrhistograms for the CLI summaries.
pub struct Distributions {
    /// Bytes, per kind of memory.
    sizes: BTreeMap<MemoryKind, Histogram<u64>>,
    /// Nanoseconds, per kind of memory.
    lifetimes: BTreeMap<MemoryKind, Histogram<u64>>,
    /// Nanoseconds, per API.
    latencies: BTreeMap<u32, Histogram<u64>>,
}

impl Default for Distributions {
    fn default() -> Self {
        Distributions { sizes: BTreeMap::new(), lifetimes: BTreeMap::new(), latencies: BTreeMap::new() }
    }
}

/// Largest values kept exactly; larger ones are recorded at the bound.
const MAX_SIZE: u64 = 1 << 44;
const MAX_NS: u64 = 7 * 24 * 3600 * 1_000_000_000;

impl Distributions {
    pub fn record(&mut self, o: &Observation) {
        // Value 0 (a zero-byte allocation) is recorded as 1: the bound's floor.
        self.latencies.entry(o.api).or_insert_with(|| histogram(MAX_NS)).saturating_record(o.latency_ns.max(1));
        if let Some((kind, size)) = o.allocation {
            self.sizes.entry(kind).or_insert_with(|| histogram(MAX_SIZE)).saturating_record(size.max(1));
        }
        if let Some((kind, ns)) = o.lifetime {
            self.lifetimes.entry(kind).or_insert_with(|| histogram(MAX_NS)).saturating_record(ns.max(1));
        }
    }

    pub fn summary(&self) -> DistributionSummary {
        DistributionSummary {
            allocation_size_bytes: self.sizes.iter().map(|(k, h)| (k.label(), Percentiles::of(h))).collect(),
            allocation_lifetime_ns: self.lifetimes.iter().map(|(k, h)| (k.label(), Percentiles::of(h))).collect(),
            api_latency_ns: self.latencies.iter().map(|(&a, h)| (api_name(a), Percentiles::of(h))).collect(),
        }
    }
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
    fn allocations_frees_and_failures_contribute_what_they_should() {
        let mut s = State::new(Limits::default());
        let mut d = Distributions::default();
        let mut feed = |e: Event| {
            let applied = s.apply(&e);
            let o = observe(&e, &applied);
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
    }
}
