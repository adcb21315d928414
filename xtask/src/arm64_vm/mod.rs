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
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use gpumem_tests::workspace;

use crate::run;

mod checks;
use checks::check;

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
    // Cross-built from CPython's sources (scripts/arm64-vm/prepare.sh,
    // about 5 minutes each the first time): the full set only.
    Scenario {
        name: "python3.10",
        check: Check::Python("3.10"),
        every_event: true,
        in_ci: false,
        line: "python_version /opt/python3.10/bin/python3.10 && env GPUMEM_STEPS=5 GPUMEM_HOLD=1 GPUMEM_IMPORT_SECONDS=3 $TRACE -c \"/opt/python3.10/bin/python3.10 /payload/train.py $L\"",
    },
    Scenario {
        name: "python3.12",
        check: Check::Python("3.12"),
        every_event: true,
        in_ci: false,
        line: "python_version /opt/python3.12/bin/python3.12 && env GPUMEM_STEPS=5 GPUMEM_HOLD=1 GPUMEM_IMPORT_SECONDS=3 $TRACE -c \"/opt/python3.12/bin/python3.12 /payload/train.py $L\"",
    },
    Scenario { name: "stress", check: Check::Stress, every_event: false, in_ci: false, line: "stress" },
];

/// The CPythons the VM's root gets cross-built for `scenarios` (Debian has
/// no arm64 build of them): those under /opt.
fn cross_pythons(scenarios: &[&Scenario]) -> Vec<&'static str> {
    scenarios
        .iter()
        .filter_map(|s| match s.check {
            Check::Python(v) if s.line.contains(&format!("/opt/python{v}/")) => Some(v),
            _ => None,
        })
        .collect()
}

pub fn test_arm64(set: Set) -> Result<()> {
    crate::require_root("the arm64 VM test")?;
    crate::setup::setup()?;
    // The x86_64 agent the host runs each "as on x86_64" scenario with (a
    // fresh checkout has none; `cargo xtask test` builds it first).
    run(crate::linted(crate::cargo().args(["build", "-p", "gpumem-agent"]))?)?;
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
    let console = boot(&payload, &cross_pythons(&scenarios), &dir.join("console.log"))?;
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
# Which CPython a Python scenario runs (Debian trixie's 3.13, bookworm's 3.11,
# 3.10 and 3.12 cross-built under /opt).
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

/// Boots the VM with the payload, and the cross-built CPythons `pythons` in
/// its root; its console, also kept in `log`.
fn boot(payload: &Path, pythons: &[&str], log: &Path) -> Result<String> {
    let script = workspace().join("scripts/arm64-vm/boot.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(payload)
        .env("ARM64_VM_CROSS_PYTHONS", pythons.join(" "))
        .output()
        .with_context(|| format!("running {}", script.display()))?;
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
