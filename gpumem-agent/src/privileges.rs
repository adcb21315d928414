//! What the agent may do: its effective capabilities, checked before loading
//! anything so that a missing one is named instead of surfacing as EPERM.
//!
//! Needed: CAP_BPF (programs, maps) and CAP_PERFMON (tracepoints, reading
//! user memory from the programs) — and for uprobes CAP_SYS_ADMIN: Linux
//! 6.16 ("perf: Revert to requiring CAP_SYS_ADMIN for uprobes", ba677dbe77af,
//! backported to the 6.6 and 6.12 stable series in July 2025) refuses uprobe
//! perf events to CAP_PERFMON alone. CAP_SYS_ADMIN implies CAP_BPF and
//! CAP_PERFMON. Wanted: CAP_SYS_PTRACE (/proc/PID/maps, root and fd of other
//! users' processes: their libcuda copies, containers and NVIDIA descriptors)
//! and CAP_DAC_READ_SEARCH (tracefs, and libraries other users own).
//! CAP_SYS_ADMIN also covers mounting tracefs when it is missing and opening
//! a deleted library through /proc/PID/map_files.

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The effective capability set (CapEff in /proc/self/status); 0 if unreadable.
pub fn effective() -> u64 {
    gpumem_engine::procfs::read_status("self").ok().and_then(|s| s.cap_eff).unwrap_or(0)
}

fn has(set: u64, cap: u32) -> bool {
    set & (1 << cap) != 0
}

/// What is missing from `set` to load and attach (an error), and what only
/// narrows what the agent sees (warnings).
pub fn check(set: u64) -> (Option<String>, Vec<String>) {
    let can_load = has(set, CAP_SYS_ADMIN) || (has(set, CAP_BPF) && has(set, CAP_PERFMON));
    let error = (!can_load).then(|| {
        let missing: Vec<&str> =
            [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")].into_iter().filter(|&(c, _)| !has(set, c)).map(|(_, n)| n).collect();
        format!(
            "gpumem needs {} to load and attach its eBPF programs; run it as root (sudo), or grant them: \
             setpriv --inh-caps=+sys_admin,+sys_ptrace,+dac_read_search --ambient-caps=+sys_admin,+sys_ptrace,+dac_read_search gpumem ..., \
             or securityContext.capabilities.add in Kubernetes (see deploy/kubernetes)",
            missing.join(" and ")
        )
    });
    let mut warnings = Vec::new();
    if can_load && !has(set, CAP_SYS_ADMIN) {
        warnings.push(
            "without CAP_SYS_ADMIN, kernels since 6.16 (and 6.6/6.12 stable since July 2025) refuse uprobes: \
             libcuda calls will not be traced there (tracepoints still are)"
                .to_string(),
        );
    }
    if !has(set, CAP_SYS_PTRACE) {
        warnings.push(
            "without CAP_SYS_PTRACE, processes of other users are not looked into (their libcuda copies, containers, NVIDIA descriptors)"
                .to_string(),
        );
    }
    if !has(set, CAP_DAC_READ_SEARCH) {
        warnings.push("without CAP_DAC_READ_SEARCH, files of other users (tracefs, their libraries) may be unreadable".to_string());
    }
    (error, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpf_and_perfmon_load_sys_admin_attaches_uprobes() {
        let minimal = (1 << CAP_BPF) | (1 << CAP_PERFMON);
        assert!(check(minimal).0.is_none());
        let w = check(minimal).1;
        assert_eq!(w.len(), 3, "the narrower view is said: {w:?}");
        assert!(w[0].contains("CAP_SYS_ADMIN") && w[0].contains("uprobes"));
        let full = (1 << CAP_SYS_ADMIN) | (1 << CAP_SYS_PTRACE) | (1 << CAP_DAC_READ_SEARCH);
        assert_eq!(check(full), (None, vec![]));
        assert!(check(1 << CAP_SYS_ADMIN).0.is_none());
        assert_eq!(check(1 << CAP_SYS_ADMIN).1.len(), 2, "CAP_SYS_ADMIN does not imply ptrace or DAC read access");
        let e = check(1 << CAP_BPF).0.unwrap();
        assert!(e.contains("needs CAP_PERFMON") && !e.contains("CAP_BPF and"), "{e}");
        assert!(check(0).0.unwrap().contains("CAP_BPF and CAP_PERFMON"));
    }
}
