//! The virtual memory management API (PyTorch's expandable segments):
//! physical memory is the live cuMemCreate handles; reserved address space
//! is reported but never counted as memory.
use gpumem_common::{ApiClass, Event, DEVICE_UNKNOWN};

use super::{
    process::{Import, Mapping, Process, Via, VmmHandle},
    Applied, Release,
};
use crate::stacks::{Sampling, StackId};

impl Process {
    /// A successful VMM or address-space call; `room`: the global table has space.
    pub(super) fn apply_vmm(&mut self, class: ApiClass, ev: &Event, room: bool, stack: Option<StackId>, out: &mut Applied) {
        match class {
            ApiClass::VmmCreate => self.vmm_create(ev, room, stack, out),
            ApiClass::VmmRelease => self.vmm_release(ev, out),
            ApiClass::VmmMap => self.vmm_map(ev, room, out),
            ApiClass::VmmUnmap => self.vmm_unmap(ev, out),
            ApiClass::VaReserve => {
                let device = self.current_device(ev.tid);
                out.device = device;
                if !room {
                    out.dropped = true;
                    return;
                }
                if let Some((old, dev)) = self.held.reservations.insert(ev.addr, (ev.size, device)) {
                    self.totals_mut(dev).reserved_bytes -= old;
                }
                self.totals_mut(device).reserved_bytes += ev.size;
            }
            ApiClass::VaFree => match self.held.reservations.remove(&ev.addr) {
                Some((size, dev)) => {
                    out.device = dev;
                    out.size = size;
                    self.totals_mut(dev).reserved_bytes -= size;
                }
                None => out.untracked = true,
            },
            _ => {}
        }
    }

    fn vmm_create(&mut self, ev: &Event, room: bool, stack: Option<StackId>, out: &mut Applied) {
        let device = if ev.device != DEVICE_UNKNOWN { ev.device } else { self.current_device(ev.tid) };
        out.device = device;
        if !room {
            out.dropped = true;
            return;
        }
        let h = VmmHandle {
            size: ev.size,
            device,
            mappings: 0,
            released: false,
            ts_ns: ev.ts_ns,
            stack,
            sampling: Sampling::of(ev.flags),
            retains: 0,
        };
        if let Some(old) = self.held.vmm_handles.insert(ev.handle, h) {
            self.uncount_handle(&old);
        }
        let t = self.totals_mut(device);
        t.live_bytes += ev.size;
        t.live_allocs += 1;
        t.vmm_physical_bytes += ev.size;
        t.vmm_handles += 1;
    }

    fn vmm_release(&mut self, ev: &Event, out: &mut Applied) {
        let Some(h) = self.held.vmm_handles.get_mut(&ev.handle) else {
            self.release_other_handle(ev.handle, out);
            return;
        };
        out.device = h.device;
        if h.retains > 0 {
            // The release of a cuMemRetainAllocationHandle: the memory stays.
            h.retains -= 1;
            out.size = 0;
            return;
        }
        out.size = h.size;
        h.released = true;
        out.lifetime_ns = Some(ev.ts_ns.saturating_sub(h.ts_ns));
        // Physical memory goes only once no mapping refers to it.
        if h.mappings == 0 {
            self.free_handle(ev.handle, out);
        }
    }

    fn vmm_map(&mut self, ev: &Event, room: bool, out: &mut Applied) {
        match self.held.vmm_handles.get_mut(&ev.handle) {
            Some(h) => {
                h.mappings += 1;
                out.device = h.device;
            }
            None => self.map_other_handle(ev, room, out),
        }
        if room {
            self.held.mappings.insert(ev.addr, Mapping { size: ev.size, handle: ev.handle });
        } else {
            out.dropped = true;
        }
    }

    /// Unmap covers [addr, addr+size): every mapping starting inside it.
    fn vmm_unmap(&mut self, ev: &Event, out: &mut Applied) {
        let end = ev.addr.saturating_add(ev.size);
        let starts: Vec<u64> = self.held.mappings.range(ev.addr..end).map(|(&a, _)| a).collect();
        if starts.is_empty() {
            out.untracked = true;
        }
        for start in starts {
            let m = self.held.mappings.remove(&start).expect("present");
            let Some(h) = self.held.vmm_handles.get_mut(&m.handle) else {
                // An imported handle's mapping: the import goes.
                if let Some(i) = self.remove_import(start) {
                    out.device = i.device;
                }
                continue;
            };
            h.mappings = h.mappings.saturating_sub(1);
            out.device = h.device;
            if h.released && h.mappings == 0 {
                self.free_handle(m.handle, out);
            }
        }
    }

    /// A cuMemMap of a handle that is not this process's own memory: an
    /// imported handle (its mapping is an import of the exporter's bytes)
    /// or a multicast object (no memory of its own); else untracked.
    fn map_other_handle(&mut self, ev: &Event, room: bool, out: &mut Applied) {
        if let Some(ih) = self.held.sharing().imported_handles.get(&ev.handle) {
            let size = ih.size.map_or(ev.size, |s| s.min(ev.size));
            let import =
                Import { from_pid: ih.from_pid, from_comm: ih.from_comm.clone(), size, device: ih.device, via: Via::ShareableHandle };
            out.device = ih.device;
            out.exporter = ih.from_pid;
            if room {
                self.add_import(ev.addr, import);
            }
        } else if !self.held.sharing().multicast.contains_key(&ev.handle) {
            out.untracked = true;
        }
    }

    /// cuMemRelease of an imported handle or a multicast object.
    fn release_other_handle(&mut self, handle: u64, out: &mut Applied) {
        let Some(sh) = self.held.sharing.as_deref_mut() else {
            out.untracked = true;
            return;
        };
        if let Some(ih) = sh.imported_handles.get_mut(&handle) {
            out.device = ih.device;
            out.size = 0;
            if ih.retains > 0 {
                ih.retains -= 1;
            } else {
                // Its mappings stay imports until unmapped, as the driver keeps them.
                sh.imported_handles.remove(&handle);
            }
        } else if sh.multicast.remove(&handle).is_none() {
            out.untracked = true;
        }
    }

    /// cuMemRetainAllocationHandle: one more release to come before the memory goes.
    pub(super) fn retain_handle(&mut self, handle: u64, out: &mut Applied) {
        if let Some(h) = self.held.vmm_handles.get_mut(&handle) {
            h.retains += 1;
            out.device = h.device;
        } else if let Some(ih) = self.held.sharing.as_deref_mut().and_then(|s| s.imported_handles.get_mut(&handle)) {
            ih.retains += 1;
            out.device = ih.device;
        } else {
            out.untracked = true;
        }
    }

    /// The handle's physical memory is gone (released and unmapped).
    fn free_handle(&mut self, handle: u64, out: &mut Applied) {
        let h = self.held.vmm_handles.remove(&handle).expect("present");
        out.released.push(Release { device: h.device, bytes: h.size, allocs: 1 });
        self.uncount_handle(&h);
    }

    fn uncount_handle(&mut self, h: &VmmHandle) {
        let t = self.totals_mut(h.device);
        t.live_bytes -= h.size;
        t.live_allocs -= 1;
        t.vmm_physical_bytes -= h.size;
        t.vmm_handles -= 1;
    }
}
