//! Events from the kernel: the ring buffer read without blocking the
//! runtime, records decoded into events, typed by kind, and every loss counted.
pub mod decode;
pub mod kind;
pub mod lost;

use aya::maps::{MapData, RingBuf};
use gpumem_common::{Event, StackEvent};
use tokio::io::unix::AsyncFd;

pub use decode::{decode, Decoded};
pub use kind::Kind;
pub use lost::{KernelCounters, LostEvents, TablesFull};

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records below the wakeup threshold do not wake us: drain on a timer too.
    poll: tokio::time::Interval,
    /// Records shorter than an Event (ABI mismatch): counted, never misread.
    pub malformed: u64,
    /// Reused buffer for records that carry a stack.
    stack_buf: Box<StackEvent>,
}

/// A decoded record: every event, and for allocations the caller's stack.
/// Returns whether to go on: records not taken stay in the ring.
pub type Handler<'a> = dyn FnMut(&Event, Option<&StackEvent>) -> bool + 'a;

impl EventReader {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd and lives inside the AsyncFd,
        // so the fd stays open and unchanged for the AsyncFd's lifetime.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
        let mut poll = tokio::time::interval(std::time::Duration::from_millis(gpumem_common::POLL_MS));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(EventReader { ring, poll, malformed: 0, stack_buf: decode::stack_buffer() })
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

    /// Hands every record available now to `f`, without waiting, until `f`
    /// says to stop; returns how many events it handed over.
    pub fn drain_now(&mut self, f: &mut Handler<'_>) -> usize {
        let (ring, buf) = (self.ring.get_mut(), &mut *self.stack_buf);
        let mut n = 0;
        while let Some(item) = ring.next() {
            let go_on = match decode(&item, buf) {
                Decoded::Malformed => {
                    self.malformed += 1;
                    continue;
                }
                Decoded::Event(ev) => f(&ev, None),
                Decoded::WithStack(ev) => f(&ev, Some(buf)),
                Decoded::StackMissing(ev) => {
                    self.malformed += 1;
                    f(&ev, None)
                }
            };
            n += 1;
            if !go_on {
                break;
            }
        }
        n
    }
}
