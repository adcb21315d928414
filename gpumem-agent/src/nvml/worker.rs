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

use gpumem_engine::model::nvml::Message;

use super::{
    kmsg::{GpuIds, KmsgWatcher},
    xid::XidWatcher,
    Sampler,
};

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

/// How long dropping the worker waits for its thread: a hung NVML call
/// must not hold up the agent's exit (the thread is left to the exit).
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The running thread; told to stop on drop, and waited for briefly.
pub struct Worker {
    stop: Arc<AtomicBool>,
    wake: std_mpsc::Sender<()>,
    /// Closed by the thread when it returns.
    done: std_mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Reads NVML now and then every `every`, sending what it finds to `tx`.
    /// `kmsg`: the kernel log to read XIDs from where NVML's events are
    /// not available (None: not read).
    pub fn start(lib: Library, every: Duration, tx: mpsc::Sender<Message>, kmsg: Option<std::path::PathBuf>) -> std::io::Result<Worker> {
        let stop = Arc::new(AtomicBool::new(false));
        let (wake, woken) = std_mpsc::channel();
        let (done_tx, done) = std_mpsc::channel::<()>();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("gpumem-nvml".into()).spawn(move || {
            run(lib, every, tx, woken, stopping, kmsg);
            drop(done_tx);
        })?;
        Ok(Worker { stop, wake, done, thread: Some(thread) })
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
        // Joined only once it has returned (its receiver gone first, so a
        // send cannot block it); a call stuck in the driver is not waited for.
        if let Err(std_mpsc::RecvTimeoutError::Disconnected) = self.done.recv_timeout(STOP_WAIT) {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// XIDs from the kernel log, started once NVML's events are known not to
/// be there; what happened is said once.
struct KernelLog {
    path: Option<std::path::PathBuf>,
    ids: Arc<GpuIds>,
    watcher: Option<KmsgWatcher>,
    tried: bool,
}

impl KernelLog {
    fn start(&mut self, why: &str, tx: &mpsc::Sender<Message>) {
        let Some(path) = self.path.as_ref().filter(|_| !std::mem::replace(&mut self.tried, true)) else { return };
        let sink = tx.clone();
        match KmsgWatcher::start(path, self.ids.clone(), gpumem_engine::clock::monotonic_ns, move |x| {
            sink.blocking_send(Message::Xid(x)).is_ok()
        }) {
            Ok(w) => {
                eprintln!("gpumem: XIDs: {why}; reading them from {}", path.display());
                self.watcher = Some(w);
            }
            Err(e) => eprintln!("gpumem: XIDs: {why}, and {} cannot be read ({e}): XIDs are not seen", path.display()),
        }
    }
}

fn run(
    lib: Library,
    every: Duration,
    tx: mpsc::Sender<Message>,
    woken: std_mpsc::Receiver<()>,
    stop: Arc<AtomicBool>,
    kmsg: Option<std::path::PathBuf>,
) {
    let mut sampler: Option<Sampler> = None;
    let mut xids: Option<XidWatcher> = None;
    // XIDs are watched once per (re)opening of NVML: a device that cannot
    // report them is not asked again at every reading.
    let mut xids_tried = false;
    let mut log = KernelLog { path: kmsg, ids: Arc::default(), watcher: None, tried: false };
    let mut log_after_reading: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        if sampler.is_none() {
            match Sampler::open(lib.path()) {
                Ok(s) => {
                    sampler = Some(s);
                    xids_tried = false;
                }
                Err(e) => {
                    log.start("NVML is not available", &tx);
                    if tx.blocking_send(Message::Unavailable(e.to_string())).is_err() {
                        return;
                    }
                }
            }
        }
        if let Some(s) = sampler.as_mut() {
            if xids.is_none() && !xids_tried {
                xids_tried = true;
                let sink = tx.clone();
                let watch = XidWatcher::start(lib.path().map(OsString::from), gpumem_engine::clock::monotonic_ns, move |x| {
                    sink.blocking_send(Message::Xid(x)).is_ok()
                });
                match watch {
                    Ok(w) => xids = Some(w),
                    // Read once a reading has named the GPUs' PCI ids.
                    Err(e) => log_after_reading = Some(format!("NVML's XID events are not available ({e})")),
                }
            }
            let at_s = gpumem_engine::clock::monotonic_ns() as f64 / 1e9;
            let message = match s.sample(at_s) {
                Ok(gpus) => {
                    log.ids.update(&gpus);
                    if let Some(why) = log_after_reading.take() {
                        log.start(&why, &tx);
                    }
                    Message::Reading { gpus, at_s }
                }
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
