//! `gpumem preflight`: what the arm64 uprobe gate would decide for each
//! probe site of some arm64 libraries on a kernel, without attaching: an
//! operator checks a node image before letting gpumem's probes near it.
use std::{io::Write as _, process::ExitCode};

use anyhow::{Context as _, Result};
use gpumem_common::APIS;
use gpumem_engine::formats::arm64_probe::{self, Decision, Kernel, Site};
use serde::Serialize;

use crate::{
    cli::preflight::PreflightArgs,
    probes::{arm64::Gate, loaders::HOOK, symbols},
};

/// Exit status when some probe site would be refused.
pub const EXIT_REFUSED: u8 = 4;

#[derive(Serialize)]
struct SiteDecision {
    symbol: &'static str,
    #[serde(flatten)]
    decision: Decision,
}

#[derive(Serialize)]
struct FileDecisions {
    path: String,
    sites: Vec<SiteDecision>,
}

pub fn run(args: PreflightArgs) -> Result<ExitCode> {
    let release = match &args.kernel {
        Some(r) => r.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/osrelease").context("reading this host's kernel release")?,
    };
    let kernel = Kernel::parse(&release)
        .with_context(|| format!("{:?} is not a kernel release (as `uname -r` prints it, e.g. 6.8.0-1015-nvidia-64k)", release.trim()))?;
    let gate = Gate { policy: args.arm64_uprobes, kernel: Some(kernel) };
    let mut files = Vec::new();
    for path in &args.files {
        let wanted = |name: &str| name == HOOK || APIS.iter().any(|api| api.symbol == name);
        let offsets = symbols::function_offsets_for(path, object::Architecture::Aarch64, wanted)
            .with_context(|| format!("{}: its symbols", path.display()))?;
        let mut sites: Vec<SiteDecision> = APIS
            .iter()
            .filter_map(|api| offsets.get(api.symbol).map(|&off| (api.symbol, off, Site::EntryAndReturn)))
            .chain(offsets.get(HOOK).map(|&off| (HOOK, off, Site::Signal)))
            .map(|(symbol, off, site)| SiteDecision { symbol, decision: gate.decide(path, off, site) })
            .collect();
        // libcuda's entry points go all or none, as the agent attaches them.
        arm64_probe::all_or_none(sites.iter_mut().filter(|s| s.symbol != HOOK).map(|s| &mut s.decision));
        sites.sort_by_key(|s| s.decision.offset);
        files.push(FileDecisions { path: path.display().to_string(), sites });
    }
    let refused = files.iter().flat_map(|f| &f.sites).filter(|s| !s.decision.attach).count();
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &serde_json::json!({ "kernel": kernel, "policy": gate.policy, "files": files }))?;
        writeln!(out)?;
    } else {
        for f in &files {
            let attached = f.sites.iter().filter(|s| s.decision.attach).count();
            let shown = gpumem_engine::names::printable(&f.path);
            writeln!(
                out,
                "{shown}: {attached} of {} probe sites attached on kernel {kernel} with --arm64-uprobes {}",
                f.sites.len(),
                gate.policy.flag()
            )?;
            for s in &f.sites {
                let what = if s.decision.attach { "attach" } else { "REFUSE" };
                writeln!(out, "  {:<32} {:#10x}  {what}  {}: {}", s.symbol, s.decision.offset, s.decision.instruction, s.decision.why)?;
            }
        }
    }
    out.flush()?;
    Ok(if refused > 0 { ExitCode::from(EXIT_REFUSED) } else { ExitCode::SUCCESS })
}
