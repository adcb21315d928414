//! State kept from the NVIDIA driver's ioctls: RM objects and the video
//! memory they hold, UVM external mappings. Only successful calls (RM status
//! 0) get here.
use gpumem_common::nv;

use super::{process::RmObject, Applied, Process};
use crate::events::kind::{Rm, Uvm};

impl Process {
    /// `out` starts with the event's own size, which most calls keep.
    pub(super) fn apply_rm(&mut self, call: &Rm, out: &mut Applied) {
        let d = &mut self.held.driver;
        match *call {
            Rm::Alloc { object, parent, class, size, .. } => {
                let video = class == nv::CLASS_MEMORY_LOCAL_USER;
                let obj = RmObject { parent, class, size: if video { size } else { 0 } };
                if let Some(old) = d.rm_objects.insert(object, obj) {
                    uncount(d, &old);
                }
                if video {
                    d.rm_memory_bytes += size;
                    d.rm_memory_objects += 1;
                }
            }
            Rm::Free { object, .. } => {
                // Freeing an object frees everything allocated under it.
                let mut doomed = vec![object];
                let mut freed = 0;
                while let Some(h) = doomed.pop() {
                    if let Some(obj) = d.rm_objects.remove(&h) {
                        freed += obj.size;
                        uncount(d, &obj);
                    }
                    doomed.extend(d.rm_objects.iter().filter(|(_, o)| o.parent == h).map(|(&k, _)| k));
                }
                out.size = freed;
            }
            Rm::Control { .. } | Rm::Map { .. } => {}
        }
    }

    /// `out` starts with the event's own size.
    pub(super) fn apply_uvm(&mut self, call: &Uvm, out: &mut Applied) {
        let d = &mut self.held.driver;
        match *call {
            Uvm::Map { base, length } => {
                if let Some(old) = d.uvm_mappings.insert(base, length) {
                    d.uvm_mapped_bytes -= old;
                }
                d.uvm_mapped_bytes += length;
            }
            Uvm::Free { base } => {
                if let Some(len) = d.uvm_mappings.remove(&base) {
                    d.uvm_mapped_bytes -= len;
                    out.size = len;
                }
            }
        }
    }
}

fn uncount(d: &mut super::process::DriverObjects, obj: &RmObject) {
    if obj.class == nv::CLASS_MEMORY_LOCAL_USER {
        d.rm_memory_bytes -= obj.size;
        d.rm_memory_objects -= 1;
    }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use crate::state::{testing::ev, Limits, State};

    const MIB: u64 = 1 << 20;

    fn rm_alloc(handle: u64, parent: u64, class: u64, size: u64) -> Event {
        Event { handle, addr: parent, aux: class, size, ..ev(api::RM_ALLOC) }
    }

    #[test]
    fn rm_memory_objects_and_hierarchical_free() {
        let mut s = State::new(Limits::default());
        s.apply(&rm_alloc(0x10, 0x1, 0x80, 0)); // a device object
        s.apply(&rm_alloc(0x20, 0x10, 0x40, 64 * MIB));
        s.apply(&rm_alloc(0x21, 0x10, 0x40, 32 * MIB));
        s.apply(&Event { result: 0x51, ..rm_alloc(0x22, 0x10, 0x40, 512 * MIB) }); // failed: no state
        let d = &s.processes[&100].held.driver;
        assert_eq!((d.rm_memory_bytes, d.rm_memory_objects), (96 * MIB, 2));
        assert_eq!(s.processes[&100].apis[&api::RM_ALLOC].failures_by_result.get(&0x51), Some(&1));
        let a = s.apply(&Event { handle: 0x21, ..ev(api::RM_FREE) });
        assert_eq!(a.size, 32 * MIB);
        // Freeing the device frees the memory under it.
        let a = s.apply(&Event { handle: 0x10, ..ev(api::RM_FREE) });
        assert_eq!(a.size, 64 * MIB);
        let d = &s.processes[&100].held.driver;
        assert_eq!((d.rm_memory_bytes, d.rm_memory_objects, d.rm_objects.len()), (0, 0, 0));
    }

    #[test]
    fn uvm_mappings() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { addr: 0x7000, size: 16 * MIB, ..ev(api::UVM_MAP_EXTERNAL_ALLOCATION) });
        assert_eq!(s.processes[&100].held.driver.uvm_mapped_bytes, 16 * MIB);
        assert_eq!(s.apply(&Event { addr: 0x7000, ..ev(api::UVM_FREE) }).size, 16 * MIB);
        assert_eq!(s.processes[&100].held.driver.uvm_mapped_bytes, 0);
    }
}
