//! The local API's routes (a Unix socket, root only): each asks the
//! runtime for a rendering and answers with it.
use axum::{
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use tokio::sync::mpsc;

use super::{ask, ask_with, unavailable, Reply, Request};
use crate::{commands::export::Query, daemon::LeaksQuery};

pub fn router(requests: mpsc::Sender<Request>) -> Router {
    Router::new()
        .route("/v1/top", api_get(&requests, Request::Top))
        .route("/v1/snapshot", api_get(&requests, Request::Snapshot))
        .route("/v1/status", api_get(&requests, Request::Status))
        .route("/v1/leaks", api_get_query(&requests, LeaksQuery::parse, Request::Leaks))
        .route("/v1/stacks", api_get_query(&requests, parse_stacks_query, |(pid, device), tx| Request::Stacks(pid, device, tx)))
        .route("/v1/holdings", api_get_query(&requests, crate::daemon::parse_pids, Request::Holdings))
        .route("/v1/export", export(&requests))
        .layer(axum::middleware::map_response(|mut r: Response| async move {
            r.headers_mut().insert(crate::daemon::VERSION_HEADER, header::HeaderValue::from_static(crate::daemon::VERSION));
            r
        }))
}

/// A route that asks the runtime and answers with its rendering.
fn api_get(requests: &mpsc::Sender<Request>, make: fn(Reply) -> Request) -> axum::routing::MethodRouter {
    let requests = requests.clone();
    get(move || {
        let r = requests.clone();
        async move { api_response(ask(&r, make).await) }
    })
}

/// The same, the request made from the query string (400 when it does not parse).
fn api_get_query<Q: Send + 'static>(
    requests: &mpsc::Sender<Request>,
    parse: fn(&str) -> Result<Q, String>,
    make: fn(Q, Reply) -> Request,
) -> axum::routing::MethodRouter {
    let requests = requests.clone();
    get(move |query: axum::extract::RawQuery| {
        let r = requests.clone();
        async move {
            match parse(query.0.as_deref().unwrap_or("")) {
                Ok(q) => api_response(ask_with(&r, |tx| make(q, tx)).await),
                Err(e) => (StatusCode::BAD_REQUEST, format!("gpumem: {e}\n")).into_response(),
            }
        }
    })
}

/// `pid=N&device=D` of /v1/stacks.
fn parse_stacks_query(q: &str) -> Result<(u32, i32), String> {
    let (mut pid, mut device) = (None, None);
    for pair in q.split('&') {
        match pair.split_once('=') {
            Some(("pid", v)) => pid = v.parse().ok(),
            Some(("device", v)) => device = v.parse().ok(),
            _ => return Err(format!("unknown parameter {pair:?}")),
        }
    }
    Ok((pid.ok_or("pid=N is missing")?, device.ok_or("device=D is missing")?))
}

fn api_response(answer: Option<Result<String, String>>) -> Response {
    match answer {
        Some(Ok(body)) => body.into_response(),
        Some(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("gpumem: {e}\n")).into_response(),
        None => unavailable(),
    }
}

/// `/v1/export?format=F&pid=N&layers=L`: the export's bytes.
fn export(requests: &mpsc::Sender<Request>) -> axum::routing::MethodRouter {
    let requests = requests.clone();
    get(move |query: axum::extract::RawQuery| {
        let r = requests.clone();
        async move {
            let q = match Query::parse(query.0.as_deref().unwrap_or("")) {
                Ok(q) => q,
                Err(e) => return (StatusCode::BAD_REQUEST, format!("gpumem: {e}\n")).into_response(),
            };
            match ask_with(&r, |tx| Request::Export(q, tx)).await {
                Some(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
                Some(Err(e)) => (StatusCode::UNPROCESSABLE_ENTITY, format!("gpumem: {e}\n")).into_response(),
                None => unavailable(),
            }
        }
    })
}
