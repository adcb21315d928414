//! The node's name: what OTLP's `host.name` and a recording's header say.

/// The DaemonSet's NODE_NAME, else the host name ("" where neither is known).
pub fn name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_default()
}
