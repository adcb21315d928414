//! Python frames in allocation stacks, zero instrumentation: CPython 3.11
//! built two ways on this machine (pyenv's, with the interpreter in
//! libpython3.11.so; Debian's /usr/bin/python3.11, with it linked into the
//! executable) running a ctypes training loop over the synthetic libcuda.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

/// The pyenv interpreter on PATH, by its full path (the test's PATH may differ).
fn pyenv_python() -> String {
    let out = std::process::Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output().expect("python3 on PATH");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn train_cmd(python: &str) -> String {
    let f = fixtures();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/train.py");
    format!("{python} {} {}", script.display(), f.libcuda.display())
}

fn names(frames: &[(String, String, u64)]) -> Vec<&str> {
    frames.iter().map(|(n, _, _)| n.as_str()).collect()
}

/// `gpumem leaks` of the training loop: the leak and the weights, each with
/// its Python frames, apart.
fn leak_and_weights_are_told_apart(python: &str) {
    require_root();
    let cmd = train_cmd(python);
    let v = leaks(&["--older-than", "0", "--duration", "3", "-n", "10", "-c", &cmd], &[("GPUMEM_STEPS", "20"), ("GPUMEM_HOLD", "6")]);
    let p = &v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).unwrap_or_else(|| panic!("{v:#}")).clone();
    let groups = p["stacks"].as_array().unwrap();
    let find = |caller: &str| {
        groups
            .iter()
            .find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == caller))
            .unwrap_or_else(|| panic!("no group allocated from {caller}: {groups:#?}"))
    };
    let (leak, weights) = (find("train_step"), find("Model.load_weights"));
    let lf = python_frames(leak);
    assert_eq!(names(&lf), ["alloc", "train_step", "main", "<module>"], "{leak:#}");
    assert!(lf.iter().all(|(_, file, line)| file == "train.py" && *line > 0), "{lf:?}");
    assert_eq!(lf[1].2, 38, "train_step's line that keeps the activation: {lf:?}");
    assert_eq!((leak["count"].as_u64(), leak["bytes"].as_u64()), (Some(20), Some(20 * MIB)), "exact leaked bytes");
    assert_eq!(names(&python_frames(weights)), ["alloc", "Model.load_weights", "main", "<module>"]);
    assert_eq!(weights["bytes"].as_u64(), Some(64 * MIB));
    // Native frames around them: the ctypes call below, the interpreter's entry above.
    let all: Vec<&str> = leak["frames"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
    assert!(all.iter().any(|f| f.contains("ffi_call") || f.contains("_ctypes_callproc")), "{all:?}");
    assert_eq!(p["outstanding_bytes"].as_u64(), Some(64 * MIB + 20 * MIB));
}

#[test]
fn pyenv_python_in_libpython_names_the_leaking_function_apart_from_the_weights() {
    leak_and_weights_are_told_apart(&pyenv_python());
}

#[test]
fn debian_python_linked_into_the_executable_names_the_leaking_function_apart_from_the_weights() {
    leak_and_weights_are_told_apart("/usr/bin/python3.11");
}

#[test]
fn a_python_loop_that_frees_what_it_allocates_leaks_nothing() {
    require_root();
    let cmd = train_cmd(&pyenv_python());
    let v = leaks(&["--older-than", "0", "--duration", "3", "-c", &cmd], &[("GPUMEM_FREE_ALL", "1"), ("GPUMEM_HOLD", "6")]);
    let held: u64 = v["processes"].as_array().unwrap().iter().map(|p| p["outstanding_bytes"].as_u64().unwrap()).sum();
    // Reported while it runs (it holds 6 s, the report comes at 3 s): freed, not gone.
    assert_eq!(held, 0, "{v:#}");
    assert_eq!(v["stacks"]["captured"].as_u64(), Some(41), "weights, 20 scratch buffers, 20 activations: {}", v["stacks"]);
    assert!(v["stacks"]["python_frames_total"].as_u64().unwrap() > 0, "Python frames were walked: {}", v["stacks"]);
}

#[test]
fn python_frames_survive_a_recording_and_its_replay() {
    require_root();
    let f = fixtures();
    let rec = f.dir.join("python.gpumemrec");
    let cmd = train_cmd(&pyenv_python());
    let out =
        run_gpumem(&["record", "-o", rec.to_str().unwrap(), "--duration", "3", "-c", &cmd], &[("GPUMEM_STEPS", "5"), ("GPUMEM_HOLD", "6")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = leaks(&["--from", rec.to_str().unwrap(), "--older-than", "0", "-n", "10"], &[]);
    let groups = v["processes"][0]["stacks"].as_array().unwrap();
    let leak = groups.iter().find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == "train_step")).expect("the leak, replayed");
    assert_eq!(names(&python_frames(leak)), ["alloc", "train_step", "main", "<module>"]);
    assert_eq!(leak["bytes"].as_u64(), Some(5 * MIB));

    // Its flame graph's folded stacks: the Python frames merged with the
    // native ones (the interpreter's, ctypes'), root first, with their files and lines.
    let folded = f.dir.join("python.folded");
    let out = run_gpumem(&["export", "--format", "folded", rec.to_str().unwrap(), "-o", folded.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&folded).unwrap();
    let line = text.lines().find(|l| l.contains(";train_step (train.py:38);")).unwrap_or_else(|| panic!("{text}"));
    let (stack, bytes) = line.rsplit_once(' ').unwrap();
    assert_eq!(bytes, (5 * MIB).to_string(), "{line}");
    let frames: Vec<&str> = stack.split(';').collect();
    let at = |name: &str| frames.iter().position(|f| f.starts_with(name)).unwrap_or_else(|| panic!("{name}: {line}"));
    assert!(at("<module> (train.py:") < at("main (train.py:") && at("main (train.py:") < at("train_step (train.py:38)"), "{line}");
    assert!(at("train_step (train.py:38)") < at("alloc (train.py:23)"), "{line}");
    let native = frames[2..].iter().filter(|f| !f.contains(".py:")).count();
    assert!(native >= 2, "native frames beside the Python ones: {line}");
}

/// A root `cargo xtask test` debootstraps (trixie's python3.13, noble's python3.12).
fn python_root(dir: &str, python: &str) -> std::path::PathBuf {
    let root = target_dir().join(dir);
    assert!(root.join("usr/bin").join(python).exists(), "{} has no {python}: run `cargo xtask test` (it debootstraps it)", root.display());
    root
}

/// The command running the training loop with `python` of `root` in a
/// chroot, the script and a fresh copy of the synthetic driver copied in.
fn train_in_root(root: &std::path::Path, python: &str) -> String {
    let dir = root.join("tmp/gpumem");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/train.py"), dir.join("train.py")).unwrap();
    let _ = std::fs::remove_file(dir.join("libcuda.so.1"));
    std::fs::copy(&fixtures().libcuda, dir.join("libcuda.so.1")).unwrap();
    format!("chroot {} /usr/bin/{python} /tmp/gpumem/train.py /tmp/gpumem/libcuda.so.1", root.display())
}

/// The training loop run by another distribution's interpreter in a chroot:
/// the script and a fresh copy of the synthetic driver at paths only the
/// chroot sees; the interpreter and its loader found through /proc/PID/root.
/// `weights_fn`: the name the weights' function has in that version. Returns
/// the leak's group.
fn walked_in_another_root(root: &std::path::Path, python: &str, weights_fn: &str) -> Value {
    let cmd = train_in_root(root, python);
    let v = leaks(&["--older-than", "0", "--duration", "3", "-n", "10", "-c", &cmd], &[("GPUMEM_STEPS", "10"), ("GPUMEM_HOLD", "6")]);
    let p = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["outstanding_bytes"].as_u64() > Some(0))
        .unwrap_or_else(|| panic!("{v:#}"))
        .clone();
    let groups = p["stacks"].as_array().unwrap();
    let leak =
        groups.iter().find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == "train_step")).unwrap_or_else(|| panic!("{groups:#?}"));
    let lf = python_frames(leak);
    assert_eq!(names(&lf), ["alloc", "train_step", "main", "<module>"], "{leak:#}");
    assert_eq!((lf[0].2, lf[1].2), (23, 38), "{lf:?}");
    assert_eq!(leak["bytes"].as_u64(), Some(10 * MIB));
    let weights = groups.iter().find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == weights_fn)).expect("the weights");
    assert_eq!(weights["bytes"].as_u64(), Some(64 * MIB));
    leak.clone()
}

#[test]
fn python_3_13_in_another_root_is_walked_through_its_debug_offsets() {
    require_root();
    // Debian trixie's python3.13: its layout comes from its _Py_DebugOffsets.
    walked_in_another_root(&python_root("py313-root", "python3.13"), "python3.13", "Model.load_weights");
}

#[test]
fn python_3_12_in_another_root_is_walked_with_its_header_offsets() {
    require_root();
    // Ubuntu noble's python3.12: offsets from its headers (a unit test checks them).
    walked_in_another_root(&python_root("py312-root", "python3.12"), "python3.12", "Model.load_weights");
}

#[test]
fn a_python_process_that_exits_mid_trace_keeps_its_frames_and_releases_its_memory() {
    require_root();
    // It exits right after its loop, while the trace goes on: its memory is
    // released at exit, and every stack kept its Python frames (code
    // objects resolved while it ran answer for stacks read after its exit).
    let cmd = train_cmd(&pyenv_python());
    let t = trace(&["--min-size", "1PiB", "-c", &cmd], &[("GPUMEM_HOLD", "0")]);
    assert!(t.status.success(), "{}", t.stderr);
    let p = &t.summary["processes"][0];
    assert_eq!(p["held_at_exit_bytes"].as_u64(), Some(64 * MIB + 20 * MIB), "{p:#}");
    let s = &t.summary["stacks"];
    assert_eq!(s["captured"].as_u64(), Some(41), "{s}");
    assert_eq!(s["python_frames_total"].as_u64(), Some(4 * 41), "every stack's four Python frames: {s}");
}

#[test]
fn a_thread_started_later_has_its_frames_from_its_second_allocation() {
    require_root();
    // Its first stack comes without Python frames (the kernel does not know
    // its thread state yet) and makes the agent read the thread list again
    // (within the 200 ms the fixture waits): the other 19, 10 ms apart,
    // name the thread's functions.
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/threads.py");
    let cmd = format!("{} {} {}", pyenv_python(), script.display(), fixtures().libcuda.display());
    let v = leaks(&["--older-than", "0", "--duration", "2", "-n", "10", "-c", &cmd], &[]);
    let groups = v["processes"][0]["stacks"].as_array().unwrap();
    let worker = groups.iter().find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == "worker")).unwrap_or_else(|| panic!("{groups:#?}"));
    assert_eq!(names(&python_frames(worker))[..3], ["alloc", "worker", "Thread.run"]);
    assert!(worker["count"].as_u64().unwrap() >= 18, "{groups:#?}");
    let outstanding: u64 = groups.iter().map(|g| g["count"].as_u64().unwrap()).sum();
    assert_eq!(outstanding, 20);
}

#[test]
fn python_3_10_is_walked_through_its_frame_objects() {
    require_root();
    // Ubuntu jammy's python3.10: frame objects chained by f_back, f_lasti and
    // PEP 626 line tables, thread ids from glibc's thread descriptors, the
    // version from the file's name (no Py_Version), bare function names (no
    // co_qualname).
    let leak = walked_in_another_root(&python_root("py310-root", "python3.10"), "python3.10", "load_weights");
    // Each Python frame in place of its own native eval frame: none left over.
    let all: Vec<&str> = leak["frames"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
    assert!(!all.iter().any(|f| f.contains("_PyEval_EvalFrameDefault")), "{all:?}");
}

#[test]
fn a_python_version_gpumem_cannot_walk_is_named_and_its_memory_stays_exact() {
    require_root();
    // The same jammy python3.10 under a name without its version: gpumem
    // cannot tell the version, says so, and keeps native stacks.
    let root = python_root("py310-root", "python3.10");
    let cmd = train_in_root(&root, "python3.10");
    let renamed = root.join("usr/bin/python3x");
    let _ = std::fs::remove_file(&renamed);
    std::fs::copy(root.join("usr/bin/python3.10"), &renamed).unwrap();
    let cmd = cmd.replace("/usr/bin/python3.10", "/usr/bin/python3x");
    let t = trace(&["--duration", "3", "-c", &cmd], &[("GPUMEM_STEPS", "10"), ("GPUMEM_HOLD", "6")]);
    let pid = t.of_type("alloc").first().unwrap_or_else(|| panic!("no allocation: {}", t.stderr))["pid"].as_u64().unwrap();
    let d = &t.summary_process(pid)["devices"][0];
    assert_eq!(d["live_bytes"].as_u64(), Some(64 * MIB + 10 * MIB), "{d:#}");
    let unwalked = t.summary["python_unwalked"].as_array().unwrap();
    let u = unwalked.iter().find(|u| u["pid"] == pid).unwrap_or_else(|| panic!("{unwalked:?}"));
    assert!(u["why"].as_str().unwrap().contains("no Py_Version"), "{u}");
}

#[test]
fn a_leak_freed_at_interpreter_exit_is_still_named_with_its_peak_and_its_growth() {
    require_root();
    let cmd = train_cmd(&pyenv_python());
    // 1 MiB kept per step for 700 steps (about 14 s), all freed just before
    // the interpreter exits: `leaks -c` reports after the exit.
    let steps = 700u64;
    let v =
        leaks(&["--older-than", "0", "-c", &cmd], &[("GPUMEM_STEPS", &steps.to_string()), ("GPUMEM_FREE_ALL", "1"), ("GPUMEM_HOLD", "0")]);
    assert_eq!(v["processes"], serde_json::json!([]), "nothing outstanding after the exit: {v:#}");
    let exited = v["exited"].as_array().unwrap();
    assert_eq!(exited.len(), 1, "{v:#}");
    let w = &exited[0];
    let groups = w["groups"].as_array().unwrap();
    let leak = groups
        .iter()
        .find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == "train_step" && f.2 == 38))
        .unwrap_or_else(|| panic!("no wound-down group from train_step's line 38: {w:#}"));
    assert_eq!(leak["held_at_wind_down_bytes"].as_u64(), Some(steps * MIB), "{leak:#}");
    assert_eq!(leak["freed_at_exit_bytes"].as_u64(), Some(steps * MIB), "{leak:#}");
    assert_eq!((leak["released_only_at_exit"].as_bool(), leak["still_growing"].as_bool()), (Some(true), Some(true)), "{leak:#}");
    assert!(leak["peak_bytes"].as_u64().unwrap() >= (steps - 4) * MIB, "{leak:#}");
    assert_eq!(leak["verdict"]["verdict"], "leak", "{leak:#}");
    let weights = groups.iter().find(|g| python_frames(g).get(1).is_some_and(|f| f.0 == "Model.load_weights")).expect("the weights");
    assert_eq!((weights["released_only_at_exit"].as_bool(), weights["still_growing"].as_bool()), (Some(true), Some(false)), "{weights:#}");
    let wind_down = w["wind_down_s"].as_f64().unwrap();
    assert!(wind_down > 0.0 && wind_down < 2.0, "from the last allocation to the exit: {w:#}");

    // The same, for people.
    let out =
        run_gpumem(&["leaks", "--older-than", "0", "-c", &cmd], &[("GPUMEM_STEPS", "300"), ("GPUMEM_FREE_ALL", "1"), ("GPUMEM_HOLD", "0")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("exited; its last") && text.contains("STILL GROWING when the program wound down; released only at exit"),
        "{text}"
    );
}

#[test]
fn trace_json_allocations_carry_their_stack_with_python_frames() {
    require_root();
    let cmd = train_cmd(&pyenv_python());
    let t = trace(&["-c", &cmd], &[("GPUMEM_STEPS", "5"), ("GPUMEM_HOLD", "0")]);
    assert!(t.status.success(), "{}", t.stderr);
    let allocs = t.of_type("alloc");
    assert_eq!(allocs.len(), 11, "weights, 5 scratch buffers, 5 activations");
    for a in &allocs {
        assert!(a["stack_id"].as_str().is_some_and(|s| s.len() == 16), "{a}");
        let frames = python_frames(a);
        assert_eq!(frames.last().map(|f| f.0.as_str()), Some("<module>"), "Python frames to the module: {a}");
        assert!(frames.iter().any(|f| f.0 == "train_step" || f.0 == "Model.load_weights"), "{a}");
    }
    let kept: Vec<&&Value> = allocs.iter().filter(|a| python_frames(a).get(1).is_some_and(|f| f.0 == "train_step" && f.2 == 38)).collect();
    assert_eq!(kept.len(), 5, "the kept activations, from line 38");
    assert!(t.of_type("free").iter().all(|f| f.get("frames").is_none()), "frees carry no stack");
}
