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

    /// The reserved segments of a device, as address ranges: cuMemAlloc
    /// allocations each on its own (blocks never span two), VMM mappings
    /// merged where contiguous (expandable segments grow by mapping more
    /// pages after the last).
    fn segments(&self, device: i32) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .held
            .allocs
            .iter()
            .filter(|(_, a)| a.memory == Memory::Device && a.device() == device)
            .map(|(&addr, a)| (addr, addr.saturating_add(a.size)))
            .collect();
        let mut mapped: Vec<(u64, u64)> = Vec::new();
        for (&addr, m) in &self.held.mappings {
            if self.held.vmm_handles.get(&m.handle).is_none_or(|h| h.device != device) {
                continue;
            }
            match mapped.last_mut() {
                Some(last) if last.1 == addr => last.1 = addr.saturating_add(m.size),
                _ => mapped.push((addr, addr.saturating_add(m.size))),
            }
        }
        out.extend(mapped);
        out.sort_unstable();
        out
    }

    /// How the tensors seen use the device's segments; None when no
    /// PyTorch probe fired in this process (nothing to tell allocated from
    /// reserved by).
    pub fn free_blocks(&self, device: i32) -> Option<FreeBlocks> {
        if !self.tensor_probes {
            return None;
        }
        let mut fb = FreeBlocks::default();
        let mut inside = 0u64;
        for (start, end) in self.segments(device) {
            fb.segment_bytes += end - start;
            let mut cursor = start;
            for (&addr, t) in self.held.tensors.range(start..end).filter(|(_, t)| t.device() == device) {
                let block_end = addr.saturating_add(t.size.max(1).div_ceil(BLOCK_ROUND) * BLOCK_ROUND).min(end);
                fb.largest_free_block = fb.largest_free_block.max(addr.saturating_sub(cursor));
                fb.unused_bytes += addr.saturating_sub(cursor);
                cursor = cursor.max(block_end);
                inside += 1;
            }
            fb.largest_free_block = fb.largest_free_block.max(end - cursor);
            fb.unused_bytes += end - cursor;
        }
        let on_device = self.held.tensors.values().filter(|t| t.device() == device).count() as u64;
        fb.tensors_outside_segments = on_device - inside;
        Some(fb)
    }
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
