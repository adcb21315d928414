//! The current task as the programs see it: its ids, its name, the time.
use aya_ebpf::helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use gpumem_common::{Event, COMM_LEN};

/// The current thread and its process.
#[derive(Clone, Copy)]
pub struct Ids {
    pub pid_tgid: u64,
    /// The process (tgid).
    pub tgid: u32,
    /// The thread.
    pub tid: u32,
}

#[inline(always)]
pub fn ids() -> Ids {
    let pid_tgid = bpf_get_current_pid_tgid();
    Ids { pid_tgid, tgid: (pid_tgid >> 32) as u32, tid: pid_tgid as u32 }
}

/// CLOCK_MONOTONIC nanoseconds (the clock of every event's `ts_ns`).
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: a helper without arguments; it reads the monotonic clock.
    unsafe { bpf_ktime_get_ns() }
}

/// The current task's name (zeroes if it cannot be read).
#[inline(always)]
pub fn comm() -> [u8; COMM_LEN] {
    bpf_get_current_comm().unwrap_or([0u8; COMM_LEN])
}

/// An event of `api_id` by the current task at `ts_ns`, every other field empty.
#[inline(always)]
pub fn event(api_id: u32, ids: Ids, ts_ns: u64) -> Event {
    Event { ts_ns, pid: ids.tgid, tid: ids.tid, comm: comm(), ..Event::empty(api_id) }
}
