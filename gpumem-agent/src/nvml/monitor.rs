//! NVML over time, for the daemons (`serve`, `top`): a reading of every GPU
//! when asked, health over the last hour of readings, XIDs as they come,
//! and NVML reopened after a failure (the driver may load later).
use std::collections::{BTreeMap, VecDeque};

use super::{
    xid::{XidEvent, XidWatcher},
    GpuSample, Sampler,
};
use crate::analysis::{
    health::{self, Health, Thresholds},
    leaks::monotonic_ns,
};

/// Health (ECC rate, XIDs) is judged over the last hour of readings.
const HEALTH_WINDOW_S: f64 = 3600.0;

/// NVML, when it is there: readings per GPU over the health window, and XIDs.
pub struct Monitor {
    lib: Option<std::ffi::OsString>,
    /// `--nvml none`: never loaded.
    disabled: bool,
    sampler: Option<Sampler>,
    xids: Option<XidWatcher>,
    /// Readings per GPU index, oldest first, covering HEALTH_WINDOW_S.
    windows: BTreeMap<u32, VecDeque<GpuSample>>,
    /// XID events within the window, for health.
    recent_xids: VecDeque<crate::nvml::xid::XidEvent>,
    pub latest: Vec<GpuSample>,
    pub health: BTreeMap<u32, Health>,
    /// Why NVML cannot be used, while it cannot.
    pub error: Option<String>,
}

impl Monitor {
    pub fn open(lib: Option<std::ffi::OsString>) -> Self {
        let mut g = Monitor {
            disabled: lib.as_deref() == Some(std::ffi::OsStr::new("none")),
            lib,
            sampler: None,
            xids: None,
            windows: BTreeMap::new(),
            recent_xids: VecDeque::new(),
            latest: Vec::new(),
            health: BTreeMap::new(),
            error: None,
        };
        g.connect();
        g
    }

    /// (Re)opens NVML: the driver may load after the agent starts.
    fn connect(&mut self) {
        if self.disabled {
            self.error = Some("NVML not used (--nvml none)".into());
            return;
        }
        match Sampler::open(self.lib.as_deref()) {
            Ok(s) => {
                self.sampler = Some(s);
                self.error = None;
                if self.xids.is_none() {
                    self.xids = XidWatcher::start(self.lib.clone(), monotonic_ns).ok();
                }
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    /// One reading of every GPU; a failure drops the stale readings (so no
    /// old value is exported as current) and NVML is reopened next time.
    /// Also returns the XID events that arrived since the last call.
    pub fn sample(&mut self, thresholds: &Thresholds) -> Vec<XidEvent> {
        if self.sampler.is_none() && !self.disabled {
            self.connect();
        }
        let xids = self.take_xids();
        let Some(sampler) = self.sampler.as_mut() else { return xids };
        let now = monotonic_ns() as f64 / 1e9;
        match sampler.sample(now) {
            Ok(readings) => {
                self.error = None;
                for r in &readings {
                    let w = self.windows.entry(r.index).or_default();
                    w.push_back(r.clone());
                    while w.front().is_some_and(|f| now - f.t_s > HEALTH_WINDOW_S) {
                        w.pop_front();
                    }
                }
                while self.recent_xids.front().is_some_and(|x| now - x.ts_ns as f64 / 1e9 > HEALTH_WINDOW_S) {
                    self.recent_xids.pop_front();
                }
                self.health = self
                    .windows
                    .iter()
                    .filter_map(|(&i, w)| {
                        let (first, last) = (w.front()?, w.back()?);
                        let mine: Vec<_> = self.recent_xids.iter().filter(|x| x.gpu == i).cloned().collect();
                        Some((i, health::assess(first, last, &mine, thresholds)))
                    })
                    .collect();
                self.latest = readings;
            }
            Err(e) => {
                eprintln!("gpumem: {e}; GPU series are left out until NVML answers again");
                self.error = Some(e.to_string());
                self.sampler = None;
                self.latest.clear();
                self.health.clear();
                self.windows.clear();
            }
        }
        xids
    }

    /// The XID events that arrived since the last call (also kept for health).
    pub fn take_xids(&mut self) -> Vec<XidEvent> {
        let new: Vec<XidEvent> = self.xids.as_ref().map(|w| w.events.try_iter().collect()).unwrap_or_default();
        self.recent_xids.extend(new.iter().cloned());
        new
    }
}

