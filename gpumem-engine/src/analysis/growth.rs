//! The growth detector: one verdict over one window, for every reader
//! (`leaks`, `top`, `/metrics`, the report, the actions).
//!
//! A leak shows in the *floor* of outstanding bytes, not in its peaks: a
//! cache's churn goes up and down, frees deferred and released in batches
//! cut teeth, a checkpoint spikes and falls, a leak keeps raising the lowest
//! level the series comes back to. The floor at a sample is the least the
//! series holds over the next cycle (twice the longest gap between two
//! frees, at least 2 s): a trough comes within it, whatever the shape or
//! period of the teeth. The last cycle is not settled (its trough may be
//! still to come), so the floor is read up to one cycle before the end.
//!
//! From the floor, over the last [`GrowthConfig::window_s`] seconds:
//! - `insufficient`: under `min_span_s` of samples, or growth that began
//!   under `evidence_s` ago (its rate is still given);
//! - `none`: flat, under `min_growth_bytes` of growth, or growth that is
//!   not spread over its time (`irregular`);
//! - `plateau`: the floor grew, then has not risen for `quiet_s` or twice
//!   the longest pause between its rises, whichever is longer (a leak that
//!   steps every 20 s is not a plateau between its steps);
//! - `leak`: the floor rose in each third of the time since it began to
//!   grow, is still rising and fits a line (R² ≥ `min_fit`); the rate is
//!   that line's slope;
//! - `cache_growth`: a `leak` of reserved bytes while PyTorch's allocated
//!   bytes (its probes) are not leaking: the caching allocator keeping freed
//!   blocks, or fragmentation.
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Seconds between samples of every series, in every command: the same
/// data gives the same verdict in `leaks`, `top` and `serve`.
pub const SAMPLE_INTERVAL_S: f64 = 0.25;

#[derive(Clone, Copy, Debug)]
pub struct GrowthConfig {
    /// The detector looks at the last this many seconds of a series.
    pub window_s: f64,
    /// Fewer seconds of samples than this say nothing.
    pub min_span_s: f64,
    /// Growth that began under this long ago is not yet a leak.
    pub evidence_s: f64,
    /// A floor that has not risen for this long (or twice its longest pause) is a plateau.
    pub quiet_s: f64,
    /// Growth of the floor below this is never a leak.
    pub min_growth_bytes: u64,
    /// R² of the floor against a line needed to call it a leak.
    pub min_fit: f64,
}

impl Default for GrowthConfig {
    fn default() -> Self {
        GrowthConfig { window_s: 300.0, min_span_s: 4.0, evidence_s: 6.0, quiet_s: 10.0, min_growth_bytes: 1 << 20, min_fit: 0.8 }
    }
}

/// What the series does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    Leak,
    CacheGrowth,
    Plateau,
    None,
    Insufficient,
}

impl Finding {
    pub fn name(self) -> &'static str {
        match self {
            Finding::Leak => "leak",
            Finding::CacheGrowth => "cache_growth",
            Finding::Plateau => "plateau",
            Finding::None => "none",
            Finding::Insufficient => "insufficient",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// `verdict == Leak`.
    pub leaking: bool,
    pub verdict: Finding,
    /// 0..1, of this verdict: for a leak, how well the floor fits a line, and how long it grew.
    pub confidence: f64,
    /// Slope of the floor while it grows, bytes per second (0 on a plateau or flat).
    pub rate_bytes_per_s: f64,
    /// Floor at the end minus floor at the window's start.
    pub growth_bytes: i64,
    /// How long the evidence lasts: the growth for a leak (or one not yet
    /// long enough), the quiet for a plateau, seconds.
    #[serde(default)]
    pub for_s: f64,
    /// Why, in words: "growing", "plateau", "flat", "too little growth",
    /// "irregular", "growing for too short a time", "not enough data".
    pub reason: String,
}

impl Verdict {
    fn of_kind(verdict: Finding, reason: &str) -> Self {
        Verdict {
            leaking: verdict == Finding::Leak,
            verdict,
            confidence: 0.0,
            rate_bytes_per_s: 0.0,
            growth_bytes: 0,
            for_s: 0.0,
            reason: reason.to_string(),
        }
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

/// Samples of (seconds, bytes), oldest first: the verdict at the last one.
pub fn assess(samples: &[(f64, u64)], cfg: &GrowthConfig) -> Verdict {
    let Some(&(end, _)) = samples.last() else { return Verdict::of_kind(Finding::Insufficient, "not enough data") };
    let s = &samples[samples.partition_point(|&(t, _)| t < end - cfg.window_s)..];
    let t0 = s[0].0;
    if s.len() < 4 || end - t0 < cfg.min_span_s {
        return Verdict::of_kind(Finding::Insufficient, "not enough data");
    }
    let top = s.iter().map(|&(_, v)| v).max().unwrap_or(0);
    // Movements below this are noise in the floor, not growth.
    let eps = ((top as f64) * 1e-4).max(65536.0);
    // One cycle of the teeth: a trough comes within it, so the least of
    // the series over it is the floor; the last one is not settled yet.
    let horizon = (2.0 * cycle_s(s, eps)).max(2.0).min((end - t0) / 4.0);
    let settled = end - horizon;
    let n = s.partition_point(|&(t, _)| t <= settled).max(2);
    let times: Vec<f64> = s[..n].iter().map(|&(t, _)| t).collect();
    let floor = &lower_envelope(s, horizon)[..n];
    let growth = floor[n - 1] as i64 - floor[0] as i64;
    // Each time the floor climbs another eps: when it rose.
    let mut rises = Vec::new();
    let mut level = floor[0] as f64;
    for (i, &f) in floor.iter().enumerate() {
        if f as f64 >= level + eps {
            rises.push(times[i]);
            level = f as f64;
        } else if (f as f64) < level - eps {
            // Given back: growth from here on counts anew.
            level = f as f64;
        }
    }
    // The unsettled tail holds a trough (it is a cycle long): if even its
    // least is above the floor, the series has risen since.
    let tail_min = s[n..].iter().map(|&(_, v)| v).min();
    if tail_min.is_some_and(|m| m as f64 >= level + eps) {
        rises.push(end);
    }
    // A step too recent to be settled: the latest sample above all the
    // series held since its floor last rose.
    if let Some(&last) = rises.last() {
        let held = s.iter().filter(|&&(t, _)| t >= last && t <= settled).map(|&(_, v)| v).max();
        if held.is_some_and(|h| s[s.len() - 1].1 as f64 > h as f64 + eps) {
            rises.push(end);
        }
    }
    let base = Verdict { growth_bytes: growth, ..Verdict::of_kind(Finding::None, "flat") };
    let Some(&last_rise) = rises.last() else { return base };
    if growth < cfg.min_growth_bytes as i64 {
        return Verdict { reason: "too little growth".into(), ..base };
    }
    let longest_pause = rises.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    let quiet = settled - last_rise;
    if quiet >= cfg.quiet_s.max(2.0 * longest_pause) {
        return Verdict { verdict: Finding::Plateau, confidence: 1.0, for_s: quiet, reason: "plateau".into(), ..base };
    }
    // Growth began where the floor first passed 5 % of what it grew by.
    let first = floor.iter().position(|&f| f as f64 - floor[0] as f64 > 0.05 * growth as f64).unwrap_or(0);
    let from = first.saturating_sub(1);
    let (xs, ys): (Vec<f64>, Vec<f64>) = (from..n).map(|i| (times[i], floor[i] as f64)).unzip();
    let (rate, fit) = line(&xs, &ys);
    let lasted = settled - times[from];
    let growing = Verdict { rate_bytes_per_s: rate.max(0.0), for_s: lasted, ..base };
    if lasted < cfg.evidence_s {
        return Verdict { verdict: Finding::Insufficient, reason: "growing for too short a time".into(), ..growing };
    }
    let third = lasted / 3.0;
    let at = |t: f64| floor[times.partition_point(|&x| x <= t).saturating_sub(1).max(from)] as f64;
    let spread = (0..3).all(|k| {
        let (a, b) = (times[from] + k as f64 * third, times[from] + (k + 1) as f64 * third);
        at(b) - at(a) >= 0.1 * growth as f64
    });
    if !spread || fit < cfg.min_fit {
        return Verdict { confidence: 1.0 - fit.clamp(0.0, 1.0), reason: "irregular".into(), ..growing };
    }
    let confidence = fit * (0.5 + 0.5 * (lasted / 60.0).min(1.0));
    Verdict { leaking: true, verdict: Finding::Leak, confidence, reason: "growing".into(), ..growing }
}

/// For each sample, the least the series holds from it to `horizon` seconds later.
fn lower_envelope(s: &[(f64, u64)], horizon: f64) -> Vec<u64> {
    let mut out = vec![0; s.len()];
    // Indices of the window's candidates, their values increasing.
    let mut window: VecDeque<usize> = VecDeque::new();
    let mut j = s.len();
    for i in (0..s.len()).rev() {
        while window.back().is_some_and(|&k| s[k].1 >= s[i].1) {
            window.pop_back();
        }
        window.push_back(i);
        // Samples later than the horizon leave (j: the first of them).
        while j > i + 1 && s[j - 1].0 > s[i].0 + horizon {
            j -= 1;
        }
        while window.front().is_some_and(|&k| k >= j) {
            window.pop_front();
        }
        out[i] = s[window.front().copied().unwrap_or(i)].1;
    }
    out
}

/// One cycle of the series: the longest time between two frees (drops
/// above `eps`); 0 where it never drops twice.
fn cycle_s(s: &[(f64, u64)], eps: f64) -> f64 {
    let drops = s.windows(2).filter(|w| (w[0].1 as f64) - (w[1].1 as f64) > eps).map(|w| w[1].0);
    let mut prev: Option<f64> = None;
    let mut longest: f64 = 0.0;
    for t in drops {
        if let Some(p) = prev {
            longest = longest.max(t - p);
        }
        prev = Some(t);
    }
    longest
}

/// Least-squares slope and R² of ys against xs.
fn line(xs: &[f64], ys: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let syy: f64 = ys.iter().map(|y| (y - my) * (y - my)).sum();
    if sxx == 0.0 || syy == 0.0 {
        return (0.0, 0.0);
    }
    (sxy / sxx, (sxy * sxy) / (sxx * syy))
}

/// A bounded series of (seconds, bytes) samples: the detector's window, at most `cap` samples.
#[derive(Clone, Debug)]
pub struct Series {
    samples: VecDeque<(f64, u64)>,
    cap: usize,
    window_s: f64,
}

impl Series {
    /// Its samples' heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        std::mem::size_of::<Series>() as u64 + crate::heap::vec::<(f64, u64)>(self.samples.capacity())
    }

    pub fn new(cap: usize) -> Self {
        // Grown as samples come: most series (short-lived processes, small groups) stay short.
        Series { samples: VecDeque::new(), cap: cap.max(2), window_s: GrowthConfig::default().window_s }
    }

    pub fn push(&mut self, t: f64, bytes: u64) {
        while self.samples.len() >= self.cap || self.samples.front().is_some_and(|&(t0, _)| t0 < t - self.window_s) {
            self.samples.pop_front();
        }
        self.samples.push_back((t, bytes));
    }

    pub fn assess(&mut self, cfg: &GrowthConfig) -> Verdict {
        assess(self.samples.make_contiguous(), cfg)
    }

    /// The verdict as it was at `t` (samples after it left out).
    pub fn assess_until(&mut self, t: f64, cfg: &GrowthConfig) -> Verdict {
        let s = self.samples.make_contiguous();
        assess(&s[..s.partition_point(|&(x, _)| x <= t)], cfg)
    }

    /// The last `n` samples' bytes, oldest first (for trend lines).
    pub fn recent(&self, n: usize) -> Vec<u64> {
        self.samples.iter().skip(self.samples.len().saturating_sub(n)).map(|&(_, b)| b).collect()
    }

    /// The latest sample's bytes.
    pub fn last(&self) -> Option<u64> {
        self.samples.back().map(|&(_, b)| b)
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

    /// `secs` seconds sampled every SAMPLE_INTERVAL_S.
    fn series_for(secs: f64, f: impl Fn(f64) -> f64) -> Vec<(f64, u64)> {
        let n = (secs / SAMPLE_INTERVAL_S) as usize;
        (0..n).map(|i| i as f64 * SAMPLE_INTERVAL_S).map(|t| (t, f(t).max(0.0) as u64)).collect()
    }

    fn series(f: impl Fn(f64) -> f64) -> Vec<(f64, u64)> {
        series_for(60.0, f)
    }

    /// The verdict at every sample.
    fn timeline(s: &[(f64, u64)]) -> Vec<(f64, Verdict)> {
        (1..=s.len()).map(|n| (s[n - 1].0, check(&s[..n]))).collect()
    }

    /// A caching allocator's churn: 64 MiB up and down every second.
    fn sawtooth(t: f64) -> f64 {
        (t.fract()) * 64.0 * MIB
    }

    /// Temporaries of 4 MiB every 0.05 s, freed 11 at a time.
    fn batched(t: f64) -> f64 {
        let made = (t / 0.05).floor();
        (made % 11.0) * 4.0 * MIB
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
    fn a_leak_under_batched_frees_is_called_within_ten_seconds_and_stays_called() {
        let s = series(|t| 256.0 * MIB + 40.0 * MIB * t + batched(t));
        let tl = timeline(&s);
        let first = tl.iter().find(|(_, v)| v.leaking).map(|(t, _)| *t);
        assert!(first.is_some_and(|t| t <= 10.0), "first leak at {first:?}");
        let after: Vec<&(f64, Verdict)> = tl.iter().filter(|(t, _)| *t >= first.unwrap()).collect();
        assert!(after.iter().all(|(_, v)| v.leaking), "{:?}", after.iter().find(|(_, v)| !v.leaking));
        let v = &tl.last().unwrap().1;
        assert!((v.rate_bytes_per_s / MIB - 40.0).abs() < 4.0, "{v:?}");
    }

    #[test]
    fn step_leak_is_flagged_and_never_called_a_plateau_between_steps() {
        // +16 MiB every 5 s, never given back.
        let s = series(|t| 512.0 * MIB + 16.0 * MIB * (t / 5.0).floor() + sawtooth(t));
        let v = check(&s);
        assert!(v.leaking, "{v:?}");
        assert!((v.rate_bytes_per_s / MIB - 3.2).abs() < 0.6, "{v:?}");
        let tl = timeline(&s);
        assert!(tl.iter().all(|(_, v)| v.verdict != Finding::Plateau), "{:?}", tl.iter().find(|(_, v)| v.verdict == Finding::Plateau));
    }

    #[test]
    fn warm_up_that_plateaus_is_called_a_plateau_only_after_the_quiet_window() {
        let s = series(|t| (t.min(15.0) / 15.0) * 4096.0 * MIB + sawtooth(t));
        let v = check(&s);
        assert_eq!(v.verdict, Finding::Plateau, "{v:?}");
        assert!(!v.leaking && v.rate_bytes_per_s == 0.0, "{v:?}");
        for (t, v) in timeline(&s) {
            if v.verdict == Finding::Plateau {
                assert!(t >= 15.0 + GrowthConfig::default().quiet_s, "plateau at {t} s: {v:?}");
                assert!(v.for_s >= GrowthConfig::default().quiet_s, "{v:?}");
            }
        }
    }

    #[test]
    fn steady_churn_is_not_a_leak() {
        let v = check(&series(|t| 2048.0 * MIB + sawtooth(t)));
        assert_eq!((v.verdict, v.reason.as_str()), (Finding::None, "flat"), "{v:?}");
    }

    #[test]
    fn checkpoint_spikes_are_not_a_leak() {
        // 2 GiB for 2 s every 15 s, over steady churn.
        let v = check(&series(|t| 1024.0 * MIB + if t % 15.0 < 2.0 { 2048.0 * MIB } else { 0.0 } + sawtooth(t)));
        assert!(!v.leaking, "{v:?}");
    }

    #[test]
    fn noise_is_not_a_leak_at_any_time() {
        let mut rng = Lcg(7);
        let noise: Vec<f64> = (0..240).map(|_| rng.next()).collect();
        let s: Vec<(f64, u64)> = (0..240).map(|i| (i as f64 * 0.25, (1024.0 * MIB + 8.0 * MIB * noise[i]) as u64)).collect();
        assert!(timeline(&s).iter().all(|(_, v)| !v.leaking));
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
    fn growth_given_back_is_not_a_leak() {
        let v = check(&series(|t| 512.0 * MIB + if t < 40.0 { 8.0 * MIB * t } else { 0.0 }));
        assert!(!v.leaking && v.verdict != Finding::Plateau, "{v:?}");
    }

    #[test]
    fn tiny_growth_is_not_a_leak() {
        let v = check(&series(|t| MIB + 8000.0 * t));
        assert_eq!((v.verdict, v.reason.as_str()), (Finding::None, "too little growth"), "{v:?}");
    }

    #[test]
    fn too_few_samples_or_too_short_a_growth_is_insufficient_with_its_rate() {
        assert_eq!(check(&[(0.0, 1), (1.0, 2)]).verdict, Finding::Insufficient);
        let v = check(&series_for(6.0, |t| 256.0 * MIB + 8.0 * MIB * t));
        assert_eq!((v.verdict, v.reason.as_str()), (Finding::Insufficient, "growing for too short a time"), "{v:?}");
        assert!(v.rate_bytes_per_s > 7.0 * MIB, "a rising series' rate is never 0: {v:?}");
    }

    #[test]
    fn the_window_bounds_what_is_judged() {
        // Grew long ago, then flat for longer than the window: flat now.
        let cfg = GrowthConfig::default();
        let s = series_for(cfg.window_s + 120.0, |t| 256.0 * MIB + 8.0 * MIB * t.min(60.0));
        assert_eq!(check(&s).reason, "flat");
    }

    #[test]
    fn series_is_bounded() {
        let mut s = Series::new(16);
        for i in 0..100 {
            s.push(i as f64, i * (1 << 20));
        }
        assert_eq!(s.samples.len(), 16);
        assert!(s.assess(&GrowthConfig::default()).leaking);
        let mut s = Series::new(1 << 20);
        for i in 0..10_000 {
            s.push(i as f64, 0);
        }
        assert_eq!(s.samples.len(), GrowthConfig::default().window_s as usize + 1, "samples older than the window go");
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
