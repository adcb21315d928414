//! Byte-weighted stack sampling beyond a process's stack budget, as heap
//! profilers do (Go's MemProfileRate, tcmalloc): an allocation of `size`
//! bytes has its stack taken with probability p = 1 − exp(−size / rate), and
//! counts for 1/p allocations and size/p bytes, so that per-stack figures
//! stay unbiased. Integer only: the eBPF programs flip the coin with this
//! function and the agent weighs with the same one, so the weight is exactly
//! the inverse of the probability used.

/// Probability 1 in the fixed-point scale used here (24 bits).
pub const P_ONE: u32 = 1 << 24;

/// Table steps per unit of size/rate; the table covers size/rate in [0, 16]
/// (beyond, p = 1 within 2^-23).
const STEPS_PER_UNIT: u64 = 16;
const TABLE_LEN: usize = 16 * STEPS_PER_UNIT as usize + 1;
/// Fraction bits of the interpolation between two table entries.
const FRACTION_BITS: u32 = 12;
/// Largest sampling rate (1 TiB): keeps the fixed-point arithmetic in 64
/// bits (eBPF has no wider division).
pub const MAX_RATE: u64 = 1 << 40;

/// P_ONE × (1 − exp(−k / 16)) for k in 0..=256, computed at compile time.
const TABLE: [u32; TABLE_LEN] = {
    let mut t = [0u32; TABLE_LEN];
    let mut k = 0;
    while k < TABLE_LEN {
        // exp(−x) as exp(−x/64)^64, the small power by its Taylor series.
        let y = -(k as f64) / (STEPS_PER_UNIT as f64) / 64.0;
        let (mut term, mut e, mut n) = (1.0f64, 1.0f64, 1);
        while n < 16 {
            term = term * y / n as f64;
            e += term;
            n += 1;
        }
        let mut sq = 0;
        while sq < 6 {
            e *= e;
            sq += 1;
        }
        t[k] = ((1.0 - e) * P_ONE as f64 + 0.5) as u32;
        k += 1;
    }
    t
};

/// The chance (in 1/P_ONE) that an allocation of `size` bytes has its stack
/// taken at sampling rate `rate` (mean bytes between samples); P_ONE when
/// `rate` is 0 (sampling off: every stack). Never 0.
#[inline(always)]
pub fn probability(size: u64, rate: u64) -> u32 {
    let rate = if rate > MAX_RATE { MAX_RATE } else { rate };
    if rate == 0 || size / rate >= 16 {
        return P_ONE;
    }
    // size < 16 × rate ≤ 2^44: shifted by 16 it stays below 2^60.
    let x = (size << (FRACTION_BITS + 4)) / rate;
    let i = (x >> FRACTION_BITS) as usize;
    let frac = x & ((1 << FRACTION_BITS) - 1);
    if i + 1 >= TABLE_LEN {
        return P_ONE;
    }
    if i == 0 {
        // Below the first step, x − x²/2 (within x³/6): small allocations
        // are most of the samples, and a chord would be 3 % off there.
        let p = (x << 8) - ((x * x) >> 9);
        return if p == 0 { 1 } else { p as u32 };
    }
    let (a, b) = (TABLE[i] as u64, TABLE[i + 1] as u64);
    let p = a + (((b - a) * frac) >> FRACTION_BITS);
    if p == 0 {
        1
    } else {
        p as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern crate std;

    #[test]
    fn the_table_is_one_minus_exp() {
        for (k, &v) in TABLE.iter().enumerate() {
            let want = (1.0 - libm_exp(-(k as f64) / 16.0)) * P_ONE as f64;
            assert!((v as f64 - want).abs() <= 1.0, "k={k}: {v} vs {want}");
        }
    }

    #[test]
    fn probability_follows_size_over_rate() {
        let rate = 512 * 1024;
        assert_eq!(probability(123, 0), P_ONE, "sampling off");
        assert_eq!(probability(16 * rate, rate), P_ONE);
        assert_eq!(probability(u64::MAX, rate), P_ONE);
        assert!(probability(1, rate) >= 1);
        for size in [256u64, 4096, 100_000, 512 * 1024, 3 << 20] {
            let p = probability(size, rate) as f64 / P_ONE as f64;
            let want = 1.0 - libm_exp(-(size as f64) / rate as f64);
            // Chords between steps of 1/16, a Taylor polynomial below: within 0.05 % absolute, 0.5 % relative.
            assert!((p - want).abs() < 5e-4 && (p - want).abs() / want < 0.005, "size {size}: {p} vs {want}");
        }
        let mut last = 0;
        for size in (0..20 * rate).step_by(4099) {
            let p = probability(size, rate);
            assert!(p >= last, "monotonic at {size}");
            last = p;
        }
    }

    fn libm_exp(x: f64) -> f64 {
        x.exp()
    }
}
