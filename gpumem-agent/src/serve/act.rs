//! serve's side of `--action` and `--webhook`, an Output: the triggers
//! found in what the runtime hands it (applied events, growth samples,
//! XIDs, health after each tick) turned into events for the dispatcher
//! (crate::actions), each with the flight recorder's window when there is one.
use std::{process::ExitCode, sync::Arc};

use anyhow::Result;

use super::flight::Flight;
use crate::{
    actions::{ActionEvent, Actions, Config, Counts},
    runtime::{Ctx, End, Flow, Output},
};
use gpumem_engine::{
    analysis::{
        triggers::{self, Edges, Trigger, TriggerKind},
        view::ViewOptions,
    },
    clock::monotonic_ns,
    model::nvml::Message,
    pipeline::Outcome,
};

pub struct Acting {
    config: Option<Config>,
    actions: Option<Actions>,
    edges: Edges,
    /// The event JSON's `node`.
    node: String,
    /// Outcomes counted, shared with /metrics.
    counts: Arc<Counts>,
    /// `--flight-recorder`: the window written when an action fires.
    flight: Option<Flight>,
}

impl Acting {
    pub fn new(config: Config, counts: Arc<Counts>, node: String, flight: Option<Flight>) -> Acting {
        Acting { config: Some(config), actions: None, edges: Edges::default(), node, counts, flight }
    }

    /// Starts the dispatcher's workers (on the runtime), saying what acts.
    fn start(&mut self) {
        let Some(config) = self.config.take() else { return };
        let actions = Actions::start(config, self.counts.clone());
        let (kinds, webhooks) = actions.subscribed();
        let kinds: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        let webhooks = if webhooks { "; webhooks get every event" } else { "" };
        eprintln!("gpumem: acting on {}{webhooks}", if kinds.is_empty() { "no event by command".into() } else { kinds.join(", ") });
        self.actions = Some(actions);
    }

    fn act(&mut self, ctx: &mut Ctx<'_>, t: Trigger) {
        let Some(actions) = self.actions.as_mut() else { return };
        if !actions.admit(t.kind) {
            return;
        }
        let mut event = ActionEvent::of(&t, ctx.pipeline, &self.node);
        if let Some(f) = &self.flight {
            let mut f = f.borrow_mut();
            match f.snapshot(ctx.pipeline, t.kind.name(), ctx.agent.kernel.lost.clone()) {
                Ok(path) => {
                    // What the full ring let go before its time is said, not lost silently.
                    let fell_out =
                        if f.dropped > 0 { format!(" ({} items fell out of the full ring so far)", f.dropped) } else { String::new() };
                    eprintln!("gpumem: flight recorder: {} written for {}{fell_out}", path.display(), t.kind.name());
                    event.recording = Some(path.display().to_string());
                }
                Err(e) => eprintln!("gpumem: flight recorder: {e:#}"),
            }
        }
        actions.fire(&event, t.kind);
    }

    fn wants(&self, kinds: &[TriggerKind]) -> bool {
        self.actions.as_ref().is_some_and(|a| kinds.iter().any(|&k| a.acts_on(k)))
    }
}

impl Output for Acting {
    type Input = std::convert::Infallible;

    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        self.start();
        Ok(())
    }

    /// A CUDA OOM or host OOM kill among the applied events (each event
    /// kept first by the flight recorder: the one that fires is in its window).
    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> Result<Flow> {
        if self.actions.is_some() {
            if let Some(t) = triggers::of_applied(&o.event, &o.applied) {
                self.act(ctx, t);
            }
        }
        Ok(Flow::Continue)
    }

    /// Growth verdicts turning on, after each sample.
    fn sampled(&mut self, ctx: &mut Ctx<'_>, _: f64) -> Result<()> {
        if !self.wants(&[TriggerKind::Leak, TriggerKind::CacheGrowth]) {
            return Ok(());
        }
        let now = monotonic_ns();
        let view = ctx.pipeline.view(&ViewOptions { now_ns: now, ..Default::default() });
        for t in self.edges.growth(&view.rows, now) {
            self.act(ctx, t);
        }
        Ok(())
    }

    /// A critical XID from NVML.
    fn nvml(&mut self, ctx: &mut Ctx<'_>, m: &Message, _: f64) -> Result<()> {
        if let Message::Xid(x) = m {
            if let Some(t) = triggers::of_xid(x) {
                self.act(ctx, t);
            }
        }
        Ok(())
    }

    /// ECC rules and health levels after the readings the pipeline took.
    fn tick(&mut self, ctx: &mut Ctx<'_>) -> Result<Flow> {
        if self.wants(&[TriggerKind::Ecc, TriggerKind::Health]) {
            for t in self.edges.health(&ctx.pipeline.gpus.health, monotonic_ns()) {
                self.act(ctx, t);
            }
        }
        Ok(Flow::Continue)
    }

    fn finish(&mut self, _: &mut Ctx<'_>, _: &End) -> Result<ExitCode> {
        Ok(ExitCode::SUCCESS)
    }
}
