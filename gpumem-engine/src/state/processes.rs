//! The traced processes by pid: found by hash on every event (several
//! times), walked in pid order by every reader (views, summaries and
//! metrics list processes in that order).
use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::process::Process;

#[derive(Debug, Default)]
pub struct Processes {
    by_pid: FxHashMap<u32, Process>,
    /// The same pids, in order.
    order: BTreeSet<u32>,
}

impl Processes {
    pub fn get(&self, pid: &u32) -> Option<&Process> {
        self.by_pid.get(pid)
    }

    pub fn get_mut(&mut self, pid: &u32) -> Option<&mut Process> {
        self.by_pid.get_mut(pid)
    }

    pub fn contains_key(&self, pid: &u32) -> bool {
        self.by_pid.contains_key(pid)
    }

    pub fn insert(&mut self, pid: u32, p: Process) -> Option<Process> {
        self.order.insert(pid);
        self.by_pid.insert(pid, p)
    }

    pub fn remove(&mut self, pid: &u32) -> Option<Process> {
        self.order.remove(pid);
        self.by_pid.remove(pid)
    }

    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }

    pub fn clear(&mut self) {
        self.by_pid.clear();
        self.order.clear();
    }

    /// The two tables' own heap (the processes' tables are theirs, see `Process::heap_bytes`).
    pub fn heap_bytes(&self) -> u64 {
        crate::heap::hash_table::<u32, Process>(self.by_pid.capacity()) + crate::heap::btree::<u32, ()>(self.order.len())
    }

    /// Each process with its pid, in pid order.
    pub fn iter(&self) -> impl Iterator<Item = (&u32, &Process)> + '_ {
        self.order.iter().map(|pid| (pid, &self.by_pid[pid]))
    }

    /// Each process, in pid order.
    pub fn values(&self) -> impl Iterator<Item = &Process> + '_ {
        self.iter().map(|(_, p)| p)
    }

    /// Each process, to change, in no particular order.
    pub fn values_mut_unordered(&mut self) -> impl Iterator<Item = &mut Process> + '_ {
        self.by_pid.values_mut()
    }
}

impl std::ops::Index<&u32> for Processes {
    type Output = Process;

    /// The process of `pid`; panics if there is none (as a map's index does).
    fn index(&self, pid: &u32) -> &Process {
        &self.by_pid[pid]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_walked_in_pid_order_whatever_the_insertion_order() {
        let mut ps = Processes::default();
        for pid in [900, 3, 77, 12, 5000, 1] {
            ps.insert(pid, Process::new(pid));
        }
        ps.remove(&77);
        assert_eq!(ps.iter().map(|(&pid, _)| pid).collect::<Vec<_>>(), [1, 3, 12, 900, 5000]);
        assert_eq!(ps.values().map(|p| p.pid).collect::<Vec<_>>(), [1, 3, 12, 900, 5000]);
        assert_eq!(ps.len(), 5);
        assert!(ps.get(&77).is_none() && ps.contains_key(&900));
        ps.clear();
        assert!(ps.is_empty() && ps.iter().next().is_none());
    }
}
