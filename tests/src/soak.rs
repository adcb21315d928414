//! The soak: `gpumem serve` under process churn (short-lived CUDA processes
//! started back to back) while one process holds a large number of live
//! allocations, sampled from /metrics. Shared by the CI test (short) and
//! `cargo xtask soak` (10 minutes, a million allocations).
use std::time::{Duration, Instant};

use crate::{fixtures, heap_parts, sample, spawn_workload, Serve, ServeState};

pub struct SoakConfig {
    pub duration: Duration,
    /// Allocations the holding process keeps live.
    pub live_allocations: u64,
    /// The agent's `--max-allocations`.
    pub max_allocations: u64,
    /// Restart the daemon this often (SIGKILL and SIGTERM in turn): it
    /// adopts its pinned state each time.
    pub restart_every: Option<Duration>,
}

#[derive(Clone, Debug, Default)]
pub struct SoakSample {
    pub at_s: f64,
    /// RSS without the ring buffer's mapping (kernel memory).
    pub own_rss_bytes: f64,
    /// Of the RSS, anonymous pages (/proc/PID/status RssAnon): what the
    /// agent allocated (heap, thread stacks), without its code's pages
    /// (a debug build's are three times a release build's) or the rings.
    pub anon_bytes: f64,
    pub tracked_processes: f64,
    pub events: f64,
    pub lost: f64,
    pub allocations_overflow: f64,
    pub aggregated_series: f64,
    pub process_series: f64,
    /// The agent's heap by owner (`gpumem_agent_heap_bytes`), in use and
    /// kept free: where the RSS goes.
    pub heap: Vec<(String, f64)>,
    pub heap_free_bytes: f64,
}

#[derive(Debug, Default)]
pub struct SoakReport {
    pub samples: Vec<SoakSample>,
    pub processes_started: u64,
    pub held_allocations_seen: f64,
    /// The holder's allocations the daemon showed right after each restart.
    pub held_after_restarts: Vec<f64>,
    pub stderr: String,
}

impl SoakReport {
    pub fn max_own_rss(&self) -> f64 {
        self.samples.iter().map(|s| s.own_rss_bytes).fold(0.0, f64::max)
    }
    pub fn max_anon(&self) -> f64 {
        self.samples.iter().map(|s| s.anon_bytes).fold(0.0, f64::max)
    }
    pub fn max_tracked(&self) -> f64 {
        self.samples.iter().map(|s| s.tracked_processes).fold(0.0, f64::max)
    }
    pub fn last(&self) -> &SoakSample {
        self.samples.last().expect("at least one sample")
    }
}

fn read(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(f64::NAN)
}

/// A process's anonymous resident bytes (RssAnon in /proc/PID/status).
fn anon_bytes(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb =
        status.lines().find_map(|l| l.strip_prefix("RssAnon:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kb.map_or(f64::NAN, |kb| kb * 1024.0)
}

fn take(text: &str, at_s: f64, pid: u32) -> SoakSample {
    let lost: f64 =
        text.lines().filter(|l| l.starts_with("gpumem_lost_events_total{")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    SoakSample {
        at_s,
        own_rss_bytes: read(text, "gpumem_agent_resident_memory_bytes") - read(text, "gpumem_agent_bpf_map_resident_memory_bytes"),
        anon_bytes: anon_bytes(pid),
        tracked_processes: read(text, "gpumem_tracked_processes"),
        events: read(text, "gpumem_events_processed_total"),
        lost,
        allocations_overflow: read(text, "gpumem_table_overflow_total{table=\"allocations\"}"),
        aggregated_series: read(text, "gpumem_exporter_aggregated_process_series"),
        process_series: read(text, "gpumem_exporter_process_series"),
        heap: heap_parts(text),
        heap_free_bytes: read(text, "gpumem_agent_heap_free_bytes"),
    }
}

/// The holder's allocations as the daemon exports them.
fn held(text: &str, holder_pid: u32) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("gpumem_process_allocations{") && l.contains(&format!("pid=\"{holder_pid}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn run(cfg: &SoakConfig, mut progress: impl FnMut(&SoakSample)) -> SoakReport {
    let f = fixtures();
    let state = ServeState::new("soak");
    let mut args: Vec<String> = state.args();
    // The kernel's table holds the holder and the churn.
    let table = (cfg.live_allocations + 100_000).to_string();
    let cap = cfg.max_allocations.to_string();
    args.extend(
        [
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--nvml",
            f.nvml.to_str().unwrap(),
            "--max-allocations",
            &cap,
            "--kernel-table-entries",
            &table,
            "--max-process-series",
            "100",
            "--exited-grace",
            "5",
        ]
        .map(String::from),
    );
    let start = || Serve::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let mut serve = start();
    let began = Instant::now();
    let live = cfg.live_allocations.to_string();
    let capacity = (1u64 << 42).to_string();
    let mut holder = spawn_workload("many", &[("GPUMEM_ALLOCS", live.as_str()), ("GPUMEM_FAKE_CAPACITY", capacity.as_str())]);
    let mut report = SoakReport::default();
    let mut next_sample = Duration::ZERO;
    let mut next_restart = cfg.restart_every.unwrap_or(Duration::MAX);
    let mut stderr = String::new();
    while began.elapsed() < cfg.duration {
        if began.elapsed() >= next_restart {
            next_restart += cfg.restart_every.unwrap_or(Duration::MAX);
            let signal = if report.held_after_restarts.len() % 2 == 0 { libc::SIGKILL } else { libc::SIGTERM };
            let (_, said) = serve.signal(signal);
            stderr += &said;
            serve = start();
            report.held_after_restarts.push(held(&serve.metrics(), holder.id()));
        }
        // Churn: one short CUDA process after another (5 allocations, a
        // context destroyed, exit holding 14 MiB).
        let out = spawn_workload("two_devices", &[]).wait_with_output().expect("churn process");
        assert!(out.status.success(), "a churn process failed");
        report.processes_started += 1;
        if began.elapsed() >= next_sample {
            let s = take(&serve.metrics(), began.elapsed().as_secs_f64(), serve.child.id());
            progress(&s);
            report.samples.push(s);
            next_sample += Duration::from_secs(10);
        }
    }
    let text = serve.metrics();
    report.samples.push(take(&text, began.elapsed().as_secs_f64(), serve.child.id()));
    report.held_allocations_seen = held(&text, holder.id());
    let _ = holder.kill();
    let _ = holder.wait();
    serve.state = Some(state);
    let (status, said) = serve.stop();
    assert!(status.success(), "gpumem serve failed: {said}");
    report.stderr = stderr + &said;
    report
}
