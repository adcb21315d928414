//! Processes the agent serves less than exactly, and why: what a process
//! shapes (its cgroup's name, its libraries, its interpreter's memory) was
//! forged, broken or over the agent's budget for one process, so the agent
//! does less for that process — and says so — while every other process
//! stays exact (issue 30). Named in `status`, counted in
//! `gpumem_degraded_total{reason}`.
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Its /proc/PID/cgroup has lines this kernel does not write (a cgroup
    /// named with a newline can forge another container's line).
    ForgedCgroup,
    /// Its interpreter's thread lists loop or go on past the agent's
    /// budget (python::threads::MAX_THREAD_STATES).
    PythonThreads,
    /// Its frames asked more of its memory per second than the agent
    /// reads from one process (python::memory::READ_BYTES_PER_SECOND).
    PythonReads,
    /// A library it maps has symbol or unwind tables past the agent's
    /// budget for one file, or took longer than the deadline to read
    /// (formats::budget).
    LibraryTables,
    /// It maps a libcuda copy past the copies the agent attaches for one
    /// tenant (mount namespace and user) or in all (probes::libcuda).
    LibcudaCopies,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::ForgedCgroup => "forged_cgroup",
            Reason::PythonThreads => "python_threads",
            Reason::PythonReads => "python_reads",
            Reason::LibraryTables => "library_tables",
            Reason::LibcudaCopies => "libcuda_copies",
        }
    }

    /// What the agent does less for the process.
    pub fn consequence(self) -> &'static str {
        match self {
            Reason::ForgedCgroup => "no container or pod is attributed to it",
            Reason::PythonThreads => "its stacks keep their native frames only (no Python frames)",
            Reason::PythonReads => "Python frames not read yet show as `?` until its budget refills",
            Reason::LibraryTables => "that library is not attached to (libcuda) or its frames end the unwind (others)",
            Reason::LibcudaCopies => "its calls through that copy are not traced",
        }
    }
}

/// One degraded process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Degraded {
    pub pid: u32,
    pub reason: Reason,
    /// What was wrong, in words (the process's own text escaped by whoever prints it).
    pub detail: String,
    pub consequence: String,
}

/// Processes named at most (the most recent); the counts cover all.
pub const LISTED_MAX: usize = 64;

#[derive(Clone, Debug, Default)]
pub struct Degradations {
    /// Processes degraded, by reason, since start.
    pub totals: BTreeMap<Reason, u64>,
    /// The most recent, each (pid, reason) once.
    pub recent: VecDeque<Degraded>,
}

impl Degradations {
    /// Counts a process degraded for `reason`, once per (pid, reason) while listed.
    pub fn add(&mut self, pid: u32, reason: Reason, detail: String) {
        if self.recent.iter().any(|d| d.pid == pid && d.reason == reason) {
            return;
        }
        *self.totals.entry(reason).or_default() += 1;
        if self.recent.len() >= LISTED_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(Degraded { pid, reason, detail, consequence: reason.consequence().to_string() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_process_counted_once_per_reason_and_the_list_bounded() {
        let mut d = Degradations::default();
        d.add(7, Reason::ForgedCgroup, "x".into());
        d.add(7, Reason::ForgedCgroup, "x".into());
        assert_eq!(d.totals[&Reason::ForgedCgroup], 1);
        for pid in 0..(LISTED_MAX as u32 + 10) {
            d.add(1000 + pid, Reason::ForgedCgroup, String::new());
        }
        assert_eq!(d.recent.len(), LISTED_MAX);
        assert_eq!(d.totals[&Reason::ForgedCgroup], LISTED_MAX as u64 + 11);
    }
}
