//! Writing a recording: frames with their checksums, each stack once.
use std::{
    collections::HashSet,
    io::{self, BufWriter, Write},
    path::Path,
};

use gpumem_common::{Event, EVENT_SIZE};
use serde::Serialize;

use super::{tag, Footer, Header, StackJson, MAGIC, MAX_PAYLOAD, VERSION};
use crate::{
    model::readings::{HostPoint, Lookup, NvmlPoint, XidPoint},
    stacks::{Frame, StackId},
};

pub struct Writer<W: Write> {
    out: BufWriter<W>,
    /// A fresh hasher, cloned per frame: `Hasher::new` detects CPU features each time.
    crc: crc32fast::Hasher,
    stacks_written: HashSet<StackId>,
    pub bytes: u64,
    /// Events written.
    pub events: u64,
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
        Ok(Writer { out, crc: crc32fast::Hasher::new(), stacks_written: HashSet::new(), bytes: 12, events: 0 })
    }

    fn frame(&mut self, tag: u8, payload: &[u8]) -> io::Result<()> {
        let len =
            u32::try_from(payload.len()).ok().filter(|&l| l <= MAX_PAYLOAD).ok_or_else(|| io::Error::other("record frame too large"))?;
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
        self.events += 1;
        self.frame(tag::EVENT, &payload)
    }

    pub fn nvml(&mut self, p: &NvmlPoint) -> io::Result<()> {
        self.json(tag::NVML, p)
    }

    pub fn xid(&mut self, x: &XidPoint) -> io::Result<()> {
        self.json(tag::XID, x)
    }

    pub fn host(&mut self, h: &HostPoint) -> io::Result<()> {
        self.json(tag::HOST, h)
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
