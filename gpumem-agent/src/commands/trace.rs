//! `gpumem trace`, `leaks` and `record`: attach, stream events, keep state,
//! report at the end; or replay a recording through the same path (`--from`).
use std::{
    ffi::CString,
    io::{BufWriter, IsTerminal as _, Write as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use tokio::signal::unix::{signal, SignalKind};

use super::{
    load_agent,
    attach_discovered, attach_given,
    ingest::{replay as replay_records, Ingest, Ingested, Replayer},
    require_privileges,
};
use crate::{
    cli::{ProbeArgs, TraceArgs},
    events::EventReader,
    analysis::{
        distributions::{self, Distributions},
        leaks::{self, GrowthTracker},
    },
    export::{
        leaks::LeaksReport,
        summary::Summary,
        trace::{cuda_oom_json, event_json, Filter, Printer},
    },
    probes::ProbeSet,
    record::{self, Footer, Header},
    state::{Limits, State},
};

/// How often new libcuda copies are looked for (the issue asks for < 1 s).
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(500);

pub struct Session {
    pub pids: Vec<u32>,
    pub command: Option<String>,
    pub duration: Option<f64>,
    pub filter: Filter,
    pub probes: ProbeArgs,
    pub json: bool,
    pub limits: Limits,
    pub probe_set: ProbeSet,
    /// Print nothing on stdout (benchmarks).
    pub quiet: bool,
    pub ringbuf_bytes: u32,
    pub stall_reader_ms: Option<u64>,
    /// `gpumem leaks`: report outstanding allocations instead of events.
    pub leaks: Option<LeaksOptions>,
    /// Also write a recording of the session here.
    pub record: Option<PathBuf>,
    /// Replay this recording instead of tracing.
    pub from: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug)]
pub struct LeaksOptions {
    pub older_than_s: f64,
    pub top: usize,
}

impl Session {
    /// Everything at its default: all processes, full probes, events printed,
    /// the default ring buffer and tables, no recording.
    fn with_probes(probes: ProbeArgs) -> Self {
        Session {
            pids: Vec::new(),
            command: None,
            duration: None,
            filter: Filter::default(),
            probes,
            json: false,
            limits: Limits::default(),
            probe_set: ProbeSet::Full,
            quiet: false,
            ringbuf_bytes: gpumem_common::RINGBUF_BYTES,
            stall_reader_ms: None,
            leaks: None,
            record: None,
            from: None,
        }
    }

    pub fn from_args(a: TraceArgs) -> Self {
        Session {
            pids: a.target.pids,
            command: a.target.command,
            duration: a.target.duration,
            filter: Filter { min_size: a.min_size.unwrap_or(0), failed_only: a.failed_only },
            json: a.json,
            limits: Limits { max_entries: a.max_allocations, ..Limits::default() },
            ringbuf_bytes: a.ringbuf_bytes,
            stall_reader_ms: a.stall_reader_ms,
            record: a.record,
            from: a.from,
            ..Session::with_probes(a.probes)
        }
    }

    pub fn for_leaks(a: crate::cli::LeaksArgs) -> Self {
        Session {
            pids: a.target.pids,
            command: a.target.command,
            duration: a.target.duration,
            json: a.json,
            limits: Limits { max_entries: a.max_allocations, ..Limits::default() },
            quiet: true,
            leaks: Some(LeaksOptions { older_than_s: a.older_than, top: a.top }),
            record: a.record,
            from: a.from,
            ..Session::with_probes(a.probes)
        }
    }
}

/// A command started blocked, so that it is in the pid filter before it runs.
struct Started {
    pid: u32,
    release: OwnedFd,
    exited: tokio::sync::oneshot::Receiver<std::io::Result<i32>>,
}

impl Started {
    /// Lets the command run.
    fn release(&self) {
        // SAFETY: writes one byte to a pipe we own.
        unsafe { libc::write(self.release.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    }
}

/// Forks `/bin/sh -c CMD`, held before exec until `Started::release`.
/// (std's Command cannot do this: its spawn waits for the exec.)
fn start_blocked(cmd: &str) -> Result<Started> {
    let sh = CString::new("/bin/sh").expect("no NUL");
    let dash_c = CString::new("-c").expect("no NUL");
    let cmd_c = CString::new(cmd).context("the command contains a NUL byte")?;
    let argv = [sh.as_ptr(), dash_c.as_ptr(), cmd_c.as_ptr(), std::ptr::null()];
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating a pipe to start the command");
    }
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only calls async-signal-safe functions (close, read,
    // execv, _exit) before exec, on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        unsafe {
            libc::close(write_end.as_raw_fd());
            let mut b = 0u8;
            // Wait until the agent has put us in its pid filter (or went away).
            libc::read(read_end.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::execv(sh.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    drop(read_end);
    let (tx, exited) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("gpumem-wait".into())
        .spawn(move || {
            let mut status = 0;
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            let _ = tx.send(if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(status) });
        })
        .context("starting the wait thread")?;
    Ok(Started { pid: pid as u32, release: write_end, exited })
}

/// Shell-style exit status: the code, or 128 + the signal that killed it.
fn exit_code(status: i32) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        128u8.wrapping_add(libc::WTERMSIG(status) as u8)
    } else {
        1
    }
}
pub fn run(s: Session) -> Result<ExitCode> {
    if let Some(path) = s.from.clone() {
        return replay(s, &path);
    }
    require_privileges()?;
    for &pid in &s.pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            bail!("no process with pid {pid}");
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(run_async(s))
}

async fn run_async(s: Session) -> Result<ExitCode> {
    let say = |m: String| eprintln!("gpumem: {m}");
    let filter_pids = !s.pids.is_empty() || s.command.is_some();
    // Created first: a path that cannot be written is a usage error, before any probe.
    let recorder = match &s.record {
        Some(path) => Some(record::Writer::create(path).with_context(|| format!("cannot write the recording {}", path.display()))?),
        None => None,
    };
    let mut agent = load_agent(&s.probes, filter_pids, s.probe_set, s.ringbuf_bytes)?;
    for note in &agent.notes {
        say(note.clone());
    }
    let mut reader = EventReader::new(agent.take_events()?).context("watching the ring buffer")?;
    attach_given(&mut agent, &s.probes, say)?;
    attach_discovered(&mut agent, &s.probes, true, say);
    if agent.attached_probe_count() == 0 {
        say(if s.probes.no_discover {
            "no libcuda attached".into()
        } else {
            "no libcuda found yet; watching for processes that load one".into()
        });
    }
    for &pid in &s.pids {
        agent.add_pid(pid, false)?;
    }
    let stdout = std::io::stdout();
    let mut sink = Sink::new(&s, BufWriter::new(stdout.lock()), Ingest::live(State::new(s.limits), recorder.is_some()));
    sink.recorder = recorder;
    sink.record(|w| {
        w.header(&Header {
            gpumem_version: env!("CARGO_PKG_VERSION").into(),
            recorded_by: if s.leaks.is_some() { "leaks" } else { "trace" }.into(),
            command: s.command.clone(),
            pids: s.pids.clone(),
            started_ns: leaks::monotonic_ns(),
        })
    });
    let mut started = match &s.command {
        Some(cmd) => {
            let st = start_blocked(cmd)?;
            agent.add_pid(st.pid, true)?;
            // Traced from its first instruction on.
            st.release();
            Some(st)
        }
        None => None,
    };
    // Everything is in place: events from here on are seen.
    say(if s.leaks.is_some() { "tracing; the report comes at the end (Ctrl-C to stop early)".into() } else { "tracing; Ctrl-C to stop".into() });

    // Live bytes are sampled for the growth detector in `leaks`, and in every
    // recording so that `leaks --from` sees the same samples.
    let sampling = s.leaks.is_some() || sink.recorder.is_some();
    let mut sample = tokio::time::interval(GROWTH_SAMPLE_INTERVAL);
    // Recordings keep NVML's readings and XIDs too (for reports), where NVML is there.
    let mut monitor = sink.recorder.is_some().then(|| crate::nvml::monitor::Monitor::open(s.probes.nvml.as_ref().map(|p| p.as_os_str().to_os_string())));
    let mut nvml_tick = tokio::time::interval(NVML_RECORD_INTERVAL);
    let thresholds = crate::analysis::health::Thresholds::default();
    let progress = s.leaks.is_some() && !s.json && std::io::stderr().is_terminal();
    let began = Instant::now();
    let deadline = s.duration.map(|d| tokio::time::Instant::now() + Duration::from_secs_f64(d));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + DISCOVERY_INTERVAL, DISCOVERY_INTERVAL);
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut child_status = None;
    let mut ticks = 0u64;
    if let Some(ms) = s.stall_reader_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    loop {
        tokio::select! {
            r = reader.readable() => {
                r.context("reading events")?;
                reader.drain_now(&mut |ev, stack| sink.on_event(ev, stack));
                let _ = sink.printer.flush();
            }
            _ = sample.tick(), if sampling => {
                let t = began.elapsed().as_secs_f64();
                sink.growth.sample(&sink.ingest.state, t);
                sink.record(|w| w.tick(t));
                if progress {
                    show_progress(t, s.duration, &sink.ingest.state);
                }
            }
            _ = nvml_tick.tick(), if monitor.is_some() => {
                let m = monitor.as_mut().expect("guarded");
                let t = began.elapsed().as_secs_f64();
                for x in m.sample(&thresholds) {
                    sink.record(|w| w.xid(&record::XidPoint { t_s: t, gpu: x.gpu, xid: x.xid }));
                }
                for g in &m.latest {
                    sink.record(|w| w.nvml(&record::NvmlPoint::from_sample(t, g)));
                }
            }
            _ = tick.tick() => {
                attach_discovered(&mut agent, &s.probes, false, say);
                ticks += 1;
                if ticks % FD_RESCAN_TICKS == 0 {
                    agent.seed_nvidia_fds();
                    agent.sweep_stale_calls();
                }
                if !s.pids.is_empty() && s.pids.iter().all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
                    break;
                }
            }
            status = async { (&mut started.as_mut().expect("guarded").exited).await }, if started.is_some() => {
                let status = status.context("the wait thread ended")?.context("waiting for the command")?;
                child_status = Some(status);
                break;
            }
            _ = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => break,
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
        if let Some(e) = sink.record_error.take() {
            let path = s.record.as_deref().unwrap_or(Path::new("?"));
            return Err(e).with_context(|| format!("writing the recording {}", path.display()));
        }
        if let Some(e) = sink.write_error.take() {
            // A closed pipe (`| head`) ends the trace quietly.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(ExitCode::SUCCESS);
            }
            return Err(e).context("writing events");
        }
    }
    // The command's exit event is already in the ring; take what is there.
    tokio::time::sleep(Duration::from_millis(50)).await;
    reader.drain_now(&mut |ev, stack| sink.on_event(ev, stack));
    if progress {
        eprint!("\r\x1b[K");
    }
    // Calls left in flight by threads that died since the last sweep.
    agent.sweep_stale_calls();
    let mut footer = Footer {
        duration_s: began.elapsed().as_secs_f64(),
        ended_ns: leaks::monotonic_ns(),
        lost: agent.lost_events(reader.malformed)?,
        probes_attached: agent.attached_probe_count(),
        discovery: agent.scan_stats.clone(),
        stacks: sink.ingest.stacks.stats.clone(),
        reconciliation: None,
        nvml: "not asked".into(),
        command_status: child_status,
        stale_calls_removed: agent.stale_calls_removed,
    };
    if s.leaks.is_none() || sink.recorder.is_some() {
        // Reconcile with the driver's own per-process figures, where NVML is there.
        match crate::nvml::Sampler::open(s.probes.nvml.as_deref().map(|p| p.as_os_str())).and_then(|mut n| n.sample(0.0)) {
            Ok(gpus) => {
                footer.reconciliation = Some(crate::analysis::reconcile::reconcile(&sink.ingest.state, &gpus));
                footer.nvml = format!("available, {} GPU(s)", gpus.len());
            }
            Err(e) => footer.nvml = e.to_string(),
        }
    }
    if let Some(e) = sink.record_error.take() {
        return Err(e).with_context(|| format!("writing the recording {}", s.record.as_deref().unwrap_or(Path::new("?")).display()));
    }
    if let Some(w) = sink.recorder.take() {
        let path = s.record.as_deref().expect("recording");
        let bytes = w.bytes;
        w.finish(&footer).with_context(|| format!("writing the recording {}", path.display()))?;
        say(format!("recorded {} events ({:.1} MiB) to {}", sink.ingest.state.events, bytes as f64 / 1048576.0, path.display()));
    }
    report(&s, &mut sink, &footer)?;
    drop(reader);
    agent.detach_in_background();
    Ok(match child_status {
        Some(st) => ExitCode::from(exit_code(st)),
        None => ExitCode::SUCCESS,
    })
}

/// The end of a session, live or replayed: the leaks report or the summary.
fn report<W: std::io::Write>(s: &Session, sink: &mut Sink<W>, f: &Footer) -> Result<()> {
    if let Some(opts) = s.leaks {
        let processes = leaks::find(&sink.ingest.state, &mut sink.ingest.stacks, &mut sink.growth, f.ended_ns, (opts.older_than_s * 1e9) as u64, opts.top);
        let report = LeaksReport {
            kind: "leaks",
            duration_s: f.duration_s,
            now_ns: f.ended_ns,
            older_than_s: opts.older_than_s,
            processes,
            oom: sink.ingest.state.oom.clone(),
            oom_events: std::mem::take(&mut sink.ooms),
            stacks: f.stacks.clone(),
            lost_events: f.lost.total(),
            distributions: sink.distributions.summary(),
        };
        let mut out = std::io::stdout().lock();
        if s.json {
            report.write_json(&mut out)?;
        } else {
            report.write_human(&mut out)?;
        }
        out.flush()?;
        return Ok(());
    }
    if s.quiet {
        return Ok(());
    }
    sink.ingest.state.mark_lost(&f.lost.by_pid);
    let mut summary = Summary::build(&sink.ingest.state, f.lost.clone(), f.duration_s, f.probes_attached, f.discovery.clone());
    summary.stacks = f.stacks.clone();
    summary.distributions = sink.distributions.summary();
    summary.reconciliation = f.reconciliation.clone();
    summary.nvml = f.nvml.clone();
    summary.stale_calls_removed = f.stale_calls_removed;
    let out = sink.printer.inner();
    if s.json {
        summary.write_json(out)?;
    } else {
        summary.write_human(out)?;
    }
    sink.printer.flush()?;
    Ok(())
}

/// `--from FILE`: the recorded session through the same state, analyses and
/// outputs. A damaged or unfinished recording is reported up to the damage,
/// with a clear error and exit status 1.
fn replay(s: Session, path: &Path) -> Result<ExitCode> {
    let mut reader = record::Reader::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let stdout = std::io::stdout();
    let mut sink = Sink::new(&s, BufWriter::new(stdout.lock()), Ingest::replay(State::new(s.limits)));
    let end = replay_records(&mut reader, &mut sink);
    let _ = sink.printer.flush();
    if let Some(e) = sink.write_error.take() {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(ExitCode::SUCCESS);
        }
        return Err(e).context("writing events");
    }
    report(&s, &mut sink, &end.footer)?;
    let events = end.events;
    if let Some(e) = end.damage {
        eprintln!("gpumem: {}: {e}; the report above covers the {events} events before it", path.display());
        return Ok(ExitCode::FAILURE);
    }
    if !end.complete {
        eprintln!("gpumem: {}: the recording ends without its footer (the session did not finish); the report above covers its {events} events", path.display());
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

impl<W: std::io::Write> Replayer for Sink<W> {
    fn parts(&mut self) -> (&mut Ingest, &mut GrowthTracker) {
        (&mut self.ingest, &mut self.growth)
    }
    fn after(&mut self, ev: &gpumem_common::Event, ingested: Ingested) -> bool {
        Sink::after(self, ev, ingested);
        self.write_error.is_none()
    }
}

/// Where events go: state always, the printer unless quiet, the recording if one is made.
struct Sink<W: std::io::Write> {
    ingest: Ingest,
    /// Live bytes sampled for the growth detector (leaks, recordings).
    growth: GrowthTracker,
    distributions: Distributions,
    printer: Printer<W>,
    quiet: bool,
    write_error: Option<std::io::Error>,
    /// OOM records (cuda_oom, oom_kill) for the leaks report.
    ooms: Vec<serde_json::Value>,
    recorder: Option<record::Writer<std::fs::File>>,
    record_error: Option<std::io::Error>,
}

const MAX_OOM_RECORDS: usize = 100;
/// NVIDIA descriptors the open tracepoint cannot see (inherited, dup'ed) are
/// picked up from /proc every this many discovery ticks (2 s).
const FD_RESCAN_TICKS: u64 = 4;
/// How often NVML is read while recording.
const NVML_RECORD_INTERVAL: Duration = Duration::from_secs(1);
/// How often live bytes are sampled for the growth detector.
const GROWTH_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// One status line on a terminal: time left (or elapsed), processes, live bytes.
fn show_progress(t: f64, duration: Option<f64>, state: &State) {
    let live: u64 = state.processes.values().flat_map(|p| p.devices.values()).map(|d| d.live_bytes).sum();
    let procs = state.processes.values().filter(|p| !p.exited).count();
    let time = match duration {
        Some(d) => format!("{:.0} s left", (d - t).max(0.0)),
        None => format!("{t:.0} s (Ctrl-C to report)"),
    };
    eprint!("\r\x1b[Kgpumem leaks: {time}, {procs} process(es), {} live", crate::export::names::bytes(live));
}

impl<W: std::io::Write> Sink<W> {
    fn new(s: &Session, out: W, ingest: Ingest) -> Self {
        Sink {
            ingest,
            growth: GrowthTracker::default(),
            distributions: Distributions::default(),
            printer: Printer::new(out, s.json, s.filter),
            quiet: s.quiet,
            write_error: None,
            ooms: Vec::new(),
            recorder: None,
            record_error: None,
        }
    }

    /// Writes to the recording, if one is made; the first error is kept and
    /// ends the session (a recording with a hole would mislead).
    fn record(&mut self, f: impl FnOnce(&mut record::Writer<std::fs::File>) -> std::io::Result<()>) {
        if let (Some(w), None) = (self.recorder.as_mut(), &self.record_error) {
            if let Err(e) = f(w) {
                self.record_error = Some(e);
            }
        }
    }

    /// A traced event.
    fn on_event(&mut self, ev: &gpumem_common::Event, stack: Option<&gpumem_common::StackEvent>) {
        let (ingested, stack_id) = self.ingest.event(ev, stack);
        if self.recorder.is_some() {
            // What replay needs before this event: the lookups it caused and its stack.
            for l in self.ingest.lookups.take_log() {
                self.record(|w| w.lookup(&l));
            }
            if let Some(id) = stack_id.filter(|&id| !self.recorder.as_ref().is_some_and(|w| w.has_stack(id))) {
                let frames = self.ingest.stacks.frames(id);
                self.record(|w| w.stack(id, frames));
            }
            self.record(|w| w.event(ev, stack_id));
        }
        self.after(ev, ingested);
    }

    fn after(&mut self, ev: &gpumem_common::Event, Ingested { applied, oom_stacks }: Ingested) {
        if let Some(o) = distributions::observe(ev, &applied) {
            self.distributions.record(&o);
        }
        // Kept for reports that come at the end (leaks); bounded.
        if self.ooms.len() < MAX_OOM_RECORDS {
            if let Some(oom) = &applied.cuda_oom {
                self.ooms.push(cuda_oom_json(ev, oom, &oom_stacks));
            }
            if applied.oom_kill.is_some() {
                self.ooms.push(event_json(ev, &applied, None));
            }
        }
        if !self.quiet && self.write_error.is_none() {
            let container = self.ingest.state.processes.get(&ev.pid).and_then(|p| p.container.as_ref());
            if let Err(e) = self.printer.event(ev, &applied, container, &oom_stacks) {
                self.write_error = Some(e);
            }
        }
    }
}

impl Session {
    /// `gpumem record`: trace with nothing on stdout, everything into the file.
    pub fn for_record(a: crate::cli::RecordArgs) -> Self {
        Session {
            pids: a.target.pids,
            command: a.target.command,
            duration: a.target.duration,
            limits: Limits { max_entries: a.max_allocations, ..Limits::default() },
            quiet: true,
            record: Some(a.output),
            ..Session::with_probes(a.probes)
        }
    }

    /// `gpumem replay FILE`: `trace --from FILE`.
    pub fn for_replay(a: crate::cli::ReplayArgs) -> Self {
        let probes = ProbeArgs { libcuda: vec![], no_discover: true, nvidia_dev_prefix: "/dev/nvidia".into(), ioctl: "off".into(), nvml: None, stacks: "on".into() };
        Session { json: a.json, from: Some(a.file), ..Session::with_probes(probes) }
    }

    /// The overhead benchmark: the same session with output off, and either
    /// gpumem's probes or empty ones on the same symbols.
    pub fn for_bench(a: crate::cli::BenchArgs) -> Self {
        Session {
            command: Some(a.command),
            probe_set: if a.probe_set == "empty" { ProbeSet::Empty } else { ProbeSet::Full },
            quiet: true,
            ..Session::with_probes(a.probes)
        }
    }
}
