//! Maps and load-time globals shared by every probe family.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
pub use gpumem_common::PendingKey;
use gpumem_common::{
    counters::{Exit, Stat},
    StackBudget, FILTER_MAX, LOST_PIDS_MAX, PENDING_MAX, RINGBUF_BYTES, STACK_BUDGET_PIDS, STACK_RING_BYTES, TRACKED_MAX,
};

/// Every event to userspace: accounting only, small fixed-size records.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(RINGBUF_BYTES, 0);

/// Allocation stacks, apart from the accounting so that a storm of stacks
/// cannot crowd accounting out: when this ring is full, events go without
/// their stacks. Never wakes the agent: it reads a stack when it reads the
/// event that names it.
#[map]
pub static STACKS: RingBuf = RingBuf::with_byte_size(STACK_RING_BYTES, 0);

/// What the kernel side could not do (indexed by `Stat`).
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Stat::COUNT, 0);

/// Why programs ended early (indexed by `Exit`).
#[map]
pub static EXITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Exit::COUNT, 0);

/// Events of each process that never reached the agent (ring buffer or
/// in-flight table full): the agent marks those processes' accounting uncertain.
#[map]
pub static LOST_BY_PID: PerCpuHashMap<u32, u64> = PerCpuHashMap::with_max_entries(LOST_PIDS_MAX, 0);

/// Each process's stack budget (a token bucket); least recently used
/// processes make room for new ones.
#[map]
pub static STACK_BUDGET: LruHashMap<u32, StackBudget> = LruHashMap::with_max_entries(STACK_BUDGET_PIDS, 0);

/// Bytes of stack to copy for a process, learned by the agent from its
/// unwinds (absent: all of STACK_BYTES); least recently used go first.
#[map]
pub static STACK_COPY_BYTES: LruHashMap<u32, u32> = LruHashMap::with_max_entries(STACK_BUDGET_PIDS, 0);

/// The CPython thread state of each Python thread (by pid_tgid), found by
/// the agent in the process's memory.
#[map]
pub static PY_THREADS: HashMap<u64, u64> = HashMap::with_max_entries(gpumem_common::python::PY_THREADS_MAX, BPF_F_NO_PREALLOC);

/// Where the Python version of each Python process keeps its frames.
#[map]
pub static PY_LAYOUTS: HashMap<u32, gpumem_common::python::PyLayout> = HashMap::with_max_entries(STACK_BUDGET_PIDS, 0);

/// PyTorch's probe sites: each one's probe and argument specs, by the index
/// the agent gave the site as its attach cookie.
#[map]
pub static USDT_SPECS: Array<gpumem_common::usdt::UsdtSpec> = Array::with_max_entries(gpumem_common::usdt::SPECS_MAX, 0);

/// Per-CPU scratch for building a record with a stack (too big for the BPF stack).
#[map]
pub static STACK_SCRATCH: PerCpuArray<gpumem_common::StackEvent> = PerCpuArray::with_max_entries(1, 0);

/// Calls in flight: arguments saved at entry, keyed by thread and API.
#[map]
pub static PENDING: HashMap<PendingKey, Pending> = HashMap::with_max_entries(PENDING_MAX, 0);

/// Processes that made a traced call, so that their exit is reported.
#[map]
pub static TRACKED: HashMap<u32, u32> = HashMap::with_max_entries(TRACKED_MAX, 0);

/// With `FILTER_MODE == filter::PIDS`: the tgids to trace (value: FOLLOW_CHILDREN or 0).
#[map]
pub static FILTER_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(FILTER_MAX, 0);

/// Set by the agent at load time (`EbpfLoader::set_global`).
#[no_mangle]
pub static FILTER_MODE: u32 = 0;

/// Ring-buffer fill (bytes) at which a record wakes the agent; below it
/// records are submitted without a wakeup and the agent polls (every
/// `gpumem_common::POLL_MS`). A wakeup is an irq_work in the traced thread's
/// call path (an IPI: a VM exit on virtual machines); without this policy the
/// kernel wakes the reader for nearly every record, since a fast reader has
/// always caught up. 0: the kernel's default (wake when the reader caught up).
#[no_mangle]
pub static WAKEUP_BYTES: u64 = 0;

/// Hash maps filled by the agent only: no memory until used.
const BPF_F_NO_PREALLOC: u32 = 1;

pub const BPF_RB_NO_WAKEUP: u64 = 1;
pub const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Flags for submitting a record to EVENTS under the wakeup policy above.
#[inline(always)]
pub fn submit_flags() -> u64 {
    // SAFETY: read of a load-time constant (see filter_mode).
    let threshold = unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) };
    if threshold == 0 {
        0
    } else if EVENTS.query(BPF_RB_AVAIL_DATA) >= threshold {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Stacks per second each process may have copied in full (0: no budget,
/// every stack); beyond it, byte-weighted sampling (`STACK_SAMPLE_BYTES`).
#[no_mangle]
pub static STACK_BUDGET_PER_S: u64 = 0;

/// Mean bytes between sampled stacks beyond the budget (see
/// `gpumem_common::sampling`).
#[no_mangle]
pub static STACK_SAMPLE_BYTES: u64 = 0;

/// Stacks a process's budget holds at most, and starts with (0: one
/// second's worth): what a new or long-idle hot process takes at once.
#[no_mangle]
pub static STACK_BURST: u64 = 0;

#[inline(always)]
pub fn load_time_u64(v: &u64) -> u64 {
    // SAFETY: read of a load-time constant (see filter_mode).
    unsafe { core::ptr::read_volatile(v) }
}

/// 1: allocations carry the caller's stack; 0 (`--stacks off`): they do not.
#[no_mangle]
pub static CAPTURE_STACKS: u32 = 1;

#[inline(always)]
pub fn capture_stacks() -> bool {
    // SAFETY: read of a load-time constant (see filter_mode).
    unsafe { core::ptr::read_volatile(&CAPTURE_STACKS) != 0 }
}

/// Offset of `child_pid` in the sched_process_fork record, read by the agent
/// from tracefs so that a layout change cannot silently misread it.
#[no_mangle]
pub static FORK_CHILD_PID_OFFSET: u32 = 44;

/// Offsets of oom:mark_victim fields on this kernel (see `gpumem_common::oom_field`).
#[no_mangle]
pub static OOM_OFFSETS: [u32; gpumem_common::oom_field::COUNT] = [gpumem_common::oom_field::FIELD_ABSENT; gpumem_common::oom_field::COUNT];

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    pub ts_ns: u64,
    pub args: [u64; 6],
    /// Read at entry where the call's input is behind a pointer (cuMemCreate).
    pub device: i32,
    pub _pad: u32,
    /// Read at entry: the key of the handle bytes an importer passes (share.rs).
    pub key: u64,
}
const _: () = assert!(core::mem::size_of::<Pending>() == gpumem_common::PENDING_VALUE_WORDS * 8);

#[inline(always)]
fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = map.get_ptr_mut(index) {
        // SAFETY: this CPU's slot; no other writer runs on this CPU meanwhile
        // (the agent sums the CPUs' slots).
        unsafe { *slot += 1 };
    }
}

/// Something the kernel side could not do.
#[inline(always)]
pub fn count(stat: Stat) {
    bump(&STATS, stat as u32);
}

/// A program's outcome: its value, or its early exit counted by reason
/// (the aya-template idiom: bodies use `?`, nothing leaves uncounted).
#[inline(always)]
pub fn done(r: Result<u32, Exit>) -> u32 {
    match r {
        Ok(v) => v,
        Err(why) => {
            bump(&EXITS, why as u32);
            0
        }
    }
}

/// A step that ended early inside a program that goes on (a helper's walk).
#[inline(always)]
pub fn exited(why: Exit) {
    bump(&EXITS, why as u32);
}

/// An event of process `tgid` is lost (`stat_index`: why): counted in total
/// and for the process.
#[inline(always)]
pub fn lost(stat: Stat, tgid: u32) {
    count(stat);
    // Per-CPU values: no two CPUs write one slot (the agent sums them).
    match LOST_BY_PID.get_ptr_mut(&tgid) {
        // SAFETY: this CPU's slot of a value of this map.
        Some(n) => unsafe { *n += 1 },
        None => {
            let _ = LOST_BY_PID.insert(&tgid, &1, 0);
        }
    }
}

#[inline(always)]
pub fn filter_mode() -> u32 {
    // SAFETY: read of a load-time constant; volatile so the compiler keeps
    // the load that the agent's set_global patches.
    unsafe { core::ptr::read_volatile(&FILTER_MODE) }
}

/// Whether events of this process are wanted.
#[inline(always)]
pub fn should_trace(tgid: u32) -> bool {
    if filter_mode() == gpumem_common::filter::ALL {
        return true;
    }
    // SAFETY: plain lookup; the value is copied out immediately.
    unsafe { FILTER_PIDS.get(&tgid).is_some() }
}

/// Remembers that a process made a traced call, so that its exit is reported.
/// True the first time: that record wakes the agent at once (not at its next
/// poll), so that it looks the process up in /proc (container, memory
/// cgroup) while the process is alive, even one that dies milliseconds later.
#[inline(always)]
pub fn track(tgid: u32) -> bool {
    // SAFETY: plain lookup. Insert only when new: an update on every call costs.
    if unsafe { TRACKED.get(&tgid) }.is_some() {
        return false;
    }
    if TRACKED.insert(&tgid, &1, 0).is_err() {
        count(Stat::TrackedFull);
    }
    true
}

/// Flags for a process's record: a wakeup now for its first, else the policy above.
#[inline(always)]
pub fn submit_flags_for(first_of_process: bool) -> u64 {
    if first_of_process {
        BPF_RB_FORCE_WAKEUP
    } else {
        submit_flags()
    }
}
