//! Who asked the driver for a process's memory: each live allocation's
//! owner is the first module of its native stack outside the CUDA driver and
//! runtime (`libnccl.so.2`, `libcublasLt.so.13`, `libc10_cuda.so`, the
//! program itself). Where that module is only glue between Python and the
//! driver (libffi and ctypes, NVIDIA's Python bindings, the interpreter),
//! the owner is the file of the innermost Python frame: the Python library
//! or script that made the call.
//!
//! Bounded: the largest [`OWNERS_SHOWN`] owners per process and device,
//! then `other`; `unknown` where no stack was taken. Where stacks were
//! sampled over the budget, figures are the sampling's unbiased estimates
//! (`estimated`).
use serde::{Deserialize, Serialize};

use super::history::Totals;
use crate::{
    stacks::{Frame, Sampling, Stacks},
    state::{Memory, Process},
};

/// Owners given per process and device; the rest are summed as `other`.
pub const OWNERS_SHOWN: usize = 8;

/// One owner's share of a process's live memory on a device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OwnerBytes {
    pub owner: String,
    pub bytes: u64,
    pub allocations: u64,
    /// Sampling estimates (stacks over the budget), not exact figures.
    pub estimated: bool,
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The CUDA driver and runtime: never an owner.
fn is_driver(module: &str) -> bool {
    module.starts_with("libcuda.so") || module.starts_with("libcudart")
}

/// Between Python and the driver: the Python caller owns what passes through.
fn is_glue(module: &str) -> bool {
    module.starts_with("libffi")
        || module.starts_with("_ctypes")
        || module.starts_with("libpython")
        || module.starts_with("python")
        || (module.starts_with("cy") && module.contains(".cpython-"))
}

/// The owner of an allocation made through `frames` (innermost first).
pub fn owner(frames: &[Frame]) -> String {
    let python_file = || frames.iter().find(|f| f.python).and_then(|f| f.file.as_deref()).map(|f| basename(f).to_string());
    for f in frames.iter().filter(|f| !f.python) {
        let module = basename(&f.module);
        if is_driver(module) {
            continue;
        }
        if is_glue(module) {
            return python_file().unwrap_or_else(|| module.to_string());
        }
        return module.to_string();
    }
    python_file().unwrap_or_else(|| "unknown".to_string())
}

/// A process's live device memory (allocations and VMM handles) on each
/// device, by owner, the largest first, bounded.
pub fn by_owner(p: &Process, stacks: &mut Stacks) -> Vec<(i32, Vec<OwnerBytes>)> {
    let allocs = p.held.allocs.values().filter(|a| a.memory() == Memory::Device).map(|a| (a.device(), a.stack(), a.size, a.sampling()));
    let handles = p.held.vmm_handles.values().map(|h| (h.device, h.stack, h.size, h.sampling));
    // Not-sampled allocations are stood for by the sampled stacks' estimates.
    let mut each: Vec<_> = allocs.chain(handles).filter(|&(.., sampling)| sampling != Sampling::NotSampled).collect();
    // Summed by device and stack first, then each stack's owner found once:
    // a process has far fewer stacks than allocations, and every scrape
    // walks them. Sorted rather than hashed: most processes hold a few
    // allocations, where hash tables' allocation and growth cost more than
    // the walk itself.
    each.sort_unstable_by_key(|&(dev, stack, ..)| (dev, stack));
    let mut per_dev: Vec<(i32, Vec<(String, Totals)>)> = Vec::new();
    for run in each.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let (dev, stack) = (run[0].0, run[0].1);
        let mut t = Totals::default();
        for &(.., size, sampling) in run {
            t.add(size, sampling, stacks.sample_bytes);
        }
        let name = match stack {
            Some(id) => stacks.owner(id, owner),
            None => "unknown".to_string(),
        };
        match per_dev.last_mut() {
            Some((d, owners)) if *d == dev => owners.push((name, t)),
            _ => per_dev.push((dev, vec![(name, t)])),
        }
    }
    per_dev.into_iter().map(|(dev, owners)| (dev, bounded(merged(owners)))).collect()
}

/// Each owner once: the totals of its stacks summed (in place).
fn merged(mut owners: Vec<(String, Totals)>) -> Vec<(String, Totals)> {
    owners.sort_by(|a, b| a.0.cmp(&b.0));
    owners.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1.merge(&later.1);
        }
        same
    });
    owners
}

/// The largest owners, then `other` for the rest.
fn bounded(owners: Vec<(String, Totals)>) -> Vec<OwnerBytes> {
    let mut all: Vec<OwnerBytes> = owners
        .into_iter()
        .map(|(owner, t)| OwnerBytes {
            owner,
            bytes: if t.estimated { t.est_bytes.round() as u64 } else { t.bytes },
            allocations: if t.estimated { t.est_count.round() as u64 } else { t.count },
            estimated: t.estimated,
        })
        .collect();
    all.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.owner.cmp(&b.owner)));
    if all.len() > OWNERS_SHOWN {
        let rest = all.split_off(OWNERS_SHOWN);
        all.push(OwnerBytes {
            owner: "other".into(),
            bytes: rest.iter().map(|o| o.bytes).sum(),
            allocations: rest.iter().map(|o| o.allocations).sum(),
            estimated: rest.iter().any(|o| o.estimated),
        });
    }
    all
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn native(module: &str) -> Frame {
        Frame { function: None, offset: None, file: None, line: None, module: Arc::from(module), module_offset: 0, python: false }
    }

    fn python(file: &str) -> Frame {
        Frame { python: true, file: Some(file.into()), function: Some("step".into()), line: Some(3), ..native("/usr/bin/python3.11") }
    }

    #[test]
    fn the_owner_is_the_first_module_outside_the_driver_or_the_python_caller_behind_glue() {
        let nccl = [native("/usr/lib/libcuda.so.1"), native("/opt/nccl/lib/libnccl.so.2"), native("/usr/lib/libtorch_cuda.so")];
        assert_eq!(owner(&nccl), "libnccl.so.2");
        let cudart = [native("/usr/lib/libcuda.so.1"), native("/usr/local/cuda/lib64/libcudart.so.13"), native("/x/libcublasLt.so.13")];
        assert_eq!(owner(&cudart), "libcublasLt.so.13");
        let ctypes =
            [native("/usr/lib/libcuda.so.1"), native("/usr/lib/libffi.so.8"), python("/srv/arraylib/core.py"), python("/srv/train.py")];
        assert_eq!(owner(&ctypes), "core.py");
        let bindings =
            [native("/fake/libcuda.so.1"), native("/venv/cuda/bindings/cydriver.cpython-311-x86_64-linux-gnu.so"), python("/srv/loop.py")];
        assert_eq!(owner(&bindings), "loop.py");
        assert_eq!(owner(&[native("/usr/lib/libcuda.so.1")]), "unknown");
        assert_eq!(owner(&[native("/usr/lib/libcuda.so.1"), native("/opt/app/workload")]), "workload");
    }

    #[test]
    fn owners_beyond_the_largest_are_summed_as_other() {
        let owners: Vec<(String, Totals)> = (0..12u64)
            .map(|i| {
                let mut t = Totals::default();
                t.add((i + 1) << 20, Sampling::Every, 0);
                (format!("lib{i}.so"), t)
            })
            .collect();
        let b = bounded(owners);
        assert_eq!(b.len(), OWNERS_SHOWN + 1);
        assert_eq!((b[0].owner.as_str(), b[0].bytes), ("lib11.so", 12 << 20));
        let other = b.last().unwrap();
        assert_eq!((other.owner.as_str(), other.bytes, other.allocations), ("other", (1 + 2 + 3 + 4) << 20, 4));
    }

    #[test]
    fn stacks_of_one_owner_are_summed_once() {
        let t = |mib: u64| {
            let mut t = Totals::default();
            t.add(mib << 20, Sampling::Every, 0);
            t
        };
        let m = merged(vec![("b.so".into(), t(1)), ("a.so".into(), t(2)), ("b.so".into(), t(4)), ("unknown".into(), t(8))]);
        let got: Vec<(&str, u64, u64)> = m.iter().map(|(o, t)| (o.as_str(), t.bytes >> 20, t.count)).collect();
        assert_eq!(got, [("a.so", 2, 1), ("b.so", 5, 2), ("unknown", 8, 1)]);
    }
}
