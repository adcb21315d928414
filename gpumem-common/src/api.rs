//! Identifiers of the traced calls. Stable numbers: they travel in events and
//! in recordings, so never renumber; append.

pub const CU_INIT: u32 = 1;
pub const CU_MEM_ALLOC_V2: u32 = 2;
pub const CU_MEM_ALLOC_PITCH_V2: u32 = 3;
pub const CU_MEM_ALLOC_MANAGED: u32 = 4;
pub const CU_MEM_ALLOC_ASYNC: u32 = 5;
pub const CU_MEM_ALLOC_ASYNC_PTSZ: u32 = 6;
pub const CU_MEM_ALLOC_FROM_POOL_ASYNC: u32 = 7;
pub const CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 8;
pub const CU_MEM_HOST_ALLOC: u32 = 9;
pub const CU_MEM_ALLOC_HOST_V2: u32 = 10;
pub const CU_MEM_FREE_V2: u32 = 11;
pub const CU_MEM_FREE_ASYNC: u32 = 12;
pub const CU_MEM_FREE_ASYNC_PTSZ: u32 = 13;
pub const CU_MEM_FREE_HOST: u32 = 14;
pub const CU_MEM_CREATE: u32 = 15;
pub const CU_MEM_RELEASE: u32 = 16;
pub const CU_MEM_MAP: u32 = 17;
pub const CU_MEM_UNMAP: u32 = 18;
pub const CU_MEM_ADDRESS_RESERVE: u32 = 19;
pub const CU_MEM_ADDRESS_FREE: u32 = 20;
pub const CU_DEVICE_PRIMARY_CTX_RETAIN: u32 = 21;
pub const CU_DEVICE_PRIMARY_CTX_RELEASE_V2: u32 = 22;
pub const CU_DEVICE_PRIMARY_CTX_RESET_V2: u32 = 23;
pub const CU_CTX_CREATE_V2: u32 = 24;
pub const CU_CTX_CREATE_V3: u32 = 25;
pub const CU_CTX_CREATE_V4: u32 = 26;
pub const CU_CTX_SET_CURRENT: u32 = 27;
pub const CU_CTX_PUSH_CURRENT_V2: u32 = 28;
pub const CU_CTX_POP_CURRENT_V2: u32 = 29;
pub const CU_CTX_DESTROY_V2: u32 = 30;
pub const CU_MEM_GET_INFO_V2: u32 = 31;
pub const CU_IPC_GET_MEM_HANDLE: u32 = 32;
pub const CU_IPC_OPEN_MEM_HANDLE_V2: u32 = 33;
pub const CU_IPC_CLOSE_MEM_HANDLE: u32 = 34;
pub const CU_MEM_POOL_EXPORT_POINTER: u32 = 35;
pub const CU_MEM_POOL_IMPORT_POINTER: u32 = 36;
pub const CU_MEM_POOL_CREATE: u32 = 37;
pub const CU_MEM_POOL_DESTROY: u32 = 38;
pub const CU_MEM_POOL_TRIM_TO: u32 = 39;
pub const CU_DEVICE_SET_MEM_POOL: u32 = 40;
pub const CU_MEM_HOST_REGISTER_V2: u32 = 41;
pub const CU_MEM_HOST_UNREGISTER: u32 = 42;
pub const CU_GREEN_CTX_CREATE: u32 = 43;
pub const CU_CTX_FROM_GREEN_CTX: u32 = 44;
pub const CU_GREEN_CTX_DESTROY: u32 = 45;
pub const CU_GRAPH_ADD_MEM_ALLOC_NODE: u32 = 46;
pub const CU_GRAPH_ADD_MEM_FREE_NODE: u32 = 47;
pub const CU_DEVICE_GRAPH_MEM_TRIM: u32 = 48;
pub const CU_GRAPH_DESTROY: u32 = 49;
pub const CU_CHECKPOINT_PROCESS_LOCK: u32 = 50;
pub const CU_CHECKPOINT_PROCESS_CHECKPOINT: u32 = 51;
pub const CU_CHECKPOINT_PROCESS_RESTORE: u32 = 52;
pub const CU_CHECKPOINT_PROCESS_UNLOCK: u32 = 53;
pub const CU_MULTICAST_CREATE: u32 = 54;
pub const CU_MULTICAST_ADD_DEVICE: u32 = 55;
pub const CU_MULTICAST_BIND_MEM: u32 = 56;
pub const CU_MULTICAST_BIND_ADDR: u32 = 57;
pub const CU_MULTICAST_UNBIND: u32 = 58;
pub const CU_MEM_EXPORT_TO_SHAREABLE_HANDLE: u32 = 59;
pub const CU_MEM_IMPORT_FROM_SHAREABLE_HANDLE: u32 = 60;
pub const CU_MEM_RETAIN_ALLOCATION_HANDLE: u32 = 61;
pub const CU_DEVICE_GET_UUID_V2: u32 = 62;
/// Not a libcuda call: the `sched_process_exit` tracepoint for a traced process.
pub const PROCESS_EXIT: u32 = 100;
/// Not a libcuda call: the `oom:mark_victim` tracepoint (host OOM kill).
/// `pid`/`comm` are the victim's, `tid` the task that triggered the kill;
/// `addr` total_vm, `size` anon_rss, `handle` file_rss, `aux` shmem_rss, in kB.
pub const OOM_KILL: u32 = 101;
/// Not a libcuda call: a process ran a new program (`sched_process_exec`).
/// A discovery signal for the agent: it reads that process's maps.
pub const PROCESS_EXEC: u32 = 102;
/// Not a libcuda call: a process's dynamic loader changed its link map
/// (a uprobe on `_dl_debug_state`, called around every dlopen/dlclose and
/// after the libraries of a new program are loaded). A discovery signal.
pub const LINK_MAP: u32 = 103;
/// NVIDIA driver ioctls (see `nv`): not libcuda calls.
pub const RM_ALLOC: u32 = 200;
pub const RM_FREE: u32 = 201;
pub const RM_MAP_MEMORY: u32 = 202;
pub const RM_MAP_MEMORY_DMA: u32 = 203;
pub const RM_CONTROL: u32 = 204;
pub const UVM_MAP_EXTERNAL_ALLOCATION: u32 = 205;
pub const UVM_FREE: u32 = 206;
/// PyTorch's `pytorch:malloc` (see `usdt`): a tensor's block handed out by
/// the caching allocator. `addr` ptr, `size` bytes asked, `device`, `aux` stream.
pub const TENSOR_ALLOC: u32 = 300;
/// PyTorch's `pytorch:free`: the tensor at `addr` given back to the cache.
pub const TENSOR_FREE: u32 = 301;
/// Highest id in use, for sizing tables.
pub const MAX: u32 = 301;

/// Whether the event is a discovery signal (not state: the agent looks
/// for new libraries in the process).
pub const fn is_discovery(id: u32) -> bool {
    id == PROCESS_EXEC || id == LINK_MAP
}

/// Whether the id is one of the NVIDIA driver ioctls.
pub const fn is_ioctl(id: u32) -> bool {
    id >= RM_ALLOC && id <= UVM_FREE
}
