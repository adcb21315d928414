//! `gpumem export`'s options.
use std::path::PathBuf;

use clap::Args;
use gpumem_engine::{analysis::profile::Layers, export::flame::Space, query::export::Format};

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
    /// flamegraph, folded: the bytes held now (inuse), or those allocated
    /// over the session (alloc).
    #[arg(long, value_enum, default_value_t = Space::Inuse)]
    pub space: Space,
    /// perfetto, flamegraph, folded: leak verdicts for allocations at least this old at the end.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub older_than: f64,
    #[command(flatten)]
    pub daemon: super::continuity::DaemonArgs,
}
