//! A heap profile of GPU memory: per (process, device, stack) the
//! allocations made over the session and those still held, with sampled
//! stacks weighed by the inverse of their sampling probability (as Go's
//! heap profiles are), from the state and the session's history.
use std::collections::BTreeMap;

use super::history::{History, Layer, Totals, TotalsKey};
use crate::{
    stacks::{Frame, Sampling, StackId, Stacks},
    state::{Memory, State},
};

/// Which allocator's view a profile takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Layers {
    /// What each process took from the CUDA driver (PyTorch's cache included).
    #[default]
    Driver,
    /// Where PyTorch's allocator probes fired, its tensors (Python stacks)
    /// instead of the segments they are carved from; the driver's elsewhere.
    Tensors,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HeapSample {
    pub pid: u32,
    pub comm: String,
    pub container: Option<String>,
    pub pod: Option<String>,
    /// DEVICE_UNKNOWN with `host`: pinned host memory.
    pub device: i32,
    pub host: bool,
    pub layer: Layer,
    pub stack: Option<StackId>,
    pub frames: Vec<Frame>,
    pub alloc_objects: i64,
    pub alloc_space: i64,
    pub inuse_objects: i64,
    pub inuse_space: i64,
    /// Some figure is an estimate (a sampled stack).
    pub estimated: bool,
}

#[derive(Clone, Debug, Default)]
pub struct HeapProfile {
    /// Largest in-use space first, then largest allocated.
    pub samples: Vec<HeapSample>,
    /// Allocations over the stack budget whose stacks were not sampled: in
    /// no sample, stood for by the estimates (allocations, bytes; made in
    /// all, and held now).
    pub not_sampled_alloc: (u64, u64),
    pub not_sampled_inuse: (u64, u64),
    /// The session's stack sampling rate (0: every stack was taken).
    pub sample_bytes: u64,
}

/// The profile of `state` now and `history` so far.
pub fn heap(state: &State, history: &History, stacks: &mut Stacks, layers: Layers) -> HeapProfile {
    let sample_bytes = stacks.sample_bytes;
    let mut out = HeapProfile { sample_bytes, ..Default::default() };
    let tensor_view = |pid: u32| {
        layers == Layers::Tensors
            && (state.processes.get(&pid).is_some_and(|p| p.tensor_probes)
                || history.totals.keys().any(|k| k.pid == pid && k.layer == Layer::Tensor))
    };
    let mut tensor_pids: BTreeMap<u32, bool> = BTreeMap::new();
    let mut wanted = |k: &TotalsKey| *tensor_pids.entry(k.pid).or_insert_with(|| tensor_view(k.pid)) == (k.layer == Layer::Tensor);

    let mut inuse: BTreeMap<TotalsKey, Totals> = BTreeMap::new();
    for p in state.processes.values().filter(|p| !p.exited) {
        let allocs = p.held.allocs.values().map(|a| {
            let host = a.memory() == Memory::HostPinned;
            (a.device(), host, Layer::Driver, a.stack(), a.size, a.sampling())
        });
        let handles = p.held.vmm_handles.values().map(|h| (h.device, false, Layer::Driver, h.stack, h.size, h.sampling));
        let tensors = p.held.tensors.values().map(|t| (t.device(), false, Layer::Tensor, t.stack(), t.size, t.sampling()));
        for (device, host, layer, stack, size, sampling) in allocs.chain(handles).chain(tensors) {
            let device = if host { gpumem_common::DEVICE_UNKNOWN } else { device };
            let key = TotalsKey { pid: p.pid, device, stack, layer, host };
            if !wanted(&key) {
                continue;
            }
            if sampling == Sampling::NotSampled {
                out.not_sampled_inuse.0 += 1;
                out.not_sampled_inuse.1 += size;
                continue;
            }
            inuse.entry(key).or_default().add(size, sampling, sample_bytes);
        }
    }
    let mut made: BTreeMap<TotalsKey, Totals> = BTreeMap::new();
    for (k, t) in history.totals.iter().filter(|(k, _)| wanted(k)) {
        made.insert(*k, *t);
    }
    for (&(pid, layer), &(n, b)) in &history.not_sampled {
        let key = TotalsKey { pid, device: 0, stack: None, layer, host: false };
        if wanted(&key) {
            out.not_sampled_alloc.0 += n;
            out.not_sampled_alloc.1 += b;
        }
    }
    let keys: std::collections::BTreeSet<TotalsKey> = inuse.keys().chain(made.keys()).copied().collect();
    for key in keys {
        let (a, u) = (made.get(&key).copied().unwrap_or_default(), inuse.get(&key).copied().unwrap_or_default());
        let (comm, container, pod) = who(state, history, key.pid);
        out.samples.push(HeapSample {
            pid: key.pid,
            comm,
            container,
            pod,
            device: key.device,
            host: key.host,
            layer: key.layer,
            stack: key.stack,
            frames: key.stack.map(|s| stacks.frames(s)).unwrap_or_default(),
            // A replay that began after some of the held allocations: made ≥ held.
            alloc_objects: a.est_count.max(u.est_count).round() as i64,
            alloc_space: a.est_bytes.max(u.est_bytes).round() as i64,
            inuse_objects: u.est_count.round() as i64,
            inuse_space: u.est_bytes.round() as i64,
            estimated: a.estimated || u.estimated,
        });
    }
    out.samples.sort_by(|x, y| y.inuse_space.cmp(&x.inuse_space).then(y.alloc_space.cmp(&x.alloc_space)));
    out
}

/// A process's name, container and pod (as every output names them): from
/// the state while it is kept, else the name of its main thread.
fn who(state: &State, history: &History, pid: u32) -> (String, Option<String>, Option<String>) {
    match state.processes.get(&pid) {
        Some(p) => {
            let w = super::view::Workload::of(p.container.as_ref());
            (p.comm.clone(), w.container, w.pod)
        }
        None => {
            let name = history.threads.get(&pid).map(|(_, n)| n.clone()).unwrap_or_default();
            (name, None, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::{
        events::Kind,
        state::{testing, Limits},
    };

    #[test]
    fn made_and_held_per_stack() {
        let (mut s, mut h, mut stacks) = (State::new(Limits::default()), History::default(), Stacks::default());
        let mut apply = |ev: Event, stack: Option<StackId>| {
            let kind = Kind::of(&ev);
            let applied = s.apply_kind(&ev, &kind, stack);
            h.observe(&ev, &kind, &applied, stack, 0);
        };
        apply(Event { handle: 0xc, device: 0, ..testing::ev(api::CU_CTX_CREATE_V2) }, None);
        // Stack 1: 4 made, all held (a leak); stack 2: 3 made and freed.
        for i in 0..4 {
            apply(Event { addr: 0x1000 + i, size: 10, ..testing::ev(api::CU_MEM_ALLOC_V2) }, Some(1));
        }
        for i in 0..3 {
            apply(Event { addr: 0x9000, size: 100, ..testing::ev(api::CU_MEM_ALLOC_V2) }, Some(2));
            apply(Event { addr: 0x9000, ts_ns: 2 + i, ..testing::ev(api::CU_MEM_FREE_V2) }, None);
        }
        let p = heap(&s, &h, &mut stacks, Layers::Driver);
        let got: Vec<(Option<u64>, i64, i64, i64, i64)> =
            p.samples.iter().map(|x| (x.stack, x.alloc_objects, x.alloc_space, x.inuse_objects, x.inuse_space)).collect();
        assert_eq!(got, [(Some(1), 4, 40, 4, 40), (Some(2), 3, 300, 0, 0)]);
        assert_eq!((p.samples[0].comm.as_str(), p.samples[0].device), ("python", 0));
    }
}
