//! Memory shared between processes (CUDA IPC, pool pointer export/import)
//! and the stream-ordered pools it comes from. Exporter and importer are
//! joined by the 64 bytes that travel between them, folded into a key
//! (`gpumem_common::ipc::key`) on both sides.
use aya_ebpf::programs::ProbeContext;
use gpumem_common::{
    api,
    payload::{Payload, Pool, Shared},
    Event,
};

use crate::{
    maps::Pending,
    user::{key_at, read_out},
    vmm,
};

/// What an entry must read while the caller's memory is as it passed it:
/// the importer's handle bytes. cuIpcOpenMemHandle_v2 takes its
/// CUipcMemHandle by value (`regs::second_struct_argument` finds it).
#[inline(always)]
pub fn entry_key(ctx: &ProbeContext, api_id: u32, args: &[u64; 6]) -> u64 {
    match api_id {
        api::CU_IPC_OPEN_MEM_HANDLE_V2 => key_at(crate::regs::second_struct_argument(ctx.regs)),
        // (CUdeviceptr *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData *shareData)
        api::CU_MEM_POOL_IMPORT_POINTER => key_at(args[2]),
        _ => 0,
    }
}

/// The calls `decode` handles.
#[inline(always)]
pub fn decodes(api_id: u32) -> bool {
    matches!(
        api_id,
        api::CU_IPC_GET_MEM_HANDLE
            | api::CU_IPC_OPEN_MEM_HANDLE_V2
            | api::CU_IPC_CLOSE_MEM_HANDLE
            | api::CU_MEM_POOL_EXPORT_POINTER
            | api::CU_MEM_POOL_IMPORT_POINTER
            | api::CU_MEM_POOL_CREATE
            | api::CU_MEM_POOL_DESTROY
            | api::CU_MEM_POOL_TRIM_TO
            | api::CU_DEVICE_SET_MEM_POOL
    )
}

#[inline(always)]
pub fn decode(api_id: u32, p: &Pending, ok: bool, ev: &mut Event) {
    let a = &p.args;
    match api_id {
        // (CUipcMemHandle *pHandle, CUdeviceptr dptr)
        // (CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
        api::CU_IPC_GET_MEM_HANDLE | api::CU_MEM_POOL_EXPORT_POINTER => {
            let key = if ok { key_at(a[0]) } else { 0 };
            Shared { addr: a[1], key, pool: 0 }.pack(ev);
        }
        // (CUdeviceptr *pdptr, [handle in memory], unsigned int Flags)
        api::CU_IPC_OPEN_MEM_HANDLE_V2 => {
            let addr = if ok { read_out(a[0], ev) } else { 0 };
            Shared { addr, key: p.key, pool: 0 }.pack(ev);
        }
        api::CU_MEM_POOL_IMPORT_POINTER => {
            let addr = if ok { read_out(a[0], ev) } else { 0 };
            Shared { addr, key: p.key, pool: a[1] }.pack(ev);
        }
        // (CUdeviceptr dptr)
        api::CU_IPC_CLOSE_MEM_HANDLE => Shared { addr: a[0], key: 0, pool: 0 }.pack(ev),
        // (CUmemoryPool *pool, const CUmemPoolProps *poolProps): the
        // location was read at entry, as cuMemCreate's.
        api::CU_MEM_POOL_CREATE => {
            vmm::device_read_at_entry(p, ev);
            let pool = if ok { read_out(a[0], ev) } else { 0 };
            Pool { pool, keep: 0 }.pack(ev);
        }
        // (CUmemoryPool pool) / (CUmemoryPool pool, size_t minBytesToKeep)
        api::CU_MEM_POOL_DESTROY | api::CU_MEM_POOL_TRIM_TO => Pool { pool: a[0], keep: a[1] }.pack(ev),
        // (CUdevice dev, CUmemoryPool pool)
        api::CU_DEVICE_SET_MEM_POOL => {
            ev.device = a[0] as i32;
            ev.flags |= gpumem_common::flags::DEVICE_FROM_ARGS;
            Pool { pool: a[1], keep: 0 }.pack(ev);
        }
        _ => {}
    }
}
