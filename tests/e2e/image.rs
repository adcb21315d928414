//! The OCI image (`cargo xtask image`, target/image/gpumem-oci.tar): an OCI
//! image layout whose version tag is an image index of linux/amd64 and
//! linux/arm64 (read with skopeo as a registry client would; the arm64
//! image's binary run under qemu-aarch64 with only its own libraries).
//! umoci unpacks the amd64 one into a runtime bundle, holding the
//! binary, the libraries it links and /etc/passwd, nothing else; run with
//! runc, `gpumem --version` names this build and `gpumem status` attaches
//! its probes with exactly the DaemonSet's capabilities, host pid namespace
//! and read-only root and tracefs; `gpumem serve` in it traces a workload
//! on the host and one in a container of its own (pod, container, exact
//! bytes on /metrics, scraped from the host at the address of the agent's
//! own pod network: a network namespace and veth pair, as a CNI plugin
//! makes). Run as root, one test at a time.
use std::{path::Path, process::Command};

use gpumem_tests::*;
use serde_json::{json, Value};

/// What the DaemonSet adds (deploy/helm/gpumem), all other capabilities dropped.
const CAPS: [&str; 5] = ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"];

/// The archive extracted into a fresh directory: its OCI image layout.
fn layout(name: &str) -> std::path::PathBuf {
    let archive = target_dir().join(IMAGE_ARCHIVE);
    assert!(archive.exists(), "{} is missing: `cargo xtask test` builds it (`cargo xtask image`)", archive.display());
    let dir = target_dir().join("image-test").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    let (ok, _, err) = command_output(Command::new("tar").arg("xf").arg(&archive).arg("-C").arg(&layout));
    assert!(ok, "{err}");
    layout
}

/// One platform's image unpacked into a fresh bundle (rootfs and config.json).
fn unpack_platform(name: &str, arch: &str) -> std::path::PathBuf {
    let layout = layout(name);
    let bundle = layout.parent().unwrap().join("bundle");
    let image = format!("{}:{}", layout.display(), image_tag(arch));
    let (ok, _, err) = command_output(Command::new("umoci").args(["unpack", "--image", &image]).arg(&bundle));
    assert!(ok, "umoci unpack: {err}");
    bundle
}

/// The amd64 image (this machine's) unpacked into a fresh bundle.
fn unpack(name: &str) -> std::path::PathBuf {
    unpack_platform(name, "amd64")
}

/// Every file under `root`, relative to it, sorted.
fn files_under(root: &Path) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                files.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files
}

/// Runs `args` in the bundle as the DaemonSet runs the agent; (ok, stdout, stderr).
fn run_in(bundle: &Path, id: &str, args: &[&str]) -> (bool, String, String) {
    configure(bundle, args, &[], None);
    command_output(Command::new("runc").args(["run", "--bundle"]).arg(bundle).arg(id))
}

/// The bundle's config as the DaemonSet's pod: `args`, its capabilities,
/// the host's pid namespace, seccomp unconfined, a read-only root and
/// tracefs, and `binds` (host path, container path) writable; a network
/// namespace of its own, or the pod network `pod` made as a CNI plugin
/// would (no hostNetwork, as the chart runs it).
fn configure(bundle: &Path, args: &[&str], binds: &[(&Path, &str)], pod: Option<&PodNetwork>) {
    let path = bundle.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["process"]["terminal"] = json!(false);
    c["process"]["args"] = json!(args);
    // The DaemonSet's downward-API NODE_NAME.
    c["process"]["env"].as_array_mut().unwrap().push(json!("NODE_NAME=image-node"));
    c["process"]["capabilities"] = json!({"bounding": CAPS, "effective": CAPS, "permitted": CAPS});
    // hostPID: the host's pid namespace; seccomp Unconfined; read-only root and tracefs.
    let mut namespaces: Vec<Value> = c["linux"]["namespaces"].as_array().unwrap().iter().filter(|n| n["type"] != "pid").cloned().collect();
    if let Some(pod) = pod {
        namespaces.retain(|n| n["type"] != "network");
        namespaces.push(json!({"type": "network", "path": pod.path()}));
    }
    c["linux"]["namespaces"] = json!(namespaces);
    c["linux"].as_object_mut().unwrap().remove("seccomp");
    c["root"]["readonly"] = json!(true);
    let mounts = c["mounts"].as_array_mut().unwrap();
    mounts.push(json!({
        "destination": "/sys/kernel/tracing", "type": "bind", "source": "/sys/kernel/tracing", "options": ["rbind", "ro"]
    }));
    for (host, at) in binds {
        mounts.push(json!({"destination": at, "type": "bind", "source": host, "options": ["rbind", "rw"]}));
    }
    std::fs::write(&path, c.to_string()).unwrap();
}

#[test]
fn the_image_holds_the_binary_and_its_libraries_only_and_runs_status_with_the_daemonsets_capabilities() {
    require_root();
    let bundle = unpack("status");
    assert_eq!(
        files_under(&bundle.join("rootfs")),
        [
            "etc/group",
            "etc/passwd",
            "lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libgcc_s.so.1",
            "lib/x86_64-linux-gnu/libm.so.6",
            "lib64/ld-linux-x86-64.so.2",
            "usr/bin/gpumem"
        ],
        "no shell, no package manager"
    );
    let config: Value = serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["process"]["args"], json!(["/usr/bin/gpumem", "serve"]), "the entrypoint and command");

    let (ok, out, err) = run_in(&bundle, &format!("gpumem-image-v-{}", std::process::id()), &["/usr/bin/gpumem", "--version"]);
    assert!(ok, "{err}");
    let (_, ours, _) = command_output(Command::new(gpumem_bin()).arg("--version"));
    assert_eq!(out, ours, "the image's binary is this build");

    mount_tracefs();
    let (ok, out, err) = run_in(&bundle, &format!("gpumem-image-s-{}", std::process::id()), &["/usr/bin/gpumem", "status", "--no-daemon"]);
    assert!(ok, "gpumem status in the image: {out}{err}");
    for line in ["uprobes/uretprobes  yes", "sched:sched_process_exit     attached", "oom:mark_victim              attached"] {
        assert!(out.contains(line), "{line}: {out}");
    }
    assert!(out.contains("hooked"), "the host's processes are seen (hostPID): a loader is hooked: {out}");
    // No ld.so.cache in the image: said once, plainly; discovery goes through the processes.
    assert!(
        out.contains(
            "note: cannot read /etc/ld.so.cache: No such file or directory (os error 2); libcuda is found in the processes that map it"
        ),
        "{out}"
    );
    assert!(!out.contains("note: note:"), "{out}");
}

/// A blob of the layout, parsed.
fn blob(layout: &Path, digest: &Value) -> Value {
    let hex = digest.as_str().unwrap().strip_prefix("sha256:").unwrap();
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap()
}

#[test]
fn the_image_index_carries_amd64_and_arm64_and_the_arm64_image_runs_with_its_own_libraries() {
    let layout = layout("index");
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let tagged = |tag: &str| {
        let found = index["manifests"].as_array().unwrap().iter().find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag);
        found.unwrap_or_else(|| panic!("nothing tagged {tag}: {index:#}")).clone()
    };
    let version = tagged(env!("CARGO_PKG_VERSION"));
    assert_eq!(version["mediaType"], "application/vnd.oci.image.index.v1+json", "the version's tag is an image index: {version:#}");
    let platforms = blob(&layout, &version["digest"]);
    let listed: Vec<Value> = platforms["manifests"].as_array().unwrap().iter().map(|m| m["platform"].clone()).collect();
    assert_eq!(
        listed,
        [json!({"architecture": "amd64", "os": "linux"}), json!({"architecture": "arm64", "os": "linux", "variant": "v8"})],
        "{platforms:#}"
    );
    // As a registry client picks a node's platform from the index: skopeo (containers/image).
    let archive = format!("oci-archive:{}:{}", target_dir().join(IMAGE_ARCHIVE).display(), env!("CARGO_PKG_VERSION"));
    for (i, (arch, _)) in IMAGE_PLATFORMS.iter().enumerate() {
        let (ok, out, err) =
            command_output(Command::new("skopeo").args(["inspect", "--override-os", "linux", "--override-arch", arch, &archive]));
        assert!(ok, "skopeo inspect --override-arch {arch}: {err}");
        let seen: Value = serde_json::from_str(&out).unwrap();
        assert_eq!((&seen["Architecture"], &seen["Os"]), (&json!(arch), &json!("linux")), "{seen:#}");
        assert_eq!(seen["Digest"], version["digest"], "{seen:#}");
        // The platform's image, as the index lists it and its own tag names it.
        let listed = &platforms["manifests"][i]["digest"];
        assert_eq!(tagged(&image_tag(arch))["digest"], *listed);
        let manifest = blob(&layout, listed);
        let layers: Vec<&Value> = manifest["layers"].as_array().unwrap().iter().map(|l| &l["digest"]).collect();
        assert_eq!(seen["Layers"].as_array().unwrap().iter().collect::<Vec<_>>(), layers, "{arch}: {seen:#}");
        let config = blob(&layout, &manifest["config"]["digest"]);
        assert_eq!((&config["architecture"], &config["os"]), (&json!(arch), &json!("linux")), "{config:#}");
    }

    let bundle = unpack_platform("index-arm64", "arm64");
    let root = bundle.join("rootfs");
    assert_eq!(
        files_under(&root),
        [
            "etc/group",
            "etc/passwd",
            "lib/aarch64-linux-gnu/libc.so.6",
            "lib/aarch64-linux-gnu/libgcc_s.so.1",
            "lib/aarch64-linux-gnu/libm.so.6",
            "lib/ld-linux-aarch64.so.1",
            "usr/bin/gpumem"
        ],
        "the arm64 image: its binary and libraries only"
    );
    let (ok, header, _) = command_output(Command::new("readelf").arg("-h").arg(root.join("usr/bin/gpumem")));
    assert!(ok && header.contains("AArch64"), "{header}");
    // Run with nothing but the image's own loader and libraries (qemu-user, its root the image's).
    let (ok, out, err) =
        command_output(Command::new("qemu-aarch64").arg("-L").arg(&root).arg(root.join("usr/bin/gpumem")).arg("--version"));
    assert!(ok, "the arm64 image's gpumem under qemu-aarch64 -L its rootfs: {err}");
    let (_, ours, _) = command_output(Command::new(gpumem_bin()).arg("--version"));
    assert_eq!(out, ours, "the arm64 image's binary is this build");
}

/// The host's tracefs, which the pod mounts read-only (a fresh machine may not have it mounted).
fn mount_tracefs() {
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let (ok, _, err) = command_output(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]));
        assert!(ok, "mounting tracefs: {err}");
    }
}

#[test]
fn gpumem_serve_in_its_image_as_the_daemonset_runs_it_traces_the_host_exactly() {
    require_root();
    let steps = steps();
    let bundle = unpack("serve");
    let state = ServeState::new("image");
    let dirs = [state.state_dir.clone(), state.socket.parent().unwrap().join("image-run")];
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    steps.step("the agent in its image, on a pod network");
    // The pod's own network, its metrics port the chart's, scraped from the host.
    let network = PodNetwork::create();
    let port = 9400;
    let listen = format!("--listen=0.0.0.0:{port}");
    let pin = format!("--pin-dir={}", state.pin_dir.display());
    // The synthetic libcuda, seen through the host's root (hostPID): attached
    // at start, as the node's driver library is, so the first calls are traced.
    let f = fixtures();
    let libcuda = format!("--libcuda=/proc/{}/root{}", std::process::id(), f.libcuda.display());
    // An isolation action as the chart renders one, run without a shell
    // (the image has none) against an API server on the pod network's host end.
    let api = Receiver::answering_on(network.host_ip, Box::new(|_, _| (200, "{}".into())));
    std::fs::write(dirs[0].join("kube-token"), "image-token").unwrap();
    let cordon = format!("--action=cuda_oom=gpumem kube cordon --api-server {} --token-file /var/lib/gpumem/kube-token", api.url(""));
    let args = [
        "/usr/bin/gpumem",
        "serve",
        &listen,
        "--no-nvml",
        &libcuda,
        &pin,
        "--state-dir=/var/lib/gpumem",
        "--socket=/run/gpumem/gpumem.sock",
        &cordon,
    ];
    let binds = [(Path::new("/sys/fs/bpf"), "/sys/fs/bpf"), (dirs[0].as_path(), "/var/lib/gpumem"), (dirs[1].as_path(), "/run/gpumem")];
    configure(&bundle, &args, &binds, Some(&network));
    mount_tracefs();
    wait_for_detach();
    let id = format!("gpumem-image-serve-{}", std::process::id());
    let log = bundle.parent().unwrap().join("serve.log");
    let out = std::fs::File::create(bundle.parent().unwrap().join("serve.out")).unwrap();
    let container = Container::start(&bundle, &id, out.into(), std::fs::File::create(&log).unwrap().into());
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    poll(30, "the agent in the container to serve", || said().contains("gpumem: serving").then_some(()), || format!(": {}", said()));
    steps.step("a host workload, exact");
    // A workload on the host, its process found through the host's /proc (hostPID).
    let mut w = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "8000")]);
    let pid = w.id();
    let metrics = || http_get_from(network.pod_ip, port, "/metrics", None).map(|r| r.2).unwrap_or_default();
    let bytes = |text: &str| pid_series(text, "gpumem_process_memory_bytes", pid);
    poll(
        20,
        "the workload's exact bytes on /metrics, scraped at the pod's address",
        || (bytes(&metrics()) == Some((9 * MIB) as f64)).then_some(()),
        || format!(":\n{}\n{}", metrics(), said()),
    );
    w.kill().unwrap();
    w.wait().unwrap();
    steps.step("a CUDA OOM cordons the node");
    // A CUDA OOM on the host: the node is cordoned through the API.
    let mut oom = spawn_workload("oom", &[("GPUMEM_FAKE_CAPACITY", "67108864")]);
    oom.wait().unwrap();
    let patch = poll(20, "the cordon's PATCH from the image", || api.all().into_iter().next(), said);
    assert_eq!((patch.method.as_str(), patch.path.as_str()), ("PATCH", "/api/v1/nodes/image-node"), "{patch:?}");
    assert_eq!(patch.header("authorization"), Some("Bearer image-token"));
    assert_eq!(patch.json()["spec"]["unschedulable"], true);

    steps.step("a workload in a container");
    // A workload in a container of its own (a pod's, with its driver library
    // at a path only it sees), found by the agent in its container.
    let cid = container_id(0xe5);
    let wb = workload_bundle(
        "beside-gpumem",
        &format!("/kubepods/burstable/pod{POD_UID}/{cid}"),
        "late_load",
        &[("GPUMEM_WORKLOAD_HOLD_MS", "8000")],
    );
    let wid = format!("gpumem-image-workload-{}", std::process::id());
    let workload = Container::start(&wb, &wid, std::process::Stdio::null(), std::process::Stdio::null());
    let host_pid = workload.pid();
    let series = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("gpumem_process_memory_bytes{") && l.contains(&format!("pid=\"{host_pid}\"")))
            .map(str::to_string)
    };
    let line = poll(
        20,
        "the containerised workload's 4 MiB",
        || series(&metrics()).filter(|l| l.ends_with(&format!(" {}", 4 * MIB))),
        || format!(":\n{}\n{}", metrics(), said()),
    );
    for label in [format!("container=\"{cid}\""), format!("pod=\"{POD_NAME}\""), format!("namespace=\"{NAMESPACE}\"")] {
        assert!(line.contains(&label), "{label}: {line}");
    }
    drop(workload);
    drop(container);
    assert!(state.pin_dir.exists() && !gpumem_programs().is_empty(), "SIGTERM leaves the probes pinned");
    let stacks = dirs[0].join("stacks.jsonl");
    assert!(stacks.exists(), "the agent kept its symbolized stacks for the next one");
    uninstall_mode_cleans_the_node(&bundle, &state, &binds, &network);
    assert!(!stacks.exists(), "the kept stacks removed");
    state.remove();
}

/// The chart's uninstall mode (`--set cleanupNodes=true`), its container's
/// command and args as `helm template` renders them, run from the image on
/// this node: every pinned link and map goes, the pod then waits (so
/// `kubectl rollout status` says when all nodes are clean) and stops at SIGTERM.
fn uninstall_mode_cleans_the_node(bundle: &Path, state: &ServeState, binds: &[(&Path, &str)], network: &PodNetwork) {
    let values = format!("cleanupNodes=true,continuity.pinDir={},continuity.stateDir=/var/lib/gpumem", state.pin_dir.display());
    let (ok, rendered, err) =
        command_output(Command::new(helm()).args(["template", "gpumem", "deploy/helm/gpumem", "--set", &values]).current_dir(workspace()));
    assert!(ok, "helm template: {err}");
    let ds = serde_yaml_ng::Deserializer::from_str(&rendered)
        .map(|d| <serde_yaml_ng::Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert!(c["livenessProbe"].is_null() && c["readinessProbe"].is_null(), "nothing listens in uninstall mode: {c:?}");
    let words = |v: &serde_yaml_ng::Value| v.as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let argv: Vec<String> = words(&c["command"]).into_iter().chain(words(&c["args"])).collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    configure(bundle, &argv, binds, Some(network));
    let log = bundle.parent().unwrap().join("cleanup.log");
    let id = format!("gpumem-image-cleanup-{}", std::process::id());
    let cleaner = Container::start(bundle, &id, std::process::Stdio::null(), std::fs::File::create(&log).unwrap().into());
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    poll(30, "uninstall mode to clean up and wait", || said().contains("waiting for SIGTERM").then_some(()), || format!(": {}", said()));
    assert!(said().contains("links detached"), "{}", said());
    assert!(!state.pin_dir.exists(), "nothing pinned is left: {}", said());
    poll(10, "every probe detached", || gpumem_programs().is_empty().then_some(()), || format!(": {:?}", gpumem_programs()));
    let (_, st, _) = command_output(Command::new("runc").args(["state", &id]));
    assert!(st.contains("\"running\""), "the pod stays up after cleaning: {st}");
    let (ok, _, err) = command_output(Command::new("runc").args(["kill", &id, "TERM"]));
    assert!(ok, "runc kill: {err}");
    let stopped = || command_output(Command::new("runc").args(["state", &id])).1.contains("\"stopped\"");
    poll(10, "uninstall mode to stop at SIGTERM", || stopped().then_some(()), String::new);
    drop(cleaner);
}
