//! The event ABI shared by gpumem's eBPF programs (`no_std`) and its agent.
//!
//! Everything here is `#[repr(C)]` with explicit padding and integer flags
//! (never `bool` or Rust enums) so that both sides agree byte for byte.
#![no_std]

pub mod api;
mod apis;
pub mod counters;
pub mod ipc;
pub mod live;
pub mod names;
pub mod python;
pub mod sampling;
pub mod usdt;

pub use apis::{api_info, ApiClass, ApiInfo, APIS};

/// Device value when the call itself does not name one.
pub const DEVICE_UNKNOWN: i32 = -1;

/// `Event::flags` bits.
pub mod flags {
    /// Reading an out-pointer from user memory failed; `addr`/`handle` may be 0.
    pub const OUT_READ_FAILED: u32 = 1 << 0;
    /// `device` comes from the call's own arguments (cuMemCreate, ctx calls).
    pub const DEVICE_FROM_ARGS: u32 = 1 << 1;
    /// The caller's stack went to the stack ring (STACKS) as a `StackEvent`
    /// with this event's `tid` and `ts_ns`, committed before this event.
    pub const HAS_STACK: u32 = 1 << 2;
    /// The process was over its stack budget and this allocation's stack was
    /// taken by byte-weighted sampling: it stands for 1/p allocations
    /// (`sampling::probability` of its size).
    pub const STACK_SAMPLED: u32 = 1 << 3;
    /// Over the stack budget and not sampled: no stack was taken; the
    /// sampled stacks' estimates stand for it.
    pub const STACK_NOT_SAMPLED: u32 = 1 << 4;
    /// The kernel's table of live entries (`live`) was full: a restarted
    /// agent cannot know of this allocation.
    pub const NOT_IN_KERNEL_TABLE: u32 = 1 << 5;
    /// Rebuilt from the kernel's table by an agent that adopted pinned state
    /// (not read from the ring): `device` is what the last agent resolved.
    pub const ADOPTED: u32 = 1 << 6;
}

/// CUresult values that gpumem names.
pub mod cu_result {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const NOT_INITIALIZED: u32 = 3;
    pub const NO_DEVICE: u32 = 100;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_CONTEXT: u32 = 201;
}

pub const COMM_LEN: usize = 16;

/// One traced call (or process exit), emitted at the call's return.
///
/// Field meaning by class:
/// - allocs: `addr` = returned pointer, `size` = bytes (pitch × height for
///   cuMemAllocPitch, with the pitch in `aux`);
/// - frees: `addr` = pointer freed;
/// - VMM create/release: `handle`; create also `size` and `device`;
/// - VMM map/unmap, VA reserve/free: `addr` + `size` (+ `handle` for map);
/// - context calls: `handle` = CUcontext, `device` where the call names one;
/// - exports and imports: `addr` the pointer, `handle` the key (`ipc::key`);
/// - pools: `handle` the pool (`size` the bytes kept for a trim).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC nanoseconds at return (bpf_ktime_get_ns).
    pub ts_ns: u64,
    pub latency_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub handle: u64,
    pub aux: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub api: u32,
    /// CUresult returned by the call (0 = success).
    pub result: u32,
    pub device: i32,
    pub flags: u32,
    pub comm: [u8; COMM_LEN],
}

pub const EVENT_SIZE: usize = core::mem::size_of::<Event>();
const _: () = assert!(EVENT_SIZE == 88);

/// Bytes of user stack copied with each successful allocation, from the
/// caller's stack pointer up: enough for deep -O2 stacks without frame
/// pointers (perf's default for DWARF unwinding is the same 8 KiB).
pub const STACK_BYTES: usize = 8192;
/// The stack is copied in chunks; a chunk that cannot be read (the top of
/// the stack) ends the copy.
pub const STACK_CHUNK: usize = 512;

/// A successful allocation with the caller's registers and stack, taken at
/// the call's return: `ip` is the return address in the caller, `sp` and
/// `bp` the caller's registers. `data` holds first `py_frames` Python frames
/// (`python::PyFrameRef`, innermost first; none for native-only processes),
/// then `len` bytes of the stack from `sp` up.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackEvent {
    pub event: Event,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub len: u32,
    pub py_frames: u32,
    pub data: [u8; STACK_BYTES + python::PY_BYTES_MAX],
}

pub const STACK_EVENT_SIZE: usize = core::mem::size_of::<StackEvent>();
/// Bytes before `data`: a record is this header, the Python frames and the
/// `len` stack bytes copied.
pub const STACK_HEADER_SIZE: usize = EVENT_SIZE + 32;
const _: () = assert!(STACK_EVENT_SIZE == STACK_HEADER_SIZE + STACK_BYTES + python::PY_BYTES_MAX);

/// A process's stack budget: a token bucket, `tokens` in stack-nanoseconds
/// (one stack is 1e9), refilled at the budget's rate up to one second's worth.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackBudget {
    pub tokens: u64,
    pub last_ns: u64,
}

/// Processes whose stack budget and copy length are kept at once.
pub const STACK_BUDGET_PIDS: u32 = 4096;

/// Filter modes for the `FILTER_MODE` global.
pub mod filter {
    /// Trace every process.
    pub const ALL: u32 = 0;
    /// Trace only tgids present in the `FILTER_PIDS` map.
    pub const PIDS: u32 = 1;
    /// `FILTER_PIDS` value: also add children forked by this process.
    pub const FOLLOW_CHILDREN: u32 = 1;
}

/// Indices into the eBPF `OOM_OFFSETS` global: where oom:mark_victim keeps
/// each field on this kernel (read from tracefs; `FIELD_ABSENT` if missing).
pub mod oom_field {
    pub const PID: usize = 0;
    pub const COMM: usize = 1;
    pub const TOTAL_VM: usize = 2;
    pub const ANON_RSS: usize = 3;
    pub const FILE_RSS: usize = 4;
    pub const SHMEM_RSS: usize = 5;
    pub const COUNT: usize = 6;
    pub const NAMES: [&str; COUNT] = ["pid", "comm", "total_vm", "anon_rss", "file_rss", "shmem_rss"];
    pub const FIELD_ABSENT: u32 = u32::MAX;
}

pub mod nv;
pub mod payload;

/// Values of the `NV_FDS` map: what kind of NVIDIA node a descriptor is.
pub mod nv_fd {
    /// /dev/nvidiactl, /dev/nvidiaN: resource manager escapes.
    pub const RM: u32 = 1;
    /// /dev/nvidia-uvm.
    pub const UVM: u32 = 2;
}

/// Key of the `NV_FDS` map: one open descriptor of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdKey {
    pub tgid: u32,
    pub fd: u32,
}

/// Key of the `PENDING` map: a driver call in flight on one thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingKey {
    pub pid_tgid: u64,
    pub api: u32,
    pub _pad: u32,
}

/// Longest device-node prefix the kernel side matches on open.
pub const NV_PREFIX_MAX: usize = 64;

/// Sizes of the kernel-side tables (also used by the agent for reporting).
/// The accounting ring as the eBPF object declares it: room for about
/// 170,000 events in flight (records are 88 bytes plus the ring's 8-byte
/// header; stacks go to their own ring). The agent sizes it at load, by flag
/// or by the host's class ([`ring_bytes_for_cpus`]).
pub const RINGBUF_BYTES: u32 = 16 * 1024 * 1024;
/// The stack ring as declared: room for about 2,000 full 8 KiB stacks in
/// flight. When it is full, events go without their stacks (counted as
/// `stacks_dropped`). Sized at load like the accounting ring.
pub const STACK_RING_BYTES: u32 = 16 * 1024 * 1024;

/// Ring bytes per online CPU when a ring is sized by the host's class: each
/// CPU can run a traced thread that fills the ring while the agent waits for
/// a core, so the room needed grows with them. A MiB holds about 11,000
/// records, half a second of one CPU calling the driver flat out under this
/// project's VM's trap costs (less on bare metal, where the agent also
/// drains faster), or 128 full stacks.
pub const RING_BYTES_PER_CPU: u32 = 1024 * 1024;
/// The smallest and largest ring sized by the host's class: 4 MiB takes a
/// small host's bursts (two processes' whole stack bursts at once), 64 MiB
/// caps what a 144-CPU Grace pair maps twice (kernel memory, resident).
pub const RING_BYTES_MIN: u32 = 4 * 1024 * 1024;
pub const RING_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// A ring's size for a host with this many online CPUs: a MiB per CPU,
/// rounded up to a power of two (the kernel's rule) within
/// [`RING_BYTES_MIN`]..=[`RING_BYTES_MAX`].
pub const fn ring_bytes_for_cpus(cpus: u32) -> u32 {
    let want = if cpus > RING_BYTES_MAX / RING_BYTES_PER_CPU { RING_BYTES_MAX } else { cpus * RING_BYTES_PER_CPU };
    let bytes = want.next_power_of_two();
    if bytes < RING_BYTES_MIN {
        RING_BYTES_MIN
    } else if bytes > RING_BYTES_MAX {
        RING_BYTES_MAX
    } else {
        bytes
    }
}
/// How often the agent drains the ring buffer without being woken: records
/// wake it only when the ring is an eighth full (see WAKEUP_BYTES in the
/// eBPF maps), so an event reaches it at most this late.
pub const POLL_MS: u64 = 50;
pub const PENDING_MAX: u32 = 16384;
/// Size of a PENDING value (the eBPF side's `Pending`, asserted there) in
/// 64-bit words: the agent's sweep opens the map with it.
pub const PENDING_VALUE_WORDS: usize = 9;

/// CUmemAllocationHandleType values gpumem tells apart.
pub mod handle_type {
    pub const POSIX_FILE_DESCRIPTOR: u64 = 1;
    /// 64 bytes that mean the same in every process (CUmemFabricHandle).
    pub const FABRIC: u64 = 8;
}
pub const TRACKED_MAX: u32 = 16384;
pub const FILTER_MAX: u32 = 16384;
/// Processes whose lost events are counted one by one (LOST_BY_PID); beyond
/// it losses are still counted in STATS, just not attributed.
pub const LOST_PIDS_MAX: u32 = 4096;

pub const NV_FDS_MAX: u32 = 65536;

#[cfg(feature = "aya")]
mod user {
    // SAFETY: Event is repr(C), Copy, has no padding holes and every bit
    // pattern is valid.
    unsafe impl aya::Pod for super::Event {}
    // SAFETY: two u32, no padding.
    unsafe impl aya::Pod for super::FdKey {}
    // SAFETY: u64 + two u32, no padding.
    unsafe impl aya::Pod for super::PendingKey {}
    // SAFETY: eight u32, no padding.
    unsafe impl aya::Pod for super::python::PyLayout {}
    // SAFETY: u32, u32, u64: no padding.
    unsafe impl aya::Pod for super::live::LiveKey {}
    // SAFETY: an Event (no holes) and a u64, both 8-aligned: no padding.
    unsafe impl aya::Pod for super::live::LiveEntry {}
}

impl Event {
    /// An event of `api` with every other field zero and no device.
    pub const fn empty(api: u32) -> Event {
        Event {
            ts_ns: 0,
            latency_ns: 0,
            addr: 0,
            size: 0,
            handle: 0,
            aux: 0,
            pid: 0,
            tid: 0,
            api,
            result: 0,
            device: DEVICE_UNKNOWN,
            flags: 0,
            comm: [0; COMM_LEN],
        }
    }

    /// Decodes an event from ring-buffer bytes. Returns None for a short read.
    pub fn from_bytes(bytes: &[u8]) -> Option<Event> {
        if bytes.len() < EVENT_SIZE {
            return None;
        }
        // SAFETY: length checked; Event is plain old data valid for any bits;
        // read_unaligned because ring-buffer records are only 8-byte aligned
        // by convention.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const Event) })
    }

    /// The event's bytes, as the ring buffer carries them (for recordings).
    pub fn to_bytes(&self) -> [u8; EVENT_SIZE] {
        // SAFETY: Event is repr(C) plain old data of exactly EVENT_SIZE bytes
        // with no padding (checked by a const assertion).
        unsafe { core::mem::transmute_copy(self) }
    }

    /// The comm as text, up to its first NUL.
    pub fn comm_bytes(&self) -> &[u8] {
        let end = self.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
        &self.comm[..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_sized_by_host_class_grow_with_cpus_within_bounds() {
        let sizes: [(u32, u32); 8] = [(0, 4), (1, 4), (2, 4), (5, 8), (16, 16), (17, 32), (72, 64), (u32::MAX, 64)];
        for (cpus, mib) in sizes {
            let bytes = ring_bytes_for_cpus(cpus);
            assert_eq!(bytes, mib << 20, "{cpus} CPUs");
            assert!(bytes.is_power_of_two());
        }
    }

    #[test]
    fn layout_is_fixed() {
        assert_eq!(core::mem::size_of::<Event>(), 88);
        assert_eq!(core::mem::align_of::<Event>(), 8);
        assert_eq!(core::mem::offset_of!(Event, pid), 48);
        assert_eq!(core::mem::offset_of!(Event, comm), 72);
    }

    #[test]
    fn decodes_from_bytes_and_rejects_short_records() {
        let mut bytes = [0u8; EVENT_SIZE];
        bytes[48..52].copy_from_slice(&1234u32.to_ne_bytes());
        bytes[56..60].copy_from_slice(&api::CU_MEM_ALLOC_V2.to_ne_bytes());
        bytes[72..76].copy_from_slice(b"test");
        let ev = Event::from_bytes(&bytes).expect("full record");
        assert_eq!(ev.pid, 1234);
        assert_eq!(ev.api, api::CU_MEM_ALLOC_V2);
        assert_eq!(ev.comm_bytes(), b"test");
        assert!(Event::from_bytes(&bytes[..EVENT_SIZE - 1]).is_none());
    }

    #[test]
    fn api_ids_are_unique_and_known() {
        for (i, a) in APIS.iter().enumerate() {
            assert!(APIS[i + 1..].iter().all(|b| b.id != a.id && b.symbol != a.symbol), "{}", a.symbol);
            assert!(a.id <= api::MAX);
            assert_eq!(api_info(a.id).map(|x| x.symbol), Some(a.symbol));
        }
        assert!(api_info(api::PROCESS_EXIT).is_none());
        assert!(api_info(api::OOM_KILL).is_none());
    }

    #[test]
    fn nvidia_ioctl_commands() {
        use nv::*;
        assert_eq!(iowr(ESC_RM_ALLOC, NVOS21_SIZE), 0xc020_462b);
        assert_eq!(classify(nv_fd::RM, iowr(ESC_RM_ALLOC, NVOS21_SIZE)), Some(api::RM_ALLOC));
        assert_eq!(classify(nv_fd::RM, iowr(ESC_RM_ALLOC, NVOS64_SIZE)), Some(api::RM_ALLOC));
        assert_eq!(classify(nv_fd::RM, iowr(ESC_RM_ALLOC, 40)), None, "unknown layout");
        assert_eq!(classify(nv_fd::RM, iowr(ESC_RM_FREE, NVOS00_SIZE)), Some(api::RM_FREE));
        assert_eq!(classify(nv_fd::RM, iowr(ESC_RM_MAP_MEMORY, NVOS33_WITH_FD_SIZE)), Some(api::RM_MAP_MEMORY));
        assert_eq!(classify(nv_fd::RM, 0x541b), None, "FIONREAD");
        assert_eq!(classify(nv_fd::UVM, UVM_FREE), Some(api::UVM_FREE));
        assert_eq!(classify(nv_fd::RM, UVM_FREE), None, "UVM numbers only on the UVM node");
    }
}
