//! Analyses over state: they read state and never talk to the kernel.
pub mod counters;
pub mod distributions;
pub mod fragmentation;
pub mod growth;
pub mod health;
pub mod history;
pub mod leaks;
pub mod oom;
pub mod owners;
pub mod profile;
pub mod reconcile;
pub mod series;
pub mod snapshot;
pub mod timeline;
pub mod triggers;
pub mod view;
pub mod wind_down;
