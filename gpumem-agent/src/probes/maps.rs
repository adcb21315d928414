//! The agent's side of the kernel's maps: the pid filter, the event ring,
//! the loss counters, the in-flight call tables and the NVIDIA descriptors.
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use gpumem_common::names::map;
use gpumem_common::{
    counters::{Exit, Stat},
    filter,
};

use super::{ioctl, Agent, ProbeError};

impl Agent {
    /// Puts NVIDIA descriptors that the open tracepoint did not see (opened
    /// before we started, inherited, dup'ed) in the kernel's table.
    pub fn seed_nvidia_fds(&mut self) {
        if self.ioctl.path != ioctl::IoctlPath::Tracepoints || self.ioctl.error.is_some() {
            return;
        }
        let found = ioctl::scan_fds(&self.ioctl.prefix);
        let Some(map) = self.ebpf.map_mut(map::NV_FDS) else { return };
        let Ok(mut fds) = BpfHashMap::<_, gpumem_common::FdKey, u32>::try_from(map) else { return };
        for (key, kind) in found {
            if self.seeded.0.insert((key.tgid, key.fd)) && fds.insert(&key, &kind, 0).is_ok() {
                self.ioctl.seeded_fds += 1;
            }
        }
    }

    /// Traces this process (and with `follow`, the children it forks).
    pub fn add_pid(&mut self, pid: u32, follow: bool) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut(map::FILTER_PIDS).ok_or(ProbeError::MissingMap(map::FILTER_PIDS))?;
        let mut pids: BpfHashMap<_, u32, u32> =
            BpfHashMap::try_from(map).map_err(|source| ProbeError::Map { map: map::FILTER_PIDS, source: Box::new(source) })?;
        let value = if follow { filter::FOLLOW_CHILDREN } else { 0 };
        pids.insert(&pid, &value, 0).map_err(|source| ProbeError::Map { map: map::FILTER_PIDS, source: Box::new(source) })
    }

    /// Tells the kernel how many stack bytes to copy for these processes
    /// (learned from their unwinds). A failed update leaves the full copy.
    pub fn set_stack_copy_bytes(&mut self, updates: &[(u32, u32)]) {
        let Some(map) = self.ebpf.map_mut(map::STACK_COPY_BYTES) else { return };
        let Ok(mut m) = BpfHashMap::<_, u32, u32>::try_from(map) else { return };
        for (pid, bytes) in updates {
            let _ = m.insert(pid, bytes, 0);
        }
    }

    /// Where this Python process's version keeps its frames.
    pub fn set_python_layout(&mut self, pid: u32, layout: &gpumem_common::python::PyLayout) {
        if let Some(Ok(mut m)) = self.ebpf.map_mut(map::PY_LAYOUTS).map(BpfHashMap::<_, u32, gpumem_common::python::PyLayout>::try_from) {
            let _ = m.insert(&pid, layout, 0);
        }
    }

    /// The thread states of a Python process's threads (`now`), and its
    /// threads that are gone. A failed update leaves those threads without
    /// Python frames.
    pub fn set_python_threads(&mut self, pid: u32, now: &[(u32, u64)], gone: &[u32]) {
        let Some(Ok(mut m)) = self.ebpf.map_mut(map::PY_THREADS).map(BpfHashMap::<_, u64, u64>::try_from) else { return };
        let key = |tid: u32| (pid as u64) << 32 | tid as u64;
        for &tid in gone {
            let _ = m.remove(&key(tid));
        }
        for &(tid, tstate) in now {
            let _ = m.insert(&key(tid), &tstate, 0);
        }
    }

    /// A Python process is gone: its layout and threads leave the kernel's tables.
    pub fn forget_python(&mut self, pid: u32, tids: &[u32]) {
        self.set_python_threads(pid, &[], tids);
        if let Some(Ok(mut m)) = self.ebpf.map_mut(map::PY_LAYOUTS).map(BpfHashMap::<_, u32, gpumem_common::python::PyLayout>::try_from) {
            let _ = m.remove(&pid);
        }
    }

    /// The event ring and the stack ring, handed to the reader once.
    pub fn take_rings(&mut self) -> Result<(RingBuf<MapData>, RingBuf<MapData>), ProbeError> {
        Ok((self.take_ring(map::EVENTS)?, self.take_ring(map::STACKS)?))
    }

    fn take_ring(&mut self, name: &'static str) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self.ebpf.take_map(name).ok_or(ProbeError::MissingMap(name))?;
        RingBuf::try_from(map).map_err(|source| ProbeError::Map { map: name, source: Box::new(source) })
    }

    /// Kernel-side drop counters, summed over CPUs, in `stat` index order.
    /// Returns without their entry that were no loss: while a new agent's
    /// links overlap the last one's, each call's return runs twice and the
    /// second finds its entry taken (see runtime/continuity.rs).
    pub fn discount_duplicate_returns(&mut self, n: u64) {
        self.duplicate_returns += n;
    }

    /// A per-CPU counter array, each slot summed over the CPUs.
    fn summed<const N: usize>(&self, name: &'static str) -> Result<[u64; N], ProbeError> {
        let map = self.ebpf.map(name).ok_or(ProbeError::MissingMap(name))?;
        let counts: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|source| ProbeError::Map { map: name, source: Box::new(source) })?;
        let mut out = [0u64; N];
        for (i, slot) in out.iter_mut().enumerate() {
            let values = counts.get(&(i as u32), 0).map_err(|source| ProbeError::Map { map: name, source: Box::new(source) })?;
            *slot = values.iter().sum();
        }
        Ok(out)
    }

    pub fn kernel_stats(&self) -> Result<[u64; Stat::COUNT as usize], ProbeError> {
        let mut out = self.summed::<{ Stat::COUNT as usize }>(map::STATS)?;
        let rwe = &mut out[Stat::ReturnWithoutEntry.index()];
        *rwe = rwe.saturating_sub(self.duplicate_returns);
        Ok(out)
    }

    /// Everything the kernel side counted: losses (with the per-process ones
    /// and the reader's own counts), full tables and dropped stacks.
    pub fn kernel_counters(
        &self,
        reader: gpumem_engine::model::lost::ReaderCounts,
    ) -> Result<gpumem_engine::model::lost::KernelCounters, ProbeError> {
        let stats = self.kernel_stats()?;
        let exits = self.summed::<{ Exit::COUNT as usize }>(map::EXITS)?;
        let map = self.ebpf.map(map::LOST_BY_PID).ok_or(ProbeError::MissingMap(map::LOST_BY_PID))?;
        let by_pid: aya::maps::PerCpuHashMap<_, u32, u64> = aya::maps::PerCpuHashMap::try_from(map)
            .map_err(|source| ProbeError::Map { map: map::LOST_BY_PID, source: Box::new(source) })?;
        // An entry removed while iterating ends the walk early; the next read has it.
        let by_pid = by_pid.iter().filter_map(Result::ok).map(|(pid, per_cpu)| (pid, per_cpu.iter().sum())).collect();
        Ok(gpumem_engine::model::lost::KernelCounters::from_stats(&stats, &exits, reader, by_pid))
    }

    /// Removes the saved entries of calls whose thread is gone: a thread
    /// killed inside the driver never returns, and its entry would hold a
    /// slot of the in-flight tables (PENDING_MAX) for good. No allocation
    /// is counted for such a call: only a return says what it did.
    pub fn sweep_stale_calls(&mut self) {
        // Value types only need the maps' value sizes: only keys are read.
        let removed = self
            .remove_dead_threads::<gpumem_common::PendingKey, [u64; gpumem_common::PENDING_VALUE_WORDS]>(map::PENDING, |k| k.pid_tgid)
            + self.remove_dead_threads::<u64, [u64; 3]>(map::IOCTL_PENDING, |&k| k)
            + self.remove_dead_threads::<u64, u32>(map::OPEN_PENDING, |&k| k);
        self.stale_calls_removed += removed as u64;
    }

    /// Removes the entries of map `name` whose thread (`pid_tgid` of the key)
    /// no longer exists; how many.
    fn remove_dead_threads<K: aya::Pod, V: aya::Pod>(&mut self, name: &str, pid_tgid: impl Fn(&K) -> u64) -> usize {
        let Some(Ok(mut m)) = self.ebpf.map_mut(name).map(BpfHashMap::<_, K, V>::try_from) else { return 0 };
        let alive = |t: u64| gpumem_engine::procfs::alive((t >> 32) as u32, Some(t as u32));
        let stale: Vec<K> = m.keys().filter_map(Result::ok).filter(|k| !alive(pid_tgid(k))).collect();
        stale.iter().filter(|k| m.remove(k).is_ok()).count()
    }

    /// Drops the per-process loss counts of processes that are gone and no
    /// longer in the agent's state, so that the kernel table (LOST_PIDS_MAX)
    /// does not fill up over a daemon's life.
    pub fn forget_lost(&mut self, keep: impl Fn(u32) -> bool) {
        let Some(map) = self.ebpf.map_mut(map::LOST_BY_PID) else { return };
        let Ok(mut by_pid) = aya::maps::PerCpuHashMap::<_, u32, u64>::try_from(map) else { return };
        let gone: Vec<u32> =
            by_pid.keys().filter_map(Result::ok).filter(|&pid| !keep(pid) && !gpumem_engine::procfs::alive(pid, None)).collect();
        for pid in gone {
            let _ = by_pid.remove(&pid);
        }
    }
}
