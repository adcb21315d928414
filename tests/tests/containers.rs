//! Workloads in real containers made by runc (`runc spec` bundles): their
//! own pid and mount namespaces, the host's libraries bound read-only, the
//! synthetic libcuda at a path only the container sees (a copy in its root:
//! an inode of its own, found through /proc/PID/maps and /proc/PID/root),
//! the pod's name in /etc/hostname and its namespace in the service-account
//! volume, and a `cgroupsPath` in the kubepods shape of the cgroupfs driver
//! and of the systemd driver's slices (runc's cgroupfs driver makes both on
//! this host's cgroup v1 hierarchy; no systemd runs here). Container id, pod
//! UID, QoS class, `ns_pid` and exact bytes are checked for each, for a
//! container that exits, and for two containers of one pod. Run as root,
//! one test at a time.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use gpumem_tests::*;
use serde_json::{json, Value};

const POD_UID: &str = "7c2d3e4f-5061-4b2c-8d3e-4f5a6b7c8d9e";
const POD_NAME: &str = "trainer-5c8d-q7w";
const NAMESPACE: &str = "ml-team";

/// A 64-hex container id, distinct per `n`.
fn container_id(n: u8) -> String {
    format!("{:02x}", n).repeat(32)
}

/// A bundle for one container running the workload's `scenario`, in `cgroups_path`.
fn bundle(name: &str, cgroups_path: &str, scenario: &str) -> PathBuf {
    let f = fixtures();
    let dir = target_dir().join("runc").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("rootfs");
    for d in ["usr", "lib", "lib64", "bin", "proc", "dev", "sys", "tmp", "opt/nvidia", "etc", "run/secrets/kubernetes.io/serviceaccount"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    // What the kubelet gives a pod's containers; the driver library only the container sees.
    std::fs::write(root.join("etc/hostname"), format!("{POD_NAME}\n")).unwrap();
    std::fs::write(root.join("run/secrets/kubernetes.io/serviceaccount/namespace"), NAMESPACE).unwrap();
    std::fs::copy(&f.libcuda, root.join("opt/nvidia/libcuda.so.1")).unwrap();
    std::fs::copy(&f.workload, root.join("opt/workload")).unwrap();
    let out = Command::new("runc").args(["spec", "--bundle"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "runc spec: {}", String::from_utf8_lossy(&out.stderr));
    let path = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["root"] = json!({"path": root, "readonly": true});
    c["hostname"] = json!(POD_NAME);
    c["process"]["terminal"] = json!(false);
    c["process"]["args"] = json!(["/opt/workload", "/opt/nvidia/libcuda.so.1", scenario]);
    c["process"]["env"] = json!(["PATH=/usr/bin:/bin", "GPUMEM_WORKLOAD_DELAY_MS=1000", "GPUMEM_WORKLOAD_HOLD_MS=1500"]);
    c["linux"]["cgroupsPath"] = json!(cgroups_path);
    let mounts = c["mounts"].as_array_mut().unwrap();
    for lib in ["/usr", "/lib", "/lib64", "/bin"] {
        if Path::new(lib).exists() {
            mounts.push(json!({"destination": lib, "type": "bind", "source": lib, "options": ["rbind", "ro"]}));
        }
    }
    std::fs::write(&path, c.to_string()).unwrap();
    dir
}

/// `runc run` of a bundle in the foreground, as a shell command.
fn run_cmd(bundle: &Path, id: &str) -> String {
    format!("runc run --bundle {} {id}", bundle.display())
}

/// The process of the container's allocations, checked: its two allocations
/// (8 MiB freed, 4 MiB held at exit) in `container` of the test pod, pid 1
/// in its namespace; the summary's process, QoS `qos`.
fn check(t: &Trace, container: &str, qos: &str) {
    let allocs: Vec<&Value> = t.of_type("alloc").into_iter().filter(|e| e["container"] == container).collect();
    let sizes: Vec<u64> = allocs.iter().map(|e| e["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [8 * MIB, 4 * MIB], "{container}: {:#?}\n{}", t.events, t.stderr);
    for e in &allocs {
        assert_eq!((e["pod_uid"].as_str(), e["ns_pid"].as_u64()), (Some(POD_UID), Some(1)), "{e}");
        assert_eq!((e["pod"].as_str(), e["namespace"].as_str()), (Some(POD_NAME), Some(NAMESPACE)), "{e}");
        assert_ne!(e["pid"], 1, "the host's pid, not the container's: {e}");
    }
    let p = t.summary_process(allocs[0]["pid"].as_u64().unwrap());
    assert_eq!((p["container"].as_str(), p["qos"].as_str()), (Some(container), Some(qos)), "{p:#}");
    // It exited holding the 4 MiB: released implicitly, and said.
    let exit = t.of_type("exit").into_iter().find(|e| e["pid"] == allocs[0]["pid"]).unwrap_or_else(|| panic!("{:#?}", t.events));
    assert_eq!((exit["size"].as_u64(), exit["released"][0]["bytes"].as_u64()), (Some(4 * MIB), Some(4 * MIB)), "{exit}");
    assert_eq!(exit["container"], container, "{exit}");
}

fn trace_containers(script: &str) -> Trace {
    let t = trace(&["-c", script], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    t
}

#[test]
fn a_runc_container_in_a_cgroupfs_kubepods_path_is_attributed_exactly() {
    require_root();
    let id = container_id(0xa1);
    let b = bundle("cgroupfs", &format!("/kubepods/burstable/pod{POD_UID}/{id}"), "late_load");
    let t = trace_containers(&run_cmd(&b, &format!("gpumem-test-{}", &id[..12])));
    check(&t, &id, "burstable");
}

#[test]
fn a_runc_container_in_a_systemd_shaped_slice_is_attributed_exactly() {
    require_root();
    let id = container_id(0xb2);
    let uid = POD_UID.replace('-', "_");
    let path = format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{id}.scope");
    let b = bundle("systemd", &path, "late_load");
    let t = trace_containers(&run_cmd(&b, &format!("gpumem-test-{}", &id[..12])));
    check(&t, &id, "besteffort");
}

#[test]
fn two_containers_of_one_pod_are_told_apart() {
    require_root();
    let (one, two) = (container_id(0xc3), container_id(0xd4));
    let b1 = bundle("pod-one", &format!("/kubepods/pod{POD_UID}/{one}"), "late_load");
    let b2 = bundle("pod-two", &format!("/kubepods/pod{POD_UID}/{two}"), "late_load");
    let script = format!("{} & {} & wait", run_cmd(&b1, "gpumem-test-one"), run_cmd(&b2, "gpumem-test-two"));
    let t = trace_containers(&script);
    check(&t, &one, "guaranteed");
    check(&t, &two, "guaranteed");
}
