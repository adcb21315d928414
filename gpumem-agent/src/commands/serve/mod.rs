//! `gpumem serve`: the daemon. Traces every process on the host and answers
//! Prometheus scrapes on /metrics until SIGTERM/SIGINT, then detaches every
//! probe before it exits.
//!
//! The runtime's task owns all state; the HTTP handlers ask it for a
//! rendering over a channel (an input of this output), so a scrape never
//! races an event and nothing is locked.
mod act;
mod api;
mod cleanup;
mod flight;
mod otlp;

pub use otlp::Endpoint as OtlpEndpoint;

use std::{
    future::IntoFuture as _,
    net::SocketAddr,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use axum::{
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use tokio::sync::{mpsc, oneshot};

use crate::{
    cli::ServeArgs,
    daemon::LeaksQuery,
    runtime::{self, Ctx, Detach, End, Flow, Output, Session},
};
use gpumem_engine::{
    analysis::view::ViewOptions,
    clock::{monotonic_ns, unix_ns},
    export::prometheus::{self, Scrape},
};

/// Samples per growth series (the detector's window: 10 min at 1 s).
const GROWTH_SAMPLES: usize = 600;
/// Memory actions the daemon keeps for exports' traces (about 64 bytes each).
const HISTORY_ENTRIES: usize = 1 << 16;
/// How often the traced processes' host memory, swap and cgroups are read.
const HOST_INTERVAL: Duration = Duration::from_secs(5);
/// A scrape or health check that the runtime has not answered by then fails.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A local API answer: the runtime's rendering, or why there is none.
pub type Reply = oneshot::Sender<Result<String, String>>;

pub enum Request {
    /// The exposition, or why it could not be rendered.
    Metrics(oneshot::Sender<Result<String, std::fmt::Error>>),
    Health(oneshot::Sender<String>),
    /// The local API: `top --once`'s text.
    Top(Reply),
    /// The local API: the live top's snapshot (JSON).
    Snapshot(Reply),
    /// The local API: a process's largest live stacks on a device (JSON).
    Stacks(u32, i32, Reply),
    /// The local API: a leaks report, rendered as asked.
    Leaks(LeaksQuery, Reply),
    /// The local API: the daemon's own status (JSON).
    Status(Reply),
    /// The local API: what these processes hold (JSON), for trace's summary.
    Holdings(Vec<u32>, Reply),
    /// The local API: an export (pprof, PyTorch snapshot) of what the daemon knows.
    Export(super::export::Query, oneshot::Sender<Result<Vec<u8>, String>>),
    /// The metrics as an OTLP request body, for the pusher.
    Otlp(oneshot::Sender<Vec<u8>>),
}

struct Server {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub struct Serve {
    listener: Option<std::net::TcpListener>,
    /// The local API's socket and where it is.
    api: Option<(std::os::unix::net::UnixListener, std::path::PathBuf)>,
    api_server: Option<Server>,
    listen: SocketAddr,
    max_process_series: usize,
    leak_age_ns: u64,
    nvml_interval_s: f64,
    /// Fault injection: renderings still to fail.
    fail_renders: u32,
    tx: mpsc::Sender<Request>,
    rx: Option<mpsc::Receiver<Request>>,
    server: Option<Server>,
    /// Whether NVML's state was said yet.
    nvml_said: bool,
    /// The local API's socket, removed at the end.
    socket: Option<std::path::PathBuf>,
    began: Instant,
    /// Unix ns when the daemon started: OTLP counters count from it.
    began_unix_ns: u64,
    /// Where and how often to push OTLP, and the pushes so far.
    otlp: Option<(otlp::Endpoint, Duration)>,
    pushes: std::sync::Arc<otlp::Pushes>,
    otlp_task: Option<tokio::task::JoinHandle<()>>,
    /// OTLP's `host.name`, read once.
    node: String,
    /// `--action` and `--webhook`.
    acting: act::Acting,
}

impl Serve {
    fn leaks(&mut self, ctx: &mut Ctx<'_>, q: &LeaksQuery) -> Result<String> {
        let query = super::leaks::Query {
            now_ns: monotonic_ns(),
            duration_s: self.began.elapsed().as_secs_f64(),
            older_than_s: q.older_than_s,
            top: q.top,
            pids: &q.pids,
        };
        let k = &ctx.agent.kernel;
        let report = super::leaks::report(ctx.pipeline, &query, k.stacks_dropped, k.lost.total());
        let mut out = Vec::new();
        if q.json {
            report.write_json(&mut out)?;
        } else {
            report.write_human(&mut out)?;
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn status(&self, ctx: &Ctx<'_>) -> serde_json::Value {
        serde_json::json!({
            "version": crate::daemon::VERSION,
            "pid": std::process::id(),
            "up_s": self.began.elapsed().as_secs_f64(),
            "metrics": format!("http://{}/metrics", self.listen),
            "probes_attached": ctx.agent.probes_attached,
            "processes": ctx.pipeline.state.processes.len(),
            "continuity": ctx.agent.continuity,
            "kernel_table": ctx.agent.kernel_table,
            "kernel_tables_full": ctx.agent.kernel.tables_full,
            "lost_events": ctx.agent.kernel.lost.total(),
        })
    }

    fn scrape(&mut self, ctx: &mut Ctx<'_>) -> Result<String, std::fmt::Error> {
        if self.fail_renders > 0 {
            // Fault injection: what the encoder returns when it fails.
            self.fail_renders -= 1;
            return Err(std::fmt::Error);
        }
        self.with_scrape(ctx, prometheus::render)
    }

    /// `f` of what /metrics shows now (the view with exited processes, the
    /// agent's status, the OTLP pushes where it pushes).
    fn with_scrape<T>(&self, ctx: &mut Ctx<'_>, f: impl FnOnce(&Scrape<'_>) -> T) -> T {
        let p = &mut *ctx.pipeline;
        let view = p.view(&ViewOptions { now_ns: monotonic_ns(), leak_age_ns: self.leak_age_ns, exited: true, ..Default::default() });
        let mut scrape = Scrape::of(p, &view, ctx.agent, self.max_process_series);
        scrape.otlp_pushes = self.otlp.is_some().then(|| self.pushes.counts());
        scrape.actions = self.acting.actions().map(|a| a.counts.snapshot());
        f(&scrape)
    }

    /// What /metrics shows, as an OTLP request body.
    fn otlp_body(&self, ctx: &mut Ctx<'_>) -> Vec<u8> {
        let times = gpumem_engine::export::otlp::Times { start_ns: self.began_unix_ns, now_ns: unix_ns() };
        self.with_scrape(ctx, |scrape| gpumem_engine::export::otlp::request(&prometheus::families(scrape), &self.node, times))
    }

    /// An export of what the daemon knows now.
    fn export(&self, ctx: &mut Ctx<'_>, q: &super::export::Query) -> Result<Vec<u8>> {
        let span = super::export::Span {
            ended_ns: monotonic_ns(),
            duration_s: self.began.elapsed().as_secs_f64(),
            wall_end_ns: unix_ns() as i64,
            recorded_by: format!("gpumem serve (pid {}), up {:.0} s", std::process::id(), self.began.elapsed().as_secs_f64()),
        };
        Ok(super::export::render(ctx.pipeline, q, &span)?.bytes)
    }
}

impl Output for Serve {
    type Input = Request;

    fn inputs(&mut self) -> Option<mpsc::Receiver<Request>> {
        self.rx.take()
    }

    fn started(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        let listener = self.listener.take().expect("started once");
        listener.set_nonblocking(true).context("setting up the listener")?;
        let listener = tokio::net::TcpListener::from_std(listener).context("setting up the listener")?;
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(axum::serve(listener, router(self.tx.clone())).with_graceful_shutdown(shutdown).into_future());
        self.server = Some(Server { stop, task });
        if let Some((api, path)) = self.api.take() {
            api.set_nonblocking(true).context("setting up the local API")?;
            let api = tokio::net::UnixListener::from_std(api).context("setting up the local API")?;
            let (stop, stopped) = oneshot::channel::<()>();
            let shutdown = async move {
                let _ = stopped.await;
            };
            let task = tokio::spawn(axum::serve(api, api::router(self.tx.clone())).with_graceful_shutdown(shutdown).into_future());
            self.api_server = Some(Server { stop, task });
            eprintln!("gpumem: local API on {} (top, leaks, status and export use it)", path.display());
        }
        if let Some((endpoint, every)) = self.otlp.clone() {
            eprintln!("gpumem: pushing OTLP metrics to {} every {} s", endpoint.0.url(), every.as_secs_f64());
            self.otlp_task = Some(otlp::spawn(endpoint, every, self.tx.clone(), self.pushes.clone()));
        }
        self.acting.start(ctx.elapsed_s);
        eprintln!(
            "gpumem: serving http://{}/metrics ({} probes attached); SIGTERM or Ctrl-C to stop",
            self.listen, ctx.agent.probes_attached
        );
        Ok(())
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &gpumem_engine::pipeline::Outcome) -> Result<Flow> {
        self.acting.outcome(ctx, o);
        Ok(Flow::Continue)
    }

    fn sampled(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.acting.sampled(ctx, t_s);
        Ok(())
    }

    fn host(&mut self, ctx: &mut Ctx<'_>, t_s: f64) -> Result<()> {
        self.acting.host(ctx, t_s);
        Ok(())
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>) -> Result<Flow> {
        self.acting.tick(ctx);
        Ok(Flow::Continue)
    }

    fn nvml(&mut self, ctx: &mut Ctx<'_>, m: &gpumem_engine::model::nvml::Message, t_s: f64) -> Result<()> {
        self.acting.nvml(ctx, m, t_s);
        if !std::mem::replace(&mut self.nvml_said, true) {
            match m {
                gpumem_engine::model::nvml::Message::Reading { gpus, .. } => eprintln!("gpumem: NVML: {} GPU(s)", gpus.len()),
                gpumem_engine::model::nvml::Message::Unavailable(e) => {
                    eprintln!("gpumem: {e}; serving traced memory only, retrying every {} s", self.nvml_interval_s)
                }
                gpumem_engine::model::nvml::Message::Xid(_) => self.nvml_said = false,
            }
        }
        Ok(())
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, r: Request) -> Result<Flow> {
        match r {
            Request::Metrics(reply) => {
                let _ = reply.send(self.scrape(ctx));
            }
            Request::Health(reply) => {
                let _ = reply.send(format!(
                    "ok: up {:.0} s, {} probes attached, {} processes tracked, NVML {}\n",
                    self.began.elapsed().as_secs_f64(),
                    ctx.agent.probes_attached,
                    ctx.pipeline.state.processes.len(),
                    ctx.pipeline.gpus.error.as_deref().unwrap_or("up"),
                ));
            }
            Request::Top(reply) => {
                let lost = ctx.agent.kernel.lost.total();
                let _ = reply.send(super::top::once_text(ctx.pipeline, lost).map_err(|e| e.to_string()));
            }
            Request::Leaks(q, reply) => {
                let _ = reply.send(self.leaks(ctx, &q).map_err(|e| e.to_string()));
            }
            Request::Snapshot(reply) => {
                let lost = ctx.agent.kernel.lost.total();
                let snapshot = super::top::snapshot(ctx.pipeline, lost);
                let answer = serde_json::json!({ "snapshot": snapshot, "probes_attached": ctx.agent.probes_attached });
                let _ = reply.send(Ok(answer.to_string()));
            }
            Request::Stacks(pid, device, reply) => {
                let groups = super::top::stacks(ctx.pipeline, pid, device);
                let _ = reply.send(serde_json::to_string(&groups).map_err(|e| e.to_string()));
            }
            Request::Holdings(pids, reply) => {
                let h = crate::daemon::holdings(&ctx.pipeline.state, &pids);
                let _ = reply.send(serde_json::to_string(&h).map_err(|e| e.to_string()));
            }
            Request::Status(reply) => {
                let _ = reply.send(serde_json::to_string(&self.status(ctx)).map_err(|e| e.to_string()));
            }
            Request::Export(q, reply) => {
                let _ = reply.send(self.export(ctx, &q).map_err(|e| format!("{e:#}")));
            }
            Request::Otlp(reply) => {
                let _ = reply.send(self.otlp_body(ctx));
            }
        }
        Ok(Flow::Continue)
    }

    fn finish(&mut self, _: &mut Ctx<'_>, _: &End) -> Result<ExitCode> {
        eprintln!("gpumem: stopping");
        Ok(ExitCode::SUCCESS)
    }

    /// The runtime no longer reads requests: a scrape in flight is answered
    /// 503 at once (its request channel is gone), then the port is closed.
    fn close(&mut self) -> impl std::future::Future<Output = ()> {
        let servers = [self.server.take(), self.api_server.take()];
        let socket = self.socket.clone();
        if let Some(t) = self.otlp_task.take() {
            t.abort();
        }
        async move {
            for s in servers.into_iter().flatten() {
                let _ = s.stop.send(());
                let _ = tokio::time::timeout(Duration::from_secs(5), s.task).await;
            }
            // Nobody answers there any more: no stale socket is left.
            if let Some(path) = socket {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    if args.continuity.cleanup {
        let done = cleanup::run(&args.continuity.pin_dir, &args.continuity.state_dir)?;
        if args.continuity.then_wait {
            cleanup::wait_for_stop();
        }
        return Ok(done);
    }
    // Bind first: a taken port is the most likely mistake, said before loading anything.
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {} (is another gpumem or exporter using it? choose one with --listen)", args.listen))?;
    let (api, socket) = match &args.socket {
        Some(path) => {
            let (l, note) = crate::daemon::socket::bind(path)?;
            if let Some(n) = note {
                eprintln!("gpumem: {n}");
            }
            (Some((l, path.clone())), Some(path.clone()))
        }
        None => (None, None),
    };
    let probing = args.probes.probing();
    let actions = args.actions.config();
    let flight = flight_recorder(&args, actions.is_some(), probing.stacks.effective_sample_bytes())?;
    let node = node_name();
    let (tx, rx) = mpsc::channel(16);
    let mut serve = Serve {
        listener: Some(listener),
        api,
        api_server: None,
        socket,
        listen: args.listen,
        max_process_series: args.max_process_series as usize,
        leak_age_ns: (args.leak_age * 1e9) as u64,
        nvml_interval_s: args.nvml_interval,
        fail_renders: args.fail_renders,
        tx,
        rx: Some(rx),
        server: None,
        nvml_said: false,
        began: Instant::now(),
        began_unix_ns: unix_ns(),
        otlp: args.otlp_endpoint.clone().map(|e| (e, Duration::from_secs_f64(args.otlp_interval))),
        pushes: Default::default(),
        otlp_task: None,
        acting: act::Acting::new(actions, node.clone(), flight),
        node,
    };
    let mut s = Session::new(probing);
    s.ringbuf_bytes = args.ringbuf_bytes;
    s.pipeline.limits.max_entries = args.max_allocations;
    s.pipeline.growth_samples = GROWTH_SAMPLES;
    s.pipeline.history = Some(HISTORY_ENTRIES);
    s.growth_every = Some(Duration::from_secs_f64(args.growth_interval));
    s.nvml_every = Duration::from_secs_f64(args.nvml_interval);
    s.host_every = Some(HOST_INTERVAL);
    s.kmsg = Some(args.kmsg.clone()).filter(|p| p.as_os_str() != "none");
    // The flight recorder keeps the lookups its recordings need.
    s.record_lookups = args.actions.flight_recorder.is_some();
    s.forget_after = Some(Duration::from_secs_f64(args.exited_grace));
    s.detach = Detach::Now;
    s.fail_counter_reads = args.fail_counter_reads;
    s.continuity = args.continuity.options();
    runtime::run(s, &mut serve)
}

/// The node's name for OTLP's `host.name`: the DaemonSet's NODE_NAME, else the host name.
fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_default()
}

/// `--flight-recorder`, which only writes when something acts.
fn flight_recorder(args: &ServeArgs, acting: bool, stack_sample_bytes: u64) -> Result<Option<flight::FlightRecorder>> {
    let Some(window_s) = args.actions.flight_recorder else { return Ok(None) };
    if !acting {
        anyhow::bail!("--flight-recorder writes its window when an action fires: add --action EVENT=COMMAND or --webhook URL");
    }
    Ok(Some(flight::FlightRecorder::new(window_s, args.actions.flight_dir.clone(), stack_sample_bytes)))
}

fn router(requests: mpsc::Sender<Request>) -> Router {
    let for_health = requests.clone();
    Router::new()
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let requests = requests.clone();
                // Prometheus asks for OpenMetrics; curl, promtool and older
                // scrapers get the classic text format.
                let openmetrics =
                    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/openmetrics-text"));
                async move { metrics_response(ask(&requests, Request::Metrics).await, openmetrics) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let requests = for_health.clone();
                async move {
                    match ask(&requests, Request::Health).await {
                        Some(body) => body.into_response(),
                        None => unavailable(),
                    }
                }
            }),
        )
}

/// The local API: what `top`, `leaks`, `trace` and `status` ask a running daemon.
fn metrics_response(answer: Option<Result<String, std::fmt::Error>>, openmetrics: bool) -> Response {
    match answer {
        Some(Ok(body)) if openmetrics => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Some(Ok(body)) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], prometheus::to_text_format(&body)).into_response(),
        Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("gpumem: rendering the metrics failed: {e}\n")).into_response(),
        None => unavailable(),
    }
}

/// Asks the runtime; None if it does not answer in time (stuck or stopping).
pub(super) async fn ask<T>(requests: &mpsc::Sender<Request>, make: fn(oneshot::Sender<T>) -> Request) -> Option<T> {
    ask_with(requests, make).await
}

pub(super) async fn ask_with<T>(requests: &mpsc::Sender<Request>, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    requests.send(make(tx)).await.ok()?;
    tokio::time::timeout(ANSWER_TIMEOUT, rx).await.ok()?.ok()
}

pub(super) fn unavailable() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "gpumem: the agent did not answer\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rendering_is_a_500_that_says_why() {
        let r = metrics_response(Some(Err(std::fmt::Error)), false);
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(metrics_response(None, false).status(), StatusCode::SERVICE_UNAVAILABLE);
        let ok = metrics_response(Some(Ok("# EOF\n".into())), true);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[header::CONTENT_TYPE], OPENMETRICS);
    }
}
