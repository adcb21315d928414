//! XIDs from the kernel log, where NVML's event sets are not there (no
//! NVML, a driver or device without XID events): the NVIDIA driver writes
//! each one as `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU
//! has fallen off the bus.` Read from /dev/kmsg (new records only: one per
//! read, `PRIO,SEQ,TS,FLAGS;TEXT`) or, for tests, a regular file followed
//! as it grows (a line per record, dmesg's `[  12.3] …` prefix allowed).
use std::{
    io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use gpumem_engine::model::nvml::{meaning, XidEvent};

pub use gpumem_engine::formats::kmsg_xid::{parse, pci_key, KmsgXid};

/// GPUs by PCI key: (index, UUID), from NVML's last reading where there is
/// one, else in PCI order as the driver lists them (/proc/driver/nvidia/gpus).
#[derive(Debug, Default)]
pub struct GpuIds(Mutex<Vec<(String, u32, String)>>);

impl GpuIds {
    pub fn update(&self, gpus: &[super::GpuSample]) {
        let ids = gpus.iter().map(|g| (pci_key(&g.pci_bus_id), g.index, g.uuid.clone())).collect();
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = ids;
    }

    fn of(&self, pci: &str) -> (u32, String) {
        let key = pci_key(pci);
        if let Some((_, i, uuid)) = self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(k, ..)| *k == key) {
            return (*i, uuid.clone());
        }
        let mut listed: Vec<String> = std::fs::read_dir("/proc/driver/nvidia/gpus")
            .map(|d| d.flatten().map(|e| pci_key(&e.file_name().to_string_lossy())).collect())
            .unwrap_or_default();
        listed.sort();
        let index = listed.iter().position(|k| *k == key).map_or(u32::MAX, |i| i as u32);
        (index, format!("PCI:{pci}"))
    }
}

/// Reads the log on a thread of its own until dropped.
pub struct KmsgWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How often a followed file is looked at again.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

impl KmsgWatcher {
    /// Opens `path` (errors are the caller's to say) and sends each XID to
    /// `sink` until it returns false.
    pub fn start(
        path: &Path,
        ids: Arc<GpuIds>,
        now_ns: fn() -> u64,
        mut sink: impl FnMut(XidEvent) -> bool + Send + 'static,
    ) -> std::io::Result<KmsgWatcher> {
        let mut file = std::fs::File::open(path)?;
        let device = std::os::unix::fs::FileTypeExt::is_char_device(&file.metadata()?.file_type());
        if device {
            // Only what is logged from now on.
            file.seek(SeekFrom::End(0))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let path: PathBuf = path.to_path_buf();
        let thread = std::thread::Builder::new().name("gpumem-kmsg".into()).spawn(move || {
            let mut each = |line: &str| match parse(line) {
                Some(k) => {
                    let (gpu, uuid) = ids.of(&k.pci);
                    let processes = k.pid.map(|p| vec![(p, 0)]).unwrap_or_default();
                    sink(XidEvent { gpu, uuid, xid: k.xid, meaning: meaning(k.xid), ts_ns: now_ns(), processes })
                }
                None => true,
            };
            if device {
                read_records(file, &stopping, &mut each);
            } else {
                follow_file(file, &path, &stopping, &mut each);
            }
        })?;
        Ok(KmsgWatcher { stop, thread: Some(thread) })
    }
}

/// /dev/kmsg: one record per read; a read that finds records overwritten
/// (EPIPE) goes on with the next. Blocks in read, so the thread is left to
/// end with the process when stopped while waiting.
fn read_records(mut f: std::fs::File, stop: &AtomicBool, each: &mut impl FnMut(&str) -> bool) {
    let mut buf = vec![0u8; 8192];
    while !stop.load(Ordering::Relaxed) {
        match f.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                let text = record.split_once(';').map_or(&*record, |(_, t)| t);
                if !each(text) {
                    return;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(_) => return,
        }
    }
}

/// A regular file: every line, then the lines appended, until stopped.
fn follow_file(f: std::fs::File, path: &Path, stop: &AtomicBool, each: &mut impl FnMut(&str) -> bool) {
    let mut r = BufReader::new(f);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => std::thread::sleep(FOLLOW_EVERY),
            Ok(_) if line.ends_with('\n') => {
                if !each(&line) {
                    return;
                }
            }
            // A line still being written: read it again whole.
            Ok(n) => {
                let _ = r.seek_relative(-(n as i64));
                std::thread::sleep(FOLLOW_EVERY);
            }
            Err(e) => {
                eprintln!("gpumem: reading {}: {e}; XIDs from it are no longer seen", path.display());
                return;
            }
        }
    }
}

impl Drop for KmsgWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A thread blocked reading /dev/kmsg is not joined (it holds nothing).
        if let Some(t) = self.thread.take().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_lines_as_the_driver_writes_them() {
        let record = "4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        assert_eq!(parse(record), Some(KmsgXid { pci: "0000:3b:00".into(), xid: 79, pid: Some(1234) }));
        let dmesg = "[ 1234.567890] NVRM: Xid (PCI:0000:B1:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error";
        assert_eq!(parse(dmesg), Some(KmsgXid { pci: "0000:b1:00".into(), xid: 48, pid: None }));
        assert_eq!(parse("NVRM: GPU at PCI:0000:3b:00: GPU-1234"), None);
        assert_eq!(parse("NVRM: Xid (PCI:0000:3b:00): x, pid=1"), None);
    }

    #[test]
    fn pci_ids_of_nvml_and_the_driver_agree() {
        assert_eq!(pci_key("00000000:3B:00.0"), pci_key("0000:3b:00"));
        assert_eq!(pci_key("0000:3b:00.0"), "0:3b:00");
        assert_ne!(pci_key("00000000:3C:00.0"), pci_key("0000:3b:00"));
    }
}
