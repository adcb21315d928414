//! Out of memory: CUDA OOMs (and fragmentation), host OOM kills in a memory cgroup.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;

#[test]
fn cuda_oom_with_enough_reported_free_is_fragmentation() {
    require_root();
    let limit = (256 * MIB).to_string();
    let t = trace_workload("fragmented", &[("GPUMEM_FAKE_MAX_CONTIGUOUS", &limit), ("GPUMEM_WORKLOAD_HOLD_MS", "300")]);
    let infos = t.of_type("mem_info");
    assert_eq!(sizes(&infos), [1024 * MIB, 224 * MIB], "free bytes read from cuMemGetInfo_v2");
    let ooms = t.of_type("cuda_oom");
    assert_eq!(ooms.len(), 2);
    assert_eq!(
        (ooms[0]["size"].as_u64(), ooms[0]["reported_free"].as_u64(), ooms[0]["fragmentation"].as_bool()),
        (Some(512 * MIB), Some(1024 * MIB), Some(true))
    );
    assert_eq!(
        (ooms[1]["size"].as_u64(), ooms[1]["reported_free"].as_u64(), ooms[1]["fragmentation"].as_bool()),
        (Some(240 * MIB), Some(224 * MIB), Some(false))
    );
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
    // Its host holdings beside the GPU ones: resident and swap as /proc had
    // them when it was chosen (null when it was already gone), pinned memory.
    assert_eq!(k["pinned_host_bytes"], 0, "{k}");
    assert!(k["host_resident_bytes"].is_null() || k["host_resident_bytes"].as_u64().unwrap() > 32 * MIB, "{k}");
    assert!(k.as_object().unwrap().contains_key("host_swap_bytes"), "{k}");
    // Then the kill's exit releases the GPU memory.
    assert_eq!(t.released_at_exit(pid), [(0, 100 * MIB, 1)]);
    assert_eq!(t.summary["oom"]["host_oom_kills"], 1);
}
