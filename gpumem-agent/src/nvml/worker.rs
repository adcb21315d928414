//! NVML on a thread of its own, so that its calls (milliseconds on a real
//! driver, seconds when a GPU hangs) never stall the event path: a reading
//! of every GPU at every interval (and when asked), XIDs as they come, and
//! NVML reopened after a failure (the driver may load after the agent).
use std::{
    ffi::OsString,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc as std_mpsc, Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use tokio::sync::mpsc;

use super::{xid::XidWatcher, GpuSample, Sampler, XidEvent};

/// What the NVML thread reports.
#[derive(Clone, Debug)]
pub enum Message {
    /// A reading of every GPU, taken at `at_s` (CLOCK_MONOTONIC seconds).
    Reading {
        gpus: Vec<GpuSample>,
        at_s: f64,
    },
    /// NVML cannot be used, and why; readings resume when it answers.
    Unavailable(String),
    Xid(XidEvent),
}

/// Which NVML library to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Library {
    /// libnvidia-ml.so.1 from the library path.
    System,
    Path(std::path::PathBuf),
}

impl Library {
    pub fn path(&self) -> Option<&std::ffi::OsStr> {
        match self {
            Library::System => None,
            Library::Path(p) => Some(p.as_os_str()),
        }
    }
}

/// The running thread; stops (and is joined) on drop.
pub struct Worker {
    stop: Arc<AtomicBool>,
    wake: std_mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Reads NVML now and then every `every`, sending what it finds to `tx`.
    pub fn start(lib: Library, every: Duration, tx: mpsc::Sender<Message>) -> std::io::Result<Worker> {
        let stop = Arc::new(AtomicBool::new(false));
        let (wake, woken) = std_mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("gpumem-nvml".into()).spawn(move || run(lib, every, tx, woken, stopping))?;
        Ok(Worker { stop, wake, thread: Some(thread) })
    }

    /// Asks for a reading now (its message follows the ones already sent).
    pub fn read_now(&self) {
        let _ = self.wake.send(());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.wake.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(lib: Library, every: Duration, tx: mpsc::Sender<Message>, woken: std_mpsc::Receiver<()>, stop: Arc<AtomicBool>) {
    let mut sampler: Option<Sampler> = None;
    let mut xids: Option<XidWatcher> = None;
    while !stop.load(Ordering::Relaxed) {
        if sampler.is_none() {
            match Sampler::open(lib.path()) {
                Ok(s) => sampler = Some(s),
                Err(e) => {
                    if tx.blocking_send(Message::Unavailable(e.to_string())).is_err() {
                        return;
                    }
                }
            }
        }
        if let Some(s) = sampler.as_mut() {
            if xids.is_none() {
                let sink = tx.clone();
                xids = XidWatcher::start(lib.path().map(OsString::from), crate::clock::monotonic_ns, move |x| {
                    sink.blocking_send(Message::Xid(x)).is_ok()
                })
                .ok();
            }
            let at_s = crate::clock::monotonic_ns() as f64 / 1e9;
            let message = match s.sample(at_s) {
                Ok(gpus) => Message::Reading { gpus, at_s },
                Err(e) => {
                    sampler = None;
                    Message::Unavailable(e.to_string())
                }
            };
            if tx.blocking_send(message).is_err() {
                return;
            }
        }
        match woken.recv_timeout(every) {
            Ok(()) | Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}
