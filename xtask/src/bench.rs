//! Probe overhead, measured side by side in one run: the same workload with
//! no probes, with empty uprobe+uretprobe programs on the same symbols, and
//! with gpumem's probes. Absolute times are noisy here; ratios are the result.
use std::process::Command;

use anyhow::{bail, Context as _, Result};

fn churn_ns(cmd: &mut Command) -> Result<(u64, u64)> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> Option<u64> { text.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse().ok()) };
    match (field("churn_calls="), field("churn_ns=")) {
        (Some(c), Some(n)) => Ok((c, n)),
        _ => bail!("no churn timing in the workload output: {text}"),
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// The peer: bpftrace doing the minimum a leak tracer must, on the same
/// four points gpumem probes (entry and return of the allocation and of the
/// free): the allocation's pointer saved at entry, the allocation put in a
/// map at a successful return, the free's pointer saved at entry and the
/// allocation removed at its successful return (a failed free frees
/// nothing). Uses only what bpftrace 0.17 (Debian) has.
fn bpftrace_script(lib: &str) -> String {
    format!(
        "uprobe:{lib}:cuMemAlloc_v2 {{ @out[tid] = arg0; }}\n\
         uretprobe:{lib}:cuMemAlloc_v2 /@out[tid]/ {{ if (retval == 0) {{ @live[*(uint64 *)uptr(@out[tid])] = nsecs; }} delete(@out[tid]); }}\n\
         uprobe:{lib}:cuMemFree_v2 {{ @freeing[tid] = arg0; }}\n\
         uretprobe:{lib}:cuMemFree_v2 /@freeing[tid]/ {{ if (retval == 0) {{ delete(@live[@freeing[tid]]); }} delete(@freeing[tid]); }}\n\
         END {{ clear(@out); clear(@live); clear(@freeing); }}\n"
    )
}

/// Which loop is measured.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// cuMemAlloc_v2/cuMemFree_v2 from C.
    C,
    /// The same from Python over ctypes (Python frames walked).
    Python,
    /// Tensors from the test allocator's cache (PyTorch's USDT probes), from Python.
    Usdt,
}

impl Loop {
    pub fn of(python: bool, usdt: bool) -> Loop {
        match (python, usdt) {
            (_, true) => Loop::Usdt,
            (true, false) => Loop::Python,
            _ => Loop::C,
        }
    }
}

/// The program that allocates and frees in a loop and times itself: the C
/// workload, the same loop in Python over ctypes (Python frames walked), or
/// a Python loop taking tensors from the test allocator's cache.
struct Churn {
    argv: Vec<String>,
    envs: Vec<(&'static str, &'static str)>,
}

impl Churn {
    fn new(f: &gpumem_tests::Fixtures, what: Loop) -> Self {
        let lib = f.libcuda.display().to_string();
        let fixture =
            |name: &str| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name).display().to_string();
        match what {
            Loop::C => Churn { argv: vec![f.workload.display().to_string(), lib, "churn".into()], envs: vec![] },
            Loop::Python => Churn { argv: vec!["python3".into(), fixture("churn.py"), lib], envs: vec![] },
            Loop::Usdt => Churn {
                argv: vec!["python3".into(), fixture("torch_train.py"), lib, f.torch.display().to_string()],
                envs: vec![("GPUMEM_TORCH", "churn"), ("GPUMEM_HOLD", "0")],
            },
        }
    }

    fn command(&self, n: &str) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]).env("GPUMEM_BENCH_N", n).envs(self.envs.iter().copied());
        c
    }

    fn shell(&self) -> String {
        self.argv.join(" ")
    }
}

/// The peer for PyTorch's probes: bpftrace's usdt: probes (which raise the
/// semaphores through the kernel's ref_ctr_offset), the tensor put in a map
/// at malloc and removed at free.
fn bpftrace_usdt_script(lib: &str) -> String {
    format!(
        "usdt:{lib}:pytorch:malloc {{ @live[arg0] = arg2; }}\n\
         usdt:{lib}:pytorch:free {{ delete(@live[arg0]); }}\n\
         END {{ clear(@live); }}\n"
    )
}

/// ns per call of the churn workload under the bpftrace script.
fn under_bpftrace(f: &gpumem_tests::Fixtures, churn: &Churn, n: &str, what: Loop) -> Result<(u64, u64)> {
    let script = match what {
        Loop::Usdt => bpftrace_usdt_script(f.torch.to_str().unwrap()),
        _ => bpftrace_script(f.libcuda.to_str().unwrap()),
    };
    let mut bt = Command::new("bpftrace")
        .args(["-e", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running bpftrace (apt-get install bpftrace)")?;
    // bpftrace says "Attaching N probes..." on stdout once they are in.
    let mut out = std::io::BufReader::new(bt.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        if std::io::BufRead::read_line(&mut out, &mut line)? == 0 {
            let mut err = String::new();
            std::io::Read::read_to_string(bt.stderr.as_mut().expect("piped"), &mut err)?;
            bail!("bpftrace exited before attaching: {err}");
        }
        if line.starts_with("Attaching") {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let r = churn_ns(&mut churn.command(n));
    // SAFETY: signals our own child.
    unsafe { libc::kill(bt.id() as i32, libc::SIGINT) };
    let _ = bt.wait();
    r
}

pub fn overhead(pairs: u64, rounds: u32, what: Loop) -> Result<()> {
    let bin = crate::build_agent_for_bench()?;
    let f = gpumem_tests::fixtures();
    let lib = f.libcuda.to_str().unwrap();
    let churn = Churn::new(f, what);
    let workload = churn.shell();
    // Python: discovery on, so that the interpreter (and the allocator) is found at its dlopen.
    let discover: &[&str] = if what == Loop::C { &["--no-discover"] } else { &[] };
    let n = pairs.to_string();
    let has_bpftrace = Command::new("bpftrace").arg("--version").output().is_ok_and(|o| o.status.success());
    // (label, ns per call of each round)
    let mut runs: Vec<(&str, Vec<f64>)> = vec![
        ("no probes", vec![]),
        ("empty probes", vec![]),
        ("gpumem probes", vec![]),
        ("gpumem --stacks off", vec![]),
        ("bpftrace (peer)", vec![]),
        ("gpumem as serve runs", vec![]),
        // The stack budget's burst as it was: a whole second's worth at once.
        ("gpumem, 1 s burst", vec![]),
    ];
    // The kernel's table of live entries kept and the state pinned, as `serve` does.
    let pin_dir = "/sys/fs/bpf/gpumem-bench";
    let mut calls = 0;
    for round in 0..rounds {
        gpumem_tests::wait_for_detach();
        let (c, t) = churn_ns(&mut churn.command(&n))?;
        calls = c;
        runs[0].1.push(t as f64 / c as f64);
        // ns per call of `gpumem bench` with these options.
        let gpumem = |options: &[&str]| -> Result<f64> {
            let mut cmd = Command::new(&bin);
            cmd.arg("bench").args(options).args(discover).args(["--libcuda", lib, "-c", &workload]);
            let (c, t) = churn_ns(cmd.env("GPUMEM_BENCH_N", &n).envs(churn.envs.iter().copied()))?;
            Ok(t as f64 / c as f64)
        };
        for (i, (set, stacks)) in [("empty", "on"), ("full", "on"), ("full", "off")].into_iter().enumerate() {
            runs[i + 1].1.push(gpumem(&["--probes", set, "--stacks", stacks])?);
            gpumem_tests::wait_for_detach();
        }
        if has_bpftrace {
            let (c, t) = under_bpftrace(f, &churn, &n, what)?;
            runs[4].1.push(t as f64 / c as f64);
        }
        runs[5].1.push(gpumem(&["--probes", "full", "--stacks", "on", "--pin-dir", pin_dir])?);
        crate::run(Command::new(&bin).args(["serve", "--cleanup", "--pin-dir", pin_dir]))?;
        gpumem_tests::wait_for_detach();
        runs[6].1.push(gpumem(&["--probes", "full", "--stacks", "on", "--stack-burst", "0"])?);
        gpumem_tests::wait_for_detach();
        let now: Vec<String> = runs.iter().filter_map(|(l, v)| v.last().map(|x| format!("{l} {x:.0}"))).collect();
        eprintln!("round {}: {} ns/call", round + 1, now.join(", "));
    }
    print_overhead(runs, calls, rounds, what);
    Ok(())
}

/// The overhead table: each row's median over the rounds, against none and empty probes.
fn print_overhead(runs: Vec<(&str, Vec<f64>)>, calls: u64, rounds: u32, what: Loop) {
    let med: Vec<(&str, Option<f64>)> = runs.into_iter().map(|(l, v)| (l, (!v.is_empty()).then(|| median(v)))).collect();
    let none = med[0].1.expect("measured");
    let empty = med[1].1.expect("measured");
    let probed = if what == Loop::Usdt {
        "PyTorch's pytorch:malloc/pytorch:free (no probes: semaphores down, the probe sites skipped)"
    } else {
        "cuMemAlloc_v2/cuMemFree_v2"
    };
    println!("probe overhead on {probed} ({calls} calls per run, median of {rounds} interleaved runs):");
    println!(
        "  {:<22} {:>9} {:>10} {:>14} {:>16} {:>16}",
        "", "ns/call", "added ns", "ratio to empty", "added vs empty's", "added ns per hit"
    );
    for (label, v) in &med {
        // Probe hits per call: everyone (gpumem, the empty baseline and the
        // bpftrace peer) traps at entry and return of both calls; USDT
        // probes are one hit per call, for everyone.
        let hits = match *label {
            "no probes" => f64::NAN,
            _ if what == Loop::Usdt => 1.0,
            _ => 2.0,
        };
        match v {
            Some(v) => println!(
                "  {label:<22} {v:>9.0} {:>10.0} {:>14.2} {:>16.2} {:>16.0}",
                v - none,
                v / empty,
                if *label == "no probes" { 0.0 } else { (v - none) / (empty - none) },
                (v - none) / hits
            ),
            None => println!("  {label:<22} not measured (bpftrace is not installed)"),
        }
    }
}

/// Cost of the ioctl path for ioctls that are not NVIDIA's: FIONREAD on a
/// pipe (and getppid), with no agent, with the agent and the ioctl
/// tracepoints, and with the agent but `--ioctl off` (which isolates the
/// tracepoints' share).
pub fn ioctl_overhead(calls: u64, rounds: u32) -> Result<()> {
    let bin = crate::build_agent()?;
    let f = gpumem_tests::fixtures();
    let n = calls.to_string();
    // (ns per FIONREAD ioctl, ns per getppid)
    let run_client = || -> Result<(f64, f64)> {
        let out = Command::new(&f.nvioctl).args(["/nonexistent", "bench", &n]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| -> Result<f64> {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse::<f64>().ok())
                .with_context(|| format!("no {k} in {text}"))
        };
        Ok((field("ioctl_ns=")? / calls as f64, field("getppid_ns=")? / calls as f64))
    };
    let with_agent = |extra: &[&str]| -> Result<(f64, f64)> {
        gpumem_tests::wait_for_detach();
        let mut agent = Command::new(&bin)
            .args(["trace", "--no-discover", "--duration", "600"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        // Ready once it says it is tracing.
        let mut err = std::io::BufReader::new(agent.stderr.take().expect("piped"));
        let mut line = String::new();
        while !line.starts_with("gpumem: tracing") {
            line.clear();
            if std::io::BufRead::read_line(&mut err, &mut line)? == 0 {
                anyhow::bail!("the agent ended before tracing");
            }
        }
        let r = run_client();
        // SIGTERM: the agent stops cleanly. SAFETY: signalling our own child.
        unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
        agent.wait()?;
        r
    };
    let (mut none, mut with_ioctl, mut without_ioctl) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        gpumem_tests::wait_for_detach();
        none.push(run_client()?);
        with_ioctl.push(with_agent(&["--ioctl", "tracepoints"])?);
        without_ioctl.push(with_agent(&["--ioctl", "off"])?);
        let r = round as usize;
        eprintln!(
            "round {}: ioctl/getppid ns: no agent {:.0}/{:.0}, --ioctl tracepoints {:.0}/{:.0}, --ioctl off {:.0}/{:.0}",
            round + 1,
            none[r].0,
            none[r].1,
            with_ioctl[r].0,
            with_ioctl[r].1,
            without_ioctl[r].0,
            without_ioctl[r].1
        );
    }
    let split = |v: Vec<(f64, f64)>| (median(v.iter().map(|x| x.0).collect()), median(v.iter().map(|x| x.1).collect()));
    let (none, with_ioctl, without_ioctl) = (split(none), split(with_ioctl), split(without_ioctl));
    println!("non-NVIDIA syscalls ({calls} per run, median of {rounds} interleaved runs):  FIONREAD on a pipe | getppid");
    println!("  no agent                {:>7.0} ns             | {:>5.0} ns", none.0, none.1);
    println!(
        "  agent, --ioctl tracepoints{:>7.0} ns (ratio {:.2}) | {:>5.0} ns (ratio {:.2})",
        with_ioctl.0,
        with_ioctl.0 / none.0,
        with_ioctl.1,
        with_ioctl.1 / none.1
    );
    println!(
        "  agent, --ioctl off        {:>7.0} ns (ratio {:.2}) | {:>5.0} ns (ratio {:.2})",
        without_ioctl.0,
        without_ioctl.0 / none.0,
        without_ioctl.1,
        without_ioctl.1 / none.1
    );
    Ok(())
}

/// /metrics render time and size at two scales, and the daemon's idle cost.
pub fn metrics(idle_s: u64, against: Option<&str>) -> Result<()> {
    crate::run(crate::cargo().args(["build", "--release", "-p", "gpumem-agent"]))?;
    let bin = gpumem_tests::target_dir().join("release/gpumem");
    println!("/metrics rendering (release build, 8 GPUs with NVML labels, median of 21):");
    println!("(builds before d9a36b1 render without each row's owners: a lighter scrape than the daemon's)");
    // 180 processes x 8 GPUs: about 10 000 samples in all; 1250 x 8: 10 000 process series.
    for processes in ["180", "1250"] {
        crate::baseline::side_by_side(against, &["render", "--processes", processes, "--gpus", "8"], 1)?;
    }
    // Fleet sizing with per-owner series: 50 processes x 8 GPUs, each row's
    // memory from 12 libraries (8 owners, then "other"); this build only.
    println!("with per-owner series (50 processes x 8 GPUs, 12 libraries each):");
    crate::run(&mut crate::engine_bench(&["render", "--processes", "50", "--gpus", "8", "--owners", "12"]))?;
    // The daemon at rest: probes on the synthetic libcuda, the synthetic NVML
    // read every 10 s, discovery every 0.5 s, nothing traced.
    std::env::set_var("GPUMEM_BIN", &bin);
    let f = gpumem_tests::fixtures();
    let serve = gpumem_tests::Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()], &[]);
    std::thread::sleep(std::time::Duration::from_secs(5));
    let read = |text: &str, name: &str| gpumem_tests::sample(text, name).unwrap_or(f64::NAN);
    let before = serve.metrics();
    let t0 = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(idle_s));
    let after = serve.metrics();
    let dt = t0.elapsed().as_secs_f64();
    let cpu = read(&after, "gpumem_agent_cpu_seconds_total") - read(&before, "gpumem_agent_cpu_seconds_total");
    println!("gpumem serve at rest over {dt:.0} s ({} probes attached, synthetic NVML):", read(&after, "gpumem_probes_attached"));
    let (rss, bpf) = (read(&after, "gpumem_agent_resident_memory_bytes"), read(&after, "gpumem_agent_bpf_map_resident_memory_bytes"));
    println!(
        "  resident memory  {:.1} MiB: the agent's own {:.1} MiB + BPF ring buffer mapping {:.1} MiB (kernel memory)",
        rss / 1048576.0,
        (rss - bpf) / 1048576.0,
        bpf / 1048576.0
    );
    let heap: Vec<String> = gpumem_tests::heap_parts(&after).iter().map(|(p, b)| format!("{p} {:.1} KiB", b / 1024.0)).collect();
    println!("  heap in use by owner: {}; kept free {:.1} KiB", heap.join(", "), read(&after, "gpumem_agent_heap_free_bytes") / 1024.0);
    println!("  CPU              {:.2} % of one core", 100.0 * cpu / dt);
    let (status, stderr) = serve.stop();
    if !status.success() {
        bail!("gpumem serve failed: {stderr}");
    }
    Ok(())
}

/// `gpumem serve` at rest among `processes` idle host processes: its CPU
/// over `seconds` with event-driven discovery, then with the loader hooks
/// refused (every process's maps read twice a second), side by side.
pub fn idle(processes: u32, seconds: u64) -> Result<()> {
    crate::run(crate::cargo().args(["build", "--release", "-p", "gpumem-agent"]))?;
    std::env::set_var("GPUMEM_BIN", gpumem_tests::target_dir().join("release/gpumem"));
    let mut sleepers = Vec::new();
    for _ in 0..processes {
        sleepers.push(Command::new("sleep").arg("3600").spawn().context("starting an idle process")?);
    }
    let f = gpumem_tests::fixtures();
    let lib = f.libcuda.to_str().unwrap().to_string();
    let mut result = Ok(());
    for (mode, extra) in [("event-driven discovery", None), ("every process scanned every 0.5 s", Some("--refuse-loader-hooks"))] {
        let mut args = vec!["--libcuda", lib.as_str(), "--no-nvml"];
        args.extend(extra);
        let serve = gpumem_tests::Serve::start(&args, &[]);
        std::thread::sleep(std::time::Duration::from_secs(5));
        let cpu = |text: &str| gpumem_tests::sample(text, "gpumem_agent_cpu_seconds_total").unwrap_or(f64::NAN);
        let before = cpu(&serve.metrics());
        let t0 = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_secs(seconds));
        let after = cpu(&serve.metrics());
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "gpumem serve at rest among {processes} idle processes, {mode}: {:.2} % of one core over {dt:.0} s",
            100.0 * (after - before) / dt
        );
        let (status, stderr) = serve.stop();
        if !status.success() {
            result = Err(anyhow::anyhow!("gpumem serve failed: {stderr}"));
            break;
        }
    }
    for mut s in sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }
    result
}
