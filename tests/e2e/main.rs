//! gpumem's end-to-end tests, one binary with a module per feature: real
//! eBPF against real processes, as root, one test at a time (`cargo xtask
//! test` runs them so). A test that cannot do its job fails with the
//! reason; none skips.
mod actions;
mod alloc;
mod arm64;
mod bindings;
mod chart;
mod cli;
mod containers;
mod contexts;
mod continuity;
mod discovery;
mod export;
mod host;
mod hostile;
mod image;
mod ioctl;
mod k8s;
mod kube;
mod leaks;
mod links;
mod live_page;
mod nvml;
mod oom;
mod python;
mod recording;
mod reliability;
mod report;
mod serve;
mod sharing;
mod soak;
mod top;
mod torch;
mod vmm;
