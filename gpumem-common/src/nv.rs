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
/// NVOS21_PARAMETERS (NV_ESC_RM_ALLOC, the short form).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos21 {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_new: u32,
    pub h_class: u32,
    pub p_alloc_parms: u64,
    pub params_size: u32,
    pub status: u32,
}

/// NVOS64_PARAMETERS (NV_ESC_RM_ALLOC with requested rights).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos64 {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_new: u32,
    pub h_class: u32,
    pub p_alloc_parms: u64,
    pub p_rights_requested: u64,
    pub params_size: u32,
    pub flags: u32,
    pub status: u32,
    pub _pad: u32,
}

/// NVOS00_PARAMETERS (NV_ESC_RM_FREE).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos00 {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_old: u32,
    pub status: u32,
}

/// NVOS54_PARAMETERS (NV_ESC_RM_CONTROL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos54 {
    pub h_client: u32,
    pub h_object: u32,
    pub cmd: u32,
    pub flags: u32,
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// nv_ioctl_nvos33_parameters_with_fd (NV_ESC_RM_MAP_MEMORY): NVOS33 and
/// the descriptor the mapping is made on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos33WithFd {
    pub h_client: u32,
    pub h_device: u32,
    pub h_memory: u32,
    pub _pad: u32,
    pub offset: u64,
    pub length: u64,
    pub p_linear_address: u64,
    pub status: u32,
    pub flags: u32,
    pub fd: i32,
    pub _pad2: u32,
}

/// NVOS46_PARAMETERS (NV_ESC_RM_MAP_MEMORY_DMA).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos46 {
    pub h_client: u32,
    pub h_device: u32,
    pub h_dma: u32,
    pub h_memory: u32,
    pub offset: u64,
    pub length: u64,
    pub flags: u32,
    pub _pad: u32,
    pub dma_offset: u64,
    pub status: u32,
    pub _pad2: u32,
}

/// NV_MEMORY_ALLOCATION_PARAMS (class 0x40's `pAllocParms`), as far as
/// gpumem reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryAllocationParams {
    pub owner: u32,
    pub kind: u32,
    pub flags: u32,
    pub width: u32,
    pub height: u32,
    pub pitch: i32,
    pub attr: u32,
    pub attr2: u32,
    pub format: u32,
    pub compr_covg: u32,
    pub zcull_covg: u32,
    pub _pad: u32,
    pub range_lo: u64,
    pub range_hi: u64,
    pub size: u64,
    pub alignment: u64,
    pub offset: u64,
    pub limit: u64,
    pub address: u64,
    pub rest: [u32; 16],
}

/// UVM_MAX_GPUS (v2 of UVM's per-GPU attribute array).
pub const UVM_MAX_GPUS: usize = 32;

/// UVM_MAP_EXTERNAL_ALLOCATION_PARAMS: the range, one attribute set per GPU
/// (36 bytes each), and the RM status at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UvmMapExternalAllocationParams {
    pub base: u64,
    pub length: u64,
    pub offset: u64,
    pub per_gpu_attributes: [u8; UVM_MAX_GPUS * 36],
    pub gpu_attributes_count: u64,
    pub rm_ctrl_fd: i32,
    pub h_client: u32,
    pub h_memory: u32,
    pub rm_status: u32,
}

/// UVM_FREE_PARAMS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UvmFreeParams {
    pub base: u64,
    pub length: u64,
    pub rm_status: u32,
    pub _pad: u32,
}

/// The sizes `_IOWR` encodes, as the driver checks them.
pub const NVOS21_SIZE: u32 = size_of::<Nvos21>() as u32;
pub const NVOS64_SIZE: u32 = size_of::<Nvos64>() as u32;
pub const NVOS00_SIZE: u32 = size_of::<Nvos00>() as u32;
pub const NVOS54_SIZE: u32 = size_of::<Nvos54>() as u32;
pub const NVOS33_WITH_FD_SIZE: u32 = size_of::<Nvos33WithFd>() as u32;
pub const NVOS46_SIZE: u32 = size_of::<Nvos46>() as u32;
pub const UVM_MAP_EXTERNAL_ALLOCATION: u32 = 33;
pub const UVM_FREE: u32 = 34;
/// NV01_MEMORY_LOCAL_USER: video memory.
pub const CLASS_MEMORY_LOCAL_USER: u32 = 0x40;

// The layouts of open-gpu-kernel-modules (driver 535), field by field: the
// eBPF decoder, the stand-in device of the tests and the C client (through
// the header `c_header` writes) all read them from here.
const _: () = {
    use core::mem::offset_of;
    assert!(NVOS21_SIZE == 32 && offset_of!(Nvos21, h_object_new) == 8 && offset_of!(Nvos21, p_alloc_parms) == 16);
    assert!(offset_of!(Nvos21, status) == 28);
    assert!(NVOS64_SIZE == 48 && offset_of!(Nvos64, p_alloc_parms) == 16 && offset_of!(Nvos64, status) == 40);
    assert!(NVOS00_SIZE == 16 && offset_of!(Nvos00, h_object_old) == 8 && offset_of!(Nvos00, status) == 12);
    assert!(NVOS54_SIZE == 32 && offset_of!(Nvos54, h_object) == 4 && offset_of!(Nvos54, cmd) == 8 && offset_of!(Nvos54, status) == 28);
    assert!(NVOS33_WITH_FD_SIZE == 56 && offset_of!(Nvos33WithFd, h_memory) == 8 && offset_of!(Nvos33WithFd, length) == 24);
    assert!(offset_of!(Nvos33WithFd, p_linear_address) == 32 && offset_of!(Nvos33WithFd, status) == 40);
    assert!(NVOS46_SIZE == 56 && offset_of!(Nvos46, h_memory) == 12 && offset_of!(Nvos46, length) == 24);
    assert!(offset_of!(Nvos46, dma_offset) == 40 && offset_of!(Nvos46, status) == 48);
    assert!(offset_of!(MemoryAllocationParams, flags) == 8 && offset_of!(MemoryAllocationParams, size) == 64);
    assert!(offset_of!(UvmMapExternalAllocationParams, rm_status) == 1196);
    assert!(size_of::<UvmMapExternalAllocationParams>() == 1200);
    assert!(offset_of!(UvmFreeParams, rm_status) == 16 && size_of::<UvmFreeParams>() == 24);
};

/// The numbers and layouts a C client needs, as `#define NAME VALUE` lines
/// of a header (the tests' raw-ioctl client takes its ioctl numbers from it
/// and asserts its structs against it).
pub const C_HEADER_FIELDS: &[(&str, usize)] = &[
    ("NV_IOCTL_MAGIC", IOC_TYPE as usize),
    ("NV_ESC_RM_FREE", ESC_RM_FREE as usize),
    ("NV_ESC_RM_CONTROL", ESC_RM_CONTROL as usize),
    ("NV_ESC_RM_ALLOC", ESC_RM_ALLOC as usize),
    ("NV_ESC_RM_MAP_MEMORY", ESC_RM_MAP_MEMORY as usize),
    ("UVM_MAP_EXTERNAL_ALLOCATION", UVM_MAP_EXTERNAL_ALLOCATION as usize),
    ("UVM_FREE", UVM_FREE as usize),
    ("NV01_MEMORY_LOCAL_USER", CLASS_MEMORY_LOCAL_USER as usize),
    ("NVOS21_SIZE", NVOS21_SIZE as usize),
    ("NVOS21_STATUS", core::mem::offset_of!(Nvos21, status)),
    ("NVOS64_SIZE", NVOS64_SIZE as usize),
    ("NVOS64_STATUS", core::mem::offset_of!(Nvos64, status)),
    ("NVOS00_SIZE", NVOS00_SIZE as usize),
    ("NVOS00_STATUS", core::mem::offset_of!(Nvos00, status)),
    ("NVOS54_SIZE", NVOS54_SIZE as usize),
    ("NVOS54_STATUS", core::mem::offset_of!(Nvos54, status)),
    ("NVOS33_WITH_FD_SIZE", NVOS33_WITH_FD_SIZE as usize),
    ("NVOS33_LINEAR_ADDRESS", core::mem::offset_of!(Nvos33WithFd, p_linear_address)),
    ("NVOS33_STATUS", core::mem::offset_of!(Nvos33WithFd, status)),
    ("MEM_PARAMS_FLAGS", core::mem::offset_of!(MemoryAllocationParams, flags)),
    ("MEM_PARAMS_SIZE", core::mem::offset_of!(MemoryAllocationParams, size)),
    ("UVM_MAP_EXTERNAL_SIZE", size_of::<UvmMapExternalAllocationParams>()),
    ("UVM_MAP_EXTERNAL_RM_STATUS", core::mem::offset_of!(UvmMapExternalAllocationParams, rm_status)),
    ("UVM_FREE_SIZE", size_of::<UvmFreeParams>()),
    ("UVM_FREE_RM_STATUS", core::mem::offset_of!(UvmFreeParams, rm_status)),
];

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
