//! What the running kernel offers, for `gpumem status` and for choosing paths.
use std::path::Path;

use aya::maps::MapType;

#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelFeatures {
    pub release: String,
    /// The uprobe perf PMU (uprobes and uretprobes).
    pub uprobes: bool,
    /// The kprobe perf PMU; absent when CONFIG_KPROBES is off.
    pub kprobes: bool,
    /// tracefs events directory present (after mounting if needed).
    pub tracepoints: bool,
    pub ring_buffer: bool,
    pub btf: bool,
}

pub fn detect() -> KernelFeatures {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    KernelFeatures {
        release,
        uprobes: Path::new("/sys/bus/event_source/devices/uprobe").exists(),
        kprobes: Path::new("/sys/bus/event_source/devices/kprobe").exists(),
        tracepoints: Path::new("/sys/kernel/tracing/events").is_dir() || Path::new("/sys/kernel/debug/tracing/events").is_dir(),
        ring_buffer: aya::sys::is_map_supported(MapType::RingBuf).unwrap_or(false),
        btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
    }
}
