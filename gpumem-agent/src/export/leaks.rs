//! The `gpumem leaks` report, for people and as one JSON object.
use std::io::{self, Write};

use serde::Serialize;

use super::names::bytes;
use crate::{analysis::leaks::ProcessLeaks, stacks::StackStats, state::OomCounters};

#[derive(Debug, Serialize)]
pub struct LeaksReport {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub duration_s: f64,
    /// CLOCK_MONOTONIC time of the report (the clock of events' ts_ns).
    pub now_ns: u64,
    pub older_than_s: f64,
    pub processes: Vec<ProcessLeaks>,
    pub oom: OomCounters,
    /// cuda_oom and oom_kill records seen while tracing, as in `trace --json`.
    pub oom_events: Vec<serde_json::Value>,
    pub stacks: StackStats,
    pub lost_events: u64,
}

impl LeaksReport {
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }

    pub fn write_human(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "=== gpumem leaks: {:.1} s traced; outstanding allocations older than {} s, by stack ===",
            self.duration_s, self.older_than_s
        )?;
        if self.processes.iter().all(|p| p.outstanding_allocs == 0) {
            writeln!(out, "no outstanding allocations older than {} s (memory freed by process exit is not a leak)", self.older_than_s)?;
        }
        for p in &self.processes {
            let dev = p.device.map_or("?".to_string(), |d| d.to_string());
            let container = p.container.as_deref().map(|c| format!(", container {}", &c[..12.min(c.len())])).unwrap_or_default();
            writeln!(
                out,
                "\npid {} ({}{container}) device {dev}: {} outstanding in {} allocation(s), {} live",
                p.pid,
                p.comm,
                bytes(p.outstanding_bytes),
                p.outstanding_allocs,
                bytes(p.live_bytes)
            )?;
            if let Some(v) = &p.growth {
                let verdict = if v.leaking { "LEAK SUSPECTED: growing and never coming back down" } else { "no sustained growth" };
                writeln!(
                    out,
                    "  growth: {verdict} ({}, {}/s, confidence {:.2})",
                    v.reason,
                    bytes(v.rate_bytes_per_s.max(0.0) as u64),
                    v.confidence
                )?;
            }
            let l = &p.layout;
            let sizes: Vec<String> = l.size_histogram.iter().rev().map(|b| format!("{}× ≤{}", b.count, bytes(b.le_bytes))).collect();
            writeln!(out, "  layout: largest {}; sizes {}", bytes(l.largest_allocation), sizes.join(", "))?;
            if l.vmm_reserved_bytes + l.vmm_physical_bytes > 0 {
                writeln!(
                    out,
                    "  VMM: {} reserved, {} mapped, {} physical; {} handle(s) released but still mapped ({})",
                    bytes(l.vmm_reserved_bytes),
                    bytes(l.vmm_mapped_bytes),
                    bytes(l.vmm_physical_bytes),
                    l.released_but_mapped_handles,
                    bytes(l.released_but_mapped_bytes)
                )?;
            }
            for g in &p.stacks {
                writeln!(out, "  {} in {} allocation(s), oldest {:.1} s:", bytes(g.bytes), g.count, g.oldest_age_s)?;
                if g.frames.is_empty() {
                    writeln!(out, "      [stack not captured]")?;
                }
                for f in &g.frames {
                    writeln!(out, "      {}", f.display())?;
                }
            }
            if p.more_stacks > 0 {
                writeln!(out, "  ... {} more stack(s); raise -n to see them", p.more_stacks)?;
            }
        }
        let o = &self.oom;
        if o.cuda_ooms + o.host_oom_kills > 0 {
            writeln!(
                out,
                "\nOUT OF MEMORY while tracing: {} CUDA out-of-memory failure(s) ({} with enough memory reported free: fragmentation), {} host OOM kill(s)",
                o.cuda_ooms, o.fragmentation_ooms, o.host_oom_kills
            )?;
        }
        let s = &self.stacks;
        writeln!(
            out,
            "\nstacks: {} captured ({} unique), {:.0} bytes copied per allocation, unwinding {:.1} µs each, depth {:.1} mean / {} max; {} lost event(s)",
            s.captured,
            s.unique,
            s.mean_bytes(),
            s.mean_unwind_us(),
            s.mean_depth(),
            s.max_depth,
            self.lost_events
        )
    }
}
