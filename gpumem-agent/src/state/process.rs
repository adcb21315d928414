//! One traced process: its live allocations, VMM handles, contexts and call
//! statistics.
use std::{collections::BTreeMap, num::NonZeroU64};

// Per-process tables are keyed by driver addresses, handles and tids the agent
// chooses nothing about; FxHash is several times cheaper than SipHash there and
// the agent's own input is not attacker-controlled hash flooding material
// beyond what the per-process entry caps already bound.
pub use rustc_hash::FxHashMap as HashMap;

/// Where an allocation lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Memory {
    Device,
    /// Page-locked host memory (cuMemHostAlloc/cuMemAllocHost): host RAM, not VRAM.
    HostPinned,
}

/// One live allocation. Packed to 32 bytes (40 with its key): a host with
/// a million live allocations is normal, and this is most of the agent's memory.
#[derive(Clone, Debug)]
pub struct Allocation {
    pub size: u64,
    pub ts_ns: u64,
    /// The caller's stack id, when it was captured and unwound (ids are hashes; 0 is mapped to 1).
    stack: Option<NonZeroU64>,
    /// Context current when it was made (an index into `Process::ctx_ids`); destroyed with it.
    pub ctx: u32,
    /// CUdevice ordinal (DEVICE_UNKNOWN is -1); ordinals fit in 16 bits.
    device: i16,
    pub memory: Memory,
}

impl Allocation {
    pub fn new(size: u64, device: i32, memory: Memory, ctx: u32, ts_ns: u64, stack: Option<crate::stacks::StackId>) -> Self {
        let stack = stack.map(|s| NonZeroU64::new(s).unwrap_or(NonZeroU64::MIN));
        Allocation { size, ts_ns, stack, ctx, device: pack_device(device), memory }
    }
    pub fn device(&self) -> i32 {
        self.device as i32
    }
    pub fn set_device(&mut self, device: i32) {
        self.device = pack_device(device);
    }
    pub fn stack(&self) -> Option<crate::stacks::StackId> {
        self.stack.map(NonZeroU64::get)
    }
}

/// A device ordinal in 16 bits; one that does not fit is unknown (the state
/// turns such ordinals into DEVICE_UNKNOWN before they get here).
fn pack_device(device: i32) -> i16 {
    i16::try_from(device).unwrap_or(gpumem_common::DEVICE_UNKNOWN as i16)
}

/// A cuMemCreate handle: physical memory, alive until released and unmapped.
#[derive(Clone, Debug)]
pub struct VmmHandle {
    pub size: u64,
    pub device: i32,
    pub mappings: u32,
    pub released: bool,
    pub ts_ns: u64,
    pub stack: Option<crate::stacks::StackId>,
}

#[derive(Clone, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
}

/// Live totals of one process on one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    /// Device memory held: classic allocations plus VMM physical handles.
    pub live_bytes: u64,
    pub live_allocs: u64,
    /// Part of live_bytes held as cuMemCreate handles.
    pub vmm_physical_bytes: u64,
    pub vmm_handles: u64,
    /// Address space reserved with cuMemAddressReserve: not memory.
    pub reserved_bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ApiStats {
    pub calls: u64,
    pub failures: u64,
    /// Count per nonzero CUresult.
    pub failures_by_result: BTreeMap<u32, u64>,
}

/// An object allocated with RM_ALLOC: its parent (freeing a parent frees its
/// children) and, for video memory, its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmObject {
    pub parent: u32,
    pub class: u32,
    pub size: u64,
}

#[derive(Clone, Debug)]
pub struct PrimaryCtx {
    pub ctx: u64,
    pub refs: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    pub exited: bool,
    /// CLOCK_MONOTONIC time of the exit event, when exited.
    pub exited_ns: u64,
    pub allocs: HashMap<u64, Allocation>,
    pub vmm_handles: HashMap<u64, VmmHandle>,
    pub mappings: BTreeMap<u64, Mapping>,
    /// Reserved VA ranges: start → (size, device).
    pub reservations: BTreeMap<u64, (u64, i32)>,
    pub devices: BTreeMap<i32, DeviceTotals>,
    pub host_pinned_bytes: u64,
    pub host_pinned_allocs: u64,
    pub ctx_device: HashMap<u64, i32>,
    pub primary: HashMap<i32, PrimaryCtx>,
    /// Per thread context stack; the last entry is current.
    pub thread_ctx: HashMap<u32, Vec<u64>>,
    /// The last context created or retained: the device guess for threads
    /// whose current context predates the trace.
    pub last_ctx: Option<u64>,
    /// Context handles allocations were made in, interned (Allocation::ctx is an index).
    pub ctx_ids: Vec<u64>,
    /// The one GPU NVML lists the process on, for calls in a context made
    /// before the agent started (see State::assume_devices).
    pub assumed_device: Option<i32>,
    pub apis: BTreeMap<u32, ApiStats>,
    /// Frees of pointers allocated before tracing began (or not seen).
    pub untracked_frees: u64,
    /// Frees seen after a reuse of their address by another thread (see apply).
    pub reordered_frees: u64,
    /// Addresses whose allocation was replaced by a newer one before its free
    /// was seen (address → frees still expected). Transient: a late free
    /// takes its entry; bounded by DISPLACED_MAX against missed frees.
    pub displaced: HashMap<u64, u32>,
    /// Device bytes still held when the process exited (freed by the driver,
    /// never by the program: a leak hint).
    pub held_at_exit_bytes: u64,
    /// RM objects alive, allocated through the driver's ioctls: handle → object.
    pub rm_objects: HashMap<u32, RmObject>,
    /// Bytes of live RM video-memory objects (class 0x40).
    pub rm_memory_bytes: u64,
    pub rm_memory_objects: u64,
    /// UVM external mappings: base → length.
    pub uvm_mappings: BTreeMap<u64, u64>,
    pub uvm_mapped_bytes: u64,
    /// Last (free, total) bytes the process's own cuMemGetInfo_v2 reported, per device.
    pub reported_free: HashMap<i32, (u64, u64)>,
    /// The last failed call: (API, CUresult, CLOCK_MONOTONIC ns).
    pub last_failure: Option<(u32, u32, u64)>,
    /// Events of this process lost in the kernel (ring buffer or call table
    /// full): its figures may be wrong, and are shown as uncertain.
    pub events_lost: u64,
    /// Container and pod, looked up from /proc when the process is first seen.
    pub container: Option<super::container::ContainerInfo>,
}

/// Most displaced addresses remembered per process (see `Process::displaced`).
const DISPLACED_MAX: usize = 4096;

impl Process {
    pub fn new(pid: u32) -> Self {
        Process { pid, ..Default::default() }
    }

    pub fn totals_mut(&mut self, device: i32) -> &mut DeviceTotals {
        self.devices.entry(device).or_default()
    }

    /// Device of the calling thread's current context, if known.
    pub fn current_device(&self, tid: u32) -> i32 {
        let ctx = self.thread_ctx.get(&tid).and_then(|s| s.last().copied()).or(self.last_ctx);
        ctx.and_then(|c| self.ctx_device.get(&c).copied()).or(self.assumed_device).unwrap_or(gpumem_common::DEVICE_UNKNOWN)
    }

    pub fn current_ctx(&self, tid: u32) -> u64 {
        self.thread_ctx.get(&tid).and_then(|s| s.last().copied()).or(self.last_ctx).unwrap_or(0)
    }

    /// The index of a context handle in `ctx_ids`, added if new. A process has a
    /// few contexts, so a scan is cheaper than a map.
    pub fn ctx_index(&mut self, ctx: u64) -> u32 {
        match self.ctx_ids.iter().position(|&c| c == ctx) {
            Some(i) => i as u32,
            None => {
                self.ctx_ids.push(ctx);
                (self.ctx_ids.len() - 1) as u32
            }
        }
    }

    /// Moves what is held on an unknown device to `device`, and sends later
    /// calls whose context is unknown there too.
    pub fn assume_device(&mut self, device: i32) {
        self.assumed_device = Some(device);
        let Some(unknown) = self.devices.remove(&gpumem_common::DEVICE_UNKNOWN) else { return };
        let t = self.totals_mut(device);
        t.live_bytes += unknown.live_bytes;
        t.live_allocs += unknown.live_allocs;
        t.vmm_physical_bytes += unknown.vmm_physical_bytes;
        t.vmm_handles += unknown.vmm_handles;
        t.reserved_bytes += unknown.reserved_bytes;
        for a in self.allocs.values_mut().filter(|a| a.memory == Memory::Device && a.device() == gpumem_common::DEVICE_UNKNOWN) {
            a.set_device(device);
        }
        for h in self.vmm_handles.values_mut().filter(|h| h.device == gpumem_common::DEVICE_UNKNOWN) {
            h.device = device;
        }
        for r in self.reservations.values_mut().filter(|r| r.1 == gpumem_common::DEVICE_UNKNOWN) {
            r.1 = device;
        }
    }

    pub fn note_displaced(&mut self, addr: u64) {
        if self.displaced.len() >= DISPLACED_MAX {
            // Only missed frees (lost events) accumulate here: forget them.
            self.displaced.clear();
        }
        *self.displaced.entry(addr).or_default() += 1;
    }

    /// Whether a late free of `addr` was expected (and now is not).
    pub fn take_displaced(&mut self, addr: u64) -> bool {
        match self.displaced.get_mut(&addr) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.displaced.remove(&addr);
                true
            }
            None => false,
        }
    }

    /// Number of table entries this process holds (for the global bound).
    pub fn entries(&self) -> usize {
        self.allocs.len() + self.vmm_handles.len() + self.mappings.len() + self.reservations.len()
    }
}
