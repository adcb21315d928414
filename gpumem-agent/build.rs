//! Builds gpumem-ebpf for the bpf target and leaves the object in OUT_DIR,
//! where probes/mod.rs embeds it (the aya-template layout, as aya-build
//! does it), with one difference: the nested build has one target folder
//! for the whole workspace (target/bpf), not one under each OUT_DIR, so
//! that the debug, release, test and lint builds of the agent share one
//! eBPF build instead of making four (each builds `core` for bpfel).
use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{anyhow, bail, Context as _};
use cargo_metadata::{Artifact, Message, MetadataCommand};

/// The git revision the binary is built from (`gpumem --version`), or
/// "unknown" outside a git checkout.
fn git_revision() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GPUMEM_GIT_REVISION={revision}");
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = std::path::Path::new(&dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", dir.join("refs/heads").display());
    }
}

fn main() -> anyhow::Result<()> {
    git_revision();
    let metadata = MetadataCommand::new().no_deps().exec().context("running cargo metadata")?;
    let package =
        |name: &str| metadata.packages.iter().find(|p| p.name.as_str() == name).ok_or_else(|| anyhow!("{name} is not a workspace package"));
    let ebpf = package("gpumem-ebpf")?;
    let root = ebpf.manifest_path.parent().context("manifest path has no parent")?;
    let common = package("gpumem-common")?.manifest_path.parent().context("manifest path has no parent")?.to_path_buf();
    println!("cargo:rerun-if-changed={root}");
    println!("cargo:rerun-if-changed={common}");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_BENCH");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    // One per machine whose registers the programs read (bpf_target_arch):
    // an aarch64 build beside the x86_64 one rebuilds neither.
    let target_dir = match arch.as_str() {
        "x86_64" => metadata.target_directory.join("bpf"),
        other => metadata.target_directory.join(format!("bpf-{other}")),
    };
    let toolchain = std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".into());
    // The benchmark's empty programs only in a `bench` build of the agent.
    let features = if std::env::var_os("CARGO_FEATURE_BENCH").is_some() { "bench" } else { "" };

    let mut cmd = Command::new("rustup");
    cmd.args(["run", &toolchain, "cargo", "build", "--package", "gpumem-ebpf", "--bins", "--release"])
        .args(["--message-format=json", "--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .args(["--features", features])
        .arg("--target-dir")
        .arg(target_dir.as_std_path())
        .current_dir(root.as_std_path())
        // -Z build-std on a stable toolchain, for this build only.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"))
        // The outer build's compiler (or a lint wrapper) is not the bpf one.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("building the eBPF programs (needs rustup, bpf-linker and rust-src: run `cargo xtask setup`)")?;
    let stderr = BufReader::new(child.stderr.take().context("no stderr")?);
    let warnings = std::thread::spawn(move || stderr.lines().map_while(Result::ok).for_each(|l| println!("cargo:warning={l}")));
    let mut object = None;
    for message in Message::parse_stream(BufReader::new(child.stdout.take().context("no stdout")?)) {
        match message.context("the eBPF build's output is not cargo's JSON")? {
            Message::CompilerArtifact(Artifact { executable: Some(exe), target, .. }) if target.name == "gpumem" => object = Some(exe),
            Message::CompilerMessage(m) => m.message.rendered.unwrap_or_default().lines().for_each(|l| println!("cargo:warning={l}")),
            _ => {}
        }
    }
    let status = child.wait().context("waiting for the eBPF build")?;
    let _ = warnings.join();
    if !status.success() {
        bail!("building the eBPF programs failed ({status}); the errors are above (cargo xtask setup installs what it needs)");
    }
    let object = object.context("the eBPF build made no `gpumem` object")?;
    std::fs::copy(&object, out_dir.join("gpumem")).with_context(|| format!("copying {object} to {}", out_dir.display()))?;
    Ok(())
}
