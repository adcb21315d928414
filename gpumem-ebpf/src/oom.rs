//! Host OOM kills: the `oom:mark_victim` tracepoint. It runs in the context
//! of the task whose allocation triggered the kill, so that task is named
//! too. Field offsets differ between kernels and come from tracefs.
use aya_ebpf::programs::TracePointContext;
use gpumem_common::{
    api,
    counters::Exit,
    oom_field,
    payload::{OomFigures, Payload},
    Event, COMM_LEN,
};

use crate::{
    emit,
    maps::{BPF_RB_FORCE_WAKEUP, OOM_OFFSETS},
    task,
};

#[inline(always)]
fn offset(field: usize) -> u32 {
    // SAFETY: read_volatile of a load-time constant array; index is a constant.
    unsafe { core::ptr::read_volatile(&OOM_OFFSETS[field]) }
}

/// A figure of the record; 0 where this kernel's record lacks it.
#[inline(always)]
fn read_u64(ctx: &TracePointContext, field: usize) -> u64 {
    let off = offset(field);
    if off == oom_field::FIELD_ABSENT {
        return 0;
    }
    // SAFETY: bounded read from the tracepoint record.
    unsafe { ctx.read_at::<u64>(off as usize) }.unwrap_or(0)
}

/// The victim's name, from the record's `__data_loc` string (zeroes if absent).
#[inline(always)]
fn victim_comm(ctx: &TracePointContext) -> [u8; COMM_LEN] {
    let comm_off = offset(oom_field::COMM);
    if comm_off == oom_field::FIELD_ABSENT {
        return [0u8; COMM_LEN];
    }
    // __data_loc: low 16 bits offset of the string in the record, high 16 its length.
    // SAFETY: bounded read from the tracepoint record.
    let Ok(loc) = (unsafe { ctx.read_at::<u32>(comm_off as usize) }) else { return [0u8; COMM_LEN] };
    // SAFETY: bounded read from the tracepoint record.
    unsafe { ctx.read_at::<[u8; COMM_LEN]>((loc & 0xffff) as usize) }.unwrap_or([0u8; COMM_LEN])
}

#[inline(always)]
pub fn try_mark_victim(ctx: &TracePointContext) -> Result<u32, Exit> {
    let pid_off = offset(oom_field::PID);
    if pid_off == oom_field::FIELD_ABSENT {
        return Err(Exit::FieldAbsent);
    }
    // SAFETY: bounded read from the tracepoint record.
    let victim = unsafe { ctx.read_at::<i32>(pid_off as usize) }.map_err(|_| Exit::RecordUnreadable)?;
    let mut ev =
        Event { ts_ns: task::now_ns(), pid: victim as u32, tid: task::ids().tgid, comm: victim_comm(ctx), ..Event::empty(api::OOM_KILL) };
    OomFigures {
        total_vm_kib: read_u64(ctx, oom_field::TOTAL_VM),
        anon_rss_kib: read_u64(ctx, oom_field::ANON_RSS),
        file_rss_kib: read_u64(ctx, oom_field::FILE_RSS),
        shmem_rss_kib: read_u64(ctx, oom_field::SHMEM_RSS),
    }
    .pack(&mut ev);
    // Rare, and urgent: the agent reads the victim's memory cgroup in /proc
    // before the kill completes.
    emit::emit_signal(&ev, BPF_RB_FORCE_WAKEUP)?;
    Ok(0)
}
