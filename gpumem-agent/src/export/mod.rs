//! Outputs: they render state and events, they never compute.
pub mod names;
pub mod summary;
pub mod trace;
