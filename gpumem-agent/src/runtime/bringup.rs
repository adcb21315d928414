//! Bring-up: privileges checked, the eBPF programs loaded, the libcuda
//! copies given and found attached, with a line said for each.
use anyhow::{bail, Context as _, Result};

use super::Probing;
use crate::probes::{discover, Agent, LibraryReport, ProbeSet, ProbeStatus, Source};
use gpumem_engine::model::agent::RingSize;

/// Fails, naming what is missing for `role` and the command to run
/// instead; warns about the ones whose absence narrows what is seen.
pub fn require_privileges(role: crate::privileges::Role) -> Result<()> {
    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let (error, warnings) = crate::privileges::check(crate::privileges::effective(), role, &argv);
    if let Some(e) = error {
        bail!(e);
    }
    for w in warnings {
        eprintln!("gpumem: {w}");
    }
    Ok(())
}

/// Loads the eBPF programs for the probes asked for; with `continuity`,
/// the kernel keeps its table of live entries and the state is pinned.
pub fn load(p: &Probing, filter_pids: bool, probe_set: ProbeSet, events_ring: RingSize) -> Result<Agent> {
    load_with(p, filter_pids, probe_set, events_ring, None).map_err(anyhow::Error::from).context("loading eBPF programs")
}

pub fn load_with(
    p: &Probing,
    filter_pids: bool,
    probe_set: ProbeSet,
    events_ring: RingSize,
    continuity: Option<&super::continuity::Continuity>,
) -> Result<Agent, crate::probes::ProbeError> {
    Agent::load(crate::probes::Options {
        filter_pids,
        probe_set,
        events_ring,
        nvidia_prefix: p.nvidia_prefix.clone(),
        ioctl_mode: p.ioctl,
        stacks: p.stacks,
        uprobe_links: p.uprobe_links,
        refuse_uprobe_multi: p.refuse_uprobe_multi,
        arm64_uprobes: p.arm64_uprobes,
        refuse_loader_hooks: p.refuse_loader_hooks,
        kernel_table: continuity.map(|c| c.opts.kernel_table),
        pin: continuity.and_then(|c| c.pinned.clone()),
    })
}

/// Whether loading failed because a pinned map differs from this build's.
pub fn is_incompatible_pin(e: &crate::probes::ProbeError) -> bool {
    matches!(e, crate::probes::ProbeError::Load(b) if matches!(**b, aya::EbpfError::MapError(aya::maps::MapError::IncompatiblePinnedMap { .. })))
}

/// A one-line description of what was attached to a library.
pub fn describe(report: &LibraryReport) -> String {
    if let Some(e) = &report.error {
        return format!("libcuda {} ({}): not attached: {e}", report.path, report.source);
    }
    let missing: Vec<&str> =
        report.probes.iter().filter(|p| matches!(p.status, ProbeStatus::NotExported { .. })).map(|p| p.symbol).collect();
    let failed: Vec<String> = report
        .probes
        .iter()
        .filter_map(|p| match &p.status {
            ProbeStatus::Failed { error } => Some(format!("{}: {error}", p.symbol)),
            _ => None,
        })
        .collect();
    let links = report.links.map(|m| format!(", {} links", m.name())).unwrap_or_default();
    let mut line = format!(
        "attached {} of {} probes to {} (inode {}, found by {}{links})",
        report.attached(),
        report.probes.len(),
        report.path,
        report.inode,
        report.source
    );
    if !missing.is_empty() {
        line.push_str(&format!("; not exported, skipped: {}", missing.join(", ")));
    }
    if !failed.is_empty() {
        line.push_str(&format!("; FAILED: {}", failed.join("; ")));
    }
    let refused: Vec<_> = report.probes.iter().filter(|p| matches!(p.status, ProbeStatus::Refused)).collect();
    if let Some(d) = refused.first().and_then(|p| p.arm64.as_ref()) {
        let names: Vec<&str> = refused.iter().map(|p| p.symbol).collect();
        line.push_str(&format!(
            "; refused on arm64: {} (the first: {}: {}; `gpumem status` says why for each)",
            names.join(", "),
            d.instruction,
            d.why
        ));
    }
    line
}

/// A one-line description of what was attached to a PyTorch library.
pub fn describe_torch(r: &crate::probes::torch::TorchReport) -> String {
    match (&r.error, r.attached) {
        (Some(e), false) => format!("PyTorch {} ({}): allocator probes not attached: {e}", r.path, r.source),
        _ => {
            let gated = r.sites.iter().filter(|s| s.semaphore.is_some()).count();
            format!(
                "attached PyTorch's allocator probes to {} (inode {}, found by {}{}): {} sites, {gated} with semaphores raised",
                r.path,
                r.inode,
                r.source,
                r.links.map(|m| format!(", {} links", m.name())).unwrap_or_default(),
                r.sites.len()
            )
        }
    }
}

/// Attaches the libraries named with --libcuda (a bad path is an error).
pub fn attach_given(agent: &mut Agent, p: &Probing, mut say: impl FnMut(String)) -> Result<()> {
    for path in &p.libcuda {
        let lib = discover::stat_library(path, Source::CommandLine)
            .with_context(|| format!("--libcuda {}: cannot use this file", path.display()))?;
        if let Some(report) = agent.attach_library(&lib) {
            if report.error.is_some() {
                bail!("{}", describe(report));
            }
            say(describe(report));
        }
    }
    pin_new_links(agent, &mut say);
    Ok(())
}

/// With pinning, the links just made are pinned (a failure is said: those
/// probes would go with this process).
fn pin_new_links(agent: &mut Agent, say: &mut impl FnMut(String)) {
    if let Err(e) = agent.pin_new_links() {
        say(format!("note: {e}: those probes are detached when this agent stops"));
    }
}

/// Attaches libcuda copies found in ld.so.cache and in every running
/// process that are not attached yet, and hooks their dynamic loaders.
pub fn attach_discovered(agent: &mut Agent, p: &Probing, with_ld_cache: bool, mut say: impl FnMut(String)) {
    if !p.discover {
        return;
    }
    let mut found = discover::Found::default();
    if with_ld_cache {
        match discover::from_ld_cache() {
            Ok(paths) => found.libcuda.extend(paths.iter().filter_map(|p| discover::stat_library(p, Source::LdCache).ok())),
            Err(e) => say(format!("note: {e}; libcuda is found in the processes that map it")),
        }
    }
    let began = std::time::Instant::now();
    let (in_processes, processes) = discover::from_processes(std::process::id());
    agent.scan_stats.record(began.elapsed(), processes);
    found.libcuda.extend(in_processes.libcuda);
    found.loaders.extend(in_processes.loaders);
    found.torch.extend(in_processes.torch);
    attach_found(agent, found, &mut say);
}

/// Reads one process's maps (it exec'd or loaded a library) and attaches
/// what it maps that is new. Returns whether it maps a loader not hooked
/// before (its first link-map change may have come before the hook) and
/// whether it maps libcuda.
pub fn attach_in_process(agent: &mut Agent, pid: u32, mut say: impl FnMut(String)) -> (bool, bool) {
    let began = std::time::Instant::now();
    let Some(found) = discover::in_process(pid) else { return (false, false) };
    agent.scan_stats.signal_reads += 1;
    agent.scan_stats.signal_read_us += began.elapsed().as_micros() as u64;
    let cuda = !found.libcuda.is_empty();
    (attach_found(agent, found, &mut say), cuda)
}

/// Attaches new libcuda copies, then hooks new loaders; whether a loader was new.
/// What it says names files as processes map them: one line each, escaped.
fn attach_found(agent: &mut Agent, found: discover::Found, say: &mut impl FnMut(String)) -> bool {
    let say = &mut |m: String| say(gpumem_engine::names::printable(&m));
    for lib in found.libcuda {
        if agent.knows(&lib) {
            continue;
        }
        if let Some(report) = agent.attach_library(&lib) {
            say(describe(report));
        }
    }
    for lib in found.torch {
        if agent.knows(&lib) {
            continue;
        }
        if let Some(report) = agent.attach_torch(&lib) {
            say(describe_torch(report));
        }
    }
    let mut new_loader = false;
    for lib in found.loaders {
        if let Some(report) = agent.hook_loader(&lib) {
            new_loader = true;
            if let Some(e) = &report.error {
                say(format!("note: dynamic loader {}: {e}; its processes' libraries are found by the periodic scan", report.path));
            }
        }
    }
    pin_new_links(agent, say);
    new_loader
}
