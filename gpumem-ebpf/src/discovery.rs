//! Discovery signals: a process ran a new program (sched_process_exec) or
//! its dynamic loader changed its link map (a uprobe on `_dl_debug_state`,
//! which the loader calls for debuggers around every dlopen and dlclose).
//! Each wakes the agent at once; it then reads only that process's maps.
use aya_ebpf::helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use gpumem_common::{api, stat, Event};

use crate::maps::{count, should_trace, BPF_RB_FORCE_WAKEUP, EVENTS};

#[inline(always)]
pub fn signal(api_id: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !should_trace(tgid) {
        return 0;
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        // Not accounting: the agent's slow full scan finds what this missed.
        count(stat::RINGBUF_FULL);
        return 0;
    };
    entry.write(Event {
        // SAFETY: a helper without arguments.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        pid: tgid,
        tid: pid_tgid as u32,
        comm: bpf_get_current_comm().unwrap_or([0u8; 16]),
        ..Event::empty(api_id)
    });
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}

#[inline(always)]
pub fn on_exec() -> u32 {
    signal(api::PROCESS_EXEC)
}

#[inline(always)]
pub fn on_link_map() -> u32 {
    signal(api::LINK_MAP)
}
