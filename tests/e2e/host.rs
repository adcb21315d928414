//! The host side of traced processes, from `gpumem serve`'s /metrics: a
//! process's resident and swapped-out host memory against its
//! /proc/PID/status, the node's swap counters against /proc/vmstat, and a
//! runc container's memory cgroup (usage and limit) against cgroupfs. Run
//! as root, one test at a time.
use gpumem_tests::*;

fn status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status.lines().find_map(|l| l.strip_prefix(key)).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
    kib * 1024
}

#[test]
fn host_resident_and_swap_bytes_of_a_traced_process_match_proc_within_a_page() {
    require_root();
    let f = fixtures();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--milestones"], &[]);
    let mut w = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "12000")]);
    let pid = w.id();
    // Its allocations are done and it sleeps: its resident memory stays put.
    poll(
        10,
        "the workload's 9 MiB",
        || (pid_series(&serve.metrics(), "gpumem_process_memory_bytes", pid) == Some((9 * MIB) as f64)).then_some(()),
        || serve.metrics(),
    );
    // The next reading of the host memory (every 5 s) has the traced process.
    let traced = serve.stderr().mark();
    serve.stderr().wait_after(traced, "milestone host-reading", 10);
    let m = serve.metrics();
    let resident = pid_series(&m, "gpumem_process_host_resident_bytes", pid).unwrap_or_else(|| panic!("no host series: {m}")) as u64;
    let swap = pid_series(&m, "gpumem_process_host_swap_bytes", pid).unwrap() as u64;
    let page = 4096;
    assert!(resident.abs_diff(status_bytes(pid, "VmRSS:")) <= page, "resident {resident} vs /proc {}", status_bytes(pid, "VmRSS:"));
    assert!(swap.abs_diff(status_bytes(pid, "VmSwap:")) <= page, "swap {swap} vs /proc {}", status_bytes(pid, "VmSwap:"));
    assert!(resident > MIB, "{resident}");
    // The node's swap traffic, as /proc/vmstat counts it (read after: never less).
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap();
    let pages = |k: &str| vmstat.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.parse::<u64>().ok()).unwrap();
    let swap_in = sample(&m, "gpumem_host_swap_in_bytes_total").unwrap() as u64;
    let swap_out = sample(&m, "gpumem_host_swap_out_bytes_total").unwrap() as u64;
    assert!(swap_in <= pages("pswpin") * page && swap_out <= pages("pswpout") * page, "{swap_in} {swap_out}");
    assert_eq!(swap_in % page, 0);
    w.kill().unwrap();
    w.wait().unwrap();
    serve.stop();
}

#[test]
fn a_containers_memory_cgroup_usage_and_limit_are_exported_with_its_pod() {
    require_root();
    let f = fixtures();
    let cid = container_id(0x4c);
    let cgroup = format!("/kubepods/burstable/pod{POD_UID}/{cid}");
    let bundle = workload_bundle("memory-limit", &cgroup, "late_load", &[("GPUMEM_WORKLOAD_HOLD_MS", "12000")]);
    // A 256 MiB limit, as the kubelet sets a container's resources.limits.memory.
    let config = bundle.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["linux"]["resources"] = serde_json::json!({"memory": {"limit": 256 * MIB}});
    std::fs::write(&config, c.to_string()).unwrap();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"], &[]);
    let id = format!("gpumem-host-{}", std::process::id());
    let container = Container::start(&bundle, &id, std::process::Stdio::null(), std::process::Stdio::null());
    let line = |m: &str, family: &str| {
        m.lines().find(|l| l.starts_with(family) && l.contains(&format!("container=\"{cid}\""))).map(str::to_string)
    };
    let m = poll(
        20,
        "the container's memory cgroup on /metrics",
        || Some(serve.metrics()).filter(|m| line(m, "gpumem_container_memory_limit_bytes{").is_some()),
        || serve.metrics(),
    );
    let limit = line(&m, "gpumem_container_memory_limit_bytes{").unwrap();
    assert!(limit.ends_with(&format!(" {}", 256 * MIB)), "{limit}");
    for label in [format!("pod=\"{POD_NAME}\""), format!("namespace=\"{NAMESPACE}\""), format!("cgroup=\"{cgroup}\"")] {
        assert!(limit.contains(&label), "{label}: {limit}");
    }
    let usage: u64 = line(&m, "gpumem_container_memory_usage_bytes{").unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    let on_disk: u64 =
        std::fs::read_to_string(format!("/sys/fs/cgroup/memory{cgroup}/memory.usage_in_bytes")).unwrap().trim().parse().unwrap();
    assert!(usage > 0 && usage.abs_diff(on_disk) < 4 * MIB, "usage {usage} vs cgroupfs {on_disk}");
    // The containerised process's own host series carries its pod.
    let pid = container.pid();
    assert!(pid_series(&m, "gpumem_process_host_resident_bytes", pid).is_some_and(|r| r > 0.0), "{m}");
    drop(container);
    serve.stop();
}

/// GPU memory limits from cgroup v2's dmem controller. This kernel has no
/// such controller (and the synthetic driver registers no region), so the
/// dmem files are laid out as the kernel writes them under a cgroup v2 root
/// given with GPUMEM_CGROUP2_ROOT, for a real process in a real cgroup of
/// that path; `status` on the real hierarchy says it is not available.
#[test]
fn a_cgroups_gpu_memory_usage_and_limit_come_from_dmem_files() {
    require_root();
    let f = fixtures();
    let real_root = if std::path::Path::new("/sys/fs/cgroup/unified").is_dir() { "/sys/fs/cgroup/unified" } else { "/sys/fs/cgroup" };
    let name = format!("gpumem-dmem-{}", std::process::id());
    let real = format!("{real_root}/{name}");
    std::fs::create_dir_all(&real).unwrap();
    let fake_root = target_dir().join("gpumem-fixtures/dmem-root");
    let fake = fake_root.join(&name);
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake_root.join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc dmem\n").unwrap();
    std::fs::write(fake.join("dmem.current"), format!("drm/0000:11:00.0/vram0 {}\n", 48 * MIB)).unwrap();
    std::fs::write(fake.join("dmem.max"), format!("drm/0000:11:00.0/vram0 {}\n", 64 * MIB)).unwrap();
    std::fs::write(fake.join("dmem.low"), "drm/0000:11:00.0/vram0 0\n").unwrap();
    let root_env = ("GPUMEM_CGROUP2_ROOT", fake_root.to_str().unwrap());
    let serve =
        Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"], &[root_env]);
    let script = format!("echo $$ > {real}/cgroup.procs && exec {}", workload_cmd("hold"));
    let mut child = std::process::Command::new("sh").args(["-c", &script]).env("GPUMEM_WORKLOAD_HOLD_MS", "30000").spawn().unwrap();
    let line =
        |m: &str, family: &str| m.lines().find(|l| l.starts_with(family) && l.contains(&format!("cgroup=\"/{name}\""))).map(str::to_string);
    let m = poll(
        30,
        "the cgroup's GPU memory on /metrics",
        || Some(serve.metrics()).filter(|m| line(m, "gpumem_container_gpu_memory_limit_bytes{").is_some()),
        || serve.metrics(),
    );
    let limit = line(&m, "gpumem_container_gpu_memory_limit_bytes{").unwrap();
    let usage = line(&m, "gpumem_container_gpu_memory_usage_bytes{").unwrap();
    assert!(limit.ends_with(&format!(" {}", 64 * MIB)) && usage.ends_with(&format!(" {}", 48 * MIB)), "{limit}\n{usage}");
    // The region's GPU by its PCI bus id (the synthetic NVML's GPU 1 is at 00000000:11:00.0).
    assert!(limit.contains("region=\"drm/0000:11:00.0/vram0\"") && limit.contains("gpu=\"1\""), "{limit}");
    // A new usage is read at the next refresh; `max` is no limit.
    std::fs::write(fake.join("dmem.current"), format!("drm/0000:11:00.0/vram0 {}\n", 50 * MIB)).unwrap();
    std::fs::write(fake.join("dmem.max"), "drm/0000:11:00.0/vram0 max\n").unwrap();
    poll(
        30,
        "the new usage, and no limit",
        || {
            let m = serve.metrics();
            let usage = line(&m, "gpumem_container_gpu_memory_usage_bytes{")?;
            (usage.ends_with(&format!(" {}", 50 * MIB)) && line(&m, "gpumem_container_gpu_memory_limit_bytes{").is_none()).then_some(())
        },
        || serve.metrics(),
    );
    let _ = child.kill();
    let _ = child.wait();
    serve.stop();
    let _ = std::fs::remove_dir(&real);
    // Where the kernel has no dmem controller, status says so.
    let out = run_gpumem(&["status", "--json", "--no-discover"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let limits = v["gpu_memory_limits"].as_str().unwrap();
    let has_dmem = std::fs::read_to_string(format!("{real_root}/cgroup.controllers")).unwrap().split_whitespace().any(|c| c == "dmem");
    assert_eq!(limits.contains("not available"), !has_dmem, "{limits}");
}
