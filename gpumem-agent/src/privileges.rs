//! What the agent may do: its effective capabilities, checked before loading
//! anything so that a missing one is named instead of surfacing as EPERM.
//!
//! Probing commands (trace, leaks, top, record, status) need CAP_SYS_ADMIN
//! for uprobes: Linux 6.16 ("perf: Revert to requiring CAP_SYS_ADMIN for
//! uprobes", ba677dbe77af, backported to the 6.6 and 6.12 stable series in
//! July 2025) refuses uprobe perf events to CAP_PERFMON alone; before it
//! CAP_BPF (programs, maps) and CAP_PERFMON (tracepoints, reading user
//! memory from the programs) sufficed, so those two still load, with a
//! warning. CAP_SYS_ADMIN implies CAP_BPF and CAP_PERFMON. Wanted:
//! CAP_SYS_PTRACE (/proc/PID/maps, root and fd of other users' processes:
//! their libcuda copies, containers and NVIDIA descriptors) and
//! CAP_DAC_READ_SEARCH (tracefs, and libraries other users own).
//! CAP_SYS_ADMIN also covers mounting tracefs when it is missing and opening
//! a deleted library through /proc/PID/map_files.
//!
//! `serve` answers for the whole node, so what only narrows a probing
//! command's view is required there: the five capabilities the Helm chart
//! grants (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE,
//! CAP_DAC_READ_SEARCH). Reading recordings needs none.

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Who is asking: a command that probes for itself, or the node's daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    Probing,
    Serve,
}

/// The `--help` line of the probing commands.
pub const PROBING_HELP: &str = "Needs root, or CAP_SYS_ADMIN (uprobes since Linux 6.16; it implies CAP_BPF and CAP_PERFMON, \
     which suffice on older kernels); CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH to see other users' processes and libraries. Reading a recording \
     instead (--from, where the command has it) needs none.";
/// The `--help` line of `serve`.
pub const SERVE_HELP: &str = "Needs root, or all five of CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH \
     (what the Helm chart grants): it answers for every process on the node.";
/// The `--help` line of the commands that read a file or ask a running daemon.
pub const NONE_HELP: &str =
    "Needs no privileges: it reads a recording (or asks a running `gpumem serve`, whose socket it must be allowed to open).";
/// The top-level `--help` line.
pub const TOP_HELP: &str = "Privileges: trace, leaks, top, record and status need root or CAP_SYS_ADMIN (plus CAP_SYS_PTRACE and \
     CAP_DAC_READ_SEARCH to see other users); serve needs CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH; \
     replay, report, export and a --from file need none. Exit status: 0 ok, 1 error, 2 bad usage; with -c, the command's own status.";

const NAMES: &[(u32, &str)] = &[
    (CAP_BPF, "CAP_BPF"),
    (CAP_PERFMON, "CAP_PERFMON"),
    (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
];

/// The effective capability set (CapEff in /proc/self/status); 0 if unreadable.
pub fn effective() -> u64 {
    gpumem_engine::procfs::read_status("self").ok().and_then(|s| s.cap_eff).unwrap_or(0)
}

fn has(set: u64, cap: u32) -> bool {
    set & (1 << cap) != 0
}

/// The capabilities of `want` missing from `set`, by name.
fn missing(set: u64, want: &[u32]) -> Vec<&'static str> {
    NAMES.iter().filter(|(c, _)| want.contains(c) && !has(set, *c)).map(|&(_, n)| n).collect()
}

/// The command line to run instead: this one under sudo, each word quoted
/// for a POSIX shell (a word no shell can quote is shown as `…`).
pub fn sudo_line(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|a| shlex::try_quote(a).map_or_else(|_| "…".to_string(), |q| q.into_owned())).collect();
    format!("sudo {}", words.join(" "))
}

/// What is missing from `set` for `role` (an error that names the missing
/// capabilities and the command to run instead, `argv` under sudo), and
/// what only narrows what the agent sees (warnings).
pub fn check(set: u64, role: Role, argv: &[String]) -> (Option<String>, Vec<String>) {
    let can_load = has(set, CAP_SYS_ADMIN) || (has(set, CAP_BPF) && has(set, CAP_PERFMON));
    let grant = "or grant them (setpriv --inh-caps=+sys_admin,+sys_ptrace,+dac_read_search --ambient-caps=+sys_admin,+sys_ptrace,+dac_read_search ...; \
                 securityContext.capabilities.add in Kubernetes, see deploy/kubernetes)";
    let error = match role {
        Role::Probing => (!can_load).then(|| {
            format!(
                "gpumem needs CAP_SYS_ADMIN (or CAP_BPF and CAP_PERFMON before Linux 6.16) to load and attach its eBPF programs; \
                 missing: {}. Run it as root instead: {}, {grant}",
                missing(set, &[CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON]).join(", "),
                sudo_line(argv)
            )
        }),
        Role::Serve => {
            let lacks = missing(set, &[CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH]);
            // CAP_SYS_ADMIN implies CAP_BPF and CAP_PERFMON: only their absence with it missing matters.
            let lacks: Vec<&str> =
                lacks.into_iter().filter(|n| !has(set, CAP_SYS_ADMIN) || !matches!(*n, "CAP_BPF" | "CAP_PERFMON")).collect();
            (!lacks.is_empty()).then(|| {
                format!(
                    "gpumem serve answers for every process on the node and needs CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE \
                     and CAP_DAC_READ_SEARCH; missing: {}. Run it as root instead: {}, {grant}",
                    lacks.join(", "),
                    sudo_line(argv)
                )
            })
        }
    };
    let mut warnings = Vec::new();
    if error.is_some() {
        return (error, warnings);
    }
    if !has(set, CAP_SYS_ADMIN) {
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

    fn argv() -> Vec<String> {
        ["gpumem", "trace", "-c", "python train.py --name 'x'"].map(String::from).to_vec()
    }

    #[test]
    fn bpf_and_perfmon_load_sys_admin_attaches_uprobes() {
        let minimal = (1 << CAP_BPF) | (1 << CAP_PERFMON);
        assert!(check(minimal, Role::Probing, &argv()).0.is_none());
        let w = check(minimal, Role::Probing, &argv()).1;
        assert_eq!(w.len(), 3, "the narrower view is said: {w:?}");
        assert!(w[0].contains("CAP_SYS_ADMIN") && w[0].contains("uprobes"));
        let full = (1 << CAP_SYS_ADMIN) | (1 << CAP_SYS_PTRACE) | (1 << CAP_DAC_READ_SEARCH);
        assert_eq!(check(full, Role::Probing, &argv()), (None, vec![]));
        assert_eq!(check(full, Role::Serve, &argv()), (None, vec![]), "CAP_SYS_ADMIN implies CAP_BPF and CAP_PERFMON");
        assert!(check(1 << CAP_SYS_ADMIN, Role::Probing, &argv()).0.is_none());
        assert_eq!(check(1 << CAP_SYS_ADMIN, Role::Probing, &argv()).1.len(), 2, "CAP_SYS_ADMIN does not imply ptrace or DAC read access");
        let e = check(1 << CAP_BPF, Role::Probing, &argv()).0.unwrap();
        assert!(e.contains("missing: CAP_PERFMON, CAP_SYS_ADMIN."), "{e}");
        assert!(check(0, Role::Probing, &argv()).0.unwrap().contains("missing: CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN."));
    }

    #[test]
    fn serve_needs_what_only_narrows_a_probing_command() {
        let e = check(1 << CAP_SYS_ADMIN, Role::Serve, &["gpumem".into(), "serve".into()]).0.unwrap();
        assert!(e.contains("missing: CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH.") && e.contains("sudo gpumem serve,"), "{e}");
        let e = check((1 << CAP_BPF) | (1 << CAP_PERFMON), Role::Serve, &["gpumem".into(), "serve".into()]).0.unwrap();
        assert!(e.contains("missing: CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH."), "{e}");
    }

    #[test]
    fn the_command_to_run_instead_is_quoted_for_a_shell() {
        let line = sudo_line(&argv());
        let words = shlex::split(&line).unwrap();
        assert_eq!(words[0], "sudo");
        assert_eq!(words[1..], argv()[..], "{line}");
        assert_eq!(sudo_line(&["gpumem".into(), "a\0b".into()]), "sudo gpumem …", "a NUL cannot be quoted");
    }
}
