//! A session over time, for reports: each process's live bytes per device
//! at every change, marks for OOMs and XIDs, NVML readings, the sizes of
//! successful allocations, and the host side (resident, swapped-out and
//! pinned host memory per process, the node's swap, the containers' memory
//! cgroups) on the same clock. Built event by event by the pipeline.
use std::collections::BTreeMap;

use gpumem_common::Event;

use super::distributions::{size_bucket, Observation};
use crate::{
    model::{
        host::HostMemory,
        readings::{NvmlPoint, XidPoint},
    },
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

/// A container's memory cgroup over time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupSeries {
    /// A traced process in it (whose container names it).
    pub pid: u32,
    pub usage: Vec<(f64, u64)>,
    /// The limit at the last reading (None: unlimited).
    pub limit: Option<u64>,
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
    /// Pinned host bytes each process held, at each change.
    pub pinned: BTreeMap<u32, Vec<(f64, u64)>>,
    /// Host memory readings: each process's resident and swapped-out bytes.
    pub resident: BTreeMap<u32, Vec<(f64, u64)>>,
    pub swapped: BTreeMap<u32, Vec<(f64, u64)>>,
    /// The node's swap counters at each reading: (seconds, bytes in, bytes out since boot).
    pub node_swap: Vec<(f64, u64, u64)>,
    /// The traced containers' memory cgroups, by path.
    pub cgroups: BTreeMap<String, CgroupSeries>,
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
        point(self.series.entry((pid, device)).or_default(), t, bytes);
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
        if p.held.pinned.bytes > 0 || self.pinned.contains_key(&ev.pid) {
            point(self.pinned.entry(ev.pid).or_default(), t, p.held.pinned.bytes);
        }
        for (&device, totals) in &p.held.devices {
            self.point(ev.pid, device, t, totals.live_bytes);
            if p.tensor_probes {
                point(self.allocated.entry((ev.pid, device)).or_default(), t, totals.allocated_bytes);
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
            if let Some(s) = self.allocated.get_mut(&(ev.pid, device)) {
                point(s, t, 0);
            }
        }
    }

    pub fn nvml(&mut self, p: NvmlPoint) {
        self.nvml.push(p);
    }

    /// A reading of the host memory, `t_s` into the session. A process
    /// missing from it (it exited) reads 0 from then on.
    pub fn host(&mut self, t_s: f64, h: &HostMemory) {
        for (&pid, p) in &h.processes {
            point(self.resident.entry(pid).or_default(), t_s, p.resident_bytes);
            point(self.swapped.entry(pid).or_default(), t_s, p.swap_bytes);
        }
        for (pid, s) in self.resident.iter_mut().chain(self.swapped.iter_mut()) {
            if !h.processes.contains_key(pid) {
                point(s, t_s, 0);
            }
        }
        if let (Some(i), Some(o)) = (h.swap_in_bytes, h.swap_out_bytes) {
            self.node_swap.push((t_s, i, o));
            if self.node_swap.len() > MAX_POINTS {
                self.node_swap = self.node_swap.iter().copied().step_by(2).collect();
            }
        }
        for (path, c) in &h.cgroups {
            let s = self.cgroups.entry(path.clone()).or_insert_with(|| CgroupSeries { pid: c.pid, ..Default::default() });
            point(&mut s.usage, t_s, c.usage_bytes);
            s.limit = c.limit_bytes;
        }
    }

    pub fn xid(&mut self, x: XidPoint) {
        self.marks.push(Mark { t_s: x.t_s, device: Some(x.gpu as i32), kind: MarkKind::Xid { xid: x.xid } });
        self.xids.push(x);
    }

    /// Puts event times on the session's clock (NVML, XID and host times
    /// count from its start), and the marks in time order.
    pub fn align(&mut self, started_ns: u64) {
        let offset = self.first_ns.map_or(0.0, |f| f.saturating_sub(started_ns) as f64 / 1e9);
        for s in self.series.values_mut().chain(self.allocated.values_mut()).chain(self.pinned.values_mut()) {
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
fn point(s: &mut Vec<(f64, u64)>, t: f64, bytes: u64) {
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
        feed(Event { ts_ns: 1_600_000_000, addr: 0x7f00_0000, size: 1 << 20, ..ev(api::CU_MEM_HOST_ALLOC) });
        feed(Event { ts_ns: 2_000_000_000, result: 2, size: 1 << 30, ..ev(api::CU_MEM_ALLOC_V2) });
        feed(Event { ts_ns: 3_000_000_000, ..ev(api::PROCESS_EXIT) });
        assert_eq!(t.series[&(100, 0)], [(0.5, 3 << 20), (2.0, 0)]);
        let pinned: Vec<u64> = t.pinned[&100].iter().map(|p| p.1).collect();
        assert_eq!(pinned, [1 << 20, 0], "pinned host memory, freed at exit");
        assert_eq!(t.size_buckets.get(&(4 << 20)), Some(&1));
        assert_eq!(t.marks.len(), 1);
        t.align(0);
        assert_eq!(t.series[&(100, 0)][0].0, 1.5, "on the session's clock");
        assert_eq!(t.pinned[&100][0].0, 1.6);
        assert_eq!(t.marks[0].t_s, 2.0);
        assert_eq!(t.devices(), [0]);
    }

    #[test]
    fn host_readings_are_series_on_the_session_clock_and_an_exited_process_reads_zero() {
        use crate::model::host::{CgroupMemory, ProcessHost};
        let mut t = Timeline::default();
        let mut h = HostMemory { swap_in_bytes: Some(0), swap_out_bytes: Some(4096), ..Default::default() };
        h.processes.insert(7, ProcessHost { resident_bytes: 10 << 20, swap_bytes: 0 });
        h.cgroups.insert("/pod".into(), CgroupMemory { usage_bytes: 1 << 20, limit_bytes: Some(1 << 30), pid: 7 });
        t.host(1.0, &h);
        h.processes.insert(7, ProcessHost { resident_bytes: 12 << 20, swap_bytes: 4096 });
        t.host(2.0, &h);
        h.processes.clear();
        t.host(3.0, &h);
        t.host(4.0, &h);
        assert_eq!(t.resident[&7], [(1.0, 10 << 20), (2.0, 12 << 20), (3.0, 0)]);
        assert_eq!(t.swapped[&7], [(1.0, 0), (2.0, 4096), (3.0, 0)]);
        assert_eq!(t.node_swap.len(), 4);
        assert_eq!(t.cgroups["/pod"], CgroupSeries { pid: 7, usage: vec![(1.0, 1 << 20)], limit: Some(1 << 30) });
        t.align(0);
        assert_eq!(t.resident[&7][0].0, 1.0, "host readings are on the session's clock already");
    }
}
