//! What processes hold, per device, as the daemon knows it (since each
//! process's first call, or its state adopted from the kernel's table):
//! what `trace`'s summary adds for processes that started before it.
use crate::{model::Holding, state::State};

/// The holdings of these processes (all, if none is named).
pub fn of(state: &State, pids: &[u32]) -> Vec<Holding> {
    let mut out = Vec::new();
    for p in state.processes.values().filter(|p| !p.exited && (pids.is_empty() || pids.contains(&p.pid))) {
        for &device in &p.devices_seen {
            let t = p.totals(device);
            out.push(Holding { pid: p.pid, comm: p.comm.clone(), device, live_bytes: t.live_bytes, live_allocs: t.live_allocs });
        }
    }
    out
}
