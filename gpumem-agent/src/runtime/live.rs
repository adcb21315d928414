//! The live loop: one task owns the pipeline; events are applied as they
//! come, and everything else (ticks, NVML, the output's inputs) waits its
//! turn between drains, so nothing is locked and nothing races an event.
use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};

use super::{
    bringup,
    child::{self, Child},
    continuity::Continuity,
    discovery::Signals,
    maintenance::{self, Maintenance},
    Ctx, Detach, End, Flow, Output, Session,
};
use crate::{nvml::Worker, probes::reader::EventReader, probes::Agent, selfstat};
use gpumem_engine::{
    clock::monotonic_ns,
    model::agent::AgentStatus,
    pipeline::{Lookups, Pipeline, Stack},
    record::Footer,
};

/// How long the end waits for a fresh NVML reading.
const FINAL_NVML_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs a live session to its end (duration, command exit, signal, all
/// traced pids gone, or the output stopping it).
pub fn run<O: Output>(s: Session, out: &mut O) -> Result<ExitCode> {
    bringup::require_privileges(s.role)?;
    for &pid in &s.pids {
        if !gpumem_engine::procfs::alive(pid, None) {
            bail!("no process with pid {pid}");
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async {
        let mut live = Live::start(s, out)?;
        let ended = live.run().await?;
        live.end(ended).await
    })
}

fn say(m: String) {
    eprintln!("gpumem: {m}");
}

impl Flow {
    /// `why` when the output stopped the session.
    fn stopped(self, why: Ended) -> Option<Ended> {
        (self == Flow::Stop).then_some(why)
    }
}

/// Waits on an optional receiver (never, without one).
async fn recv<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Why the loop ended.
enum Ended {
    /// Its duration, a signal, or every `-p` process gone.
    Done,
    /// An output stopped it (a closed pipe, `q` in top): nothing more is applied.
    ByOutput,
    /// The `-c` command exited with this wait status.
    Command(i32),
}

struct Live<'o, O: Output> {
    s: Session,
    out: &'o mut O,
    agent: Agent,
    reader: EventReader,
    pipeline: Pipeline,
    nvml: Option<Worker>,
    nvml_rx: Option<mpsc::Receiver<gpumem_engine::model::nvml::Message>>,
    inputs: Option<mpsc::Receiver<O::Input>>,
    child: Option<Child>,
    status: AgentStatus,
    maintenance: Maintenance,
    /// Processes that exec'd or loaded a library, read after each drain.
    signals: Signals,
    /// SIGINT and SIGTERM, caught from before `started` says the session
    /// is up (a signal sent on seeing that line must end it cleanly).
    stop_signals: (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    /// `serve`'s pinned state, adopted and kept for the next agent.
    continuity: Option<Continuity>,
    began: Instant,
}

impl<'o, O: Output> Live<'o, O> {
    /// Bring-up: load, attach, NVML, the command; then the output is told.
    fn start(s: Session, out: &'o mut O) -> Result<Self> {
        let (mut agent, reader, mut continuity) = attach(&s)?;
        let mut pipeline = Pipeline::new(s.pipeline, Lookups::live(s.record_lookups));
        pipeline.stacks.sample_bytes = s.probing.stacks.effective_sample_bytes();
        if let Some(c) = continuity.as_mut() {
            c.adopt(&mut agent, &mut pipeline);
            if let Some(a) = &c.report.adopted {
                say(format!(
                    "adopted the pinned state: {} live entries of {} processes rebuilt from the kernel's table in {:.0} ms ({} with their stacks; {} entries of processes gone removed)",
                    a.entries, a.processes, a.took_ms, a.stacks_restored, a.entries_of_exited
                ));
            }
        }
        // A session of chosen processes names only them among NVML's (a -c
        // command's are all traced: none).
        pipeline.untraced_scope = match (&s.command, s.pids.is_empty()) {
            (Some(_), _) => Some(Vec::new()),
            (None, false) => Some(s.pids.clone()),
            (None, true) => None,
        };
        let (nvml, nvml_rx) = match &s.probing.nvml {
            Some(lib) => {
                let (tx, rx) = mpsc::channel(64);
                (Some(Worker::start(lib.clone(), s.nvml_every, tx, s.kmsg.clone()).context("starting the NVML thread")?), Some(rx))
            }
            None => {
                pipeline.gpus.failed("NVML not used (--no-nvml)".into());
                (None, None)
            }
        };
        let child = match &s.command {
            Some(cmd) => {
                let c = child::start_blocked(cmd)?;
                agent.add_pid(c.pid, true)?;
                // Traced from its first instruction on.
                c.release();
                Some(c)
            }
            None => None,
        };
        let inputs = out.inputs();
        let status = agent.status_at_load();
        let maintenance = Maintenance::new(&s);
        let mut live = Live {
            s,
            out,
            agent,
            reader,
            pipeline,
            nvml,
            nvml_rx,
            inputs,
            child,
            status,
            maintenance,
            signals: Signals::default(),
            stop_signals: (
                signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
                signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            ),
            continuity,
            began: Instant::now(),
        };
        live.out.started(&mut Ctx { pipeline: &mut live.pipeline, agent: &live.status, elapsed_s: 0.0 })?;
        Ok(live)
    }

    fn elapsed_s(&self) -> f64 {
        self.began.elapsed().as_secs_f64()
    }

    async fn run(&mut self) -> Result<Ended> {
        if let Some(ms) = self.s.stall_reader_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + maintenance::EVERY, maintenance::EVERY);
        let sampling = self.s.growth_every.is_some();
        let mut growth = tokio::time::interval(self.s.growth_every.unwrap_or(Duration::MAX / 4));
        let reading_host = self.s.host_every.is_some();
        let mut host = tokio::time::interval(self.s.host_every.unwrap_or(Duration::MAX / 4));
        let deadline = self.s.duration.map(|d| tokio::time::Instant::now() + d);
        loop {
            let stop = tokio::select! {
                r = self.reader.readable() => {
                    r.context("reading events")?;
                    self.drain()?.stopped(Ended::ByOutput)
                }
                _ = tick.tick() => self.tick()?,
                _ = growth.tick(), if sampling => self.sample()?.stopped(Ended::ByOutput),
                _ = host.tick(), if reading_host => {
                    self.read_host()?;
                    None
                }
                Some(m) = recv(&mut self.nvml_rx) => {
                    self.nvml_message(m)?;
                    None
                }
                Some(input) = recv(&mut self.inputs) => self.input(input)?.stopped(Ended::ByOutput),
                st = async { (&mut self.child.as_mut().expect("guarded").exited).await }, if self.child.is_some() => {
                    Some(Ended::Command(st.context("the wait thread ended")?.context("waiting for the command")?))
                }
                _ = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => Some(Ended::Done),
                _ = self.stop_signals.0.recv() => Some(Ended::Done),
                _ = self.stop_signals.1.recv() => Some(Ended::Done),
            };
            if let Some(ended) = stop {
                return Ok(ended);
            }
        }
    }

    /// Applies every event in the ring and hands each to the output.
    fn drain(&mut self) -> Result<Flow> {
        let elapsed_s = self.elapsed_s();
        let (pipeline, out, agent, signals) = (&mut self.pipeline, &mut *self.out, &self.status, &mut self.signals);
        let (continuity, kernel) = (&mut self.continuity, &mut self.agent);
        let mut result = Ok(Flow::Continue);
        // Once an output stops the session (or fails), the rest stays in the
        // ring: every output has seen every event the state has.
        let n = self.reader.drain_now(&mut |ev, stack| {
            if signals.take(ev) {
                return true;
            }
            if let Some(s) = stack.filter(|s| s.py_frames == 0) {
                signals.python.frameless(s.event.pid);
            }
            if let Some(c) = continuity.as_mut() {
                if c.skips(ev, &pipeline.state) {
                    if let Some(s) = stack {
                        c.skipped_with_stack(pipeline, s);
                    }
                    return true;
                }
            }
            let o = pipeline.apply(ev, stack.map_or(Stack::None, Stack::Captured));
            if let Some(c) = continuity.as_mut() {
                c.applied(&o, kernel, &pipeline.state);
            }
            result = out.event(&mut Ctx { pipeline: &mut *pipeline, agent, elapsed_s }, &o);
            matches!(result, Ok(Flow::Continue))
        });
        if n > 0 {
            if let Some(c) = continuity.as_mut() {
                c.drained(kernel, pipeline);
            }
            out.drained(&mut Ctx { pipeline, agent, elapsed_s })?;
            let learned = pipeline.stacks.take_copy_updates();
            if !learned.is_empty() {
                self.agent.set_stack_copy_bytes(&learned);
            }
        }
        if self.s.probing.discover {
            let announce = self.s.announce;
            self.signals.run(&mut self.agent, Instant::now(), |m| {
                if announce {
                    eprintln!("gpumem: {m}");
                }
            });
            self.hand_over_interpreters();
        }
        result
    }

    /// Interpreters found go to the stack resolver before any stack with
    /// their Python frames is read; processes degraded are noted.
    fn hand_over_interpreters(&mut self) {
        for interp in self.signals.python.take_found() {
            self.pipeline.stacks.add_interpreter(interp);
        }
        for (pid, reason, why) in self.signals.python.take_degraded().into_iter().chain(std::mem::take(&mut self.agent.degraded)) {
            self.pipeline.degraded.add(pid, reason, why);
        }
    }

    /// The maintenance tick; why the session ends, if it does.
    fn tick(&mut self) -> Result<Option<Ended>> {
        let gone = self.maintenance.tick(&mut self.agent, &self.s, &mut self.pipeline, &mut self.status, self.reader.counts());
        if let Some(c) = self.continuity.as_mut() {
            c.tick(&mut self.agent, &self.pipeline);
        }
        let cuda = self.pipeline.state.processes.values().filter(|p| !p.exited).map(|p| p.pid);
        self.signals.python.tick(&mut self.agent, cuda);
        self.hand_over_interpreters();
        let elapsed_s = self.elapsed_s();
        let flow = self.out.tick(&mut Ctx { pipeline: &mut self.pipeline, agent: &self.status, elapsed_s })?;
        self.milestone("tick");
        Ok(if gone { Some(Ended::Done) } else { flow.stopped(Ended::ByOutput) })
    }

    fn sample(&mut self) -> Result<Flow> {
        let t = self.elapsed_s();
        self.pipeline.sample_growth(t);
        self.out.sampled(&mut Ctx { pipeline: &mut self.pipeline, agent: &self.status, elapsed_s: t }, t)?;
        self.milestone("growth-sample");
        Ok(Flow::Continue)
    }

    fn read_host(&mut self) -> Result<()> {
        let t = self.elapsed_s();
        self.pipeline.sample_host(t);
        self.out.host(&mut Ctx { pipeline: &mut self.pipeline, agent: &self.status, elapsed_s: t }, t)?;
        self.milestone("host-reading");
        Ok(())
    }

    /// `--milestones`: says that something was applied (what tests wait for).
    fn milestone(&self, what: &str) {
        if self.s.probing.milestones {
            eprintln!("gpumem: milestone {what}");
        }
    }

    /// What is in the ring counts for the answer, and so does a fresh status.
    fn input(&mut self, input: O::Input) -> Result<Flow> {
        if self.drain()? == Flow::Stop {
            return Ok(Flow::Stop);
        }
        self.refresh();
        let elapsed_s = self.elapsed_s();
        self.out.input(&mut Ctx { pipeline: &mut self.pipeline, agent: &self.status, elapsed_s }, input)
    }

    fn refresh(&mut self) {
        self.maintenance.refresh(&self.agent, &mut self.pipeline, &mut self.status, self.reader.counts());
        self.status.stale_calls_removed = self.agent.stale_calls_removed;
        self.status.discovery = self.agent.scan_stats.clone();
        self.status.usage = selfstat::usage();
        if let Some(c) = &self.continuity {
            self.status.continuity = Some(c.report.clone());
            self.status.kernel_table = self.agent.kernel_table();
        }
    }

    fn nvml_message(&mut self, m: gpumem_engine::model::nvml::Message) -> Result<()> {
        // Said when NVML goes away (it may come back), unless a full-screen UI runs.
        if let gpumem_engine::model::nvml::Message::Unavailable(why) = &m {
            if self.s.announce && self.pipeline.gpus.error.is_none() && !self.pipeline.gpus.latest.is_empty() {
                say(format!("{why}; GPU readings are left out until NVML answers again"));
            }
        }
        let elapsed_s = self.elapsed_s();
        self.out.nvml(&mut Ctx { pipeline: &mut self.pipeline, agent: &self.status, elapsed_s }, &m, elapsed_s)?;
        let what = m.name();
        self.pipeline.nvml(m);
        self.milestone(what);
        Ok(())
    }

    /// A fresh NVML reading for the end of the session: what NVML is, in
    /// words, and whether the reading came (what to reconcile with).
    async fn final_nvml(&mut self) -> Result<(String, bool)> {
        if self.nvml.is_none() || self.nvml_rx.is_none() {
            return Ok((self.pipeline.gpus.error.clone().unwrap_or_default(), false));
        }
        // Messages already queued come first; the reading asked for now after them.
        while let Some(m) = self.nvml_rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
            self.nvml_message(m)?;
        }
        self.nvml.as_ref().expect("checked").read_now();
        let deadline = tokio::time::Instant::now() + FINAL_NVML_TIMEOUT;
        loop {
            let next = self.nvml_rx.as_mut().expect("checked").recv();
            match tokio::time::timeout_at(deadline, next).await {
                Ok(Some(gpumem_engine::model::nvml::Message::Xid(x))) => self.nvml_message(gpumem_engine::model::nvml::Message::Xid(x))?,
                Ok(Some(m)) => {
                    self.nvml_message(m)?;
                    break;
                }
                Ok(None) | Err(_) => return Ok(("no NVML reading at the end (NVML did not answer in time)".into(), false)),
            }
        }
        Ok(match &self.pipeline.gpus.error {
            Some(e) => (e.clone(), false),
            None => (format!("available, {} GPU(s)", self.pipeline.gpus.latest.len()), true),
        })
    }

    /// The end: what is left in the ring (unless an output stopped the
    /// session), a last sweep and reading, the footer, the output's report;
    /// then the probes go.
    async fn end(mut self, ended: Ended) -> Result<ExitCode> {
        if !matches!(ended, Ended::ByOutput) {
            // The command's exit event is already in the ring; take what is there.
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.drain()?;
        }
        // Calls left in flight by threads that died since the last sweep.
        self.agent.sweep_stale_calls();
        self.refresh();
        let (nvml, fresh) = if self.s.reconcile_at_end { self.final_nvml().await? } else { ("not asked".into(), false) };
        let reconciliation = fresh.then(|| self.pipeline.reconciliation());
        let footer = Footer {
            duration_s: self.elapsed_s(),
            ended_ns: monotonic_ns(),
            lost: self.status.kernel.lost.clone(),
            tables_full: self.status.kernel.tables_full.clone(),
            stacks_dropped: self.status.kernel.stacks_dropped,
            probes_attached: self.status.probes_attached,
            discovery: self.agent.scan_stats.clone(),
            stacks: self.pipeline.stacks.stats.clone(),
            reconciliation,
            nvml,
            command_status: match ended {
                Ended::Command(st) => Some(st),
                Ended::Done | Ended::ByOutput => None,
            },
            stale_calls_removed: self.agent.stale_calls_removed,
            python_unwalked: self.signals.python.unwalked(),
        };
        // The receivers go first: a thread blocked sending to one returns.
        self.nvml_rx = None;
        self.nvml = None;
        self.inputs = None;
        let elapsed_s = self.elapsed_s();
        let end = End { footer, complete: true, events: self.pipeline.state.events, ..Default::default() };
        let code = self.out.finish(&mut Ctx { pipeline: &mut self.pipeline, agent: &self.status, elapsed_s }, &end)?;
        self.out.close().await;
        drop(self.reader);
        if let Some(c) = self.continuity.as_mut() {
            c.finish(&mut self.agent, &mut self.pipeline);
            if let Some(p) = self.agent.pinned() {
                say(format!(
                    "probes stay attached and keep counting (pinned in {}): the next `gpumem serve` takes over; `gpumem serve --cleanup` removes them",
                    p.root.join(&p.layout).display()
                ));
                drop(self.agent);
                return Ok(code);
            }
        }
        detach(self.agent, self.s.detach);
        Ok(match ended {
            Ended::Command(st) if code == ExitCode::SUCCESS => ExitCode::from(child::exit_code(st)),
            _ => code,
        })
    }
}

fn attach(s: &Session) -> Result<(Agent, EventReader, Option<Continuity>)> {
    let filter_pids = !s.pids.is_empty() || s.command.is_some();
    let mut continuity = s.continuity.clone().map(Continuity::prepare);
    let load = |c: Option<&Continuity>| bringup::load_with(&s.probing, filter_pids, s.probe_set, s.events_ring, c);
    let mut agent = match (load(continuity.as_ref()), continuity.as_mut()) {
        (Err(e), Some(c)) if bringup::is_incompatible_pin(&e) => {
            c.replace_incompatible(&e.to_string());
            load(Some(c))
        }
        (r, _) => r,
    }
    .context("loading eBPF programs")?;
    for note in continuity.iter().flat_map(|c| &c.report.notes) {
        say(note.clone());
    }
    for note in &agent.notes {
        say(note.clone());
    }
    let returns_before = super::continuity::returns_without_entry(&agent);
    let (events, stacks) = agent.take_rings()?;
    let reader = EventReader::new(events, stacks).context("watching the ring buffer")?;
    let announce = |m: String| {
        if s.announce {
            say(m)
        }
    };
    bringup::attach_given(&mut agent, &s.probing, announce)?;
    bringup::attach_discovered(&mut agent, &s.probing, true, announce);
    if agent.attached_probe_count() == 0 && s.announce {
        say(if s.probing.discover {
            "no libcuda found yet; watching for processes that load one".into()
        } else {
            "no libcuda attached".into()
        });
    }
    for &pid in &s.pids {
        agent.add_pid(pid, false)?;
    }
    if let Some(c) = continuity.as_mut() {
        c.take_over(&mut agent, returns_before);
        if c.report.links_taken_over > 0 {
            say(format!("took over from the last agent: its {} links replaced by this one's", c.report.links_taken_over));
        }
    }
    Ok((agent, reader, continuity))
}

fn detach(agent: Agent, how: Detach) {
    match how {
        Detach::Background => agent.detach_in_background(),
        Detach::Now => {
            // Detached here: when the command exits, nothing of it is left in
            // the kernel (a DaemonSet pod's grace period covers this).
            let probes = agent.attached_probe_count();
            let t = Instant::now();
            drop(agent);
            say(format!("{probes} probes detached in {:.1} s", t.elapsed().as_secs_f64()));
        }
    }
}
