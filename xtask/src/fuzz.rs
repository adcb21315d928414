//! `cargo xtask fuzz --seconds N`: every cargo-fuzz target (`fuzz/`, one per
//! parser of untrusted bytes: gpumem_engine::untrusted) run for N seconds
//! under libFuzzer and AddressSanitizer, on the nightly toolchain. A crash
//! fails the run; libFuzzer leaves the input in `fuzz/artifacts/TARGET/`:
//! once fixed, it goes to `fuzz/regressions/TARGET/`, which the engine's
//! tests replay with the seeds (`fuzz/corpus/TARGET/`) every run.
use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};

use crate::run;

const CARGO_FUZZ_VERSION: &str = "0.13.1";
/// Seconds per target in `cargo xtask test` (15 targets): brief, to keep CI within its 45 minutes.
pub const CI_SECONDS: u64 = 6;

/// What one target's run did.
struct Ran {
    target: String,
    runs: u64,
    new_inputs: u64,
    peak_rss_mb: u64,
}

fn stat(text: &str, name: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(&format!("stat::{name}:"))?.trim().parse().ok()).unwrap_or(0)
}

fn setup() -> Result<()> {
    let have = |args: &[&str]| Command::new("rustup").args(args).output().is_ok_and(|o| o.status.success());
    if !have(&["run", "nightly", "rustc", "--version"]) {
        eprintln!("xtask: installing the nightly toolchain (cargo-fuzz builds with sanitizers)");
        run(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))
            .context("installing the nightly toolchain for cargo-fuzz")?;
    }
    let version = Command::new("cargo").args(["fuzz", "--version"]).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if !version.unwrap_or_default().contains(CARGO_FUZZ_VERSION) {
        eprintln!("xtask: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
        run(crate::cargo().args(["install", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION, "--locked"]))?;
    }
    Ok(())
}

fn cargo_fuzz() -> Command {
    let mut c = Command::new("cargo");
    // The toolchain file pins stable for the workspace; cargo-fuzz needs nightly.
    c.args(["+nightly", "fuzz"]).env_remove("RUSTUP_TOOLCHAIN");
    c
}

fn targets() -> Result<Vec<String>> {
    let out = cargo_fuzz().arg("list").output().context("cargo fuzz list")?;
    if !out.status.success() {
        bail!("cargo fuzz list failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
}

/// How the targets are built: optimized for long runs; unoptimized (with
/// overflow checks and debug assertions) for CI's brief one, where the build
/// is most of the time (341 s optimized on a fresh 2-core machine).
#[derive(Clone, Copy)]
pub enum Build {
    Optimized,
    Unoptimized,
}

pub fn fuzz(seconds: u64, build: Build) -> Result<()> {
    setup()?;
    let began = Instant::now();
    let mode: &[&str] = match build {
        Build::Optimized => &[],
        Build::Unoptimized => &["--dev"],
    };
    run(cargo_fuzz().args(["build", "--target-dir", "target/fuzz"]).args(mode))?;
    let built_s = began.elapsed().as_secs_f64();
    let mut ran = Vec::new();
    let mut crashed = Vec::new();
    for t in targets()? {
        // New inputs go to a scratch corpus (kept under target/ between
        // runs); the committed seeds are read, never written.
        let scratch = Path::new("target/fuzz-corpus").join(&t);
        std::fs::create_dir_all(&scratch)?;
        let out = cargo_fuzz()
            .args(["run", "--target-dir", "target/fuzz"])
            .args(mode)
            .arg(&t)
            .arg(&scratch)
            .arg(Path::new("fuzz/corpus").join(&t))
            .arg("--")
            .args([&format!("-max_total_time={seconds}"), "-rss_limit_mb=2048", "-timeout=5", "-print_final_stats=1"])
            .output()
            .with_context(|| format!("cargo fuzz run {t}"))?;
        let text = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            eprintln!("{}", text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n"));
            crashed.push(t.clone());
        }
        ran.push(Ran {
            target: t,
            runs: stat(&text, "number_of_executed_units"),
            new_inputs: stat(&text, "new_units_added"),
            peak_rss_mb: stat(&text, "peak_rss_mb"),
        });
    }
    println!("fuzzing: {seconds} s per target, built in {built_s:.0} s, {:.0} s in all", began.elapsed().as_secs_f64());
    println!("{:<24} {:>12} {:>10} {:>12}", "target", "runs", "new inputs", "peak RSS MB");
    for r in &ran {
        println!("{:<24} {:>12} {:>10} {:>12}", r.target, r.runs, r.new_inputs, r.peak_rss_mb);
    }
    if !crashed.is_empty() {
        bail!("fuzz targets crashed: {} (inputs in fuzz/artifacts/; fix, then keep each in fuzz/regressions/TARGET/)", crashed.join(", "));
    }
    Ok(())
}
