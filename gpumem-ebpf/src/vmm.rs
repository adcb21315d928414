//! Virtual memory management calls (cuMemCreate & co., PyTorch's
//! expandable segments). Physical memory is a cuMemCreate handle; reserved
//! address space is not memory.
use aya_ebpf::helpers::bpf_probe_read_user;
use gpumem_common::{api, flags, Event, DEVICE_UNKNOWN};

use crate::{maps::Pending, user::read_out};

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
    // SAFETY: bpf_probe_read_user validates the user address.
    unsafe { bpf_probe_read_user((prop + PROP_LOCATION_ID_OFFSET) as *const i32) }.unwrap_or(DEVICE_UNKNOWN)
}

#[inline(always)]
pub fn decode(api_id: u32, p: &Pending, ok: bool, ev: &mut Event) {
    let a = &p.args;
    match api_id {
        // (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, u64 flags)
        api::CU_MEM_CREATE => {
            ev.size = a[1];
            ev.device = p.device;
            if p.device != DEVICE_UNKNOWN {
                ev.flags |= flags::DEVICE_FROM_ARGS;
            }
            if ok {
                ev.handle = read_out(a[0], ev);
            }
        }
        // (CUmemGenericAllocationHandle handle)
        api::CU_MEM_RELEASE => ev.handle = a[0],
        // (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, u64 flags)
        api::CU_MEM_MAP => {
            ev.addr = a[0];
            ev.size = a[1];
            ev.aux = a[2];
            ev.handle = a[3];
        }
        // (CUdeviceptr ptr, size_t size)
        api::CU_MEM_UNMAP | api::CU_MEM_ADDRESS_FREE => {
            ev.addr = a[0];
            ev.size = a[1];
        }
        // (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, u64 flags)
        api::CU_MEM_ADDRESS_RESERVE => {
            ev.size = a[1];
            if ok {
                ev.addr = read_out(a[0], ev);
            }
        }
        _ => {}
    }
}
