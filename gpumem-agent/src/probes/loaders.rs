//! The dynamic loaders' debugger hook: a uprobe on `_dl_debug_state` of
//! each loader copy (by inode: a container's glibc or musl is another file),
//! which the loader calls around every dlopen and dlclose and once the
//! libraries of a new program are loaded. Its signal makes the agent read
//! that one process's maps, so a new libcuda copy is attached within
//! milliseconds of its dlopen instead of at the next scan of every process.
use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    UProbe,
};
use serde::Serialize;

use gpumem_engine::formats::arm64_probe::{Decision, Site};

use super::{discover::Library, symbols, Agent, ProbeError};

/// The debugger hook every loader calls when its link map changes.
pub const HOOK: &str = "_dl_debug_state";
const PROGRAM: &str = gpumem_common::names::program::LINK_MAP;

/// One loader copy and whether its hook is attached.
#[derive(Clone, Debug, Serialize)]
pub struct LoaderReport {
    pub path: String,
    pub dev: u64,
    pub inode: u64,
    pub attached: bool,
    pub error: Option<String>,
    /// On arm64: the hook's instruction and what the gate decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm64: Option<Decision>,
}

impl Agent {
    /// Hooks a loader copy not seen before; its report, or None if known.
    pub fn hook_loader(&mut self, lib: &Library) -> Option<&LoaderReport> {
        if !self.loaders_seen.insert(lib.key()) {
            return None;
        }
        self.links_changed = true;
        let mut arm64 = None;
        let result = self.attach_hook(lib, &mut arm64);
        self.loaders.push(LoaderReport {
            path: lib.name.clone(),
            dev: lib.dev,
            inode: lib.ino,
            attached: result.is_ok(),
            error: result.err().map(|e| e.to_string()),
            arm64,
        });
        self.loaders.last()
    }

    /// Loader hooks attached: discovery is event-driven for processes
    /// whose loader is one of them.
    pub fn hooked_loaders(&self) -> usize {
        self.loaders.iter().filter(|l| l.attached).count()
    }

    fn attach_hook(&mut self, lib: &Library, arm64: &mut Option<Decision>) -> Result<(), ProbeError> {
        if self.options.refuse_loader_hooks {
            return Err(ProbeError::Injected("attaching the loader hook"));
        }
        let opened = lib.open().map_err(|e| ProbeError::Hook(format!("{}: opening it: {e}", lib.name)))?;
        let offset = symbols::function_offsets(&opened.path, |name| name == HOOK)
            .map_err(|e| ProbeError::Hook(format!("{}: {e}", lib.name)))?
            .get(HOOK)
            .copied()
            .ok_or_else(|| ProbeError::Hook(format!("{} has no {HOOK}", lib.name)))?;
        // The hook reads no register: on arm64 it may sit after a landing pad.
        *arm64 = self.gate.check(&opened.path, offset, Site::Signal);
        let offset = match arm64.as_ref() {
            Some(d) if !d.attach => {
                return Err(ProbeError::Hook(format!("{HOOK} in {}: refused on arm64: {}: {}", lib.name, d.instruction, d.why)))
            }
            Some(d) => d.offset,
            None => offset,
        };
        if !self.hook_loaded {
            let prog: &mut UProbe = self.program(PROGRAM)?;
            prog.load().map_err(|source| ProbeError::Program { program: PROGRAM.to_string(), source: Box::new(source) })?;
            self.hook_loaded = true;
        }
        let prog: &mut UProbe = self.program(PROGRAM)?;
        let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: None };
        prog.attach([point], &opened.path, UProbeScope::AllProcesses).map_err(|source| ProbeError::Attach {
            program: PROGRAM.to_string(),
            target: format!("{HOOK} in {}", lib.name),
            source: Box::new(source),
        })?;
        Ok(())
    }
}
