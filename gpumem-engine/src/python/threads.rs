//! The threads of a CPython process, read from its memory: each thread
//! state and the kernel thread id it runs on, by walking the interpreter's
//! lists (bounded, and refused where they loop: a process may forge them).
use super::{
    layout::{Layout, ThreadId, PTHREAD_TID},
    memory::Memory,
    Interpreter,
};
use crate::procfs::ProcessMemory;

/// Interpreters walked per process, at most.
const MAX_INTERPRETERS: usize = 64;

/// Thread states read per process and walk, across its interpreters, at
/// most: the lists are in the process's memory, which it may have forged
/// (a list that loops, or goes on forever). Past it, or at an entry seen
/// before, the walk is refused, not cut short.
pub const MAX_THREAD_STATES: usize = 4096;

/// (native thread id, thread state address) of every thread of every
/// interpreter in the process; Err says why its lists cannot be believed.
pub fn thread_states(interp: &Interpreter) -> Result<Vec<(u32, u64)>, String> {
    let Ok(mem) = ProcessMemory::open(interp.pid) else { return Ok(Vec::new()) };
    walk(&mem, &interp.layout, interp.runtime, interp.pid)
}

/// `thread_states` over any memory (`pid`: the main thread's id).
pub fn walk(mem: &impl Memory, l: &Layout, runtime: u64, pid: u32) -> Result<Vec<(u32, u64)>, String> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut is = mem.u64(runtime.wrapping_add(l.runtime_interpreters_head)).unwrap_or(0);
    for _ in 0..MAX_INTERPRETERS {
        if is == 0 {
            break;
        }
        if !seen.insert(is) {
            return Err(format!("its interpreter list loops (at {is:#x})"));
        }
        let mut ts = mem.u64(is.wrapping_add(l.interp_threads_head)).unwrap_or(0);
        while ts != 0 {
            if !seen.insert(ts) {
                return Err(format!("its thread list loops (at {ts:#x})"));
            }
            if seen.len() > MAX_THREAD_STATES {
                return Err(format!("its thread lists hold over {MAX_THREAD_STATES} thread states"));
            }
            if let Some(tid) = thread_id(mem, l, ts) {
                out.push((tid, ts));
            }
            ts = mem.u64(ts.wrapping_add(l.tstate_next)).unwrap_or(0);
        }
        is = mem.u64(is.wrapping_add(l.interp_next)).unwrap_or(0);
    }
    // Thread ids read from glibc's descriptors are believed only when the
    // main thread is among them (another C library keeps them elsewhere).
    if l.thread_id == ThreadId::Pthread && !out.iter().any(|&(tid, _)| tid == pid) {
        return Ok(Vec::new());
    }
    Ok(out)
}

/// The kernel thread id of a thread state: its native id, or (3.10) the
/// one glibc's thread descriptor holds.
fn thread_id(mem: &impl Memory, l: &Layout, ts: u64) -> Option<u32> {
    let id = mem.u64(ts.wrapping_add(l.tstate_native_thread_id))?;
    let tid = match l.thread_id {
        ThreadId::Native => id,
        ThreadId::Pthread => mem.u32(id.checked_add(PTHREAD_TID)?)? as u64,
    };
    (tid > 0 && tid <= u32::MAX as u64).then_some(tid as u32)
}
