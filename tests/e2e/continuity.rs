//! Continuity of `gpumem serve` across restarts: its kernel state pinned
//! in bpffs, the kernel's own table of live entries adopted by the next
//! agent, the local API through which `top`, `leaks` and `status` use a
//! running daemon, and the bad cases (another layout, a full table, no
//! bpffs, stale and foreign sockets, a daemon of another version).
//! Run as root, one test at a time (`cargo xtask test` does both).
use std::{
    io::{BufRead as _, BufReader},
    process::{Child, ChildStderr, Command, Stdio},
};

use gpumem_tests::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The `phases` workload: it moves to its next phase at each SIGUSR1 and
/// says "phase N" on stderr when one is done.
struct Phases {
    child: Child,
    stderr: BufReader<ChildStderr>,
}

impl Phases {
    fn start() -> Phases {
        let f = fixtures();
        let mut child = Command::new(&f.workload)
            .args([f.libcuda.to_str().unwrap(), "phases"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut p = Phases { child, stderr };
        p.wait_for(0);
        p
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_for(&mut self, n: u32) {
        let mut line = String::new();
        self.stderr.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("phase {n}"), "the workload failed");
    }

    /// The next phase, done.
    fn next(&mut self, n: u32) {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGUSR1) };
        self.wait_for(n);
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Device bytes serve exports for a process on GPU 0.
fn memory_bytes(serve: &Serve, pid: u32) -> Option<u64> {
    let prefix = format!("gpumem_process_memory_bytes{{pid=\"{pid}\"");
    serve
        .metrics()
        .lines()
        .find(|l| l.starts_with(&prefix) && l.contains("gpu=\"0\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits until serve exports these bytes for the process (events are read
/// within a poll interval).
fn wait_for_bytes(serve: &Serve, pid: u32, bytes: u64) {
    let what = format!("pid {pid}'s {bytes} bytes exported");
    poll(
        10,
        &what,
        || (memory_bytes(serve, pid) == Some(bytes)).then_some(()),
        || format!(": {:?}\n{}", memory_bytes(serve, pid), serve.metrics()),
    );
}

/// Waits for two maintenance ticks from now (`--milestones`): what the
/// agent learned is in the kernel's table (written back at each tick).
fn two_ticks(serve: &Serve) {
    for _ in 0..2 {
        serve.stderr().wait_after(serve.stderr().mark(), "milestone tick", 10);
    }
}

fn serve_args(state: &ServeState, extra: &[&str]) -> Vec<String> {
    let f = fixtures();
    let mut args = state.args();
    args.extend(["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn start(args: &[String]) -> Serve {
    Serve::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
}

fn gpumem(args: &[&str]) -> std::process::Output {
    Command::new(gpumem_bin()).args(args).output().unwrap()
}

/// The daemon's leaks report for one process, as JSON.
fn daemon_leaks(state: &ServeState, pid: u32) -> Value {
    let out = gpumem(&["leaks", "--json", "--socket", state.socket.to_str().unwrap(), "-p", &pid.to_string(), "--older-than", "0"]);
    assert!(out.status.success(), "leaks: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The restart test, with the signal that stops the first agent.
fn restart_loses_nothing(signal: i32) {
    require_root();
    let state = ServeState::new(&format!("restart-{signal}"));
    let args = serve_args(&state, &["--milestones"]);
    let first = start(&args);
    // Phase 0 before the agent: 8 MiB, a 4 MiB VMM handle mapped, 64 KiB pinned.
    let mut w = Phases::start();
    wait_for_bytes(&first, w.pid(), 12 * MIB);
    // What the agent learned (devices, stack ids) reaches the kernel's table
    // at its next tick (0.5 s): an allocation younger than that at a SIGKILL
    // keeps its bytes, not its stack.
    two_ticks(&first);
    let (_, said) = first.signal(signal);
    if signal == libc::SIGTERM {
        assert!(said.contains("probes stay attached and keep counting"), "{said}");
    }
    assert!(gpumem_programs().iter().any(|n| n == "cuda_m_return"), "no agent runs, the probes do");
    // The gap: 16 MiB and 2 MiB allocated, the 8 MiB freed, no agent running.
    w.next(1);
    let mut second = start(&args);
    // Exact at once: what was live before, and what the gap did.
    assert_eq!(memory_bytes(&second, w.pid()), Some(22 * MIB), "{}", second.metrics());
    // After the restart: the 16 MiB (allocated in the gap) freed, 1 MiB allocated.
    w.next(2);
    wait_for_bytes(&second, w.pid(), 7 * MIB);
    let leaks = daemon_leaks(&state, w.pid());
    let p = leaks["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{leaks:#}"));
    assert_eq!(p["pid"], w.pid());
    assert_eq!(p["untracked_frees"], 0, "a free of what the gap made or freed is not untracked: {p:#}");
    assert_eq!(p["live_bytes"], 7 * MIB);
    let groups = p["stacks"].as_array().unwrap_or_else(|| panic!("{p:#}"));
    let sizes: Vec<u64> = groups.iter().map(|g| g["bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [4 * MIB, 2 * MIB, MIB], "{p:#}");
    for g in groups {
        // Before the restart (the VMM handle), during the gap (2 MiB) and after (1 MiB): every one with its stack.
        let frames = g["frames"].as_array().unwrap();
        assert!(frames.iter().any(|f| f["file"].as_str().is_some_and(|s| s.ends_with("workload.c"))), "no stack: {g:#}");
    }
    // trace's summary names what the daemon knows the process holds from its start.
    let f = fixtures();
    let (sock, pid) = (state.socket.to_str().unwrap(), w.pid().to_string());
    let out = gpumem(&[
        "trace",
        "--json",
        "--socket",
        sock,
        "-p",
        &pid,
        "--duration",
        "0.5",
        "--libcuda",
        f.libcuda.to_str().unwrap(),
        "--no-nvml",
    ]);
    let summary: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("{}")).unwrap();
    let known = &summary["known_to_daemon"];
    assert_eq!(known[0]["pid"], w.pid(), "{summary:#}");
    assert_eq!((known[0]["device"].as_i64(), known[0]["live_bytes"].as_u64()), (Some(0), Some(7 * MIB)), "{summary:#}");
    let top = gpumem(&["top", "--once", "--socket", state.socket.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(text.contains("7.0 MiB"), "{text}");
    let status = gpumem(&["status", "--json", "--socket", state.socket.to_str().unwrap(), "--pin-dir", state.pin_dir.to_str().unwrap()]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["daemon"]["pid"], second.child.id());
    assert_eq!(status["daemon"]["continuity"]["adopted"]["entries"], 8, "{:#}", status["daemon"]);
    assert_eq!(status["daemon"]["kernel_table"]["entries"], 8, "{:#}", status["daemon"]);
    assert_eq!(status["pinned"][0]["compatible"], true);
    second.state = Some(state);
    let (_, said) = second.stop();
    assert!(said.contains("took over from the last agent"), "{said}");
    assert!(said.contains("adopted the pinned state: 8 live entries of 1 processes rebuilt"), "{said}");
    // The VMM handle's stack was written by the first agent; the gap's
    // allocations get theirs from the ring.
    assert!(said.contains("(1 with their stacks"), "{said}");
    // `serve --cleanup` (what stop ran) detaches them all.
    poll(
        10,
        "every program gone after serve --cleanup",
        || gpumem_programs().is_empty().then_some(()),
        || format!(": {:?}", gpumem_programs()),
    );
}

#[test]
fn sigkill_of_serve_while_a_workload_allocates_in_the_gap_loses_nothing() {
    restart_loses_nothing(libc::SIGKILL);
}

#[test]
fn sigterm_of_serve_an_upgrade_loses_nothing() {
    restart_loses_nothing(libc::SIGTERM);
}

#[test]
fn pinned_state_of_another_layout_or_size_is_replaced_never_read() {
    require_root();
    let state = ServeState::new("layouts");
    // What another gpumem build left: a layout of another name.
    std::fs::create_dir_all(state.pin_dir.join("v0-00000000/links")).unwrap();
    let first = start(&serve_args(&state, &[]));
    let (_, said) = first.signal(libc::SIGTERM);
    assert!(said.contains("pinned state of another gpumem layout (v0-00000000"), "{said}");
    assert!(!state.pin_dir.join("v0-00000000").exists());
    // Same layout, but a kernel table of another size: aya refuses the map.
    let mut second = start(&serve_args(&state, &["--kernel-table-entries", "1000"]));
    second.state = Some(state);
    let (_, said) = second.stop();
    assert!(said.contains("pinned state does not match this gpumem"), "{said}");
    assert!(said.contains("max_entries"), "{said}");
    assert!(!said.contains("adopted the pinned state"), "{said}");
}

#[test]
fn a_full_kernel_table_is_counted_and_its_process_uncertain_after_a_restart() {
    require_root();
    let state = ServeState::new("full");
    let args = serve_args(&state, &["--kernel-table-entries", "4"]);
    let first = start(&args);
    let w = Phases::start();
    wait_for_bytes(&first, w.pid(), 12 * MIB);
    // Phase 0 makes 8 entries (context, current context, reservation, handle,
    // mapping, 8 MiB, pinned host): 4 fit.
    let m = first.metrics();
    assert_eq!(sample(&m, "gpumem_table_overflow_total{table=\"kernel_live_entries\"}"), Some(3.0), "{m}");
    assert_eq!(sample(&m, "gpumem_kernel_table_entries"), Some(4.0), "{m}");
    first.signal(libc::SIGKILL);
    let mut second = start(&args);
    let m = second.metrics();
    let lost = format!("gpumem_process_events_lost_total{{pid=\"{}\"", w.pid());
    assert!(m.lines().any(|l| l.starts_with(&lost)), "the process is not marked uncertain:\n{m}");
    second.state = Some(state);
    second.stop();
}

#[test]
fn without_bpffs_serve_runs_unpinned_and_says_so() {
    require_root();
    let f = fixtures();
    let socket = target_dir().join("serve-state/unpinned.sock");
    let serve = Serve::start_with(
        &[
            "--pin-dir",
            "/proc/gpumem-none/pins",
            "--socket",
            socket.to_str().unwrap(),
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--no-nvml",
        ],
        &[],
    );
    let (_, said) = serve.signal(libc::SIGTERM);
    assert!(said.contains("running unpinned"), "{said}");
    assert!(said.contains("probes detached"), "unpinned probes go with the agent: {said}");
}

#[test]
fn sockets_that_are_stale_foreign_or_of_another_version_are_not_used() {
    require_root();
    let dir = target_dir().join("serve-state/sockets");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let f = fixtures();
    let own = ["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--duration", "0.5"];
    // Stale: nobody listens. top falls back to its own probes and says why.
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let out = gpumem(&[&["top", "--once", "--socket", stale.to_str().unwrap()][..], &own].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stale socket"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("process(es)"));
    // Foreign: owned by another user. Neither the commands nor serve use it.
    let foreign = dir.join("foreign.sock");
    drop(std::os::unix::net::UnixListener::bind(&foreign).unwrap());
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    let out = gpumem(&["leaks", "--socket", foreign.to_str().unwrap(), "-p", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("belongs to uid 65534"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = gpumem(&["serve", "--no-pin", "--socket", foreign.to_str().unwrap(), "--listen", "127.0.0.1:0", "--no-nvml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not replacing it"), "{}", String::from_utf8_lossy(&out.stderr));
    // Another version: an HTTP answer that names another gpumem.
    let other = dir.join("other.sock");
    let listener = std::os::unix::net::UnixListener::bind(&other).unwrap();
    let server = std::thread::spawn(move || {
        use std::io::{Read as _, Write as _};
        let (mut s, _) = listener.accept().unwrap();
        // The whole request, then the answer.
        let (mut req, mut buf) = (Vec::new(), [0u8; 1024]);
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the request was cut short: {req:?}");
            req.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nx-gpumem-version: 0.0.1\r\ncontent-length: 5\r\nconnection: close\r\n\r\nold!\n").unwrap();
    });
    let out = gpumem(&[&["top", "--once", "--socket", other.to_str().unwrap()][..], &own].concat());
    server.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is version 0.0.1, this gpumem is"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("old!"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pytorch_tensors_held_across_a_restart_stay_exact() {
    require_root();
    let state = ServeState::new("tensors");
    let args = serve_args(&state, &["--milestones"]);
    let first = start(&args);
    let mut workload = Command::new("sh")
        .args(["-c", &format!("exec {}", torch_cmd())])
        .envs([("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "30")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(workload.stderr.take().unwrap());
    let own = read_figures(&mut err);
    let pid = workload.id();
    let series = |serve: &Serve, name: &str| pid_series(&serve.metrics(), name, pid);
    poll(
        10,
        "the loop's tensors on /metrics",
        || (series(&first, "gpumem_process_allocated_bytes") == own["allocated"].as_f64()).then_some(()),
        || first.metrics(),
    );
    // The stacks the agent learned reach the kernel's table at its ticks.
    two_ticks(&first);
    first.signal(libc::SIGKILL);
    let mut second = start(&args);
    // Tensors and segments both come back from the kernel's table.
    assert_eq!(series(&second, "gpumem_process_allocated_bytes"), own["allocated"].as_f64(), "{}", second.metrics());
    assert_eq!(series(&second, "gpumem_process_memory_bytes"), own["reserved"].as_f64());
    assert_eq!(series(&second, "gpumem_process_reserved_unused_bytes"), own["unused"].as_f64());
    let leaks = daemon_leaks(&state, pid);
    let p = leaks["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{leaks:#}")).clone();
    // The leaking line (kept.append), from stacks the first agent kept.
    let script = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_train.py")).unwrap();
    let keep_line = script.lines().position(|l| l.contains("kept.append(")).unwrap() as u64 + 1;
    let groups = p["tensors"]["stacks"].as_array().unwrap_or_else(|| panic!("{p:#}"));
    let kept = groups
        .iter()
        .find(|g| g["frames"].as_array().unwrap().iter().any(|f| f["function"] == "train_step" && f["line"] == keep_line))
        .unwrap_or_else(|| panic!("no tensors at the leaking line: {p:#}"));
    assert_eq!(kept["bytes"], 20 * MIB, "{kept:#}");
    let _ = workload.kill();
    let _ = workload.wait();
    second.state = Some(state);
    second.stop();
}
