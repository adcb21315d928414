//! `cargo xtask …`: everything a fresh machine needs, in one place.
//!
//! - `setup`: llvm-22-dev, bpf-linker 0.13.0 built for LLVM 22, rust-src (each only if missing)
//! - `lint`: module and function sizes, no import cycle between modules, no aya or tokio under the engine, rustfmt's check and clippy (warnings are errors) on every crate, the eBPF one included
//! - `nvidia-libs`: NVIDIA's libcuda1/libnvidia-ml1 535 from Debian non-free, unpacked under target/nvidia
//! - `demo`: the real agent on the bundled synthetic driver: trace, leaks, health, a recording drawn as a report
//! - `test`: setup, test-deps, the source rules, one build linted by clippy as it compiles, the image, then every test (unit tests in parallel, end-to-end ones as root, one at a time)
//! - `bench`: probe overhead as a ratio to empty probes on the same symbols
//! - `bench-export`: `gpumem export`'s time and size per format for a 1 M-event recording
//! - `bench-engine`: events/s through the pipeline (decode → lookups → stacks → state → analyses) from a recording; bytes per live allocation
//! - `bench-metrics`: /metrics render time and size, the daemon's idle memory and CPU
//! - `bench-stacks`: unwinding and symbolization (uncached, cached) per stack
//! - `bench-verdicts`: the growth detector's recall, precision and time to verdict on its labelled corpus (recordings under target/verdict-corpus)
//! - `bench-idle`: the daemon's idle CPU among many host processes (discovery's cost)
//! - `bench-agent`: the daemon's CPU per allocation at steady rates, stacks on
//! - `soak`: `gpumem serve` for 10 minutes under process churn and a million live allocations
mod bench;
mod fuzz;
mod image;
mod layers;
mod setup;
mod size;
mod soak;

use std::process::Command;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gpumem build, set-up, demo, test and benchmark helpers")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building gpumem needs, when missing.
    Setup,
    /// Fetch NVIDIA's real user-space driver libraries (Debian non-free) into target/nvidia.
    NvidiaLibs,
    /// Fetch and make what the end-to-end tests run against besides the build:
    /// NVIDIA's libraries, the trixie (python3.13) and noble (python3.12)
    /// roots, PyTorch's libc10_cuda.so (`test` does this first).
    TestDeps,
    /// Trace a leaky workload on the bundled synthetic CUDA driver.
    Demo,
    /// Sizes (modules ≤ 500 lines, functions ≤ 80, outside tests), rustfmt and
    /// clippy (warnings are errors) on every crate, the eBPF one included.
    Lint,
    /// Run every test (unit and end-to-end). Needs root.
    Test {
        /// Extra arguments for the test binaries (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Measure what the ioctl path costs ioctls that are not NVIDIA's.
    BenchIoctl {
        /// ioctls per run
        #[arg(long, default_value_t = 200000)]
        calls: u64,
        /// runs of each configuration, interleaved
        #[arg(long, default_value_t = 5)]
        rounds: u32,
    },
    /// Measure the engine's throughput (decode → state → analyses, no kernel) and its memory per live allocation.
    BenchEngine {
        /// events in the synthetic recording
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
    },
    /// Write deploy/kubernetes/gpumem-daemonset.yaml from the Helm chart (deploy/helm/gpumem).
    Manifests,
    /// Build the OCI image (target/image/gpumem-oci.tar, an OCI image layout archive) with umoci.
    Image,
    /// Measure `gpumem export`'s time and file size per format on a synthetic recording.
    BenchExport {
        /// events in the synthetic recording
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
    },
    /// Run every cargo-fuzz target (fuzz/: the parsers of untrusted bytes) for
    /// SECONDS each under libFuzzer and AddressSanitizer (nightly toolchain).
    Fuzz {
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// The growth detector on its labelled corpus of allocator shapes: recall, precision, time to verdict.
    BenchVerdicts,
    /// Measure unwinding and symbolization (uncached and cached) per stack.
    BenchStacks {
        #[arg(long, default_value_t = 20_000)]
        rounds: u32,
    },
    /// Measure /metrics render time and size, and `gpumem serve`'s idle memory and CPU.
    BenchMetrics {
        /// seconds the daemon is left idle for the CPU measurement
        #[arg(long, default_value_t = 30)]
        idle: u64,
    },
    /// Measure `gpumem serve`'s idle CPU among many host processes, with
    /// event-driven discovery and, side by side, with every process scanned
    /// twice a second (the fallback).
    BenchIdle {
        /// idle host processes (`sleep`) started for the measurement
        #[arg(long, default_value_t = 2000)]
        processes: u32,
        /// seconds the daemon is measured for, in each mode
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
    /// Measure `gpumem serve`'s CPU per allocation at steady rates (1 000/s
    /// and 10 000/s, 16-frame stacks), beside the daemon at rest.
    BenchAgent {
        /// seconds at each rate
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// the workload in Python over ctypes (Python frames resolved) instead of C
        #[arg(long)]
        python: bool,
    },
    /// Soak `gpumem serve`: process churn and many live allocations, memory sampled every 10 s.
    Soak {
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
        /// allocations one process keeps live
        #[arg(long, default_value_t = 1_100_000)]
        live: u64,
        /// the agent's --max-allocations
        #[arg(long, default_value_t = 1 << 20)]
        max_allocations: u64,
        /// restart the daemon every this many seconds (SIGKILL and SIGTERM in turn)
        #[arg(long, value_name = "SECONDS")]
        restart_every: Option<f64>,
    },
    /// Measure probe overhead against empty probes on the same symbols.
    Bench {
        /// alloc/free pairs per run
        #[arg(long, default_value_t = 20000)]
        pairs: u64,
        /// runs of each configuration, interleaved
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// the loop in Python over ctypes (Python frames walked) instead of C
        #[arg(long)]
        python: bool,
        /// PyTorch's USDT probes instead of libcuda's: a Python loop over the
        /// test allocator (tensors from its cache), bpftrace's usdt: as the peer
        #[arg(long)]
        usdt: bool,
    },
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

pub fn require_root(what: &str) -> Result<()> {
    if !is_root() {
        bail!("{what} needs root (it loads eBPF programs and installs packages); run it with sudo");
    }
    Ok(())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// The size rules, the direction of imports, rustfmt's check, then clippy
/// with warnings as errors: the host crates with every target, and the eBPF
/// crate for its own target.
fn lint() -> Result<()> {
    lint_source()?;
    run(cargo().args(["clippy", "--workspace", "--exclude", "gpumem-ebpf", "--all-targets", "--", "-D", "warnings"]))
}

/// What lint checks without building the host crates: sizes, import
/// cycles, the engine's dependencies, formatting, and clippy on the eBPF
/// crate (it builds core from source, on stable with RUSTC_BOOTSTRAP for
/// that build only), with and without the benchmark's programs.
fn lint_source() -> Result<()> {
    let root = gpumem_tests::workspace();
    size::check(&root)?;
    layers::check_cycles(&root)?;
    layers::check_engine_deps(&root)?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    for features in ["", "bench"] {
        run(cargo()
            .args(["clippy", "--target", "bpfel-unknown-none", "-Z", "build-std=core", "--features", features, "--", "-D", "warnings"])
            .current_dir(root.join("gpumem-ebpf"))
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", gpumem_tests::target_dir().join("ebpf-lint")))?;
    }
    Ok(())
}

/// `cmd` (a cargo build of the host crates) with clippy linting each
/// workspace crate as it is compiled, warnings as errors: what `cargo
/// clippy` does, without a second, check-only compilation of everything.
/// Every build in `cargo xtask test` goes through it, so they share artifacts.
fn linted(cmd: &mut Command) -> Result<&mut Command> {
    let out = Command::new("rustup").args(["which", "clippy-driver"]).current_dir(gpumem_tests::workspace()).output()?;
    if !out.status.success() {
        bail!("clippy-driver is not installed for this toolchain: rustup component add clippy");
    }
    let driver = String::from_utf8(out.stdout)?.trim().to_string();
    Ok(cmd.env("RUSTC_WORKSPACE_WRAPPER", driver).env("CLIPPY_ARGS", "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"))
}

/// The plain manifest: the chart's defaults rendered with a Namespace.
fn manifest(helm: &std::path::Path) -> Result<String> {
    let out = Command::new(helm)
        .args(gpumem_tests::PLAIN_MANIFEST_HELM_ARGS)
        .current_dir(gpumem_tests::workspace())
        .output()
        .context("running helm")?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(format!("{}{}", gpumem_tests::PLAIN_MANIFEST_HEADER, String::from_utf8(out.stdout)?))
}

/// The engine benchmarks (gpumem-agent/benches/engine), built for release
/// on the library the agent ships, in mode `args[0]`.
pub fn engine_bench(args: &[&str]) -> Command {
    let mut c = cargo();
    c.args(["bench", "--quiet", "-p", "gpumem-agent", "--bench", "engine", "--"]).args(args);
    c
}

/// Builds the agent (debug) and returns its path.
pub fn build_agent() -> Result<std::path::PathBuf> {
    run(cargo().args(["build", "-p", "gpumem-agent"]))?;
    Ok(gpumem_tests::target_dir().join("debug/gpumem"))
}

/// Builds the agent (debug) with the overhead benchmark's empty programs
/// (`--probe-set empty`), and returns its path.
pub fn build_agent_for_bench() -> Result<std::path::PathBuf> {
    run(cargo().args(["build", "-p", "gpumem-agent", "--features", "bench"]))?;
    Ok(gpumem_tests::target_dir().join("debug/gpumem"))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Setup => setup::setup(),
        Cmd::NvidiaLibs => setup::nvidia_libs().map(|_| ()),
        Cmd::TestDeps => setup::test_deps(),
        Cmd::Image => {
            let tar = image::build()?;
            let digest = std::process::Command::new("sha256sum").arg(&tar).output()?;
            eprintln!(
                "xtask: wrote {} ({})",
                tar.display(),
                String::from_utf8_lossy(&digest.stdout).split_whitespace().next().unwrap_or("")
            );
            Ok(())
        }
        Cmd::Manifests => {
            let text = manifest(&setup::helm()?)?;
            std::fs::write(gpumem_tests::workspace().join(gpumem_tests::PLAIN_MANIFEST), text)?;
            Ok(())
        }
        Cmd::Lint => {
            setup::setup()?;
            lint()
        }
        Cmd::Demo => {
            require_root("the demo")?;
            setup::setup()?;
            let bin = build_agent()?;
            let f = gpumem_tests::fixtures();
            let lib = f.libcuda.to_str().unwrap();
            // 1. Every call of a workload that leaks a little, and the summary.
            let cmd = gpumem_tests::workload_cmd("leaky");
            println!("\n$ gpumem trace --libcuda {lib} -c '{cmd}'\n");
            run(Command::new(&bin).args(["trace", "--libcuda", lib, "-c", &cmd]))?;
            // 2. Where a leak comes from: a program built without frame pointers.
            gpumem_tests::wait_for_detach();
            let cmd = gpumem_tests::workload_cmd("deep_leak");
            println!("\n$ gpumem leaks --older-than 1 --duration 3 --libcuda {lib} -c '{cmd}'\n");
            run(Command::new(&bin).args(["leaks", "--older-than", "1", "--duration", "3", "--libcuda", lib, "-c", &cmd]))?;
            // 3. Device health, from the synthetic NVML.
            let nvml = f.nvml.to_str().unwrap();
            println!("\n$ gpumem health --interval 1 --nvml {nvml}\n");
            run(Command::new(&bin).args(["health", "--interval", "1", "--nvml", nvml]))?;
            // 4. A recording, drawn as a page to open in a browser.
            gpumem_tests::wait_for_detach();
            let dir = gpumem_tests::target_dir().join("demo");
            std::fs::create_dir_all(&dir)?;
            let (rec, html) = (dir.join("session.gpumemrec"), dir.join("report.html"));
            let cmd = gpumem_tests::workload_cmd("leaky");
            println!("\n$ gpumem record -o {} --nvml {nvml} --libcuda {lib} -c '{cmd}'", rec.display());
            run(Command::new(&bin).args(["record", "-o", rec.to_str().unwrap(), "--nvml", nvml, "--libcuda", lib, "-c", &cmd]))?;
            println!("$ gpumem report {} -o {}", rec.display(), html.display());
            run(Command::new(&bin).args(["report", rec.to_str().unwrap(), "-o", html.to_str().unwrap()]))
        }
        Cmd::Test { args } => test(&args),
        Cmd::BenchEngine { events } => run(&mut engine_bench(&["engine", "--events", &events.to_string()])),
        Cmd::BenchExport { events } => run(&mut engine_bench(&["export", "--events", &events.to_string()])),
        Cmd::Fuzz { seconds } => fuzz::fuzz(seconds),
        Cmd::BenchVerdicts => {
            let out = gpumem_tests::target_dir().join("verdict-corpus");
            run(&mut engine_bench(&["verdicts", "--out", out.to_str().context("target dir is not UTF-8")?]))
        }
        Cmd::BenchStacks { rounds } => run(&mut engine_bench(&["stacks", "--rounds", &rounds.to_string()])),
        measurement => measure(measurement),
    }
}

/// Everything CI runs: set-up, the source rules, one build of every host
/// crate linted as it compiles (the agent and every test target), the image,
/// then the unit tests (in parallel) and the end-to-end ones (one at a time:
/// they load eBPF and mount tracefs). Both test runs go to the end; either
/// failing fails the whole.
fn test(args: &[String]) -> Result<()> {
    require_root("the test suite")?;
    setup::setup()?;
    setup::test_deps()?;
    lint_source()?;
    run(linted(cargo().args(["build", "-p", "gpumem-agent"]))?)?;
    run(linted(cargo().args(["test", "--workspace", "--exclude", "gpumem-ebpf", "--all-targets", "--no-run"]))?)?;
    // The image the image tests unpack and run.
    image::build()?;
    let unit = run(linted(
        cargo().args(["test", "--workspace", "--exclude", "gpumem-ebpf", "--exclude", "gpumem-tests", "--no-fail-fast", "--"]).args(args),
    )?);
    let e2e = run(linted(cargo().args(["test", "-p", "gpumem-tests", "--no-fail-fast", "--", "--test-threads=1"]).args(args))?);
    // Every parser of untrusted bytes, briefly (a longer run: `cargo xtask fuzz`).
    let fuzzed = if args.is_empty() { fuzz::fuzz(fuzz::CI_SECONDS) } else { Ok(()) };
    unit.and(e2e).and(fuzzed)
}

/// The benchmarks and the soak that run the agent: as root, set up first.
fn measure(cmd: Cmd) -> Result<()> {
    require_root("the measurement")?;
    setup::setup()?;
    match cmd {
        Cmd::BenchIoctl { calls, rounds } => bench::ioctl_overhead(calls, rounds),
        Cmd::BenchMetrics { idle } => bench::metrics(idle),
        Cmd::BenchIdle { processes, seconds } => bench::idle(processes, seconds),
        Cmd::BenchAgent { seconds, python } => bench::agent_cpu(seconds, python),
        Cmd::Soak { minutes, live, max_allocations, restart_every } => soak::soak(minutes, live, max_allocations, restart_every),
        Cmd::Bench { pairs, rounds, python, usdt } => bench::overhead(pairs, rounds, bench::Loop::of(python, usdt)),
        _ => bail!("not a measurement"),
    }
}
