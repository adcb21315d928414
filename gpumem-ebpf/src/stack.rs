//! The caller's stack for leak finding. Frame pointers cannot be trusted
//! (-O2 code, libcuda, PyTorch have none), so the registers and a bounded
//! slice of the user stack go to the agent, which unwinds them with the
//! binaries' .eh_frame. Taken at the uretprobe: the callee's frame is gone,
//! `rip` is the return address in the caller and `rsp`/`rbp` are the
//! caller's, so the unwind starts in the caller.
use aya_ebpf::{helpers::generated::bpf_probe_read_user, programs::RetProbeContext};
use gpumem_common::{flags, stat, Event, STACK_BYTES, STACK_CHUNK, STACK_HEADER_SIZE};

use crate::maps::{lost, EVENTS, STACK_SCRATCH};

#[inline(always)]
/// `submit`: the ring buffer flags (wakeup policy) for the record.
pub fn emit_with_stack(ctx: &RetProbeContext, mut ev: Event, submit: u64) {
    // Built in a per-CPU scratch record, then only the bytes actually copied
    // go to the ring (ring reservations must have a constant size).
    let Some(rec) = STACK_SCRATCH.get_ptr_mut(0) else { return };
    // SAFETY: the context is the probe's pt_regs.
    let (ip, sp, bp) = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
    ev.flags |= flags::HAS_STACK;
    let mut len = 0usize;
    // SAFETY: `rec` is this CPU's scratch StackEvent; each read stays inside
    // `data`, and user addresses are checked by the helper.
    unsafe {
        (*rec).event = ev;
        (*rec).ip = ip;
        (*rec).sp = sp;
        (*rec).bp = bp;
        (*rec)._pad = 0;
        let data = (*rec).data.as_mut_ptr();
        let mut i = 0;
        while i < STACK_BYTES / STACK_CHUNK {
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
            ev.flags &= !flags::HAS_STACK;
            if EVENTS.output::<Event>(&ev, submit).is_err() {
                lost(stat::RINGBUF_FULL, ev.pid);
            }
            return;
        }
        let bytes = core::slice::from_raw_parts(rec as *const u8, STACK_HEADER_SIZE + len.min(STACK_BYTES));
        if EVENTS.output::<[u8]>(bytes, submit).is_err() {
            lost(stat::RINGBUF_FULL, ev.pid);
        }
    }
}
