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
    helpers::bpf_probe_read_user_str_bytes,
    macros::map,
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use gpumem_common::{
    api,
    counters::{Exit, Stat},
    nv::{
        self, MemoryAllocationParams, Nvos00, Nvos21, Nvos33WithFd, Nvos46, Nvos54, Nvos64, UvmFreeParams, UvmMapExternalAllocationParams,
    },
    nv_fd,
    payload::{Payload, RmAlloc, RmControl, RmFree, RmMap, UvmRange},
    Event, FdKey, NV_FDS_MAX, NV_PREFIX_MAX, PENDING_MAX,
};

use crate::{
    emit,
    maps::{count, exited, lost, should_trace, submit_flags_for, track},
    task,
    user::read,
};

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

/// A u64 field of a syscall tracepoint record.
#[inline(always)]
fn record_u64(ctx: &TracePointContext, at: usize) -> Result<u64, Exit> {
    // SAFETY: bounded read from the tracepoint record.
    unsafe { ctx.read_at::<u64>(at) }.map_err(|_| Exit::RecordUnreadable)
}

/// Whether `name` starts with the device prefix; the node's kind if so.
#[inline(always)]
fn node_kind(buf: &[u8; NV_PREFIX_MAX + 8], name_len: usize) -> Result<u32, Exit> {
    let len = volatile(&NV_PREFIX_LEN) as usize;
    if len == 0 || len > NV_PREFIX_MAX || name_len < len {
        return Err(Exit::NotNvidia);
    }
    let mut i = 0;
    while i < NV_PREFIX_MAX {
        if i >= len {
            break;
        }
        if buf[i] != volatile(&NV_PREFIX[i]) {
            return Err(Exit::NotNvidia);
        }
        i += 1;
    }
    // `<prefix>-uvm` is the UVM node; every other match is an RM node.
    let uvm = len + 4 <= NV_PREFIX_MAX && buf[len] == b'-' && buf[len + 1] == b'u' && buf[len + 2] == b'v' && buf[len + 3] == b'm';
    Ok(if uvm { nv_fd::UVM } else { nv_fd::RM })
}

/// sys_enter_openat(dfd, filename, flags, mode): remember opens of NVIDIA nodes.
#[inline(always)]
pub fn try_enter_openat(ctx: &TracePointContext) -> Result<u32, Exit> {
    let ids = task::ids();
    if !should_trace(ids.tgid) {
        return Err(Exit::NotTraced);
    }
    let filename = record_u64(ctx, ARG1)?;
    let mut buf = [0u8; NV_PREFIX_MAX + 8];
    // SAFETY: the helper checks the user address and bounds the copy to `buf`.
    let name_len = unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut buf) }.map_err(|_| Exit::UserUnreadable)?.len();
    let kind = node_kind(&buf, name_len)?;
    if OPEN_PENDING.insert(&ids.pid_tgid, &kind, 0).is_err() {
        count(Stat::PendingFull);
        return Err(Exit::PendingFull);
    }
    Ok(0)
}

/// sys_exit_openat: the open succeeded, the descriptor is an NVIDIA node.
#[inline(always)]
pub fn try_exit_openat(ctx: &TracePointContext) -> Result<u32, Exit> {
    let ids = task::ids();
    // SAFETY: value copied out.
    let kind = (unsafe { OPEN_PENDING.get(&ids.pid_tgid) }).copied().ok_or(Exit::NothingInFlight)?;
    let _ = OPEN_PENDING.remove(&ids.pid_tgid);
    // SAFETY: bounded read from the tracepoint record.
    let ret = unsafe { ctx.read_at::<i64>(RET) }.map_err(|_| Exit::RecordUnreadable)?;
    if ret < 0 {
        return Err(Exit::CallFailed);
    }
    let key = FdKey { tgid: ids.tgid, fd: ret as u32 };
    if NV_FDS.insert(&key, &kind, 0).is_err() {
        count(Stat::FilterFull);
    }
    Ok(0)
}

/// sys_enter_close(fd): forget the descriptor.
#[inline(always)]
pub fn try_enter_close(ctx: &TracePointContext) -> Result<u32, Exit> {
    let fd = record_u64(ctx, ARG0)?;
    let key = FdKey { tgid: task::ids().tgid, fd: fd as u32 };
    NV_FDS.remove(&key).map_err(|_| Exit::NotNvidia)?;
    Ok(0)
}

/// Saves an NVIDIA ioctl for decoding at its exit.
#[inline(always)]
fn save(ids: task::Ids, cmd: u32, arg: u64, api_id: u32) -> Result<u32, Exit> {
    let p = IoctlPending { ts_ns: task::now_ns(), arg, cmd, api: api_id };
    if IOCTL_PENDING.insert(&ids.pid_tgid, &p, 0).is_err() {
        lost(Stat::PendingFull, ids.tgid);
        return Err(Exit::PendingFull);
    }
    Ok(0)
}

/// sys_enter_ioctl(fd, cmd, arg): the filter every ioctl on the host goes through.
#[inline(always)]
pub fn try_enter_ioctl(ctx: &TracePointContext) -> Result<u32, Exit> {
    let cmd = record_u64(ctx, ARG1)? as u32;
    // Cheapest test first: not an NVIDIA command number, not ours.
    if nv::ioc_type(cmd) != nv::IOC_TYPE && cmd != nv::UVM_MAP_EXTERNAL_ALLOCATION && cmd != nv::UVM_FREE {
        return Err(Exit::NotNvidia);
    }
    let ids = task::ids();
    if !should_trace(ids.tgid) {
        return Err(Exit::NotTraced);
    }
    let (fd, arg) = (record_u64(ctx, ARG0)?, record_u64(ctx, ARG2)?);
    let key = FdKey { tgid: ids.tgid, fd: fd as u32 };
    // SAFETY: value copied out.
    let kind = (unsafe { NV_FDS.get(&key) }).copied().ok_or(Exit::NotNvidia)?;
    let api_id = nv::classify(kind, cmd).ok_or(Exit::UnknownCommand)?;
    save(ids, cmd, arg, api_id)
}

/// sys_exit_ioctl: decode what the driver wrote back.
#[inline(always)]
pub fn try_exit_ioctl(_ctx: &TracePointContext) -> Result<u32, Exit> {
    finish(task::ids())
}

/// kprobe on nvidia_unlocked_ioctl(file, cmd, arg): only NVIDIA files get here.
#[inline(always)]
pub fn try_kprobe(ctx: &ProbeContext, kind: u32) -> Result<u32, Exit> {
    let ids = task::ids();
    if !should_trace(ids.tgid) {
        return Err(Exit::NotTraced);
    }
    let cmd = ctx.arg::<u64>(1).unwrap_or(0) as u32;
    let arg = ctx.arg::<u64>(2).unwrap_or(0);
    let api_id = nv::classify(kind, cmd).ok_or(Exit::UnknownCommand)?;
    save(ids, cmd, arg, api_id)
}

#[inline(always)]
pub fn try_kretprobe(_ctx: &RetProbeContext) -> Result<u32, Exit> {
    finish(task::ids())
}

/// Where the parameters' memory (class 0x40) says how much video memory
/// was asked, and with which flags.
#[inline(always)]
fn memory_asked(class: u32, params: u64) -> (u64, u32) {
    if class != nv::CLASS_MEMORY_LOCAL_USER || params == 0 {
        return (0, 0);
    }
    let size = read::<u64>(params + core::mem::offset_of!(MemoryAllocationParams, size) as u64).unwrap_or(0);
    let flags = read::<u32>(params + core::mem::offset_of!(MemoryAllocationParams, flags) as u64).unwrap_or(0);
    (size, flags)
}

/// A parameter struct as the driver wrote it back; zeroes if it cannot be
/// read (counted: the event still goes, as the call happened).
#[inline(always)]
fn written_back<T: Default>(addr: u64) -> T {
    read::<T>(addr).unwrap_or_else(|why| {
        exited(why);
        T::default()
    })
}

/// The event of a finished NVIDIA ioctl: its payload from the parameter
/// struct the driver wrote back (the RM status is in it, not the return).
#[inline(always)]
fn decode(p: &IoctlPending, ev: &mut Event) -> Result<(), Exit> {
    let a = p.arg;
    match p.api {
        api::RM_ALLOC if nv::ioc_size(p.cmd) == nv::NVOS64_SIZE => {
            let s = written_back::<Nvos64>(a);
            let (size, flags) = memory_asked(s.h_class, s.p_alloc_parms);
            RmAlloc { object: s.h_object_new, parent: s.h_object_parent, root: s.h_root, class: s.h_class, flags, size }.pack(ev);
            ev.result = s.status;
        }
        api::RM_ALLOC => {
            let s = written_back::<Nvos21>(a);
            let (size, flags) = memory_asked(s.h_class, s.p_alloc_parms);
            RmAlloc { object: s.h_object_new, parent: s.h_object_parent, root: s.h_root, class: s.h_class, flags, size }.pack(ev);
            ev.result = s.status;
        }
        api::RM_FREE => {
            let s = written_back::<Nvos00>(a);
            RmFree { object: s.h_object_old, parent: s.h_object_parent, root: s.h_root }.pack(ev);
            ev.result = s.status;
        }
        api::RM_CONTROL => {
            let s = written_back::<Nvos54>(a);
            RmControl { object: s.h_object, cmd: s.cmd as u64 }.pack(ev);
            ev.result = s.status;
        }
        api::RM_MAP_MEMORY => {
            let s = written_back::<Nvos33WithFd>(a);
            RmMap { memory: s.h_memory as u64, length: s.length, address: s.p_linear_address }.pack(ev);
            ev.result = s.status;
        }
        api::RM_MAP_MEMORY_DMA => {
            let s = written_back::<Nvos46>(a);
            RmMap { memory: s.h_memory as u64, length: s.length, address: s.dma_offset }.pack(ev);
            ev.result = s.status;
        }
        api::UVM_MAP_EXTERNAL_ALLOCATION => {
            // The struct is 1200 bytes: only the range and the status are read.
            let (base, length) = (written_back::<u64>(a), written_back::<u64>(a + 8));
            UvmRange { base, length }.pack(ev);
            ev.result = written_back::<u32>(a + core::mem::offset_of!(UvmMapExternalAllocationParams, rm_status) as u64);
        }
        api::UVM_FREE => {
            let s = written_back::<UvmFreeParams>(a);
            UvmRange { base: s.base, length: s.length }.pack(ev);
            ev.result = s.rm_status;
        }
        _ => return Err(Exit::UnknownCommand),
    }
    Ok(())
}

#[inline(always)]
fn finish(ids: task::Ids) -> Result<u32, Exit> {
    // SAFETY: value copied out.
    let p = (unsafe { IOCTL_PENDING.get(&ids.pid_tgid) }).copied().ok_or(Exit::NothingInFlight)?;
    let _ = IOCTL_PENDING.remove(&ids.pid_tgid);
    let now = task::now_ns();
    let mut ev = task::event(p.api, ids, now);
    ev.latency_ns = now.wrapping_sub(p.ts_ns);
    decode(&p, &mut ev)?;
    emit::emit(&ev, submit_flags_for(track(ids.tgid)))?;
    Ok(0)
}
