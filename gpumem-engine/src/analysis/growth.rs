//! Growth detector: "grows linearly or faster and never comes back down".
//!
//! A leak shows in the *floor* of live bytes, not in its peaks: a caching
//! allocator's churn goes up and down, a warm-up ramps then stays, a leak
//! keeps raising the lowest level the process ever returns to. The window
//! is cut into equal time buckets and the minimum of each is its floor. A
//! leak is flagged when the floors rise bucket after bucket (almost never
//! fall, mostly rise), are still rising in the most recent buckets (so a
//! plateau is not a leak), and rose by a meaningful amount. The growth rate
//! is the least-squares slope of the floors.
use std::collections::VecDeque;

use serde::Serialize;

#[derive(Clone, Copy, Debug)]
pub struct GrowthConfig {
    /// Buckets the window is cut into.
    pub buckets: usize,
    /// Growth of the floor below this is never a leak.
    pub min_growth_bytes: u64,
    /// Confidence needed to call it a leak (0..1).
    pub min_confidence: f64,
}

impl Default for GrowthConfig {
    fn default() -> Self {
        GrowthConfig { buckets: 8, min_growth_bytes: 1 << 20, min_confidence: 0.7 }
    }
}

/// What the growth is: for a process whose tensors PyTorch's probes show,
/// allocated bytes growing is a `leak`; reserved growing while allocated
/// stays flat is `cache_growth` (the caching allocator keeping freed
/// blocks, or fragmentation), not a leak. Elsewhere growth is a `leak`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    Leak,
    CacheGrowth,
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub leaking: bool,
    pub verdict: Finding,
    /// 0..1: how consistently the floor rose.
    pub confidence: f64,
    /// Slope of the floor, bytes per second.
    pub rate_bytes_per_s: f64,
    /// Floor at the end minus floor at the start.
    pub growth_bytes: i64,
    /// Why: "growing", "plateau", "flat", "too little growth", "not enough data".
    pub reason: &'static str,
}

impl Verdict {
    fn none(reason: &'static str) -> Self {
        Verdict { leaking: false, verdict: Finding::None, confidence: 0.0, rate_bytes_per_s: 0.0, growth_bytes: 0, reason }
    }

    /// Reserved bytes' verdict told apart by the allocated bytes' (where
    /// known): a leak is in the tensors; reserved growing alone is the cache.
    pub fn of(reserved: Verdict, allocated: Option<Verdict>) -> Verdict {
        match allocated {
            None => reserved,
            Some(a) if a.leaking => a,
            Some(_) if reserved.leaking => Verdict { leaking: false, verdict: Finding::CacheGrowth, ..reserved },
            Some(_) => reserved,
        }
    }
}

/// Samples of (seconds, live bytes), oldest first.
pub fn assess(samples: &[(f64, u64)], cfg: &GrowthConfig) -> Verdict {
    let n = cfg.buckets.max(3);
    if samples.len() < 2 * n {
        return Verdict::none("not enough data");
    }
    let (t0, t1) = (samples[0].0, samples[samples.len() - 1].0);
    let span = t1 - t0;
    if span <= 0.0 {
        return Verdict::none("not enough data");
    }
    let mut floors: Vec<Option<u64>> = vec![None; n];
    for &(t, v) in samples {
        let i = (((t - t0) / span) * n as f64).floor().min((n - 1) as f64) as usize;
        floors[i] = Some(floors[i].map_or(v, |f: u64| f.min(v)));
    }
    // An empty bucket (a gap in sampling) keeps the previous floor.
    let mut prev = floors[0].unwrap_or(samples[0].1);
    let floors: Vec<u64> = floors
        .into_iter()
        .map(|f| {
            prev = f.unwrap_or(prev);
            prev
        })
        .collect();

    let steps = (n - 1) as f64;
    let top = *floors.iter().max().expect("n >= 3") as f64;
    // Differences below this are noise in the floor, not movement.
    let eps = (top * 0.001).max(1.0);
    let mut nondecreasing = 0.0;
    let mut increasing = 0.0;
    for w in floors.windows(2) {
        let d = w[1] as f64 - w[0] as f64;
        if d >= -eps {
            nondecreasing += 1.0;
        }
        if d > eps {
            increasing += 1.0;
        }
    }
    let confidence = (nondecreasing / steps) * (increasing / (steps * 0.75)).min(1.0);

    let bucket_width = span / n as f64;
    let xs: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) * bucket_width).collect();
    let ys: Vec<f64> = floors.iter().map(|&f| f as f64).collect();
    let rate = slope(&xs, &ys);
    let growth = floors[n - 1] as i64 - floors[0] as i64;
    let still_rising = floors[n - 1] as f64 > floors[n - 3] as f64 + eps;

    let reason = if growth <= 0 || increasing == 0.0 {
        "flat"
    } else if !still_rising {
        "plateau"
    } else if growth < cfg.min_growth_bytes as i64 {
        "too little growth"
    } else if confidence < cfg.min_confidence {
        "irregular"
    } else {
        "growing"
    };
    let leaking = reason == "growing";
    let verdict = if leaking { Finding::Leak } else { Finding::None };
    Verdict { leaking, verdict, confidence, rate_bytes_per_s: rate, growth_bytes: growth, reason }
}

fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let num: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// A bounded series of live-byte samples for one process and device.
#[derive(Clone, Debug)]
pub struct Series {
    samples: VecDeque<(f64, u64)>,
    cap: usize,
}

impl Series {
    pub fn new(cap: usize) -> Self {
        Series { samples: VecDeque::with_capacity(cap), cap: cap.max(2) }
    }

    pub fn push(&mut self, t: f64, bytes: u64) {
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back((t, bytes));
    }

    pub fn assess(&mut self, cfg: &GrowthConfig) -> Verdict {
        assess(self.samples.make_contiguous(), cfg)
    }

    /// The last `n` samples' bytes, oldest first (for trend lines).
    pub fn recent(&self, n: usize) -> Vec<u64> {
        self.samples.iter().skip(self.samples.len().saturating_sub(n)).map(|&(_, b)| b).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    /// Deterministic noise in [-1, 1).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        }
    }

    /// 60 s sampled every 0.25 s.
    fn series(f: impl Fn(f64) -> f64) -> Vec<(f64, u64)> {
        (0..240).map(|i| i as f64 * 0.25).map(|t| (t, f(t).max(0.0) as u64)).collect()
    }

    /// A caching allocator's churn: 64 MiB up and down every second.
    fn sawtooth(t: f64) -> f64 {
        (t.fract()) * 64.0 * MIB
    }

    fn check(s: &[(f64, u64)]) -> Verdict {
        assess(s, &GrowthConfig::default())
    }

    #[test]
    fn linear_leak_under_churn_is_flagged_with_its_rate() {
        let v = check(&series(|t| 1024.0 * MIB + 2.0 * MIB * t + sawtooth(t)));
        assert!(v.leaking, "{v:?}");
        assert!(v.confidence > 0.9, "{v:?}");
        assert!((v.rate_bytes_per_s / MIB - 2.0).abs() < 0.2, "{v:?}");
    }

    #[test]
    fn step_leak_is_flagged() {
        // +16 MiB every 5 s, never given back.
        let v = check(&series(|t| 512.0 * MIB + 16.0 * MIB * (t / 5.0).floor() + sawtooth(t)));
        assert!(v.leaking, "{v:?}");
        assert!((v.rate_bytes_per_s / MIB - 3.2).abs() < 0.6, "{v:?}");
    }

    #[test]
    fn warm_up_that_plateaus_is_not_a_leak() {
        let v = check(&series(|t| (t.min(15.0) / 15.0) * 4096.0 * MIB + sawtooth(t)));
        assert!(!v.leaking, "{v:?}");
        assert_eq!(v.reason, "plateau");
    }

    #[test]
    fn steady_churn_is_not_a_leak() {
        let v = check(&series(|t| 2048.0 * MIB + sawtooth(t)));
        assert!(!v.leaking, "{v:?}");
        assert_eq!(v.reason, "flat");
    }

    #[test]
    fn noise_is_not_a_leak() {
        let mut rng = Lcg(7);
        let noise: Vec<f64> = (0..240).map(|_| rng.next()).collect();
        let s: Vec<(f64, u64)> = (0..240).map(|i| (i as f64 * 0.25, (1024.0 * MIB + 8.0 * MIB * noise[i]) as u64)).collect();
        let v = check(&s);
        assert!(!v.leaking, "{v:?}");
    }

    #[test]
    fn slow_leak_under_noise_is_flagged() {
        let mut rng = Lcg(11);
        let noise: Vec<f64> = (0..240).map(|_| rng.next()).collect();
        let s: Vec<(f64, u64)> =
            (0..240).map(|i| i as f64 * 0.25).zip(&noise).map(|(t, n)| (t, (1024.0 * MIB + MIB * t + 2.0 * MIB * n) as u64)).collect();
        let v = check(&s);
        assert!(v.leaking, "{v:?}");
    }

    #[test]
    fn tiny_growth_is_not_a_leak() {
        let v = check(&series(|t| MIB + 1000.0 * t));
        assert!(!v.leaking);
        assert_eq!(v.reason, "too little growth");
    }

    #[test]
    fn too_few_samples() {
        assert_eq!(check(&[(0.0, 1), (1.0, 2)]).reason, "not enough data");
    }

    #[test]
    fn series_is_bounded() {
        let mut s = Series::new(16);
        for i in 0..100 {
            s.push(i as f64, i * (1 << 20));
        }
        assert_eq!(s.samples.len(), 16);
        assert!(s.assess(&GrowthConfig::default()).leaking);
    }

    #[test]
    fn allocated_tells_a_tensor_leak_from_cache_growth() {
        let reserved = check(&series(|t| 512.0 * MIB + 8.0 * MIB * t));
        let flat = check(&series(|_| 256.0 * MIB));
        let rising = check(&series(|t| 256.0 * MIB + 2.0 * MIB * t));
        let cache = Verdict::of(reserved.clone(), Some(flat));
        assert_eq!((cache.leaking, cache.verdict), (false, Finding::CacheGrowth), "{cache:?}");
        let leak = Verdict::of(reserved.clone(), Some(rising));
        assert_eq!((leak.leaking, leak.verdict), (true, Finding::Leak));
        assert!((leak.rate_bytes_per_s / MIB - 2.0).abs() < 0.2, "the tensors' rate: {leak:?}");
        assert_eq!(Verdict::of(reserved, None).verdict, Finding::Leak, "without tensors, growth is a leak");
    }
}
