//! gpumem's agent: the kernel side (probes: load, discover, attach, read
//! the rings), the runtime that drives the engine (gpumem-engine) live or
//! from a recording, NVML, the daemon's servers and the command line. The
//! CLI (main.rs), the benchmarks and the property tests link it, so what is
//! measured and fuzzed is what ships.
//!
//! Data flows one way: probes → events → pipeline → state → analyses →
//! outputs; everything from events on is the engine's.
/// `gpumem --version`: the release and the git revision it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("GPUMEM_GIT_REVISION"), ")");

pub mod actions;
pub mod cli;
pub mod commands;
pub mod daemon;
pub mod driver;
#[cfg(test)]
mod fuzz;
pub mod http_post;
pub mod kube;
pub mod node;
pub mod nvml;
pub mod privileges;
pub mod probes;
pub mod runtime;
pub mod selfstat;
pub mod serve;
