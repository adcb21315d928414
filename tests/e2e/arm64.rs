//! The aarch64 build (issue 33), run here under qemu-user: everything that
//! needs no kernel (a recording replayed, its leak report) answers exactly
//! as the x86_64 build does. Its eBPF programs on a real arm64 kernel:
//! `cargo xtask test-arm64` (a VM, not part of `cargo xtask test`).
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

/// The first instruction word of every function objdump finds in an aarch64 file, by address.
fn entry_words(lib: &std::path::Path) -> std::collections::HashMap<u64, String> {
    let out = std::process::Command::new("aarch64-linux-gnu-objdump").arg("-d").arg(lib).output().expect("aarch64-linux-gnu-objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = std::collections::HashMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.ends_with(">:") {
            let Some(first) = lines.next() else { break };
            let mut cols = first.trim().split(['\t', ':']).map(str::trim).filter(|c| !c.is_empty());
            if let (Some(addr), Some(word)) = (cols.next(), cols.next()) {
                words.insert(u64::from_str_radix(addr, 16).unwrap(), word.to_string());
            }
        }
    }
    words
}

fn preflight(args: &[&str]) -> (i32, Value) {
    let out = run_gpumem(&[&["preflight", "--json"][..], args].concat(), &[]);
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap(), serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn preflight_reads_each_entry_instruction_as_objdump_does_and_attaches_a_library_all_or_none() {
    let loader = "/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1";
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_libcuda.c");
    // The synthetic driver for aarch64 without and with branch protection
    // (every entry then starts with paciasp or bti c: stepped out of line).
    for (name, flags) in [("plain", &[][..]), ("branch-protection", &["-mbranch-protection=standard"][..])] {
        let lib = target_dir().join(format!("gpumem-fixtures/arm64-preflight-{name}.so"));
        let cc = std::process::Command::new("aarch64-linux-gnu-gcc")
            .args(["-shared", "-fPIC", "-O2", "-o", lib.to_str().unwrap(), src.to_str().unwrap(), "-lpthread"])
            .args(flags)
            .status()
            .expect("aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu; cargo xtask setup installs it)");
        assert!(cc.success());
        let words = entry_words(&lib);
        let (code, strict) = preflight(&["--kernel", "6.12.43+deb13-arm64", lib.to_str().unwrap(), loader]);
        assert_eq!(strict["kernel"], serde_json::json!([6, 12]));
        let sites = strict["files"][0]["sites"].as_array().unwrap();
        assert!(sites.len() >= 60, "{name}: every entry point gpumem probes: {}", sites.len());
        let mut stepped = 0;
        for s in sites {
            let word = &words[&s["offset"].as_u64().unwrap()];
            let instruction = s["instruction"].as_str().unwrap();
            assert!(
                instruction.starts_with(&format!("0x{word} (")),
                "{name} {}: objdump reads {word}, preflight {instruction}",
                s["symbol"]
            );
            stepped += (s["handling"] == "stepped_out_of_line") as usize;
            assert_eq!(s["attach"], false, "{name} {}: all or none, and some are stepped out of line: {s}", s["symbol"]);
        }
        assert!(stepped > 0, "{name}");
        if name == "branch-protection" {
            assert_eq!(stepped, sites.len(), "every entry a landing pad");
        }
        assert_eq!(code, 4, "{name}: a refusal is exit status 4");
        // The loader's hook is `ret`: simulated, attached under strict.
        let hook = &strict["files"][1]["sites"][0];
        assert_eq!((hook["symbol"].as_str(), hook["attach"].as_bool()), (Some("_dl_debug_state"), Some(true)), "{hook}");
        assert!(hook["instruction"].as_str().unwrap().starts_with("0xd65f03c0 (ret)"), "{hook}");

        // allow-xol lifts what is stepped out of line, for the whole library.
        let (code, xol) = preflight(&["--kernel", "6.12.43+deb13-arm64", "--arm64-uprobes", "allow-xol", lib.to_str().unwrap()]);
        let sites = xol["files"][0]["sites"].as_array().unwrap();
        assert!(sites.iter().all(|s| s["attach"] == true), "{name}: {sites:?}");
        assert_eq!(code, 0);
        // And `off` none.
        let (code, off) = preflight(&["--kernel", "6.18.0", "--arm64-uprobes", "off", loader]);
        assert_eq!((code, &off["files"][0]["sites"][0]["attach"]), (4, &Value::Bool(false)));
    }
    // Bad input: a release that is not one, a file that is not aarch64.
    let said = |args: &[&str]| {
        let out = run_gpumem(args, &[]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = said(&["preflight", "--kernel", "banana", loader]);
    assert!(err.contains("\"banana\" is not a kernel release"), "{err}");
    let err = said(&["preflight", "--kernel", "6.12", &gpumem_bin().display().to_string()]);
    assert!(err.contains("is code for X86_64"), "{err}");
}
