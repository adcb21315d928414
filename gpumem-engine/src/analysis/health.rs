//! Device health from NVML readings: runbook rules, each taking points from
//! 100, with the reasons kept so that cards can be ranked and the ones to
//! retire or move to non-critical work picked.
use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::model::nvml::{GpuSample, XidEvent};

#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Corrected ECC errors per hour above which the card warns (runbook: 10).
    pub ecc_warn_per_hour: f64,
    /// ... and above which it is critical (runbook: 50).
    pub ecc_critical_per_hour: f64,
    /// HBM temperature above which errors become likely (default 85 °C).
    pub hbm_temp_c: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { ecc_warn_per_hour: 10.0, ecc_critical_per_hour: 50.0, hbm_temp_c: 85 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Ok,
    Warning,
    Critical,
}

/// One rule that took points.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reason {
    pub rule: &'static str,
    pub level: Level,
    pub points: u32,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Health {
    pub score: u32,
    pub level: Level,
    /// Corrected ECC errors per hour over the window (volatile counter).
    pub ecc_corrected_per_hour: Option<f64>,
    pub reasons: Vec<Reason>,
}

/// Points each rule takes (documented in the README).
pub mod points {
    pub const ECC_RATE_WARN: u32 = 15;
    pub const ECC_RATE_CRITICAL: u32 = 30;
    pub const UNCORRECTABLE_ECC: u32 = 30;
    pub const RETIREMENT_PENDING: u32 = 25;
    pub const DOUBLE_BIT_RETIRED: u32 = 10;
    pub const REMAP_FAILURE: u32 = 50;
    pub const REMAP_PENDING: u32 = 20;
    pub const REMAP_UNCORRECTABLE: u32 = 10;
    pub const HBM_HOT: u32 = 10;
    /// Per distinct XID code seen: the critical ones (DBE, retirement or
    /// remap failure, off the bus, uncontained ECC) and the others.
    pub const XID_CRITICAL: u32 = 20;
    pub const XID_OTHER: u32 = 10;
}

/// XIDs that mean the card lost data or cannot be trusted.
pub const CRITICAL_XIDS: [u64; 4] = [48, 64, 79, 95];

/// The rules that took points, as they are found.
#[derive(Default)]
struct Reasons(Vec<Reason>);

impl Reasons {
    fn take(&mut self, rule: &'static str, level: Level, points: u32, detail: String) {
        self.0.push(Reason { rule, level, points, detail });
    }
}

/// Scores a GPU from its first and last readings of a window and the XID
/// events it raised meanwhile.
pub fn assess(first: &GpuSample, last: &GpuSample, xids: &[XidEvent], t: &Thresholds) -> Health {
    let mut r = Reasons::default();
    let rate = ecc_rules(&mut r, first, last, t);
    retirement_and_remap_rules(&mut r, last);
    if let Some(temp) = last.memory_temp_c {
        if temp > t.hbm_temp_c {
            r.take("hbm_hot", Level::Warning, points::HBM_HOT, format!("memory at {temp} °C > {} °C", t.hbm_temp_c));
        }
    }
    xid_rules(&mut r, xids);
    let reasons = r.0;
    let lost: u32 = reasons.iter().map(|r| r.points).sum();
    let level = reasons.iter().map(|r| r.level).max().unwrap_or(Level::Ok);
    Health { score: 100u32.saturating_sub(lost), level, ecc_corrected_per_hour: rate, reasons }
}

/// The corrected-error rate over the window (returned) and uncorrectable errors.
fn ecc_rules(r: &mut Reasons, first: &GpuSample, last: &GpuSample, t: &Thresholds) -> Option<f64> {
    let hours = (last.t_s - first.t_s) / 3600.0;
    let rate = match (&first.ecc, &last.ecc) {
        (Some(a), Some(b)) if hours > 0.0 => Some(b.corrected_volatile.saturating_sub(a.corrected_volatile) as f64 / hours),
        _ => None,
    };
    match rate {
        Some(x) if x > t.ecc_critical_per_hour => r.take(
            "ecc_corrected_rate",
            Level::Critical,
            points::ECC_RATE_CRITICAL,
            format!("{x:.0} corrected ECC errors/h > {}", t.ecc_critical_per_hour),
        ),
        Some(x) if x > t.ecc_warn_per_hour => r.take(
            "ecc_corrected_rate",
            Level::Warning,
            points::ECC_RATE_WARN,
            format!("{x:.0} corrected ECC errors/h > {}", t.ecc_warn_per_hour),
        ),
        _ => {}
    }
    if let Some(e) = &last.ecc {
        let unc = e.uncorrected_volatile.max(e.uncorrected_aggregate);
        if unc > 0 {
            r.take("ecc_uncorrectable", Level::Critical, points::UNCORRECTABLE_ECC, format!("{unc} uncorrectable ECC error(s)"));
        }
    }
    rate
}

fn retirement_and_remap_rules(r: &mut Reasons, last: &GpuSample) {
    if let Some(p) = &last.retired_pages {
        if p.pending {
            r.take("retirement_pending", Level::Critical, points::RETIREMENT_PENDING, "page retirement pending (needs a reset)".into());
        }
        if p.double_bit > 0 {
            let detail = format!("{} page(s) retired for double-bit errors", p.double_bit);
            r.take("double_bit_retired", Level::Warning, points::DOUBLE_BIT_RETIRED, detail);
        }
    }
    if let Some(m) = &last.remapped_rows {
        if m.failure {
            let detail = "row remapping failed: the card has no spare rows left".into();
            r.take("row_remap_failure", Level::Critical, points::REMAP_FAILURE, detail);
        }
        if m.pending {
            r.take("row_remap_pending", Level::Critical, points::REMAP_PENDING, "row remap pending (needs a reset)".into());
        }
        if m.uncorrectable > 0 {
            let detail = format!("{} row(s) remapped for uncorrectable errors", m.uncorrectable);
            r.take("rows_remapped_uncorrectable", Level::Warning, points::REMAP_UNCORRECTABLE, detail);
        }
    }
}

/// Points per distinct XID code seen.
fn xid_rules(r: &mut Reasons, xids: &[XidEvent]) {
    let mut codes: Vec<u64> = xids.iter().map(|x| x.xid).collect();
    codes.sort_unstable();
    codes.dedup();
    for code in codes {
        let n = xids.iter().filter(|x| x.xid == code).count();
        let (level, pts) =
            if CRITICAL_XIDS.contains(&code) { (Level::Critical, points::XID_CRITICAL) } else { (Level::Warning, points::XID_OTHER) };
        r.take("xid", level, pts, format!("XID {code} ({}) ×{n}", crate::model::nvml::meaning(code)));
    }
}

/// One GPU judged over its window: its last reading, health with reasons,
/// memory temperature against errors, and the XIDs (each with the
/// processes on the GPU then).
#[derive(Clone, Debug, Serialize)]
pub struct GpuAssessment {
    #[serde(flatten)]
    pub sample: GpuSample,
    pub health: Health,
    pub temperature: TemperatureModel,
    pub xid_events: Vec<XidEvent>,
    /// Seconds covered by the readings the rates and model come from.
    pub window_s: f64,
}

/// Health is judged over the last hour of readings.
pub const WINDOW_S: f64 = 3600.0;
/// Readings kept per GPU, whatever the interval.
const MAX_READINGS: usize = 3600;
/// XID events kept for health (the window's); beyond it the oldest go, counted.
const MAX_XIDS: usize = 1024;

/// NVML's GPUs over time: the latest reading, a window of readings per GPU,
/// the XIDs of the window, and each GPU's health over it.
#[derive(Clone, Debug, Default)]
pub struct GpuWatch {
    pub thresholds: Thresholds,
    /// Readings per GPU index, oldest first, covering WINDOW_S.
    windows: BTreeMap<u32, VecDeque<GpuSample>>,
    xids: VecDeque<XidEvent>,
    /// XIDs that did not fit in MAX_XIDS (still counted by the exporter).
    pub xids_dropped: u64,
    pub latest: Vec<GpuSample>,
    pub health: BTreeMap<u32, Health>,
    /// Why NVML cannot be used, while it cannot.
    pub error: Option<String>,
}

impl GpuWatch {
    pub fn new(thresholds: Thresholds) -> Self {
        GpuWatch { thresholds, ..Default::default() }
    }

    /// A reading of every GPU, at `now_s` (CLOCK_MONOTONIC seconds).
    pub fn reading(&mut self, readings: Vec<GpuSample>, now_s: f64) {
        self.error = None;
        for r in &readings {
            let w = self.windows.entry(r.index).or_default();
            w.push_back(r.clone());
            while w.len() > MAX_READINGS || w.front().is_some_and(|f| now_s - f.t_s > WINDOW_S) {
                w.pop_front();
            }
        }
        while self.xids.front().is_some_and(|x| now_s - x.ts_ns as f64 / 1e9 > WINDOW_S) {
            self.xids.pop_front();
        }
        self.latest = readings;
        self.assess();
    }

    /// NVML failed: stale readings are dropped, so that no old value passes for current.
    pub fn failed(&mut self, why: String) {
        self.error = Some(why);
        self.latest.clear();
        self.health.clear();
        self.windows.clear();
    }

    pub fn xid(&mut self, x: XidEvent) {
        if self.xids.len() >= MAX_XIDS {
            self.xids.pop_front();
            self.xids_dropped += 1;
        }
        self.xids.push_back(x);
        self.assess();
    }

    /// The XIDs kept, newest first.
    pub fn recent_xids(&self) -> impl Iterator<Item = &XidEvent> {
        self.xids.iter().rev()
    }

    /// The XIDs of the window on one GPU.
    pub fn xids_of(&self, gpu: u32) -> Vec<XidEvent> {
        self.xids.iter().filter(|x| x.gpu == gpu).cloned().collect()
    }

    /// Each GPU's readings over the window, oldest first.
    pub fn windows(&mut self) -> impl Iterator<Item = (u32, &[GpuSample])> {
        self.windows.iter_mut().map(|(&i, w)| (i, &*w.make_contiguous()))
    }

    /// Each GPU's health over its window, once every GPU has two readings.
    pub fn assessments(&mut self) -> Option<Vec<GpuAssessment>> {
        if self.windows.is_empty() || self.windows.values().any(|w| w.len() < 2) {
            return None;
        }
        let hbm = self.thresholds.hbm_temp_c;
        let xids: BTreeMap<u32, Vec<XidEvent>> = self.windows.keys().map(|&i| (i, self.xids_of(i))).collect();
        let mut out = Vec::new();
        for (i, w) in self.windows.iter_mut() {
            let w = w.make_contiguous();
            let (Some(first), Some(last), Some(health)) = (w.first(), w.last(), self.health.get(i)) else { continue };
            out.push(GpuAssessment {
                health: health.clone(),
                xid_events: xids.get(i).cloned().unwrap_or_default(),
                temperature: temperature_model(w, hbm),
                window_s: last.t_s - first.t_s,
                sample: last.clone(),
            });
        }
        Some(out)
    }

    fn assess(&mut self) {
        let mut health = BTreeMap::new();
        for (&i, w) in &self.windows {
            if let (Some(first), Some(last)) = (w.front(), w.back()) {
                health.insert(i, assess(first, last, &self.xids_of(i), &self.thresholds));
            }
        }
        self.health = health;
    }
}

/// Memory temperature against memory errors over a window of readings.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TemperatureModel {
    /// (memory °C, new corrected errors) at each reading where errors rose.
    pub ecc_increments: Vec<(u32, u64)>,
    /// Pearson correlation of memory temperature with new errors per reading
    /// interval; None with fewer than 3 intervals or no variation.
    pub correlation: Option<f64>,
    /// Time the memory spent above the HBM threshold, in seconds.
    pub seconds_above_hbm: f64,
    pub max_memory_temp_c: Option<u32>,
}

/// Relates temperature and errors over consecutive readings of one GPU.
pub fn temperature_model(window: &[GpuSample], hbm_temp_c: u32) -> TemperatureModel {
    let mut m = TemperatureModel::default();
    let mut pairs: Vec<(f64, f64)> = Vec::new();
    for w in window.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if let Some(temp) = b.memory_temp_c {
            m.max_memory_temp_c = Some(m.max_memory_temp_c.map_or(temp, |t| t.max(temp)));
            if temp > hbm_temp_c {
                m.seconds_above_hbm += b.t_s - a.t_s;
            }
            if let (Some(ea), Some(eb)) = (&a.ecc, &b.ecc) {
                let delta = eb.corrected_volatile.saturating_sub(ea.corrected_volatile);
                if delta > 0 {
                    m.ecc_increments.push((temp, delta));
                }
                pairs.push((temp as f64, delta as f64));
            }
        }
    }
    m.correlation = pearson(&pairs);
    m
}

fn pearson(pairs: &[(f64, f64)]) -> Option<f64> {
    if pairs.len() < 3 {
        return None;
    }
    let n = pairs.len() as f64;
    let (mx, my) = (pairs.iter().map(|p| p.0).sum::<f64>() / n, pairs.iter().map(|p| p.1).sum::<f64>() / n);
    let cov: f64 = pairs.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let vx: f64 = pairs.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let vy: f64 = pairs.iter().map(|(_, y)| (y - my).powi(2)).sum();
    (vx > 0.0 && vy > 0.0).then(|| cov / (vx.sqrt() * vy.sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::nvml::{EccCounts, RemappedRows, RetiredPages};

    #[test]
    fn temperature_against_errors() {
        // Errors rise faster as the memory heats: 86..90 °C, +100, +200, ...
        let window: Vec<GpuSample> = (0..6u64)
            .map(|i| GpuSample {
                t_s: i as f64 * 10.0,
                ecc: Some(EccCounts { corrected_volatile: 100 * i * (i + 1) / 2, ..Default::default() }),
                memory_temp_c: Some(85 + i as u32),
                ..Default::default()
            })
            .collect();
        let m = temperature_model(&window, 87);
        assert_eq!(m.ecc_increments, [(86, 100), (87, 200), (88, 300), (89, 400), (90, 500)]);
        assert!((m.correlation.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(m.seconds_above_hbm, 30.0, "88, 89 and 90 °C readings, 10 s each");
        assert_eq!(m.max_memory_temp_c, Some(90));
        // Constant errors: no correlation to speak of.
        let flat: Vec<GpuSample> = (0..5u64)
            .map(|i| GpuSample {
                t_s: i as f64,
                ecc: Some(EccCounts { corrected_volatile: 10 * i, ..Default::default() }),
                memory_temp_c: Some(80 + i as u32),
                ..Default::default()
            })
            .collect();
        assert_eq!(temperature_model(&flat, 85).correlation, None);
    }

    fn sample(t_s: f64, corrected: u64) -> GpuSample {
        GpuSample { t_s, ecc: Some(EccCounts { corrected_volatile: corrected, ..Default::default() }), ..Default::default() }
    }

    #[test]
    fn healthy_card_scores_100() {
        let h = assess(&sample(0.0, 5), &sample(3600.0, 5), &[], &Thresholds::default());
        assert_eq!((h.score, h.level, h.ecc_corrected_per_hour), (100, Level::Ok, Some(0.0)));
        assert!(h.reasons.is_empty());
    }

    #[test]
    fn ecc_rate_thresholds() {
        let t = Thresholds::default();
        // 10/h is not above 10: fine; 11/h warns; 51/h is critical.
        assert_eq!(assess(&sample(0.0, 0), &sample(3600.0, 10), &[], &t).score, 100);
        let h = assess(&sample(0.0, 0), &sample(3600.0, 11), &[], &t);
        assert_eq!((h.score, h.level), (100 - points::ECC_RATE_WARN, Level::Warning));
        let h = assess(&sample(0.0, 0), &sample(1800.0, 26), &[], &t);
        assert_eq!(h.ecc_corrected_per_hour, Some(52.0));
        assert_eq!((h.score, h.level), (100 - points::ECC_RATE_CRITICAL, Level::Critical));
        // Configurable thresholds.
        let strict = Thresholds { ecc_warn_per_hour: 1.0, ..t };
        assert_eq!(assess(&sample(0.0, 0), &sample(3600.0, 2), &[], &strict).level, Level::Warning);
    }

    #[test]
    fn hardware_failures_are_critical_with_reasons() {
        let mut last = sample(60.0, 0);
        last.ecc.as_mut().unwrap().uncorrected_aggregate = 1;
        last.retired_pages = Some(RetiredPages { single_bit: 2, double_bit: 1, pending: true });
        last.remapped_rows = Some(RemappedRows { correctable: 3, uncorrectable: 1, pending: true, failure: true });
        last.memory_temp_c = Some(90);
        let h = assess(&sample(0.0, 0), &last, &[], &Thresholds::default());
        let rules: Vec<&str> = h.reasons.iter().map(|r| r.rule).collect();
        assert_eq!(
            rules,
            [
                "ecc_uncorrectable",
                "retirement_pending",
                "double_bit_retired",
                "row_remap_failure",
                "row_remap_pending",
                "rows_remapped_uncorrectable",
                "hbm_hot"
            ]
        );
        assert_eq!((h.score, h.level), (0, Level::Critical));
    }

    #[test]
    fn xids_take_points_per_code() {
        let x = |xid| XidEvent { gpu: 0, uuid: String::new(), xid, meaning: "", ts_ns: 0, processes: vec![] };
        let h = assess(&sample(0.0, 0), &sample(1.0, 0), &[x(48), x(48), x(92)], &Thresholds::default());
        let r: Vec<(&str, Level, u32)> = h.reasons.iter().map(|r| (r.rule, r.level, r.points)).collect();
        assert_eq!(r, [("xid", Level::Critical, points::XID_CRITICAL), ("xid", Level::Warning, points::XID_OTHER)]);
        assert!(h.reasons[0].detail.contains("XID 48 (double-bit ECC error (DBE)) ×2"), "{}", h.reasons[0].detail);
        assert_eq!(h.score, 70);
    }

    #[test]
    fn the_watch_keeps_a_window_and_a_bounded_xid_history() {
        let mut w = GpuWatch::new(Thresholds::default());
        let x = |xid, ts_ns| XidEvent { gpu: 0, uuid: String::new(), xid, meaning: "", ts_ns, processes: vec![] };
        w.reading(vec![GpuSample { index: 0, t_s: 0.0, ..Default::default() }], 0.0);
        for i in 0..(MAX_XIDS as u64 + 10) {
            w.xid(x(48, i));
        }
        assert_eq!((w.xids_of(0).len(), w.xids_dropped), (MAX_XIDS, 10), "bounded, and what went is counted");
        assert_eq!(w.health[&0].level, Level::Critical);
        // An hour later the old readings and XIDs have left the window.
        w.reading(vec![GpuSample { index: 0, t_s: WINDOW_S + 10.0, ..Default::default() }], WINDOW_S + 10.0);
        assert!(w.xids_of(0).is_empty());
        assert_eq!(w.windows().map(|(_, r)| r.len()).collect::<Vec<_>>(), [1]);
        assert_eq!(w.health[&0].score, 100);
        // NVML failing drops what would pass for current.
        w.failed("gone".into());
        assert!(w.latest.is_empty() && w.health.is_empty());
    }

    #[test]
    fn unsupported_readings_take_no_points() {
        let h = assess(&GpuSample::default(), &GpuSample { t_s: 10.0, ..Default::default() }, &[], &Thresholds::default());
        assert_eq!((h.score, h.ecc_corrected_per_hour), (100, None));
    }
}
