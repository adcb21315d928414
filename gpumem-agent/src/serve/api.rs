//! serve's local API (a Unix socket, root only): the engine's queries
//! (gpumem_engine::query), each asked of the runtime's task (an input of
//! this output) and answered with the bytes the asking command prints, or
//! JSON of the typed answer. A query that does not parse is a 400 that
//! says why, one that names no question a 404.
use std::{path::PathBuf, process::ExitCode, time::Instant};

use anyhow::{Context as _, Result};
use axum::{
    extract::Request as HttpRequest,
    http::{header, Method, StatusCode},
    response::{IntoResponse, Response},
    Router,
};
use gpumem_engine::{
    clock::{monotonic_ns, unix_ns},
    query::{
        self,
        status::Serving,
        wire::{ParseError, VERSION_HEADER},
        Answer, Asked, Query, QueryError,
    },
    VERSION,
};
use tokio::sync::{mpsc, oneshot};

use super::http::{ask, unavailable, Server};
use crate::runtime::{Ctx, End, Flow, Output};

/// The longest query asked (a filter names a few pids, a duration, a format).
const MAX_URI: usize = 4096;

/// A query and where its answer goes: the bytes, or (status, why).
pub struct Request {
    query: Query,
    reply: oneshot::Sender<Result<Vec<u8>, (StatusCode, String)>>,
}

pub struct LocalApi {
    listener: Option<std::os::unix::net::UnixListener>,
    /// The socket, removed when the API closes.
    path: PathBuf,
    /// Where the daemon's metrics are (its status says).
    metrics_url: String,
    tx: mpsc::Sender<Request>,
    rx: Option<mpsc::Receiver<Request>>,
    server: Option<Server>,
    began: Instant,
    access: super::peer::Access,
}

impl LocalApi {
    /// Over `listener`, bound at `path` (bound first: a socket another
    /// daemon answers on is said before anything loads).
    pub fn new(listener: std::os::unix::net::UnixListener, path: PathBuf, metrics_url: String, access: super::peer::Access) -> LocalApi {
        let (tx, rx) = mpsc::channel(16);
        LocalApi { listener: Some(listener), path, metrics_url, tx, rx: Some(rx), server: None, began: Instant::now(), access }
    }
}

/// A query's answer as bytes, as the daemon (up since `began`, its metrics
/// at `metrics_url`) knows things now: the local API's and the live page's.
pub fn answer(ctx: &mut Ctx<'_>, began: Instant, metrics_url: &str, q: &Query) -> Result<Vec<u8>, (StatusCode, String)> {
    let up_s = began.elapsed().as_secs_f64();
    let serving = Serving { pid: std::process::id(), up_s, metrics: metrics_url.to_string() };
    let at = Asked {
        agent: ctx.agent,
        now_ns: monotonic_ns(),
        duration_s: up_s,
        wall_end_ns: unix_ns() as i64,
        recorded_by: format!("gpumem serve (pid {}) on {}, up {up_s:.0} s", serving.pid, crate::node::name()),
        serving: Some(&serving),
    };
    let failed = |e: QueryError| {
        // An export of what this daemon does not keep is the asker's to change.
        let status = if q.is_binary() { StatusCode::UNPROCESSABLE_ENTITY } else { StatusCode::INTERNAL_SERVER_ERROR };
        (status, e.to_string())
    };
    query::answer(ctx.pipeline, &at, q).and_then(|a: Answer| a.to_bytes()).map_err(failed)
}

impl Output for LocalApi {
    type Input = Request;

    fn inputs(&mut self) -> Option<mpsc::Receiver<Request>> {
        self.rx.take()
    }

    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        let api = self.listener.take().context("the local API was started twice")?;
        api.set_nonblocking(true).context("setting up the local API")?;
        let api = tokio::net::UnixListener::from_std(api).context("setting up the local API")?;
        self.server = Some(Server::spawn(super::peer::Guarded::new(api, self.access), router(self.tx.clone())));
        eprintln!("gpumem: local API on {} (top, leaks, status and export use it)", self.path.display());
        Ok(())
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, r: Request) -> Result<Flow> {
        let _ = r.reply.send(answer(ctx, self.began, &self.metrics_url, &r.query));
        Ok(Flow::Continue)
    }

    fn finish(&mut self, _: &mut Ctx<'_>, _: &End) -> Result<ExitCode> {
        Ok(ExitCode::SUCCESS)
    }

    /// Nobody answers there any more: no stale socket is left.
    fn close(&mut self) -> impl std::future::Future<Output = ()> {
        let (server, path) = (self.server.take(), self.path.clone());
        async move {
            if let Some(s) = server {
                s.stop().await;
            }
            let _ = std::fs::remove_file(path);
        }
    }
}

fn router(requests: mpsc::Sender<Request>) -> Router {
    Router::new()
        .fallback(move |req: HttpRequest| {
            let requests = requests.clone();
            async move { respond(&requests, req).await }
        })
        .layer(axum::middleware::map_response(|mut r: Response| async move {
            r.headers_mut().insert(VERSION_HEADER, header::HeaderValue::from_static(VERSION));
            r
        }))
}

async fn respond(requests: &mpsc::Sender<Request>, req: HttpRequest) -> Response {
    if req.method() != Method::GET {
        return (StatusCode::METHOD_NOT_ALLOWED, "gpumem: the local API answers GET only\n").into_response();
    }
    let uri = req.uri();
    if uri.to_string().len() > MAX_URI {
        return (StatusCode::URI_TOO_LONG, format!("gpumem: a query is at most {MAX_URI} bytes\n")).into_response();
    }
    let query = match Query::parse(uri.path(), uri.query().unwrap_or("")) {
        Ok(q) => q,
        Err(e @ ParseError::Unknown(_)) => return (StatusCode::NOT_FOUND, format!("gpumem: {e}\n")).into_response(),
        Err(e) => return (StatusCode::BAD_REQUEST, format!("gpumem: {e}\n")).into_response(),
    };
    let binary = query.is_binary();
    match ask(requests, |reply| Request { query, reply }).await {
        Some(Ok(bytes)) if binary => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Some(Ok(bytes)) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], bytes).into_response(),
        Some(Err((status, e))) => (status, format!("gpumem: {e}\n")).into_response(),
        None => unavailable(),
    }
}
