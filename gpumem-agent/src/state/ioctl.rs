//! State kept from the NVIDIA driver's ioctls: RM objects and the video
//! memory they hold, UVM external mappings. Only successful calls (RM status
//! 0) get here.
use gpumem_common::{api, nv, Event, DEVICE_UNKNOWN};

use super::{process::RmObject, Applied, Process};

pub fn apply(p: &mut Process, ev: &Event) -> Applied {
    let mut out = Applied { device: DEVICE_UNKNOWN, size: ev.size, ..Default::default() };
    match ev.api {
        api::RM_ALLOC => {
            let class = ev.aux as u32;
            let obj = RmObject { parent: ev.addr as u32, class, size: if class == nv::CLASS_MEMORY_LOCAL_USER { ev.size } else { 0 } };
            if let Some(old) = p.rm_objects.insert(ev.handle as u32, obj.clone()) {
                uncount(p, &old);
            }
            if obj.class == nv::CLASS_MEMORY_LOCAL_USER {
                p.rm_memory_bytes += obj.size;
                p.rm_memory_objects += 1;
            }
        }
        api::RM_FREE => {
            // Freeing an object frees everything allocated under it.
            let mut doomed = vec![ev.handle as u32];
            let mut freed = 0;
            while let Some(h) = doomed.pop() {
                if let Some(obj) = p.rm_objects.remove(&h) {
                    freed += obj.size;
                    uncount(p, &obj);
                }
                doomed.extend(p.rm_objects.iter().filter(|(_, o)| o.parent == h).map(|(&k, _)| k));
            }
            out.size = freed;
        }
        api::UVM_MAP_EXTERNAL_ALLOCATION => {
            if let Some(old) = p.uvm_mappings.insert(ev.addr, ev.size) {
                p.uvm_mapped_bytes -= old;
            }
            p.uvm_mapped_bytes += ev.size;
        }
        api::UVM_FREE => {
            if let Some(len) = p.uvm_mappings.remove(&ev.addr) {
                p.uvm_mapped_bytes -= len;
                out.size = len;
            }
        }
        _ => {}
    }
    out
}

fn uncount(p: &mut Process, obj: &RmObject) {
    if obj.class == nv::CLASS_MEMORY_LOCAL_USER {
        p.rm_memory_bytes -= obj.size;
        p.rm_memory_objects -= 1;
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
        let p = &s.processes[&100];
        assert_eq!((p.rm_memory_bytes, p.rm_memory_objects), (96 * MIB, 2));
        assert_eq!(p.apis[&api::RM_ALLOC].failures_by_result.get(&0x51), Some(&1));
        let a = s.apply(&Event { handle: 0x21, ..ev(api::RM_FREE) });
        assert_eq!(a.size, 32 * MIB);
        // Freeing the device frees the memory under it.
        let a = s.apply(&Event { handle: 0x10, ..ev(api::RM_FREE) });
        assert_eq!(a.size, 64 * MIB);
        let p = &s.processes[&100];
        assert_eq!((p.rm_memory_bytes, p.rm_memory_objects, p.rm_objects.len()), (0, 0, 0));
    }

    #[test]
    fn uvm_mappings() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { addr: 0x7000, size: 16 * MIB, ..ev(api::UVM_MAP_EXTERNAL_ALLOCATION) });
        assert_eq!(s.processes[&100].uvm_mapped_bytes, 16 * MIB);
        assert_eq!(s.apply(&Event { addr: 0x7000, ..ev(api::UVM_FREE) }).size, 16 * MIB);
        assert_eq!(s.processes[&100].uvm_mapped_bytes, 0);
    }
}
