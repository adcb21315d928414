//! End-to-end: the real gpumem binary loads its eBPF programs, attaches to a
//! real libcuda.so.1 (synthetic, or NVIDIA's own) and traces real processes.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

fn api_stats<'a>(proc_summary: &'a Value, api: &str) -> &'a Value {
    proc_summary["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == api)
        .unwrap_or_else(|| panic!("{api} not in {proc_summary:#}"))
}

fn single_pid(t: &Trace) -> u64 {
    let pids = t.pids();
    assert_eq!(pids.len(), 1, "one traced process expected: {pids:?}");
    pids[0]
}

fn assert_nothing_live(t: &Trace, pid: u64) {
    let p = t.summary_process(pid);
    assert_eq!(p["exited"], true, "{p:#}");
    for d in p["devices"].as_array().unwrap() {
        assert_eq!(d["live_bytes"], 0, "{p:#}");
        assert_eq!(d["live_allocs"], 0, "{p:#}");
    }
    assert_eq!(p["host_pinned_bytes"], 0);
}

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
    assert_eq!(frees.iter().map(|e| e["api"].as_str().unwrap()).collect::<Vec<_>>(), ["cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"]);
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
fn two_devices_through_two_contexts() {
    require_root();
    let t = trace_workload("two_devices", &[]);
    let pid = single_pid(&t);
    let allocs = t.of_type("alloc");
    assert_eq!(sizes(&allocs), [10 * MIB, 20 * MIB, MIB, 2 * MIB, 3 * MIB]);
    assert_eq!(devices(&allocs), [0, 1, 0, 1, 0]);
    let creates = t.of_type("ctx_create");
    assert_eq!(creates.iter().map(|e| e["api"].as_str().unwrap()).collect::<Vec<_>>(), ["cuCtxCreate_v2", "cuCtxCreate_v3"]);
    assert_eq!(devices(&creates), [0, 1]);
    // Destroying the device-1 context frees its memory implicitly.
    let destroy = t.of_type("ctx_destroy");
    assert_eq!(destroy.len(), 1);
    assert_eq!(released(destroy[0]), [(1, 22 * MIB, 2)]);
    assert_eq!(destroy[0]["handle"], creates[1]["handle"]);
    assert_eq!(t.released_at_exit(pid), [(0, 14 * MIB, 3)]);
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

#[test]
fn expandable_segments_count_physical_handles_not_reservations() {
    require_root();
    let t = trace_workload("expandable", &[]);
    let pid = single_pid(&t);
    let reserve = t.of_type("va_reserve");
    assert_eq!(sizes(&reserve), [1152 * MIB]);
    let creates = t.of_type("vmm_create");
    assert_eq!(sizes(&creates), [20 * MIB; 6]);
    assert_eq!(devices(&creates), [0, 0, 0, 0, 0, 1], "the last handle names device 1 in prop->location");
    assert_eq!(t.of_type("vmm_map").len(), 6);
    let unmaps = t.of_type("vmm_unmap");
    assert_eq!(unmaps.len(), 2);
    // Handle 0 was unmapped before its release: the release frees it.
    // Handle 1 was released while mapped: its unmap frees it.
    assert_eq!(released(unmaps[0]), []);
    assert_eq!(released(unmaps[1]), [(0, 20 * MIB, 1)]);
    let releases = t.of_type("vmm_release");
    assert_eq!(releases.len(), 2);
    assert_eq!(releases[0]["handle"], creates[0]["handle"]);
    assert_eq!(released(releases[0]), [(0, 20 * MIB, 1)], "unmapped handle: the release frees it");
    assert_eq!(released(releases[1]), [], "still mapped: freed at its unmap");
    assert_eq!(t.released_at_exit(pid), [(0, 60 * MIB, 3), (1, 20 * MIB, 1)]);
}

#[test]
fn library_loaded_after_the_agent_started_is_attached() {
    require_root();
    let f = fixtures();
    // A fresh copy: an inode no agent has seen, not in ld.so.cache, not given.
    let dir = f.dir.join("late");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&lib);
    std::fs::copy(&f.libcuda, &lib).unwrap();
    // The workload calls 1 s after loading the library: every call, from
    // cuInit on, is traced only if the library was attached within a second.
    let cmd = format!("{} {} late_load", f.workload.display(), lib.display());
    let t = trace(&["-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert!(t.stderr.contains(&format!("root{}", lib.display())), "attached through /proc/PID/root: {}", t.stderr);
    let pid = single_pid(&t);
    assert_eq!(t.of_type("init").len(), 1, "cuInit, 1 s after the load, is traced");
    assert_eq!(sizes(&t.of_type("alloc")), [8 * MIB, 4 * MIB]);
    assert_eq!(t.released_at_exit(pid), [(0, 4 * MIB, 1)]);
}

#[test]
fn real_nvidia_driver_failures_are_reported_with_their_codes() {
    require_root();
    let real = real_libcuda();
    let f = fixtures();
    let cmd = format!("{} {} real_driver", f.workload.display(), real.display());
    let t = trace(&["--libcuda", real.to_str().unwrap(), "-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert!(t.stderr.contains("attached 2") || t.stderr.contains("attached 3"), "probes attached to the real driver: {}", t.stderr);
    let pid = single_pid(&t);
    let init = t.of_type("init");
    assert_eq!(results(&init), [100]);
    assert_eq!(init[0]["result_name"], "CUDA_ERROR_NO_DEVICE");
    let allocs = t.of_type("alloc");
    assert_eq!(results(&allocs), [3]);
    assert_eq!(allocs[0]["result_name"], "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!(allocs[0]["size"], MIB);
    assert_eq!(t.released_at_exit(pid), []);
    let p = t.summary_process(pid);
    assert_eq!(api_stats(p, "cuMemAlloc_v2")["failures"], 1);
    assert_eq!(api_stats(p, "cuInit")["results"]["100"], 1);
}

#[test]
fn status_reports_probes_and_missing_symbols() {
    require_root();
    let f = fixtures();
    let out = run_gpumem(&["status", "--json", "--libcuda", f.libcuda.to_str().unwrap(), "--no-discover"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kernel"]["uprobes"], true);
    assert_eq!(v["kernel"]["ring_buffer"], true);
    let libs = v["libraries"].as_array().unwrap();
    assert_eq!(libs.len(), 1);
    let probes = libs[0]["probes"].as_array().unwrap();
    let attached = probes.iter().filter(|p| p["status"] == "attached").count();
    assert_eq!(attached, gpumem_common::APIS.len() - 1, "all but cuCtxCreate_v4");
    let v4 = probes.iter().find(|p| p["symbol"] == "cuCtxCreate_v4").unwrap();
    assert_eq!(v4["status"], "not_exported");
    assert_eq!(v4["required"], false);
    let exit = v["tracepoints"].as_array().unwrap().iter().find(|t| t["tracepoint"] == "sched:sched_process_exit").unwrap();
    assert_eq!(exit["attached"], true);
}

#[test]
fn status_on_the_real_driver_resolves_every_symbol() {
    require_root();
    let real = real_libcuda();
    let out = run_gpumem(&["status", "--json", "--libcuda", real.to_str().unwrap(), "--no-discover"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let probes = v["libraries"][0]["probes"].as_array().unwrap().clone();
    let not_attached: Vec<&Value> = probes.iter().filter(|p| p["status"] != "attached" && p["required"] != false).collect();
    assert!(not_attached.is_empty(), "driver 535 exports every required entry point: {not_attached:#?}");
}

#[test]
fn tracefs_is_mounted_when_missing() {
    require_root();
    // A fresh machine may come without tracefs: take it away and let gpumem mount it.
    let _ = std::process::Command::new("umount").arg("/sys/kernel/tracing").status();
    assert!(!std::path::Path::new("/sys/kernel/tracing/events").exists(), "could not unmount tracefs for the test");
    let out = run_gpumem(&["status", "--json", "--no-discover"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("mounted tracefs")), "{v:#}");
    assert_eq!(v["kernel"]["tracepoints"], true);
    assert!(std::path::Path::new("/sys/kernel/tracing/events/sched").exists());
}

#[test]
fn errors_are_one_line_with_nonzero_status() {
    require_root();
    // Unknown pid.
    let out = run_gpumem(&["trace", "-p", "999999999"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), "gpumem: no process with pid 999999999");
    // Bad flag values are usage errors (2), without a backtrace.
    for args in [&["trace", "--duration", "-1"][..], &["trace", "--min-size", "lots"], &["trace", "-p", "abc"]] {
        let out = run_gpumem(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error:"), "{err}");
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    }
    // A --libcuda path that does not exist.
    let out = run_gpumem(&["trace", "--libcuda", "/nonexistent/libcuda.so.1", "--duration", "1"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--libcuda /nonexistent/libcuda.so.1"));
    // Not root and no capabilities: drop to nobody (reliability.rs covers
    // running with only the capabilities it needs).
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(gpumem_bin())
        .arg("status")
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpumem needs CAP_BPF and CAP_PERFMON"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn command_exit_status_is_passed_through() {
    require_root();
    let f = fixtures();
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-discover", "-c", "exit 7"], &[]);
    assert_eq!(t.status.code(), Some(7));
    assert!(t.events.is_empty());
}

#[test]
fn pid_filter_and_display_filters() {
    require_root();
    let f = fixtures();
    let cap = (64 * MIB).to_string();
    // --failed-only shows only failures; the summary still counts everything.
    let cmd = workload_cmd("oom");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--failed-only", "-c", &cmd], &[("GPUMEM_FAKE_CAPACITY", &cap)]);
    assert_eq!(results(&t.of_type("alloc")), [2, 1]);
    assert_eq!(t.events.len(), 3, "two failed allocations and the cuda_oom record of the first");
    assert_eq!(t.of_type("cuda_oom").len(), 1);
    let pid = t.summary["processes"][0]["pid"].as_u64().unwrap();
    assert_eq!(api_stats(t.summary_process(pid), "cuMemAlloc_v2")["calls"], 4);
    // --min-size hides small events.
    let cmd = workload_cmd("two_devices");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--min-size", "10MiB", "-c", &cmd], &[]);
    let shown: Vec<(String, u64)> = t.events.iter().map(|e| (e["type"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap())).collect();
    assert_eq!(
        shown,
        [("alloc".into(), 10 * MIB), ("alloc".into(), 20 * MIB), ("ctx_destroy".into(), 22 * MIB), ("exit".into(), 14 * MIB)]
    );
}

#[test]
fn lost_events_are_counted_exactly() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("threads");
    // A one-page ring and a reader that starts late: most events cannot fit.
    let t = trace(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--ringbuf-bytes", "4096", "--stall-reader-ms", "3000", "-c", &cmd],
        &[],
    );
    assert!(t.status.success(), "{}", t.stderr);
    let lost = &t.summary["lost"];
    let ringbuf_full = lost["ringbuf_full"].as_u64().unwrap();
    assert!(ringbuf_full > 1000, "{lost}");
    assert_eq!(t.summary["lost_events"].as_u64().unwrap(), ringbuf_full, "{lost}");
    // init + retain + 9 set_current + 1600 allocs + 800 frees + exit: every one
    // either arrived or is counted as lost.
    assert_eq!(t.events.len() as u64 + ringbuf_full, 1 + 1 + 9 + 1600 + 800 + 1);
    // Every loss is the workload's: it is marked uncertain, with the count.
    assert_eq!(lost["by_pid"].as_object().unwrap().len(), 1, "{lost}");
    let pid = t.pids()[0];
    let p = t.summary_process(pid);
    assert_eq!(p["events_lost"].as_u64().unwrap(), ringbuf_full, "{p}");
    assert_eq!(p["uncertain"], true, "{p}");
}

#[test]
fn system_wide_trace_sees_processes_started_later() {
    require_root();
    let f = fixtures();
    let (agent, stderr) = start_agent(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-discover", "--duration", "4"]);
    let st = std::process::Command::new(&f.workload).args([f.libcuda.to_str().unwrap(), "bad_free"]).status().unwrap();
    assert!(st.success());
    let (lines, _) = finish_agent(agent, stderr);
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    let frees: Vec<&Value> = lines.iter().filter(|e| e["type"] == "free").collect();
    assert_eq!(results(&frees), [1, 0, 1]);
    let pid = frees[0]["pid"].as_u64().unwrap();
    let exit = lines.iter().find(|e| e["type"] == "exit" && e["pid"] == pid).expect("exit event");
    assert_eq!(released(exit), [(0, MIB, 1)]);
    assert!(summary["discovery"]["scans"].as_u64().unwrap() == 0, "--no-discover scans nothing");
}

/// Starts the synthetic driver's late_load workload: it waits `delay_ms`, then
/// allocates 8 MiB (freed) and 4 MiB (kept), then holds `hold_ms`.
fn spawn_late_load(delay_ms: u32, hold_ms: u32) -> std::process::Child {
    spawn_workload("late_load", &[("GPUMEM_WORKLOAD_DELAY_MS", &delay_ms.to_string()), ("GPUMEM_WORKLOAD_HOLD_MS", &hold_ms.to_string())])
}

#[test]
fn pid_option_traces_a_running_process_until_it_exits() {
    require_root();
    let f = fixtures();
    wait_for_detach();
    // late_load waits 3 s before its first CUDA call: time for the agent to start.
    let mut workload = spawn_late_load(3000, 0);
    let pid = workload.id().to_string();
    // A second process doing the same calls at the same time must not show up.
    let other = spawn_late_load(3000, 0);
    let (agent, stderr) = start_agent(&["-p", &pid, "--libcuda", f.libcuda.to_str().unwrap()]);
    assert!(workload.wait().unwrap().success());
    // The agent ends by itself once the traced process is gone.
    let (lines, _) = finish_agent(agent, stderr);
    let _ = other.wait_with_output();
    let events: Vec<&Value> = lines.iter().filter(|e| e["type"] != "summary").collect();
    assert!(events.iter().all(|e| e["pid"].to_string() == pid), "only the -p process is traced");
    let allocs: Vec<&Value> = events.iter().copied().filter(|e| e["type"] == "alloc").collect();
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB]);
    let exit = events.iter().find(|e| e["type"] == "exit").expect("exit event");
    assert_eq!(released(exit), [(0, 4 * MIB, 1)]);
}

/// Runs the bad_free workload inside a new cgroup directory and returns the trace.
fn trace_in_cgroup(cgroup_dir: &std::path::Path) -> Trace {
    let f = fixtures();
    std::fs::create_dir_all(cgroup_dir).expect("creating the test cgroup");
    let procs = cgroup_dir.join("cgroup.procs");
    // In a mount namespace of its own, the process sees what the kubelet
    // gives a pod's containers: its pod name as /etc/hostname and its
    // namespace in the service-account volume.
    let hostname = target_dir().join("gpumem-fixtures/pod-hostname");
    std::fs::write(&hostname, format!("{TEST_POD_NAME}\n")).unwrap();
    let sa = "/run/secrets/kubernetes.io/serviceaccount";
    let cmd = format!(
        "unshare --mount sh -c 'mount -t tmpfs none /run && mkdir -p {sa} && echo {TEST_NAMESPACE} > {sa}/namespace && mount --bind {} /etc/hostname && echo $$ > {} && exec {} {} bad_free'",
        hostname.display(),
        procs.display(),
        f.workload.display(),
        f.libcuda.display()
    );
    // The agent reads /proc/PID/cgroup when it first sees the process: keep it alive a moment.
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "-c", &cmd], &[("GPUMEM_WORKLOAD_HOLD_MS", "500")]);
    // Leaf first, then the parents this test made (they are empty now).
    let mut dir = cgroup_dir.to_path_buf();
    while dir.file_name().is_some_and(|n| n != "memory" && n != "unified") {
        if std::fs::remove_dir(&dir).is_err() {
            break;
        }
        dir.pop();
    }
    assert!(t.status.success(), "{}", t.stderr);
    t
}

const TEST_POD_UID: &str = "6b1c2d3e-4f50-4a1b-9c2d-3e4f5a6b7c8d";
const TEST_POD_NAME: &str = "trainer-7d9f-x2x";
const TEST_NAMESPACE: &str = "ml-team";
const TEST_CONTAINER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn kubernetes_pod_and_container_from_cgroup_v1_cgroupfs() {
    require_root();
    let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory/kubepods/burstable/pod{TEST_POD_UID}/{TEST_CONTAINER}"));
    let t = trace_in_cgroup(&dir);
    let allocs = t.of_type("alloc");
    assert_eq!(allocs.len(), 2);
    for e in &allocs {
        assert_eq!(e["pod_uid"], TEST_POD_UID, "{e}");
        assert_eq!(e["container"], TEST_CONTAINER, "{e}");
        assert_eq!(e["ns_pid"], e["pid"], "same pid namespace");
        assert_eq!(e["pod"], TEST_POD_NAME, "{e}");
        assert_eq!(e["namespace"], TEST_NAMESPACE, "{e}");
    }
    let p = t.summary_process(allocs[0]["pid"].as_u64().unwrap());
    assert_eq!(p["pod_uid"], TEST_POD_UID);
    assert_eq!((p["pod"].as_str(), p["namespace"].as_str()), (Some(TEST_POD_NAME), Some(TEST_NAMESPACE)));
}

#[test]
fn kubernetes_pod_and_container_from_cgroup_v2_systemd() {
    require_root();
    let uid = TEST_POD_UID.replace('-', "_");
    let dir = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/unified/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{TEST_CONTAINER}.scope"
    ));
    let t = trace_in_cgroup(&dir);
    let allocs = t.of_type("alloc");
    assert_eq!(allocs.len(), 2);
    for e in &allocs {
        assert_eq!(e["pod_uid"], TEST_POD_UID, "{e}");
        assert_eq!(e["container"], TEST_CONTAINER, "{e}");
    }
}

#[test]
fn cuda_oom_with_enough_reported_free_is_fragmentation() {
    require_root();
    let limit = (256 * MIB).to_string();
    let t = trace_workload("fragmented", &[("GPUMEM_FAKE_MAX_CONTIGUOUS", &limit), ("GPUMEM_WORKLOAD_HOLD_MS", "300")]);
    let infos = t.of_type("mem_info");
    assert_eq!(sizes(&infos), [1024 * MIB, 224 * MIB], "free bytes read from cuMemGetInfo_v2");
    let ooms = t.of_type("cuda_oom");
    assert_eq!(ooms.len(), 2);
    assert_eq!((ooms[0]["size"].as_u64(), ooms[0]["reported_free"].as_u64(), ooms[0]["fragmentation"].as_bool()), (Some(512 * MIB), Some(1024 * MIB), Some(true)));
    assert_eq!((ooms[1]["size"].as_u64(), ooms[1]["reported_free"].as_u64(), ooms[1]["fragmentation"].as_bool()), (Some(240 * MIB), Some(224 * MIB), Some(false)));
    // The snapshot names who held the device: the process itself, 800 MiB in 4.
    let pid = single_pid(&t);
    assert_eq!(ooms[1]["holders"][0]["pid"], pid);
    assert_eq!(ooms[1]["holders"][0]["bytes"], 800 * MIB);
    assert_eq!(ooms[1]["holders"][0]["allocs"], 4);
    // ... and from where: its top stacks on that device.
    let top = &ooms[1]["holders"][0]["top_stacks"][0];
    assert_eq!((top["count"].as_u64(), top["bytes"].as_u64()), (Some(4), Some(800 * MIB)), "{top:#}");
    assert!(!top["frames"].as_array().unwrap().is_empty(), "{top:#}");
    assert_eq!(ooms[0]["holders"], serde_json::json!([]), "nothing was held at the first failure");
    let oom = &t.summary["oom"];
    assert_eq!((oom["cuda_ooms"].as_u64(), oom["fragmentation_ooms"].as_u64()), (Some(2), Some(1)));
}

#[test]
fn host_oom_kill_in_a_memory_cgroup_names_victim_and_gpu_holdings() {
    require_root();
    let f = fixtures();
    let (cg, cmd) = hog_in_memory_cgroup("gpumem-oom-test");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "-c", &cmd], &[]);
    let _ = std::fs::remove_dir(cg);
    assert_eq!(t.status.code(), Some(128 + 9), "the command was OOM-killed: {}", t.stderr);
    let kills = t.of_type("oom_kill");
    assert_eq!(kills.len(), 1, "{:#?}", t.events);
    let k = kills[0];
    let pid = single_pid(&t);
    assert_eq!(k["pid"], pid);
    assert_eq!(k["comm"], "workload");
    assert_eq!(k["trigger_pid"], pid, "the hog triggered its own kill");
    assert_eq!(released(&serde_json::json!({"released": k["gpu_holdings"]})), [(0, 100 * MIB, 1)]);
    assert_eq!(k["memcg"], true);
    assert_eq!(k["memcg_path"], "/gpumem-oom-test");
    assert!(k["anon_rss_bytes"].as_u64().unwrap() > 32 * MIB, "{k}");
    // Then the kill's exit releases the GPU memory.
    assert_eq!(t.released_at_exit(pid), [(0, 100 * MIB, 1)]);
    assert_eq!(t.summary["oom"]["host_oom_kills"], 1);
}

fn leaks(args: &[&str], envs: &[(&str, &str)]) -> Value {
    let mut full = vec!["leaks", "--json"];
    full.extend_from_slice(args);
    let out = run_gpumem(&full, envs);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["type"], "leaks");
    v
}

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
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0.5", "--duration", "3", "-c", &cmd],
        &[("GPUMEM_LEAK_LOG", log.to_str().unwrap()), ("GPUMEM_STEPS", "60")],
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
    assert!(count == older || (near > 0 && count.abs_diff(older) <= near as u64), "{count} leaks reported, {older} made before the cut-off");
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

    // Growth: the leak (40 MiB/s), not the weights.
    let g = &p["growth"];
    assert_eq!(g["leaking"], true, "{g}");
    let rate = g["rate_bytes_per_s"].as_f64().unwrap() / MIB as f64;
    assert!((30.0..50.0).contains(&rate), "{rate} MiB/s");

    let st = &v["stacks"];
    assert!(st["captured"].as_u64().unwrap() >= count + 1);
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
    // 10 steps (1 s) of leaking, then 3 s quiet: the live bytes plateau.
    let cmd = workload_cmd("deep_leak");
    let v = leaks(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "4", "-c", &cmd],
        &[("GPUMEM_STEPS", "10"), ("GPUMEM_WORKLOAD_HOLD_MS", "6000")],
    );
    let g = &v["processes"][0]["growth"];
    assert_eq!(g["leaking"], false, "{g}");
    assert_eq!(g["reason"], "plateau", "{g}");
}

#[test]
fn vmm_reserved_mapped_and_released_but_mapped_are_reported() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("expandable_held");
    let v = leaks(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "2", "-c", &cmd],
        &[("GPUMEM_WORKLOAD_HOLD_MS", "4000")],
    );
    let dev0 = v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).expect("device 0").clone();
    let l = &dev0["layout"];
    assert_eq!(l["vmm_reserved_bytes"].as_u64(), Some(1152 * MIB));
    // Handles 2..4 mapped; handle 2 released while still mapped.
    assert_eq!(l["vmm_mapped_bytes"].as_u64(), Some(60 * MIB));
    assert_eq!(l["vmm_physical_bytes"].as_u64(), Some(60 * MIB));
    assert_eq!((l["released_but_mapped_handles"].as_u64(), l["released_but_mapped_bytes"].as_u64()), (Some(1), Some(20 * MIB)));
    assert_eq!(dev0["outstanding_bytes"].as_u64(), Some(60 * MIB), "reserved address space is not memory");
}

const FAKE_NVIDIA_DEV: &str = env!("CARGO_BIN_EXE_fake_nvidia_dev");

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// `h1=0x.. h2=0x.. device=0x..` from the client's stderr.
fn client_handles(stderr: &str) -> (u64, u64, u64) {
    let line = stderr.lines().find(|l| l.contains("h1=")).unwrap_or_else(|| panic!("no handles in {stderr}"));
    let get = |k: &str| u64::from_str_radix(line.split(k).nth(1).unwrap().split_whitespace().next().unwrap().trim_start_matches("0x"), 16).unwrap();
    (get("h1="), get("h2="), get("device="))
}

#[test]
fn nvidia_ioctls_are_decoded_exactly_and_rm_memory_is_kept() {
    require_root();
    let dev = FakeDevice::mount(FAKE_NVIDIA_DEV, "decode");
    let f = fixtures();
    let cmd = format!("{} {}", f.nvioctl.display(), dev.dir.display());
    // The summary comes while the client is alive (it holds 4 s), so its RM memory shows.
    let t = trace(
        &["--nvidia-dev-prefix", &dev.prefix(), "--no-discover", "--duration", "2", "-c", &cmd],
        &[("GPUMEM_WORKLOAD_HOLD_MS", "4000")],
    );
    let (h1, h2, device) = client_handles(&t.stderr);
    let types: Vec<&str> = t.events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    // Nine NVIDIA ioctls; the pipe's 101 ioctls (one of them an 'F' escape) produce nothing.
    assert_eq!(types, ["rm_alloc", "rm_alloc", "rm_alloc", "rm_alloc", "rm_map", "rm_control", "rm_free", "uvm_map", "uvm_free"]);
    let e = &t.events;
    assert_eq!((hex(&e[0]["class"]), hex(&e[0]["handle"]), e[0]["size"].as_u64()), (0x80, device, Some(0)));
    // NVOS21, class 0x40: size and flags from NV_MEMORY_ALLOCATION_PARAMS.
    assert_eq!((hex(&e[1]["class"]), hex(&e[1]["handle"]), hex(&e[1]["parent"])), (0x40, h1, device));
    assert_eq!((e[1]["size"].as_u64(), e[1]["flags"].as_u64(), e[1]["status"].as_u64()), (Some(64 * MIB), Some(5), Some(0)));
    assert_eq!(hex(&e[1]["root"]), 0xc1d00001);
    // NVOS64 form.
    assert_eq!((hex(&e[2]["handle"]), e[2]["size"].as_u64(), e[2]["flags"].as_u64()), (h2, Some(32 * MIB), Some(9)));
    // Refused by the RM: status in the struct, the syscall itself succeeded.
    assert_eq!((hex(&e[3]["parent"]), e[3]["status"].as_u64(), e[3]["size"].as_u64()), (0xbad, Some(0x38), Some(128 * MIB)));
    assert_eq!((hex(&e[4]["handle"]), e[4]["size"].as_u64(), e[4]["addr"].as_str()), (h1, Some(2 * MIB), Some("0x7f0000001000")));
    assert_eq!((hex(&e[5]["cmd"]), hex(&e[5]["handle"])), (0x20800a01, device));
    assert_eq!((hex(&e[6]["handle"]), e[6]["size"].as_u64()), (h2, Some(32 * MIB)), "a free reports what it released");
    assert_eq!((e[7]["addr"].as_str(), e[7]["size"].as_u64()), (Some("0x7a0000000000"), Some(16 * MIB)));
    assert_eq!(e[8]["addr"].as_str(), Some("0x7a0000000000"));

    let pid = e[0]["pid"].as_u64().unwrap();
    let p = t.summary_process(pid);
    assert_eq!((p["rm_memory_bytes"].as_u64(), p["rm_memory_objects"].as_u64(), p["uvm_mapped_bytes"].as_u64()), (Some(64 * MIB), Some(1), Some(0)));
    let alloc = api_stats(p, "NV_ESC_RM_ALLOC");
    assert_eq!((alloc["calls"].as_u64(), alloc["failures"].as_u64()), (Some(4), Some(1)));
    assert_eq!(alloc["results"]["56"], 1);
}

#[test]
fn nvidia_descriptors_opened_before_the_agent_are_seeded_from_proc() {
    require_root();
    let dev = FakeDevice::mount(FAKE_NVIDIA_DEV, "seed");
    let f = fixtures();
    wait_for_detach();
    // The client opens the nodes, then waits for the go file (the agent attached).
    let go = dev.dir.with_extension("go");
    let _ = std::fs::remove_file(&go);
    let mut client = std::process::Command::new(&f.nvioctl)
        .arg(&dev.dir)
        .env("GPUMEM_NVIOCTL_GO", &go)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = client.id().to_string();
    let (agent, stderr) = start_agent(&["-p", &pid, "--nvidia-dev-prefix", &dev.prefix(), "--no-discover"]);
    std::fs::write(&go, b"go").unwrap();
    assert!(client.wait().unwrap().success());
    let _ = std::fs::remove_file(&go);
    let (lines, _) = finish_agent(agent, stderr);
    let types: Vec<&str> = lines.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.iter().filter(|t| t.starts_with("rm_") || t.starts_with("uvm_")).count(), 9, "{types:?}");
}

#[test]
fn status_names_the_live_ioctl_path_and_why() {
    require_root();
    let out = run_gpumem(&["status", "--json", "--no-discover"], &[]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let io = &v["ioctl"];
    if v["kernel"]["kprobes"] == false {
        // This kernel: auto does not impose the fallback's cost, and says why.
        assert_eq!(io["path"], "off", "{io}");
        assert!(io["why"].as_str().unwrap().contains("no kprobes"), "{io}");
        // Asking for kprobes falls back to the tracepoints, which attach for real.
        let out = run_gpumem(&["status", "--json", "--no-discover", "--ioctl", "kprobes"], &[]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["ioctl"]["path"], "tracepoints", "{}", v["ioctl"]);
        assert!(v["ioctl"]["why"].as_str().unwrap().contains("falling back"));
        assert!(v["ioctl"]["error"].is_null(), "{}", v["ioctl"]);
    } else {
        assert!(io["path"] == "kprobes" || io["path"] == "off", "{io}");
    }
    assert!(io["error"].is_null(), "{io}");
    let out = run_gpumem(&["status", "--json", "--no-discover", "--ioctl", "off"], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ioctl"]["path"], "off");
}

fn health(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut full = vec!["health"];
    full.extend_from_slice(args);
    run_gpumem(&full, envs)
}

#[test]
fn health_from_the_synthetic_nvml_with_rules_and_reasons() {
    let f = fixtures();
    let log = f.dir.join("nvml-unsupported.log");
    let _ = std::fs::remove_file(&log);
    let out = health(
        &["--json", "--interval", "1", "--nvml", f.nvml.to_str().unwrap()],
        &[("GPUMEM_FAKE_NVML_PIDS", "4242:1048576,4343:2097152"), ("GPUMEM_FAKE_NVML_LOG", log.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["type"], "health");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 3);

    let g0 = &gpus[0];
    assert_eq!((g0["index"].as_u64(), g0["UUID"].as_str(), g0["pci_bus_id"].as_str(), g0["modelName"].as_str()),
        (Some(0), Some("GPU-00000000-0000-0000-0000-000000000000"), Some("00000000:10:00.0"), Some("Fake H200")));
    assert_eq!(g0["memory"]["total"].as_u64(), Some(144 << 30));
    assert_eq!(g0["memory"]["used"].as_u64(), Some(20 << 30));
    assert_eq!(g0["processes"], serde_json::json!([[4242, MIB], [4343, 2 * MIB]]));
    assert_eq!((g0["health"]["score"].as_u64(), g0["health"]["level"].as_str()), (Some(100), Some("ok")));
    assert_eq!((g0["gpu_temp_c"].as_u64(), g0["memory_temp_c"].as_u64()), (Some(60), Some(70)));

    let g1 = &gpus[1];
    // The n-th reading of the volatile counter adds 100 n: 100, then 300.
    assert_eq!(g1["ecc"]["corrected_volatile"].as_u64(), Some(300));
    assert_eq!(g1["ecc"]["corrected_aggregate"].as_u64(), Some(1300));
    let rate = g1["health"]["ecc_corrected_per_hour"].as_f64().unwrap();
    assert!((400_000.0..800_000.0).contains(&rate), "200 errors in about 1 s: {rate}/h");
    assert_eq!(g1["retired_pages"], serde_json::json!({"single_bit": 2, "double_bit": 1, "pending": true}));
    assert_eq!(g1["ecc_by_location"], serde_json::json!({"device_memory": [1234, 0], "sram": [5, 0]}), "only the locations it reports");
    assert_eq!(g1["remapped_rows"], serde_json::json!({"correctable": 3, "uncorrectable": 1, "pending": true, "failure": false}));
    assert_eq!(g1["memory_temp_c"].as_u64(), Some(87));
    let rules: Vec<(&str, u64)> = g1["health"]["reasons"].as_array().unwrap().iter().map(|r| (r["rule"].as_str().unwrap(), r["points"].as_u64().unwrap())).collect();
    assert_eq!(
        rules,
        [("ecc_corrected_rate", 30), ("retirement_pending", 25), ("double_bit_retired", 10), ("row_remap_pending", 20), ("rows_remapped_uncorrectable", 10), ("hbm_hot", 10)]
    );
    assert_eq!((g1["health"]["score"].as_u64(), g1["health"]["level"].as_str()), (Some(0), Some("critical")));

    // An older card: unsupported readings are recorded, cost no points, and are asked once.
    let g2 = &gpus[2];
    assert_eq!(g2["unsupported"], serde_json::json!(["ecc", "ecc_by_location", "memory_temperature", "remapped_rows", "retired_pages"]));
    assert!(g2["ecc"].is_null() && g2["retired_pages"].is_null());
    assert_eq!(g2["health"]["score"].as_u64(), Some(100));
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1, "ECC of device 2 asked once over two readings");

    // Thresholds are configurable: a strict HBM limit flags the healthy card too.
    let out = health(&["--json", "--interval", "0.1", "--hbm-temp-c", "65", "--nvml", f.nvml.to_str().unwrap()], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpus"][0]["health"]["reasons"][0]["rule"], "hbm_hot");
}

#[test]
fn real_nvml_without_a_gpu_degrades_cleanly() {
    let real = real_nvml();
    let out = health(&["--nvml", real.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("NVML unavailable"), "{err}");
    // Tracing keeps working, and status says NVML is missing.
    require_root();
    let out = run_gpumem(&["status", "--json", "--no-discover", "--nvml", real.to_str().unwrap()], &[]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["nvml"].as_str().unwrap().contains("NVML unavailable"), "{}", v["nvml"]);
    let t = trace_workload("bad_free", &[]);
    assert_eq!(t.of_type("free").len(), 3);
}

#[test]
fn health_watch_relates_memory_temperature_to_errors() {
    let f = fixtures();
    let out = health(&["--json", "--watch", "--count", "4", "--interval", "0.2", "--nvml", f.nvml.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reports: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(reports.len(), 4, "one report per reading after the first");
    let g1 = &reports[3]["gpus"][1];
    let m = &g1["temperature"];
    // Readings 2..5: errors +200, +300, +400, +500 at 87..90 °C.
    assert_eq!(m["ecc_increments"], serde_json::json!([[87, 200], [88, 300], [89, 400], [90, 500]]));
    assert!((m["correlation"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{m}");
    assert_eq!(m["max_memory_temp_c"].as_u64(), Some(90));
    // Every interval ended above 85 °C: the whole window counts.
    let window = g1["window_s"].as_f64().unwrap();
    assert!(window > 0.6, "{window}");
    assert!((m["seconds_above_hbm"].as_f64().unwrap() - window).abs() < 1e-9);
    // The healthy card: no increments, no time above the threshold, no correlation.
    let m0 = &reports[3]["gpus"][0]["temperature"];
    assert_eq!((m0["ecc_increments"].clone(), m0["seconds_above_hbm"].as_f64(), m0["correlation"].is_null()), (serde_json::json!([]), Some(0.0), true));
}

#[test]
fn reconciliation_of_traced_bytes_with_nvml() {
    require_root();
    let f = fixtures();
    wait_for_detach();
    let mut workload = spawn_late_load(2000, 5000);
    let pid = workload.id();
    // NVML (synthetic) sees the process with 4 MiB plus 300 MiB of context it never allocated.
    let nvml_bytes = 4 * MIB + 300 * MIB;
    let pids = format!("{pid}:{nvml_bytes}");
    let out = std::process::Command::new(gpumem_bin())
        .args(["trace", "--json", "-p", &pid.to_string(), "--duration", "4", "--libcuda", f.libcuda.to_str().unwrap()])
        .args(["--nvml", f.nvml.to_str().unwrap()])
        .env("GPUMEM_FAKE_NVML_PIDS", &pids)
        .output()
        .unwrap();
    let _ = workload.kill();
    let _ = workload.wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(summary["type"], "summary");
    assert!(summary["nvml"].as_str().unwrap().starts_with("available"), "{}", summary["nvml"]);
    let rows = summary["reconciliation"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!((r["pid"].as_u64(), r["gpu"].as_u64()), (Some(pid as u64), Some(0)));
    assert_eq!((r["nvml_bytes"].as_u64(), r["traced_bytes"].as_u64(), r["untracked_bytes"].as_i64()), (Some(nvml_bytes), Some(4 * MIB), Some(300 * MIB as i64)));
    // Without NVML the summary says why, and there is nothing to reconcile.
    let t = trace_workload("bad_free", &[]);
    assert!(t.summary["reconciliation"].is_null());
    assert!(t.summary["nvml"].as_str().unwrap().contains("NVML unavailable"), "{}", t.summary["nvml"]);
}

#[test]
fn xid_events_are_attributed_to_the_processes_on_that_gpu() {
    let f = fixtures();
    let out = health(
        &["--json", "--interval", "1", "--nvml", f.nvml.to_str().unwrap()],
        &[("GPUMEM_FAKE_NVML_XIDS", "1:48,1:92"), ("GPUMEM_FAKE_NVML_PIDS", "111:1048576,1/222:2097152")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["xid_watch"].as_str().unwrap().contains("not supported on GPU(s) [2]"), "{}", v["xid_watch"]);
    let x1 = v["gpus"][1]["xid_events"].as_array().unwrap();
    let got: Vec<(u64, &str)> = x1.iter().map(|x| (x["xid"].as_u64().unwrap(), x["meaning"].as_str().unwrap())).collect();
    assert_eq!(got, [(48, "double-bit ECC error (DBE)"), (92, "high single-bit ECC error rate")]);
    // Attributed to GPU 1's process, not GPU 0's.
    assert_eq!(x1[0]["processes"], serde_json::json!([[222, 2 * MIB]]));
    assert_eq!(v["gpus"][0]["xid_events"], serde_json::json!([]));
    let rules: Vec<(&str, u64)> = v["gpus"][1]["health"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == "xid")
        .map(|r| (r["level"].as_str().unwrap(), r["points"].as_u64().unwrap()))
        .collect();
    assert_eq!(rules, [("critical", 20), ("warning", 10)]);
}

/// A recording made while tracing, replayed: the same answers, exactly.
#[test]
fn a_recorded_session_replays_to_the_same_leak_report_and_trace() {
    require_root();
    let f = fixtures();
    let dir = target_dir().join("gpumem-fixtures");
    let rec = dir.join("leaks.gpumemrec");
    let cmd = workload_cmd("deep_leak");
    let args = ["--older-than", "0.5", "--libcuda", f.libcuda.to_str().unwrap()];
    let mut live_args = args.to_vec();
    // Stopped while the workload still runs: memory freed by its exit is not a leak.
    live_args.extend(["--record", rec.to_str().unwrap(), "--duration", "1.5", "-c", &cmd]);
    let live = leaks(&live_args, &[("GPUMEM_STEPS", "30")]);
    assert!(live["processes"][0]["stacks"].as_array().is_some_and(|s| !s.is_empty()), "{live:#}");
    let mut replay_args = args.to_vec();
    replay_args.extend(["--from", rec.to_str().unwrap()]);
    let replayed = leaks(&replay_args, &[]);
    assert_eq!(replayed, live, "leaks --from gives the live report");

    // trace: every event line and the summary, including an OOM with its holders' stacks.
    let rec2 = dir.join("trace.gpumemrec");
    let cap = (64 * MIB).to_string();
    let live = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--record", rec2.to_str().unwrap(), "-c", &workload_cmd("oom")], &[("GPUMEM_FAKE_CAPACITY", &cap)]);
    assert!(live.status.success(), "{}", live.stderr);
    assert!(live.stderr.contains("recorded 9 events"), "{}", live.stderr);
    let replayed = trace(&["--from", rec2.to_str().unwrap()], &[]);
    assert!(replayed.status.success(), "{}", replayed.stderr);
    assert_eq!(replayed.events, live.events);
    assert_eq!(replayed.summary, live.summary);
    // `replay FILE` is `trace --from FILE`.
    let out = run_gpumem(&["replay", "--json", rec2.to_str().unwrap()], &[]);
    assert!(out.status.success());
    let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last, live.summary);
}

#[test]
fn damaged_recordings_give_clear_errors_and_what_was_readable() {
    require_root();
    let f = fixtures();
    let dir = target_dir().join("gpumem-fixtures");
    let rec = dir.join("damage.gpumemrec");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--record", rec.to_str().unwrap(), "-c", &workload_cmd("threads")], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let full = std::fs::read(&rec).unwrap();
    let replay = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = run_gpumem(&["trace", "--json", "--from", path.to_str().unwrap()], &[]);
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Cut in the middle: the events before the cut, a summary of them, and where it broke.
    let (code, stdout, stderr) = replay("cut.gpumemrec", &full[..full.len() / 2]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("truncated at byte") && stderr.contains("the report above covers the"), "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    let events = lines.len() - 1;
    assert!(events > 100 && events < t.events.len(), "{events} of {}", t.events.len());
    assert_eq!(lines[..events], t.events[..events], "what was read is what was recorded");
    // A flipped byte in the middle: caught by the checksum, same treatment.
    let mut bad = full.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    let (code, _, stderr) = replay("flipped.gpumemrec", &bad);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("damaged at byte") && stderr.contains("checksum mismatch"), "{stderr}");
    // A newer format, and a file that is not a recording: refused, nothing misread.
    let mut newer = full.clone();
    newer[8] = 2;
    let (code, stdout, stderr) = replay("newer.gpumemrec", &newer);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(stderr.contains("recording format version 2 is newer than this gpumem reads (1)"), "{stderr}");
    let (code, stdout, stderr) = replay("not-a-recording.gpumemrec", b"{\"type\":\"summary\"}\n");
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(stderr.contains("not a gpumem recording"), "{stderr}");
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
