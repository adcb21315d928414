//! The session as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev)
//! and chrome://tracing open: per process a counter track of live bytes on
//! each GPU (and of allocated bytes where PyTorch's probes fired), instant
//! events for CUDA OOMs, host OOM kills, XIDs and leak verdicts, process and
//! thread names; NVML's used bytes per GPU on a track of their own. `ts` in
//! microseconds from the session's start. A counter's value is its `bytes`
//! argument: Perfetto names the track "GPU-0 live bytes".
use serde_json::{json, Value};

use crate::{
    analysis::{history::History, leaks::ProcessLeaks, timeline::MarkKind, timeline::Timeline},
    names::bytes,
};

/// The pseudo-process that carries the GPUs' own tracks (NVML, XIDs): no
/// real process has pid 0.
const GPUS_PID: u32 = 0;

pub struct Session<'a> {
    pub timeline: &'a Timeline,
    pub history: &'a History,
    /// The processes' leak findings at the end (growth verdicts).
    pub leaks: &'a [ProcessLeaks],
    /// Seconds from the session's start to its end.
    pub end_s: f64,
    pub recorded_by: String,
}

fn us(t_s: f64) -> f64 {
    (t_s * 1e6).round()
}

fn gpu(device: i32) -> String {
    if device < 0 {
        "unknown GPU".to_string()
    } else {
        format!("GPU-{device}")
    }
}

fn meta(events: &mut Vec<Value>, pid: u32, tid: Option<u32>, what: &str, name: &str) {
    let mut e = json!({"ph": "M", "pid": pid, "name": what, "args": {"name": name}});
    if let Some(t) = tid {
        e["tid"] = json!(t);
    }
    events.push(e);
}

fn counter(events: &mut Vec<Value>, pid: u32, name: &str, points: &[(f64, u64)]) {
    for &(t, b) in points {
        events.push(json!({"ph": "C", "pid": pid, "tid": pid, "name": name, "ts": us(t), "args": {"bytes": b}}));
    }
}

fn instant(events: &mut Vec<Value>, pid: u32, name: &str, t_s: f64, args: Value) {
    let scope = if pid == GPUS_PID { "g" } else { "p" };
    events.push(json!({"ph": "i", "s": scope, "pid": pid, "tid": pid, "name": name, "ts": us(t_s), "args": args}));
}

/// The trace, as JSON text.
pub fn render(s: &Session<'_>) -> String {
    let t = s.timeline;
    let mut events = Vec::new();
    meta(&mut events, GPUS_PID, None, "process_name", "GPUs (NVML)");
    let pids: std::collections::BTreeSet<u32> = t.series.keys().map(|&(p, _)| p).chain(t.comm.keys().copied()).collect();
    for &pid in &pids {
        let comm = t.comm.get(&pid).map(String::as_str).unwrap_or("");
        meta(&mut events, pid, None, "process_name", &format!("{comm} ({pid})"));
        for (tid, name) in s.history.threads_of(pid) {
            meta(&mut events, pid, Some(tid), "thread_name", name);
        }
    }
    for (&(pid, device), points) in &t.series {
        counter(&mut events, pid, &format!("{} live", gpu(device)), points);
    }
    for (&(pid, device), points) in &t.allocated {
        counter(&mut events, pid, &format!("{} allocated", gpu(device)), points);
    }
    for p in &t.nvml {
        if let Some(used) = p.used_bytes {
            counter(&mut events, GPUS_PID, &format!("GPU-{} used (NVML)", p.gpu), &[(p.t_s, used)]);
        }
    }
    for m in &t.marks {
        match &m.kind {
            MarkKind::CudaOom { pid, requested } => {
                let device = m.device.unwrap_or(-1);
                let args = json!({"device": gpu(device), "requested_bytes": requested, "requested": bytes(*requested)});
                instant(&mut events, *pid, "CUDA out of memory", m.t_s, args);
            }
            MarkKind::OomKill { pid } => instant(&mut events, *pid, "host OOM kill", m.t_s, json!({"victim": pid})),
            MarkKind::Xid { xid } => {
                instant(&mut events, GPUS_PID, &format!("XID {xid}"), m.t_s, json!({"device": gpu(m.device.unwrap_or(-1)), "xid": xid}))
            }
        }
    }
    for l in s.leaks.iter() {
        let Some(v) = l.growth.as_ref().filter(|v| v.leaking || v.verdict != crate::analysis::growth::Finding::None) else { continue };
        let args = json!({
            "device": gpu(l.device.unwrap_or(-1)),
            "verdict": v.verdict,
            "leaking": v.leaking,
            "rate_bytes_per_s": v.rate_bytes_per_s,
            "growth_bytes": v.growth_bytes,
            "outstanding_bytes": l.outstanding_bytes,
            "top_stack": l.stacks.first().and_then(|g| g.frames.first()).map(|f| f.display()),
        });
        instant(&mut events, l.pid, &format!("leak verdict: {}", v.reason), s.end_s, args);
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": format!("gpumem {}", env!("CARGO_PKG_VERSION")), "recorded_by": s.recorded_by},
    });
    doc.to_string()
}
