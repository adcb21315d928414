//! NVIDIA driver ioctls: GPU memory that never passes through libcuda.
//!
//! Two ways in. Where the kernel has kprobes and the nvidia module is loaded,
//! kprobes on the driver's ioctl entry points see only NVIDIA files. Elsewhere
//! the `syscalls:sys_{enter,exit}_ioctl` tracepoints see every ioctl on the
//! host, so the kernel filters: a command that is not an NVIDIA escape is
//! dropped at once, and one that is must come on a descriptor known to be an
//! NVIDIA node. Those descriptors are in `NV_FDS`: added when an open of a
//! path under the device prefix (`/dev/nvidia` by default) succeeds, removed
//! at close, and seeded by the agent from /proc/*/fd for files opened before
//! it started (and on each rescan, for descriptors inherited or dup'ed).
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    macros::map,
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use gpumem_common::{api, nv, nv_fd, stat, Event, FdKey, NV_FDS_MAX, NV_PREFIX_MAX, PENDING_MAX};

use crate::maps::{count, lost, should_trace, submit_flags_for, track, EVENTS};

/// Open NVIDIA descriptors: (tgid, fd) → `nv_fd::RM` or `nv_fd::UVM`.
#[map]
pub static NV_FDS: HashMap<FdKey, u32> = HashMap::with_max_entries(NV_FDS_MAX, 0);

/// Opens of NVIDIA nodes in flight: pid_tgid → kind.
#[map]
static OPEN_PENDING: HashMap<u64, u32> = HashMap::with_max_entries(PENDING_MAX, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IoctlPending {
    ts_ns: u64,
    arg: u64,
    cmd: u32,
    api: u32,
}

/// NVIDIA ioctls in flight: pid_tgid → command and argument.
#[map]
static IOCTL_PENDING: HashMap<u64, IoctlPending> = HashMap::with_max_entries(PENDING_MAX, 0);

/// Device-node path prefix, set by the agent (`--nvidia-dev-prefix`).
#[no_mangle]
static NV_PREFIX: [u8; NV_PREFIX_MAX] =
    *b"/dev/nvidia\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
#[no_mangle]
static NV_PREFIX_LEN: u32 = 11;

// Syscall tracepoint records: 8 bytes of common fields, the syscall number,
// then each argument in an 8-byte slot from offset 16 (fixed by the kernel's
// syscall trace events); sys_exit_* has `ret` at 16.
const ARG0: usize = 16;
const ARG1: usize = 24;
const ARG2: usize = 32;
const RET: usize = 16;

#[inline(always)]
fn volatile<T: Copy>(v: &T) -> T {
    // SAFETY: read of a load-time constant.
    unsafe { core::ptr::read_volatile(v) }
}

/// sys_enter_openat(dfd, filename, flags, mode): remember opens of NVIDIA nodes.
#[inline(always)]
pub fn on_enter_openat(ctx: &TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !should_trace((pid_tgid >> 32) as u32) {
        return 0;
    }
    // SAFETY: bounded read from the tracepoint record.
    let Ok(filename) = (unsafe { ctx.read_at::<u64>(ARG1) }) else { return 0 };
    let mut buf = [0u8; NV_PREFIX_MAX + 8];
    // SAFETY: the helper checks the user address.
    let Ok(name) = (unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut buf) }) else { return 0 };
    let len = volatile(&NV_PREFIX_LEN) as usize;
    if len == 0 || len > NV_PREFIX_MAX || name.len() < len {
        return 0;
    }
    let mut i = 0;
    while i < NV_PREFIX_MAX {
        if i >= len {
            break;
        }
        if buf[i] != volatile(&NV_PREFIX[i]) {
            return 0;
        }
        i += 1;
    }
    // `<prefix>-uvm` is the UVM node; every other match is an RM node.
    let kind = if len + 4 <= NV_PREFIX_MAX && buf[len] == b'-' && buf[len + 1] == b'u' && buf[len + 2] == b'v' && buf[len + 3] == b'm' {
        nv_fd::UVM
    } else {
        nv_fd::RM
    };
    if OPEN_PENDING.insert(&pid_tgid, &kind, 0).is_err() {
        count(stat::PENDING_FULL);
    }
    0
}

/// sys_exit_openat: the open succeeded, the descriptor is an NVIDIA node.
#[inline(always)]
pub fn on_exit_openat(ctx: &TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: value copied out.
    let Some(kind) = (unsafe { OPEN_PENDING.get(&pid_tgid) }).copied() else { return 0 };
    let _ = OPEN_PENDING.remove(&pid_tgid);
    // SAFETY: bounded read from the tracepoint record.
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(RET) }) else { return 0 };
    if ret >= 0 {
        let key = FdKey { tgid: (pid_tgid >> 32) as u32, fd: ret as u32 };
        if NV_FDS.insert(&key, &kind, 0).is_err() {
            count(stat::FILTER_FULL);
        }
    }
    0
}

/// sys_enter_close(fd): forget the descriptor.
#[inline(always)]
pub fn on_enter_close(ctx: &TracePointContext) -> u32 {
    // SAFETY: bounded read from the tracepoint record.
    let Ok(fd) = (unsafe { ctx.read_at::<u64>(ARG0) }) else { return 0 };
    let key = FdKey { tgid: (bpf_get_current_pid_tgid() >> 32) as u32, fd: fd as u32 };
    let _ = NV_FDS.remove(&key);
    0
}

/// Saves an NVIDIA ioctl for decoding at its exit.
#[inline(always)]
fn save(pid_tgid: u64, cmd: u32, arg: u64, api_id: u32) {
    let p = IoctlPending { ts_ns: unsafe { bpf_ktime_get_ns() }, arg, cmd, api: api_id };
    if IOCTL_PENDING.insert(&pid_tgid, &p, 0).is_err() {
        lost(stat::PENDING_FULL, (pid_tgid >> 32) as u32);
    }
}

/// sys_enter_ioctl(fd, cmd, arg): the filter every ioctl on the host goes through.
#[inline(always)]
pub fn on_enter_ioctl(ctx: &TracePointContext) -> u32 {
    // SAFETY: bounded read from the tracepoint record.
    let Ok(cmd) = (unsafe { ctx.read_at::<u64>(ARG1) }) else { return 0 };
    let cmd = cmd as u32;
    // Cheapest test first: not an NVIDIA command number, not ours.
    if nv::ioc_type(cmd) != nv::IOC_TYPE && cmd != nv::UVM_MAP_EXTERNAL_ALLOCATION && cmd != nv::UVM_FREE {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if !should_trace((pid_tgid >> 32) as u32) {
        return 0;
    }
    // SAFETY: bounded reads from the tracepoint record.
    let (Ok(fd), Ok(arg)) = (unsafe { ctx.read_at::<u64>(ARG0) }, unsafe { ctx.read_at::<u64>(ARG2) }) else { return 0 };
    let key = FdKey { tgid: (pid_tgid >> 32) as u32, fd: fd as u32 };
    // SAFETY: value copied out.
    let Some(kind) = (unsafe { NV_FDS.get(&key) }).copied() else { return 0 };
    if let Some(api_id) = nv::classify(kind, cmd) {
        save(pid_tgid, cmd, arg, api_id);
    }
    0
}

/// sys_exit_ioctl: decode what the driver wrote back.
#[inline(always)]
pub fn on_exit_ioctl(_ctx: &TracePointContext) -> u32 {
    finish(bpf_get_current_pid_tgid())
}

/// kprobe on nvidia_unlocked_ioctl(file, cmd, arg): only NVIDIA files get here.
#[inline(always)]
pub fn on_kprobe(ctx: &ProbeContext, kind: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !should_trace((pid_tgid >> 32) as u32) {
        return 0;
    }
    let cmd = ctx.arg::<u64>(1).unwrap_or(0) as u32;
    let arg = ctx.arg::<u64>(2).unwrap_or(0);
    if let Some(api_id) = nv::classify(kind, cmd) {
        save(pid_tgid, cmd, arg, api_id);
    }
    0
}

#[inline(always)]
pub fn on_kretprobe(_ctx: &RetProbeContext) -> u32 {
    finish(bpf_get_current_pid_tgid())
}

#[inline(always)]
fn u32_at(addr: u64) -> u32 {
    // SAFETY: the helper checks the user address.
    unsafe { bpf_probe_read_user((addr) as *const u32) }.unwrap_or(0)
}

#[inline(always)]
fn u64_at(addr: u64) -> u64 {
    // SAFETY: the helper checks the user address.
    unsafe { bpf_probe_read_user((addr) as *const u64) }.unwrap_or(0)
}

#[inline(always)]
fn finish(pid_tgid: u64) -> u32 {
    // SAFETY: value copied out.
    let Some(p) = (unsafe { IOCTL_PENDING.get(&pid_tgid) }).copied() else { return 0 };
    let _ = IOCTL_PENDING.remove(&pid_tgid);
    let now = unsafe { bpf_ktime_get_ns() };
    let a = p.arg;
    let mut ev = Event {
        ts_ns: now,
        latency_ns: now.wrapping_sub(p.ts_ns),
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        comm: bpf_get_current_comm().unwrap_or([0u8; 16]),
        ..Event::empty(p.api)
    };
    let parent_and_root = |a: u64| (u32_at(a + 4) as u64) | ((u32_at(a) as u64) << 32);
    match p.api {
        api::RM_ALLOC => {
            // NVOS21 { hRoot, hObjectParent, hObjectNew, hClass, pAllocParms, paramsSize, status }
            // NVOS64 { ..., pAllocParms, pRightsRequested, paramsSize, flags, status }
            ev.addr = parent_and_root(a);
            ev.handle = u32_at(a + 8) as u64;
            let class = u32_at(a + 12);
            ev.result = if nv::ioc_size(p.cmd) == nv::NVOS64_SIZE { u32_at(a + 40) } else { u32_at(a + 28) };
            let params = u64_at(a + 16);
            let mut mem_flags = 0u32;
            if class == nv::CLASS_MEMORY_LOCAL_USER && params != 0 {
                ev.size = u64_at(params + nv::MEM_PARAMS_SIZE_OFFSET);
                mem_flags = u32_at(params + nv::MEM_PARAMS_FLAGS_OFFSET);
            }
            ev.aux = class as u64 | ((mem_flags as u64) << 32);
        }
        api::RM_FREE => {
            // NVOS00 { hRoot, hObjectParent, hObjectOld, status }
            ev.addr = parent_and_root(a);
            ev.handle = u32_at(a + 8) as u64;
            ev.result = u32_at(a + 12);
        }
        api::RM_CONTROL => {
            // NVOS54 { hClient, hObject, cmd, flags, params, paramsSize, status }
            ev.handle = u32_at(a + 4) as u64;
            ev.aux = u32_at(a + 8) as u64;
            ev.result = u32_at(a + 28);
        }
        api::RM_MAP_MEMORY => {
            // NVOS33 { hClient, hDevice, hMemory, offset@16, length@24, pLinearAddress@32, status@40, flags }
            ev.handle = u32_at(a + 8) as u64;
            ev.size = u64_at(a + 24);
            ev.addr = u64_at(a + 32);
            ev.result = u32_at(a + 40);
        }
        api::RM_MAP_MEMORY_DMA => {
            // NVOS46 { hClient, hDevice, hDma, hMemory, offset@16, length@24, flags, dmaOffset@40, status@48 }
            ev.handle = u32_at(a + 12) as u64;
            ev.size = u64_at(a + 24);
            ev.addr = u64_at(a + 40);
            ev.result = u32_at(a + 48);
        }
        api::UVM_MAP_EXTERNAL_ALLOCATION => {
            ev.addr = u64_at(a);
            ev.size = u64_at(a + 8);
            ev.result = u32_at(a + nv::UVM_MAP_EXTERNAL_STATUS_OFFSET);
        }
        api::UVM_FREE => {
            ev.addr = u64_at(a);
            ev.size = u64_at(a + 8);
            ev.result = u32_at(a + nv::UVM_FREE_STATUS_OFFSET);
        }
        _ => return 0,
    }
    let flags = submit_flags_for(track((pid_tgid >> 32) as u32));
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            entry.write(ev);
            entry.submit(flags);
        }
        None => lost(stat::RINGBUF_FULL, (pid_tgid >> 32) as u32),
    }
    0
}
