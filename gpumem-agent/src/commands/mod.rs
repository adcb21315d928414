//! One small file per subcommand: an `Output` wired to the runtime or to a
//! replay, or a one-shot query (status, health). main.rs only dispatches here.
pub mod bench;
pub mod export;
pub mod health;
pub mod kube;
pub mod leaks;
pub mod preflight;
pub mod record;
pub mod replay;
pub mod report;
pub mod status;
pub mod status_text;
pub mod top;
pub mod trace;

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    cli::{ProbeArgs, Switch, TargetArgs},
    nvml,
    runtime::{Probing, Session},
};
use gpumem_engine::{record::Reader, state::Limits};

impl ProbeArgs {
    /// What the runtime attaches, from the command line.
    pub fn probing(&self) -> Probing {
        let stack_ring = crate::runtime::rings::sized(self.stack_ring_bytes);
        Probing {
            libcuda: self.libcuda.clone(),
            discover: !self.no_discover,
            nvidia_prefix: self.nvidia_dev_prefix.clone(),
            ioctl: self.ioctl,
            nvml: match (&self.nvml, self.no_nvml) {
                (_, true) => None,
                (Some(p), false) => Some(nvml::Library::Path(p.clone())),
                (None, false) => Some(nvml::Library::System),
            },
            stacks: gpumem_engine::stacks::StackPolicy {
                capture: self.stacks == Switch::On,
                ring_bytes: stack_ring.bytes,
                ring_sizing: stack_ring.sizing,
                budget_per_s: self.stack_budget,
                sample_bytes: self.stack_sample_bytes,
                burst: self.stack_burst,
            },
            uprobe_links: self.uprobe_links,
            refuse_uprobe_multi: self.refuse_uprobe_multi,
            arm64_uprobes: self.arm64_uprobes,
            refuse_loader_hooks: self.refuse_loader_hooks,
            milestones: self.milestones,
        }
    }
}

/// A session on what the command line targets.
pub fn session(probes: &ProbeArgs, target: &TargetArgs, max_allocations: usize) -> Session {
    let mut s = Session::new(probes.probing());
    s.pids = target.pids.clone();
    s.command = target.command.clone();
    s.duration = target.duration.map(Duration::from_secs_f64);
    s.pipeline.limits = Limits { max_entries: max_allocations, ..Limits::default() };
    s
}

/// The pipeline of a replay, with the table bound the command line asks for.
pub fn replay_options(max_allocations: usize) -> gpumem_engine::pipeline::Options {
    gpumem_engine::pipeline::Options { limits: Limits { max_entries: max_allocations, ..Limits::default() }, ..Default::default() }
}

/// Opens a recording, naming it in the error.
pub fn open_recording(path: &Path) -> Result<Reader<std::fs::File>> {
    Reader::open(path).with_context(|| path.display().to_string())
}
