//! `gpumem export --format F [RECORDING] -o FILE`: what the analyses found,
//! in a format another tool reads, from a recording replayed through the
//! usual pipeline or from a running daemon. The file appears whole or not
//! at all (written under a temporary name, then renamed).
use std::{convert::Infallible, io::Write as _, path::Path, process::ExitCode};

use anyhow::{bail, Context as _, Result};

use crate::{
    cli::export::{ExportArgs, Format},
    runtime::{self, Ctx, End, Output},
};
use gpumem_engine::{
    analysis::{history, leaks, profile, snapshot},
    export::{perfetto, pprof, torch_snapshot},
    pipeline::{self, Pipeline},
};

/// What an export asks for, besides the file (the daemon's query too).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Query {
    pub format: Format,
    pub pid: Option<u32>,
    pub layers: profile::Layers,
    pub older_than_s: f64,
}

impl Query {
    pub fn of(a: &ExportArgs) -> Self {
        Query { format: a.format, pid: a.pid, layers: a.layers, older_than_s: a.older_than }
    }

    /// The query string of the local API's /v1/export.
    pub fn to_query(&self) -> String {
        let layers = if self.layers == profile::Layers::Tensors { "tensors" } else { "driver" };
        let pid = self.pid.map_or_else(String::new, |p| p.to_string());
        format!("format={}&pid={pid}&layers={layers}&older_than_s={}", self.format.name(), self.older_than_s)
    }

    /// Parses the query string of /v1/export.
    pub fn parse(q: &str) -> Result<Self, String> {
        use clap::ValueEnum as _;
        let mut out = Query { format: Format::Pprof, pid: None, layers: profile::Layers::Driver, older_than_s: 5.0 };
        let mut format = None;
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |what: &str| format!("bad {k}={v}: {what}");
            match k {
                "format" => format = Some(Format::from_str(v, false).map_err(|_| bad("not a format"))?),
                "pid" if v.is_empty() => out.pid = None,
                "pid" => out.pid = Some(v.parse().map_err(|_| bad("not a pid"))?),
                "layers" => out.layers = profile::Layers::from_str(v, false).map_err(|_| bad("driver or tensors"))?,
                "older_than_s" => out.older_than_s = v.parse().map_err(|_| bad("not a number"))?,
                _ => return Err(format!("unknown parameter {k}")),
            }
        }
        out.format = format.ok_or("format=F is missing")?;
        Ok(out)
    }
}

/// The session the pipeline saw: when it ended and how long it ran.
pub struct Span {
    /// CLOCK_MONOTONIC at the end (the events' clock).
    pub ended_ns: u64,
    pub duration_s: f64,
    /// Wall-clock nanoseconds at the end, where known.
    pub wall_end_ns: i64,
    pub recorded_by: String,
}

/// An export, rendered, with a line that says what is in it.
pub struct Rendered {
    pub bytes: Vec<u8>,
    pub what: String,
}

/// Renders what the pipeline holds as `q` asks.
pub fn render(p: &mut Pipeline, q: &Query, span: &Span) -> Result<Rendered> {
    let Some(history) = p.history.as_ref() else { bail!("this session kept no history to export") };
    Ok(match q.format {
        Format::Pprof => {
            let prof = profile::heap(&p.state, history, &mut p.stacks, q.layers);
            let mut comments =
                vec![format!("gpumem {}: GPU memory by allocation stack", env!("CARGO_PKG_VERSION")), span.recorded_by.clone()];
            if prof.not_sampled_alloc.0 > 0 {
                comments.push(format!(
                    "{} allocation(s), {} bytes, over the stack budget were not sampled: sampled stacks carry unbiased estimates (label estimated=true)",
                    prof.not_sampled_alloc.0, prof.not_sampled_alloc.1
                ));
            }
            let meta = pprof::Meta { time_ns: span.wall_end_ns, duration_ns: (span.duration_s * 1e9) as i64, comments };
            Rendered { what: format!("{} sample(s)", prof.samples.len()), bytes: pprof::render(&prof, &meta) }
        }
        Format::TorchSnapshot => {
            let snap = snapshot::of_process(&p.state, history, q.pid)?;
            let entries: usize = snap.traces.values().map(Vec::len).sum();
            let mut what = format!("process {}: {} segment(s), {entries} trace entries", snap.pid, snap.segments.len());
            if !snap.tensor_blocks {
                what.push_str("; blocks are whole segments (no PyTorch probe fired in it)");
            }
            if snap.trace_dropped > 0 {
                what.push_str(&format!("; the {} oldest trace entries were dropped (at most {} kept)", snap.trace_dropped, snap.trace_cap));
            }
            Rendered { bytes: torch_snapshot::render(&snap, &mut p.stacks), what }
        }
        Format::Perfetto => {
            let Some(timeline) = p.timeline.as_ref() else {
                bail!("a running daemon keeps no timeline: record the session (gpumem record -o FILE) and export the recording")
            };
            let found = leaks::find(&p.state, &mut p.stacks, &mut p.growth, span.ended_ns, (q.older_than_s * 1e9) as u64, 1);
            let s = perfetto::Session { timeline, history, leaks: &found, end_s: span.duration_s, recorded_by: span.recorded_by.clone() };
            let what = format!("{} process/GPU series, {} mark(s)", timeline.series.len(), timeline.marks.len());
            Rendered { bytes: perfetto::render(&s).into_bytes(), what }
        }
    })
}

/// Writes `bytes` to `path` whole: a temporary file beside it, renamed.
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let done = written.and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

struct Export<'a> {
    args: &'a ExportArgs,
}

impl Output for Export<'_> {
    type Input = Infallible;

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        let file = self.args.file.as_deref().unwrap_or(Path::new("-"));
        // A damaged recording would give a profile that looks whole and is not.
        if let Some(e) = &end.damage {
            bail!("{}: {e}; nothing written (`gpumem report` shows what the {} events before it say)", file.display(), end.events);
        }
        if !end.complete {
            eprintln!(
                "gpumem: {}: the recording has no footer (its session did not finish); exporting its {} events",
                file.display(),
                end.events
            );
        }
        let wall_end_ns = std::fs::metadata(file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i64);
        let recorded_by = end.header.as_ref().map_or_else(String::new, |h| match &h.command {
            Some(c) => format!("recorded by gpumem {} ({}): {c}", h.gpumem_version, h.recorded_by),
            None => format!("recorded by gpumem {} ({})", h.gpumem_version, h.recorded_by),
        });
        let span = Span { ended_ns: end.footer.ended_ns, duration_s: end.footer.duration_s, wall_end_ns, recorded_by };
        let r = render(ctx.pipeline, &Query::of(self.args), &span)?;
        write_whole(&self.args.output, &r.bytes)?;
        eprintln!(
            "gpumem: wrote {} ({}, {}, {} KiB)",
            self.args.output.display(),
            self.args.format.name(),
            r.what,
            r.bytes.len().div_ceil(1024)
        );
        Ok(ExitCode::SUCCESS)
    }
}

pub fn run(args: ExportArgs) -> Result<ExitCode> {
    let Some(file) = &args.file else { return from_daemon(&args) };
    let mut reader = super::open_recording(file)?;
    let options = pipeline::Options { timeline: args.format == Format::Perfetto, history: Some(history::TRACE_CAP), ..Default::default() };
    runtime::replay(&mut reader, options, &mut Export { args: &args })
}

/// The export of a running daemon: what it knows now.
fn from_daemon(args: &ExportArgs) -> Result<ExitCode> {
    let path = format!("/v1/export?{}", Query::of(args).to_query());
    let Some(bytes) = crate::daemon::client::ask_bytes(&args.daemon, &path)? else {
        bail!(
            "no RECORDING given and no gpumem serve answers at {}: export a recording (gpumem record -o FILE ...), or start gpumem serve",
            args.daemon.socket.display()
        )
    };
    write_whole(&args.output, &bytes)?;
    eprintln!(
        "gpumem: wrote {} ({}, from the daemon at {}, {} KiB)",
        args.output.display(),
        args.format.name(),
        args.daemon.socket.display(),
        bytes.len().div_ceil(1024)
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_query_goes_through_its_query_string() {
        let q = Query { format: Format::TorchSnapshot, pid: Some(42), layers: profile::Layers::Tensors, older_than_s: 1.5 };
        assert_eq!(Query::parse(&q.to_query()).unwrap(), q);
        assert!(Query::parse("pid=1").unwrap_err().contains("format=F is missing"));
        assert!(Query::parse("format=svg").unwrap_err().contains("not a format"));
    }
}
