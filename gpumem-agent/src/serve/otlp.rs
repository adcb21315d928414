//! `serve --otlp-endpoint URL`: every interval the runtime renders the
//! metrics as an OTLP/HTTP protobuf request (export::otlp, asked as an
//! input of this output) and a task of its own POSTs it; pushes that fail are counted and retried at the next interval
//! (counters are cumulative: nothing is lost by a missed push).
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Result;
use gpumem_engine::{
    clock::unix_ns,
    export::{otlp, prometheus},
};
use tokio::sync::{mpsc, oneshot};

use super::metrics::{with_scrape, Extras};
use crate::{
    http_post::{self, Endpoint},
    runtime::{Ctx, End, Flow, Output},
};

/// The pusher asks for a body: the metrics as an OTLP request, now.
pub struct Request(oneshot::Sender<Vec<u8>>);

/// `--otlp-endpoint`: an Output whose inputs are the pusher's requests.
pub struct OtlpPush {
    endpoint: Endpoint,
    every: Duration,
    pushes: Arc<Pushes>,
    /// OTLP's `host.name`.
    node: String,
    /// Unix ns when the daemon started: OTLP counters count from it.
    began_unix_ns: u64,
    leak_age_ns: u64,
    max_process_series: usize,
    extras: Extras,
    tx: mpsc::Sender<Request>,
    rx: Option<mpsc::Receiver<Request>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// What an OTLP push carries besides the scrape.
pub struct Settings {
    pub endpoint: Endpoint,
    pub every: Duration,
    pub node: String,
    pub leak_age_s: f64,
    pub max_process_series: usize,
}

impl OtlpPush {
    /// `pushes`: shared with /metrics (gpumem_otlp_pushes_total), as `extras` are.
    pub fn new(s: Settings, pushes: Arc<Pushes>, extras: Extras) -> OtlpPush {
        let (tx, rx) = mpsc::channel(4);
        OtlpPush {
            endpoint: s.endpoint,
            every: s.every,
            pushes,
            node: s.node,
            began_unix_ns: unix_ns(),
            leak_age_ns: (s.leak_age_s * 1e9) as u64,
            max_process_series: s.max_process_series,
            extras,
            tx,
            rx: Some(rx),
            task: None,
        }
    }
}

impl Output for OtlpPush {
    type Input = Request;

    fn inputs(&mut self) -> Option<mpsc::Receiver<Request>> {
        self.rx.take()
    }

    fn started(&mut self, _: &mut Ctx<'_>) -> Result<()> {
        eprintln!("gpumem: pushing OTLP metrics to {} every {} s", self.endpoint.url(), self.every.as_secs_f64());
        self.task = Some(spawn(self.endpoint.clone(), self.every, self.tx.clone(), self.pushes.clone()));
        Ok(())
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, Request(reply): Request) -> Result<Flow> {
        let times = otlp::Times { start_ns: self.began_unix_ns, now_ns: unix_ns() };
        let node = &self.node;
        let body = with_scrape(ctx, self.leak_age_ns, self.max_process_series, &self.extras, |scrape| {
            otlp::request(&prometheus::families(scrape), node, times)
        });
        let _ = reply.send(body);
        Ok(Flow::Continue)
    }

    fn finish(&mut self, _: &mut Ctx<'_>, _: &End) -> Result<std::process::ExitCode> {
        Ok(std::process::ExitCode::SUCCESS)
    }

    fn close(&mut self) -> impl std::future::Future<Output = ()> {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        async {}
    }
}

/// A push not answered by then has failed.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

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
fn spawn(e: Endpoint, every: Duration, requests: mpsc::Sender<Request>, pushes: Arc<Pushes>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut said_failure = false;
        loop {
            tick.tick().await;
            let (tx, rx) = oneshot::channel();
            if requests.send(Request(tx)).await.is_err() {
                return; // the runtime is gone
            }
            let Ok(body) = rx.await else { return };
            // Gzipped, as OTLP/HTTP receivers must accept: a push of 10 000
            // process series is 18 MB of protobuf, well under a tenth of it gzipped.
            let Ok(Ok(body)) = tokio::task::spawn_blocking(move || http_post::gzip(&body)).await else {
                fail(&pushes, &mut said_failure, "compressing the push failed");
                continue;
            };
            match tokio::time::timeout(PUSH_TIMEOUT, http_post::post(&e, "application/x-protobuf", Some("gzip"), body)).await {
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
