//! Outputs: they render state and events, they never compute.
pub mod health;
pub mod leaks;
pub mod otlp;
pub mod perfetto;
pub mod pickle;
pub mod pprof;
pub mod prometheus;
pub mod report;
pub mod summary;
pub mod top;
pub mod torch_snapshot;
pub mod trace;

use crate::{
    analysis::{
        growth::{Finding, Verdict},
        leaks::LeakGroup,
    },
    names::bytes,
};

/// A stack group's bytes and allocations, estimates marked with `~`.
pub fn group_figures(g: &LeakGroup) -> String {
    let mark = if g.estimated { "~" } else { "" };
    format!("{mark}{} in {mark}{} allocation(s)", bytes(g.bytes), g.count)
}

/// A verdict's figures in words: why, its rate, confidence and how long.
pub fn verdict_figures(v: &Verdict) -> String {
    match v.verdict {
        Finding::Leak | Finding::CacheGrowth => {
            format!("{}, {}/s for {:.0} s, confidence {:.2}", v.reason, bytes(v.rate_bytes_per_s.max(0.0) as u64), v.for_s, v.confidence)
        }
        Finding::Plateau => format!("{} grown, then no growth for {:.0} s", bytes(v.growth_bytes.max(0) as u64), v.for_s),
        Finding::Insufficient if v.rate_bytes_per_s > 0.0 => {
            format!("{}: {}/s for {:.0} s", v.reason, bytes(v.rate_bytes_per_s as u64), v.for_s)
        }
        Finding::None | Finding::Insufficient => v.reason.clone(),
    }
}

/// Memory by owner in words: `libnccl.so.2 544.0 MiB, train.py ~12.0 MiB` (`~`: estimates).
pub fn owners_line(owners: &[crate::analysis::owners::OwnerBytes]) -> String {
    let each: Vec<String> = owners
        .iter()
        .map(|o| format!("{} {}{}", crate::names::printable(&o.owner), if o.estimated { "~" } else { "" }, bytes(o.bytes)))
        .collect();
    each.join(", ")
}

/// The lines that say where a process's memory on a device went: by owner,
/// by pool, and what it maps of other processes (nothing for an empty part).
pub fn breakdown_lines(b: &crate::analysis::breakdown::Breakdown) -> Vec<String> {
    let mut lines = Vec::new();
    if !b.by_owner.is_empty() {
        lines.push(format!("by owner: {}", owners_line(&b.by_owner)));
    }
    if !b.pools.is_empty() {
        let each: Vec<String> = b
            .pools
            .iter()
            .map(|p| {
                let trims = if p.trims > 0 { format!(", trimmed {}×", p.trims) } else { String::new() };
                let destroyed = if p.destroyed { ", destroyed" } else { "" };
                format!("{} {} in {}{trims}{destroyed}", p.pool, bytes(p.bytes), p.allocations)
            })
            .collect();
        lines.push(format!("pools (live allocations; what a pool keeps beyond them is the driver's): {}", each.join(", ")));
    }
    if !b.imported.is_empty() {
        let each: Vec<String> = b
            .imported
            .iter()
            .map(|i| {
                let via = match i.via {
                    crate::state::Via::Ipc => "IPC",
                    crate::state::Via::PoolPointer => "pool pointer",
                    crate::state::Via::ShareableHandle => "shareable handle",
                };
                let from = match i.pid {
                    Some(pid) => format!("pid {pid} ({})", crate::names::printable(&i.comm)),
                    None if i.comm == "other" => "others".to_string(),
                    None => "an exporter not seen (bytes unknown)".to_string(),
                };
                format!("{} from {from} by {via} in {}", bytes(i.bytes), i.mappings)
            })
            .collect();
        lines.push(format!(
            "imported {} (the exporters' memory, not in this process's bytes): {}",
            bytes(b.imported_bytes),
            each.join(", ")
        ));
    }
    if let Some(g) = &b.graph_pool {
        let trims = if g.trims > 0 { format!(", trimmed {}×", g.trims) } else { String::new() };
        lines.push(format!(
            "graph pool: {} declared by {} allocation node(s) of {} graph(s){trims} (what the pool physically holds is the driver's)",
            bytes(g.bytes),
            g.nodes,
            g.graphs
        ));
    }
    if !b.multicast.is_empty() {
        let each: Vec<String> = b
            .multicast
            .iter()
            .map(|m| {
                format!(
                    "{} of {} on {}/{} devices: {} bound here",
                    m.handle,
                    bytes(m.size),
                    m.devices_added,
                    m.devices,
                    bytes(m.bound_bytes)
                )
            })
            .collect();
        lines.push(format!("multicast (its own handles, already counted): {}", each.join(", ")));
    }
    match (&b.overhead.bytes, &b.overhead.reason) {
        (Some(o), _) => lines.push(format!(
            "overhead (NVML's {} minus everything traced: context, modules, driver and pool reserves): {}",
            bytes(b.overhead.nvml_bytes.unwrap_or(0)),
            signed_bytes(*o)
        )),
        (None, Some(why)) if !b.by_owner.is_empty() => lines.push(format!("overhead: not known ({why})")),
        _ => {}
    }
    if let Some(s) = &b.suspension {
        let what = match s.state {
            crate::state::Suspension::Locked => "locked by a checkpointing tool",
            crate::state::Suspension::Checkpointed => "CHECKPOINTED: its memory is off the GPU, suspended (not freed, not a leak)",
            crate::state::Suspension::Restored => "restored, still locked",
        };
        lines.push(format!("{what} (pid {})", s.by_pid));
    }
    lines
}

/// Bytes that may be negative (traced memory NVML does not count).
fn signed_bytes(v: i64) -> String {
    if v < 0 {
        format!("-{}", bytes(v.unsigned_abs()))
    } else {
        bytes(v as u64)
    }
}

/// A group's own verdict after its figures: ` — LEAK (growing, ...)`; nothing where it has none.
pub fn group_verdict(g: &LeakGroup) -> String {
    match &g.verdict {
        Some(v) if v.verdict == Finding::Leak => format!(" — LEAK ({})", verdict_figures(v)),
        Some(v) => format!(" — {} ({})", v.verdict.name(), verdict_figures(v)),
        None => String::new(),
    }
}

/// The line that says what the `~` figures stand for, where some stacks
/// were not sampled.
pub fn not_sampled_note(allocs: u64, size: u64) -> Option<String> {
    (allocs > 0).then(|| {
        format!(
            "{} in {allocs} allocation(s) over the stack budget were not sampled: the ~ figures are unbiased estimates that include them",
            bytes(size)
        )
    })
}
