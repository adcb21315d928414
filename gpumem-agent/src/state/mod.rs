//! Live allocation state per process and device, built from decoded events.
//!
//! Failed calls are counted and change nothing. Everything held is bounded by
//! `Limits`; what does not fit is counted in `Overflow`, never dropped silently.
pub mod container;
mod ioctl;
pub mod process;

use std::collections::BTreeMap;

use gpumem_common::{api_info, ApiClass, Event, DEVICE_UNKNOWN};
pub use process::{Allocation, Memory, Process, VmmHandle};

use process::{Mapping, PrimaryCtx};

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Live table entries (allocations, handles, mappings, reservations) across all processes.
    pub max_entries: usize,
    /// Processes kept, live or exited.
    pub max_processes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_entries: 1 << 20, max_processes: 8192 }
    }
}

/// What did not fit.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Overflow {
    /// Allocations/handles not recorded because the table was full.
    pub entries_dropped: u64,
    /// Events of processes not recorded because the process table was full.
    pub process_events_dropped: u64,
}

/// Memory released implicitly on one device (context destroyed, process exit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub device: i32,
    pub bytes: u64,
    pub allocs: u64,
}

/// A process holding memory on a device, for OOM snapshots.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub bytes: u64,
    pub allocs: u64,
}

/// A CUDA allocation that failed with out-of-memory, and who held the device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CudaOom {
    pub device: i32,
    pub requested: u64,
    /// Free bytes the process's own last cuMemGetInfo_v2 reported for the device.
    pub reported_free: Option<u64>,
    /// Failed although at least the requested size was reported free.
    pub fragmentation: bool,
    /// Largest holders of the device, most first (at most `OOM_TOP_HOLDERS`).
    pub holders: Vec<Holder>,
}

pub const OOM_TOP_HOLDERS: usize = 5;

/// A host OOM kill as the state saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OomKill {
    /// The victim's GPU memory per device at that moment.
    pub holdings: Vec<Release>,
    /// The limited memory cgroup the kill happened in (filled by the caller,
    /// which can read /proc); None for a host-wide kill or when unknown.
    pub memcg: Option<String>,
}

/// Out-of-memory counts kept for the summary and the exporter.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OomCounters {
    pub cuda_ooms: u64,
    pub fragmentation_ooms: u64,
    pub host_oom_kills: u64,
}

/// Sizes above this are not believed: 256 TiB of memory (no GPU or host
/// comes near), 128 PiB of address space for a VA reservation.
fn plausible_size_limit(api_id: u32) -> u64 {
    match api_info(api_id).map(|i| i.class) {
        Some(ApiClass::VaReserve | ApiClass::VaFree | ApiClass::VmmMap | ApiClass::VmmUnmap) => 1 << 57,
        _ => MEMORY_SIZE_LIMIT,
    }
}

const MEMORY_SIZE_LIMIT: u64 = 1 << 48;

/// The largest device ordinal kept (allocations store it in 16 bits).
pub const MAX_DEVICE_ORDINAL: i32 = i16::MAX as i32;

/// What applying one event did, for rendering. Returned for every event, so
/// the rare parts (OOMs) are boxed to keep it small to move.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Host OOM kill: the victim's GPU holdings per device at that moment.
    pub oom_kill: Option<Box<OomKill>>,
    /// A CUDA allocation failed with out-of-memory.
    pub cuda_oom: Option<Box<CudaOom>>,
    /// Device the event is attributed to (resolved from contexts if the call
    /// itself names none).
    pub device: i32,
    /// Bytes the event concerns (for a free: the size that was freed).
    pub size: u64,
    /// Implicit releases (ctx destroy, primary ctx release/reset, exit).
    pub released: Vec<Release>,
    /// A free/release of something not in the table (predates the trace).
    pub untracked: bool,
    /// Not recorded: a table was full.
    pub dropped: bool,
    /// An explicit free of a tracked allocation or handle: how long it lived.
    pub lifetime_ns: Option<u64>,
}

#[derive(Debug, Default)]
pub struct State {
    pub limits: Limits,
    pub processes: BTreeMap<u32, Process>,
    pub overflow: Overflow,
    entries: usize,
    pub events: u64,
    pub oom: OomCounters,
    /// New processes seen on the pid of one that had exited (see apply_with_stack).
    pub pid_reuses: u64,
    /// Calls of a process read after its exit (begun before it): not applied.
    pub late_events: u64,
    /// Successful calls with a size no GPU could hold: not applied.
    pub implausible_events: u64,
}

impl State {
    pub fn new(limits: Limits) -> Self {
        State { limits, ..Default::default() }
    }

    #[cfg(test)]
    pub fn live_entries(&self) -> usize {
        self.entries
    }

    /// Applies an event without a stack (tests; the agent always passes what it has).
    #[cfg(test)]
    pub fn apply(&mut self, ev: &Event) -> Applied {
        self.apply_with_stack(ev, None)
    }

    /// Applies an event whose caller's stack was unwound to `stack`.
    pub fn apply_with_stack(&mut self, ev: &Event, stack: Option<crate::stacks::StackId>) -> Applied {
        self.events += 1;
        // A device ordinal no GPU can have (read from a process's arguments)
        // is unknown, everywhere it is stored.
        let normalized;
        let ev = if ev.device != DEVICE_UNKNOWN && !(0..=MAX_DEVICE_ORDINAL).contains(&ev.device) {
            normalized = Event { device: DEVICE_UNKNOWN, ..*ev };
            &normalized
        } else {
            ev
        };
        // A size no GPU could hold (an ABI mismatch, a garbled read): counted
        // and not applied, so that no total can wrap.
        // (The cheap comparison first: the API lookup is for the rare large sizes.)
        if ev.result == 0 && ev.size > MEMORY_SIZE_LIMIT && ev.size > plausible_size_limit(ev.api) {
            self.implausible_events += 1;
            return Applied { device: ev.device, dropped: true, ..Default::default() };
        }
        if ev.api == gpumem_common::api::OOM_KILL {
            // The victim need not be a CUDA process: do not create one for it.
            self.oom.host_oom_kills += 1;
            let holdings = self.processes.get(&ev.pid).map(holdings).unwrap_or_default();
            return Applied { device: DEVICE_UNKNOWN, oom_kill: Some(Box::new(OomKill { holdings, memcg: None })), ..Default::default() };
        }
        if !self.processes.contains_key(&ev.pid) {
            if self.processes.len() >= self.limits.max_processes && !self.evict_exited() {
                self.overflow.process_events_dropped += 1;
                return Applied { device: ev.device, size: ev.size, dropped: true, ..Default::default() };
            }
            self.processes.insert(ev.pid, Process::new(ev.pid));
        }
        let room = self.entries < self.limits.max_entries;
        let mut proc = self.processes.get_mut(&ev.pid).expect("inserted above");
        // A call that began after the exit of the process we knew by this pid
        // is a new process's (the kernel reused the pid): start it afresh, so
        // that nothing of the old one (statistics, contexts, container) carries over.
        if proc.exited && ev.api != gpumem_common::api::PROCESS_EXIT {
            if ev.ts_ns.saturating_sub(ev.latency_ns) <= proc.exited_ns {
                // A call the dead process began before its exit, read after it:
                // the driver freed everything at exit, there is nothing to apply.
                self.late_events += 1;
                return Applied { device: ev.device, ..Default::default() };
            }
            self.pid_reuses += 1;
            self.processes.insert(ev.pid, Process::new(ev.pid));
            proc = self.processes.get_mut(&ev.pid).expect("inserted above");
        }
        // The main thread's comm is the process's name; compare bytes first so
        // that the common case (unchanged) allocates nothing.
        let comm = ev.comm_bytes();
        if (proc.comm.is_empty() || ev.tid == ev.pid) && !comm.is_empty() && proc.comm.as_bytes() != comm {
            proc.comm = String::from_utf8_lossy(comm).into_owned();
        }
        if ev.api == gpumem_common::api::PROCESS_EXIT {
            let before = proc.entries();
            let released = release_all(proc);
            proc.exited = true;
            proc.exited_ns = ev.ts_ns;
            proc.held_at_exit_bytes = released.iter().map(|r| r.bytes).sum();
            self.entries -= before;
            return Applied { device: DEVICE_UNKNOWN, size: released.iter().map(|r| r.bytes).sum(), released, ..Default::default() };
        }
        if gpumem_common::api::is_ioctl(ev.api) {
            let stats = proc.apis.entry(ev.api).or_default();
            stats.calls += 1;
            if ev.result != 0 {
                stats.failures += 1;
                *stats.failures_by_result.entry(ev.result).or_default() += 1;
                return Applied { device: DEVICE_UNKNOWN, size: ev.size, ..Default::default() };
            }
            return ioctl::apply(proc, ev);
        }
        let Some(info) = api_info(ev.api) else {
            return Applied { device: ev.device, ..Default::default() };
        };
        let stats = proc.apis.entry(ev.api).or_default();
        stats.calls += 1;
        if ev.result != 0 {
            stats.failures += 1;
            *stats.failures_by_result.entry(ev.result).or_default() += 1;
            proc.last_failure = Some((ev.api, ev.result, ev.ts_ns));
            let device = if ev.device != DEVICE_UNKNOWN { ev.device } else { proc.current_device(ev.tid) };
            let mut applied = Applied { device, size: ev.size, ..Default::default() };
            if ev.result == gpumem_common::cu_result::OUT_OF_MEMORY && matches!(info.class, ApiClass::DeviceAlloc | ApiClass::VmmCreate) {
                let reported_free = proc.reported_free.get(&device).map(|&(free, _)| free);
                let fragmentation = reported_free.is_some_and(|free| free >= ev.size);
                self.oom.cuda_ooms += 1;
                if fragmentation {
                    self.oom.fragmentation_ooms += 1;
                }
                let holders = self.top_holders(device, OOM_TOP_HOLDERS);
                applied.cuda_oom = Some(Box::new(CudaOom { device, requested: ev.size, reported_free, fragmentation, holders }));
            }
            return applied;
        }
        let before = proc.entries();
        let applied = apply_success(proc, info.class, ev, room, stack);
        self.entries = self.entries + proc.entries() - before;
        if applied.dropped {
            self.overflow.entries_dropped += 1;
        }
        applied
    }

    /// A process whose calls run in a context the agent never saw created
    /// (made before it started) has its memory on an unknown device. Where
    /// NVML lists the process on exactly one GPU, that is the device.
    pub fn assume_devices(&mut self, gpus: &[crate::nvml::GpuSample]) {
        for p in self.processes.values_mut().filter(|p| !p.exited && p.assumed_device.is_none()) {
            let mut on = gpus.iter().filter(|g| g.processes.iter().flatten().any(|&(pid, _)| pid == p.pid));
            if let (Some(g), None) = (on.next(), on.next()) {
                let needs = p.devices.contains_key(&DEVICE_UNKNOWN) || p.ctx_device.is_empty();
                if needs {
                    p.assume_device(g.index as i32);
                }
            }
        }
    }

    /// Marks the processes that lost events (cumulative counts per pid, as
    /// the kernel keeps them) as uncertain.
    pub fn mark_lost(&mut self, by_pid: &BTreeMap<u32, u64>) {
        for (pid, &n) in by_pid {
            if let Some(p) = self.processes.get_mut(pid) {
                p.events_lost = p.events_lost.max(n);
            }
        }
    }

    /// The processes holding the most memory on a device, most first.
    pub fn top_holders(&self, device: i32, n: usize) -> Vec<Holder> {
        let mut holders: Vec<Holder> = self
            .processes
            .values()
            .filter_map(|p| {
                let t = p.devices.get(&device)?;
                (t.live_allocs > 0).then(|| Holder { pid: p.pid, comm: p.comm.clone(), bytes: t.live_bytes, allocs: t.live_allocs })
            })
            .collect();
        holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
        holders.truncate(n);
        holders
    }

    /// Forgets processes that exited before `cutoff_ns` (CLOCK_MONOTONIC), so
    /// that a long-running agent does not keep every pid it ever saw.
    /// Returns their pids.
    pub fn forget_exited_before(&mut self, cutoff_ns: u64) -> Vec<u32> {
        let gone: Vec<u32> = self.processes.values().filter(|p| p.exited && p.exited_ns < cutoff_ns).map(|p| p.pid).collect();
        for pid in &gone {
            if let Some(p) = self.processes.remove(pid) {
                self.entries -= p.entries();
            }
        }
        gone
    }

    /// Makes room by forgetting the oldest exited process. False if none.
    fn evict_exited(&mut self) -> bool {
        let victim = self.processes.iter().find(|(_, p)| p.exited).map(|(&pid, _)| pid);
        match victim {
            Some(pid) => {
                if let Some(p) = self.processes.remove(&pid) {
                    self.entries -= p.entries();
                }
                true
            }
            None => false,
        }
    }
}

fn apply_success(p: &mut Process, class: ApiClass, ev: &Event, room: bool, stack: Option<crate::stacks::StackId>) -> Applied {
    let mut out = Applied { device: ev.device, size: ev.size, ..Default::default() };
    match class {
        ApiClass::Init => {}
        ApiClass::DeviceAlloc | ApiClass::HostAlloc => {
            let memory = if class == ApiClass::HostAlloc { Memory::HostPinned } else { Memory::Device };
            let device = if memory == Memory::HostPinned { DEVICE_UNKNOWN } else { p.current_device(ev.tid) };
            out.device = device;
            if !room {
                out.dropped = true;
                return out;
            }
            let ctx = p.current_ctx(ev.tid);
            let alloc = Allocation::new(ev.size, device, memory, p.ctx_index(ctx), ev.ts_ns, stack);
            // A pointer handed out twice: its free is late (another thread's,
            // not yet seen; see below) or was missed. Replace it, and remember
            // that a late free of this address may still come.
            if let Some(old) = p.allocs.insert(ev.addr, alloc) {
                credit_free(p, &old);
                p.note_displaced(ev.addr);
            }
            match memory {
                Memory::Device => {
                    let t = p.totals_mut(device);
                    t.live_bytes += ev.size;
                    t.live_allocs += 1;
                }
                Memory::HostPinned => {
                    p.host_pinned_bytes += ev.size;
                    p.host_pinned_allocs += 1;
                }
            }
        }
        // Events are ordered by their return. When one thread frees an address
        // and another gets it back from the allocator, the second thread's
        // allocation can return (and be seen) before the first thread's free.
        // A free that started before the live allocation at its address
        // returned cannot be freeing it: it freed the one displaced earlier
        // (already credited when the new allocation replaced it).
        ApiClass::DeviceFree | ApiClass::HostFree
            if p.allocs.get(&ev.addr).is_some_and(|cur| ev.ts_ns.saturating_sub(ev.latency_ns) < cur.ts_ns) =>
        {
            out.device = p.allocs[&ev.addr].device();
            out.size = 0;
            p.reordered_frees += 1;
            p.take_displaced(ev.addr);
        }
        ApiClass::DeviceFree | ApiClass::HostFree => match p.allocs.remove(&ev.addr) {
            Some(old) => {
                out.device = old.device();
                out.size = old.size;
                out.lifetime_ns = Some(ev.ts_ns.saturating_sub(old.ts_ns));
                credit_free(p, &old);
            }
            None => {
                out.device = if class == ApiClass::HostFree { DEVICE_UNKNOWN } else { p.current_device(ev.tid) };
                // The same, later still: the second thread has freed the
                // address too before the first thread's free is seen.
                if p.take_displaced(ev.addr) {
                    out.size = 0;
                    p.reordered_frees += 1;
                } else {
                    out.untracked = true;
                    p.untracked_frees += 1;
                }
            }
        },
        ApiClass::VmmCreate => {
            let device = if ev.device != DEVICE_UNKNOWN { ev.device } else { p.current_device(ev.tid) };
            out.device = device;
            if !room {
                out.dropped = true;
                return out;
            }
            let h = VmmHandle { size: ev.size, device, mappings: 0, released: false, ts_ns: ev.ts_ns, stack };
            if let Some(old) = p.vmm_handles.insert(ev.handle, h) {
                uncount_handle(p, &old);
            }
            let t = p.totals_mut(device);
            t.live_bytes += ev.size;
            t.live_allocs += 1;
            t.vmm_physical_bytes += ev.size;
            t.vmm_handles += 1;
        }
        ApiClass::VmmRelease => match p.vmm_handles.get_mut(&ev.handle) {
            Some(h) => {
                out.device = h.device;
                out.size = h.size;
                h.released = true;
                out.lifetime_ns = Some(ev.ts_ns.saturating_sub(h.ts_ns));
                // Physical memory goes only once no mapping refers to it.
                if h.mappings == 0 {
                    let h = p.vmm_handles.remove(&ev.handle).expect("present");
                    out.released.push(Release { device: h.device, bytes: h.size, allocs: 1 });
                    uncount_handle(p, &h);
                }
            }
            None => out.untracked = true,
        },
        ApiClass::VmmMap => {
            if let Some(h) = p.vmm_handles.get_mut(&ev.handle) {
                h.mappings += 1;
                out.device = h.device;
            } else {
                out.untracked = true;
            }
            if room {
                p.mappings.insert(ev.addr, Mapping { size: ev.size, handle: ev.handle });
            } else {
                out.dropped = true;
            }
        }
        ApiClass::VmmUnmap => {
            // Unmap covers [addr, addr+size): every mapping starting inside it.
            let end = ev.addr.saturating_add(ev.size);
            let starts: Vec<u64> = p.mappings.range(ev.addr..end).map(|(&a, _)| a).collect();
            if starts.is_empty() {
                out.untracked = true;
            }
            for start in starts {
                let m = p.mappings.remove(&start).expect("present");
                if let Some(h) = p.vmm_handles.get_mut(&m.handle) {
                    h.mappings = h.mappings.saturating_sub(1);
                    out.device = h.device;
                    if h.released && h.mappings == 0 {
                        let h = p.vmm_handles.remove(&m.handle).expect("present");
                        out.released.push(Release { device: h.device, bytes: h.size, allocs: 1 });
                        uncount_handle(p, &h);
                    }
                }
            }
        }
        ApiClass::VaReserve => {
            let device = p.current_device(ev.tid);
            out.device = device;
            if !room {
                out.dropped = true;
                return out;
            }
            if let Some((old, dev)) = p.reservations.insert(ev.addr, (ev.size, device)) {
                p.totals_mut(dev).reserved_bytes -= old;
            }
            p.totals_mut(device).reserved_bytes += ev.size;
        }
        ApiClass::VaFree => match p.reservations.remove(&ev.addr) {
            Some((size, dev)) => {
                out.device = dev;
                out.size = size;
                p.totals_mut(dev).reserved_bytes -= size;
            }
            None => out.untracked = true,
        },
        ApiClass::CtxRetainPrimary => {
            p.ctx_device.insert(ev.handle, ev.device);
            let prim = p.primary.entry(ev.device).or_insert(PrimaryCtx { ctx: ev.handle, refs: 0 });
            prim.ctx = ev.handle;
            prim.refs += 1;
            p.last_ctx = Some(ev.handle);
        }
        ApiClass::CtxReleasePrimary => {
            if let Some(prim) = p.primary.get_mut(&ev.device) {
                // Only a release that we saw drop the count to zero destroys it:
                // retains made before the trace are unknown.
                if prim.refs > 0 {
                    prim.refs -= 1;
                    if prim.refs == 0 {
                        let ctx = prim.ctx;
                        out.released = release_ctx(p, ctx);
                    }
                }
            }
        }
        ApiClass::CtxResetPrimary => {
            if let Some(prim) = p.primary.get_mut(&ev.device) {
                prim.refs = 0;
                let ctx = prim.ctx;
                out.released = release_ctx(p, ctx);
            }
        }
        ApiClass::CtxCreate => {
            // cuCtxCreate makes the new context current on the calling thread.
            p.ctx_device.insert(ev.handle, ev.device);
            p.thread_ctx.entry(ev.tid).or_default().push(ev.handle);
            p.last_ctx = Some(ev.handle);
        }
        ApiClass::CtxSetCurrent => {
            let stack = p.thread_ctx.entry(ev.tid).or_default();
            stack.pop();
            if ev.handle != 0 {
                stack.push(ev.handle);
            }
            out.device = p.ctx_device.get(&ev.handle).copied().unwrap_or(DEVICE_UNKNOWN);
        }
        ApiClass::CtxPush => {
            p.thread_ctx.entry(ev.tid).or_default().push(ev.handle);
            out.device = p.ctx_device.get(&ev.handle).copied().unwrap_or(DEVICE_UNKNOWN);
        }
        ApiClass::CtxPop => {
            if let Some(stack) = p.thread_ctx.get_mut(&ev.tid) {
                stack.pop();
            }
            out.device = p.ctx_device.get(&ev.handle).copied().unwrap_or(DEVICE_UNKNOWN);
        }
        ApiClass::CtxDestroy => {
            out.device = p.ctx_device.get(&ev.handle).copied().unwrap_or(DEVICE_UNKNOWN);
            out.released = release_ctx(p, ev.handle);
            out.size = out.released.iter().map(|r| r.bytes).sum();
            p.ctx_device.remove(&ev.handle);
            for stack in p.thread_ctx.values_mut() {
                stack.retain(|&c| c != ev.handle);
            }
            if p.last_ctx == Some(ev.handle) {
                p.last_ctx = None;
            }
            p.primary.retain(|_, prim| prim.ctx != ev.handle);
        }
        ApiClass::MemGetInfo => {
            let device = p.current_device(ev.tid);
            out.device = device;
            p.reported_free.insert(device, (ev.size, ev.aux));
        }
        ApiClass::ProcessExit => {}
    }
    out
}

/// A process's live device memory per device.
fn holdings(p: &Process) -> Vec<Release> {
    p.devices
        .iter()
        .filter(|(_, t)| t.live_allocs > 0)
        .map(|(&device, t)| Release { device, bytes: t.live_bytes, allocs: t.live_allocs })
        .collect()
}

fn credit_free(p: &mut Process, a: &Allocation) {
    match a.memory {
        Memory::Device => {
            let t = p.totals_mut(a.device());
            t.live_bytes -= a.size;
            t.live_allocs -= 1;
        }
        Memory::HostPinned => {
            p.host_pinned_bytes -= a.size;
            p.host_pinned_allocs -= 1;
        }
    }
}

fn uncount_handle(p: &mut Process, h: &VmmHandle) {
    let t = p.totals_mut(h.device);
    t.live_bytes -= h.size;
    t.live_allocs -= 1;
    t.vmm_physical_bytes -= h.size;
    t.vmm_handles -= 1;
}

/// Frees every device allocation made in `ctx` (destroying a context frees
/// its memory). VMM handles are not bound to a context and stay.
fn release_ctx(p: &mut Process, ctx: u64) -> Vec<Release> {
    let Some(ctx) = p.ctx_ids.iter().position(|&c| c == ctx).map(|i| i as u32) else { return Vec::new() };
    let addrs: Vec<u64> = p.allocs.iter().filter(|(_, a)| a.ctx == ctx && a.memory == Memory::Device).map(|(&k, _)| k).collect();
    let mut by_dev: BTreeMap<i32, Release> = BTreeMap::new();
    for addr in addrs {
        let a = p.allocs.remove(&addr).expect("present");
        let r = by_dev.entry(a.device()).or_insert(Release { device: a.device(), bytes: 0, allocs: 0 });
        r.bytes += a.size;
        r.allocs += 1;
        credit_free(p, &a);
    }
    by_dev.into_values().collect()
}

/// Process exit: the driver frees everything the process held.
fn release_all(p: &mut Process) -> Vec<Release> {
    let released = holdings(p);
    p.allocs.clear();
    p.vmm_handles.clear();
    p.mappings.clear();
    p.reservations.clear();
    p.devices.clear();
    p.host_pinned_bytes = 0;
    p.host_pinned_allocs = 0;
    p.thread_ctx.clear();
    p.ctx_device.clear();
    p.primary.clear();
    p.last_ctx = None;
    p.reported_free.clear();
    p.rm_objects.clear();
    p.rm_memory_bytes = 0;
    p.rm_memory_objects = 0;
    p.uvm_mappings.clear();
    p.uvm_mapped_bytes = 0;
    released
}

#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;
