//! How the uprobes reach a library's entry points: one uprobe_multi link per
//! library and direction (kernel 6.6+), or one perf link per entry point and
//! direction where the kernel has no uprobe_multi. Either way the API id is
//! the attach cookie, read by the same program.
//!
//! Why it matters: a multi link attaches every entry point at once (a process
//! calling meanwhile sees all of a library's probes or none) and is removed
//! in one RCU grace period; per-point links appear one by one and each waits
//! for its own grace period when removed (about 0.1 s here, 6 s for 60).
use aya::{
    programs::{uprobe::UProbeError, ProgramError},
    sys::{is_uprobe_multi_supported, UProbeMultiFeature},
};
use gpumem_common::names::program;

/// `--uprobe-links`: how to link uprobes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UprobeLinks {
    /// uprobe_multi where the kernel has it, else per-point links.
    Auto,
    /// uprobe_multi links only; a kernel without them leaves libraries unattached.
    Multi,
    /// One link per entry point (what kernels before 6.6 can do).
    PerPoint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkMode {
    Multi,
    PerPoint,
}

impl LinkMode {
    pub fn name(self) -> &'static str {
        match self {
            LinkMode::Multi => "uprobe_multi",
            LinkMode::PerPoint => "per-point",
        }
    }
}

/// What `gpumem status` says about the links.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LinkReport {
    pub mode: LinkMode,
    /// Why this mode: asked for, found in the kernel, or fallen back to.
    pub why: String,
    /// uprobe links made so far (entry and return counted apart).
    pub links: usize,
}

/// The mode to start in. `Auto` asks the kernel (a feature probe that makes
/// and drops one link); a refusal at attach time still falls back later.
pub fn choose(asked: UprobeLinks) -> LinkReport {
    let (mode, why) = match asked {
        UprobeLinks::Multi => (LinkMode::Multi, "asked for (--uprobe-links multi)".to_string()),
        UprobeLinks::PerPoint => (LinkMode::PerPoint, "asked for (--uprobe-links per-point)".to_string()),
        UprobeLinks::Auto => match is_uprobe_multi_supported(UProbeMultiFeature::LinkCreation) {
            Ok(true) => (LinkMode::Multi, "the kernel has uprobe_multi links: one per library and direction".to_string()),
            Ok(false) => (LinkMode::PerPoint, "the kernel has no uprobe_multi links (before 6.6): one link per entry point".to_string()),
            Err(e) => (LinkMode::PerPoint, format!("uprobe_multi support could not be probed ({e}): one link per entry point")),
        },
    };
    LinkReport { mode, why, links: 0 }
}

/// Whether a failed multi attach means "this kernel cannot" (fall back to
/// per-point links) rather than a real failure: what aya itself treats so.
pub fn is_refusal(e: &ProgramError) -> bool {
    match e {
        ProgramError::UProbeError(UProbeError::MultiLinkNotSupported) => true,
        ProgramError::SyscallError(s) => s.call == "bpf_link_create" && s.io_error.raw_os_error() == Some(libc::EINVAL),
        _ => false,
    }
}

/// Tests' stand-in for a kernel that refuses uprobe_multi links (hidden
/// `--refuse-uprobe-multi`): the error aya returns on such kernels.
pub fn simulated_refusal() -> ProgramError {
    ProgramError::UProbeError(UProbeError::MultiLinkNotSupported)
}

/// Entry and return program names for a probe set in a mode.
pub fn programs(set: super::ProbeSet, mode: LinkMode) -> [&'static str; 2] {
    use super::ProbeSet::*;
    match (set, mode) {
        (Full, LinkMode::Multi) => [program::CUDA_MULTI_ENTRY, program::CUDA_MULTI_RETURN],
        (Full, LinkMode::PerPoint) => [program::CUDA_ENTRY, program::CUDA_RETURN],
        (Empty, LinkMode::Multi) => [program::bench::MULTI_ENTRY, program::bench::MULTI_RETURN],
        (Empty, LinkMode::PerPoint) => [program::bench::ENTRY, program::bench::RETURN],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_fall_back_and_other_failures_do_not() {
        assert!(is_refusal(&simulated_refusal()));
        let einval = aya::sys::SyscallError { call: "bpf_link_create", io_error: std::io::Error::from_raw_os_error(libc::EINVAL) };
        assert!(is_refusal(&ProgramError::SyscallError(einval)));
        let eperm = aya::sys::SyscallError { call: "bpf_link_create", io_error: std::io::Error::from_raw_os_error(libc::EPERM) };
        assert!(!is_refusal(&ProgramError::SyscallError(eperm)));
    }

    #[test]
    fn names_stay_within_the_kernels_15_bytes() {
        for set in [super::super::ProbeSet::Full, super::super::ProbeSet::Empty] {
            for mode in [LinkMode::Multi, LinkMode::PerPoint] {
                for name in programs(set, mode) {
                    assert!(name.len() <= 15, "{name}: the kernel keeps 15 bytes of a program's name");
                }
            }
        }
    }
}
