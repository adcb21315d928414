//! `gpumem replay FILE`: `trace --from FILE`.
use std::{
    io::{self, BufWriter},
    process::ExitCode,
};

use anyhow::Result;

use super::trace::Trace;
use crate::{cli::ReplayArgs, runtime};
use gpumem_engine::export::trace::Filter;

pub fn run(a: ReplayArgs) -> Result<ExitCode> {
    let mut trace = Trace::new(BufWriter::new(io::stdout().lock()), a.json, Filter::default(), Some(a.file.clone()));
    runtime::replay(&mut super::open_recording(&a.file)?, Default::default(), &mut trace)
}
