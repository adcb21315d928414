//! One event into the agent's state: its stack unwound, the state updated,
//! the process's container looked up once, OOM kills placed in their memory
//! cgroup. Shared by `trace`/`leaks` (which print) and `serve` (which exports).
use rustc_hash::FxHashMap as HashMap;

use gpumem_common::{api, Event, StackEvent};

use crate::{
    analysis::leaks::{self, GrowthTracker},
    record::{Footer, Header, Lookup, ReadError, Reader, Record},
    stacks::{StackId, Stacks},
    state::{
        container::{self, ContainerInfo},
        Applied, State,
    },
};

/// Where what the agent looks up about a process comes from: /proc while
/// tracing (kept in `log` when recording), the recording when replaying.
pub enum Lookups {
    Live { log: Option<Vec<Lookup>> },
    Recorded { containers: HashMap<u32, ContainerInfo>, memcg: HashMap<u32, String> },
}

impl Lookups {
    fn container(&mut self, pid: u32) -> Option<ContainerInfo> {
        match self {
            Lookups::Live { log } => {
                let c = container::lookup(pid);
                if let (Some(log), Some(c)) = (log, &c) {
                    log.push(Lookup { pid, container: Some(c.clone()), memcg: None });
                }
                c
            }
            Lookups::Recorded { containers, .. } => containers.remove(&pid),
        }
    }

    /// `known`: the memory cgroup read while the process was alive, for when
    /// the victim is already gone (its cgroup directory is still there).
    fn memcg(&mut self, pid: u32, tid: u32, known: Option<&(String, String)>) -> Option<String> {
        match self {
            Lookups::Live { log } => {
                let m = container::limited_memory_cgroup(pid)
                    .or_else(|| container::limited_memory_cgroup(tid))
                    .or_else(|| known.and_then(container::limited));
                if let (Some(log), Some(m)) = (log, &m) {
                    log.push(Lookup { pid, container: None, memcg: Some(m.clone()) });
                }
                m
            }
            Lookups::Recorded { memcg, .. } => memcg.remove(&pid),
        }
    }

    /// A recorded lookup, for the events that follow it.
    pub fn add(&mut self, l: Lookup) {
        if let Lookups::Recorded { containers, memcg } = self {
            if let Some(c) = l.container {
                containers.insert(l.pid, c);
            }
            if let Some(m) = l.memcg {
                memcg.insert(l.pid, m);
            }
        }
    }

    /// The lookups made since the last call (when recording).
    pub fn take_log(&mut self) -> Vec<Lookup> {
        match self {
            Lookups::Live { log: Some(log) } => std::mem::take(log),
            _ => Vec::new(),
        }
    }
}

pub struct Ingest {
    pub state: State,
    pub stacks: Stacks,
    pub lookups: Lookups,
}

/// What one event did.
pub struct Ingested {
    pub applied: Applied,
    /// For a CUDA out-of-memory: the top stacks of each holder of the device
    /// (in `applied.cuda_oom.holders` order), as JSON.
    pub oom_stacks: Vec<serde_json::Value>,
}

impl Ingest {
    /// Tracing; `recording` keeps a log of the lookups for the recording.
    pub fn live(state: State, recording: bool) -> Self {
        Ingest { state, stacks: Stacks::default(), lookups: Lookups::Live { log: recording.then(Vec::new) } }
    }

    /// Replaying a recording.
    pub fn replay(state: State) -> Self {
        Ingest { state, stacks: Stacks::default(), lookups: Lookups::Recorded { containers: HashMap::default(), memcg: HashMap::default() } }
    }

    /// A traced event with the stack the kernel copied, unwound here.
    pub fn event(&mut self, ev: &Event, stack: Option<&StackEvent>) -> (Ingested, Option<StackId>) {
        if ev.api != api::PROCESS_EXIT && ev.api != api::OOM_KILL && !self.state.processes.contains_key(&ev.pid) {
            self.stacks.prepare(ev.pid);
        }
        let stack_id = stack.and_then(|s| self.stacks.record(s));
        (self.apply(ev, stack_id), stack_id)
    }

    /// A recorded event, whose stack was unwound when it was recorded.
    pub fn recorded_event(&mut self, ev: &Event, stack_id: Option<StackId>) -> Ingested {
        self.apply(ev, stack_id)
    }

    fn apply(&mut self, ev: &Event, stack_id: Option<StackId>) -> Ingested {
        let mut applied = self.state.apply_with_stack(ev, stack_id);
        // Who held the device, and from where, when an allocation ran out of memory.
        let mut oom_stacks = Vec::new();
        if let Some(oom) = &applied.cuda_oom {
            for h in &oom.holders {
                let groups = self.state.processes.get(&h.pid).map(|p| leaks::top_stacks(p, oom.device, &mut self.stacks, 3, ev.ts_ns));
                oom_stacks.push(serde_json::to_value(groups.unwrap_or_default()).unwrap_or_default());
            }
        }
        if ev.api == api::PROCESS_EXIT {
            self.stacks.forget_process(ev.pid);
        }
        if let Some(kill) = applied.oom_kill.as_mut() {
            // The victim may already be gone; the triggering task shares its cgroup in a memcg OOM.
            let known = self.state.processes.get(&ev.pid).and_then(|p| p.container.as_ref()).and_then(|c| c.memory_limit_file.as_ref());
            kill.memcg = self.lookups.memcg(ev.pid, ev.tid, known);
        }
        // Looked up once per process, while it is alive; a process that is
        // already gone when its first event is read keeps trying on the next.
        if let Some(p) = self.state.processes.get_mut(&ev.pid) {
            if p.container.is_none() && ev.api != api::PROCESS_EXIT {
                p.container = self.lookups.container(ev.pid);
            }
        }
        Ingested { applied, oom_stacks }
    }
}

/// What a replay feeds: the ingest path and growth detector, and whatever
/// the command does with each applied event.
pub trait Replayer {
    fn parts(&mut self) -> (&mut Ingest, &mut GrowthTracker);
    /// One applied event; false stops the replay.
    fn after(&mut self, ev: &Event, ingested: Ingested) -> bool;
    /// NVML readings and XIDs recorded during the session.
    fn nvml(&mut self, _point: crate::record::NvmlPoint) {}
    fn xid(&mut self, _xid: crate::record::XidPoint) {}
}

/// How a replay ended.
pub struct Replayed {
    pub header: Option<Header>,
    /// The recording's footer, or one made from what was read.
    pub footer: Footer,
    /// The footer was there: the session finished.
    pub complete: bool,
    /// Where and why reading stopped early.
    pub damage: Option<ReadError>,
    pub events: u64,
}

/// Feeds a recording through the same state and analyses as a live session:
/// stacks and lookups as recorded, growth samples where they were taken.
pub fn replay<R: std::io::Read>(reader: &mut Reader<R>, r: &mut impl Replayer) -> Replayed {
    let (mut header, mut footer, mut damage): (Option<Header>, _, _) = (None, None, None);
    let mut last_ts = 0;
    while let Some(rec) = reader.next_record() {
        match rec {
            Ok(Record::Header(h)) => header = Some(h),
            Ok(Record::Event { event, stack }) => {
                last_ts = event.ts_ns;
                let ingested = r.parts().0.recorded_event(&event, stack);
                if !r.after(&event, ingested) {
                    break;
                }
            }
            Ok(Record::Stack { id, frames }) => r.parts().0.stacks.insert_symbolized(id, frames),
            Ok(Record::Lookup(l)) => r.parts().0.lookups.add(l),
            Ok(Record::Tick(t)) => {
                let (ingest, growth) = r.parts();
                growth.sample(&ingest.state, t);
            }
            Ok(Record::Nvml(p)) => r.nvml(p),
            Ok(Record::Xid(x)) => r.xid(x),
            Ok(Record::Footer(f)) => footer = Some(f),
            Err(e) => {
                damage = Some(e);
                break;
            }
        }
    }
    let complete = footer.is_some();
    let footer = footer.unwrap_or_else(|| Footer {
        duration_s: header.as_ref().map_or(0.0, |h| last_ts.saturating_sub(h.started_ns) as f64 / 1e9),
        ended_ns: last_ts,
        nvml: "unknown: the recording has no footer".into(),
        ..Default::default()
    });
    Replayed { header, footer, complete, damage, events: reader.events }
}
