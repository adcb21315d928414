//! Analyses over state: they read state and never talk to the kernel.
pub mod counters;
pub mod distributions;
pub mod fragmentation;
pub mod growth;
pub mod health;
pub mod leaks;
pub mod oom;
pub mod reconcile;
pub mod timeline;
pub mod view;
