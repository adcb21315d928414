//! One event into the agent's state: its stack unwound, the state updated,
//! the process's container looked up once, OOM kills placed in their memory
//! cgroup. Shared by `trace`/`leaks` (which print) and `serve` (which exports).
use gpumem_common::{api, Event, StackEvent};

use crate::{
    analysis::leaks,
    state::{container, Applied, State},
    stacks::Stacks,
};

pub struct Ingest {
    pub state: State,
    pub stacks: Stacks,
}

/// What one event did.
pub struct Ingested {
    pub applied: Applied,
    /// For a CUDA out-of-memory: the top stacks of each holder of the device
    /// (in `applied.cuda_oom.holders` order), as JSON.
    pub oom_stacks: Vec<serde_json::Value>,
}

impl Ingest {
    pub fn new(state: State) -> Self {
        Ingest { state, stacks: Stacks::default() }
    }

    pub fn event(&mut self, ev: &Event, stack: Option<&StackEvent>) -> Ingested {
        if ev.api != api::PROCESS_EXIT && ev.api != api::OOM_KILL && !self.state.processes.contains_key(&ev.pid) {
            self.stacks.prepare(ev.pid);
        }
        let stack_id = stack.and_then(|s| self.stacks.record(s));
        let mut applied = self.state.apply_with_stack(ev, stack_id);
        // Who held the device, and from where, when an allocation ran out of memory.
        let mut oom_stacks = Vec::new();
        if let Some(oom) = &applied.cuda_oom {
            for h in &oom.holders {
                let groups = self.state.processes.get(&h.pid).map(|p| leaks::top_stacks(p, oom.device, &mut self.stacks, 3));
                oom_stacks.push(serde_json::to_value(groups.unwrap_or_default()).unwrap_or_default());
            }
        }
        if ev.api == api::PROCESS_EXIT {
            self.stacks.forget_process(ev.pid);
        }
        if let Some(kill) = applied.oom_kill.as_mut() {
            // The victim may already be gone; the triggering task shares its cgroup in a memcg OOM.
            kill.memcg = container::limited_memory_cgroup(ev.pid).or_else(|| container::limited_memory_cgroup(ev.tid));
        }
        // Looked up once per process, while it is alive; a process that is
        // already gone when its first event is read keeps trying on the next.
        if let Some(p) = self.state.processes.get_mut(&ev.pid) {
            if p.container.is_none() && ev.api != api::PROCESS_EXIT {
                p.container = container::lookup(ev.pid);
            }
        }
        Ingested { applied, oom_stacks }
    }
}
