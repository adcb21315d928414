//! libcuda entry/return handling shared by every probed call: save the
//! arguments at entry, decode them with the CUresult at return (one
//! payload per kind of call, gpumem_common::payload), emit one event.
use aya_ebpf::programs::{ProbeContext, RetProbeContext};
use gpumem_common::{
    api,
    counters::{Exit, Stat},
    flags,
    payload::{Alloc, CheckpointCall, Context, DeviceUuid, Free, GreenCtx, Init, MemInfo, Payload, PitchAlloc, PoolAlloc},
    Event, DEVICE_UNKNOWN,
};

use crate::{
    emit, live,
    maps::{capture_stacks, count, lost, should_trace, submit_flags_for, track, Pending, PendingKey, PENDING},
    share, stack, task,
    user::read_out,
    vmm,
};

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

#[inline(always)]
pub fn try_entry(ctx: &ProbeContext, api_id: u32) -> Result<u32, Exit> {
    let ids = task::ids();
    if !should_trace(ids.tgid) {
        return Err(Exit::NotTraced);
    }
    let args = [arg(ctx, 0), arg(ctx, 1), arg(ctx, 2), arg(ctx, 3), arg(ctx, 4), arg(ctx, 5)];
    let device = match api_id {
        api::CU_MEM_CREATE => vmm::create_device(args[2]),
        // The node's pool properties begin its parameters.
        api::CU_GRAPH_ADD_MEM_ALLOC_NODE => vmm::create_device(args[4]),
        api::CU_MEM_POOL_CREATE => vmm::create_device(args[1]),
        _ => DEVICE_UNKNOWN,
    };
    let key = share::entry_key(ctx, api_id, &args);
    let pending = Pending { ts_ns: task::now_ns(), args, device, _pad: 0, key };
    let key = PendingKey { pid_tgid: ids.pid_tgid, api: api_id, _pad: 0 };
    if PENDING.insert(&key, &pending, 0).is_err() {
        lost(Stat::PendingFull, ids.tgid);
        return Err(Exit::PendingFull);
    }
    Ok(0)
}

#[inline(always)]
pub fn try_return(ctx: &RetProbeContext, api_id: u32) -> Result<u32, Exit> {
    let ids = task::ids();
    let key = PendingKey { pid_tgid: ids.pid_tgid, api: api_id, _pad: 0 };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(pending) = (unsafe { PENDING.get(&key) }).copied() else {
        if !should_trace(ids.tgid) {
            return Err(Exit::NotTraced);
        }
        count(Stat::ReturnWithoutEntry);
        return Err(Exit::NothingInFlight);
    };
    let _ = PENDING.remove(&key);
    let now = task::now_ns();
    // CUresult is a C enum (int): the low 32 bits of rax.
    let result = ctx.ret::<u64>() as u32;
    let mut ev = task::event(api_id, ids, now);
    ev.latency_ns = now.wrapping_sub(pending.ts_ns);
    ev.result = result;
    decode(api_id, &pending, result == 0, &mut ev);
    if result == 0 {
        live::record(&mut ev);
    }
    let flags = submit_flags_for(track(ids.tgid));
    if result == 0 && wants_stack(api_id) && capture_stacks() {
        stack::emit_with_stack(ctx.regs, ev, flags)?;
    } else {
        emit::emit(&ev, flags)?;
    }
    Ok(0)
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

/// A value the call wrote through `ptr`, only on success (on failure the
/// driver may not have written it).
#[inline(always)]
fn out_if(ok: bool, ptr: u64, ev: &mut Event) -> u64 {
    if ok {
        read_out(ptr, ev)
    } else {
        0
    }
}

/// Green contexts (CUDA 12.4+).
#[inline(always)]
fn green_ctx(api_id: u32, a: &[u64; 6], ok: bool, ev: &mut Event) {
    match api_id {
        // (CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
        api::CU_GREEN_CTX_CREATE => {
            device_arg(a[2], ev);
            let ctx = out_if(ok, a[0], ev);
            GreenCtx { ctx, green: 0 }.pack(ev);
        }
        // (CUcontext *pContext, CUgreenCtx hCtx)
        api::CU_CTX_FROM_GREEN_CTX => {
            let ctx = out_if(ok, a[0], ev);
            GreenCtx { ctx, green: a[1] }.pack(ev);
        }
        // (CUgreenCtx hCtx)
        _ => GreenCtx { ctx: a[0], green: 0 }.pack(ev),
    }
}

/// Fills the event's fields from the saved arguments.
#[inline(always)]
fn decode(api_id: u32, p: &Pending, ok: bool, ev: &mut Event) {
    let a = &p.args;
    match api_id {
        api::CU_INIT => Init { flags: a[0] }.pack(ev),
        // (CUdeviceptr *dptr, size_t bytesize, ...)
        api::CU_MEM_ALLOC_V2
        | api::CU_MEM_ALLOC_MANAGED
        | api::CU_MEM_ALLOC_ASYNC
        | api::CU_MEM_ALLOC_ASYNC_PTSZ
        | api::CU_MEM_HOST_ALLOC
        | api::CU_MEM_ALLOC_HOST_V2 => {
            let addr = out_if(ok, a[0], ev);
            Alloc { addr, size: a[1] }.pack(ev);
        }
        // (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream)
        api::CU_MEM_ALLOC_FROM_POOL_ASYNC | api::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
            let addr = out_if(ok, a[0], ev);
            PoolAlloc { addr, size: a[1], pool: a[2] }.pack(ev);
        }
        // (void *p, size_t bytesize, unsigned int Flags): host memory the
        // caller already has, pinned in place.
        api::CU_MEM_HOST_REGISTER_V2 => Alloc { addr: a[0], size: a[1] }.pack(ev),
        // (CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height, unsigned elem)
        api::CU_MEM_ALLOC_PITCH_V2 => {
            let (addr, pitch) = (out_if(ok, a[0], ev), out_if(ok, a[1], ev));
            let size = if ok { pitch.wrapping_mul(a[3]) } else { a[2].wrapping_mul(a[3]) };
            PitchAlloc { addr, size, pitch }.pack(ev);
        }
        // (CUdeviceptr dptr, ...) / (void *p)
        api::CU_MEM_FREE_V2
        | api::CU_MEM_FREE_ASYNC
        | api::CU_MEM_FREE_ASYNC_PTSZ
        | api::CU_MEM_FREE_HOST
        | api::CU_MEM_HOST_UNREGISTER => Free { addr: a[0] }.pack(ev),
        id if share::decodes(id) => share::decode(api_id, p, ok, ev),
        id if vmm::decodes(id) => vmm::decode(api_id, p, ok, ev),
        // (int pid, CUcheckpoint*Args *args): the process acted on.
        api::CU_CHECKPOINT_PROCESS_LOCK
        | api::CU_CHECKPOINT_PROCESS_CHECKPOINT
        | api::CU_CHECKPOINT_PROCESS_RESTORE
        | api::CU_CHECKPOINT_PROCESS_UNLOCK => CheckpointCall { target: a[0] as u32 as u64 }.pack(ev),
        _ => context(api_id, a, ok, ev),
    }
}

/// Context and device calls: which device later calls go to.
#[inline(always)]
fn context(api_id: u32, a: &[u64; 6], ok: bool, ev: &mut Event) {
    match api_id {
        // (CUuuid *uuid, CUdevice dev)
        api::CU_DEVICE_GET_UUID_V2 => {
            device_arg(a[1], ev);
            let (first, last) = (out_if(ok, a[0], ev), out_if(ok, a[0] + 8, ev));
            DeviceUuid { first, last }.pack(ev);
        }
        // (CUcontext *pctx, CUdevice dev)
        api::CU_DEVICE_PRIMARY_CTX_RETAIN => {
            device_arg(a[1], ev);
            let handle = out_if(ok, a[0], ev);
            Context { handle }.pack(ev);
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
            let handle = out_if(ok, a[0], ev);
            Context { handle }.pack(ev);
        }
        // (CUcontext ctx)
        api::CU_CTX_SET_CURRENT | api::CU_CTX_PUSH_CURRENT_V2 | api::CU_CTX_DESTROY_V2 => Context { handle: a[0] }.pack(ev),
        // (size_t *free, size_t *total)
        api::CU_MEM_GET_INFO_V2 if ok => {
            let (free, total) = (read_out(a[0], ev), read_out(a[1], ev));
            MemInfo { free, total }.pack(ev);
        }
        // (CUcontext *pctx), pctx may be NULL
        api::CU_CTX_POP_CURRENT_V2 if ok => {
            let handle = read_out(a[0], ev);
            Context { handle }.pack(ev);
        }
        api::CU_GREEN_CTX_CREATE | api::CU_CTX_FROM_GREEN_CTX | api::CU_GREEN_CTX_DESTROY => green_ctx(api_id, a, ok, ev),
        _ => {}
    }
}
