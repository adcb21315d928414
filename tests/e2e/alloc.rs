//! Allocations and frees of every kind through the real eBPF probes: exact
//! bytes, failures that change nothing, threads racing, children exiting.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;

#[test]
fn every_allocation_kind_with_exact_sizes() {
    require_root();
    let t = trace_workload("all_kinds", &[]);
    let pid = single_pid(&t);

    let allocs = t.of_type("alloc");
    let apis: Vec<&str> = allocs.iter().map(|e| e["api"].as_str().unwrap()).collect();
    assert_eq!(
        apis,
        [
            "cuMemAlloc_v2",
            "cuMemAllocPitch_v2",
            "cuMemAllocManaged",
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz"
        ]
    );
    assert_eq!(sizes(&allocs), [MIB, 1024 * 100, 2 * MIB, 3 * MIB, 4 * MIB, 5 * MIB, 6 * MIB]);
    assert_eq!(devices(&allocs), [0; 7]);
    assert_eq!(allocs[1]["pitch"], 1024, "pitch read back from *pPitch");
    assert!(allocs.iter().all(|e| e["result"] == 0 && e["addr"] != "0x0" && e["latency_ns"].as_u64().unwrap() > 0));

    let host = t.of_type("host_alloc");
    assert_eq!(sizes(&host), [64 * KIB, 128 * KIB]);
    assert_eq!(host.iter().map(|e| e["api"].as_str().unwrap()).collect::<Vec<_>>(), ["cuMemHostAlloc", "cuMemAllocHost_v2"]);
    assert!(host.iter().all(|e| e["device"].is_null()), "pinned host memory has no device");

    let frees = t.of_type("free");
    assert_eq!(
        frees.iter().map(|e| e["api"].as_str().unwrap()).collect::<Vec<_>>(),
        ["cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"]
    );
    assert_eq!(sizes(&frees), [MIB, 3 * MIB, 4 * MIB], "a free reports the size it released");
    assert_eq!(frees[0]["addr"], allocs[0]["addr"]);
    assert_eq!(sizes(&t.of_type("host_free")), [64 * KIB]);

    // Live at exit: pitch + managed + both pool allocations on device 0.
    assert_eq!(t.released_at_exit(pid), [(0, 1024 * 100 + 13 * MIB, 4)]);
    assert_nothing_live(&t, pid);
    let p = t.summary_process(pid);
    assert_eq!(p["comm"], "workload");
    assert_eq!(api_stats(p, "cuMemAllocPitch_v2")["calls"], 1);
    assert_eq!(api_stats(p, "cuMemHostAlloc")["calls"], 1);
    // The summary's percentiles count exactly the calls the events show (the
    // exporter's histograms are fed from the same observations).
    let d = &t.summary["distributions"];
    assert_eq!(d["allocation_size_bytes"]["device"]["count"], 7, "{d:#}");
    assert_eq!(d["allocation_size_bytes"]["device"]["max"], 6 * MIB);
    assert_eq!(d["allocation_size_bytes"]["host_pinned"]["count"], 2);
    assert_eq!(d["allocation_lifetime_ns"]["device"]["count"], 3);
    assert_eq!(d["allocation_lifetime_ns"]["host_pinned"]["count"], 1);
    assert_eq!(d["api_latency_ns"]["cuMemAlloc_v2"]["count"], 1);
    let calls: u64 = d["api_latency_ns"].as_object().unwrap().values().map(|p| p["count"].as_u64().unwrap()).sum();
    assert_eq!(calls, t.events.iter().filter(|e| e["type"] != "exit").count() as u64);
    for e in &t.events {
        for key in ["type", "ts_ns", "pid", "tid", "comm", "api", "device", "addr", "size", "result", "latency_ns"] {
            assert!(e.get(key).is_some(), "{key} missing in {e}");
        }
    }
}

#[test]
fn failed_allocations_are_events_that_change_nothing() {
    require_root();
    let cap = (64 * MIB).to_string();
    let t = trace_workload("oom", &[("GPUMEM_FAKE_CAPACITY", &cap)]);
    let pid = single_pid(&t);
    let allocs = t.of_type("alloc");
    assert_eq!(results(&allocs), [0, 2, 1, 0]);
    assert_eq!(allocs[1]["result_name"], "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(allocs[1]["size"], 32 * MIB, "a failed allocation reports the size it asked for");
    assert_eq!(allocs[1]["addr"], "0x0");
    assert_eq!(t.released_at_exit(pid), [(0, 32 * MIB, 1)]);
    let stats = api_stats(t.summary_process(pid), "cuMemAlloc_v2");
    assert_eq!(stats["calls"], 4);
    assert_eq!(stats["failures"], 2);
    assert_eq!(stats["results"]["2"], 1);
    assert_eq!(stats["results"]["1"], 1);
}

#[test]
fn frees_that_fail_are_not_credited() {
    require_root();
    let t = trace_workload("bad_free", &[]);
    let pid = single_pid(&t);
    let frees = t.of_type("free");
    assert_eq!(results(&frees), [1, 0, 1]);
    assert_eq!(frees[1]["size"], 2 * MIB);
    assert_eq!(t.released_at_exit(pid), [(0, MIB, 1)]);
    let stats = api_stats(t.summary_process(pid), "cuMemFree_v2");
    assert_eq!((stats["calls"].as_u64(), stats["failures"].as_u64()), (Some(3), Some(2)));
}

#[test]
fn eight_threads_final_state_exact() {
    require_root();
    let t = trace_workload("threads", &[]);
    let pid = single_pid(&t);
    assert_eq!(t.of_type("alloc").len(), 1600);
    assert_eq!(t.of_type("free").len(), 800);
    let tids: std::collections::BTreeSet<u64> = t.of_type("alloc").iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids.len(), 8, "allocations come from eight threads");
    assert!(!tids.contains(&pid));
    assert!(t.of_type("alloc").iter().all(|e| e["device"] == 0), "threads set the primary context of device 0");
    assert_eq!(t.released_at_exit(pid), [(0, 100 * 4 * KIB * 36, 800)]);
    assert_eq!(api_stats(t.summary_process(pid), "cuMemAlloc_v2")["calls"], 1600);
}

#[test]
fn child_exiting_without_freeing_leaves_nothing_live() {
    require_root();
    let t = trace_workload("child_exit", &[]);
    let pids = t.pids();
    assert_eq!(pids.len(), 2, "the forked child is followed: {pids:?}");
    let child = pids[0];
    let parent = pids[1];
    assert_eq!(sizes(&t.for_pid(child).into_iter().filter(|e| e["type"] == "alloc").collect::<Vec<_>>()), [16 * MIB, 16 * MIB]);
    assert_eq!(t.released_at_exit(child), [(0, 32 * MIB, 2)]);
    assert_eq!(t.released_at_exit(parent), []);
    assert_nothing_live(&t, child);
    assert_nothing_live(&t, parent);
}
