//! The end-of-trace summary: per process and device, live memory and calls.
use std::io::{self, Write};

use serde::Serialize;

use crate::names::{api_name, bytes, printable, result_name, short_id};
use crate::{
    analysis::{
        distributions::{DistributionSummary, Percentiles},
        fragmentation::DeviceLayout,
        reconcile::Reconciliation,
        view::{View, Workload},
    },
    model::agent::ScanStats,
    model::lost::{LostEvents, StacksDropped, TablesFull},
    record::Footer,
    stacks::StackStats,
    state::{OomCounters, Overflow, Process, State},
};

#[derive(Debug, Serialize)]
pub struct DeviceSummary {
    pub device: Option<i32>,
    pub live_bytes: u64,
    pub live_allocs: u64,
    pub vmm_physical_bytes: u64,
    pub vmm_handles: u64,
    pub reserved_bytes: u64,
    /// Bytes of live tensors PyTorch's allocator handed out, where its
    /// probes fired (None: not a PyTorch process, or its probes not seen);
    /// `live_bytes` is then what it reserved.
    pub allocated_bytes: Option<u64>,
    pub tensors: Option<u64>,
    /// The growth verdict: `leak`, `cache_growth` or `none` (None when not sampled).
    pub verdict: Option<crate::analysis::growth::Finding>,
    /// How the live memory is cut up (fragmentation signals).
    pub layout: DeviceLayout,
    /// Where the live memory went: by owner, by pool, and what it maps of
    /// other processes (not in `live_bytes`).
    #[serde(flatten)]
    pub breakdown: crate::analysis::breakdown::Breakdown,
}

#[derive(Debug, Serialize)]
pub struct ApiSummary {
    pub api: &'static str,
    pub calls: u64,
    pub failures: u64,
    /// "CUresult": count, for failures.
    pub results: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct ProcessSummary {
    pub pid: u32,
    pub comm: String,
    pub exited: bool,
    pub devices: Vec<DeviceSummary>,
    pub host_pinned_bytes: u64,
    pub host_pinned_allocs: u64,
    pub untracked_frees: u64,
    /// PyTorch tensors given back that were handed out before tracing began.
    pub untracked_tensor_frees: u64,
    /// Frees read after their address was already reused by another thread.
    pub reordered_frees: u64,
    /// Device bytes the process still held when it exited.
    pub held_at_exit_bytes: u64,
    /// Events of the process lost in the kernel; nonzero: its figures are uncertain.
    pub events_lost: u64,
    pub uncertain: bool,
    /// Video memory held through RM objects allocated by ioctl (class 0x40).
    pub rm_memory_bytes: u64,
    pub rm_memory_objects: u64,
    pub uvm_mapped_bytes: u64,
    pub container: Option<String>,
    pub pod_uid: Option<String>,
    /// The pod's Kubernetes QoS class (guaranteed, burstable, besteffort), from its cgroup path.
    pub qos: Option<&'static str>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub ns_pid: Option<u32>,
    pub apis: Vec<ApiSummary>,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub duration_s: f64,
    pub events: u64,
    pub processes: Vec<ProcessSummary>,
    pub lost_events: u64,
    pub lost: LostEvents,
    pub state_overflow: Overflow,
    /// New processes traced on the pid of an exited one (each started afresh).
    pub pid_reuses: u64,
    /// Calls of processes read after their exit (begun before it), not applied.
    pub late_events: u64,
    /// Successful calls with a size no GPU could hold (garbled input), not applied.
    pub implausible_events: u64,
    /// Events of an id this agent does not know, not applied.
    pub unknown_events: u64,
    /// Kernel tables that were full (nothing lost from the stream, something not followed).
    pub kernel_tables_full: TablesFull,
    pub probes_attached: usize,
    /// Cost of the periodic /proc scans for new libcuda copies.
    pub discovery: ScanStats,
    pub oom: OomCounters,
    /// Allocation stacks: how many, what they cost.
    pub stacks: StackStats,
    /// Allocations that arrived without their stack (accounting unaffected).
    pub stacks_dropped: StacksDropped,
    /// Sizes, lifetimes and latencies (the same observations the exporter's histograms count).
    pub distributions: DistributionSummary,
    /// Traced bytes against NVML's per-process figures; None without NVML.
    pub reconciliation: Option<Vec<Reconciliation>>,
    /// Whether NVML could be used, and if not why.
    pub nvml: String,
    /// Calls in flight whose thread died inside the driver: nothing counted for them.
    pub stale_calls_removed: u64,
    /// Python processes whose frames could not be walked (their stacks are native only), and why.
    pub python_unwalked: Vec<crate::python::Unwalked>,
    /// Processes served less than exactly (forged, broken, over budget), and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<crate::model::degraded::Degraded>,
    /// Processes NVML lists whose calls were never traced, with NVML's bytes
    /// (held since before tracing began).
    pub held_before_tracing: Vec<crate::analysis::view::UntracedRow>,
    /// What a running `gpumem serve` knows these processes hold, from their
    /// first call (memory allocated before this session included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known_to_daemon: Vec<crate::model::Holding>,
}

fn process_summary(p: &Process, view: &View) -> ProcessSummary {
    let c = p.container.as_ref();
    ProcessSummary {
        pid: p.pid,
        comm: p.comm.clone(),
        exited: p.exited,
        devices: view
            .rows
            .iter()
            .filter(|r| r.pid == p.pid && p.held.devices.contains_key(&r.device))
            .map(|r| DeviceSummary {
                device: (r.device != gpumem_common::DEVICE_UNKNOWN).then_some(r.device),
                live_bytes: r.totals.live_bytes,
                live_allocs: r.totals.live_allocs,
                vmm_physical_bytes: r.totals.vmm_physical_bytes,
                vmm_handles: r.totals.vmm_handles,
                reserved_bytes: r.totals.reserved_bytes,
                allocated_bytes: p.tensor_probes.then_some(r.totals.allocated_bytes),
                tensors: p.tensor_probes.then_some(r.totals.tensors),
                verdict: r.growth.as_ref().map(|g| g.verdict),
                layout: r.layout.clone().unwrap_or_default(),
                breakdown: r.breakdown.as_deref().cloned().unwrap_or_default(),
            })
            .collect(),
        host_pinned_bytes: p.held.pinned.bytes,
        host_pinned_allocs: p.held.pinned.allocs,
        untracked_frees: p.untracked_frees,
        untracked_tensor_frees: p.untracked_tensor_frees,
        reordered_frees: p.reordered_frees,
        held_at_exit_bytes: p.held_at_exit_bytes,
        events_lost: p.events_lost,
        uncertain: p.events_lost > 0,
        rm_memory_bytes: p.held.driver.rm_memory_bytes,
        rm_memory_objects: p.held.driver.rm_memory_objects,
        uvm_mapped_bytes: p.held.driver.uvm_mapped_bytes,
        container: c.and_then(|c| c.container.clone()),
        pod_uid: c.and_then(|c| c.pod_uid.clone()),
        qos: c.and_then(|c| c.qos),
        pod: c.and_then(|c| c.pod_name.clone()),
        namespace: c.and_then(|c| c.namespace.clone()),
        ns_pid: c.and_then(|c| c.ns_pid),
        apis: p
            .apis
            .iter()
            .map(|(&id, s)| ApiSummary {
                api: api_name(id),
                calls: s.calls,
                failures: s.failures,
                results: s.failures_by_result.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            })
            .collect(),
    }
}

impl Summary {
    /// From the state at the end, its view (with layouts) and how the session ended.
    pub fn build(state: &State, view: &View, footer: &Footer, distributions: DistributionSummary) -> Self {
        Summary {
            kind: "summary",
            duration_s: footer.duration_s,
            events: state.events,
            processes: state.processes.values().map(|p| process_summary(p, view)).collect(),
            lost_events: footer.lost.total(),
            lost: footer.lost.clone(),
            state_overflow: state.overflow.clone(),
            pid_reuses: state.pid_reuses,
            late_events: state.late_events,
            implausible_events: state.implausible_events,
            unknown_events: state.unknown_events,
            kernel_tables_full: footer.tables_full.clone(),
            probes_attached: footer.probes_attached,
            discovery: footer.discovery.clone(),
            oom: state.oom.clone(),
            stacks: footer.stacks.clone(),
            stacks_dropped: footer.stacks_dropped,
            distributions,
            reconciliation: footer.reconciliation.clone(),
            nvml: footer.nvml.clone(),
            stale_calls_removed: footer.stale_calls_removed,
            python_unwalked: footer.python_unwalked.clone(),
            degraded: Vec::new(),
            held_before_tracing: view.untraced.clone(),
            known_to_daemon: Vec::new(),
        }
    }

    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }

    pub fn write_human(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out)?;
        writeln!(
            out,
            "=== gpumem summary: {:.1} s, {} events, {} lost, {} probes attached ===",
            self.duration_s, self.events, self.lost_events, self.probes_attached
        )?;
        self.write_processes(out)?;
        self.write_apis(out)?;
        write_distributions(out, &self.distributions)?;
        let o = &self.oom;
        if o.cuda_ooms + o.host_oom_kills > 0 {
            writeln!(
                out,
                "\nOUT OF MEMORY: {} CUDA allocation(s) failed with out-of-memory ({} while enough was reported free: fragmentation), {} host OOM kill(s)",
                o.cuda_ooms, o.fragmentation_ooms, o.host_oom_kills
            )?;
        }
        self.write_reconciliation(out)?;
        for u in &self.held_before_tracing {
            writeln!(
                out,
                "note: pid {} ({}) holds {} on GPU {} by NVML, allocated before tracing began (no call of it traced)",
                u.pid,
                printable(&u.comm),
                bytes(u.nvml_bytes),
                u.gpu
            )?;
        }
        for h in &self.known_to_daemon {
            writeln!(
                out,
                "note: the running gpumem serve, which has traced pid {} ({}) from its start: {} live in {} allocation(s) on GPU {}",
                h.pid,
                printable(&h.comm),
                bytes(h.live_bytes),
                h.live_allocs,
                h.device
            )?;
        }
        for u in &self.python_unwalked {
            writeln!(out, "note: Python process {}: frames not walked (native stacks only): {}", u.pid, printable(&u.why))?;
        }
        for d in &self.degraded {
            writeln!(out, "degraded: pid {} ({}): {}; {}", d.pid, d.reason.name(), printable(&d.detail), d.consequence)?;
        }
        self.write_losses(out)
    }

    fn write_processes(&self, out: &mut impl Write) -> io::Result<()> {
        if self.processes.is_empty() {
            return writeln!(out, "no CUDA calls seen");
        }
        writeln!(out, "{:>7} {:<15} {:>4} {:>12} {:>8} {:>12} {:>12}", "PID", "COMM", "DEV", "LIVE", "ALLOCS", "VMM PHYS", "VA RESERVED")?;
        for p in &self.processes {
            let comm = printable(&p.comm);
            let mut state = match (p.exited, p.held_at_exit_bytes) {
                (false, _) => String::new(),
                (true, 0) => " (exited)".to_string(),
                (true, held) => format!(" (exited holding {} it never freed)", bytes(held)),
            };
            if p.uncertain {
                state += &format!(" (UNCERTAIN: {} of its events were lost in the kernel)", p.events_lost);
            }
            if p.devices.is_empty() && p.host_pinned_allocs == 0 {
                writeln!(out, "{:>7} {:<15} {:>4} {:>12} {:>8}{}", p.pid, comm, "-", bytes(0), 0, state)?;
            }
            for d in &p.devices {
                let dev = d.device.map_or("?".to_string(), |d| d.to_string());
                let (live, phys, reserved) = (bytes(d.live_bytes), bytes(d.vmm_physical_bytes), bytes(d.reserved_bytes));
                writeln!(out, "{:>7} {:<15} {:>4} {live:>12} {:>8} {phys:>12} {reserved:>12}{state}", p.pid, comm, dev, d.live_allocs)?;
                for line in super::breakdown_lines(&d.breakdown) {
                    writeln!(out, "{:>7} {:<15}   {line}", p.pid, comm)?;
                }
            }
            if let Some(c) = &p.container {
                let w = Workload { container: None, pod: p.pod.clone().or_else(|| p.pod_uid.clone()), namespace: p.namespace.clone() };
                let pod = if w.pod.is_some() { format!(", pod {}", printable(&w.name())) } else { String::new() };
                writeln!(out, "{:>7} {:<15} container {}{pod}", p.pid, comm, printable(short_id(c)))?;
            }
            if p.rm_memory_objects > 0 || p.uvm_mapped_bytes > 0 {
                let (rm, uvm) = (bytes(p.rm_memory_bytes), bytes(p.uvm_mapped_bytes));
                writeln!(
                    out,
                    "{:>7} {:<15}   RM {rm:>12} {:>8}   (video memory allocated by driver ioctls; UVM mapped {uvm})",
                    p.pid, comm, p.rm_memory_objects
                )?;
            }
            if p.host_pinned_allocs > 0 {
                writeln!(
                    out,
                    "{:>7} {:<15} {:>4} {:>12} {:>8}   (pinned host memory)",
                    p.pid,
                    comm,
                    "host",
                    bytes(p.host_pinned_bytes),
                    p.host_pinned_allocs
                )?;
            }
        }
        Ok(())
    }

    fn write_apis(&self, out: &mut impl Write) -> io::Result<()> {
        if !self.processes.iter().any(|p| !p.apis.is_empty()) {
            return Ok(());
        }
        writeln!(out, "\n{:>7} {:<30} {:>8} {:>8}  FAILURES BY RESULT", "PID", "API", "CALLS", "FAILED")?;
        for p in &self.processes {
            for a in &p.apis {
                let results: Vec<String> = a
                    .results
                    .iter()
                    .map(|(r, n)| {
                        let name = r.parse().ok().and_then(result_name).unwrap_or("");
                        format!("{n}× {r} {}", name.trim_start_matches("CUDA_ERROR_"))
                    })
                    .collect();
                writeln!(out, "{:>7} {:<30} {:>8} {:>8}  {}", p.pid, a.api, a.calls, a.failures, results.join(", "))?;
            }
        }
        Ok(())
    }

    fn write_reconciliation(&self, out: &mut impl Write) -> io::Result<()> {
        let Some(rows) = &self.reconciliation else { return Ok(()) };
        if !rows.is_empty() {
            writeln!(out, "\n{:>7} {:>4} {:>12} {:>12} {:>12}  (NVML vs traced)", "PID", "GPU", "NVML", "TRACED", "UNTRACKED")?;
        }
        for r in rows {
            let untracked = if r.untracked_bytes < 0 {
                format!("-{}", bytes(r.untracked_bytes.unsigned_abs()))
            } else {
                bytes(r.untracked_bytes as u64)
            };
            writeln!(out, "{:>7} {:>4} {:>12} {:>12} {:>12}", r.pid, r.gpu, bytes(r.nvml_bytes), bytes(r.traced_bytes), untracked)?;
        }
        Ok(())
    }

    /// Everything that was lost or did not fit.
    fn write_losses(&self, out: &mut impl Write) -> io::Result<()> {
        if self.lost_events > 0 {
            let l = &self.lost;
            writeln!(
                out,
                "\nLOST EVENTS: {} (ring buffer full {}, call table full {}, return without entry {}, malformed {})",
                self.lost_events, l.ringbuf_full, l.pending_full, l.return_without_entry, l.malformed
            )?;
        }
        let d = &self.stacks_dropped;
        if d.total() > 0 {
            writeln!(
                out,
                "STACKS DROPPED: {} allocation(s) without their stack (stack ring full {}, not found {}); their bytes are counted",
                d.total(),
                d.ring_full,
                d.unmatched
            )?;
        }
        let o = &self.state_overflow;
        if o.entries_dropped > 0 || o.process_events_dropped > 0 {
            writeln!(
                out,
                "STATE OVERFLOW: {} allocations not recorded (table full), {} events of untracked processes (process table full)",
                o.entries_dropped, o.process_events_dropped
            )?;
        }
        let k = &self.kernel_tables_full;
        if k.tracked_processes > 0 || k.pid_filter > 0 {
            writeln!(
                out,
                "KERNEL TABLES FULL: traced processes {} (their exits may be missed), pid filter {} (children or descriptors not followed)",
                k.tracked_processes, k.pid_filter
            )?;
        }
        if k.kernel_table > 0 {
            writeln!(
                out,
                "KERNEL TABLE OF LIVE ENTRIES FULL: {} entries not kept in the kernel (an agent restarted now would not know of them; raise serve --kernel-table-entries)",
                k.kernel_table
            )?;
        }
        if self.implausible_events + self.unknown_events > 0 {
            writeln!(
                out,
                "NOT APPLIED: {} event(s) with a size no GPU could hold, {} of an unknown kind",
                self.implausible_events, self.unknown_events
            )?;
        }
        Ok(())
    }
}

/// Percentiles of sizes, lifetimes and latencies (hdrhistogram, 1 % resolution).
pub fn write_distributions(out: &mut impl Write, d: &DistributionSummary) -> io::Result<()> {
    if d.api_latency_ns.is_empty() {
        return Ok(());
    }
    let head = |out: &mut dyn Write, what: &str| {
        writeln!(out, "\n{what:<36} {:>8} {:>10} {:>10} {:>10} {:>10}", "COUNT", "P50", "P90", "P99", "MAX")
    };
    let row = |out: &mut dyn Write, name: &str, p: &Percentiles, f: &dyn Fn(u64) -> String| {
        writeln!(out, "{name:<36} {:>8} {:>10} {:>10} {:>10} {:>10}", p.count, f(p.p50), f(p.p90), f(p.p99), f(p.max))
    };
    if !d.allocation_size_bytes.is_empty() {
        head(out, "ALLOCATION SIZE")?;
        for (k, p) in &d.allocation_size_bytes {
            row(out, k, p, &bytes)?;
        }
    }
    if !d.allocation_lifetime_ns.is_empty() {
        head(out, "ALLOCATION LIFETIME (explicit frees)")?;
        for (k, p) in &d.allocation_lifetime_ns {
            row(out, k, p, &duration)?;
        }
    }
    head(out, "CALL LATENCY")?;
    for (k, p) in &d.api_latency_ns {
        row(out, k, p, &duration)?;
    }
    Ok(())
}

/// Nanoseconds in the unit that reads best.
fn duration(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns} ns"),
        10_000..=999_999 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.1} s", ns as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::{
        analysis::{health::GpuWatch, series::GrowthTracker, view::ViewOptions},
        state::{testing::ev, Limits},
    };

    #[test]
    fn human_summary_shows_live_memory_failures_and_losses() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { handle: 0xc, device: 1, ..ev(api::CU_CTX_CREATE_V2) });
        s.apply(&Event { addr: 0x1, size: 3 << 20, ..ev(api::CU_MEM_ALLOC_V2) });
        s.apply(&Event { result: 2, size: 1 << 30, ..ev(api::CU_MEM_ALLOC_V2) });
        s.apply(&Event { pid: 200, tid: 200, ..ev(api::CU_INIT) });
        s.apply(&Event { pid: 200, tid: 200, ..ev(api::PROCESS_EXIT) });
        let footer = Footer {
            lost: LostEvents { ringbuf_full: 3, ..Default::default() },
            duration_s: 1.5,
            probes_attached: 30,
            ..Default::default()
        };
        let view =
            View::build(&s, &mut GrowthTracker::default(), &GpuWatch::default(), &ViewOptions { layouts: true, ..Default::default() });
        let summary = Summary::build(&s, &view, &footer, Default::default());
        let mut out = Vec::new();
        summary.write_human(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            "=== gpumem summary: 1.5 s, 5 events, 3 lost, 30 probes attached ===",
            "    100 python             1      3.0 MiB        1",
            "cuMemAlloc_v2                         2        1  1× 2 OUT_OF_MEMORY",
            "(exited)",
            "OUT OF MEMORY: 1 CUDA allocation(s) failed with out-of-memory (0 while enough was reported free: fragmentation), 0 host OOM kill(s)",
            "LOST EVENTS: 3 (ring buffer full 3",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
    }
}
