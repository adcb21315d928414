//! gpumem's engine: everything between a decoded kernel event and what a
//! person or a program reads, with no kernel access and no async runtime
//! (neither aya nor tokio is a dependency: the compiler keeps data flowing
//! one way). The agent feeds it live; recordings, benchmarks and property
//! tests feed it the same way.
//!
//! Layers, bottom up (a module imports only those below it; `cargo xtask
//! lint` fails on an import cycle):
//! - `procfs`, `names`, `clock`, `heap`: reading /proc, naming things, clocks, heap estimates;
//! - `model`: plain data types every layer shares;
//! - `events`: records decoded and typed;
//! - `python`, `stacks`: CPython frames and native stacks, unwound and symbolized;
//! - `state`: live allocations per process and device;
//! - `analysis`: leaks, growth, health, views, timelines, triggers;
//! - `pipeline`: the one path every event takes (`Pipeline::apply`);
//! - `record`: the recording file format;
//! - `export`: renderers (summaries, tables, Prometheus, pprof, reports, ...);
//! - `query`: the questions every reader asks, answered from a pipeline.
pub mod analysis;
pub mod clock;
pub mod corpus;
pub mod events;
pub mod export;
pub mod formats;
pub mod heap;
pub mod model;
pub mod names;
pub mod pipeline;
pub mod procfs;
pub mod python;
pub mod query;
pub mod record;
pub mod stacks;
pub mod state;
pub mod untrusted;

/// This build's version, as recordings and the daemon's answers carry it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
