//! `cargo xtask test-arm64`: the aarch64 agent on a real arm64 kernel.
//!
//! Boots Debian trixie's arm64 kernel under qemu-system-aarch64 (TCG) with
//! an initramfs root made from Debian arm64 packages
//! (scripts/arm64-vm/boot.sh, cached under target/arm64-vm), runs the
//! aarch64 agent with the synthetic driver and workload cross-built for
//! aarch64 inside, and checks each scenario's events against the x86_64
//! agent's run of the same scenario here: the same calls, sizes, results
//! and per-process totals, byte for byte. One line per scenario; any
//! mismatch fails the whole.
use std::{
    collections::BTreeMap,
    os::unix::{fs::PermissionsExt as _, process::ExitStatusExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use gpumem_tests::{api_calls, printed_value as printed, workspace, Trace};
use serde_json::{json, Value};

use crate::run;

/// One scenario: what the VM runs (a shell line, its stdout and stderr sent
/// back; `every_event`: every line of stdout, else only its last, the
/// trace's summary) and how the host judges it.
struct Scenario {
    name: &'static str,
    check: Check,
    every_event: bool,
    /// In the reduced set `cargo xtask test` runs (CI's 45 minutes leave
    /// room for about a minute of the VM): the gate, exact bytes, VMM, the
    /// storm, USDT at -O2 and both CPythons' frames; fresh copies, USDT at
    /// -O0 and the 30 s stress only in the full run.
    in_ci: bool,
    line: &'static str,
}

/// Which scenarios a boot runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Set {
    Full,
    Ci,
}

enum Check {
    /// The default gate attaches nothing of the synthetic driver (its -O2
    /// entry points start with instructions the kernel steps out of line).
    Refused,
    /// The same events and per-process totals as the x86_64 agent's run of
    /// this workload scenario with this environment.
    AsOnX86(&'static str, &'static [(&'static str, &'static str)]),
    /// Every call of eight threads traced, none lost.
    Storm,
    /// Native stacks unwound by framehop's aarch64 unwinder from DWARF CFI
    /// (the workload is built without frame pointers): each leaked buffer
    /// through its two callers, with file and line from DWARF.
    Stacks,
    /// Each fresh copy of the driver attached between its dlopen and first
    /// call (3 s apart: under TCG the agent is some 30 times slower).
    Fresh,
    /// Every allocation carries its Python frames to `<module>`, under
    /// this CPython (major.minor, as the interpreter says).
    Python(&'static str),
    /// The PyTorch-shaped allocator's USDT probes, semaphores raised: its
    /// tensors and its own figures (allocated, reserved, the largest free
    /// block) exact while it holds them (the trace ends after 15 s, the loop
    /// 14 s after its figures: it lingers into the next scenarios, which
    /// judge only their own process), as on x86_64; the library built at this optimization
    /// level (its notes' operands: registers at -O2, `[sp, n]` at -O0).
    Usdt(&'static str),
    /// The workload's own checks pass while agents attach and detach.
    Stress,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "strict-gate",
        check: Check::Refused,
        every_event: true,
        in_ci: true,
        line: "/payload/gpumem trace --json --libcuda $L -c \"$W $L all_kinds\"",
    },
    Scenario {
        name: "basic",
        check: Check::AsOnX86("all_kinds", &[]),
        every_event: true,
        in_ci: true,
        line: "$TRACE --libcuda $L -c \"$W $L all_kinds\"",
    },
    Scenario {
        name: "vmm",
        check: Check::AsOnX86("expandable", &[]),
        every_event: true,
        in_ci: true,
        line: "$TRACE --libcuda $L -c \"$W $L expandable\"",
    },
    Scenario {
        name: "stacks",
        check: Check::Stacks,
        every_event: true,
        in_ci: true,
        // Held after its last call: under TCG the agent reads the
        // process's mappings seconds after its first event.
        line: "env GPUMEM_STEPS=5 GPUMEM_WORKLOAD_HOLD_MS=4000 $TRACE --libcuda $L -c \"$W $L deep_leak\"",
    },
    Scenario {
        name: "storm",
        check: Check::Storm,
        every_event: false,
        in_ci: true,
        line: "env GPUMEM_THREADS=8 GPUMEM_PAIRS=1000 $TRACE --libcuda $L --stack-budget 0 -c \"$W $L storm\"",
    },
    Scenario {
        name: "usdt",
        check: Check::Usdt("O2"),
        every_event: true,
        in_ci: true,
        line: "env GPUMEM_TORCH=leak GPUMEM_HOLD=14 $TRACE --duration 15 -c \"python3 /payload/torch_train.py $L /payload/lib/O2/libc10_cuda.so await-probes\"",
    },
    Scenario {
        name: "fresh-copies",
        check: Check::Fresh,
        every_event: true,
        in_ci: false,
        line: "fresh_copies && env GPUMEM_FRESH_GAP_MS=3000 GPUMEM_LIBS=/tmp/fresh/0/libcuda.so.1:/tmp/fresh/1/libcuda.so.1:/tmp/fresh/2/libcuda.so.1 $TRACE -c \"$W $L fresh\"",
    },
    Scenario {
        name: "usdt-stack",
        check: Check::Usdt("O0"),
        every_event: true,
        in_ci: false,
        line: "env GPUMEM_TORCH=leak GPUMEM_HOLD=14 $TRACE --duration 15 -c \"python3 /payload/torch_train.py $L /payload/lib/O0/libc10_cuda.so await-probes\"",
    },
    Scenario {
        name: "python",
        check: Check::Python("3.13"),
        every_event: true,
        in_ci: true,
        line: "python_version python3 && env GPUMEM_STEPS=5 GPUMEM_HOLD=1 GPUMEM_IMPORT_SECONDS=3 $TRACE -c \"python3 /payload/train.py $L\"",
    },
    Scenario {
        name: "python3.11",
        check: Check::Python("3.11"),
        every_event: true,
        in_ci: true,
        line: "python_version python3.11 && env GPUMEM_STEPS=5 GPUMEM_HOLD=1 GPUMEM_IMPORT_SECONDS=3 $TRACE -c \"python3.11 /payload/train.py $L\"",
    },
    Scenario { name: "stress", check: Check::Stress, every_event: false, in_ci: false, line: "stress" },
];

pub fn test_arm64(set: Set) -> Result<()> {
    crate::require_root("the arm64 VM test")?;
    crate::setup::setup()?;
    run_scenarios(set)
}

/// Boots the VM once with `set`'s scenarios and judges each: one line per
/// scenario with the guest's time it took. The VM's root and the aarch64
/// agent are made here when missing (`cargo xtask test` makes both first).
pub fn run_scenarios(set: Set) -> Result<()> {
    let dir = gpumem_tests::target_dir().join("arm64-vm");
    let payload = dir.join("payload");
    let scenarios: Vec<&Scenario> = SCENARIOS.iter().filter(|s| set == Set::Full || s.in_ci).collect();
    make_payload(&payload, &scenarios)?;
    let console = boot(&payload, &dir.join("console.log"))?;
    let kernel = console.lines().find_map(|l| l.strip_prefix("GPUMEM-KERNEL ")).unwrap_or("?").to_string();
    eprintln!("xtask: arm64 kernel {kernel}");
    let runs = scenario_outputs(&console);
    let mut failed = Vec::new();
    for s in scenarios {
        let run = runs.get(s.name);
        let verdict = match run {
            Some(run) => check(s, run),
            None => Err(anyhow::anyhow!("no output came back (see {})", dir.join("console.log").display())),
        };
        let took = run.and_then(|r| r.seconds).map(|t| format!(" ({t:.1} s)")).unwrap_or_default();
        match verdict {
            Ok(what) => println!("arm64 {:<12} ok{took}: {what}", s.name),
            Err(e) => {
                println!("arm64 {:<12} FAILED{took}: {e:#}", s.name);
                failed.push(s.name);
            }
        }
    }
    if !failed.is_empty() {
        bail!("arm64 scenarios failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The VM's root (kernel, Debian arm64 packages), made once under
/// target/arm64-vm: downloads and unpacking, fetched beside the builds.
pub fn prepare() -> Result<()> {
    run(Command::new("bash").arg(workspace().join("scripts/arm64-vm/prepare.sh")))
}

/// The aarch64 agent (the image's release build of HEAD, stripped), the
/// synthetic driver, the workload and the PyTorch-shaped allocator
/// cross-built for aarch64, and the script the VM runs.
fn make_payload(payload: &Path, scenarios: &[&Scenario]) -> Result<()> {
    let agent = crate::image::aarch64_binary()?;
    let _ = std::fs::remove_dir_all(payload);
    std::fs::create_dir_all(payload.join("lib"))?;
    run(Command::new("aarch64-linux-gnu-strip").arg("-o").arg(payload.join("gpumem")).arg(agent))?;
    let src = workspace().join("tests/fixtures");
    let cc = |args: &[&str], out: PathBuf, file: &str| {
        run(Command::new("aarch64-linux-gnu-gcc").args(args).arg("-o").arg(out).arg(src.join(file)).args(["-ldl", "-lpthread"]))
    };
    cc(&["-shared", "-fPIC", "-O2", "-Wall"], payload.join("lib/libcuda.so.1"), "fake_libcuda.c")?;
    cc(&["-O2", "-g", "-fomit-frame-pointer", "-Wall"], payload.join("workload"), "workload.c")?;
    std::fs::copy(src.join("train.py"), payload.join("train.py"))?;
    // The PyTorch-shaped allocator with its USDT probes, as GCC builds it
    // optimized (operands in registers) and not (operands on the stack).
    // sys/sdt.h is systemtap-sdt-dev's, whose headers are the same on every
    // architecture; only their directory is x86_64's.
    let include = payload.join("include");
    std::fs::create_dir_all(include.join("sys"))?;
    for h in ["sdt.h", "sdt-config.h"] {
        std::fs::copy(format!("/usr/include/x86_64-linux-gnu/sys/{h}"), include.join("sys").join(h))
            .context("systemtap-sdt-dev's headers")?;
    }
    let include = format!("-I{}", include.display());
    for opt in ["-O2", "-O0"] {
        let dir = payload.join("lib").join(&opt[1..]);
        std::fs::create_dir_all(&dir)?;
        cc(&["-shared", "-fPIC", opt, "-g", "-Wall", &include], dir.join("libc10_cuda.so"), "torch_alloc.c")?;
    }
    std::fs::remove_dir_all(payload.join("include"))?;
    std::fs::copy(src.join("torch_train.py"), payload.join("torch_train.py"))?;
    let script = payload.join("run");
    std::fs::write(&script, run_script(scenarios))?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The VM's /payload/run: each scenario's stdout and stderr sent back line
/// by line with markers the host reads.
const RUN_PRELUDE: &str = r#"#!/bin/sh
# Written by cargo xtask test-arm64.
cd /payload
echo "GPUMEM-KERNEL $(uname -r)"
W=/payload/workload L=/payload/lib/libcuda.so.1
TRACE="/payload/gpumem trace --json --arm64-uprobes allow-xol"
scenario() {
  name=$1; every=$2; shift 2
  start=$(cut -d' ' -f1 /proc/uptime)
  eval "$*" > /tmp/$name.out 2> /tmp/$name.err
  rc=$?
  echo "GPUMEM-TIME $name $start $(cut -d' ' -f1 /proc/uptime)"
  if [ "$every" = 1 ]; then sed "s/^/GPUMEM-OUT $name /" /tmp/$name.out; else tail -n 1 /tmp/$name.out | sed "s/^/GPUMEM-OUT $name /"; fi
  sed "s/^/GPUMEM-ERR $name /" /tmp/$name.err
  echo "GPUMEM-RC $name $rc"
}
# Which CPython a Python scenario runs (Debian trixie's 3.13, bookworm's 3.11).
python_version() { $1 -c 'import sys; print("python_version=%d.%d" % sys.version_info[:2], file=sys.stderr)'; }
# Copies of the driver on new inodes: files no agent has seen.
fresh_copies() { for i in 0 1 2; do mkdir -p /tmp/fresh/$i && cp $L /tmp/fresh/$i/; done; }
# Eight threads allocating and freeing for 30 s, checking every result,
# while agents attach and detach, one after another: each asked to stop
# after 5 s, killed 2 s later if it has not (a crashed agent's links go too).
stress() {
  env GPUMEM_THREADS=8 GPUMEM_SECONDS=30 $W $L race 2> /tmp/stress.workload &
  w=$!
  end=$(( $(date +%s) + 30 )); cycles=0
  while [ "$(date +%s)" -lt $end ]; do
    timeout -s INT -k 2 5 $TRACE --libcuda $L > /dev/null 2>> /tmp/stress.agent
    cycles=$((cycles + 1))
  done
  wait $w; rc=$?
  cat /tmp/stress.workload >&2
  echo "stress_cycles=$cycles stress_attaches=$(grep -c 'attached [0-9]* of' /tmp/stress.agent)" >&2
  grep -v '^$' /tmp/stress.agent | tail -n 40 | sed 's/^/agent: /' >&2
  return $rc
}
"#;

fn run_script(scenarios: &[&Scenario]) -> String {
    let mut s = String::from(RUN_PRELUDE);
    for sc in scenarios {
        s.push_str(&format!("scenario {} {} '{}'\n", sc.name, u8::from(sc.every_event), sc.line));
    }
    s.push_str("exit 0\n");
    s
}

/// Boots the VM with the payload; its console, also kept in `log`.
fn boot(payload: &Path, log: &Path) -> Result<String> {
    let script = workspace().join("scripts/arm64-vm/boot.sh");
    let out = Command::new("bash").arg(&script).arg(payload).output().with_context(|| format!("running {}", script.display()))?;
    let console = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    std::fs::write(log, &console)?;
    if !out.status.success() {
        bail!("the arm64 VM failed ({}): {}\nconsole in {}", out.status, String::from_utf8_lossy(&out.stderr), log.display());
    }
    Ok(console)
}

/// What one scenario printed, and the guest's seconds it took.
#[derive(Default)]
struct Run {
    stdout: String,
    stderr: String,
    /// None until its `GPUMEM-RC` line: a scenario without one did not finish.
    rc: Option<i32>,
    seconds: Option<f64>,
}

/// Each scenario that finished (its exit code said), by name.
fn scenario_outputs(console: &str) -> BTreeMap<String, Run> {
    let mut runs: BTreeMap<String, Run> = BTreeMap::new();
    for line in console.lines() {
        let Some((tag, rest)) = line.split_once(' ') else { continue };
        let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
        let run = runs.entry(name.to_string());
        match tag {
            "GPUMEM-OUT" => run.or_default().stdout.push_str(&format!("{text}\n")),
            "GPUMEM-ERR" => run.or_default().stderr.push_str(&format!("{text}\n")),
            "GPUMEM-RC" => run.or_default().rc = text.trim().parse().ok(),
            "GPUMEM-TIME" => run.or_default().seconds = uptime_span(text),
            _ => {}
        }
    }
    runs.retain(|_, r| r.rc.is_some());
    runs
}

/// "START END", both from the guest's /proc/uptime.
fn uptime_span(text: &str) -> Option<f64> {
    let (start, end) = text.trim().split_once(' ')?;
    Some(end.parse::<f64>().ok()? - start.parse::<f64>().ok()?)
}

/// One scenario's verdict: what was measured, or what differs.
fn check(s: &Scenario, run: &Run) -> Result<String> {
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    let Some(rc) = run.rc else { bail!("no exit code came back: {stderr}") };
    // A trace exits with its command's code: the workloads check every result themselves.
    if rc != 0 {
        bail!("exit code {rc}: {stderr}");
    }
    if let Check::Stress = s.check {
        return stress(stderr);
    }
    let t = std::panic::catch_unwind(|| Trace::parse(stdout, stderr.clone(), std::process::ExitStatus::from_raw(0)))
        .map_err(|_| anyhow::anyhow!("not a trace: {stdout}\n{stderr}"))?;
    match s.check {
        Check::Refused => refused(&t),
        Check::AsOnX86(workload, env) => {
            let libcuda = gpumem_tests::fixtures().libcuda.to_str().context("the fixtures' path is not UTF-8")?;
            let x86 = gpumem_tests::trace(&["--libcuda", libcuda, "-c", &gpumem_tests::workload_cmd(workload)], env);
            let (a, b) = (shape(&t), shape(&x86));
            if a != b {
                bail!("differs from x86_64:\narm64:  {a}\nx86_64: {b}");
            }
            Ok(format!("{} events and every process's totals as on x86_64", t.events.len()))
        }
        Check::Storm => storm(&t),
        Check::Stacks => native_stacks(&t),
        Check::Fresh => fresh(&t),
        Check::Python(version) => python(&t, version),
        Check::Usdt(level) => usdt(&t, level),
        Check::Stress => unreachable!("judged above"),
    }
}

fn refused(t: &Trace) -> Result<String> {
    let allocs = t.of_type("alloc").len();
    let Some(why) = t.stderr.lines().find(|l| l.contains("refused on arm64")) else {
        bail!("the default gate refused nothing ({allocs} allocations traced): {}", t.stderr);
    };
    if allocs != 0 {
        bail!("{allocs} allocations traced under the default gate: {}", t.stderr);
    }
    Ok(format!("nothing attached, the workload's calls all right; the first refused: {}", why.split("(the first: ").nth(1).unwrap_or(why)))
}

fn fresh(t: &Trace) -> Result<String> {
    let attach_ms: Vec<&str> = t.stderr.split_whitespace().filter_map(|w| w.strip_prefix("fresh_attach_ms=")).collect();
    let (inits, allocs) = (t.of_type("init").len(), t.of_type("alloc").len());
    if inits != 3 || allocs != 3 || attach_ms.len() != 3 || attach_ms.iter().any(|ms| ms.starts_with('-')) {
        bail!("{inits} cuInit and {allocs} allocations traced of 3 copies; attached {attach_ms:?} ms after dlopen: {}", t.stderr);
    }
    Ok(format!("3 copies, each attached {attach_ms:?} ms after its dlopen, before its first call"))
}

fn python(t: &Trace, version: &str) -> Result<String> {
    let ran = t.stderr.lines().find_map(|l| l.strip_prefix("python_version=")).unwrap_or("?");
    if ran != version {
        bail!("CPython {ran} ran where {version} was meant");
    }
    let allocs = t.of_type("alloc");
    let names = |a: &Value| -> Vec<String> {
        a["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["python"] == true)
            .map(|f| f["function"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let python = t.stderr.lines().find(|l| l.contains("Python")).unwrap_or_default().to_string();
    for a in &allocs {
        let n = names(a);
        if n.last().map(String::as_str) != Some("<module>") || !n.iter().any(|f| f == "train_step" || f == "Model.load_weights") {
            bail!("an allocation without its Python frames to <module>: {n:?} ({python})");
        }
    }
    if allocs.len() != 11 {
        bail!("{} allocations traced of 11: {}", allocs.len(), t.stderr);
    }
    Ok(format!(
        "CPython {version}: 11 allocations, each with its Python frames, e.g. {:?}",
        allocs.last().map(|a| names(a)).unwrap_or_default()
    ))
}

/// The tensors of torch_train.py's `leak` loop: the weights (64 MiB) and
/// 20 kept activations of 1 MiB; each step's 3 MiB scratch freed.
fn usdt(t: &Trace, level: &str) -> Result<String> {
    const MIB: u64 = 1 << 20;
    let lib = gpumem_tests::target_dir().join("arm64-vm/payload/lib").join(level).join("libc10_cuda.so");
    let notes = Command::new("readelf").arg("-n").arg(&lib).output().context("readelf")?;
    let operands =
        String::from_utf8_lossy(&notes.stdout).lines().find_map(|l| l.trim().strip_prefix("Arguments:")).unwrap_or("?").trim().to_string();
    let own = t.stderr.lines().find_map(|l| l.strip_prefix("torch_figures=")).context("the loop printed no figures")?;
    let own: Value = serde_json::from_str(own)?;
    let allocs = t.of_type("tensor_alloc");
    let first = allocs.first().with_context(|| format!("no tensor events: {}", t.stderr))?;
    let pid = first["pid"].as_u64().context("a pid")?;
    let devices = t.summary_process(pid)["devices"].as_array().cloned().unwrap_or_default();
    let d = devices.iter().find(|d| d["device"] == 0).context("no device 0 in the summary")?;
    let fb = &d["layout"]["free_blocks"];
    let ours = json!({"allocated": d["allocated_bytes"], "reserved": d["live_bytes"], "largest_free": fb["largest_free_block"], "unused": fb["unused_bytes"]});
    if ours != own || own["allocated"] != 84 * MIB || d["tensors"] != 21 || fb["tensors_outside_segments"] != 0 {
        bail!("gpumem's figures {ours} ({} tensors), the allocator's own {own}", d["tensors"]);
    }
    if (first["size"].as_u64(), first["stream"].as_str()) != (Some(64 * MIB), Some("0x7")) || t.of_type("tensor_free").len() != 20 {
        bail!("PyTorch's argument layout misread: first tensor {first}, {} frees of 20", t.of_type("tensor_free").len());
    }
    if !t.stderr.contains("2 sites, 2 with semaphores raised") {
        bail!("the probes' semaphores were not raised: {}", t.stderr);
    }
    let python =
        allocs.iter().all(|a| a["frames"].as_array().into_iter().flatten().any(|f| f["python"] == true && f["function"] == "<module>"));
    if !python {
        bail!("a tensor without its Python frames: {first}");
    }
    Ok(format!(
        "21 tensors (-{level}: pytorch:malloc's operands {}), allocated {} reserved {} largest free {} bytes, as the allocator's own; semaphores raised",
        operands, own["allocated"], own["reserved"], own["largest_free"]
    ))
}

fn stress(stderr: &str) -> Result<String> {
    // The agents' own lines (the last 40, for when they did not attach) are not the workload's.
    let workload_said: String = stderr.lines().filter(|l| !l.starts_with("agent: ")).collect::<Vec<_>>().join("\n");
    let (calls, cycles, attaches) = (printed(stderr, "race_calls"), printed(stderr, "stress_cycles"), printed(stderr, "stress_attaches"));
    match (calls, cycles, attaches) {
        (Some(calls), Some(cycles), Some(attaches)) if attaches >= 3 && !workload_said.contains("returned") => Ok(format!(
            "{calls} calls from 8 threads in 30 s, every result right, while agents attached {attaches} times in {cycles} cycles"
        )),
        _ => bail!("calls {calls:?}, agent cycles {cycles:?}, attached {attaches:?}: {stderr}"),
    }
}

/// deep_leak's 4 MiB buffers: each from leak_buffer, called by train_step,
/// called by run_model, as the x86_64 test of `gpumem leaks` finds them.
fn native_stacks(t: &Trace) -> Result<String> {
    let functions = |a: &Value| -> Vec<String> {
        a["frames"].as_array().into_iter().flatten().map(|f| f["function"].as_str().unwrap_or("?").to_string()).collect()
    };
    let leaks: Vec<&Value> = t.of_type("alloc").into_iter().filter(|a| a["size"] == 4u64 << 20).collect();
    if leaks.len() != 5 {
        bail!("{} leaked buffers traced of 5: {}", leaks.len(), t.stderr);
    }
    for a in &leaks {
        let f = functions(a);
        if f.get(..3) != Some(&["leak_buffer".to_string(), "train_step".into(), "run_model".into()][..]) {
            bail!("a leaked buffer's stack is {f:?} (unwinding: {}): {a}", t.summary["stacks"]);
        }
    }
    let top = &leaks[0]["frames"][0];
    let (file, line) = (top["file"].as_str().unwrap_or(""), top["line"].as_u64().unwrap_or(0));
    if !file.ends_with("workload.c") || line == 0 {
        bail!("leak_buffer's frame has no file and line from DWARF: {top}");
    }
    Ok(format!("5 leaked buffers, each unwound without frame pointers: {:?} (workload.c:{line})", functions(leaks[0])))
}

/// Eight threads' allocations and frees, every one accounted for.
fn storm(t: &Trace) -> Result<String> {
    let calls = printed(&t.stderr, "storm_calls").context("the workload printed no storm_calls")?;
    let p = &t.summary["processes"][0];
    let traced = api_calls(p, "cuMemAlloc_v2") + api_calls(p, "cuMemFree_v2");
    if t.summary["lost_events"] != 0 || traced != calls || p["held_at_exit_bytes"].as_u64() != printed(&t.stderr, "storm_live_bytes") {
        bail!("{calls} calls made, {traced} traced, lost {}: {p}", t.summary["lost_events"]);
    }
    Ok(format!("{calls} calls from 8 threads, 0 lost, held at exit {} bytes", p["held_at_exit_bytes"]))
}

/// What must be the same on both machines: each event's call, sizes and
/// result, and each process's totals (not pids, addresses or times).
fn shape(t: &Trace) -> Value {
    let events: Vec<Value> =
        t.events.iter().map(|e| json!([e["type"], e["api"], e["size"], e["device"], e["result"], e["pitch"], e["released"]])).collect();
    let processes: Vec<Value> = t.summary["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let mut p = p.clone();
            if let Some(o) = p.as_object_mut() {
                for k in ["pid", "ns_pid"] {
                    o.remove(k);
                }
            }
            p
        })
        .collect();
    json!({"events": events, "processes": processes, "lost_events": t.summary["lost_events"]})
}
