//! Reliability under load and faults (issue 8): real eBPF against real
//! processes, as root. Each test names the fault it injects and what the
//! agent's accounting must still say exactly.
use gpumem_tests::*;
use serde_json::Value;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A value `key=N` the race workload printed on stderr.
fn printed(stderr: &str, key: &str) -> u64 {
    stderr
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in the workload's output: {stderr}"))
}

fn api_calls(p: &Value, api: &str) -> u64 {
    p["apis"].as_array().unwrap().iter().find(|a| a["api"] == api).map_or(0, |a| a["calls"].as_u64().unwrap())
}

/// `gpumem trace` of the race workload with no event lines (every event is
/// still counted in the summary): threads allocating and freeing as fast as
/// the uprobe traps let them.
fn race(threads: u32, seconds: u32) -> (Trace, Value) {
    let f = fixtures();
    let cmd = workload_cmd("race");
    let (threads, seconds) = (threads.to_string(), seconds.to_string());
    // --min-size above any size: the summary only.
    let t = trace(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--min-size", "1PiB", "-c", &cmd],
        &[("GPUMEM_THREADS", threads.as_str()), ("GPUMEM_SECONDS", seconds.as_str())],
    );
    assert!(t.status.success(), "{}", t.stderr);
    let procs = t.summary["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{:#}", t.summary);
    let p = procs[0].clone();
    (t, p)
}

#[test]
fn no_event_is_lost_at_the_trap_bound_rate() {
    require_root();
    // Two threads for 30 s: the load. Every call must arrive.
    let (t, p) = race(2, 30);
    let calls = printed(&t.stderr, "race_calls");
    assert_eq!(t.summary["lost_events"], 0, "{:#}", t.summary["lost"]);
    assert_eq!(api_calls(&p, "cuMemAlloc_v2") + api_calls(&p, "cuMemFree_v2"), calls, "{p:#}");
    assert!(calls > 100_000, "a trap-bound rate means tens of thousands of calls per second: {calls}");
    assert_eq!(p["held_at_exit_bytes"].as_u64().unwrap(), printed(&t.stderr, "race_live_bytes"));
    assert_eq!(p["untracked_frees"], 0);
    assert_eq!(p["uncertain"], false);
    let stacks = &t.summary["stacks"];
    assert_eq!(stacks["captured"].as_u64().unwrap(), api_calls(&p, "cuMemAlloc_v2"), "every allocation's stack: {stacks}");
    eprintln!("{calls} calls in 30 s, 0 lost; stacks {stacks}");
}

#[test]
fn sixteen_threads_racing_alloc_and_free_end_exact() {
    require_root();
    let (t, p) = race(16, 4);
    let calls = printed(&t.stderr, "race_calls");
    assert_eq!(t.summary["lost_events"], 0, "{:#}", t.summary["lost"]);
    assert_eq!(api_calls(&p, "cuMemAlloc_v2") + api_calls(&p, "cuMemFree_v2"), calls);
    // Thread t keeps t+1 allocations of 64 KiB: 136 × 64 KiB in all, whatever
    // order the 16 threads' frees and reused addresses arrived in.
    assert_eq!(p["held_at_exit_bytes"].as_u64().unwrap(), 136 * 64 * KIB);
    assert_eq!(printed(&t.stderr, "race_live_bytes"), 136 * 64 * KIB);
    assert_eq!(p["untracked_frees"], 0, "{p:#}");
    let _ = MIB;
}
