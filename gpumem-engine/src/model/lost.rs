//! Loss accounting: every event that did not reach the agent, by cause,
//! and the kernel tables that ran out of room.
use std::collections::BTreeMap;

use gpumem_common::counters::{Exit, Stat};
use serde::{Deserialize, Serialize};

/// Every event that did not reach the agent, by cause.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LostEvents {
    /// Ring buffer full in the kernel.
    pub ringbuf_full: u64,
    /// In-flight call table full: the return could not be decoded.
    pub pending_full: u64,
    /// A return without its entry (probe attached while the call was running).
    pub return_without_entry: u64,
    /// Record too short to decode.
    pub malformed: u64,
    /// Ring-buffer and call-table losses per process (the kernel's LOST_BY_PID):
    /// those processes' figures are uncertain.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_pid: BTreeMap<u32, u64>,
}

impl LostEvents {
    pub fn total(&self) -> u64 {
        self.ringbuf_full + self.pending_full + self.return_without_entry + self.malformed
    }
}

/// Kernel tables that were full: nothing was lost from the event stream,
/// but something was not followed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TablesFull {
    /// Traced-process table (TRACKED_MAX) full: exits of some processes may be missed.
    pub tracked_processes: u64,
    /// Pid filter (FILTER_MAX) full: children of a `-c` command or NVIDIA
    /// descriptors were not followed.
    pub pid_filter: u64,
    /// The kernel's table of live entries (`serve`'s pinned state) full: a
    /// restarted agent will not know of these entries.
    #[serde(default)]
    pub kernel_table: u64,
}

/// Allocation events that arrived without their stack: their accounting is
/// whole, only the call site is missing.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StacksDropped {
    /// The kernel's stack ring was full (or a preempting probe took the
    /// per-CPU scratch).
    pub ring_full: u64,
    /// Flagged with a stack the reader did not find in the stack ring.
    pub unmatched: u64,
}

impl StacksDropped {
    pub fn total(&self) -> u64 {
        self.ring_full + self.unmatched
    }
}

/// What the event reader itself counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderCounts {
    /// Records too short to decode.
    pub malformed: u64,
    /// Events whose stack was not in the stack ring.
    pub stacks_unmatched: u64,
}

/// Why the eBPF programs ended early, by reason (`Exit`'s names): what they
/// did not do, and why (most are the programs doing their job: a process
/// not traced, an ioctl that is not NVIDIA's).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProbeExits(pub BTreeMap<String, u64>);

impl ProbeExits {
    /// From the kernel's EXITS array (summed over CPUs), the reasons seen.
    pub fn from_counts(counts: &[u64; Exit::COUNT as usize]) -> Self {
        ProbeExits(Exit::ALL.iter().zip(counts).filter(|(_, &n)| n > 0).map(|(e, &n)| (e.name().to_string(), n)).collect())
    }

    /// The exits that say something went wrong (a read that failed, a full table).
    pub fn failures(&self) -> impl Iterator<Item = (&str, u64)> {
        let failed = |name: &str| Exit::ALL.iter().any(|e| e.name() == name && e.is_failure());
        self.0.iter().filter(move |(k, _)| failed(k)).map(|(k, &n)| (k.as_str(), n))
    }
}

/// What the kernel side counted, as the agent last read it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelCounters {
    pub lost: LostEvents,
    #[serde(default)]
    pub tables_full: TablesFull,
    #[serde(default)]
    pub stacks_dropped: StacksDropped,
    #[serde(default)]
    pub exits: ProbeExits,
}

impl KernelCounters {
    /// From the kernel's STATS array (summed over CPUs) and the reader's own counts.
    pub fn from_stats(
        kernel: &[u64; Stat::COUNT as usize],
        exits: &[u64; Exit::COUNT as usize],
        reader: ReaderCounts,
        by_pid: BTreeMap<u32, u64>,
    ) -> Self {
        KernelCounters {
            lost: LostEvents {
                ringbuf_full: kernel[Stat::RingbufFull.index()],
                pending_full: kernel[Stat::PendingFull.index()],
                return_without_entry: kernel[Stat::ReturnWithoutEntry.index()],
                malformed: reader.malformed,
                by_pid,
            },
            tables_full: TablesFull {
                tracked_processes: kernel[Stat::TrackedFull.index()],
                pid_filter: kernel[Stat::FilterFull.index()],
                kernel_table: kernel[Stat::KernelTableFull.index()],
            },
            stacks_dropped: StacksDropped { ring_full: kernel[Stat::StacksDropped.index()], unmatched: reader.stacks_unmatched },
            exits: ProbeExits::from_counts(exits),
        }
    }

    /// These counters with the reader's own counts brought up to date (they
    /// need no kernel read).
    pub fn with_reader(&self, reader: ReaderCounts) -> Self {
        let mut k = self.clone();
        k.lost.malformed = reader.malformed;
        k.stacks_dropped.unmatched = reader.stacks_unmatched;
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_counter_lands_somewhere() {
        let mut stats = [0u64; Stat::COUNT as usize];
        for (i, s) in stats.iter_mut().enumerate() {
            *s = 10 + i as u64;
        }
        let reader = ReaderCounts { malformed: 7, stacks_unmatched: 2 };
        let mut exits = [0u64; Exit::COUNT as usize];
        exits[Exit::NotTraced.index()] = 5;
        exits[Exit::UserUnreadable.index()] = 2;
        let k = KernelCounters::from_stats(&stats, &exits, reader, BTreeMap::from([(42, 3)]));
        assert_eq!((k.lost.ringbuf_full, k.lost.pending_full, k.lost.return_without_entry, k.lost.malformed), (10, 11, 12, 7));
        assert_eq!((k.tables_full.tracked_processes, k.tables_full.pid_filter), (13, 14));
        assert_eq!(k.stacks_dropped, StacksDropped { ring_full: 15, unmatched: 2 });
        assert_eq!(k.tables_full.kernel_table, 16);
        assert_eq!(k.lost.total(), 40, "dropped stacks are not lost events");
        assert_eq!(Stat::COUNT, 7, "a new kernel counter must be surfaced here");
        assert_eq!(k.exits.0, BTreeMap::from([("not_traced".to_string(), 5), ("user_unreadable".to_string(), 2)]), "exits seen, by name");
        assert_eq!(k.exits.failures().collect::<Vec<_>>(), [("user_unreadable", 2)]);
        let later = k.with_reader(ReaderCounts { malformed: 8, stacks_unmatched: 3 });
        assert_eq!((later.lost.malformed, later.stacks_dropped.unmatched, later.stacks_dropped.ring_full), (8, 3, 15));
    }
}
