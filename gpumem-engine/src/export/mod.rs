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

use crate::{analysis::leaks::LeakGroup, names::bytes};

/// A stack group's bytes and allocations, estimates marked with `~`.
pub fn group_figures(g: &LeakGroup) -> String {
    let mark = if g.estimated { "~" } else { "" };
    format!("{mark}{} in {mark}{} allocation(s)", bytes(g.bytes), g.count)
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
