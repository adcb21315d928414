//! Command-line interface (clap). No logic here.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gpumem_engine::formats::arm64_probe::Policy;

pub mod actions;
pub mod continuity;
pub mod export;
pub mod kube;
mod parse;
pub mod preflight;

pub use parse::{parse_age, parse_bytes, parse_duration};
use parse::{parse_prefix, parse_ringbuf, parse_sample_bytes, parse_stack_budget};

use crate::{
    privileges,
    probes::{ioctl::IoctlMode, links::UprobeLinks, ProbeSet},
};

#[derive(Debug, Parser)]
#[command(
    name = "gpumem",
    version = crate::VERSION,
    about = "Who holds GPU memory on this host, and why: eBPF tracing of the CUDA driver, no changes to the traced programs",
    after_help = privileges::TOP_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream CUDA memory events as they happen, then summarise per process and device.
    #[command(after_help = privileges::PROBING_HELP)]
    Trace(TraceArgs),
    /// Find GPU memory leaks: after tracing, the allocations still outstanding and
    /// older than --older-than, per process and device, grouped by allocation stack,
    /// with a growth verdict per process.
    #[command(after_help = privileges::PROBING_HELP)]
    Leaks(LeaksArgs),
    /// A live view of who holds GPU memory: per GPU, then per process, with
    /// growth, trend, leak verdict and last failure (q quits).
    #[command(after_help = privileges::PROBING_HELP)]
    Top(TopArgs),
    /// Record a session to a file (events, stacks symbolized now, lookups) for
    /// `trace --from`, `leaks --from` and `replay`, here or on another host.
    #[command(after_help = privileges::PROBING_HELP)]
    Record(RecordArgs),
    /// Replay a recording: its events and summary, as `trace --from FILE`.
    #[command(after_help = privileges::NONE_HELP)]
    Replay(ReplayArgs),
    /// Draw a recording: a self-contained HTML page (memory over time per GPU
    /// and process, OOM and XID marks, ECC and temperatures, allocation sizes,
    /// leak suspects with stacks) and/or one SVG chart for a ticket.
    #[command(after_help = privileges::NONE_HELP)]
    Report(ReportArgs),
    /// Write what gpumem found in the formats other tools read: a pprof heap
    /// profile, PyTorch's memory snapshot, a Perfetto trace; from a recording
    /// or a running daemon.
    #[command(after_help = privileges::NONE_HELP)]
    Export(export::ExportArgs),
    /// Show kernel features, every libcuda found and every probe attached or skipped.
    #[command(after_help = privileges::PROBING_HELP)]
    Status(StatusArgs),
    /// On arm64: which probe sites of these libraries gpumem would attach
    /// on a kernel, and why not the others (the instruction at each; nothing
    /// is attached; any host can check arm64 files).
    #[command(after_help = privileges::NONE_HELP)]
    Preflight(preflight::PreflightArgs),
    /// GPU health from NVML: ECC, retired pages, remapped rows, temperatures, a score
    /// with its reasons. Exit status 3 when NVML is unavailable.
    Health(HealthArgs),
    /// Run as a daemon: trace every process on the host and serve Prometheus
    /// metrics on /metrics (and /healthz) until SIGTERM or SIGINT.
    #[command(after_help = privileges::SERVE_HELP)]
    Serve(Box<ServeArgs>),
    /// Isolation actions for `serve --action`: cordon or taint this node,
    /// or delete the pod the event names, through the Kubernetes API with
    /// the pod's service account (the event's JSON on stdin).
    Kube(kube::KubeArgs),
    /// Attach probes and wait, for overhead measurements (see `cargo xtask bench`).
    #[command(hide = true)]
    Bench(BenchArgs),
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

#[derive(Debug, Args, Clone)]
pub struct ProbeArgs {
    /// Also attach to this libcuda file (repeatable). Copies found in ld.so.cache
    /// and in running processes are attached without it.
    #[arg(long = "libcuda", value_name = "PATH")]
    pub libcuda: Vec<PathBuf>,
    /// Do not look for libcuda copies beyond those given with --libcuda.
    #[arg(long)]
    pub no_discover: bool,
    /// Path prefix of NVIDIA device nodes whose ioctls are traced
    /// (`<prefix>ctl`, `<prefix>0`, `<prefix>-uvm`).
    #[arg(long, value_name = "PREFIX", default_value = "/dev/nvidia", value_parser = parse_prefix)]
    pub nvidia_dev_prefix: String,
    /// How to trace NVIDIA driver ioctls: `auto` uses kprobes on the driver where the
    /// kernel has them and the module is loaded (no cost for other ioctls), the syscall
    /// tracepoints for a stand-in device given with --nvidia-dev-prefix, and nothing
    /// otherwise; `tracepoints` forces the fallback, which slows every ioctl on the
    /// host (about 2x) and every other syscall (about 1.2x), see README.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = IoctlMode::Auto)]
    pub ioctl: IoctlMode,
    /// NVML library: GPU readings, the GPU each process is on (for contexts
    /// made before the agent started) and traced bytes reconciled with the
    /// driver's per-process figures (default: libnvidia-ml.so.1 from the
    /// library path, when there is one).
    #[arg(long, value_name = "PATH", conflicts_with = "no_nvml")]
    pub nvml: Option<PathBuf>,
    /// Do not use NVML at all.
    #[arg(long)]
    pub no_nvml: bool,
    /// Copy the caller's stack at each allocation (up to 8 KiB, unwound in the
    /// agent). `off` lowers the per-call cost (see README, What the probes
    /// cost); leaks are then reported without call sites.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = Switch::On)]
    pub stacks: Switch,
    /// Size of the kernel's stack ring in bytes (a power of two, at least
    /// 4096): allocations beyond what it holds arrive without their stack
    /// (counted as dropped stacks); accounting has its own ring. Default:
    /// by the host's class, 1 MiB per online CPU within 4-64 MiB (`status`
    /// says what was chosen).
    #[arg(long, value_name = "BYTES", value_parser = parse_ringbuf)]
    pub stack_ring_bytes: Option<u32>,
    /// Stacks per second each process may have copied in full (0: no budget,
    /// every stack); beyond it, stacks are sampled by bytes (see
    /// --stack-sample-bytes) and per-stack figures are shown as estimates.
    /// Accounting is never sampled.
    #[arg(long, value_name = "PER_S", value_parser = parse_stack_budget, default_value_t = gpumem_engine::stacks::policy::DEFAULT_BUDGET_PER_S)]
    pub stack_budget: u32,
    /// Full stacks the budget holds at most, and what a new or long-idle
    /// process gets at once before the per-second rate applies (0: one
    /// second's worth).
    #[arg(long, value_name = "N", value_parser = parse_stack_budget, default_value_t = gpumem_engine::stacks::policy::DEFAULT_BURST)]
    pub stack_burst: u32,
    /// Beyond the budget, an allocation of SIZE bytes has its stack taken
    /// with probability 1 - exp(-SIZE/BYTES) and stands for 1/p allocations
    /// (as Go's and tcmalloc's heap profiles do).
    #[arg(long, value_name = "BYTES", value_parser = parse_sample_bytes, default_value = "512KiB")]
    pub stack_sample_bytes: u64,
    /// How uprobes are linked to libcuda: `auto` makes one uprobe_multi link per
    /// library and direction where the kernel has them (6.6+: every entry point
    /// attached at once, detached in one step), else one link per entry point.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = UprobeLinks::Auto)]
    pub uprobe_links: UprobeLinks,
    /// Tests: act as a kernel that refuses uprobe_multi links.
    #[arg(long, hide = true)]
    pub refuse_uprobe_multi: bool,
    /// On arm64 hosts, which probe sites are attached: `strict` only those
    /// whose instruction the kernel simulates; `allow-xol` also those it
    /// single-steps out of line (most function entries: the path blamed for
    /// processes resumed at a wrong PC on GB300); `off` none. Ignored on
    /// x86_64. `gpumem status` says per site what was decided and why.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = Policy::Strict, env = "GPUMEM_ARM64_UPROBES")]
    pub arm64_uprobes: Policy,
    /// Tests and benchmarks: act as if no dynamic loader could be hooked
    /// (discovery falls back to scanning every process).
    #[arg(long, hide = true)]
    pub refuse_loader_hooks: bool,
    /// Tests: a `gpumem: milestone …` line on stderr when a reading (NVML,
    /// host memory, a growth sample) has been applied and after each
    /// maintenance tick: what a test waits for instead of a fixed time.
    #[arg(long, hide = true)]
    pub milestones: bool,
}

/// What to trace and for how long (shared by trace and leaks).
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Trace only this process (repeatable). Tracing ends when all of them have exited.
    #[arg(short = 'p', long = "pid", value_name = "PID", conflicts_with = "command")]
    pub pids: Vec<u32>,
    /// Start this command (run by /bin/sh), trace it and its children until it exits
    /// (or --duration ends first; the command is then left running), and exit with its status.
    #[arg(short = 'c', long = "command", value_name = "CMD")]
    pub command: Option<String>,
    /// Stop after this many seconds (fractions allowed); default: until Ctrl-C or the command exits.
    #[arg(long, value_name = "SECONDS", value_parser = parse_duration, allow_negative_numbers = true)]
    pub duration: Option<f64>,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub daemon: continuity::DaemonArgs,
    /// Show only events of at least this size (e.g. 4096, 64K, 20MiB). The summary counts everything.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub min_size: Option<u64>,
    /// Show only failed calls (nonzero CUresult). The summary counts everything.
    #[arg(long)]
    pub failed_only: bool,
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// One JSON object per line; the last one is the summary (`"type":"summary"`).
    #[arg(long)]
    pub json: bool,
    /// Most live allocations, VMM handles, mappings and reservations kept in memory;
    /// beyond it events are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub max_allocations: usize,
    /// Size of the kernel's accounting ring in bytes (a power of two, at
    /// least 4096). Default: by the host's class, 1 MiB per online CPU
    /// within 4-64 MiB (`status` says what was chosen).
    #[arg(long, value_name = "BYTES", value_parser = parse_ringbuf)]
    pub ringbuf_bytes: Option<u32>,
    /// Also write a recording of the session to this file (see `gpumem record`).
    #[arg(long, value_name = "FILE", conflicts_with = "from")]
    pub record: Option<PathBuf>,
    /// Read the session from a recording instead of tracing.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["pids", "command", "duration"])]
    pub from: Option<PathBuf>,
    /// Fault injection for tests: do not read events for this long after start.
    #[arg(long, value_name = "MS", hide = true)]
    pub stall_reader_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Report only allocations at least this old when the report is made.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = parse_age, allow_negative_numbers = true)]
    pub older_than: f64,
    /// Show the largest N stacks per process and device.
    #[arg(short = 'n', long = "top", value_name = "N", default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Print the report as one JSON object (`"type":"leaks"`).
    #[arg(long)]
    pub json: bool,
    /// Also write a recording of the session to this file (see `gpumem record`).
    #[arg(long, value_name = "FILE", conflicts_with = "from")]
    pub record: Option<PathBuf>,
    /// Read the session from a recording instead of tracing.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["pids", "command", "duration"])]
    pub from: Option<PathBuf>,
    /// Most live allocations kept in memory; beyond it allocations are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub max_allocations: usize,
    #[command(flatten)]
    pub daemon: continuity::DaemonArgs,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Print one snapshot as text after --duration seconds and exit (for scripts).
    #[arg(long)]
    pub once: bool,
    /// With --once: seconds to trace before the snapshot.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = parse_duration, allow_negative_numbers = true)]
    pub duration: f64,
    /// Seconds between screen updates.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_duration, allow_negative_numbers = true)]
    pub interval: f64,
    /// Show the end of a recording instead of tracing.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Most live allocations kept in memory.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub max_allocations: usize,
    /// Seconds an exited process stays in the table before it is forgotten.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = parse_age, allow_negative_numbers = true)]
    pub exited_grace: f64,
    #[command(flatten)]
    pub daemon: continuity::DaemonArgs,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("out").required(true).multiple(true).args(["output", "svg"]))]
pub struct ReportArgs {
    /// A file written by `gpumem record` (or `--record`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The HTML page to write.
    #[arg(short = 'o', long = "output", value_name = "HTML")]
    pub output: Option<PathBuf>,
    /// Also (or only) write one chart as an SVG file (--chart says which).
    #[arg(long, value_name = "SVG")]
    pub svg: Option<PathBuf>,
    /// With --svg: GPU memory per process, or host memory per process.
    #[arg(long, value_enum, default_value_t = ReportChart::Memory)]
    pub chart: ReportChart,
    /// With --svg --chart memory: only this GPU.
    #[arg(long, value_name = "N")]
    pub gpu: Option<i32>,
    /// Leak suspects: live allocations at least this old at the end of the recording.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = parse_age, allow_negative_numbers = true)]
    pub older_than: f64,
}

/// The chart `report --svg` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportChart {
    /// Live GPU memory per process (and GPU).
    Memory,
    /// Resident, swapped-out and pinned host memory per process.
    Host,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The recording to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Most live allocations kept in memory; beyond it events are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub max_allocations: usize,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A file written by `gpumem record` (or `--record`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// One JSON object per line, as `trace --json`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Seconds between the two readings that rates are computed from.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = parse_duration, allow_negative_numbers = true)]
    pub interval: f64,
    /// NVML library to load (default: libnvidia-ml.so.1 from the library path).
    #[arg(long, value_name = "PATH")]
    pub nvml: Option<PathBuf>,
    /// Where the loaded NVIDIA kernel module says its version (compared
    /// with NVML's; another path for tests).
    #[arg(long, value_name = "PATH", default_value = crate::driver::VERSION_FILE)]
    pub driver_version_file: PathBuf,
    /// Corrected ECC errors per hour above which a card warns.
    #[arg(long, value_name = "N", default_value_t = 10.0)]
    pub ecc_warn_per_hour: f64,
    /// Corrected ECC errors per hour above which a card is critical.
    #[arg(long, value_name = "N", default_value_t = 50.0)]
    pub ecc_critical_per_hour: f64,
    /// Memory (HBM) temperature above which a card warns, in °C.
    #[arg(long, value_name = "CELSIUS", default_value_t = 85)]
    pub hbm_temp_c: u32,
    /// Keep reading every --interval and report after each reading, over the
    /// window since start (one JSON object per line with --json).
    #[arg(long)]
    pub watch: bool,
    /// With --watch: stop after this many reports.
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
    /// Print the report as one JSON object (`"type":"health"`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve /metrics, /healthz and the live page (/) on. Loopback
    /// by default: binding another address exposes process names, pids (and,
    /// on the page, their stacks) to whoever can reach it.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
    pub listen: std::net::SocketAddr,
    /// Do not serve the live page (/ and its /api/v1/ questions) beside /metrics.
    #[arg(long)]
    pub no_page: bool,
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Seconds between NVML readings (memory, ECC, temperatures, health).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_duration, allow_negative_numbers = true)]
    pub nvml_interval: f64,
    /// Most (process, device) series exported; the smallest holders beyond it
    /// are summed into one series per GPU with comm="other".
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_process_series: u32,
    /// Seconds an exited process's series stay (at 0) before they are removed.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = parse_age, allow_negative_numbers = true)]
    pub exited_grace: f64,
    /// While a process's growth detector fires, its live allocations older
    /// than this are exported as leak suspects.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0, value_parser = parse_age, allow_negative_numbers = true)]
    pub leak_age: f64,
    /// Seconds between samples of live bytes for the growth detector (it
    /// judges the last 5 minutes; the default is every other command's).
    #[arg(long, value_name = "SECONDS", default_value_t = gpumem_engine::analysis::growth::SAMPLE_INTERVAL_S, value_parser = parse_duration, allow_negative_numbers = true)]
    pub growth_interval: f64,
    /// Most live allocations, VMM handles, mappings and reservations kept in memory;
    /// beyond it they are counted in gpumem_table_overflow_total.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub max_allocations: usize,
    /// Size of the kernel's accounting ring in bytes (a power of two, at
    /// least 4096). Default: by the host's class, 1 MiB per online CPU
    /// within 4-64 MiB (`status` says what was chosen).
    #[arg(long, value_name = "BYTES", value_parser = parse_ringbuf)]
    pub ringbuf_bytes: Option<u32>,
    #[command(flatten)]
    pub continuity: continuity::ContinuityArgs,
    /// Also push the metrics over OTLP/HTTP protobuf (cumulative) to this
    /// receiver, e.g. http://collector:4318/v1/metrics.
    #[arg(long, value_name = "URL", value_parser = crate::http_post::Endpoint::otlp)]
    pub otlp_endpoint: Option<crate::http_post::Endpoint>,
    /// How often to push OTLP.
    #[arg(long, value_name = "SECONDS", default_value_t = 15.0, value_parser = parse_duration, allow_negative_numbers = true)]
    pub otlp_interval: f64,
    /// Where NVML's XID events are not available (no NVML, or a driver or
    /// device without them), read XIDs from this kernel log (`NVRM: Xid`
    /// lines; needs CAP_SYSLOG where dmesg is restricted); "none": do not.
    #[arg(long, value_name = "PATH", default_value = "/dev/kmsg")]
    pub kmsg: PathBuf,
    #[command(flatten)]
    pub actions: actions::ActionArgs,
    /// The local API's socket (root only), through which top, leaks and
    /// status use this daemon.
    #[arg(long, value_name = "PATH", default_value = crate::daemon::DEFAULT_SOCKET)]
    pub socket: Option<PathBuf>,
    /// Let this group's members use the local API too (name or number; the
    /// socket becomes mode 0660, and each connection's peer is checked).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Fault injection for tests: the first N renderings of /metrics fail.
    #[arg(long, value_name = "N", default_value_t = 0, hide = true)]
    pub fail_renders: u32,
    /// Fault injection for tests: the first N reads of the kernel's counters fail.
    #[arg(long, value_name = "N", default_value_t = 0, hide = true)]
    pub fail_counter_reads: u32,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Where the loaded NVIDIA kernel module says its version (compared
    /// with the user-space libraries'; another path for tests).
    #[arg(long, value_name = "PATH", default_value = crate::driver::VERSION_FILE)]
    pub driver_version_file: PathBuf,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub daemon: continuity::DaemonArgs,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which programs to attach: gpumem's (`full`) or empty ones (the baseline).
    #[arg(long = "probes", value_enum)]
    pub probe_set: ProbeSet,
    #[command(flatten)]
    pub probes: ProbeArgs,
    /// Command to run while the probes are attached.
    #[arg(short = 'c', long = "command", value_name = "CMD")]
    pub command: String,
    /// As `serve` runs: the kernel's table of live entries kept, state
    /// pinned here (the caller removes it with `serve --cleanup`).
    #[arg(long, value_name = "DIR", hide = true)]
    pub pin_dir: Option<PathBuf>,
}

/// The longest duration or age accepted (about three years): longer ones
/// would overflow the clock arithmetic they feed, and mean "forever" anyway.
const SECONDS_MAX: f64 = 1e8;

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn each_command_says_the_privileges_it_needs() {
        let mut cli = Cli::command();
        let help = |cli: &mut clap::Command, name: &str| cli.find_subcommand_mut(name).unwrap().render_long_help().to_string();
        for probing in ["trace", "leaks", "top", "record", "status"] {
            assert!(help(&mut cli, probing).contains(privileges::PROBING_HELP), "{probing}");
        }
        let serve = help(&mut cli, "serve");
        assert!(serve.contains("CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (what the Helm chart grants)"), "{serve}");
        for reading in ["replay", "report", "export"] {
            assert!(help(&mut cli, reading).contains("Needs no privileges"), "{reading}");
        }
        assert!(cli.render_long_help().to_string().contains("serve needs CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN"));
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("20MiB"), Ok(20 << 20));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_duration("1.5"), Ok(1.5));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("1e300").is_err());
        assert_eq!(parse_age("1e8"), Ok(1e8));
        assert!(parse_age("1e9").is_err());
        assert_eq!(parse_ringbuf("4096"), Ok(4096));
        assert!(parse_ringbuf("5000").is_err());
        assert!(parse_ringbuf("1024").is_err());
    }

    /// Every option given a wrong value is a usage error (exit status 2)
    /// whose message names the option and what is wrong.
    #[test]
    fn wrong_values_are_usage_errors_that_say_what_is_wrong() {
        for (args, says) in [
            (&["trace", "--min-size", "lots"][..], "use e.g. 4096, 64K or 20MiB"),
            (&["trace", "--duration", "-1"], "duration must be a positive number of seconds"),
            (&["trace", "--duration", "0"], "duration must be a positive number of seconds"),
            (&["trace", "--duration", "1e300"], "is too long: at most 1e8 seconds"),
            (&["leaks", "--older-than", "1e20"], "is too long: at most 1e8 seconds"),
            (&["trace", "--ringbuf-bytes", "5000"], "a power of two between 4096 and 1GiB"),
            (&["trace", "-p", "x"], "'--pid <PID>'"),
            (&["trace", "--ioctl", "maybe"], "[possible values: auto, kprobes, tracepoints, off]"),
            (&["trace", "--nvidia-dev-prefix", "rel"], "must be an absolute path"),
            (&["leaks", "--older-than", "soon"], "`soon` is not a number of seconds"),
            (&["leaks", "--older-than", "-3"], "age must be zero or a positive number of seconds"),
            (&["leaks", "-n", "many"], "'--top <N>'"),
            (&["health", "--interval", "0"], "duration must be a positive number of seconds"),
            (&["health", "--count", "3"], "--watch"),
            (&["serve", "--listen", "nope"], "invalid socket address syntax"),
            (&["serve", "--max-process-series", "0"], "0 is not in 1.."),
            (&["serve", "--exited-grace", "-5"], "age must be zero or a positive number of seconds"),
            (&["serve", "--nvml-interval", "x"], "`x` is not a number of seconds"),
            (&["top", "--interval", "0"], "duration must be a positive number of seconds"),
            (&["record", "-c", "true"], "--output <FILE>"),
            (&["report", "f.rec"], "--output <HTML>"),
            (&["trace", "--from", "f.rec", "-c", "true"], "cannot be used with"),
            (&["trace", "--bogus"], "unexpected argument '--bogus'"),
            (&["trace", "--stacks", "maybe"], "[possible values: on, off]"),
            (&["trace", "--stack-budget", "2000000"], "stacks per second from 0 (no budget) to 1000000"),
            (&["trace", "--stack-sample-bytes", "0"], "between 1 byte and 1TiB"),
            (&["trace", "--stack-ring-bytes", "5000"], "a power of two"),
            (&["trace", "--nvml", "x", "--no-nvml"], "cannot be used with"),
            (&["top", "--exited-grace", "-1"], "age must be zero or a positive number of seconds"),
        ] {
            let mut argv = vec!["gpumem"];
            argv.extend_from_slice(args);
            let e = Cli::try_parse_from(&argv).expect_err(&format!("{args:?} must be refused"));
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let msg = e.render().to_string();
            assert!(msg.contains(says), "{args:?}: `{says}` not in:\n{msg}");
        }
    }

    #[test]
    fn pid_and_command_conflict() {
        assert!(Cli::try_parse_from(["gpumem", "trace", "-p", "1", "-c", "true"]).is_err());
        assert!(Cli::try_parse_from(["gpumem", "trace", "-p", "x"]).is_err());
    }
}
