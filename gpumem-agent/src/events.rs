//! Reading the event ring buffer without blocking the runtime, decoding
//! records, and counting every event that did not arrive.

use aya::maps::{MapData, RingBuf};
use gpumem_common::{stat, Event};
use tokio::io::unix::AsyncFd;

pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records shorter than an Event (ABI mismatch): counted, never misread.
    pub malformed: u64,
}

impl EventReader {
    pub fn new(ring: RingBuf<MapData>) -> std::io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd and lives inside the AsyncFd,
        // so the fd stays open and unchanged for the AsyncFd's lifetime.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
        Ok(EventReader { ring, malformed: 0 })
    }

    /// Waits until records are available, then hands every available one to `f`.
    pub async fn read(&mut self, mut f: impl FnMut(&Event)) -> std::io::Result<usize> {
        let mut guard = self.ring.readable_mut().await?;
        let n = drain(guard.get_inner_mut(), &mut self.malformed, &mut f);
        guard.clear_ready();
        // Records may have arrived between the last read and clear_ready.
        Ok(n + drain(self.ring.get_mut(), &mut self.malformed, &mut f))
    }

    /// Hands every record available now to `f`, without waiting.
    pub fn drain_now(&mut self, mut f: impl FnMut(&Event)) -> usize {
        drain(self.ring.get_mut(), &mut self.malformed, &mut f)
    }
}

fn drain(ring: &mut RingBuf<MapData>, malformed: &mut u64, f: &mut impl FnMut(&Event)) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        match Event::from_bytes(&item) {
            Some(ev) => {
                f(&ev);
                n += 1;
            }
            None => *malformed += 1,
        }
    }
    n
}

/// Every event that did not reach the agent, by cause.
#[derive(Clone, Debug, Default, serde::Serialize, PartialEq, Eq)]
pub struct LostEvents {
    /// Ring buffer full in the kernel.
    pub ringbuf_full: u64,
    /// In-flight call table full: the return could not be decoded.
    pub pending_full: u64,
    /// A return without its entry (probe attached while the call was running).
    pub return_without_entry: u64,
    /// Record too short to decode.
    pub malformed: u64,
}

impl LostEvents {
    pub fn from_stats(kernel: &[u64; stat::COUNT as usize], malformed: u64) -> Self {
        LostEvents {
            ringbuf_full: kernel[stat::RINGBUF_FULL as usize],
            pending_full: kernel[stat::PENDING_FULL as usize],
            return_without_entry: kernel[stat::RETURN_WITHOUT_ENTRY as usize],
            malformed,
        }
    }

    pub fn total(&self) -> u64 {
        self.ringbuf_full + self.pending_full + self.return_without_entry + self.malformed
    }
}
