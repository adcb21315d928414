//! Loss accounting: every event that did not reach the agent, by cause,
//! and the kernel tables that ran out of room.
use std::collections::BTreeMap;

use gpumem_common::stat;
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

/// What the kernel side counted, as the agent last read it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelCounters {
    pub lost: LostEvents,
    #[serde(default)]
    pub tables_full: TablesFull,
    #[serde(default)]
    pub stacks_dropped: StacksDropped,
}

impl KernelCounters {
    /// From the kernel's STATS array (summed over CPUs) and the reader's own counts.
    pub fn from_stats(kernel: &[u64; stat::COUNT as usize], reader: ReaderCounts, by_pid: BTreeMap<u32, u64>) -> Self {
        KernelCounters {
            lost: LostEvents {
                ringbuf_full: kernel[stat::RINGBUF_FULL as usize],
                pending_full: kernel[stat::PENDING_FULL as usize],
                return_without_entry: kernel[stat::RETURN_WITHOUT_ENTRY as usize],
                malformed: reader.malformed,
                by_pid,
            },
            tables_full: TablesFull {
                tracked_processes: kernel[stat::TRACKED_FULL as usize],
                pid_filter: kernel[stat::FILTER_FULL as usize],
                kernel_table: kernel[stat::KERNEL_TABLE_FULL as usize],
            },
            stacks_dropped: StacksDropped { ring_full: kernel[stat::STACKS_DROPPED as usize], unmatched: reader.stacks_unmatched },
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
        let mut stats = [0u64; stat::COUNT as usize];
        for (i, s) in stats.iter_mut().enumerate() {
            *s = 10 + i as u64;
        }
        let reader = ReaderCounts { malformed: 7, stacks_unmatched: 2 };
        let k = KernelCounters::from_stats(&stats, reader, BTreeMap::from([(42, 3)]));
        assert_eq!((k.lost.ringbuf_full, k.lost.pending_full, k.lost.return_without_entry, k.lost.malformed), (10, 11, 12, 7));
        assert_eq!((k.tables_full.tracked_processes, k.tables_full.pid_filter), (13, 14));
        assert_eq!(k.stacks_dropped, StacksDropped { ring_full: 15, unmatched: 2 });
        assert_eq!(k.tables_full.kernel_table, 16);
        assert_eq!(k.lost.total(), 40, "dropped stacks are not lost events");
        assert_eq!(stat::COUNT, 7, "a new kernel counter must be surfaced here");
        let later = k.with_reader(ReaderCounts { malformed: 8, stacks_unmatched: 3 });
        assert_eq!((later.lost.malformed, later.stacks_dropped.unmatched, later.stacks_dropped.ring_full), (8, 3, 15));
    }
}
