//! Counts of what happened, event by event: calls by API and result, CUDA
//! out-of-memory failures, OOM kills, exits holding memory, XIDs. The
//! exporter renders them as counters; nothing here is ever reset.
use std::collections::BTreeMap;

use gpumem_common::Event;
use rustc_hash::FxHashMap;

use crate::{events::Kind, state::Applied};

/// Where a host OOM kill happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KillSource {
    /// Memory was short host-wide.
    Host,
    /// A memory cgroup with a limit.
    Memcg,
}

impl KillSource {
    pub const ALL: [KillSource; 2] = [KillSource::Host, KillSource::Memcg];

    pub fn label(self) -> &'static str {
        match self {
            KillSource::Host => "host",
            KillSource::Memcg => "memcg",
        }
    }
}

/// CUDA out-of-memory failures on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomCount {
    pub all: u64,
    /// Of them, while the process had seen enough reported free.
    pub fragmentation: u64,
}

#[derive(Clone, Debug, Default)]
pub struct EventCounts {
    /// Successful calls per API id (ids are small and dense).
    succeeded: Vec<u64>,
    /// Failed calls per (API, CUresult or RM status).
    failed: FxHashMap<(u32, u32), u64>,
    /// Device → CUDA out-of-memory failures.
    pub cuda_ooms: BTreeMap<i32, OomCount>,
    pub oom_kills: BTreeMap<KillSource, u64>,
    /// Device → processes that exited holding memory on it.
    pub exits: BTreeMap<i32, u64>,
    /// (GPU index, XID) → events.
    pub xids: BTreeMap<(u32, u64), u64>,
}

impl EventCounts {
    /// Counts one event after the state applied it (and the OOM kill's
    /// memory cgroup was looked up).
    /// Inlined for the common case, a successful call of an API already
    /// counted once; the rest out of line.
    #[inline]
    pub fn observe(&mut self, ev: &Event, kind: &Kind, applied: &Applied) {
        let call = matches!(kind, Kind::Cuda(_) | Kind::Rm(_) | Kind::Uvm(_) | Kind::TensorAlloc | Kind::TensorFree);
        if call && ev.result == 0 && applied.cuda_oom.is_none() {
            if let Some(n) = self.succeeded.get_mut(ev.api as usize) {
                *n += 1;
                return;
            }
        }
        self.observe_rest(ev, kind, applied);
    }

    #[inline(never)]
    fn observe_rest(&mut self, ev: &Event, kind: &Kind, applied: &Applied) {
        match kind {
            Kind::Cuda(_) | Kind::Rm(_) | Kind::Uvm(_) | Kind::TensorAlloc | Kind::TensorFree => {
                if ev.result == 0 {
                    let i = ev.api as usize;
                    if i >= self.succeeded.len() {
                        self.succeeded.resize((gpumem_common::api::MAX as usize + 1).max(i + 1), 0);
                    }
                    self.succeeded[i] += 1;
                } else {
                    *self.failed.entry((ev.api, ev.result)).or_default() += 1;
                }
            }
            Kind::Exit => {
                for r in &applied.released {
                    *self.exits.entry(r.device).or_default() += 1;
                }
            }
            Kind::OomKill(_) => {
                let source =
                    if applied.oom_kill.as_ref().is_some_and(|k| k.memcg.is_some()) { KillSource::Memcg } else { KillSource::Host };
                *self.oom_kills.entry(source).or_default() += 1;
            }
            Kind::Unknown => {}
        }
        if let Some(oom) = &applied.cuda_oom {
            let n = self.cuda_ooms.entry(oom.device).or_default();
            n.all += 1;
            n.fragmentation += oom.fragmentation as u64;
        }
    }

    pub fn xid(&mut self, gpu: u32, xid: u64) {
        *self.xids.entry((gpu, xid)).or_default() += 1;
    }

    /// (API, result) → calls, in a stable order; result 0 is success.
    pub fn api_calls(&self) -> BTreeMap<(u32, u32), u64> {
        let mut out: BTreeMap<(u32, u32), u64> = self.failed.iter().map(|(&k, &v)| (k, v)).collect();
        out.extend(self.succeeded.iter().enumerate().filter(|(_, &n)| n > 0).map(|(api, &n)| ((api as u32, 0), n)));
        out
    }
}

#[cfg(test)]
mod tests {
    use gpumem_common::api;

    use super::*;
    use crate::state::{testing::ev, Limits, State};

    #[test]
    fn calls_failures_ooms_exits_and_kills() {
        let mut s = State::new(Limits::default());
        let mut c = EventCounts::default();
        let mut feed = |e: Event| {
            let kind = Kind::of(&e);
            let applied = s.apply_kind(&e, &kind, None);
            c.observe(&e, &kind, &applied);
        };
        feed(Event { handle: 0xc, device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) });
        feed(Event { handle: 0xc, ..ev(api::CU_CTX_SET_CURRENT) });
        feed(Event { addr: 1, size: 10, ..ev(api::CU_MEM_ALLOC_V2) });
        feed(Event { result: 2, size: 1 << 30, ..ev(api::CU_MEM_ALLOC_V2) });
        feed(Event { pid: 9, tid: 9, ..ev(api::OOM_KILL) });
        feed(ev(api::PROCESS_EXIT));
        feed(Event::empty(999));
        let calls: Vec<((u32, u32), u64)> = c.api_calls().into_iter().collect();
        assert_eq!(
            calls,
            [
                ((api::CU_MEM_ALLOC_V2, 0), 1),
                ((api::CU_MEM_ALLOC_V2, 2), 1),
                ((api::CU_DEVICE_PRIMARY_CTX_RETAIN, 0), 1),
                ((api::CU_CTX_SET_CURRENT, 0), 1)
            ]
        );
        assert_eq!(c.cuda_ooms.get(&0), Some(&OomCount { all: 1, fragmentation: 0 }));
        assert_eq!(c.exits.get(&0), Some(&1));
        assert_eq!(c.oom_kills.get(&KillSource::Host), Some(&1));
    }
}
