//! `gpumem leaks`: outstanding allocations by stack, unwound without frame
//! pointers, growth verdicts; stacks off.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

fn function_names(group: &Value) -> Vec<String> {
    group["frames"].as_array().unwrap().iter().map(|f| f["function"].as_str().unwrap_or("?").to_string()).collect()
}

#[test]
fn leaks_names_the_leaking_function_and_its_callers_without_frame_pointers() {
    require_root();
    let f = fixtures();
    let log = f.dir.join("leak.log");
    let _ = std::fs::remove_file(&log);
    let cmd = workload_cmd("deep_leak");
    let v = leaks(
        // The detector calls a leak after 6 s of growth, read up to 2 s back.
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0.5", "--duration", "10", "-c", &cmd],
        &[("GPUMEM_LEAK_LOG", log.to_str().unwrap()), ("GPUMEM_STEPS", "150")],
    );
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{v:#}");
    let p = &procs[0];
    assert_eq!(p["comm"], "workload");
    assert_eq!(p["device"], 0);

    let groups = p["stacks"].as_array().unwrap();
    let leak = groups.iter().find(|g| function_names(g).first().map(String::as_str) == Some("leak_buffer")).expect("a leak_buffer stack");
    // The leaking function and its callers, unwound from .eh_frame (no frame pointers).
    assert_eq!(function_names(leak)[..3], ["leak_buffer", "train_step", "run_model"], "{leak:#}");
    assert!(leak["frames"][0]["file"].as_str().unwrap().ends_with("workload.c"), "file:line from DWARF: {leak:#}");
    assert!(leak["frames"][0]["line"].as_u64().unwrap() > 0);
    // Exact bytes: every leak older than 0.5 s at the report, 4 MiB each.
    let cutoff = v["now_ns"].as_u64().unwrap() - 500_000_000;
    let stamps: Vec<u64> = std::fs::read_to_string(&log).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let near = stamps.iter().filter(|&&t| t.abs_diff(cutoff) < 2_000_000).count();
    let older = stamps.iter().filter(|&&t| t < cutoff).count() as u64;
    let count = leak["count"].as_u64().unwrap();
    assert!(
        count == older || (near > 0 && count.abs_diff(older) <= near as u64),
        "{count} leaks reported, {older} made before the cut-off"
    );
    assert!(count >= 15, "{count}");
    assert_eq!(leak["bytes"].as_u64().unwrap(), count * 4 * MIB);

    // The weights are outstanding (memleak semantics) under their own stack, once.
    let weights = groups.iter().find(|g| function_names(g).first().map(String::as_str) == Some("load_weights")).expect("weights");
    assert_eq!((weights["count"].as_u64(), weights["bytes"].as_u64()), (Some(1), Some(256 * MIB)));
    // Freed activations never show up.
    assert!(groups.iter().all(|g| function_names(g).first().map(String::as_str) != Some("train_step")), "{groups:#?}");
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!(p["outstanding_bytes"].as_u64().unwrap(), 256 * MIB + count * 4 * MIB);
    // Fragmentation signals: the size classes of what is live, and the largest piece.
    let layout = &p["layout"];
    assert_eq!(layout["largest_allocation"].as_u64(), Some(256 * MIB));
    let hist = layout["size_histogram"].as_array().unwrap();
    let class = |le: u64| hist.iter().find(|b| b["le_bytes"] == le).map(|b| b["count"].as_u64().unwrap());
    assert_eq!(class(256 * MIB), Some(1));
    assert!(class(4 * MIB).unwrap() >= count, "{layout:#}");

    // Growth: the leak (40 MiB/s), not the weights: each group judged on its own.
    assert_eq!(leak["verdict"]["verdict"], "leak", "{leak:#}");
    let leak_rate = leak["verdict"]["rate_bytes_per_s"].as_f64().unwrap() / MIB as f64;
    assert!((30.0..50.0).contains(&leak_rate), "{leak_rate} MiB/s");
    assert!(["none", "insufficient"].contains(&weights["verdict"]["verdict"].as_str().unwrap()), "{weights:#}");
    assert!(leak["trend"].as_array().is_some_and(|t| t.len() >= 10), "{leak:#}");
    let g = &p["growth"];
    assert_eq!((g["verdict"].as_str(), g["leaking"].as_bool()), (Some("leak"), Some(true)), "{g}");
    let rate = g["rate_bytes_per_s"].as_f64().unwrap() / MIB as f64;
    assert!((30.0..50.0).contains(&rate), "{rate} MiB/s");

    // Who asked the driver: the program itself, for every live byte.
    let owners: Vec<(&str, u64)> =
        p["by_owner"].as_array().unwrap().iter().map(|o| (o["owner"].as_str().unwrap(), o["bytes"].as_u64().unwrap())).collect();
    assert_eq!(owners, [("workload", p["live_bytes"].as_u64().unwrap())], "{:#}", p["by_owner"]);

    let st = &v["stacks"];
    assert!(st["captured"].as_u64().unwrap() > count);
    assert_eq!(st["unwind_failed"], 0);
}

#[test]
fn leaks_after_exit_reports_nothing() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("deep_leak");
    // The process leaks, then exits: the driver frees everything, no leak remains.
    let v = leaks(&["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "-c", &cmd], &[("GPUMEM_STEPS", "5")]);
    assert_eq!(v["processes"], serde_json::json!([]), "{v:#}");
    assert!(v["stacks"]["captured"].as_u64().unwrap() >= 6);
}

#[test]
fn growth_detector_ignores_a_warm_up_that_plateaus() {
    require_root();
    let f = fixtures();
    // 10 steps (1 s) of leaking, then quiet: the live bytes plateau once
    // they have not risen for the detector's 10 s (read up to 2 s back).
    let cmd = workload_cmd("deep_leak");
    let v = leaks(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "14", "-c", &cmd],
        &[("GPUMEM_STEPS", "10"), ("GPUMEM_WORKLOAD_HOLD_MS", "16000")],
    );
    let g = &v["processes"][0]["growth"];
    assert_eq!(
        (g["verdict"].as_str(), g["leaking"].as_bool(), g["reason"].as_str()),
        (Some("plateau"), Some(false), Some("plateau")),
        "{g}"
    );
    assert!(g["for_s"].as_f64().unwrap() >= 10.0, "{g}");
}

#[test]
fn stacks_off_traces_the_same_allocations_without_copying_stacks() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("threads");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--stacks", "off", "-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    assert_eq!(t.summary["stacks"]["captured"], 0, "{}", t.summary["stacks"]);
    assert_eq!(t.summary["lost_events"], 0);
    assert_eq!(t.released_at_exit(pid), [(0, 100 * 4 * KIB * 36, 800)], "the same figures as with stacks");
}

#[test]
fn stacks_beyond_the_budget_are_sampled_and_weighed_into_unbiased_estimates() {
    require_root();
    // A budget of 100 stacks/s and one sample per 64 KiB on average: of the
    // 33,001 allocations most are over budget, 4 KiB ones sampled with
    // p = 1 - exp(-1/16) (about 6 %) and each weighed 1/p; the 4 MiB one
    // always (p = 1). Accounting stays exact.
    let f = fixtures();
    let cmd = workload_cmd("sampled");
    let v = leaks(
        &[
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--older-than",
            "0",
            "--duration",
            "4",
            "--stack-budget",
            "100",
            "--stack-sample-bytes",
            "64KiB",
            "-n",
            "10",
            "-c",
            &cmd,
        ],
        &[("GPUMEM_SECONDS", "10")],
    );
    let p = &v["processes"][0];
    const KIB: u64 = 1024;
    // Exact, sampled or not.
    assert_eq!(p["outstanding_allocs"].as_u64(), Some(33_001), "{p:#}");
    assert_eq!(p["outstanding_bytes"].as_u64(), Some(33_000 * 4 * KIB + 4 * MIB));
    let not_sampled = p["not_sampled_allocs"].as_u64().unwrap();
    assert!(not_sampled > 25_000, "most allocations are over the budget: {p:#}");
    let groups = p["stacks"].as_array().unwrap();
    let group = |name: &str| {
        groups.iter().find(|g| function_names(g).first().map(String::as_str) == Some(name)).unwrap_or_else(|| panic!("{name}: {groups:#?}"))
    };
    let (many, few, big) = (group("sampled_many"), group("sampled_few"), group("sampled_big"));
    for g in [many, few, big] {
        assert_eq!(g["estimated"], true, "{g:#}");
    }
    // p = 1: the estimate is the truth.
    assert_eq!((big["count"].as_u64(), big["bytes"].as_u64()), (Some(1), Some(4 * MIB)));
    // About 1,800 and 180 samples: within 4 standard errors (10 % and 30 %).
    let close = |g: &Value, truth: u64, tolerance: f64| {
        let est = g["bytes"].as_u64().unwrap() as f64;
        assert!((est - truth as f64).abs() / truth as f64 <= tolerance, "estimated {est} vs {truth}: {g:#}");
    };
    close(many, 30_000 * 4 * KIB, 0.10);
    close(few, 3_000 * 4 * KIB, 0.30);
    let s = &v["stacks"];
    assert_eq!(s["not_sampled"].as_u64(), Some(not_sampled));
    assert!(s["sampled"].as_u64().unwrap() > 1000, "{s:#}");
    eprintln!("sampled: many {} (truth {}), few {} (truth {}), stacks {s}", many["bytes"], 30_000 * 4 * KIB, few["bytes"], 3_000 * 4 * KIB);
}
