//! PyTorch's memory snapshot (what `torch.cuda.memory._snapshot()` pickles,
//! and pytorch.org/memory_viz and `torch.cuda._memory_viz` read): `segments`
//! with their blocks in address order, and `device_traces`, a list indexed
//! by device ordinal of memory actions with their frames. Plain data only
//! (dict, list, tuple, str, int, bool). `category` is left out: the viewer
//! mis-handles it.
use std::collections::HashMap;

use super::pickle::{Memo, Pickler};
use crate::{
    analysis::{
        history::{Action, TraceEntry},
        snapshot::MemorySnapshot,
    },
    stacks::{Frame, StackId, Stacks},
    state::tensor::{Block, Segment},
};

/// PyTorch calls segments above 1 MiB "large" (its kSmallSize).
const SMALL_SEGMENT: u64 = 1 << 20;

struct Writer<'a> {
    p: Pickler,
    stacks: &'a mut Stacks,
    /// Each stack's frames list, written once.
    frames: HashMap<Option<StackId>, Memo>,
}

impl Writer<'_> {
    fn frames(&mut self, stack: Option<StackId>) {
        if let Some(&m) = self.frames.get(&stack) {
            return self.p.get(m);
        }
        let frames = stack.map(|s| self.stacks.frames(s)).unwrap_or_default();
        self.p.list();
        for f in &frames {
            frame(&mut self.p, f);
        }
        self.p.end_list();
        let m = self.p.memoize();
        self.frames.insert(stack, m);
    }

    fn segment(&mut self, device: i32, s: &Segment) {
        let used: Vec<&Block> = s.blocks.iter().filter(|b| b.in_use).collect();
        let allocated: u64 = used.iter().map(|b| b.size).sum();
        let requested: u64 = used.iter().map(|b| b.requested).sum();
        let p = &mut self.p;
        p.dict();
        p.entry_int("device", device as i128);
        p.entry_int("address", s.address as i128);
        p.entry_int("total_size", s.size as i128);
        p.entry_int("allocated_size", allocated as i128);
        p.entry_int("active_size", allocated as i128);
        p.entry_int("requested_size", requested as i128);
        p.entry_int("stream", 0);
        p.entry_str("segment_type", if s.size > SMALL_SEGMENT { "large" } else { "small" });
        p.str("segment_pool_id");
        p.tuple();
        p.int(0);
        p.int(0);
        p.end_tuple();
        p.str("is_expandable");
        p.bool(s.expandable);
        p.str("frames");
        self.frames(s.stack);
        self.p.str("blocks");
        self.p.list();
        for b in &s.blocks {
            self.p.dict();
            self.p.entry_int("address", b.address as i128);
            self.p.entry_int("size", b.size as i128);
            self.p.entry_int("requested_size", b.requested as i128);
            self.p.entry_str("state", if b.in_use { "active_allocated" } else { "inactive" });
            self.p.str("frames");
            self.frames(b.stack);
            self.p.end_dict();
        }
        self.p.end_list();
        self.p.end_dict();
    }

    fn entry(&mut self, e: &TraceEntry) {
        let p = &mut self.p;
        p.dict();
        p.entry_str("action", e.action.name());
        p.entry_int("addr", e.addr as i128);
        p.entry_int("size", e.size as i128);
        p.entry_int("stream", e.stream as i128);
        p.entry_int("time_us", (e.ts_ns / 1000) as i128);
        if e.action == Action::Oom {
            p.entry_int("device_free", e.device_free.unwrap_or(0) as i128);
        }
        p.str("frames");
        self.frames(e.stack);
        self.p.end_dict();
    }
}

/// `{filename, line, name}`, as PyTorch's captured frames.
fn frame(p: &mut Pickler, f: &Frame) {
    p.dict();
    p.entry_str("filename", f.file.as_deref().unwrap_or(&f.module));
    p.entry_int("line", f.line.unwrap_or(0) as i128);
    p.entry_str("name", &f.name());
    p.end_dict();
}

/// The snapshot, pickled.
pub fn render(s: &MemorySnapshot, stacks: &mut Stacks) -> Vec<u8> {
    let mut w = Writer { p: Pickler::default(), stacks, frames: HashMap::new() };
    w.p.dict();
    w.p.str("segments");
    w.p.list();
    for (device, seg) in &s.segments {
        w.segment(*device, seg);
    }
    w.p.end_list();
    // Indexed by device ordinal: every device up to the highest seen.
    let devices = s.segments.iter().map(|(d, _)| *d).chain(s.traces.keys().copied()).max().map_or(0, |d| d + 1);
    w.p.str("device_traces");
    w.p.list();
    for d in 0..devices {
        w.p.list();
        for e in s.traces.get(&d).into_iter().flatten() {
            w.entry(e);
        }
        w.p.end_list();
    }
    w.p.end_list();
    w.p.str("allocator_settings");
    w.p.dict();
    w.p.end_dict();
    w.p.end_dict();
    w.p.finish()
}
