//! `gpumem export` on a synthetic recording: replay and rendering time and
//! the file's size per format (what `cargo xtask bench-export` prints).
use std::{convert::Infallible, process::ExitCode, sync::Arc, time::Instant};

use anyhow::{anyhow, Result};
use gpumem_agent::{
    analysis::{history, profile::Layers},
    cli::export::Format,
    commands::export::{render, Query, Span},
    pipeline,
    record::{self, Footer, Header},
    runtime::{self, Ctx, End, Output},
    stacks::Frame,
    state::Limits,
};
use gpumem_common::{api, Event};

/// Distinct allocation stacks in the recording, and frames in each.
const STACKS: u64 = 64;
const DEPTH: usize = 16;

/// Renders at the end of the replay and keeps the file.
struct Render {
    format: Format,
    out: Option<Vec<u8>>,
}

impl Output for Render {
    type Input = Infallible;
    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        let q = Query { format: self.format, pid: Some(1), layers: Layers::Driver, older_than_s: 0.0 };
        let span = Span { ended_ns: end.footer.ended_ns, duration_s: end.footer.duration_s, wall_end_ns: 0, recorded_by: "bench".into() };
        self.out = Some(render(ctx.pipeline, &q, &span)?.bytes);
        Ok(ExitCode::SUCCESS)
    }
}

/// The synthetic session of the engine benchmark, each allocation with one
/// of STACKS symbolized stacks of DEPTH frames.
fn recording(events: u64, processes: u32) -> Result<Vec<u8>> {
    let mut w = record::Writer::new(Vec::with_capacity((events as usize) * 100))?;
    let header = Header {
        gpumem_version: env!("CARGO_PKG_VERSION").into(),
        recorded_by: "bench".into(),
        command: None,
        pids: vec![],
        started_ns: 0,
        stack_sample_bytes: 0,
    };
    w.header(&header)?;
    let module: Arc<str> = Arc::from("/opt/app/bin/train");
    for id in 1..=STACKS {
        let frames = (0..DEPTH)
            .map(|d| Frame {
                function: Some(format!("layer_{id}_{d}")),
                offset: Some(0x10),
                file: Some(format!("/src/model_{id}.cc")),
                line: Some(d as u32 + 1),
                module: module.clone(),
                module_offset: id * 0x1000 + d as u64 * 0x10,
                python: false,
            })
            .collect();
        w.stack(id, frames)?;
    }
    let mut ts = 1u64;
    let mut ev = |pid: u32, e: Event, stack: Option<u64>, w: &mut record::Writer<Vec<u8>>| -> Result<()> {
        ts += 1_000;
        w.event(&Event { pid, tid: pid, comm: super::COMM, ts_ns: ts, latency_ns: 20_000, ..e }, stack)?;
        Ok(())
    };
    let mut n = 0u64;
    for pid in 1..=processes {
        ev(pid, Event { handle: 0xc0, device: (pid % 8) as i32, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }, None, &mut w)?;
        ev(pid, Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }, None, &mut w)?;
        n += 2;
    }
    let mut i = 0u64;
    while n < events {
        let pid = 1 + (i % processes as u64) as u32;
        let addr = 0x7f00_0000_0000 + i * 0x1000;
        let size = 4096u64 << (i % 15);
        ev(pid, Event { addr, size, ..Event::empty(api::CU_MEM_ALLOC_V2) }, Some(1 + i % STACKS), &mut w)?;
        n += 1;
        if !i.is_multiple_of(10) {
            ev(pid, Event { addr, ..Event::empty(api::CU_MEM_FREE_V2) }, None, &mut w)?;
            n += 1;
        }
        i += 1;
    }
    Ok(w.finish(&Footer::default())?)
}

pub fn run(events: u64, processes: u32) -> Result<()> {
    let bytes = recording(events, processes)?;
    println!(
        "export: {events} events, {processes} processes, {STACKS} stacks of {DEPTH} frames ({:.1} MiB recording), one core:",
        bytes.len() as f64 / 1048576.0
    );
    for format in [Format::Pprof, Format::TorchSnapshot, Format::Perfetto] {
        let mut reader = record::Reader::new(bytes.as_slice()).map_err(|e| anyhow!("{e}"))?;
        let options = pipeline::Options {
            limits: Limits { max_entries: 1 << 24, max_processes: 1 << 20 },
            timeline: format == Format::Perfetto,
            history: Some(history::TRACE_CAP),
            ..Default::default()
        };
        let mut out = Render { format, out: None };
        let t = Instant::now();
        runtime::replay(&mut reader, options, &mut out)?;
        let dt = t.elapsed().as_secs_f64();
        let size = out.out.map_or(0, |b| b.len());
        println!("  {:<15} {:>7.2} s replay + render, {:>9.1} KiB", format.name(), dt, size as f64 / 1024.0);
    }
    Ok(())
}
