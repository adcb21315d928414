//! Where a process's memory on a device went: its own bytes by owner
//! (owners.rs) and by stream-ordered pool, and beside them what it maps
//! of other processes (imports: their exporters' bytes, never its own).
use serde::{Deserialize, Serialize};

use super::owners::OwnerBytes;
use crate::state::{share, Process, Via};

/// Imports shown per process and device, by exporter; the rest summed as one
/// line with no exporter named.
pub const IMPORTERS_SHOWN: usize = 8;
/// Pools shown per process and device, the largest first.
pub const POOLS_SHOWN: usize = 8;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
}

impl Breakdown {
    pub fn is_empty(&self) -> bool {
        self.by_owner.is_empty() && self.pools.is_empty() && self.imported.is_empty()
    }
}

/// What one exporter's memory mapped here comes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedFrom {
    /// None: its export was not seen (made before tracing began, by an
    /// untraced process, or freed since): its bytes are then unknown (0).
    pub pid: Option<u32>,
    pub comm: String,
    pub via: Via,
    pub bytes: u64,
    pub mappings: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    for i in p.held.imports.values().filter(|i| i.device == device) {
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
    Breakdown { by_owner, pools, imported_bytes: p.totals(device).imported_bytes, imported }
}
