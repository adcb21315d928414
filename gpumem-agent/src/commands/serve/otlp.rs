//! `serve --otlp-endpoint URL`: every interval the runtime renders the
//! metrics as an OTLP/HTTP protobuf request (export::otlp) and this task
//! POSTs it; pushes that fail are counted and retried at the next interval
//! (counters are cumulative: nothing is lost by a missed push).
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use http_body_util::{BodyExt as _, Full};
use hyper::{body::Bytes, Request as HttpRequest};
use tokio::sync::{mpsc, oneshot};

use super::Request;

/// A push not answered by then has failed.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where to push: an OTLP/HTTP receiver (http only; a collector on the
/// node or in the cluster terminates TLS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// `host:port`, for the Host header.
    pub authority: String,
    pub path: String,
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    /// `http://host[:port][/path]`; the path defaults to OTLP's `/v1/metrics`.
    fn from_str(url: &str) -> Result<Self, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!("{url}: {other} is not supported, only http (push to a collector on the node that forwards with TLS)"))
            }
            None => return Err(format!("{url}: no scheme; write http://HOST:PORT/PATH")),
        }
        let host = uri.host().ok_or_else(|| format!("{url}: no host"))?.to_string();
        let port = uri.port_u16().unwrap_or(80);
        let path = match uri.path() {
            "" | "/" => "/v1/metrics".to_string(),
            p => uri.path_and_query().map_or(p, |pq| pq.as_str()).to_string(),
        };
        Ok(Endpoint { authority: format!("{host}:{port}"), host, port, path })
    }
}

/// Pushes done and failed, for /metrics.
#[derive(Debug, Default)]
pub struct Pushes {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
}

impl Pushes {
    pub fn counts(&self) -> (u64, u64) {
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

/// POSTs one request body; the receiver's status.
async fn post(e: &Endpoint, body: Vec<u8>) -> Result<u16> {
    let stream =
        tokio::net::TcpStream::connect((e.host.as_str(), e.port)).await.with_context(|| format!("connecting to {}", e.authority))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = HttpRequest::post(e.path.as_str())
        .header(hyper::header::HOST, e.authority.as_str())
        .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    if !resp.status().is_success() {
        let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        bail!("{} answered {status}: {}", e.authority, String::from_utf8_lossy(&body).trim());
    }
    Ok(status)
}

/// The pushing task: one push every `every`, the first one at once.
pub fn spawn(e: Endpoint, every: Duration, requests: mpsc::Sender<Request>, pushes: Arc<Pushes>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut said_failure = false;
        loop {
            tick.tick().await;
            let (tx, rx) = oneshot::channel();
            if requests.send(Request::Otlp(tx)).await.is_err() {
                return; // the runtime is gone
            }
            let Ok(body) = rx.await else { return };
            match tokio::time::timeout(PUSH_TIMEOUT, post(&e, body)).await {
                Ok(Ok(_)) => {
                    pushes.ok.fetch_add(1, Ordering::Relaxed);
                    said_failure = false;
                }
                Ok(Err(err)) => fail(&pushes, &mut said_failure, &format!("{err:#}")),
                Err(_) => fail(&pushes, &mut said_failure, &format!("{} did not answer in {} s", e.authority, PUSH_TIMEOUT.as_secs())),
            }
        }
    })
}

/// Counted every time, said once per run of failures.
fn fail(pushes: &Pushes, said: &mut bool, why: &str) {
    pushes.failed.fetch_add(1, Ordering::Relaxed);
    if !std::mem::replace(said, true) {
        eprintln!("gpumem: OTLP push failed: {why}; retrying every interval (gpumem_otlp_pushes_total counts)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls_with_otlps_path_by_default() {
        let e: Endpoint = "http://127.0.0.1:8428/opentelemetry/v1/metrics".parse().unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("127.0.0.1", 8428, "/opentelemetry/v1/metrics"));
        let e: Endpoint = "http://collector".parse().unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("collector:80", "/v1/metrics"));
        assert!("https://x/v1/metrics".parse::<Endpoint>().unwrap_err().contains("only http"));
        assert!("collector:4318".parse::<Endpoint>().is_err());
    }
}
