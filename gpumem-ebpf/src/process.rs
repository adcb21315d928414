//! Process lifecycle: exits of traced processes (their memory is released
//! implicitly) and forks of filtered processes (so `-c CMD` follows children).
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::TracePointContext,
};
use gpumem_common::{api, filter, stat, Event};

use crate::maps::{count, filter_mode, lost, submit_flags, EVENTS, FILTER_PIDS, FORK_CHILD_PID_OFFSET, TRACKED};

/// sched:sched_process_exit runs for every exiting thread; the process is
/// gone when its leader exits (tid == tgid).
#[inline(always)]
pub fn on_exit(_ctx: &TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if filter_mode() == filter::PIDS {
        // Threads of followed processes were added by on_fork under their tid.
        let _ = FILTER_PIDS.remove(&tid);
    }
    if tid != tgid {
        return 0;
    }
    // SAFETY: plain lookup.
    if unsafe { TRACKED.get(&tgid) }.is_none() {
        return 0;
    }
    let _ = TRACKED.remove(&tgid);
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        lost(stat::RINGBUF_FULL, tgid);
        return 0;
    };
    entry.write(Event {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        pid: tgid,
        tid: tgid,
        comm: bpf_get_current_comm().unwrap_or([0u8; 16]),
        ..Event::empty(api::PROCESS_EXIT)
    });
    entry.submit(submit_flags());
    0
}

/// sched:sched_process_fork: the current task is the parent.
#[inline(always)]
pub fn on_fork(ctx: &TracePointContext) -> u32 {
    if filter_mode() != filter::PIDS {
        return 0;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: plain lookup, value copied.
    let follow = match unsafe { FILTER_PIDS.get(&parent) } {
        Some(v) => *v,
        None => return 0,
    };
    if follow != filter::FOLLOW_CHILDREN {
        return 0;
    }
    // SAFETY: read_volatile of a load-time constant.
    let offset = unsafe { core::ptr::read_volatile(&FORK_CHILD_PID_OFFSET) } as usize;
    // SAFETY: bounded read from the tracepoint record.
    let Ok(child) = (unsafe { ctx.read_at::<i32>(offset) }) else {
        return 0;
    };
    // A new thread shows up here too (its tid); harmless, and removed at exit.
    if FILTER_PIDS.insert(&(child as u32), &filter::FOLLOW_CHILDREN, 0).is_err() {
        count(stat::FILTER_FULL);
    }
    0
}
