//! Where a process's memory on a device went, for people: one line per
//! part of its breakdown (by owner, pools, imports, graph pool, multicast,
//! overhead, a checkpoint), nothing for an empty part.
use super::{bytes, owners_line};
use crate::{
    analysis::breakdown::{Breakdown, GraphPool, ImportedFrom, MulticastBytes, Overhead, PoolBytes, SuspensionOf},
    names::printable,
    state::{Suspension, Via},
};

pub fn breakdown_lines(b: &Breakdown) -> Vec<String> {
    let mut lines = Vec::new();
    if !b.by_owner.is_empty() {
        lines.push(format!("by owner: {}", owners_line(&b.by_owner)));
    }
    lines.extend(beyond_owners(b));
    lines
}

/// The lines after the owners'.
pub fn beyond_owners(b: &Breakdown) -> Vec<String> {
    let mut lines = Vec::new();
    if !b.pools.is_empty() {
        lines.push(pools_line(&b.pools));
    }
    if !b.imported.is_empty() {
        lines.push(imports_line(b.imported_bytes, &b.imported));
    }
    lines.extend(b.graph_pool.as_deref().map(graph_line));
    if !b.multicast.is_empty() {
        lines.push(multicast_line(&b.multicast));
    }
    lines.extend(overhead_line(&b.overhead, !b.by_owner.is_empty()));
    lines.extend(b.suspension.as_ref().map(suspension_line));
    lines
}

fn pools_line(pools: &[PoolBytes]) -> String {
    let each: Vec<String> = pools
        .iter()
        .map(|p| {
            let trims = if p.trims > 0 { format!(", trimmed {}×", p.trims) } else { String::new() };
            let destroyed = if p.destroyed { ", destroyed" } else { "" };
            format!("{} {} in {}{trims}{destroyed}", p.pool, bytes(p.bytes), p.allocations)
        })
        .collect();
    format!("pools (live allocations; what a pool keeps beyond them is the driver's): {}", each.join(", "))
}

fn imports_line(total: u64, imported: &[ImportedFrom]) -> String {
    let each: Vec<String> = imported
        .iter()
        .map(|i| {
            let via = match i.via {
                Via::Ipc => "IPC",
                Via::PoolPointer => "pool pointer",
                Via::ShareableHandle => "shareable handle",
            };
            let from = match i.pid {
                Some(pid) => format!("pid {pid} ({})", printable(&i.comm)),
                None if i.comm == "other" => "others".to_string(),
                None => "an exporter not seen (bytes unknown)".to_string(),
            };
            format!("{} from {from} by {via} in {}", bytes(i.bytes), i.mappings)
        })
        .collect();
    format!("imported {} (the exporters' memory, not in this process's bytes): {}", bytes(total), each.join(", "))
}

fn graph_line(g: &GraphPool) -> String {
    let trims = if g.trims > 0 { format!(", trimmed {}×", g.trims) } else { String::new() };
    format!(
        "graph pool: {} declared by {} allocation node(s) of {} graph(s){trims} (what the pool physically holds is the driver's)",
        bytes(g.bytes),
        g.nodes,
        g.graphs
    )
}

fn multicast_line(multicast: &[MulticastBytes]) -> String {
    let each: Vec<String> = multicast
        .iter()
        .map(|m| {
            format!("{} of {} on {}/{} devices: {} bound here", m.handle, bytes(m.size), m.devices_added, m.devices, bytes(m.bound_bytes))
        })
        .collect();
    format!("multicast (its own handles, already counted): {}", each.join(", "))
}

/// The overhead, or why it is not known (said only beside memory of its own).
fn overhead_line(o: &Overhead, has_memory: bool) -> Option<String> {
    match (o.bytes, &o.reason) {
        (Some(v), _) => Some(format!(
            "overhead (NVML's {} minus everything traced: context, modules, driver and pool reserves): {}",
            bytes(o.nvml_bytes.unwrap_or(0)),
            signed_bytes(v)
        )),
        (None, Some(why)) if has_memory => Some(format!("overhead: not known ({why})")),
        _ => None,
    }
}

fn suspension_line(s: &SuspensionOf) -> String {
    let what = match s.state {
        Suspension::Locked => "locked by a checkpointing tool",
        Suspension::Checkpointed => "CHECKPOINTED: its memory is off the GPU, suspended (not freed, not a leak)",
        Suspension::Restored => "restored, still locked",
    };
    format!("{what} (pid {})", s.by_pid)
}

/// Bytes that may be negative (traced memory NVML does not count).
fn signed_bytes(v: i64) -> String {
    if v < 0 {
        format!("-{}", bytes(v.unsigned_abs()))
    } else {
        bytes(v as u64)
    }
}
