//! Classic allocations (cuMemAlloc and friends, pinned host memory) and
//! their frees, including frees read after the address was reused.
use gpumem_common::{ApiClass, Event, DEVICE_UNKNOWN};

use super::{
    process::{Allocation, Memory, Process},
    Applied,
};
use crate::stacks::{Sampling, StackId};

impl Process {
    /// A successful allocation; `room`: the global table has space for it.
    pub(super) fn apply_alloc(&mut self, class: ApiClass, ev: &Event, room: bool, stack: Option<StackId>, out: &mut Applied) {
        let memory = if class == ApiClass::HostAlloc { Memory::HostPinned } else { Memory::Device };
        let adopted = ev.flags & gpumem_common::flags::ADOPTED != 0 && ev.device != DEVICE_UNKNOWN;
        let (ctx, current_device) = self.current(ev.tid);
        let device = match memory {
            Memory::HostPinned => DEVICE_UNKNOWN,
            // Rebuilt from the kernel's table: the device the last agent resolved.
            Memory::Device if adopted => ev.device,
            Memory::Device => current_device,
        };
        // A pool made while traced names its device, whatever context is current.
        let pool = if memory == Memory::Device { self.pool_of_alloc(ev, device) } else { None };
        let device = match pool {
            Some(k) if !adopted && k.device != DEVICE_UNKNOWN => k.device,
            _ => device,
        };
        out.device = device;
        if !room {
            out.dropped = true;
            return;
        }
        let alloc = Allocation::new(ev.size, device, memory, self.ctx_index(ctx), ev.ts_ns, stack, Sampling::of(ev.flags));
        // A pointer handed out twice: its free is late (another thread's,
        // not yet seen; see below) or was missed. Replace it, and remember
        // that a late free of this address may still come.
        if let Some(old) = self.held.allocs.insert(ev.addr, alloc) {
            self.credit_free(&old);
            self.pool_free(ev.addr, old.size);
            self.note_displaced(ev.addr);
        }
        if let Some(key) = pool {
            self.pool_alloc(ev.addr, key, ev.size);
        }
        match memory {
            Memory::Device => {
                self.wind_down.allocated(ev.ts_ns);
                let t = self.totals_mut(device);
                t.live_bytes += ev.size;
                t.live_allocs += 1;
            }
            Memory::HostPinned => {
                self.held.pinned.bytes += ev.size;
                self.held.pinned.allocs += 1;
            }
        }
    }

    /// A successful free.
    ///
    /// Events are ordered by their return. When one thread frees an address
    /// and another gets it back from the allocator, the second thread's
    /// allocation can return (and be seen) before the first thread's free.
    /// A free that started before the live allocation at its address
    /// returned cannot be freeing it: it freed the one displaced earlier
    /// (already credited when the new allocation replaced it).
    pub(super) fn apply_free(&mut self, class: ApiClass, ev: &Event, out: &mut Applied) {
        let started = ev.ts_ns.saturating_sub(ev.latency_ns);
        if let Some(cur) = self.held.allocs.get(ev.addr).filter(|cur| started < cur.ts_ns) {
            out.device = cur.device();
            out.size = 0;
            self.reordered_frees += 1;
            self.take_displaced(ev.addr);
            return;
        }
        match self.held.allocs.remove(ev.addr) {
            Some(old) => {
                out.device = old.device();
                out.size = old.size;
                out.lifetime_ns = Some(ev.ts_ns.saturating_sub(old.ts_ns));
                if old.memory() == Memory::Device {
                    self.wind_down.freed(old.device(), old.stack(), old.size);
                    self.pool_free(ev.addr, old.size);
                }
                self.credit_free(&old);
            }
            // A pool pointer imported from another process is freed here
            // (cuMemFree/cuMemFreeAsync): the mapping goes, the memory stays
            // its exporter's.
            None if !self.held.sharing().imports.is_empty() && self.remove_import(ev.addr).is_some() => {
                out.size = 0;
            }
            None => {
                out.device = if class == ApiClass::HostFree { DEVICE_UNKNOWN } else { self.current_device(ev.tid) };
                // The same, later still: the second thread has freed the
                // address too before the first thread's free is seen.
                if self.take_displaced(ev.addr) {
                    out.size = 0;
                    self.reordered_frees += 1;
                } else {
                    out.untracked = true;
                    self.untracked_frees += 1;
                }
            }
        }
    }

    /// Takes an allocation's bytes off the totals.
    pub(super) fn credit_free(&mut self, a: &Allocation) {
        match a.memory() {
            Memory::Device => {
                let t = self.totals_mut(a.device());
                t.live_bytes -= a.size;
                t.live_allocs -= 1;
            }
            Memory::HostPinned => {
                self.held.pinned.bytes -= a.size;
                self.held.pinned.allocs -= 1;
            }
        }
    }
}
