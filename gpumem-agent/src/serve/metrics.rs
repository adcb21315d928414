//! serve's metrics listener: Prometheus scrapes on /metrics (OpenMetrics
//! when asked for, the classic text format otherwise), /healthz and the
//! live page (`/` and its read-only questions, serve/page.rs). Each
//! request asks the runtime's task for its rendering (an input of this
//! output), so a scrape never races an event and nothing is locked.
use std::{net::SocketAddr, process::ExitCode, sync::Arc, time::Instant};

use anyhow::{Context as _, Result};
use axum::{
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use gpumem_engine::{
    analysis::view::ViewOptions,
    clock::monotonic_ns,
    export::prometheus::{self, Scrape},
    model::nvml::Message,
};
use tokio::sync::{mpsc, oneshot};

use super::{
    http::{ask, unavailable, Server},
    otlp::Pushes,
};
use crate::{
    actions::Counts,
    runtime::{Ctx, End, Flow, Output},
};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub enum Request {
    /// The exposition, or why it could not be rendered.
    Metrics(oneshot::Sender<Result<String, std::fmt::Error>>),
    Health(oneshot::Sender<String>),
    /// A question of the live page (serve/page.rs allows which).
    Query {
        query: gpumem_engine::query::Query,
        reply: oneshot::Sender<Result<Vec<u8>, (StatusCode, String)>>,
    },
}

/// What /metrics shows besides the pipeline and the agent's status.
#[derive(Clone, Default)]
pub struct Extras {
    /// `--otlp-endpoint`: the pushes so far.
    pub otlp: Option<Arc<Pushes>>,
    /// `--action`/`--webhook`: their outcomes so far.
    pub actions: Option<Arc<Counts>>,
}

pub struct Metrics {
    listener: Option<std::net::TcpListener>,
    listen: SocketAddr,
    /// Process series at most before the long tail is summed (`--max-process-series`).
    max_process_series: usize,
    /// Allocations at least this old count as leak suspects (`--leak-age`).
    leak_age_ns: u64,
    nvml_interval_s: f64,
    /// Fault injection: renderings still to fail.
    fail_renders: u32,
    page: bool,
    extras: Extras,
    tx: mpsc::Sender<Request>,
    rx: Option<mpsc::Receiver<Request>>,
    server: Option<Server>,
    /// Whether NVML's state was said yet.
    nvml_said: bool,
    began: Instant,
}

/// `serve`'s settings for /metrics.
pub struct Settings {
    pub max_process_series: usize,
    pub leak_age_s: f64,
    pub nvml_interval_s: f64,
    pub fail_renders: u32,
    /// The live page beside /metrics (`--no-page` turns it off).
    pub page: bool,
}

impl Metrics {
    /// Over `listener` (bound first: a taken port is said before anything loads).
    pub fn new(listener: std::net::TcpListener, listen: SocketAddr, s: Settings, extras: Extras) -> Metrics {
        let (tx, rx) = mpsc::channel(16);
        Metrics {
            listener: Some(listener),
            listen,
            max_process_series: s.max_process_series,
            leak_age_ns: (s.leak_age_s * 1e9) as u64,
            nvml_interval_s: s.nvml_interval_s,
            fail_renders: s.fail_renders,
            page: s.page,
            extras,
            tx,
            rx: Some(rx),
            server: None,
            nvml_said: false,
            began: Instant::now(),
        }
    }

    fn scrape(&mut self, ctx: &mut Ctx<'_>) -> Result<String, std::fmt::Error> {
        if self.fail_renders > 0 {
            // Fault injection: what the encoder returns when it fails.
            self.fail_renders -= 1;
            return Err(std::fmt::Error);
        }
        with_scrape(ctx, self.leak_age_ns, self.max_process_series, &self.extras, prometheus::render)
    }
}

/// The view a scrape renders: exited processes (at 0 until forgotten) and
/// each row's owners (the render benchmark takes the same).
pub fn scrape_view(leak_age_ns: u64) -> ViewOptions {
    ViewOptions { now_ns: monotonic_ns(), leak_age_ns, exited: true, owners: true, ..Default::default() }
}

/// `f` of what /metrics shows now (the view with exited processes, the
/// agent's status, the OTLP pushes and actions where there are).
pub fn with_scrape<T>(ctx: &mut Ctx<'_>, leak_age_ns: u64, max_series: usize, extras: &Extras, f: impl FnOnce(&Scrape<'_>) -> T) -> T {
    let p = &mut *ctx.pipeline;
    let view = p.view(&scrape_view(leak_age_ns));
    let mut scrape = Scrape::of(p, &view, ctx.agent, max_series);
    scrape.otlp_pushes = extras.otlp.as_ref().map(|p| p.counts());
    scrape.actions = extras.actions.as_ref().map(|a| a.snapshot());
    f(&scrape)
}

impl Output for Metrics {
    type Input = Request;

    fn inputs(&mut self) -> Option<mpsc::Receiver<Request>> {
        self.rx.take()
    }

    /// The listener serves from here on; the ready line comes last of serve's.
    fn started(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        let listener = self.listener.take().context("the metrics listener was started twice")?;
        listener.set_nonblocking(true).context("setting up the listener")?;
        let listener = tokio::net::TcpListener::from_std(listener).context("setting up the listener")?;
        self.server = Some(Server::spawn(listener, router(self.tx.clone(), self.page)));
        eprintln!(
            "gpumem: serving http://{}/metrics ({} probes attached); SIGTERM or Ctrl-C to stop",
            self.listen, ctx.agent.probes_attached
        );
        Ok(())
    }

    fn nvml(&mut self, _: &mut Ctx<'_>, m: &Message, _: f64) -> Result<()> {
        if !std::mem::replace(&mut self.nvml_said, true) {
            match m {
                Message::Reading { gpus, .. } => eprintln!("gpumem: NVML: {} GPU(s)", gpus.len()),
                Message::Unavailable(e) => eprintln!("gpumem: {e}; serving traced memory only, retrying every {} s", self.nvml_interval_s),
                Message::Xid(_) => self.nvml_said = false,
            }
        }
        Ok(())
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, r: Request) -> Result<Flow> {
        match r {
            Request::Metrics(reply) => {
                let _ = reply.send(self.scrape(ctx));
            }
            Request::Query { query, reply } => {
                let _ = reply.send(super::api::answer(ctx, self.began, &format!("http://{}/metrics", self.listen), &query));
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
                s.stop().await;
            }
        }
    }
}

fn router(requests: mpsc::Sender<Request>, page: bool) -> Router {
    let for_health = requests.clone();
    let page = if page { super::page::routes(requests.clone()) } else { Router::new() };
    Router::new()
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let requests = requests.clone();
                // Prometheus asks for OpenMetrics; curl, promtool and older
                // scrapers get the classic text format.
                let openmetrics =
                    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/openmetrics-text"));
                // Prometheus asks for gzip: a scrape is about a tenth of its text then.
                let gzip = headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("gzip"));
                async move {
                    let response = metrics_response(ask(&requests, Request::Metrics).await, openmetrics);
                    if gzip && response.status() == StatusCode::OK {
                        gzipped(response).await
                    } else {
                        response
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
        .merge(page)
}

fn metrics_response(answer: Option<Result<String, std::fmt::Error>>, openmetrics: bool) -> Response {
    match answer {
        Some(Ok(body)) if openmetrics => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Some(Ok(body)) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], prometheus::to_text_format(&body)).into_response(),
        Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("gpumem: rendering the metrics failed: {e}\n")).into_response(),
        None => unavailable(),
    }
}

/// The response's body gzipped off the runtime's threads; as it was if that fails.
async fn gzipped(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "gpumem: reading the rendered metrics failed\n").into_response();
    };
    let compressed = tokio::task::spawn_blocking(move || crate::http_post::gzip(&bytes).map_err(|_| bytes)).await;
    match compressed {
        Ok(Ok(body)) => {
            parts.headers.insert(header::CONTENT_ENCODING, header::HeaderValue::from_static("gzip"));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(body))
        }
        Ok(Err(plain)) => Response::from_parts(parts, axum::body::Body::from(plain)),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "gpumem: compressing the metrics failed\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_gzipped_scrape_unzips_to_the_same_text() {
        use std::io::Read as _;
        let text = "# HELP x X.\n# TYPE x gauge\nx 1\n".repeat(100) + "# EOF\n";
        let r = gzipped(metrics_response(Some(Ok(text.clone())), true)).await;
        assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(r.headers()[header::CONTENT_TYPE], OPENMETRICS);
        let body = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap();
        let mut unzipped = String::new();
        flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut unzipped).unwrap();
        assert_eq!(unzipped, text);
        assert!(body.len() < text.len() / 10, "{} of {}", body.len(), text.len());
    }

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
