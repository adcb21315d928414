//! Fragmentation signals visible from outside a process: how its live
//! memory on a device is cut up (a caching allocator's segment pattern), and
//! for VMM users how much address space is reserved against what is mapped
//! and physically held, including handles released but still mapped.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::state::{tensor::FreeBlocks, Memory, Process};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    /// Allocations of at most this many bytes (and more than the bucket below).
    pub le_bytes: u64,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceLayout {
    pub largest_allocation: u64,
    /// Live allocations and VMM handles by power-of-two size class (non-empty classes only).
    pub size_histogram: Vec<SizeBucket>,
    pub vmm_reserved_bytes: u64,
    pub vmm_mapped_bytes: u64,
    pub vmm_physical_bytes: u64,
    /// Handles released by the program but still mapped: physical memory the
    /// program no longer owns yet still holds.
    pub released_but_mapped_handles: u64,
    pub released_but_mapped_bytes: u64,
    /// Where PyTorch's allocator probes fired: how its tensors use the
    /// segments (reserved but unused bytes, the largest free block).
    pub free_blocks: Option<FreeBlocks>,
}

/// How a process's live memory on one device is laid out.
pub fn layout(p: &Process, device: i32) -> DeviceLayout {
    let mut l = DeviceLayout::default();
    let mut hist: BTreeMap<u64, SizeBucket> = BTreeMap::new();
    let mut add = |size: u64| {
        let le = size.max(1).next_power_of_two();
        let b = hist.entry(le).or_insert(SizeBucket { le_bytes: le, count: 0, bytes: 0 });
        b.count += 1;
        b.bytes += size;
    };
    for a in p.held.allocs.values().filter(|a| a.memory() == Memory::Device && a.device() == device) {
        add(a.size);
        l.largest_allocation = l.largest_allocation.max(a.size);
    }
    for h in p.held.vmm_handles.values().filter(|h| h.device == device) {
        add(h.size);
        l.largest_allocation = l.largest_allocation.max(h.size);
        l.vmm_physical_bytes += h.size;
        if h.released && h.mappings > 0 {
            l.released_but_mapped_handles += 1;
            l.released_but_mapped_bytes += h.size;
        }
    }
    for m in p.held.mappings.values() {
        if p.held.vmm_handles.get(&m.handle).is_some_and(|h| h.device == device) {
            l.vmm_mapped_bytes += m.size;
        }
    }
    l.vmm_reserved_bytes = p.held.reservations.values().filter(|(_, d)| *d == device).map(|(s, _)| s).sum();
    l.size_histogram = hist.into_values().collect();
    l.free_blocks = p.free_blocks(device);
    l
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing::ev, Limits, State};

    const MIB: u64 = 1 << 20;

    #[test]
    fn sizes_and_vmm_layout() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { handle: 0xc, device: 0, ..ev(api::CU_CTX_CREATE_V2) });
        s.apply(&Event { addr: 0x1, size: 256 * MIB, ..ev(api::CU_MEM_ALLOC_V2) });
        for i in 0..3 {
            s.apply(&Event { addr: 0x10 + i, size: 3 * MIB, ..ev(api::CU_MEM_ALLOC_V2) });
        }
        s.apply(&Event { addr: 0x1000_0000, size: 1024 * MIB, ..ev(api::CU_MEM_ADDRESS_RESERVE) });
        for i in 0..2u64 {
            s.apply(&Event { handle: 7 + i, size: 20 * MIB, device: 0, ..ev(api::CU_MEM_CREATE) });
            s.apply(&Event { addr: 0x1000_0000 + i * 20 * MIB, size: 20 * MIB, handle: 7 + i, ..ev(api::CU_MEM_MAP) });
        }
        s.apply(&Event { handle: 7, ..ev(api::CU_MEM_RELEASE) });
        let l = layout(&s.processes[&100], 0);
        assert_eq!(l.largest_allocation, 256 * MIB);
        assert_eq!(
            l.size_histogram,
            [
                SizeBucket { le_bytes: 4 * MIB, count: 3, bytes: 9 * MIB },
                SizeBucket { le_bytes: 32 * MIB, count: 2, bytes: 40 * MIB },
                SizeBucket { le_bytes: 256 * MIB, count: 1, bytes: 256 * MIB }
            ]
        );
        assert_eq!((l.vmm_reserved_bytes, l.vmm_mapped_bytes, l.vmm_physical_bytes), (1024 * MIB, 40 * MIB, 40 * MIB));
        assert_eq!((l.released_but_mapped_handles, l.released_but_mapped_bytes), (1, 20 * MIB));
        assert_eq!(layout(&s.processes[&100], 1), DeviceLayout::default());
    }
}
