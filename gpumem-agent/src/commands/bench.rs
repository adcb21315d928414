//! `gpumem bench` (hidden): a session that prints nothing, with gpumem's
//! probes or empty ones on the same symbols, for `cargo xtask bench`'s
//! overhead measurement against a workload.
use std::{io, process::ExitCode};

use anyhow::Result;

use super::trace::Trace;
use crate::{
    cli::{BenchArgs, TargetArgs},
    runtime,
};
use gpumem_engine::export::trace::Filter;

pub fn run(a: BenchArgs) -> Result<ExitCode> {
    let target = TargetArgs { pids: vec![], command: Some(a.command.clone()), duration: None };
    let mut s = super::session(&a.probes, &target, 1 << 20);
    s.probe_set = a.probe_set;
    s.continuity = a.pin_dir.map(|root| runtime::continuity::Options {
        state_dir: std::env::temp_dir().join("gpumem-bench-state"),
        root,
        kernel_table: gpumem_common::live::MAX_DEFAULT,
    });
    runtime::run(s, &mut Trace::new(io::sink(), false, Filter::default(), None).quiet())
}
