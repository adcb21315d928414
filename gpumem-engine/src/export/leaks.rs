//! The `gpumem leaks` report, for people and as one JSON object.
use std::io::{self, Write};

use serde::Serialize;

use crate::names::{bytes, printable, short_id};
use crate::{
    analysis::{distributions::DistributionSummary, growth::Finding, leaks::ProcessLeaks, wind_down::WoundDown},
    model::lost::StacksDropped,
    stacks::StackStats,
    state::OomCounters,
};

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
    /// Out-of-memory records beyond the ones kept (still counted in `oom`).
    pub oom_events_dropped: u64,
    pub stacks: StackStats,
    /// Allocations that arrived without their stack (their bytes are counted).
    pub stacks_dropped: StacksDropped,
    pub lost_events: u64,
    /// Sizes, lifetimes and latencies over the session (as in the trace summary).
    pub distributions: DistributionSummary,
    /// Processes NVML lists whose calls were never traced: what they hold
    /// was allocated before tracing began, so no stack is known for it.
    pub held_before_tracing: Vec<crate::analysis::view::UntracedRow>,
    /// Processes that exited while traced: what their stack groups held as
    /// they wound down (a leak freed at teardown is named here).
    pub exited: Vec<WoundDown>,
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
        if self.processes.iter().all(|p| p.outstanding_allocs == 0) && self.exited.is_empty() {
            writeln!(out, "no outstanding allocations older than {} s (memory freed by process exit is not a leak)", self.older_than_s)?;
        }
        for p in &self.processes {
            write_process(out, p)?;
        }
        for w in &self.exited {
            write_wound_down(out, w)?;
        }
        for u in &self.held_before_tracing {
            writeln!(
                out,
                "\npid {} ({}) GPU {}: {} by NVML, allocated before tracing began: no stack is known for it (start gpumem before the job, or run `gpumem serve`)",
                u.pid,
                printable(&u.comm),
                u.gpu,
                bytes(u.nvml_bytes)
            )?;
        }
        self.write_ooms(out)?;
        super::summary::write_distributions(out, &self.distributions)?;
        let s = &self.stacks;
        writeln!(
            out,
            "\nstacks: {} captured ({} unique, {} by sampling beyond the budget), {} not sampled, {} dropped, {:.0} bytes copied per allocation, unwinding {:.1} µs each, depth {:.1} mean / {} max; {} lost event(s)",
            s.captured,
            s.unique,
            s.sampled,
            s.not_sampled,
            self.stacks_dropped.total(),
            s.mean_bytes(),
            s.mean_unwind_us(),
            s.mean_depth(),
            s.max_depth,
            self.lost_events
        )
    }

    fn write_ooms(&self, out: &mut impl Write) -> io::Result<()> {
        let o = &self.oom;
        if o.cuda_ooms + o.host_oom_kills > 0 {
            writeln!(
                out,
                "\nOUT OF MEMORY while tracing: {} CUDA out-of-memory failure(s) ({} fragmentation: enough memory reported free or cached by PyTorch, in no block large enough), {} host OOM kill(s)",
                o.cuda_ooms, o.fragmentation_ooms, o.host_oom_kills
            )?;
        }
        if self.oom_events_dropped > 0 {
            writeln!(
                out,
                "({} out-of-memory record(s) beyond the first {} were not kept)",
                self.oom_events_dropped,
                self.oom_events.len()
            )?;
        }
        Ok(())
    }
}

/// An exited process: what each group held as it wound down, and whether
/// it was freed only then.
fn write_wound_down(out: &mut impl Write, w: &WoundDown) -> io::Result<()> {
    let dev = w.device.map_or("?".to_string(), |d| d.to_string());
    writeln!(
        out,
        "
pid {} ({}) device {dev} exited; its last {:.1} s (after its last allocation) freed, by stack:",
        w.pid,
        printable(&w.comm),
        w.wind_down_s
    )?;
    for g in &w.groups {
        let mut notes = Vec::new();
        if g.still_growing {
            notes.push("STILL GROWING when the program wound down".to_string());
        }
        if g.released_only_at_exit {
            notes.push(format!("released only at exit ({} freed in the wind-down)", bytes(g.freed_at_exit_bytes)));
        }
        if let Some(v) = &g.verdict {
            notes.push(format!("verdict then: {} ({})", v.verdict.name(), super::verdict_figures(v)));
        }
        writeln!(
            out,
            "  {} held at wind-down, peak {}{}:",
            bytes(g.held_at_wind_down_bytes),
            bytes(g.peak_bytes),
            if notes.is_empty() { String::new() } else { format!("; {}", notes.join("; ")) }
        )?;
        if g.frames.is_empty() {
            writeln!(out, "      [stack not captured]")?;
        }
        for f in &g.frames {
            writeln!(out, "      {}", f.display())?;
        }
    }
    Ok(())
}

/// One process: what it holds, its growth verdict, layout and leak stacks.
fn write_process(out: &mut impl Write, p: &ProcessLeaks) -> io::Result<()> {
    let dev = p.device.map_or("?".to_string(), |d| d.to_string());
    let container = p.container.as_deref().map(|c| format!(", container {}", printable(short_id(c)))).unwrap_or_default();
    writeln!(
        out,
        "\npid {} ({}{container}) device {dev}: {} outstanding in {} allocation(s), {} live",
        p.pid,
        printable(&p.comm),
        bytes(p.outstanding_bytes),
        p.outstanding_allocs,
        bytes(p.live_bytes)
    )?;
    if let Some(v) = &p.growth {
        let verdict = match v.verdict {
            Finding::Leak if p.tensors.is_some() => "LEAK SUSPECTED: tensors (allocated bytes) growing and never coming back down",
            Finding::Leak => "LEAK SUSPECTED: growing and never coming back down",
            Finding::CacheGrowth => {
                "CACHE GROWTH: reserved grows while allocated stays flat (the allocator's cache, or fragmentation): not a leak"
            }
            Finding::Plateau => "plateau: grew, then held",
            Finding::None => "no sustained growth",
            Finding::Insufficient => "not enough data yet",
        };
        writeln!(out, "  growth: {verdict} ({})", super::verdict_figures(v))?;
    }
    for line in super::breakdown_lines(&p.breakdown) {
        writeln!(out, "  {line}")?;
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
    if let Some(fb) = &l.free_blocks {
        writeln!(
            out,
            "  PyTorch cache: {} of {} reserved unused, largest free block {}{}",
            bytes(fb.unused_bytes),
            bytes(fb.segment_bytes),
            bytes(fb.largest_free_block),
            if fb.tensors_outside_segments > 0 {
                format!(" ({} tensor(s) in segments made before tracing: an estimate)", fb.tensors_outside_segments)
            } else {
                String::new()
            }
        )?;
    }
    if let Some(t) = &p.tensors {
        writeln!(
            out,
            "  tensors: {} outstanding in {} tensor(s), {} allocated; by stack:",
            bytes(t.outstanding_bytes),
            t.outstanding_tensors,
            bytes(t.allocated_bytes)
        )?;
        write_groups(out, &t.stacks, t.more_stacks)?;
        writeln!(out, "  segments reserved from the driver, by stack:")?;
    }
    write_groups(out, &p.stacks, p.more_stacks)?;
    if let Some(note) = super::not_sampled_note(p.not_sampled_allocs, p.not_sampled_bytes) {
        writeln!(out, "  {note}")?;
    }
    Ok(())
}

fn write_groups(out: &mut impl Write, groups: &[crate::analysis::leaks::LeakGroup], more: usize) -> io::Result<()> {
    for g in groups {
        writeln!(out, "  {}, oldest {:.1} s{}:", super::group_figures(g), g.oldest_age_s, super::group_verdict(g))?;
        if g.frames.is_empty() {
            writeln!(out, "      [stack not captured]")?;
        }
        for f in &g.frames {
            writeln!(out, "      {}", f.display())?;
        }
    }
    if more > 0 {
        writeln!(out, "  ... {more} more stack(s); raise -n to see them")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        analysis::{fragmentation::DeviceLayout, growth::Verdict, leaks::LeakGroup},
        stacks::Frame,
    };

    fn frame(function: &str, line: u32) -> Frame {
        Frame {
            function: Some(function.into()),
            offset: Some(0x11),
            file: Some("/src/train.c".into()),
            line: Some(line),
            module: Arc::from("/opt/app/train"),
            module_offset: 0x1234,
            python: false,
        }
    }

    #[test]
    fn human_report_names_stacks_growth_and_costs() {
        let report = LeaksReport {
            kind: "leaks",
            duration_s: 3.0,
            now_ns: 0,
            older_than_s: 1.0,
            processes: vec![ProcessLeaks {
                pid: 42,
                comm: "train".into(),
                container: Some("0123456789abcdef0123".into()),
                pod_uid: None,
                ns_pid: Some(7),
                device: Some(0),
                outstanding_bytes: 80 << 20,
                outstanding_allocs: 20,
                live_bytes: 90 << 20,
                growth: Some(Verdict {
                    leaking: true,
                    verdict: Finding::Leak,
                    confidence: 0.97,
                    rate_bytes_per_s: 4.0 * 1048576.0,
                    growth_bytes: 80 << 20,
                    for_s: 20.0,
                    reason: "growing".into(),
                }),
                stacks: vec![
                    LeakGroup {
                        stack_id: Some("00000000000000aa".into()),
                        count: 20,
                        bytes: 80 << 20,
                        estimated: false,
                        oldest_age_s: 2.5,
                        frames: vec![frame("leak_buffer", 10), frame("train_step", 20)],
                        verdict: Some(Verdict {
                            leaking: true,
                            verdict: Finding::Leak,
                            confidence: 0.97,
                            rate_bytes_per_s: 4.0 * 1048576.0,
                            growth_bytes: 80 << 20,
                            for_s: 20.0,
                            reason: "growing".into(),
                        }),
                        trend: vec![1, 2, 3],
                    },
                    LeakGroup {
                        stack_id: Some("00000000000000bb".into()),
                        count: 300,
                        bytes: 3 << 20,
                        estimated: true,
                        oldest_age_s: 1.5,
                        frames: vec![frame("small_tensors", 30)],
                        verdict: None,
                        trend: Vec::new(),
                    },
                ],
                more_stacks: 2,
                untracked_groups: Default::default(),
                breakdown: crate::analysis::breakdown::Breakdown {
                    by_owner: vec![crate::analysis::owners::OwnerBytes {
                        owner: "train".into(),
                        bytes: 90 << 20,
                        allocations: 21,
                        estimated: false,
                    }],
                    ..Default::default()
                },
                not_sampled_allocs: 280,
                not_sampled_bytes: 2 << 20,
                layout: DeviceLayout { largest_allocation: 4 << 20, ..Default::default() },
                tensors: None,
                untracked_frees: 0,
                placement: Default::default(),
            }],
            oom: OomCounters { cuda_ooms: 1, fragmentation_ooms: 1, host_oom_kills: 0 },
            oom_events: Vec::new(),
            oom_events_dropped: 0,
            stacks: StackStats { captured: 20, unique: 1, bytes_copied: 20 * 4096, ..Default::default() },
            stacks_dropped: StacksDropped::default(),
            lost_events: 0,
            distributions: DistributionSummary::default(),
            held_before_tracing: vec![crate::analysis::view::UntracedRow {
                pid: 9,
                comm: "job".into(),
                workload: Default::default(),
                gpu: 1,
                nvml_bytes: 5 << 30,
            }],
            exited: Vec::new(),
        };
        let mut out = Vec::new();
        report.write_human(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            "pid 42 (train, container 0123456789ab) device 0: 80.0 MiB outstanding in 20 allocation(s), 90.0 MiB live",
            "growth: LEAK SUSPECTED",
            "  by owner: train 90.0 MiB",
            "4.0 MiB/s for 20 s, confidence 0.97",
            "80.0 MiB in 20 allocation(s), oldest 2.5 s — LEAK (growing, 4.0 MiB/s for 20 s, confidence 0.97):",
            "~3.0 MiB in ~300 allocation(s), oldest 1.5 s:",
            "2.0 MiB in 280 allocation(s) over the stack budget were not sampled: the ~ figures are unbiased estimates that include them",
            "leak_buffer+0x11 (train.c:10) [train]",
            "train_step+0x11 (train.c:20) [train]",
            "... 2 more stack(s)",
            "1 CUDA out-of-memory failure(s) (1 fragmentation: enough memory reported free or cached by PyTorch, in no block large enough)",
            "4096 bytes copied per allocation",
            "pid 9 (job) GPU 1: 5.0 GiB by NVML, allocated before tracing began",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
        let mut json = Vec::new();
        report.write_json(&mut json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["processes"][0]["stacks"][0]["frames"][1]["function"], "train_step");
        assert_eq!(
            (&v["processes"][0]["stacks"][1]["estimated"], &v["processes"][0]["not_sampled_bytes"]),
            (&true.into(), &(2u64 << 20).into())
        );
    }
}
