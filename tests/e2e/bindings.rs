//! A Python training loop over NVIDIA's own driver bindings (PyPI
//! cuda-bindings: every entry point through cuGetProcAddress_v2), on the
//! synthetic driver, with a library's deferred frees released 11 at a
//! time: its leak is the one group called a leak, in `leaks`, in `top
//! --once` over a daemon and in `/metrics`. The CUDA runtime is never
//! loaded (the loop checks its own maps).
use std::process::{Command, Stdio};

use gpumem_tests::*;
use serde_json::Value;

/// A card the loop's leak does not fill while tested (1 TiB).
const BIG_CARD: &str = "1099511627776";

fn loop_cmd() -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bindings_train.py");
    format!("{} {}", cuda_bindings_python().display(), script.display())
}

/// The line of the script that keeps the leaked buffer.
fn leak_line() -> u64 {
    let script = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bindings_train.py")).unwrap();
    script.lines().position(|l| l.contains("kept.append(alloc(")).unwrap() as u64 + 1
}

/// The directory of the synthetic libcuda.so.1: where the bindings dlopen it.
fn driver_dir() -> String {
    fixtures().libcuda.parent().unwrap().to_str().unwrap().to_string()
}

fn python_frames(group: &Value) -> Vec<(String, u64)> {
    group["frames"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter(|f| f["python"] == true)
                .map(|f| (f["function"].as_str().unwrap_or("?").to_string(), f["line"].as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

fn is_leak_group(g: &Value) -> bool {
    python_frames(g).iter().any(|(f, l)| f == "train_step" && *l == leak_line())
}

#[test]
fn a_loop_over_nvidias_python_driver_bindings_with_batched_frees_has_one_leaking_group() {
    require_root();
    let f = fixtures();
    let dir = driver_dir();
    let envs = [("LD_LIBRARY_PATH", dir.as_str()), ("GPUMEM_STEPS", "500"), ("GPUMEM_FAKE_CAPACITY", BIG_CARD)];
    let cmd = loop_cmd();
    let out = run_gpumem(
        &["leaks", "--json", "--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "-n", "10", "--duration", "14", "-c", &cmd],
        &envs,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("bindings: no libcudart mapped"), "the loop checked its maps: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{v:#}")).clone();
    let groups = p["stacks"].as_array().unwrap();
    let leak =
        groups.iter().find(|g| is_leak_group(g)).unwrap_or_else(|| panic!("no group from train_step's line {}: {groups:#?}", leak_line()));
    assert_eq!(leak["verdict"]["verdict"], "leak", "{leak:#}");
    let rate = leak["verdict"]["rate_bytes_per_s"].as_f64().unwrap() / MIB as f64;
    assert!(rate > 5.0, "2 MiB a step, a step every 0.05 s and a bit: {rate} MiB/s");
    assert_eq!(leak["bytes"].as_u64(), Some(leak["count"].as_u64().unwrap() * 2 * MIB), "exact bytes: {leak:#}");
    let called: Vec<(Vec<(String, u64)>, &Value)> = groups.iter().map(|g| (python_frames(g), &g["verdict"]["verdict"])).collect();
    let leaking = groups.iter().filter(|g| g["verdict"]["verdict"] == "leak").count();
    assert_eq!(leaking, 1, "only the leak is called a leak: {called:#?}");
    // The weights (made right after the bindings' import: their Python
    // frames may not be walked yet), held and never called a leak.
    let weights = groups
        .iter()
        .find(|g| !is_leak_group(g) && g["bytes"].as_u64() >= Some(256 * MIB))
        .unwrap_or_else(|| panic!("the weights' group: {called:#?}"));
    assert_ne!(weights["verdict"]["verdict"], "leak", "{weights:#}");
    assert_eq!((p["growth"]["verdict"].as_str(), p["growth"]["leaking"].as_bool()), (Some("leak"), Some(true)), "{:#}", p["growth"]);
    // Who asked the driver: the script behind the bindings (its Python frames), every byte counted once.
    let owners = p["by_owner"].as_array().unwrap();
    let script = owners.iter().find(|o| o["owner"] == "bindings_train.py").unwrap_or_else(|| panic!("{owners:#?}"));
    assert!(script["bytes"].as_u64().unwrap() >= leak["bytes"].as_u64().unwrap(), "{owners:#?}");
    let total: u64 = owners.iter().map(|o| o["bytes"].as_u64().unwrap()).sum();
    assert_eq!(Some(total), p["live_bytes"].as_u64(), "{owners:#?}");
}

#[test]
fn top_over_a_daemon_and_metrics_call_the_same_one_group_a_leak() {
    require_root();
    let f = fixtures();
    let state = ServeState::new("bindings-daemon");
    let mut args = state.args();
    args.extend(["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"].map(String::from));
    let mut serve = Serve::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let socket = state.socket.clone();
    serve.state = Some(state);
    let mut child = Command::new("sh")
        .args(["-c", &format!("exec {}", loop_cmd())])
        .env("LD_LIBRARY_PATH", driver_dir())
        .env("GPUMEM_STEPS", "600")
        .env("GPUMEM_FAKE_CAPACITY", BIG_CARD)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let groups = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("gpumem_leak_group_bytes{") && l.contains(&format!("pid=\"{pid}\"")))
            .map(String::from)
            .collect()
    };
    let lines =
        poll(30, "the daemon to call the loop's leak", || Some(groups(&serve.metrics())).filter(|g| !g.is_empty()), || serve.metrics());
    assert_eq!(lines.len(), 1, "one leaking group: {lines:#?}");
    let text = serve.metrics();
    assert_eq!(pid_series(&text, "gpumem_process_leak_suspected", pid), Some(1.0));
    assert!(
        text.lines().any(|l| l.starts_with("gpumem_process_memory_by_owner_bytes{")
            && l.contains(&format!("pid=\"{pid}\""))
            && l.contains("owner=\"bindings_train.py\"")),
        "the script owns its memory: {text}"
    );
    let stack_id = lines[0].split("stack_id=\"").nth(1).and_then(|s| s.split('"').next()).unwrap().to_string();

    // top --once asks the daemon: its verdict at once, the same.
    let ask = |args: &[&str]| Command::new(gpumem_bin()).args(args).output().unwrap();
    let out = ask(&["top", "--once", "--socket", socket.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row = text.lines().find(|l| l.trim_start().starts_with(&pid.to_string())).unwrap_or_else(|| panic!("no row for {pid}: {text}"));
    assert!(row.contains("LEAK"), "{row}");

    // The daemon's leaks: the group with that id is the leaking one, from train_step.
    let out = ask(&["leaks", "--json", "--older-than", "0", "-p", &pid.to_string(), "--socket", socket.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = v["processes"][0]["stacks"].as_array().unwrap().clone();
    let g = groups.iter().find(|g| g["stack_id"] == stack_id.as_str()).unwrap_or_else(|| panic!("{stack_id} in {groups:#?}"));
    assert!(is_leak_group(g), "{g:#}");
    let _ = child.kill();
    let _ = child.wait();
    serve.stop();
}

/// A query for every probed entry point: (base name, CUDA version, flags,
/// the exported symbol gpumem probes), as NVIDIA's callers ask for it.
fn queries() -> Vec<(String, bool)> {
    gpumem_common::APIS
        .iter()
        .map(|a| {
            let (name, flags) = match a.symbol.strip_suffix("_ptsz") {
                Some(base) => (base, 2),
                None => (a.symbol, 0),
            };
            let base = name.rsplit_once("_v").filter(|(_, n)| n.parse::<u32>().is_ok()).map_or(name, |(b, _)| b);
            // cuCtxCreate has three: each is what its own version asks for.
            let version = match a.symbol {
                "cuCtxCreate_v2" => 3020,
                "cuCtxCreate_v4" => 12050,
                _ => 12020,
            };
            (format!("{base}:{version}:{flags}:{}", a.symbol), a.required)
        })
        .collect()
}

/// `procaddress` against `libcuda`: one line per query.
fn ask_procaddress(libcuda: &std::path::Path) -> Vec<String> {
    let bin = target_dir().join("gpumem-fixtures/procaddress");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/procaddress.c");
    let built = Command::new("cc").args(["-O2", "-Wall", "-o"]).arg(&bin).arg(&src).status().expect("cc");
    assert!(built.success(), "building procaddress");
    let q = queries();
    let out = Command::new(&bin).arg(libcuda).args(q.iter().map(|(q, _)| q)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), q.len(), "{lines:?}");
    lines
}

#[test]
fn nvidias_libcuda_hands_out_through_cu_get_proc_address_exactly_the_symbols_gpumem_probes() {
    // Without a GPU cuInit fails, but cuGetProcAddress_v2 answers: the
    // runtime's and the bindings' callers call the very code gpumem probes.
    for (lib, what) in [(real_libcuda(), "NVIDIA's libcuda 535"), (fixtures().libcuda.clone(), "the synthetic driver")] {
        let lines = ask_procaddress(&lib);
        for (line, (_, required)) in lines.iter().zip(queries()) {
            let verdict = line.split_whitespace().nth(4).unwrap();
            // cuCtxCreate_v4 (CUDA 12.5) is in neither: optional, and absent.
            let ok = verdict == "same" || (!required && verdict == "absent");
            assert!(ok, "{what}: {line}");
        }
        let same = lines.iter().filter(|l| l.contains(" same ")).count();
        let required = gpumem_common::APIS.iter().filter(|a| a.required).count();
        assert!(same >= required, "{what}: {lines:#?}");
    }
}
