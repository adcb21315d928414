//! XID events through an NVML event set, waited for on a thread of their own
//! so that waiting never blocks the agent. Each event is attributed to the
//! processes holding memory on that GPU at that moment (NVML's view).
use std::{
    ffi::OsString,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
};

use gpumem_engine::model::nvml::{meaning, XidEvent};
use nvml_wrapper::{bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError, Nvml};

/// Why XIDs cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum XidWatchError {
    #[error("NVML: {0}")]
    Nvml(#[from] NvmlError),
    #[error("starting the XID thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the XID thread stopped before it was ready")]
    Stopped,
}

/// A running watcher; stops (and joins its thread) on drop.
pub struct XidWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// GPUs whose events could not be registered (not supported), by index.
    pub unsupported: Vec<u32>,
}

impl XidWatcher {
    /// Starts watching every GPU (its own NVML handle, so the sampler stays
    /// free); each event goes to `sink`, until it returns false.
    pub fn start(
        lib: Option<OsString>,
        now_ns: fn() -> u64,
        mut sink: impl FnMut(XidEvent) -> bool + Send + 'static,
    ) -> Result<XidWatcher, XidWatchError> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Vec<u32>, NvmlError>>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_thread = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gpumem-xid".into())
            .spawn(move || {
                let mut b = Nvml::builder();
                if let Some(p) = &lib {
                    b.lib_path(p);
                }
                let nvml = match b.init() {
                    Ok(n) => n,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                let count = nvml.device_count().unwrap_or(0);
                let mut unsupported = Vec::new();
                let mut set = match nvml.create_event_set() {
                    Ok(s) => s,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                for i in 0..count {
                    let Ok(dev) = nvml.device_by_index(i) else { continue };
                    match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                        Ok(s) => set = s,
                        Err(_) => {
                            // A failed registration frees the set: start a new one.
                            unsupported.push(i);
                            set = match nvml.create_event_set() {
                                Ok(s) => s,
                                Err(e) => return drop(ready_tx.send(Err(e))),
                            };
                        }
                    }
                }
                let _ = ready_tx.send(Ok(unsupported));
                while !stop_thread.load(Ordering::Relaxed) {
                    match set.wait(200) {
                        Ok(ev) => {
                            let xid = match ev.event_data {
                                Some(XidError::Value(v)) => v,
                                _ => continue,
                            };
                            let gpu = ev.device.index().unwrap_or(u32::MAX);
                            let processes = ev.device.running_compute_processes().map(|ps| super::process_bytes(&ps)).unwrap_or_default();
                            let e = XidEvent {
                                gpu,
                                uuid: ev.device.uuid().unwrap_or_default(),
                                xid,
                                meaning: meaning(xid),
                                ts_ns: now_ns(),
                                processes,
                            };
                            if !sink(e) {
                                return;
                            }
                        }
                        Err(NvmlError::Timeout) => {}
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
                    }
                }
            })
            .map_err(XidWatchError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(unsupported)) => Ok(XidWatcher { stop, thread: Some(thread), unsupported }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e.into())
            }
            Err(_) => Err(XidWatchError::Stopped),
        }
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_xids_have_meanings() {
        for x in [48, 63, 64, 92, 94, 95] {
            assert_ne!(super::meaning(x), "see NVIDIA's XID catalogue", "{x}");
        }
        assert_eq!(super::meaning(48), "double-bit ECC error (DBE)");
    }
}
