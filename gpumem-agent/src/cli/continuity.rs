//! `serve`'s options for keeping its knowledge across restarts.
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct ContinuityArgs {
    /// Do not pin: the probes and what they know go with this process.
    #[arg(long)]
    pub no_pin: bool,
    /// Where the probes' links and the kernel's tables are pinned (bpffs,
    /// mounted there if it is not).
    #[arg(long, value_name = "DIR", default_value = crate::probes::pin::DEFAULT_ROOT)]
    pub pin_dir: PathBuf,
    /// Where symbolized stacks are kept for the next agent.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/gpumem")]
    pub state_dir: PathBuf,
    /// Entries of the kernel's table of live allocations, handles, mappings
    /// and contexts (about 150 bytes each, taken as used); what does not fit
    /// is counted, and its process is uncertain after a restart.
    #[arg(long, value_name = "N", default_value_t = gpumem_common::live::MAX_DEFAULT, value_parser = clap::value_parser!(u32).range(1..))]
    pub kernel_table_entries: u32,
    /// Remove the pinned state (links, maps) and exit: what to run when
    /// gpumem is uninstalled from a node.
    #[arg(long)]
    pub cleanup: bool,
    /// After --cleanup, stay (doing nothing) until SIGTERM or SIGINT: the
    /// chart's uninstall mode runs this as its DaemonSet's pods, so `kubectl
    /// rollout status` says when every node is clean.
    #[arg(long, requires = "cleanup")]
    pub then_wait: bool,
}

impl ContinuityArgs {
    pub fn options(&self) -> Option<crate::runtime::continuity::Options> {
        (!self.no_pin).then(|| crate::runtime::continuity::Options {
            root: self.pin_dir.clone(),
            state_dir: self.state_dir.clone(),
            kernel_table: self.kernel_table_entries,
        })
    }
}

/// How `top --once`, `leaks` and `status` find a running `serve`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The local API's socket of a running `gpumem serve`.
    #[arg(long, value_name = "PATH", default_value = crate::daemon::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Do not ask a running daemon: start probes of our own.
    #[arg(long)]
    pub no_daemon: bool,
    /// Where `serve` pins its state (what `status` looks at).
    #[arg(long, value_name = "DIR", default_value = crate::probes::pin::DEFAULT_ROOT)]
    pub pin_dir: PathBuf,
}

impl DaemonArgs {
    /// The daemon these arguments name.
    pub fn daemon(&self) -> crate::daemon::client::Daemon {
        crate::daemon::client::Daemon { socket: self.socket.clone(), disabled: self.no_daemon }
    }
}
