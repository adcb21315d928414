//! `serve --flight-recorder DURATION`: the evidence at the moment an action
//! fires. The daemon keeps the last DURATION of what a recording holds
//! (events with their stacks and lookups, growth samples, NVML readings,
//! XIDs, host-memory readings) in a bounded ring; when an action fires it
//! writes a recording of that window, preceded by the state before it —
//! every allocation still live that was made before the window, with its
//! stack, and the last host-memory reading before it — and followed by the
//! host memory read as the action fires, so that `gpumem report` and `leaks
//! --from` on the file see what the daemon saw.
use std::{
    cell::RefCell,
    collections::VecDeque,
    path::{Path, PathBuf},
    process::ExitCode,
    rc::Rc,
};

use anyhow::{Context as _, Result};
use gpumem_common::{api, flags, Event, COMM_LEN, DEVICE_UNKNOWN};

use gpumem_engine::{
    clock::monotonic_ns,
    model::{
        host::HostMemory,
        lost::LostEvents,
        nvml::Message,
        readings::{HostPoint, Lookup, NvmlPoint, XidPoint},
    },
    pipeline::{Outcome, Pipeline},
    record::{Footer, Header, Writer},
    stacks::{Sampling, StackId},
    state::process::{Memory, Process},
};

use crate::runtime::{Ctx, End, Flow, Output};

/// The recorder, shared by its Output (which fills the window) and the
/// actions (which write it when they fire); both run on the runtime's task.
pub type Flight = Rc<RefCell<FlightRecorder>>;

/// Items kept at most, whatever the duration (about 130 bytes each).
const MAX_ITEMS: usize = 1 << 20;

enum Item {
    Event { ev: Event, stack: Option<StackId>, lookups: Vec<Lookup> },
    Tick(f64),
    Nvml(Vec<NvmlPoint>),
    Xid(XidPoint),
    Host(Box<HostPoint>),
}

pub struct FlightRecorder {
    window_ns: u64,
    dir: PathBuf,
    /// (CLOCK_MONOTONIC ns, item), oldest first.
    items: VecDeque<(u64, Item)>,
    /// Items that fell out because the ring was full (not because they aged).
    pub dropped: u64,
    /// The last host-memory reading that left the ring (the window may be
    /// shorter than the reading interval).
    host_before: Option<Box<HostPoint>>,
    session_start_ns: u64,
    stack_sample_bytes: u64,
}

impl FlightRecorder {
    pub fn new(window_s: f64, dir: PathBuf, stack_sample_bytes: u64) -> FlightRecorder {
        FlightRecorder {
            window_ns: (window_s * 1e9) as u64,
            dir,
            items: VecDeque::new(),
            dropped: 0,
            host_before: None,
            session_start_ns: monotonic_ns(),
            stack_sample_bytes,
        }
    }

    /// The session's clock starts `elapsed_s` before now (ticks count from it).
    fn started(&mut self, elapsed_s: f64) {
        self.session_start_ns = monotonic_ns().saturating_sub((elapsed_s * 1e9) as u64);
    }

    fn push(&mut self, at: u64, item: Item) {
        let oldest = at.saturating_sub(self.window_ns);
        while self.items.front().is_some_and(|(t, _)| *t < oldest) {
            self.pop();
        }
        if self.items.len() >= MAX_ITEMS {
            self.pop();
            self.dropped += 1;
        }
        self.items.push_back((at, item));
    }

    fn pop(&mut self) {
        if let Some((_, Item::Host(h))) = self.items.pop_front() {
            self.host_before = Some(h);
        }
    }

    fn event(&mut self, p: &mut Pipeline, o: &Outcome) {
        let lookups = p.lookups.take_log();
        let mut ev = o.event;
        // The contexts it was resolved through may be older than the window:
        // the event carries the device the daemon resolved, as an adopted one.
        if o.applied.device != DEVICE_UNKNOWN {
            ev.device = o.applied.device;
            ev.flags |= flags::ADOPTED;
        }
        self.push(ev.ts_ns, Item::Event { ev, stack: o.stack, lookups });
    }

    fn tick(&mut self, t_s: f64) {
        self.push(monotonic_ns(), Item::Tick(t_s));
    }

    fn nvml(&mut self, m: &Message, t_s: f64) {
        match m {
            Message::Reading { gpus, .. } => {
                self.push(monotonic_ns(), Item::Nvml(gpus.iter().map(|g| NvmlPoint::from_sample(t_s, g)).collect()))
            }
            Message::Xid(x) => self.push(monotonic_ns(), Item::Xid(XidPoint { t_s, gpu: x.gpu, xid: x.xid })),
            Message::Unavailable(_) => {}
        }
    }

    fn host(&mut self, h: &HostMemory, t_s: f64) {
        self.push(monotonic_ns(), Item::Host(Box::new(HostPoint { t_s, host: h.clone() })));
    }

    /// Writes the window (and the state before it) for an action on `kind`;
    /// the file's path.
    pub fn snapshot(&mut self, p: &mut Pipeline, kind: &str, lost: LostEvents) -> Result<PathBuf> {
        let now = monotonic_ns();
        let since = self.items.front().map_or(now, |(t, _)| *t).min(now.saturating_sub(self.window_ns));
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let name = format!("gpumem-{kind}-{}.gpumem", gpumem_engine::clock::rfc3339(gpumem_engine::clock::unix_ns()).replace(':', ""));
        let path = self.dir.join(name);
        let tmp = path.with_extension("partial");
        self.write(&tmp, p, since, now, lost).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        Ok(path)
    }

    fn write(&self, path: &Path, p: &mut Pipeline, since: u64, now: u64, lost: LostEvents) -> std::io::Result<()> {
        let mut w = Writer::create(path)?;
        w.header(&Header {
            gpumem_version: env!("CARGO_PKG_VERSION").into(),
            recorded_by: "serve --flight-recorder".into(),
            command: None,
            pids: Vec::new(),
            started_ns: self.session_start_ns,
            stack_sample_bytes: self.stack_sample_bytes,
            host: crate::node::name(),
            started_unix_ns: gpumem_engine::clock::unix_ns_of(self.session_start_ns) as i64,
        })?;
        if let Some(h) = &self.host_before {
            w.host(h)?;
        }
        write_state_before(&mut w, p, since)?;
        for (_, item) in &self.items {
            match item {
                Item::Event { ev, stack, lookups } => {
                    for l in lookups {
                        w.lookup(l)?;
                    }
                    write_stack(&mut w, p, *stack)?;
                    w.event(ev, *stack)?;
                }
                Item::Tick(t_s) => w.tick(*t_s)?,
                Item::Nvml(points) => {
                    for n in points {
                        w.nvml(n)?;
                    }
                }
                Item::Xid(x) => w.xid(x)?,
                Item::Host(h) => w.host(h)?,
            }
        }
        // The host memory at the moment the action fired: the evidence of a
        // host-side cause (a reading is a few /proc files per process).
        p.refresh_host();
        w.host(&HostPoint { t_s: now.saturating_sub(self.session_start_ns) as f64 / 1e9, host: p.host.clone() })?;

        let footer = Footer {
            duration_s: now.saturating_sub(self.session_start_ns) as f64 / 1e9,
            ended_ns: now,
            lost,
            nvml: "as the daemon read it".into(),
            stacks: p.stacks.stats.clone(),
            ..Default::default()
        };
        w.finish(&footer)?.sync_all()
    }
}

/// The flight recorder as an Output: everything a recording holds goes
/// into its window as the session sees it.
pub struct Window(pub Flight);

impl Output for Window {
    type Input = std::convert::Infallible;

    fn started(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        self.0.borrow_mut().started(ctx.elapsed_s);
        Ok(())
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> Result<Flow> {
        self.0.borrow_mut().event(ctx.pipeline, o);
        Ok(Flow::Continue)
    }

    fn sampled(&mut self, _: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.0.borrow_mut().tick(t_s);
        Ok(())
    }

    fn nvml(&mut self, _: &mut Ctx<'_>, m: &Message, t_s: f64) -> Result<()> {
        self.0.borrow_mut().nvml(m, t_s);
        Ok(())
    }

    fn host(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.0.borrow_mut().host(&ctx.pipeline.host, t_s);
        Ok(())
    }

    fn finish(&mut self, _: &mut Ctx<'_>, _: &End) -> Result<ExitCode> {
        Ok(ExitCode::SUCCESS)
    }
}

fn write_stack(w: &mut Writer<std::fs::File>, p: &mut Pipeline, stack: Option<StackId>) -> std::io::Result<()> {
    match stack {
        Some(id) if !w.has_stack(id) => w.stack(id, p.stacks.frames(id)),
        _ => Ok(()),
    }
}

/// Every live allocation (device and pinned host memory) made before
/// `since`, as the call that made it (with its device and stack), oldest
/// first, each process's container looked up first.
fn write_state_before(w: &mut Writer<std::fs::File>, p: &mut Pipeline, since: u64) -> std::io::Result<()> {
    let mut before: Vec<(Event, Option<StackId>)> = Vec::new();
    let mut lookups = Vec::new();
    for proc in p.state.processes.values().filter(|p| !p.exited) {
        let n = before.len();
        before.extend(made_before(proc, since));
        if before.len() > n {
            if let Some(c) = &proc.container {
                lookups.push(Lookup { pid: proc.pid, container: Some(c.clone()), memcg: None, host: None });
            }
        }
    }
    before.sort_by_key(|(e, _)| e.ts_ns);
    for l in &lookups {
        w.lookup(l)?;
    }
    for (ev, stack) in &before {
        write_stack(w, p, *stack)?;
        w.event(ev, *stack)?;
    }
    Ok(())
}

fn made_before(p: &Process, since: u64) -> impl Iterator<Item = (Event, Option<StackId>)> + '_ {
    let mut comm = [0u8; COMM_LEN];
    let n = p.comm.len().min(COMM_LEN - 1);
    comm[..n].copy_from_slice(&p.comm.as_bytes()[..n]);
    p.held.allocs.iter().filter(move |(_, a)| a.ts_ns < since).map(move |(addr, a)| {
        let sampling = match a.sampling() {
            Sampling::Every => 0,
            Sampling::Sampled => flags::STACK_SAMPLED,
            Sampling::NotSampled => flags::STACK_NOT_SAMPLED,
        };
        let api = if a.memory() == Memory::HostPinned { api::CU_MEM_HOST_ALLOC } else { api::CU_MEM_ALLOC_V2 };
        let ev = Event {
            ts_ns: a.ts_ns,
            latency_ns: 0,
            addr,
            size: a.size,
            handle: 0,
            aux: 0,
            pid: p.pid,
            tid: p.pid,
            api,
            result: 0,
            device: a.device(),
            // The device is the one resolved then, as for an adopted entry.
            flags: flags::ADOPTED | sampling,
            comm,
        };
        (ev, a.stack())
    })
}
