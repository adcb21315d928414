//! Allocation stacks: unwound from the stack slice each allocation event
//! carries, deduplicated by id, symbolized on demand.
mod known;
pub mod policy;
mod python;
pub mod symbolize;
pub mod unwind;

use std::{
    collections::{hash_map::DefaultHasher, HashMap},
    hash::{Hash as _, Hasher as _},
    time::Instant,
};

use gpumem_common::StackEvent;
pub use policy::{Sampling, StackPolicy};
use serde::Serialize;
pub use symbolize::Frame;
use unwind::{ModuleCache, ProcessUnwinder, RawFrame};

use crate::model::degraded::Reason;

pub type StackId = u64;

/// Deepest stack kept.
pub const MAX_FRAMES: usize = 64;
/// Distinct stacks kept; beyond it new stacks are counted and not stored.
pub const MAX_STACKS: usize = 65536;
/// Processes whose unwind state is kept.
const MAX_PROCESSES: usize = 1024;

/// What stack capture and unwinding cost, for the summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct StackStats {
    pub captured: u64,
    pub unique: u64,
    /// Stack bytes copied from the kernel, in total.
    pub bytes_copied: u64,
    /// Stacks with no frame at all (process gone before we could read its maps).
    pub unwind_failed: u64,
    /// New stacks not stored because the table was full.
    pub table_full: u64,
    pub unwind_ns_total: u64,
    pub frames_total: u64,
    pub max_depth: u64,
    /// Python frames resolved, in total (Python processes only).
    #[serde(default)]
    pub python_frames_total: u64,
    /// Allocations over their process's stack budget whose stack was taken
    /// by sampling (counted in `captured` too), and whose was not.
    #[serde(default)]
    pub sampled: u64,
    #[serde(default)]
    pub not_sampled: u64,
}

impl StackStats {
    pub fn mean_bytes(&self) -> f64 {
        if self.captured == 0 {
            0.0
        } else {
            self.bytes_copied as f64 / self.captured as f64
        }
    }
    pub fn mean_unwind_us(&self) -> f64 {
        if self.captured == 0 {
            0.0
        } else {
            self.unwind_ns_total as f64 / self.captured as f64 / 1e3
        }
    }
    pub fn mean_depth(&self) -> f64 {
        if self.captured == 0 {
            0.0
        } else {
            self.frames_total as f64 / self.captured as f64
        }
    }
}

#[derive(Default)]
pub struct Stacks {
    modules: ModuleCache,
    unwinders: rustc_hash::FxHashMap<u32, ProcessUnwinder>,
    table: HashMap<StackId, Vec<RawFrame>>,
    /// Stacks already symbolized: read from a recording, or through a file
    /// replaced on disk (see `record`).
    symbolized: HashMap<StackId, Vec<Frame>>,
    /// Each stack's owner (analysis::owners), found once.
    owners: rustc_hash::FxHashMap<StackId, String>,
    /// Owners and process unwinders let go to stay within their bounds.
    owners_evicted: u64,
    unwinders_evicted: u64,
    symbolizer: symbolize::Symbolizer,
    pub stats: StackStats,
    /// The session's stack sampling rate (beyond the budget): what sampled
    /// allocations are weighed with. 0: none were sampled.
    pub sample_bytes: u64,
    copy: policy::CopyLengths,
    /// Python frames resolved at capture, per stack (Python processes only).
    python_frames: HashMap<StackId, Vec<crate::python::code::PyFrame>>,
    python: crate::python::code::Resolver,
    /// Stacks seen before, by their unwound frames (see `known`).
    known: known::Known,
    /// Processes degraded since the last `take_degraded`.
    degraded: Vec<(u32, Reason, String)>,
}

impl Stacks {
    /// Reads a process's mappings now, while it is alive: called at its first
    /// event, so that a process that exits soon after its allocations can
    /// still be unwound.
    pub fn prepare(&mut self, pid: u32) {
        if !self.unwinders.contains_key(&pid) {
            if self.unwinders.len() >= MAX_PROCESSES {
                self.unwinders_evicted += self.unwinders.len() as u64;
                self.unwinders.clear();
                self.known.clear();
            }
            if let Some(mut u) = ProcessUnwinder::new(pid, &mut self.modules) {
                self.note_refused(pid, &mut u);
                self.unwinders.insert(pid, u);
            }
        }
    }

    /// Libraries of the process refused (over budget, late): the process is degraded for them.
    fn note_refused(&mut self, pid: u32, u: &mut ProcessUnwinder) {
        for (path, why) in u.take_refused() {
            self.degraded.push((pid, Reason::LibraryTables, format!("{path}: {why}")));
        }
    }

    /// The processes degraded since the last call (libraries over budget,
    /// interpreters' memory read past budget), and why.
    /// Whether `take_degraded` has anything (asked for every event).
    pub fn has_degraded(&self) -> bool {
        !self.degraded.is_empty() || self.python.has_degraded()
    }

    pub fn take_degraded(&mut self) -> Vec<(u32, Reason, String)> {
        let mut out = std::mem::take(&mut self.degraded);
        out.extend(self.python.take_degraded());
        out
    }

    /// What the stack tables take on the agent's heap (estimated, see
    /// `heap`): (native stacks with the symbolized frames' cache, Python
    /// frames and code caches). Libraries' unwind tables are counted apart
    /// (`unwind_table_bytes`); what blazesym keeps parsed is not counted.
    pub fn heap_bytes(&self) -> (u64, u64) {
        use crate::heap::{hash_table, string, vec};
        let table = hash_table::<StackId, Vec<RawFrame>>(self.table.capacity())
            + self.table.values().map(|v| vec::<RawFrame>(v.capacity())).sum::<u64>();
        let symbolized = hash_table::<StackId, Vec<Frame>>(self.symbolized.capacity())
            + self.symbolized.values().map(|v| vec::<Frame>(v.capacity()) + v.iter().map(Frame::string_bytes).sum::<u64>()).sum::<u64>();
        let owners = hash_table::<StackId, String>(self.owners.capacity()) + self.owners.values().map(|o| string(o)).sum::<u64>();
        let py = |f: &crate::python::code::PyFrame| string(&f.function) + string(&f.file);
        let python_frames = hash_table::<StackId, Vec<crate::python::code::PyFrame>>(self.python_frames.capacity())
            + self
                .python_frames
                .values()
                .map(|v| vec::<crate::python::code::PyFrame>(v.capacity()) + v.iter().map(py).sum::<u64>())
                .sum::<u64>();
        (table + symbolized + owners + self.known.heap_bytes() + self.symbolizer.heap_bytes(), python_frames + self.python.heap_bytes())
    }

    /// Bytes of libraries' unwind tables read for unwinding (on the heap).
    pub fn unwind_table_bytes(&self) -> u64 {
        self.modules.bytes()
    }

    /// The caches stacks keep, each with its bound and what it let go. The
    /// table of stacks itself does not evict: a stack past it is refused
    /// and counted (`StackStats::table_full`).
    pub fn caches(&self) -> Vec<crate::heap::Cache> {
        use crate::heap::Cache;
        vec![
            Cache::new("stacks", self.table.len() + self.symbolized.len(), MAX_STACKS, 0),
            self.known.cache(),
            self.symbolizer.cache(),
            Cache::new("stack_owners", self.owners.len(), MAX_STACKS, self.owners_evicted),
            Cache::new("process_unwinders", self.unwinders.len(), MAX_PROCESSES, self.unwinders_evicted),
            self.modules.cache(),
            self.python.cache(),
        ]
    }

    /// Counts an allocation event's stack sampling (see `StackStats`).
    pub fn count_sampling(&mut self, event_flags: u32) {
        match Sampling::of(event_flags) {
            Sampling::Sampled => self.stats.sampled += 1,
            Sampling::NotSampled => self.stats.not_sampled += 1,
            Sampling::Every => {}
        }
    }

    /// Unwinds one captured stack and returns its id.
    pub fn record(&mut self, rec: &StackEvent) -> Option<StackId> {
        let began = Instant::now();
        let pid = rec.event.pid;
        let stack = rec.stack();
        let len = stack.len();
        self.stats.captured += 1;
        self.stats.bytes_copied += len as u64;
        self.prepare(pid);
        let frames = match self.unwinders.get_mut(&pid) {
            Some(u) => {
                if u.has_late() {
                    u.add_modules(&mut self.modules);
                }
                let mut unwound = u.unwind(rec.ip, rec.sp, rec.bp, stack, MAX_FRAMES);
                if unwound.unknown && u.refresh(&mut self.modules).is_some() {
                    // A library loaded since we read the maps (dlopen); the
                    // stacks known hold the old mappings' modules by address.
                    self.known.forget(pid);
                    unwound = u.unwind(rec.ip, rec.sp, rec.bp, stack, MAX_FRAMES);
                }
                if !unwound.frames.is_empty() {
                    self.copy.learn(pid, len, &unwound);
                }
                for (path, why) in u.take_refused() {
                    self.degraded.push((pid, Reason::LibraryTables, format!("{path}: {why}")));
                }
                unwound.frames
            }
            None => Vec::new(),
        };
        self.stats.unwind_ns_total += began.elapsed().as_nanos() as u64;
        if frames.is_empty() {
            self.stats.unwind_failed += 1;
            return None;
        }
        self.stats.frames_total += frames.len() as u64;
        self.stats.max_depth = self.stats.max_depth.max(frames.len() as u64);
        let python = (rec.py_frames > 0).then(|| self.python.generation(pid));
        let key = self.known.key(&frames, rec.python_frames());
        if let Some(seen) = self.known.get(pid, key, python.flatten()) {
            self.stats.python_frames_total += seen.python_frames as u64;
            return Some(seen.id);
        }
        // Resolved now: the interpreter's code objects are read while it runs.
        let (py, generation) = match python {
            Some(_) => {
                let r = self.python.resolve(pid, rec.python_frames());
                (r.frames, r.generation)
            }
            None => (Vec::new(), None),
        };
        self.stats.python_frames_total += py.len() as u64;
        let id = stack_id(&frames, &py);
        if !self.table.contains_key(&id) && !self.symbolized.contains_key(&id) {
            if self.table.len() + self.symbolized.len() >= MAX_STACKS {
                self.stats.table_full += 1;
                return None;
            }
            if frames.iter().any(|f| f.module.deleted) {
                // A file replaced on disk opens only while the process lives:
                // symbolized now rather than when a report asks.
                let frames = frames.iter().map(|f| self.symbolizer.frame(f)).collect();
                self.symbolized.insert(id, frames);
            } else {
                self.table.insert(id, frames);
            }
            self.stats.unique += 1;
        }
        // Final only where every Python frame was resolved for good.
        if python.is_none() || generation.is_some() {
            self.known.insert(pid, key, id, py.len(), generation);
        }
        if !py.is_empty() {
            self.python_frames.entry(id).or_insert(py);
        }
        Some(id)
    }

    /// Forgets a process's unwind state (it exited).
    pub fn forget_process(&mut self, pid: u32) {
        self.unwinders.remove(&pid);
        self.known.forget(pid);
        self.python.forget(pid);
        self.copy.forget(pid);
    }

    /// Lets the symbolizer's parsed files go once idle (see
    /// `symbolize::IDLE_RELEASE`); a maintenance tick calls it. True if it did.
    pub fn release_idle(&mut self) -> bool {
        self.symbolizer.release_if_idle()
    }

    /// A Python process's interpreter, so that its stacks' Python frames resolve.
    pub fn add_interpreter(&mut self, interp: crate::python::Interpreter) {
        self.python.add(interp);
    }

    /// Stack copy lengths learned since the last call, for the kernel.
    pub fn take_copy_updates(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.copy.updates)
    }

    /// The module (or Python file) that asked the driver through this stack
    /// (see analysis::owners), found once per stack.
    pub fn owner(&mut self, id: StackId, find: impl FnOnce(&[Frame]) -> String) -> String {
        if let Some(o) = self.owners.get(&id) {
            return o.clone();
        }
        if self.owners.len() >= MAX_STACKS {
            // Stacks come and go with processes: the cache is bounded as the table is.
            self.owners_evicted += self.owners.len() as u64;
            self.owners.clear();
        }
        let o = find(&self.module_frames(id));
        self.owners.insert(id, o.clone());
        o
    }

    /// A stack's frames as far as an owner needs them: native frames'
    /// modules and the Python frames, without symbolizing (an owner is a
    /// module, and symbolizing every stack would keep every library's DWARF
    /// in the agent's memory).
    fn module_frames(&self, id: StackId) -> Vec<Frame> {
        let natives = match (self.symbolized.get(&id), self.table.get(&id)) {
            (Some(frames), _) => frames.clone(),
            (None, Some(raw)) => raw.iter().map(Frame::unsymbolized).collect(),
            (None, None) => return Vec::new(),
        };
        self.with_python(id, natives)
    }

    /// A stack's native frames with its Python frames in the place of the
    /// `_PyEval_EvalFrameDefault` frames that ran them.
    fn with_python(&self, id: StackId, natives: Vec<Frame>) -> Vec<Frame> {
        match self.python_frames.get(&id) {
            Some(py) => python::interleave(natives, py),
            None => natives,
        }
    }

    /// A stack from a recording, symbolized when it was recorded.
    pub fn insert_symbolized(&mut self, id: StackId, frames: Vec<Frame>) {
        self.symbolized.insert(id, frames);
    }

    /// The symbolized frames of a stack, innermost first.
    /// Python frames take the place of the `_PyEval_EvalFrameDefault`
    /// native frames that ran them.
    pub fn frames(&mut self, id: StackId) -> Vec<Frame> {
        let natives = if let Some(frames) = self.symbolized.get(&id) {
            frames.clone()
        } else {
            let Some(raw) = self.table.get(&id) else { return Vec::new() };
            raw.iter().map(|f| self.symbolizer.frame(f)).collect()
        };
        self.with_python(id, natives)
    }
}

/// A stack's id: its frames' files and offsets and its Python frames, hashed
/// (the same in every run: recordings and the kernel's live table keep ids).
fn stack_id(frames: &[RawFrame], py: &[crate::python::code::PyFrame]) -> StackId {
    let mut h = DefaultHasher::new();
    for f in frames {
        f.module.path.hash(&mut h);
        f.module.file.hash(&mut h);
        f.file_offset.hash(&mut h);
    }
    py.hash(&mut h);
    h.finish()
}
