//! Recordings: the event stream of a session, the stacks it refers to
//! (symbolized when recorded, so a recording reads the same on another host)
//! and what the agent looked up about each process, in a compact, versioned
//! file that `--from` replays through the same analyses.
//!
//! Layout: `GPUMEMRC`, format version (u16 LE), 2 reserved bytes; then
//! frames `tag u8 | length u32 LE | payload | CRC-32 (u32 LE) of tag, length
//! and payload`. Version 2 added host-memory frames; version 1 files (which
//! have none) are read as they are. Events are the kernel ABI's 88 bytes plus a stack id (u64);
//! everything else is JSON. A reader stops at the first damaged frame and
//! says where, keeping everything before it.
mod reader;
mod writer;

use std::io;

use gpumem_common::Event;
use serde::{Deserialize, Serialize};

use crate::{
    analysis::reconcile::Reconciliation,
    model::{
        agent::ScanStats,
        lost::{LostEvents, StacksDropped, TablesFull},
        readings::{HostPoint, Lookup, NvmlPoint, XidPoint},
    },
    stacks::{Frame, StackId, StackStats},
};
pub use reader::Reader;
pub use writer::Writer;

pub const MAGIC: &[u8; 8] = b"GPUMEMRC";
/// Bump on any change of a frame's layout or meaning, or a new kind of frame.
pub const VERSION: u16 = 2;
/// The oldest version still read (a subset of this one's frames).
pub const OLDEST_READ: u16 = 1;
/// Largest frame payload accepted: a bound against reading garbage lengths.
const MAX_PAYLOAD: u32 = 64 << 20;

pub(crate) mod tag {
    pub const HEADER: u8 = 1;
    pub const EVENT: u8 = 2;
    pub const STACK: u8 = 3;
    pub const LOOKUP: u8 = 4;
    pub const TICK: u8 = 5;
    pub const FOOTER: u8 = 6;
    pub const NVML: u8 = 7;
    pub const XID: u8 = 8;
    pub const HOST: u8 = 9;
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
    /// The stack sampling rate beyond the budget (what sampled allocations
    /// are weighed with); 0: no stack was sampled.
    #[serde(default)]
    pub stack_sample_bytes: u64,
    /// The node it ran on and when it began (wall clock, ns since the
    /// epoch); empty and 0 in recordings older than these fields.
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub started_unix_ns: i64,
}

/// The program a command line runs: its first word past `NAME=value`
/// assignments, without its directory (`GPUMEM_STEPS=60 /w/train x` → `train`).
fn program(command: &str) -> Option<&str> {
    let word = command.split_whitespace().find(|w| !(w.contains('=') && !w.starts_with('/')))?;
    Some(word.rsplit('/').next().unwrap_or(word))
}

/// What a session was, in a few words: `train on node-3, 2026-12-04
/// 15:20:11 UTC, 10.0 s`. The program is the command's (else `names`, the
/// traced processes', else who recorded it).
pub fn session_title(header: Option<&Header>, names: &[&str], duration_s: f64) -> String {
    use std::fmt::Write as _;
    let mut title = match header.and_then(|h| h.command.as_deref()).and_then(program) {
        Some(p) => p.to_string(),
        None if !names.is_empty() => names.iter().take(3).copied().collect::<Vec<_>>().join(", "),
        None => header.map_or("a session".to_string(), |h| h.recorded_by.clone()),
    };
    if let Some(h) = header.filter(|h| !h.host.is_empty()) {
        let _ = write!(title, " on {}", h.host);
    }
    if let Some(ns) = header.map(|h| h.started_unix_ns).filter(|&ns| ns > 0) {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64);
        let at = humantime::format_rfc3339_seconds(at).to_string();
        let _ = write!(title, ", {} UTC", at.trim_end_matches('Z').replace('T', " "));
    }
    let _ = write!(title, ", {duration_s:.1} s");
    crate::names::printable(&title)
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
    /// Kernel tables that were full during the session.
    #[serde(default)]
    pub tables_full: TablesFull,
    /// Allocations that arrived without their stack.
    #[serde(default)]
    pub stacks_dropped: StacksDropped,
    /// Python processes whose frames could not be walked, and why (a version
    /// gpumem does not know): their stacks are native only.
    #[serde(default)]
    pub python_unwalked: Vec<crate::python::Unwalked>,
}

/// One frame of a recording.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    // The rare, large frames are boxed: an event's record is moved for each of millions of events.
    Header(Box<Header>),
    Event {
        event: Event,
        stack: Option<StackId>,
    },
    Stack {
        id: StackId,
        frames: Vec<Frame>,
    },
    Lookup(Box<Lookup>),
    /// A sample of live bytes for the growth detector, at this many seconds.
    Tick(f64),
    Nvml(Box<NvmlPoint>),
    Xid(Box<XidPoint>),
    Host(Box<HostPoint>),
    Footer(Box<Footer>),
}

/// A stack frame's payload.
#[derive(Serialize, Deserialize)]
struct StackJson {
    id: StackId,
    frames: Vec<Frame>,
}

/// Why a recording could not be read (further).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not a gpumem recording (it does not start with GPUMEMRC)")]
    NotARecording,
    #[error("recording format version {found} is newer than this gpumem reads ({supported}); replay it with the gpumem version that wrote it or a newer one")]
    NewerVersion { found: u16, supported: u16 },
    #[error("recording format version {found} is no longer read by this gpumem (it reads {oldest} and newer); replay it with the gpumem version that wrote it")]
    OlderVersion { found: u16, oldest: u16 },
    #[error("recording truncated at byte {offset} (after {events} events): it ends inside a frame; the session was not finished")]
    Truncated { offset: u64, events: u64 },
    #[error("recording damaged at byte {offset} (after {events} events): {why}")]
    Corrupt { offset: u64, events: u64, why: FrameError },
    #[error("reading the recording: {0}")]
    Io(#[from] io::Error),
}

/// What is wrong with a damaged frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("a frame claims {0} bytes")]
    TooLarge(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("bad {what} frame: {source}")]
    Json { what: &'static str, source: serde_json::Error },
    #[error("an event frame of {got} bytes (expected {expected})")]
    EventSize { got: usize, expected: usize },
    #[error("a tick frame of the wrong size")]
    TickSize,
    #[error("unknown frame type {0}")]
    UnknownTag(u8),
}

#[cfg(test)]
mod tests;
