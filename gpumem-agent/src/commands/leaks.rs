//! `gpumem leaks`: after tracing, the allocations still outstanding and
//! older than --older-than, grouped by stack, with a growth verdict.
use std::{
    convert::Infallible,
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Result;

use super::trace::replay_outcome;
use crate::{
    analysis::leaks,
    cli::LeaksArgs,
    export::{leaks::LeaksReport, trace},
    names::bytes,
    runtime::{self, Ctx, End, Output},
};

/// How often live bytes are sampled for the growth detector.
pub const GROWTH_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

pub struct Leaks {
    older_than_s: f64,
    top: usize,
    json: bool,
    /// A status line on a terminal while tracing.
    progress: bool,
    duration: Option<f64>,
    from: Option<PathBuf>,
}

impl Output for Leaks {
    type Input = Infallible;

    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        if self.from.is_none() {
            eprintln!("gpumem: tracing; the report comes at the end (Ctrl-C to stop early)");
        }
        Ok(())
    }

    fn sampled(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        if self.progress {
            let (procs, live) = ctx.pipeline.state.live_totals();
            let time = match self.duration {
                Some(d) => format!("{:.0} s left", (d - t_s).max(0.0)),
                None => format!("{t_s:.0} s (Ctrl-C to report)"),
            };
            eprint!("\r\x1b[Kgpumem leaks: {time}, {procs} process(es), {} live", bytes(live));
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        if self.progress {
            eprint!("\r\x1b[K");
        }
        let p = &mut *ctx.pipeline;
        let f = &end.footer;
        let processes = leaks::find(&p.state, &mut p.stacks, &mut p.growth, f.ended_ns, (self.older_than_s * 1e9) as u64, self.top);
        let oom_events = p
            .ooms
            .records
            .iter()
            .map(|r| match &r.applied.cuda_oom {
                Some(oom) => trace::cuda_oom_json(&r.event, oom, &r.holder_stacks),
                None => trace::event_json(&r.event, &r.kind, &r.applied, None),
            })
            .collect();
        let report = LeaksReport {
            kind: "leaks",
            duration_s: f.duration_s,
            now_ns: f.ended_ns,
            older_than_s: self.older_than_s,
            processes,
            oom: p.state.oom.clone(),
            oom_events,
            oom_events_dropped: p.ooms.dropped,
            stacks: f.stacks.clone(),
            stacks_dropped: f.stacks_dropped,
            lost_events: f.lost.total(),
            distributions: p.distributions.summary(),
            held_before_tracing: p.untraced_rows(),
        };
        let mut out = std::io::stdout().lock();
        if self.json {
            report.write_json(&mut out)?;
        } else {
            report.write_human(&mut out)?;
        }
        out.flush()?;
        Ok(replay_outcome(self.from.as_deref(), end, "the report above covers"))
    }
}

pub fn run(a: LeaksArgs) -> Result<ExitCode> {
    let mut out = Leaks {
        older_than_s: a.older_than,
        top: a.top,
        json: a.json,
        progress: a.from.is_none() && !a.json && std::io::stderr().is_terminal(),
        duration: a.target.duration,
        from: a.from.clone(),
    };
    if let Some(path) = &a.from {
        return runtime::replay(&mut super::open_recording(path)?, super::replay_options(a.max_allocations), &mut out);
    }
    let mut s = super::session(&a.probes, &a.target, a.max_allocations);
    s.growth_every = Some(GROWTH_SAMPLE_INTERVAL);
    super::record::run_recorded(s, out, a.record.as_deref(), "leaks")
}
