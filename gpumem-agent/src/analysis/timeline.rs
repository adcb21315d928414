//! A session over time, for reports: each process's live bytes per device
//! at every change, marks for OOMs and XIDs, NVML readings, and the sizes of
//! successful allocations. Built event by event by the pipeline.
use std::collections::BTreeMap;

use gpumem_common::Event;

use super::distributions::{size_bucket, Observation};
use crate::{
    record::{NvmlPoint, XidPoint},
    state::{Applied, State},
};

/// Points kept per (process, GPU) series; beyond it every other point goes
/// (a chart is 1100 pixels wide).
const MAX_POINTS: usize = 4000;

/// What a mark on the timeline is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// An allocation of `requested` bytes failed with out-of-memory.
    CudaOom {
        pid: u32,
        requested: u64,
    },
    /// The kernel's OOM killer killed the process.
    OomKill {
        pid: u32,
    },
    Xid {
        xid: u64,
    },
}

/// A mark on the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub t_s: f64,
    /// The GPU it concerns; None: the host (OOM kill).
    pub device: Option<i32>,
    pub kind: MarkKind,
}

#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// (pid, device) → (seconds into the session, live bytes), at each change.
    pub series: BTreeMap<(u32, i32), Vec<(f64, u64)>>,
    /// The same for the bytes of live tensors, where PyTorch's probes fired.
    pub allocated: BTreeMap<(u32, i32), Vec<(f64, u64)>>,
    pub comm: BTreeMap<u32, String>,
    pub marks: Vec<Mark>,
    pub nvml: Vec<NvmlPoint>,
    pub xids: Vec<XidPoint>,
    /// Successful allocations per size bucket (see `size_bucket`): bound → count.
    pub size_buckets: BTreeMap<u64, u64>,
    pub events: u64,
    /// CLOCK_MONOTONIC of the first event: event times count from it until
    /// `align` puts them on the session's clock.
    first_ns: Option<u64>,
}

impl Timeline {
    fn t(&mut self, ts_ns: u64) -> f64 {
        let first = *self.first_ns.get_or_insert(ts_ns);
        ts_ns.saturating_sub(first) as f64 / 1e9
    }

    fn point(&mut self, pid: u32, device: i32, t: f64, bytes: u64) {
        point(&mut self.series, (pid, device), t, bytes);
    }

    /// One applied event (`state` as it is after it).
    pub fn observe(&mut self, ev: &Event, applied: &Applied, obs: Option<&Observation>, state: &State) {
        self.events += 1;
        let t = self.t(ev.ts_ns);
        if let Some((_, size)) = obs.and_then(|o| o.allocation) {
            *self.size_buckets.entry(size_bucket(size)).or_default() += 1;
        }
        if let Some(oom) = &applied.cuda_oom {
            self.marks.push(Mark { t_s: t, device: Some(oom.device), kind: MarkKind::CudaOom { pid: ev.pid, requested: oom.requested } });
        }
        if applied.oom_kill.is_some() {
            self.marks.push(Mark { t_s: t, device: None, kind: MarkKind::OomKill { pid: ev.pid } });
        }
        let Some(p) = state.processes.get(&ev.pid) else { return };
        if !p.comm.is_empty() && self.comm.get(&ev.pid) != Some(&p.comm) {
            self.comm.insert(ev.pid, p.comm.clone());
        }
        for (&device, totals) in &p.held.devices {
            self.point(ev.pid, device, t, totals.live_bytes);
            if p.tensor_probes {
                point(&mut self.allocated, (ev.pid, device), t, totals.allocated_bytes);
            }
        }
        // A device the process no longer holds memory on (freed, exited) reads 0.
        let gone: Vec<i32> = self
            .series
            .range((ev.pid, i32::MIN)..=(ev.pid, i32::MAX))
            .map(|(&(_, d), _)| d)
            .filter(|d| !p.held.devices.contains_key(d))
            .collect();
        for device in gone {
            self.point(ev.pid, device, t, 0);
            if self.allocated.contains_key(&(ev.pid, device)) {
                point(&mut self.allocated, (ev.pid, device), t, 0);
            }
        }
    }

    pub fn nvml(&mut self, p: NvmlPoint) {
        self.nvml.push(p);
    }

    pub fn xid(&mut self, x: XidPoint) {
        self.marks.push(Mark { t_s: x.t_s, device: Some(x.gpu as i32), kind: MarkKind::Xid { xid: x.xid } });
        self.xids.push(x);
    }

    /// Puts event times on the session's clock (NVML and XID times count
    /// from its start), and the marks in time order.
    pub fn align(&mut self, started_ns: u64) {
        let offset = self.first_ns.map_or(0.0, |f| f.saturating_sub(started_ns) as f64 / 1e9);
        for s in self.series.values_mut().chain(self.allocated.values_mut()) {
            for p in s.iter_mut() {
                p.0 += offset;
            }
        }
        for m in self.marks.iter_mut().filter(|m| !matches!(m.kind, MarkKind::Xid { .. })) {
            m.t_s += offset;
        }
        self.marks.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    }

    /// Devices of the series and of the NVML readings.
    pub fn devices(&self) -> Vec<i32> {
        let mut d: Vec<i32> = self.series.keys().map(|&(_, dev)| dev).collect();
        d.extend(self.nvml.iter().map(|p| p.gpu as i32));
        d.sort_unstable();
        d.dedup();
        d
    }
}

/// A point of a series, kept only where the bytes changed; a long series
/// is thinned to every other point.
fn point(series: &mut BTreeMap<(u32, i32), Vec<(f64, u64)>>, key: (u32, i32), t: f64, bytes: u64) {
    let s = series.entry(key).or_default();
    if s.last().is_some_and(|&(_, b)| b == bytes) {
        return;
    }
    s.push((t, bytes));
    if s.len() > MAX_POINTS {
        let thinned: Vec<(f64, u64)> = s.iter().copied().step_by(2).collect();
        *s = thinned;
    }
}

#[cfg(test)]
mod tests {
    use gpumem_common::api;

    use super::*;
    use crate::{
        events::Kind,
        state::{testing::ev, Limits},
    };

    #[test]
    fn series_follow_live_bytes_and_read_zero_after_exit() {
        let mut s = State::new(Limits::default());
        let mut t = Timeline::default();
        let mut feed = |e: Event| {
            let kind = Kind::of(&e);
            let applied = s.apply_kind(&e, &kind, None);
            let obs = super::super::distributions::observe(&e, &kind, &applied);
            t.observe(&e, &applied, obs.as_ref(), &s);
        };
        feed(Event { ts_ns: 1_000_000_000, handle: 0xc, device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) });
        feed(Event { ts_ns: 1_000_000_000, handle: 0xc, ..ev(api::CU_CTX_SET_CURRENT) });
        feed(Event { ts_ns: 1_500_000_000, addr: 1, size: 3 << 20, ..ev(api::CU_MEM_ALLOC_V2) });
        feed(Event { ts_ns: 2_000_000_000, result: 2, size: 1 << 30, ..ev(api::CU_MEM_ALLOC_V2) });
        feed(Event { ts_ns: 3_000_000_000, ..ev(api::PROCESS_EXIT) });
        assert_eq!(t.series[&(100, 0)], [(0.5, 3 << 20), (2.0, 0)]);
        assert_eq!(t.size_buckets.get(&(4 << 20)), Some(&1));
        assert_eq!(t.marks.len(), 1);
        t.align(0);
        assert_eq!(t.series[&(100, 0)][0].0, 1.5, "on the session's clock");
        assert_eq!(t.marks[0].t_s, 2.0);
        assert_eq!(t.devices(), [0]);
    }
}
