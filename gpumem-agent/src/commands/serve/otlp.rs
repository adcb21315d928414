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

use tokio::sync::{mpsc, oneshot};

use super::Request;
use crate::http_post;

/// A push not answered by then has failed.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where to push: an OTLP/HTTP receiver (http only; a collector on the
/// node or in the cluster terminates TLS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint(pub http_post::Endpoint);

impl std::str::FromStr for Endpoint {
    type Err = String;

    /// `http://host[:port][/path]`; the path defaults to OTLP's `/v1/metrics`.
    fn from_str(url: &str) -> Result<Self, String> {
        http_post::Endpoint::parse(url, "/v1/metrics").map(Endpoint)
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
            match tokio::time::timeout(PUSH_TIMEOUT, http_post::post(&e.0, "application/x-protobuf", body)).await {
                Ok(Ok(_)) => {
                    pushes.ok.fetch_add(1, Ordering::Relaxed);
                    said_failure = false;
                }
                Ok(Err(err)) => fail(&pushes, &mut said_failure, &format!("{err:#}")),
                Err(_) => fail(&pushes, &mut said_failure, &format!("{} did not answer in {} s", e.0.authority, PUSH_TIMEOUT.as_secs())),
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
