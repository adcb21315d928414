//! Loading gpumem's eBPF programs, attaching them to every libcuda copy and
//! the process tracepoints, and reporting what is attached and why not.
pub mod arm64;
mod detach;
pub mod discover;
pub mod features;
pub mod ioctl;
mod libcuda;
pub mod links;
pub mod live;
pub mod loaders;
mod maps;
pub mod pin;
pub mod python;
pub mod reader;
pub mod torch;
pub mod tracefs;

use gpumem_common::names::{global, map, program};
use std::collections::HashSet;

use aya::{programs::TracePoint, Ebpf, EbpfLoader};
pub use discover::{Library, Source};
use gpumem_common::{filter, oom_field};
/// The parsers of what a traced process loads (its libraries' symbols and
/// USDT notes, ld.so.cache): the engine's, fuzzed there.
pub use gpumem_engine::formats::{ld_cache, symbols, usdt};
use gpumem_engine::model::degraded::Reason;
pub use libcuda::{LibraryReport, ProbeStatus, SymbolReport};
use links::{LinkReport, UprobeLinks};

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpumem"));

#[derive(Debug, thiserror::Error)]
// aya's errors are large: boxed, so that every Result here stays small.
pub enum ProbeError {
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("eBPF program {program} failed to load: {source}")]
    Program { program: String, source: Box<aya::programs::ProgramError> },
    #[error("eBPF program {program}: attaching to {target} failed: {source}")]
    Attach { program: String, target: String, source: Box<aya::programs::ProgramError> },
    #[error("eBPF map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("eBPF map {map}: {source}")]
    Map { map: &'static str, source: Box<aya::maps::MapError> },
    #[error("the dynamic loader's hook: {0}")]
    Hook(String),
    #[error("pinning: {0}")]
    Pin(String),
    #[error(
        "the overhead benchmark's empty programs are not in this build: build gpumem with `--features bench` (cargo xtask bench does)"
    )]
    NoBenchPrograms,
    /// Tests' fault injection (hidden options): what was made to fail.
    #[error("{0} failed (fault injected)")]
    Injected(&'static str),
}

/// Which programs go on the libcuda symbols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeSet {
    /// gpumem's real probes.
    Full,
    /// Empty programs on the same symbols: the overhead baseline.
    Empty,
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Trace only the processes added with `Agent::add_pid`.
    pub filter_pids: bool,
    pub probe_set: ProbeSet,
    /// The accounting ring.
    pub events_ring: gpumem_engine::model::agent::RingSize,
    /// Which allocation stacks the kernel copies.
    pub stacks: gpumem_engine::stacks::StackPolicy,
    /// NVIDIA device-node prefix for the ioctl path.
    pub nvidia_prefix: String,
    pub ioctl_mode: ioctl::IoctlMode,
    pub uprobe_links: UprobeLinks,
    /// Tests: act as a kernel that refuses uprobe_multi links at attach time.
    pub refuse_uprobe_multi: bool,
    /// Which probe sites an arm64 host attaches.
    pub arm64_uprobes: gpumem_engine::formats::arm64_probe::Policy,
    /// Tests and benchmarks: act as if no dynamic loader could be hooked.
    pub refuse_loader_hooks: bool,
    /// The kernel keeps its table of live entries (`serve`), this big.
    pub kernel_table: Option<u32>,
    /// Pin the shared maps and every link here (`serve`).
    pub pin: Option<pin::Pinned>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct TracepointReport {
    pub tracepoint: &'static str,
    pub attached: bool,
    pub error: Option<String>,
}

pub struct Agent {
    ebpf: Ebpf,
    options: Options,
    seen: HashSet<(u64, u64)>,
    pub libraries: Vec<LibraryReport>,
    /// Dynamic loaders whose debugger hook is probed (discovery signals).
    pub loaders: Vec<loaders::LoaderReport>,
    loaders_seen: HashSet<(u64, u64)>,
    hook_loaded: bool,
    pub tracepoints: Vec<TracepointReport>,
    pub uprobe_links: LinkReport,
    pub notes: Vec<String>,
    /// Processes degraded by a library over budget, not yet taken by the live loop.
    pub degraded: Vec<(u32, Reason, String)>,
    /// libcuda copies attached per tenant and in all.
    pub copies: libcuda::CopyBudget,
    /// Cost of looking for new libcuda copies in /proc.
    pub scan_stats: gpumem_engine::model::agent::ScanStats,
    pub ioctl: ioctl::IoctlReport,
    seeded: ioctl::Seeded,
    /// Calls in flight whose thread died before returning (killed in the
    /// driver): their saved entries, removed from the kernel's tables.
    pub stale_calls_removed: u64,
    /// PyTorch libraries (libc10_cuda.so) and their probe links.
    pub torch: Vec<torch::TorchReport>,
    torch_links: Vec<std::os::fd::OwnedFd>,
    usdt_specs_used: u32,
    /// The arm64 uprobe gate (no-op on x86_64).
    gate: arm64::Gate,
    /// Links made since the last pinning (see `pin_new_links`).
    links_changed: bool,
    /// Links of this load pinned so far, by id.
    pinned_links: HashSet<u32>,
    /// Not losses: returns run twice while links overlapped at a takeover.
    duplicate_returns: u64,
}

impl Agent {
    /// Loads (verifies) every program; attaches nothing yet.
    pub fn load(options: Options) -> Result<Agent, ProbeError> {
        if options.probe_set == ProbeSet::Empty && !cfg!(feature = "bench") {
            return Err(ProbeError::NoBenchPrograms);
        }
        let mut notes = Vec::new();
        match tracefs::ensure_mounted() {
            Ok(Some(note)) => notes.push(note),
            Ok(None) => {}
            Err(e) => notes.push(e.to_string()),
        }
        let (fork_offset, oom_offsets) = tracefs::record_offsets(&mut notes);
        let mode = if options.filter_pids { filter::PIDS } else { filter::ALL };
        let prefix = options.nvidia_prefix.clone();
        let mut prefix_bytes = [0u8; gpumem_common::NV_PREFIX_MAX];
        prefix_bytes[..prefix.len()].copy_from_slice(prefix.as_bytes());
        let prefix_len = prefix.len() as u32;
        let keep_live = options.kernel_table.is_some() as u32;
        let mut loader = EbpfLoader::new();
        pin::share_maps(&mut loader, options.pin.as_ref());
        let ebpf = loader
            .override_global(global::NV_PREFIX, &prefix_bytes, true)
            .override_global(global::KEEP_LIVE, &keep_live, true)
            .map_max_entries(map::LIVE, options.kernel_table.unwrap_or(1))
            .override_global(global::NV_PREFIX_LEN, &prefix_len, true)
            .override_global(global::FILTER_MODE, &mode, true)
            .override_global(global::CAPTURE_STACKS, &(options.stacks.capture as u32), true)
            .override_global(global::STACK_BUDGET_PER_S, &(options.stacks.budget_per_s as u64), true)
            .override_global(global::STACK_SAMPLE_BYTES, &options.stacks.sample_bytes, true)
            .override_global(global::STACK_BURST, &(options.stacks.burst as u64), true)
            // Wake the reader at an eighth of the ring; below, it polls (POLL_MS).
            .override_global(global::WAKEUP_BYTES, &(options.events_ring.bytes as u64 / 8), true)
            .override_global(global::FORK_CHILD_PID_OFFSET, &fork_offset, true)
            .override_global(global::OOM_OFFSETS, &oom_offsets, true)
            .map_max_entries(map::EVENTS, options.events_ring.bytes)
            // A page when stacks are off: the ring must exist, nothing goes to it.
            .map_max_entries(map::STACKS, options.stacks.kernel_ring_bytes())
            .load(EBPF_OBJECT)
            .map_err(|e| ProbeError::Load(Box::new(e)))?;
        let (path, why) = ioctl::choose(options.ioctl_mode, features::detect().kprobes, ioctl::nvidia_module_loaded(), &prefix);
        let ioctl = ioctl::IoctlReport { path, why, prefix, seeded_fds: 0, error: None };
        let uprobe_links = links::choose(options.uprobe_links);
        let gate = arm64::Gate::running(options.arm64_uprobes);
        let mut agent = Agent {
            ebpf,
            options,
            gate,
            seen: HashSet::new(),
            libraries: Vec::new(),
            loaders: Vec::new(),
            loaders_seen: HashSet::new(),
            hook_loaded: false,
            tracepoints: Vec::new(),
            uprobe_links,
            notes,
            degraded: Vec::new(),
            copies: Default::default(),
            scan_stats: Default::default(),
            ioctl,
            seeded: Default::default(),
            stale_calls_removed: 0,
            torch: Vec::new(),
            torch_links: Vec::new(),
            usdt_specs_used: 0,
            links_changed: true,
            pinned_links: HashSet::new(),
            duplicate_returns: 0,
        };
        agent.load_uprobes()?;
        agent.attach_tracepoints(fork_offset != 0, oom_offsets[oom_field::PID] != oom_field::FIELD_ABSENT);
        agent.attach_ioctl();
        agent.pin_new_links()?;
        Ok(agent)
    }

    fn program<T>(&mut self, name: &str) -> Result<&mut T, ProbeError>
    where
        for<'a> &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
    {
        let prog = self.ebpf.program_mut(name).ok_or_else(|| ProbeError::Program {
            program: name.to_string(),
            source: Box::new(aya::programs::ProgramError::UnexpectedProgramType),
        })?;
        prog.try_into().map_err(|source| ProbeError::Program { program: name.to_string(), source: Box::new(source) })
    }

    fn attach_tracepoints(&mut self, fork_known: bool, oom_known: bool) {
        // Exec: a discovery signal (the new program's libraries and loader).
        let mut wanted = vec![("sched", program::PROCESS_EXIT), ("sched", program::PROCESS_EXEC)];
        if self.options.filter_pids && fork_known {
            wanted.push(("sched", program::PROCESS_FORK));
        }
        // Host OOM kills. Kernels with kprobes could also use oom_kill_process;
        // the tracepoint runs in the triggering task, which names it just as well.
        if oom_known {
            wanted.push(("oom", program::OOM_VICTIM));
        } else {
            self.notes.push("oom:mark_victim has no pid field here: host OOM kills are not traced".into());
        }
        for (category, name) in wanted {
            let result = self.attach_tracepoint(category, name);
            let tracepoint = match name {
                program::PROCESS_EXIT => "sched:sched_process_exit",
                program::PROCESS_EXEC => "sched:sched_process_exec",
                program::PROCESS_FORK => "sched:sched_process_fork",
                _ => "oom:mark_victim",
            };
            if let Err(e) = &result {
                let consequence = match name {
                    program::PROCESS_EXIT => "exits will not release memory",
                    program::PROCESS_EXEC => "new programs are found by the periodic scan only",
                    program::PROCESS_FORK => "children of -c commands are not followed",
                    _ => "host OOM kills are not traced",
                };
                self.notes.push(format!("{tracepoint} not attached ({e}): {consequence}"));
            }
            self.tracepoints.push(TracepointReport { tracepoint, attached: result.is_ok(), error: result.err().map(|e| e.to_string()) });
        }
    }

    /// Loads and attaches the tracepoint program named after the tracepoint.
    fn attach_tracepoint(&mut self, category: &str, name: &str) -> Result<(), ProbeError> {
        let prog: &mut TracePoint = self.program(name)?;
        prog.load().map_err(|source| ProbeError::Program { program: name.to_string(), source: Box::new(source) })?;
        prog.attach(category, name).map_err(|source| ProbeError::Attach {
            program: name.to_string(),
            target: format!("{category}:{name}"),
            source: Box::new(source),
        })?;
        Ok(())
    }

    /// Attaches the chosen ioctl path; a kprobe failure falls back to the tracepoints.
    fn attach_ioctl(&mut self) {
        if self.ioctl.path == ioctl::IoctlPath::Kprobes {
            if let Err(e) = self.attach_ioctl_kprobes() {
                self.ioctl.path = ioctl::IoctlPath::Tracepoints;
                self.ioctl.why = format!("kprobes failed ({e}): syscall tracepoints, filtered in the kernel");
            }
        }
        if self.ioctl.path == ioctl::IoctlPath::Tracepoints {
            if let Err(e) = self.attach_ioctl_tracepoints() {
                self.ioctl.error = Some(e.to_string());
                self.notes.push(format!("NVIDIA ioctls are not traced: {e}"));
                return;
            }
            self.seed_nvidia_fds();
        }
    }

    fn attach_ioctl_kprobes(&mut self) -> Result<(), ProbeError> {
        for (prog, func) in [(program::NV_RM_IOCTL, "nvidia_unlocked_ioctl"), (program::NV_UVM_IOCTL, "uvm_unlocked_ioctl_entry")] {
            self.attach_kprobe(prog, &[func])?;
        }
        self.attach_kprobe(program::NV_IOCTL_RETURN, &["nvidia_unlocked_ioctl", "uvm_unlocked_ioctl_entry"])
    }

    fn attach_kprobe(&mut self, prog: &str, funcs: &[&str]) -> Result<(), ProbeError> {
        let p: &mut aya::programs::KProbe = self.program(prog)?;
        p.load().map_err(|source| ProbeError::Program { program: prog.to_string(), source: Box::new(source) })?;
        for func in funcs {
            p.attach(*func, 0).map_err(|source| ProbeError::Attach {
                program: prog.to_string(),
                target: func.to_string(),
                source: Box::new(source),
            })?;
        }
        Ok(())
    }

    fn attach_ioctl_tracepoints(&mut self) -> Result<(), ProbeError> {
        for name in [program::ENTER_OPENAT, program::EXIT_OPENAT, program::ENTER_CLOSE, program::ENTER_IOCTL, program::EXIT_IOCTL] {
            self.attach_tracepoint("syscalls", name)?;
        }
        Ok(())
    }

    /// The arm64 uprobe gate, as `status` describes it (None on x86_64).
    pub fn arm64_gate(&self) -> Option<String> {
        self.gate.describe()
    }

    /// Whether this library (by inode) has been handled already.
    pub fn knows(&self, lib: &Library) -> bool {
        self.seen.contains(&lib.key())
    }

    /// A library (libcuda or libc10_cuda) to handle now, opened; None if it
    /// was handled already, or if its file is gone since it was found (its
    /// mapping changed, as the loader maps a library in steps, or its
    /// process exited): that one is not taken as handled, and is tried
    /// again when found again.
    fn claim(&mut self, lib: &Library) -> Option<std::io::Result<discover::Opened>> {
        if !self.seen.insert(lib.key()) {
            return None;
        }
        let opened = lib.open();
        if opened.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            self.seen.remove(&lib.key());
            return None;
        }
        Some(opened)
    }

    /// The agent's status once loaded: its probes, its rings' sizes and
    /// its maps' kernel memory (fixed from here on; the rest is counted as
    /// the session goes).
    pub fn status_at_load(&self) -> gpumem_engine::model::agent::AgentStatus {
        let rings = gpumem_engine::model::agent::Rings {
            events_bytes: self.options.events_ring.bytes as u64,
            stacks_bytes: self.options.stacks.kernel_ring_bytes() as u64,
            events_sizing: self.options.events_ring.sizing,
            stacks_sizing: self.options.stacks.ring_sizing,
        };
        gpumem_engine::model::agent::AgentStatus {
            probes_attached: self.attached_probe_count(),
            rings,
            bpf_maps: crate::selfstat::bpf_maps(),
            ..crate::selfstat::status()
        }
    }

    pub fn attached_probe_count(&self) -> usize {
        self.libraries.iter().map(LibraryReport::attached).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use gpumem_common::names::{global, map, program};
    use object::{Object as _, ObjectSymbol as _};

    /// The built object has every map, global and program the agent finds
    /// by name (gpumem_common::names), and the benchmark's programs only
    /// in a `bench` build.
    #[test]
    fn the_object_has_every_name_the_agent_uses() {
        let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object parses");
        let symbols: BTreeSet<&str> = elf.symbols().filter_map(|s| s.name().ok()).collect();
        for name in map::ALL.iter().chain(&global::ALL).chain(&program::ALL) {
            assert!(symbols.contains(name), "{name} is not in the eBPF object: its name changed on one side only");
        }
        for name in program::bench::ALL {
            assert_eq!(symbols.contains(name), cfg!(feature = "bench"), "{name} is in the object exactly when built with `bench`");
        }
        assert!(map::PINNED.iter().all(|m| map::ALL.contains(m)));
    }
}
