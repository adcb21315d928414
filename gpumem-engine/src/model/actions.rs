//! The outcomes of serve's actions, as counted for /metrics.

/// How a command run or a webhook delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Ok,
    Failed,
    Timeout,
    /// Over the event kind's rate limit: not run.
    RateLimited,
    /// The target's queue was full: not run.
    QueueFull,
    /// `--action-dry-run`: said, not run.
    DryRun,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
            Outcome::RateLimited => "rate_limited",
            Outcome::QueueFull => "queue_full",
            Outcome::DryRun => "dry_run",
        }
    }
}

/// What acts: a command, or a webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Command,
    Webhook,
}
