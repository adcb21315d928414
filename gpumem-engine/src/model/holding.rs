//! What a daemon knows a process holds.

/// What a process holds on one device, as the daemon knows it (since the
/// process's first call, or its state adopted from the kernel's table).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Holding {
    pub pid: u32,
    pub comm: String,
    pub device: i32,
    pub live_bytes: u64,
    pub live_allocs: u64,
}
