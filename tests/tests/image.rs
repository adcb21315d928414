//! The OCI image (`cargo xtask image`, target/image/gpumem-oci.tar): an OCI
//! image layout that umoci unpacks into a runtime bundle, holding the
//! binary, the libraries it links and /etc/passwd, nothing else; run with
//! runc, `gpumem --version` names this build and `gpumem status` attaches
//! its probes with exactly the DaemonSet's capabilities, host pid namespace
//! and read-only root and tracefs. Run as root, one test at a time.
use std::{path::Path, process::Command};

use gpumem_tests::*;
use serde_json::{json, Value};

/// What the DaemonSet adds (deploy/helm/gpumem), all other capabilities dropped.
const CAPS: [&str; 5] = ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"];

fn output(cmd: &mut Command) -> (bool, String, String) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The image unpacked into a fresh bundle (rootfs and config.json).
fn unpack(name: &str) -> std::path::PathBuf {
    let archive = target_dir().join(IMAGE_ARCHIVE);
    assert!(archive.exists(), "{} is missing: `cargo xtask test` builds it (`cargo xtask image`)", archive.display());
    let dir = target_dir().join("image-test").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    let (ok, _, err) = output(Command::new("tar").arg("xf").arg(&archive).arg("-C").arg(&layout));
    assert!(ok, "{err}");
    let bundle = dir.join("bundle");
    let image = format!("{}:{}", layout.display(), env!("CARGO_PKG_VERSION"));
    let (ok, _, err) = output(Command::new("umoci").args(["unpack", "--image", &image]).arg(&bundle));
    assert!(ok, "umoci unpack: {err}");
    bundle
}

/// Runs `args` in the bundle as the DaemonSet runs the agent; (ok, stdout, stderr).
fn run_in(bundle: &Path, id: &str, args: &[&str]) -> (bool, String, String) {
    let path = bundle.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["process"]["terminal"] = json!(false);
    c["process"]["args"] = json!(args);
    c["process"]["capabilities"] = json!({"bounding": CAPS, "effective": CAPS, "permitted": CAPS});
    // hostPID: the host's pid namespace; seccomp Unconfined; read-only root and tracefs.
    let namespaces: Vec<Value> = c["linux"]["namespaces"].as_array().unwrap().iter().filter(|n| n["type"] != "pid").cloned().collect();
    c["linux"]["namespaces"] = json!(namespaces);
    c["linux"].as_object_mut().unwrap().remove("seccomp");
    c["root"]["readonly"] = json!(true);
    c["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/sys/kernel/tracing", "type": "bind", "source": "/sys/kernel/tracing", "options": ["rbind", "ro"]
    }));
    std::fs::write(&path, c.to_string()).unwrap();
    output(Command::new("runc").args(["run", "--bundle"]).arg(bundle).arg(id))
}

#[test]
fn the_image_holds_the_binary_and_its_libraries_only_and_runs_status_with_the_daemonsets_capabilities() {
    require_root();
    let bundle = unpack("status");
    let root = bundle.join("rootfs");
    let mut files: Vec<String> = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                files.push(p.strip_prefix(&root).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    assert_eq!(
        files,
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
    let (_, ours, _) = output(Command::new(gpumem_bin()).arg("--version"));
    assert_eq!(out, ours, "the image's binary is this build");

    mount_tracefs();
    let (ok, out, err) = run_in(&bundle, &format!("gpumem-image-s-{}", std::process::id()), &["/usr/bin/gpumem", "status", "--no-daemon"]);
    assert!(ok, "gpumem status in the image: {out}{err}");
    for line in ["uprobes/uretprobes  yes", "sched:sched_process_exit     attached", "oom:mark_victim              attached"] {
        assert!(out.contains(line), "{line}: {out}");
    }
    assert!(out.contains("hooked"), "the host's processes are seen (hostPID): a loader is hooked: {out}");
}

/// The host's tracefs, which the pod mounts read-only (a fresh machine may not have it mounted).
fn mount_tracefs() {
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let (ok, _, err) = output(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]));
        assert!(ok, "mounting tracefs: {err}");
    }
}
