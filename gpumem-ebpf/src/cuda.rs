//! libcuda entry/return handling shared by every probed call: save the
//! arguments at entry, decode them with the CUresult at return, emit one event.
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::{ProbeContext, RetProbeContext},
};
use gpumem_common::{api, flags, stat, Event, DEVICE_UNKNOWN};

use crate::{
    live,
    maps::{capture_stacks, count, lost, should_trace, submit_flags_for, track, Pending, PendingKey, EVENTS, PENDING},
    stack,
    user::read_out,
    vmm,
};

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

#[inline(always)]
pub fn on_entry(ctx: &ProbeContext, api_id: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !should_trace((pid_tgid >> 32) as u32) {
        return 0;
    }
    let args = [arg(ctx, 0), arg(ctx, 1), arg(ctx, 2), arg(ctx, 3), arg(ctx, 4), arg(ctx, 5)];
    let device = if api_id == api::CU_MEM_CREATE { vmm::create_device(args[2]) } else { DEVICE_UNKNOWN };
    let pending = Pending { ts_ns: unsafe { bpf_ktime_get_ns() }, args, device, _pad: 0 };
    let key = PendingKey { pid_tgid, api: api_id, _pad: 0 };
    if PENDING.insert(&key, &pending, 0).is_err() {
        lost(stat::PENDING_FULL, (pid_tgid >> 32) as u32);
    }
    0
}

#[inline(always)]
pub fn on_return(ctx: &RetProbeContext, api_id: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let key = PendingKey { pid_tgid, api: api_id, _pad: 0 };
    // SAFETY: the value is copied out before the entry is removed.
    let pending = match unsafe { PENDING.get(&key) } {
        Some(p) => *p,
        None => {
            if should_trace(tgid) {
                count(stat::RETURN_WITHOUT_ENTRY);
            }
            return 0;
        }
    };
    let _ = PENDING.remove(&key);
    let now = unsafe { bpf_ktime_get_ns() };
    // CUresult is a C enum (int): the low 32 bits of rax.
    let result = ctx.ret::<u64>() as u32;

    let mut ev = Event {
        ts_ns: now,
        latency_ns: now.wrapping_sub(pending.ts_ns),
        addr: 0,
        size: 0,
        handle: 0,
        aux: 0,
        pid: tgid,
        tid: pid_tgid as u32,
        api: api_id,
        result,
        device: DEVICE_UNKNOWN,
        flags: 0,
        comm: bpf_get_current_comm().unwrap_or([0u8; 16]),
    };
    decode(api_id, &pending, result == 0, &mut ev);
    if result == 0 {
        live::record(&mut ev);
    }
    let flags = submit_flags_for(track(tgid));
    if result == 0 && wants_stack(api_id) && capture_stacks() {
        stack::emit_with_stack(ctx.regs, ev, flags);
    } else {
        match EVENTS.reserve::<Event>(0) {
            Some(mut entry) => {
                entry.write(ev);
                entry.submit(flags);
            }
            None => lost(stat::RINGBUF_FULL, tgid),
        }
    }
    0
}

/// Allocations whose caller's stack is recorded (for leak finding).
#[inline(always)]
fn wants_stack(api_id: u32) -> bool {
    matches!(
        api_id,
        api::CU_MEM_ALLOC_V2
            | api::CU_MEM_ALLOC_PITCH_V2
            | api::CU_MEM_ALLOC_MANAGED
            | api::CU_MEM_ALLOC_ASYNC
            | api::CU_MEM_ALLOC_ASYNC_PTSZ
            | api::CU_MEM_ALLOC_FROM_POOL_ASYNC
            | api::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ
            | api::CU_MEM_CREATE
    )
}

#[inline(always)]
fn device_arg(v: u64, ev: &mut Event) {
    ev.device = v as i32;
    ev.flags |= flags::DEVICE_FROM_ARGS;
}

/// Fills the event's fields from the saved arguments. Out-pointers are read
/// only on success: on failure the driver may not have written them.
#[inline(always)]
fn decode(api_id: u32, p: &Pending, ok: bool, ev: &mut Event) {
    let a = &p.args;
    match api_id {
        api::CU_INIT => ev.aux = a[0],
        // (CUdeviceptr *dptr, size_t bytesize, ...)
        api::CU_MEM_ALLOC_V2
        | api::CU_MEM_ALLOC_MANAGED
        | api::CU_MEM_ALLOC_ASYNC
        | api::CU_MEM_ALLOC_ASYNC_PTSZ
        | api::CU_MEM_ALLOC_FROM_POOL_ASYNC
        | api::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ
        | api::CU_MEM_HOST_ALLOC
        | api::CU_MEM_ALLOC_HOST_V2 => {
            ev.size = a[1];
            if ok {
                ev.addr = read_out(a[0], ev);
            }
        }
        // (CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height, unsigned elem)
        api::CU_MEM_ALLOC_PITCH_V2 => {
            ev.size = a[2].wrapping_mul(a[3]);
            if ok {
                ev.addr = read_out(a[0], ev);
                let pitch = read_out(a[1], ev);
                ev.aux = pitch;
                ev.size = pitch.wrapping_mul(a[3]);
            }
        }
        // (CUdeviceptr dptr, ...) / (void *p)
        api::CU_MEM_FREE_V2 | api::CU_MEM_FREE_ASYNC | api::CU_MEM_FREE_ASYNC_PTSZ | api::CU_MEM_FREE_HOST => {
            ev.addr = a[0];
        }
        api::CU_MEM_CREATE
        | api::CU_MEM_RELEASE
        | api::CU_MEM_MAP
        | api::CU_MEM_UNMAP
        | api::CU_MEM_ADDRESS_RESERVE
        | api::CU_MEM_ADDRESS_FREE => vmm::decode(api_id, p, ok, ev),
        // (CUcontext *pctx, CUdevice dev)
        api::CU_DEVICE_PRIMARY_CTX_RETAIN => {
            device_arg(a[1], ev);
            if ok {
                ev.handle = read_out(a[0], ev);
            }
        }
        // (CUdevice dev)
        api::CU_DEVICE_PRIMARY_CTX_RELEASE_V2 | api::CU_DEVICE_PRIMARY_CTX_RESET_V2 => device_arg(a[0], ev),
        // v2: (CUcontext *pctx, unsigned flags, CUdevice dev)
        // v3: (CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned flags, CUdevice dev)
        // v4: (CUcontext *pctx, CUctxCreateParams *p, unsigned flags, CUdevice dev)
        api::CU_CTX_CREATE_V2 | api::CU_CTX_CREATE_V3 | api::CU_CTX_CREATE_V4 => {
            let dev = match api_id {
                api::CU_CTX_CREATE_V2 => a[2],
                api::CU_CTX_CREATE_V3 => a[4],
                _ => a[3],
            };
            device_arg(dev, ev);
            if ok {
                ev.handle = read_out(a[0], ev);
            }
        }
        // (CUcontext ctx)
        api::CU_CTX_SET_CURRENT | api::CU_CTX_PUSH_CURRENT_V2 | api::CU_CTX_DESTROY_V2 => ev.handle = a[0],
        // (size_t *free, size_t *total)
        api::CU_MEM_GET_INFO_V2 if ok => {
            ev.size = read_out(a[0], ev);
            ev.aux = read_out(a[1], ev);
        }
        // (CUcontext *pctx), pctx may be NULL
        api::CU_CTX_POP_CURRENT_V2 if ok => ev.handle = read_out(a[0], ev),
        _ => {}
    }
}
