//! Finding and attaching libcuda: libraries loaded later, NVIDIA's real
//! driver, `gpumem status`, tracefs, system-wide and `-p` tracing.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

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
