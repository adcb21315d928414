//! The agent's side of the kernel's table of live entries
//! (`gpumem_common::live`): read whole when pinned state is adopted, the
//! stack id and device written back as events are applied, and the entries
//! of processes that are gone removed.
use gpumem_common::names::map;
use std::collections::BTreeMap;

use aya::maps::{HashMap as BpfHashMap, MapData};
use gpumem_common::live::{LiveEntry, LiveKey};
use gpumem_engine::model::agent::KernelTable;

use super::Agent;

/// BPF_EXIST: update an entry only if it is still there (a free may have
/// removed it meanwhile).
const BPF_EXIST: u64 = 2;

impl Agent {
    fn live_map(&self) -> Option<BpfHashMap<&MapData, LiveKey, LiveEntry>> {
        self.options.kernel_table?;
        BpfHashMap::try_from(self.ebpf.map(map::LIVE)?).ok()
    }

    fn live_map_mut(&mut self) -> Option<BpfHashMap<&mut MapData, LiveKey, LiveEntry>> {
        self.options.kernel_table?;
        BpfHashMap::try_from(self.ebpf.map_mut(map::LIVE)?).ok()
    }

    /// Every entry of the table (an entry removed while the walk runs may
    /// end it early: the ring then has its events).
    pub fn live_entries(&self) -> Vec<(LiveKey, LiveEntry)> {
        self.live_map().map(|m| m.iter().filter_map(Result::ok).collect()).unwrap_or_default()
    }

    /// Entries of each process that did not fit in the table.
    pub fn live_missed(&self) -> BTreeMap<u32, u64> {
        let Some(Ok(m)) = self.ebpf.map(map::LIVE_MISSED).map(BpfHashMap::<_, u32, u64>::try_from) else { return BTreeMap::new() };
        m.iter().filter_map(Result::ok).collect()
    }

    /// Writes what the agent learned about an entry (its stack id, its
    /// device) into it, if the entry is still there.
    pub fn live_write_back(&mut self, key: &LiveKey, entry: &LiveEntry) {
        if let Some(mut m) = self.live_map_mut() {
            let _ = m.insert(key, entry, BPF_EXIST);
        }
    }

    /// Removes the entries (and missed counts) of processes for which
    /// `gone` is true; how many entries.
    pub fn remove_live_of(&mut self, mut gone: impl FnMut(u32) -> bool) -> usize {
        let Some(mut m) = self.live_map_mut() else { return 0 };
        let stale: Vec<LiveKey> = m.keys().filter_map(Result::ok).filter(|k| gone(k.tgid)).collect();
        let removed = stale.iter().filter(|k| m.remove(k).is_ok()).count();
        if let Some(Ok(mut missed)) = self.ebpf.map_mut(map::LIVE_MISSED).map(BpfHashMap::<_, u32, u64>::try_from) {
            let pids: Vec<u32> = missed.keys().filter_map(Result::ok).filter(|&p| gone(p)).collect();
            for pid in pids {
                let _ = missed.remove(&pid);
            }
        }
        removed
    }

    /// How full the table is (one walk of its keys).
    pub fn kernel_table(&self) -> Option<KernelTable> {
        let max = self.options.kernel_table?;
        let entries = self.live_map()?.keys().filter_map(Result::ok).count() as u64;
        Some(KernelTable { entries, max_entries: max as u64, bytes: entries * gpumem_common::live::BYTES_PER_ENTRY })
    }
}
