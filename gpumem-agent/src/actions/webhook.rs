//! One `--webhook URL` delivery: the event's JSON POSTed, retried with
//! exponential backoff while the receiver fails or cannot be reached.
use std::time::Duration;

use crate::http_post::{self, Endpoint};
use gpumem_engine::model::actions::Outcome;

/// Tries per delivery, the first included.
pub const ATTEMPTS: u32 = 4;
/// The wait before the first retry; doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// One try not answered by then has failed.
const TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the delivery ended with, the tries it took, and the last failure.
pub async fn deliver(to: &Endpoint, json: &[u8]) -> (Outcome, u32, Option<String>) {
    let mut backoff = FIRST_BACKOFF;
    let mut last = None;
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(TRY_TIMEOUT, http_post::post(to, "application/json", None, json.to_vec())).await {
            Ok(Ok(_)) => return (Outcome::Ok, attempt, None),
            Ok(Err(e)) => last = Some(format!("{e:#}")),
            Err(_) => last = Some(format!("{} did not answer in {} s", to.authority, TRY_TIMEOUT.as_secs())),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    (Outcome::Failed, ATTEMPTS, last)
}
