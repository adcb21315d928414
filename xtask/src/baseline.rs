//! The engine benchmarks of another revision, built beside this one, so
//! that a change is measured against the build before it in one run, on one
//! machine (timings here are only comparable side by side).
use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

/// main before issue 32's engine and /metrics work: what `bench-engine` and
/// `bench-metrics` compare with unless told otherwise.
pub const PREVIOUS: &str = "7ce4784";

/// The source of `rev`, unpacked under target/baseline/ (once), to build there.
fn source(rev: &str) -> Result<PathBuf> {
    let root = gpumem_tests::workspace();
    let out = Command::new("git").args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")]).current_dir(&root).output()?;
    if !out.status.success() {
        bail!("{rev} is not a commit of this repository ({}); name one with --against", String::from_utf8_lossy(&out.stderr).trim());
    }
    let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = gpumem_tests::target_dir().join("baseline").join(&sha);
    if !dir.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&dir)?;
        let archive = format!("git archive {sha} | tar -x -C '{}'", dir.display());
        crate::run(Command::new("sh").args(["-c", &archive]).current_dir(&root))?;
    }
    same_recording(&dir)?;
    Ok(dir)
}

/// Before the fix of its synthetic recording, the engine benchmark spaced a
/// process's calls 1 µs apart though each lasted 20 µs: every free started
/// before its allocation returned, so the state took it for a reordered
/// free and kept every allocation. An older revision's benchmark gets the
/// same spacing as this one's, so that both builds replay the same
/// recording.
fn same_recording(dir: &std::path::Path) -> Result<()> {
    const BEFORE: &str = "ts += 1_000;";
    const AFTER: &str = "ts += 25_000;";
    let bench = dir.join("gpumem-agent/benches/engine/main.rs");
    let text = std::fs::read_to_string(&bench).with_context(|| format!("reading {}", bench.display()))?;
    if text.contains(BEFORE) {
        std::fs::write(&bench, text.replacen(BEFORE, AFTER, 1))?;
    } else if !text.contains(AFTER) {
        bail!(
            "{}: its synthetic recording's spacing ({AFTER}) not found; check that both builds replay the same recording",
            bench.display()
        );
    }
    Ok(())
}

/// The engine benchmark of `rev` with `args` (as `crate::engine_bench`), built in
/// its own target directory (kept: a second run does not build again).
pub fn engine_bench(rev: &str, args: &[&str]) -> Result<Command> {
    let dir = source(rev).with_context(|| format!("unpacking {rev} to measure it"))?;
    let mut c = crate::engine_bench(args);
    c.current_dir(dir).env("CARGO_TARGET_DIR", gpumem_tests::target_dir().join("baseline-target"));
    Ok(c)
}

/// Runs the benchmark with `args` on `rev` and on this tree, `rounds` times
/// alternately, printing each line under the build that printed it.
pub fn side_by_side(rev: Option<&str>, args: &[&str], rounds: u32) -> Result<()> {
    let Some(rev) = rev else { return crate::run(&mut crate::engine_bench(args)) };
    // Build both first, so that no build runs between the measurements.
    crate::run(engine_bench(rev, &["--help"])?.stdout(std::process::Stdio::null()))?;
    crate::run(crate::engine_bench(&["--help"]).stdout(std::process::Stdio::null()))?;
    for round in 1..=rounds {
        for (who, mut cmd) in
            [(format!("previous ({rev})"), engine_bench(rev, args)?), ("this build".to_string(), crate::engine_bench(args))]
        {
            let out = cmd.output().with_context(|| format!("running the {who} benchmark"))?;
            if !out.status.success() {
                bail!("the {who} benchmark failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                println!("[round {round}] {who:<22} {line}");
            }
        }
    }
    Ok(())
}
