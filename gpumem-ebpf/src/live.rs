//! The kernel's own table of what each process holds (`gpumem_common::live`):
//! updated at every successful call's return, before its event is sent, so
//! that it is right whether or not an agent reads the ring.
use aya_ebpf::{macros::map, maps::HashMap};
use gpumem_common::{
    counters::Stat,
    flags,
    live::{self, LiveEntry, LiveKey},
    Event,
};

use crate::maps::count;

/// (process, kind, id) → the call that made it live. Entries are allocated
/// as they are used; the agent sizes it (`serve --kernel-table-entries`).
#[map]
pub static LIVE: HashMap<LiveKey, LiveEntry> = HashMap::with_max_entries(live::MAX_DEFAULT, BPF_F_NO_PREALLOC);

/// Entries of each process that did not fit in LIVE: an agent that adopts
/// the table marks those processes uncertain.
#[map]
pub static LIVE_MISSED: HashMap<u32, u64> = HashMap::with_max_entries(live::MISSED_PIDS_MAX, BPF_F_NO_PREALLOC);

const BPF_F_NO_PREALLOC: u32 = 1;

/// Set by the agent at load time: 1 when it keeps the table (`serve`).
#[no_mangle]
pub static KEEP_LIVE: u32 = 0;

/// Records a successful call's effect on the table; flags the event when
/// its entry did not fit.
#[inline(always)]
pub fn record(ev: &mut Event) {
    // SAFETY: read of a load-time constant (see maps::filter_mode).
    if unsafe { core::ptr::read_volatile(&KEEP_LIVE) } == 0 {
        return;
    }
    let Some((kind, id, add)) = live::effect(ev) else { return };
    let key = LiveKey { tgid: ev.pid, kind, id };
    if live::is_counted(ev.api) {
        if let Some(e) = LIVE.get_ptr_mut(&key) {
            // SAFETY: a value of this map. Not atomic (the BPF target has no
            // fetch-and-add in core): two threads of a process retaining its
            // primary context at the same instant (at start-up) may count
            // one retain less.
            let count = unsafe { &mut (*e).event.aux };
            if add {
                *count += 1;
            } else if *count <= 1 {
                let _ = LIVE.remove(&key);
            } else {
                *count -= 1;
            }
            return;
        }
        if !add {
            return;
        }
    }
    if !add {
        let _ = LIVE.remove(&key);
        return;
    }
    let mut entry = LiveEntry { event: *ev, stack: 0 };
    if live::is_counted(ev.api) {
        entry.event.aux = 1;
    }
    if LIVE.insert(&key, &entry, 0).is_err() {
        count(Stat::KernelTableFull);
        ev.flags |= flags::NOT_IN_KERNEL_TABLE;
        match LIVE_MISSED.get_ptr_mut(&ev.pid) {
            // SAFETY: a value of this map; a lost update under a race only
            // undercounts a process that is marked uncertain either way.
            Some(n) => unsafe { *n += 1 },
            None => {
                let _ = LIVE_MISSED.insert(&ev.pid, &1, 0);
            }
        }
    }
}
