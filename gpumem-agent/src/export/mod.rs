//! Outputs: they render state and events, they never compute.
pub mod leaks;
pub mod names;
pub mod prometheus;
pub mod report;
pub mod summary;
pub mod top;
pub mod trace;
