//! Finding and attaching libcuda: libraries loaded later, NVIDIA's real
//! driver, `gpumem status`, tracefs, system-wide and `-p` tracing.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

#[test]
fn library_loaded_after_the_agent_started_is_attached() {
    late_library_is_attached(&[]);
}

#[test]
fn without_loader_hooks_the_periodic_scan_still_attaches_a_late_library() {
    // The fallback: no dynamic loader hooked (refusal simulated), every
    // process is read at each scan, twice a second, as before the hooks.
    late_library_is_attached(&["--refuse-loader-hooks"]);
    let out = run_gpumem(&["status", "--json", "--refuse-loader-hooks"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["discovery"];
    assert_eq!((&d["mode"], d["full_scan_every_s"].as_f64()), (&Value::from("periodic"), Some(0.5)), "{d:#}");
    assert!(d["loaders"].as_array().unwrap().iter().all(|l| l["attached"] == false && l["error"].is_string()), "{d:#}");
}

#[test]
fn status_says_discovery_is_event_driven_through_the_hooked_loaders() {
    require_root();
    let out = run_gpumem(&["status", "--json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["discovery"];
    assert_eq!((&d["mode"], d["full_scan_every_s"].as_f64()), (&Value::from("event_driven"), Some(30.0)), "{d:#}");
    // This machine's glibc loader, by the path processes map it at.
    let loaders = d["loaders"].as_array().unwrap();
    assert!(loaders.iter().any(|l| l["attached"] == true && l["path"].as_str().unwrap().ends_with("ld-linux-x86-64.so.2")), "{d:#}");
    let exec = v["tracepoints"].as_array().unwrap().iter().find(|t| t["tracepoint"] == "sched:sched_process_exec").unwrap();
    assert_eq!(exec["attached"], true);
    let human = run_gpumem(&["status"], &[]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("discovery: event-driven — sched_process_exec and the _dl_debug_state hook of"), "{text}");
}

fn late_library_is_attached(extra: &[&str]) {
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
    let mut args = extra.to_vec();
    args.extend(["-c", &cmd]);
    let t = trace(&args, &[]);
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
    // Everything driver 535 exports is attached; what it lacks (newer drivers only) is named.
    let optional: Vec<&str> = gpumem_common::APIS.iter().filter(|a| !a.required).map(|a| a.symbol).collect();
    let n = gpumem_common::APIS.len();
    let attached = format!("attached {} of {n} probes", n - optional.len());
    let skipped = format!("not exported, skipped: {}", optional.join(", "));
    assert!(t.stderr.contains(&attached) && t.stderr.contains(&skipped), "probes attached to the real driver: {}", t.stderr);
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
    // The whole memory API: sharing between processes, pools, registered
    // host memory, green contexts, each listed with its status.
    for symbol in [
        "cuIpcGetMemHandle",
        "cuIpcOpenMemHandle_v2",
        "cuIpcCloseMemHandle",
        "cuMemPoolExportPointer",
        "cuMemPoolImportPointer",
        "cuMemPoolCreate",
        "cuMemPoolDestroy",
        "cuMemPoolTrimTo",
        "cuDeviceSetMemPool",
        "cuMemHostRegister_v2",
        "cuMemHostUnregister",
        "cuGreenCtxCreate",
        "cuCtxFromGreenCtx",
        "cuGreenCtxDestroy",
        "cuGraphAddMemAllocNode",
        "cuGraphAddMemFreeNode",
        "cuDeviceGraphMemTrim",
        "cuGraphDestroy",
        "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint",
        "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
        "cuMulticastCreate",
        "cuMulticastAddDevice",
        "cuMulticastBindMem",
        "cuMulticastBindAddr",
        "cuMulticastUnbind",
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
        "cuMemRetainAllocationHandle",
        "cuDeviceGetUuid_v2",
    ] {
        let p = probes.iter().find(|p| p["symbol"] == symbol).unwrap_or_else(|| panic!("{symbol} in {probes:#?}"));
        assert_eq!(p["status"], "attached", "{p:#}");
    }
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
    // Green contexts (CUDA 12.4) and checkpoints (12.8) are newer than driver 535: said so.
    for symbol in ["cuGreenCtxCreate", "cuCheckpointProcessCheckpoint"] {
        let p = probes.iter().find(|p| p["symbol"] == symbol).unwrap();
        assert_eq!((p["status"].as_str(), p["required"].as_bool()), (Some("not_exported"), Some(false)), "{p:#}");
    }
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
    let pid_number: u64 = pid.parse().unwrap();
    assert!(events.iter().all(|e| e["pid"] == pid_number), "only the -p process is traced");
    let allocs: Vec<&Value> = events.iter().copied().filter(|e| e["type"] == "alloc").collect();
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB]);
    let exit = events.iter().find(|e| e["type"] == "exit").expect("exit event");
    assert_eq!(released(exit), [(0, 4 * MIB, 1)]);
}

#[test]
fn fresh_libcuda_copies_opened_with_dlopen_are_attached_before_their_first_call() {
    require_root();
    let f = fixtures();
    // Five copies, each a fresh inode, each opened with dlopen and first
    // called 100 ms later: the loader's hook wakes the agent, which reads
    // that one process's maps and attaches the copy.
    let dir = f.dir.join("fresh");
    std::fs::create_dir_all(&dir).unwrap();
    let libs: Vec<String> = (0..5)
        .map(|i| {
            let lib = dir.join(i.to_string()).join("libcuda.so.1");
            std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&lib);
            std::fs::copy(&f.libcuda, &lib).unwrap();
            lib.display().to_string()
        })
        .collect();
    let cmd = format!("{} {} fresh", f.workload.display(), f.libcuda.display());
    let t = trace(&["-c", &cmd], &[("GPUMEM_LIBS", &libs.join(":"))]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    assert_eq!(t.of_type("init").len(), 5, "every copy's cuInit is traced: {}", t.stderr);
    assert_eq!(sizes(&t.of_type("alloc")), [MIB; 5]);
    assert_eq!(t.released_at_exit(pid).iter().map(|r| r.1).sum::<u64>(), 5 * MIB);
    // When the breakpoint appeared in the process, measured by the process.
    let attach_ms: Vec<f64> =
        t.stderr.split_whitespace().filter_map(|w| w.strip_prefix("fresh_attach_ms=")).map(|v| v.parse().unwrap()).collect();
    assert_eq!(attach_ms.len(), 5, "{}", t.stderr);
    assert!(attach_ms.iter().all(|&ms| ms >= 0.0), "attached before the first call: {attach_ms:?}");
    eprintln!("fresh copies attached {attach_ms:?} ms after their dlopen");
}
