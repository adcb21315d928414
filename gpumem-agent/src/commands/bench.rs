//! Benchmarks of the agent's own engine, no kernel involved (for
//! `cargo xtask bench-engine`): throughput of decode → state → analyses on a
//! recorded session, and memory per live allocation.
use std::{collections::BTreeMap, time::Instant};

use anyhow::{anyhow, Result};
use gpumem_common::{api, Event};

use super::ingest::{self, Ingest, Ingested, Replayer};
use crate::{
    analysis::{
        distributions::{self, Distributions},
        leaks::GrowthTracker,
    },
    cli::BenchEngineArgs,
    export::prometheus::{ExportConfig, Exporter},
    record::{self, Footer, Header},
    state::{Limits, State},
};

/// A synthetic session: `processes` processes, each with a primary context,
/// doing allocate/free pairs (sizes from 4 KiB to 64 MiB) with a tenth of
/// allocations kept live, until `events` events.
fn synthetic_recording(events: u64, processes: u32) -> Result<Vec<u8>> {
    let mut w = record::Writer::new(Vec::with_capacity((events as usize) * 100))?;
    w.header(&Header { gpumem_version: env!("CARGO_PKG_VERSION").into(), recorded_by: "bench".into(), command: None, pids: vec![], started_ns: 0 })?;
    let comm = *b"python3\0\0\0\0\0\0\0\0\0";
    let mut ts = 1u64;
    let mut ev = |pid: u32, e: Event, w: &mut record::Writer<Vec<u8>>| -> Result<()> {
        ts += 1_000;
        w.event(&Event { pid, tid: pid, comm, ts_ns: ts, latency_ns: 20_000, ..e }, None)?;
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

struct Engine {
    ingest: Ingest,
    growth: GrowthTracker,
    distributions: Distributions,
    exporter: Exporter,
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

pub fn run(a: BenchEngineArgs) -> Result<()> {
    // 1. Memory per live allocation (first, in a fresh heap): `live` allocations across `live_processes`.
    let rss0 = rss();
    let mut state = State::new(Limits { max_entries: a.live as usize + 1, max_processes: 1 << 20 });
    let per = (a.live / a.live_processes as u64).max(1);
    let comm = *b"python3\0\0\0\0\0\0\0\0\0";
    for pid in 1..=a.live_processes {
        let at = |e: Event| Event { pid, tid: pid, comm, ts_ns: 1, ..e };
        state.apply_with_stack(&at(Event { handle: 0xc0, device: 0, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }), None);
        state.apply_with_stack(&at(Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }), None);
        for i in 0..per {
            state.apply_with_stack(&at(Event { addr: 0x1000 * (i + 1), size: 1 << 20, ..Event::empty(api::CU_MEM_ALLOC_V2) }), Some(i % 64));
        }
    }
    let live: u64 = state.processes.values().map(|p| p.allocs.len() as u64).sum();
    let rss1 = rss();
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
        let mut engine = Engine {
            ingest: Ingest::replay(State::new(Limits { max_entries: 1 << 24, max_processes: 1 << 20 })),
            growth: GrowthTracker::default(),
            distributions: Distributions::default(),
            exporter: Exporter::new(ExportConfig { max_process_series: 500, leak_age_ns: u64::MAX }),
        };
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

/// Resident bytes of this process (/proc/self/statm).
fn rss() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |p| p * page)
}
