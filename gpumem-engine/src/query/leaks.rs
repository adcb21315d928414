//! The leaks report: the allocations still outstanding and older than a
//! threshold, grouped by stack, with a growth verdict per process and
//! device; the OOMs seen; what NVML says was held before tracing began.
use crate::{
    analysis::leaks,
    export::{leaks::LeaksReport, trace},
    model::lost::StacksDropped,
    pipeline::Pipeline,
};

/// What a leaks report covers.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LeaksQuery {
    /// Only these processes (empty: all).
    #[serde(default)]
    pub pids: Vec<u32>,
    pub older_than_s: f64,
    /// Stacks per process and device.
    pub top: usize,
    /// Rendered as one JSON object (else for people).
    #[serde(default)]
    pub json: bool,
}

/// The time the report is made at.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// CLOCK_MONOTONIC (the events' clock).
    pub now_ns: u64,
    pub duration_s: f64,
}

/// The leaks report of what the pipeline holds: at the end of a session,
/// or asked of a running daemon.
pub fn report(p: &mut Pipeline, q: &LeaksQuery, at: Span, stacks_dropped: StacksDropped, lost_events: u64) -> LeaksReport {
    let mut processes = leaks::find(&p.state, &mut p.stacks, &mut p.growth, at.now_ns, (q.older_than_s * 1e9) as u64, q.top);
    let wanted = |pid: u32| q.pids.is_empty() || q.pids.contains(&pid);
    processes.retain(|l| wanted(l.pid));
    for l in &mut processes {
        let device = l.device.unwrap_or(gpumem_common::DEVICE_UNKNOWN);
        let Some(proc) = p.state.processes.get(&l.pid) else { continue };
        let at = crate::analysis::placement::place(proc, device, &p.gpus.latest);
        l.breakdown.overhead = crate::analysis::breakdown::Overhead::of(l.pid, &at, l.live_bytes, &p.gpus);
        l.placement = at;
    }
    let oom_events = p
        .ooms
        .records
        .iter()
        .filter(|r| wanted(r.event.pid))
        .map(|r| match &r.applied.cuda_oom {
            Some(oom) => trace::cuda_oom_json(&r.event, oom, &r.holder_stacks),
            None => trace::event_json(&r.event, &r.kind, &r.applied, None),
        })
        .collect();
    let mut held_before_tracing = p.untraced_rows();
    held_before_tracing.retain(|r| wanted(r.pid));
    LeaksReport {
        kind: "leaks",
        duration_s: at.duration_s,
        now_ns: at.now_ns,
        older_than_s: q.older_than_s,
        processes,
        oom: p.state.oom.clone(),
        oom_events,
        oom_events_dropped: p.ooms.dropped,
        stacks: p.stacks.stats.clone(),
        stacks_dropped,
        lost_events,
        distributions: p.distributions.summary(),
        held_before_tracing,
        exited: p.wound_down.iter().filter(|w| wanted(w.pid)).cloned().collect(),
    }
}
