//! The aarch64 build (issue 33), run here under qemu-user: everything that
//! needs no kernel (a recording replayed, its leak report) answers exactly
//! as the x86_64 build does. Its eBPF programs on an arm64 kernel are for a
//! test that boots one (not built yet: see the README's arm64 section).
use gpumem_tests::*;
use serde_json::Value;

#[test]
fn the_aarch64_build_replays_a_recording_exactly_as_the_x86_64_one_does() {
    require_root();
    let f = fixtures();
    let rec = target_dir().join("gpumem-fixtures/arm64-replay.gpumemrec");
    let cap = (64 * MIB).to_string();
    let live = trace(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--record", rec.to_str().unwrap(), "-c", &workload_cmd("oom")],
        &[("GPUMEM_FAKE_CAPACITY", &cap)],
    );
    assert!(live.status.success(), "{}", live.stderr);
    for args in [&["replay", "--json"][..], &["leaks", "--json", "--older-than", "0", "--from"][..]] {
        let x86 = run_gpumem(&[args, &[rec.to_str().unwrap()]].concat(), &[]);
        let arm = aarch64_gpumem().args(args).arg(&rec).output().expect("qemu-aarch64 (qemu-user; cargo xtask setup installs it)");
        let (x86_out, arm_out) = (String::from_utf8_lossy(&x86.stdout), String::from_utf8_lossy(&arm.stdout));
        assert!(x86.status.success() && arm.status.success(), "{args:?}: {}", String::from_utf8_lossy(&arm.stderr));
        assert!(x86_out.contains("cuMemAlloc_v2"), "{x86_out}");
        assert_eq!(arm_out, x86_out, "{args:?}: the same bytes from both builds");
    }
    // The summary says what the live session said (an OOM among its events).
    let out = aarch64_gpumem().args(["replay", "--json"]).arg(&rec).output().unwrap();
    let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last, live.summary);
    // The build says what it is.
    let version = aarch64_gpumem().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("gpumem "), "{version:?}");
}
