//! PyTorch's caching-allocator probes (`pytorch:malloc`, `pytorch:free`):
//! one program for every probe site, the site's spec (which probe, where
//! its arguments are) found by the attach cookie in `USDT_SPECS`.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user},
    programs::ProbeContext,
};
use gpumem_common::{
    api, flags, stat,
    usdt::{arg_kind, UsdtArgSpec},
    Event, DEVICE_UNKNOWN,
};

use crate::{
    live,
    maps::{capture_stacks, lost, should_trace, submit_flags_for, track, EVENTS, USDT_SPECS},
    stack,
};

/// One argument, widened to 64 bits as its size and sign say.
#[inline(always)]
fn read_arg(regs: *const pt_regs, a: &UsdtArgSpec) -> u64 {
    let register = || {
        // SAFETY: reads inside the probe's pt_regs; the helper checks the read.
        let v = unsafe { bpf_probe_read_kernel((regs as *const u8).wrapping_add(a.reg_off as usize & 0xff) as *const u64) }.unwrap_or(0);
        if a.high_byte != 0 {
            v >> 8
        } else {
            v
        }
    };
    let raw = match a.kind {
        arg_kind::REGISTER => register(),
        arg_kind::CONSTANT => a.value as u64,
        arg_kind::MEMORY => {
            let at = register().wrapping_add(a.value as u64);
            // SAFETY: the helper validates the user address.
            unsafe { bpf_probe_read_user(at as *const u64) }.unwrap_or(0)
        }
        _ => 0,
    };
    let shift = (a.shift & 63) as u64;
    if a.signed != 0 {
        (((raw << shift) as i64) >> shift) as u64
    } else {
        (raw << shift) >> shift
    }
}

#[inline(always)]
pub fn on_probe(ctx: &ProbeContext, spec_index: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !should_trace(tgid) {
        return 0;
    }
    let Some(spec) = USDT_SPECS.get(spec_index) else { return 0 };
    let regs = ctx.regs as *const pt_regs;
    let mut ev = Event::empty(spec.probe);
    ev.ts_ns = unsafe { bpf_ktime_get_ns() };
    ev.pid = tgid;
    ev.tid = pid_tgid as u32;
    ev.comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
    ev.addr = read_arg(regs, &spec.args[0]);
    let flags = submit_flags_for(track(tgid));
    if spec.probe == api::TENSOR_ALLOC {
        ev.device = read_arg(regs, &spec.args[1]) as i32;
        ev.size = read_arg(regs, &spec.args[2]);
        ev.aux = read_arg(regs, &spec.args[3]);
        ev.flags |= flags::DEVICE_FROM_ARGS;
        if ev.device < 0 {
            ev.device = DEVICE_UNKNOWN;
        }
    }
    live::record(&mut ev);
    if spec.probe == api::TENSOR_ALLOC && capture_stacks() {
        stack::emit_with_stack(regs, ev, flags);
        return 0;
    }
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            entry.write(ev);
            entry.submit(flags);
        }
        None => lost(stat::RINGBUF_FULL, tgid),
    }
    0
}
