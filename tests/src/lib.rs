//! Harness for gpumem's end-to-end tests: builds the C fixtures (synthetic
//! libcuda.so.1 and workload programs), runs the real `gpumem` binary as root
//! against real processes, and parses its JSON output.
//!
//! Nothing here skips: a test that cannot do its job (not root, binary not
//! built, real NVIDIA library not fetched) fails with the reason.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use serde_json::Value;

mod browser;
mod fake_device;
mod http;
mod lines;
mod prometheus;
mod receiver;
pub mod runc;
pub mod soak;
mod tools;
mod trace;
mod wait;

pub use browser::*;
pub use fake_device::*;
pub use http::*;
pub use lines::Lines;
pub use prometheus::*;
pub use receiver::*;
pub use runc::*;
pub use tools::*;
pub use trace::*;
pub use wait::*;

pub const MIB: u64 = 1024 * 1024;
pub const KIB: u64 = 1024;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The cargo target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target"))
}

/// The gpumem binary under test: $GPUMEM_BIN, or target/debug/gpumem.
pub fn gpumem_bin() -> PathBuf {
    let bin = std::env::var_os("GPUMEM_BIN").map(PathBuf::from).unwrap_or_else(|| target_dir().join("debug/gpumem"));
    assert!(bin.exists(), "{} does not exist: build it first (`cargo build -p gpumem-agent`) or run `cargo xtask test`", bin.display());
    bin
}

/// The agent as shipped: the image's release build for this machine, built
/// by `cargo xtask image` from the checkout's HEAD (`cargo xtask test` does),
/// or `GPUMEM_RELEASE_BIN`. For what depends on how fast the agent drains
/// (the debug build is about ten times slower).
pub fn release_gpumem_bin() -> PathBuf {
    let bin = std::env::var_os("GPUMEM_RELEASE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(IMAGE_BUILD_ROOT).join(format!("target/{}-unknown-linux-gnu/release/gpumem", std::env::consts::ARCH)));
    assert!(bin.exists(), "{} does not exist: build it first (`cargo xtask image`) or run `cargo xtask test`", bin.display());
    bin
}

/// The image's aarch64 agent (release), as `cargo xtask image` builds it
/// from the checkout's HEAD (`cargo xtask test` does).
pub fn aarch64_gpumem_bin() -> PathBuf {
    Path::new(IMAGE_BUILD_ROOT).join("target/aarch64-unknown-linux-gnu/release/gpumem")
}

/// The agent built for aarch64 (`cargo xtask test` builds it), and the
/// command that runs it here under qemu-user with Debian's aarch64 libraries.
pub fn aarch64_gpumem() -> std::process::Command {
    let bin = aarch64_gpumem_bin();
    assert!(bin.exists(), "{} does not exist: `cargo xtask image` builds it (cargo xtask test does)", bin.display());
    let mut cmd = std::process::Command::new("qemu-aarch64");
    cmd.env("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu").arg(bin);
    cmd
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the end-to-end tests load eBPF and must run as root");
}

pub struct Fixtures {
    pub dir: PathBuf,
    /// The synthetic driver, named like the real one.
    pub libcuda: PathBuf,
    pub workload: PathBuf,
    /// A raw-ioctl NVIDIA client (no libcuda).
    pub nvioctl: PathBuf,
    /// The synthetic NVML, named like the real one.
    pub nvml: PathBuf,
    /// The PyTorch-shaped test allocator with PyTorch's USDT probes, named
    /// like PyTorch's library (libc10_cuda.so).
    pub torch: PathBuf,
    /// A folder with a library that allocates device memory itself, built
    /// as libnccl.so.2 and libcublasLt.so.13 (the `trainer` scenario's owners).
    pub owner_libs: PathBuf,
}

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("running cc (install gcc)");
    assert!(out.status.success(), "cc {:?} failed:\n{}", args, String::from_utf8_lossy(&out.stderr));
}

/// Builds the C fixtures once per test binary.
pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let src = workspace().join("tests/fixtures");
        let dir = target_dir().join("gpumem-fixtures");
        let libdir = dir.join("fake");
        std::fs::create_dir_all(&libdir).expect("creating the fixtures dir");
        let libcuda = libdir.join("libcuda.so.1");
        let workload = dir.join("workload");
        let lib_tmp = libdir.join("libcuda.so.1.tmp");
        cc(&[
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-o",
            lib_tmp.to_str().unwrap(),
            src.join("fake_libcuda.c").to_str().unwrap(),
            "-lpthread",
        ]);
        // Replace by rename: a running process keeps the old inode intact.
        std::fs::rename(&lib_tmp, &libcuda).expect("installing the synthetic libcuda");
        // No frame pointers, like libcuda and PyTorch: stacks must come from .eh_frame.
        cc(&[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-Wall",
            "-o",
            workload.to_str().unwrap(),
            src.join("workload.c").to_str().unwrap(),
            "-ldl",
            "-lpthread",
        ]);
        let nvioctl = dir.join("nvioctl");
        let include = nv_abi_header(&dir);
        let include = format!("-I{}", include.display());
        cc(&["-O2", "-Wall", &include, "-o", nvioctl.to_str().unwrap(), src.join("nvioctl.c").to_str().unwrap()]);
        let nvml_dir = dir.join("fake-nvml");
        std::fs::create_dir_all(&nvml_dir).unwrap();
        let nvml = nvml_dir.join("libnvidia-ml.so.1");
        cc(&["-shared", "-fPIC", "-O2", "-Wall", "-o", nvml.to_str().unwrap(), src.join("fake_nvml.c").to_str().unwrap()]);
        let torch_dir = dir.join("torch");
        std::fs::create_dir_all(&torch_dir).unwrap();
        let torch = torch_dir.join("libc10_cuda.so");
        let torch_tmp = torch_dir.join("libc10_cuda.so.tmp");
        // sys/sdt.h comes with systemtap-sdt-dev (cargo xtask setup installs it).
        let (t, s) = (torch_tmp.to_str().unwrap(), src.join("torch_alloc.c"));
        cc(&["-shared", "-fPIC", "-O2", "-g", "-Wall", "-o", t, s.to_str().unwrap(), "-ldl", "-lpthread"]);
        std::fs::rename(&torch_tmp, &torch).expect("installing the test allocator");
        let owner_libs = dir.join("owners");
        std::fs::create_dir_all(&owner_libs).unwrap();
        for name in ["libnccl.so.2", "libcublasLt.so.13"] {
            let (lib, tmp) = (owner_libs.join(name), owner_libs.join(format!("{name}.tmp")));
            let s = src.join("owner_lib.c");
            cc(&["-shared", "-fPIC", "-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o", tmp.to_str().unwrap(), s.to_str().unwrap()]);
            std::fs::rename(&tmp, &lib).expect("installing an owner library");
        }
        Fixtures { dir, libcuda, workload, nvioctl, nvml, torch, owner_libs }
    })
}

/// Writes `gpumem_nv_abi.h` (NVIDIA's ioctl numbers and layouts as
/// gpumem_common::nv has them) under `dir`/include; that folder.
fn nv_abi_header(dir: &Path) -> PathBuf {
    let include = dir.join("include");
    std::fs::create_dir_all(&include).expect("creating the include dir");
    let mut h = String::from("/* Written by the test harness from gpumem_common::nv: do not edit. */\n#pragma once\n");
    for (name, value) in gpumem_common::nv::C_HEADER_FIELDS {
        h.push_str(&format!("#define GPUMEM_{name} {value}\n"));
    }
    std::fs::write(include.join("gpumem_nv_abi.h"), h).expect("writing gpumem_nv_abi.h");
    include
}

/// NVIDIA's real NVML (fetched with libcuda by `cargo xtask nvidia-libs`).
pub fn real_nvml() -> PathBuf {
    let path = real_libcuda().with_file_name("libnvidia-ml.so.1");
    assert!(path.exists(), "{} is missing: run `cargo xtask nvidia-libs`", path.display());
    path
}

/// Where `cargo xtask nvidia-libs` leaves the real NVIDIA user-space libraries.
pub fn real_libcuda() -> PathBuf {
    let path = std::env::var_os("GPUMEM_REAL_LIBCUDA")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("nvidia/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"));
    assert!(
        path.exists(),
        "the real NVIDIA libcuda is not at {}: fetch it with `cargo xtask nvidia-libs` (part of `cargo xtask test`)",
        path.display()
    );
    path
}

/// NVIDIA's Python driver bindings the tests use (`cargo xtask test-deps` installs them).
pub const CUDA_BINDINGS: &str = "cuda-bindings==13.0.1";
/// Their virtual environment, under ~/.cache/gpumem.
pub const CUDA_BINDINGS_VENV: &str = "cuda-bindings-13.0.1-venv";

/// The python of the cuda-bindings environment; fails (never skips) if it
/// was not installed.
pub fn cuda_bindings_python() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let python = PathBuf::from(home).join(".cache/gpumem").join(CUDA_BINDINGS_VENV).join("bin/python");
    assert!(python.with_file_name("..").join("installed").exists(), "{CUDA_BINDINGS} is not installed: run `cargo xtask test-deps`");
    python
}

/// Runs `gpumem leaks --json ARGS` and parses its report.
pub fn leaks(args: &[&str], envs: &[(&str, &str)]) -> Value {
    let mut full = vec!["leaks", "--json"];
    full.extend_from_slice(args);
    let out = run_gpumem(&full, envs);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["type"], "leaks");
    v
}

/// Starts the synthetic driver's late_load workload: it waits `delay_ms`, then
/// allocates 8 MiB (freed) and 4 MiB (kept), then holds `hold_ms`.
pub fn spawn_late_load(delay_ms: u32, hold_ms: u32) -> std::process::Child {
    spawn_workload("late_load", &[("GPUMEM_WORKLOAD_DELAY_MS", &delay_ms.to_string()), ("GPUMEM_WORKLOAD_HOLD_MS", &hold_ms.to_string())])
}

/// (device, bytes, allocs) of an event's `released` list; device -1 = unknown.
pub fn released(ev: &Value) -> Vec<(i64, u64, u64)> {
    ev["released"]
        .as_array()
        .unwrap_or_else(|| panic!("no released list in {ev}"))
        .iter()
        .map(|r| (r["device"].as_i64().unwrap_or(-1), r["bytes"].as_u64().unwrap(), r["allocs"].as_u64().unwrap()))
        .collect()
}

/// Runs a command to its end: (success, stdout, stderr).
pub fn command_output(cmd: &mut Command) -> (bool, String, String) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

pub fn run_gpumem(args: &[&str], envs: &[(&str, &str)]) -> Output {
    run_gpumem_bin(&gpumem_bin(), args, envs)
}

/// `run_gpumem` with another build of the agent.
pub fn run_gpumem_bin(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    wait_for_detach();
    let mut cmd = Command::new(bin);
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("running gpumem")
}

/// Runs `gpumem trace --json ARGS` and parses every line.
pub fn trace(args: &[&str], envs: &[(&str, &str)]) -> Trace {
    trace_bin(&gpumem_bin(), args, envs)
}

/// `trace` with another build of the agent.
pub fn trace_bin(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> Trace {
    let mut full = vec!["trace", "--json"];
    full.extend_from_slice(args);
    let out = run_gpumem_bin(bin, &full, envs);
    Trace::parse(&String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr).into_owned(), out.status)
}

/// The PyTorch-shaped loop (fixtures/torch_train.py) over the test allocator and the synthetic driver.
pub fn torch_cmd() -> String {
    let f = fixtures();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_train.py");
    // Its first CUDA call waits for the agent's USDT probes (their semaphore raised).
    format!("python3 {} {} {} await-probes", script.display(), f.libcuda.display(), f.torch.display())
}

/// The allocator's own figures, as the loop printed them (`torch_figures={...}`).
pub fn figures(stderr: &str) -> serde_json::Value {
    let line = stderr.lines().find_map(|l| l.strip_prefix("torch_figures=")).unwrap_or_else(|| panic!("no figures in {stderr}"));
    serde_json::from_str(line).unwrap()
}

/// Reads the loop's stderr up to its figures line; the figures.
pub fn read_figures(stderr: &mut impl std::io::BufRead) -> serde_json::Value {
    let (mut line, mut said) = (String::new(), String::new());
    while !line.starts_with("torch_figures=") {
        said.push_str(&line);
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the loop ended early: {said}");
    }
    figures(&line)
}

/// The shell command that runs one workload scenario on the synthetic driver.
pub fn workload_cmd(scenario: &str) -> String {
    let f = fixtures();
    format!("{} {} {}", f.workload.display(), f.libcuda.display(), scenario)
}

/// Starts one workload scenario on the synthetic driver in the background
/// (stdout, where `churn` prints its timing, discarded; stderr kept).
pub fn spawn_workload(scenario: &str, envs: &[(&str, &str)]) -> std::process::Child {
    let f = fixtures();
    let mut cmd = Command::new(&f.workload);
    cmd.args([f.libcuda.to_str().unwrap(), scenario]).stdout(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("starting the workload")
}

/// Starts one workload scenario on the synthetic driver in the background,
/// its stderr watched (scenarios say "phase N" as they go).
pub fn spawn_workload_watched(scenario: &str, envs: &[(&str, &str)]) -> (std::process::Child, Lines) {
    let f = fixtures();
    let mut cmd = Command::new(&f.workload);
    cmd.args([f.libcuda.to_str().unwrap(), scenario]).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("starting the workload");
    let lines = Lines::spawn(child.stderr.take().expect("piped"));
    (child, lines)
}

/// Traces one workload scenario against the synthetic driver (attached by path).
pub fn trace_workload(scenario: &str, envs: &[(&str, &str)]) -> Trace {
    let f = fixtures();
    let cmd = workload_cmd(scenario);
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "-c", &cmd], envs);
    assert!(t.status.success(), "workload {scenario} failed: {:?}\nstderr: {}", t.status, t.stderr);
    assert_eq!(t.summary["lost_events"], 0, "events lost: {:#}", t.summary);
    t
}

/// Sizes of the events of one type, in order.
pub fn sizes(events: &[&Value]) -> Vec<u64> {
    events.iter().map(|e| e["size"].as_u64().unwrap()).collect()
}

pub fn devices(events: &[&Value]) -> Vec<i64> {
    events.iter().map(|e| e["device"].as_i64().unwrap_or(-1)).collect()
}

pub fn results(events: &[&Value]) -> Vec<u64> {
    events.iter().map(|e| e["result"].as_u64().unwrap()).collect()
}

/// Watches the child's stderr (piped) and waits until a line starting with
/// `ready` (the agent's "everything is attached" line); the watcher goes on
/// collecting, to wait on later lines and to return all of stderr at the end.
/// Fails if stderr ends first.
pub fn stderr_after_line(child: &mut std::process::Child, ready: &str) -> Lines {
    let lines = Lines::spawn(child.stderr.take().expect("stderr piped"));
    lines.wait_for_start(ready, 120);
    lines
}

/// A memory cgroup (v1) limited to 64 MiB and a shell command that runs the
/// memory hog workload in it: the kernel OOM-kills the hog. Remove the
/// directory after the command.
pub fn hog_in_memory_cgroup(name: &str) -> (PathBuf, String) {
    let f = fixtures();
    let cg = PathBuf::from("/sys/fs/cgroup/memory").join(name);
    let _ = std::fs::remove_dir(&cg);
    std::fs::create_dir_all(&cg).expect("creating a memory cgroup (cgroup v1 memory controller)");
    std::fs::write(cg.join("memory.limit_in_bytes"), (64 * MIB).to_string()).unwrap();
    let _ = std::fs::write(cg.join("memory.memsw.limit_in_bytes"), (64 * MIB).to_string());
    let cmd = format!("echo $$ > {}/cgroup.procs && exec {} {} hog", cg.display(), f.workload.display(), f.libcuda.display());
    (cg, cmd)
}

/// Starts `gpumem trace --json ARGS` in the background and waits until it
/// traces (its "tracing" line on stderr).
pub fn start_agent(args: &[&str]) -> (std::process::Child, Lines) {
    start_agent_with(args, &[])
}

/// `start_agent` with environment variables (for the synthetic driver and NVML).
pub fn start_agent_with(args: &[&str], envs: &[(&str, &str)]) -> (std::process::Child, Lines) {
    wait_for_detach();
    let mut child = std::process::Command::new(gpumem_bin())
        .args(["trace", "--json"])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rest = stderr_after_line(&mut child, "gpumem: tracing");
    (child, rest)
}

/// Ends a session started in the background (SIGINT): it reports on what it saw.
pub fn interrupt(child: &std::process::Child) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

pub fn finish_agent(child: std::process::Child, stderr: Lines) -> (Vec<Value>, String) {
    let out = child.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect(), stderr)
}

/// The Python frames (function, file name, line) of a stack group or an
/// alloc event, innermost first.
pub fn python_frames(group: &Value) -> Vec<(String, String, u64)> {
    group["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["python"] == true)
        .map(|f| {
            let file = f["file"].as_str().unwrap_or("?").rsplit('/').next().unwrap_or("?").to_string();
            (f["function"].as_str().unwrap_or("?").to_string(), file, f["line"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// The frame of a recording (kind, 4-byte length, payload, checksum) that
/// holds byte `at`: its offset and its payload's length. A cut or a flip
/// aimed inside its payload damages it; a cut at a frame's end reads,
/// rightly, as a recording that ends without its footer.
pub fn recording_frame_at(recording: &[u8], at: usize) -> (usize, usize) {
    let mut frame = 12; // after the magic and the version
    loop {
        let len = u32::from_le_bytes(recording[frame + 1..frame + 5].try_into().unwrap()) as usize;
        if frame + 9 + len > at {
            return (frame, len);
        }
        frame += 9 + len;
    }
}

/// The host's online CPUs, as `/sys/devices/system/cpu/online` lists them
/// (ranges such as `0-3,8-11`).
pub fn online_cpus() -> u32 {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("reading the online CPUs");
    list.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1,
            None => 1,
        })
        .sum()
}
