//! What serve's two servers (the metrics listener and the local API) share:
//! an axum server that stops gracefully, and asking the runtime's task for
//! an answer over a channel (its input) without waiting forever.
use std::{future::IntoFuture as _, time::Duration};

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Router,
};
use tokio::sync::{mpsc, oneshot};

/// A request the runtime has not answered by then fails (503).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long closing waits for a server's requests in flight.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A running server, stopped by `stop`.
pub struct Server {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Serves `router` on `listener` (a TCP or Unix listener) until stopped.
    pub fn spawn<L>(listener: L, router: Router) -> Server
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(axum::serve(listener, router).with_graceful_shutdown(shutdown).into_future());
        Server { stop, task }
    }

    /// Stops accepting, and waits briefly for what is in flight.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(CLOSE_WAIT, self.task).await;
    }
}

/// Asks the runtime (`make` wraps the reply channel into its input); None if
/// it does not answer in time (stuck or stopping).
pub async fn ask<R, T>(requests: &mpsc::Sender<R>, make: impl FnOnce(oneshot::Sender<T>) -> R) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    requests.send(make(tx)).await.ok()?;
    tokio::time::timeout(ANSWER_TIMEOUT, rx).await.ok()?.ok()
}

pub fn unavailable() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "gpumem: the agent did not answer\n").into_response()
}
