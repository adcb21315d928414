//! `gpumem preflight`: the arm64 uprobe gate's decisions, without attaching.
use std::path::PathBuf;

use clap::Args;
use gpumem_engine::formats::arm64_probe::Policy;

#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// arm64 libraries to check: libcuda copies (every entry point gpumem
    /// probes) and dynamic loaders (their `_dl_debug_state` hook).
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// The kernel release to decide for (e.g. `6.8.0-1015-nvidia-64k`);
    /// default: this host's.
    #[arg(long, value_name = "RELEASE")]
    pub kernel: Option<String>,
    /// The policy to decide with (as `--arm64-uprobes` of the other commands).
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = Policy::Strict, env = "GPUMEM_ARM64_UPROBES")]
    pub arm64_uprobes: Policy,
    /// Print the decisions as one JSON object.
    #[arg(long)]
    pub json: bool,
}
