//! The one path every event takes, live or replayed, in benchmarks and
//! property tests alike: decode → lookups → stacks → state → analyses.
//! `Pipeline::apply` is it; the rest feeds the analyses that are not per
//! event (growth samples, NVML readings, forgetting).
pub mod dmem;
pub mod host;
pub mod lookups;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use gpumem_common::{Event, StackEvent};
use rustc_hash::FxHashMap;

use crate::{
    analysis::{
        counters::EventCounts,
        distributions::{self, Distributions},
        health::{GpuWatch, Thresholds},
        history::History,
        leaks::{self, LeakGroup},
        oom::OomLog,
        owners,
        series::{self, GrowthTracker},
        timeline::Timeline,
        view::{self, View, ViewOptions},
        wind_down::{self, WoundDown},
    },
    events::Kind,
    model::{
        container::ContainerInfo,
        degraded::{Degradations, Reason},
        host::{HostMemory, ProcessHost},
        nvml::{GpuSample, Message},
        readings::{HostPoint, NvmlPoint, XidPoint},
    },
    stacks::{StackId, Stacks},
    state::{Applied, Limits, State},
};
pub use lookups::Lookups;

/// What `Pipeline::lookup` found.
struct Looked {
    /// Boxed: found once per process, and the struct is moved per event.
    container: Option<Box<ContainerInfo>>,
    memcg: Option<String>,
    host: Option<ProcessHost>,
}

/// Untraced processes NVML lists that are named at once, at most.
const UNTRACED_MAX: usize = 4096;

/// Top stacks kept per holder of a device that ran out of memory.
const OOM_HOLDER_STACKS: usize = 3;

#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub limits: Limits,
    /// Samples per growth series (the detector's window is this × the sampling interval).
    pub growth_samples: usize,
    /// Keep the session over time (reports).
    pub timeline: bool,
    /// Keep what the exports need that the state forgets (allocations made
    /// per stack, each device's memory actions): at most this many actions.
    pub history: Option<usize>,
    pub thresholds: Thresholds,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            growth_samples: series::SERIES_CAP,
            timeline: false,
            history: None,
            thresholds: Thresholds::default(),
        }
    }
}

/// How much the pipeline keeps per process, now and at most so far (as
/// sampled at each growth sample and forgetting): a table that only grows
/// under process churn shows here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kept {
    pub processes: usize,
    pub exited: usize,
    pub growth_series: usize,
    pub peak_processes: usize,
    pub peak_growth_series: usize,
}

/// The stack that came with an event.
pub enum Stack<'a> {
    None,
    /// Copied by the kernel: unwound here.
    Captured(&'a StackEvent),
    /// Unwound (and symbolized) when the event was recorded.
    Recorded(StackId),
}

/// What one event did.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub event: Event,
    pub kind: Kind,
    pub applied: Applied,
    pub stack: Option<StackId>,
    /// For a CUDA out-of-memory: each holder's top stacks on the device
    /// (in `applied.cuda_oom.holders` order).
    pub oom_stacks: Box<[Vec<LeakGroup>]>,
}

pub struct Pipeline {
    pub state: State,
    pub stacks: Stacks,
    pub lookups: Lookups,
    pub growth: GrowthTracker,
    pub distributions: Distributions,
    pub counts: EventCounts,
    pub ooms: OomLog,
    pub gpus: GpuWatch,
    pub timeline: Option<Timeline>,
    pub history: Option<History>,
    /// A replayed NVML reading, one point per GPU, until it is whole.
    recorded_reading: Vec<NvmlPoint>,
    pub kept: Kept,
    /// Processes NVML lists that made no traced call (they allocated before
    /// tracing began): their name and container, looked up once.
    pub untraced: FxHashMap<u32, (String, Option<ContainerInfo>)>,
    /// Which of those a session shows: all (None, system-wide) or these pids.
    pub untraced_scope: Option<Vec<u32>>,
    /// The traced processes' host memory, the node's swap and their memory
    /// cgroups, as last refreshed (`refresh_host`).
    pub host: HostMemory,
    /// What exited processes had piled up when they wound down, the most recent last.
    pub wound_down: VecDeque<WoundDown>,
    /// The latest event's time (growth samples are placed by it).
    pub last_event_ns: u64,
    /// Processes served less than exactly, and why.
    pub degraded: Degradations,
}

impl Pipeline {
    pub fn new(o: Options, lookups: Lookups) -> Self {
        Pipeline {
            state: State::new(o.limits),
            stacks: Stacks::default(),
            lookups,
            growth: GrowthTracker::with_capacity(o.growth_samples),
            distributions: Distributions::default(),
            counts: EventCounts::default(),
            ooms: OomLog::default(),
            gpus: GpuWatch::new(o.thresholds),
            timeline: o.timeline.then(Timeline::default),
            history: o.history.map(History::with_trace_cap),
            recorded_reading: Vec::new(),
            kept: Kept::default(),
            untraced: FxHashMap::default(),
            untraced_scope: None,
            host: HostMemory::default(),
            wound_down: VecDeque::new(),
            last_event_ns: 0,
            degraded: Degradations::default(),
        }
    }

    /// One event, through everything.
    pub fn apply(&mut self, ev: &Event, stack: Stack<'_>) -> Outcome {
        if !self.recorded_reading.is_empty() {
            self.apply_recorded_reading();
        }
        let kind = Kind::of(ev);
        let looked = self.lookup(ev, &kind);
        // Read a new process's mappings while it is alive: it may exit soon
        // after its allocations, before their stacks are unwound.
        if self.lookups.is_live() && !matches!(kind, Kind::Exit | Kind::OomKill(_)) && !self.state.processes.contains_key(&ev.pid) {
            self.stacks.prepare(ev.pid);
        }
        self.stacks.count_sampling(ev.flags);
        let stack = match stack {
            Stack::None => None,
            Stack::Captured(s) => self.stacks.record(s),
            Stack::Recorded(id) => Some(id),
        };
        if self.stacks.has_degraded() {
            for (pid, reason, why) in self.stacks.take_degraded() {
                self.degraded.add(pid, reason, why);
            }
        }
        self.last_event_ns = self.last_event_ns.max(ev.ts_ns);
        if matches!(kind, Kind::Exit) {
            self.keep_wind_down(ev);
        }
        let mut applied = self.state.apply_kind(ev, &kind, stack);
        self.looked_up(ev, looked, &mut applied);
        self.forget_forgotten();
        if matches!(kind, Kind::Exit) {
            self.stacks.forget_process(ev.pid);
        }
        let oom_stacks = self.oom_stacks(ev, &applied);
        let obs = distributions::observe(ev, &kind, &applied);
        if let Some(o) = &obs {
            self.distributions.record(o);
        }
        self.counts.observe(ev, &kind, &applied);
        self.ooms.observe(ev, &kind, &applied, &oom_stacks);
        if let Some(t) = self.timeline.as_mut() {
            t.observe(ev, &applied, obs.as_ref(), &self.state);
        }
        if let Some(h) = self.history.as_mut() {
            h.observe(ev, &kind, &applied, stack, self.stacks.sample_bytes);
        }
        Outcome { event: *ev, kind, applied, stack, oom_stacks }
    }

    /// The stack of an allocation rebuilt from the kernel's table, from its
    /// ring event: unwound and set on the allocation (or VMM handle). Its id
    /// and the allocation's device, if the allocation is held.
    pub fn adopt_stack(&mut self, s: &gpumem_common::StackEvent) -> Option<(StackId, i32)> {
        let id = self.stacks.record(s)?;
        let device = self.state.set_stack(&s.event, id)?;
        Some((id, device))
    }

    /// What is looked up about a process while it is alive, before its event
    /// is applied: its container, once (a process already gone when its
    /// first event is read keeps trying on the next), and for an OOM kill the
    /// memory cgroup it happened in.
    fn lookup(&mut self, ev: &Event, kind: &Kind) -> Looked {
        let known = self.state.processes.get(&ev.pid);
        let wants_container = match known {
            None => !matches!(kind, Kind::Exit | Kind::OomKill(_)),
            // An exited process's pid may be reused by this event's process.
            Some(p) => !matches!(kind, Kind::Exit) && (p.container.is_none() || p.exited),
        };
        let (memcg, host) = match kind {
            Kind::OomKill(_) => {
                // The victim may already be gone; the triggering task shares its cgroup in a memcg OOM.
                let limit_file = known.and_then(|p| p.container.as_ref()).and_then(|c| c.memory_limit_file.clone());
                let memcg = self.lookups.memcg(ev.pid, ev.tid, limit_file.as_ref());
                (memcg, self.lookups.victim_host(ev.pid, self.host.processes.get(&ev.pid).copied()))
            }
            _ => (None, None),
        };
        Looked { container: if wants_container { self.lookups.container(ev.pid).map(Box::new) } else { None }, memcg, host }
    }

    fn looked_up(&mut self, ev: &Event, looked: Looked, applied: &mut Applied) {
        if let Some(kill) = applied.oom_kill.as_mut() {
            kill.memcg = looked.memcg;
            kill.host = looked.host;
            kill.pinned_host_bytes = self.state.processes.get(&ev.pid).map_or(0, |p| p.held.pinned.bytes);
        }
        if let (Some(c), Some(p)) = (looked.container, self.state.processes.get_mut(&ev.pid)) {
            if let Some(why) = &c.forged_cgroup {
                self.degraded.add(ev.pid, Reason::ForgedCgroup, why.clone());
            }
            if p.container.is_none() {
                p.container = Some(*c);
            }
        }
    }

    /// A process about to exit: what its groups held as it wound down (before the exit releases it).
    fn keep_wind_down(&mut self, ev: &Event) {
        let Some(p) = self.state.processes.get(&ev.pid).filter(|p| !p.exited) else { return };
        for w in wind_down::wind_down(p, ev.ts_ns, &mut self.stacks, &mut self.growth) {
            if self.wound_down.len() == wind_down::PROCESSES_KEPT {
                self.wound_down.pop_front();
            }
            self.wound_down.push_back(w);
        }
    }

    /// Who held the device, and from where, when an allocation ran out of memory.
    #[inline]
    fn oom_stacks(&mut self, ev: &Event, applied: &Applied) -> Box<[Vec<LeakGroup>]> {
        match &applied.cuda_oom {
            None => Box::default(),
            Some(oom) => self.holder_stacks(ev, oom),
        }
    }

    #[cold]
    fn holder_stacks(&mut self, ev: &Event, oom: &crate::state::CudaOom) -> Box<[Vec<LeakGroup>]> {
        oom.holders
            .iter()
            .map(|h| match self.state.processes.get(&h.pid) {
                Some(p) => leaks::top_stacks(p, oom.device, &mut self.stacks, &mut self.growth, OOM_HOLDER_STACKS, ev.ts_ns),
                None => Vec::new(),
            })
            .collect()
    }

    /// Whatever else is kept per process goes when the state forgets one
    /// (inlined for the check every event makes).
    #[inline]
    fn forget_forgotten(&mut self) {
        if self.state.has_forgotten() {
            self.forget_now();
        }
    }

    #[cold]
    fn forget_now(&mut self) {
        for pid in self.state.take_forgotten() {
            self.growth.forget(pid);
            self.stacks.forget_process(pid);
            if let Some(h) = self.history.as_mut() {
                h.forget(pid);
            }
        }
    }

    /// Forgets processes that exited before `cutoff_ns`, everywhere they are kept.
    pub fn forget_exited_before(&mut self, cutoff_ns: u64) -> Vec<u32> {
        self.note_kept();
        let gone = self.state.forget_exited_before(cutoff_ns);
        self.forget_forgotten();
        self.note_kept();
        gone
    }

    /// A sample of every process's live bytes for the growth detector.
    pub fn sample_growth(&mut self, t_s: f64) {
        self.growth.sample(&self.state, t_s, self.last_event_ns);
        self.note_kept();
    }

    /// The agent's heap by owner (estimated from the tables, see `heap`).
    pub fn heap(&self) -> crate::heap::Parts {
        let (stacks, python) = self.stacks.heap_bytes();
        crate::heap::Parts {
            state: self.state.heap_bytes(),
            stacks,
            unwind: self.stacks.unwind_table_bytes(),
            python,
            growth: self.growth.heap_bytes(),
            history: self.history.as_ref().map_or(0, History::heap_bytes),
        }
    }

    /// How much is kept now, and the most so far.
    pub fn note_kept(&mut self) {
        let k = &mut self.kept;
        k.processes = self.state.processes.len();
        k.exited = self.state.processes.values().filter(|p| p.exited).count();
        k.growth_series = self.growth.len();
        k.peak_processes = k.peak_processes.max(k.processes);
        k.peak_growth_series = k.peak_growth_series.max(k.growth_series);
    }

    /// A message from the NVML thread.
    pub fn nvml(&mut self, m: Message) {
        match m {
            Message::Reading { gpus, at_s } => {
                self.state.assume_devices(&gpus);
                self.look_up_untraced(&gpus);
                self.gpus.reading(gpus, at_s);
            }
            Message::Unavailable(why) => self.gpus.failed(why),
            Message::Xid(x) => {
                self.counts.xid(x.gpu, x.xid);
                self.gpus.xid(x);
            }
        }
    }

    /// Names the processes NVML lists that no traced call came from; forgets
    /// the ones it no longer lists.
    fn look_up_untraced(&mut self, gpus: &[GpuSample]) {
        let listed: Vec<u32> = gpus.iter().flat_map(|g| g.processes.iter().flatten().map(|&(pid, _)| pid)).collect();
        self.untraced.retain(|pid, _| listed.contains(pid));
        for pid in listed {
            let traced = self.state.processes.get(&pid).is_some_and(|p| !p.exited);
            if traced || self.untraced.contains_key(&pid) || self.untraced.len() >= UNTRACED_MAX {
                continue;
            }
            if let Some(found) = self.lookups.untraced(pid) {
                self.untraced.insert(pid, found);
            }
        }
    }

    /// One GPU's NVML reading from a recording. A reading is every GPU's
    /// point at one time: it is applied whole, before the next event.
    pub fn recorded_nvml(&mut self, p: NvmlPoint) {
        if self.recorded_reading.first().is_some_and(|first| first.t_s != p.t_s) {
            self.apply_recorded_reading();
        }
        self.recorded_reading.push(p.clone());
        if let Some(t) = self.timeline.as_mut() {
            t.nvml(p);
        }
    }

    /// The processes a recorded reading lists per GPU, as a live reading would place them.
    pub fn apply_recorded_reading(&mut self) {
        let gpus: Vec<GpuSample> =
            self.recorded_reading.drain(..).map(|p| GpuSample { index: p.gpu, processes: p.processes, ..Default::default() }).collect();
        if gpus.iter().any(|g| g.processes.is_some()) {
            self.state.assume_devices(&gpus);
        }
    }

    /// An XID from a recording.
    pub fn recorded_xid(&mut self, x: XidPoint) {
        self.counts.xid(x.gpu, x.xid);
        if let Some(t) = self.timeline.as_mut() {
            t.xid(x);
        }
    }

    /// Reads the host memory of the live traced processes again (live only).
    pub fn refresh_host(&mut self) {
        if self.lookups.is_live() {
            let gpu_nodes: Vec<(u32, u32)> = self.gpus.latest.iter().filter_map(|g| Some((g.index, g.numa_node?))).collect();
            self.host.refresh(&self.state, &gpu_nodes);
        }
    }

    /// A session's reading of the host memory, `t_s` into it: read now
    /// (live) and kept on the timeline.
    pub fn sample_host(&mut self, t_s: f64) {
        self.refresh_host();
        if let Some(t) = self.timeline.as_mut() {
            t.host(t_s, &self.host);
        }
    }

    /// A reading of the host memory from a recording: what the outputs show
    /// as the host's, and a point of the timeline.
    pub fn recorded_host(&mut self, p: HostPoint) {
        self.host = p.host;
        self.host.refreshed = true;
        if let Some(t) = self.timeline.as_mut() {
            t.host(p.t_s, &self.host);
        }
    }

    /// Traced bytes against NVML's per process and GPU, an MPS server's
    /// against its traced clients.
    pub fn reconciliation(&self) -> Vec<crate::analysis::reconcile::Reconciliation> {
        let mut rows = crate::analysis::reconcile::reconcile(&self.state, &self.gpus.latest);
        self.account_mps(&mut rows);
        rows
    }

    /// MPS servers among the untraced processes NVML lists, by their names.
    fn account_mps(&self, rows: &mut [crate::analysis::reconcile::Reconciliation]) {
        let comm_of = |pid: u32| self.untraced.get(&pid).map(|(comm, _)| comm.clone());
        crate::analysis::reconcile::account_mps(rows, &self.state, &self.gpus.latest, comm_of);
    }

    /// Where things stand now.
    pub fn view(&mut self, o: &ViewOptions) -> View {
        let mut v = View::build(&self.state, &mut self.growth, &self.gpus, o);
        self.account_mps(&mut v.reconciliation);
        if o.owners {
            // One walk of a process's allocations serves all its devices' rows.
            let mut walked: FxHashMap<u32, Vec<(i32, Vec<owners::OwnerBytes>)>> = FxHashMap::default();
            for r in v.rows.iter_mut().filter(|r| !r.exited) {
                let Some(p) = self.state.processes.get(&r.pid) else { continue };
                let per_dev = walked.entry(r.pid).or_insert_with(|| owners::by_owner(p, &mut self.stacks));
                // Each (process, device) row is visited once: its owners are taken, not copied.
                let owners = per_dev.iter_mut().find(|(d, _)| *d == r.device).map(|(_, o)| std::mem::take(o)).unwrap_or_default();
                let mut b = crate::analysis::breakdown::of(p, r.device, owners);
                b.overhead = crate::analysis::breakdown::Overhead::of(r.pid, &r.placement, r.totals.live_bytes, &self.gpus);
                r.breakdown = Some(Box::new(b));
            }
        }
        v.untraced = view::untraced(&self.state, &v.reconciliation, &self.untraced, self.untraced_scope.as_deref());
        v
    }

    /// The processes NVML lists that no traced call came from (what `view`
    /// has in `untraced`, without building the rest of a view).
    pub fn untraced_rows(&self) -> Vec<view::UntracedRow> {
        let reconciliation = self.reconciliation();
        view::untraced(&self.state, &reconciliation, &self.untraced, self.untraced_scope.as_deref())
    }
}
