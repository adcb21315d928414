//! Parsers of flag values: sizes, durations, ages, prefixes.
use super::SECONDS_MAX;

pub fn parse_duration(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("duration must be a positive number of seconds, got `{s}`"));
    }
    at_most_seconds_max(s, v)
}

pub(super) fn at_most_seconds_max(s: &str, v: f64) -> Result<f64, String> {
    if v > SECONDS_MAX {
        return Err(format!("`{s}` seconds is too long: at most {SECONDS_MAX:e} seconds (about three years)"));
    }
    Ok(v)
}

pub(super) fn parse_prefix(s: &str) -> Result<String, String> {
    if !s.starts_with('/') || s.len() > gpumem_common::NV_PREFIX_MAX {
        return Err(format!("the device prefix must be an absolute path of at most {} bytes", gpumem_common::NV_PREFIX_MAX));
    }
    Ok(s.to_string())
}

pub fn parse_age(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("age must be zero or a positive number of seconds, got `{s}`"));
    }
    at_most_seconds_max(s, v)
}

pub(super) fn parse_ringbuf(s: &str) -> Result<u32, String> {
    let v = parse_bytes(s)?;
    if v < 4096 || !v.is_power_of_two() || v > 1 << 30 {
        return Err(format!("the ring buffer size must be a power of two between 4096 and 1GiB, got {v}"));
    }
    Ok(v as u32)
}

pub(super) fn parse_stack_budget(s: &str) -> Result<u32, String> {
    let max = gpumem_engine::stacks::policy::MAX_BUDGET_PER_S;
    match s.parse::<u32>() {
        Ok(v) if v <= max => Ok(v),
        _ => Err(format!("the stack budget is a number of stacks per second from 0 (no budget) to {max}, got `{s}`")),
    }
}

pub(super) fn parse_sample_bytes(s: &str) -> Result<u64, String> {
    let v = parse_bytes(s)?;
    if v == 0 || v > gpumem_common::sampling::MAX_RATE {
        return Err(format!("the sampling rate must be between 1 byte and 1TiB, got {v}"));
    }
    Ok(v)
}

pub fn parse_bytes(s: &str) -> Result<u64, String> {
    // Binary units: GPU memory is sized in powers of two (64K = 65536).
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("`{s}` is not a size in bytes ({e}); use e.g. 4096, 64K or 20MiB"))
}
