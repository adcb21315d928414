//! Live allocation state per process and device, built from typed events.
//!
//! Failed calls are counted and change nothing. Everything held is bounded by
//! `Limits`; what does not fit is counted in `Overflow`, never dropped silently.
//! Each concern is a file of methods on `Process`: alloc.rs, vmm.rs, ctx.rs,
//! ioctl.rs; this file decides which applies.
mod alloc;
mod allocations;
mod checkpoint;
mod ctx;
mod graph;
mod ioctl;
mod outcome;
pub mod process;
mod processes;
pub mod share;
pub mod tensor;
mod vmm;

use std::collections::BTreeMap;

use gpumem_common::{api_info, cu_result, ApiClass, ApiInfo, Event, DEVICE_UNKNOWN};
use rustc_hash::FxHashMap;

use crate::{events::Kind, stacks::StackId};
pub use outcome::{Applied, CudaOom, Holder, OomCounters, OomKill, Release, OOM_TOP_HOLDERS};
pub use process::{Allocation, Failure, Import, Memory, PoolKey, PoolUse, Process, Sharing, Suspension, Via, VmmHandle};
pub use processes::Processes;

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
    /// Exports not remembered because the export table was full
    /// (`share::EXPORTS_MAX`): their importers read "exporter unknown".
    pub exports_dropped: u64,
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

#[derive(Debug, Default)]
pub struct State {
    pub limits: Limits,
    pub processes: Processes,
    pub overflow: Overflow,
    entries: usize,
    pub events: u64,
    pub oom: OomCounters,
    /// New processes seen on the pid of one that had exited (see `process_for`).
    pub pid_reuses: u64,
    /// Calls of a process read after its exit (begun before it): not applied.
    pub late_events: u64,
    /// Successful calls with a size no GPU could hold: not applied.
    pub implausible_events: u64,
    /// Events of an id this agent does not know: not applied.
    pub unknown_events: u64,
    /// The one GPU NVML lists each process on (see `assume_devices`).
    device_hints: FxHashMap<u32, i32>,
    /// Processes forgotten (evicted or aged out) since the last `take_forgotten`.
    forgotten: Vec<u32>,
    /// Shared allocations by the key of their handle bytes (share.rs).
    exports: FxHashMap<u64, share::Export>,
}

impl State {
    pub fn new(limits: Limits) -> Self {
        State { limits, ..Default::default() }
    }

    /// What the live state takes on the agent's heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        let processes: u64 = self.processes.values().map(Process::heap_bytes).sum();
        processes + self.processes.heap_bytes() + crate::heap::hash_table::<u64, share::Export>(self.exports.capacity())
    }

    /// Table entries held across all processes.
    #[cfg(test)]
    pub fn live_entries(&self) -> usize {
        self.entries
    }

    /// Applies an event, decoding its kind (tests; the pipeline decodes once).
    #[cfg(test)]
    pub fn apply(&mut self, ev: &Event) -> Applied {
        self.apply_kind(ev, &Kind::of(ev), None)
    }

    /// The same, with the stack it was unwound to (tests).
    #[cfg(test)]
    pub fn apply_with_stack(&mut self, ev: &Event, stack: Option<StackId>) -> Applied {
        self.apply_kind(ev, &Kind::of(ev), stack)
    }

    /// Applies an event of a known kind whose caller's stack was unwound to `stack`.
    pub fn apply_kind(&mut self, ev: &Event, kind: &Kind, stack: Option<StackId>) -> Applied {
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
        match kind {
            // The victim need not be a CUDA process: do not create one for it.
            Kind::OomKill(_) => return self.oom_kill(ev.pid),
            Kind::Unknown => {
                self.unknown_events += 1;
                return Applied { device: ev.device, dropped: true, ..Default::default() };
            }
            _ => {}
        }
        let Some(proc) = self.process_for(ev, kind) else {
            return Applied { device: ev.device, size: ev.size, dropped: true, ..Default::default() };
        };
        if proc.exited && !matches!(kind, Kind::Exit) {
            // A call the dead process began before its exit, read after it:
            // the driver freed everything at exit, there is nothing to apply.
            self.late_events += 1;
            return Applied { device: ev.device, ..Default::default() };
        }
        note_comm(proc, ev);
        match kind {
            Kind::Exit => self.exit(ev),
            Kind::Rm(call) => ioctl_call(proc, ev, |p, out| p.apply_rm(call, out)),
            Kind::Uvm(call) => ioctl_call(proc, ev, |p, out| p.apply_uvm(call, out)),
            Kind::Cuda(info) if ev.result != 0 => self.failed_call(info, ev),
            Kind::Cuda(info) => self.successful_call(info, ev, stack),
            Kind::TensorAlloc | Kind::TensorFree => self.tensor_call(kind, ev, stack),
            Kind::OomKill(_) | Kind::Unknown => unreachable!("returned above"),
        }
    }

    /// The process an event belongs to, created if new. None: the process
    /// table is full of live processes. A call that began after the exit of
    /// the process we knew by this pid is a new process's (the kernel reused
    /// the pid): it starts afresh, so that nothing of the old one carries
    /// over; a call that began before it is returned with the exited process.
    fn process_for(&mut self, ev: &Event, kind: &Kind) -> Option<&mut Process> {
        let reused = match self.processes.get(&ev.pid) {
            Some(p) => p.exited && !matches!(kind, Kind::Exit) && ev.ts_ns.saturating_sub(ev.latency_ns) > p.exited_ns,
            None => {
                if self.processes.len() >= self.limits.max_processes && !self.evict_exited() {
                    self.overflow.process_events_dropped += 1;
                    return None;
                }
                true
            }
        };
        if reused {
            if self.processes.contains_key(&ev.pid) {
                self.pid_reuses += 1;
            }
            let mut p = Process::new(ev.pid);
            p.assumed_device = self.device_hints.get(&ev.pid).copied();
            self.processes.insert(ev.pid, p);
        }
        self.processes.get_mut(&ev.pid)
    }

    fn exit(&mut self, ev: &Event) -> Applied {
        let p = self.processes.get_mut(&ev.pid).expect("present");
        let before = p.entries();
        let released = p.holdings();
        // Everything the driver frees at exit, in one statement.
        p.held = Default::default();
        p.exited = true;
        p.exited_ns = ev.ts_ns;
        p.held_at_exit_bytes = released.iter().map(|r| r.bytes).sum();
        let size = p.held_at_exit_bytes;
        self.entries -= before;
        self.drop_exports_of(ev.pid);
        Applied { device: DEVICE_UNKNOWN, size, released, ..Default::default() }
    }

    fn failed_call(&mut self, info: &ApiInfo, ev: &Event) -> Applied {
        let p = self.processes.get_mut(&ev.pid).expect("present");
        p.count_call(ev.api, ev.result);
        p.last_failure = Some(Failure { api: ev.api, result: ev.result, ts_ns: ev.ts_ns });
        let device = if ev.device != DEVICE_UNKNOWN { ev.device } else { p.current_device(ev.tid) };
        let mut applied = Applied { device, size: ev.size, ..Default::default() };
        if ev.result == cu_result::OUT_OF_MEMORY && matches!(info.class, ApiClass::DeviceAlloc | ApiClass::VmmCreate) {
            let reported_free = p.held.reported_free.get(&device).map(|&(free, _)| free);
            let blocks = p.free_blocks(device);
            let cached = blocks.map(|b| b.unused_bytes);
            let fragmentation = reported_free.is_some_and(|free| free >= ev.size) || cached.is_some_and(|c| c >= ev.size);
            self.oom.cuda_ooms += 1;
            self.oom.fragmentation_ooms += fragmentation as u64;
            let holders = self.top_holders(device, OOM_TOP_HOLDERS);
            applied.cuda_oom = Some(Box::new(CudaOom {
                device,
                requested: ev.size,
                reported_free,
                fragmentation,
                reserved_unused: cached,
                largest_free_block: blocks.map(|b| b.largest_free_block),
                holders,
            }));
        }
        applied
    }

    fn successful_call(&mut self, info: &ApiInfo, ev: &Event, stack: Option<StackId>) -> Applied {
        match info.class {
            ApiClass::Export | ApiClass::Import | ApiClass::ImportClose | ApiClass::HandleExport | ApiClass::HandleImport => {
                return self.share_call(info.class, ev)
            }
            ApiClass::Checkpoint => return self.checkpoint_call(ev),
            _ => {}
        }
        self.apply_counted(ev, |p, room, out| match info.class {
            ApiClass::Init | ApiClass::ProcessExit => {}
            ApiClass::DeviceAlloc | ApiClass::HostAlloc => p.apply_alloc(info.class, ev, room, stack, out),
            ApiClass::DeviceFree | ApiClass::HostFree => p.apply_free(info.class, ev, out),
            ApiClass::VmmCreate | ApiClass::VmmRelease | ApiClass::VmmMap | ApiClass::VmmUnmap | ApiClass::VaReserve | ApiClass::VaFree => {
                p.apply_vmm(info.class, ev, room, stack, out)
            }
            ApiClass::CtxRetainPrimary
            | ApiClass::CtxReleasePrimary
            | ApiClass::CtxResetPrimary
            | ApiClass::CtxCreate
            | ApiClass::CtxSetCurrent
            | ApiClass::CtxPush
            | ApiClass::CtxPop
            | ApiClass::CtxDestroy
            | ApiClass::MemGetInfo
            | ApiClass::GreenCtxCreate
            | ApiClass::CtxFromGreen
            | ApiClass::GreenCtxDestroy => p.apply_ctx(info.class, ev, out),
            ApiClass::PoolCreate | ApiClass::PoolDestroy | ApiClass::PoolTrim | ApiClass::PoolSetDevice => {
                p.apply_pool(info.class, ev, out)
            }
            ApiClass::GraphAlloc | ApiClass::GraphFree | ApiClass::GraphTrim | ApiClass::GraphDestroy => {
                p.apply_graph(info.class, ev, room, out)
            }
            ApiClass::MulticastCreate | ApiClass::MulticastAddDevice | ApiClass::MulticastBind | ApiClass::MulticastUnbind => {
                p.apply_multicast(info.class, ev, room, out)
            }
            ApiClass::HandleRetain => p.retain_handle(ev.handle, out),
            ApiClass::DeviceUuid => p.note_uuid(ev),
            ApiClass::Export
            | ApiClass::Import
            | ApiClass::ImportClose
            | ApiClass::HandleExport
            | ApiClass::HandleImport
            | ApiClass::Checkpoint => unreachable!("applied above"),
        })
    }

    /// A PyTorch allocator probe: a tensor handed out or given back.
    fn tensor_call(&mut self, kind: &Kind, ev: &Event, stack: Option<StackId>) -> Applied {
        self.apply_counted(ev, |p, room, out| match kind {
            Kind::TensorAlloc => p.apply_tensor_alloc(ev, room, stack, out),
            _ => p.apply_tensor_free(ev, out),
        })
    }

    /// Applies a successful event to its process with `apply(process, room,
    /// out)` (`room`: the global table has space), counting the call and
    /// keeping the global entry count and the overflow counter right.
    fn apply_counted(&mut self, ev: &Event, apply: impl FnOnce(&mut Process, bool, &mut Applied)) -> Applied {
        let room = self.entries < self.limits.max_entries;
        let p = self.processes.get_mut(&ev.pid).expect("present");
        p.count_call(ev.api, 0);
        let before = p.entries();
        let mut out = Applied { device: ev.device, size: ev.size, ..Default::default() };
        apply(p, room, &mut out);
        self.entries = self.entries + p.entries() - before;
        if out.dropped {
            self.overflow.entries_dropped += 1;
        }
        out
    }

    /// A host OOM kill: the victim's holdings at that moment.
    fn oom_kill(&mut self, victim: u32) -> Applied {
        self.oom.host_oom_kills += 1;
        let holdings = self.processes.get(&victim).map(Process::holdings).unwrap_or_default();
        Applied { device: DEVICE_UNKNOWN, oom_kill: Some(Box::new(OomKill { holdings, ..Default::default() })), ..Default::default() }
    }

    /// A process whose calls run in a context the agent never saw created
    /// (made before it started) has its memory on an unknown device. Where
    /// NVML lists the process on exactly one GPU, that is the device: for
    /// the processes known now, and for those first seen later.
    pub fn assume_devices(&mut self, gpus: &[crate::model::nvml::GpuSample]) {
        let mut on: FxHashMap<u32, Option<i32>> = FxHashMap::default();
        for g in gpus {
            for &(pid, _) in g.processes.iter().flatten() {
                // A process on two GPUs has no single device to assume.
                on.entry(pid).and_modify(|d| *d = d.filter(|&d| d == g.index as i32)).or_insert(Some(g.index as i32));
            }
        }
        self.device_hints = on.into_iter().filter_map(|(pid, d)| Some((pid, d?))).collect();
        for p in self.processes.values_mut_unordered().filter(|p| !p.exited && p.assumed_device.is_none()) {
            if let Some(&device) = self.device_hints.get(&p.pid) {
                if p.held.devices.contains_key(&DEVICE_UNKNOWN) || p.held.contexts.device_of.is_empty() {
                    p.assume_device(device);
                }
            }
        }
    }

    /// Marks the processes that lost events (cumulative counts per pid, as
    /// the kernel keeps them) as uncertain.
    /// Whether the process holds what a key of the kernel's table names
    /// (`gpumem_common::live`): Some(its time, 0 where none is kept) if so.
    pub fn held_entry(&self, pid: u32, kind: u32, id: u64) -> Option<u64> {
        use gpumem_common::live::kind as k;
        let h = &self.processes.get(&pid)?.held;
        match kind {
            k::ALLOC => h.allocs.get(id).map(|a| a.ts_ns),
            k::TENSOR => h.tensors.get(&id).map(|a| a.ts_ns),
            k::VMM_HANDLE => h.vmm_handles.get(&id).map(|v| v.ts_ns),
            k::VMM_MAP => h.mappings.contains_key(&id).then_some(0),
            k::VA => h.reservations.contains_key(&id).then_some(0),
            k::CTX => h.contexts.device_of.contains_key(&id).then_some(0),
            k::PRIMARY_CTX => h.contexts.primary.contains_key(&(id as u32 as i32)).then_some(0),
            _ => None,
        }
    }

    /// Sets the stack of the allocation or VMM handle an event made; its
    /// device, if held.
    pub fn set_stack(&mut self, ev: &Event, stack: StackId) -> Option<i32> {
        let p = self.processes.get_mut(&ev.pid)?;
        if ev.api == gpumem_common::api::CU_MEM_CREATE {
            let h = p.held.vmm_handles.get_mut(&ev.handle)?;
            h.stack = Some(stack);
            return Some(h.device);
        }
        if ev.api != gpumem_common::api::TENSOR_ALLOC {
            return p.held.allocs.set_stack(ev.addr, stack);
        }
        let a = p.held.tensors.get_mut(&ev.addr)?;
        a.set_stack(stack);
        Some(a.device())
    }

    pub fn mark_lost(&mut self, by_pid: &BTreeMap<u32, u64>) {
        for (pid, &n) in by_pid {
            if let Some(p) = self.processes.get_mut(pid) {
                p.events_lost = p.events_lost.max(n);
            }
        }
    }

    /// Processes alive, and the device memory they hold in all.
    pub fn live_totals(&self) -> (usize, u64) {
        let alive = self.processes.values().filter(|p| !p.exited);
        alive.fold((0, 0), |(n, bytes), p| (n + 1, bytes + p.held.devices.values().map(|t| t.live_bytes).sum::<u64>()))
    }

    /// The processes holding the most memory on a device, most first.
    pub fn top_holders(&self, device: i32, n: usize) -> Vec<Holder> {
        let mut holders: Vec<Holder> = self
            .processes
            .values()
            .filter_map(|p| {
                let t = p.held.devices.get(&device)?;
                (t.live_allocs > 0).then(|| Holder { pid: p.pid, comm: p.comm.clone(), bytes: t.live_bytes, allocs: t.live_allocs })
            })
            .collect();
        holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
        holders.truncate(n);
        holders
    }

    /// Forgets processes that exited before `cutoff_ns` (CLOCK_MONOTONIC), so
    /// that a long-running agent does not keep every pid it ever saw. Their
    /// pids are also handed out by `take_forgotten`.
    pub fn forget_exited_before(&mut self, cutoff_ns: u64) -> Vec<u32> {
        let gone: Vec<u32> = self.processes.values().filter(|p| p.exited && p.exited_ns < cutoff_ns).map(|p| p.pid).collect();
        for &pid in &gone {
            self.forget(pid);
        }
        gone
    }

    /// The processes forgotten since the last call (aged out or evicted), so
    /// that whatever else is kept per process can go too.
    pub fn take_forgotten(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.forgotten)
    }

    /// Whether a process was forgotten since the last `take_forgotten`.
    pub fn has_forgotten(&self) -> bool {
        !self.forgotten.is_empty()
    }

    fn forget(&mut self, pid: u32) {
        if let Some(p) = self.processes.remove(&pid) {
            self.entries -= p.entries();
            self.forgotten.push(pid);
            self.drop_exports_of(pid);
        }
    }

    /// Makes room by forgetting the oldest exited process. False if none.
    fn evict_exited(&mut self) -> bool {
        let lowest_exited = self.processes.iter().find(|(_, p)| p.exited).map(|(&pid, _)| pid);
        match lowest_exited {
            Some(pid) => {
                self.forget(pid);
                true
            }
            None => false,
        }
    }
}

/// The main thread's comm is the process's name; compare bytes first so
/// that the common case (unchanged) allocates nothing.
fn note_comm(p: &mut Process, ev: &Event) {
    if !(p.comm.is_empty() || ev.tid == ev.pid) || p.seen_comm == ev.comm {
        return;
    }
    p.seen_comm = ev.comm;
    let comm = ev.comm_bytes();
    if !comm.is_empty() && p.comm.as_bytes() != comm {
        p.comm = String::from_utf8_lossy(comm).into_owned();
    }
}

/// An ioctl: counted; applied when the RM status says it succeeded.
fn ioctl_call(p: &mut Process, ev: &Event, apply: impl FnOnce(&mut Process, &mut Applied)) -> Applied {
    p.count_call(ev.api, ev.result);
    let mut out = Applied { device: DEVICE_UNKNOWN, size: ev.size, ..Default::default() };
    if ev.result == 0 {
        apply(p, &mut out);
    }
    out
}

#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;
