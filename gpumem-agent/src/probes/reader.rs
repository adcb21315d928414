//! The kernel's two rings read without blocking the runtime: each event
//! record decoded (gpumem_engine::events) and handed over with its stack,
//! and what could not be read counted.

use std::collections::HashMap;

use aya::maps::{MapData, RingBuf};
use gpumem_common::{flags, Event, StackEvent};
use gpumem_engine::{
    events::{decode_event, decode_stack, stack_buffer, stack_key, StackKey},
    model::lost::ReaderCounts,
};
use tokio::io::unix::AsyncFd;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    /// The stack ring: read when an event says its stack is there.
    stacks: RingBuf<MapData>,
    /// Records below the wakeup threshold do not wake us: drain on a timer too.
    poll: tokio::time::Interval,
    /// Records shorter than what they must hold (ABI mismatch): counted, never misread.
    pub malformed: u64,
    /// Events flagged with a stack that was not in the stack ring: they go
    /// on without it (counted with the kernel's dropped stacks).
    pub stacks_unmatched: u64,
    /// Stacks read ahead of their events (other CPUs commit to the two rings
    /// in a different order), by thread and timestamp.
    ahead: HashMap<StackKey, Vec<u8>>,
    /// Reused buffer for the stack handed over with an event.
    stack_buf: Box<StackEvent>,
}

/// Stacks kept while their events are not read yet; a stack beyond it can
/// only be an orphan (its event is committed after it), and is dropped.
const MAX_AHEAD: usize = 4096;

/// A decoded record: every event, and for allocations the caller's stack.
/// Returns whether to go on: records not taken stay in the ring.
pub type Handler<'a> = dyn FnMut(&Event, Option<&StackEvent>) -> bool + 'a;

impl EventReader {
    pub fn new(ring: RingBuf<MapData>, stacks: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd and lives inside the AsyncFd,
        // so the fd stays open and unchanged for the AsyncFd's lifetime.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
        let mut poll = tokio::time::interval(std::time::Duration::from_millis(gpumem_common::POLL_MS));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(EventReader { ring, stacks, poll, malformed: 0, stacks_unmatched: 0, ahead: HashMap::new(), stack_buf: stack_buffer() })
    }

    /// Waits until records are available, or until the poll interval has
    /// passed (records submitted without a wakeup, while the ring is less than
    /// an eighth full, are taken then); take them with `drain_now`.
    pub async fn readable(&mut self) -> std::io::Result<()> {
        tokio::select! {
            guard = self.ring.readable_mut() => {
                // Cleared before draining: a record arriving during the drain is
                // either drained or signals readiness again.
                guard?.clear_ready();
            }
            _ = self.poll.tick() => {}
        }
        Ok(())
    }

    /// What the reader itself counted so far.
    pub fn counts(&self) -> ReaderCounts {
        ReaderCounts { malformed: self.malformed, stacks_unmatched: self.stacks_unmatched }
    }

    /// Hands every record available now to `f`, without waiting, until `f`
    /// says to stop; returns how many events it handed over.
    pub fn drain_now(&mut self, f: &mut Handler<'_>) -> usize {
        let mut n = 0;
        loop {
            // The record is released (consumed) here, before its stack is looked for.
            let decoded = match self.ring.get_mut().next() {
                Some(item) => decode_event(&item),
                None => break,
            };
            let Some(mut ev) = decoded else {
                self.malformed += 1;
                continue;
            };
            let go_on = if ev.flags & flags::HAS_STACK == 0 {
                f(&ev, None)
            } else if self.find_stack(ev.tid, ev.ts_ns) {
                f(&ev, Some(&self.stack_buf))
            } else {
                self.stacks_unmatched += 1;
                ev.flags &= !flags::HAS_STACK;
                f(&ev, None)
            };
            n += 1;
            if !go_on {
                break;
            }
        }
        n
    }

    /// Puts the stack of the event (tid, ts_ns) in `stack_buf`: read ahead
    /// before, or next in the stack ring (reading past, and keeping, the
    /// stacks of events not read yet). False if the ring has no such stack.
    fn find_stack(&mut self, tid: u32, ts_ns: u64) -> bool {
        if let Some(bytes) = self.ahead.remove(&(tid, ts_ns)) {
            return decode_stack(&bytes, &mut self.stack_buf).is_some();
        }
        while let Some(item) = self.stacks.next() {
            match stack_key(&item) {
                None => self.malformed += 1,
                Some(key) if key == (tid, ts_ns) => return decode_stack(&item, &mut self.stack_buf).is_some(),
                Some(key) => {
                    if self.ahead.len() >= MAX_AHEAD {
                        // Their events, when read, count as unmatched.
                        self.ahead.clear();
                    }
                    self.ahead.insert(key, item.to_vec());
                }
            }
        }
        false
    }
}
