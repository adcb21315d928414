//! Recent out-of-memory events and XIDs, newest first: what the live page
//! lists under its processes (the same records `trace` and the report name).
use gpumem_common::Event;

use crate::{names::printable, pipeline::Pipeline};

/// Events listed at most of each kind.
pub const RECENT: usize = 20;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OomLine {
    /// Seconds before the question.
    pub age_s: f64,
    pub pid: u32,
    pub comm: String,
    /// `cuda` (a failed allocation) or `host` (the kernel's OOM killer).
    pub kind: String,
    /// The GPU a CUDA OOM failed on, and the bytes it asked for.
    pub device: Option<i32>,
    pub requested_bytes: Option<u64>,
    /// The victim's GPU bytes when the OOM killer chose it.
    pub gpu_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct XidLine {
    pub age_s: f64,
    pub gpu: u32,
    pub xid: u64,
    pub meaning: String,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EventsAnswer {
    pub ooms: Vec<OomLine>,
    pub xids: Vec<XidLine>,
    /// Kept no longer (past the logs' bounds), still counted by /metrics.
    pub ooms_dropped: u64,
    pub xids_dropped: u64,
}

fn age_s(now_ns: u64, ts_ns: u64) -> f64 {
    now_ns.saturating_sub(ts_ns) as f64 / 1e9
}

/// The newest [`RECENT`] OOMs and XIDs the pipeline keeps, at `now_ns`.
pub fn recent(p: &Pipeline, now_ns: u64) -> EventsAnswer {
    let comm = |e: &Event| printable(&String::from_utf8_lossy(e.comm_bytes()));
    let ooms = p
        .ooms
        .records
        .iter()
        .rev()
        .take(RECENT)
        .map(|r| {
            let cuda = r.applied.cuda_oom.as_deref();
            OomLine {
                age_s: age_s(now_ns, r.event.ts_ns),
                pid: r.event.pid,
                comm: comm(&r.event),
                kind: if cuda.is_some() { "cuda" } else { "host" }.to_string(),
                device: cuda.map(|c| c.device),
                requested_bytes: cuda.map(|c| c.requested),
                gpu_bytes: r.applied.oom_kill.as_deref().map(|k| k.holdings.iter().map(|h| h.bytes).sum()),
            }
        })
        .collect();
    let xids = p
        .gpus
        .recent_xids()
        .take(RECENT)
        .map(|x| XidLine { age_s: age_s(now_ns, x.ts_ns), gpu: x.gpu, xid: x.xid, meaning: x.meaning.to_string() })
        .collect();
    EventsAnswer { ooms, xids, ooms_dropped: p.ooms.dropped, xids_dropped: p.gpus.xids_dropped }
}
