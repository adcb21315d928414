//! memleak semantics for GPU memory: allocations still outstanding and older
//! than a threshold, per process and device, grouped by allocation stack,
//! with the growth verdict of the process's live bytes.
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{
    breakdown::{self, Breakdown},
    fragmentation::{self, DeviceLayout},
    growth::Verdict,
    history::Totals,
    owners::{self, OwnerBytes},
    series::{GrowthTracker, Layer, OtherGroups},
};
use crate::{
    stacks::{Frame, Sampling, StackId, Stacks},
    state::{Memory, Process, State},
};

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct LeakGroup {
    /// None when the stack could not be captured or unwound.
    pub stack_id: Option<String>,
    /// Allocations and bytes: exact, or with `estimated` unbiased estimates
    /// (stacks sampled beyond the process's stack budget, each weighed by
    /// the inverse of its sampling probability).
    pub count: u64,
    pub bytes: u64,
    pub estimated: bool,
    pub oldest_age_s: f64,
    pub frames: Vec<Frame>,
    /// The group's own growth verdict (from its outstanding bytes over
    /// time), where it is among the largest groups tracked.
    #[serde(default)]
    pub verdict: Option<Verdict>,
    /// The group's outstanding bytes at its last samples, oldest first (for sparklines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trend: Vec<u64>,
}

/// Samples of a group's bytes given with it.
pub const GROUP_TREND: usize = 60;

#[derive(Debug, Serialize)]
pub struct ProcessLeaks {
    pub pid: u32,
    pub comm: String,
    pub container: Option<String>,
    pub pod_uid: Option<String>,
    pub ns_pid: Option<u32>,
    pub device: Option<i32>,
    /// Outstanding allocations older than the threshold.
    pub outstanding_bytes: u64,
    pub outstanding_allocs: u64,
    /// Everything live on the device now, young or old.
    pub live_bytes: u64,
    pub growth: Option<Verdict>,
    /// Largest groups first, at most `top`.
    pub stacks: Vec<LeakGroup>,
    /// Groups beyond `top`, not shown.
    pub more_stacks: usize,
    /// Groups too small to have a growth series of their own.
    pub untracked_groups: OtherGroups,
    /// Where everything live on the device went: by the module (or Python
    /// file) that asked the driver for it, by pool, and what it maps of
    /// other processes (beside `live_bytes`, not in it).
    #[serde(flatten)]
    pub breakdown: Breakdown,
    /// Of the outstanding allocations, those over the stack budget whose
    /// stacks were not sampled (exact): the estimated groups stand for them.
    pub not_sampled_allocs: u64,
    pub not_sampled_bytes: u64,
    /// How the live memory is cut up (fragmentation signals).
    pub layout: DeviceLayout,
    /// Where PyTorch's allocator probes fired: its outstanding tensors.
    pub tensors: Option<TensorLeaks>,
    /// Frees of the process's allocations that were never seen made (made
    /// before tracing began): what was held before is not all shown.
    pub untracked_frees: u64,
    /// Which GPU (and MIG instance) `device` is on the host.
    pub placement: super::placement::Placement,
}

#[derive(Default)]
struct Group {
    /// Allocations seen with this stack, exact and weighed.
    totals: Totals,
    oldest_ts: u64,
}

/// A device's outstanding allocations, grouped by stack.
#[derive(Default)]
struct DeviceGroups {
    groups: HashMap<Option<StackId>, Group>,
    /// Over the stack budget and not sampled: (allocations, bytes).
    not_sampled: (u64, u64),
}

/// One live block for grouping: device, stack, size, time, how its stack was taken.
type Item = (i32, Option<StackId>, u64, u64, Sampling);

/// The items older than `older_than_ns` on each device, grouped by stack;
/// `sample_bytes`: the session's stack sampling rate.
fn group_items(items: impl Iterator<Item = Item>, now_ns: u64, older_than_ns: u64, sample_bytes: u64) -> BTreeMap<i32, DeviceGroups> {
    let mut per_dev: BTreeMap<i32, DeviceGroups> = BTreeMap::new();
    for (dev, stack, size, ts, sampling) in items {
        if now_ns.saturating_sub(ts) < older_than_ns {
            continue;
        }
        let d = per_dev.entry(dev).or_default();
        if sampling == Sampling::NotSampled {
            d.not_sampled.0 += 1;
            d.not_sampled.1 += size;
            continue;
        }
        let g = d.groups.entry(stack).or_insert(Group { oldest_ts: u64::MAX, ..Default::default() });
        g.totals.add(size, sampling, sample_bytes);
        g.oldest_ts = g.oldest_ts.min(ts);
    }
    per_dev
}

/// A process's device allocations and VMM handles (what it reserved from the driver).
fn group_by_stack(p: &Process, now_ns: u64, older_than_ns: u64, sample_bytes: u64) -> BTreeMap<i32, DeviceGroups> {
    let allocs =
        p.held.allocs.values().filter(|a| a.memory() == Memory::Device).map(|a| (a.device(), a.stack(), a.size, a.ts_ns, a.sampling()));
    let handles = p.held.vmm_handles.values().map(|h| (h.device, h.stack, h.size, h.ts_ns, h.sampling));
    group_items(allocs.chain(handles), now_ns, older_than_ns, sample_bytes)
}

/// A process's live tensors (PyTorch's allocator probes).
fn group_tensors(p: &Process, now_ns: u64, older_than_ns: u64, sample_bytes: u64) -> BTreeMap<i32, DeviceGroups> {
    let tensors = p.held.tensors.values().map(|t| (t.device(), t.stack(), t.size, t.ts_ns, t.sampling()));
    group_items(tensors, now_ns, older_than_ns, sample_bytes)
}

/// Outstanding tensors of a process on a device, by the stack that made
/// them (Python frames included): what holds the memory inside the cache.
#[derive(Debug, Serialize)]
pub struct TensorLeaks {
    pub outstanding_bytes: u64,
    pub outstanding_tensors: u64,
    /// Bytes of live tensors, young or old (allocated; `live_bytes` is reserved).
    pub allocated_bytes: u64,
    pub stacks: Vec<LeakGroup>,
    pub more_stacks: usize,
}

/// Where a group's own verdict is looked up: the process, its device and the layer.
pub struct Judged<'a> {
    pub growth: &'a mut GrowthTracker,
    pub pid: u32,
    pub device: i32,
    pub layer: Layer,
}

/// Bytes of a process's live device memory on `device` allocated at or
/// before `before_ns` (allocations and VMM handles).
pub fn bytes_allocated_before(p: &Process, device: i32, before_ns: u64) -> u64 {
    // Where the tensors are seen, a leak is theirs: not the cache's segments.
    if p.tensor_probes {
        return p.held.tensors.values().filter(|t| t.device() == device && t.ts_ns <= before_ns).map(|t| t.size).sum();
    }
    let allocs =
        p.held.allocs.values().filter(|a| a.memory() == Memory::Device && a.device() == device && a.ts_ns <= before_ns).map(|a| a.size);
    let handles = p.held.vmm_handles.values().filter(|h| h.device == device && h.ts_ns <= before_ns).map(|h| h.size);
    allocs.chain(handles).sum()
}

/// The largest `top` groups, symbolized; and how many more there were.
fn largest(
    groups: HashMap<Option<StackId>, Group>,
    stacks: &mut Stacks,
    judged: Judged,
    now_ns: u64,
    top: usize,
) -> (Vec<LeakGroup>, usize) {
    let mut groups: Vec<(Option<StackId>, Group)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.totals.est_bytes.total_cmp(&a.1.totals.est_bytes).then(b.1.totals.count.cmp(&a.1.totals.count)));
    let more = groups.len().saturating_sub(top);
    let shown = groups
        .into_iter()
        .take(top)
        .map(|(id, Group { totals: g, oldest_ts })| LeakGroup {
            stack_id: id.map(|i| format!("{i:016x}")),
            count: if g.estimated { g.est_count.round() as u64 } else { g.count },
            bytes: if g.estimated { g.est_bytes.round() as u64 } else { g.bytes },
            estimated: g.estimated,
            oldest_age_s: now_ns.saturating_sub(oldest_ts) as f64 / 1e9,
            frames: id.map(|i| stacks.frames(i)).unwrap_or_default(),
            verdict: judged.growth.group_verdict(judged.pid, judged.device, judged.layer, id),
            trend: judged.growth.group_recent(judged.pid, judged.device, judged.layer, id, GROUP_TREND),
        })
        .collect();
    (shown, more)
}

/// A process's top stacks on a device (for OOM snapshots): its tensors'
/// where PyTorch's probes show them.
/// Ages are taken at `now_ns` (the event that asked: replays give the same answer).
pub fn top_stacks(p: &Process, device: i32, stacks: &mut Stacks, growth: &mut GrowthTracker, top: usize, now: u64) -> Vec<LeakGroup> {
    let (grouped, layer) = if p.tensor_probes {
        (group_tensors(p, now, 0, stacks.sample_bytes), Layer::Tensor)
    } else {
        (group_by_stack(p, now, 0, stacks.sample_bytes), Layer::Driver)
    };
    let judged = Judged { growth, pid: p.pid, device, layer };
    match grouped.into_iter().find(|(d, _)| *d == device).map(|(_, g)| g) {
        Some(d) => largest(d.groups, stacks, judged, now, top).0,
        None => Vec::new(),
    }
}

/// Finds outstanding allocations older than `older_than_ns` at `now_ns`.
pub fn find(
    state: &State,
    stacks: &mut Stacks,
    growth: &mut GrowthTracker,
    now_ns: u64,
    older_than_ns: u64,
    top: usize,
) -> Vec<ProcessLeaks> {
    let mut out = Vec::new();
    for p in state.processes.values().filter(|p| !p.exited) {
        let mut by_owner: BTreeMap<i32, Vec<OwnerBytes>> = owners::by_owner(p, stacks).into_iter().collect();
        let mut tensors = if p.tensor_probes { group_tensors(p, now_ns, older_than_ns, stacks.sample_bytes) } else { BTreeMap::new() };
        for (dev, d) in group_by_stack(p, now_ns, older_than_ns, stacks.sample_bytes) {
            let tensors = p.tensor_probes.then(|| {
                let t = tensors.remove(&dev).unwrap_or_default();
                let (ns_allocs, ns_bytes) = t.not_sampled;
                let outstanding_bytes = t.groups.values().map(|g| g.totals.bytes).sum::<u64>() + ns_bytes;
                let outstanding_tensors = t.groups.values().map(|g| g.totals.count).sum::<u64>() + ns_allocs;
                let judged = Judged { growth: &mut *growth, pid: p.pid, device: dev, layer: Layer::Tensor };
                let (shown, more_stacks) = largest(t.groups, stacks, judged, now_ns, top);
                let allocated_bytes = p.held.devices.get(&dev).map_or(0, |t| t.allocated_bytes);
                TensorLeaks { outstanding_bytes, outstanding_tensors, allocated_bytes, stacks: shown, more_stacks }
            });
            let (not_sampled_allocs, not_sampled_bytes) = d.not_sampled;
            let outstanding_bytes = d.groups.values().map(|g| g.totals.bytes).sum::<u64>() + not_sampled_bytes;
            let outstanding_allocs = d.groups.values().map(|g| g.totals.count).sum::<u64>() + not_sampled_allocs;
            let judged = Judged { growth: &mut *growth, pid: p.pid, device: dev, layer: Layer::Driver };
            let (shown, more_stacks) = largest(d.groups, stacks, judged, now_ns, top);
            let c = p.container.clone().unwrap_or_default();
            out.push(ProcessLeaks {
                pid: p.pid,
                comm: p.comm.clone(),
                container: c.container,
                pod_uid: c.pod_uid,
                ns_pid: c.ns_pid,
                device: (dev != gpumem_common::DEVICE_UNKNOWN).then_some(dev),
                outstanding_bytes,
                outstanding_allocs,
                live_bytes: p.held.devices.get(&dev).map_or(0, |t| t.live_bytes),
                growth: growth.verdict(p.pid, dev),
                stacks: shown,
                more_stacks,
                untracked_groups: growth.other(p.pid, dev),
                breakdown: breakdown::of(p, dev, by_owner.remove(&dev).unwrap_or_default()),
                not_sampled_allocs,
                not_sampled_bytes,
                layout: fragmentation::layout(p, dev),
                tensors,
                untracked_frees: p.untracked_frees,
                placement: Default::default(),
            });
        }
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.outstanding_bytes));
    out
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing, Limits};

    fn ev(api_id: u32, addr: u64, size: u64, ts_ns: u64) -> Event {
        Event { addr, size, ts_ns, ..testing::ev(api_id) }
    }

    #[test]
    fn groups_old_outstanding_allocations_by_stack() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { handle: 0xc, device: 0, ..ev(api::CU_CTX_CREATE_V2, 0, 0, 0) });
        // Weights (stack 1), leaks (stack 2), a young allocation (stack 2), a freed one.
        s.apply_with_stack(&ev(api::CU_MEM_ALLOC_V2, 0x100, 256, 1_000), Some(1));
        for i in 0..5 {
            s.apply_with_stack(&ev(api::CU_MEM_ALLOC_V2, 0x200 + i, 4, 2_000 + i), Some(2));
        }
        s.apply_with_stack(&ev(api::CU_MEM_ALLOC_V2, 0x300, 4, 9_500), Some(2));
        s.apply_with_stack(&ev(api::CU_MEM_ALLOC_V2, 0x400, 64, 1_500), Some(3));
        s.apply(&ev(api::CU_MEM_FREE_V2, 0x400, 0, 1_600));
        let mut stacks = Stacks::default();
        let found = find(&s, &mut stacks, &mut GrowthTracker::default(), 10_000, 1_000, 10);
        assert_eq!(found.len(), 1);
        let p = &found[0];
        assert_eq!((p.device, p.outstanding_bytes, p.outstanding_allocs, p.live_bytes), (Some(0), 276, 6, 280));
        let groups: Vec<(Option<&str>, u64, u64)> = p.stacks.iter().map(|g| (g.stack_id.as_deref(), g.count, g.bytes)).collect();
        assert_eq!(groups, [(Some("0000000000000001"), 1, 256), (Some("0000000000000002"), 5, 20)]);
        assert!((p.stacks[0].oldest_age_s - 9e-6).abs() < 1e-9);
        // Top 1: the rest is counted.
        let found = find(&s, &mut stacks, &mut GrowthTracker::default(), 10_000, 1_000, 1);
        assert_eq!((found[0].stacks.len(), found[0].more_stacks), (1, 1));
    }

    #[test]
    fn exited_processes_have_no_leaks() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { handle: 0xc, device: 0, ..ev(api::CU_CTX_CREATE_V2, 0, 0, 0) });
        s.apply(&ev(api::CU_MEM_ALLOC_V2, 0x100, 256, 1_000));
        s.apply(&ev(api::PROCESS_EXIT, 0, 0, 2_000));
        assert!(find(&s, &mut Stacks::default(), &mut GrowthTracker::default(), 10_000, 0, 10).is_empty());
    }
}
