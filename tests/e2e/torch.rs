//! PyTorch's caching allocator seen from outside: its `pytorch:malloc` and
//! `pytorch:free` USDT probes, semaphore-gated. Against a PyTorch-shaped
//! test allocator built with sys/sdt.h (torch_alloc.c, driven by a Python
//! loop over ctypes: allocated, reserved, free blocks and verdicts exact),
//! and against PyTorch's own libc10_cuda.so from the torch wheel (attached,
//! its semaphores raised only while gpumem runs). Run as root, one test at
//! a time (`cargo xtask test` does both, and fetches the wheel's library).
use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use gpumem_tests::*;
use serde_json::Value;

/// The shell command running the PyTorch-shaped loop (`GPUMEM_TORCH` picks the scenario).
fn device0(t: &Trace) -> Value {
    let pid = t.of_type("tensor_alloc").first().unwrap_or_else(|| panic!("no tensor events: {}", t.stderr))["pid"].as_u64().unwrap();
    let p = t.summary_process(pid);
    p["devices"].as_array().unwrap().iter().find(|d| d["device"] == 0).unwrap_or_else(|| panic!("{p:#}")).clone()
}

/// gpumem's figures for device 0 against the allocator's own.
fn assert_figures_match(d: &Value, own: &Value, tensors: u64) {
    let fb = &d["layout"]["free_blocks"];
    assert_eq!(d["live_bytes"], own["reserved"], "reserved: {d:#}");
    assert_eq!(d["allocated_bytes"], own["allocated"], "allocated: {d:#}");
    assert_eq!(d["tensors"], tensors, "{d:#}");
    assert_eq!(fb["unused_bytes"], own["unused"], "reserved but unused: {d:#}");
    assert_eq!(fb["largest_free_block"], own["largest_free"], "largest free block: {d:#}");
    assert_eq!(fb["tensors_outside_segments"], 0, "{d:#}");
}

#[test]
fn allocated_reserved_and_the_largest_free_block_are_exact_and_a_fragmented_oom_says_so() {
    require_root();
    let cmd = torch_cmd();
    // 20 steps: weights (64 MiB) and 20 kept activations of 1 MiB; each step's 3 MiB scratch freed.
    let t = trace(&["--duration", "3", "-c", &cmd], &[("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "5")]);
    let own = figures(&t.stderr);
    assert_eq!(own["allocated"], 84 * MIB);
    assert_figures_match(&device0(&t), &own, 21);
    assert!(t.stderr.contains("2 sites, 2 with semaphores raised"), "{}", t.stderr);
    let first = t.of_type("tensor_alloc")[0];
    assert_eq!((first["size"].as_u64(), first["stream"].as_str()), (Some(64 * MIB), Some("0x7")), "PyTorch's argument layout: {first}");
    assert_eq!(t.of_type("tensor_free").len(), 20, "the scratch tensors");

    // 44 tensors of 1 MiB in 2 MiB segments, every second freed: 22 MiB cached
    // in 1 MiB holes; a 4 MiB tensor's 20 MiB segment does not fit in 48 MiB.
    let envs = [("GPUMEM_TORCH", "frag"), ("GPUMEM_HOLD", "5"), ("GPUMEM_FAKE_CAPACITY", "50331648")];
    let t = trace(&["--duration", "3", "-c", &cmd], &envs);
    let own = figures(&t.stderr);
    assert_eq!((own["allocated"].as_u64(), own["largest_free"].as_u64()), (Some(22 * MIB), Some(MIB)));
    assert_figures_match(&device0(&t), &own, 22);
    let ooms = t.of_type("cuda_oom");
    assert_eq!(ooms.len(), 1, "{:#?}", t.events);
    let oom = ooms[0];
    assert_eq!(oom["size"], 20 * MIB, "the segment asked of the driver: {oom:#}");
    assert_eq!((oom["reserved_unused"].as_u64(), oom["largest_free_block"].as_u64()), (Some(22 * MIB), Some(MIB)), "{oom:#}");
    assert_eq!(oom["fragmentation"], true, "20 MiB asked with 22 MiB cached in 1 MiB blocks: {oom:#}");
    assert_eq!(t.summary["oom"]["fragmentation_ooms"], 1);
}

/// (function, line) of a group's Python frames.
fn python_frames(group: &Value) -> Vec<(String, u64)> {
    let frames = group["frames"].as_array().unwrap();
    frames
        .iter()
        .filter(|f| f["python"] == true)
        .map(|f| (f["function"].as_str().unwrap().to_string(), f["line"].as_u64().unwrap_or(0)))
        .collect()
}

#[test]
fn a_tensor_leak_is_named_by_its_python_line_and_cache_growth_is_not_a_leak() {
    require_root();
    let cmd = torch_cmd();
    // The loop keeps leaking until gpumem reports: 14 s leave the detector
    // its 6 s of growth (read 2 s back) after Python and the allocator start.
    let v = leaks(&["--older-than", "0", "--duration", "14", "-c", &cmd], &[("GPUMEM_TORCH", "leak"), ("GPUMEM_STEPS", "400")]);
    let p = v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{v:#}")).clone();
    assert_eq!((p["growth"]["verdict"].as_str(), p["growth"]["leaking"].as_bool()), (Some("leak"), Some(true)), "{:#}", p["growth"]);
    let tensors = &p["tensors"];
    let groups = tensors["stacks"].as_array().unwrap();
    let by_caller = |caller: &str| {
        groups
            .iter()
            .find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == caller))
            .unwrap_or_else(|| panic!("no tensor group from {caller}: {groups:#?}"))
    };
    let (leak, weights) = (by_caller("train_step"), by_caller("Model.load_weights"));
    let lf = python_frames(leak);
    let names: Vec<&str> = lf.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(names, ["empty", "train_step", "main", "<module>"], "{leak:#}");
    let script = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_train.py")).unwrap();
    let keep_line = script.lines().position(|l| l.contains("kept.append(")).unwrap() as u64 + 1;
    assert_eq!(lf[1].1, keep_line, "the line that keeps the activation: {lf:?}");
    let count = leak["count"].as_u64().unwrap();
    assert!(count >= 20, "{leak:#}");
    assert_eq!(leak["bytes"].as_u64(), Some(count * MIB), "exact tensor bytes: {leak:#}");
    assert_eq!(weights["bytes"].as_u64(), Some(64 * MIB));
    assert_eq!(tensors["outstanding_bytes"].as_u64(), Some(64 * MIB + count * MIB), "{tensors:#}");
    assert_eq!(tensors["allocated_bytes"], tensors["outstanding_bytes"], "{tensors:#}");

    // Each step a tensor larger than any cached block, freed at once: reserved
    // grows (new segments), allocated stays at the weights.
    let envs = [("GPUMEM_TORCH", "cache_growth"), ("GPUMEM_STEPS", "400"), ("GPUMEM_FAKE_CAPACITY", "1099511627776")];
    let v = leaks(&["--older-than", "0", "--duration", "14", "-c", &cmd], &envs);
    let p = v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{v:#}")).clone();
    let g = &p["growth"];
    assert_eq!((g["verdict"].as_str(), g["leaking"].as_bool()), (Some("cache_growth"), Some(false)), "{g:#}");
    assert_eq!(p["tensors"]["allocated_bytes"], 64 * MIB, "{:#}", p["tensors"]);
    assert!(p["live_bytes"].as_u64().unwrap() > 256 * MIB, "reserved grew: {p:#}");
}

/// A private mount namespace where `lib` is at a path only it sees (a tmpfs
/// over an empty host directory): the shell prefix that sets it up (the
/// command to run there follows, then a closing quote), and the library's
/// path inside.
fn namespace_only(lib: &std::path::Path, tag: &str) -> (String, String) {
    let dir = std::env::temp_dir().join(format!("gpumem-ns-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let inside = dir.join(lib.file_name().unwrap());
    let setup = format!("mount -t tmpfs tmpfs {d} && cp {lib} {d}/", d = dir.display(), lib = lib.display());
    (format!("unshare -m --propagation private sh -c '{setup} &&"), inside.display().to_string())
}

#[test]
fn per_point_links_for_kernels_without_uprobe_multi_see_the_same_tensors() {
    require_root();
    let envs = [("GPUMEM_TORCH", "frag"), ("GPUMEM_HOLD", "5"), ("GPUMEM_FAKE_CAPACITY", "50331648")];
    let t = trace(&["--duration", "3", "--uprobe-links", "per-point", "-c", &torch_cmd()], &envs);
    assert!(t.stderr.contains("per-point links): 2 sites, 2 with semaphores raised"), "{}", t.stderr);
    assert_figures_match(&device0(&t), &figures(&t.stderr), 22);
}

#[test]
fn the_allocator_and_libpython_in_another_mount_namespace_are_found_through_proc_root() {
    require_root();
    let f = fixtures();
    let (prefix, inside) = namespace_only(&f.torch, "fixture");
    let dir = std::path::Path::new(&inside).parent().unwrap().display().to_string();
    // The interpreter too, at a path only the namespace sees: pyenv's
    // installation bind-mounted into the namespace's tmpfs.
    let out = Command::new("python3").args(["-c", "import sys; print(sys.base_prefix)"]).output().unwrap();
    let pyenv = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_train.py");
    let cmd = format!(
        "{prefix} mkdir {dir}/py && mount --bind {pyenv} {dir}/py && exec {dir}/py/bin/python3 {} {} {inside}'",
        script.display(),
        f.libcuda.display()
    );
    let v = leaks(&["--older-than", "0", "--duration", "3", "-c", &cmd], &[("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "5")]);
    assert!(!std::path::Path::new(&inside).exists(), "the library is in the namespace only");
    let p = v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{v:#}")).clone();
    // 20 steps: 64 MiB of weights and 20 activations of 1 MiB in 104 MiB reserved.
    assert_eq!((p["live_bytes"].as_u64(), p["tensors"]["allocated_bytes"].as_u64()), (Some(104 * MIB), Some(84 * MIB)), "{p:#}");
    let fb = &p["layout"]["free_blocks"];
    assert_eq!((fb["unused_bytes"].as_u64(), fb["largest_free_block"].as_u64()), (Some(20 * MIB), Some(20 * MIB)), "{fb:#}");
    let groups = p["tensors"]["stacks"].as_array().unwrap();
    let leak =
        groups.iter().find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == "train_step")).unwrap_or_else(|| panic!("{groups:#?}"));
    assert_eq!(leak["bytes"].as_u64(), Some(20 * MIB), "{leak:#}");
    let files: Vec<&str> = leak["frames"].as_array().unwrap().iter().filter_map(|f| f["module"].as_str()).collect();
    assert!(files.iter().any(|m| m.contains(&format!("{dir}/py/"))), "libpython mapped from the namespace's path: {files:?}");
}

/// PyTorch's own libc10_cuda.so mapped by a process as the loader would (it
/// needs the CUDA runtime and a GPU to be loaded for real).
struct Mapper {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Mapper {
    fn start(shell: &str) -> Mapper {
        let mut child = Command::new("sh").args(["-c", shell]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("mapped "), "{line}");
        Mapper { child, out }
    }

    /// The 16-bit values at these file offsets of the mapped library.
    fn semaphores(&mut self, offsets: &[u64]) -> Vec<u64> {
        let line: Vec<String> = offsets.iter().map(|o| format!("{o:#x}")).collect();
        writeln!(self.child.stdin.as_mut().unwrap(), "{}", line.join(" ")).unwrap();
        let mut reply = String::new();
        self.out.read_line(&mut reply).unwrap();
        reply.trim().strip_prefix("sem ").unwrap_or_else(|| panic!("{reply}")).split(' ').map(|v| v.parse().unwrap()).collect()
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pytorchs_own_libc10_cuda_attaches_with_its_semaphores_raised_only_while_gpumem_runs() {
    require_root();
    let lib = real_torch_lib();
    let (prefix, inside) = namespace_only(&lib, "wheel");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/map_elf.py");
    let mut mapper = Mapper::start(&format!("{prefix} exec python3 {} {inside}'", script.display()));

    let out = run_gpumem(&["status", "--json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let torch = status["pytorch"].as_array().unwrap().iter().find(|t| t["path"].as_str().unwrap().ends_with(&inside)).cloned();
    let torch = torch.unwrap_or_else(|| panic!("libc10_cuda.so not found: {status:#}"));
    assert_eq!(torch["attached"], true, "{torch:#}");
    let sites = torch["sites"].as_array().unwrap();
    let shape =
        |probe: &str| -> Vec<usize> { sites.iter().filter(|s| s["probe"] == probe).map(|s| s["args"].as_array().unwrap().len()).collect() };
    assert_eq!((shape("pytorch:malloc"), shape("pytorch:free")), (vec![4, 4], vec![1, 1]), "every argument spec parsed: {torch:#}");
    let malloc_args: Vec<&str> = sites[2]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(malloc_args, ["i64 %rbp", "i8 %rax", "i64 %r12", "i64 56(%rsp)"], "{torch:#}");
    let mut semaphores: Vec<u64> = sites.iter().map(|s| s["semaphore"].as_u64().expect("semaphore-gated")).collect();
    semaphores.dedup();
    assert_eq!(semaphores.len(), 2, "one semaphore per probe: {torch:#}");
    wait_for_detach();
    assert_eq!(mapper.semaphores(&semaphores), [0, 0], "lowered once status detached");

    // Both ways of linking: uprobe_multi (6.6+) and a perf-event uprobe per site.
    for links in ["multi", "per-point"] {
        let (agent, stderr) = start_agent(&["--duration", "3", "--uprobe-links", links]);
        let raised = mapper.semaphores(&semaphores);
        assert_eq!(raised, [2, 2], "raised while gpumem runs, once per site ({links}): {raised:?}");
        let (_, stderr) = finish_agent(agent, stderr);
        wait_for_detach();
        assert_eq!(mapper.semaphores(&semaphores), [0, 0], "lowered when gpumem stopped ({links}); {stderr}");
    }

    // SIGKILL: the kernel lowers them when the link's last descriptor goes.
    let (mut agent, _stderr) = start_agent(&["--duration", "30"]);
    assert!(mapper.semaphores(&semaphores).iter().all(|&v| v > 0));
    agent.kill().unwrap();
    agent.wait().unwrap();
    wait_for_detach();
    assert_eq!(mapper.semaphores(&semaphores), [0, 0], "lowered after SIGKILL");
}

#[test]
fn metrics_and_top_show_allocated_beside_reserved() {
    require_root();
    let cmd = torch_cmd();
    let mut workload = Command::new("sh")
        .args(["-c", &format!("exec {cmd}")])
        .envs([("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "30")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let serve = Serve::start(&["--no-nvml"], &[]);
    // The loop starts its CUDA calls 0.3 s in: after serve attached.
    let mut err = BufReader::new(workload.stderr.take().unwrap());
    let own = read_figures(&mut err);
    let pid = workload.id();
    // What the loop allocated, as the daemon applied it.
    let text = poll(
        10,
        "the loop's tensors on /metrics",
        || {
            let t = serve.metrics();
            let matches = |name: &str, key: &str| pid_series(&t, name, pid) == own[key].as_f64();
            (matches("gpumem_process_allocated_bytes", "allocated")
                && matches("gpumem_process_memory_bytes", "reserved")
                && matches("gpumem_process_reserved_unused_bytes", "unused")
                && matches("gpumem_process_largest_free_block_bytes", "largest_free"))
            .then_some(t)
        },
        || serve.metrics(),
    );
    let series = |name: &str| pid_series(&text, name, pid).unwrap_or_else(|| panic!("no {name} for pid {pid} in\n{text}"));
    assert_eq!(series("gpumem_process_allocated_bytes"), own["allocated"].as_f64().unwrap());
    assert_eq!(series("gpumem_process_memory_bytes"), own["reserved"].as_f64().unwrap());
    assert_eq!(series("gpumem_process_reserved_unused_bytes"), own["unused"].as_f64().unwrap());
    assert_eq!(series("gpumem_process_largest_free_block_bytes"), own["largest_free"].as_f64().unwrap());
    // promtool's only complaints: the camelCase labels kept for joins with dcgm-exporter.
    let (code, said) = promtool_check_metrics(&text);
    assert_ne!(code, Some(1), "promtool could not parse it: {said}");
    let complaints: Vec<&str> = said.lines().filter(|l| !l.contains("not 'camelCase'")).collect();
    assert!(complaints.is_empty(), "promtool: {}", complaints.join("\n"));
    drop(serve);
    let _ = workload.kill();
    let _ = workload.wait();

    // top, started before a second run of the loop: both columns.
    wait_for_detach();
    let mut top = Command::new(gpumem_bin())
        .args(["top", "--once", "--duration", "3", "--no-nvml"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = stderr_after_line(&mut top, "gpumem: tracing for");
    let mut workload =
        Command::new("sh").args(["-c", &format!("exec {cmd}")]).envs([("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "10")]).spawn().unwrap();
    let out = top.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    let _ = workload.kill();
    let _ = workload.wait();
    let top = String::from_utf8(out.stdout).unwrap();
    let header = top.lines().find(|l| l.trim_start().starts_with("PID")).unwrap_or_else(|| panic!("{top}\n{stderr}"));
    assert!(header.contains("LIVE") && header.contains("TENSORS"), "{header}");
    let row = top.lines().find(|l| l.split_whitespace().next() == Some(&workload.id().to_string())).unwrap_or_else(|| panic!("{top}"));
    let w: Vec<&str> = row.split_whitespace().collect();
    // PID POD COMM GPU LIVE(2 words) ALLOCS TENSORS(2 words) ...
    assert_eq!((w[4], w[5], w[7], w[8]), ("104.0", "MiB", "84.0", "MiB"), "reserved, then allocated: {row}");
}

/// The operands of a `readelf -n` "Arguments:" line: split at spaces
/// outside brackets (`8@[sp, 40]` is one).
fn note_arguments(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in line.trim().chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ' ' if depth == 0 => {
                out.extend((!cur.is_empty()).then(|| std::mem::take(&mut cur)));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.extend((!cur.is_empty()).then_some(cur));
    out
}

/// What `gpumem status` says of the libc10_cuda.so a process maps from `lib`.
fn torch_status_of(lib: &std::path::Path) -> Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/map_elf.py");
    let _mapper = Mapper::start(&format!("exec python3 {} {}", script.display(), lib.display()));
    let out = run_gpumem(&["status", "--json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let path = lib.display().to_string();
    let found = status["pytorch"].as_array().unwrap().iter().find(|t| t["path"].as_str().is_some_and(|p| p.ends_with(&path))).cloned();
    found.unwrap_or_else(|| panic!("{path} not found: {status:#}"))
}

#[test]
fn aarch64_libraries_probes_read_in_aarch64_syntax_and_not_attached_by_an_x86_64_agent() {
    require_root();
    // The test allocator built for aarch64 (GCC at -O0 puts arguments on the stack: `8@[sp, 40]`).
    let dir = std::env::temp_dir().join(format!("gpumem-aarch64-{}", std::process::id()));
    let sys = dir.join("include/sys");
    std::fs::create_dir_all(&sys).unwrap();
    for h in ["sdt.h", "sdt-config.h"] {
        std::fs::copy(format!("/usr/include/x86_64-linux-gnu/sys/{h}"), sys.join(h)).expect("systemtap-sdt-dev's headers");
    }
    let lib = dir.join("libc10_cuda.so");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_alloc.c");
    let include = format!("-I{}", dir.join("include").display());
    let cc = Command::new("aarch64-linux-gnu-gcc")
        .args(["-shared", "-fPIC", "-O0", "-g", &include, "-o", lib.to_str().unwrap(), src.to_str().unwrap(), "-ldl", "-lpthread"])
        .status()
        .expect("aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu; cargo xtask setup installs it)");
    assert!(cc.success());
    // What binutils reads in its notes.
    let notes = Command::new("readelf").arg("-n").arg(&lib).output().unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    let expected: Vec<Vec<String>> = notes
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Arguments:"))
        .map(|args| {
            let described = |spec: &String| {
                let (size, operand) = spec.split_once('@').unwrap();
                let bits = size.trim_start_matches('-').parse::<u32>().unwrap() * 8;
                format!("{}{bits} {operand}", if size.starts_with('-') { "i" } else { "u" })
            };
            note_arguments(args).iter().map(described).collect()
        })
        .collect();
    assert_eq!(expected.iter().map(Vec::len).collect::<Vec<_>>(), [4, 1], "{notes}");
    assert!(expected[0].iter().any(|a| a.contains("[sp, ")), "memory operands at -O0: {expected:?}");

    let torch = torch_status_of(&lib);
    let said: Vec<Vec<String>> = torch["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect())
        .collect();
    assert_eq!(said, expected, "every argument read in aarch64's syntax: {torch:#}");
    assert!(torch["sites"].as_array().unwrap().iter().all(|s| s["semaphore"].as_u64().is_some()), "{torch:#}");
    assert_eq!(torch["attached"], false, "{torch:#}");
    let why = torch["error"].as_str().unwrap_or_default();
    assert!(why.contains("written for aarch64; this agent runs on x86_64"), "{torch:#}");

    // PyTorch 2.15's own aarch64 libc10_cuda.so has no USDT probes at all:
    // on Grace, tensors are seen only where a build has them.
    let wheel = real_torch_lib_aarch64();
    let copy = dir.join("wheel/libc10_cuda.so");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&wheel, &copy).unwrap();
    let torch = torch_status_of(&copy);
    assert_eq!((torch["attached"].as_bool(), torch["sites"].as_array().map(Vec::len)), (Some(false), Some(0)), "{torch:#}");
    assert!(torch["error"].as_str().unwrap_or_default().contains("no pytorch:malloc or pytorch:free probes"), "{torch:#}");
    let _ = std::fs::remove_dir_all(&dir);
}
