//! The one live loop every probing command runs, and the one replay of a
//! recording: both drive an `Output` (what the command does with the
//! session) through the same pipeline.
//!
//! Live: bring-up (privileges, tracefs, load, attach), then events as they
//! come, one maintenance tick (discovery, descriptor rescan, stale-call
//! sweep, forgetting, kernel counters), growth samples, NVML on its own
//! thread, the output's own inputs (keys, scrapes), `-c` child handling, and
//! at the end a footer and the output's report.
mod bringup;
pub mod child;
pub mod continuity;
pub mod discovery;
mod live;
mod maintenance;
mod replay;
pub mod rings;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use tokio::sync::mpsc;

pub use bringup::{attach_discovered, attach_given, describe, load, require_privileges};
pub use live::run;
pub use replay::replay;

use crate::{
    nvml,
    probes::{ioctl::IoctlMode, ProbeSet},
};
use gpumem_engine::{
    model::agent::AgentStatus,
    model::nvml::Message,
    pipeline::{self, Outcome, Pipeline},
    record::{Footer, Header, ReadError},
};

/// What to attach to, and how.
#[derive(Clone, Debug)]
pub struct Probing {
    /// libcuda files to attach besides those found.
    pub libcuda: Vec<PathBuf>,
    /// Look for libcuda copies in ld.so.cache and running processes.
    pub discover: bool,
    pub nvidia_prefix: String,
    pub ioctl: IoctlMode,
    /// None: NVML is not used.
    pub nvml: Option<nvml::Library>,
    /// Which allocation stacks the kernel copies.
    pub stacks: gpumem_engine::stacks::StackPolicy,
    pub uprobe_links: crate::probes::links::UprobeLinks,
    /// Tests: act as a kernel that refuses uprobe_multi links.
    pub refuse_uprobe_multi: bool,
    /// Which probe sites an arm64 host attaches.
    pub arm64_uprobes: gpumem_engine::formats::arm64_probe::Policy,
    /// Tests and benchmarks: act as if no dynamic loader could be hooked.
    pub refuse_loader_hooks: bool,
    /// Tests: say on stderr when readings are applied and ticks run
    /// (`gpumem: milestone …`), so that a test waits for them, not for a time.
    pub milestones: bool,
}

/// When the probes go at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detach {
    /// In a child that outlives us briefly: the command returns at once.
    Background,
    /// Before returning: nothing of the agent is left in the kernel.
    Now,
}

/// How often every command samples live bytes for the growth detector:
/// the same data gives the same verdict in `leaks`, `top`, `serve` and a recording's replay.
pub const GROWTH_SAMPLE_INTERVAL: Duration = Duration::from_millis((gpumem_engine::analysis::growth::SAMPLE_INTERVAL_S * 1000.0) as u64);

/// A live session.
#[derive(Clone, Debug)]
pub struct Session {
    pub probing: Probing,
    /// Trace only these processes (tracing ends when all have exited).
    pub pids: Vec<u32>,
    /// Start this command and trace it (and its children) until it exits.
    pub command: Option<String>,
    pub duration: Option<Duration>,
    pub probe_set: ProbeSet,
    /// The accounting ring.
    pub events_ring: gpumem_engine::model::agent::RingSize,
    pub pipeline: pipeline::Options,
    /// Keep the lookups made, for a recording.
    pub record_lookups: bool,
    /// Exited processes are forgotten this long after their exit; None: kept
    /// (within the process table's bound) until the end.
    pub forget_after: Option<Duration>,
    /// Live bytes sampled for the growth detector this often (every command
    /// that judges growth uses [`GROWTH_SAMPLE_INTERVAL`]); None: not sampled.
    pub growth_every: Option<Duration>,
    pub nvml_every: Duration,
    /// The traced processes' host memory (and the node's swap, their
    /// cgroups') read this often; None: not read by the session.
    pub host_every: Option<Duration>,
    /// The kernel log XIDs are read from where NVML's events are not
    /// available (serve's --kmsg); None: not read.
    pub kmsg: Option<std::path::PathBuf>,
    /// A fresh NVML reading at the end (the footer's reconciliation).
    pub reconcile_at_end: bool,
    /// Say what is attached as it is found (not while a full-screen UI runs).
    pub announce: bool,
    pub detach: Detach,
    /// Fault injection for tests: do not read events for this long after start.
    pub stall_reader_ms: Option<u64>,
    /// Fault injection for tests: this many reads of the kernel counters fail.
    pub fail_counter_reads: u32,
    /// `serve`: the kernel keeps what is live, pinned for the next agent.
    pub continuity: Option<continuity::Options>,
    /// Whose capabilities are checked: a probing command's or the daemon's.
    pub role: crate::privileges::Role,
}

impl Session {
    /// A session with every option at its default.
    pub fn new(probing: Probing) -> Self {
        Session {
            probing,
            pids: Vec::new(),
            command: None,
            duration: None,
            probe_set: ProbeSet::Full,
            events_ring: rings::sized(None),
            pipeline: pipeline::Options::default(),
            record_lookups: false,
            forget_after: None,
            growth_every: None,
            nvml_every: Duration::from_secs(1),
            host_every: None,
            kmsg: None,
            reconcile_at_end: false,
            announce: true,
            detach: Detach::Background,
            stall_reader_ms: None,
            fail_counter_reads: 0,
            role: crate::privileges::Role::Probing,
            continuity: None,
        }
    }
}

/// Whether the session goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// What an output sees of the session at each call.
pub struct Ctx<'a> {
    pub pipeline: &'a mut Pipeline,
    pub agent: &'a AgentStatus,
    /// Seconds since the session started.
    pub elapsed_s: f64,
}

/// How a session ended.
#[derive(Debug, Default)]
pub struct End {
    pub header: Option<Header>,
    pub footer: Footer,
    /// Replays: the recording has its footer (the session finished).
    pub complete: bool,
    /// Replays: where and why reading stopped early.
    pub damage: Option<ReadError>,
    pub events: u64,
}

/// What a command does with a session, live or replayed. Every method but
/// `finish` has a default that does nothing.
pub trait Output {
    /// Input that only this output waits for (keys, scrapes).
    type Input: Send + 'static;

    /// Where the inputs come from; taken once, when the session starts.
    fn inputs(&mut self) -> Option<mpsc::Receiver<Self::Input>> {
        None
    }

    /// Everything is attached: events from here on are seen.
    fn started(&mut self, _ctx: &mut Ctx<'_>) -> Result<()> {
        Ok(())
    }

    /// One event, after the pipeline applied it.
    fn event(&mut self, _ctx: &mut Ctx<'_>, _o: &Outcome) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// Every event available was handed to `event` (flush what is buffered).
    fn drained(&mut self, _ctx: &mut Ctx<'_>) -> Result<()> {
        Ok(())
    }

    /// Live bytes were sampled for the growth detector, `t_s` into the session.
    fn sampled(&mut self, _ctx: &mut Ctx<'_>, _t_s: f64) -> Result<()> {
        Ok(())
    }

    /// A message from NVML (before the pipeline takes it), `t_s` into the session.
    fn nvml(&mut self, _ctx: &mut Ctx<'_>, _m: &Message, _t_s: f64) -> Result<()> {
        Ok(())
    }

    /// The host memory was read (`ctx.pipeline.host`), `t_s` into the session.
    fn host(&mut self, _ctx: &mut Ctx<'_>, _t_s: f64) -> Result<()> {
        Ok(())
    }

    /// The maintenance tick ran.
    fn tick(&mut self, _ctx: &mut Ctx<'_>) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// One of the output's own inputs; every event already in the ring has
    /// been applied, and the agent's status is fresh.
    fn input(&mut self, _ctx: &mut Ctx<'_>, _input: Self::Input) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// The session ended: the report, and the exit status (a `-c`
    /// command's own status replaces a successful one).
    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode>;

    /// After `finish`, before the probes go (live sessions): what serves the
    /// output's inputs (an HTTP server) closes.
    fn close(&mut self) -> impl std::future::Future<Output = ()> {
        async {}
    }
}

/// An input of one of two outputs fed together.
pub enum Either<A, B> {
    First(A),
    Second(B),
}

/// Two outputs fed the same session (a trace that is also recorded; serve's
/// servers, actions and flight recorder). The second sees each call first
/// (a recording must hold an event before a report that stops the session
/// on it); each gets its own inputs.
impl<A: Output, B: Output> Output for (A, B) {
    type Input = Either<A::Input, B::Input>;

    /// Both outputs' inputs, in one channel (forwarded by a task each: this
    /// is called on the runtime, when the session starts).
    fn inputs(&mut self) -> Option<mpsc::Receiver<Self::Input>> {
        match (self.0.inputs(), self.1.inputs()) {
            (None, None) => None,
            (a, b) => {
                let (tx, rx) = mpsc::channel(16);
                forward(a, tx.clone(), Either::First);
                forward(b, tx, Either::Second);
                Some(rx)
            }
        }
    }

    fn started(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        self.1.started(ctx)?;
        self.0.started(ctx)
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> Result<Flow> {
        // The second (a recording) sees the event first: a report that stops
        // the session must not leave the event out of the file.
        let b = self.1.event(ctx, o)?;
        let a = self.0.event(ctx, o)?;
        Ok(if a == Flow::Stop || b == Flow::Stop { Flow::Stop } else { Flow::Continue })
    }

    fn drained(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        self.1.drained(ctx)?;
        self.0.drained(ctx)
    }

    fn sampled(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.1.sampled(ctx, t_s)?;
        self.0.sampled(ctx, t_s)
    }

    fn nvml(&mut self, ctx: &mut Ctx<'_>, m: &Message, t_s: f64) -> Result<()> {
        self.1.nvml(ctx, m, t_s)?;
        self.0.nvml(ctx, m, t_s)
    }

    fn host(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.1.host(ctx, t_s)?;
        self.0.host(ctx, t_s)
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>) -> Result<Flow> {
        let b = self.1.tick(ctx)?;
        let a = self.0.tick(ctx)?;
        Ok(if a == Flow::Stop || b == Flow::Stop { Flow::Stop } else { Flow::Continue })
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, input: Self::Input) -> Result<Flow> {
        match input {
            Either::First(i) => self.0.input(ctx, i),
            Either::Second(i) => self.1.input(ctx, i),
        }
    }

    /// The second (a recording) is finished first, so that the report can name it.
    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        self.1.finish(ctx, end)?;
        self.0.finish(ctx, end)
    }

    fn close(&mut self) -> impl std::future::Future<Output = ()> {
        let (a, b) = (self.0.close(), self.1.close());
        async move {
            b.await;
            a.await;
        }
    }
}

/// An output that may not be there (serve's optional servers and actions):
/// absent, it does nothing.
impl<O: Output> Output for Option<O> {
    type Input = O::Input;

    fn inputs(&mut self) -> Option<mpsc::Receiver<O::Input>> {
        self.as_mut()?.inputs()
    }

    fn started(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        self.as_mut().map_or(Ok(()), |o| o.started(ctx))
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> Result<Flow> {
        self.as_mut().map_or(Ok(Flow::Continue), |out| out.event(ctx, o))
    }

    fn drained(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        self.as_mut().map_or(Ok(()), |o| o.drained(ctx))
    }

    fn sampled(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.as_mut().map_or(Ok(()), |o| o.sampled(ctx, t_s))
    }

    fn nvml(&mut self, ctx: &mut Ctx<'_>, m: &Message, t_s: f64) -> Result<()> {
        self.as_mut().map_or(Ok(()), |o| o.nvml(ctx, m, t_s))
    }

    fn host(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.as_mut().map_or(Ok(()), |o| o.host(ctx, t_s))
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>) -> Result<Flow> {
        self.as_mut().map_or(Ok(Flow::Continue), |o| o.tick(ctx))
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, input: O::Input) -> Result<Flow> {
        self.as_mut().map_or(Ok(Flow::Continue), |o| o.input(ctx, input))
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        self.as_mut().map_or(Ok(ExitCode::SUCCESS), |o| o.finish(ctx, end))
    }

    fn close(&mut self) -> impl std::future::Future<Output = ()> {
        let closing = self.as_mut().map(|o| o.close());
        async move {
            if let Some(c) = closing {
                c.await;
            }
        }
    }
}

/// Forwards every input of `from` into `to`, wrapped, until either closes.
fn forward<T: Send + 'static, U: Send + 'static>(from: Option<mpsc::Receiver<T>>, to: mpsc::Sender<U>, wrap: fn(T) -> U) {
    let Some(mut from) = from else { return };
    tokio::spawn(async move {
        while let Some(i) = from.recv().await {
            if to.send(wrap(i)).await.is_err() {
                return;
            }
        }
    });
}
