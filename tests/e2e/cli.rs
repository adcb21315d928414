//! The command line: one-line errors, exit statuses, filters, loss accounting.
//! Run as root, one test at a time (`cargo xtask test` does both).
use std::process::Command;

use gpumem_tests::*;

#[test]
fn errors_are_one_line_with_nonzero_status() {
    require_root();
    // Unknown pid.
    let out = run_gpumem(&["trace", "-p", "999999999"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), "gpumem: no process with pid 999999999");
    // Bad flag values are usage errors (2), without a backtrace.
    for args in [&["trace", "--duration", "-1"][..], &["trace", "--min-size", "lots"], &["trace", "-p", "abc"]] {
        let out = run_gpumem(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error:"), "{err}");
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    }
    // A --libcuda path that does not exist.
    let out = run_gpumem(&["trace", "--libcuda", "/nonexistent/libcuda.so.1", "--duration", "1"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--libcuda /nonexistent/libcuda.so.1"));
    // Not root and no capabilities: drop to nobody (reliability.rs covers
    // running with only the capabilities it needs).
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(gpumem_bin())
        .arg("status")
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpumem needs CAP_SYS_ADMIN (or CAP_BPF and CAP_PERFMON before Linux 6.16)"), "{err}");
    assert!(err.contains("missing: CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN."), "{err}");
    assert!(err.contains(&format!("Run it as root instead: sudo {} status,", gpumem_bin().display())), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn command_exit_status_is_passed_through() {
    require_root();
    let f = fixtures();
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-discover", "-c", "exit 7"], &[]);
    assert_eq!(t.status.code(), Some(7));
    assert!(t.events.is_empty());
}

#[test]
fn pid_filter_and_display_filters() {
    require_root();
    let f = fixtures();
    let cap = (64 * MIB).to_string();
    // --failed-only shows only failures; the summary still counts everything.
    let cmd = workload_cmd("oom");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--failed-only", "-c", &cmd], &[("GPUMEM_FAKE_CAPACITY", &cap)]);
    assert_eq!(results(&t.of_type("alloc")), [2, 1]);
    assert_eq!(t.events.len(), 3, "two failed allocations and the cuda_oom record of the first");
    assert_eq!(t.of_type("cuda_oom").len(), 1);
    let pid = t.summary["processes"][0]["pid"].as_u64().unwrap();
    assert_eq!(api_stats(t.summary_process(pid), "cuMemAlloc_v2")["calls"], 4);
    // --min-size hides small events.
    let cmd = workload_cmd("two_devices");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--min-size", "10MiB", "-c", &cmd], &[]);
    let shown: Vec<(String, u64)> =
        t.events.iter().map(|e| (e["type"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap())).collect();
    assert_eq!(
        shown,
        [("alloc".into(), 10 * MIB), ("alloc".into(), 20 * MIB), ("ctx_destroy".into(), 22 * MIB), ("exit".into(), 14 * MIB)]
    );
}

#[test]
fn lost_events_are_counted_exactly() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("threads");
    // A one-page ring and a reader that starts late: most events cannot fit.
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--ringbuf-bytes", "4096", "--stall-reader-ms", "3000", "-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let lost = &t.summary["lost"];
    let ringbuf_full = lost["ringbuf_full"].as_u64().unwrap();
    assert!(ringbuf_full > 1000, "{lost}");
    assert_eq!(t.summary["lost_events"].as_u64().unwrap(), ringbuf_full, "{lost}");
    // init + retain + 9 set_current + 1600 allocs + 800 frees + exit: every one
    // either arrived or is counted as lost.
    assert_eq!(t.events.len() as u64 + ringbuf_full, 1 + 1 + 9 + 1600 + 800 + 1);
    // Every loss is the workload's: it is marked uncertain, with the count.
    assert_eq!(lost["by_pid"].as_object().unwrap().len(), 1, "{lost}");
    let pid = t.pids()[0];
    let p = t.summary_process(pid);
    assert_eq!(p["events_lost"].as_u64().unwrap(), ringbuf_full, "{p}");
    assert_eq!(p["uncertain"], true, "{p}");
}

#[test]
fn the_version_names_the_git_revision_and_the_glibc_floor_holds() {
    let out = Command::new(gpumem_bin()).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(workspace()).output().unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert_eq!(text, format!("gpumem {} ({head})", env!("CARGO_PKG_VERSION")));
    // The newest glibc symbol version each build needs: the floor the README
    // states (glibc 2.34 on x86_64 and on aarch64: Debian 12, Ubuntu 22.04,
    // RHEL 9 and later).
    for (objdump, bin) in [("objdump", gpumem_bin()), ("aarch64-linux-gnu-objdump", aarch64_gpumem_bin())] {
        let dynamic = Command::new(objdump).arg("-T").arg(&bin).output().expect("objdump (binutils)");
        assert!(dynamic.status.success(), "{objdump} -T {}: {}", bin.display(), String::from_utf8_lossy(&dynamic.stderr));
        let needed = String::from_utf8_lossy(&dynamic.stdout)
            .split_whitespace()
            .filter_map(|w| w.trim_start_matches('(').trim_end_matches(')').strip_prefix("GLIBC_"))
            .filter_map(|v| {
                let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
                Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
            })
            .max()
            .expect("glibc symbols");
        assert!(
            needed <= (2, 34),
            "{} needs glibc {}.{}: raise the floor in the README or avoid the symbol",
            bin.display(),
            needed.0,
            needed.1
        );
    }
}
