//! `gpumem report FILE -o report.html [--svg chart.svg]`: a recording
//! replayed through the usual pipeline with its timeline kept, drawn as a
//! self-contained page or a single chart.
use std::{convert::Infallible, path::Path, process::ExitCode};

use anyhow::{Context as _, Result};

use crate::{
    cli::{ReportArgs, ReportChart},
    runtime::{self, Ctx, End, Output},
};
use gpumem_engine::{
    analysis::{history, leaks, profile::Layers},
    export::{flame::Space, report::ReportData},
    pipeline,
    query::export::{self, ExportQuery, Format, Span},
};

struct Report<'a> {
    args: &'a ReportArgs,
}

impl Output for Report<'_> {
    type Input = Infallible;

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        let p = &mut *ctx.pipeline;
        let a = self.args;
        let span = Span {
            ended_ns: end.footer.ended_ns,
            duration_s: end.footer.duration_s,
            wall_end_ns: 0,
            recorded_by: String::new(),
            title: String::new(),
        };
        let flames = [Space::Inuse, Space::Alloc]
            .into_iter()
            .map(|space| {
                let q = ExportQuery { format: Format::Folded, pid: None, layers: Layers::Driver, older_than_s: a.older_than, space };
                (space, export::flame_of(p, &q, &span).0)
            })
            .collect();
        let data = ReportData {
            flames,
            timeline: p.timeline.take().unwrap_or_default(),
            leaks: leaks::find(&p.state, &mut p.stacks, &mut p.growth, end.footer.ended_ns, (a.older_than * 1e9) as u64, 5),
            header: end.header.clone(),
            footer: end.footer.clone(),
            damage: end.damage.as_ref().map(|e| e.to_string()),
        };
        if let Some(out) = &a.output {
            let html = data.html().context("drawing the report")?;
            write(out, &html)?;
            let t = &data.timeline;
            eprintln!(
                "gpumem: wrote {} ({} KiB, {} events, {} process/GPU series, {} host-memory series)",
                out.display(),
                html.len() / 1024,
                t.events,
                t.series.len(),
                t.resident.len()
            );
        }
        if let Some(svg_path) = &a.svg {
            let svg = match a.chart {
                ReportChart::Memory => data.timeline_svg(a.gpu),
                ReportChart::Host => data.host_svg(),
            }
            .context("drawing the chart")?;
            write(svg_path, &svg)?;
            eprintln!("gpumem: wrote {}", svg_path.display());
        }
        // An unfinished recording still makes a report: only damage fails it.
        if let Some(e) = &end.damage {
            eprintln!("gpumem: {}: {e}; the report covers the {} events before it", a.file.display(), end.events);
            return Ok(ExitCode::FAILURE);
        }
        Ok(ExitCode::SUCCESS)
    }
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let mut reader = super::open_recording(&args.file)?;
    runtime::replay(
        &mut reader,
        pipeline::Options { timeline: true, history: Some(history::TRACE_CAP), ..Default::default() },
        &mut Report { args: &args },
    )
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
