//! Stacks seen before, by what unwinding and the kernel gave: each frame's
//! mapping and file offset and the Python frames' (code object, instruction)
//! references. A stack seen again takes its id from here, skipping the
//! Python frames' resolution and the id's hash over every frame's strings:
//! a loop allocates from the same few stacks (issue 32).
use std::{
    hash::{BuildHasher as _, Hasher as _},
    sync::Arc,
};

use gpumem_common::python::PyFrameRef;
use rustc_hash::FxHashMap;

use super::{unwind::RawFrame, StackId};

/// Stacks remembered in all, at most (about 40 bytes each); past it the
/// memory starts over.
const MAX_KNOWN: usize = 65536;

/// What a stack seen before resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub id: StackId,
    /// Its Python frames (for the statistics).
    pub python_frames: u32,
    /// The generation of the process's code objects it was resolved with
    /// (None: a process whose Python frames are not resolved).
    generation: Option<u64>,
}

#[derive(Default)]
pub struct Known {
    /// By process: the key is a hash of the frames (seeded per agent, so a
    /// process cannot choose collisions), its mappings held by the
    /// process's unwinder for as long as the entry is (`forget` on refresh).
    by_pid: FxHashMap<u32, FxHashMap<u64, Seen>>,
    len: usize,
    seed: foldhash::fast::RandomState,
    /// Stacks let go to stay within `MAX_KNOWN`.
    evicted: u64,
}

impl Known {
    /// The key of an unwound stack and its Python frame references.
    /// A frame's module is taken by address: the unwinder's mappings hold
    /// it until the process's maps are read again, which forgets the process.
    pub fn key(&self, frames: &[RawFrame], python: impl Iterator<Item = PyFrameRef>) -> u64 {
        let mut h = self.seed.build_hasher();
        h.write_usize(frames.len());
        for f in frames {
            h.write_usize(Arc::as_ptr(&f.module) as usize);
            h.write_u64(f.file_offset);
        }
        for p in python {
            h.write_u64(p.code);
            h.write_u64(p.instr);
        }
        h.finish()
    }

    /// The stack's id if seen before and still valid for the process's
    /// code objects at `generation`.
    pub fn get(&self, pid: u32, key: u64, generation: Option<u64>) -> Option<Seen> {
        self.by_pid.get(&pid)?.get(&key).copied().filter(|s| s.generation == generation)
    }

    pub fn insert(&mut self, pid: u32, key: u64, id: StackId, python_frames: usize, generation: Option<u64>) {
        if self.len >= MAX_KNOWN {
            self.clear();
        }
        let seen = Seen { id, python_frames: python_frames as u32, generation };
        if self.by_pid.entry(pid).or_default().insert(key, seen).is_none() {
            self.len += 1;
        }
    }

    /// Forgets a process's stacks (it exited, or its maps were read again).
    pub fn forget(&mut self, pid: u32) {
        if let Some(m) = self.by_pid.remove(&pid) {
            self.len -= m.len();
        }
    }

    /// Lets every stack go (counted as evicted).
    pub fn clear(&mut self) {
        self.evicted += self.len as u64;
        self.by_pid.clear();
        self.len = 0;
    }

    /// The cache, as a report.
    pub fn cache(&self) -> crate::heap::Cache {
        crate::heap::Cache::new("known_stacks", self.len, MAX_KNOWN, self.evicted)
    }

    /// What it takes on the agent's heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        use crate::heap::hash_table;
        hash_table::<u32, FxHashMap<u64, Seen>>(self.by_pid.capacity())
            + self.by_pid.values().map(|m| hash_table::<u64, Seen>(m.capacity())).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::unwind::ModuleRef;

    fn frame(module: &Arc<ModuleRef>, offset: u64) -> RawFrame {
        RawFrame { module: module.clone(), file_offset: offset }
    }

    #[test]
    fn a_stack_is_known_by_its_frames_python_references_process_and_generation() {
        let m = Arc::new(ModuleRef { path: "/x".into(), open_path: "/x".into(), deleted: false, file: ("fd:01".into(), 1) });
        let mut k = Known::default();
        let frames = [frame(&m, 0x10), frame(&m, 0x20)];
        let py = [PyFrameRef { code: 0x1000, instr: 0x1010 }];
        let key = k.key(&frames, py.iter().copied());
        assert_eq!(key, k.key(&frames, py.iter().copied()), "the same frames, the same key");
        assert_ne!(key, k.key(&frames, std::iter::empty()), "Python frames are part of it");
        assert_ne!(key, k.key(&frames[..1], py.iter().copied()));
        assert_ne!(key, k.key(&[frame(&m, 0x20), frame(&m, 0x10)], py.iter().copied()), "order matters");
        let other_instr = [PyFrameRef { code: 0x1000, instr: 0x1012 }];
        assert_ne!(key, k.key(&frames, other_instr.iter().copied()));
        k.insert(7, key, 42, 1, Some(3));
        assert_eq!(k.get(7, key, Some(3)).map(|s| (s.id, s.python_frames)), Some((42, 1)));
        assert_eq!(k.get(7, key, Some(4)), None, "the code objects were read again since");
        assert_eq!(k.get(8, key, Some(3)), None, "another process");
        k.forget(7);
        assert_eq!(k.get(7, key, Some(3)), None);
        assert_eq!(k.len, 0);
    }

    #[test]
    fn it_stays_within_its_bound() {
        let mut k = Known::default();
        for i in 0..(MAX_KNOWN as u64 + 10) {
            k.insert((i % 7) as u32, i, i, 0, None);
            assert!(k.len <= MAX_KNOWN);
        }
        assert_eq!(k.len, 10, "started over once full");
        assert_eq!(k.cache().evicted, MAX_KNOWN as u64);
    }
}
