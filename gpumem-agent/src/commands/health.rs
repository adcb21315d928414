//! `gpumem health`: NVML readings and health per GPU.
use std::{
    collections::{BTreeMap, VecDeque},
    io::Write as _,
    process::ExitCode,
    time::Duration,
};

use anyhow::Result;
use serde::Serialize;

use crate::{
    analysis::{health, leaks::monotonic_ns},
    cli::HealthArgs,
    export::names::bytes,
    nvml::{
        xid::{XidEvent, XidWatcher},
        GpuSample, Sampler,
    },
};

/// Exit status when NVML cannot be used (no library, no driver, no device).
pub const EXIT_NO_NVML: u8 = 3;

#[derive(Serialize)]
struct GpuHealth {
    #[serde(flatten)]
    sample: GpuSample,
    health: health::Health,
    temperature: health::TemperatureModel,
    /// XID events in the window, each with the processes holding memory on the GPU then.
    xid_events: Vec<XidEvent>,
    /// Seconds covered by the readings the rates and model come from.
    window_s: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(rename = "type")]
    kind: &'static str,
    interval_s: f64,
    /// Why XID events are not watched, if they are not (or GPUs that cannot report them).
    xid_watch: String,
    gpus: Vec<GpuHealth>,
}

fn now_s() -> f64 {
    monotonic_ns() as f64 / 1e9
}

/// Readings kept per GPU for --watch (older ones slide out).
const WINDOW_READINGS: usize = 3600;

pub fn run(args: HealthArgs) -> Result<ExitCode> {
    let mut sampler = match Sampler::open(args.nvml.as_deref().map(|p| p.as_os_str())) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpumem: {e}; GPU health needs NVML (the NVIDIA driver). Tracing works without it.");
            return Ok(ExitCode::from(EXIT_NO_NVML));
        }
    };
    let t = health::Thresholds {
        ecc_warn_per_hour: args.ecc_warn_per_hour,
        ecc_critical_per_hour: args.ecc_critical_per_hour,
        hbm_temp_c: args.hbm_temp_c,
    };
    // XIDs arrive on their own thread, from the start.
    let watcher = XidWatcher::start(args.nvml.as_ref().map(|p| p.as_os_str().to_os_string()), monotonic_ns);
    let xid_watch = match &watcher {
        Ok(w) if w.unsupported.is_empty() => "watching".to_string(),
        Ok(w) => format!("watching; not supported on GPU(s) {:?}", w.unsupported),
        Err(e) => format!("not watched: {e}"),
    };
    let mut xids: Vec<XidEvent> = Vec::new();
    // Readings per GPU (by UUID), oldest first.
    let mut windows: BTreeMap<String, VecDeque<GpuSample>> = BTreeMap::new();
    let mut reports = 0u64;
    loop {
        let readings = match sampler.sample(now_s()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("gpumem: {e}");
                return Ok(ExitCode::from(EXIT_NO_NVML));
            }
        };
        for r in readings {
            let w = windows.entry(r.uuid.clone()).or_default();
            if w.len() == WINDOW_READINGS {
                w.pop_front();
            }
            w.push_back(r);
        }
        if let Ok(w) = &watcher {
            xids.extend(w.events.try_iter());
        }
        if windows.values().all(|w| w.len() >= 2) {
            let gpus = windows
                .values_mut()
                .map(|w| {
                    let w = w.make_contiguous();
                    let (first, last) = (&w[0], &w[w.len() - 1]);
                    let mine: Vec<XidEvent> = xids.iter().filter(|x| x.uuid == last.uuid).cloned().collect();
                    GpuHealth {
                        health: health::assess(first, last, &mine, &t),
                        xid_events: mine,
                        temperature: health::temperature_model(w, t.hbm_temp_c),
                        window_s: last.t_s - first.t_s,
                        sample: last.clone(),
                    }
                })
                .collect();
            print(&Report { kind: "health", interval_s: args.interval, xid_watch: xid_watch.clone(), gpus }, args.json)?;
            reports += 1;
            if !args.watch || args.count.is_some_and(|c| reports >= c) {
                return Ok(ExitCode::SUCCESS);
            }
        }
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}

fn print(report: &Report, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
        return Ok(out.flush()?);
    }
    for g in &report.gpus {
        let s = &g.sample;
        let h = &g.health;
        writeln!(out, "GPU {} {} {} ({}): health {}/100, {:?}", s.index, s.name, s.uuid, s.pci_bus_id, h.score, h.level)?;
        if let Some(m) = &s.memory {
            writeln!(out, "  memory: {} used of {}, {} free, {} reserved", bytes(m.used), bytes(m.total), bytes(m.free), bytes(m.reserved))?;
        }
        if let Some(ps) = &s.processes {
            for (pid, b) in ps {
                writeln!(out, "  process {pid}: {}", bytes(*b))?;
            }
        }
        if let Some(e) = &s.ecc {
            let rate = h.ecc_corrected_per_hour.map_or("?".into(), |r| format!("{r:.0}/h"));
            writeln!(
                out,
                "  ECC: corrected {} volatile / {} aggregate ({rate}), uncorrected {} / {}",
                e.corrected_volatile, e.corrected_aggregate, e.uncorrected_volatile, e.uncorrected_aggregate
            )?;
        }
        if let Some(by) = &s.ecc_by_location {
            let parts: Vec<String> = by.iter().map(|(k, (c, u))| format!("{k} {c}/{u}")).collect();
            writeln!(out, "  ECC by location (corrected/uncorrected): {}", parts.join(", "))?;
        }
        if let Some(r) = &s.retired_pages {
            writeln!(out, "  retired pages: {} single-bit, {} double-bit, pending {}", r.single_bit, r.double_bit, r.pending)?;
        }
        if let Some(r) = &s.remapped_rows {
            writeln!(
                out,
                "  remapped rows: {} correctable, {} uncorrectable, pending {}, failure {}",
                r.correctable, r.uncorrectable, r.pending, r.failure
            )?;
        }
        let temp = |t: Option<u32>| t.map_or("n/a".to_string(), |t| format!("{t} °C"));
        writeln!(out, "  temperature: GPU {}, memory {}", temp(s.gpu_temp_c), temp(s.memory_temp_c))?;
        if !s.unsupported.is_empty() {
            writeln!(out, "  not supported: {}", s.unsupported.iter().copied().collect::<Vec<_>>().join(", "))?;
        }
        let m = &g.temperature;
        if !m.ecc_increments.is_empty() || m.seconds_above_hbm > 0.0 {
            let corr = m.correlation.map_or("n/a".to_string(), |c| format!("{c:.2}"));
            writeln!(
                out,
                "  memory temperature vs errors over {:.0} s: {} increase(s), correlation {corr}, {:.0} s above the HBM threshold",
                g.window_s,
                m.ecc_increments.len(),
                m.seconds_above_hbm
            )?;
        }
        for x in &g.xid_events {
            let procs: Vec<String> = x.processes.iter().map(|(p, b)| format!("{p} ({})", bytes(*b))).collect();
            writeln!(out, "  XID {} ({}): processes on the GPU then: {}", x.xid, x.meaning, if procs.is_empty() { "none".into() } else { procs.join(", ") })?;
        }
        for r in &h.reasons {
            writeln!(out, "  -{:<3} {:?} {}: {}", r.points, r.level, r.rule, r.detail)?;
        }
    }
    Ok(out.flush()?)
}
