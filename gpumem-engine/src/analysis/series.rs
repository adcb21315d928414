//! The series the growth detector reads, per process and device: its live
//! (reserved) bytes, its tensors' allocated bytes where PyTorch's probes
//! show them, and the outstanding bytes of each of its largest stack groups
//! (driver allocations and tensors apart). Each group has its own verdict;
//! the process's derives from its groups.
//!
//! Bounded: at most [`GROUPS_TRACKED`] groups per process, device and layer
//! have a series: those that grew most since they were first seen, then the
//! largest (a small leak among many large, steady groups is tracked; one
//! that falls out of these gives its place to one that came in). The rest
//! are counted as `other`.
use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::growth::{Finding, GrowthConfig, Series, Verdict};
pub use super::history::Layer;
use crate::{
    stacks::{Sampling, StackId},
    state::{Memory, Process, State},
};

/// Samples kept per series at most (the window bounds them first: 1200 at
/// the sampling interval).
pub const SERIES_CAP: usize = 4096;

/// Stack groups with a series of their own, per process, device and layer.
pub const GROUPS_TRACKED: usize = 8;

/// Seconds between samples of the groups (each walks the process's live
/// allocations: slower than the totals, which are kept as they change).
pub const GROUP_SAMPLE_INTERVAL_S: f64 = 0.5;

type GroupKey = (Layer, Option<StackId>);

/// The tracked groups of one process on one device.
#[derive(Default)]
struct Groups {
    tracked: HashMap<GroupKey, Series>,
    /// The most each tracked group has held since it was tracked.
    peak: HashMap<GroupKey, u64>,
    /// The least each group present has held since it was first seen.
    low: HashMap<GroupKey, u64>,
    /// Groups without a series at the last sample: how many, and their bytes.
    other: (usize, u64),
}

/// Leaking groups given per process and device (to `/metrics`, `top`), at most.
pub const LEAKING_GROUPS_SHOWN: usize = 5;

/// A stack group whose own verdict is `leak`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeakingGroup {
    pub layer: Layer,
    /// As in `leaks`: 16 hex digits; None where the stack was not captured.
    pub stack_id: Option<String>,
    /// Outstanding at the last sample.
    pub bytes: u64,
    pub rate_bytes_per_s: f64,
}

/// Groups beyond the tracked ones, at the last sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherGroups {
    pub groups: usize,
    pub bytes: u64,
}

pub struct GrowthTracker {
    series: BTreeMap<(u32, i32), Series>,
    allocated: BTreeMap<(u32, i32), Series>,
    groups: BTreeMap<(u32, i32), Groups>,
    last_group_sample: Option<f64>,
    /// (seconds, CLOCK_MONOTONIC ns of the latest event) at each sample:
    /// events' times in the series' clock.
    clock: std::collections::VecDeque<(f64, u64)>,
    /// Samples kept per series at most.
    cap: usize,
}

impl Default for GrowthTracker {
    fn default() -> Self {
        GrowthTracker::with_capacity(SERIES_CAP)
    }
}

impl GrowthTracker {
    pub fn with_capacity(cap: usize) -> Self {
        GrowthTracker {
            series: BTreeMap::new(),
            allocated: BTreeMap::new(),
            groups: BTreeMap::new(),
            last_group_sample: None,
            clock: std::collections::VecDeque::new(),
            cap,
        }
    }

    /// Drops a process's series (it is gone from state).
    pub fn forget(&mut self, pid: u32) {
        let range = (pid, i32::MIN)..=(pid, i32::MAX);
        let devices: Vec<(u32, i32)> = self.series.range(range.clone()).map(|(&k, _)| k).collect();
        for k in devices {
            self.series.remove(&k);
            self.allocated.remove(&k);
        }
        let devices: Vec<(u32, i32)> = self.groups.range(range).map(|(&k, _)| k).collect();
        for k in devices {
            self.groups.remove(&k);
        }
    }

    /// What the series take on the agent's heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        use crate::heap::{btree, hash_table};
        let series = |m: &BTreeMap<(u32, i32), Series>| btree::<(u32, i32), ()>(m.len()) + m.values().map(Series::heap_bytes).sum::<u64>();
        let groups = self.groups.values().map(|g| {
            hash_table::<GroupKey, ()>(g.tracked.capacity())
                + g.tracked.values().map(Series::heap_bytes).sum::<u64>()
                + hash_table::<GroupKey, u64>(g.peak.capacity())
                + hash_table::<GroupKey, u64>(g.low.capacity())
        });
        series(&self.series) + series(&self.allocated) + btree::<(u32, i32), Groups>(self.groups.len()) + groups.sum::<u64>()
    }

    /// Series kept: one per (process, device) sampled.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// A sample at `t_s` seconds, `now_ns` being the latest event's time.
    pub fn sample(&mut self, state: &State, t_s: f64, now_ns: u64) {
        if self.clock.len() == self.cap {
            self.clock.pop_front();
        }
        self.clock.push_back((t_s, now_ns));
        for p in state.processes.values().filter(|p| !p.exited) {
            for (&dev, totals) in &p.held.devices {
                self.series.entry((p.pid, dev)).or_insert_with(|| Series::new(self.cap)).push(t_s, totals.live_bytes);
                if p.tensor_probes {
                    self.allocated.entry((p.pid, dev)).or_insert_with(|| Series::new(self.cap)).push(t_s, totals.allocated_bytes);
                }
            }
        }
        if self.last_group_sample.is_none_or(|last| t_s - last >= GROUP_SAMPLE_INTERVAL_S - 1e-9) {
            self.last_group_sample = Some(t_s);
            for p in state.processes.values().filter(|p| !p.exited) {
                for (dev, now) in group_bytes(p) {
                    let cap = self.cap;
                    self.groups.entry((p.pid, dev)).or_default().sample(now, t_s, cap);
                }
            }
        }
    }

    /// The last `n` samples of a process's live bytes on a device, oldest first.
    pub fn recent(&self, pid: u32, device: i32, n: usize) -> Vec<u64> {
        self.series.get(&(pid, device)).map(|s| s.recent(n)).unwrap_or_default()
    }

    /// A group's own verdict, where it has a series. Driver memory that
    /// grows while the process's tensors do not is the cache's.
    pub fn group_verdict(&mut self, pid: u32, device: i32, layer: Layer, stack: Option<StackId>) -> Option<Verdict> {
        let cfg = GrowthConfig::default();
        let v = self.groups.get_mut(&(pid, device))?.tracked.get_mut(&(layer, stack))?.assess(&cfg);
        if layer == Layer::Driver && v.leaking {
            if let Some(a) = self.allocated.get_mut(&(pid, device)) {
                if !a.assess(&cfg).leaking {
                    return Some(Verdict { leaking: false, verdict: Finding::CacheGrowth, ..v });
                }
            }
        }
        Some(v)
    }

    /// The last `n` samples of a group's outstanding bytes, oldest first.
    pub fn group_recent(&self, pid: u32, device: i32, layer: Layer, stack: Option<StackId>, n: usize) -> Vec<u64> {
        self.groups.get(&(pid, device)).and_then(|g| g.tracked.get(&(layer, stack))).map(|s| s.recent(n)).unwrap_or_default()
    }

    /// A process's leaking groups on a device, the largest first (at most [`LEAKING_GROUPS_SHOWN`]).
    pub fn leaking_groups(&mut self, pid: u32, device: i32) -> Vec<LeakingGroup> {
        let mut keys: Vec<(GroupKey, u64)> = self
            .groups
            .get(&(pid, device))
            .map(|g| g.tracked.iter().map(|(&k, s)| (k, s.last().unwrap_or(0))).collect())
            .unwrap_or_default();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut out = Vec::new();
        for ((layer, stack), bytes) in keys {
            if out.len() == LEAKING_GROUPS_SHOWN {
                break;
            }
            if let Some(v) = self.group_verdict(pid, device, layer, stack).filter(|v| v.leaking) {
                out.push(LeakingGroup { layer, stack_id: stack.map(|i| format!("{i:016x}")), bytes, rate_bytes_per_s: v.rate_bytes_per_s });
            }
        }
        out
    }

    /// A group's verdict as it stood at `at_ns` (the samples up to then),
    /// and the most it held while tracked.
    pub fn group_until(&mut self, pid: u32, device: i32, layer: Layer, stack: Option<StackId>, at_ns: u64) -> Option<(Verdict, u64)> {
        let t = self.clock.iter().take_while(|&&(_, ns)| ns <= at_ns).last().map_or(f64::NEG_INFINITY, |&(t, _)| t);
        let g = self.groups.get_mut(&(pid, device))?;
        let peak = g.peak.get(&(layer, stack)).copied().unwrap_or(0);
        Some((g.tracked.get_mut(&(layer, stack))?.assess_until(t, &GrowthConfig::default()), peak))
    }

    /// The groups without a series of a process on a device.
    pub fn other(&self, pid: u32, device: i32) -> OtherGroups {
        self.groups.get(&(pid, device)).map_or(OtherGroups::default(), |g| OtherGroups { groups: g.other.0, bytes: g.other.1 })
    }

    /// A process's verdict on a device: a leak where any of its groups
    /// leaks (their rates summed); else cache growth, else a plateau, where
    /// a group's is; otherwise its live bytes' own (a leak spread over
    /// stacks too small to be tracked is still a leak there).
    pub fn verdict(&mut self, pid: u32, device: i32) -> Option<Verdict> {
        let cfg = GrowthConfig::default();
        let reserved = self.series.get_mut(&(pid, device))?.assess(&cfg);
        let whole = Verdict::of(reserved, self.allocated.get_mut(&(pid, device)).map(|s| s.assess(&cfg)));
        let mut keys: Vec<GroupKey> = self.groups.get(&(pid, device)).map(|g| g.tracked.keys().copied().collect()).unwrap_or_default();
        keys.sort();
        let groups: Vec<Verdict> = keys.into_iter().filter_map(|(layer, stack)| self.group_verdict(pid, device, layer, stack)).collect();
        let leaking: Vec<Verdict> = groups.iter().filter(|v| v.leaking).cloned().collect();
        if leaking.is_empty() {
            if whole.leaking {
                return Some(whole);
            }
            // The largest growth among groups that cached or plateaued.
            for finding in [Finding::CacheGrowth, Finding::Plateau] {
                if let Some(v) = groups.iter().filter(|v| v.verdict == finding).max_by_key(|v| v.growth_bytes) {
                    return Some(v.clone());
                }
            }
            return Some(whole);
        }
        let groups = leaking.len();
        Some(Verdict {
            leaking: true,
            verdict: Finding::Leak,
            confidence: leaking.iter().map(|v| v.confidence).fold(0.0, f64::max),
            rate_bytes_per_s: leaking.iter().map(|v| v.rate_bytes_per_s).sum(),
            growth_bytes: leaking.iter().map(|v| v.growth_bytes).sum(),
            for_s: leaking.iter().map(|v| v.for_s).fold(0.0, f64::max),
            reason: if groups == 1 { "growing: 1 stack group".into() } else { format!("growing: {groups} stack groups") },
        })
    }
}

impl Groups {
    /// One sample of a device's group bytes (`now`: every group of the
    /// process there): the largest have a series, the others are counted.
    fn sample(&mut self, now: HashMap<GroupKey, u64>, t_s: f64, cap: usize) {
        self.low.retain(|k, _| now.contains_key(k));
        for (&k, &b) in &now {
            let low = self.low.entry(k).or_insert(b);
            *low = (*low).min(b);
        }
        for layer in [Layer::Driver, Layer::Tensor] {
            // (key, growth since first seen, bytes)
            let mut ranked: Vec<(GroupKey, u64, u64)> =
                now.iter().filter(|(k, _)| k.0 == layer).map(|(&k, &b)| (k, b - self.low[&k], b)).collect();
            ranked.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
            let largest: Vec<GroupKey> = ranked.iter().take(GROUPS_TRACKED).map(|&(k, _, _)| k).collect();
            for k in largest.iter().filter(|k| !self.tracked.contains_key(k)).copied().collect::<Vec<_>>() {
                let of_layer = self.tracked.keys().filter(|k| k.0 == layer).count();
                if of_layer >= GROUPS_TRACKED {
                    // The smallest tracked group no longer among the largest makes room.
                    let out = self
                        .tracked
                        .keys()
                        .filter(|t| t.0 == layer && !largest.contains(t))
                        .min_by_key(|t| (now.get(t).copied().unwrap_or(0), **t))
                        .copied();
                    let Some(out) = out else { break };
                    self.tracked.remove(&out);
                }
                self.tracked.insert(k, Series::new(cap));
            }
        }
        let tracked = &self.tracked;
        self.peak.retain(|k, _| tracked.contains_key(k));
        for (k, s) in self.tracked.iter_mut() {
            let bytes = now.get(k).copied().unwrap_or(0);
            s.push(t_s, bytes);
            let peak = self.peak.entry(*k).or_default();
            *peak = (*peak).max(bytes);
        }
        let other: Vec<u64> = now.iter().filter(|(k, _)| !self.tracked.contains_key(k)).map(|(_, &b)| b).collect();
        self.other = (other.len(), other.iter().sum());
    }
}

/// A process's outstanding bytes by device and group (allocations whose
/// stacks were not sampled are in no group).
fn group_bytes(p: &Process) -> BTreeMap<i32, HashMap<GroupKey, u64>> {
    let mut out: BTreeMap<i32, HashMap<GroupKey, u64>> = BTreeMap::new();
    let driver = p
        .held
        .allocs
        .values()
        .filter(|a| a.memory() == Memory::Device)
        .map(|a| (a.device(), Layer::Driver, a.stack(), a.size, a.sampling()))
        .chain(p.held.vmm_handles.values().map(|h| (h.device, Layer::Driver, h.stack, h.size, h.sampling)));
    let tensors = p.held.tensors.values().map(|t| (t.device(), Layer::Tensor, t.stack(), t.size, t.sampling()));
    for (dev, layer, stack, size, sampling) in driver.chain(tensors) {
        if sampling == Sampling::NotSampled {
            continue;
        }
        *out.entry(dev).or_default().entry((layer, stack)).or_default() += size;
    }
    out
}
