//! Reads of the traced process's memory (`bpf_probe_read_user`), the one
//! place eBPF code touches user memory: a read that fails is said (a flag,
//! an error), never a silent zero taken as a value.
use aya_ebpf::helpers::bpf_probe_read_user;
use gpumem_common::{
    counters::Exit,
    flags,
    ipc::{self, HANDLE_BYTES},
    Event,
};

/// A `T` at `addr` in the traced process.
#[inline(always)]
pub fn read<T>(addr: u64) -> Result<T, Exit> {
    // SAFETY: bpf_probe_read_user validates the user address; T is plain
    // data the caller reads fields of.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|_| Exit::UserUnreadable)
}

/// Reads a value the call wrote through an out-pointer; a failed read
/// flags the event (`OUT_READ_FAILED`) and gives 0.
#[inline(always)]
pub fn read_out(ptr: u64, ev: &mut Event) -> u64 {
    if ptr == 0 {
        return 0;
    }
    match read::<u64>(ptr) {
        Ok(v) => v,
        Err(_) => {
            ev.flags |= flags::OUT_READ_FAILED;
            0
        }
    }
}

/// The key of the handle bytes at `addr` (0 where they cannot be read: the
/// import is then said to come from an unknown exporter).
#[inline(always)]
pub fn key_at(addr: u64) -> u64 {
    if addr == 0 {
        return 0;
    }
    read::<[u64; HANDLE_BYTES / 8]>(addr).map(|w| ipc::key(&w)).unwrap_or(0)
}
