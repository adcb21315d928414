//! serve's side of `--action` and `--webhook`: the triggers found in what
//! the runtime hands serve (applied events, growth samples, XIDs, health
//! after each tick) turned into events for the dispatcher (crate::actions).
use super::flight::FlightRecorder;
use crate::{
    actions::{ActionEvent, Actions, Config},
    runtime::Ctx,
};
use gpumem_engine::{
    analysis::{
        triggers::{self, Edges, Trigger, TriggerKind},
        view::ViewOptions,
    },
    clock::monotonic_ns,
    pipeline::Outcome,
};

pub struct Acting {
    config: Option<Config>,
    actions: Option<Actions>,
    edges: Edges,
    /// The event JSON's `node`.
    node: String,
    /// `--flight-recorder`: the window written when an action fires.
    flight: Option<FlightRecorder>,
}

impl Acting {
    pub fn new(config: Option<Config>, node: String, flight: Option<FlightRecorder>) -> Acting {
        Acting { config, actions: None, edges: Edges::default(), node, flight }
    }

    /// Starts the dispatcher's workers (on the runtime), saying what acts.
    pub fn start(&mut self, elapsed_s: f64) {
        if let Some(f) = self.flight.as_mut() {
            f.started(elapsed_s);
        }
        let Some(config) = self.config.take() else { return };
        let actions = Actions::start(config);
        let (kinds, webhooks) = actions.subscribed();
        let kinds: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        let webhooks = if webhooks { "; webhooks get every event" } else { "" };
        eprintln!("gpumem: acting on {}{webhooks}", if kinds.is_empty() { "no event by command".into() } else { kinds.join(", ") });
        self.actions = Some(actions);
    }

    pub fn actions(&self) -> Option<&Actions> {
        self.actions.as_ref()
    }

    fn act(&mut self, ctx: &mut Ctx<'_>, t: Trigger) {
        let Some(actions) = self.actions.as_mut() else { return };
        if !actions.admit(t.kind) {
            return;
        }
        let mut event = ActionEvent::of(&t, ctx.pipeline, &self.node);
        if let Some(f) = self.flight.as_mut() {
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

    /// A CUDA OOM or host OOM kill among the applied events (each event
    /// kept first by the flight recorder: the one that fires is in its window).
    pub fn outcome(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) {
        if let Some(f) = self.flight.as_mut() {
            f.event(ctx.pipeline, o);
        }
        if self.actions.is_some() {
            if let Some(t) = triggers::of_outcome(o) {
                self.act(ctx, t);
            }
        }
    }

    /// Growth verdicts turning on, after each sample.
    pub fn sampled(&mut self, ctx: &mut Ctx<'_>, t_s: f64) {
        if let Some(f) = self.flight.as_mut() {
            f.tick(t_s);
        }
        if !self.wants(&[TriggerKind::Leak, TriggerKind::CacheGrowth]) {
            return;
        }
        let now = monotonic_ns();
        let view = ctx.pipeline.view(&ViewOptions { now_ns: now, ..Default::default() });
        for t in self.edges.growth(&view.rows, now) {
            self.act(ctx, t);
        }
    }

    /// A critical XID from NVML.
    pub fn nvml(&mut self, ctx: &mut Ctx<'_>, m: &gpumem_engine::model::nvml::Message, t_s: f64) {
        if let Some(f) = self.flight.as_mut() {
            f.nvml(m, t_s);
        }
        if let gpumem_engine::model::nvml::Message::Xid(x) = m {
            if let Some(t) = triggers::of_xid(x) {
                self.act(ctx, t);
            }
        }
    }

    /// A reading of the host memory, kept in the window.
    pub fn host(&mut self, ctx: &mut Ctx<'_>, t_s: f64) {
        if let Some(f) = self.flight.as_mut() {
            f.host(&ctx.pipeline.host, t_s);
        }
    }

    /// ECC rules and health levels after the readings the pipeline took.
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        if !self.wants(&[TriggerKind::Ecc, TriggerKind::Health]) {
            return;
        }
        for t in self.edges.health(&ctx.pipeline.gpus.health, monotonic_ns()) {
            self.act(ctx, t);
        }
    }
}
