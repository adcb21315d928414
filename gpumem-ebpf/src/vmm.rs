//! Virtual memory management calls (cuMemCreate & co., PyTorch's
//! expandable segments). Physical memory is a cuMemCreate handle; reserved
//! address space is not memory.
use gpumem_common::{
    api, flags,
    payload::{Payload, VaRange, VmmCreate, VmmMap, VmmRelease},
    Event, DEVICE_UNKNOWN,
};

use crate::{
    maps::Pending,
    user::{read, read_out},
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
        _ => {}
    }
}
