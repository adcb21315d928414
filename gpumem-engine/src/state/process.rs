//! One traced process: what it holds (reset in one statement when it exits),
//! its call statistics and who it is.
use std::collections::{BTreeMap, BTreeSet};

// Per-process tables are keyed by driver addresses, handles and tids the agent
// chooses nothing about; FxHash is several times cheaper than SipHash there and
// the agent's own input is not attacker-controlled hash flooding material
// beyond what the per-process entry caps already bound.
pub use rustc_hash::FxHashMap as HashMap;

pub use super::{
    allocations::{Allocation, Allocations, Memory},
    checkpoint::Suspension,
    graph::{GraphNode, Multicast},
    share::{Import, ImportedHandle, PoolKey, PoolUse, Via},
};
use crate::stacks::{Sampling, StackId};

/// A cuMemCreate handle: physical memory, alive until released and unmapped.
#[derive(Clone, Debug)]
pub struct VmmHandle {
    pub size: u64,
    pub device: i32,
    pub mappings: u32,
    pub released: bool,
    pub ts_ns: u64,
    pub stack: Option<StackId>,
    pub sampling: Sampling,
    /// cuMemRetainAllocationHandle calls not yet released: a release takes
    /// one of these before it releases the memory.
    pub retains: u32,
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
    /// Bytes of live tensors PyTorch's allocator handed out (its probes),
    /// carved from live_bytes (what it reserved).
    pub allocated_bytes: u64,
    pub tensors: u64,
}

impl DeviceTotals {
    /// Adds what `other` holds (memory moved from an unknown device to a known one).
    pub fn absorb(&mut self, other: &DeviceTotals) {
        self.live_bytes += other.live_bytes;
        self.live_allocs += other.live_allocs;
        self.vmm_physical_bytes += other.vmm_physical_bytes;
        self.vmm_handles += other.vmm_handles;
        self.reserved_bytes += other.reserved_bytes;
        self.allocated_bytes += other.allocated_bytes;
        self.tensors += other.tensors;
    }
}

#[derive(Clone, Debug, Default)]
pub struct ApiStats {
    pub calls: u64,
    pub failures: u64,
    /// Count per nonzero CUresult (or RM status).
    pub failures_by_result: BTreeMap<u32, u64>,
}

/// The last failed call of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub api: u32,
    pub result: u32,
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
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

/// Contexts the process created or retained, and which is current where.
#[derive(Clone, Debug, Default)]
pub struct Contexts {
    /// Context handle → device.
    pub device_of: HashMap<u64, i32>,
    pub primary: HashMap<i32, PrimaryCtx>,
    /// Per thread context stack; the last entry is current.
    pub per_thread: HashMap<u32, Vec<u64>>,
    /// The last context created or retained: the device guess for threads
    /// whose current context predates the trace.
    pub last: Option<u64>,
    /// Context handles allocations were made in, interned (an allocation's ctx() is an index).
    pub ids: Vec<u64>,
}

/// Memory and objects made through the driver's ioctls.
#[derive(Clone, Debug, Default)]
pub struct DriverObjects {
    /// RM objects alive: handle → object.
    pub rm_objects: HashMap<u32, RmObject>,
    /// Bytes of live RM video-memory objects (class 0x40).
    pub rm_memory_bytes: u64,
    pub rm_memory_objects: u64,
    /// UVM external mappings: base → length.
    pub uvm_mappings: BTreeMap<u64, u64>,
    pub uvm_mapped_bytes: u64,
}

/// Pinned host memory held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    pub bytes: u64,
    pub allocs: u64,
}

/// Everything a process holds that the driver frees when it exits: reset
/// as a whole (`std::mem::take`), so that no table is forgotten.
#[derive(Clone, Debug, Default)]
pub struct Held {
    pub allocs: Allocations,
    /// Addresses whose allocation was replaced by a newer one before its free
    /// was seen (address → frees still expected). Transient: a late free
    /// takes its entry; bounded by DISPLACED_MAX against missed frees.
    pub displaced: HashMap<u64, u32>,
    pub vmm_handles: HashMap<u64, VmmHandle>,
    pub mappings: BTreeMap<u64, Mapping>,
    /// Reserved VA ranges: start → (size, device).
    pub reservations: BTreeMap<u64, (u64, i32)>,
    pub devices: BTreeMap<i32, DeviceTotals>,
    pub pinned: Pinned,
    pub contexts: Contexts,
    /// Last (free, total) bytes the process's own cuMemGetInfo_v2 reported, per device.
    pub reported_free: HashMap<i32, (u64, u64)>,
    pub driver: DriverObjects,
    /// Live tensors of PyTorch's allocator, by address.
    pub tensors: super::tensor::Tensors,
    /// Memory shared with other processes, pools, multicast objects and
    /// graph nodes: boxed on first use, as most processes have none (a
    /// host tracks thousands of processes; see `sharing`).
    pub sharing: Option<Box<Sharing>>,
}

/// What few processes hold: see `Held::sharing`.
#[derive(Clone, Debug, Default)]
pub struct Sharing {
    /// Other processes' allocations mapped here, by the address they got.
    pub imports: HashMap<u64, Import>,
    /// Stream-ordered pools and what they hold.
    pub pools: HashMap<PoolKey, PoolUse>,
    /// The pool cuMemAllocAsync takes from on each device, where
    /// cuDeviceSetMemPool chose one (else the default pool).
    pub device_pool: HashMap<i32, u64>,
    /// Live allocations made from a pool: address → pool.
    pub pool_of: HashMap<u64, PoolKey>,
    /// Handles imported from other processes, by the handle made here.
    pub imported_handles: HashMap<u64, ImportedHandle>,
    /// Multicast objects, by handle.
    pub multicast: HashMap<u64, Multicast>,
    /// Graph memory allocation nodes with no free node yet, by pointer.
    pub graph_nodes: HashMap<u64, GraphNode>,
    /// cuDeviceGraphMemTrim calls per device.
    pub graph_trims: HashMap<i32, u64>,
}

impl Sharing {
    fn entries(&self) -> usize {
        self.imports.len() + self.imported_handles.len() + self.multicast.len() + self.graph_nodes.len()
    }
}

/// What a process without sharing reads.
static NO_SHARING: std::sync::LazyLock<Sharing> = std::sync::LazyLock::new(Sharing::default);

impl Held {
    /// What it shares, pools, multicast objects, graph nodes (empty if none).
    pub fn sharing(&self) -> &Sharing {
        self.sharing.as_deref().unwrap_or(&NO_SHARING)
    }

    /// The same, to change (made on first use).
    pub fn sharing_mut(&mut self) -> &mut Sharing {
        self.sharing.get_or_insert_with(Default::default)
    }

    /// Table entries held (for the global bound).
    pub fn entries(&self) -> usize {
        self.allocs.len()
            + self.vmm_handles.len()
            + self.mappings.len()
            + self.reservations.len()
            + self.tensors.len()
            + self.sharing.as_ref().map_or(0, |s| s.entries())
    }
}

#[derive(Clone, Debug, Default)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    /// The event's comm `comm` was last checked against, as the kernel gave
    /// it: most events carry the same, and two words compare cheaper than text.
    pub seen_comm: [u8; gpumem_common::COMM_LEN],
    pub exited: bool,
    /// CLOCK_MONOTONIC time of the exit event, when exited.
    pub exited_ns: u64,
    pub held: Held,
    /// Devices the process has held memory (or address space) on since it
    /// was first seen: its figures there read 0 once freed, until it is forgotten.
    pub devices_seen: BTreeSet<i32>,
    /// The one GPU NVML lists the process on, for calls in a context made
    /// before the agent started (see State::assume_devices).
    pub assumed_device: Option<i32>,
    pub apis: BTreeMap<u32, ApiStats>,
    /// Frees of pointers allocated before tracing began (or not seen).
    pub untracked_frees: u64,
    /// Frees seen after a reuse of their address by another thread (see alloc.rs).
    pub reordered_frees: u64,
    /// Device bytes still held when the process exited (freed by the driver,
    /// never by the program: a leak hint).
    pub held_at_exit_bytes: u64,
    pub last_failure: Option<Failure>,
    /// Events of this process lost in the kernel (ring buffer or call table
    /// full): its figures may be wrong, and are shown as uncertain.
    pub events_lost: u64,
    /// Container and pod, looked up from /proc when the process is first seen.
    pub container: Option<crate::model::container::ContainerInfo>,
    /// PyTorch's allocator probes fired in this process: its allocated
    /// bytes are known (else only what it reserved).
    pub tensor_probes: bool,
    /// Tensor frees of blocks handed out before tracing began.
    pub untracked_tensor_frees: u64,
    /// What the process freed since its last allocation: at its exit, its wind-down.
    pub wind_down: WindDown,
    /// A checkpointing tool's hold on it: (state, the tool's pid, since when, CLOCK_MONOTONIC ns).
    pub suspension: Option<(Suspension, u32, u64)>,
    /// The UUID of each CUDA device ordinal as the process's own
    /// cuDeviceGetUuid_v2 said it: which GPU, or which MIG instance, the
    /// ordinal is (CUDA_VISIBLE_DEVICES renumbers and hides them).
    pub device_uuids: BTreeMap<i32, [u8; 16]>,
}

/// The frees since a process's last device allocation, by device and
/// stack. A program winding down (an interpreter's teardown, a library's
/// atexit) frees without allocating: at exit, these are the frees of that
/// last phase, and what each group held before it is their sum plus what is
/// left.
#[derive(Clone, Debug, Default)]
pub struct WindDown {
    /// CLOCK_MONOTONIC time of the last device allocation (0: none yet).
    pub since_ns: u64,
    pub freed: HashMap<(i32, Option<StackId>), u64>,
}

impl WindDown {
    pub fn allocated(&mut self, ts_ns: u64) {
        self.since_ns = ts_ns;
        if !self.freed.is_empty() {
            self.freed.clear();
        }
    }

    pub fn freed(&mut self, device: i32, stack: Option<StackId>, size: u64) {
        *self.freed.entry((device, stack)).or_default() += size;
    }
}

/// Most displaced addresses remembered per process (see `Held::displaced`).
const DISPLACED_MAX: usize = 4096;

impl Process {
    pub fn new(pid: u32) -> Self {
        Process { pid, ..Default::default() }
    }

    /// The totals of one device, created (and remembered as seen) if new.
    pub fn totals_mut(&mut self, device: i32) -> &mut DeviceTotals {
        if !self.devices_seen.contains(&device) {
            self.devices_seen.insert(device);
        }
        self.held.devices.entry(device).or_default()
    }

    /// Live totals on one device (zero where nothing is held).
    pub fn totals(&self, device: i32) -> DeviceTotals {
        self.held.devices.get(&device).cloned().unwrap_or_default()
    }

    /// Counts one call, and a failure with its result.
    pub fn count_call(&mut self, api: u32, result: u32) -> &mut ApiStats {
        let stats = self.apis.entry(api).or_default();
        stats.calls += 1;
        if result != 0 {
            stats.failures += 1;
            *stats.failures_by_result.entry(result).or_default() += 1;
        }
        stats
    }

    /// Table entries this process holds (for the global bound).
    pub fn entries(&self) -> usize {
        self.held.entries()
    }

    /// What this process's tables take on the agent's heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        use crate::heap::{btree, hash_table};
        let h = &self.held;
        std::mem::size_of::<Process>() as u64
            + crate::heap::string(&self.comm)
            + h.allocs.heap_bytes()
            + hash_table::<u64, u32>(h.displaced.capacity())
            + hash_table::<u64, VmmHandle>(h.vmm_handles.capacity())
            + btree::<u64, Mapping>(h.mappings.len())
            + btree::<u64, (u64, i32)>(h.reservations.len())
            + btree::<u64, Allocation>(h.tensors.len())
            + btree::<u32, ApiStats>(self.apis.len())
            + hash_table::<(i32, Option<StackId>), u64>(self.wind_down.freed.capacity())
            + h.sharing.as_ref().map_or(0, |_| std::mem::size_of::<Sharing>() as u64)
    }

    /// A process's live device memory per device.
    pub fn holdings(&self) -> Vec<super::Release> {
        self.held
            .devices
            .iter()
            .filter(|(_, t)| t.live_allocs > 0)
            .map(|(&device, t)| super::Release { device, bytes: t.live_bytes, allocs: t.live_allocs })
            .collect()
    }

    pub fn note_displaced(&mut self, addr: u64) {
        let displaced = &mut self.held.displaced;
        if displaced.len() >= DISPLACED_MAX {
            // Only missed frees (lost events) accumulate here: forget them.
            displaced.clear();
        }
        *displaced.entry(addr).or_default() += 1;
    }

    /// Whether a late free of `addr` was expected (and now is not).
    pub fn take_displaced(&mut self, addr: u64) -> bool {
        let displaced = &mut self.held.displaced;
        match displaced.get_mut(&addr) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                displaced.remove(&addr);
                true
            }
            None => false,
        }
    }

    /// A device's UUID, from the process's cuDeviceGetUuid_v2 (a few devices: bounded).
    pub fn note_uuid(&mut self, ev: &gpumem_common::Event) {
        use gpumem_common::payload::{DeviceUuid, Payload};
        const DEVICES_MAX: usize = 64;
        if ev.device == gpumem_common::DEVICE_UNKNOWN
            || (self.device_uuids.len() >= DEVICES_MAX && !self.device_uuids.contains_key(&ev.device))
        {
            return;
        }
        let u = DeviceUuid::unpack(ev);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&u.first.to_le_bytes());
        bytes[8..].copy_from_slice(&u.last.to_le_bytes());
        self.device_uuids.insert(ev.device, bytes);
    }

    /// Moves what is held on an unknown device to `device`, and sends later
    /// calls whose context is unknown there too.
    pub fn assume_device(&mut self, device: i32) {
        use gpumem_common::DEVICE_UNKNOWN;
        self.assumed_device = Some(device);
        self.devices_seen.remove(&DEVICE_UNKNOWN);
        let Some(unknown) = self.held.devices.remove(&DEVICE_UNKNOWN) else { return };
        self.totals_mut(device).absorb(&unknown);
        let held = &mut self.held;
        held.allocs.assume_device(device);
        for h in held.vmm_handles.values_mut().filter(|h| h.device == DEVICE_UNKNOWN) {
            h.device = device;
        }
        for r in held.reservations.values_mut().filter(|r| r.1 == DEVICE_UNKNOWN) {
            r.1 = device;
        }
        for t in held.tensors.values_mut().filter(|t| t.device() == DEVICE_UNKNOWN) {
            t.set_device(device);
        }
    }
}
