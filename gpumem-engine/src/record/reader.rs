//! Reading a recording: frame by frame, stopping at the first damaged one
//! and saying where, with everything before it kept.
use std::{
    io::{self, BufReader, Read},
    path::Path,
};

use gpumem_common::{Event, EVENT_SIZE};
use serde::Deserialize;

use super::{tag, FrameError, ReadError, Record, StackJson, MAGIC, MAX_PAYLOAD, OLDEST_READ, VERSION};

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
        if found < OLDEST_READ {
            return Err(ReadError::OlderVersion { found, oldest: OLDEST_READ });
        }
        Ok(Reader { input, crc: crc32fast::Hasher::new(), payload: Vec::new(), offset: 12, events: 0, done: false })
    }

    fn corrupt(&mut self, why: FrameError) -> ReadError {
        self.done = true;
        ReadError::Corrupt { offset: self.offset, events: self.events, why }
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
            return Some(Err(self.corrupt(FrameError::TooLarge(len))));
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
        let decoded = if ok { decode(tag, body) } else { Err(FrameError::Checksum) };
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

fn json<T: for<'de> Deserialize<'de>>(what: &'static str, payload: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|source| FrameError::Json { what, source })
}

fn decode(tag: u8, payload: &[u8]) -> Result<Record, FrameError> {
    Ok(match tag {
        tag::HEADER => Record::Header(json("header", payload)?),
        tag::EVENT => {
            if payload.len() != EVENT_SIZE + 8 {
                return Err(FrameError::EventSize { got: payload.len(), expected: EVENT_SIZE + 8 });
            }
            let event =
                Event::from_bytes(&payload[..EVENT_SIZE]).ok_or(FrameError::EventSize { got: payload.len(), expected: EVENT_SIZE + 8 })?;
            let id = u64::from_le_bytes(payload[EVENT_SIZE..].try_into().expect("8 bytes"));
            Record::Event { event, stack: (id != 0).then_some(id) }
        }
        tag::STACK => {
            let s: StackJson = json("stack", payload)?;
            Record::Stack { id: s.id, frames: s.frames }
        }
        tag::LOOKUP => Record::Lookup(json("lookup", payload)?),
        tag::TICK => Record::Tick(f64::from_le_bytes(payload.try_into().map_err(|_| FrameError::TickSize)?)),
        tag::FOOTER => Record::Footer(json("footer", payload)?),
        tag::NVML => Record::Nvml(json("NVML", payload)?),
        tag::XID => Record::Xid(json("XID", payload)?),
        tag::HOST => Record::Host(json("host memory", payload)?),
        other => return Err(FrameError::UnknownTag(other)),
    })
}
