//! Continuity across restarts of `gpumem serve`: its kernel state pinned
//! (probes/pin.rs), taken over by the next agent, and its state rebuilt from
//! the kernel's table of live entries (probes/live.rs) — allocations made
//! before, during and after the gap alike — with the stacks of allocations
//! made before the restart read back from the state directory.
//!
//! Adoption: the old links are removed once this agent's are attached (the
//! probes overlap, never miss), the table is read and replayed in time order
//! as events flagged ADOPTED, and then the ring is read from where the last
//! reader stopped. Ring events up to the snapshot may already be in the
//! table: one that made what the state now holds (same key, same time) is
//! skipped, and so is a free of what it does not hold (freed before the
//! snapshot, not untracked). The state is the reference: no copy of the
//! table is kept (a million entries would cost a hundred MiB).
use std::{
    collections::{HashMap, HashSet},
    io::{BufRead as _, Write as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpumem_common::{
    flags,
    live::{self, kind, LiveEntry, LiveKey},
    Event,
};

use crate::probes::{pin, Agent};
use gpumem_engine::{
    clock::monotonic_ns,
    events::Kind,
    model::agent::{Adopted, ContinuityReport},
    pipeline::{Outcome, Pipeline, Stack},
    stacks::{Frame, StackId},
};

/// `serve`'s continuity settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the pinned state lives (bpffs).
    pub root: PathBuf,
    /// Where symbolized stacks are kept for the next agent.
    pub state_dir: PathBuf,
    /// Entries of the kernel's table of live entries.
    pub kernel_table: u32,
}

/// Entries of processes gone are removed from the kernel's table this often
/// (and at each exit seen).
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// The replay window is closed this long after adoption.
const WINDOW_FOR: Duration = Duration::from_secs(30);
/// Write-backs kept for the tick at most; beyond, written at once.
const WRITE_BACK_MAX: usize = 4096;

/// Ring events up to the snapshot may be accounted for by it.
struct Window {
    until_ns: u64,
    opened: Instant,
}

pub struct Continuity {
    pub opts: Options,
    pub pinned: Option<pin::Pinned>,
    pub report: ContinuityReport,
    old_links: Vec<PathBuf>,
    adopt: bool,
    window: Option<Window>,
    exited: Vec<u32>,
    last_sweep: Instant,
    stacks: StackFile,
    /// What the agent learned about entries (device, stack), written back
    /// at the next tick to those still held: most allocations are freed
    /// before, and cost no system call (one each doubled the agent's CPU
    /// per allocation at 10 000/s).
    to_write: Vec<(LiveKey, LiveEntry)>,
}

impl Continuity {
    /// Makes the pin directory ready (bpffs mounted, other layouts replaced);
    /// without bpffs the session runs unpinned and says why.
    pub fn prepare(opts: Options) -> Self {
        let p = pin::Pinned::at(&opts.root);
        let mut report = ContinuityReport { layout: p.layout.clone(), ..Default::default() };
        let pinned = match pin::prepare(&p) {
            Ok(prep) => {
                report.notes.extend(prep.notes);
                report.pinned = Some(p.root.join(&p.layout).display().to_string());
                Some(p)
            }
            Err(e) => {
                report.unpinned_why = Some(e.clone());
                report.notes.push(format!("{e}: running unpinned (state is lost when this agent stops)"));
                None
            }
        };
        let old_links = pinned.as_ref().map(pin::Pinned::links_pinned).unwrap_or_default();
        let adopt = pinned.as_ref().is_some_and(pin::Pinned::has_state);
        let stacks = StackFile::at(&opts.state_dir);
        Continuity {
            opts,
            pinned,
            report,
            old_links,
            adopt,
            window: None,
            exited: Vec::new(),
            last_sweep: Instant::now(),
            stacks,
            to_write: Vec::new(),
        }
    }

    /// The pinned maps did not match this build (aya refused one): the
    /// layout's state is replaced and loading starts afresh.
    pub fn replace_incompatible(&mut self, why: &str) {
        let Some(p) = &self.pinned else { return };
        let (links, maps) = pin::remove_tree(&p.root.join(&p.layout));
        self.report
            .notes
            .push(format!("pinned state does not match this gpumem ({why}): replaced ({links} links detached, {maps} maps unpinned)"));
        self.old_links.clear();
        self.adopt = false;
        if let Err(e) = pin::prepare(p) {
            self.report.notes.push(format!("{e}: running unpinned"));
            self.report.unpinned_why = Some(e);
            self.report.pinned = None;
            self.pinned = None;
        }
    }

    /// This agent's links are attached and pinned: the previous agent's go.
    /// `returns_before`: the kernel's count of returns without their entry
    /// before this agent's first link; what it counted since were the
    /// overlapping links' second returns, discounted.
    pub fn take_over(&mut self, agent: &mut Agent, returns_before: u64) {
        for l in std::mem::take(&mut self.old_links) {
            if std::fs::remove_file(&l).is_ok() {
                self.report.links_taken_over += 1;
            }
        }
        if self.report.links_taken_over > 0 {
            let now = returns_without_entry(agent);
            self.report.duplicate_returns = now.saturating_sub(returns_before);
            agent.discount_duplicate_returns(self.report.duplicate_returns);
        }
    }

    /// Rebuilds the state from the kernel's table (when a previous agent
    /// left one) and opens the replay window.
    pub fn adopt(&mut self, agent: &mut Agent, pipeline: &mut Pipeline) {
        if !std::mem::take(&mut self.adopt) {
            return;
        }
        let began = Instant::now();
        let mut alive = Alive::default();
        let entries_of_exited = agent.remove_live_of(|pid| !alive.check(pid));
        let mut entries = agent.live_entries();
        entries.sort_by_key(|(_, e)| e.event.ts_ns);
        let restored = self.stacks.load(entries.iter().map(|(_, e)| e.stack).filter(|&s| s != 0).collect());
        let mut stacks_restored = 0;
        for (id, frames) in restored {
            pipeline.stacks.insert_symbolized(id, frames);
        }
        for (_, entry) in &entries {
            let mut ev = entry.event;
            ev.flags |= flags::ADOPTED;
            let stack = match entry.stack {
                0 => Stack::None,
                id if self.stacks.persisted.contains(&id) => {
                    stacks_restored += 1;
                    Stack::Recorded(id)
                }
                _ => Stack::None,
            };
            pipeline.apply(&ev, stack);
            // A primary context: once per retain not released yet.
            if ev.api == gpumem_common::api::CU_DEVICE_PRIMARY_CTX_RETAIN {
                for _ in 1..entry.event.aux.clamp(1, 1000) {
                    pipeline.apply(&ev, Stack::None);
                }
            }
        }
        let window = Window { until_ns: monotonic_ns(), opened: Instant::now() };
        let missed = agent.live_missed();
        pipeline.state.mark_lost(&missed);
        let processes = entries.iter().map(|(k, _)| k.tgid).collect::<HashSet<_>>().len();
        self.report.adopted = Some(Adopted {
            processes,
            entries: entries.len(),
            entries_of_exited,
            stacks_restored,
            processes_uncertain: missed.len(),
            took_ms: began.elapsed().as_secs_f64() * 1e3,
        });
        self.window = Some(window);
    }

    /// Whether a ring event is already accounted for by the adopted table.
    pub fn skips(&self, ev: &Event, state: &gpumem_engine::state::State) -> bool {
        let Some(w) = &self.window else { return false };
        if ev.ts_ns > w.until_ns || ev.result != 0 {
            return false;
        }
        let Some((k, id, add)) = live::effect(ev) else { return false };
        if k == kind::PRIMARY_CTX && !add {
            // The table's count already has every release before the snapshot.
            return true;
        }
        let held = state.held_entry(ev.pid, k, id);
        if add {
            // What the state holds came from this very call (entries
            // without a time: the key is unique in the table).
            k != kind::THREAD_CTX && held.is_some_and(|ts| ts == ev.ts_ns || ts == 0)
        } else {
            // Freed before the snapshot: not held, and no untracked free.
            matches!(k, kind::ALLOC | kind::VMM_HANDLE | kind::VMM_MAP | kind::VA | kind::TENSOR) && held.is_none()
        }
    }

    /// After an event is applied: the device and stack the agent resolved go
    /// into the kernel's entry, exits are noted for the sweep, new stacks
    /// for the state directory; a full batch of write-backs is written at
    /// once (a burst of a ring's worth of allocations would otherwise be held
    /// until the drain's end).
    pub fn applied(&mut self, o: &Outcome, agent: &mut Agent, state: &gpumem_engine::state::State) {
        if matches!(o.kind, Kind::Exit) {
            self.exited.push(o.event.pid);
            return;
        }
        self.learned(&o.event, o.applied.device, o.stack);
        self.write_back_if_full(agent, state);
    }

    /// A ring event the adopted table accounted for brought the stack of an
    /// allocation made while no agent ran: the state and the kernel's entry get it.
    pub fn skipped_with_stack(&mut self, pipeline: &mut Pipeline, s: &gpumem_common::StackEvent) {
        let ev = &s.event;
        if let Some((id, device)) = pipeline.adopt_stack(s) {
            self.learned(ev, device, Some(id));
        }
    }

    fn learned(&mut self, ev: &Event, device: i32, stack: Option<StackId>) {
        if ev.result != 0 || ev.flags & flags::NOT_IN_KERNEL_TABLE != 0 {
            return;
        }
        let Some((k @ (kind::ALLOC | kind::VMM_HANDLE | kind::TENSOR), id, true)) = live::effect(ev) else { return };
        let mut event = *ev;
        event.device = device;
        event.flags |= flags::ADOPTED;
        let stack = stack.unwrap_or(0);
        if stack != 0 && !self.stacks.persisted.contains(&stack) {
            self.stacks.pending.insert(stack);
        }
        self.to_write.push((LiveKey { tgid: event.pid, kind: k, id }, LiveEntry { event, stack }));
    }

    /// Writes back what is still held (same key, same call) to the kernel's entries.
    fn write_back(&mut self, agent: &mut Agent, state: &gpumem_engine::state::State) {
        for (key, entry) in self.to_write.drain(..) {
            if state.held_entry(key.tgid, key.kind, key.id) == Some(entry.event.ts_ns) {
                agent.live_write_back(&key, &entry);
            }
        }
        // A burst between ticks may have grown it past the batch: not kept.
        self.to_write.shrink_to(WRITE_BACK_MAX);
    }

    /// After each drain: the stacks first seen in it are written, so that
    /// even a SIGKILL right after leaves them for the next agent (each
    /// stack is symbolized and written once).
    pub fn drained(&mut self, agent: &mut Agent, pipeline: &mut Pipeline) {
        self.write_back_if_full(agent, &pipeline.state);
        self.stacks.persist(pipeline);
    }

    /// Writes back a full batch at once.
    fn write_back_if_full(&mut self, agent: &mut Agent, state: &gpumem_engine::state::State) {
        if self.to_write.len() >= WRITE_BACK_MAX {
            self.write_back(agent, state);
        }
    }

    /// The maintenance tick: what was learned written back, entries of
    /// processes gone removed, the replay window closed.
    pub fn tick(&mut self, agent: &mut Agent, pipeline: &Pipeline) {
        self.write_back(agent, &pipeline.state);
        if !self.exited.is_empty() || self.last_sweep.elapsed() >= SWEEP_EVERY {
            let exited: HashSet<u32> = self.exited.drain(..).collect();
            let mut alive = Alive::default();
            agent.remove_live_of(|pid| exited.contains(&pid) || !alive.check(pid));
            self.last_sweep = Instant::now();
        }
        if self.window.as_ref().is_some_and(|w| w.opened.elapsed() >= WINDOW_FOR) {
            self.window = None;
        }
    }

    /// The end: what was learned and the stacks not written yet are (a
    /// SIGTERM of an upgrade).
    pub fn finish(&mut self, agent: &mut Agent, pipeline: &mut Pipeline) {
        self.write_back(agent, &pipeline.state);
        self.stacks.persist(pipeline);
    }
}

/// The kernel's count of returns without their entry (0 if unreadable).
pub fn returns_without_entry(agent: &Agent) -> u64 {
    agent.kernel_stats().map_or(0, |s| s[gpumem_common::counters::Stat::ReturnWithoutEntry.index()])
}

/// Liveness of processes, each looked up once per sweep.
#[derive(Default)]
struct Alive(HashMap<u32, bool>);

impl Alive {
    fn check(&mut self, pid: u32) -> bool {
        *self.0.entry(pid).or_insert_with(|| gpumem_engine::procfs::alive(pid, None))
    }
}

/// Symbolized stacks by id, one JSON object per line, appended as new
/// stacks are seen and compacted to the live ones at adoption.
struct StackFile {
    path: PathBuf,
    persisted: HashSet<StackId>,
    pending: HashSet<StackId>,
    error: Option<String>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredStack {
    id: StackId,
    frames: Vec<Frame>,
}

/// The file under --state-dir where symbolized stacks are kept by id.
pub const STACK_FILE: &str = "stacks.jsonl";

impl StackFile {
    fn at(dir: &Path) -> Self {
        StackFile { path: dir.join(STACK_FILE), persisted: HashSet::new(), pending: HashSet::new(), error: None }
    }

    /// The stored stacks among `wanted`; the file is rewritten with only them.
    fn load(&mut self, wanted: HashSet<StackId>) -> Vec<(StackId, Vec<Frame>)> {
        let mut found = Vec::new();
        if let Ok(f) = std::fs::File::open(&self.path) {
            for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                // A line cut short by a kill is skipped; its stack is lost only.
                if let Ok(s) = serde_json::from_str::<StoredStack>(&line) {
                    if wanted.contains(&s.id) && self.persisted.insert(s.id) {
                        found.push((s.id, s.frames));
                    }
                }
            }
        }
        let text: String = found
            .iter()
            .filter_map(|(id, frames)| serde_json::to_string(&StoredStack { id: *id, frames: frames.clone() }).ok())
            .map(|l| l + "\n")
            .collect();
        self.write(|path| {
            let tmp = path.with_extension("jsonl.tmp");
            std::fs::write(&tmp, &text)?;
            std::fs::rename(&tmp, path)
        });
        found
    }

    /// Appends the stacks seen since the last call.
    fn persist(&mut self, pipeline: &mut Pipeline) {
        if self.pending.is_empty() {
            return;
        }
        let mut text = String::new();
        for id in std::mem::take(&mut self.pending) {
            let frames = pipeline.stacks.frames(id);
            if frames.is_empty() {
                continue;
            }
            if let Ok(line) = serde_json::to_string(&StoredStack { id, frames }) {
                text += &line;
                text.push('\n');
                self.persisted.insert(id);
            }
        }
        self.write(|path| std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(text.as_bytes()));
    }

    fn write(&mut self, f: impl FnOnce(&Path) -> std::io::Result<()>) {
        let result = std::fs::create_dir_all(self.path.parent().unwrap_or(Path::new("."))).and_then(|_| f(&self.path));
        if let Err(e) = result {
            if self.error.is_none() {
                eprintln!("gpumem: cannot keep stacks in {}: {e} (a restarted agent will not have them)", self.path.display());
            }
            self.error = Some(e.to_string());
        }
    }
}
