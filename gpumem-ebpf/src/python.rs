//! The thread's CPython frames at an allocation: from the thread state the
//! agent found for this thread (PY_THREADS) along the frame chain, each
//! frame's code object and instruction pointer, with the layout of the
//! process's Python version (PY_LAYOUTS). Only read, never written: a
//! frame that cannot be read ends the walk.
use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_loop;
use gpumem_common::{
    counters::Exit,
    python::{entry_kind, PyFrameRef, PyLayout, ENTRY, FRAME_OWNED_BY_CSTACK, NO_CFRAME, PY_FRAMES_MAX},
};

use crate::{
    maps::{exited, PY_LAYOUTS, PY_THREADS},
    user::read,
};

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    read::<u64>(addr).ok()
}

#[inline(always)]
fn read_u8(addr: u64) -> Option<u8> {
    read::<u8>(addr).ok()
}

/// The walk's state, in the caller's stack (bpf_loop's context).
#[repr(C)]
struct Walk {
    frame: u64,
    n: u32,
    /// Slot of the frame last written; PY_FRAMES_MAX: none.
    last: u32,
    layout: PyLayout,
    out: *mut PyFrameRef,
}

/// Writes this thread's Python frames to `out` (room for PY_FRAMES_MAX);
/// how many. 0 for threads that are not Python's (most processes). The
/// walk runs in `bpf_loop`, so that the verifier checks one step, not each.
#[inline(always)]
pub fn walk(pid_tgid: u64, out: *mut PyFrameRef) -> u32 {
    match first_frame(pid_tgid) {
        Ok((frame, layout)) => walk_from(frame, layout, out),
        Err(why) => {
            exited(why);
            0
        }
    }
}

/// The thread's innermost frame, and its process's layout.
#[inline(always)]
fn first_frame(pid_tgid: u64) -> Result<(u64, PyLayout), Exit> {
    // SAFETY: plain lookup, value copied.
    let tstate = (unsafe { PY_THREADS.get(&pid_tgid) }).copied().ok_or(Exit::PyNoThreadState)?;
    // SAFETY: plain lookup, value copied.
    let layout = (unsafe { PY_LAYOUTS.get(&((pid_tgid >> 32) as u32)) }).copied().ok_or(Exit::PyNoLayout)?;
    let mut frame = read_u64(tstate + layout.tstate_frame as u64).ok_or(Exit::PyFrameUnreadable)?;
    if layout.cframe_current != NO_CFRAME {
        frame = read_u64(frame + layout.cframe_current as u64).ok_or(Exit::PyFrameUnreadable)?;
    }
    Ok((frame, layout))
}

#[inline(always)]
fn walk_from(frame: u64, layout: PyLayout, out: *mut PyFrameRef) -> u32 {
    let mut w = Walk { frame, n: 0, last: PY_FRAMES_MAX as u32, layout, out };
    // The callback is passed as the function itself (a BPF_PSEUDO_FUNC
    // relocation), never through an integer.
    let callback = step as unsafe extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: bpf_loop calls `step` with `w`, which outlives the call.
    unsafe { bpf_loop((PY_FRAMES_MAX + 8) as u32, callback as *mut c_void, core::ptr::addr_of_mut!(w).cast(), 0) };
    w.n
}

/// One frame of the walk; 1 ends it.
#[inline(never)]
unsafe extern "C" fn step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop hands back the Walk given to it.
    let w = unsafe { &mut *(ctx as *mut Walk) };
    if w.frame == 0 || w.n as usize >= PY_FRAMES_MAX {
        return 1;
    }
    let (l, frame) = (w.layout, w.frame);
    let (Some(code), Some(instr), Some(flag), Some(previous)) = (
        read_u64(frame + l.frame_code as u64),
        read_u64(frame + l.frame_instr as u64),
        read_u8(frame + l.entry_byte as u64),
        read_u64(frame + l.frame_previous as u64),
    ) else {
        exited(Exit::PyFrameUnreadable);
        return 1;
    };
    w.frame = previous;
    if l.entry_kind == entry_kind::CSTACK_OWNER && flag == FRAME_OWNED_BY_CSTACK {
        // A shim between two native calls: the frame before it was an entry.
        let j = w.last as usize;
        if j < PY_FRAMES_MAX {
            // SAFETY: j < PY_FRAMES_MAX, inside the caller's buffer.
            unsafe { (*w.out.add(j)).instr |= ENTRY };
        }
        return 0;
    }
    let entry = (l.entry_kind == entry_kind::IS_ENTRY && flag != 0) || l.entry_kind == entry_kind::EVERY_FRAME;
    let slot = (w.n as usize) & (PY_FRAMES_MAX - 1);
    // SAFETY: slot < PY_FRAMES_MAX, inside the caller's buffer.
    unsafe { *w.out.add(slot) = PyFrameRef { code, instr: if entry { instr | ENTRY } else { instr } } };
    w.last = slot as u32;
    w.n += 1;
    0
}
