//! PyTorch's caching-allocator probes (`pytorch:malloc`, `pytorch:free`):
//! one program for every probe site, the site's spec (which probe, where
//! its arguments are) found by the attach cookie in `USDT_SPECS`.
use aya_ebpf::{bindings::pt_regs, helpers::bpf_probe_read_kernel, programs::ProbeContext};
use gpumem_common::{
    api,
    counters::Exit,
    flags,
    payload::{Payload, TensorAlloc, TensorFree},
    usdt::{arg_kind, UsdtArgSpec},
    DEVICE_UNKNOWN,
};

use crate::{
    emit, live,
    maps::{capture_stacks, should_trace, submit_flags_for, track, USDT_SPECS},
    stack, task, user,
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
            user::read::<u64>(at).unwrap_or(0)
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
pub fn try_probe(ctx: &ProbeContext, spec_index: u32) -> Result<u32, Exit> {
    let ids = task::ids();
    if !should_trace(ids.tgid) {
        return Err(Exit::NotTraced);
    }
    let spec = USDT_SPECS.get(spec_index).ok_or(Exit::NoUsdtSpec)?;
    let regs = ctx.regs as *const pt_regs;
    let mut ev = task::event(spec.probe, ids, task::now_ns());
    let addr = read_arg(regs, &spec.args[0]);
    let flags = submit_flags_for(track(ids.tgid));
    if spec.probe == api::TENSOR_ALLOC {
        ev.device = read_arg(regs, &spec.args[1]) as i32;
        TensorAlloc { addr, size: read_arg(regs, &spec.args[2]), stream: read_arg(regs, &spec.args[3]) }.pack(&mut ev);
        ev.flags |= flags::DEVICE_FROM_ARGS;
        if ev.device < 0 {
            ev.device = DEVICE_UNKNOWN;
        }
    } else {
        TensorFree { addr }.pack(&mut ev);
    }
    live::record(&mut ev);
    if spec.probe == api::TENSOR_ALLOC && capture_stacks() {
        stack::emit_with_stack(regs, ev, flags)?;
    } else {
        emit::emit(&ev, flags)?;
    }
    Ok(0)
}
