//! Attaching libcuda copies: their exported entry points, linked to the
//! entry and return programs in one uprobe_multi link per direction or
//! point by point, and what each attach did (`gpumem status`).
use std::{collections::HashMap, os::unix::fs::MetadataExt as _, path::Path};

use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    UProbe,
};
use gpumem_common::{ApiInfo, APIS};
use gpumem_engine::{
    formats::arm64_probe::{self, Decision, Site},
    model::degraded::Reason,
};

use super::{
    links::{self, LinkMode, UprobeLinks},
    symbols, Agent, Library, ProbeError,
};

#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ProbeStatus {
    Attached,
    /// The library does not export this symbol.
    NotExported {
        required: bool,
    },
    Failed {
        error: String,
    },
    /// Not attached by the arm64 gate (its `arm64` decision says why).
    Refused,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SymbolReport {
    pub symbol: &'static str,
    #[serde(flatten)]
    pub status: ProbeStatus,
    /// On arm64: the entry's instruction and what the gate decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm64: Option<Decision>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct LibraryReport {
    pub path: String,
    pub source: String,
    pub dev: u64,
    pub inode: u64,
    pub error: Option<String>,
    /// How its probes are linked (none when nothing was attached).
    pub links: Option<LinkMode>,
    pub probes: Vec<SymbolReport>,
}

impl LibraryReport {
    pub fn attached(&self) -> usize {
        self.probes.iter().filter(|p| matches!(p.status, ProbeStatus::Attached)).count()
    }
}

/// Context calls first, then frees, then allocations: with per-point links,
/// a process that calls while we attach then sees its allocations attributed
/// to the right device, and at worst a free of something we never saw
/// allocated. (A uprobe_multi link attaches them all at once.)
fn attach_order() -> Vec<&'static ApiInfo> {
    use gpumem_common::ApiClass::*;
    let rank = |c: gpumem_common::ApiClass| match c {
        CtxRetainPrimary | CtxReleasePrimary | CtxResetPrimary | CtxCreate | CtxSetCurrent | CtxPush | CtxPop | CtxDestroy => 0,
        Init => 1,
        DeviceFree | HostFree | VmmRelease | VmmUnmap | VaFree => 2,
        _ => 3,
    };
    let mut apis: Vec<_> = APIS.iter().collect();
    apis.sort_by_key(|a| rank(a.class));
    apis
}

/// libcuda copies attached per tenant (the mount namespace and user of the
/// process found mapping it) and in all: each copy costs the kernel 62
/// uprobes and their links, and a tenant makes copies at will (a copy is
/// a new inode). Copies stay attached while the agent runs.
pub const MAX_COPIES_PER_TENANT: usize = 8;
pub const MAX_COPIES: usize = 64;

#[derive(Debug, Default)]
pub struct CopyBudget {
    per_tenant: HashMap<(u64, u32), usize>,
    total: usize,
    /// Copies refused, since start.
    pub refused: u64,
}

/// Refused copies listed in `status` (the others counted in `refused`).
const REFUSED_LISTED: u64 = 16;

impl CopyBudget {
    /// Takes one copy from the budget of the tenant of `pid` (None: named by
    /// the operator or ld.so.cache, counted in the total only), or says why not.
    pub fn admit(&mut self, pid: Option<u32>) -> Result<(), String> {
        if self.total >= MAX_COPIES {
            return Err(format!("gpumem attaches at most {MAX_COPIES} libcuda copies, and has"));
        }
        if let Some((ns, uid)) = pid.and_then(tenant) {
            let n = self.per_tenant.entry((ns, uid)).or_default();
            if *n >= MAX_COPIES_PER_TENANT {
                return Err(format!(
                    "its tenant (mount namespace {ns}, uid {uid}) has {MAX_COPIES_PER_TENANT} libcuda copies attached, the most gpumem attaches for one"
                ));
            }
            *n += 1;
        }
        self.total += 1;
        Ok(())
    }
}

/// A process's mount namespace and user.
fn tenant(pid: u32) -> Option<(u64, u32)> {
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/mnt")).ok()?.ino();
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    Some((ns, uid))
}

impl Agent {
    /// Attaches every probe to one libcuda copy. Missing symbols are skipped
    /// and noted; the library is handled once per inode.
    pub fn attach_library(&mut self, lib: &Library) -> Option<&LibraryReport> {
        let opened = self.claim(lib)?;
        let mut report = LibraryReport {
            path: lib.name.clone(),
            source: lib.source.to_string(),
            dev: lib.dev,
            inode: lib.ino,
            error: None,
            links: None,
            probes: Vec::new(),
        };
        if let Err(why) = self.copies.admit(lib.pid) {
            if let Some(pid) = lib.pid {
                self.degraded.push((pid, Reason::LibcudaCopies, format!("{}: {why}", lib.name)));
            }
            // The first refusals are listed; the rest only counted (a tenant makes copies at will).
            self.copies.refused += 1;
            if self.copies.refused > REFUSED_LISTED {
                return None;
            }
            report.error = Some(why);
            self.libraries.push(report);
            return self.libraries.last();
        }
        self.links_changed = true;
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                report.error = Some(format!("opening it: {e}"));
                self.libraries.push(report);
                return self.libraries.last();
            }
        };
        let path = &opened.path;
        match symbols::function_offsets(path, |name| APIS.iter().any(|api| api.symbol == name)) {
            Err(e) => {
                if let (true, Some(pid)) = (e.over_budget(), lib.pid) {
                    self.degraded.push((pid, Reason::LibraryTables, format!("{}: {}", lib.name, opened.said(&e))));
                }
                report.error = Some(opened.said(e));
            }
            Ok(offsets) => {
                let exported: Vec<(&'static ApiInfo, u64)> =
                    attach_order().into_iter().filter_map(|api| offsets.get(api.symbol).map(|&off| (api, off))).collect();
                // On arm64, only the entries the gate allows (the return probe
                // goes on the same entry, so the entry's instruction decides both).
                let mut decisions: HashMap<&str, Decision> = exported
                    .iter()
                    .filter_map(|(api, off)| {
                        let d = self.gate.check(path, *off, Site::EntryAndReturn)?;
                        Some((api.symbol, Decision { why: opened.said(&d.why), ..d }))
                    })
                    .collect();
                arm64_probe::all_or_none(decisions.values_mut());
                let allowed: Vec<_> = exported.into_iter().filter(|(api, _)| decisions.get(api.symbol).is_none_or(|d| d.attach)).collect();
                let (mode, failed) = self.link(&allowed, path);
                for api in APIS {
                    let arm64 = decisions.get(api.symbol).cloned();
                    let status = match failed.iter().find(|(symbol, _)| *symbol == api.symbol) {
                        _ if !offsets.contains_key(api.symbol) => ProbeStatus::NotExported { required: api.required },
                        _ if arm64.as_ref().is_some_and(|d| !d.attach) => ProbeStatus::Refused,
                        Some((_, error)) => ProbeStatus::Failed { error: opened.said(error) },
                        None => ProbeStatus::Attached,
                    };
                    report.probes.push(SymbolReport { symbol: api.symbol, status, arm64 });
                }
                report.links = (report.attached() > 0).then_some(mode);
            }
        }
        self.libraries.push(report);
        self.libraries.last()
    }

    /// Loads the entry and return programs of the current link mode.
    pub(super) fn load_uprobes(&mut self) -> Result<(), ProbeError> {
        for name in links::programs(self.options.probe_set, self.uprobe_links.mode) {
            let prog: &mut UProbe = self.program(name)?;
            prog.load().map_err(|source| ProbeError::Program { program: name.to_string(), source: Box::new(source) })?;
        }
        Ok(())
    }

    /// Links the entry and return programs to these entry points of one
    /// library, each point's API id as its cookie: in one uprobe_multi link
    /// per direction, or point by point. A kernel that refuses uprobe_multi
    /// turns `--uprobe-links auto` to per-point links, for this library and
    /// the ones after it.
    /// Returns the mode used and the entry points that failed, with why.
    fn link(&mut self, points: &[(&'static ApiInfo, u64)], path: &Path) -> (LinkMode, Vec<(&'static str, String)>) {
        let every_point_failed = |e: &dyn std::fmt::Display| points.iter().map(|(api, _)| (api.symbol, e.to_string())).collect();
        if points.is_empty() {
            return (self.uprobe_links.mode, Vec::new());
        }
        if self.uprobe_links.mode == LinkMode::Multi {
            match self.link_multi(points, path) {
                Ok(()) => return (LinkMode::Multi, Vec::new()),
                Err(ProbeError::Attach { source, .. }) if self.options.uprobe_links == UprobeLinks::Auto && links::is_refusal(&source) => {
                    self.uprobe_links.mode = LinkMode::PerPoint;
                    self.uprobe_links.why = format!("the kernel refused a uprobe_multi link ({source}): one link per entry point");
                    self.notes.push(format!("uprobe links: {}", self.uprobe_links.why));
                    if let Err(e) = self.load_uprobes() {
                        return (LinkMode::PerPoint, every_point_failed(&e));
                    }
                }
                Err(e) => return (LinkMode::Multi, every_point_failed(&e)),
            }
        }
        let mut failed = Vec::new();
        for &(api, offset) in points {
            if let Err(e) = self.link_point(api, offset, path) {
                failed.push((api.symbol, e.to_string()));
            }
        }
        (LinkMode::PerPoint, failed)
    }

    fn link_multi(&mut self, points: &[(&'static ApiInfo, u64)], path: &Path) -> Result<(), ProbeError> {
        let [entry, ret] = links::programs(self.options.probe_set, LinkMode::Multi);
        let attach_points: Vec<UProbeAttachPoint> = points
            .iter()
            .map(|(api, off)| UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(*off), cookie: Some(api.id as u64) })
            .collect();
        let target = || format!("{} entry points in {}", points.len(), path.display());
        let refuse = self.options.refuse_uprobe_multi;
        let attach = |agent: &mut Agent, name: &str| -> Result<_, ProbeError> {
            let prog: &mut UProbe = agent.program(name)?;
            let result =
                if refuse { Err(links::simulated_refusal()) } else { prog.attach(&attach_points, path, UProbeScope::AllProcesses) };
            result.map_err(|source| ProbeError::Attach { program: name.to_string(), target: target(), source: Box::new(source) })
        };
        let entry_link = attach(self, entry)?;
        if let Err(e) = attach(self, ret) {
            // Without its return link the entry link only fills the call table.
            let prog: &mut UProbe = self.program(entry)?;
            let _ = prog.detach(entry_link);
            return Err(e);
        }
        self.uprobe_links.links += 2;
        Ok(())
    }

    fn link_point(&mut self, api: &ApiInfo, offset: u64, path: &Path) -> Result<(), ProbeError> {
        let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(api.id as u64) };
        for name in links::programs(self.options.probe_set, LinkMode::PerPoint) {
            let prog: &mut UProbe = self.program(name)?;
            prog.attach([point], path, UProbeScope::AllProcesses).map_err(|source| ProbeError::Attach {
                program: name.to_string(),
                target: format!("{} in {}", api.symbol, path.display()),
                source: Box::new(source),
            })?;
            self.uprobe_links.links += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_budgeted_per_tenant_and_in_all() {
        let mut b = CopyBudget::default();
        let me = std::process::id();
        for _ in 0..MAX_COPIES_PER_TENANT {
            b.admit(Some(me)).unwrap();
        }
        let why = b.admit(Some(me)).unwrap_err();
        assert!(why.contains(&format!("has {MAX_COPIES_PER_TENANT} libcuda copies attached")), "{why}");
        // The operator's copies are not a tenant's, but count in all.
        for _ in MAX_COPIES_PER_TENANT..MAX_COPIES {
            b.admit(None).unwrap();
        }
        assert!(b.admit(None).unwrap_err().contains(&format!("at most {MAX_COPIES}")));
    }
}
