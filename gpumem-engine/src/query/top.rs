//! What `top` shows of a pipeline now: the snapshot of every GPU and
//! process, and the largest live stacks of a selected row.
use crate::{
    analysis::{leaks, view::ViewOptions},
    export::top::{self, model, tui::Screen, Snapshot},
    pipeline::Pipeline,
};

/// Stacks shown for the selected row.
pub const STACKS_SHOWN: usize = 5;

/// The live top's answer: the snapshot, and what the agent has attached
/// (its title line).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct SnapshotAnswer {
    pub snapshot: Snapshot,
    pub probes_attached: usize,
}

/// What a pipeline holds now, as top shows it (sorted as top starts).
pub fn snapshot(p: &mut Pipeline, now_ns: u64, lost_events: u64) -> Snapshot {
    p.note_kept();
    let view = p.view(&ViewOptions { now_ns, trend: model::TREND_LEN, owners: true, ..Default::default() });
    let mut snap = top::build(&view, &p.host, p.state.events, lost_events, p.kept);
    snap.sort(Screen::default().sort);
    snap
}

/// A process's largest live allocation stacks on a device (None: gone).
pub fn stacks(p: &mut Pipeline, pid: u32, device: i32, now_ns: u64) -> Option<Vec<leaks::LeakGroup>> {
    let proc = p.state.processes.get(&pid)?;
    Some(leaks::top_stacks(proc, device, &mut p.stacks, &mut p.growth, STACKS_SHOWN, now_ns))
}
