//! Exports: what the analyses found, in a format another tool reads — a
//! pprof heap profile, PyTorch's memory snapshot, a Perfetto trace —
//! rendered from what a pipeline holds.
use super::QueryError;
use crate::{
    analysis::{leaks, profile, snapshot},
    export::{flame, perfetto, pprof, torch_snapshot},
    pipeline::Pipeline,
};

/// What an export writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Format {
    /// pprof's profile.proto, gzipped (go tool pprof, Pyroscope, Parca):
    /// alloc_objects, alloc_space, inuse_objects, inuse_space per stack.
    Pprof,
    /// PyTorch's memory snapshot pickle (pytorch.org/memory_viz,
    /// torch.cuda._memory_viz): one process's segments, blocks and traces.
    TorchSnapshot,
    /// Chrome trace-event JSON (Perfetto, chrome://tracing): live bytes over
    /// time per process and GPU, OOMs, XIDs, leak verdicts.
    Perfetto,
    /// A memory flame graph (SVG, drawn by inferno: searchable, click to
    /// zoom): bytes by stack per process and GPU, leaking groups marked.
    Flamegraph,
    /// Brendan Gregg's folded stacks (flamegraph.pl, inferno, speedscope,
    /// Pyroscope): a line per process, GPU and stack with its bytes.
    Folded,
}

impl Format {
    pub const ALL: [Format; 5] = [Format::Pprof, Format::TorchSnapshot, Format::Perfetto, Format::Flamegraph, Format::Folded];

    pub fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::TorchSnapshot => "torch-snapshot",
            Format::Perfetto => "perfetto",
            Format::Flamegraph => "flamegraph",
            Format::Folded => "folded",
        }
    }

    /// The format of this name (as `name` writes it).
    pub fn parse(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// What an export asks for, besides the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExportQuery {
    pub format: Format,
    pub pid: Option<u32>,
    pub layers: profile::Layers,
    pub older_than_s: f64,
    /// Flame graphs: bytes held now, or allocated over the session.
    pub space: flame::Space,
}

fn unanswerable(why: &str) -> QueryError {
    QueryError::Unanswerable(why.to_string())
}

/// The session the pipeline saw: when it ended and how long it ran.
#[derive(Clone, Debug)]
pub struct Span {
    /// CLOCK_MONOTONIC at the end (the events' clock).
    pub ended_ns: u64,
    pub duration_s: f64,
    /// Wall-clock nanoseconds at the end, where known.
    pub wall_end_ns: i64,
    pub recorded_by: String,
    /// What the session was in a few words (record::session_title): a
    /// flame graph's subtitle.
    pub title: String,
}

/// An export, rendered, with a line that says what is in it.
#[derive(Debug)]
pub struct Rendered {
    pub bytes: Vec<u8>,
    pub what: String,
}

/// Renders what the pipeline holds as `q` asks.
pub fn render(p: &mut Pipeline, q: &ExportQuery, span: &Span) -> Result<Rendered, QueryError> {
    let Some(history) = p.history.as_ref() else { return Err(unanswerable("this session kept no history to export")) };
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
            let snap = snapshot::of_process(&p.state, history, q.pid).map_err(|e| QueryError::Unanswerable(e.to_string()))?;
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
                return Err(unanswerable(
                    "a running daemon keeps no timeline: record the session (gpumem record -o FILE) and export the recording",
                ));
            };
            let found = leaks::find(&p.state, &mut p.stacks, &mut p.growth, span.ended_ns, (q.older_than_s * 1e9) as u64, 1);
            let s = perfetto::Session { timeline, history, leaks: &found, end_s: span.duration_s, recorded_by: span.recorded_by.clone() };
            let what = format!("{} process/GPU series, {} mark(s)", timeline.series.len(), timeline.marks.len());
            Rendered { bytes: perfetto::render(&s).into_bytes(), what }
        }
        Format::Flamegraph | Format::Folded => {
            let (folded, stacks) = flame_of(p, q, span);
            let what = format!("{stacks} stack(s), {} bytes", q.space.name());
            let bytes = if q.format == Format::Folded {
                folded.into_bytes()
            } else {
                flame::svg(&folded, q.space, &span.title).map_err(|e| unanswerable(&e.to_string()))?.into_bytes()
            };
            Rendered { bytes, what }
        }
    })
}

/// The folded stacks `q` asks for, and how many: the driver's view (or
/// the tensors', as `q.layers` says), leaking groups marked by the leak
/// report's verdicts.
pub fn flame_of(p: &mut Pipeline, q: &ExportQuery, span: &Span) -> (String, usize) {
    let Some(history) = p.history.as_ref() else { return (String::new(), 0) };
    let prof = profile::heap(&p.state, history, &mut p.stacks, q.layers);
    let found = leaks::find(&p.state, &mut p.stacks, &mut p.growth, span.ended_ns, (q.older_than_s * 1e9) as u64, FLAME_GROUPS);
    let folded = flame::folded(&prof, &found, &flame::FlameQuery { space: q.space, pid: q.pid });
    let n = folded.lines().count();
    (folded, n)
}

/// Leak groups per process judged for a flame graph's marks.
const FLAME_GROUPS: usize = 20;
