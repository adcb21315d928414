//! `gpumem serve`: the daemon. Traces every process on the host, keeps the
//! state, samples NVML, and answers Prometheus scrapes on /metrics until
//! SIGTERM/SIGINT, then detaches every probe before it exits.
//!
//! One task owns all state; the HTTP handlers ask it for a rendering over a
//! channel, so a scrape never races an event and nothing is locked.
use std::{
    future::IntoFuture as _,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use axum::{
    http::{header, HeaderMap},
    response::IntoResponse,
    routing::get,
    Router,
};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::{mpsc, oneshot},
};

use super::{
    load_agent,attach_discovered, attach_given, ingest::Ingest, require_privileges};
use crate::{
    analysis::{
        distributions,
        health::Thresholds,
        leaks::{monotonic_ns, GrowthTracker},
    },
    cli::ServeArgs,
    events::EventReader,
    export::prometheus::{self, ExportConfig, Exporter, Inputs},
    nvml::monitor::Monitor,
    probes::ProbeSet,
    state::{Limits, State},
};

/// How often new libcuda copies are looked for, and exited processes pruned.
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(500);
/// NVIDIA descriptors are rescanned from /proc every this many discovery ticks.
const FD_RESCAN_TICKS: u64 = 4;
/// Samples per growth series (the detector's window: 10 min at 1 s).
const GROWTH_SAMPLES: usize = 600;
/// A scrape or health check that the main task has not answered by then fails.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

enum Request {
    Metrics(oneshot::Sender<String>),
    Health(oneshot::Sender<String>),
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    require_privileges()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> Result<ExitCode> {
    let say = |m: String| eprintln!("gpumem: {m}");
    // Bind first: a taken port is the most likely mistake, report it before loading anything.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (is another gpumem or exporter using it? choose one with --listen)", args.listen))?;
    let mut agent = load_agent(&args.probes, false, ProbeSet::Full, args.ringbuf_bytes)?;
    for note in &agent.notes {
        say(note.clone());
    }
    let mut reader = EventReader::new(agent.take_events()?).context("watching the ring buffer")?;
    attach_given(&mut agent, &args.probes, say)?;
    attach_discovered(&mut agent, &args.probes, true, say);

    let mut ingest = Ingest::live(State::new(Limits { max_entries: args.max_allocations, ..Limits::default() }), false);
    let mut exporter = Exporter::new(ExportConfig {
        max_process_series: args.max_process_series as usize,
        leak_age_ns: (args.leak_age * 1e9) as u64,
    });
    let mut growth = GrowthTracker::with_capacity(GROWTH_SAMPLES);
    let thresholds = Thresholds::default();
    let mut gpus = Monitor::open(args.probes.nvml.as_ref().map(|p| p.as_os_str().to_os_string()));
    for x in gpus.sample(&thresholds) {
        exporter.observe_xid(x.gpu, x.xid);
    }
    match &gpus.error {
        None => say(format!("NVML: {} GPU(s)", gpus.latest.len())),
        Some(e) => say(format!("{e}; serving traced memory only, retrying every {} s", args.nvml_interval)),
    }

    let (requests, mut incoming) = mpsc::channel::<Request>(16);
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, router(requests))
            .with_graceful_shutdown(async move {
                let _ = server_stopped.await;
            })
            .into_future(),
    );
    say(format!("serving http://{}/metrics ({} probes attached); SIGTERM or Ctrl-C to stop", args.listen, agent.attached_probe_count()));

    let began = Instant::now();
    let mut discovery = tokio::time::interval_at(tokio::time::Instant::now() + DISCOVERY_INTERVAL, DISCOVERY_INTERVAL);
    let growth_every = Duration::from_secs_f64(args.growth_interval);
    let mut growth_tick = tokio::time::interval(growth_every);
    let nvml_every = Duration::from_secs_f64(args.nvml_interval);
    let mut nvml_tick = tokio::time::interval_at(tokio::time::Instant::now() + nvml_every, nvml_every);
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut ticks = 0u64;
    let grace_ns = (args.exited_grace * 1e9) as u64;
    let on_event = |ingest: &mut Ingest, exporter: &mut Exporter, ev: &gpumem_common::Event, stack: Option<&gpumem_common::StackEvent>| {
        let (done, _) = ingest.event(ev, stack);
        let obs = distributions::observe(ev, &done.applied);
        exporter.observe(ev, &done.applied, obs.as_ref());
    };

    loop {
        tokio::select! {
            r = reader.readable() => {
                r.context("reading events")?;
                reader.drain_now(&mut |ev, stack| on_event(&mut ingest, &mut exporter, ev, stack));
            }
            Some(req) = incoming.recv() => match req {
                Request::Metrics(reply) => {
                    // Everything already in the ring counts in this scrape.
                    reader.drain_now(&mut |ev, stack| on_event(&mut ingest, &mut exporter, ev, stack));
                    for x in gpus.take_xids() {
                        exporter.observe_xid(x.gpu, x.xid);
                    }
                    let lost = agent.lost_events(reader.malformed)?;
                    ingest.state.mark_lost(&lost.by_pid);
                    let body = exporter.render(Inputs {
                        state: &ingest.state,
                        growth: &mut growth,
                        gpus: &gpus.latest,
                        health: &gpus.health,
                        nvml_error: gpus.error.as_deref(),
                        lost: &lost,
                        probes_attached: agent.attached_probe_count(),
                        stale_calls_removed: agent.stale_calls_removed,
                        now_ns: monotonic_ns(),
                    });
                    let _ = reply.send(body.unwrap_or_else(|e| format!("# rendering failed: {e}\n")));
                }
                Request::Health(reply) => {
                    let _ = reply.send(format!(
                        "ok: up {:.0} s, {} probes attached, {} processes tracked, NVML {}\n",
                        began.elapsed().as_secs_f64(),
                        agent.attached_probe_count(),
                        ingest.state.processes.len(),
                        gpus.error.as_deref().unwrap_or("up"),
                    ));
                }
            },
            _ = growth_tick.tick() => growth.sample(&ingest.state, began.elapsed().as_secs_f64()),
            _ = nvml_tick.tick() => {
                for x in gpus.sample(&thresholds) {
                    exporter.observe_xid(x.gpu, x.xid);
                }
                ingest.state.assume_devices(&gpus.latest);
            }
            _ = discovery.tick() => {
                attach_discovered(&mut agent, &args.probes, false, say);
                ticks += 1;
                if ticks % FD_RESCAN_TICKS == 0 {
                    agent.seed_nvidia_fds();
                    agent.sweep_stale_calls();
                    let state = &ingest.state;
                    agent.forget_lost(|pid| state.processes.contains_key(&pid));
                }
                // Exited processes keep their (zero) series for the grace period.
                for pid in ingest.state.forget_exited_before(monotonic_ns().saturating_sub(grace_ns)) {
                    exporter.forget_process(pid);
                    growth.forget(pid);
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    say("stopping".into());
    let _ = stop_server.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    drop(reader);
    // Detached here, not in the background: when serve exits, nothing of it
    // is left in the kernel (a DaemonSet pod's grace period covers this).
    let probes = agent.attached_probe_count();
    let t = Instant::now();
    drop(agent);
    say(format!("{probes} probes detached in {:.1} s", t.elapsed().as_secs_f64()));
    Ok(ExitCode::SUCCESS)
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
                let openmetrics = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|a| a.contains("application/openmetrics-text"));
                async move {
                    match ask(&requests, Request::Metrics).await {
                        Some(body) if openmetrics => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
                        Some(body) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], prometheus::to_text_format(&body)).into_response(),
                        None => unavailable(),
                    }
                }
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

/// Asks the main task; None if it does not answer in time (stuck or stopping).
async fn ask(requests: &mpsc::Sender<Request>, make: fn(oneshot::Sender<String>) -> Request) -> Option<String> {
    let (tx, rx) = oneshot::channel();
    requests.send(make(tx)).await.ok()?;
    tokio::time::timeout(ANSWER_TIMEOUT, rx).await.ok()?.ok()
}

fn unavailable() -> axum::response::Response {
    (axum::http::StatusCode::SERVICE_UNAVAILABLE, "gpumem: the agent did not answer\n").into_response()
}
