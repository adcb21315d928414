//! `gpumem trace`: every event as it happens, then a summary per process
//! and device; or a recording replayed through the same path (`--from`).
use std::{
    convert::Infallible,
    io::{self, BufWriter, Write},
    path::PathBuf,
    process::ExitCode,
};

use anyhow::{Context as _, Result};

use crate::{
    cli::TraceArgs,
    daemon::client::Daemon,
    runtime::{self, Ctx, End, Flow, Output},
};
use gpumem_engine::{
    analysis::view::ViewOptions,
    export::{
        summary::Summary,
        trace::{Filter, Printer},
    },
    model::Holding,
    pipeline::Outcome,
    query::Query,
};

/// The events, then the summary.
pub struct Trace<W: Write> {
    printer: Printer<W>,
    json: bool,
    /// Print nothing (the overhead benchmark).
    quiet: bool,
    /// Replaying this recording (None: live).
    from: Option<PathBuf>,
    /// The first failed write: a closed pipe (`| head`) ends the trace quietly.
    write_error: Option<io::Error>,
    /// A running daemon to ask, at the end, what the traced processes hold
    /// since their start.
    daemon: Option<Daemon>,
    /// The processes asked for (`-p`): named even if they made no call.
    pids: Vec<u32>,
}

impl<W: Write> Trace<W> {
    pub fn new(out: W, json: bool, filter: Filter, from: Option<PathBuf>) -> Self {
        Trace { printer: Printer::new(out, json, filter), json, quiet: false, from, write_error: None, daemon: None, pids: Vec::new() }
    }

    /// Nothing on stdout: the session only runs.
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    fn summary(&mut self, ctx: &mut Ctx<'_>, end: &End) -> io::Result<()> {
        let p = &mut *ctx.pipeline;
        let view = p.view(&ViewOptions { exited: true, layouts: true, owners: true, ..Default::default() });
        let mut summary = Summary::build(&p.state, &view, &end.footer, p.distributions.summary());
        summary.degraded = p.degraded.recent.iter().cloned().collect();
        if let Some(d) = &self.daemon {
            summary.known_to_daemon = known_to_daemon(d, &summary, &self.pids);
        }
        let out = self.printer.inner();
        if self.json {
            summary.write_json(out)?;
        } else {
            summary.write_human(out)?;
        }
        self.printer.flush()
    }
}

impl<W: Write> Output for Trace<W> {
    type Input = Infallible;

    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        if self.from.is_none() {
            // Everything is in place: events from here on are seen.
            eprintln!("gpumem: tracing; Ctrl-C to stop");
        }
        Ok(())
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> Result<Flow> {
        if self.quiet {
            return Ok(Flow::Continue);
        }
        // JSON lines carry the allocation's stack, symbolized (once per stack).
        let frames = match o.stack {
            Some(id) if self.json && self.printer.shows(o) => Some(ctx.pipeline.stacks.frames(id)),
            _ => None,
        };
        let container = ctx.pipeline.state.processes.get(&o.event.pid).and_then(|p| p.container.as_ref());
        match self.printer.event(o, container, frames.as_deref()) {
            Ok(()) => Ok(Flow::Continue),
            Err(e) => {
                self.write_error = Some(e);
                Ok(Flow::Stop)
            }
        }
    }

    fn drained(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        if let Err(e) = self.printer.flush() {
            self.write_error.get_or_insert(e);
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        if let Some(e) = self.write_error.take() {
            if e.kind() == io::ErrorKind::BrokenPipe {
                return Ok(ExitCode::SUCCESS);
            }
            return Err(e).context("writing events");
        }
        if !self.quiet {
            match self.summary(ctx, end) {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
                r => r.context("writing the summary")?,
            }
        }
        Ok(replay_outcome(self.from.as_deref(), end, "the report above covers"))
    }
}

/// What a running daemon knows the session's processes hold (from their
/// start); empty without one. A daemon that cannot be asked is said, not fatal.
fn known_to_daemon(d: &Daemon, summary: &Summary, asked: &[u32]) -> Vec<Holding> {
    let mut pids: Vec<u32> = summary.processes.iter().map(|p| p.pid).chain(asked.iter().copied()).collect();
    pids.sort_unstable();
    pids.dedup();
    if pids.is_empty() {
        return Vec::new();
    }
    match d.ask_typed(&Query::Holdings { pids }) {
        Ok(h) => h.unwrap_or_default(),
        Err(e) => {
            eprintln!("gpumem: {e:#}");
            Vec::new()
        }
    }
}

/// A replay's exit status: a damaged or unfinished recording is said, with
/// how much of it the report covers (`covers`: how the command says it), and
/// is a failure.
pub fn replay_outcome(from: Option<&std::path::Path>, end: &End, covers: &str) -> ExitCode {
    let Some(path) = from else { return ExitCode::SUCCESS };
    let events = end.events;
    if let Some(e) = &end.damage {
        eprintln!("gpumem: {}: {e}; {covers} the {events} events before it", path.display());
        return ExitCode::FAILURE;
    }
    if !end.complete {
        eprintln!(
            "gpumem: {}: the recording ends without its footer (the session did not finish); {covers} its {events} events",
            path.display()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

pub fn run(a: TraceArgs) -> Result<ExitCode> {
    let stdout = BufWriter::new(io::stdout().lock());
    let filter = Filter { min_size: a.min_size.unwrap_or(0), failed_only: a.failed_only };
    let mut trace = Trace::new(stdout, a.json, filter, a.from.clone());
    trace.daemon = Some(a.daemon.daemon());
    trace.pids = a.target.pids.clone();
    if let Some(path) = &a.from {
        return runtime::replay(&mut super::open_recording(path)?, super::replay_options(a.max_allocations), &mut trace);
    }
    let mut s = super::session(&a.probes, &a.target, a.max_allocations);
    s.events_ring = runtime::rings::sized(a.ringbuf_bytes);
    s.stall_reader_ms = a.stall_reader_ms;
    s.reconcile_at_end = true;
    super::record::run_recorded(s, trace, a.record.as_deref(), "trace")
}
