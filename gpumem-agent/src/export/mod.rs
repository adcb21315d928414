//! Outputs: they render state and events, they never compute.
pub mod leaks;
pub mod names;
pub mod summary;
pub mod trace;
