//! Tensors PyTorch's caching allocator hands out (its `pytorch:malloc` and
//! `pytorch:free` probes): blocks carved from the segments it reserved from
//! the driver (this process's cuMemAlloc allocations or VMM mappings). What
//! the segments hold is *reserved*; what the tensors hold is *allocated*.
use std::collections::BTreeMap;

use gpumem_common::{Event, DEVICE_UNKNOWN};

use super::{
    process::{Allocation, Memory, Process},
    Applied,
};
use crate::stacks::{Sampling, StackId};

/// PyTorch's block granularity (kMinBlockSize): every block it carves is a
/// multiple of 512 bytes, the tensor's size rounded up.
pub const BLOCK_ROUND: u64 = 512;

/// How a device's reserved segments are used by the tensors seen in them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FreeBlocks {
    /// Bytes of the segments the tensors are carved from.
    pub segment_bytes: u64,
    /// Segment bytes no live tensor's block covers (reserved but unused).
    pub unused_bytes: u64,
    /// The largest contiguous run of them inside one segment (adjacent
    /// free blocks merge, as the allocator merges them).
    pub largest_free_block: u64,
    /// Live tensors that lie in no segment gpumem saw made (made before
    /// tracing began): their segments' free space is unknown.
    pub tensors_outside_segments: u64,
}

impl Process {
    /// A tensor handed out (`pytorch:malloc`); `room`: the table has space.
    pub(super) fn apply_tensor_alloc(&mut self, ev: &Event, room: bool, stack: Option<StackId>, out: &mut Applied) {
        self.tensor_probes = true;
        let device = if ev.device != DEVICE_UNKNOWN { ev.device } else { self.current_device(ev.tid) };
        out.device = device;
        if !room {
            out.dropped = true;
            return;
        }
        let t = Allocation::new(ev.size, device, Memory::Device, 0, ev.ts_ns, stack, Sampling::of(ev.flags));
        // An address handed out again before its free was seen: the free was missed.
        if let Some(old) = self.held.tensors.insert(ev.addr, t) {
            self.credit_tensor(&old);
        }
        let totals = self.totals_mut(device);
        totals.allocated_bytes += ev.size;
        totals.tensors += 1;
    }

    /// A tensor given back to the cache (`pytorch:free`).
    pub(super) fn apply_tensor_free(&mut self, ev: &Event, out: &mut Applied) {
        self.tensor_probes = true;
        match self.held.tensors.remove(&ev.addr) {
            Some(old) => {
                out.device = old.device();
                out.size = old.size;
                out.lifetime_ns = Some(ev.ts_ns.saturating_sub(old.ts_ns));
                self.credit_tensor(&old);
            }
            None => {
                out.device = self.current_device(ev.tid);
                out.untracked = true;
                self.untracked_tensor_frees += 1;
            }
        }
    }

    fn credit_tensor(&mut self, t: &Allocation) {
        let totals = self.totals_mut(t.device());
        totals.allocated_bytes -= t.size;
        totals.tensors -= 1;
    }

    /// The reserved segments of a device in address order, carved into
    /// blocks: cuMemAlloc allocations each on its own (blocks never span
    /// two), VMM mappings merged where contiguous (expandable segments grow
    /// by mapping more pages after the last). Where PyTorch's probes fired,
    /// its tensors' blocks (sizes rounded to its 512 B granularity) and the
    /// free runs between them, merged as its allocator merges them; without
    /// them a segment is one block, in use. The blocks of a segment add up
    /// to it exactly.
    pub fn segments(&self, device: i32) -> Vec<Segment> {
        let mut out = self.spans(device);
        for seg in &mut out {
            let mut blocks = Vec::new();
            self.carve(seg, device, |b| blocks.push(b));
            seg.blocks = blocks;
        }
        out
    }

    /// The segments of a device in address order, not carved yet.
    fn spans(&self, device: i32) -> Vec<Segment> {
        let mut out: Vec<Segment> = self
            .held
            .allocs
            .iter()
            .filter(|(_, a)| a.memory() == Memory::Device && a.device() == device)
            .map(|(addr, a)| Segment { address: addr, size: a.size, expandable: false, stack: a.stack(), blocks: Vec::new() })
            .collect();
        let mut mapped: Vec<Segment> = Vec::new();
        for (&addr, m) in &self.held.mappings {
            let Some(h) = self.held.vmm_handles.get(&m.handle).filter(|h| h.device == device) else { continue };
            match mapped.last_mut() {
                Some(last) if last.address.saturating_add(last.size) == addr => last.size += m.size,
                _ => mapped.push(Segment { address: addr, size: m.size, expandable: true, stack: h.stack, blocks: Vec::new() }),
            }
        }
        out.extend(mapped);
        out.sort_unstable_by_key(|s| s.address);
        out
    }

    /// Hands `block` each block of a segment in address order (see
    /// `segments`); the tensors that lie in it.
    fn carve(&self, seg: &Segment, device: i32, mut block: impl FnMut(Block)) -> u64 {
        let (start, end) = (seg.address, seg.address.saturating_add(seg.size));
        if !self.tensor_probes {
            block(Block { address: start, size: seg.size, requested: seg.size, in_use: true, stack: seg.stack });
            return 0;
        }
        let mut cursor = start;
        let mut inside = 0;
        for (&addr, t) in self.held.tensors.range(start..end).filter(|(_, t)| t.device() == device) {
            inside += 1;
            let from = addr.max(cursor);
            let block_end = addr.saturating_add(t.size.max(1).div_ceil(BLOCK_ROUND) * BLOCK_ROUND).min(end);
            if from > cursor {
                block(Block { address: cursor, size: from - cursor, requested: 0, in_use: false, stack: None });
            }
            if block_end > from {
                let size = block_end - from;
                block(Block { address: from, size, requested: t.size.min(size), in_use: true, stack: t.stack() });
            }
            cursor = cursor.max(block_end);
        }
        if end > cursor {
            block(Block { address: cursor, size: end - cursor, requested: 0, in_use: false, stack: None });
        }
        inside
    }

    /// How the tensors seen use the device's segments; None when no
    /// PyTorch probe fired in this process (nothing to tell allocated from
    /// reserved by). On every scrape: the blocks are walked, not kept.
    pub fn free_blocks(&self, device: i32) -> Option<FreeBlocks> {
        if !self.tensor_probes {
            return None;
        }
        let mut fb = FreeBlocks::default();
        let mut inside = 0u64;
        for seg in self.spans(device) {
            fb.segment_bytes += seg.size;
            inside += self.carve(&seg, device, |b| {
                if !b.in_use {
                    fb.unused_bytes += b.size;
                    fb.largest_free_block = fb.largest_free_block.max(b.size);
                }
            });
        }
        let on_device = self.held.tensors.values().filter(|t| t.device() == device).count() as u64;
        fb.tensors_outside_segments = on_device - inside;
        Some(fb)
    }
}

/// Memory a process reserved from the driver in one piece of address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub address: u64,
    pub size: u64,
    /// Made of VMM mappings (PyTorch's expandable segments).
    pub expandable: bool,
    /// The stack of the allocation (or first mapping's handle) that made it.
    pub stack: Option<StackId>,
    pub blocks: Vec<Block>,
}

/// A piece of a segment: a tensor's block, or a free run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// What the tensor asked for (its block is rounded up); 0 when free.
    pub requested: u64,
    pub in_use: bool,
    pub stack: Option<StackId>,
}

/// Tensors by address, for carving (BTreeMap: ranges by segment).
pub type Tensors = BTreeMap<u64, Allocation>;

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use crate::state::{testing::ev, Limits, State};

    const MIB: u64 = 1 << 20;

    fn tensor(s: &mut State, addr: u64, size: u64) {
        s.apply(&Event { addr, size, device: 0, ..ev(api::TENSOR_ALLOC) });
    }

    #[test]
    fn allocated_is_told_from_reserved_and_free_blocks_merge() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { handle: 0xc, device: 0, ..ev(api::CU_CTX_CREATE_V2) });
        assert_eq!(s.processes[&100].free_blocks(0), None, "no probe fired yet: nothing to tell");
        // Two 2 MiB segments; tensors of 1 MiB, 300 B (a 512 B block) and 512 KiB.
        s.apply(&Event { addr: 0x1000_0000, size: 2 * MIB, ..ev(api::CU_MEM_ALLOC_V2) });
        s.apply(&Event { addr: 0x2000_0000, size: 2 * MIB, ..ev(api::CU_MEM_ALLOC_V2) });
        tensor(&mut s, 0x1000_0000, MIB);
        tensor(&mut s, 0x1000_0000 + MIB, 300);
        tensor(&mut s, 0x2000_0000 + MIB, MIB / 2);
        let p = &s.processes[&100];
        assert_eq!((p.totals(0).live_bytes, p.totals(0).allocated_bytes, p.totals(0).tensors), (4 * MIB, MIB + 300 + MIB / 2, 3));
        let fb = p.free_blocks(0).unwrap();
        // Segment 1: 1 MiB − 512 B free after the small block; segment 2: 1 MiB before, 512 KiB after.
        assert_eq!(fb.unused_bytes, (MIB - 512) + MIB + MIB / 2);
        assert_eq!(fb.largest_free_block, MIB);
        // Freeing the 300 B tensor merges its block with the free space after it.
        s.apply(&Event { addr: 0x1000_0000 + MIB, ..ev(api::TENSOR_FREE) });
        let fb = s.processes[&100].free_blocks(0).unwrap();
        assert_eq!((fb.unused_bytes, fb.largest_free_block, fb.tensors_outside_segments), (MIB + MIB + MIB / 2, MIB, 0));
        // A tensor in a segment made before tracing, a free never seen allocated.
        tensor(&mut s, 0x9000_0000, MIB);
        s.apply(&Event { addr: 0x7777, ..ev(api::TENSOR_FREE) });
        let p = &s.processes[&100];
        assert_eq!((p.free_blocks(0).unwrap().tensors_outside_segments, p.untracked_tensor_frees), (1, 1));
        // The driver frees everything at exit, tensors included.
        s.apply(&ev(api::PROCESS_EXIT));
        assert_eq!(s.live_entries(), 0);
    }
}
