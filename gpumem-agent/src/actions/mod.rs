//! Acting on what gpumem finds (`serve --action EVENT=COMMAND`, `--webhook
//! URL`): each trigger (analysis::triggers) becomes one JSON event, handed
//! to the commands subscribed to its kind and POSTed to every webhook. The
//! event path never waits: a rate limit per event kind, then a bounded
//! queue per target (what does not fit is dropped, counted); commands run
//! a few at a time with a timeout, webhooks retry with backoff, on tasks of
//! their own. Every outcome is counted for /metrics.
pub mod command;
pub mod event;
pub mod webhook;

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, Semaphore};

pub use event::ActionEvent;

use crate::http_post::Endpoint;
use gpumem_engine::{
    analysis::triggers::TriggerKind,
    model::actions::{Outcome, Target},
};

/// One `--action EVENT=COMMAND`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    pub kind: TriggerKind,
    pub command: String,
}

impl std::str::FromStr for Hook {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let names = || TriggerKind::ALL.map(TriggerKind::name).join(", ");
        let (kind, command) = s.split_once('=').ok_or_else(|| format!("{s:?}: write EVENT=COMMAND, EVENT one of {}", names()))?;
        let kind = TriggerKind::ALL
            .into_iter()
            .find(|k| k.name() == kind.trim())
            .ok_or_else(|| format!("{kind:?} is not an event; one of {}", names()))?;
        if command.trim().is_empty() {
            return Err(format!("{s:?}: the command is empty"));
        }
        Ok(Hook { kind, command: command.to_string() })
    }
}

/// How the daemon acts (serve's options).
#[derive(Clone, Debug)]
pub struct Config {
    pub hooks: Vec<Hook>,
    pub webhooks: Vec<Endpoint>,
    pub timeout: Duration,
    /// Most events of one kind acted on per minute.
    pub per_minute: u32,
    /// Events waiting per target (commands, webhooks) at most.
    pub queue: usize,
    /// Commands running (and webhook deliveries under way) at once at most.
    pub concurrency: usize,
    pub dry_run: bool,
}

/// Outcomes so far, by (target, event kind, outcome).
#[derive(Debug, Default)]
pub struct Counts(Mutex<BTreeMap<(Target, TriggerKind, Outcome), u64>>);

impl Counts {
    fn add(&self, target: Target, kind: TriggerKind, outcome: Outcome) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry((target, kind, outcome)).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<(Target, TriggerKind, Outcome), u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// At most `per_minute` events of each kind in any 60 s.
#[derive(Debug)]
struct Limiter {
    per_minute: u32,
    fired: BTreeMap<TriggerKind, VecDeque<Instant>>,
}

impl Limiter {
    fn allow(&mut self, kind: TriggerKind, now: Instant) -> bool {
        let q = self.fired.entry(kind).or_default();
        while q.front().is_some_and(|&t| now.duration_since(t) >= Duration::from_secs(60)) {
            q.pop_front();
        }
        if q.len() >= self.per_minute as usize {
            return false;
        }
        q.push_back(now);
        true
    }
}

struct Job {
    kind: TriggerKind,
    json: Arc<Vec<u8>>,
}

/// The dispatcher serve feeds.
pub struct Actions {
    config: Config,
    limiter: Limiter,
    commands: Option<mpsc::Sender<Job>>,
    webhooks: Option<mpsc::Sender<Job>>,
    pub counts: Arc<Counts>,
}

impl Actions {
    /// Starts the workers (on the current tokio runtime); outcomes are
    /// counted in `counts` (which /metrics reads).
    pub fn start(config: Config, counts: Arc<Counts>) -> Actions {
        let commands = (!config.hooks.is_empty() && !config.dry_run).then(|| {
            let (tx, rx) = mpsc::channel(config.queue);
            tokio::spawn(run_commands(rx, config.clone(), counts.clone()));
            tx
        });
        let webhooks = (!config.webhooks.is_empty() && !config.dry_run).then(|| {
            let (tx, rx) = mpsc::channel(config.queue);
            tokio::spawn(deliver_webhooks(rx, config.webhooks.clone(), config.concurrency, counts.clone()));
            tx
        });
        Actions { limiter: Limiter { per_minute: config.per_minute, fired: BTreeMap::new() }, config, commands, webhooks, counts }
    }

    /// Whether an event of this kind is to be acted on now: something
    /// subscribes to it and it is within the kind's rate limit (else
    /// counted as rate_limited). Asked before the event is built, so that a
    /// burst costs the event path nothing.
    pub fn admit(&mut self, kind: TriggerKind) -> bool {
        let (hooks, webhooks) = self.targets(kind);
        if !hooks && !webhooks {
            return false;
        }
        if self.limiter.allow(kind, Instant::now()) {
            return true;
        }
        for (target, on) in [(Target::Command, hooks), (Target::Webhook, webhooks)] {
            if on {
                self.counts.add(target, kind, Outcome::RateLimited);
            }
        }
        false
    }

    /// Hands an admitted event to its commands and the webhooks; never waits.
    pub fn fire(&mut self, event: &ActionEvent, kind: TriggerKind) {
        let json = Arc::new(serde_json::to_vec(event).expect("an event serializes"));
        if self.config.dry_run {
            self.say_dry_run(kind, &json);
            return;
        }
        let (hooks, _) = self.targets(kind);
        for (target, tx) in [(Target::Command, self.commands.as_ref().filter(|_| hooks)), (Target::Webhook, self.webhooks.as_ref())] {
            let Some(tx) = tx else { continue };
            if tx.try_send(Job { kind, json: json.clone() }).is_err() {
                self.counts.add(target, kind, Outcome::QueueFull);
            }
        }
    }

    /// Whether commands subscribe to `kind`, and whether webhooks (which get every kind) are there.
    fn targets(&self, kind: TriggerKind) -> (bool, bool) {
        (self.config.hooks.iter().any(|h| h.kind == kind), !self.config.webhooks.is_empty())
    }

    /// Whether anything acts on `kind`.
    pub fn acts_on(&self, kind: TriggerKind) -> bool {
        let (hooks, webhooks) = self.targets(kind);
        hooks || webhooks
    }

    /// The kinds commands subscribe to, and whether webhooks get every kind.
    pub fn subscribed(&self) -> (Vec<TriggerKind>, bool) {
        let mut kinds: Vec<TriggerKind> = self.config.hooks.iter().map(|h| h.kind).collect();
        kinds.sort();
        kinds.dedup();
        (kinds, !self.config.webhooks.is_empty())
    }

    fn say_dry_run(&self, kind: TriggerKind, json: &[u8]) {
        let text = String::from_utf8_lossy(json);
        for h in self.config.hooks.iter().filter(|h| h.kind == kind) {
            eprintln!("gpumem: action (dry run) {}: would run {:?} with {text}", kind.name(), h.command);
            self.counts.add(Target::Command, kind, Outcome::DryRun);
        }
        for w in &self.config.webhooks {
            eprintln!("gpumem: webhook (dry run) {}: would POST to {} {text}", kind.name(), w.url());
            self.counts.add(Target::Webhook, kind, Outcome::DryRun);
        }
    }
}

/// Runs each job's commands, `concurrency` at a time.
async fn run_commands(mut rx: mpsc::Receiver<Job>, config: Config, counts: Arc<Counts>) {
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    while let Some(job) = rx.recv().await {
        for hook in config.hooks.iter().filter(|h| h.kind == job.kind).cloned() {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (counts, json, timeout) = (counts.clone(), job.json.clone(), config.timeout);
            tokio::spawn(async move {
                let (outcome, why) = command::run(&hook.command, hook.kind.name(), &json, timeout).await;
                if let Some(why) = why {
                    eprintln!("gpumem: action {} ({:?}) {}: {why}", hook.kind.name(), hook.command, outcome.name());
                }
                counts.add(Target::Command, hook.kind, outcome);
                drop(slot);
            });
        }
    }
}

/// Delivers each job to every webhook, `concurrency` deliveries at a time
/// (a receiver that is down holds a slot through its retries).
async fn deliver_webhooks(mut rx: mpsc::Receiver<Job>, to: Vec<Endpoint>, concurrency: usize, counts: Arc<Counts>) {
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    while let Some(job) = rx.recv().await {
        for e in &to {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (e, counts, json, kind) = (e.clone(), counts.clone(), job.json.clone(), job.kind);
            tokio::spawn(async move {
                let (outcome, tries, why) = webhook::deliver(&e, &json).await;
                if let Some(why) = why {
                    eprintln!("gpumem: webhook {} to {} failed after {tries} tries: {why}", kind.name(), e.url());
                }
                counts.add(Target::Webhook, kind, outcome);
                drop(slot);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_name_an_event_and_a_command() {
        let h: Hook = "cuda_oom=/usr/local/bin/snap --gpu 0".parse().unwrap();
        assert_eq!((h.kind, h.command.as_str()), (TriggerKind::CudaOom, "/usr/local/bin/snap --gpu 0"));
        let h: Hook = "leak=echo a=b".parse().unwrap();
        assert_eq!(h.command, "echo a=b");
        assert!("oom=true".parse::<Hook>().unwrap_err().contains("cuda_oom, host_oom, leak"));
        assert!("leak=".parse::<Hook>().unwrap_err().contains("empty"));
        assert!("leak".parse::<Hook>().unwrap_err().contains("EVENT=COMMAND"));
    }

    #[test]
    fn the_limit_is_per_kind_over_any_minute() {
        let mut l = Limiter { per_minute: 2, fired: BTreeMap::new() };
        let t = Instant::now();
        assert!(l.allow(TriggerKind::CudaOom, t));
        assert!(l.allow(TriggerKind::CudaOom, t));
        assert!(!l.allow(TriggerKind::CudaOom, t + Duration::from_secs(59)));
        assert!(l.allow(TriggerKind::Leak, t + Duration::from_secs(59)), "another kind has its own budget");
        assert!(l.allow(TriggerKind::CudaOom, t + Duration::from_secs(60)));
    }
}
