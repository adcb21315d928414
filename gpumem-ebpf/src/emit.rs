//! Sending events to the agent: the one place a record is reserved in the
//! event ring, written and submitted, and its loss counted when the ring is
//! full.
use aya_ebpf::maps::ring_buf::RingBufEntry;
use gpumem_common::{
    counters::{Exit, Stat},
    Event,
};

use crate::maps::{count, lost, EVENTS};

/// Reserves a record for an event of process `tgid` (its accounting: a
/// full ring is that process's loss).
#[inline(always)]
pub fn reserve(tgid: u32) -> Result<RingBufEntry<Event>, Exit> {
    EVENTS.reserve::<Event>(0).ok_or_else(|| {
        lost(Stat::RingbufFull, tgid);
        Exit::RingFull
    })
}

/// Sends an event of the process's accounting under the ring's `flags`.
#[inline(always)]
pub fn emit(ev: &Event, flags: u64) -> Result<(), Exit> {
    let mut entry = reserve(ev.pid)?;
    entry.write(*ev);
    entry.submit(flags);
    Ok(())
}

/// Sends a signal (a discovery hint, an OOM kill's record) that no
/// process's accounting depends on: a full ring is counted in total only.
#[inline(always)]
pub fn emit_signal(ev: &Event, flags: u64) -> Result<(), Exit> {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(Stat::RingbufFull);
        return Err(Exit::RingFull);
    };
    entry.write(*ev);
    entry.submit(flags);
    Ok(())
}
