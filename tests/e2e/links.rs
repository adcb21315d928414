//! How the uprobes are linked (issue 14): one uprobe_multi link per library
//! and direction, every entry point at once; per-point links when the kernel
//! refuses uprobe_multi. Run as root, one test at a time (`cargo xtask test`).
use gpumem_tests::*;
use serde_json::Value;

fn status(extra: &[&str]) -> Value {
    let f = fixtures();
    let mut args = vec!["status", "--json", "--no-nvml", "--no-discover", "--libcuda", f.libcuda.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = run_gpumem(&args, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_entry_point_of_a_library_is_on_two_uprobe_multi_links() {
    require_root();
    let v = status(&[]);
    assert_eq!(v["uprobe_links"]["mode"], "multi", "{:#}", v["uprobe_links"]);
    assert_eq!(v["uprobe_links"]["links"], 2, "one entry and one return link: {:#}", v["uprobe_links"]);
    let lib = &v["libraries"][0];
    assert_eq!(lib["links"], "multi");
    let attached = lib["probes"].as_array().unwrap().iter().filter(|p| p["status"] == "attached").count();
    assert_eq!(attached, gpumem_common::APIS.len() - 1, "all but cuCtxCreate_v4");
}

/// A kernel before 6.6 refuses uprobe_multi links (simulated with the hidden
/// `--refuse-uprobe-multi`, which makes the attach fail as aya does there):
/// `auto` falls back to per-point links, says so, and traces the same events.
#[test]
fn a_refused_uprobe_multi_falls_back_to_per_point_links_that_trace_the_same() {
    require_root();
    let v = status(&["--refuse-uprobe-multi"]);
    let links = &v["uprobe_links"];
    assert_eq!(links["mode"], "per_point", "{links:#}");
    assert!(links["why"].as_str().unwrap().contains("refused a uprobe_multi link"), "{links:#}");
    let attached = gpumem_common::APIS.len() - 1;
    assert_eq!(links["links"], 2 * attached as u64, "one entry and one return link per entry point: {links:#}");
    assert_eq!(v["libraries"][0]["links"], "per_point");
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("refused a uprobe_multi link")), "{v:#}");
    // The human status names the path too.
    let f = fixtures();
    let out = run_gpumem(&["status", "--no-nvml", "--no-discover", "--libcuda", f.libcuda.to_str().unwrap(), "--refuse-uprobe-multi"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("uprobe links: per-point — the kernel refused a uprobe_multi link"), "{text}");

    // The same workload traced both ways gives the same calls, sizes and devices.
    let calls = |extra: &[&str]| -> Vec<(String, u64, i64)> {
        let mut args = vec!["--libcuda", f.libcuda.to_str().unwrap(), "--no-discover"];
        args.extend_from_slice(extra);
        let cmd = workload_cmd("two_devices");
        args.extend(["-c", &cmd]);
        let t = trace(&args, &[]);
        assert!(t.status.success(), "{}", t.stderr);
        t.events
            .iter()
            .filter(|e| e["api"].is_string())
            .map(|e| (e["api"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap_or(0), e["device"].as_i64().unwrap_or(-1)))
            .collect()
    };
    let multi = calls(&[]);
    assert!(multi.len() >= 10, "{multi:?}");
    assert_eq!(calls(&["--refuse-uprobe-multi"]), multi);
}

/// A process allocating and freeing as fast as it can while gpumem attaches
/// (system-wide: a `-p` filter would hide the attach): every entry point is
/// probed from the same instant, so at most the pair in flight at each of the
/// two link instants is seen half (a free of an allocation made before).
/// Per-point links attach frees before allocations, one by one: the frees of
/// the allocations made in between are seen without them.
#[test]
fn a_process_calling_while_gpumem_attaches_sees_all_or_none_of_the_probes() {
    require_root();
    let threads = 2u64;
    let untracked_frees = |extra: &[&str]| -> u64 {
        let f = fixtures();
        // The last agent's probes gone first: waiting for them after the
        // workload started would spend its five seconds (a detach takes up
        // to ten seconds here), and the agent would see none of its calls.
        wait_for_detach();
        let (mut w, said) = spawn_workload_watched("race", &[("GPUMEM_THREADS", "2"), ("GPUMEM_SECONDS", "5")]);
        let pid = w.id();
        // Its threads are in their loop before the agent attaches.
        said.wait_for("racing", 10);
        let mut args = vec!["--libcuda", f.libcuda.to_str().unwrap(), "--no-discover", "--min-size", "1PiB", "--duration", "2"];
        args.extend_from_slice(extra);
        let t = trace(&args, &[]);
        assert!(w.wait().unwrap().success());
        assert!(t.status.success(), "{}", t.stderr);
        assert_eq!(t.summary["lost_events"], 0, "{:#}", t.summary["lost"]);
        t.summary_process(pid as u64)["untracked_frees"].as_u64().unwrap()
    };
    let multi = untracked_frees(&[]);
    assert!(multi <= 2 * threads, "{multi} frees of allocations made before the probes (at most 2 per thread)");
    let per_point = untracked_frees(&["--uprobe-links", "per-point"]);
    eprintln!("frees seen without their allocation while attaching: uprobe_multi {multi}, per-point {per_point}");
}
