//! Containers and Kubernetes pods from cgroup paths (v1 cgroupfs, v2 systemd).
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;

const TEST_POD_UID: &str = "6b1c2d3e-4f50-4a1b-9c2d-3e4f5a6b7c8d";

const TEST_POD_NAME: &str = "trainer-7d9f-x2x";

const TEST_NAMESPACE: &str = "ml-team";

const TEST_CONTAINER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

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

#[test]
fn kubernetes_pod_and_container_from_cgroup_v1_cgroupfs() {
    require_root();
    let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory/kubepods/burstable/pod{TEST_POD_UID}/{TEST_CONTAINER}"));
    let t = trace_in_cgroup(&dir);
    let allocs = allocs_in_the_test_container(&t);
    for e in &allocs {
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
    allocs_in_the_test_container(&t);
}

/// The workload's two allocations, each attributed to the test pod and container.
fn allocs_in_the_test_container(t: &Trace) -> Vec<&serde_json::Value> {
    let allocs = t.of_type("alloc");
    assert_eq!(allocs.len(), 2);
    for e in &allocs {
        assert_eq!(e["pod_uid"], TEST_POD_UID, "{e}");
        assert_eq!(e["container"], TEST_CONTAINER, "{e}");
    }
    allocs
}
