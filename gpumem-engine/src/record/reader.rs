//! Reading a recording: frame by frame, stopping at the first damaged one
//! and saying where, with everything before it kept.
use std::{
    io::{self, BufRead, BufReader, Read},
    path::Path,
};

use gpumem_common::{Event, EVENT_SIZE};
use serde::Deserialize;

use super::{tag, FrameError, ReadError, Record, StackJson, MAGIC, MAX_PAYLOAD, OLDEST_READ, VERSION};

pub struct Reader<R: Read> {
    input: BufReader<R>,
    /// A fresh hasher, cloned per frame (see Writer).
    crc: crc32fast::Hasher,
    /// Reused for every frame's payload (its tests check what it reserves).
    pub(super) payload: Vec<u8>,
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
        // Most frames (events: 105 bytes) lie whole in the read buffer: read
        // them there, without copying them out first.
        let (head, len) = match self.input.fill_buf() {
            Ok(buf) if buf.len() >= 5 => {
                let head: [u8; 5] = buf[..5].try_into().expect("5 bytes");
                (head, u32::from_le_bytes([head[1], head[2], head[3], head[4]]))
            }
            // The end of the buffer or of the file, or an error: read as it comes.
            _ => return self.next_record_copied(),
        };
        let whole = 9 + len as usize;
        if len > MAX_PAYLOAD || self.input.buffer().len() < whole {
            return self.next_record_copied();
        }
        // The checksum over tag, length and payload in one pass: they lie together here.
        let (framed, crc) = self.input.buffer()[..whole].split_at(whole - 4);
        let decoded = checked(&self.crc, &[framed], crc).and_then(|()| decode(head[0], &framed[5..]));
        self.input.consume(whole);
        Some(self.decoded(decoded, len))
    }

    /// The next frame, copied out of the input (it straddles the read buffer's end).
    fn next_record_copied(&mut self) -> Option<Result<Record, ReadError>> {
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
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if len > MAX_PAYLOAD {
            return Some(Err(self.corrupt(FrameError::TooLarge(len))));
        }
        // Grown as the bytes arrive, never sized by the length the frame
        // claims: a damaged or hostile length (up to 64 MiB) costs only what
        // the file holds, not 64 MiB zeroed first.
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        let want = u64::from(len) + 4;
        match (&mut self.input).take(want).read_to_end(&mut payload) {
            Ok(got) if got as u64 == want => {}
            Ok(_) => {
                self.payload = payload;
                return Some(Err(truncated(self)));
            }
            Err(e) => {
                self.done = true;
                return Some(Err(e.into()));
            }
        }
        let (body, crc) = payload.split_at(len as usize);
        let decoded = checked(&self.crc, &[&head, body], crc).and_then(|()| decode(head[0], body));
        self.payload = payload;
        Some(self.decoded(decoded, len))
    }

    /// A frame's record counted, or its damage said.
    fn decoded(&mut self, decoded: Result<Record, FrameError>, len: u32) -> Result<Record, ReadError> {
        let record = decoded.map_err(|why| self.corrupt(why))?;
        self.offset += 9 + len as u64;
        match record {
            Record::Event { .. } => self.events += 1,
            Record::Footer(_) => self.done = true,
            _ => {}
        }
        Ok(record)
    }
}

/// Whether `crc` (4 bytes, LE) is the CRC-32 of `parts` one after the other.
fn checked(fresh: &crc32fast::Hasher, parts: &[&[u8]], crc: &[u8]) -> Result<(), FrameError> {
    let mut h = fresh.clone();
    for p in parts {
        h.update(p);
    }
    if h.finalize().to_le_bytes()[..] == crc[..] {
        Ok(())
    } else {
        Err(FrameError::Checksum)
    }
}

fn json<T: for<'de> Deserialize<'de>>(what: &'static str, payload: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|source| FrameError::Json { what, source })
}

fn decode(tag: u8, payload: &[u8]) -> Result<Record, FrameError> {
    Ok(match tag {
        tag::HEADER => Record::Header(Box::new(json("header", payload)?)),
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
        tag::LOOKUP => Record::Lookup(Box::new(json("lookup", payload)?)),
        tag::TICK => Record::Tick(f64::from_le_bytes(payload.try_into().map_err(|_| FrameError::TickSize)?)),
        tag::FOOTER => Record::Footer(Box::new(json("footer", payload)?)),
        tag::NVML => Record::Nvml(Box::new(json("NVML", payload)?)),
        tag::XID => Record::Xid(Box::new(json("XID", payload)?)),
        tag::HOST => Record::Host(Box::new(json("host memory", payload)?)),
        other => return Err(FrameError::UnknownTag(other)),
    })
}
