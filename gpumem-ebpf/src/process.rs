//! Process lifecycle: exits of traced processes (their memory is released
//! implicitly) and forks of filtered processes (so `-c CMD` follows children).
use aya_ebpf::programs::TracePointContext;
use gpumem_common::{
    api,
    counters::{Exit, Stat},
    filter,
};

use crate::{
    emit,
    maps::{count, filter_mode, submit_flags, FILTER_PIDS, FORK_CHILD_PID_OFFSET, TRACKED},
    task,
};

/// sched:sched_process_exit runs for every exiting thread; the process is
/// gone when its leader exits (tid == tgid).
#[inline(always)]
pub fn try_exit(_ctx: &TracePointContext) -> Result<u32, Exit> {
    let ids = task::ids();
    if filter_mode() == filter::PIDS {
        // Threads of followed processes were added by try_fork under their tid.
        let _ = FILTER_PIDS.remove(&ids.tid);
    }
    if ids.tid != ids.tgid {
        return Err(Exit::ThreadExit);
    }
    // SAFETY: plain lookup.
    if unsafe { TRACKED.get(&ids.tgid) }.is_none() {
        return Err(Exit::UntracedExit);
    }
    let _ = TRACKED.remove(&ids.tgid);
    emit::emit(&task::event(api::PROCESS_EXIT, ids, task::now_ns()), submit_flags())?;
    Ok(0)
}

/// sched:sched_process_fork: the current task is the parent.
#[inline(always)]
pub fn try_fork(ctx: &TracePointContext) -> Result<u32, Exit> {
    if filter_mode() != filter::PIDS {
        return Err(Exit::NotTraced);
    }
    let parent = task::ids().tgid;
    // SAFETY: plain lookup, value copied.
    let follow = (unsafe { FILTER_PIDS.get(&parent) }).copied().ok_or(Exit::NotTraced)?;
    if follow != filter::FOLLOW_CHILDREN {
        return Err(Exit::ChildNotFollowed);
    }
    // SAFETY: read_volatile of a load-time constant.
    let offset = unsafe { core::ptr::read_volatile(&FORK_CHILD_PID_OFFSET) } as usize;
    // SAFETY: bounded read from the tracepoint record.
    let child = unsafe { ctx.read_at::<i32>(offset) }.map_err(|_| Exit::RecordUnreadable)?;
    // A new thread shows up here too (its tid); harmless, and removed at exit.
    if FILTER_PIDS.insert(&(child as u32), &filter::FOLLOW_CHILDREN, 0).is_err() {
        count(Stat::FilterFull);
    }
    Ok(0)
}
