//! `cargo xtask bench-agent`: the daemon's CPU per allocation at a steady
//! rate, native call chains and Python ones.
use std::process::Command;

use anyhow::{bail, Result};

use crate::bench::median;

/// `gpumem serve`'s CPU while one process allocates and frees at a steady
/// rate, each allocation's stack 16 frames deep and taken (under the stack
/// budget at 1 000/s, sampled beyond it at 10 000/s), beside the daemon at
/// rest in the same run; pinned (the default: the kernel's table of live
/// entries kept, the agent writing back each allocation's device and stack)
/// and with `--no-pin`, one after the other. With `python`, pinned, the
/// same rates with 16 Python frames over ctypes and with 16 C frames in
/// turn over three rounds, and what Python costs against C.
pub fn agent_cpu(seconds: u64, python: bool) -> Result<()> {
    crate::run(crate::cargo().args(["build", "--release", "-p", "gpumem-agent"]))?;
    std::env::set_var("GPUMEM_BIN", gpumem_tests::target_dir().join("release/gpumem"));
    let what = if python { "16 Python frames over ctypes against 16-frame C call chains" } else { "16-frame C call chains" };
    println!("gpumem serve (release), one process allocating at a steady rate, {what}, {seconds} s each:");
    // Python against C in the default mode only: the modes differ in what
    // they write back to the kernel, the same for both.
    let modes: &[(&str, Option<&str>)] =
        if python { &[("pinned (default)", None)] } else { &[("pinned (default)", None), ("--no-pin", Some("--no-pin"))] };
    for &(mode, extra) in modes {
        println!(" {mode}:");
        agent_cpu_of(seconds, python, extra)?;
    }
    Ok(())
}

fn agent_cpu_of(seconds: u64, python: bool, extra: Option<&str>) -> Result<()> {
    let f = gpumem_tests::fixtures();
    let mut args = vec!["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"];
    args.extend(extra);
    let serve = gpumem_tests::Serve::start(&args, &[]);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let cpu = || gpumem_tests::sample(&serve.metrics(), "gpumem_agent_cpu_seconds_total").unwrap_or(f64::NAN);
    let secs = seconds.to_string();
    // Share of one core over a span, and the span.
    let measure = |work: &mut dyn FnMut() -> Result<u64>| -> Result<(f64, f64, u64)> {
        let before = cpu();
        let t0 = std::time::Instant::now();
        let pairs = work()?;
        let dt = t0.elapsed().as_secs_f64();
        Ok((100.0 * (cpu() - before) / dt, dt, pairs))
    };
    let (idle, _, _) = measure(&mut || {
        std::thread::sleep(std::time::Duration::from_secs(seconds));
        Ok(0)
    })?;
    println!("  at rest: {idle:.2} % of one core");
    let workloads: &[bool] = if python { &[false, true] } else { &[false] };
    // A program's first run makes the agent read its libraries' unwind
    // tables (and an interpreter's symbols) once for every later process:
    // said here, and not charged to the rates below.
    for &py in workloads {
        let (share, dt, _) = measure(&mut || steady(f, py, 100, "1"))?;
        let chain = if py { "Python" } else { "C" };
        println!("  first run ({chain}, 1 s): {:.1} ms of agent CPU above rest", (share - idle) / 100.0 * dt * 1e3);
    }
    let rates: &[u32] = if python { &[1000, 3000] } else { &[1000, 10_000] };
    // Python against C: alternated over three rounds, each workload's median
    // taken (a 30 s full scan of every process lands in some spans only).
    let rounds = if python { 3 } else { 1 };
    for &rate in rates {
        let mut per_alloc: Vec<Vec<f64>> = vec![Vec::new(); workloads.len()];
        for _ in 0..rounds {
            for (w, &py) in workloads.iter().enumerate() {
                let (share, dt, pairs) = measure(&mut || {
                    let pairs = steady(f, py, rate, &secs)?;
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    Ok(pairs)
                })?;
                let per_alloc_us = (share - idle) / 100.0 * dt / pairs as f64 * 1e6;
                per_alloc[w].push(per_alloc_us);
                let chain = if py { "Python" } else { "C" };
                println!(
                    "  {rate} allocations/s asked, {:.0}/s made ({chain}): {share:.2} % of one core ({per_alloc_us:.1} µs of agent CPU per allocation+free above rest)",
                    pairs as f64 / seconds as f64
                );
            }
        }
        if let [c, py] = &per_alloc[..] {
            let (c, py) = (median(c.clone()), median(py.clone()));
            println!(
                "  {rate}/s, medians of {rounds}: C {c:.1} µs, Python {py:.1} µs: Python stacks cost {:.2}× C stacks (target ≤ 2×)",
                py / c
            );
        }
    }
    let (status, stderr) = serve.stop();
    if !status.success() {
        bail!("gpumem serve failed: {stderr}");
    }
    Ok(())
}

/// The interpreter `python3` runs, by its path: on PATH `python3` may be a
/// launcher (pyenv's shim is a shell script that runs several programs
/// before the interpreter), whose processes the agent would read too and
/// charge to each Python run.
fn python_interpreter() -> Result<String> {
    let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || path.is_empty() {
        bail!("python3 does not say where its interpreter is: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(path)
}

/// Runs the steady workload (C or Python) at `rate` pairs/s; the pairs it made.
fn steady(f: &gpumem_tests::Fixtures, python: bool, rate: u32, seconds: &str) -> Result<u64> {
    let lib = f.libcuda.display().to_string();
    let mut cmd = if python {
        let mut c = Command::new(python_interpreter()?);
        c.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/steady.py")).arg(&lib);
        c
    } else {
        let mut c = Command::new(&f.workload);
        c.args([lib.as_str(), "steady"]);
        c
    };
    let out = cmd.env("GPUMEM_RATE", rate.to_string()).env("GPUMEM_SECONDS", seconds).output()?;
    let text = String::from_utf8_lossy(&out.stderr);
    match text.split_whitespace().find_map(|w| w.strip_prefix("steady_pairs=")).and_then(|v| v.parse().ok()) {
        Some(n) if out.status.success() => Ok(n),
        _ => bail!("the steady workload failed ({}): {text}", out.status),
    }
}
