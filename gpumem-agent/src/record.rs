//! Recordings: the event stream of a session, the stacks it refers to
//! (symbolized when recorded, so a recording reads the same on another host)
//! and what the agent looked up about each process, in a compact, versioned
//! file that `--from` replays through the same analyses.
//!
//! Layout: `GPUMEMRC`, format version (u16 LE), 2 reserved bytes; then
//! frames `tag u8 | length u32 LE | payload | CRC-32 (u32 LE) of tag, length
//! and payload`. Events are the kernel ABI's 88 bytes plus a stack id (u64);
//! everything else is JSON. A reader stops at the first damaged frame and
//! says where, keeping everything before it.
use std::{
    collections::HashSet,
    io::{self, BufReader, BufWriter, Read, Write},
    path::Path,
};

use gpumem_common::{Event, EVENT_SIZE};
use serde::{Deserialize, Serialize};

use crate::{
    analysis::reconcile::Reconciliation,
    events::LostEvents,
    probes::discover::ScanStats,
    stacks::{Frame, StackId, StackStats},
    state::container::ContainerInfo,
};

pub const MAGIC: &[u8; 8] = b"GPUMEMRC";
/// Bump on any change of a frame's layout or meaning.
pub const VERSION: u16 = 1;
/// Largest frame payload accepted: a bound against reading garbage lengths.
const MAX_PAYLOAD: u32 = 64 << 20;

mod tag {
    pub const HEADER: u8 = 1;
    pub const EVENT: u8 = 2;
    pub const STACK: u8 = 3;
    pub const LOOKUP: u8 = 4;
    pub const TICK: u8 = 5;
    pub const FOOTER: u8 = 6;
    pub const NVML: u8 = 7;
    pub const XID: u8 = 8;
}

/// What the session was.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub gpumem_version: String,
    /// `trace`, `leaks` or `record`, and the command traced, if any.
    pub recorded_by: String,
    pub command: Option<String>,
    pub pids: Vec<u32>,
    /// CLOCK_MONOTONIC at the start (the clock of events' ts_ns).
    pub started_ns: u64,
}

/// What the agent looked up about a process while it was alive: written
/// before the event that needed it, so that replay sees it at the same point.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Lookup {
    pub pid: u32,
    pub container: Option<ContainerInfo>,
    /// The limited memory cgroup of an OOM kill's victim (or trigger).
    pub memcg: Option<String>,
}

/// One NVML reading of one GPU, at `t_s` seconds into the session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NvmlPoint {
    pub t_s: f64,
    pub gpu: u32,
    pub uuid: String,
    pub name: String,
    pub used_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Volatile ECC counts.
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub gpu_temp_c: Option<u32>,
    pub memory_temp_c: Option<u32>,
}

impl NvmlPoint {
    pub fn from_sample(t_s: f64, g: &crate::nvml::GpuSample) -> Self {
        NvmlPoint {
            t_s,
            gpu: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            used_bytes: g.memory.as_ref().map(|m| m.used),
            total_bytes: g.memory.as_ref().map(|m| m.total),
            ecc_corrected: g.ecc.as_ref().map(|e| e.corrected_volatile),
            ecc_uncorrected: g.ecc.as_ref().map(|e| e.uncorrected_volatile),
            gpu_temp_c: g.gpu_temp_c,
            memory_temp_c: g.memory_temp_c,
        }
    }
}

/// An XID event, at `t_s` seconds into the session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct XidPoint {
    pub t_s: f64,
    pub gpu: u32,
    pub xid: u64,
}

/// How the session ended: what a report needs besides the events.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Footer {
    pub duration_s: f64,
    /// CLOCK_MONOTONIC when the session ended (ages in `leaks` are taken at it).
    pub ended_ns: u64,
    pub lost: LostEvents,
    pub probes_attached: usize,
    pub discovery: ScanStats,
    pub stacks: StackStats,
    /// NVML at the end: the reconciliation, or why there was none.
    pub reconciliation: Option<Vec<Reconciliation>>,
    pub nvml: String,
    /// The traced command's wait status, when there was one.
    pub command_status: Option<i32>,
    /// Calls whose thread died inside the driver (see Agent::sweep_stale_calls).
    #[serde(default)]
    pub stale_calls_removed: u64,
}

/// One frame of a recording.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Header(Header),
    Event { event: Event, stack: Option<StackId> },
    Stack { id: StackId, frames: Vec<Frame> },
    Lookup(Lookup),
    /// A sample of live bytes for the growth detector, at this many seconds.
    Tick(f64),
    Nvml(NvmlPoint),
    Xid(XidPoint),
    Footer(Footer),
}

#[derive(Serialize, Deserialize)]
struct StackJson {
    id: StackId,
    frames: Vec<Frame>,
}

pub struct Writer<W: Write> {
    out: BufWriter<W>,
    /// A fresh hasher, cloned per frame: `Hasher::new` detects CPU features each time.
    crc: crc32fast::Hasher,
    stacks_written: HashSet<StackId>,
    pub bytes: u64,
}

impl Writer<std::fs::File> {
    pub fn create(path: &Path) -> io::Result<Self> {
        Writer::new(std::fs::File::create(path)?)
    }
}

impl<W: Write> Writer<W> {
    pub fn new(w: W) -> io::Result<Self> {
        let mut out = BufWriter::with_capacity(1 << 16, w);
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&[0, 0])?;
        Ok(Writer { out, crc: crc32fast::Hasher::new(), stacks_written: HashSet::new(), bytes: 12 })
    }

    fn frame(&mut self, tag: u8, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len()).ok().filter(|&l| l <= MAX_PAYLOAD).ok_or_else(|| io::Error::other("record frame too large"))?;
        let mut crc = self.crc.clone();
        crc.update(&[tag]);
        crc.update(&len.to_le_bytes());
        crc.update(payload);
        self.out.write_all(&[tag])?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(payload)?;
        self.out.write_all(&crc.finalize().to_le_bytes())?;
        self.bytes += 9 + payload.len() as u64;
        Ok(())
    }

    fn json(&mut self, tag: u8, v: &impl Serialize) -> io::Result<()> {
        let payload = serde_json::to_vec(v)?;
        self.frame(tag, &payload)
    }

    pub fn header(&mut self, h: &Header) -> io::Result<()> {
        self.json(tag::HEADER, h)
    }

    pub fn lookup(&mut self, l: &Lookup) -> io::Result<()> {
        self.json(tag::LOOKUP, l)
    }

    /// Whether the stack's frames are already in the file.
    pub fn has_stack(&self, id: StackId) -> bool {
        self.stacks_written.contains(&id)
    }

    pub fn stack(&mut self, id: StackId, frames: Vec<Frame>) -> io::Result<()> {
        self.stacks_written.insert(id);
        self.json(tag::STACK, &StackJson { id, frames })
    }

    pub fn event(&mut self, ev: &Event, stack: Option<StackId>) -> io::Result<()> {
        let mut payload = [0u8; EVENT_SIZE + 8];
        payload[..EVENT_SIZE].copy_from_slice(&ev.to_bytes());
        // 0 is "no stack": ids are hashes, and 0 is as unlikely as any other value.
        payload[EVENT_SIZE..].copy_from_slice(&stack.unwrap_or(0).to_le_bytes());
        self.frame(tag::EVENT, &payload)
    }

    pub fn nvml(&mut self, p: &NvmlPoint) -> io::Result<()> {
        self.json(tag::NVML, p)
    }

    pub fn xid(&mut self, x: &XidPoint) -> io::Result<()> {
        self.json(tag::XID, x)
    }

    pub fn tick(&mut self, t_s: f64) -> io::Result<()> {
        self.frame(tag::TICK, &t_s.to_le_bytes())
    }

    /// Writes the footer and flushes: the recording is complete.
    pub fn finish(mut self, f: &Footer) -> io::Result<W> {
        self.json(tag::FOOTER, f)?;
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

/// Why a recording could not be read (further).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not a gpumem recording (it does not start with GPUMEMRC)")]
    NotARecording,
    #[error("recording format version {found} is newer than this gpumem reads ({supported}); replay it with the gpumem version that wrote it or a newer one")]
    NewerVersion { found: u16, supported: u16 },
    #[error("recording format version {found} is no longer read by this gpumem (it reads {supported})")]
    OlderVersion { found: u16, supported: u16 },
    #[error("recording truncated at byte {offset} (after {events} events): it ends inside a frame; the session was not finished")]
    Truncated { offset: u64, events: u64 },
    #[error("recording damaged at byte {offset} (after {events} events): {why}")]
    Corrupt { offset: u64, events: u64, why: String },
    #[error("reading the recording: {0}")]
    Io(#[from] io::Error),
}

pub struct Reader<R: Read> {
    input: BufReader<R>,
    /// A fresh hasher, cloned per frame (see Writer).
    crc: crc32fast::Hasher,
    /// Reused for every frame's payload.
    payload: Vec<u8>,
    offset: u64,
    pub events: u64,
    done: bool,
}

impl Reader<std::fs::File> {
    pub fn open(path: &Path) -> Result<Self, ReadError> {
        Reader::new(std::fs::File::open(path)?)
    }
}

/// Reads up to `buf.len()` bytes; fewer only at end of file.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

impl<R: Read> Reader<R> {
    pub fn new(r: R) -> Result<Self, ReadError> {
        let mut input = BufReader::with_capacity(1 << 16, r);
        let mut head = [0u8; 12];
        let n = read_full(&mut input, &mut head)?;
        if n < 12 || &head[..8] != MAGIC {
            return Err(ReadError::NotARecording);
        }
        let found = u16::from_le_bytes([head[8], head[9]]);
        if found > VERSION {
            return Err(ReadError::NewerVersion { found, supported: VERSION });
        }
        if found < VERSION {
            return Err(ReadError::OlderVersion { found, supported: VERSION });
        }
        Ok(Reader { input, crc: crc32fast::Hasher::new(), payload: Vec::new(), offset: 12, events: 0, done: false })
    }

    fn corrupt(&mut self, why: impl Into<String>) -> ReadError {
        self.done = true;
        ReadError::Corrupt { offset: self.offset, events: self.events, why: why.into() }
    }

    /// The next frame; None at a clean end of file.
    pub fn next_record(&mut self) -> Option<Result<Record, ReadError>> {
        if self.done {
            return None;
        }
        let mut head = [0u8; 5];
        let n = match read_full(&mut self.input, &mut head) {
            Ok(n) => n,
            Err(e) => {
                self.done = true;
                return Some(Err(e.into()));
            }
        };
        if n == 0 {
            self.done = true;
            return None;
        }
        let truncated = |s: &mut Self| {
            s.done = true;
            ReadError::Truncated { offset: s.offset, events: s.events }
        };
        if n < 5 {
            return Some(Err(truncated(self)));
        }
        let (tag, len) = (head[0], u32::from_le_bytes([head[1], head[2], head[3], head[4]]));
        if len > MAX_PAYLOAD {
            return Some(Err(self.corrupt(format!("a frame claims {len} bytes"))));
        }
        let mut payload = std::mem::take(&mut self.payload);
        payload.resize(len as usize + 4, 0);
        match read_full(&mut self.input, &mut payload) {
            Ok(got) if got == payload.len() => {}
            Ok(_) => return Some(Err(truncated(self))),
            Err(e) => {
                self.done = true;
                return Some(Err(e.into()));
            }
        }
        let (body, crc_bytes) = payload.split_at(len as usize);
        let mut crc = self.crc.clone();
        crc.update(&head);
        crc.update(body);
        let ok = crc.finalize().to_le_bytes()[..] == crc_bytes[..];
        let decoded = if ok { decode(tag, body) } else { Err("checksum mismatch".to_string()) };
        self.payload = payload;
        let record = match decoded {
            Ok(r) => r,
            Err(why) => return Some(Err(self.corrupt(why))),
        };
        self.offset += 9 + len as u64;
        if matches!(record, Record::Event { .. }) {
            self.events += 1;
        }
        if matches!(record, Record::Footer(_)) {
            self.done = true;
        }
        Some(Ok(record))
    }
}

fn json<T: for<'de> Deserialize<'de>>(what: &str, payload: &[u8]) -> Result<T, String> {
    serde_json::from_slice(payload).map_err(|e| format!("bad {what} frame: {e}"))
}

fn decode(tag: u8, payload: &[u8]) -> Result<Record, String> {
    Ok(match tag {
        tag::HEADER => Record::Header(json("header", payload)?),
        tag::EVENT => {
            if payload.len() != EVENT_SIZE + 8 {
                return Err(format!("an event frame of {} bytes (expected {})", payload.len(), EVENT_SIZE + 8));
            }
            let event = Event::from_bytes(&payload[..EVENT_SIZE]).ok_or("short event")?;
            let id = u64::from_le_bytes(payload[EVENT_SIZE..].try_into().expect("8 bytes"));
            Record::Event { event, stack: (id != 0).then_some(id) }
        }
        tag::STACK => {
            let s: StackJson = json("stack", payload)?;
            Record::Stack { id: s.id, frames: s.frames }
        }
        tag::LOOKUP => Record::Lookup(json("lookup", payload)?),
        tag::TICK => Record::Tick(f64::from_le_bytes(payload.try_into().map_err(|_| "a tick frame of the wrong size")?)),
        tag::FOOTER => Record::Footer(json("footer", payload)?),
        tag::NVML => Record::Nvml(json("NVML", payload)?),
        tag::XID => Record::Xid(json("XID", payload)?),
        other => return Err(format!("unknown frame type {other}")),
    })
}

#[cfg(test)]
mod tests {
    use gpumem_common::api;

    use super::*;
    use crate::state::testing::ev;

    fn sample() -> Vec<u8> {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.header(&Header { gpumem_version: "0.1.0".into(), recorded_by: "test".into(), command: None, pids: vec![], started_ns: 5 }).unwrap();
        w.lookup(&Lookup { pid: 100, container: Some(ContainerInfo { qos: Some("burstable"), ..Default::default() }), memcg: None }).unwrap();
        for i in 0..3 {
            w.event(&Event { addr: i, size: 4096, ..ev(api::CU_MEM_ALLOC_V2) }, (i == 1).then_some(77)).unwrap();
        }
        w.tick(0.1).unwrap();
        w.finish(&Footer { duration_s: 1.5, ..Default::default() }).unwrap()
    }

    fn read_all(bytes: &[u8]) -> (Vec<Record>, Option<ReadError>) {
        let mut r = match Reader::new(bytes) {
            Ok(r) => r,
            Err(e) => return (vec![], Some(e)),
        };
        let mut out = Vec::new();
        while let Some(x) = r.next_record() {
            match x {
                Ok(rec) => out.push(rec),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    #[test]
    fn round_trip() {
        let (recs, err) = read_all(&sample());
        assert!(err.is_none(), "{err:?}");
        assert_eq!(recs.len(), 7);
        assert_eq!(recs[2], Record::Event { event: Event { addr: 0, size: 4096, ..ev(api::CU_MEM_ALLOC_V2) }, stack: None });
        assert_eq!(recs[3], Record::Event { event: Event { addr: 1, size: 4096, ..ev(api::CU_MEM_ALLOC_V2) }, stack: Some(77) });
        let Record::Lookup(l) = &recs[1] else { panic!() };
        assert_eq!(l.container.as_ref().unwrap().qos, Some("burstable"));
        assert_eq!(recs[5], Record::Tick(0.1));
        assert!(matches!(&recs[6], Record::Footer(f) if f.duration_s == 1.5));
    }

    #[test]
    fn every_truncation_keeps_what_came_before_and_says_where() {
        let full = sample();
        for cut in 12..full.len() {
            let (recs, err) = read_all(&full[..cut]);
            match err {
                Some(ReadError::Truncated { offset, events }) => {
                    assert!(offset <= cut as u64);
                    assert_eq!(events, recs.iter().filter(|r| matches!(r, Record::Event { .. })).count() as u64);
                }
                // A cut exactly between frames is a clean end without a footer.
                None => assert!(!recs.iter().any(|r| matches!(r, Record::Footer(_))), "cut {cut}"),
                Some(e) => panic!("cut at {cut}: {e}"),
            }
        }
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let full = sample();
        for i in 12..full.len() {
            let mut bad = full.clone();
            bad[i] ^= 0x40;
            let (recs, err) = read_all(&bad);
            let err = err.unwrap_or_else(|| panic!("byte {i} flipped went unnoticed: {recs:?}"));
            assert!(matches!(err, ReadError::Corrupt { .. } | ReadError::Truncated { .. }), "byte {i}: {err}");
        }
    }

    #[test]
    fn other_versions_and_other_files_are_refused_clearly() {
        let mut newer = sample();
        newer[8] = 9;
        let (_, err) = read_all(&newer);
        let msg = err.unwrap().to_string();
        assert!(msg.contains("version 9 is newer than this gpumem reads (1)"), "{msg}");
        let (_, err) = read_all(b"{\"type\":\"summary\"}");
        assert!(matches!(err, Some(ReadError::NotARecording)));
        let (_, err) = read_all(b"");
        assert!(matches!(err, Some(ReadError::NotARecording)));
    }
}
