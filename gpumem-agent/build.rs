//! Builds gpumem-ebpf for the bpf target and leaves the object in OUT_DIR,
//! where main.rs embeds it (aya-template layout).
use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};
use cargo_metadata::MetadataCommand;

fn main() -> anyhow::Result<()> {
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
