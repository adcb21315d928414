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
use std::path::Path;

use gpumem_tests::*;
use serde_json::Value;

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
    let b = workload_bundle("cgroupfs", &format!("/kubepods/burstable/pod{POD_UID}/{id}"), "late_load", &[]);
    let t = trace_containers(&run_cmd(&b, &format!("gpumem-test-{}", &id[..12])));
    check(&t, &id, "burstable");
}

#[test]
fn a_runc_container_in_a_systemd_shaped_slice_is_attributed_exactly() {
    require_root();
    let id = container_id(0xb2);
    let uid = POD_UID.replace('-', "_");
    let path = format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{id}.scope");
    let b = workload_bundle("systemd", &path, "late_load", &[]);
    let t = trace_containers(&run_cmd(&b, &format!("gpumem-test-{}", &id[..12])));
    check(&t, &id, "besteffort");
}

#[test]
fn two_containers_of_one_pod_are_told_apart() {
    require_root();
    let (one, two) = (container_id(0xc3), container_id(0xd4));
    let b1 = workload_bundle("pod-one", &format!("/kubepods/pod{POD_UID}/{one}"), "late_load", &[]);
    let b2 = workload_bundle("pod-two", &format!("/kubepods/pod{POD_UID}/{two}"), "late_load", &[]);
    let script = format!("{} & {} & wait", run_cmd(&b1, "gpumem-test-one"), run_cmd(&b2, "gpumem-test-two"));
    let t = trace_containers(&script);
    check(&t, &one, "guaranteed");
    check(&t, &two, "guaranteed");
}

#[test]
fn a_container_whose_ld_so_cache_is_garbage_is_attributed_exactly() {
    require_root();
    // The container's own /etc/ld.so.cache, random bytes behind a real
    // magic (the dynamic loader inside ignores what it cannot use): the
    // agent reads libraries from the container's maps by inode, never from
    // its cache, and stays exact.
    let id = container_id(0xc3);
    let b = workload_bundle("garbage-ld-cache", &format!("/kubepods/burstable/pod{POD_UID}/{id}"), "late_load", &[]);
    let mut garbage = b"glibc-ld.so.cache1.1".to_vec();
    garbage.extend((0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8));
    std::fs::write(b.join("rootfs/etc/ld.so.cache"), garbage).unwrap();
    let t = trace_containers(&run_cmd(&b, &format!("gpumem-test-{}", &id[..12])));
    check(&t, &id, "burstable");
}
