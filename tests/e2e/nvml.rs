//! NVML: health rules and reasons, the real NVML without a GPU, memory
//! temperature against errors, reconciliation, XIDs.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

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
    assert_eq!(
        (g0["index"].as_u64(), g0["UUID"].as_str(), g0["pci_bus_id"].as_str(), g0["modelName"].as_str()),
        (Some(0), Some("GPU-00000000-0000-0000-0000-000000000000"), Some("00000000:10:00.0"), Some("Fake H200"))
    );
    assert_eq!(g0["memory"]["total"].as_u64(), Some(144 << 30));
    assert_eq!(g0["memory"]["used"].as_u64(), Some(20 << 30));
    assert_eq!(g0["processes"], serde_json::json!([[4242, MIB], [4343, 2 * MIB]]));
    assert_eq!((g0["health"]["score"].as_u64(), g0["health"]["level"].as_str()), (Some(100), Some("ok")));
    assert_eq!((g0["gpu_temp_c"].as_u64(), g0["memory_temp_c"].as_u64()), (Some(60), Some(70)));
    // nvmlDeviceGetAddressingMode: none here, ATS on device 1 (a Grace Hopper's), unsupported on device 2.
    assert_eq!((gpus[0]["addressing_mode"].as_str(), gpus[1]["addressing_mode"].as_str()), (Some("none"), Some("ats")));
    assert!(gpus[2]["addressing_mode"].is_null());

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
    let rules: Vec<(&str, u64)> =
        g1["health"]["reasons"].as_array().unwrap().iter().map(|r| (r["rule"].as_str().unwrap(), r["points"].as_u64().unwrap())).collect();
    assert_eq!(
        rules,
        [
            ("ecc_corrected_rate", 30),
            ("retirement_pending", 25),
            ("double_bit_retired", 10),
            ("row_remap_pending", 20),
            ("rows_remapped_uncorrectable", 10),
            ("hbm_hot", 10)
        ]
    );
    assert_eq!((g1["health"]["score"].as_u64(), g1["health"]["level"].as_str()), (Some(0), Some("critical")));

    // An older card: unsupported readings are recorded, cost no points, and are asked once.
    let g2 = &gpus[2];
    assert_eq!(
        g2["unsupported"],
        serde_json::json!([
            "addressing_mode",
            "ecc",
            "ecc_by_location",
            "memory_temperature",
            "numa_node",
            "remapped_rows",
            "retired_pages"
        ])
    );
    // Only card 1 (a Grace Hopper's) has memory that is a NUMA node.
    assert_eq!([&gpus[0]["numa_node"], &g1["numa_node"], &g2["numa_node"]], [&Value::Null, &serde_json::json!(0), &Value::Null]);
    assert!(g2["ecc"].is_null() && g2["retired_pages"].is_null());
    assert_eq!(g2["health"]["score"].as_u64(), Some(100));
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1, "ECC of device 2 asked once over two readings");

    // The human report says what ATS means for gpumem's figures.
    let out = health(&["--interval", "0.1", "--nvml", f.nvml.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let gpu1 = text.split("GPU 1 ").nth(1).unwrap_or_else(|| panic!("{text}"));
    assert!(
        gpu1.contains("  addressing: ATS: memory the GPU reaches from malloc or mmap is not in gpumem's per-process figures\n"),
        "{text}"
    );
    assert!(text.contains("  addressing: none\n"), "{text}");
    assert!(gpu1.contains("  NUMA node 0 is this GPU's memory: `gpumem serve` exports each process's pages there\n"), "{text}");
    assert_eq!(text.matches("is this GPU's memory").count(), 1, "{text}");

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
    assert_eq!(
        (m0["ecc_increments"].clone(), m0["seconds_above_hbm"].as_f64(), m0["correlation"].is_null()),
        (serde_json::json!([]), Some(0.0), true)
    );
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
    assert_eq!(
        (r["nvml_bytes"].as_u64(), r["traced_bytes"].as_u64(), r["untracked_bytes"].as_i64()),
        (Some(nvml_bytes), Some(4 * MIB), Some(300 * MIB as i64))
    );
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

/// The loaded kernel module's version (a synthetic /proc/driver/nvidia/version)
/// against the real user-space libraries' (Debian's 535.261.03): the classic
/// "driver/library version mismatch" named in status and health, and not
/// when they agree.
/// `status` says each GPU's addressing mode where the driver does, and why
/// it matters under ATS: what the GPU reaches of host memory is not traced.
#[test]
fn status_says_each_gpus_addressing_mode() {
    require_root();
    let f = fixtures();
    let out = run_gpumem(&["status", "--no-discover", "--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("NVML: ")).unwrap_or_else(|| panic!("no NVML line: {text}"));
    assert_eq!(
        line,
        "NVML: available, 3 GPU(s); addressing: GPU 0 none, GPU 1 ats (its memory is NUMA node 0), GPU 2 not said (host memory the GPU reaches under hmm or ats is not in the per-process figures; each process's pages on a GPU's node are in gpumem_process_gpu_node_resident_bytes)"
    );
    let out = run_gpumem(
        &["status", "--json", "--no-discover", "--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()],
        &[],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nvml"].as_str(), line.strip_prefix("NVML: "));
}

#[test]
fn a_driver_library_version_mismatch_is_named_in_status_and_health() {
    require_root();
    let dir = target_dir().join("driver-version");
    std::fs::create_dir_all(&dir).unwrap();
    let (newer, same) = (dir.join("newer"), dir.join("same"));
    std::fs::write(&newer, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  (dvs-builder@U16)  Thu Feb 22 2024\nGCC version:  gcc version 12.2.0\n").unwrap();
    std::fs::write(&same, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jun  4 13:49:15 UTC 2025\n").unwrap();
    let (libcuda, nvml) = (real_libcuda(), real_nvml());
    let status = |file: &std::path::Path| {
        let out = run_gpumem(
            &[
                "status",
                "--no-discover",
                "--libcuda",
                libcuda.to_str().unwrap(),
                "--nvml",
                nvml.to_str().unwrap(),
                "--driver-version-file",
                file.to_str().unwrap(),
            ],
            &[],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = status(&newer);
    assert!(out.contains("driver: kernel module 550.54.14; libcuda 535.261.03, NVML 535.261.03"), "{out}");
    assert!(out.contains("driver/library version mismatch: the loaded kernel module is 550.54.14, but libcuda 535.261.03 ("), "{out}");
    assert!(out.contains("reload the nvidia modules"), "{out}");
    let out = status(&same);
    assert!(out.contains("driver: kernel module 535.261.03; libcuda 535.261.03, NVML 535.261.03"), "{out}");
    assert!(!out.contains("mismatch"), "{out}");
    let out = health(&["--nvml", nvml.to_str().unwrap(), "--driver-version-file", newer.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("driver/library version mismatch: the loaded kernel module is 550.54.14, but NVML 535.261.03"), "{err}");
    let out = health(&["--nvml", nvml.to_str().unwrap(), "--driver-version-file", dir.join("absent").to_str().unwrap()], &[]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("mismatch"), "no module loaded here: nothing to compare");
}

/// MPS: NVML lists only the server, for its clients' memory; each client is
/// traced as itself. The server is reconciled against its traced clients,
/// not called untraced, and the clients are not "missing from NVML".
#[test]
fn an_mps_server_is_reconciled_against_its_traced_clients() {
    require_root();
    let f = fixtures();
    // A stand-in for nvidia-cuda-mps-server: its comm is what the agent reads.
    let dir = target_dir().join("gpumem-fixtures/mps");
    std::fs::create_dir_all(&dir).unwrap();
    let server_bin = dir.join("nvidia-cuda-mps-server");
    std::fs::copy("/bin/sleep", &server_bin).unwrap();
    let mut server = std::process::Command::new(&server_bin).arg("120").spawn().unwrap();
    let pids_file = target_dir().join("gpumem-fixtures/nvml-pids-mps");
    std::fs::write(&pids_file, "").unwrap();
    let serve = Serve::start(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"],
        &[("GPUMEM_FAKE_NVML_PIDS_FILE", pids_file.to_str().unwrap())],
    );
    // The client: 9 MiB on GPU 0 (and 2 MiB on GPU 1, where no server is listed).
    let mut client = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "60000")]);
    let (spid, cpid) = (server.id(), client.id());
    // NVML: the server alone on GPU 0, with the client's 9 MiB and 300 MiB of context.
    std::fs::write(&pids_file, format!("{spid}:{}", 309 * MIB)).unwrap();
    let series = |text: &str, gpu: u32| {
        text.lines()
            .find(|l| l.starts_with(&format!("gpumem_process_untracked_bytes{{pid=\"{spid}\"")) && l.contains(&format!("gpu=\"{gpu}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let untracked = poll(
        30,
        "the server reconciled against its client",
        || {
            let text = serve.metrics();
            series(&text, 0).filter(|&v| v == (300 * MIB) as f64)
        },
        || serve.metrics(),
    );
    assert_eq!(untracked, (300 * MIB) as f64, "309 MiB listed for the server, 9 MiB of it traced in its client");
    let text = serve.metrics();
    assert_eq!(pid_series(&text, "gpumem_process_memory_bytes", cpid), Some((9 * MIB) as f64), "the client as itself");
    serve.stop();
    let _ = client.kill();
    let _ = client.wait();
    // A session's summary says the same, naming the client it traced.
    let cmd = workload_cmd("hold");
    let out = std::process::Command::new(gpumem_bin())
        .args(["trace", "--json", "--duration", "3", "--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()])
        .args(["-c", &cmd])
        .env("GPUMEM_FAKE_NVML_PIDS_FILE", &pids_file)
        .env("GPUMEM_WORKLOAD_HOLD_MS", "6000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let rows = summary["reconciliation"].as_array().unwrap_or_else(|| panic!("{summary:#}"));
    let r = rows.iter().find(|r| r["pid"] == spid).unwrap_or_else(|| panic!("{rows:#?}"));
    assert_eq!(r["mps_clients"].as_array().map(Vec::len), Some(1), "{r:#}");
    assert_ne!(r["mps_clients"][0], cpid, "the session's own client");
    assert_eq!((r["traced_bytes"].as_u64(), r["untracked_bytes"].as_i64()), (Some(9 * MIB), Some(300 * MIB as i64)));
    let _ = server.kill();
    let _ = server.wait();
}

/// MIG: a process in a MIG instance (CUDA_VISIBLE_DEVICES=MIG-…) sees the
/// instance as its device 0; its own cuDeviceGetUuid_v2 says which, and its
/// memory is the instance's, labelled as dcgm-exporter labels it, reconciled
/// against what NVML lists on that instance.
#[test]
fn a_mig_instances_memory_carries_dcgm_exporters_instance_labels() {
    require_root();
    let f = fixtures();
    let pids_file = target_dir().join("gpumem-fixtures/nvml-pids-mig");
    std::fs::write(&pids_file, "").unwrap();
    let envs = [("GPUMEM_FAKE_NVML_PIDS_FILE", pids_file.to_str().unwrap()), ("GPUMEM_FAKE_NVML_MIG", "2")];
    let serve =
        Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"], &envs);
    // GPU instance 2 of GPU 0 (the synthetic NVML's MIG-…0012).
    let mut child = spawn_workload(
        "mig",
        &[("CUDA_VISIBLE_DEVICES", "MIG-00000000-0000-0000-0000-000000000012"), ("GPUMEM_WORKLOAD_HOLD_MS", "30000")],
    );
    let pid = child.id();
    std::fs::write(&pids_file, format!("0.2/{pid}:{}", 40 * MIB)).unwrap();
    let line = |text: &str, family: &str| {
        text.lines().find(|l| l.starts_with(&format!("{family}{{pid=\"{pid}\"")) && l.contains("GPU_I_ID=\"2\"")).map(str::to_string)
    };
    let text = poll(
        30,
        "the instance's memory and its reconciliation",
        || {
            Some(serve.metrics())
                .filter(|t| line(t, "gpumem_process_memory_bytes").is_some() && line(t, "gpumem_process_untracked_bytes").is_some())
        },
        || serve.metrics(),
    );
    let memory = line(&text, "gpumem_process_memory_bytes").unwrap();
    assert!(memory.ends_with(&format!(" {}", 12 * MIB)), "{memory}");
    for label in ["gpu=\"0\"", "GPU_I_PROFILE=\"1g.18gb\"", "UUID=\"GPU-00000000-0000-0000-0000-000000000000\""] {
        assert!(memory.contains(label), "{label} in {memory}");
    }
    let untracked = line(&text, "gpumem_process_untracked_bytes").unwrap();
    assert!(untracked.ends_with(&format!(" {}", 28 * MIB)), "40 MiB on the instance, 12 MiB traced: {untracked}");
    let _ = child.kill();
    let _ = child.wait();
    serve.stop();
}

/// On a coherent platform a GPU's memory is a NUMA node, and a process's
/// malloc'd memory can sit there with no driver call. The synthetic NVML
/// names this machine's only node as GPU 1's memory, so the workload's own
/// pages (48 MiB written, its libraries, its stack) are all there: the
/// figure must be what the test sums from the same numa_maps, with GPU 1's
/// labels, and no GPU without a node gets a series.
#[test]
fn a_processs_pages_on_a_gpus_numa_node_are_read_from_numa_maps() {
    require_root();
    let f = fixtures();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"], &[]);
    let (mut child, lines) = spawn_workload_watched("hold", &[("GPUMEM_WORKLOAD_TOUCH_MIB", "48"), ("GPUMEM_WORKLOAD_HOLD_MS", "60000")]);
    let pid = child.id();
    lines.wait_for("workload: holding", 30);
    let series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("gpumem_process_gpu_node_resident_bytes{{pid=\"{pid}\"")))
            .map(str::to_string)
            .collect()
    };
    // Read at once when the process is new, again every 30 s: an early
    // read may come before its 48 MiB were written.
    let value_of = |line: &str| -> u64 { line.rsplit(' ').next().unwrap().parse().unwrap() };
    let at_least = |t: &String| series(t).iter().any(|l| value_of(l) >= 48 * MIB);
    let text = poll(45, "the workload's 48 MiB on GPU 1's node", || Some(serve.metrics()).filter(at_least), || serve.metrics());
    // What numastat -p sums: every N0= count at its line's page size.
    let numa_maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap();
    let expected: u64 = numa_maps
        .lines()
        .map(|l| {
            let field = |key: &str| l.split(' ').find_map(|t| t.strip_prefix(key)?.parse::<u64>().ok()).unwrap_or(0);
            field("N0=") * field("kernelpagesize_kB=") * 1024
        })
        .sum();
    let lines_of = series(&text);
    assert_eq!(lines_of.len(), 1, "one series, GPU 1's: {lines_of:?}");
    let line = &lines_of[0];
    for label in ["gpu=\"1\"", "node=\"0\"", "UUID=\"GPU-00000000-0000-0000-0000-000000000001\"", "comm=\"workload\""] {
        assert!(line.contains(label), "{label} in {line}");
    }
    assert_eq!(value_of(line), expected, "the agent's sum against the test's own of /proc/{pid}/numa_maps:\n{numa_maps}");
    assert!(text.lines().any(|l| l == "gpumem_gpu_node_reads_cut_total 0"), "no read cut");
    let _ = child.kill();
    let _ = child.wait();
    serve.stop();
}
