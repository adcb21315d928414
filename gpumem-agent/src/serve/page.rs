//! The live page on serve's metrics listener: `/` is a self-contained page
//! (its HTML, CSS and script embedded in the binary; nothing fetched from
//! elsewhere) that refreshes from `/api/v1/…`: the local API's read-only
//! questions (top's snapshot, leaks as JSON, recent OOMs and XIDs, a
//! process's flame graph), answered by the same code as the socket's.
use axum::{
    extract::Request as HttpRequest,
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use gpumem_engine::query::{export::Format, wire::ParseError, Query};
use tokio::sync::mpsc;

use super::{
    http::{ask, unavailable},
    metrics::Request,
};

/// The page: HTML with its style and script inline.
const PAGE: &str = include_str!("page.html");
/// Scripts and styles only from the page itself, data only from this
/// listener; no frame may embed it.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; \
                   object-src 'self' blob:; frame-src 'self' blob:; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
/// The longest question asked (pids, a format, a space).
const MAX_URI: usize = 1024;

/// Whether the page may ask this of the agent: what it draws, nothing else
/// (no exports but the flame graph, no status with paths of the node).
fn allowed(q: &Query) -> bool {
    match q {
        Query::Snapshot | Query::Events | Query::Leaks(_) => true,
        Query::Export(e) => e.format == Format::Flamegraph,
        _ => false,
    }
}

/// `/` and `/api/v1/…`, asked of the runtime over `requests`.
pub fn routes(requests: mpsc::Sender<Request>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async {
                let headers = [
                    (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
                    (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
                    (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                ];
                (headers, PAGE).into_response()
            }),
        )
        .route(
            "/api/{*question}",
            get(move |req: HttpRequest| {
                let requests = requests.clone();
                async move { respond(&requests, req).await }
            }),
        )
}

async fn respond(requests: &mpsc::Sender<Request>, req: HttpRequest) -> Response {
    let uri = req.uri();
    if uri.to_string().len() > MAX_URI {
        return (StatusCode::URI_TOO_LONG, format!("gpumem: a question is at most {MAX_URI} bytes\n")).into_response();
    }
    let path = uri.path().strip_prefix("/api").unwrap_or(uri.path());
    let query = match Query::parse(path, uri.query().unwrap_or("")) {
        Ok(q) if allowed(&q) => q,
        Ok(_) | Err(ParseError::Unknown(_)) => {
            return (StatusCode::NOT_FOUND, "gpumem: the page asks /api/v1/snapshot, leaks, events and flame graphs only\n").into_response()
        }
        Err(e) => return (StatusCode::BAD_REQUEST, format!("gpumem: {e}\n")).into_response(),
    };
    let kind = if query.is_binary() { "image/svg+xml" } else { "application/json" };
    match ask(requests, |reply| Request::Query { query, reply }).await {
        Some(Ok(bytes)) => {
            ([(header::CONTENT_TYPE, kind), (header::X_CONTENT_TYPE_OPTIONS, "nosniff"), (header::CACHE_CONTROL, "no-store")], bytes)
                .into_response()
        }
        Some(Err((status, e))) => (status, format!("gpumem: {e}\n")).into_response(),
        None => unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_asks_only_what_it_draws() {
        let q = |p: &str, s: &str| Query::parse(p, s).unwrap();
        assert!(allowed(&q("/v1/snapshot", "")) && allowed(&q("/v1/events", "")) && allowed(&q("/v1/leaks", "json=true")));
        assert!(allowed(&q("/v1/export", "format=flamegraph&pid=7")));
        assert!(!allowed(&q("/v1/export", "format=pprof")), "no other export");
        assert!(!allowed(&q("/v1/status", "")) && !allowed(&q("/v1/holdings", "")));
        assert!(PAGE.starts_with("<!DOCTYPE html>"));
        for fetched in [" src=", "<link", "https://", "@import", "url("] {
            assert!(!PAGE.contains(fetched), "the page fetches nothing but its own API: {fetched}");
        }
    }
}
