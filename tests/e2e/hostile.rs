//! Hostile and broken inputs (issue 30): what a local user or container
//! shapes — file names, paths — reaches the agent, which stays exact for it
//! and escapes it everywhere it shows it.
use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _};

use gpumem_tests::*;
use serde_json::Value;

/// A copy of the synthetic libcuda in a directory whose name is `dir`
/// (bytes: a newline, spaces, not UTF-8 if it likes), a fresh inode.
fn libcuda_under(dir: &[u8]) -> std::path::PathBuf {
    let f = fixtures();
    let dir = f.dir.join("hostile").join(OsStr::from_bytes(dir));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&lib);
    std::fs::copy(&f.libcuda, &lib).unwrap();
    lib
}

#[test]
fn a_libcuda_under_a_path_with_a_newline_and_spaces_is_attached_and_exact() {
    require_root();
    let f = fixtures();
    // The kernel writes the newline as \012 in /proc/PID/maps.
    let lib = libcuda_under(b"lib dir\n  with newline");
    // sh keeps a newline inside single quotes.
    let cmd = format!("{} '{}' late_load", f.workload.display(), lib.display());
    let t = trace(&["-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    assert_eq!(t.of_type("init").len(), 1, "attached before cuInit: {}", t.stderr);
    assert_eq!(sizes(&t.of_type("alloc")), [8 * MIB, 4 * MIB]);
    assert_eq!(t.released_at_exit(pid), [(0, 4 * MIB, 1)]);
    // Named on one line, the newline escaped: no line of the agent's starts
    // with what followed it.
    assert!(t.stderr.contains("lib dir?  with newline/libcuda.so.1"), "{}", t.stderr);
    assert!(!t.stderr.lines().any(|l| l.starts_with("  with newline")), "{}", t.stderr);
}

#[test]
fn a_libcuda_whose_path_is_not_utf8_is_attached_and_exact_system_wide() {
    require_root();
    let f = fixtures();
    let lib = libcuda_under(b"bad \xff\xfe name\nx");
    // System-wide: found through the process's maps (not -c, not --libcuda);
    // the loader hook attaches it within the workload's 1 s before cuInit.
    let (agent, stderr) = start_agent(&["--duration", "6"]);
    let st = std::process::Command::new(&f.workload).arg(&lib).arg("late_load").env("GPUMEM_WORKLOAD_DELAY_MS", "1500").status().unwrap();
    assert!(st.success());
    let (lines, said) = finish_agent(agent, stderr);
    let pid =
        lines.iter().find(|e| e["type"] == "init").and_then(|e| e["pid"].as_u64()).unwrap_or_else(|| panic!("no cuInit traced: {said}"));
    let allocs: Vec<&Value> = lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] == pid).collect();
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB], "{said}");
    let exit = lines.iter().find(|e| e["type"] == "exit" && e["pid"] == pid).expect("exit event");
    assert_eq!(released(exit), [(0, 4 * MIB, 1)]);
    assert!(said.contains("bad \u{fffd}\u{fffd} name?x/libcuda.so.1"), "{said}");
}
