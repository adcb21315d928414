//! What the pipeline looks up about a process: its container and pod, and
//! for an OOM kill its memory cgroup. From /proc while tracing (kept in a
//! log when recording), from the recording when replaying.
use rustc_hash::FxHashMap as HashMap;

use crate::{
    record::Lookup,
    state::container::{self, ContainerInfo},
};

pub enum Lookups {
    Live { log: Option<Vec<Lookup>> },
    Recorded { containers: HashMap<u32, ContainerInfo>, memcg: HashMap<u32, String> },
}

impl Lookups {
    /// Tracing; `recording` keeps a log of the lookups for the recording.
    pub fn live(recording: bool) -> Self {
        Lookups::Live { log: recording.then(Vec::new) }
    }

    pub fn recorded() -> Self {
        Lookups::Recorded { containers: HashMap::default(), memcg: HashMap::default() }
    }

    /// Looking at live processes (not a recording).
    pub fn is_live(&self) -> bool {
        matches!(self, Lookups::Live { .. })
    }

    pub fn container(&mut self, pid: u32) -> Option<ContainerInfo> {
        match self {
            Lookups::Live { log } => {
                let c = container::lookup(pid);
                if let (Some(log), Some(c)) = (log, &c) {
                    log.push(Lookup { pid, container: Some(c.clone()), memcg: None });
                }
                c
            }
            Lookups::Recorded { containers, .. } => containers.remove(&pid),
        }
    }

    /// `known`: the memory cgroup read while the process was alive, for when
    /// the victim is already gone (its cgroup directory is still there).
    pub fn memcg(&mut self, pid: u32, tid: u32, known: Option<&(String, String)>) -> Option<String> {
        match self {
            Lookups::Live { log } => {
                let m = container::limited_memory_cgroup(pid)
                    .or_else(|| container::limited_memory_cgroup(tid))
                    .or_else(|| known.and_then(container::limited));
                if let (Some(log), Some(m)) = (log, &m) {
                    log.push(Lookup { pid, container: None, memcg: Some(m.clone()) });
                }
                m
            }
            Lookups::Recorded { memcg, .. } => memcg.remove(&pid),
        }
    }

    /// A recorded lookup, for the events that follow it.
    pub fn add(&mut self, l: Lookup) {
        if let Lookups::Recorded { containers, memcg } = self {
            if let Some(c) = l.container {
                containers.insert(l.pid, c);
            }
            if let Some(m) = l.memcg {
                memcg.insert(l.pid, m);
            }
        }
    }

    /// The lookups made since the last call (when recording).
    pub fn take_log(&mut self) -> Vec<Lookup> {
        match self {
            Lookups::Live { log: Some(log) } => std::mem::take(log),
            _ => Vec::new(),
        }
    }
}
