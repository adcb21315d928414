//! Reading the event ring buffer without blocking the runtime, decoding
//! records, and counting every event that did not arrive.

use aya::maps::{MapData, RingBuf};
use gpumem_common::{flags, stat, Event, StackEvent, STACK_EVENT_SIZE, STACK_HEADER_SIZE};
use tokio::io::unix::AsyncFd;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records below the wakeup threshold do not wake us: drain on a timer too.
    poll: tokio::time::Interval,
    /// Records shorter than an Event (ABI mismatch): counted, never misread.
    pub malformed: u64,
    /// Reused buffer for records that carry a stack (8 KiB: not on the stack).
    stack_buf: Box<StackEvent>,
}

/// A decoded record: every event, and for allocations the caller's stack.
pub type Handler<'a> = dyn FnMut(&Event, Option<&StackEvent>) + 'a;

impl EventReader {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd and lives inside the AsyncFd,
        // so the fd stays open and unchanged for the AsyncFd's lifetime.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
        // SAFETY: StackEvent is plain old data; all zeroes is a valid value.
        let stack_buf = unsafe { Box::<StackEvent>::new_zeroed().assume_init() };
        let mut poll = tokio::time::interval(std::time::Duration::from_millis(gpumem_common::POLL_MS));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(EventReader { ring, poll, malformed: 0, stack_buf })
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

    /// Hands every record available now to `f`, without waiting.
    pub fn drain_now(&mut self, f: &mut Handler<'_>) -> usize {
        drain(self.ring.get_mut(), &mut self.malformed, &mut self.stack_buf, f)
    }
}

fn drain(ring: &mut RingBuf<MapData>, malformed: &mut u64, buf: &mut StackEvent, f: &mut Handler<'_>) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        match decode(&item, buf) {
            Decoded::Malformed => *malformed += 1,
            Decoded::Event(ev) => {
                n += 1;
                f(&ev, None);
            }
            Decoded::WithStack(ev) => {
                n += 1;
                f(&ev, Some(buf));
            }
            Decoded::StackMissing(ev) => {
                n += 1;
                *malformed += 1;
                f(&ev, None);
            }
        }
    }
    n
}

/// One ring-buffer record, decoded.
#[derive(Debug)]
pub enum Decoded {
    /// Shorter than an Event (an ABI mismatch): nothing can be read from it.
    Malformed,
    Event(Event),
    /// An event whose stack was copied into the caller's buffer.
    WithStack(Event),
    /// An event flagged with a stack whose record is too short to hold one.
    StackMissing(Event),
}

/// Decodes one record; a stack goes into `buf` (only the bytes the record
/// holds, its length clamped to them). Any bytes are accepted.
pub fn decode(item: &[u8], buf: &mut StackEvent) -> Decoded {
    let Some(ev) = Event::from_bytes(item) else { return Decoded::Malformed };
    if ev.flags & flags::HAS_STACK == 0 {
        return Decoded::Event(ev);
    }
    if item.len() < STACK_HEADER_SIZE {
        return Decoded::StackMissing(ev);
    }
    // Header plus only the stack bytes that were copied.
    let n = item.len().min(STACK_EVENT_SIZE);
    // SAFETY: n fits both the record and the buffer; StackEvent is plain old data.
    unsafe { std::ptr::copy_nonoverlapping(item.as_ptr(), (buf as *mut StackEvent).cast::<u8>(), n) };
    buf.len = buf.len.min((n - STACK_HEADER_SIZE) as u32);
    Decoded::WithStack(ev)
}

/// Every event that did not reach the agent, by cause.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
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
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub by_pid: std::collections::BTreeMap<u32, u64>,
}

impl LostEvents {
    pub fn from_stats(kernel: &[u64; stat::COUNT as usize], malformed: u64) -> Self {
        LostEvents {
            ringbuf_full: kernel[stat::RINGBUF_FULL as usize],
            pending_full: kernel[stat::PENDING_FULL as usize],
            return_without_entry: kernel[stat::RETURN_WITHOUT_ENTRY as usize],
            malformed,
            by_pid: Default::default(),
        }
    }

    pub fn total(&self) -> u64 {
        self.ringbuf_full + self.pending_full + self.return_without_entry + self.malformed
    }
}
