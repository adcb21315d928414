//! Outputs: they render state and events, they never compute.
pub mod health;
pub mod leaks;
pub mod prometheus;
pub mod report;
pub mod status;
pub mod summary;
pub mod top;
pub mod trace;
