//! Memory shared between processes and the pools it comes from.
//!
//! An exported allocation (cuIpcGetMemHandle, cuMemPoolExportPointer) stays
//! its exporter's: an importer's mapping (cuIpcOpenMemHandle_v2,
//! cuMemPoolImportPointer) is counted apart, as `imported_bytes`, with the
//! exporter named, and never in the importer's live bytes, so no total
//! counts it twice. Exporter and importer are joined by the key of the
//! handle bytes both calls see (`gpumem_common::ipc::key`); the export is
//! checked against what the exporter holds when the import comes, so a
//! freed or reused export is not believed.
//!
//! Pools: every allocation from a stream-ordered pool (cuMemAllocFromPoolAsync,
//! or cuMemAllocAsync from the device's current pool, its default one unless
//! cuDeviceSetMemPool chose another) is counted to its pool. What a pool
//! keeps beyond its live allocations, and what a trim gives back, happen
//! inside the driver: no call says it, so it is left to NVML's figure for
//! the process (its overhead), and trims are counted, not guessed.
use gpumem_common::{
    api,
    payload::{Payload, Pool as PoolCall, PoolAlloc, ShareableHandle},
    ApiClass, Event,
};

use super::{process::Process, Applied, State};

/// Exports remembered across all processes; beyond, new ones are counted
/// as dropped (their importers then read "exporter unknown").
pub const EXPORTS_MAX: usize = 1 << 16;

/// One export: whose allocation the key names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub pid: u32,
    /// The allocation's address, or (`handle`) the physical handle exported.
    pub addr: u64,
    pub handle: bool,
    pub ts_ns: u64,
}

/// Who exported what an import names: the process and its allocation's bytes and device.
struct Exporter {
    pid: u32,
    comm: String,
    size: u64,
    device: i32,
}

/// Another process's allocation mapped into this one (see share.rs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    /// The exporter, where its export was seen and it still held the
    /// allocation; None: exported before tracing began, or by an untraced
    /// process (the bytes are then unknown, 0).
    pub from_pid: Option<u32>,
    pub from_comm: String,
    pub size: u64,
    pub device: i32,
    pub via: Via,
}

/// How an import came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// cuIpcOpenMemHandle_v2.
    Ipc,
    /// cuMemPoolImportPointer.
    PoolPointer,
    /// cuMemImportFromShareableHandle, then cuMemMap.
    ShareableHandle,
}

/// A physical handle imported from another process
/// (cuMemImportFromShareableHandle): its mappings here are imports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportedHandle {
    pub from_pid: Option<u32>,
    pub from_comm: String,
    /// The exporter's handle's bytes, where joined (else each mapping's size counts).
    pub size: Option<u64>,
    pub device: i32,
    pub retains: u32,
}

/// A stream-ordered pool: its handle (0: the device's default pool) and device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub pool: u64,
    pub device: i32,
}

/// What a pool holds in live allocations, and what was done to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolUse {
    pub bytes: u64,
    pub allocs: u64,
    /// cuMemPoolTrimTo calls: what each released is not visible from outside.
    pub trims: u64,
    /// cuMemPoolDestroy was called while allocations were live.
    pub destroyed: bool,
}

impl State {
    /// A successful export, import or close.
    pub(super) fn share_call(&mut self, class: ApiClass, ev: &Event) -> Applied {
        let shared = gpumem_common::payload::Shared::unpack(ev);
        match class {
            ApiClass::Export => self.export(ev, shared.key, shared.addr, false),
            ApiClass::HandleExport => {
                let call = ShareableHandle::unpack(ev);
                self.export(ev, call.key, call.handle, true)
            }
            ApiClass::HandleImport => {
                let call = ShareableHandle::unpack(ev);
                let from = self.exported(call.key, ev.ts_ns);
                self.apply_counted(ev, |p, room, out| {
                    let device = from.as_ref().map_or(p.current_device(ev.tid), |f| f.device);
                    out.device = device;
                    out.exporter = from.as_ref().map(|f| f.pid);
                    out.size = 0;
                    if !room {
                        out.dropped = true;
                        return;
                    }
                    let (from_pid, from_comm, size) = from.map_or((None, String::new(), None), |f| (Some(f.pid), f.comm, Some(f.size)));
                    p.held
                        .sharing_mut()
                        .imported_handles
                        .insert(call.handle, ImportedHandle { from_pid, from_comm, size, device, retains: 0 });
                })
            }
            ApiClass::Import => {
                let from = self.exported(shared.key, ev.ts_ns);
                let via = if ev.api == api::CU_MEM_POOL_IMPORT_POINTER { Via::PoolPointer } else { Via::Ipc };
                self.apply_counted(ev, |p, room, out| {
                    let (from_pid, from_comm, size, device) = match from {
                        Some(f) => (Some(f.pid), f.comm, f.size, f.device),
                        None => (None, String::new(), 0, p.current_device(ev.tid)),
                    };
                    out.device = device;
                    out.size = size;
                    out.untracked = from_pid.is_none();
                    out.exporter = from_pid;
                    if !room {
                        out.dropped = true;
                        return;
                    }
                    p.add_import(ev.addr, Import { from_pid, from_comm, size, device, via });
                })
            }
            _ => self.apply_counted(ev, |p, _, out| match p.remove_import(shared.addr) {
                Some(i) => {
                    out.device = i.device;
                    out.size = i.size;
                }
                None => out.untracked = true,
            }),
        }
    }

    /// An export of the allocation at `addr` (or, `handle`, of that physical
    /// handle): remembered by its key if the exporter holds it.
    fn export(&mut self, ev: &Event, key: u64, addr: u64, handle: bool) -> Applied {
        let applied = self.apply_counted(ev, |p, _, out| {
            let held = if handle {
                p.held.vmm_handles.get(&addr).map(|h| (h.device, h.size))
            } else {
                p.held.allocs.get(addr).map(|a| (a.device(), a.size))
            };
            out.device = held.map_or(out.device, |h| h.0);
            out.size = held.map_or(0, |h| h.1);
            out.untracked = held.is_none();
        });
        if !applied.untracked {
            self.remember_export(key, Export { pid: ev.pid, addr, handle, ts_ns: ev.ts_ns });
        }
        applied
    }

    fn remember_export(&mut self, key: u64, export: Export) {
        if key == 0 {
            return;
        }
        if self.exports.len() >= EXPORTS_MAX && !self.exports.contains_key(&key) {
            self.overflow.exports_dropped += 1;
            return;
        }
        self.exports.insert(key, export);
    }

    /// The exporter of `key` and the allocation it names, if the exporter
    /// still holds it as it was when exported.
    fn exported(&self, key: u64, now_ns: u64) -> Option<Exporter> {
        let e = self.exports.get(&key)?;
        let p = self.processes.get(&e.pid).filter(|p| !p.exited)?;
        let (size, device, made_ns) = if e.handle {
            p.held.vmm_handles.get(&e.addr).map(|h| (h.size, h.device, h.ts_ns))?
        } else {
            p.held.allocs.get(e.addr).map(|a| (a.size, a.device(), a.ts_ns))?
        };
        (made_ns <= e.ts_ns && e.ts_ns <= now_ns).then(|| Exporter { pid: e.pid, comm: p.comm.clone(), size, device })
    }

    /// Forgets the exports of a process that exited.
    pub(super) fn drop_exports_of(&mut self, pid: u32) {
        if !self.exports.is_empty() {
            self.exports.retain(|_, e| e.pid != pid);
        }
    }
}

impl Process {
    pub(super) fn add_import(&mut self, addr: u64, import: Import) {
        // The device is one the process has memory on, its own or not (its row).
        self.totals_mut(import.device);
        self.held.sharing_mut().imports.insert(addr, import);
    }

    pub(super) fn remove_import(&mut self, addr: u64) -> Option<Import> {
        self.held.sharing.as_deref_mut()?.imports.remove(&addr)
    }

    /// Other processes' memory mapped here on `device`: (bytes, mappings).
    pub fn imports_on(&self, device: i32) -> (u64, u64) {
        let on = self.held.sharing().imports.values().filter(|i| i.device == device);
        on.fold((0, 0), |(bytes, n), i| (bytes + i.size, n + 1))
    }

    /// A successful pool call.
    pub(super) fn apply_pool(&mut self, class: ApiClass, ev: &Event, out: &mut Applied) {
        let call = PoolCall::unpack(ev);
        match class {
            ApiClass::PoolCreate => {
                let device = if ev.device != gpumem_common::DEVICE_UNKNOWN { ev.device } else { self.current_device(ev.tid) };
                out.device = device;
                self.held.sharing_mut().pools.entry(PoolKey { pool: call.pool, device }).or_default();
            }
            ApiClass::PoolDestroy => {
                // Its live allocations stay until freed (the driver releases
                // the pool after the last one); it is forgotten then.
                let sh = self.held.sharing_mut();
                let Some((&key, u)) = sh.pools.iter_mut().find(|(k, _)| k.pool == call.pool) else {
                    out.untracked = true;
                    return;
                };
                out.device = key.device;
                u.destroyed = true;
                if u.allocs == 0 {
                    sh.pools.remove(&key);
                }
                sh.device_pool.retain(|_, p| *p != call.pool);
            }
            ApiClass::PoolTrim => {
                let Some((&key, u)) = self.held.sharing_mut().pools.iter_mut().find(|(k, _)| k.pool == call.pool) else {
                    out.untracked = true;
                    return;
                };
                out.device = key.device;
                u.trims += 1;
            }
            ApiClass::PoolSetDevice => {
                if call.pool == 0 {
                    self.held.sharing_mut().device_pool.remove(&ev.device);
                } else {
                    self.held.sharing_mut().device_pool.insert(ev.device, call.pool);
                }
            }
            _ => {}
        }
    }

    /// The pool a successful allocation came from, if any, and its device
    /// where the pool names one.
    pub(super) fn pool_of_alloc(&self, ev: &Event, device: i32) -> Option<PoolKey> {
        let pool = match ev.api {
            api::CU_MEM_ALLOC_FROM_POOL_ASYNC | api::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => PoolAlloc::unpack(ev).pool,
            api::CU_MEM_ALLOC_ASYNC | api::CU_MEM_ALLOC_ASYNC_PTSZ => self.held.sharing().device_pool.get(&device).copied().unwrap_or(0),
            _ => return None,
        };
        // A pool made while traced knows its device.
        let known = (pool != 0).then(|| self.held.sharing().pools.keys().find(|k| k.pool == pool).copied()).flatten();
        Some(known.unwrap_or(PoolKey { pool, device }))
    }

    /// Counts a live allocation to its pool.
    pub(super) fn pool_alloc(&mut self, addr: u64, key: PoolKey, size: u64) {
        let sh = self.held.sharing_mut();
        let u = sh.pools.entry(key).or_default();
        u.bytes += size;
        u.allocs += 1;
        sh.pool_of.insert(addr, key);
    }

    /// Takes a freed allocation off its pool's count.
    pub(super) fn pool_free(&mut self, addr: u64, size: u64) {
        // Most processes have no pool: a free costs no lookup then.
        let Some(sh) = self.held.sharing.as_deref_mut() else { return };
        let Some(key) = sh.pool_of.remove(&addr) else { return };
        let Some(u) = sh.pools.get_mut(&key) else { return };
        u.bytes = u.bytes.saturating_sub(size);
        u.allocs = u.allocs.saturating_sub(1);
        if u.destroyed && u.allocs == 0 {
            sh.pools.remove(&key);
        }
    }
}

/// What a pool holds now, for the breakdown.
pub fn pools_on(p: &Process, device: i32) -> Vec<(PoolKey, PoolUse)> {
    let mut v: Vec<(PoolKey, PoolUse)> =
        p.held.sharing().pools.iter().filter(|(k, _)| k.device == device).map(|(k, u)| (*k, u.clone())).collect();
    v.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.pool.cmp(&b.0.pool)));
    v
}
