//! `gpumem report FILE -o report.html [--svg chart.svg]`: a recording replayed
//! through the usual state and analyses, with each process's live bytes
//! kept over time, drawn as a self-contained page or a single chart.
use std::{collections::BTreeMap, path::Path, process::ExitCode};

use anyhow::{anyhow, Context as _, Result};
use gpumem_common::{api, Event};

use super::ingest::{self, Ingest, Ingested, Replayer};
use crate::{
    analysis::{
        distributions,
        leaks::{self, GrowthTracker},
    },
    cli::ReportArgs,
    export::report::{size_bucket, Mark, ReportData},
    record::{self, NvmlPoint, XidPoint},
    state::{Limits, State},
};

/// Points kept per (process, GPU) series; beyond it every other point goes
/// (a chart is 1100 pixels wide).
const MAX_POINTS: usize = 4000;

struct Collect {
    ingest: Ingest,
    growth: GrowthTracker,
    data: ReportData,
    started_ns: Option<u64>,
    /// Devices each process has held memory on.
    held: BTreeMap<u32, Vec<i32>>,
}

impl Collect {
    fn t(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.started_ns.unwrap_or(ts_ns)) as f64 / 1e9
    }

    fn point(&mut self, pid: u32, device: i32, t: f64, bytes: u64) {
        let s = self.data.series.entry((pid, device)).or_default();
        if s.last().is_some_and(|&(_, b)| b == bytes) {
            return;
        }
        s.push((t, bytes));
        if s.len() > MAX_POINTS {
            let thinned: Vec<(f64, u64)> = s.iter().copied().enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, p)| p).collect();
            *s = thinned;
        }
    }
}

impl Replayer for Collect {
    fn parts(&mut self) -> (&mut Ingest, &mut GrowthTracker) {
        (&mut self.ingest, &mut self.growth)
    }

    fn after(&mut self, ev: &Event, Ingested { applied, .. }: Ingested) -> bool {
        self.data.events += 1;
        if self.started_ns.is_none() {
            self.started_ns = Some(ev.ts_ns);
        }
        let t = self.t(ev.ts_ns);
        if let Some(o) = distributions::observe(ev, &applied) {
            if let Some((_, size)) = o.allocation {
                *self.data.size_buckets.entry(size_bucket(size)).or_default() += 1;
            }
        }
        if let Some(oom) = &applied.cuda_oom {
            let label = format!("CUDA OOM pid {} ({})", ev.pid, crate::export::names::bytes(oom.requested));
            self.data.marks.push(Mark { t_s: t, device: Some(oom.device), label });
        }
        if applied.oom_kill.is_some() {
            self.data.marks.push(Mark { t_s: t, device: None, label: format!("OOM kill pid {}", ev.pid) });
        }
        let Some(p) = self.ingest.state.processes.get(&ev.pid) else { return true };
        if !p.comm.is_empty() {
            self.data.comm.insert(ev.pid, p.comm.clone());
        }
        let now: Vec<(i32, u64)> = p.devices.iter().map(|(&d, t)| (d, t.live_bytes)).collect();
        let held = self.held.entry(ev.pid).or_default();
        for &(d, _) in &now {
            if !held.contains(&d) {
                held.push(d);
            }
        }
        // A device the process no longer has memory on (freed, exited) reads 0.
        let gone: Vec<i32> = held.iter().copied().filter(|d| !now.iter().any(|(n, _)| n == d)).collect();
        for (d, b) in now {
            self.point(ev.pid, d, t, b);
        }
        if ev.api == api::PROCESS_EXIT || !gone.is_empty() {
            for d in gone {
                self.point(ev.pid, d, t, 0);
            }
        }
        true
    }

    fn nvml(&mut self, p: NvmlPoint) {
        self.data.nvml.push(p);
    }

    fn xid(&mut self, x: XidPoint) {
        self.data.marks.push(Mark { t_s: x.t_s, device: Some(x.gpu as i32), label: format!("XID {}", x.xid) });
        self.data.xids.push(x);
    }
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let mut reader = record::Reader::open(&args.file).map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let mut c = Collect {
        ingest: Ingest::replay(State::new(Limits::default())),
        growth: GrowthTracker::default(),
        data: ReportData::default(),
        started_ns: None,
        held: BTreeMap::new(),
    };
    let end = ingest::replay(&mut reader, &mut c);
    // Event times and NVML/XID times share the session's start.
    if let Some(h) = &end.header {
        let offset = c.started_ns.map_or(0.0, |s| s.saturating_sub(h.started_ns) as f64 / 1e9);
        for s in c.data.series.values_mut() {
            for p in s.iter_mut() {
                p.0 += offset;
            }
        }
        for m in c.data.marks.iter_mut().filter(|m| !m.label.starts_with("XID")) {
            m.t_s += offset;
        }
    }
    c.data.marks.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    c.data.leaks = leaks::find(&c.ingest.state, &mut c.ingest.stacks, &mut c.growth, end.footer.ended_ns, (args.older_than * 1e9) as u64, 5);
    c.data.header = end.header.clone();
    c.data.footer = end.footer.clone();
    c.data.damage = end.damage.as_ref().map(|e| e.to_string());
    if let Some(out) = &args.output {
        let html = c.data.html().map_err(|e| anyhow!("drawing the report: {e}"))?;
        write(out, &html)?;
        eprintln!("gpumem: wrote {} ({} KiB, {} events, {} process/GPU series)", out.display(), html.len() / 1024, c.data.events, c.data.series.len());
    }
    if let Some(svg_path) = &args.svg {
        let svg = c.data.timeline_svg(args.gpu).map_err(|e| anyhow!("drawing the chart: {e}"))?;
        write(svg_path, &svg)?;
        eprintln!("gpumem: wrote {}", svg_path.display());
    }
    if let Some(e) = &end.damage {
        eprintln!("gpumem: {}: {e}; the report covers the {} events before it", args.file.display(), end.events);
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
