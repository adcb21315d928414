//! Benchmarks of gpumem's engine, no kernel involved, on the library the
//! agent ships (`cargo bench -p gpumem-agent --bench engine -- MODE`):
//! - `engine`: events/s through the pipeline (decode → lookups → stacks →
//!   state → analyses) from a synthetic recording, and bytes per live allocation;
//! - `render`: /metrics render time and size for a large host;
//! - `stacks`: unwinding and symbolization (uncached, cached) per stack;
//! - `export`: `gpumem export`'s time and file size per format;
//! - `verdicts`: the growth detector's recall, precision and time to verdict on its corpus.
//!
//! `cargo xtask bench-engine`, `bench-metrics` and `bench-stacks` run them.
mod export;
mod render;
mod stacks;

use std::{convert::Infallible, process::ExitCode, time::Instant};

use anyhow::{anyhow, bail, Result};
use clap::{Parser, Subcommand};
use gpumem_agent::runtime::{self, Ctx, End, Output};
use gpumem_common::{api, Event};
use gpumem_engine::{
    events::Kind,
    pipeline,
    record::{self, Footer, Header},
    state::{Limits, State},
};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true, global = true)]
    bench: bool,
}

#[derive(Subcommand)]
enum Mode {
    /// Engine throughput and memory per live allocation.
    Engine {
        /// Events in the synthetic recording.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Processes in it.
        #[arg(long, default_value_t = 100)]
        processes: u32,
        /// Replays; the median rate is reported.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Live allocations for the memory measurement.
        #[arg(long, default_value_t = 1_000_000)]
        live: u64,
        /// Processes holding them.
        #[arg(long, default_value_t = 1000)]
        live_processes: u32,
    },
    /// /metrics rendered from a synthetic host.
    Render {
        /// Processes, each holding memory on every GPU.
        #[arg(long, default_value_t = 1250)]
        processes: u32,
        /// GPUs (each with NVML labels).
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        /// Libraries each process's memory on each GPU comes from (0: no stacks, one owner "unknown").
        #[arg(long, default_value_t = 0)]
        owners: u32,
        /// Renderings; the median is reported.
        #[arg(long, default_value_t = 21)]
        rounds: u32,
    },
    /// Export time and size per format for a synthetic recording.
    Export {
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        #[arg(long, default_value_t = 100)]
        processes: u32,
    },
    /// The growth detector on its labelled corpus: recall, precision and
    /// time to verdict per shape; the recordings are written to `--out`.
    Verdicts {
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Unwinding and symbolization cost per stack.
    Stacks {
        /// Stacks unwound (and frames symbolized) per measurement.
        #[arg(long, default_value_t = 20_000)]
        rounds: u32,
    },
}

/// The comm of every synthetic process.
pub const COMM: [u8; 16] = *b"python3\0\0\0\0\0\0\0\0\0";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.mode {
        Mode::Engine { events, processes, rounds, live, live_processes } => {
            memory(live, live_processes).and_then(|()| throughput(events, processes, rounds))
        }
        Mode::Render { processes, gpus, owners, rounds } => render::run(processes, gpus, owners, rounds),
        Mode::Stacks { rounds } => stacks::run(rounds),
        Mode::Export { events, processes } => export::run(events, processes),
        Mode::Verdicts { out } => verdicts(out.as_deref()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Scores the detector on the corpus and prints the table; writes each
/// recording to `out` (replay them with `gpumem leaks --replay`).
fn verdicts(out: Option<&std::path::Path>) -> Result<()> {
    use gpumem_engine::corpus;
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)?;
        for shape in corpus::shapes() {
            std::fs::write(dir.join(format!("{}.gpumem", shape.name)), corpus::recording(shape)?)?;
        }
        println!("recordings: {}", dir.display());
    }
    let scores = corpus::score().map_err(|e| anyhow!("{e}"))?;
    print!("{}", scores.table());
    Ok(())
}

/// A synthetic session: `processes` processes, each with a primary context,
/// doing allocate/free pairs (sizes from 4 KiB to 64 MiB) with a tenth of
/// allocations kept live, until `events` events.
struct Synthetic {
    bytes: Vec<u8>,
    /// Allocations never freed: what the state holds at the end.
    kept: u64,
}

fn synthetic_recording(events: u64, processes: u32) -> Result<Synthetic> {
    synthetic_recording_with(events, processes, &[])
}

/// The same, allocation i with stack `stacks[i % len]` (symbolized, in the recording).
fn synthetic_recording_with(events: u64, processes: u32, stacks: &[(u64, Vec<gpumem_engine::stacks::Frame>)]) -> Result<Synthetic> {
    let mut w = record::Writer::new(Vec::with_capacity((events as usize) * 100))?;
    w.header(&Header {
        gpumem_version: env!("CARGO_PKG_VERSION").into(),
        recorded_by: "bench".into(),
        command: None,
        pids: vec![],
        started_ns: 0,
        stack_sample_bytes: 0,
        host: String::new(),
        started_unix_ns: 0,
    })?;
    for (id, frames) in stacks {
        w.stack(*id, frames.clone())?;
    }
    // Each process is one thread, so each call starts after its previous
    // call returned (calls 25 µs apart, 20 µs long). With calls closer than
    // they last, a free would start before the allocation it frees had
    // returned: the state takes that for a reordered free (of an earlier
    // allocation at the address), and the table would keep every allocation.
    let mut ts = 1u64;
    let mut ev = |pid: u32, e: Event, stack: Option<u64>, w: &mut record::Writer<Vec<u8>>| -> Result<()> {
        ts += 25_000;
        w.event(&Event { pid, tid: pid, comm: COMM, ts_ns: ts, latency_ns: 20_000, ..e }, stack)?;
        Ok(())
    };
    let mut n = 0u64;
    for pid in 1..=processes {
        ev(pid, Event { handle: 0xc0, device: (pid % 8) as i32, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }, None, &mut w)?;
        ev(pid, Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }, None, &mut w)?;
        n += 2;
    }
    let (mut i, mut kept) = (0u64, 0u64);
    while n < events {
        let pid = 1 + (i % processes as u64) as u32;
        let addr = 0x7f00_0000_0000 + i * 0x1000;
        let size = 4096u64 << (i % 15);
        let stack = (!stacks.is_empty()).then(|| stacks[(i % stacks.len() as u64) as usize].0);
        ev(pid, Event { addr, size, ..Event::empty(api::CU_MEM_ALLOC_V2) }, stack, &mut w)?;
        n += 1;
        if i.is_multiple_of(10) {
            kept += 1;
        } else {
            ev(pid, Event { addr, ..Event::empty(api::CU_MEM_FREE_V2) }, None, &mut w)?;
            n += 1;
        }
        i += 1;
    }
    Ok(Synthetic { bytes: w.finish(&Footer::default())?, kept })
}

/// Memory per live allocation, in a fresh heap: `live` allocations across `processes`.
fn memory(live: u64, processes: u32) -> Result<()> {
    let rss0 = gpumem_agent::selfstat::resident_bytes();
    let mut state = State::new(Limits { max_entries: live as usize + 1, max_processes: 1 << 20 });
    let per = (live / processes as u64).max(1);
    let mut apply = |e: Event, stack| {
        state.apply_kind(&e, &Kind::of(&e), stack);
    };
    for pid in 1..=processes {
        let at = |e: Event| Event { pid, tid: pid, comm: COMM, ts_ns: 1, ..e };
        apply(at(Event { handle: 0xc0, device: 0, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }), None);
        apply(at(Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }), None);
        for i in 0..per {
            apply(at(Event { addr: 0x1000 * (i + 1), size: 1 << 20, ..Event::empty(api::CU_MEM_ALLOC_V2) }), Some(i % 64));
        }
    }
    let live: u64 = state.processes.values().map(|p| p.held.allocs.len() as u64).sum();
    let rss1 = gpumem_agent::selfstat::resident_bytes();
    let on_0: u64 = state.processes.values().filter_map(|p| p.held.devices.get(&0)).map(|t| t.live_allocs).sum();
    println!(
        "memory: {live} live allocations in {processes} processes: agent RSS {:.1} MiB → {:.1} MiB, {:.0} bytes per live allocation (state only; kernel maps not included); {on_0} on device 0",
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0,
        rss1.saturating_sub(rss0) as f64 / live.max(1) as f64,
    );
    Ok(())
}

/// Replays do nothing per event: the pipeline is what is measured. At the
/// end, what the state holds, so that the benchmark checks it measured the
/// path it means to (frees that free).
#[derive(Default)]
struct Count {
    live: u64,
    frees_not_matched: u64,
}

impl Output for Count {
    type Input = Infallible;

    fn finish(&mut self, ctx: &mut Ctx<'_>, _: &End) -> Result<ExitCode> {
        let processes = ctx.pipeline.state.processes.values();
        for p in processes {
            self.live += p.held.allocs.len() as u64;
            self.frees_not_matched += p.reordered_frees + p.untracked_frees;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Events per second through the pipeline, as every command applies them.
fn throughput(events: u64, processes: u32, rounds: u32) -> Result<()> {
    let Synthetic { bytes, kept } = synthetic_recording(events, processes)?;
    let mut rates = Vec::new();
    let mut read = 0;
    for _ in 0..rounds.max(1) {
        let mut reader = record::Reader::new(bytes.as_slice()).map_err(|e| anyhow!("{e}"))?;
        let options = pipeline::Options { limits: Limits { max_entries: 1 << 24, max_processes: 1 << 20 }, ..Default::default() };
        let mut count = Count::default();
        let t = Instant::now();
        runtime::replay(&mut reader, options, &mut count)?;
        let dt = t.elapsed().as_secs_f64();
        read = reader.events;
        if count.frees_not_matched != 0 || count.live != kept {
            bail!(
                "the replay measured another path than meant: {} live allocations (expected {kept}), {} frees not matched to their allocation",
                count.live,
                count.frees_not_matched
            );
        }
        rates.push(read as f64 / dt);
    }
    rates.sort_by(|x, y| x.total_cmp(y));
    println!(
        "engine: {read} events ({processes} processes, {:.1} MiB recording) through decode → lookups → stacks → state → analyses: median {:.2} M events/s, best {:.2} M events/s ({} rounds, one core)",
        bytes.len() as f64 / 1048576.0,
        rates[rates.len() / 2] / 1e6,
        rates[rates.len() - 1] / 1e6,
        rates.len()
    );
    Ok(())
}
