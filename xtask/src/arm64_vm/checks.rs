//! How the host judges each arm64 scenario from what the VM sent back.
use std::{os::unix::process::ExitStatusExt as _, process::Command};

use anyhow::{bail, Context as _, Result};
use gpumem_tests::{api_calls, printed_value as printed, Trace};
use serde_json::{json, Value};

use super::{Check, Run, Scenario};

/// One scenario's verdict: what was measured, or what differs.
pub(super) fn check(s: &Scenario, run: &Run) -> Result<String> {
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
    // 3.10's code objects have no qualified name: the method is bare.
    let weights = if version == "3.10" { "load_weights" } else { "Model.load_weights" };
    for a in &allocs {
        let n = names(a);
        if n.last().map(String::as_str) != Some("<module>") || !n.iter().any(|f| f == "train_step" || f == weights) {
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
