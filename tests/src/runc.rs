//! Containers made by runc for the tests: a workload in a bundle shaped as
//! a Kubernetes pod's container (see tests/tests/containers.rs).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{json, Value};

use crate::{fixtures, target_dir};

pub const POD_UID: &str = "7c2d3e4f-5061-4b2c-8d3e-4f5a6b7c8d9e";
pub const POD_NAME: &str = "trainer-5c8d-q7w";
pub const NAMESPACE: &str = "ml-team";

/// A 64-hex container id, distinct per `n`.
pub fn container_id(n: u8) -> String {
    format!("{:02x}", n).repeat(32)
}

/// A bundle for one container running the workload's `scenario`, in
/// `cgroups_path`, with `envs` (the workload waits 1 s after loading the
/// library and holds 1.5 s before it exits, unless told otherwise).
pub fn workload_bundle(name: &str, cgroups_path: &str, scenario: &str, envs: &[(&str, &str)]) -> PathBuf {
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
    let mut vars: Vec<(&str, &str)> = vec![("GPUMEM_WORKLOAD_DELAY_MS", "1000"), ("GPUMEM_WORKLOAD_HOLD_MS", "1500")];
    for &(k, v) in envs {
        vars.retain(|(e, _)| *e != k);
        vars.push((k, v));
    }
    let env: Vec<String> = std::iter::once("PATH=/usr/bin:/bin".to_string()).chain(vars.iter().map(|(k, v)| format!("{k}={v}"))).collect();
    c["process"]["env"] = json!(env);
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

/// A pod's network as a CNI plugin makes one: a network namespace
/// (`ip netns`) with one end of a veth pair, the other end on the host, a
/// /30 between them. Removed (namespace and pair) when dropped.
pub struct PodNetwork {
    pub name: String,
    pub host_ip: std::net::Ipv4Addr,
    pub pod_ip: std::net::Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("iproute2's ip (cargo xtask setup installs it)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl PodNetwork {
    pub fn create() -> PodNetwork {
        let n = std::process::id() % 64;
        let name = format!("gpumem-pod-{}", std::process::id());
        let (host_ip, pod_ip) = (std::net::Ipv4Addr::new(10, 213, n as u8, 1), std::net::Ipv4Addr::new(10, 213, n as u8, 2));
        let (host_end, pod_end) = (format!("gpmh{n}"), format!("gpmp{n}"));
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let _ = Command::new("ip").args(["link", "del", &host_end]).output();
        ip(&["netns", "add", &name]);
        ip(&["link", "add", &host_end, "type", "veth", "peer", "name", &pod_end]);
        ip(&["link", "set", &pod_end, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_end]);
        ip(&["link", "set", &host_end, "up"]);
        ip(&["-n", &name, "addr", "add", &format!("{pod_ip}/30"), "dev", &pod_end]);
        ip(&["-n", &name, "link", "set", &pod_end, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        PodNetwork { name, host_ip, pod_ip }
    }

    /// The namespace's path, for a runtime spec's `linux.namespaces`.
    pub fn path(&self) -> PathBuf {
        Path::new("/var/run/netns").join(&self.name)
    }
}

impl Drop for PodNetwork {
    /// Deleting the namespace deletes the veth pair with it.
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// A container run detached from a bundle; killed and deleted on drop.
pub struct Container {
    pub id: String,
}

impl Container {
    /// `runc run --detach`, the container's stdout and stderr to these.
    pub fn start(bundle: &Path, id: &str, stdout: std::process::Stdio, stderr: std::process::Stdio) -> Container {
        let (ok, _, err) = crate::command_output(
            Command::new("runc")
                .args(["run", "--detach", "--bundle"])
                .arg(bundle)
                .arg(id)
                .stdin(std::process::Stdio::null())
                .stdout(stdout)
                .stderr(stderr),
        );
        assert!(ok, "runc run: {err}");
        Container { id: id.to_string() }
    }

    /// Its process's host pid.
    pub fn pid(&self) -> u32 {
        let (_, state, _) = crate::command_output(Command::new("runc").args(["state", &self.id]));
        serde_json::from_str::<Value>(&state).unwrap()["pid"].as_u64().unwrap() as u32
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("runc").args(["kill", &self.id, "TERM"]).output();
        // It stops on SIGTERM (its state says so); one that does not is killed by the forced delete.
        let state = || crate::command_output(Command::new("runc").args(["state", &self.id])).1;
        let stopped = || state().is_empty() || state().contains("\"stopped\"");
        let _ = crate::try_poll(5, || stopped().then_some(()));
        let _ = Command::new("runc").args(["delete", "--force", &self.id]).output();
    }
}
