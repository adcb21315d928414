//! PyTorch's caching-allocator probes (USDT `pytorch:malloc(ptr, device,
//! size, stream)` and `pytorch:free(ptr)` in libc10_cuda.so): how the agent
//! tells the eBPF program where each probe site keeps its arguments. Each
//! site's spec sits in the `USDT_SPECS` array; its index is the site's
//! attach cookie.

/// Probe sites (specs) the kernel side knows at once.
pub const SPECS_MAX: u32 = 256;
/// Arguments read per probe, at most (`pytorch:malloc` has 4).
pub const ARGS_MAX: usize = 4;

/// `UsdtArgSpec::kind`.
pub mod arg_kind {
    pub const ABSENT: u8 = 0;
    /// A register: `reg_off` into `struct pt_regs`.
    pub const REGISTER: u8 = 1;
    /// A constant: `value`.
    pub const CONSTANT: u8 = 2;
    /// Memory at a register plus `value`.
    pub const MEMORY: u8 = 3;
}

/// Where one argument is and how to widen it to 64 bits: the raw value is
/// shifted left by `shift` (64 − 8 × size) then right again, arithmetically
/// when `signed`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArgSpec {
    /// The constant, or the memory operand's displacement.
    pub value: i64,
    pub reg_off: u16,
    pub kind: u8,
    pub shift: u8,
    pub signed: u8,
    /// ah..dh: the register's second byte.
    pub high_byte: u8,
    pub _pad: [u8; 2],
}

/// One probe site: which probe it is (an `api::TENSOR_*` id) and its arguments.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    pub probe: u32,
    pub _pad: u32,
    pub args: [UsdtArgSpec; ARGS_MAX],
}

const _: () = assert!(core::mem::size_of::<UsdtArgSpec>() == 16);
const _: () = assert!(core::mem::size_of::<UsdtSpec>() == 8 + 16 * ARGS_MAX);

#[cfg(feature = "aya")]
// SAFETY: repr(C) integers with explicit padding; every bit pattern is valid.
unsafe impl aya::Pod for UsdtSpec {}
