//! Every probed libcuda entry point: its stable id, exported symbol, class
//! (what it does to memory state) and whether every driver has it.
use crate::api;

/// What a traced call does to memory state; decides how the agent applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ApiClass {
    Init,
    DeviceAlloc,
    DeviceFree,
    HostAlloc,
    HostFree,
    VmmCreate,
    VmmRelease,
    VmmMap,
    VmmUnmap,
    VaReserve,
    VaFree,
    CtxRetainPrimary,
    CtxReleasePrimary,
    CtxResetPrimary,
    CtxCreate,
    CtxSetCurrent,
    CtxPush,
    CtxPop,
    CtxDestroy,
    /// cuMemGetInfo_v2: free bytes in `size`, total in `aux`.
    MemGetInfo,
    /// cuIpcGetMemHandle, cuMemPoolExportPointer: an allocation made
    /// shareable; `addr` the pointer, `handle` the key of the 64 bytes that
    /// travel to the importer (`ipc::key`).
    Export,
    /// cuIpcOpenMemHandle_v2, cuMemPoolImportPointer: another process's
    /// allocation mapped here; `addr` the pointer returned, `handle` the key
    /// of the bytes it was opened with, `aux` the pool imported into (0: none).
    Import,
    /// cuIpcCloseMemHandle: an IPC mapping closed; `addr`.
    ImportClose,
    /// cuMemPoolCreate: `handle` the pool, `device` its location.
    PoolCreate,
    /// cuMemPoolDestroy: `handle` the pool.
    PoolDestroy,
    /// cuMemPoolTrimTo: `handle` the pool, `size` the bytes to keep.
    PoolTrim,
    /// cuDeviceSetMemPool: the device's current pool (`handle`) for cuMemAllocAsync.
    PoolSetDevice,
    /// cuGreenCtxCreate: `handle` the green context, `device` its device.
    GreenCtxCreate,
    /// cuCtxFromGreenCtx: `handle` the context, `aux` the green context it stands for.
    CtxFromGreen,
    /// cuGreenCtxDestroy: `handle` the green context.
    GreenCtxDestroy,
    /// cuGraphAddMemAllocNode: `addr` the pointer the node will hand out,
    /// `size` its bytes, `handle` the graph, `device` its location.
    GraphAlloc,
    /// cuGraphAddMemFreeNode: `addr` the pointer, `handle` the graph.
    GraphFree,
    /// cuDeviceGraphMemTrim: `device`.
    GraphTrim,
    /// cuGraphDestroy: `handle` the graph.
    GraphDestroy,
    /// cuCheckpointProcess{Lock,Checkpoint,Restore,Unlock}, called by a
    /// checkpointing tool: `addr` the pid of the process it acts on.
    Checkpoint,
    /// cuMulticastCreate: `handle` the multicast object, `size` its bytes, `aux` its devices.
    MulticastCreate,
    /// cuMulticastAddDevice: `handle`, `device`.
    MulticastAddDevice,
    /// cuMulticastBindMem (`addr` the physical handle bound) and
    /// cuMulticastBindAddr (`addr` a mapped address): `handle` the
    /// multicast object, `aux` the offset in it, `size` the bytes bound.
    MulticastBind,
    /// cuMulticastUnbind: `handle`, `device`, `aux` the offset, `size`.
    MulticastUnbind,
    /// cuMemExportToShareableHandle: `handle` the physical handle, `aux`
    /// the handle type, `addr` the key of what travels (fabric handles'
    /// 64 bytes; 0 for file descriptors, whose numbers differ per process).
    HandleExport,
    /// cuMemImportFromShareableHandle: `handle` the handle made here, `aux`
    /// the type, `addr` the key as for the export.
    HandleImport,
    /// cuMemRetainAllocationHandle: `handle` the handle retained, `addr` the address asked.
    HandleRetain,
    /// cuDeviceGetUuid_v2: the device's UUID (a MIG instance's, in a MIG
    /// process), `addr` its first 8 bytes and `aux` the last 8; `device` the ordinal.
    DeviceUuid,
    ProcessExit,
}

/// One libcuda entry point that gpumem probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiInfo {
    pub id: u32,
    /// Exported symbol name in libcuda.so.1.
    pub symbol: &'static str,
    pub class: ApiClass,
    /// Required for a useful trace; optional ones (newer drivers only) are
    /// skipped quietly when missing.
    pub required: bool,
}

macro_rules! apis {
    ($( $id:ident, $sym:literal, $class:ident, $req:literal; )*) => {
        /// Every probed libcuda entry point, in id order.
        pub const APIS: &[ApiInfo] = &[
            $( ApiInfo { id: api::$id, symbol: $sym, class: ApiClass::$class, required: $req }, )*
        ];
    };
}

apis! {
    CU_INIT, "cuInit", Init, true;
    CU_MEM_ALLOC_V2, "cuMemAlloc_v2", DeviceAlloc, true;
    CU_MEM_ALLOC_PITCH_V2, "cuMemAllocPitch_v2", DeviceAlloc, true;
    CU_MEM_ALLOC_MANAGED, "cuMemAllocManaged", DeviceAlloc, true;
    CU_MEM_ALLOC_ASYNC, "cuMemAllocAsync", DeviceAlloc, true;
    CU_MEM_ALLOC_ASYNC_PTSZ, "cuMemAllocAsync_ptsz", DeviceAlloc, true;
    CU_MEM_ALLOC_FROM_POOL_ASYNC, "cuMemAllocFromPoolAsync", DeviceAlloc, true;
    CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, "cuMemAllocFromPoolAsync_ptsz", DeviceAlloc, true;
    CU_MEM_HOST_ALLOC, "cuMemHostAlloc", HostAlloc, true;
    CU_MEM_ALLOC_HOST_V2, "cuMemAllocHost_v2", HostAlloc, true;
    CU_MEM_FREE_V2, "cuMemFree_v2", DeviceFree, true;
    CU_MEM_FREE_ASYNC, "cuMemFreeAsync", DeviceFree, true;
    CU_MEM_FREE_ASYNC_PTSZ, "cuMemFreeAsync_ptsz", DeviceFree, true;
    CU_MEM_FREE_HOST, "cuMemFreeHost", HostFree, true;
    CU_MEM_CREATE, "cuMemCreate", VmmCreate, true;
    CU_MEM_RELEASE, "cuMemRelease", VmmRelease, true;
    CU_MEM_MAP, "cuMemMap", VmmMap, true;
    CU_MEM_UNMAP, "cuMemUnmap", VmmUnmap, true;
    CU_MEM_ADDRESS_RESERVE, "cuMemAddressReserve", VaReserve, true;
    CU_MEM_ADDRESS_FREE, "cuMemAddressFree", VaFree, true;
    CU_DEVICE_PRIMARY_CTX_RETAIN, "cuDevicePrimaryCtxRetain", CtxRetainPrimary, true;
    CU_DEVICE_PRIMARY_CTX_RELEASE_V2, "cuDevicePrimaryCtxRelease_v2", CtxReleasePrimary, true;
    CU_DEVICE_PRIMARY_CTX_RESET_V2, "cuDevicePrimaryCtxReset_v2", CtxResetPrimary, true;
    CU_CTX_CREATE_V2, "cuCtxCreate_v2", CtxCreate, true;
    CU_CTX_CREATE_V3, "cuCtxCreate_v3", CtxCreate, true;
    CU_CTX_CREATE_V4, "cuCtxCreate_v4", CtxCreate, false;
    CU_CTX_SET_CURRENT, "cuCtxSetCurrent", CtxSetCurrent, true;
    CU_CTX_PUSH_CURRENT_V2, "cuCtxPushCurrent_v2", CtxPush, true;
    CU_CTX_POP_CURRENT_V2, "cuCtxPopCurrent_v2", CtxPop, true;
    CU_CTX_DESTROY_V2, "cuCtxDestroy_v2", CtxDestroy, true;
    CU_MEM_GET_INFO_V2, "cuMemGetInfo_v2", MemGetInfo, true;
    CU_IPC_GET_MEM_HANDLE, "cuIpcGetMemHandle", Export, true;
    CU_IPC_OPEN_MEM_HANDLE_V2, "cuIpcOpenMemHandle_v2", Import, true;
    CU_IPC_CLOSE_MEM_HANDLE, "cuIpcCloseMemHandle", ImportClose, true;
    CU_MEM_POOL_EXPORT_POINTER, "cuMemPoolExportPointer", Export, true;
    CU_MEM_POOL_IMPORT_POINTER, "cuMemPoolImportPointer", Import, true;
    CU_MEM_POOL_CREATE, "cuMemPoolCreate", PoolCreate, true;
    CU_MEM_POOL_DESTROY, "cuMemPoolDestroy", PoolDestroy, true;
    CU_MEM_POOL_TRIM_TO, "cuMemPoolTrimTo", PoolTrim, true;
    CU_DEVICE_SET_MEM_POOL, "cuDeviceSetMemPool", PoolSetDevice, true;
    CU_MEM_HOST_REGISTER_V2, "cuMemHostRegister_v2", HostAlloc, true;
    CU_MEM_HOST_UNREGISTER, "cuMemHostUnregister", HostFree, true;
    CU_GREEN_CTX_CREATE, "cuGreenCtxCreate", GreenCtxCreate, false;
    CU_CTX_FROM_GREEN_CTX, "cuCtxFromGreenCtx", CtxFromGreen, false;
    CU_GREEN_CTX_DESTROY, "cuGreenCtxDestroy", GreenCtxDestroy, false;
    CU_GRAPH_ADD_MEM_ALLOC_NODE, "cuGraphAddMemAllocNode", GraphAlloc, true;
    CU_GRAPH_ADD_MEM_FREE_NODE, "cuGraphAddMemFreeNode", GraphFree, true;
    CU_DEVICE_GRAPH_MEM_TRIM, "cuDeviceGraphMemTrim", GraphTrim, true;
    CU_GRAPH_DESTROY, "cuGraphDestroy", GraphDestroy, true;
    CU_CHECKPOINT_PROCESS_LOCK, "cuCheckpointProcessLock", Checkpoint, false;
    CU_CHECKPOINT_PROCESS_CHECKPOINT, "cuCheckpointProcessCheckpoint", Checkpoint, false;
    CU_CHECKPOINT_PROCESS_RESTORE, "cuCheckpointProcessRestore", Checkpoint, false;
    CU_CHECKPOINT_PROCESS_UNLOCK, "cuCheckpointProcessUnlock", Checkpoint, false;
    CU_MULTICAST_CREATE, "cuMulticastCreate", MulticastCreate, true;
    CU_MULTICAST_ADD_DEVICE, "cuMulticastAddDevice", MulticastAddDevice, true;
    CU_MULTICAST_BIND_MEM, "cuMulticastBindMem", MulticastBind, true;
    CU_MULTICAST_BIND_ADDR, "cuMulticastBindAddr", MulticastBind, true;
    CU_MULTICAST_UNBIND, "cuMulticastUnbind", MulticastUnbind, true;
    CU_MEM_EXPORT_TO_SHAREABLE_HANDLE, "cuMemExportToShareableHandle", HandleExport, true;
    CU_MEM_IMPORT_FROM_SHAREABLE_HANDLE, "cuMemImportFromShareableHandle", HandleImport, true;
    CU_MEM_RETAIN_ALLOCATION_HANDLE, "cuMemRetainAllocationHandle", HandleRetain, true;
    CU_DEVICE_GET_UUID_V2, "cuDeviceGetUuid_v2", DeviceUuid, true;
}

/// Each id's index in APIS (u8::MAX: not a probed API): every event looks
/// its API up, so this is a table, not a search.
const BY_ID: [u8; api::MAX as usize + 1] = {
    assert!(APIS.len() < u8::MAX as usize);
    let mut t = [u8::MAX; api::MAX as usize + 1];
    let mut i = 0;
    while i < APIS.len() {
        t[APIS[i].id as usize] = i as u8;
        i += 1;
    }
    t
};

/// Looks up a probed API by id.
pub fn api_info(id: u32) -> Option<&'static ApiInfo> {
    APIS.get(*BY_ID.get(id as usize)? as usize)
}
