//! gpumem's eBPF programs: one uprobe/uretprobe pair for every libcuda entry
//! point (told apart by the attach cookie, an id of `gpumem_common::api`),
//! PyTorch's allocator probes, the process lifecycle tracepoints, the
//! discovery signals (exec and the dynamic loader's debugger hook), the
//! OOM killer and the NVIDIA driver's ioctls; with the `bench` feature, an
//! empty pair used as the baseline when measuring probe overhead.
//!
//! Every program is `done(try_…(ctx))`: its body uses `?`, and every early
//! exit is counted by reason (gpumem_common::counters::Exit) in EXITS. One
//! file per probe family; maps.rs holds the maps and load-time globals,
//! emit.rs sends events, user.rs reads user memory, task.rs the current task.
#![no_std]
#![no_main]
#![allow(non_snake_case)]

mod cuda;
mod discovery;
mod emit;
mod ioctl;
mod live;
mod maps;
mod oom;
mod process;
mod python;
mod regs;
mod share;
mod stack;
mod task;
mod usdt;
mod user;
mod vmm;

use aya_ebpf::{
    helpers::generated::bpf_get_attach_cookie,
    macros::{kprobe, kretprobe, tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext,
};
use maps::done;

// One entry and one return program for every libcuda entry point: the API id
// is the attach cookie. The `_m_` pair goes on uprobe_multi links (one per
// library and direction, kernel 6.6+), the other on per-point links.

#[uprobe(multi)]
pub fn cuda_m_entry(ctx: ProbeContext) -> u32 {
    done(cuda::try_entry(&ctx, api_of(&ctx)))
}

#[uretprobe(multi)]
pub fn cuda_m_return(ctx: RetProbeContext) -> u32 {
    done(cuda::try_return(&ctx, api_of(&ctx)))
}

#[uprobe]
pub fn cuda_entry(ctx: ProbeContext) -> u32 {
    done(cuda::try_entry(&ctx, api_of(&ctx)))
}

#[uretprobe]
pub fn cuda_return(ctx: RetProbeContext) -> u32 {
    done(cuda::try_return(&ctx, api_of(&ctx)))
}

/// The API id the agent gave this attach point as its cookie.
#[inline(always)]
fn api_of(ctx: &impl EbpfContext) -> u32 {
    // SAFETY: the helper only reads the running program's attach cookie.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

/// Every PyTorch allocator probe site (`pytorch:malloc`, `pytorch:free`):
/// the cookie indexes the site's spec. uprobe_multi links only.
#[uprobe(multi)]
pub fn torch_usdt(ctx: ProbeContext) -> u32 {
    done(usdt::try_probe(&ctx, api_of(&ctx)))
}

/// The same on perf-event uprobes, one per site (kernels before 6.6).
#[uprobe]
pub fn torch_usdt_p(ctx: ProbeContext) -> u32 {
    done(usdt::try_probe(&ctx, api_of(&ctx)))
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    done(process::try_exit(&ctx))
}

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    done(discovery::try_exec())
}

/// On `_dl_debug_state` of each dynamic loader the agent found.
#[uprobe]
pub fn dl_debug_state(_ctx: ProbeContext) -> u32 {
    done(discovery::try_link_map())
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    done(oom::try_mark_victim(&ctx))
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    done(process::try_fork(&ctx))
}

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    done(ioctl::try_enter_openat(&ctx))
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    done(ioctl::try_exit_openat(&ctx))
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    done(ioctl::try_enter_close(&ctx))
}

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    done(ioctl::try_enter_ioctl(&ctx))
}

#[tracepoint]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    done(ioctl::try_exit_ioctl(&ctx))
}

/// Kprobe path (kernels with kprobes and the nvidia module): nvidia_unlocked_ioctl.
#[kprobe]
pub fn nv_rm_ioctl(ctx: ProbeContext) -> u32 {
    done(ioctl::try_kprobe(&ctx, gpumem_common::nv_fd::RM))
}

/// Kprobe path: uvm_unlocked_ioctl_entry.
#[kprobe]
pub fn nv_uvm_ioctl(ctx: ProbeContext) -> u32 {
    done(ioctl::try_kprobe(&ctx, gpumem_common::nv_fd::UVM))
}

#[kretprobe]
pub fn nv_ioctl_return(ctx: RetProbeContext) -> u32 {
    done(ioctl::try_kretprobe(&ctx))
}

/// Baselines for overhead measurements (`cargo xtask bench`): the cheapest
/// possible programs, linked as the real ones are. Only in a `bench` build.
#[cfg(feature = "bench")]
mod bench {
    use aya_ebpf::{
        macros::{uprobe, uretprobe},
        programs::{ProbeContext, RetProbeContext},
    };

    #[uprobe(multi)]
    pub fn empty_m_entry(_ctx: ProbeContext) -> u32 {
        0
    }

    #[uretprobe(multi)]
    pub fn empty_m_return(_ctx: RetProbeContext) -> u32 {
        0
    }

    #[uprobe(multi)]
    pub fn empty_usdt(_ctx: ProbeContext) -> u32 {
        0
    }

    #[uprobe]
    pub fn empty_usdt_p(_ctx: ProbeContext) -> u32 {
        0
    }

    #[uprobe]
    pub fn empty_entry(_ctx: ProbeContext) -> u32 {
        0
    }

    #[uretprobe]
    pub fn empty_return(_ctx: RetProbeContext) -> u32 {
        0
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
