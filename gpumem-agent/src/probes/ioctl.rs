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

/// Which path to use, and why. Kprobes only see the real driver, so a custom
/// device prefix (a stand-in device) needs the tracepoints.
pub fn choose(disabled: bool, kprobes: bool, module_loaded: bool, prefix: &str) -> (IoctlPath, String) {
    if disabled {
        return (IoctlPath::Off, "disabled with --no-ioctl".into());
    }
    if prefix != DEFAULT_PREFIX {
        return (IoctlPath::Tracepoints, format!("device prefix {prefix} is not the driver's: syscall tracepoints, filtered in the kernel"));
    }
    match (kprobes, module_loaded) {
        (true, true) => (IoctlPath::Kprobes, "kprobes on nvidia_unlocked_ioctl and uvm_unlocked_ioctl_entry".into()),
        (false, _) => (
            IoctlPath::Tracepoints,
            "this kernel has no kprobes (CONFIG_KPROBES off): syscall tracepoints, filtered in the kernel".into(),
        ),
        (true, false) => (
            IoctlPath::Tracepoints,
            "the nvidia module is not loaded (nothing to kprobe): syscall tracepoints, filtered in the kernel".into(),
        ),
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
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let Some(tgid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Some(n) = fd.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            if let Some(kind) = target.to_str().and_then(|t| node_kind(t, prefix)) {
                out.push((FdKey { tgid, fd: n }, kind));
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
        assert_eq!(choose(false, true, true, DEFAULT_PREFIX).0, IoctlPath::Kprobes);
        let (p, why) = choose(false, false, true, DEFAULT_PREFIX);
        assert_eq!(p, IoctlPath::Tracepoints);
        assert!(why.contains("no kprobes"));
        let (p, why) = choose(false, true, false, DEFAULT_PREFIX);
        assert_eq!(p, IoctlPath::Tracepoints);
        assert!(why.contains("not loaded"));
        assert_eq!(choose(false, true, true, "/tmp/fake/nvidia").0, IoctlPath::Tracepoints, "stand-in devices need tracepoints");
        assert_eq!(choose(true, true, true, DEFAULT_PREFIX).0, IoctlPath::Off);
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
