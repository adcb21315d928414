//! NVIDIA driver ioctls through the stand-in device: RM and UVM calls decoded
//! exactly, descriptors seeded from /proc, the path chosen and why.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

const FAKE_NVIDIA_DEV: &str = env!("CARGO_BIN_EXE_fake_nvidia_dev");

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// `h1=0x.. h2=0x.. device=0x..` from the client's stderr.
fn client_handles(stderr: &str) -> (u64, u64, u64) {
    let line = stderr.lines().find(|l| l.contains("h1=")).unwrap_or_else(|| panic!("no handles in {stderr}"));
    let get = |k: &str| {
        u64::from_str_radix(line.split(k).nth(1).unwrap().split_whitespace().next().unwrap().trim_start_matches("0x"), 16).unwrap()
    };
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
    assert_eq!(
        (p["rm_memory_bytes"].as_u64(), p["rm_memory_objects"].as_u64(), p["uvm_mapped_bytes"].as_u64()),
        (Some(64 * MIB), Some(1), Some(0))
    );
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
    // Both nodes open before the agent starts (what it seeds from /proc).
    let open_nodes = || {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", client.id())).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
        fds.iter().filter_map(|e| std::fs::read_link(e.path()).ok()).filter(|t| t.starts_with(&dev.dir)).count()
    };
    poll(10, "the client's two NVIDIA descriptors", || (open_nodes() >= 2).then_some(()), String::new);
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
