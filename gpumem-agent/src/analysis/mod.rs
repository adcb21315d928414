//! Analyses over state: they read state and never talk to the kernel.
pub mod growth;
pub mod leaks;
