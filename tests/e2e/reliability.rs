//! Reliability under load and faults (issue 8): real eBPF against real
//! processes, as root. Each test names the fault it injects and what the
//! agent's accounting must still say exactly.
use gpumem_tests::*;
use serde_json::Value;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A value `key=N` the race workload printed on stderr.
fn printed(stderr: &str, key: &str) -> u64 {
    printed_value(stderr, key).unwrap_or_else(|| panic!("no {key}= in the workload's output: {stderr}"))
}

/// `gpumem trace` of the race workload with no event lines (every event is
/// still counted in the summary): threads allocating and freeing as fast as
/// the uprobe traps let them.
fn race(threads: u32, seconds: u32) -> (Trace, Value) {
    let f = fixtures();
    let cmd = workload_cmd("race");
    let (threads, seconds) = (threads.to_string(), seconds.to_string());
    // --min-size above any size: the summary only.
    let t = trace(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--min-size", "1PiB", "-c", &cmd],
        &[("GPUMEM_THREADS", threads.as_str()), ("GPUMEM_SECONDS", seconds.as_str())],
    );
    assert!(t.status.success(), "{}", t.stderr);
    let procs = t.summary["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{:#}", t.summary);
    let p = procs[0].clone();
    (t, p)
}

#[test]
fn no_event_is_lost_at_the_trap_bound_rate() {
    require_root();
    // Two threads for 30 s: the load. Every call must arrive.
    let (t, p) = race(2, 30);
    let calls = printed(&t.stderr, "race_calls");
    assert_eq!(t.summary["lost_events"], 0, "{:#}", t.summary["lost"]);
    assert_eq!(api_calls(&p, "cuMemAlloc_v2") + api_calls(&p, "cuMemFree_v2"), calls, "{p:#}");
    assert!(calls > 100_000, "a trap-bound rate means tens of thousands of calls per second: {calls}");
    assert_eq!(p["held_at_exit_bytes"].as_u64().unwrap(), printed(&t.stderr, "race_live_bytes"));
    assert_eq!(p["untracked_frees"], 0);
    assert_eq!(p["uncertain"], false);
    // Every allocation's stack: taken (under the budget or sampled beyond
    // it), not sampled (beyond it), or dropped (stack ring full), counted.
    let (stacks, dropped) = (&t.summary["stacks"], &t.summary["stacks_dropped"]);
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
    let seen = n(stacks, "captured") + n(stacks, "not_sampled") + n(dropped, "ring_full") + n(dropped, "unmatched");
    assert_eq!(seen, api_calls(&p, "cuMemAlloc_v2"), "every allocation's stack accounted for: {stacks} {dropped}");
    assert!(n(stacks, "not_sampled") > 0, "the default budget (2,000/s) is exceeded at this rate: {stacks}");
    eprintln!("{calls} calls in 30 s, 0 lost; stacks {stacks}");
}

#[test]
fn a_storm_of_allocations_with_stacks_loses_no_accounting() {
    require_root();
    // Eight threads, 5,000 allocate/free pairs each, every allocation with
    // its stack (no stack budget: the worst case), every event printed (a
    // reader slower than the threads): stacks beyond the stack ring's room
    // are dropped and counted; the accounting ring loses nothing. (With one
    // shared ring, about 25,000 of the 80,036 events were lost here.) The
    // build that ships, with the rings sized for this host's CPUs (4 MiB
    // each on 2); and this build, in debug, which drains about ten times
    // slower, with 16 MiB rings (at 4 MiB it lost about 9,000 events).
    let f = fixtures();
    let cmd = workload_cmd("storm");
    let args = ["--libcuda", f.libcuda.to_str().unwrap(), "--stack-budget", "0", "-c", &cmd];
    let envs = [("GPUMEM_THREADS", "8"), ("GPUMEM_PAIRS", "5000")];
    let debug: Vec<&str> = args.iter().copied().chain(["--ringbuf-bytes", "16MiB", "--stack-ring-bytes", "16MiB"]).collect();
    for (build, bin, args) in
        [("release, host-sized rings", release_gpumem_bin(), &args[..]), ("debug, 16 MiB rings", gpumem_bin(), &debug[..])]
    {
        storm_loses_no_accounting(build, &trace_bin(&bin, args, &envs));
    }
}

fn storm_loses_no_accounting(build: &str, t: &Trace) {
    assert!(t.status.success(), "{build}: {}", t.stderr);
    let p = &t.summary["processes"][0];
    let calls = printed(&t.stderr, "storm_calls");
    assert_eq!(calls, 8 * 2 * 5000 + 36);
    assert_eq!(t.summary["lost_events"], 0, "{build}: {:#}", t.summary["lost"]);
    assert_eq!(api_calls(p, "cuMemAlloc_v2") + api_calls(p, "cuMemFree_v2"), calls, "{build}: {p:#}");
    assert_eq!(p["held_at_exit_bytes"].as_u64().unwrap(), printed(&t.stderr, "storm_live_bytes"), "{build}");
    assert_eq!((&p["untracked_frees"], &p["uncertain"]), (&Value::from(0), &Value::from(false)), "{build}: {p:#}");
    // Every allocation's stack is either unwound or counted as dropped.
    let (stacks, dropped) = (&t.summary["stacks"], &t.summary["stacks_dropped"]);
    let seen = stacks["captured"].as_u64().unwrap() + dropped["ring_full"].as_u64().unwrap() + dropped["unmatched"].as_u64().unwrap();
    assert_eq!(seen, api_calls(p, "cuMemAlloc_v2"), "{build}: stacks {stacks}, dropped {dropped}");
    assert_eq!(dropped["unmatched"], 0, "{build}: a stack committed before its event is always found");
    eprintln!("storm ({build}): {calls} calls, 0 lost; stacks {stacks}; dropped {dropped}");
}

#[test]
fn sixteen_threads_racing_alloc_and_free_end_exact() {
    require_root();
    let (t, p) = race(16, 4);
    let calls = printed(&t.stderr, "race_calls");
    assert_eq!(t.summary["lost_events"], 0, "{:#}", t.summary["lost"]);
    assert_eq!(api_calls(&p, "cuMemAlloc_v2") + api_calls(&p, "cuMemFree_v2"), calls);
    // Thread t keeps t+1 allocations of 64 KiB: 136 × 64 KiB in all, whatever
    // order the 16 threads' frees and reused addresses arrived in.
    assert_eq!(p["held_at_exit_bytes"].as_u64().unwrap(), 136 * 64 * KIB);
    assert_eq!(printed(&t.stderr, "race_live_bytes"), 136 * 64 * KIB);
    assert_eq!(p["untracked_frees"], 0, "{p:#}");
    let _ = MIB;
}

#[test]
fn a_forked_child_cannot_free_its_parents_allocation() {
    require_root();
    // The driver refuses every call in a child forked after cuInit (3, not
    // initialized): the child's free fails and changes nothing, the parent's
    // 8 MiB stays the parent's until the parent frees it.
    let t = trace_workload("fork_free", &[]);
    let pids = t.pids();
    assert_eq!(pids.len(), 2, "the child is followed: {pids:?}");
    let (parent, child) = (pids[0], pids[1]);
    let child_calls = t.for_pid(child);
    assert_eq!(child_calls.iter().filter(|e| e["type"] == "free").map(|e| e["result"].as_u64().unwrap()).collect::<Vec<_>>(), [3]);
    let c = t.summary_process(child);
    assert_eq!((c["untracked_frees"].as_u64(), c["held_at_exit_bytes"].as_u64()), (Some(0), Some(0)), "{c:#}");
    let frees: Vec<u64> = t.for_pid(parent).iter().filter(|e| e["type"] == "free").map(|e| e["size"].as_u64().unwrap()).collect();
    assert_eq!(frees, [8 * MIB], "the parent's free credits its own allocation");
    assert_eq!(t.released_at_exit(parent), [(0, MIB, 1)]);
}

/// Runs `scenario` until it gets pid `want` (set through ns_last_pid; another
/// process forking in between takes it, so this retries), and waits for it.
fn run_on_pid(want: u32, scenario: &str, envs: &[(&str, &str)]) -> bool {
    for _ in 0..20 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string()).expect("writing ns_last_pid (root)");
        let mut child = spawn_workload(scenario, envs);
        let got = child.id();
        assert!(child.wait().unwrap().success());
        if got == want {
            return true;
        }
    }
    false
}

#[test]
fn a_pid_reused_by_a_new_process_starts_afresh() {
    require_root();
    let f = fixtures();
    let (agent, stderr) = start_agent(&["--no-discover", "--duration", "6", "--libcuda", f.libcuda.to_str().unwrap()]);
    // The first process exits holding 8 + 1 MiB on device 0, 2 MiB on device 1
    // and 64 KiB of pinned memory.
    let mut first = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "0")]);
    let pid = first.id();
    assert!(first.wait().unwrap().success());
    // A different program on the same pid: 10+1+3 MiB on device 0, then 20+2 on device 1.
    assert!(run_on_pid(pid, "two_devices", &[]), "could not get pid {pid} again");
    let (lines, _) = finish_agent(agent, stderr);
    let exits: Vec<&Value> = lines.iter().filter(|e| e["type"] == "exit" && e["pid"] == pid).collect();
    assert_eq!(exits.len(), 2, "two processes exited on pid {pid}");
    assert_eq!(released(exits[0]), [(0, 9 * MIB, 2), (1, 2 * MIB, 1)]);
    assert_eq!(released(exits[1]), [(0, 14 * MIB, 3)], "nothing of the first process carries over");
    let summary = lines.last().unwrap();
    assert_eq!(summary["pid_reuses"], 1, "{summary:#}");
    let p = summary["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap();
    // Only the second program's calls: it made no pinned allocation.
    assert_eq!(api_calls(p, "cuMemAllocHost_v2"), 0, "{p:#}");
    assert_eq!(api_calls(p, "cuCtxCreate_v3"), 1);
    assert_eq!(p["host_pinned_bytes"], 0);
}

/// A child process killed when the test ends, passed or failed.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value of the first series `name{...}` whose labels include every one of `labels`.
fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn after_an_agent_restart_older_memory_is_untracked_never_negative_or_leaked_and_nvml_may_fail() {
    require_root();
    let steps = steps();
    let f = fixtures();
    let lib = f.libcuda.to_str().unwrap();
    let dir = target_dir().join("gpumem-fixtures");
    let (pids_file, fail_file) = (dir.join("restart-nvml-pids"), dir.join("restart-nvml-fail"));
    std::fs::write(&pids_file, "").unwrap();
    let _ = std::fs::remove_file(&fail_file);

    steps.step("the first agent sees 16 MiB, then is killed");
    // The first agent sees 2 × 8 MiB allocated, then crashes (SIGKILL: no clean detach).
    let first = Serve::start(&["--libcuda", lib, "--no-nvml"], &[]);
    // It moves on at each SIGUSR1 (and is killed if the test fails first).
    let mut workload = Reaped(spawn_workload("restart", &[]));
    // SAFETY: signals our own child.
    let step = |w: &Reaped| unsafe { libc::kill(w.0.id() as i32, libc::SIGUSR1) };
    let pid = workload.0.id().to_string();
    let mine = [("pid", pid.as_str()), ("gpu", "0")];
    poll(
        10,
        "the first agent to see 16 MiB",
        || series(&first.metrics(), "gpumem_process_memory_bytes", &mine).filter(|&v| v == (16 * MIB) as f64),
        String::new,
    );
    drop(first);

    steps.step("a second agent: NVML's figure is untracked");
    // The second agent starts while that memory is held: it never saw it.
    // NVML says the process holds it (and 300 MiB of context).
    std::fs::write(&pids_file, format!("{pid}:{}", 16 * MIB + 300 * MIB)).unwrap();
    let envs = [("GPUMEM_FAKE_NVML_PIDS_FILE", pids_file.to_str().unwrap()), ("GPUMEM_FAKE_NVML_FAIL_FILE", fail_file.to_str().unwrap())];
    let second = Serve::start(&["--libcuda", lib, "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"], &envs);
    let text = poll(
        10,
        "NVML's figure as untracked",
        || {
            let t = second.metrics();
            series(&t, "gpumem_process_untracked_bytes", &mine).filter(|&v| v == (316 * MIB) as f64).map(|_| t)
        },
        String::new,
    );
    assert!(series(&text, "gpumem_process_memory_bytes", &mine).unwrap_or(0.0) == 0.0, "{text}");

    steps.step("frees of what it never saw");
    // Then the workload frees the two allocations the agent never saw and
    // allocates 1 MiB: traced 1 MiB, not 1 − 16 MiB; no leak; the rest untracked.
    step(&workload);
    let text = poll(
        15,
        "the 1 MiB allocated after the restart",
        || {
            let t = second.metrics();
            series(&t, "gpumem_process_memory_bytes", &mine).filter(|&v| v == MIB as f64).map(|_| t)
        },
        String::new,
    );
    std::fs::write(&pids_file, format!("{pid}:{}", MIB + 300 * MIB)).unwrap();
    poll(
        10,
        "the untracked bytes to follow NVML",
        || series(&second.metrics(), "gpumem_process_untracked_bytes", &mine).filter(|&v| v == (300 * MIB) as f64),
        String::new,
    );
    assert_eq!(series(&text, "gpumem_process_leak_suspected", &mine), Some(0.0));
    assert_eq!(series(&text, "gpumem_process_allocations", &mine), Some(1.0));
    for l in text.lines().filter(|l| l.contains(&format!("pid=\"{pid}\""))) {
        assert!(!l.rsplit(' ').next().unwrap().starts_with('-'), "a negative figure: {l}");
    }

    steps.step("NVML fails, then answers again");
    // NVML starts failing (GPU lost): the agent says so and keeps serving
    // what it traced; when NVML answers again, so do its series.
    std::fs::write(&fail_file, "").unwrap();
    let text = poll(
        10,
        "gpumem_nvml_up 0",
        || {
            let t = second.metrics();
            (sample(&t, "gpumem_nvml_up") == Some(0.0)).then_some(t)
        },
        String::new,
    );
    assert_eq!(series(&text, "gpumem_process_memory_bytes", &mine), Some(MIB as f64), "traced figures stay");
    std::fs::remove_file(&fail_file).unwrap();
    poll(10, "gpumem_nvml_up 1 again", || (sample(&second.metrics(), "gpumem_nvml_up") == Some(1.0)).then_some(()), String::new);
    poll(10, "untracked bytes again", || series(&second.metrics(), "gpumem_process_untracked_bytes", &mine), String::new);
    step(&workload);
    assert!(workload.0.wait().unwrap().success(), "every call returned what the workload expects");
    let (status, stderr) = second.stop();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("NVML unavailable: device fell off the bus"), "the NVML failure is said: {stderr}");
}

#[test]
fn a_process_killed_inside_an_allocation_call_leaves_nothing_behind() {
    require_root();
    let f = fixtures();
    let (agent, stderr) = start_agent(&["--no-discover", "--duration", "6", "--libcuda", f.libcuda.to_str().unwrap()]);
    // Its first allocation takes 30 s in the driver; it is killed 1 s into it.
    let (victim, said) = spawn_workload_watched("hold", &[("GPUMEM_FAKE_ALLOC_DELAY_MS", "30000")]);
    let mut victim = Reaped(victim);
    let pid = victim.0.id() as u64;
    said.wait_for("fake_libcuda: in cuMemAlloc_v2", 10);
    victim.0.kill().unwrap();
    victim.0.wait().unwrap();
    // A process after it is traced as usual.
    let after = spawn_workload("bad_free", &[]).wait_with_output().unwrap();
    assert!(after.status.success());
    let (lines, _) = finish_agent(agent, stderr);
    let mine: Vec<&Value> = lines.iter().filter(|e| e["pid"] == pid).collect();
    assert!(mine.iter().all(|e| e["type"] != "alloc"), "no allocation is counted for a call that never returned: {mine:#?}");
    let exit = mine.iter().find(|e| e["type"] == "exit").expect("its exit is seen");
    assert_eq!(released(exit), [], "it held nothing");
    let summary = lines.last().unwrap();
    assert_eq!(summary["lost_events"], 0);
    // The call's saved entry is removed from the kernel's in-flight table.
    assert_eq!(summary["stale_calls_removed"], 1, "{summary:#}");
    let others: Vec<&Value> = lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] != pid).collect();
    assert!(!others.is_empty(), "the next process is traced");
}

#[test]
fn a_library_replaced_on_disk_while_in_use_is_still_traced() {
    require_root();
    let f = fixtures();
    // A driver upgrade under a running job: the process keeps running the
    // old libcuda, whose file is gone; a different file now has its name.
    let dir = target_dir().join("gpumem-fixtures/upgraded");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    std::fs::copy(&f.libcuda, &lib).unwrap();
    let mut child = std::process::Command::new(&f.workload)
        .args([lib.to_str().unwrap(), "restart"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let said = Lines::spawn(child.stderr.take().unwrap());
    let mut workload = Reaped(child);
    let pid = workload.0.id() as u64;
    // SAFETY: signals our own child.
    let step = |w: &Reaped| unsafe { libc::kill(w.0.id() as i32, libc::SIGUSR1) };
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    said.wait_for("phase 0", 10);
    std::fs::remove_file(&lib).unwrap();
    std::fs::copy(&f.nvml, &lib).unwrap();
    assert!(maps().contains(" (deleted)"), "{}", maps());

    let (agent, stderr) = start_agent(&[]);
    step(&workload); // frees the 2 × 8 MiB (unseen), allocates 1 MiB
    said.wait_for("phase 1", 10);
    step(&workload);
    assert!(workload.0.wait().unwrap().success());
    // Its exit is in the ring: the session can end.
    interrupt(&agent);
    let (lines, stderr) = finish_agent(agent, stderr);
    assert!(stderr.contains("deleted or replaced on disk"), "the agent says what it attached to: {stderr}");
    let allocs: Vec<u64> = lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] == pid).map(|e| e["size"].as_u64().unwrap()).collect();
    assert_eq!(allocs, [MIB], "the allocation made through the deleted library's code");
    let frees = lines.iter().filter(|e| e["type"] == "free" && e["pid"] == pid).count();
    assert_eq!(frees, 2);
    let exit = lines.iter().find(|e| e["type"] == "exit" && e["pid"] == pid).unwrap();
    // Its context predates the agent and there is no NVML to place it: device unknown.
    assert_eq!(released(exit), [(-1, MIB, 1)]);
}

/// `gpumem ARGS` as user nobody with only capabilities `caps` (setpriv, in
/// the inheritable, ambient and bounding sets).
fn as_nobody_with(caps: &str, args: &[&str]) -> std::process::Output {
    wait_for_detach();
    let set = format!("-all{}", caps.split(',').filter(|c| !c.is_empty()).map(|c| format!(",+{c}")).collect::<String>());
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args([format!("--inh-caps={set}"), format!("--ambient-caps={set}"), format!("--bounding-set={set}")])
        .arg("--")
        .arg(gpumem_bin())
        .args(args)
        .output()
        .expect("running setpriv (util-linux)")
}

#[test]
fn runs_as_an_unprivileged_user_with_only_the_documented_capabilities() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("two_devices");
    let args = ["trace", "--json", "--libcuda", f.libcuda.to_str().unwrap(), "-c", cmd.as_str()];
    // The DaemonSet's set (deploy/kubernetes): everything works, exactly as root.
    let out = as_nobody_with("bpf,perfmon,sys_admin,sys_ptrace,dac_read_search", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("without CAP_"), "nothing is missing: {stderr}");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["lost_events"], 0);
    let exits: Vec<&Value> = lines.iter().filter(|e| e["type"] == "exit").collect();
    assert_eq!(exits.len(), 1);
    assert_eq!(released(exits[0]), [(0, 14 * MIB, 3)], "the same figures as under root");

    // CAP_BPF + CAP_PERFMON load the programs, but this kernel refuses
    // uprobes without CAP_SYS_ADMIN: said at start, and no probe attaches.
    let out =
        as_nobody_with("bpf,perfmon,sys_ptrace,dac_read_search", &["trace", "--libcuda", f.libcuda.to_str().unwrap(), "--duration", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without CAP_SYS_ADMIN, kernels since 6.16"), "{stderr}");

    // Without CAP_BPF/CAP_PERFMON/CAP_SYS_ADMIN: a clear error, status 1, nothing loaded.
    let out = as_nobody_with("", &["trace", "--duration", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("to load and attach its eBPF programs; missing: CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN."), "{stderr}");
    assert!(stderr.contains(&format!("Run it as root instead: sudo {} trace --duration 1,", gpumem_bin().display())), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");

    // serve answers for the whole node: what only narrows `trace` is missing there.
    let out = as_nobody_with("bpf,perfmon,sys_admin", &["serve", "--listen", "127.0.0.1:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gpumem serve answers for every process on the node"), "{stderr}");
    assert!(stderr.contains("missing: CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH."), "{stderr}");
}

/// The name the `evil_name` workload gives itself (15 bytes, the kernel's limit).
const EVIL_COMM: &str = "ev\x1b[2J\"\\\n{}";

#[test]
fn hostile_process_names_cannot_break_the_output_formats() {
    require_root();
    let f = fixtures();
    let lib = f.libcuda.to_str().unwrap();
    let cmd = workload_cmd("evil_name");
    // Terminal output: the escape sequence and the newline never reach it.
    let out = run_gpumem(&["trace", "--libcuda", lib, "-c", &cmd], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!out.stdout.contains(&0x1b), "an escape byte reached the terminal");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ev?[2J\"\\?{}"), "the name is shown, neutralized:\n{text}");
    // Every event line and summary row stays one line: no line starts with the name's tail.
    assert!(!text.lines().any(|l| l.starts_with("{}")), "{text}");

    // JSON keeps the exact name, escaped by the encoder.
    let t = trace_workload("evil_name", &[]);
    let alloc = t.of_type("alloc")[0];
    assert_eq!(alloc["comm"], EVIL_COMM);

    // Prometheus: the label value is escaped (\" \\ \n) and promtool parses the exposition.
    let serve = Serve::start(&["--libcuda", lib, "--no-nvml"], &[]);
    let mut hold = Reaped(spawn_workload("evil_name", &[("GPUMEM_WORKLOAD_HOLD_MS", "20000")]));
    let pid = hold.0.id().to_string();
    let text = poll(
        10,
        "the process's series",
        || {
            let t = serve.metrics();
            series(&t, "gpumem_process_memory_bytes", &[("pid", &pid)]).map(|_| t)
        },
        String::new,
    );
    let line = text.lines().find(|l| l.starts_with("gpumem_process_memory_bytes{") && l.contains(&format!("pid=\"{pid}\""))).unwrap();
    assert!(line.contains("comm=\"ev\x1b[2J\\\"\\\\\\n{}\""), "{line:?}");
    let (code, report) = promtool_check_metrics(&text);
    assert_ne!(code, Some(1), "promtool could not parse the exposition:\n{report}");
    drop(serve);
    let _ = hold.0.kill();

    // `top --once` (what the live view draws): no escape byte either.
    wait_for_detach();
    let mut top = std::process::Command::new(gpumem_bin())
        .args(["top", "--once", "--duration", "3", "--libcuda", lib, "--no-nvml"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = stderr_after_line(&mut top, "gpumem: tracing for");
    let mut hold = Reaped(spawn_workload("evil_name", &[("GPUMEM_WORKLOAD_HOLD_MS", "10000")]));
    let pid = hold.0.id().to_string();
    let out = top.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(out.status.success(), "{stderr}");
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(top.contains(&pid) && top.contains("ev?[2J"), "the process is listed:\n{top}");
    assert!(!out.stdout.contains(&0x1b), "an escape byte in top:\n{top}");
    let _ = hold.0.kill();
}

#[test]
fn stacks_through_files_replaced_on_disk_unwind_and_are_symbolized() {
    require_root();
    let f = fixtures();
    // An upgrade under a running job replaces both the driver and the program
    // that calls it: the stack of each allocation runs through files whose
    // paths now name other files (or none).
    let dir = target_dir().join("gpumem-fixtures/upgraded-stacks");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (lib, program) = (dir.join("libcuda.so.1"), dir.join("workload"));
    std::fs::copy(&f.libcuda, &lib).unwrap();
    std::fs::copy(&f.workload, &program).unwrap();
    let mut workload = Reaped(
        std::process::Command::new(&program).args([lib.to_str().unwrap(), "restart"]).stdout(std::process::Stdio::null()).spawn().unwrap(),
    );
    let pid = workload.0.id() as u64;
    // SAFETY: signals our own child.
    let step = |w: &Reaped| unsafe { libc::kill(w.0.id() as i32, libc::SIGUSR1) };
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    poll(10, "the workload to load the library", || maps().contains(lib.to_str().unwrap()).then_some(()), String::new);
    for file in [&lib, &program] {
        std::fs::remove_file(file).unwrap();
        std::fs::copy(&f.nvml, file).unwrap();
    }
    assert!(maps().matches(" (deleted)").count() >= 2, "{}", maps());

    let out = std::process::Command::new(gpumem_bin())
        .args(["leaks", "--json", "--older-than", "0", "--duration", "4"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = out;
    let stderr = stderr_after_line(&mut out, "gpumem: tracing");
    step(&workload); // frees the 2 × 8 MiB (unseen), allocates 1 MiB: held until the report
    let out = out.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    step(&workload);
    assert!(workload.0.wait().unwrap().success());
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mine = report["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(mine["outstanding_bytes"], MIB, "{mine:#}");
    let frames = mine["stacks"][0]["frames"].as_array().unwrap();
    let in_program: Vec<&Value> =
        frames.iter().filter(|fr| fr["module"].as_str().is_some_and(|m| m.ends_with("upgraded-stacks/workload"))).collect();
    assert!(in_program.len() >= 2, "unwound through the replaced program: {frames:#?}");
    let names: Vec<&str> = in_program.iter().filter_map(|fr| fr["function"].as_str()).collect();
    assert!(names.contains(&"main"), "symbolized from the old file, not the one now at its path: {frames:#?}");
}
