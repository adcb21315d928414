//! Plain data types every layer shares: what the NVML thread, the host
//! readings, the agent's own status and a recording's readings carry, and
//! the holdings a daemon answers with. No behaviour beyond small
//! constructors: a type goes here when more than one layer uses it, so that
//! none of them has to import another's internals.
pub mod actions;
pub mod agent;
pub mod container;
pub mod degraded;
pub mod holding;
pub mod host;
pub mod lost;
pub mod nvml;
pub mod readings;

pub use holding::Holding;
