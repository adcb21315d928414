//! Every metric gpumem exports: name, help and type, in one table (the
//! README's metric reference is checked against it). Names follow DESIGN.md
//! §5: `gpumem_` prefix, base units; counters are named without `_total`,
//! which the encoder appends.
use prometheus_client::metrics::MetricType::{self, Counter, Gauge, Histogram};

#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
}

macro_rules! catalog {
    ($($id:ident, $kind:ident, $name:literal, $help:literal;)*) => {
        $(pub const $id: Metric = Metric { name: $name, help: $help, kind: $kind };)*
        /// Every metric, in exposition order.
        pub const ALL: &[Metric] = &[$($id),*];
    };
}

catalog! {
    ALLOCATION_SIZE, Histogram, "gpumem_allocation_size_bytes", "Size of successful allocations, by kind of memory";
    ALLOCATION_LIFETIME, Histogram, "gpumem_allocation_lifetime_seconds", "Time from allocation to its explicit free, by kind of memory (memory released by process exit or context destruction is not counted)";
    API_LATENCY, Histogram, "gpumem_api_latency_seconds", "Time spent in each traced driver call, entry to return";
    PROCESS_MEMORY, Gauge, "gpumem_process_memory_bytes", "Device memory the process holds on the GPU, as traced: allocations plus VMM physical handles";
    PROCESS_ALLOCATIONS, Gauge, "gpumem_process_allocations", "Live allocations and VMM handles the process holds on the GPU";
    PROCESS_VMM_PHYSICAL, Gauge, "gpumem_process_vmm_physical_bytes", "Part of the process's memory held as cuMemCreate handles";
    PROCESS_VMM_RESERVED, Gauge, "gpumem_process_vmm_reserved_bytes", "Address space reserved with cuMemAddressReserve (not memory)";
    PROCESS_LEAK_SUSPECT, Gauge, "gpumem_process_leak_suspect_bytes", "While the growth detector fires for the process: bytes of its live allocations older than --leak-age";
    PROCESS_GROWTH, Gauge, "gpumem_process_memory_growth_bytes_per_second", "Slope of the floor of the process's live bytes (growth detector)";
    PROCESS_LEAK_SUSPECTED, Gauge, "gpumem_process_leak_suspected", "1 while the growth detector says the process's memory keeps growing (for PyTorch processes: its tensors' bytes)";
    PROCESS_ALLOCATED, Gauge, "gpumem_process_allocated_bytes", "Bytes of live tensors PyTorch's caching allocator handed out (its USDT probes); gpumem_process_memory_bytes is what it reserved. Only for processes whose probes fired";
    PROCESS_RESERVED_UNUSED, Gauge, "gpumem_process_reserved_unused_bytes", "Bytes of PyTorch's reserved segments no live tensor uses (its cache)";
    PROCESS_LARGEST_FREE_BLOCK, Gauge, "gpumem_process_largest_free_block_bytes", "Largest contiguous free block in PyTorch's reserved segments: far below reserved-unused means fragmentation";
    PROCESS_BY_OWNER, Gauge, "gpumem_process_memory_by_owner_bytes", "Device memory the process holds on the GPU, by the module (or Python file) that asked the driver for it: at most 8 owners per process and GPU, then owner=\"other\"; owner=\"unknown\" where no stack was taken; estimates where stacks were sampled";
    PROCESS_BY_POOL, Gauge, "gpumem_process_memory_by_pool_bytes", "Part of the process's memory on the GPU in live allocations from a stream-ordered pool (pool=\"default\" for the device's own, else the pool's handle; at most 8 per process and GPU). What a pool keeps beyond its live allocations is inside the driver: it shows in NVML's figure, not here";
    PROCESS_IMPORTED, Gauge, "gpumem_process_imported_memory_bytes", "Other processes' device memory mapped into the process (CUDA IPC, pool pointers): counted in the exporter's gpumem_process_memory_bytes, never in this process's, so sums over processes count each byte once";
    PROCESS_GRAPH_POOL, Gauge, "gpumem_process_graph_pool_bytes", "Bytes the process's CUDA graphs' memory allocation nodes on the GPU declare (cuGraphAddMemAllocNode without a free node): what the graph memory pool hands out when they run; the pool's physical size is the driver's";
    PROCESS_CHECKPOINTED, Gauge, "gpumem_process_checkpointed", "1 while a checkpointing tool (cuCheckpointProcessCheckpoint) holds the process's device memory off the GPU: suspended, not freed and not a leak";
    LEAK_GROUP_BYTES, Gauge, "gpumem_leak_group_bytes", "Outstanding bytes of a stack group whose own growth verdict is leak (at most 5 per process and GPU, the largest; stack_id as in gpumem leaks)";
    LEAK_GROUP_GROWTH, Gauge, "gpumem_leak_group_growth_bytes_per_second", "Slope of the floor of a leaking stack group's outstanding bytes";
    PROCESS_CACHE_GROWTH, Gauge, "gpumem_process_cache_growth", "1 while reserved grows and allocated stays flat (the caching allocator's cache or fragmentation, not a leak)";
    PROCESS_HOST_RESIDENT, Gauge, "gpumem_process_host_resident_bytes", "Host memory the traced process has resident (VmRSS), read every few seconds";
    PROCESS_HOST_SWAP, Gauge, "gpumem_process_host_swap_bytes", "Host memory of the traced process swapped out (VmSwap)";
    PROCESS_GPU_NODE_RESIDENT, Gauge, "gpumem_process_gpu_node_resident_bytes", "The traced process's pages on the NUMA node that is a GPU's own memory (coherent platforms such as GH200 and GB200, where NVML names the node), from /proc/PID/numa_maps every 30 s as numastat -p sums them: memory from malloc or mmap the GPU holds with no driver call, not in gpumem_process_memory_bytes";
    GPU_NODE_READS_CUT, Counter, "gpumem_gpu_node_reads_cut", "numa_maps reads cut at their 16 MiB bound (a process with about 100 000 mappings or more): its gpumem_process_gpu_node_resident_bytes is a lower bound";
    HOST_SWAP_IN, Counter, "gpumem_host_swap_in_bytes", "Bytes the node swapped in since boot (/proc/vmstat pswpin times the page size)";
    HOST_SWAP_OUT, Counter, "gpumem_host_swap_out_bytes", "Bytes the node swapped out since boot (/proc/vmstat pswpout times the page size)";
    CONTAINER_MEMORY_USAGE, Gauge, "gpumem_container_memory_usage_bytes", "Host memory the memory cgroup of a traced process's container uses";
    CONTAINER_MEMORY_LIMIT, Gauge, "gpumem_container_memory_limit_bytes", "The memory limit of that cgroup (absent: none)";
    CONTAINER_GPU_MEMORY_USAGE, Gauge, "gpumem_container_gpu_memory_usage_bytes", "Device memory the cgroup of a traced process uses in a region of cgroup v2's dmem controller (dmem.current; Linux 6.14+, drivers that register their memory)";
    CONTAINER_GPU_MEMORY_LIMIT, Gauge, "gpumem_container_gpu_memory_limit_bytes", "That region's limit for the cgroup (dmem.max; absent: max, no limit)";
    PROCESS_HOST_PINNED, Gauge, "gpumem_process_host_pinned_bytes", "Page-locked host memory the process holds (cuMemHostAlloc/cuMemAllocHost)";
    PROCESS_EVENTS_LOST, Counter, "gpumem_process_events_lost", "Events of the process lost in the kernel (ring buffer or call table full): its other series may be wrong";
    PROCESS_UNTRACKED, Gauge, "gpumem_process_untracked_bytes", "GPU memory NVML reports for the process minus what gpumem traced (context overhead, memory allocated before the agent started, untraced paths)";
    EXPORTER_PROCESS_SERIES, Gauge, "gpumem_exporter_process_series", "(process, device) pairs known, before the cap";
    EXPORTER_AGGREGATED_SERIES, Gauge, "gpumem_exporter_aggregated_process_series", "(process, device) pairs summed into comm=\"other\" because of --max-process-series";
    API_CALLS, Counter, "gpumem_api_calls", "Traced driver calls by API and result (success or the CUresult name)";
    CUDA_OOM, Counter, "gpumem_cuda_oom", "CUDA allocations that failed with CUDA_ERROR_OUT_OF_MEMORY";
    FRAGMENTATION_FAILURES, Counter, "gpumem_fragmentation_failures", "CUDA out-of-memory failures while at least the requested size was free: reported by the process's own cuMemGetInfo, or cached unused in PyTorch's segments";
    PROCESS_EXITS, Counter, "gpumem_process_exits", "Processes that exited while holding memory on the GPU (the driver frees it): an exit explains a drop in used memory";
    OOM_KILLS, Counter, "gpumem_oom_kills", "Host OOM kills (oom:mark_victim), source=memcg when in a memory cgroup with a limit";
    GPU_MEMORY_TOTAL, Gauge, "gpumem_gpu_memory_total_bytes", "GPU memory size (NVML)";
    GPU_MEMORY_USED, Gauge, "gpumem_gpu_memory_used_bytes", "GPU memory in use, all processes and the driver (NVML)";
    GPU_TRACED_MEMORY, Gauge, "gpumem_gpu_traced_memory_bytes", "GPU memory held by traced processes (sum of gpumem_process_memory_bytes)";
    GPU_ECC_ERRORS, Counter, "gpumem_gpu_ecc_errors", "ECC errors (NVML), by error type and counter (volatile: since driver load; aggregate: lifetime)";
    GPU_RETIRED_PAGES, Gauge, "gpumem_gpu_retired_pages", "Memory pages retired (NVML), by cause";
    GPU_RETIRED_PAGES_PENDING, Gauge, "gpumem_gpu_retired_pages_pending", "1 when a page retirement waits for the next driver reload";
    GPU_REMAPPED_ROWS, Gauge, "gpumem_gpu_remapped_rows", "Rows remapped (NVML), by kind of error that caused it";
    GPU_ROW_REMAP_PENDING, Gauge, "gpumem_gpu_row_remap_pending", "1 when a row remap waits for the next GPU reset";
    GPU_ROW_REMAP_FAILURE, Gauge, "gpumem_gpu_row_remap_failure", "1 when a row remap failed (the GPU should be replaced)";
    GPU_ADDRESSING_MODE, Gauge, "gpumem_gpu_addressing_mode", "1 for the GPU's addressing mode, by `mode` (NVML nvmlDeviceGetAddressingMode, driver 570 and later: none, hmm, ats); under hmm or ats the GPU also reaches host memory from malloc or mmap, which no driver call allocates and gpumem's per-process figures leave out. No series where the driver does not say";
    GPU_TEMPERATURE, Gauge, "gpumem_gpu_temperature_celsius", "GPU core temperature (NVML)";
    GPU_MEMORY_TEMPERATURE, Gauge, "gpumem_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature (NVML field 82)";
    GPU_XID_ERRORS, Counter, "gpumem_gpu_xid_errors", "XID events received from NVML since the agent started, by XID code";
    GPU_HEALTH_SCORE, Gauge, "gpumem_gpu_health_score", "Health score 0-100 from ECC, retirement, remap, temperature and XID rules (see `gpumem health`)";
    LOST_EVENTS, Counter, "gpumem_lost_events", "Events that never reached the agent, by reason";
    STACKS_SAMPLING, Counter, "gpumem_stack_sampling", "Allocations over their process's stack budget, by outcome (sampled: stack taken and weighed; not_sampled: stood for by the sampled ones)";
    STACKS_DROPPED, Counter, "gpumem_stacks_dropped", "Allocations that reached the agent without their stack, by reason (their bytes are counted)";
    PROBE_EXITS, Counter, "gpumem_probe_exits", "Early exits of the eBPF programs, by reason: most are the programs doing their job (not_traced, not_nvidia, thread_exit), the *_unreadable, *_full and field_absent ones say what could not be done";
    TABLE_OVERFLOW, Counter, "gpumem_table_overflow", "Records not kept because a bounded table was full, by table (kernel_* tables are the eBPF side's)";
    IMPLAUSIBLE_EVENTS, Counter, "gpumem_implausible_events", "Successful calls with a size no GPU could hold (an ABI mismatch or garbled read): not applied";
    UNKNOWN_EVENTS, Counter, "gpumem_unknown_events", "Events of an id this agent does not know (a newer eBPF object): not applied";
    PROBES_ATTACHED, Gauge, "gpumem_probes_attached", "uprobes, uretprobes and tracepoints attached";
    STALE_CALLS_REMOVED, Counter, "gpumem_stale_calls_removed", "Calls whose thread died inside the driver (never returned): their saved entries removed, nothing counted for them";
    EVENTS_PROCESSED, Counter, "gpumem_events_processed", "Events read from the ring buffer and applied";
    TRACKED_PROCESSES, Gauge, "gpumem_tracked_processes", "Processes in the agent's state, live or recently exited";
    NVML_UP, Gauge, "gpumem_nvml_up", "1 when NVML answers (GPU series come from it)";
    AGENT_ERRORS, Counter, "gpumem_agent_errors", "Operations of the agent that failed and were retried later, by operation (the figures they feed are from the last success)";
    AGENT_CPU, Counter, "gpumem_agent_cpu_seconds", "CPU time the agent has used (user + system)";
    AGENT_RSS, Gauge, "gpumem_agent_resident_memory_bytes", "The agent's resident memory, BPF ring buffer mapping included";
    ACTIONS, Counter, "gpumem_actions", "Events handed to serve --action commands, by event and outcome (ok, failed, timeout, rate_limited, queue_full, dry_run)";
    WEBHOOKS, Counter, "gpumem_webhooks", "Events POSTed to serve --webhook receivers, by event and outcome (ok after retries, failed after retries, rate_limited, queue_full, dry_run)";
    OTLP_PUSHES, Counter, "gpumem_otlp_pushes", "OTLP pushes of these metrics (serve --otlp-endpoint), by outcome";
    KERNEL_TABLE_ENTRIES, Gauge, "gpumem_kernel_table_entries", "Live allocations, VMM handles, mappings and contexts the kernel keeps for a restarted agent (serve's pinned table)";
    KERNEL_TABLE_CAPACITY, Gauge, "gpumem_kernel_table_capacity_entries", "Entries the kernel's table holds at most (serve --kernel-table-entries); beyond it gpumem_table_overflow_total{table=\"kernel_live_entries\"} counts";
    KERNEL_TABLE_BYTES, Gauge, "gpumem_kernel_table_bytes", "Kernel memory the table's entries take";
    AGENT_BPF_MAP_RSS, Gauge, "gpumem_agent_bpf_map_resident_memory_bytes", "Part of the resident memory that is BPF maps mapped from the kernel (the event ring buffer, whose pages are mapped twice)";
    AGENT_BPF_MAP_BYTES, Gauge, "gpumem_agent_bpf_map_bytes", "Kernel memory of each BPF map the agent holds open (its fdinfo's memlock), by map name as the kernel keeps it (the rings' pages are resident from their creation)";
    AGENT_HEAP, Gauge, "gpumem_agent_heap_bytes", "The agent's heap in use by owner: state (live allocations and their processes), stacks (unwound and symbolized stacks), unwind (libraries' unwind tables), python (Python frames and code-object caches), growth (growth series), history (what exports keep), estimated from their tables' capacities; unattributed: the rest of the allocator's bytes in use (what the symbolizer keeps parsed, buffers)";
    AGENT_CACHE_ENTRIES, Gauge, "gpumem_agent_cache_entries", "Entries in each of the agent's caches (stacks, known_stacks, symbolized_frames, stack_owners, process_unwinders, unwind_tables, python_code_objects)";
    AGENT_CACHE_MAX, Gauge, "gpumem_agent_cache_max_entries", "The most entries each cache holds (python_code_objects: per process); a full cache starts over, a full stacks table refuses new stacks (gpumem_table_overflow_total{table=\"stacks\"})";
    AGENT_CACHE_EVICTIONS, Counter, "gpumem_agent_cache_evictions", "Entries each cache let go to stay within its bound (read or computed again when asked)";
    AGENT_HEAP_FREE, Gauge, "gpumem_agent_heap_free_bytes", "Free bytes the allocator keeps in its arenas, not given back to the kernel yet (resident where touched)";
    BUILD_INFO, Gauge, "gpumem_build_info", "The agent's version";
    DEGRADED, Counter, "gpumem_degraded", "Processes the agent serves less than exactly because what they shape was forged, broken or over its budget for one process, by reason (forged_cgroup: no container attributed; python_threads: native frames only; python_reads: Python frames `?` past its read budget; library_tables: a library's symbol or unwind tables past budget or deadline; libcuda_copies: a libcuda copy past the copies attached per tenant); gpumem status names them";
}

/// The name a sample of the metric has in the exposition (counters end in `_total`).
pub fn exposed_name(m: &Metric) -> String {
    match m.kind {
        Counter => format!("{}_total", m.name),
        _ => m.name.to_string(),
    }
}
