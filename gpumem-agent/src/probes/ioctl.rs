//! Choosing and attaching the NVIDIA ioctl path, and seeding the kernel's
//! table of NVIDIA descriptors with files opened before the agent started.
use std::{collections::HashSet, path::Path};

use gpumem_common::{nv_fd, FdKey};
use serde::Serialize;

pub const DEFAULT_PREFIX: &str = "/dev/nvidia";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoctlPath {
    /// kprobes/kretprobes on nvidia_unlocked_ioctl and uvm_unlocked_ioctl_entry.
    Kprobes,
    /// syscalls:sys_{enter,exit}_ioctl (+ openat/close to know NVIDIA descriptors).
    Tracepoints,
    Off,
}

#[derive(Clone, Debug, Serialize)]
pub struct IoctlReport {
    pub path: IoctlPath,
    pub why: String,
    pub prefix: String,
    /// Descriptors seeded from /proc (files opened before the agent started).
    pub seeded_fds: usize,
    pub error: Option<String>,
}

/// What `--ioctl` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IoctlMode {
    Auto,
    Kprobes,
    Tracepoints,
    Off,
}

/// The tracepoint fallback's cost, measured with `cargo xtask bench-ioctl`.
const FALLBACK_COST: &str = "the syscall tracepoints would slow every ioctl on this host about 2x and every other syscall about 1.2x";

/// Which path to use, and why. Kprobes see only the real driver and cost
/// other ioctls nothing; the syscall tracepoints see every ioctl (filtered in
/// the kernel) but put every syscall on the kernel's slower tracing path, so
/// `auto` uses them only for a stand-in device named with a custom prefix.
pub fn choose(mode: IoctlMode, kprobes: bool, module_loaded: bool, prefix: &str) -> (IoctlPath, String) {
    let kprobes_usable = kprobes && module_loaded && prefix == DEFAULT_PREFIX;
    let why_not_kprobes = if !kprobes {
        "this kernel has no kprobes (CONFIG_KPROBES off)".to_string()
    } else if !module_loaded {
        "the nvidia module is not loaded (nothing to kprobe)".to_string()
    } else {
        format!("device prefix {prefix} is not the driver's")
    };
    match mode {
        IoctlMode::Off => (IoctlPath::Off, "turned off with --ioctl off".into()),
        IoctlMode::Tracepoints => (IoctlPath::Tracepoints, "syscall tracepoints, filtered in the kernel (--ioctl tracepoints)".into()),
        _ if kprobes_usable => (IoctlPath::Kprobes, "kprobes on nvidia_unlocked_ioctl and uvm_unlocked_ioctl_entry".into()),
        IoctlMode::Kprobes => {
            (IoctlPath::Tracepoints, format!("{why_not_kprobes}: falling back to syscall tracepoints, filtered in the kernel"))
        }
        IoctlMode::Auto if prefix != DEFAULT_PREFIX => {
            (IoctlPath::Tracepoints, format!("{why_not_kprobes}: syscall tracepoints for the stand-in device, filtered in the kernel"))
        }
        IoctlMode::Auto => (IoctlPath::Off, format!("{why_not_kprobes}, and {FALLBACK_COST}: enable them with --ioctl tracepoints")),
    }
}

pub fn nvidia_module_loaded() -> bool {
    Path::new("/sys/module/nvidia").exists()
}

/// The kind of NVIDIA node a path is, if it is one.
pub fn node_kind(path: &str, prefix: &str) -> Option<u32> {
    let rest = path.strip_prefix(prefix)?;
    Some(if rest.starts_with("-uvm") { nv_fd::UVM } else { nv_fd::RM })
}

/// Open NVIDIA descriptors of every process, from /proc/PID/fd.
pub fn scan_fds(prefix: &str) -> Vec<(FdKey, u32)> {
    let mut out = Vec::new();
    for tgid in gpumem_engine::procfs::pids() {
        for (fd, target) in gpumem_engine::procfs::fd_targets(tgid) {
            if let Some(kind) = target.to_str().and_then(|t| node_kind(t, prefix)) {
                out.push((FdKey { tgid, fd }, kind));
            }
        }
    }
    out
}

/// Descriptors already put in the kernel table, so rescans add only new ones.
#[derive(Default)]
pub struct Seeded(pub HashSet<(u32, u32)>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_selection() {
        use IoctlMode::*;
        // A GPU host with kprobes: the driver's own entry points.
        assert_eq!(choose(Auto, true, true, DEFAULT_PREFIX).0, IoctlPath::Kprobes);
        assert_eq!(choose(Kprobes, true, true, DEFAULT_PREFIX).0, IoctlPath::Kprobes);
        // No kprobes (this kernel): auto does not impose the fallback's cost...
        let (p, why) = choose(Auto, false, true, DEFAULT_PREFIX);
        assert_eq!(p, IoctlPath::Off);
        assert!(why.contains("no kprobes") && why.contains("--ioctl tracepoints"), "{why}");
        // ...asking for kprobes falls back, and the fallback can be asked for.
        let (p, why) = choose(Kprobes, false, true, DEFAULT_PREFIX);
        assert_eq!(p, IoctlPath::Tracepoints);
        assert!(why.contains("falling back"), "{why}");
        assert_eq!(choose(Tracepoints, true, true, DEFAULT_PREFIX).0, IoctlPath::Tracepoints);
        // Module not loaded.
        let (p, why) = choose(Kprobes, true, false, DEFAULT_PREFIX);
        assert_eq!(p, IoctlPath::Tracepoints);
        assert!(why.contains("not loaded"), "{why}");
        // A stand-in device is only visible to the tracepoints.
        assert_eq!(choose(Auto, true, true, "/tmp/fake/nvidia").0, IoctlPath::Tracepoints);
        assert_eq!(choose(Auto, false, false, "/tmp/fake/nvidia").0, IoctlPath::Tracepoints);
        assert_eq!(choose(Off, true, true, DEFAULT_PREFIX).0, IoctlPath::Off);
    }

    #[test]
    fn node_kinds() {
        assert_eq!(node_kind("/dev/nvidiactl", DEFAULT_PREFIX), Some(nv_fd::RM));
        assert_eq!(node_kind("/dev/nvidia0", DEFAULT_PREFIX), Some(nv_fd::RM));
        assert_eq!(node_kind("/dev/nvidia-uvm", DEFAULT_PREFIX), Some(nv_fd::UVM));
        assert_eq!(node_kind("/dev/null", DEFAULT_PREFIX), None);
        assert_eq!(node_kind("/tmp/x/nvidia-uvm", "/tmp/x/nvidia"), Some(nv_fd::UVM));
    }
}
