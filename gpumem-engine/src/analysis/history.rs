//! What a session did that the state forgets once memory is freed, for the
//! exports: how much each stack allocated in total (a heap profile's
//! `alloc_*` figures), a bounded log of each device's memory actions
//! (PyTorch's memory trace) and the names of the threads seen. Built event
//! by event by the pipeline when an export asks for it.
use std::collections::{BTreeMap, VecDeque};

use gpumem_common::{
    payload::{Payload, TensorAlloc},
    ApiClass, Event, DEVICE_UNKNOWN,
};
use rustc_hash::FxHashMap;

use crate::{
    events::Kind,
    stacks::{policy, Sampling, StackId},
    state::Applied,
};

/// Entries of the device logs kept in all by exports of a recording (a
/// daemon keeps fewer); beyond it the oldest go, counted.
pub const TRACE_CAP: usize = 1 << 21;
/// Distinct (process, device, stack, layer) totals kept; beyond it counted.
pub const TOTALS_CAP: usize = 1 << 20;

/// Which allocator an allocation was made by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The CUDA driver: cuMemAlloc and friends, VMM handles, pinned host memory.
    Driver,
    /// PyTorch's caching allocator (its USDT probes): a tensor's block.
    Tensor,
}

impl Layer {
    pub fn name(self) -> &'static str {
        match self {
            Layer::Driver => "driver",
            Layer::Tensor => "tensor",
        }
    }
}

/// Whose allocations a total is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TotalsKey {
    pub pid: u32,
    /// DEVICE_UNKNOWN for pinned host memory.
    pub device: i32,
    pub stack: Option<StackId>,
    pub layer: Layer,
    /// Pinned host memory, not VRAM.
    pub host: bool,
}

/// Allocations made, exact and weighed by the inverse of their stack's
/// sampling probability.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub count: u64,
    pub bytes: u64,
    pub est_count: f64,
    pub est_bytes: f64,
    pub estimated: bool,
}

impl Totals {
    /// Adds one allocation of `size` taken as `sampling` says.
    pub fn add(&mut self, size: u64, sampling: Sampling, sample_bytes: u64) {
        let w = policy::weight(sampling, size, sample_bytes);
        self.count += 1;
        self.bytes += size;
        self.est_count += w;
        self.est_bytes += w * size as f64;
        self.estimated |= sampling == Sampling::Sampled;
    }

    /// Adds what `other` counted.
    pub fn merge(&mut self, other: &Totals) {
        self.count += other.count;
        self.bytes += other.bytes;
        self.est_count += other.est_count;
        self.est_bytes += other.est_bytes;
        self.estimated |= other.estimated;
    }
}

/// What happened to device memory, in PyTorch's trace vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The driver handed out memory (cuMemAlloc*): a segment.
    SegmentAlloc,
    SegmentFree,
    /// Physical memory mapped into reserved address space (cuMemMap:
    /// expandable segments grow this way).
    SegmentMap,
    SegmentUnmap,
    /// A tensor's block handed out by PyTorch's allocator.
    Alloc,
    /// A tensor given back: PyTorch logs it asked (requested) and done
    /// (completed, when its streams are); the probe sees both at once.
    FreeRequested,
    FreeCompleted,
    /// An allocation failed with out-of-memory: `size` asked, `device_free`.
    Oom,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::Oom => "oom",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceEntry {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub stack: Option<StackId>,
    /// Free bytes on the device at an OOM, where the driver said.
    pub device_free: Option<u64>,
}

#[derive(Debug)]
pub struct History {
    pub totals: FxHashMap<TotalsKey, Totals>,
    /// Allocations not added to `totals` because it was full.
    pub totals_full: u64,
    /// Allocations over their process's stack budget whose stack was not
    /// sampled, per process and layer: (allocations, bytes).
    pub not_sampled: FxHashMap<(u32, Layer), (u64, u64)>,
    /// Per device, oldest first.
    pub traces: BTreeMap<i32, VecDeque<TraceEntry>>,
    trace_len: usize,
    /// Entries dropped from the front of the logs to stay within TRACE_CAP.
    pub trace_dropped: u64,
    /// Thread id → (process id, the thread's name at its last event).
    pub threads: BTreeMap<u32, (u32, String)>,
    trace_cap: usize,
}

impl Default for History {
    fn default() -> Self {
        History::with_trace_cap(TRACE_CAP)
    }
}

impl History {
    /// What it keeps on the agent's heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        use crate::heap::{btree, hash_table, vec};
        hash_table::<TotalsKey, Totals>(self.totals.capacity())
            + hash_table::<(u32, Layer), (u64, u64)>(self.not_sampled.capacity())
            + self.traces.values().map(|t| vec::<TraceEntry>(t.capacity())).sum::<u64>()
            + btree::<u32, (u32, String)>(self.threads.len())
            + self.threads.values().map(|(_, name)| name.capacity() as u64).sum::<u64>()
    }

    /// A history whose device logs keep at most `trace_cap` entries in all.
    pub fn with_trace_cap(trace_cap: usize) -> Self {
        History {
            totals: FxHashMap::default(),
            totals_full: 0,
            not_sampled: FxHashMap::default(),
            traces: BTreeMap::new(),
            trace_len: 0,
            trace_dropped: 0,
            threads: BTreeMap::new(),
            trace_cap,
        }
    }

    /// Drops what is kept per process of one the state forgot (its log
    /// entries go with the oldest).
    pub fn forget(&mut self, pid: u32) {
        self.totals.retain(|k, _| k.pid != pid);
        self.not_sampled.retain(|k, _| k.0 != pid);
        self.threads.retain(|_, (p, _)| *p != pid);
    }

    /// One applied event; `sample_bytes`: the session's stack sampling rate.
    pub fn observe(&mut self, ev: &Event, kind: &Kind, applied: &Applied, stack: Option<StackId>, sample_bytes: u64) {
        self.name_thread(ev, kind);
        if let Some(oom) = &applied.cuda_oom {
            self.log(
                oom.device,
                TraceEntry { action: Action::Oom, size: oom.requested, device_free: oom.reported_free, ..entry(ev, stack) },
            );
        }
        if ev.result != 0 || applied.dropped {
            return;
        }
        let (layer, host, action) = match kind {
            Kind::Cuda(info) => match info.class {
                ApiClass::DeviceAlloc => (Layer::Driver, false, Some(Action::SegmentAlloc)),
                ApiClass::HostAlloc => (Layer::Driver, true, None),
                ApiClass::VmmCreate => (Layer::Driver, false, None),
                ApiClass::DeviceFree if applied.size > 0 => return self.log(applied.device, freed(ev, applied, Action::SegmentFree)),
                ApiClass::VmmMap => return self.log(applied.device, TraceEntry { action: Action::SegmentMap, ..entry(ev, stack) }),
                ApiClass::VmmUnmap if applied.size > 0 => {
                    return self.log(applied.device, freed(ev, applied, Action::SegmentUnmap));
                }
                _ => return,
            },
            Kind::TensorAlloc => (Layer::Tensor, false, Some(Action::Alloc)),
            Kind::TensorFree if applied.size > 0 => {
                self.log(applied.device, freed(ev, applied, Action::FreeRequested));
                return self.log(applied.device, freed(ev, applied, Action::FreeCompleted));
            }
            _ => return,
        };
        let device = if host { DEVICE_UNKNOWN } else { applied.device };
        let sampling = Sampling::of(ev.flags);
        let key = TotalsKey { pid: ev.pid, device, stack, layer, host };
        if sampling == Sampling::NotSampled {
            let n = self.not_sampled.entry((ev.pid, layer)).or_default();
            n.0 += 1;
            n.1 += ev.size;
        } else if !self.totals.contains_key(&key) && self.totals.len() >= TOTALS_CAP {
            self.totals_full += 1;
        } else {
            self.totals.entry(key).or_default().add(ev.size, sampling, sample_bytes);
        }
        if let Some(action) = action {
            let stream = if matches!(kind, Kind::TensorAlloc) { TensorAlloc::unpack(ev).stream } else { 0 };
            self.log(device, TraceEntry { action, stream, ..entry(ev, stack) });
        }
    }

    fn name_thread(&mut self, ev: &Event, kind: &Kind) {
        if matches!(kind, Kind::OomKill(_)) {
            return; // the victim's pid with the trigger's tid
        }
        let name = String::from_utf8_lossy(ev.comm_bytes());
        match self.threads.get(&ev.tid) {
            Some((pid, n)) if *pid == ev.pid && *n == name => {}
            _ => {
                self.threads.insert(ev.tid, (ev.pid, name.into_owned()));
            }
        }
    }

    fn log(&mut self, device: i32, e: TraceEntry) {
        if device == DEVICE_UNKNOWN {
            return;
        }
        self.traces.entry(device).or_default();
        if self.trace_len >= self.trace_cap {
            // The oldest entry of the longest log goes, counting this one in
            // its log; taken before the push, so that a full log stays within
            // its capacity (pushed first, a deque at its capacity doubles).
            let longest = self.traces.iter_mut().max_by_key(|(d, l)| l.len() + usize::from(**d == device)).map(|(_, l)| l);
            if let Some(log) = longest {
                self.trace_dropped += 1;
                if log.pop_front().is_none() {
                    return; // no room at all (a cap of 0): this one goes
                }
                self.trace_len -= 1;
            }
        }
        self.traces.entry(device).or_default().push_back(e);
        self.trace_len += 1;
    }

    /// The most log entries kept, all devices together.
    pub fn trace_cap(&self) -> usize {
        self.trace_cap
    }

    /// The threads of a process, by thread id.
    pub fn threads_of(&self, pid: u32) -> impl Iterator<Item = (u32, &str)> {
        self.threads.iter().filter(move |(_, (p, _))| *p == pid).map(|(&tid, (_, name))| (tid, name.as_str()))
    }
}

fn entry(ev: &Event, stack: Option<StackId>) -> TraceEntry {
    TraceEntry {
        ts_ns: ev.ts_ns,
        pid: ev.pid,
        tid: ev.tid,
        action: Action::Alloc,
        addr: ev.addr,
        size: ev.size,
        stream: 0,
        stack,
        device_free: None,
    }
}

/// A free's entry: the size freed, the stack of the code that freed it.
fn freed(ev: &Event, applied: &Applied, action: Action) -> TraceEntry {
    TraceEntry { action, size: applied.size, ..entry(ev, None) }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing, Limits, State};

    fn apply(s: &mut State, h: &mut History, ev: Event, stack: Option<StackId>) {
        let kind = Kind::of(&ev);
        let applied = s.apply_kind(&ev, &kind, stack);
        h.observe(&ev, &kind, &applied, stack, 0);
    }

    #[test]
    fn totals_count_every_allocation_and_the_log_names_segments() {
        let (mut s, mut h) = (State::new(Limits::default()), History::default());
        apply(&mut s, &mut h, Event { handle: 0xc, device: 1, ..testing::ev(api::CU_CTX_CREATE_V2) }, None);
        for i in 0..3 {
            let a = 0x1000 * (i + 1);
            apply(&mut s, &mut h, Event { addr: a, size: 100, ts_ns: 10 + i, ..testing::ev(api::CU_MEM_ALLOC_V2) }, Some(7));
            apply(&mut s, &mut h, Event { addr: a, ts_ns: 11 + i, ..testing::ev(api::CU_MEM_FREE_V2) }, None);
        }
        let key = TotalsKey { pid: testing::ev(0).pid, device: 1, stack: Some(7), layer: Layer::Driver, host: false };
        let t = h.totals[&key];
        assert_eq!((t.count, t.bytes, t.est_count, t.estimated), (3, 300, 3.0, false));
        let actions: Vec<(&str, u64)> = h.traces[&1].iter().map(|e| (e.action.name(), e.size)).collect();
        assert_eq!(actions, [("segment_alloc", 100), ("segment_free", 100)].repeat(3));
        assert_eq!(h.threads_of(key.pid).count(), 1);
    }

    #[test]
    fn full_logs_drop_the_oldest_of_the_longest_and_stay_within_their_capacity() {
        let entry = |ts_ns| TraceEntry {
            ts_ns,
            pid: 1,
            tid: 1,
            action: Action::SegmentAlloc,
            addr: 0,
            size: 1,
            stream: 0,
            stack: None,
            device_free: None,
        };
        let mut h = History::with_trace_cap(1024);
        for ts in 0..1024 {
            h.log(0, entry(ts));
        }
        let capacity = h.traces[&0].capacity();
        for ts in 1024..10_000 {
            h.log(0, entry(ts));
        }
        assert_eq!((h.traces[&0].len(), h.trace_dropped), (1024, 10_000 - 1024));
        assert_eq!(h.traces[&0].front().map(|e| e.ts_ns), Some(10_000 - 1024), "the oldest went");
        assert_eq!(h.traces[&0].capacity(), capacity, "a full log does not grow");
        // Another device's entries take room from the longest log.
        h.log(1, entry(1));
        h.log(1, entry(2));
        assert_eq!((h.traces[&0].len(), h.traces[&1].len(), h.trace_len), (1022, 2, 1024));
        // Equal logs: the last device's goes first, as when pushed before.
        let mut h = History::with_trace_cap(2);
        h.log(0, entry(1));
        h.log(1, entry(2));
        h.log(0, entry(3));
        assert_eq!((h.traces[&0].len(), h.traces[&1].len()), (1, 1), "device 0, longest counting the new entry, lost its oldest");
        assert_eq!(h.traces[&0].front().map(|e| e.ts_ns), Some(3));
        let mut none = History::with_trace_cap(0);
        none.log(0, entry(1));
        assert_eq!((none.trace_len, none.trace_dropped), (0, 1));
    }
}
