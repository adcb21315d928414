//! `serve`'s options for acting on what it finds (hooks and webhooks).
use std::time::Duration;

use clap::Args;

use crate::{
    actions::{Config, Hook},
    http_post::Endpoint,
};

fn parse_webhook(url: &str) -> Result<Endpoint, String> {
    Endpoint::parse(url, "/")
}

#[derive(Debug, Args)]
pub struct ActionArgs {
    /// Run COMMAND (through /bin/sh -c) when EVENT happens, the event as one
    /// JSON object on its stdin and GPUMEM_EVENT set. EVENT: cuda_oom,
    /// host_oom, leak (a process's growth verdict turning to leak),
    /// cache_growth, xid (critical XIDs), ecc (an ECC rule firing), health
    /// (a GPU's health turning critical). Repeatable.
    #[arg(long = "action", value_name = "EVENT=COMMAND")]
    pub actions: Vec<Hook>,
    /// POST every event's JSON to this http URL (retried with backoff).
    /// Repeatable.
    #[arg(long = "webhook", value_name = "URL", value_parser = parse_webhook)]
    pub webhooks: Vec<Endpoint>,
    /// Seconds a command may run before it (its process group) is killed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = super::parse_duration)]
    pub action_timeout: f64,
    /// Most events of one kind acted on per minute; the rest are counted
    /// as rate_limited.
    #[arg(long, value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub action_rate_limit: u32,
    /// Events waiting for commands (and for webhooks) at most; beyond it
    /// they are counted as queue_full.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub action_queue: u32,
    /// Commands running (and webhook deliveries under way) at once at most.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub action_concurrency: u32,
    /// Say what would run and be posted, and run nothing.
    #[arg(long)]
    pub action_dry_run: bool,
    /// Keep the last SECONDS of events in memory and, when an action fires,
    /// write them (with the allocations live before them) as a recording
    /// under --flight-dir, named in the event's `recording`.
    #[arg(long, value_name = "SECONDS", value_parser = super::parse_duration)]
    pub flight_recorder: Option<f64>,
    /// Where the flight recorder writes.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/gpumem/flight")]
    pub flight_dir: std::path::PathBuf,
}

impl ActionArgs {
    /// The dispatcher's configuration, None when nothing acts.
    pub fn config(&self) -> Option<Config> {
        (!self.actions.is_empty() || !self.webhooks.is_empty()).then(|| Config {
            hooks: self.actions.clone(),
            webhooks: self.webhooks.clone(),
            timeout: Duration::from_secs_f64(self.action_timeout),
            per_minute: self.action_rate_limit,
            queue: self.action_queue as usize,
            concurrency: self.action_concurrency as usize,
            dry_run: self.action_dry_run,
        })
    }
}
