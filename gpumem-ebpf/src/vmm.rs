//! Virtual memory management calls (cuMemCreate & co., PyTorch's
//! expandable segments). Physical memory is a cuMemCreate handle; reserved
//! address space is not memory.
use gpumem_common::{
    api, flags, handle_type,
    payload::{GraphNode, MulticastCall, Payload, ShareableHandle, VaRange, VmmCreate, VmmMap, VmmRelease},
    Event, DEVICE_UNKNOWN,
};

use crate::{
    maps::Pending,
    user::{key_at, read, read_out},
};

/// Offset of `location.id` in CUmemAllocationProp:
/// { CUmemAllocationType type; CUmemAllocationHandleType requestedHandleTypes;
///   CUmemLocation { CUmemLocationType type; int id; } location; ... }
const PROP_LOCATION_ID_OFFSET: u64 = 12;

/// Device named by cuMemCreate's `prop`, read at entry while it is valid.
#[inline(always)]
pub fn create_device(prop: u64) -> i32 {
    if prop == 0 {
        return DEVICE_UNKNOWN;
    }
    read::<i32>(prop + PROP_LOCATION_ID_OFFSET).unwrap_or(DEVICE_UNKNOWN)
}

/// The device an entry read from the call's properties (`create_device`).
#[inline(always)]
pub fn device_read_at_entry(p: &Pending, ev: &mut Event) {
    ev.device = p.device;
    if p.device != DEVICE_UNKNOWN {
        ev.flags |= flags::DEVICE_FROM_ARGS;
    }
}

#[inline(always)]
pub fn decode(api_id: u32, p: &Pending, ok: bool, ev: &mut Event) {
    let a = &p.args;
    match api_id {
        // (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, u64 flags)
        api::CU_MEM_CREATE => {
            device_read_at_entry(p, ev);
            let handle = if ok { read_out(a[0], ev) } else { 0 };
            VmmCreate { handle, size: a[1] }.pack(ev);
        }
        // (CUmemGenericAllocationHandle handle)
        api::CU_MEM_RELEASE => VmmRelease { handle: a[0] }.pack(ev),
        // (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, u64 flags)
        api::CU_MEM_MAP => VmmMap { addr: a[0], size: a[1], offset: a[2], handle: a[3] }.pack(ev),
        // (CUdeviceptr ptr, size_t size)
        api::CU_MEM_UNMAP | api::CU_MEM_ADDRESS_FREE => VaRange { addr: a[0], size: a[1] }.pack(ev),
        // (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, u64 flags)
        api::CU_MEM_ADDRESS_RESERVE => {
            let addr = if ok { read_out(a[0], ev) } else { 0 };
            VaRange { addr, size: a[1] }.pack(ev);
        }
        _ => decode_shared(api_id, p, ok, ev),
    }
}

/// CUDA_MEM_ALLOC_NODE_PARAMS: { CUmemPoolProps poolProps (88 bytes, its
/// location.id at 12); const CUmemAccessDesc *accessDescs; size_t
/// accessDescCount; size_t bytesize; CUdeviceptr dptr (out) }.
const NODE_BYTESIZE_OFFSET: u64 = 104;
const NODE_DPTR_OFFSET: u64 = 112;
/// CUmulticastObjectProp: { unsigned int numDevices; size_t size; ... }.
const MC_PROP_SIZE_OFFSET: u64 = 8;

/// The calls `decode` handles.
#[inline(always)]
pub fn decodes(api_id: u32) -> bool {
    matches!(
        api_id,
        api::CU_MEM_CREATE
            | api::CU_MEM_RELEASE
            | api::CU_MEM_MAP
            | api::CU_MEM_UNMAP
            | api::CU_MEM_ADDRESS_RESERVE
            | api::CU_MEM_ADDRESS_FREE
            | api::CU_GRAPH_ADD_MEM_ALLOC_NODE
            | api::CU_GRAPH_ADD_MEM_FREE_NODE
            | api::CU_GRAPH_DESTROY
            | api::CU_DEVICE_GRAPH_MEM_TRIM
            | api::CU_MULTICAST_CREATE
            | api::CU_MULTICAST_ADD_DEVICE
            | api::CU_MULTICAST_BIND_MEM
            | api::CU_MULTICAST_BIND_ADDR
            | api::CU_MULTICAST_UNBIND
            | api::CU_MEM_EXPORT_TO_SHAREABLE_HANDLE
            | api::CU_MEM_IMPORT_FROM_SHAREABLE_HANDLE
            | api::CU_MEM_RETAIN_ALLOCATION_HANDLE
    )
}

/// Multicast objects, shareable handles and graph memory nodes.
#[inline(always)]
fn decode_shared(api_id: u32, p: &Pending, ok: bool, ev: &mut Event) {
    let a = &p.args;
    match api_id {
        // (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *deps, size_t n, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
        api::CU_GRAPH_ADD_MEM_ALLOC_NODE => {
            device_read_at_entry(p, ev);
            let (size, addr) = if ok { (read_out(a[4] + NODE_BYTESIZE_OFFSET, ev), read_out(a[4] + NODE_DPTR_OFFSET, ev)) } else { (0, 0) };
            GraphNode { addr, size, graph: a[1] }.pack(ev);
        }
        // (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *deps, size_t n, CUdeviceptr dptr)
        api::CU_GRAPH_ADD_MEM_FREE_NODE => GraphNode { addr: a[4], size: 0, graph: a[1] }.pack(ev),
        // (CUgraph hGraph)
        api::CU_GRAPH_DESTROY => GraphNode { addr: 0, size: 0, graph: a[0] }.pack(ev),
        // (CUdevice device)
        api::CU_DEVICE_GRAPH_MEM_TRIM => device_arg(a[0], ev),
        // (CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
        api::CU_MULTICAST_CREATE => {
            let mc = if ok { read_out(a[0], ev) } else { 0 };
            let (devices, size) = (read::<u32>(a[1]).unwrap_or(0) as u64, read::<u64>(a[1] + MC_PROP_SIZE_OFFSET).unwrap_or(0));
            MulticastCall { mc, size, offset: devices, memory: 0 }.pack(ev);
        }
        // (CUmemGenericAllocationHandle mcHandle, CUdevice dev)
        api::CU_MULTICAST_ADD_DEVICE => {
            device_arg(a[1], ev);
            MulticastCall { mc: a[0], size: 0, offset: 0, memory: 0 }.pack(ev);
        }
        // (mcHandle, size_t mcOffset, CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size, u64 flags)
        api::CU_MULTICAST_BIND_MEM => MulticastCall { mc: a[0], size: a[4], offset: a[1], memory: a[2] }.pack(ev),
        // (mcHandle, size_t mcOffset, CUdeviceptr memptr, size_t size, u64 flags)
        api::CU_MULTICAST_BIND_ADDR => MulticastCall { mc: a[0], size: a[3], offset: a[1], memory: a[2] }.pack(ev),
        // (mcHandle, CUdevice dev, size_t mcOffset, size_t size)
        api::CU_MULTICAST_UNBIND => {
            device_arg(a[1], ev);
            MulticastCall { mc: a[0], size: a[3], offset: a[2], memory: 0 }.pack(ev);
        }
        // (void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type, u64 flags):
        // a fabric handle's 64 bytes mean the same everywhere; a file
        // descriptor's number does not, so it joins nothing.
        api::CU_MEM_EXPORT_TO_SHAREABLE_HANDLE => {
            let key = if ok && a[2] == handle_type::FABRIC { key_at(a[0]) } else { 0 };
            ShareableHandle { handle: a[1], key, kind: a[2] }.pack(ev);
        }
        // (CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType type)
        api::CU_MEM_IMPORT_FROM_SHAREABLE_HANDLE => {
            let handle = if ok { read_out(a[0], ev) } else { 0 };
            let key = if a[2] == handle_type::FABRIC { key_at(a[1]) } else { 0 };
            ShareableHandle { handle, key, kind: a[2] }.pack(ev);
        }
        // (CUmemGenericAllocationHandle *handle, void *addr)
        api::CU_MEM_RETAIN_ALLOCATION_HANDLE => {
            let handle = if ok { read_out(a[0], ev) } else { 0 };
            ShareableHandle { handle, key: 0, kind: a[1] }.pack(ev);
        }
        _ => {}
    }
}

#[inline(always)]
fn device_arg(v: u64, ev: &mut Event) {
    ev.device = v as i32;
    ev.flags |= flags::DEVICE_FROM_ARGS;
}
