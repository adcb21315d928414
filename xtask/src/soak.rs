//! `cargo xtask soak`: the long soak (the CI test runs the same code for 90 s).
use std::time::Duration;

use anyhow::{bail, Result};
use gpumem_tests::soak::{self, SoakConfig};

pub fn soak(minutes: f64, live: u64, max_allocations: u64, restart_every: Option<f64>) -> Result<()> {
    crate::run(crate::cargo().args(["build", "--release", "-p", "gpumem-agent"]))?;
    std::env::set_var("GPUMEM_BIN", gpumem_tests::target_dir().join("release/gpumem"));
    let cfg = SoakConfig {
        duration: Duration::from_secs_f64(minutes * 60.0),
        live_allocations: live,
        max_allocations,
        restart_every: restart_every.map(Duration::from_secs_f64),
    };
    println!(
        "soak: {minutes} min of back-to-back CUDA processes; one process holding {live} allocations; --max-allocations {max_allocations}"
    );
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>9} {:>10} {:>6} {:>12} {:>10}  heap by owner (MiB)",
        "t (s)", "own RSS", "anon", "heap free", "tracked", "events", "lost", "table full", "series"
    );
    let line = |s: &soak::SoakSample| {
        let parts: Vec<String> = s.heap.iter().map(|(part, b)| format!("{part} {:.1}", b / 1048576.0)).collect();
        println!(
            "{:>6.0} {:>6.1} MiB {:>6.1} MiB {:>6.1} MiB {:>9} {:>10} {:>6} {:>12} {:>10}  {}",
            s.at_s,
            s.own_rss_bytes / 1048576.0,
            s.anon_bytes / 1048576.0,
            s.heap_free_bytes / 1048576.0,
            s.tracked_processes,
            s.events,
            s.lost,
            s.allocations_overflow,
            format!("{}+{}", s.process_series, s.aggregated_series),
            parts.join(", ")
        )
    };
    let r = soak::run(&cfg, line);
    line(r.last());
    println!(
        "{} processes started ({:.0}/s); own RSS max {:.1} MiB, last {:.1} MiB, anonymous max {:.1} MiB; tracked processes max {}; the holder's allocations kept {} (cap {max_allocations}), {} counted as not kept",
        r.processes_started,
        r.processes_started as f64 / cfg.duration.as_secs_f64(),
        r.max_own_rss() / 1048576.0,
        r.last().own_rss_bytes / 1048576.0,
        r.max_anon() / 1048576.0,
        r.max_tracked(),
        r.held_allocations_seen,
        r.last().allocations_overflow
    );
    if !r.held_after_restarts.is_empty() {
        println!(
            "restarted {} times: the holder's allocations right after each restart {:?}",
            r.held_after_restarts.len(),
            r.held_after_restarts
        );
        if r.held_after_restarts.iter().any(|&h| h != r.held_allocations_seen) {
            bail!("a restart lost allocations");
        }
    }
    if r.last().lost > 0.0 {
        bail!("events were lost");
    }
    Ok(())
}
