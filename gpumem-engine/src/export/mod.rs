//! Outputs: they render state and events, they never compute.
pub mod breakdown;
pub mod flame;
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

pub use breakdown::breakdown_lines;

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
