//! gpumem's eBPF programs. One uprobe/uretprobe pair per libcuda entry point
//! (named `e_<symbol>` / `r_<symbol>`, which the agent derives from
//! `gpumem_common::APIS`), the process lifecycle tracepoints, and an empty
//! pair used as the baseline when measuring probe overhead.
#![no_std]
#![no_main]
#![allow(non_snake_case)]

mod cuda;
mod ioctl;
mod maps;
mod oom;
mod process;
mod stack;
mod vmm;

use aya_ebpf::{
    macros::{kprobe, kretprobe, tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use gpumem_common::api;

macro_rules! probe_pair {
    ($($entry:ident, $ret:ident, $id:ident;)*) => {$(
        #[uprobe]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            cuda::on_entry(&ctx, api::$id)
        }
        #[uretprobe]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            cuda::on_return(&ctx, api::$id)
        }
    )*};
}

probe_pair! {
    e_cuInit, r_cuInit, CU_INIT;
    e_cuMemAlloc_v2, r_cuMemAlloc_v2, CU_MEM_ALLOC_V2;
    e_cuMemAllocPitch_v2, r_cuMemAllocPitch_v2, CU_MEM_ALLOC_PITCH_V2;
    e_cuMemAllocManaged, r_cuMemAllocManaged, CU_MEM_ALLOC_MANAGED;
    e_cuMemAllocAsync, r_cuMemAllocAsync, CU_MEM_ALLOC_ASYNC;
    e_cuMemAllocAsync_ptsz, r_cuMemAllocAsync_ptsz, CU_MEM_ALLOC_ASYNC_PTSZ;
    e_cuMemAllocFromPoolAsync, r_cuMemAllocFromPoolAsync, CU_MEM_ALLOC_FROM_POOL_ASYNC;
    e_cuMemAllocFromPoolAsync_ptsz, r_cuMemAllocFromPoolAsync_ptsz, CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ;
    e_cuMemHostAlloc, r_cuMemHostAlloc, CU_MEM_HOST_ALLOC;
    e_cuMemAllocHost_v2, r_cuMemAllocHost_v2, CU_MEM_ALLOC_HOST_V2;
    e_cuMemFree_v2, r_cuMemFree_v2, CU_MEM_FREE_V2;
    e_cuMemFreeAsync, r_cuMemFreeAsync, CU_MEM_FREE_ASYNC;
    e_cuMemFreeAsync_ptsz, r_cuMemFreeAsync_ptsz, CU_MEM_FREE_ASYNC_PTSZ;
    e_cuMemFreeHost, r_cuMemFreeHost, CU_MEM_FREE_HOST;
    e_cuMemCreate, r_cuMemCreate, CU_MEM_CREATE;
    e_cuMemRelease, r_cuMemRelease, CU_MEM_RELEASE;
    e_cuMemMap, r_cuMemMap, CU_MEM_MAP;
    e_cuMemUnmap, r_cuMemUnmap, CU_MEM_UNMAP;
    e_cuMemAddressReserve, r_cuMemAddressReserve, CU_MEM_ADDRESS_RESERVE;
    e_cuMemAddressFree, r_cuMemAddressFree, CU_MEM_ADDRESS_FREE;
    e_cuDevicePrimaryCtxRetain, r_cuDevicePrimaryCtxRetain, CU_DEVICE_PRIMARY_CTX_RETAIN;
    e_cuDevicePrimaryCtxRelease_v2, r_cuDevicePrimaryCtxRelease_v2, CU_DEVICE_PRIMARY_CTX_RELEASE_V2;
    e_cuDevicePrimaryCtxReset_v2, r_cuDevicePrimaryCtxReset_v2, CU_DEVICE_PRIMARY_CTX_RESET_V2;
    e_cuCtxCreate_v2, r_cuCtxCreate_v2, CU_CTX_CREATE_V2;
    e_cuCtxCreate_v3, r_cuCtxCreate_v3, CU_CTX_CREATE_V3;
    e_cuCtxCreate_v4, r_cuCtxCreate_v4, CU_CTX_CREATE_V4;
    e_cuCtxSetCurrent, r_cuCtxSetCurrent, CU_CTX_SET_CURRENT;
    e_cuCtxPushCurrent_v2, r_cuCtxPushCurrent_v2, CU_CTX_PUSH_CURRENT_V2;
    e_cuCtxPopCurrent_v2, r_cuCtxPopCurrent_v2, CU_CTX_POP_CURRENT_V2;
    e_cuCtxDestroy_v2, r_cuCtxDestroy_v2, CU_CTX_DESTROY_V2;
    e_cuMemGetInfo_v2, r_cuMemGetInfo_v2, CU_MEM_GET_INFO_V2;
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    process::on_exit(&ctx)
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    oom::on_mark_victim(&ctx)
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    process::on_fork(&ctx)
}

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    ioctl::on_enter_openat(&ctx)
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    ioctl::on_exit_openat(&ctx)
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    ioctl::on_enter_close(&ctx)
}

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    ioctl::on_enter_ioctl(&ctx)
}

#[tracepoint]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    ioctl::on_exit_ioctl(&ctx)
}

/// Kprobe path (kernels with kprobes and the nvidia module): nvidia_unlocked_ioctl.
#[kprobe]
pub fn nv_rm_ioctl(ctx: ProbeContext) -> u32 {
    ioctl::on_kprobe(&ctx, gpumem_common::nv_fd::RM)
}

/// Kprobe path: uvm_unlocked_ioctl_entry.
#[kprobe]
pub fn nv_uvm_ioctl(ctx: ProbeContext) -> u32 {
    ioctl::on_kprobe(&ctx, gpumem_common::nv_fd::UVM)
}

#[kretprobe]
pub fn nv_ioctl_return(ctx: RetProbeContext) -> u32 {
    ioctl::on_kretprobe(&ctx)
}

/// Baseline for overhead measurements: the cheapest possible probe pair.
#[uprobe]
pub fn empty_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn empty_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
