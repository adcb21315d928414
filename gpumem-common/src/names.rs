//! The names the agent finds the eBPF object's parts by: its maps, its
//! load-time globals and its programs. The eBPF crate's statics and
//! functions are named exactly so (the `#[map]` and program macros take the
//! item's own name); a test of the agent checks that the built object has
//! every one, so a rename on one side cannot go unnoticed.

/// Maps, by the static's name in gpumem-ebpf.
pub mod map {
    pub const EVENTS: &str = "EVENTS";
    pub const STACKS: &str = "STACKS";
    pub const STATS: &str = "STATS";
    pub const EXITS: &str = "EXITS";
    pub const LOST_BY_PID: &str = "LOST_BY_PID";
    pub const STACK_BUDGET: &str = "STACK_BUDGET";
    pub const STACK_COPY_BYTES: &str = "STACK_COPY_BYTES";
    pub const PY_THREADS: &str = "PY_THREADS";
    pub const PY_LAYOUTS: &str = "PY_LAYOUTS";
    pub const USDT_SPECS: &str = "USDT_SPECS";
    pub const STACK_SCRATCH: &str = "STACK_SCRATCH";
    pub const PENDING: &str = "PENDING";
    pub const TRACKED: &str = "TRACKED";
    pub const FILTER_PIDS: &str = "FILTER_PIDS";
    pub const NV_FDS: &str = "NV_FDS";
    pub const OPEN_PENDING: &str = "OPEN_PENDING";
    pub const IOCTL_PENDING: &str = "IOCTL_PENDING";
    pub const LIVE: &str = "LIVE";
    pub const LIVE_MISSED: &str = "LIVE_MISSED";

    /// Every map.
    pub const ALL: [&str; 19] = [
        EVENTS,
        STACKS,
        STATS,
        EXITS,
        LOST_BY_PID,
        STACK_BUDGET,
        STACK_COPY_BYTES,
        PY_THREADS,
        PY_LAYOUTS,
        USDT_SPECS,
        STACK_SCRATCH,
        PENDING,
        TRACKED,
        FILTER_PIDS,
        NV_FDS,
        OPEN_PENDING,
        IOCTL_PENDING,
        LIVE,
        LIVE_MISSED,
    ];

    /// What `serve` pins and the next agent adopts: the rings, the loss
    /// counters, the kernel's table of live entries and the calls in flight.
    /// The others (load-time settings, the Python and PyTorch tables the
    /// agent fills, scratch, the early-exit counts) belong to one load.
    pub const PINNED: [&str; 11] =
        [EVENTS, STACKS, STATS, LOST_BY_PID, LIVE, LIVE_MISSED, PENDING, TRACKED, NV_FDS, IOCTL_PENDING, OPEN_PENDING];
}

/// Load-time globals the agent sets (`EbpfLoader::override_global`).
pub mod global {
    pub const FILTER_MODE: &str = "FILTER_MODE";
    pub const WAKEUP_BYTES: &str = "WAKEUP_BYTES";
    pub const STACK_BUDGET_PER_S: &str = "STACK_BUDGET_PER_S";
    pub const STACK_SAMPLE_BYTES: &str = "STACK_SAMPLE_BYTES";
    pub const STACK_BURST: &str = "STACK_BURST";
    pub const CAPTURE_STACKS: &str = "CAPTURE_STACKS";
    pub const FORK_CHILD_PID_OFFSET: &str = "FORK_CHILD_PID_OFFSET";
    pub const OOM_OFFSETS: &str = "OOM_OFFSETS";
    pub const NV_PREFIX: &str = "NV_PREFIX";
    pub const NV_PREFIX_LEN: &str = "NV_PREFIX_LEN";
    pub const KEEP_LIVE: &str = "KEEP_LIVE";

    pub const ALL: [&str; 11] = [
        FILTER_MODE,
        WAKEUP_BYTES,
        STACK_BUDGET_PER_S,
        STACK_SAMPLE_BYTES,
        STACK_BURST,
        CAPTURE_STACKS,
        FORK_CHILD_PID_OFFSET,
        OOM_OFFSETS,
        NV_PREFIX,
        NV_PREFIX_LEN,
        KEEP_LIVE,
    ];
}

/// Programs, by their function's name in gpumem-ebpf.
pub mod program {
    /// libcuda's entry points on uprobe_multi links (the API id is the cookie).
    pub const CUDA_MULTI_ENTRY: &str = "cuda_m_entry";
    pub const CUDA_MULTI_RETURN: &str = "cuda_m_return";
    /// The same on one perf link per entry point (kernels before 6.6).
    pub const CUDA_ENTRY: &str = "cuda_entry";
    pub const CUDA_RETURN: &str = "cuda_return";
    /// PyTorch's allocator probes (the site's spec index is the cookie).
    pub const TORCH_USDT_MULTI: &str = "torch_usdt";
    pub const TORCH_USDT: &str = "torch_usdt_p";
    pub const PROCESS_EXIT: &str = "sched_process_exit";
    pub const PROCESS_EXEC: &str = "sched_process_exec";
    pub const PROCESS_FORK: &str = "sched_process_fork";
    pub const LINK_MAP: &str = "dl_debug_state";
    pub const OOM_VICTIM: &str = "mark_victim";
    pub const ENTER_OPENAT: &str = "sys_enter_openat";
    pub const EXIT_OPENAT: &str = "sys_exit_openat";
    pub const ENTER_CLOSE: &str = "sys_enter_close";
    pub const ENTER_IOCTL: &str = "sys_enter_ioctl";
    pub const EXIT_IOCTL: &str = "sys_exit_ioctl";
    /// Kprobes on the NVIDIA driver, where kprobes exist.
    pub const NV_RM_IOCTL: &str = "nv_rm_ioctl";
    pub const NV_UVM_IOCTL: &str = "nv_uvm_ioctl";
    pub const NV_IOCTL_RETURN: &str = "nv_ioctl_return";

    pub const ALL: [&str; 19] = [
        CUDA_MULTI_ENTRY,
        CUDA_MULTI_RETURN,
        CUDA_ENTRY,
        CUDA_RETURN,
        TORCH_USDT_MULTI,
        TORCH_USDT,
        PROCESS_EXIT,
        PROCESS_EXEC,
        PROCESS_FORK,
        LINK_MAP,
        OOM_VICTIM,
        ENTER_OPENAT,
        EXIT_OPENAT,
        ENTER_CLOSE,
        ENTER_IOCTL,
        EXIT_IOCTL,
        NV_RM_IOCTL,
        NV_UVM_IOCTL,
        NV_IOCTL_RETURN,
    ];

    /// Empty programs on the same attach points, the baseline of the
    /// overhead benchmark: only in an object built with the `bench` feature.
    pub mod bench {
        pub const MULTI_ENTRY: &str = "empty_m_entry";
        pub const MULTI_RETURN: &str = "empty_m_return";
        pub const ENTRY: &str = "empty_entry";
        pub const RETURN: &str = "empty_return";
        pub const USDT_MULTI: &str = "empty_usdt";
        pub const USDT: &str = "empty_usdt_p";

        pub const ALL: [&str; 6] = [MULTI_ENTRY, MULTI_RETURN, ENTRY, RETURN, USDT_MULTI, USDT];
    }
}
