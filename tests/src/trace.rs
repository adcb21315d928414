//! A finished `gpumem trace --json` run, parsed: its events and summary,
//! and the questions tests ask of them (also of runs in the arm64 VM).
use serde_json::Value;

use crate::released;

/// A finished `gpumem trace --json` run.
#[derive(Debug)]
pub struct Trace {
    pub events: Vec<Value>,
    pub summary: Value,
    pub status: std::process::ExitStatus,
    pub stderr: String,
}

impl Trace {
    pub fn of_type(&self, t: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["type"] == t).collect()
    }

    pub fn for_pid(&self, pid: u64) -> Vec<&Value> {
        self.events.iter().filter(|e| e["pid"] == pid).collect()
    }

    /// The `released` list of a process's exit event, as (device, bytes, allocs).
    pub fn released_at_exit(&self, pid: u64) -> Vec<(i64, u64, u64)> {
        let exits: Vec<&Value> = self.events.iter().filter(|e| e["type"] == "exit" && e["pid"] == pid).collect();
        assert_eq!(exits.len(), 1, "one exit event for pid {pid}: {:#?}", self.events);
        released(exits[0])
    }

    pub fn summary_process(&self, pid: u64) -> &Value {
        self.summary["processes"]
            .as_array()
            .expect("processes array")
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in summary {:#}", self.summary))
    }

    /// Pids seen in events, in order of first appearance.
    pub fn pids(&self) -> Vec<u64> {
        let mut pids = Vec::new();
        for e in &self.events {
            let p = e["pid"].as_u64().expect("pid");
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        pids
    }
}

/// Calls of one API in a summary's process (0 if it made none).
pub fn api_calls(proc_summary: &Value, api: &str) -> u64 {
    proc_summary["apis"].as_array().into_iter().flatten().find(|a| a["api"] == api).and_then(|a| a["calls"].as_u64()).unwrap_or(0)
}

/// A value `key=N` a workload printed (on stderr, under `gpumem trace -c`).
pub fn printed_value(stderr: &str, key: &str) -> Option<u64> {
    stderr.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// A process's statistics for one API in a summary.
pub fn api_stats<'a>(proc_summary: &'a Value, api: &str) -> &'a Value {
    proc_summary["apis"].as_array().unwrap().iter().find(|a| a["api"] == api).unwrap_or_else(|| panic!("{api} not in {proc_summary:#}"))
}

/// The one process a trace saw.
pub fn single_pid(t: &Trace) -> u64 {
    let pids = t.pids();
    assert_eq!(pids.len(), 1, "one traced process expected: {pids:?}");
    pids[0]
}

/// The process exited holding nothing.
pub fn assert_nothing_live(t: &Trace, pid: u64) {
    let p = t.summary_process(pid);
    assert_eq!(p["exited"], true, "{p:#}");
    for d in p["devices"].as_array().unwrap() {
        assert_eq!(d["live_bytes"], 0, "{p:#}");
        assert_eq!(d["live_allocs"], 0, "{p:#}");
    }
    assert_eq!(p["host_pinned_bytes"], 0);
}

impl Trace {
    /// `gpumem trace --json`'s output: its events, then one summary.
    pub fn parse(stdout: &str, stderr: String, status: std::process::ExitStatus) -> Trace {
        let mut events = Vec::new();
        let mut summary = None;
        for line in stdout.lines() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\nstderr: {stderr}"));
            if v["type"] == "summary" {
                assert!(summary.is_none(), "two summaries");
                summary = Some(v);
            } else {
                assert!(summary.is_none(), "event after the summary: {line}");
                events.push(v);
            }
        }
        let summary = summary.unwrap_or_else(|| panic!("no summary; status {status:?}\nstdout: {stdout}\nstderr: {stderr}"));
        Trace { events, summary, status, stderr }
    }
}
