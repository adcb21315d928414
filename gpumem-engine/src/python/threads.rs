//! The threads of a CPython process, read from its memory: each thread
//! state and the kernel thread id it runs on, by walking the interpreter's
//! lists (bounded: a garbled list cannot loop forever).
use super::{
    layout::{Layout, ThreadId, PTHREAD_TID},
    Interpreter,
};
use crate::procfs::ProcessMemory;

/// Interpreters and threads walked per process, at most (a garbled list
/// cannot loop forever).
const MAX_INTERPRETERS: usize = 64;

const MAX_THREADS: usize = 4096;

/// (native thread id, thread state address) of every thread of every
/// interpreter in the process.
pub fn thread_states(interp: &Interpreter) -> Vec<(u32, u64)> {
    let Ok(mem) = ProcessMemory::open(interp.pid) else { return Vec::new() };
    let l = &interp.layout;
    let mut out = Vec::new();
    let mut is = mem.u64(interp.runtime + l.runtime_interpreters_head).unwrap_or(0);
    for _ in 0..MAX_INTERPRETERS {
        if is == 0 {
            break;
        }
        let mut ts = mem.u64(is + l.interp_threads_head).unwrap_or(0);
        for _ in 0..MAX_THREADS {
            if ts == 0 {
                break;
            }
            if let Some(tid) = thread_id(&mem, l, ts) {
                out.push((tid, ts));
            }
            ts = mem.u64(ts + l.tstate_next).unwrap_or(0);
        }
        is = mem.u64(is + l.interp_next).unwrap_or(0);
    }
    // Thread ids read from glibc's descriptors are believed only when the
    // main thread is among them (another C library keeps them elsewhere).
    if l.thread_id == ThreadId::Pthread && !out.iter().any(|&(tid, _)| tid == interp.pid) {
        return Vec::new();
    }
    out
}

/// The kernel thread id of a thread state: its native id, or (3.10) the
/// one glibc's thread descriptor holds.
fn thread_id(mem: &ProcessMemory, l: &Layout, ts: u64) -> Option<u32> {
    let id = mem.u64(ts + l.tstate_native_thread_id)?;
    let tid = match l.thread_id {
        ThreadId::Native => id,
        ThreadId::Pthread => mem.u32(id.checked_add(PTHREAD_TID)?)? as u64,
    };
    (tid > 0 && tid <= u32::MAX as u64).then_some(tid as u32)
}
