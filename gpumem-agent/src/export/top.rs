//! What `gpumem top` shows: per GPU a header, then one row per process and
//! GPU. Built from state, the growth detector and NVML; drawn by the terminal
//! UI (commands/top.rs) or written as text (`--once`).
use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use gpumem_common::DEVICE_UNKNOWN;

use super::names::{api_name, bytes, printable, result_name, short_id};
use crate::{
    analysis::{health::Health, leaks::GrowthTracker},
    nvml::GpuSample,
    state::State,
};

/// Samples in a row's trend line.
pub const TREND_LEN: usize = 20;

#[derive(Clone, Debug, PartialEq)]
pub struct GpuHeader {
    pub index: i32,
    pub name: String,
    pub uuid: String,
    /// NVML's used and total bytes, where NVML is there.
    pub nvml: Option<(u64, u64)>,
    pub traced_bytes: u64,
    pub temp_c: Option<u32>,
    pub memory_temp_c: Option<u32>,
    pub health: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub pid: u32,
    pub comm: String,
    /// Pod (namespace/name) or short container id, or "-".
    pub workload: String,
    pub device: i32,
    pub live_bytes: u64,
    pub allocs: u64,
    pub growth_bytes_per_s: f64,
    pub trend: Vec<u64>,
    pub verdict: String,
    pub leaking: bool,
    pub last_failure: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Bytes,
    Growth,
    Allocs,
    Pid,
}

impl SortKey {
    pub fn next(self) -> Self {
        match self {
            SortKey::Bytes => SortKey::Growth,
            SortKey::Growth => SortKey::Allocs,
            SortKey::Allocs => SortKey::Pid,
            SortKey::Pid => SortKey::Bytes,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Bytes => "live bytes",
            SortKey::Growth => "growth",
            SortKey::Allocs => "allocations",
            SortKey::Pid => "pid",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub gpus: Vec<GpuHeader>,
    pub rows: Vec<Row>,
    pub events: u64,
    pub lost: u64,
}


/// `▁▂▃▅▇` from a series, scaled between its own minimum and maximum.
pub fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let (Some(&min), Some(&max)) = (values.iter().min(), values.iter().max()) else { return String::new() };
    values
        .iter()
        .map(|&v| if max == min { BARS[0] } else { BARS[((v - min) as f64 / (max - min) as f64 * 7.0).round() as usize] })
        .collect()
}

pub fn build(state: &State, growth: &mut GrowthTracker, gpus: &[GpuSample], health: &BTreeMap<u32, Health>, lost: u64) -> Snapshot {
    let mut rows = Vec::new();
    let mut traced: BTreeMap<i32, u64> = BTreeMap::new();
    for p in state.processes.values().filter(|p| !p.exited) {
        let workload = match &p.container {
            Some(c) => match (&c.namespace, &c.pod_name, &c.pod_uid, &c.container) {
                (Some(ns), Some(name), _, _) => format!("{ns}/{name}"),
                (None, Some(name), _, _) => name.clone(),
                (_, None, Some(uid), _) => uid.clone(),
                (_, _, _, Some(id)) => short_id(id).to_string(),
                _ => "-".to_string(),
            },
            None => "-".to_string(),
        };
        let last_failure = p.last_failure.map(|(api, result, _)| {
            format!("{} {}", api_name(api), result_name(result).map_or(result.to_string(), |n| n.trim_start_matches("CUDA_ERROR_").to_string()))
        });
        for (&device, t) in &p.devices {
            *traced.entry(device).or_default() += t.live_bytes;
            let verdict = growth.verdict(p.pid, device);
            let (rate, leaking, why) = match &verdict {
                Some(v) => (v.rate_bytes_per_s, v.leaking, if v.leaking { "LEAK".to_string() } else { v.reason.to_string() }),
                None => (0.0, false, "-".to_string()),
            };
            rows.push(Row {
                pid: p.pid,
                comm: printable(&p.comm),
                workload: printable(&workload),
                device,
                live_bytes: t.live_bytes,
                allocs: t.live_allocs,
                growth_bytes_per_s: rate,
                trend: growth.recent(p.pid, device, TREND_LEN),
                verdict: why,
                leaking,
                last_failure: last_failure.clone(),
            });
        }
    }
    let mut headers: Vec<GpuHeader> = gpus
        .iter()
        .map(|g| GpuHeader {
            index: g.index as i32,
            name: printable(&g.name),
            uuid: g.uuid.clone(),
            nvml: g.memory.as_ref().map(|m| (m.used, m.total)),
            traced_bytes: traced.get(&(g.index as i32)).copied().unwrap_or(0),
            temp_c: g.gpu_temp_c,
            memory_temp_c: g.memory_temp_c,
            health: health.get(&g.index).map(|h| h.score),
        })
        .collect();
    // GPUs traced but not known to NVML (no NVML, or CUDA_VISIBLE_DEVICES).
    for (&device, &b) in &traced {
        if !headers.iter().any(|h| h.index == device) {
            headers.push(GpuHeader {
                index: device,
                name: String::new(),
                uuid: String::new(),
                nvml: None,
                traced_bytes: b,
                temp_c: None,
                memory_temp_c: None,
                health: None,
            });
        }
    }
    headers.sort_by_key(|h| h.index);
    let mut s = Snapshot { gpus: headers, rows, events: state.events, lost };
    s.sort(SortKey::Bytes);
    s
}

impl Snapshot {
    pub fn sort(&mut self, key: SortKey) {
        self.rows.sort_by(|a, b| {
            let primary = match key {
                SortKey::Bytes => b.live_bytes.cmp(&a.live_bytes),
                SortKey::Growth => b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s),
                SortKey::Allocs => b.allocs.cmp(&a.allocs),
                SortKey::Pid => a.pid.cmp(&b.pid),
            };
            primary.then(a.pid.cmp(&b.pid)).then(a.device.cmp(&b.device))
        });
    }

    /// Rows whose comm, workload or pid contains `filter`, on `device` (None: all).
    pub fn visible(&self, filter: &str, device: Option<i32>) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| device.is_none_or(|d| r.device == d))
            .filter(|r| filter.is_empty() || r.comm.contains(filter) || r.workload.contains(filter) || r.pid.to_string().contains(filter))
            .collect()
    }

    pub fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        let procs = self.rows.iter().map(|r| r.pid).collect::<std::collections::BTreeSet<_>>().len();
        writeln!(out, "gpumem top: {} GPU(s), {procs} process(es), {} events, {} lost", self.gpus.len(), self.events, self.lost)?;
        for g in &self.gpus {
            writeln!(out, "{}", gpu_line(g))?;
        }
        writeln!(out, "{}", header_line())?;
        for r in &self.rows {
            writeln!(out, "{}", row_line(r))?;
        }
        Ok(())
    }
}

pub fn device_name(d: i32) -> String {
    if d == DEVICE_UNKNOWN { "?".into() } else { d.to_string() }
}

pub fn gpu_line(g: &GpuHeader) -> String {
    let nvml = g.nvml.map_or("NVML n/a".to_string(), |(used, total)| format!("{} / {} used", bytes(used), bytes(total)));
    let temp = match (g.temp_c, g.memory_temp_c) {
        (Some(t), Some(m)) => format!(", {t} °C, HBM {m} °C"),
        (Some(t), None) => format!(", {t} °C"),
        _ => String::new(),
    };
    let health = g.health.map_or(String::new(), |h| format!(", health {h}"));
    let name = if g.name.is_empty() { String::new() } else { format!(" {}", g.name) };
    format!("GPU {}{name}: {nvml}, traced {}{temp}{health}", device_name(g.index), bytes(g.traced_bytes))
}

pub fn header_line() -> String {
    format!(
        "{:>7} {:<24} {:<15} {:>3} {:>11} {:>7} {:>11} {:<20} {:<16} {}",
        "PID", "POD/CONTAINER", "COMM", "GPU", "LIVE", "ALLOCS", "GROWTH", "TREND", "VERDICT", "LAST FAILURE"
    )
}

pub fn growth(rate: f64) -> String {
    let sign = if rate < 0.0 { "-" } else { "" };
    format!("{sign}{}/s", bytes(rate.abs() as u64))
}

pub fn row_line(r: &Row) -> String {
    let workload: String = r.workload.chars().take(24).collect();
    let comm: String = r.comm.chars().take(15).collect();
    format!(
        "{:>7} {:<24} {:<15} {:>3} {:>11} {:>7} {:>11} {:<20} {:<16} {}",
        r.pid,
        workload,
        comm,
        device_name(r.device),
        bytes(r.live_bytes),
        r.allocs,
        growth(r.growth_bytes_per_s),
        sparkline(&r.trend),
        r.verdict,
        r.last_failure.as_deref().unwrap_or("-")
    )
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing::ev, Limits};

    #[test]
    fn rows_per_process_and_gpu_sorted_and_filtered() {
        let mut s = State::new(Limits::default());
        for (pid, dev, mib) in [(10u32, 0, 5u64), (11, 1, 9), (11, 0, 1)] {
            let at = |e: Event| Event { pid, tid: pid, ..e };
            s.apply(&at(Event { handle: 0xc0 + dev as u64, device: dev, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }));
            s.apply(&at(Event { handle: 0xc0 + dev as u64, ..ev(api::CU_CTX_SET_CURRENT) }));
            s.apply(&at(Event { addr: 0x1000 * mib, size: mib << 20, ..ev(api::CU_MEM_ALLOC_V2) }));
        }
        s.apply(&Event { pid: 10, tid: 10, result: 2, size: 1 << 30, ..ev(api::CU_MEM_ALLOC_V2) });
        let mut g = GrowthTracker::default();
        let mut snap = build(&s, &mut g, &[], &BTreeMap::new(), 0);
        assert_eq!(snap.rows.iter().map(|r| (r.pid, r.device, r.live_bytes >> 20)).collect::<Vec<_>>(), [(11, 1, 9), (10, 0, 5), (11, 0, 1)]);
        assert_eq!(snap.gpus.iter().map(|g| (g.index, g.traced_bytes >> 20)).collect::<Vec<_>>(), [(0, 6), (1, 9)]);
        assert_eq!(snap.rows[1].last_failure.as_deref(), Some("cuMemAlloc_v2 OUT_OF_MEMORY"));
        snap.sort(SortKey::Pid);
        assert_eq!(snap.rows[0].pid, 10);
        assert_eq!(snap.visible("", Some(1)).len(), 1);
        assert_eq!(snap.visible("11", None).len(), 2);
        let mut text = Vec::new();
        snap.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with("gpumem top: 2 GPU(s), 2 process(es), 10 events, 0 lost\nGPU 0: NVML n/a, traced 6.0 MiB\n"), "{text}");
    }

    #[test]
    fn escape_sequences_from_traced_processes_do_not_reach_the_terminal() {
        assert_eq!(sparkline(&[0, 4, 8]), "▁▅█");
        assert_eq!(sparkline(&[3, 3]), "▁▁");
    }
}
