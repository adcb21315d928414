//! A Python process's memory as the decoders read it: the process itself
//! (/proc/PID/mem), or any bytes at an address (what fuzzing feeds them:
//! the process may have forged every pointer and size), and the budget of
//! bytes the agent reads from one process (issue 30).
use std::{cell::Cell, io, time::Instant};

use crate::procfs::ProcessMemory;

/// Memory read at addresses the process chose.
pub trait Memory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()>;

    fn u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).ok()?;
        Some(u64::from_ne_bytes(b))
    }

    fn u32(&self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b).ok()?;
        Some(u32::from_ne_bytes(b))
    }
}

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        ProcessMemory::read(self, addr, buf)
    }
}

/// Bytes standing at `base`: every address outside them is unmapped.
pub struct Image<'a> {
    pub base: u64,
    pub bytes: &'a [u8],
}

impl Memory for Image<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let unmapped = || io::Error::from_raw_os_error(libc::EFAULT);
        let start = usize::try_from(addr.checked_sub(self.base).ok_or_else(unmapped)?).map_err(|_| unmapped())?;
        let end = start.checked_add(buf.len()).ok_or_else(unmapped)?;
        buf.copy_from_slice(self.bytes.get(start..end).ok_or_else(unmapped)?);
        Ok(())
    }
}

/// Counts what is read through it (what a budget is charged).
pub struct Counted<'m, M: ?Sized> {
    pub memory: &'m M,
    pub bytes: Cell<u64>,
}

impl<'m, M: Memory + ?Sized> Counted<'m, M> {
    pub fn new(memory: &'m M) -> Self {
        Counted { memory, bytes: Cell::new(0) }
    }
}

impl<M: Memory + ?Sized> Memory for Counted<'_, M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.bytes.set(self.bytes.get() + buf.len() as u64);
        self.memory.read(addr, buf)
    }
}

/// Bytes the agent reads from one process's memory per second, sustained,
/// and at once: a real program's allocation stacks name a few hundred code
/// objects (a few hundred bytes each); a forged one can make every frame a
/// new code object with 64 KiB strings.
pub const READ_BYTES_PER_SECOND: u64 = 512 << 10;
pub const READ_BURST_BYTES: u64 = 2 << 20;

/// A token bucket of bytes for one process.
#[derive(Clone, Debug)]
pub struct ReadBudget {
    tokens: f64,
    last: Instant,
}

impl Default for ReadBudget {
    fn default() -> Self {
        ReadBudget { tokens: READ_BURST_BYTES as f64, last: Instant::now() }
    }
}

impl ReadBudget {
    /// Whether a read may start now (the bucket is not empty).
    pub fn allows(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * READ_BYTES_PER_SECOND as f64;
        self.tokens = (self.tokens + refill).min(READ_BURST_BYTES as f64);
        self.last = now;
        self.tokens > 0.0
    }

    /// Charges bytes read (a read that began within budget may overdraw it).
    pub fn charge(&mut self, bytes: u64) {
        self.tokens -= bytes as f64;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_image_reads_inside_itself_only() {
        let bytes: Vec<u8> = (0..16).collect();
        let m = Image { base: 0x1000, bytes: &bytes };
        assert_eq!(m.u32(0x1004), Some(u32::from_ne_bytes([4, 5, 6, 7])));
        assert_eq!(m.u64(0x100c), None, "runs past the end");
        assert_eq!(m.u32(0xfff), None, "below the start");
        assert_eq!(m.u64(u64::MAX - 2), None, "wraps");
        let c = Counted::new(&m);
        c.u64(0x1000);
        c.u32(0x2000);
        assert_eq!(c.bytes.get(), 12);
    }

    #[test]
    fn the_budget_refills_at_its_rate_up_to_its_burst() {
        let start = Instant::now();
        let mut b = ReadBudget { tokens: READ_BURST_BYTES as f64, last: start };
        assert!(b.allows(start));
        b.charge(READ_BURST_BYTES + 10);
        assert!(!b.allows(start), "overdrawn");
        assert!(!b.allows(start + Duration::from_micros(1)));
        assert!(b.allows(start + Duration::from_millis(10)), "refilled 10 KiB");
        assert!(b.allows(start + Duration::from_secs(3600)));
        assert_eq!(b.tokens, READ_BURST_BYTES as f64, "never past the burst");
    }
}
