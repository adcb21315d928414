//! Contexts: allocations placed on the device of the calling thread's
//! context, and on the GPU NVML lists the process on for contexts made
//! before the agent started.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;

#[test]
fn two_devices_through_two_contexts() {
    require_root();
    let t = trace_workload("two_devices", &[]);
    let pid = single_pid(&t);
    let allocs = t.of_type("alloc");
    assert_eq!(sizes(&allocs), [10 * MIB, 20 * MIB, MIB, 2 * MIB, 3 * MIB]);
    assert_eq!(devices(&allocs), [0, 1, 0, 1, 0]);
    let creates = t.of_type("ctx_create");
    assert_eq!(creates.iter().map(|e| e["api"].as_str().unwrap()).collect::<Vec<_>>(), ["cuCtxCreate_v2", "cuCtxCreate_v3"]);
    assert_eq!(devices(&creates), [0, 1]);
    // Destroying the device-1 context frees its memory implicitly.
    let destroy = t.of_type("ctx_destroy");
    assert_eq!(destroy.len(), 1);
    assert_eq!(released(destroy[0]), [(1, 22 * MIB, 2)]);
    assert_eq!(destroy[0]["handle"], creates[1]["handle"]);
    assert_eq!(t.released_at_exit(pid), [(0, 14 * MIB, 3)]);
}

/// The `restart` workload on the synthetic driver: it retains its context and
/// allocates 2 × 8 MiB, then at each SIGUSR1 moves on (frees both and
/// allocates 1 MiB; then exits), saying "phase N" after each step. Returned
/// once its context and first allocations exist.
fn workload_with_an_old_context() -> (std::process::Child, Lines) {
    let (child, lines) = spawn_workload_watched("restart", &[]);
    lines.wait_for("phase 0", 10);
    (child, lines)
}

/// The workload's next step, once the last one is done (a second SIGUSR1
/// sent before it took the first would merge with it).
fn step(child: &std::process::Child, said: &Lines, phase: u32) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    if phase > 0 {
        said.wait_for(&format!("phase {phase}"), 10);
    }
}

/// NVML (synthetic) lists `pid` on GPU 1, with what it holds.
fn nvml_lists_on_gpu_1(name: &str, pid: u32) -> (std::path::PathBuf, Vec<(&'static str, String)>) {
    let file = target_dir().join("gpumem-fixtures").join(name);
    std::fs::write(&file, format!("1/{pid}:{}", 17 * MIB)).unwrap();
    let envs = vec![("GPUMEM_FAKE_NVML_PIDS_FILE", file.to_str().unwrap().to_string())];
    (file, envs)
}

/// A context made before the agent started is placed on the GPU NVML lists
/// the process on: in trace (and its recording's replay), ...
#[test]
fn a_context_made_before_the_agent_is_placed_on_the_gpu_nvml_lists_in_trace() {
    require_root();
    let f = fixtures();
    let (lib, nvml) = (f.libcuda.to_str().unwrap(), f.nvml.to_str().unwrap());
    // The allocation made after the agent started is on GPU 1, and so is what its exit releases.
    let (mut w, said) = workload_with_an_old_context();
    let pid = w.id();
    let (_, envs) = nvml_lists_on_gpu_1("ctx-trace-pids", pid);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let rec = target_dir().join("gpumem-fixtures").join("ctx-trace.gpumem");
    let record = rec.to_str().unwrap();
    let args = ["--libcuda", lib, "--nvml", nvml, "-p", &pid.to_string(), "--record", record, "--milestones"];
    let (agent, stderr) = start_agent_with(&args, &envs);
    // NVML's reading (the process on GPU 1) is applied before the allocation.
    stderr.wait_for("milestone nvml-reading", 20);
    step(&w, &said, 1);
    step(&w, &said, 0);
    assert!(w.wait().unwrap().success());
    let (lines, stderr) = finish_agent(agent, stderr);
    let allocs: Vec<(u64, i64)> =
        lines.iter().filter(|e| e["type"] == "alloc").map(|e| (e["size"].as_u64().unwrap(), e["device"].as_i64().unwrap_or(-1))).collect();
    assert_eq!(allocs, [(MIB, 1)], "{stderr}");
    let exit = lines.iter().find(|e| e["type"] == "exit").expect("its exit");
    assert_eq!(released(exit), [(1, MIB, 1)]);
    // Its replay places it on GPU 1 too: the recording carries NVML's process list.
    let replayed = trace(&["--from", record], &[]);
    let allocs: Vec<(u64, i64)> =
        replayed.of_type("alloc").iter().map(|e| (e["size"].as_u64().unwrap(), e["device"].as_i64().unwrap_or(-1))).collect();
    assert_eq!(allocs, [(MIB, 1)], "replay of {record}");
    assert_eq!(released(replayed.of_type("exit")[0]), [(1, MIB, 1)]);
}

/// ... in top (its row is on GPU 1) ...
#[test]
fn a_context_made_before_the_agent_is_placed_on_the_gpu_nvml_lists_in_top() {
    require_root();
    let f = fixtures();
    let (lib, nvml) = (f.libcuda.to_str().unwrap(), f.nvml.to_str().unwrap());
    let (mut w, said) = workload_with_an_old_context();
    let pid = w.id();
    let (_, envs) = nvml_lists_on_gpu_1("ctx-top-pids", pid);
    let mut top = std::process::Command::new(gpumem_bin())
        .args(["top", "--once", "--duration", "4", "--libcuda", lib, "--nvml", nvml, "--milestones"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = stderr_after_line(&mut top, "gpumem: tracing for");
    stderr.wait_for("milestone nvml-reading", 20);
    step(&w, &said, 1);
    let out = top.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    step(&w, &said, 0);
    assert!(w.wait().unwrap().success());
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.split_whitespace().next() == Some(&pid.to_string())).unwrap_or_else(|| panic!("{text}\n{stderr}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cols[3], cols[4], cols[5]), ("1", "1.0", "MiB"), "{text}");
}

/// ... and on /metrics (its series is on GPU 1).
#[test]
fn a_context_made_before_the_agent_is_placed_on_the_gpu_nvml_lists_in_metrics() {
    require_root();
    let f = fixtures();
    let (lib, nvml) = (f.libcuda.to_str().unwrap(), f.nvml.to_str().unwrap());
    let (mut w, said) = workload_with_an_old_context();
    let pid = w.id();
    let (_, envs) = nvml_lists_on_gpu_1("ctx-serve-pids", pid);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let serve = Serve::start(&["--libcuda", lib, "--nvml", nvml, "--nvml-interval", "1", "--milestones"], &envs);
    serve.stderr().wait_for("milestone nvml-reading", 20);
    step(&w, &said, 1);
    let series = format!("pid=\"{pid}\"");
    poll(
        10,
        "1 MiB on GPU 1",
        || {
            let text = serve.metrics();
            let mine: Vec<String> =
                text.lines().filter(|l| l.starts_with("gpumem_process_memory_bytes{") && l.contains(&series)).map(str::to_string).collect();
            mine.iter().any(|l| l.contains("gpu=\"1\"") && l.ends_with(&format!(" {MIB}"))).then_some(mine)
        },
        || serve.metrics(),
    )
    .iter()
    .for_each(|l| assert!(!l.contains("gpu=\"unknown\""), "{l}"));
    step(&w, &said, 0);
    assert!(w.wait().unwrap().success());
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}
