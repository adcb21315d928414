//! Builds gpumem-ebpf for the bpf target and leaves the object in OUT_DIR,
//! where main.rs embeds it (aya-template layout).
use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};
use cargo_metadata::MetadataCommand;

/// The git revision the binary is built from (`gpumem --version`), or
/// "unknown" outside a git checkout.
fn git_revision() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
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
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "gpumem-ebpf")
        .ok_or_else(|| anyhow!("gpumem-ebpf is not a workspace package"))?;
    let root = ebpf.manifest_path.parent().context("manifest path has no parent")?.to_string();

    // The eBPF crate needs -Z build-std=core. On a stable toolchain that takes
    // RUSTC_BOOTSTRAP=1, set here for the nested build only: aya-build hands
    // this build script's environment to the cargo it runs.
    // SAFETY: the build script is single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    let toolchain = std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".into());
    aya_build::build_ebpf([Package { name: "gpumem-ebpf", root_dir: &root, ..Default::default() }], Toolchain::Custom(&toolchain))
        .context("building the eBPF programs (needs bpf-linker and rust-src: run `cargo xtask setup`)")
}
