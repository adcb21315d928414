//! Host OOM kills: the `oom:mark_victim` tracepoint. It runs in the context
//! of the task whose allocation triggered the kill, so that task is named
//! too. Field offsets differ between kernels and come from tracefs.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::TracePointContext,
};
use gpumem_common::{api, oom_field, stat, Event};

use crate::maps::{count, BPF_RB_FORCE_WAKEUP, EVENTS, OOM_OFFSETS};

#[inline(always)]
fn offset(field: usize) -> u32 {
    // SAFETY: read_volatile of a load-time constant array; index is a constant.
    unsafe { core::ptr::read_volatile(&OOM_OFFSETS[field]) }
}

#[inline(always)]
fn read_u64(ctx: &TracePointContext, field: usize) -> u64 {
    let off = offset(field);
    if off == oom_field::FIELD_ABSENT {
        return 0;
    }
    // SAFETY: bounded read from the tracepoint record.
    unsafe { ctx.read_at::<u64>(off as usize) }.unwrap_or(0)
}

#[inline(always)]
pub fn on_mark_victim(ctx: &TracePointContext) -> u32 {
    let pid_off = offset(oom_field::PID);
    if pid_off == oom_field::FIELD_ABSENT {
        return 0;
    }
    // SAFETY: bounded read from the tracepoint record.
    let Ok(victim) = (unsafe { ctx.read_at::<i32>(pid_off as usize) }) else { return 0 };
    let mut comm = [0u8; 16];
    let comm_off = offset(oom_field::COMM);
    if comm_off != oom_field::FIELD_ABSENT {
        // __data_loc: low 16 bits offset of the string in the record, high 16 its length.
        // SAFETY: bounded reads from the tracepoint record.
        if let Ok(loc) = unsafe { ctx.read_at::<u32>(comm_off as usize) } {
            let at = (loc & 0xffff) as usize;
            if let Ok(c) = unsafe { ctx.read_at::<[u8; 16]>(at) } {
                comm = c;
            }
        }
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(stat::RINGBUF_FULL);
        return 0;
    };
    entry.write(Event {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        addr: read_u64(ctx, oom_field::TOTAL_VM),
        size: read_u64(ctx, oom_field::ANON_RSS),
        handle: read_u64(ctx, oom_field::FILE_RSS),
        aux: read_u64(ctx, oom_field::SHMEM_RSS),
        pid: victim as u32,
        tid: (bpf_get_current_pid_tgid() >> 32) as u32,
        comm,
        ..Event::empty(api::OOM_KILL)
    });
    // Rare, and urgent: the agent reads the victim's memory cgroup in /proc
    // before the kill completes.
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}
