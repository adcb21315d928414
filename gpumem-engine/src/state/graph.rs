//! CUDA graph memory (cuGraphAddMemAllocNode and friends) and multicast
//! objects (NVLS): neither is memory of its own in the process's totals.
//! A graph's allocation nodes declare what the device's graph memory pool
//! hands out when the graph runs (what the pool physically holds is the
//! driver's, in NVML's figure); a multicast object's physical memory is the
//! handles bound to it, already counted where they were created.
use gpumem_common::{
    payload::{GraphNode as GraphCall, MulticastCall, Payload},
    ApiClass, Event, DEVICE_UNKNOWN,
};

use super::{process::Process, Applied};

/// A multicast object (NVLS): no memory of its own; the physical memory
/// bound to it on each device is that device's own handles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Multicast {
    pub size: u64,
    /// Devices it was made for (numDevices) and those added so far.
    pub devices: u64,
    pub added: Vec<i32>,
    /// (device, offset in the object, bytes bound).
    pub bound: Vec<(i32, u64, u64)>,
}

/// A CUDA graph's memory allocation node: the pointer it hands out when the
/// graph runs, from the device's graph memory pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphNode {
    pub graph: u64,
    pub size: u64,
    pub device: i32,
}

impl Process {
    /// A successful graph memory call.
    pub(super) fn apply_graph(&mut self, class: ApiClass, ev: &Event, room: bool, out: &mut Applied) {
        let call = GraphCall::unpack(ev);
        match class {
            ApiClass::GraphAlloc => {
                let device = if ev.device != DEVICE_UNKNOWN { ev.device } else { self.current_device(ev.tid) };
                out.device = device;
                if !room {
                    out.dropped = true;
                    return;
                }
                self.totals_mut(device);
                self.held.sharing_mut().graph_nodes.insert(call.addr, GraphNode { graph: call.graph, size: call.size, device });
            }
            ApiClass::GraphFree => match self.held.sharing_mut().graph_nodes.remove(&call.addr) {
                Some(n) => {
                    out.device = n.device;
                    out.size = n.size;
                }
                None => out.untracked = true,
            },
            ApiClass::GraphDestroy => {
                let before: u64 = self.held.sharing_mut().graph_nodes.values().map(|n| n.size).sum();
                self.held.sharing_mut().graph_nodes.retain(|_, n| n.graph != call.graph);
                out.size = before - self.held.sharing_mut().graph_nodes.values().map(|n| n.size).sum::<u64>();
            }
            ApiClass::GraphTrim => *self.held.sharing_mut().graph_trims.entry(ev.device).or_default() += 1,
            _ => {}
        }
    }

    /// A successful multicast call.
    pub(super) fn apply_multicast(&mut self, class: ApiClass, ev: &Event, room: bool, out: &mut Applied) {
        let call = MulticastCall::unpack(ev);
        match class {
            ApiClass::MulticastCreate => {
                if !room {
                    out.dropped = true;
                    return;
                }
                self.held
                    .sharing_mut()
                    .multicast
                    .insert(call.mc, Multicast { size: call.size, devices: call.offset, ..Default::default() });
            }
            ApiClass::MulticastAddDevice => match self.held.sharing_mut().multicast.get_mut(&call.mc) {
                Some(m) => {
                    if !m.added.contains(&ev.device) {
                        m.added.push(ev.device);
                    }
                    self.totals_mut(ev.device);
                }
                None => out.untracked = true,
            },
            ApiClass::MulticastBind => {
                // BindMem names a physical handle; BindAddr an address mapped to one.
                let handle = if self.held.vmm_handles.contains_key(&call.memory) {
                    Some(call.memory)
                } else {
                    self.held.mappings.range(..=call.memory).next_back().filter(|(&a, m)| call.memory < a + m.size).map(|(_, m)| m.handle)
                };
                let device = handle.and_then(|h| self.held.vmm_handles.get(&h)).map_or(DEVICE_UNKNOWN, |h| h.device);
                out.device = device;
                match self.held.sharing_mut().multicast.get_mut(&call.mc) {
                    Some(m) => m.bound.push((device, call.offset, call.size)),
                    None => out.untracked = true,
                }
            }
            ApiClass::MulticastUnbind => match self.held.sharing_mut().multicast.get_mut(&call.mc) {
                Some(m) => m.bound.retain(|&(d, o, _)| !(d == ev.device && o == call.offset)),
                None => out.untracked = true,
            },
            _ => {}
        }
    }
}
