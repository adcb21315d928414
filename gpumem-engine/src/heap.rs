//! What the agent's own tables hold on the heap, estimated from their
//! capacities (a hash table's buckets with one control byte each, a vector's
//! capacity, a B-tree's entries in nodes about two-thirds full), so that
//! `/metrics` and `status` can say which part of the agent's memory is whose.
//! Estimates of the tables, not of everything they point to: what is not
//! counted shows as the heap's unattributed rest.
use std::mem::size_of;

/// A hashbrown table (std's and rustc-hash's maps) of `capacity` items.
pub fn hash_table<K, V>(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    // hashbrown: 7/8 full at most past 8 buckets; a power of two.
    let buckets = if capacity < 8 { (capacity + 1).next_power_of_two() } else { (capacity * 8).div_ceil(7).next_power_of_two() };
    (buckets * (size_of::<(K, V)>() + 1)) as u64
}

/// A vector (or VecDeque) of `capacity` items.
pub fn vec<T>(capacity: usize) -> u64 {
    (capacity * size_of::<T>()) as u64
}

/// A BTreeMap of `len` entries.
pub fn btree<K, V>(len: usize) -> u64 {
    (len * (size_of::<K>() + size_of::<V>()) * 3 / 2) as u64
}

/// A string's heap bytes.
pub fn string(s: &str) -> u64 {
    s.len() as u64
}

/// The agent's heap, by owner (estimates, see the module).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Parts {
    /// Live allocations, handles, mappings and the processes holding them.
    pub state: u64,
    /// Native stacks: unwound frames by stack id, symbolized frames, owners.
    pub stacks: u64,
    /// Libraries' unwind tables (.eh_frame, .debug_frame) read for unwinding.
    #[serde(default)]
    pub unwind: u64,
    /// Python frames per stack and each interpreter's code-object cache.
    pub python: u64,
    /// Growth series (processes, devices, stack groups).
    pub growth: u64,
    /// What exports and reports keep beyond the state (per-stack totals, call logs).
    pub history: u64,
}

impl Parts {
    /// Each part with its label, in order.
    pub fn labelled(&self) -> [(&'static str, u64); 6] {
        [
            ("state", self.state),
            ("stacks", self.stacks),
            ("unwind", self.unwind),
            ("python", self.python),
            ("growth", self.growth),
            ("history", self.history),
        ]
    }

    pub fn total(&self) -> u64 {
        self.labelled().iter().map(|(_, b)| b).sum()
    }

    /// What of the allocator's `in_use` bytes no part accounts for.
    pub fn unattributed(&self, in_use: u64) -> u64 {
        in_use.saturating_sub(self.total())
    }
}

/// One of the agent's caches: what it holds, the most it may hold, and the
/// entries it has let go to stay within that (each starts over when full:
/// what it let go is read or computed again when asked).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cache {
    pub name: String,
    pub entries: u64,
    pub max_entries: u64,
    pub evicted: u64,
}

impl Cache {
    pub fn new(name: &str, entries: usize, max_entries: usize, evicted: u64) -> Self {
        Cache { name: name.to_string(), entries: entries as u64, max_entries: max_entries as u64, evicted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_tables_estimate_follows_its_buckets() {
        assert_eq!(hash_table::<u64, u64>(0), 0);
        // 3 items fit in 4 buckets; 14 in 16; 15 need 32.
        assert_eq!(hash_table::<u64, u64>(3), 4 * 17);
        assert_eq!(hash_table::<u64, u64>(14), 16 * 17);
        assert_eq!(hash_table::<u64, u64>(15), 32 * 17);
        let mut m: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        m.extend((0..1000).map(|i| (i, i)));
        // hashbrown's capacity is the items its buckets hold: the estimate of 1000 items is at most that.
        assert!(hash_table::<u64, u64>(m.capacity()) <= hash_table::<u64, u64>(1000) * 2);
    }
}
