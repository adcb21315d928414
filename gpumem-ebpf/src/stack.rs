//! The caller's stack for leak finding. Frame pointers cannot be trusted
//! (-O2 code, libcuda, PyTorch have none), so the registers and a bounded
//! slice of the user stack go to the agent, which unwinds them with the
//! binaries' .eh_frame. Taken at the uretprobe: the callee's frame is gone,
//! `rip` is the return address in the caller and `rsp`/`rbp` are the
//! caller's, so the unwind starts in the caller. (At a USDT probe `rip` is
//! the probe's own instruction, inside the function that fires it.)
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_prandom_u32, generated::bpf_probe_read_user},
};
use gpumem_common::{
    counters::{Exit, Stat},
    flags,
    python::{PY_FRAMES_MAX, PY_FRAME_SIZE},
    sampling, Event, StackBudget, STACK_BYTES, STACK_CHUNK, STACK_HEADER_SIZE,
};

use crate::{
    emit,
    maps::{
        count, load_time_u64, BPF_RB_NO_WAKEUP, STACKS, STACK_BUDGET, STACK_BUDGET_PER_S, STACK_BURST, STACK_COPY_BYTES,
        STACK_SAMPLE_BYTES, STACK_SCRATCH,
    },
    python,
};

const NS_PER_S: u64 = 1_000_000_000;

/// Sends an allocation event, and its caller's stack to the stack ring.
/// The event's slot is reserved first (no stack is copied for an event that
/// cannot be sent) and submitted last (its stack is committed before it, so
/// the agent finds the stack when it reads the event). `submit`: the ring
/// buffer flags (wakeup policy) for the event.
#[inline(always)]
pub fn emit_with_stack(regs: *const pt_regs, mut ev: Event, submit: u64) -> Result<(), Exit> {
    let mut entry = emit::reserve(ev.pid)?;
    let take = if under_budget(ev.pid, ev.ts_ns) {
        true
    } else if sampled(ev.size) {
        ev.flags |= flags::STACK_SAMPLED;
        true
    } else {
        ev.flags |= flags::STACK_NOT_SAMPLED;
        false
    };
    if take {
        if send_stack(regs, &ev) {
            ev.flags |= flags::HAS_STACK;
        } else {
            count(Stat::StacksDropped);
        }
    }
    entry.write(ev);
    entry.submit(submit);
    Ok(())
}

/// Takes one stack from the process's budget if it has one left. Threads of
/// one process on other CPUs may update its bucket at once: a lost update
/// only shifts the budget by a stack, never the accounting.
#[inline(always)]
fn under_budget(tgid: u32, now: u64) -> bool {
    let per_s = load_time_u64(&STACK_BUDGET_PER_S);
    if per_s == 0 {
        return true;
    }
    // The agent keeps per_s and the burst ≤ 1e6: they fit in 64 bits.
    let burst = load_time_u64(&STACK_BURST);
    let full = if burst == 0 { per_s } else { burst } * NS_PER_S;
    let Some(b) = STACK_BUDGET.get_ptr_mut(&tgid) else {
        let _ = STACK_BUDGET.insert(&tgid, &StackBudget { tokens: full - NS_PER_S, last_ns: now }, 0);
        return true;
    };
    // SAFETY: a value of this map, valid while the program runs.
    unsafe {
        let elapsed = now.saturating_sub((*b).last_ns).min(NS_PER_S);
        let tokens = ((*b).tokens + elapsed * per_s).min(full);
        (*b).last_ns = now;
        if tokens >= NS_PER_S {
            (*b).tokens = tokens - NS_PER_S;
            true
        } else {
            (*b).tokens = tokens;
            false
        }
    }
}

/// Beyond the budget: a stack with probability 1 − exp(−size/rate).
#[inline(always)]
fn sampled(size: u64) -> bool {
    let p = sampling::probability(size, load_time_u64(&STACK_SAMPLE_BYTES));
    // SAFETY: a helper without arguments.
    (unsafe { bpf_get_prandom_u32() } & (sampling::P_ONE - 1)) < p
}

/// Copies the stack into a per-CPU scratch record (too big for the BPF
/// stack), then only the bytes actually read to the stack ring (ring
/// reservations must have a constant size). False if it could not be sent.
#[inline(always)]
fn send_stack(regs: *const pt_regs, ev: &Event) -> bool {
    let Some(rec) = STACK_SCRATCH.get_ptr_mut(0) else { return false };
    let (ip, sp, bp) = crate::regs::caller(regs);
    let mut len = 0usize;
    // SAFETY: plain lookup, copied out.
    let chunks = unsafe { STACK_COPY_BYTES.get(&ev.pid) }.map_or(STACK_BYTES, |&b| b as usize) / STACK_CHUNK;
    // SAFETY: `rec` is this CPU's scratch StackEvent; each read stays inside
    // `data`, and user addresses are checked by the helper.
    unsafe {
        (*rec).event = *ev;
        (*rec).event.flags |= flags::HAS_STACK;
        (*rec).ip = ip;
        (*rec).sp = sp;
        (*rec).bp = bp;
        // The Python frames first (none for native-only processes), then the stack.
        let pid_tgid = ((ev.pid as u64) << 32) | ev.tid as u64;
        let py = python::walk(pid_tgid, (*rec).data.as_mut_ptr().cast()) as usize;
        let py_bytes = (py & (PY_FRAMES_MAX * 2 - 1)).min(PY_FRAMES_MAX) * PY_FRAME_SIZE;
        (*rec).py_frames = (py_bytes / PY_FRAME_SIZE) as u32;
        let data = (*rec).data.as_mut_ptr().add(py_bytes);
        let mut i = 0;
        while i < STACK_BYTES / STACK_CHUNK && i < chunks {
            let off = i * STACK_CHUNK;
            let r = bpf_probe_read_user(data.add(off).cast(), STACK_CHUNK as u32, (sp as usize + off) as *const _);
            if r != 0 {
                break;
            }
            len += STACK_CHUNK;
            i += 1;
        }
        (*rec).len = len as u32;
        // Uprobe programs can be preempted (migration is disabled, preemption
        // is not): if another thread's probe on this CPU rewrote the scratch
        // meanwhile, send the event without a stack rather than a wrong one.
        if (*rec).event.tid != ev.tid || (*rec).event.ts_ns != ev.ts_ns {
            return false;
        }
        let bytes = core::slice::from_raw_parts(rec as *const u8, STACK_HEADER_SIZE + py_bytes + len.min(STACK_BYTES));
        STACKS.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_ok()
    }
}
