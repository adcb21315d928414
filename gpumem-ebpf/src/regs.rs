//! The registers the programs read beyond the arguments and the return
//! value (which aya reads for each architecture): where the caller's stack
//! starts, and where a by-value struct argument is. x86_64 and aarch64
//! (issue 33); the agent's unwinder takes them as (ip, sp, frame pointer).
use aya_ebpf::bindings::pt_regs;

/// At a uretprobe: the return address in the caller, the caller's stack
/// pointer and frame pointer (x86_64: rip, rsp, rbp; aarch64: pc, sp, x29).
#[inline(always)]
pub fn caller(regs: *const pt_regs) -> (u64, u64, u64) {
    // SAFETY: `regs` is the probe's context, its pt_regs.
    #[cfg(bpf_target_arch = "x86_64")]
    unsafe {
        ((*regs).rip, (*regs).rsp, (*regs).rbp)
    }
    // SAFETY: as above; aya's aarch64 pt_regs is the kernel's user_pt_regs.
    #[cfg(bpf_target_arch = "aarch64")]
    unsafe {
        ((*regs).pc, (*regs).sp, (*regs).regs[29])
    }
}

/// At a function's entry, where a 64-byte struct passed by value as its
/// second argument (cuIpcOpenMemHandle_v2's CUipcMemHandle) is: the x86-64
/// SysV ABI passes it in memory at [rsp+8] (the return address at [rsp]);
/// AAPCS64 passes a copy by reference, its address in x1.
#[inline(always)]
pub fn second_struct_argument(regs: *const pt_regs) -> u64 {
    // SAFETY: `regs` is the probe's context, its pt_regs.
    #[cfg(bpf_target_arch = "x86_64")]
    unsafe {
        (*regs).rsp + 8
    }
    // SAFETY: as above.
    #[cfg(bpf_target_arch = "aarch64")]
    unsafe {
        (*regs).regs[1]
    }
}
