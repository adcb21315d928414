//! Benchmarks of the agent's own engine, no kernel involved: throughput of
//! decode → state → analyses on a recorded session and memory per live
//! allocation (`cargo xtask bench-engine`), and /metrics rendering at scale
//! (`cargo xtask bench-metrics`).
use std::{collections::BTreeMap, time::Instant};

use anyhow::{anyhow, Result};
use gpumem_common::{api, Event};

use super::ingest::{self, Ingest, Ingested, Replayer};
use crate::{
    analysis::{
        distributions::{self, Distributions},
        leaks::{self, GrowthTracker},
    },
    cli::BenchEngineArgs,
    events::LostEvents,
    export::prometheus::{self, ExportConfig, Exporter, Inputs},
    nvml::GpuSample,
    record::{self, Footer, Header},
    state::{Limits, State},
};

/// The comm of every synthetic process.
const COMM: [u8; 16] = *b"python3\0\0\0\0\0\0\0\0\0";

/// A synthetic session: `processes` processes, each with a primary context,
/// doing allocate/free pairs (sizes from 4 KiB to 64 MiB) with a tenth of
/// allocations kept live, until `events` events.
fn synthetic_recording(events: u64, processes: u32) -> Result<Vec<u8>> {
    let mut w = record::Writer::new(Vec::with_capacity((events as usize) * 100))?;
    w.header(&Header { gpumem_version: env!("CARGO_PKG_VERSION").into(), recorded_by: "bench".into(), command: None, pids: vec![], started_ns: 0 })?;
    let mut ts = 1u64;
    let mut ev = |pid: u32, e: Event, w: &mut record::Writer<Vec<u8>>| -> Result<()> {
        ts += 1_000;
        w.event(&Event { pid, tid: pid, comm: COMM, ts_ns: ts, latency_ns: 20_000, ..e }, None)?;
        Ok(())
    };
    let mut n = 0u64;
    for pid in 1..=processes {
        ev(pid, Event { handle: 0xc0, device: (pid % 8) as i32, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }, &mut w)?;
        ev(pid, Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }, &mut w)?;
        n += 2;
    }
    let mut i = 0u64;
    while n < events {
        let pid = 1 + (i % processes as u64) as u32;
        let addr = 0x7f00_0000_0000 + i * 0x1000;
        let size = 4096u64 << (i % 15);
        ev(pid, Event { addr, size, ..Event::empty(api::CU_MEM_ALLOC_V2) }, &mut w)?;
        n += 1;
        if i % 10 != 0 {
            ev(pid, Event { addr, ..Event::empty(api::CU_MEM_FREE_V2) }, &mut w)?;
            n += 1;
        }
        i += 1;
    }
    Ok(w.finish(&Footer::default())?)
}

/// What `serve` does per event: ingest, distributions and the exporter's
/// counters and histograms (also driven by the property tests).
pub struct Engine {
    pub ingest: Ingest,
    pub growth: GrowthTracker,
    pub distributions: Distributions,
    pub exporter: Exporter,
}

impl Engine {
    pub fn new(limits: Limits, export: ExportConfig) -> Self {
        Engine {
            ingest: Ingest::replay(State::new(limits)),
            growth: GrowthTracker::default(),
            distributions: Distributions::default(),
            exporter: Exporter::new(export),
        }
    }
}

impl Replayer for Engine {
    fn parts(&mut self) -> (&mut Ingest, &mut GrowthTracker) {
        (&mut self.ingest, &mut self.growth)
    }
    fn after(&mut self, ev: &Event, Ingested { applied, .. }: Ingested) -> bool {
        let o = distributions::observe(ev, &applied);
        if let Some(o) = &o {
            self.distributions.record(o);
        }
        self.exporter.observe(ev, &applied, o.as_ref());
        true
    }
}

pub fn engine(a: BenchEngineArgs) -> Result<()> {
    // 1. Memory per live allocation (first, in a fresh heap): `live` allocations across `live_processes`.
    let rss0 = crate::selfstat::resident_bytes();
    let mut state = State::new(Limits { max_entries: a.live as usize + 1, max_processes: 1 << 20 });
    let per = (a.live / a.live_processes as u64).max(1);
    for pid in 1..=a.live_processes {
        let at = |e: Event| Event { pid, tid: pid, comm: COMM, ts_ns: 1, ..e };
        state.apply_with_stack(&at(Event { handle: 0xc0, device: 0, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }), None);
        state.apply_with_stack(&at(Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }), None);
        for i in 0..per {
            state.apply_with_stack(&at(Event { addr: 0x1000 * (i + 1), size: 1 << 20, ..Event::empty(api::CU_MEM_ALLOC_V2) }), Some(i % 64));
        }
    }
    let live: u64 = state.processes.values().map(|p| p.allocs.len() as u64).sum();
    let rss1 = crate::selfstat::resident_bytes();
    let by_dev: BTreeMap<i32, u64> = state.processes.values().flat_map(|p| p.devices.iter().map(|(&d, t)| (d, t.live_allocs))).fold(BTreeMap::new(), |mut m, (d, n)| {
        *m.entry(d).or_default() += n;
        m
    });
    println!(
        "memory: {live} live allocations in {} processes: agent RSS {:.1} MiB → {:.1} MiB, {:.0} bytes per live allocation (state only; kernel maps not included); {} on device 0",
        a.live_processes,
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0,
        rss1.saturating_sub(rss0) as f64 / live.max(1) as f64,
        by_dev.get(&0).copied().unwrap_or(0)
    );
    drop(state);

    // 2. Throughput: decode (frames, CRC), state, distributions and the
    // exporter's counters and histograms, as `serve` does per event.
    let bytes = synthetic_recording(a.events, a.processes)?;
    let mut rates = Vec::new();
    let mut events = 0;
    for _ in 0..a.rounds.max(1) {
        let mut reader = record::Reader::new(bytes.as_slice()).map_err(|e| anyhow!("{e}"))?;
        let mut engine = Engine::new(
            Limits { max_entries: 1 << 24, max_processes: 1 << 20 },
            ExportConfig { max_process_series: 500, leak_age_ns: u64::MAX },
        );
        let t = Instant::now();
        let end = ingest::replay(&mut reader, &mut engine);
        let dt = t.elapsed().as_secs_f64();
        if let Some(e) = end.damage {
            return Err(anyhow!("the synthetic recording did not read back: {e}"));
        }
        events = end.events;
        rates.push(events as f64 / dt);
    }
    rates.sort_by(|x, y| x.total_cmp(y));
    println!(
        "engine: {events} events ({} processes, {:.1} MiB recording) through decode → state → distributions → exporter: median {:.2} M events/s, best {:.2} M events/s ({} rounds, one core)",
        a.processes,
        bytes.len() as f64 / 1048576.0,
        rates[rates.len() / 2] / 1e6,
        rates[rates.len() - 1] / 1e6,
        rates.len()
    );

    Ok(())
}

/// Renders the exposition of a synthetic host (every process holding memory
/// on every GPU, no cap) and reports its size and the median render time.
pub fn render(args: crate::cli::BenchRenderArgs) -> Result<()> {
    let mut state = State::new(Limits::default());
    let mut exporter = Exporter::new(ExportConfig { max_process_series: usize::MAX, leak_age_ns: u64::MAX });
    let gpus: Vec<GpuSample> = (0..args.gpus)
        .map(|i| GpuSample {
            index: i,
            uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
            name: "NVIDIA H200".into(),
            memory: Some(crate::nvml::MemoryInfo { total: 141 << 30, used: 1 << 30, free: 140 << 30, reserved: 0 }),
            gpu_temp_c: Some(40),
            memory_temp_c: Some(45),
            ..Default::default()
        })
        .collect();
    for pid in 1..=args.processes {
        let at = |e: Event| Event { pid, tid: pid, comm: COMM, ts_ns: 1, latency_ns: 5_000, ..e };
        for dev in 0..args.gpus as i32 {
            let ctx = 0x100 + dev as u64;
            for e in [
                at(Event { handle: ctx, device: dev, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }),
                at(Event { handle: ctx, ..Event::empty(api::CU_CTX_SET_CURRENT) }),
                at(Event { addr: 0x1000 + dev as u64, size: 2 << 20, ..Event::empty(api::CU_MEM_ALLOC_V2) }),
            ] {
                let applied = state.apply_with_stack(&e, None);
                exporter.observe(&e, &applied, distributions::observe(&e, &applied).as_ref());
            }
        }
    }
    let mut growth = GrowthTracker::default();
    let health = BTreeMap::new();
    let lost = LostEvents::default();
    let mut times = Vec::new();
    let mut body = String::new();
    for _ in 0..args.rounds.max(1) {
        let t = Instant::now();
        body = exporter.render(Inputs {
            state: &state,
            growth: &mut growth,
            gpus: &gpus,
            health: &health,
            nvml_error: None,
            lost: &lost,
            probes_attached: 30,
            stale_calls_removed: 0,
            now_ns: leaks::monotonic_ns(),
        })?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let samples = body.lines().filter(|l| !l.starts_with('#')).count();
    let process_series = body.lines().filter(|l| l.starts_with("gpumem_process_memory_bytes{")).count();
    println!(
        "process_series={process_series} samples={samples} bytes={} text_bytes={} median_ms={:.2} min_ms={:.2}",
        body.len(),
        prometheus::to_text_format(&body).len(),
        times[times.len() / 2] * 1e3,
        times[0] * 1e3
    );
    Ok(())
}

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
    while len < gpumem_common::STACK_BYTES && mem.read_exact_at(&mut rec.data[len..len + gpumem_common::STACK_CHUNK], sp + len as u64).is_ok() {
        len += gpumem_common::STACK_CHUNK;
    }
    rec.len = len as u32;
    rec
}

/// A few calls deep, so that the stack has frames of this binary and libc's.
#[inline(never)]
fn deep(n: u32) -> Box<gpumem_common::StackEvent> {
    if n == 0 { capture_own_stack() } else { std::hint::black_box(deep(n - 1)) }
}

/// Unwinding and symbolization per stack, on a real stack of this process:
/// unwinding every time (the agent unwinds each allocation's stack), and
/// symbolizing its frames uncached (a fresh symbolizer: ELF and DWARF read)
/// and cached (the agent's per-frame cache).
pub fn stacks(a: crate::cli::BenchStacksArgs) -> Result<()> {
    use crate::stacks::Stacks;
    let rec = deep(8);
    let rounds = a.rounds.max(1);
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
