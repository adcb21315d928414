//! The kernel's own table of what each process holds (allocations, VMM
//! handles, mappings and reservations, contexts), kept by the eBPF programs
//! at each successful call's return. `gpumem serve` pins it with its other
//! maps, so that a restarted agent rebuilds its state exactly from it,
//! allocations made while no agent ran included.
use crate::{api, Event};

/// What a key's `id` names.
pub mod kind {
    /// An allocation (device, managed or pinned host) by its address.
    pub const ALLOC: u32 = 1;
    /// A cuMemCreate handle.
    pub const VMM_HANDLE: u32 = 2;
    /// A cuMemMap mapping by its start address.
    pub const VMM_MAP: u32 = 3;
    /// A cuMemAddressReserve reservation by its start address.
    pub const VA: u32 = 4;
    /// A context (primary retained or created) by its handle.
    pub const CTX: u32 = 5;
    /// A thread's current context (set or pushed), by thread id.
    pub const THREAD_CTX: u32 = 6;
    /// A tensor of PyTorch's caching allocator (its USDT probes), by address.
    pub const TENSOR: u32 = 7;
    /// A device's primary context, by device: the retain event, its
    /// `aux` the retains not released yet (kept by the eBPF side).
    pub const PRIMARY_CTX: u32 = 8;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LiveKey {
    pub tgid: u32,
    pub kind: u32,
    pub id: u64,
}

/// The call that made the entry live, as it was emitted, and the stack id
/// the agent gave its stack (0: none), written back by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveEntry {
    pub event: Event,
    pub stack: u64,
}

/// Entries by default (`serve --kernel-table-entries`): about 110 bytes each,
/// allocated as they are used.
pub const MAX_DEFAULT: u32 = 1 << 18;
/// Kernel bytes per entry: key, value and the hash table's element header.
pub const BYTES_PER_ENTRY: u64 = (core::mem::size_of::<LiveKey>() + core::mem::size_of::<LiveEntry>() + 48) as u64;
/// Processes whose entries that did not fit are counted one by one.
pub const MISSED_PIDS_MAX: u32 = 4096;

/// Bumped whenever a pinned map's key or value changes meaning: pinned state
/// of another layout is replaced, never read.
pub const LAYOUT_VERSION: u32 = 1;

/// What a successful call does to the table: (kind, id, true: add / false: remove).
#[inline(always)]
pub fn effect(ev: &Event) -> Option<(u32, u64, bool)> {
    use api::*;
    Some(match ev.api {
        CU_MEM_ALLOC_V2
        | CU_MEM_ALLOC_PITCH_V2
        | CU_MEM_ALLOC_MANAGED
        | CU_MEM_ALLOC_ASYNC
        | CU_MEM_ALLOC_ASYNC_PTSZ
        | CU_MEM_ALLOC_FROM_POOL_ASYNC
        | CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ
        | CU_MEM_HOST_ALLOC
        | CU_MEM_ALLOC_HOST_V2
        | CU_MEM_HOST_REGISTER_V2 => (kind::ALLOC, ev.addr, true),
        CU_MEM_FREE_V2 | CU_MEM_FREE_ASYNC | CU_MEM_FREE_ASYNC_PTSZ | CU_MEM_FREE_HOST | CU_MEM_HOST_UNREGISTER => {
            (kind::ALLOC, ev.addr, false)
        }
        // A green context names its device; the contexts made from one are
        // found again through it (not kept: an adopting agent would not know
        // their device), and imports are another process's memory.
        CU_GREEN_CTX_CREATE => (kind::CTX, ev.handle, true),
        CU_GREEN_CTX_DESTROY => (kind::CTX, ev.handle, false),
        CU_MEM_CREATE => (kind::VMM_HANDLE, ev.handle, true),
        CU_MEM_RELEASE => (kind::VMM_HANDLE, ev.handle, false),
        CU_MEM_MAP => (kind::VMM_MAP, ev.addr, true),
        CU_MEM_UNMAP => (kind::VMM_MAP, ev.addr, false),
        CU_MEM_ADDRESS_RESERVE => (kind::VA, ev.addr, true),
        CU_MEM_ADDRESS_FREE => (kind::VA, ev.addr, false),
        CU_CTX_CREATE_V2 | CU_CTX_CREATE_V3 | CU_CTX_CREATE_V4 => (kind::CTX, ev.handle, true),
        // Counted: a release removes the entry only with the last retain
        // (see `is_counted`); a reset removes it at once.
        CU_DEVICE_PRIMARY_CTX_RETAIN => (kind::PRIMARY_CTX, ev.device as u32 as u64, true),
        CU_DEVICE_PRIMARY_CTX_RELEASE_V2 | CU_DEVICE_PRIMARY_CTX_RESET_V2 => (kind::PRIMARY_CTX, ev.device as u32 as u64, false),
        CU_CTX_DESTROY_V2 => (kind::CTX, ev.handle, false),
        CU_CTX_SET_CURRENT | CU_CTX_PUSH_CURRENT_V2 => (kind::THREAD_CTX, ev.tid as u64, true),
        // The context below the popped one is not known here: the thread
        // falls back to the process's last context.
        CU_CTX_POP_CURRENT_V2 => (kind::THREAD_CTX, ev.tid as u64, false),
        TENSOR_ALLOC => (kind::TENSOR, ev.addr, true),
        TENSOR_FREE => (kind::TENSOR, ev.addr, false),
        _ => return None,
    })
}

/// Whether the call counts its entry up or down (retain, release) rather
/// than adding or removing it.
#[inline(always)]
pub fn is_counted(api_id: u32) -> bool {
    api_id == api::CU_DEVICE_PRIMARY_CTX_RETAIN || api_id == api::CU_DEVICE_PRIMARY_CTX_RELEASE_V2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_add_has_its_remove_on_the_same_key() {
        let of = |api: u32| {
            let mut ev = Event::empty(api);
            (ev.addr, ev.handle, ev.tid) = (0x1000, 0x2000, 7);
            effect(&ev)
        };
        use api::*;
        for (add, remove) in [
            (CU_MEM_ALLOC_V2, CU_MEM_FREE_V2),
            (CU_MEM_ALLOC_ASYNC, CU_MEM_FREE_ASYNC),
            (CU_MEM_ALLOC_HOST_V2, CU_MEM_FREE_HOST),
            (CU_MEM_HOST_REGISTER_V2, CU_MEM_HOST_UNREGISTER),
            (CU_GREEN_CTX_CREATE, CU_GREEN_CTX_DESTROY),
            (CU_MEM_CREATE, CU_MEM_RELEASE),
            (CU_MEM_MAP, CU_MEM_UNMAP),
            (CU_MEM_ADDRESS_RESERVE, CU_MEM_ADDRESS_FREE),
            (CU_CTX_CREATE_V2, CU_CTX_DESTROY_V2),
            (CU_CTX_SET_CURRENT, CU_CTX_POP_CURRENT_V2),
            (CU_DEVICE_PRIMARY_CTX_RETAIN, CU_DEVICE_PRIMARY_CTX_RELEASE_V2),
            (CU_DEVICE_PRIMARY_CTX_RETAIN, CU_DEVICE_PRIMARY_CTX_RESET_V2),
            (TENSOR_ALLOC, TENSOR_FREE),
        ] {
            let (a, r) = (of(add).unwrap(), of(remove).unwrap());
            assert_eq!((a.0, a.1, a.2), (r.0, r.1, true), "api {add}");
            assert!(!r.2, "api {remove} removes");
        }
        assert_eq!(of(CU_MEM_CREATE).unwrap().1, 0x2000, "handles by handle");
        assert_eq!(of(CU_CTX_SET_CURRENT).unwrap().1, 7, "current contexts by thread");
        assert_eq!(of(CU_MEM_GET_INFO_V2), None);
        assert_eq!(of(PROCESS_EXIT), None);
    }
}
