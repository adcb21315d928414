//! gpumem's engine as a library: the CLI (main.rs), the benchmarks and the
//! property tests all link it, so what is measured and fuzzed is what ships.
//!
//! Data flows one way: probes → events → pipeline → state → analyses →
//! outputs (export), driven live by `runtime` or from a recording.
/// `gpumem --version`: the release and the git revision it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("GPUMEM_GIT_REVISION"), ")");

pub mod actions;
pub mod analysis;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod daemon;
pub mod driver;
pub mod events;
pub mod export;
#[cfg(test)]
mod fuzz;
pub mod http_post;
pub mod kube;
pub mod names;
pub mod nvml;
pub mod pipeline;
pub mod privileges;
pub mod probes;
pub mod procfs;
pub mod python;
pub mod record;
pub mod runtime;
pub mod selfstat;
pub mod stacks;
pub mod state;
