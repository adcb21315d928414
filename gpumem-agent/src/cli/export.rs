//! `gpumem export`'s options.
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use gpumem_engine::analysis::profile::Layers;

/// What `gpumem export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
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
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::TorchSnapshot => "torch-snapshot",
            Format::Perfetto => "perfetto",
        }
    }
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A file written by `gpumem record` (or `--record`); without it, what
    /// a running `gpumem serve` knows now.
    #[arg(value_name = "RECORDING")]
    pub file: Option<PathBuf>,
    #[arg(short, long, value_enum)]
    pub format: Format,
    /// The file to write (written whole under a temporary name, then renamed).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// torch-snapshot: the process (a snapshot is one process's; needed when
    /// several did GPU memory work).
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,
    /// pprof: the driver's allocations, or PyTorch's tensors where its
    /// probes fired.
    #[arg(long, value_enum, default_value_t = Layers::Driver)]
    pub layers: Layers,
    /// perfetto: leak verdicts for allocations at least this old at the end.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub older_than: f64,
    #[command(flatten)]
    pub daemon: super::continuity::DaemonArgs,
}
