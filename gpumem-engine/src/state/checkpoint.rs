//! Checkpoints (cuCheckpointProcess*, called by a tool such as
//! cuda-checkpoint on another process): a checkpointed process's device
//! memory is saved to host memory and released from the GPU, to come back
//! at its restore. It is suspended, not freed and not a leak: its
//! allocations stay as they were, the process is marked, and the GPU's
//! traced total leaves it out while it is off the device.
use gpumem_common::{
    api,
    payload::{CheckpointCall, Payload},
    Event, DEVICE_UNKNOWN,
};

use super::{Applied, State};

/// Where a checkpointing tool (cuda-checkpoint) has a process: its device
/// memory is moved off the GPU while checkpointed, not freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Suspension {
    /// cuCheckpointProcessLock: its CUDA calls are held.
    Locked,
    /// cuCheckpointProcessCheckpoint: its device memory is saved to host memory and released from the GPU.
    Checkpointed,
    /// cuCheckpointProcessRestore: its memory is back, still locked.
    Restored,
}

impl State {
    /// A successful checkpoint call, counted for the tool that made it and
    /// applied to the process it names.
    pub(super) fn checkpoint_call(&mut self, ev: &Event) -> Applied {
        let target = CheckpointCall::unpack(ev).target as u32;
        let mut out = self.apply_counted(ev, |_, _, _| {});
        out.device = DEVICE_UNKNOWN;
        let Some(p) = self.processes.get_mut(&target).filter(|p| !p.exited) else {
            out.untracked = true;
            return out;
        };
        out.size = p.held.devices.values().map(|t| t.live_bytes).sum();
        p.suspension = match ev.api {
            api::CU_CHECKPOINT_PROCESS_LOCK => Some((Suspension::Locked, ev.pid, ev.ts_ns)),
            api::CU_CHECKPOINT_PROCESS_CHECKPOINT => Some((Suspension::Checkpointed, ev.pid, ev.ts_ns)),
            api::CU_CHECKPOINT_PROCESS_RESTORE => Some((Suspension::Restored, ev.pid, ev.ts_ns)),
            _ => None,
        };
        out
    }
}
