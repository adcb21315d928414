//! `gpumem export` on a synthetic recording: replay and rendering time and
//! the file's size per format (what `cargo xtask bench-export` prints).
use std::{convert::Infallible, process::ExitCode, sync::Arc, time::Instant};

use anyhow::{anyhow, Result};
use gpumem_agent::runtime::{self, Ctx, End, Output};
use gpumem_engine::{
    analysis::{history, profile::Layers},
    pipeline,
    query::export::{render, ExportQuery, Format, Span},
    record,
    stacks::Frame,
    state::Limits,
};

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
        let q = ExportQuery { format: self.format, pid: Some(1), layers: Layers::Driver, older_than_s: 0.0, space: Default::default() };
        let span = Span {
            ended_ns: end.footer.ended_ns,
            duration_s: end.footer.duration_s,
            wall_end_ns: 0,
            recorded_by: "bench".into(),
            title: "bench".into(),
        };
        self.out = Some(render(ctx.pipeline, &q, &span)?.bytes);
        Ok(ExitCode::SUCCESS)
    }
}

/// STACKS symbolized stacks of DEPTH frames, for the engine benchmark's session.
fn stacks() -> Vec<(u64, Vec<Frame>)> {
    let module: Arc<str> = Arc::from("/opt/app/bin/train");
    (1..=STACKS)
        .map(|id| {
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
            (id, frames)
        })
        .collect()
}

pub fn run(events: u64, processes: u32) -> Result<()> {
    let bytes = super::synthetic_recording_with(events, processes, &stacks())?.bytes;
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
