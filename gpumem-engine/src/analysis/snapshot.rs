//! One process's GPU memory as PyTorch's memory snapshot sees it: its
//! segments carved into blocks now, and each device's trace of memory
//! actions over the session (the history's log, this process's entries).
use std::collections::BTreeMap;

use super::history::{History, TraceEntry};
use crate::state::{tensor::Segment, State};

pub struct MemorySnapshot {
    pub pid: u32,
    /// (device, segment), by device then address.
    pub segments: Vec<(i32, Segment)>,
    /// Per device, oldest first.
    pub traces: BTreeMap<i32, Vec<TraceEntry>>,
    /// Blocks are tensors (PyTorch's probes fired); else whole segments.
    pub tensor_blocks: bool,
    /// Log entries dropped (all processes) to stay within the history's
    /// bound, and that bound.
    pub trace_dropped: u64,
    pub trace_cap: usize,
}

/// Why no snapshot could be made.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("no process held or allocated GPU memory in this session")]
    Empty,
    #[error("a PyTorch memory snapshot is one process's, and {} did GPU memory work here: pass --pid PID (one of: {})", .0.len(), list(.0))]
    WhichProcess(Vec<(u32, String)>),
    #[error("process {pid} did no GPU memory work in this session (processes that did: {})", list(.found))]
    NoSuchProcess { pid: u32, found: Vec<(u32, String)> },
}

fn list(pids: &[(u32, String)]) -> String {
    pids.iter().map(|(p, c)| if c.is_empty() { p.to_string() } else { format!("{p} ({c})") }).collect::<Vec<_>>().join(", ")
}

/// The processes with something to show: segments held or memory actions logged.
fn candidates(state: &State, history: &History) -> Vec<(u32, String)> {
    let mut pids: BTreeMap<u32, String> = BTreeMap::new();
    for p in state.processes.values().filter(|p| !p.exited && p.held.devices.values().any(|t| t.live_bytes > 0)) {
        pids.insert(p.pid, p.comm.clone());
    }
    for e in history.traces.values().flatten() {
        pids.entry(e.pid).or_insert_with(|| history.threads.get(&e.pid).map(|(_, n)| n.clone()).unwrap_or_default());
    }
    pids.into_iter().collect()
}

/// The snapshot of `pid`, or of the only process there is.
pub fn of_process(state: &State, history: &History, pid: Option<u32>) -> Result<MemorySnapshot, SnapshotError> {
    let found = candidates(state, history);
    let pid = match (pid, found.as_slice()) {
        (_, []) => return Err(SnapshotError::Empty),
        (Some(p), _) if found.iter().any(|(q, _)| *q == p) => p,
        (Some(p), _) => return Err(SnapshotError::NoSuchProcess { pid: p, found }),
        (None, [(p, _)]) => *p,
        (None, _) => return Err(SnapshotError::WhichProcess(found)),
    };
    let mut segments = Vec::new();
    let mut tensor_blocks = false;
    if let Some(p) = state.processes.get(&pid).filter(|p| !p.exited) {
        tensor_blocks = p.tensor_probes;
        for &device in p.held.devices.keys().filter(|&&d| d >= 0) {
            segments.extend(p.segments(device).into_iter().map(|s| (device, s)));
        }
    }
    let traces = history
        .traces
        .iter()
        .map(|(&d, log)| (d, log.iter().filter(|e| e.pid == pid).copied().collect::<Vec<_>>()))
        .filter(|(_, log)| !log.is_empty())
        .collect();
    Ok(MemorySnapshot { pid, segments, traces, tensor_blocks, trace_dropped: history.trace_dropped, trace_cap: history.trace_cap() })
}
