//! `gpumem serve`: the daemon. Traces every process on the host and answers
//! Prometheus scrapes on /metrics until SIGTERM/SIGINT, then detaches every
//! probe before it exits.
//!
//! The runtime's task owns all state; the HTTP handlers ask it for a
//! rendering over a channel (an input of this output), so a scrape never
//! races an event and nothing is locked.
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
    analysis::view::ViewOptions,
    cli::ServeArgs,
    clock::monotonic_ns,
    export::prometheus::{self, Scrape},
    nvml,
    runtime::{self, Ctx, Detach, End, Flow, Output, Session},
};

/// Samples per growth series (the detector's window: 10 min at 1 s).
const GROWTH_SAMPLES: usize = 600;
/// A scrape or health check that the runtime has not answered by then fails.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub enum Request {
    /// The exposition, or why it could not be rendered.
    Metrics(oneshot::Sender<Result<String, std::fmt::Error>>),
    Health(oneshot::Sender<String>),
}

struct Server {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub struct Serve {
    listener: Option<std::net::TcpListener>,
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
    began: Instant,
}

impl Serve {
    fn scrape(&mut self, ctx: &mut Ctx<'_>) -> Result<String, std::fmt::Error> {
        if self.fail_renders > 0 {
            // Fault injection: what the encoder returns when it fails.
            self.fail_renders -= 1;
            return Err(std::fmt::Error);
        }
        let p = &mut *ctx.pipeline;
        let view = p.view(&ViewOptions { now_ns: monotonic_ns(), leak_age_ns: self.leak_age_ns, exited: true, ..Default::default() });
        let scrape = Scrape::of(p, &view, ctx.agent, self.max_process_series);
        prometheus::render(&scrape)
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
        eprintln!(
            "gpumem: serving http://{}/metrics ({} probes attached); SIGTERM or Ctrl-C to stop",
            self.listen, ctx.agent.probes_attached
        );
        Ok(())
    }

    fn nvml(&mut self, _: &mut Ctx<'_>, m: &nvml::Message, _: f64) -> Result<()> {
        if !std::mem::replace(&mut self.nvml_said, true) {
            match m {
                nvml::Message::Reading { gpus, .. } => eprintln!("gpumem: NVML: {} GPU(s)", gpus.len()),
                nvml::Message::Unavailable(e) => {
                    eprintln!("gpumem: {e}; serving traced memory only, retrying every {} s", self.nvml_interval_s)
                }
                nvml::Message::Xid(_) => self.nvml_said = false,
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
        let server = self.server.take();
        async move {
            if let Some(s) = server {
                let _ = s.stop.send(());
                let _ = tokio::time::timeout(Duration::from_secs(5), s.task).await;
            }
        }
    }
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    // Bind first: a taken port is the most likely mistake, said before loading anything.
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {} (is another gpumem or exporter using it? choose one with --listen)", args.listen))?;
    let (tx, rx) = mpsc::channel(16);
    let mut serve = Serve {
        listener: Some(listener),
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
    };
    let mut s = Session::new(args.probes.probing());
    s.ringbuf_bytes = args.ringbuf_bytes;
    s.pipeline.limits.max_entries = args.max_allocations;
    s.pipeline.growth_samples = GROWTH_SAMPLES;
    s.growth_every = Some(Duration::from_secs_f64(args.growth_interval));
    s.nvml_every = Duration::from_secs_f64(args.nvml_interval);
    s.forget_after = Some(Duration::from_secs_f64(args.exited_grace));
    s.detach = Detach::Now;
    s.fail_counter_reads = args.fail_counter_reads;
    runtime::run(s, &mut serve)
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

fn metrics_response(answer: Option<Result<String, std::fmt::Error>>, openmetrics: bool) -> Response {
    match answer {
        Some(Ok(body)) if openmetrics => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Some(Ok(body)) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], prometheus::to_text_format(&body)).into_response(),
        Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("gpumem: rendering the metrics failed: {e}\n")).into_response(),
        None => unavailable(),
    }
}

/// Asks the runtime; None if it does not answer in time (stuck or stopping).
async fn ask<T>(requests: &mpsc::Sender<Request>, make: fn(oneshot::Sender<T>) -> Request) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    requests.send(make(tx)).await.ok()?;
    tokio::time::timeout(ANSWER_TIMEOUT, rx).await.ok()?.ok()
}

fn unavailable() -> Response {
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
