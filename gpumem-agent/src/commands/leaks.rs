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
    cli::LeaksArgs,
    runtime::{self, Ctx, End, Output},
};
use gpumem_engine::{
    names::bytes,
    query::{
        leaks::{report, LeaksQuery, Span},
        Query,
    },
};

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
        let f = &end.footer;
        let q = LeaksQuery { pids: Vec::new(), older_than_s: self.older_than_s, top: self.top, json: self.json };
        let span = Span { now_ns: f.ended_ns, duration_s: f.duration_s };
        let mut report = report(ctx.pipeline, &q, span, f.stacks_dropped, f.lost.total());
        report.stacks = f.stacks.clone();
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
    if a.from.is_none() && a.target.command.is_none() && a.record.is_none() {
        if let Some(text) = from_daemon(&a)? {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
            return Ok(ExitCode::SUCCESS);
        }
    }
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
    s.growth_every = Some(runtime::GROWTH_SAMPLE_INTERVAL);
    super::record::run_recorded(s, out, a.record.as_deref(), "leaks")
}

/// The report of a running daemon, which has traced the processes since it
/// started (their allocations from before this command included); with
/// --duration, asked when that time has passed.
fn from_daemon(a: &LeaksArgs) -> Result<Option<String>> {
    let q = Query::Leaks(LeaksQuery { pids: a.target.pids.clone(), older_than_s: a.older_than, top: a.top, json: a.json });
    let daemon = a.daemon.daemon();
    // Asked once first: without a daemon, no time is lost waiting.
    let Some(now) = daemon.ask_text(&q)? else { return Ok(None) };
    let Some(d) = a.target.duration else { return Ok(Some(now)) };
    eprintln!("gpumem: using the running gpumem serve; its report in {d} s");
    std::thread::sleep(Duration::from_secs_f64(d));
    Ok(Some(daemon.ask_text(&q)?.unwrap_or(now)))
}
