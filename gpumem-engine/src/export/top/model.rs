//! What `gpumem top` shows: per GPU a header, then one row per process and
//! GPU, from the analysis view; drawn by the terminal UI (tui.rs) or written
//! as text (`--once`).
use std::io::{self, Write};

use gpumem_common::DEVICE_UNKNOWN;

pub use crate::pipeline::Kept;
use crate::{
    analysis::view::View,
    names::{api_name, bytes, printable, result_name},
};

/// Samples in a row's trend (growth samples, 0.25 s apart: the last minute,
/// what top's chart draws).
pub const TREND_LEN: usize = 240;
/// Of them, the latest in a row's sparkline.
pub const SPARK_LEN: usize = 20;

/// The latest [`SPARK_LEN`] samples of a trend.
pub fn spark_tail(trend: &[u64]) -> &[u64] {
    &trend[trend.len().saturating_sub(SPARK_LEN)..]
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub pid: u32,
    pub comm: String,
    /// Pod (namespace/name) or short container id, or "-".
    pub workload: String,
    pub device: i32,
    pub live_bytes: u64,
    pub allocs: u64,
    /// Live tensor bytes, where PyTorch's allocator probes fired.
    pub allocated_bytes: Option<u64>,
    pub growth_bytes_per_s: f64,
    pub trend: Vec<u64>,
    pub verdict: String,
    pub leaking: bool,
    pub last_failure: Option<String>,
    /// A process NVML lists whose calls were never traced: `live_bytes` is
    /// NVML's figure, held since before tracing began.
    pub before_tracing: bool,
    /// Its host memory: resident and swapped out (None: not read).
    #[serde(default)]
    pub host_resident_bytes: Option<u64>,
    #[serde(default)]
    pub host_swap_bytes: Option<u64>,
    /// Where its memory went (by owner, pool, imports, ...), for people:
    /// shown above its stacks when the row is opened.
    #[serde(default)]
    pub breakdown: Vec<String>,
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

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub gpus: Vec<GpuHeader>,
    pub rows: Vec<Row>,
    pub events: u64,
    pub lost: u64,
    pub kept: Kept,
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

/// The snapshot of a view (live processes only).
pub fn build(view: &View, host: &crate::model::host::HostMemory, events: u64, lost: u64, kept: Kept) -> Snapshot {
    let resident = |pid: u32| host.processes.get(&pid).map(|h| h.resident_bytes);
    let swap = |pid: u32| host.processes.get(&pid).map(|h| h.swap_bytes);
    let rows = view
        .rows
        .iter()
        .filter(|r| !r.exited)
        .map(|r| Row {
            pid: r.pid,
            comm: printable(&r.comm),
            workload: printable(&r.workload.name()),
            device: r.device,
            live_bytes: r.totals.live_bytes,
            allocs: r.totals.live_allocs,
            allocated_bytes: r.allocated_bytes(),
            growth_bytes_per_s: r.growth_bytes_per_s(),
            trend: r.trend.clone(),
            verdict: match &r.growth {
                Some(v) if v.leaking => "LEAK".to_string(),
                _ if r.cache_growth() => "CACHE GROWTH".to_string(),
                Some(v) => v.reason.to_string(),
                None => "-".to_string(),
            },
            leaking: r.leaking(),
            last_failure: r.last_failure.map(|f| {
                let result = result_name(f.result).map_or(f.result.to_string(), |n| n.trim_start_matches("CUDA_ERROR_").to_string());
                format!("{} {result}", api_name(f.api))
            }),
            before_tracing: false,
            host_resident_bytes: resident(r.pid),
            host_swap_bytes: swap(r.pid),
            breakdown: r
                .breakdown
                .as_deref()
                .map(|b| crate::export::breakdown_lines(b).iter().map(|l| printable(l)).collect())
                .unwrap_or_default(),
        })
        .chain(view.untraced.iter().map(|u| Row {
            pid: u.pid,
            comm: printable(&u.comm),
            workload: printable(&u.workload.name()),
            device: u.gpu as i32,
            live_bytes: u.nvml_bytes,
            allocs: 0,
            allocated_bytes: None,
            growth_bytes_per_s: 0.0,
            trend: Vec::new(),
            verdict: "BEFORE TRACING (NVML)".to_string(),
            leaking: false,
            last_failure: None,
            before_tracing: true,
            host_resident_bytes: resident(u.pid),
            host_swap_bytes: swap(u.pid),
            breakdown: Vec::new(),
        }))
        .collect();
    let gpus = view
        .gpus
        .iter()
        .map(|g| GpuHeader {
            index: g.index,
            name: g.nvml.as_ref().map_or(String::new(), |n| printable(&n.name)),
            uuid: g.nvml.as_ref().map_or(String::new(), |n| n.uuid.clone()),
            nvml: g.nvml.as_ref().and_then(|n| n.memory.as_ref()).map(|m| (m.used, m.total)),
            traced_bytes: g.traced_bytes,
            temp_c: g.nvml.as_ref().and_then(|n| n.gpu_temp_c),
            memory_temp_c: g.nvml.as_ref().and_then(|n| n.memory_temp_c),
            health: g.health.as_ref().map(|h| h.score),
        })
        .collect();
    let mut s = Snapshot { gpus, rows, events, lost, kept };
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
        let k = &self.kept;
        writeln!(
            out,
            "kept: {} process(es) ({} exited, peak {}), {} growth series (peak {})",
            k.processes, k.exited, k.peak_processes, k.growth_series, k.peak_growth_series
        )
    }
}

pub fn device_name(d: i32) -> String {
    if d == DEVICE_UNKNOWN {
        "?".into()
    } else {
        d.to_string()
    }
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
        "{:>7} {:<24} {:<15} {:>3} {:>11} {:>7} {:>11} {:>11} {:>11} {:>11} {:<20} {:<16} {}",
        "PID", "POD/CONTAINER", "COMM", "GPU", "LIVE", "ALLOCS", "TENSORS", "HOST", "SWAP", "GROWTH", "TREND", "VERDICT", "LAST FAILURE"
    )
}

/// The ALLOCS column: "-" for a process whose calls were never traced.
pub fn allocs(r: &Row) -> String {
    if r.before_tracing {
        "-".to_string()
    } else {
        r.allocs.to_string()
    }
}

/// A host memory column: bytes, or "-" where it was not read.
pub fn host_bytes(b: Option<u64>) -> String {
    b.map_or("-".to_string(), bytes)
}

/// The TENSORS column: live tensor bytes, or "-" where PyTorch's probes did not fire.
pub fn allocated(r: &Row) -> String {
    r.allocated_bytes.map_or("-".to_string(), bytes)
}

pub fn growth(rate: f64) -> String {
    let sign = if rate < 0.0 { "-" } else { "" };
    format!("{sign}{}/s", bytes(rate.abs() as u64))
}

pub fn row_line(r: &Row) -> String {
    let workload: String = r.workload.chars().take(24).collect();
    let comm: String = r.comm.chars().take(15).collect();
    format!(
        "{:>7} {:<24} {:<15} {:>3} {:>11} {:>7} {:>11} {:>11} {:>11} {:>11} {:<20} {:<16} {}",
        r.pid,
        workload,
        comm,
        device_name(r.device),
        bytes(r.live_bytes),
        allocs(r),
        allocated(r),
        host_bytes(r.host_resident_bytes),
        host_bytes(r.host_swap_bytes),
        growth(r.growth_bytes_per_s),
        sparkline(spark_tail(&r.trend)),
        r.verdict,
        r.last_failure.as_deref().unwrap_or("-")
    )
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::{
        analysis::{health::GpuWatch, series::GrowthTracker, view::ViewOptions},
        state::{testing::ev, Limits, State},
    };

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
        let view = View::build(&s, &mut g, &GpuWatch::default(), &ViewOptions::default());
        let mut snap = build(&view, &Default::default(), s.events, 0, Kept::default());
        assert_eq!(
            snap.rows.iter().map(|r| (r.pid, r.device, r.live_bytes >> 20)).collect::<Vec<_>>(),
            [(11, 1, 9), (10, 0, 5), (11, 0, 1)]
        );
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
