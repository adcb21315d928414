//! `gpumem serve --action EVENT=COMMAND` and `--webhook URL` against real
//! workloads on the synthetic driver: a CUDA OOM runs the hook with the
//! event's JSON on stdin and reaches a local webhook (after a failed try);
//! a hook that hangs is killed at its timeout, its process group with it;
//! a burst of 1000 OOMs is acted on within the rate limit while every
//! event is handled at once and none is lost. Run as root, one at a time.
use std::path::Path;

use gpumem_tests::*;
use serde_json::Value;

fn counter(metrics: &str, family: &str, event: &str, outcome: &str) -> f64 {
    sample(metrics, &format!("{family}{{event=\"{event}\",outcome=\"{outcome}\"}}")).unwrap_or(0.0)
}

fn dir(name: &str) -> std::path::PathBuf {
    let d = target_dir().join("actions").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

#[test]
fn a_cuda_oom_runs_the_hook_with_its_json_on_stdin_and_reaches_the_webhook() {
    require_root();
    let f = fixtures();
    let d = dir("oom");
    let receiver = Receiver::start(1, 200);
    let hook = format!("cuda_oom=cat > {0}/event.json; echo \"$GPUMEM_EVENT\" > {0}/kind", d.display());
    let webhook = receiver.url("/hooks/gpumem");
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--action", &hook, "--webhook", &webhook], &[]);
    let mut w = spawn_workload("oom", &[("GPUMEM_FAKE_CAPACITY", "67108864"), ("GPUMEM_WORKLOAD_HOLD_MS", "3000")]);
    let pid = w.id();
    // The hook writes event.json, then kind: done once both are there.
    let written = || Some((read_json(&d.join("event.json"))?, std::fs::read_to_string(d.join("kind")).ok().filter(|k| k.ends_with('\n'))?));
    let (event, kind) = poll(20, "the hook's event.json and kind", written, || serve.metrics());
    assert_eq!(kind.trim(), "cuda_oom");
    assert_eq!(event["event"], "cuda_oom");
    assert_eq!(event["pid"], pid);
    assert_eq!(event["comm"], "workload");
    assert_eq!(event["bytes"], 32 * MIB, "the request that failed: {event:#}");
    assert_eq!(event["gpu"]["index"], 0);
    assert_eq!(event["details"]["holders"][0]["bytes"], 48 * MIB, "{event:#}");
    assert!(!event["node"].as_str().unwrap().is_empty());
    assert!(event["time"].as_str().unwrap().ends_with('Z') && event["time_unix_ns"].as_u64().unwrap() > 0);
    assert!(event["summary"].as_str().unwrap().contains("CUDA out of memory"), "{event:#}");
    // The process's own largest stack on that GPU: the 48 MiB it held,
    // symbolized to the workload's source (oom() is inlined into main).
    let stack = &event["stacks"][0];
    assert_eq!(stack["bytes"], 48 * MIB, "{event:#}");
    assert!(stack["frames"].as_array().unwrap().iter().any(|f| f.as_str().unwrap().contains("(workload.c:")), "{stack:#}");

    // The webhook: refused once (503), delivered on the retry, the same event.
    let posts = poll(20, "the webhook's delivery", || (receiver.all().len() >= 2).then(|| receiver.all()), || serve.metrics());
    assert_eq!(posts.len(), 2, "one retry: {posts:?}");
    for p in &posts {
        assert_eq!((p.method.as_str(), p.path.as_str()), ("POST", "/hooks/gpumem"));
        assert_eq!(p.header("content-type"), Some("application/json"));
        assert_eq!(p.json(), event, "the webhook gets what the hook got");
    }
    let m = poll(
        10,
        "both outcomes counted",
        || {
            let m = serve.metrics();
            (counter(&m, "gpumem_actions_total", "cuda_oom", "ok") == 1.0 && counter(&m, "gpumem_webhooks_total", "cuda_oom", "ok") == 1.0)
                .then_some(m)
        },
        || serve.metrics(),
    );
    assert_eq!(counter(&m, "gpumem_webhooks_total", "cuda_oom", "failed"), 0.0, "the retry succeeded");
    w.wait().unwrap();
    serve.stop();
}

#[test]
fn a_hook_that_hangs_is_killed_at_its_timeout_with_its_children_and_counted() {
    require_root();
    let f = fixtures();
    let d = dir("hang");
    let hook = format!("cuda_oom=sleep 600 & echo $! > {}/sleep.pid; wait", d.display());
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--action", &hook, "--action-timeout", "1"], &[]);
    let mut w = spawn_workload("oom", &[("GPUMEM_FAKE_CAPACITY", "67108864")]);
    w.wait().unwrap();
    let m = poll(
        15,
        "the timeout counted",
        || {
            let m = serve.metrics();
            (counter(&m, "gpumem_actions_total", "cuda_oom", "timeout") == 1.0).then_some(m)
        },
        || serve.metrics(),
    );
    assert_eq!(counter(&m, "gpumem_actions_total", "cuda_oom", "ok"), 0.0);
    let sleep: u32 = std::fs::read_to_string(d.join("sleep.pid")).unwrap().trim().parse().unwrap();
    poll(5, "the hook's child killed with it", || (!Path::new(&format!("/proc/{sleep}")).exists()).then_some(()), String::new);
    let (_, said) = serve.stop();
    assert!(said.contains("timeout: killed after 1 s"), "{said}");
}

#[test]
fn a_burst_of_1000_ooms_is_acted_on_within_the_rate_limit_without_delaying_or_losing_events() {
    require_root();
    let f = fixtures();
    let d = dir("burst");
    let receiver = Receiver::start(0, 200);
    // Each run takes 3 s: the 1000 events are all handled long before the first ends.
    let hook = format!("cuda_oom=cat > /dev/null; sleep 3; echo done >> {}/runs", d.display());
    let webhook = receiver.url("/");
    let serve = Serve::start(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--action", &hook, "--webhook", &webhook, "--action-rate-limit", "5"],
        &[],
    );
    let started = std::time::Instant::now();
    let mut w = spawn_workload("oom_burst", &[("GPUMEM_FAKE_CAPACITY", "67108864")]);
    w.wait().unwrap();
    let ooms = |m: &str| {
        m.lines().filter(|l| l.starts_with("gpumem_cuda_oom_total{")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>()
    };
    let m = poll(10, "1000 CUDA OOMs handled", || Some(serve.metrics()).filter(|m| ooms(m) == 1000.0), || serve.metrics());
    let handled_s = started.elapsed().as_secs_f64();
    assert!(
        !d.join("runs").exists() && counter(&m, "gpumem_actions_total", "cuda_oom", "ok") == 0.0,
        "every event was handled while the first hooks still ran ({handled_s:.1} s)"
    );
    assert_eq!(counter(&m, "gpumem_actions_total", "cuda_oom", "rate_limited"), 995.0, "{m}");
    assert_eq!(counter(&m, "gpumem_webhooks_total", "cuda_oom", "rate_limited"), 995.0);
    assert_eq!(counter(&m, "gpumem_actions_total", "cuda_oom", "queue_full"), 0.0);
    for l in m.lines().filter(|l| l.starts_with("gpumem_lost_events_total")) {
        assert!(l.ends_with(" 0"), "nothing lost: {l}");
    }
    let m = poll(
        20,
        "the 5 admitted runs to finish",
        || Some(serve.metrics()).filter(|m| counter(m, "gpumem_actions_total", "cuda_oom", "ok") == 5.0),
        || serve.metrics(),
    );
    assert_eq!(std::fs::read_to_string(d.join("runs")).unwrap().lines().count(), 5);
    assert_eq!(counter(&m, "gpumem_webhooks_total", "cuda_oom", "ok"), 5.0);
    assert_eq!(receiver.all().len(), 5);
    serve.stop();
}

#[test]
fn dry_run_says_what_would_run_and_runs_nothing() {
    require_root();
    let f = fixtures();
    let d = dir("dry");
    let hook = format!("cuda_oom=touch {}/ran", d.display());
    let serve = Serve::start(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--action", &hook, "--action-dry-run", "--webhook", "http://127.0.0.1:9/"],
        &[],
    );
    let mut w = spawn_workload("oom", &[("GPUMEM_FAKE_CAPACITY", "67108864")]);
    w.wait().unwrap();
    poll(
        10,
        "the dry runs counted",
        || {
            let m = serve.metrics();
            (counter(&m, "gpumem_actions_total", "cuda_oom", "dry_run") == 1.0
                && counter(&m, "gpumem_webhooks_total", "cuda_oom", "dry_run") == 1.0)
                .then_some(())
        },
        || serve.metrics(),
    );
    assert!(!d.join("ran").exists());
    let (_, said) = serve.stop();
    assert!(said.contains("action (dry run) cuda_oom: would run") && said.contains("\"event\":\"cuda_oom\""), "{said}");
    assert!(said.contains("webhook (dry run) cuda_oom: would POST to http://127.0.0.1:9/"), "{said}");
}

/// Where NVML has no XID events, XIDs come from the kernel log (a file fed
/// with `NVRM: Xid` lines here, /dev/kmsg on a node), mapped to the GPU by
/// its PCI id from NVML's reading; a critical one runs the xid action,
/// and the GPU's health turning critical runs the health action.
#[test]
fn xids_from_the_kernel_log_reach_the_xid_and_health_actions() {
    require_root();
    let f = fixtures();
    let d = dir("kmsg");
    let kmsg = d.join("kmsg");
    std::fs::write(&kmsg, "[    1.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.261.03\n").unwrap();
    let xid_hook = format!("xid=cat > {}/xid.json", d.display());
    let health_hook = format!("health=cat >> {0}/health.jsonl; echo >> {0}/health.jsonl", d.display());
    let serve = Serve::start(
        &[
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--nvml",
            f.nvml.to_str().unwrap(),
            "--nvml-interval",
            "1",
            "--kmsg",
            kmsg.to_str().unwrap(),
            "--action",
            &xid_hook,
            "--action",
            &health_hook,
            "--milestones",
        ],
        &[("GPUMEM_FAKE_NVML_NO_EVENTS", "1")],
    );
    // The driver logs an XID for GPU 0 (PCI 0000:10:00, healthy until then)
    // once the agent follows the log and a reading and a tick have judged the GPUs.
    let said = serve.stderr();
    said.wait_for("XIDs: NVML's XID events are not available", 20);
    let read = said.wait_for_mark("milestone nvml-reading", 20);
    said.wait_after(read, "milestone tick", 20);
    let mut log = std::fs::OpenOptions::new().append(true).open(&kmsg).unwrap();
    std::io::Write::write_all(
        &mut log,
        b"[  812.345678] NVRM: Xid (PCI:0000:10:00): 79, pid=4242, name=python3, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let event = poll(15, "the xid action's event", || read_json(&d.join("xid.json")), || serve.metrics());
    assert_eq!(event["event"], "xid");
    assert_eq!(event["gpu"]["index"], 0, "{event:#}");
    assert_eq!(event["gpu"]["pci_bus_id"], "00000000:10:00.0");
    assert_eq!(event["details"]["xid"], 79);
    assert_eq!(event["details"]["meaning"], "GPU has fallen off the bus");
    assert_eq!(event["details"]["processes"], serde_json::json!([[4242, 0]]));
    // GPU 1 was critical from the start (a retirement pending); GPU 0 turns critical with the XID.
    let health_of = |gpu: u64| {
        let text = std::fs::read_to_string(d.join("health.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|e| e["gpu"]["index"] == gpu)
    };
    let health = poll(15, "GPU 0's health action", || health_of(0), || serve.metrics());
    assert!(health["summary"].as_str().unwrap().contains("XID 79"), "{health:#}");
    let one = health_of(1).expect("GPU 1's health action");
    assert!(one["summary"].as_str().unwrap().contains("page retirement pending"), "{one:#}");
    assert_eq!(health_of(2), None, "GPU 2 is not critical");
    let m = serve.metrics();
    let xid79 = |gpu: u32| {
        m.lines()
            .find(|l| l.starts_with("gpumem_gpu_xid_errors_total{") && l.contains(&format!("gpu=\"{gpu}\"")) && l.contains("xid=\"79\""))
            .unwrap_or_else(|| panic!("no XID 79 series for GPU {gpu}: {m}"))
    };
    assert!(xid79(0).ends_with(" 1") && xid79(1).ends_with(" 0"), "counted on GPU 0 only: {} / {}", xid79(0), xid79(1));
    let (_, said) = serve.stop();
    assert!(said.contains("XIDs: NVML's XID events are not available"), "{said}");
}

/// The leaks report's figures that do not depend on when it is asked: per
/// process and device, outstanding bytes and allocations, and each stack's
/// bytes, count and frames (ages and growth verdicts are the asker's).
/// (bytes, count, function names innermost first) of one stack.
type StackFigures = (u64, u64, Vec<String>);

fn leak_figures(report: &Value, pid: u32) -> Vec<(Value, u64, u64, Vec<StackFigures>)> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == pid)
        .map(|p| {
            let stacks = p["stacks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let frames =
                        s["frames"].as_array().unwrap().iter().map(|f| f["function"].as_str().unwrap_or("?").to_string()).collect();
                    (s["bytes"].as_u64().unwrap(), s["count"].as_u64().unwrap(), frames)
                })
                .collect();
            (p["device"].clone(), p["outstanding_bytes"].as_u64().unwrap(), p["outstanding_allocs"].as_u64().unwrap(), stacks)
        })
        .collect()
}

/// `gpumem report FILE --chart host --svg SVG`, while the daemon runs.
fn gpumem_report_svg(recording: &std::path::Path, svg: &std::path::Path) {
    let (ok, _, err) = command_output(std::process::Command::new(gpumem_bin()).args([
        "report".as_ref(),
        recording.as_os_str(),
        "--chart".as_ref(),
        "host".as_ref(),
        "--svg".as_ref(),
        svg.as_os_str(),
    ]));
    assert!(ok, "gpumem report: {err}");
}

/// `--flight-recorder 2`: a CUDA OOM fires the action, and the recording of
/// the last 2 s (with the allocations made before them) replays with
/// `leaks --from` to the same report the live daemon gives.
#[test]
fn a_flight_recorder_snapshot_replays_to_the_same_leak_report_as_the_live_daemon() {
    require_root();
    let f = fixtures();
    let d = dir("flight");
    let hook = format!("cuda_oom=cat > {}/event.json", d.display());
    let flight_dir = d.join("flight");
    let serve = Serve::start(
        &[
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--no-nvml",
            "--action",
            &hook,
            "--flight-recorder",
            "2",
            "--flight-dir",
            flight_dir.to_str().unwrap(),
        ],
        &[],
    );
    let mut w = spawn_workload("flight", &[("GPUMEM_WORKLOAD_HOLD_MS", "20000")]);
    let pid = w.id();
    let event = poll(20, "the OOM's action", || read_json(&d.join("event.json")), || serve.metrics());
    let recording = std::path::PathBuf::from(event["recording"].as_str().unwrap_or_else(|| panic!("no recording: {event:#}")));
    assert!(recording.starts_with(&flight_dir) && recording.exists(), "{recording:?}");
    let socket = serve.state.as_ref().unwrap().socket.clone();
    // Asked while the daemon runs (no run_gpumem: it waits for every gpumem to stop).
    let gpumem = |args: &[&str]| {
        let (ok, out, err) = command_output(std::process::Command::new(gpumem_bin()).args(args));
        assert!(ok, "gpumem {args:?}: {err}");
        serde_json::from_str::<Value>(&out).unwrap()
    };
    let live = gpumem(&["leaks", "--json", "--socket", socket.to_str().unwrap(), "-p", &pid.to_string(), "--older-than", "0"]);
    let replayed = gpumem(&["leaks", "--json", "--from", recording.to_str().unwrap(), "--older-than", "0"]);
    let figures = leak_figures(&live, pid);
    // The 64 MiB of weights (made 4 s before the window) and the nine buffers still held.
    let device0 = figures.iter().find(|f| f.0 == 0).unwrap_or_else(|| panic!("{live:#}"));
    assert_eq!((device0.1, device0.2), (73 * MIB, 10), "{live:#}");
    assert!(device0.3.iter().any(|s| s.0 == 64 * MIB && s.2.iter().any(|f| f == "hold_weights")), "{:?}", device0.3);
    assert!(device0.3.iter().any(|s| s.0 == 9 * MIB && s.1 == 9 && s.2.iter().any(|f| f == "leak_buffers")), "{:?}", device0.3);
    assert_eq!(leak_figures(&replayed, pid), figures, "the snapshot's replay gives the daemon's report:\n{replayed:#}");
    assert_eq!(replayed["oom_events"].as_array().unwrap().len(), 1, "the OOM itself is in the window");
    // The host memory read as the action fired: the workload's resident bytes, in the report.
    let svg = d.join("host.svg");
    gpumem_report_svg(&recording, &svg);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains(&format!("workload ({pid}) resident")), "{text}");
    w.kill().unwrap();
    w.wait().unwrap();
    let (_, said) = serve.stop();
    assert!(said.contains("flight recorder:") && said.contains("written for cuda_oom"), "{said}");
}
