//! The moments operators act on (`serve --action`, `--webhook`): a CUDA
//! out-of-memory, a host OOM kill of a process, a process's growth verdict
//! turning to leak or to cache growth, a critical XID, an ECC rule firing,
//! a GPU's health turning critical. Conditions that last (a verdict, a
//! rule) are found as edges: each fires when it turns on, and again only
//! after it has turned off.
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::json;

use super::{
    health::{Health, Level, CRITICAL_XIDS},
    view::Row,
};
use gpumem_common::Event;

use crate::{model::nvml::XidEvent, state::Applied};

/// What happened, as `--action EVENT=…` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    CudaOom,
    HostOom,
    Leak,
    CacheGrowth,
    Xid,
    Ecc,
    Health,
}

impl TriggerKind {
    pub const ALL: [TriggerKind; 7] = [
        TriggerKind::CudaOom,
        TriggerKind::HostOom,
        TriggerKind::Leak,
        TriggerKind::CacheGrowth,
        TriggerKind::Xid,
        TriggerKind::Ecc,
        TriggerKind::Health,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TriggerKind::CudaOom => "cuda_oom",
            TriggerKind::HostOom => "host_oom",
            TriggerKind::Leak => "leak",
            TriggerKind::CacheGrowth => "cache_growth",
            TriggerKind::Xid => "xid",
            TriggerKind::Ecc => "ecc",
            TriggerKind::Health => "health",
        }
    }
}

/// One moment to act on: who and what it concerns.
#[derive(Clone, Debug, PartialEq)]
pub struct Trigger {
    pub kind: TriggerKind,
    /// CLOCK_MONOTONIC nanoseconds when it happened.
    pub ts_ns: u64,
    pub pid: Option<u32>,
    /// The CUDA device ordinal (for NVML's events, its index).
    pub device: Option<i32>,
    pub bytes: Option<u64>,
    /// One line saying what happened.
    pub summary: String,
    /// The kind's own facts (a JSON object).
    pub details: serde_json::Value,
}

/// The CUDA OOM or host OOM kill an applied event is, if it is one.
pub fn of_applied(e: &Event, applied: &Applied) -> Option<Trigger> {
    if let Some(oom) = &applied.cuda_oom {
        let frag = if oom.fragmentation { " (fragmentation: that much was free)" } else { "" };
        let holders: Vec<_> = oom.holders.iter().map(|h| json!({"pid": h.pid, "comm": h.comm, "bytes": h.bytes})).collect();
        return Some(Trigger {
            kind: TriggerKind::CudaOom,
            ts_ns: e.ts_ns,
            pid: Some(e.pid),
            device: Some(oom.device),
            bytes: Some(oom.requested),
            summary: format!("CUDA out of memory: {} bytes requested on GPU {}{frag}", oom.requested, oom.device),
            details: json!({
                "requested_bytes": oom.requested,
                "reported_free_bytes": oom.reported_free,
                "fragmentation": oom.fragmentation,
                "reserved_unused_bytes": oom.reserved_unused,
                "largest_free_block_bytes": oom.largest_free_block,
                "holders": holders,
            }),
        });
    }
    let kill = applied.oom_kill.as_ref()?;
    let gpu_bytes: u64 = kill.holdings.iter().map(|h| h.bytes).sum();
    let holdings: Vec<_> = kill.holdings.iter().map(|h| json!({"device": h.device, "bytes": h.bytes, "allocations": h.allocs})).collect();
    Some(Trigger {
        kind: TriggerKind::HostOom,
        ts_ns: e.ts_ns,
        pid: Some(e.pid),
        device: kill.holdings.iter().max_by_key(|h| h.bytes).map(|h| h.device),
        bytes: Some(gpu_bytes),
        summary: format!("host OOM killer chose pid {} holding {gpu_bytes} bytes of GPU memory", e.pid),
        details: json!({
            "memory_cgroup": kill.memcg,
            "gpu_holdings": holdings,
            "host_resident_bytes": kill.host.map(|h| h.resident_bytes),
            "host_swap_bytes": kill.host.map(|h| h.swap_bytes),
            "pinned_host_bytes": kill.pinned_host_bytes,
        }),
    })
}

/// A critical XID (the ones the alerting rules page for).
pub fn of_xid(x: &XidEvent) -> Option<Trigger> {
    CRITICAL_XIDS.contains(&x.xid).then(|| Trigger {
        kind: TriggerKind::Xid,
        ts_ns: x.ts_ns,
        pid: None,
        device: Some(x.gpu as i32),
        bytes: None,
        summary: format!("XID {} on GPU {} ({}): {}", x.xid, x.gpu, x.uuid, x.meaning),
        details: json!({"xid": x.xid, "meaning": x.meaning, "processes": x.processes}),
    })
}

/// ECC rules: the health rules about memory errors.
const ECC_RULES: [&str; 2] = ["ecc_corrected_rate", "ecc_uncorrectable"];

/// What is on now, to fire on what turns on.
#[derive(Debug, Default)]
pub struct Edges {
    leaking: BTreeSet<(u32, i32)>,
    cache_growth: BTreeSet<(u32, i32)>,
    critical: BTreeSet<u32>,
    /// (GPU, ECC rule, its level).
    ecc: BTreeSet<(u32, &'static str, Level)>,
}

impl Edges {
    /// Growth verdicts that turned on since the last look, per (process, device).
    pub fn growth(&mut self, rows: &[Row], now_ns: u64) -> Vec<Trigger> {
        let mut out = Vec::new();
        let leaking: BTreeSet<(u32, i32)> = rows.iter().filter(|r| !r.exited && r.leaking()).map(|r| (r.pid, r.device)).collect();
        let cache: BTreeSet<(u32, i32)> = rows.iter().filter(|r| !r.exited && r.cache_growth()).map(|r| (r.pid, r.device)).collect();
        for r in rows {
            let key = (r.pid, r.device);
            let rate = r.growth_bytes_per_s();
            let details = json!({"growth_bytes_per_s": rate, "live_bytes": r.totals.live_bytes, "leak_suspect_bytes": r.leak_suspect_bytes, "leaking_groups": r.leaking_groups});
            if leaking.contains(&key) && !self.leaking.contains(&key) {
                out.push(Trigger {
                    kind: TriggerKind::Leak,
                    ts_ns: now_ns,
                    pid: Some(r.pid),
                    device: Some(r.device),
                    bytes: Some(r.totals.live_bytes),
                    summary: format!("{} (pid {}) leaks GPU memory on GPU {}: +{:.0} bytes/s", r.comm, r.pid, r.device, rate),
                    details: details.clone(),
                });
            }
            if cache.contains(&key) && !self.cache_growth.contains(&key) {
                out.push(Trigger {
                    kind: TriggerKind::CacheGrowth,
                    ts_ns: now_ns,
                    pid: Some(r.pid),
                    device: Some(r.device),
                    bytes: Some(r.totals.live_bytes),
                    summary: format!(
                        "{} (pid {}): PyTorch's cache grows on GPU {} (+{:.0} bytes/s, tensors flat)",
                        r.comm, r.pid, r.device, rate
                    ),
                    details,
                });
            }
        }
        (self.leaking, self.cache_growth) = (leaking, cache);
        out
    }

    /// ECC rules that fired or rose in level, and GPUs whose health turned critical.
    pub fn health(&mut self, health: &BTreeMap<u32, Health>, now_ns: u64) -> Vec<Trigger> {
        let mut out = Vec::new();
        let mut ecc = BTreeSet::new();
        let mut critical = BTreeSet::new();
        for (&gpu, h) in health {
            for r in h.reasons.iter().filter(|r| ECC_RULES.contains(&r.rule)) {
                let key = (gpu, r.rule, r.level);
                if !self.ecc.contains(&key) {
                    out.push(Trigger {
                        kind: TriggerKind::Ecc,
                        ts_ns: now_ns,
                        pid: None,
                        device: Some(gpu as i32),
                        bytes: None,
                        summary: format!("GPU {gpu} ECC: {}", r.detail),
                        details: json!({"rule": r.rule, "level": r.level, "detail": r.detail, "ecc_corrected_per_hour": h.ecc_corrected_per_hour}),
                    });
                }
                ecc.insert(key);
            }
            if h.level == Level::Critical {
                if !self.critical.contains(&gpu) {
                    let reasons: Vec<&str> = h.reasons.iter().filter(|r| r.level == Level::Critical).map(|r| r.detail.as_str()).collect();
                    out.push(Trigger {
                        kind: TriggerKind::Health,
                        ts_ns: now_ns,
                        pid: None,
                        device: Some(gpu as i32),
                        bytes: None,
                        summary: format!("GPU {gpu} health critical (score {}): {}", h.score, reasons.join("; ")),
                        details: json!({"score": h.score, "level": h.level, "reasons": h.reasons}),
                    });
                }
                critical.insert(gpu);
            }
        }
        (self.ecc, self.critical) = (ecc, critical);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{
        growth::{Finding, Verdict},
        health::Reason,
    };

    fn row(pid: u32, finding: Finding) -> Row {
        let growth = Verdict {
            leaking: finding == Finding::Leak,
            verdict: finding,
            confidence: 1.0,
            rate_bytes_per_s: 1e6,
            growth_bytes: 1 << 20,
            for_s: 10.0,
            reason: "growing".into(),
        };
        Row {
            pid,
            comm: "python3".into(),
            workload: Default::default(),
            device: 0,
            exited: false,
            totals: Default::default(),
            growth: Some(growth),
            leak_suspect_bytes: 0,
            trend: Vec::new(),
            leaking_groups: Vec::new(),
            breakdown: None,
            last_failure: None,
            events_lost: 0,
            layout: None,
            free_blocks: None,
            placement: Default::default(),
        }
    }

    #[test]
    fn a_growth_verdict_fires_when_it_turns_on_and_again_only_after_it_turned_off() {
        let mut e = Edges::default();
        let kinds = |t: Vec<Trigger>| t.into_iter().map(|t| (t.kind, t.pid)).collect::<Vec<_>>();
        assert_eq!(
            kinds(e.growth(&[row(1, Finding::Leak), row(2, Finding::CacheGrowth)], 0)),
            [(TriggerKind::Leak, Some(1)), (TriggerKind::CacheGrowth, Some(2))]
        );
        assert_eq!(kinds(e.growth(&[row(1, Finding::Leak), row(2, Finding::CacheGrowth)], 1)), [], "still on: nothing new");
        assert_eq!(kinds(e.growth(&[row(1, Finding::None)], 2)), []);
        assert_eq!(kinds(e.growth(&[row(1, Finding::Leak)], 3)), [(TriggerKind::Leak, Some(1))], "on again after off");
        let mut gone = row(1, Finding::Leak);
        gone.exited = true;
        assert_eq!(kinds(e.growth(&[gone], 4)), [], "an exited process does not fire");
    }

    fn health(level: Level, reasons: &[(&'static str, Level)]) -> Health {
        let reasons = reasons.iter().map(|&(rule, level)| Reason { rule, level, points: 10, detail: format!("{rule} detail") }).collect();
        Health { score: 50, level, ecc_corrected_per_hour: Some(60.0), reasons }
    }

    #[test]
    fn ecc_rules_and_critical_health_fire_on_their_edges_per_gpu() {
        let mut e = Edges::default();
        let kinds = |t: Vec<Trigger>| t.into_iter().map(|t| (t.kind, t.device)).collect::<Vec<_>>();
        let warn = BTreeMap::from([(1, health(Level::Warning, &[("ecc_corrected_rate", Level::Warning), ("xid", Level::Warning)]))]);
        assert_eq!(kinds(e.health(&warn, 0)), [(TriggerKind::Ecc, Some(1))], "an ECC rule fires; other rules do not");
        assert_eq!(kinds(e.health(&warn, 1)), []);
        // The rate rule rising to critical is a new ECC event, and the GPU turns critical.
        let crit = BTreeMap::from([(1, health(Level::Critical, &[("ecc_corrected_rate", Level::Critical)]))]);
        assert_eq!(kinds(e.health(&crit, 2)), [(TriggerKind::Ecc, Some(1)), (TriggerKind::Health, Some(1))]);
        assert_eq!(kinds(e.health(&crit, 3)), []);
        let two = BTreeMap::from([(0, health(Level::Critical, &[("ecc_uncorrectable", Level::Critical)])), (1, crit[&1].clone())]);
        assert_eq!(kinds(e.health(&two, 4)), [(TriggerKind::Ecc, Some(0)), (TriggerKind::Health, Some(0))], "each GPU on its own");
    }
}
