//! `gpumem record`, and `--record` on trace and leaks: the session written
//! to a file as it happens (events, their stacks symbolized, lookups,
//! growth samples, NVML readings, XIDs and host-memory readings), finished
//! with its footer.
use std::{
    convert::Infallible,
    fs::File,
    io,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{
    cli::RecordArgs,
    runtime::{self, Ctx, End, Flow, Output, Session},
};
use gpumem_engine::{
    clock::monotonic_ns,
    model::readings::{HostPoint, NvmlPoint, XidPoint},
    pipeline::Outcome,
    record::{Header, Writer},
};

/// How often NVML and the host memory are read while recording.
const NVML_RECORD_INTERVAL: Duration = Duration::from_secs(1);
const HOST_RECORD_INTERVAL: Duration = Duration::from_secs(1);

pub struct Recorder {
    writer: Option<Writer<File>>,
    path: PathBuf,
    /// Written when the session starts, so that its clock is the session's.
    header: Header,
}

/// What a recorded session needs of the runtime: lookups kept for the file,
/// growth samples, NVML and the host memory every second, NVML at the end.
pub fn prepare(s: &mut Session) {
    s.record_lookups = true;
    s.growth_every = Some(runtime::GROWTH_SAMPLE_INTERVAL);
    s.nvml_every = NVML_RECORD_INTERVAL;
    s.host_every = Some(HOST_RECORD_INTERVAL);
    s.reconcile_at_end = true;
}

impl Recorder {
    /// Created first: a path that cannot be written is a usage error, before any probe.
    pub fn create(path: &Path, recorded_by: &str, s: &Session) -> Result<Self> {
        let w = Writer::create(path).with_context(|| format!("cannot write the recording {}", path.display()))?;
        let header = Header {
            gpumem_version: env!("CARGO_PKG_VERSION").into(),
            recorded_by: recorded_by.into(),
            command: s.command.clone(),
            pids: s.pids.clone(),
            started_ns: 0,
            stack_sample_bytes: s.probing.stacks.effective_sample_bytes(),
            host: crate::node::name(),
            started_unix_ns: 0,
        };
        Ok(Recorder { writer: Some(w), path: path.to_path_buf(), header })
    }

    /// Writes to the recording; an error ends the session (a recording with a hole would mislead).
    fn write(&mut self, f: impl FnOnce(&mut Writer<File>) -> io::Result<()>) -> Result<()> {
        match self.writer.as_mut() {
            Some(w) => f(w).with_context(|| format!("writing the recording {}", self.path.display())),
            None => Ok(()),
        }
    }
}

impl Output for Recorder {
    type Input = Infallible;

    /// The header, at the time the session's clock starts (growth samples
    /// and NVML readings count from it).
    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        self.header.started_ns = monotonic_ns();
        self.header.started_unix_ns = gpumem_engine::clock::unix_ns_of(self.header.started_ns) as i64;
        let header = self.header.clone();
        self.write(|w| w.header(&header))
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> Result<Flow> {
        // What replay needs before this event: the lookups it caused and its stack.
        for l in ctx.pipeline.lookups.take_log() {
            self.write(|w| w.lookup(&l))?;
        }
        if let Some(id) = o.stack.filter(|&id| !self.writer.as_ref().is_some_and(|w| w.has_stack(id))) {
            let frames = ctx.pipeline.stacks.frames(id);
            self.write(|w| w.stack(id, frames))?;
        }
        self.write(|w| w.event(&o.event, o.stack))?;
        Ok(Flow::Continue)
    }

    fn sampled(&mut self, _: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.write(|w| w.tick(t_s))
    }

    fn host(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        let point = HostPoint { t_s, host: ctx.pipeline.host.clone() };
        self.write(|w| w.host(&point))
    }

    fn nvml(&mut self, _: &mut Ctx<'_>, m: &gpumem_engine::model::nvml::Message, t_s: f64) -> Result<()> {
        match m {
            gpumem_engine::model::nvml::Message::Reading { gpus, .. } => {
                for g in gpus {
                    self.write(|w| w.nvml(&NvmlPoint::from_sample(t_s, g)))?;
                }
            }
            gpumem_engine::model::nvml::Message::Xid(x) => self.write(|w| w.xid(&XidPoint { t_s, gpu: x.gpu, xid: x.xid }))?,
            gpumem_engine::model::nvml::Message::Unavailable(_) => {}
        }
        Ok(())
    }

    fn finish(&mut self, _: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        let Some(w) = self.writer.take() else { return Ok(ExitCode::SUCCESS) };
        let (bytes, events) = (w.bytes, w.events);
        w.finish(&end.footer).with_context(|| format!("writing the recording {}", self.path.display()))?;
        eprintln!("gpumem: recorded {events} events ({:.1} MiB) to {}", bytes as f64 / 1048576.0, self.path.display());
        Ok(ExitCode::SUCCESS)
    }
}

/// Runs a live session into `out`, also recorded to `record` when given
/// (`--record` of trace and leaks).
pub fn run_recorded<O: Output>(mut s: Session, mut out: O, record: Option<&Path>, recorded_by: &str) -> Result<ExitCode> {
    let Some(path) = record else { return runtime::run(s, &mut out) };
    let recorder = Recorder::create(path, recorded_by, &s)?;
    prepare(&mut s);
    runtime::run(s, &mut (out, recorder))
}

pub fn run(a: RecordArgs) -> Result<ExitCode> {
    let mut s = super::session(&a.probes, &a.target, a.max_allocations);
    prepare(&mut s);
    let recorder = Recorder::create(&a.output, "record", &s)?;
    runtime::run(s, &mut (Announce, recorder))
}

/// The ready line of a session that prints nothing else.
struct Announce;

impl Output for Announce {
    type Input = Infallible;

    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        eprintln!("gpumem: tracing; Ctrl-C to stop");
        Ok(())
    }

    fn finish(&mut self, _: &mut Ctx<'_>, _: &End) -> Result<ExitCode> {
        Ok(ExitCode::SUCCESS)
    }
}
