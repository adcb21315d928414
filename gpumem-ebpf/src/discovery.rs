//! Discovery signals: a process ran a new program (sched_process_exec) or
//! its dynamic loader changed its link map (a uprobe on `_dl_debug_state`,
//! which the loader calls for debuggers around every dlopen and dlclose).
//! Each wakes the agent at once; it then reads only that process's maps.
use gpumem_common::{api, counters::Exit};

use crate::{
    emit,
    maps::{should_trace, BPF_RB_FORCE_WAKEUP},
    task,
};

#[inline(always)]
fn try_signal(api_id: u32) -> Result<u32, Exit> {
    let ids = task::ids();
    if !should_trace(ids.tgid) {
        return Err(Exit::NotTraced);
    }
    // Not accounting: a lost signal is what the agent's slow full scan finds.
    emit::emit_signal(&task::event(api_id, ids, task::now_ns()), BPF_RB_FORCE_WAKEUP)?;
    Ok(0)
}

#[inline(always)]
pub fn try_exec() -> Result<u32, Exit> {
    try_signal(api::PROCESS_EXEC)
}

#[inline(always)]
pub fn try_link_map() -> Result<u32, Exit> {
    try_signal(api::LINK_MAP)
}
