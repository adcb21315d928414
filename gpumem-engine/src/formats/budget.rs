//! What the agent spends on one file another process chose (issue 30): how
//! many symbols it scans, how many bytes of unwind tables it keeps, and how
//! long it waits for the reading. A library's owner decides its size and
//! where it lives (a FUSE file can answer a read never): reading runs on
//! its own thread, and the event path waits for it a bounded time only.
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

/// Symbols scanned in one library's tables: the files read for symbols are
/// libcuda (535 exports ~1 000), the C library and dynamic loader (~3 000)
/// and interpreters (~10 000).
pub const MAX_SYMBOLS: usize = 1 << 17;
/// Unwind tables (.eh_frame, .eh_frame_hdr, .debug_frame) kept of one
/// library (libtorch_cuda's are ~40 MiB).
pub const MAX_UNWIND_BYTES: u64 = 128 << 20;
/// How long the event path waits for one library's tables.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Readings past their deadline still running, at most: past it no new
/// reading starts (each may hold a thread blocked in a read for good).
pub const MAX_LATE: usize = 8;

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// A reading given its deadline.
pub enum Timed<T> {
    Done(T),
    /// Still running: its result arrives here if it ever ends.
    Late(mpsc::Receiver<T>),
    /// Not started: too many earlier readings are still running.
    Refused,
}

/// Runs `work` on its own thread and waits for it at most `deadline`.
pub fn within<T: Send + 'static>(deadline: Duration, work: impl FnOnce() -> T + Send + 'static) -> Timed<T> {
    if RUNNING.load(Ordering::Relaxed) >= MAX_LATE {
        return Timed::Refused;
    }
    RUNNING.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new().name("gpumem-read".into()).spawn(move || {
        let out = work();
        RUNNING.fetch_sub(1, Ordering::Relaxed);
        let _ = tx.send(out);
    });
    if spawned.is_err() {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
        return Timed::Refused;
    }
    match rx.recv_timeout(deadline) {
        Ok(out) => Timed::Done(out),
        Err(_) => Timed::Late(rx),
    }
}

/// Readings still running (past their deadline or not).
pub fn running() -> usize {
    RUNNING.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_past_its_deadline_is_late_and_its_result_arrives_after() {
        match within(Duration::from_secs(5), || 7) {
            Timed::Done(7) => {}
            _ => panic!("a quick reading is done"),
        }
        let (go, wait) = mpsc::channel::<()>();
        let Timed::Late(rx) = within(Duration::from_millis(20), move || wait.recv().map(|_| 8)) else {
            panic!("a blocked reading is late")
        };
        assert!(running() >= 1);
        go.send(()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Ok(8));
    }
}
