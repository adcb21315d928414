//! The thread states of Python processes that call CUDA, put in the
//! kernel's table (PY_THREADS) so that the walk at an allocation starts
//! from the calling thread's frame. Found (python::threads) by walking the
//! interpreter's lists in the process's memory, at registration and at
//! every refresh.
use std::collections::{BTreeMap, BTreeSet};

use gpumem_engine::{
    model::degraded::Reason,
    procfs,
    python::{threads::thread_states, Finder, Interpreter, Unwalked},
};

use super::Agent;

/// A Python process's thread list is read again for a frameless stack at
/// most this often (a thread of its own making without a thread state,
/// a C++ worker say, would otherwise have it read at every allocation).
const FRAMELESS_REFRESH: std::time::Duration = std::time::Duration::from_millis(50);

/// The Python processes known, and what the kernel was told about them.
#[derive(Default)]
pub struct Tracker {
    /// Python processes whose thread list to read again now (a stack came
    /// without Python frames: a thread started since the last read), and
    /// when each was last read so.
    stale: BTreeSet<u32>,
    last_read: BTreeMap<u32, std::time::Instant>,
    /// Processes looked at (Python or not), so each is looked at once.
    checked: BTreeSet<u32>,
    python: BTreeMap<u32, (Interpreter, Vec<(u32, u64)>)>,
    finder: Finder,
    /// Interpreters found since the last `take_found`, for the stack
    /// resolver (which reads their code objects).
    found: Vec<Interpreter>,
    /// Python processes that cannot be walked (at most UNWALKED_MAX kept).
    unwalked: BTreeMap<u32, String>,
    /// Processes refused since the last `take_degraded`.
    degraded: Vec<(u32, Reason, String)>,
}

/// Unwalkable Python processes remembered for the report.
const UNWALKED_MAX: usize = 256;

impl Tracker {
    /// Looks at a process that uses CUDA once: a Python one is registered
    /// and its threads told to the kernel.
    pub fn check(&mut self, agent: &mut Agent, pid: u32) {
        if !self.checked.insert(pid) {
            return;
        }
        // A version gpumem cannot walk (the error says which) keeps its
        // native frames, and is reported with why.
        match self.finder.find(pid) {
            Ok(Some(interp)) => {
                agent.set_python_layout(pid, &interp.layout.frames);
                self.found.push(interp.clone());
                self.python.insert(pid, (interp, Vec::new()));
                self.refresh_one(agent, pid);
            }
            Ok(None) => {}
            Err(why) if self.unwalked.len() < UNWALKED_MAX => {
                self.unwalked.insert(pid, why);
            }
            Err(_) => {}
        }
    }

    /// The Python processes whose frames cannot be walked, and why.
    pub fn unwalked(&self) -> Vec<Unwalked> {
        self.unwalked.iter().map(|(&pid, why)| Unwalked { pid, why: why.clone() }).collect()
    }

    /// A stack of this process came without Python frames.
    pub fn frameless(&mut self, pid: u32) {
        if self.python.contains_key(&pid) {
            self.stale.insert(pid);
        }
    }

    /// Reads again the thread lists of the processes that had frameless
    /// stacks (after a drain), each at most every FRAMELESS_REFRESH.
    pub fn refresh_stale(&mut self, agent: &mut Agent, now: std::time::Instant) {
        for pid in std::mem::take(&mut self.stale) {
            if self.last_read.get(&pid).is_some_and(|t| now.duration_since(*t) < FRAMELESS_REFRESH) {
                continue;
            }
            self.last_read.insert(pid, now);
            self.refresh_one(agent, pid);
        }
    }

    /// The maintenance tick: processes that made CUDA calls are looked at
    /// (those already running when the agent started), and every Python
    /// process's threads are brought up to date.
    pub fn tick(&mut self, agent: &mut Agent, cuda_processes: impl Iterator<Item = u32>) {
        for pid in cuda_processes {
            self.check(agent, pid);
        }
        self.refresh(agent);
    }

    /// Brings every Python process's threads up to date; forgets the
    /// processes that are gone.
    pub fn refresh(&mut self, agent: &mut Agent) {
        let pids: Vec<u32> = self.python.keys().copied().collect();
        for pid in pids {
            if procfs::alive(pid, None) {
                self.refresh_one(agent, pid);
            } else {
                self.forget(agent, pid);
            }
        }
        self.checked.retain(|&pid| procfs::alive(pid, None));
    }

    fn refresh_one(&mut self, agent: &mut Agent, pid: u32) {
        let Some((interp, known)) = self.python.get_mut(&pid) else { return };
        let now = match thread_states(interp) {
            Ok(now) => now,
            Err(why) => {
                // Forged or broken: walked no more, its threads forgotten
                // by the kernel (native frames only), and said.
                self.forget(agent, pid);
                if self.unwalked.len() < UNWALKED_MAX {
                    self.unwalked.insert(pid, why.clone());
                }
                self.degraded.push((pid, Reason::PythonThreads, why));
                return;
            }
        };
        let gone: Vec<u32> = known.iter().filter(|(tid, _)| !now.iter().any(|(t, _)| t == tid)).map(|&(tid, _)| tid).collect();
        agent.set_python_threads(pid, &now, &gone);
        *known = now;
    }

    fn forget(&mut self, agent: &mut Agent, pid: u32) {
        self.last_read.remove(&pid);
        if let Some((_, known)) = self.python.remove(&pid) {
            let tids: Vec<u32> = known.iter().map(|&(t, _)| t).collect();
            agent.forget_python(pid, &tids);
        }
    }

    /// The interpreters found since the last call.
    pub fn take_found(&mut self) -> Vec<Interpreter> {
        std::mem::take(&mut self.found)
    }

    /// The Python processes refused since the last call, and why.
    pub fn take_degraded(&mut self) -> Vec<(u32, Reason, String)> {
        std::mem::take(&mut self.degraded)
    }
}
