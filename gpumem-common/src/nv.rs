//! The NVIDIA driver's ioctl ABI (open-gpu-kernel-modules, driver 535).
//!
//! RM escapes are `_IOWR('F', nr, size)` on /dev/nvidiactl and /dev/nvidiaN;
//! UVM commands are plain numbers on /dev/nvidia-uvm. The RM status comes
//! back in the parameter struct, not as the syscall's return value.
//!
//! Events of the ioctl path use `Event` fields as follows:
//! - RM_ALLOC: `handle` hObjectNew, `addr` hObjectParent | hRoot << 32,
//!   `aux` hClass | (memory flags << 32), `size` the requested size for
//!   class 0x40 (NV_MEMORY_ALLOCATION_PARAMS.size), `result` the RM status;
//! - RM_FREE: `handle` hObjectOld, `addr` hObjectParent | hRoot << 32;
//! - RM_MAP_MEMORY(_DMA): `handle` hMemory, `size` length, `addr` the linear
//!   (or DMA) address returned;
//! - RM_CONTROL: `handle` hObject, `aux` the control command;
//! - UVM_MAP_EXTERNAL_ALLOCATION / UVM_FREE: `addr` base, `size` length.
pub const IOC_TYPE: u32 = b'F' as u32;
pub const ESC_RM_FREE: u32 = 0x29;
pub const ESC_RM_CONTROL: u32 = 0x2A;
pub const ESC_RM_ALLOC: u32 = 0x2B;
pub const ESC_RM_MAP_MEMORY: u32 = 0x4E;
pub const ESC_RM_MAP_MEMORY_DMA: u32 = 0x57;
pub const NVOS21_SIZE: u32 = 32;
pub const NVOS64_SIZE: u32 = 48;
pub const NVOS00_SIZE: u32 = 16;
pub const NVOS54_SIZE: u32 = 32;
/// nv_ioctl_nvos33_parameters_with_fd: NVOS33 (48) + int fd, padded.
pub const NVOS33_WITH_FD_SIZE: u32 = 56;
pub const NVOS46_SIZE: u32 = 56;
pub const UVM_MAP_EXTERNAL_ALLOCATION: u32 = 33;
pub const UVM_FREE: u32 = 34;
/// NV01_MEMORY_LOCAL_USER: video memory.
pub const CLASS_MEMORY_LOCAL_USER: u32 = 0x40;
/// Offsets in NV_MEMORY_ALLOCATION_PARAMS.
pub const MEM_PARAMS_FLAGS_OFFSET: u64 = 8;
pub const MEM_PARAMS_SIZE_OFFSET: u64 = 64;
/// rmStatus in UVM_MAP_EXTERNAL_ALLOCATION_PARAMS (UVM_MAX_GPUS = 32) and UVM_FREE_PARAMS.
pub const UVM_MAP_EXTERNAL_STATUS_OFFSET: u64 = 1196;
pub const UVM_FREE_STATUS_OFFSET: u64 = 16;

pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}
pub const fn ioc_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}
/// `_IOWR('F', nr, size)`.
pub const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | (IOC_TYPE << 8) | nr
}

/// Which gpumem api a (device kind, command) pair is, if any.
pub const fn classify(kind: u32, cmd: u32) -> Option<u32> {
    if kind == super::nv_fd::UVM {
        return match cmd {
            UVM_MAP_EXTERNAL_ALLOCATION => Some(super::api::UVM_MAP_EXTERNAL_ALLOCATION),
            UVM_FREE => Some(super::api::UVM_FREE),
            _ => None,
        };
    }
    if ioc_type(cmd) != IOC_TYPE {
        return None;
    }
    match (ioc_nr(cmd), ioc_size(cmd)) {
        (ESC_RM_ALLOC, NVOS21_SIZE) | (ESC_RM_ALLOC, NVOS64_SIZE) => Some(super::api::RM_ALLOC),
        (ESC_RM_FREE, NVOS00_SIZE) => Some(super::api::RM_FREE),
        (ESC_RM_CONTROL, NVOS54_SIZE) => Some(super::api::RM_CONTROL),
        (ESC_RM_MAP_MEMORY, NVOS33_WITH_FD_SIZE) => Some(super::api::RM_MAP_MEMORY),
        (ESC_RM_MAP_MEMORY_DMA, NVOS46_SIZE) => Some(super::api::RM_MAP_MEMORY_DMA),
        _ => None,
    }
}
