//! Where a process's memory went across the driver's whole memory API:
//! memory shared between processes (CUDA IPC, pool pointers) counted once,
//! for its exporter; stream-ordered pools; registered host memory; green
//! contexts. Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

/// The `share` scenario's two processes in a trace: (exporter, importer).
fn share_pids(t: &Trace) -> (u64, u64) {
    let exporter = t.of_type("export")[0]["pid"].as_u64().unwrap();
    let importer = t.of_type("import")[0]["pid"].as_u64().unwrap();
    assert_ne!(exporter, importer);
    (exporter, importer)
}

#[test]
fn ipc_and_pool_pointer_imports_map_the_exporters_allocations() {
    require_root();
    let t = trace_workload("share", &[("GPUMEM_WORKLOAD_HOLD_MS", "300")]);
    assert!(t.status.success(), "{}", t.stderr);
    let (exporter, importer) = share_pids(&t);
    let exports = t.of_type("export");
    let apis: Vec<&str> = exports.iter().map(|e| e["api"].as_str().unwrap()).collect();
    assert_eq!(apis, ["cuIpcGetMemHandle", "cuMemPoolExportPointer"]);
    assert_eq!(sizes(&exports), [64 * MIB, 6 * MIB], "the exported allocations' sizes");
    let imports = t.of_type("import");
    let apis: Vec<&str> = imports.iter().map(|e| e["api"].as_str().unwrap()).collect();
    assert_eq!(apis, ["cuIpcOpenMemHandle_v2", "cuMemPoolImportPointer"]);
    assert_eq!(sizes(&imports), [64 * MIB, 6 * MIB], "joined to the exporter's allocations by the handle bytes");
    assert_eq!(devices(&imports), [0, 0], "on the exporter's device");
    for i in &imports {
        assert_eq!(i["exporter"].as_u64(), Some(exporter), "{i:#}");
        assert_eq!(i["pid"].as_u64(), Some(importer));
    }
    let close = t.of_type("import_close");
    assert_eq!(sizes(&close), [64 * MIB]);
    // The imported pool pointer is freed with cuMemFree: a mapping going,
    // neither an untracked free nor memory of the importer's.
    let frees: Vec<&Value> = t.for_pid(importer).into_iter().filter(|e| e["type"] == "free").collect();
    assert_eq!(sizes(&frees), [0, MIB], "the imported pointer, then its own 1 MiB");
    let summary = t.summary_process(importer);
    assert_eq!(summary["untracked_frees"], 0, "{summary:#}");
    assert_eq!(api_stats(summary, "cuMemPoolImportPointer")["calls"], 1);
    // Nothing is left of either, and the importer never held the exporter's bytes.
    assert_nothing_live(&t, exporter);
    assert_nothing_live(&t, importer);
    assert_eq!(t.released_at_exit(importer), []);
    let pool = t.of_type("pool_create");
    assert_eq!((pool.len(), devices(&pool)), (1, vec![0]));
    assert_eq!(t.of_type("pool_trim").len(), 1);
    assert_eq!(t.of_type("pool_destroy")[0]["handle"], pool[0]["handle"]);
}

#[test]
fn leaks_break_a_process_down_by_owner_pool_and_imports_counted_once() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("share");
    let v = leaks(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "3", "-c", &cmd],
        &[("GPUMEM_WORKLOAD_HOLD_MS", "6000")],
    );
    let procs = v["processes"].as_array().unwrap();
    let on0 = |live: u64| {
        procs
            .iter()
            .find(|p| p["device"] == 0 && p["live_bytes"].as_u64() == Some(live))
            .unwrap_or_else(|| panic!("a process with {live} B on device 0: {v:#}"))
    };
    let exporter = on0(72 * MIB);
    let importer = on0(MIB);
    // The importer maps 70 MiB of the exporter's, beside its own 1 MiB, not in it.
    assert_eq!(importer["imported_bytes"].as_u64(), Some(70 * MIB), "{importer:#}");
    let from: Vec<(u64, &str, u64, u64)> = importer["imported"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["pid"].as_u64().unwrap(), i["via"].as_str().unwrap(), i["bytes"].as_u64().unwrap(), i["mappings"].as_u64().unwrap()))
        .collect();
    let epid = exporter["pid"].as_u64().unwrap();
    assert_eq!(from, [(epid, "ipc", 64 * MIB, 1), (epid, "pool_pointer", 6 * MIB, 1)]);
    assert_eq!(exporter["imported_bytes"].as_u64(), Some(0));
    // The exporter's pools: its own pool (6 MiB, trimmed once) and the default one (cuMemAllocAsync).
    let pools: Vec<(bool, u64, u64, u64)> = exporter["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pool"] == "default", p["bytes"].as_u64().unwrap(), p["allocations"].as_u64().unwrap(), p["trims"].as_u64().unwrap()))
        .collect();
    assert_eq!(pools, [(false, 6 * MIB, 1, 1), (true, 2 * MIB, 1, 0)], "{:#}", exporter["pools"]);
    // Every own byte has its owner, once.
    for p in [exporter, importer] {
        let owned: u64 = p["by_owner"].as_array().unwrap().iter().map(|o| o["bytes"].as_u64().unwrap()).sum();
        assert_eq!(Some(owned), p["live_bytes"].as_u64(), "{:#}", p["by_owner"]);
    }
}

#[test]
fn metrics_count_shared_memory_once_for_its_exporter() {
    require_root();
    let f = fixtures();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"], &[]);
    let (mut child, lines) = spawn_workload_watched("share", &[("GPUMEM_WORKLOAD_HOLD_MS", "30000")]);
    let exporter = child.id();
    let line = lines.wait_for("share: imported pid=", 20);
    let importer: u32 = line.rsplit('=').next().unwrap().trim().parse().unwrap();
    let series = |text: &str, name: &str, pid: u32| pid_series(text, name, pid);
    let text = poll(
        20,
        "the import in /metrics",
        || {
            let text = serve.metrics();
            (series(&text, "gpumem_process_imported_memory_bytes", importer) == Some((70 * MIB) as f64)).then_some(text)
        },
        || serve.metrics(),
    );
    assert_eq!(series(&text, "gpumem_process_memory_bytes", importer), Some(MIB as f64), "its own only");
    assert_eq!(series(&text, "gpumem_process_memory_bytes", exporter), Some((72 * MIB) as f64));
    assert_eq!(series(&text, "gpumem_process_imported_memory_bytes", exporter), None, "nothing imported: no series");
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("gpumem_process_memory_bytes{") && l.contains("gpu=\"0\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total, (73 * MIB) as f64, "summed over processes, each byte once");
    let pool = |name: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("gpumem_process_memory_by_pool_bytes{")
                    && l.contains(&format!("pid=\"{exporter}\""))
                    && l.contains(&format!("pool=\"{name}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(pool("default"), Some((2 * MIB) as f64), "{text}");
    let _ = std::process::Command::new("kill").arg(importer.to_string()).status();
    let _ = child.kill();
    let _ = child.wait();
    serve.stop();
}

#[test]
fn registered_host_memory_is_pinned_and_green_contexts_keep_their_device() {
    require_root();
    let t = trace_workload("register_green", &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    let pinned = t.of_type("host_alloc");
    assert_eq!(sizes(&pinned), [3 * MIB, MIB]);
    assert!(pinned.iter().all(|e| e["api"] == "cuMemHostRegister_v2"), "{pinned:#?}");
    let unpinned = t.of_type("host_free");
    assert_eq!((sizes(&unpinned), unpinned[0]["api"].as_str()), (vec![MIB], Some("cuMemHostUnregister")));
    let green = t.of_type("green_ctx_create");
    assert_eq!(devices(&green), [1]);
    let from = t.of_type("ctx_from_green");
    assert_eq!(devices(&from), [1]);
    let allocs = t.of_type("alloc");
    assert_eq!((sizes(&allocs), devices(&allocs)), (vec![5 * MIB], vec![1]), "in the green context's device, not device 0's");
    // Host memory is never VRAM: at exit only the green context's 5 MiB was on a device.
    assert_eq!(t.released_at_exit(pid), [(1, 5 * MIB, 1)]);
}

#[test]
fn nvls_shareable_handles_multicast_retains_and_graph_nodes_are_explained() {
    require_root();
    let t = trace_workload("nvls", &[("GPUMEM_WORKLOAD_HOLD_MS", "300")]);
    assert!(t.status.success(), "{}", t.stderr);
    let exports = t.of_type("handle_export");
    assert_eq!(sizes(&exports), [32 * MIB, 16 * MIB], "the exported handles' sizes");
    let exporter = exports[0]["pid"].as_u64().unwrap();
    let imports = t.of_type("handle_import");
    let importer = imports[0]["pid"].as_u64().unwrap();
    assert_eq!(imports[0]["exporter"].as_u64(), Some(exporter), "a fabric handle's bytes join the two");
    assert_eq!(imports[1]["exporter"], Value::Null, "a file descriptor's number does not");
    // The importer's maps of imported handles are imports, not maps without a create.
    let maps: Vec<&Value> = t.for_pid(importer).into_iter().filter(|e| e["type"] == "vmm_map").collect();
    assert_eq!(maps.len(), 2);
    assert_eq!(maps[0]["exporter"].as_u64(), Some(exporter), "{:#}", maps[0]);
    assert_eq!(t.summary_process(importer)["untracked_frees"], 0);
    // The exporter's retain and its release free nothing; the multicast
    // object's map is known; graph nodes declare, they do not hold.
    let retain = t.of_type("handle_retain");
    assert_eq!((retain.len(), retain[0]["pid"].as_u64()), (1, Some(exporter)));
    let mc = t.of_type("multicast_create");
    assert_eq!(sizes(&mc), [32 * MIB]);
    assert_eq!(sizes(&t.of_type("multicast_bind")), [32 * MIB]);
    let graph = t.of_type("graph_alloc");
    assert_eq!((sizes(&graph), devices(&graph)), (vec![8 * MIB, 2 * MIB], vec![0, 0]));
    assert_eq!(sizes(&t.of_type("graph_free")), [2 * MIB]);
    assert_eq!(sizes(&t.of_type("graph_destroy")), [8 * MIB], "the node left when the graph went");
    assert_eq!(devices(&t.of_type("graph_trim")), [0]);
    let releases: Vec<&Value> = t.for_pid(exporter).into_iter().filter(|e| e["type"] == "vmm_release").collect();
    assert_eq!(released(releases[0]), [], "the retain's release");
    assert_nothing_live(&t, exporter);
    assert_nothing_live(&t, importer);
}

#[test]
fn leaks_explain_an_nvls_exporter_and_importer() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("nvls");
    let v = leaks(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "3", "-c", &cmd],
        &[("GPUMEM_WORKLOAD_HOLD_MS", "6000")],
    );
    let procs = v["processes"].as_array().unwrap();
    let find = |live: u64| procs.iter().find(|p| p["live_bytes"].as_u64() == Some(live)).unwrap_or_else(|| panic!("{live} B: {v:#}"));
    let exporter = find(48 * MIB);
    let importer = find(MIB);
    assert_eq!(importer["imported_bytes"].as_u64(), Some(48 * MIB), "{importer:#}");
    let from: Vec<(Option<u64>, &str, u64)> = importer["imported"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["pid"].as_u64(), i["via"].as_str().unwrap(), i["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(from, [(exporter["pid"].as_u64(), "shareable_handle", 32 * MIB), (None, "shareable_handle", 16 * MIB)]);
    let g = &exporter["graph_pool"];
    assert_eq!(
        (g["bytes"].as_u64(), g["nodes"].as_u64(), g["graphs"].as_u64(), g["trims"].as_u64()),
        (Some(8 * MIB), Some(1), Some(1), Some(1)),
        "{g:#}"
    );
    let mc = exporter["multicast"].as_array().unwrap();
    assert_eq!(mc.len(), 1);
    assert_eq!(
        (mc[0]["size"].as_u64(), mc[0]["devices"].as_u64(), mc[0]["devices_added"].as_u64(), mc[0]["bound_bytes"].as_u64()),
        (Some(32 * MIB), Some(2), Some(1), Some(32 * MIB))
    );
}

#[test]
fn a_checkpointed_process_is_suspended_not_freed_and_comes_back() {
    require_root();
    let f = fixtures();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"], &[]);
    let (mut child, lines) = spawn_workload_watched("checkpoint", &[("GPUMEM_WORKLOAD_HOLD_MS", "4000")]);
    let pid = child.id();
    lines.wait_for("checkpoint: checkpointed pid=", 20);
    let text = poll(
        20,
        "the checkpoint in /metrics",
        || Some(serve.metrics()).filter(|t| pid_series(t, "gpumem_process_checkpointed", pid) == Some(1.0)),
        || serve.metrics(),
    );
    assert_eq!(pid_series(&text, "gpumem_process_memory_bytes", pid), Some((12 * MIB) as f64), "suspended, not freed");
    assert_eq!(pid_series(&text, "gpumem_process_leak_suspected", pid).unwrap_or(0.0), 0.0);
    lines.wait_for("checkpoint: restored", 20);
    poll(
        20,
        "the restore in /metrics",
        || Some(serve.metrics()).filter(|t| pid_series(t, "gpumem_process_checkpointed", pid).is_none()),
        || serve.metrics(),
    );
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    serve.stop();
}

/// The README's worked example ("Where did my VRAM go"), byte for byte.
#[test]
fn the_readme_trainer_is_explained_byte_for_byte() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("trainer");
    let libs = f.owner_libs.to_str().unwrap();
    let envs = [("GPUMEM_WORKLOAD_HOLD_MS", "6000"), ("GPUMEM_OWNER_LIBS", libs)];
    let v = leaks(&["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "3", "-c", &cmd], &envs);
    let procs = v["processes"].as_array().unwrap();
    let trainer = procs.iter().find(|p| p["live_bytes"].as_u64() == Some(448 * MIB)).unwrap_or_else(|| panic!("{v:#}"));
    let peer = procs.iter().find(|p| p["live_bytes"].as_u64() == Some(16 * MIB)).unwrap_or_else(|| panic!("{v:#}"));
    let owners: Vec<(&str, u64, u64, bool)> = trainer["by_owner"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["owner"].as_str().unwrap(),
                o["bytes"].as_u64().unwrap(),
                o["allocations"].as_u64().unwrap(),
                o["estimated"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [("workload", 288 * MIB, 3, false), ("libnccl.so.2", 128 * MIB, 2, false), ("libcublasLt.so.13", 32 * MIB, 1, false)],
        "the module that asked the driver, exact"
    );
    let pools: Vec<(bool, u64)> =
        trainer["pools"].as_array().unwrap().iter().map(|p| (p["pool"] == "default", p["bytes"].as_u64().unwrap())).collect();
    assert_eq!(pools, [(false, 24 * MIB), (true, 8 * MIB)]);
    assert_eq!(trainer["imported_bytes"].as_u64(), Some(16 * MIB));
    assert_eq!(trainer["imported"][0]["pid"], peer["pid"]);
    assert_eq!(trainer["imported"][0]["via"], "ipc");
    // The human report says the same.
    let out = run_gpumem(&["leaks", "--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "3", "-c", &cmd], &envs);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for line in [
        "by owner: workload 288.0 MiB, libnccl.so.2 128.0 MiB, libcublasLt.so.13 32.0 MiB",
        "pools (live allocations; what a pool keeps beyond them is the driver's): ",
        "imported 16.0 MiB (the exporters' memory, not in this process's bytes): 16.0 MiB from pid ",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
}
