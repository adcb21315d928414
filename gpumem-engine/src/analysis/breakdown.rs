//! Where a process's memory on a device went: its own bytes by owner
//! (owners.rs) and by stream-ordered pool, and beside them what it maps
//! of other processes (imports: their exporters' bytes, never its own).
use serde::Serialize;

use super::owners::OwnerBytes;
use crate::state::{share, Process, Suspension, Via};

/// Imports shown per process and device, by exporter; the rest summed as one
/// line with no exporter named.
pub const IMPORTERS_SHOWN: usize = 8;
/// Pools shown per process and device, the largest first.
pub const POOLS_SHOWN: usize = 8;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Its own live memory by the module (or Python file) that asked the
    /// driver for it: the largest owners, then `other`.
    pub by_owner: Vec<OwnerBytes>,
    /// Of its own live memory, what stream-ordered pools hold in live
    /// allocations (what a pool keeps beyond them is inside the driver: it
    /// is in NVML's figure for the process, not here).
    pub pools: Vec<PoolBytes>,
    /// Other processes' memory mapped here (IPC, pool pointers): counted
    /// for its exporter and never in this process's live bytes.
    pub imported_bytes: u64,
    pub imported: Vec<ImportedFrom>,
    /// CUDA graphs' memory allocation nodes on this device: what the graph
    /// memory pool hands out when they run (declared by the nodes; the
    /// pool's physical size is the driver's, in NVML's figure).
    pub graph_pool: Option<Box<GraphPool>>,
    /// Multicast objects (NVLS) with memory of this device bound to them:
    /// that memory is the process's own handles, already in its bytes.
    pub multicast: Vec<MulticastBytes>,
    /// A checkpointing tool's hold on the process: while `checkpointed`,
    /// its memory is off the GPU, suspended, not freed and not a leak.
    pub suspension: Option<SuspensionOf>,
    /// What NVML says the process takes on the GPU beyond everything traced.
    pub overhead: Overhead,
}

/// NVML's figure for the process on the GPU minus its traced live bytes:
/// its context, loaded modules, the driver's reserves, what pools and the
/// graph pool keep beyond their live allocations. Where NVML cannot say,
/// `bytes` is None and `reason` says why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Overhead {
    pub bytes: Option<i64>,
    pub nvml_bytes: Option<u64>,
    pub reason: Option<&'static str>,
}

impl Overhead {
    /// The overhead of `pid` on the GPU (or MIG instance) `at`, holding
    /// `traced` live bytes there, by what NVML read last.
    pub fn of(pid: u32, at: &super::placement::Placement, traced: u64, gpus: &super::health::GpuWatch) -> Overhead {
        let why = |r: &'static str| Overhead { reason: Some(r), ..Default::default() };
        if gpus.latest.is_empty() {
            // The same in a replay as live: why NVML is missing is said once, as `nvml`.
            return why("no NVML reading; its status says why");
        }
        let Some(g) = at.gpu.and_then(|d| gpus.latest.iter().find(|g| g.index == d)) else {
            return why("NVML lists no GPU of this index (CUDA_VISIBLE_DEVICES may renumber them)");
        };
        let listed = match &at.mig {
            Some(m) => g.mig.iter().find(|i| i.gpu_instance_id == m.gpu_instance_id).and_then(|i| i.processes.as_ref()),
            None => g.processes.as_ref(),
        };
        let Some(procs) = listed else {
            return why("NVML gives no per-process figures on this GPU (MIG, MPS, or too few privileges)");
        };
        match procs.iter().find(|(p, _)| *p == pid) {
            Some(&(_, nvml)) => Overhead { bytes: Some(nvml as i64 - traced as i64), nvml_bytes: Some(nvml), reason: None },
            None => why("NVML does not list this process on this GPU"),
        }
    }
}

impl Breakdown {
    pub fn is_empty(&self) -> bool {
        self.by_owner.is_empty()
            && self.pools.is_empty()
            && self.imported.is_empty()
            && self.graph_pool.is_none()
            && self.multicast.is_empty()
            && self.suspension.is_none()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GraphPool {
    pub bytes: u64,
    pub nodes: u64,
    pub graphs: u64,
    /// cuDeviceGraphMemTrim calls for this device.
    pub trims: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MulticastBytes {
    pub handle: String,
    /// The object's size and the devices it spans (asked; added so far).
    pub size: u64,
    pub devices: u64,
    pub devices_added: u64,
    /// Bytes of this device's memory bound to it.
    pub bound_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SuspensionOf {
    pub state: Suspension,
    /// The checkpointing tool's pid.
    pub by_pid: u32,
    /// CLOCK_MONOTONIC ns of the call that put it there.
    pub since_ns: u64,
}

/// What one exporter's memory mapped here comes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImportedFrom {
    /// None: its export was not seen (made before tracing began, by an
    /// untraced process, or freed since): its bytes are then unknown (0).
    pub pid: Option<u32>,
    pub comm: String,
    pub via: Via,
    pub bytes: u64,
    pub mappings: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolBytes {
    /// The pool's handle, or `default` for the device's own pool.
    pub pool: String,
    pub bytes: u64,
    pub allocations: u64,
    /// cuMemPoolTrimTo calls (what each gave back is not visible from outside).
    pub trims: u64,
    /// cuMemPoolDestroy was called; it goes with its last allocation.
    pub destroyed: bool,
}

/// The breakdown of `p` on `device`, its owners already found.
pub fn of(p: &Process, device: i32, by_owner: Vec<OwnerBytes>) -> Breakdown {
    let mut pools: Vec<PoolBytes> = share::pools_on(p, device)
        .into_iter()
        .filter(|(_, u)| u.allocs > 0)
        .map(|(k, u)| PoolBytes {
            pool: if k.pool == 0 { "default".into() } else { format!("{:#x}", k.pool) },
            bytes: u.bytes,
            allocations: u.allocs,
            trims: u.trims,
            destroyed: u.destroyed,
        })
        .collect();
    pools.truncate(POOLS_SHOWN);
    let mut imported: Vec<ImportedFrom> = Vec::new();
    for i in p.held.sharing().imports.values().filter(|i| i.device == device) {
        match imported.iter_mut().find(|f| f.pid == i.from_pid && f.via == i.via) {
            Some(f) => {
                f.bytes += i.size;
                f.mappings += 1;
            }
            None => imported.push(ImportedFrom { pid: i.from_pid, comm: i.from_comm.clone(), via: i.via, bytes: i.size, mappings: 1 }),
        }
    }
    imported.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    if imported.len() > IMPORTERS_SHOWN {
        let rest = imported.split_off(IMPORTERS_SHOWN);
        let via = rest[0].via;
        imported.push(ImportedFrom {
            pid: None,
            comm: "other".into(),
            via,
            bytes: rest.iter().map(|f| f.bytes).sum(),
            mappings: rest.iter().map(|f| f.mappings).sum(),
        });
    }
    let nodes: Vec<_> = p.held.sharing().graph_nodes.values().filter(|n| n.device == device).collect();
    let trims = p.held.sharing().graph_trims.get(&device).copied().unwrap_or(0);
    let graph_pool = (!nodes.is_empty() || trims > 0).then(|| {
        let mut graphs: Vec<u64> = nodes.iter().map(|n| n.graph).collect();
        graphs.sort_unstable();
        graphs.dedup();
        Box::new(GraphPool { bytes: nodes.iter().map(|n| n.size).sum(), nodes: nodes.len() as u64, graphs: graphs.len() as u64, trims })
    });
    let mut multicast: Vec<MulticastBytes> = p
        .held
        .sharing()
        .multicast
        .iter()
        .filter(|(_, m)| m.added.contains(&device) || m.bound.iter().any(|b| b.0 == device))
        .map(|(&h, m)| MulticastBytes {
            handle: format!("{h:#x}"),
            size: m.size,
            devices: m.devices,
            devices_added: m.added.len() as u64,
            bound_bytes: m.bound.iter().filter(|b| b.0 == device).map(|b| b.2).sum(),
        })
        .collect();
    multicast.sort_by(|a, b| b.bound_bytes.cmp(&a.bound_bytes).then(a.handle.cmp(&b.handle)));
    multicast.truncate(POOLS_SHOWN);
    let suspension = p.suspension.map(|(state, by_pid, since_ns)| SuspensionOf { state, by_pid, since_ns });
    let imported_bytes = imported.iter().map(|f| f.bytes).sum();
    Breakdown { by_owner, pools, imported_bytes, imported, graph_pool, multicast, suspension, overhead: Overhead::default() }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing::ev, Limits, State};

    const MIB: u64 = 1 << 20;

    fn on(pid: u32, ts_ns: u64, e: Event) -> Event {
        Event { pid, tid: pid, ts_ns, ..e }
    }

    #[test]
    fn imports_are_grouped_by_exporter_and_empty_pools_left_out() {
        let mut s = State::new(Limits::default());
        for pid in [100, 200, 300] {
            s.apply(&on(pid, 1, Event { handle: 0xc0, device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }));
            s.apply(&on(pid, 1, Event { handle: 0xc0, ..ev(api::CU_CTX_SET_CURRENT) }));
        }
        for (pid, addr, key) in [(100, 0x1000, 1), (100, 0x2000, 2), (300, 0x3000, 3)] {
            s.apply(&on(pid, 2, Event { addr, size: 2 * MIB, ..ev(api::CU_MEM_ALLOC_V2) }));
            s.apply(&on(pid, 3, Event { addr, handle: key, ..ev(api::CU_IPC_GET_MEM_HANDLE) }));
        }
        for (addr, key) in [(0x9000, 1), (0xa000, 2), (0xb000, 3), (0xc000, 4)] {
            s.apply(&on(200, 4, Event { addr, handle: key, ..ev(api::CU_IPC_OPEN_MEM_HANDLE_V2) }));
        }
        s.apply(&on(200, 5, Event { handle: 0x77, device: 0, ..ev(api::CU_MEM_POOL_CREATE) }));
        let b = of(&s.processes[&200], 0, Vec::new());
        assert_eq!(b.imported_bytes, 6 * MIB);
        let from: Vec<(Option<u32>, u64, u64)> = b.imported.iter().map(|i| (i.pid, i.bytes, i.mappings)).collect();
        assert_eq!(from, [(Some(100), 4 * MIB, 2), (Some(300), 2 * MIB, 1), (None, 0, 1)], "largest first; the unknown one said");
        assert!(b.pools.is_empty(), "a pool with nothing live is not shown");
        assert!(!b.is_empty());
    }
}
