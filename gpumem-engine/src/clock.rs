//! CLOCK_MONOTONIC, the clock of the events' `ts_ns` (bpf_ktime_get_ns).

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Unix nanoseconds now.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The Unix time of a CLOCK_MONOTONIC instant of this boot (as far back
/// from now as it is).
pub fn unix_ns_of(monotonic: u64) -> u64 {
    unix_ns().saturating_sub(monotonic_ns().saturating_sub(monotonic))
}

/// RFC 3339 in UTC (`2026-12-01T23:02:51.123456789Z`).
pub fn rfc3339(unix_ns: u64) -> String {
    humantime::format_rfc3339_nanos(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(unix_ns)).to_string()
}
