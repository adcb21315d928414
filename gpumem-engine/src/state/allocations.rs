//! One process's live allocations: most of the agent's memory on a busy
//! host (a million live allocations is normal), so each is packed into a
//! 26-byte slot (its address, size, time and a 16-bit site index), and
//! what many allocations share (stack, context, device, kind of memory, how
//! the stack was taken) is kept once per process as a site. Readers get the
//! whole `Allocation` back by value.
use std::{
    hash::{BuildHasher, Hash},
    num::NonZeroU64,
};

use hashbrown::hash_table::{Entry, HashTable};
use rustc_hash::FxBuildHasher;

use super::process::HashMap;
use crate::stacks::{Sampling, StackId};

const _: () = assert!(std::mem::size_of::<Allocation>() == 32, "tensors keep it whole: keep it packed");
const _: () = assert!(std::mem::size_of::<(Addr, Slot)>() == 26, "a million live allocations: keep the slot packed");

/// Where an allocation lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Memory {
    Device,
    /// Page-locked host memory (cuMemHostAlloc/cuMemAllocHost): host RAM, not VRAM.
    HostPinned,
}

/// One live allocation, as readers see it (and as tensors are kept whole).
#[derive(Clone, Copy, Debug)]
pub struct Allocation {
    pub size: u64,
    pub ts_ns: u64,
    /// What it shares with allocations like it.
    site: Site,
}

impl Allocation {
    pub fn new(size: u64, device: i32, memory: Memory, ctx: u32, ts_ns: u64, stack: Option<StackId>, sampling: Sampling) -> Self {
        let stack = stack.map(|s| NonZeroU64::new(s).unwrap_or(NonZeroU64::MIN));
        Allocation { size, ts_ns, site: Site { stack, ctx, device: pack_device(device), memory, sampling } }
    }
    pub fn device(&self) -> i32 {
        self.site.device as i32
    }
    pub fn set_device(&mut self, device: i32) {
        self.site.device = pack_device(device);
    }
    pub fn stack(&self) -> Option<StackId> {
        self.site.stack.map(NonZeroU64::get)
    }
    pub fn set_stack(&mut self, stack: StackId) {
        self.site.stack = Some(NonZeroU64::new(stack).unwrap_or(NonZeroU64::MIN));
    }
    /// The context current when it was made (an index into `Contexts::ids`); destroyed with it.
    pub fn ctx(&self) -> u32 {
        self.site.ctx
    }
    pub fn memory(&self) -> Memory {
        self.site.memory
    }
    /// How its stack was taken (budget, sampled, not sampled).
    pub fn sampling(&self) -> Sampling {
        self.site.sampling
    }
}

/// A device ordinal in 16 bits; one that does not fit is unknown (the state
/// turns such ordinals into DEVICE_UNKNOWN before they get here).
fn pack_device(device: i32) -> i16 {
    i16::try_from(device).unwrap_or(gpumem_common::DEVICE_UNKNOWN as i16)
}

/// What allocations made at one call site, in one context, share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Site {
    /// The caller's stack id, when it was captured and unwound (ids are hashes; 0 is mapped to 1).
    stack: Option<NonZeroU64>,
    ctx: u32,
    /// CUdevice ordinal (DEVICE_UNKNOWN is -1); ordinals fit in 16 bits.
    device: i16,
    memory: Memory,
    sampling: Sampling,
}

impl Hash for Site {
    // Two words, not the five fields and their discriminants one by one:
    // a site is hashed for every allocation that is not at the last one's.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(self.stack.map_or(0, NonZeroU64::get));
        h.write_u64(
            self.ctx as u64 | (self.device as u16 as u64) << 32 | (self.memory as u8 as u64) << 48 | (self.sampling as u8 as u64) << 56,
        );
    }
}

/// An address, 2-byte aligned so that a slot has no padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C, packed(2))]
struct Addr(u64);

#[derive(Clone, Copy, Debug)]
#[repr(C, packed(2))]
struct Slot {
    size: u64,
    ts_ns: u64,
    /// Index into `Sites`, or OVERFLOW.
    site: u16,
}

/// The slot's site is in `Allocations::overflow`: every index was taken.
const OVERFLOW: u16 = u16::MAX;

/// The live allocations of one process, by address.
#[derive(Clone, Debug, Default)]
pub struct Allocations {
    slots: HashMap<Addr, Slot>,
    sites: Sites,
}

impl Allocations {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn get(&self, addr: u64) -> Option<Allocation> {
        self.slots.get(&Addr(addr)).map(|s| self.sites.whole(addr, s))
    }

    /// Keeps `a` at `addr`; the allocation it replaces, if any.
    pub fn insert(&mut self, addr: u64, a: Allocation) -> Option<Allocation> {
        use std::collections::hash_map::Entry;
        let sites = &mut self.sites;
        match self.slots.entry(Addr(addr)) {
            Entry::Vacant(e) => {
                e.insert(Slot { size: a.size, ts_ns: a.ts_ns, site: sites.take(addr, a.site) });
                None
            }
            Entry::Occupied(mut e) => {
                let old = *e.get();
                let whole = sites.whole(addr, &old);
                sites.let_go(addr, old.site);
                e.insert(Slot { size: a.size, ts_ns: a.ts_ns, site: sites.take(addr, a.site) });
                Some(whole)
            }
        }
    }

    pub fn remove(&mut self, addr: u64) -> Option<Allocation> {
        let old = self.slots.remove(&Addr(addr))?;
        let whole = self.sites.whole(addr, &old);
        self.sites.let_go(addr, old.site);
        Some(whole)
    }

    /// Sets the stack of the allocation at `addr`; its device, if held.
    pub fn set_stack(&mut self, addr: u64, stack: StackId) -> Option<i32> {
        let slot = self.slots.get_mut(&Addr(addr))?;
        let mut a = self.sites.whole(addr, slot);
        a.set_stack(stack);
        self.sites.let_go(addr, slot.site);
        slot.site = self.sites.take(addr, a.site);
        Some(a.device())
    }

    /// Moves the device memory held on an unknown device to `device`.
    pub fn assume_device(&mut self, device: i32) {
        use gpumem_common::DEVICE_UNKNOWN;
        for (addr, slot) in self.slots.iter_mut() {
            let mut a = self.sites.whole(addr.0, slot);
            if a.memory() == Memory::Device && a.device() == DEVICE_UNKNOWN {
                a.set_device(device);
                self.sites.let_go(addr.0, slot.site);
                slot.site = self.sites.take(addr.0, a.site);
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, Allocation)> + '_ {
        self.slots.iter().map(|(addr, s)| (addr.0, self.sites.whole(addr.0, s)))
    }

    pub fn values(&self) -> impl Iterator<Item = Allocation> + '_ {
        self.iter().map(|(_, a)| a)
    }

    /// Distinct sites the allocations point to by index.
    pub fn sites(&self) -> usize {
        let s = &self.sites;
        let idle_last = s.last.is_some_and(|i| s.refs[i as usize] == 0);
        s.sites.len() - s.free.len() - usize::from(idle_last)
    }

    /// What the table takes on the heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        use crate::heap::{hash_table, vec};
        let s = &self.sites;
        hash_table::<Addr, Slot>(self.slots.capacity())
            + vec::<Site>(s.sites.capacity())
            + vec::<u32>(s.refs.capacity())
            + vec::<u16>(s.free.capacity())
            + hash_table::<u16, ()>(s.index.capacity())
            + hash_table::<u64, Site>(s.overflow.capacity())
    }
}

/// Sites, interned, each with the count of allocations pointing to it; one
/// no allocation points to any more is forgotten (its index reused), except
/// the last one interned, until another is: a process that allocates and
/// frees at one site in turn (a temporary per step) finds it there again.
#[derive(Clone, Debug, Default)]
struct Sites {
    sites: Vec<Site>,
    refs: Vec<u32>,
    /// Indices into `sites`, found by the site's hash.
    index: HashTable<u16>,
    free: Vec<u16>,
    /// The index interned last: allocations in a row mostly share a site.
    /// Kept while no allocation points to it (see above).
    last: Option<u16>,
    /// The sites of allocations made while all 65 535 indices were taken
    /// (a process with that many distinct call sites live), by address.
    overflow: HashMap<u64, Site>,
}

impl Sites {
    /// The allocation at `addr` whose slot is `s`.
    fn whole(&self, addr: u64, s: &Slot) -> Allocation {
        let site = match s.site {
            OVERFLOW => self.overflow.get(&addr).copied().expect("an overflowing slot's site is kept"),
            i => self.sites[i as usize],
        };
        Allocation { size: s.size, ts_ns: s.ts_ns, site }
    }

    /// The index of `site` for the allocation at `addr`, counting one more allocation there.
    #[inline]
    fn take(&mut self, addr: u64, site: Site) -> u16 {
        if let Some(i) = self.last.filter(|&i| self.sites[i as usize] == site) {
            self.refs[i as usize] += 1;
            return i;
        }
        match self.intern(site) {
            Some(i) => {
                if let Some(idle) = self.last.replace(i).filter(|&l| self.refs[l as usize] == 0) {
                    self.forget(idle);
                }
                i
            }
            None => {
                self.overflow.insert(addr, site);
                OVERFLOW
            }
        }
    }

    /// The allocation at `addr` no longer points to site `i`.
    fn let_go(&mut self, addr: u64, i: u16) {
        if i == OVERFLOW {
            self.overflow.remove(&addr);
            return;
        }
        let refs = &mut self.refs[i as usize];
        *refs -= 1;
        if *refs == 0 && self.last != Some(i) {
            self.forget(i);
        }
    }

    /// Site `i`, which no allocation points to, is forgotten and its index free.
    fn forget(&mut self, i: u16) {
        if let Ok(e) = self.index.find_entry(Self::hash(&self.sites[i as usize]), |&j| j == i) {
            e.remove();
        }
        self.free.push(i);
    }

    fn hash(site: &Site) -> u64 {
        FxBuildHasher.hash_one(site)
    }

    /// The index of `site`, counting one more allocation there; None when
    /// it is new and every index is taken. Out of line: most allocations
    /// are at the last one's site.
    #[inline(never)]
    fn intern(&mut self, site: Site) -> Option<u16> {
        let sites = &self.sites;
        let entry = self.index.entry(Self::hash(&site), |&i| sites[i as usize] == site, |&i| Self::hash(&sites[i as usize]));
        match entry {
            Entry::Occupied(e) => {
                let i = *e.get();
                self.refs[i as usize] += 1;
                Some(i)
            }
            Entry::Vacant(e) => {
                let i = match self.free.pop() {
                    Some(i) => {
                        self.sites[i as usize] = site;
                        self.refs[i as usize] = 1;
                        i
                    }
                    None if self.sites.len() < OVERFLOW as usize => {
                        self.sites.push(site);
                        self.refs.push(1);
                        (self.sites.len() - 1) as u16
                    }
                    None => return None,
                };
                e.insert(i);
                Some(i)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(size: u64, device: i32, stack: Option<u64>) -> Allocation {
        Allocation::new(size, device, Memory::Device, 0, size, stack, Sampling::Every)
    }

    #[test]
    fn allocations_at_one_site_share_it_and_it_goes_with_the_last() {
        let mut t = Allocations::default();
        for i in 0..100 {
            assert!(t.insert(0x1000 * i, alloc(i, 0, Some(7))).is_none());
        }
        t.insert(0xdead_0000, alloc(5, 1, Some(8)));
        assert_eq!((t.len(), t.sites()), (101, 2));
        let a = t.get(0x1000 * 42).expect("held");
        assert_eq!((a.size, a.ts_ns, a.device(), a.stack(), a.ctx(), a.memory()), (42, 42, 0, Some(7), 0, Memory::Device));
        for i in 0..100 {
            assert_eq!(t.remove(0x1000 * i).map(|a| a.size), Some(i));
        }
        assert_eq!((t.len(), t.sites()), (1, 1));
        assert_eq!(t.remove(0xdead_0000).map(|a| (a.device(), a.stack())), Some((1, Some(8))));
        assert_eq!((t.len(), t.sites(), t.remove(0x1000).is_none()), (0, 0, true));
    }

    #[test]
    fn a_replaced_allocation_comes_back_whole_and_its_site_is_reused() {
        let mut t = Allocations::default();
        t.insert(0x10, alloc(1, 0, Some(1)));
        let old = t.insert(0x10, alloc(2, 3, None)).expect("replaced");
        assert_eq!((old.size, old.device(), old.stack()), (1, 0, Some(1)));
        assert_eq!((t.len(), t.sites()), (1, 1));
        // The freed index is taken again, and found again by its site.
        t.insert(0x20, alloc(3, 0, Some(1)));
        t.insert(0x30, alloc(4, 0, Some(1)));
        assert_eq!((t.sites(), t.sites.sites.len()), (2, 2));
    }

    #[test]
    fn a_site_allocated_and_freed_in_turn_stays_interned_until_another_is() {
        let mut t = Allocations::default();
        for i in 0..3 {
            t.insert(0x10, alloc(1, 0, Some(4)));
            assert_eq!((t.len(), t.sites()), (1, 1));
            assert!(t.remove(0x10).is_some());
            assert_eq!((t.len(), t.sites(), t.sites.index.len(), t.sites.free.len()), (0, 0, 1, 0), "round {i}");
        }
        // Another site interned: the idle one is forgotten and its index reused.
        t.insert(0x20, alloc(1, 0, Some(5)));
        assert_eq!((t.sites(), t.sites.index.len(), t.sites.free.len()), (1, 1, 1));
        t.insert(0x30, alloc(1, 0, Some(6)));
        assert_eq!((t.sites(), t.sites.sites.len(), t.sites.free.len()), (2, 2, 0));
        assert_eq!((t.get(0x20).and_then(|a| a.stack()), t.get(0x30).and_then(|a| a.stack())), (Some(5), Some(6)));
    }

    #[test]
    fn changing_one_allocation_moves_it_alone_to_its_new_site() {
        let mut t = Allocations::default();
        t.insert(0x10, alloc(1, 0, None));
        t.insert(0x20, alloc(2, 0, None));
        assert_eq!(t.set_stack(0x10, 9), Some(0));
        assert_eq!(t.set_stack(0x99, 9), None);
        assert_eq!((t.get(0x10).and_then(|a| a.stack()), t.get(0x20).and_then(|a| a.stack()), t.sites()), (Some(9), None, 2));
        // Stack id 0 is kept as 1 (ids are hashes).
        t.set_stack(0x20, 0);
        assert_eq!(t.get(0x20).and_then(|a| a.stack()), Some(1));
    }

    #[test]
    fn memory_on_an_unknown_device_moves_to_the_assumed_one_and_pinned_memory_stays() {
        use gpumem_common::DEVICE_UNKNOWN;
        let mut t = Allocations::default();
        t.insert(0x10, alloc(1, DEVICE_UNKNOWN, Some(1)));
        t.insert(0x20, alloc(2, 2, Some(1)));
        t.insert(0x30, Allocation::new(3, DEVICE_UNKNOWN, Memory::HostPinned, 0, 3, None, Sampling::Every));
        t.assume_device(2);
        let devices: std::collections::BTreeMap<u64, i32> = t.iter().map(|(k, a)| (k, a.device())).collect();
        assert_eq!(devices, [(0x10, 2), (0x20, 2), (0x30, DEVICE_UNKNOWN)].into());
        assert_eq!(t.sites(), 2, "the moved allocation joins the site already there");
    }

    #[test]
    fn beyond_65_535_sites_each_allocation_keeps_its_own_and_nothing_is_lost() {
        let mut t = Allocations::default();
        let n = 70_000u64;
        for i in 1..=n {
            t.insert(i << 12, alloc(i, 0, Some(i)));
        }
        assert_eq!((t.len(), t.sites(), t.sites.overflow.len()), (n as usize, 65_535, 4_465));
        assert!(t.iter().all(|(addr, a)| a.stack() == Some(addr >> 12) && a.size == addr >> 12));
        // An overflowing allocation changed, replaced and freed like any other.
        assert_eq!(t.set_stack(n << 12, 5), Some(0));
        assert_eq!(t.get(n << 12).and_then(|a| a.stack()), Some(5));
        assert_eq!(t.insert(n << 12, alloc(1, 2, Some(6))).map(|a| a.size), Some(n));
        for i in 1..=n {
            assert!(t.remove(i << 12).is_some());
        }
        assert_eq!((t.len(), t.sites(), t.sites.overflow.len()), (0, 0, 0));
    }

    #[test]
    fn device_ordinals_beyond_16_bits_are_unknown() {
        assert_eq!(alloc(1, 1 << 20, None).device(), gpumem_common::DEVICE_UNKNOWN);
    }
}
