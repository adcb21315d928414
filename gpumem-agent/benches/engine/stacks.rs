//! Unwinding and symbolization per stack, on a real stack of this process.
use std::time::Instant;

use anyhow::{anyhow, Result};
use gpumem_common::{api, Event};
use gpumem_engine::stacks::Stacks;

/// This thread's stack captured the way the uretprobe does: the registers at
/// one instruction and up to STACK_BYTES from the stack pointer, read through
/// /proc/self/mem in 512-byte chunks (a read past the stack's top fails, as
/// bpf_probe_read_user does).
#[inline(never)]
fn capture_own_stack() -> Box<gpumem_common::StackEvent> {
    use std::os::unix::fs::FileExt as _;
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, touches no memory.
    unsafe { std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp", ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp) };
    // SAFETY: StackEvent is plain old data; all zeroes is valid.
    let mut rec = unsafe { Box::<gpumem_common::StackEvent>::new_zeroed().assume_init() };
    rec.event = Event { pid: std::process::id(), tid: std::process::id(), ..Event::empty(api::CU_MEM_ALLOC_V2) };
    (rec.ip, rec.sp, rec.bp) = (ip, sp, bp);
    let mem = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
    let mut len = 0;
    while len < gpumem_common::STACK_BYTES
        && mem.read_exact_at(&mut rec.data[len..len + gpumem_common::STACK_CHUNK], sp + len as u64).is_ok()
    {
        len += gpumem_common::STACK_CHUNK;
    }
    rec.len = len as u32;
    rec
}

/// A few calls deep, so that the stack has frames of this binary and libc's.
#[inline(never)]
fn deep(n: u32) -> Box<gpumem_common::StackEvent> {
    if n == 0 {
        capture_own_stack()
    } else {
        std::hint::black_box(deep(n - 1))
    }
}

/// Unwinding and symbolization per stack, on a real stack of this process:
/// unwinding every time (the agent unwinds each allocation's stack), and
/// symbolizing its frames uncached (a fresh symbolizer: ELF and DWARF read)
/// and cached (the agent's per-frame cache).
pub fn run(rounds: u32) -> Result<()> {
    let rec = deep(8);
    let rounds = rounds.max(1);
    let mut stacks = Stacks::default();
    let id = stacks.record(&rec).ok_or_else(|| anyhow!("could not unwind this process's own stack"))?;
    let t = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(stacks.record(&rec));
    }
    let unwind_us = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
    let depth = stacks.stats.frames_total / stacks.stats.captured.max(1);
    let uncached_rounds = (rounds / 100).clamp(3, 50);
    let t = Instant::now();
    let mut frames = Vec::new();
    for _ in 0..uncached_rounds {
        let mut fresh = Stacks::default();
        let id = fresh.record(&rec).expect("unwound above");
        frames = fresh.frames(id);
        std::hint::black_box(&frames);
    }
    // The unwinding share of the loop above is known: take it out.
    let uncached_us = t.elapsed().as_secs_f64() * 1e6 / uncached_rounds as f64 - unwind_us;
    let t = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(stacks.frames(id));
    }
    let cached_us = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
    let named = frames.iter().filter(|f| f.function.is_some()).count();
    println!(
        "stacks: {} bytes copied, {depth} frames ({named} named): unwind {unwind_us:.2} µs per stack; symbolize uncached {uncached_us:.0} µs per stack, cached {cached_us:.2} µs per stack ({rounds} rounds; uncached {uncached_rounds})",
        rec.len
    );
    Ok(())
}
