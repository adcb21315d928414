//! `gpumem health`'s report: per GPU its readings, health with reasons,
//! memory temperature against errors, and XIDs with the processes then.
use std::io::{self, Write};

use serde::Serialize;

use crate::{analysis::health::GpuAssessment, names::bytes};

#[derive(Serialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub interval_s: f64,
    /// Why XID events are not watched, if they are not (or GPUs that cannot report them).
    pub xid_watch: String,
    pub gpus: Vec<GpuAssessment>,
}

impl Report {
    /// On stdout: one JSON object (a line), or the human report.
    pub fn print(&self, json: bool) -> io::Result<()> {
        let mut out = io::stdout().lock();
        if json {
            serde_json::to_writer(&mut out, self)?;
            writeln!(out)?;
            return out.flush();
        }
        for g in &self.gpus {
            write_gpu(&mut out, g)?;
        }
        out.flush()
    }
}

fn write_gpu(out: &mut impl Write, g: &GpuAssessment) -> io::Result<()> {
    let s = &g.sample;
    let h = &g.health;
    writeln!(out, "GPU {} {} {} ({}): health {}/100, {:?}", s.index, s.name, s.uuid, s.pci_bus_id, h.score, h.level)?;
    if let Some(m) = &s.memory {
        writeln!(out, "  memory: {} used of {}, {} free, {} reserved", bytes(m.used), bytes(m.total), bytes(m.free), bytes(m.reserved))?;
    }
    match s.addressing_mode {
        Some(mode) if s.reaches_host_memory() => writeln!(
            out,
            "  addressing: {}: memory the GPU reaches from malloc or mmap is not in gpumem's per-process figures",
            mode.to_uppercase()
        )?,
        Some(mode) => writeln!(out, "  addressing: {mode}")?,
        None => {}
    }
    if let Some(node) = s.numa_node {
        writeln!(out, "  NUMA node {node} is this GPU's memory: `gpumem serve` exports each process's pages there")?;
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
        writeln!(
            out,
            "  XID {} ({}): processes on the GPU then: {}",
            x.xid,
            x.meaning,
            if procs.is_empty() { "none".into() } else { procs.join(", ") }
        )?;
    }
    for r in &h.reasons {
        writeln!(out, "  -{:<3} {:?} {}: {}", r.points, r.level, r.rule, r.detail)?;
    }
    Ok(())
}
