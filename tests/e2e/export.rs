//! `gpumem export`: recordings of real traced sessions, written in other
//! tools' formats and read back by those tools: pprof profiles by Go's own
//! `go tool pprof`, PyTorch memory snapshots by torch's `_memory_viz.py`
//! (from the torch wheel), Perfetto JSON by structure. Exact bytes
//! throughout. Run as root, one test at a time (`cargo xtask test` does both).
use std::{path::PathBuf, process::Command};

use gpumem_tests::*;
use serde_json::Value;

fn dir() -> PathBuf {
    let d = target_dir().join("gpumem-fixtures/export");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Records `script` (run by sh) for `duration` seconds.
fn record(name: &str, script: &str, duration: &str, envs: &[(&str, &str)]) -> (PathBuf, String) {
    let f = fixtures();
    let rec = dir().join(name);
    let out = run_gpumem(
        &[
            "record",
            "-o",
            rec.to_str().unwrap(),
            "--duration",
            duration,
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--nvml",
            f.nvml.to_str().unwrap(),
            "-c",
            script,
        ],
        envs,
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (rec, stderr)
}

/// `gpumem export --format FORMAT REC -o OUT [EXTRA]`: the file written.
fn export(format: &str, rec: &std::path::Path, out_name: &str, extra: &[&str]) -> PathBuf {
    let out = dir().join(out_name);
    let _ = std::fs::remove_file(&out);
    let mut args = vec!["export", "--format", format, rec.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = run_gpumem(&args, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A command's stdout; it must succeed.
fn run(cmd: &mut Command) -> String {
    let (ok, out, err) = command_output(cmd);
    assert!(ok, "{err}");
    out
}

/// `go tool pprof -symbolize=none ARGS PROFILE`.
fn pprof(profile: &std::path::Path, args: &[&str]) -> String {
    run(Command::new("go").args(["tool", "pprof", "-symbolize=none"]).args(args).arg(profile))
}

/// The flat value of the row of `-top` output naming `function`.
fn flat(top: &str, function: &str) -> String {
    let row = top.lines().find(|l| l.trim_end().ends_with(&format!("  {function}"))).unwrap_or_else(|| panic!("no {function} in:\n{top}"));
    row.split_whitespace().next().unwrap().to_string()
}

#[test]
fn go_tool_pprof_reads_the_heap_profile_with_the_leaks_exact_bytes() {
    require_root();
    // 15 steps: leak_buffer keeps 4 MiB each, train_step's 32 MiB is freed each step, weights kept.
    let script = format!("GPUMEM_STEPS=15 GPUMEM_WORKLOAD_HOLD_MS=4000 {}", workload_cmd("deep_leak"));
    let (rec, _) = record("pprof.gpumemrec", &script, "3", &[]);
    let profile = export("pprof", &rec, "heap.pb.gz", &[]);
    let bytes = std::fs::read(&profile).unwrap();
    assert_eq!(&bytes[..2], [0x1f, 0x8b], "gzipped");

    let top = pprof(&profile, &["-top", "-unit=bytes", "-nodecount=100", "-nodefraction=0"]);
    assert!(top.contains("Type: inuse_space"), "inuse_space is the default:\n{top}");
    assert_eq!(flat(&top, "leak_buffer"), format!("{}B", 15 * 4 * MIB), "{top}");
    assert_eq!(flat(&top, "load_weights"), format!("{}B", 256 * MIB), "{top}");
    let made = pprof(&profile, &["-top", "-unit=bytes", "-nodecount=100", "-nodefraction=0", "-sample_index=alloc_space"]);
    assert_eq!(flat(&made, "train_step"), format!("{}B", 15 * 32 * MIB), "freed, but made: {made}");
    let objects = pprof(&profile, &["-top", "-nodecount=100", "-nodefraction=0", "-sample_index=alloc_objects"]);
    assert_eq!(flat(&objects, "leak_buffer"), "15", "{objects}");
    let held = pprof(&profile, &["-top", "-nodecount=100", "-nodefraction=0", "-sample_index=inuse_objects"]);
    assert_eq!(flat(&held, "leak_buffer"), "15", "{held}");

    // The leak's whole stack, innermost first, with the labels.
    let traces = pprof(&profile, &["-traces"]);
    let leak =
        traces.split("-----------+-------------------------------------------------------").find(|t| t.contains("leak_buffer")).unwrap();
    let order: Vec<usize> =
        ["leak_buffer", "train_step", "run_model", "main"].iter().map(|f| leak.find(f).unwrap_or_else(|| panic!("{f}: {leak}"))).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "innermost first: {leak}");
    let words = leak.split_whitespace().collect::<Vec<_>>().join(" ");
    for label in ["device: GPU-0", "comm: workload", "layer: driver"] {
        assert!(words.contains(label), "{label}: {leak}");
    }
    // -raw: every sample type, the mappings with the workload's file.
    let raw = pprof(&profile, &["-raw"]);
    assert!(raw.contains("alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes[dflt]"), "{raw}");
    assert!(raw.contains("Mappings") && raw.contains(&fixtures().workload.display().to_string()), "{raw}");
}

/// Loads a pickle with only plain types allowed; prints a JSON summary.
const CHECK_PICKLE: &str = r#"
import json, pickle, sys
class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"not plain data: {module}.{name}")
s = Plain(open(sys.argv[1], "rb")).load()
for seg in s["segments"]:
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"], seg
    addrs = [b["address"] for b in seg["blocks"]]
    assert addrs == sorted(addrs) and addrs[0] == seg["address"], seg
    assert "category" not in seg
names = sorted({f["name"] for t in s["device_traces"] for e in t for f in e["frames"]})
actions = {}
for t in s["device_traces"]:
    for e in t:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
print(json.dumps({"reserved": sum(x["total_size"] for x in s["segments"]), "segments": len(s["segments"]),
    "devices": len(s["device_traces"]), "actions": actions, "names": names}))
"#;

#[test]
fn pytorch_memory_viz_reads_the_snapshot_with_exact_tensors_and_traces() {
    require_root();
    // Weights (64 MiB) and 20 kept 1 MiB activations; 20 scratch tensors of 3 MiB freed.
    let (rec, stderr) = record("torch.gpumemrec", &torch_cmd(), "3", &[("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "5")]);
    let own = figures(&stderr);
    let snap = export("torch-snapshot", &rec, "snapshot.pickle", &[]);

    let summary: Value = serde_json::from_str(&run(Command::new("python3").args(["-c", CHECK_PICKLE]).arg(&snap))).unwrap();
    assert_eq!(summary["reserved"], own["reserved"], "segments add up to what the allocator reserved: {summary}");
    assert_eq!(summary["actions"]["alloc"], 41, "weights, 20 activations, 20 scratch: {summary}");
    assert_eq!((summary["actions"]["free_requested"].as_u64(), summary["actions"]["free_completed"].as_u64()), (Some(20), Some(20)));
    assert!(summary["names"].as_array().unwrap().iter().any(|n| n == "Model.load_weights"), "Python frames: {summary}");

    let viz = torch_memory_viz();
    let stats = run(Command::new("python3").arg(&viz).arg("stats").arg(&snap));
    assert!(stats.contains("total_allocated: 84.0MiB"), "64 MiB + 20 × 1 MiB asked:\n{stats}");
    let reserved_mib = own["reserved"].as_u64().unwrap() as f64 / MIB as f64;
    assert!(stats.contains(&format!("total_reserved: {reserved_mib:.1}MiB")), "{stats}");
    let trace = run(Command::new("python3").arg(&viz).arg("trace").arg(&snap));
    assert!(trace.starts_with("Device 0 ----------------"), "{trace}");
    assert_eq!(trace.matches("cudaMalloc(").count(), summary["actions"]["segment_alloc"].as_u64().unwrap() as usize, "{trace}");
    assert_eq!(trace.matches("# free completed for ").count(), 20, "{trace}");
    assert_eq!(trace.matches("[0:64.0MiB]").count(), 1, "the weights carved from their segment: {trace}");
}

#[test]
fn the_perfetto_trace_has_counter_tracks_names_and_marks() {
    require_root();
    let xids = dir().join("xids");
    std::fs::write(&xids, "1:48").unwrap();
    let script = format!(
        "GPUMEM_STEPS=10 GPUMEM_WORKLOAD_HOLD_MS=4000 {} & GPUMEM_FAKE_CAPACITY={} {}; wait",
        workload_cmd("deep_leak"),
        64 * MIB,
        workload_cmd("oom")
    );
    let (rec, _) = record("perfetto.gpumemrec", &script, "3", &[("GPUMEM_FAKE_NVML_XIDS_FILE", xids.to_str().unwrap())]);
    let out = export("perfetto", &rec, "trace.json", &[]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).expect("JSON");
    assert_eq!(doc["displayTimeUnit"], "ms");
    let events = doc["traceEvents"].as_array().unwrap();
    let of =
        |ph: &str, name: &str| events.iter().filter(|e| e["ph"] == ph && e["name"].as_str().unwrap().contains(name)).collect::<Vec<_>>();
    for e in events {
        assert!(e["pid"].is_u64() && e["ph"].is_string(), "{e}");
        if e["ph"] != "M" {
            assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        }
    }
    // The leaking process: its live bytes end at weights + 10 leaks, in time order.
    let counters = of("C", "GPU-0 live");
    let leaker = counters.iter().find(|c| c["args"]["bytes"] == 256 * MIB).expect("the weights")["pid"].clone();
    let series: Vec<(f64, u64)> =
        counters.iter().filter(|c| c["pid"] == leaker).map(|c| (c["ts"].as_f64().unwrap(), c["args"]["bytes"].as_u64().unwrap())).collect();
    assert!(series.windows(2).all(|w| w[0].0 <= w[1].0), "{series:?}");
    assert_eq!(series.last().unwrap().1, 256 * MIB + 10 * 4 * MIB, "{series:?}");
    let names = of("M", "process_name");
    assert!(names.iter().any(|m| m["pid"] == leaker && m["args"]["name"].as_str().unwrap().starts_with("workload")), "{names:?}");
    assert!(of("M", "thread_name").iter().any(|m| m["pid"] == leaker && m["tid"] == leaker), "the main thread is named");
    let ooms = of("i", "CUDA out of memory");
    assert_eq!(ooms.len(), 1, "{ooms:?}");
    assert_ne!(ooms[0]["pid"], leaker);
    assert_eq!(ooms[0]["args"]["device"], "GPU-0");
    assert_eq!(of("i", "XID 48").len(), 1, "the XID on the GPUs' track");

    // The real Perfetto UI's trace processor reads the same (headless Chromium).
    let shots = target_dir().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/perfetto_ui.py");
    let read: Value =
        serde_json::from_str(&run(Command::new(perfetto_ui_python()).arg(script).arg(&out).arg(shots.join("perfetto.png")))).unwrap();
    let last = read["counters"].as_array().unwrap().iter().rfind(|c| c["pid"] == leaker && c["name"] == "GPU-0 live bytes").cloned();
    assert_eq!(last.unwrap_or_default()["value"].as_f64(), Some((256 * MIB + 10 * 4 * MIB) as f64), "{read}");
    let instants: Vec<&str> = read["instants"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert!(instants.contains(&"CUDA out of memory") && instants.contains(&"XID 48"), "{read}");
    let named =
        read["processes"].as_array().unwrap().iter().any(|p| p["pid"] == leaker && p["name"].as_str().unwrap().starts_with("workload ("));
    assert!(named, "{read}");
    let png = std::fs::read(shots.join("perfetto.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG", "a screenshot");
}

#[test]
fn a_truncated_recording_is_refused_and_nothing_is_written() {
    require_root();
    let (rec, _) = record("cut.gpumemrec", &workload_cmd("leaky"), "2", &[]);
    let bytes = std::fs::read(&rec).unwrap();
    let cut = dir().join("cut-short.gpumemrec");
    // Inside the footer frame: the recording ends mid-frame.
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let out_dir = dir().join("cut-out");
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("heap.pb.gz");
    for format in ["pprof", "torch-snapshot", "perfetto"] {
        let o = run_gpumem(&["export", "--format", format, cut.to_str().unwrap(), "-o", out.to_str().unwrap()], &[]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{format}: {stderr}");
        assert!(stderr.contains("recording truncated at byte") && stderr.contains("nothing written"), "{format}: {stderr}");
        assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0, "{format}: no file, no temporary left");
    }
    let o = run_gpumem(&["export", "--format", "pprof", "/etc/hostname", "-o", out.to_str().unwrap()], &[]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a gpumem recording"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A `hold` workload alive for `ms`: 8 + 1 MiB on GPU 0, 2 MiB on GPU 1
/// (a context of its own) and 64 KiB pinned.
fn hold_workload(ms: &str) -> std::process::Child {
    spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", ms)])
}

const HOLD_BYTES: u64 = 9 * MIB;

/// Waits until the daemon's /metrics shows the process's exact bytes (its first series: GPU 0).
fn wait_for_bytes(serve: &Serve, pid: u32, bytes: u64) {
    let shows = || (pid_series(&serve.metrics(), "gpumem_process_memory_bytes", pid) == Some(bytes as f64)).then_some(());
    poll(15, &format!("{pid} to show {bytes} bytes"), shows, || format!(":\n{}", serve.metrics()));
}

#[test]
fn a_running_daemon_exports_what_it_knows_as_pprof() {
    require_root();
    let f = fixtures();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"], &[]);
    let socket = serve.state.as_ref().unwrap().socket.clone();
    let mut child = hold_workload("6000");
    wait_for_bytes(&serve, child.id(), HOLD_BYTES);
    let out = dir().join("daemon-heap.pb.gz");
    let _ = std::fs::remove_file(&out);
    let o = Command::new(gpumem_bin())
        .args(["export", "--format", "pprof", "-o", out.to_str().unwrap(), "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("from the daemon"), "{}", String::from_utf8_lossy(&o.stderr));
    // pprof keeps one -tagfocus: the process is the only one allocating here.
    // `hold` is inlined into main.
    let gpu = pprof(&out, &["-top", "-unit=bytes", "-tagfocus=device=GPU-0"]);
    assert_eq!(flat(&gpu, "main"), format!("{HOLD_BYTES}B"), "{gpu}");
    let gpu1 = pprof(&out, &["-top", "-unit=bytes", "-tagfocus=device=GPU-1"]);
    assert_eq!(flat(&gpu1, "main"), format!("{}B", 2 * MIB), "{gpu1}");
    let host = pprof(&out, &["-top", "-unit=bytes", "-tagfocus=device=host"]);
    assert_eq!(flat(&host, "[stack not captured]"), format!("{}B", 64 * 1024), "pinned host memory apart: {host}");
    let raw = pprof(&out, &["-raw"]);
    assert!(raw.contains(&format!("pid:[{}]", child.id())), "{raw}");
    // PyTorch's snapshot of the same process, from the daemon: its three segments.
    let snap = dir().join("daemon-snapshot.pickle");
    let o = Command::new(gpumem_bin())
        .args(["export", "--format", "torch-snapshot", "-o", snap.to_str().unwrap(), "--socket", socket.to_str().unwrap()])
        .args(["--pid", &child.id().to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stats = run(Command::new("python3").arg(torch_memory_viz()).arg("stats").arg(&snap));
    assert!(stats.contains("segments: 3") && stats.contains("total_reserved: 11.0MiB"), "{stats}");
    // A daemon keeps no timeline: perfetto is refused with what to do.
    let o = Command::new(gpumem_bin())
        .args(["export", "--format", "perfetto", "-o", snap.to_str().unwrap(), "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("record the session"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(serve.stop().0.success());
}

/// VictoriaMetrics on a free port, its data under target/.
struct Victoria {
    child: std::process::Child,
    port: u16,
}

impl Victoria {
    fn start() -> Victoria {
        let port = free_port();
        let data = dir().join(format!("vm-data-{port}"));
        let _ = std::fs::remove_dir_all(&data);
        let child = Command::new(victoria_metrics())
            .arg(format!("-storageDataPath={}", data.display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg("-search.latencyOffset=1ms")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let v = Victoria { child, port };
        v.wait_for(10, "VictoriaMetrics to start", || http_get(port, "/health", None).ok().filter(|r| r.0 == 200));
        v
    }

    /// The samples of the series `selector` matches (`/api/v1/export`, JSON lines).
    fn export(&self, selector: &str) -> Vec<Value> {
        let _ = http_get(self.port, "/internal/force_flush", None);
        let (_, _, body) = http_get(self.port, &format!("/api/v1/export?match[]={}", url_encode(selector)), None).unwrap();
        body.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    fn wait_for<T>(&self, secs: u64, what: &str, f: impl FnMut() -> Option<T>) -> T {
        poll(secs, what, f, String::new)
    }
}

impl Drop for Victoria {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn otlp_pushes_reach_victoria_metrics_with_the_series_of_a_scrape() {
    require_root();
    let f = fixtures();
    let vm = Victoria::start();
    let endpoint = format!("http://127.0.0.1:{}/opentelemetry/v1/metrics", vm.port);
    let serve =
        Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--otlp-endpoint", &endpoint, "--otlp-interval", "1"], &[]);
    let mut child = hold_workload("8000");
    let pid = child.id();
    wait_for_bytes(&serve, pid, HOLD_BYTES);
    // The process's gauge, exact, with its labels.
    let selector = format!("gpumem_process_memory_bytes{{pid=\"{pid}\"}}");
    let series = vm.wait_for(20, "the process's bytes in VictoriaMetrics", || {
        vm.export(&selector).into_iter().find(|s| s["values"].as_array().is_some_and(|v| v.last() == Some(&Value::from(HOLD_BYTES))))
    });
    assert_eq!(series["metric"]["comm"], "workload", "{series}");
    assert_eq!(series["metric"]["service.name"], "gpumem", "{series}");
    assert!(series["metric"]["gpu"].is_string(), "dcgm's device label: {series}");
    // Counters as a scrape names them, cumulative: the last pushed value is what /metrics says.
    let text = serve.metrics();
    let calls = vm.wait_for(10, "the counters", || {
        let s = vm.export("gpumem_events_processed_total");
        s.first().and_then(|s| s["values"].as_array().and_then(|v| v.last()).and_then(Value::as_f64))
    });
    let scraped = sample(&text, "gpumem_events_processed_total").unwrap();
    assert!(calls > 0.0 && calls <= scraped, "pushed {calls}, scraped later {scraped}");
    let buckets = vm.export("gpumem_allocation_size_bytes_bucket");
    assert!(buckets.iter().any(|s| s["metric"]["le"] == "+Inf"), "histograms with their buckets: {buckets:?}");
    assert!(sample(&text, "gpumem_otlp_pushes_total{outcome=\"ok\"}").unwrap() >= 1.0, "{text}");
    assert_eq!(sample(&text, "gpumem_otlp_pushes_total{outcome=\"failed\"}"), Some(0.0), "{text}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(serve.stop().0.success());
}

#[test]
fn sampled_stacks_carry_the_same_unbiased_estimates_as_leaks() {
    require_root();
    // Stacks over a budget of 100/s sampled one per 64 KiB on average (see
    // tests/leaks.rs): pprof's figures are the leak groups' estimates.
    let script = format!("GPUMEM_SECONDS=6 {}", workload_cmd("sampled"));
    let f = fixtures();
    let rec = dir().join("sampled.gpumemrec");
    let args = ["record", "-o", rec.to_str().unwrap(), "--duration", "3", "--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"];
    let out = run_gpumem(&[&args[..], &["--stack-budget", "100", "--stack-sample-bytes", "64KiB", "-c", &script]].concat(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let o = run_gpumem(&["leaks", "--from", rec.to_str().unwrap(), "--json", "--older-than", "0", "-n", "10"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let profile = export("pprof", &rec, "sampled.pb.gz", &[]);
    let top = pprof(&profile, &["-top", "-unit=bytes", "-nodecount=100", "-nodefraction=0"]);
    let objects = pprof(&profile, &["-top", "-nodecount=100", "-nodefraction=0", "-sample_index=inuse_objects"]);
    for g in v["processes"][0]["stacks"].as_array().unwrap() {
        let name = g["frames"][0]["function"].as_str().unwrap();
        assert_eq!(g["estimated"], true, "{g}");
        assert_eq!(flat(&top, name), format!("{}B", g["bytes"]), "{name}: {top}");
        assert_eq!(flat(&objects, name), g["count"].to_string(), "{name}: {objects}");
    }
    assert_eq!(flat(&top, "sampled_big"), format!("{}B", 4 * MIB), "p = 1: exact");
    let raw = pprof(&profile, &["-raw"]);
    assert!(raw.contains("estimated:[true]") && raw.contains("over the stack budget were not sampled"), "{raw}");
}

/// The `<title>` texts of an SVG's frames (inferno writes one per frame).
fn frame_titles(svg: &str) -> Vec<String> {
    svg.split("<title>").skip(1).filter_map(|t| t.split("</title>").next()).map(|t| t.replace("&amp;", "&")).collect()
}

#[test]
fn the_memory_flame_graph_names_the_leak_with_its_exact_bytes_and_its_folded_stacks_read_in_inferno() {
    require_root();
    // 15 steps: leak_buffer keeps 4 MiB each (60 MiB), train_step's 32 MiB is freed each step (480 MiB made).
    let script = format!("GPUMEM_STEPS=15 GPUMEM_WORKLOAD_HOLD_MS=4000 {}", workload_cmd("deep_leak"));
    let (rec, _) = record("flame.gpumemrec", &script, "3", &[]);
    let leak = format!("leak_buffer ({} bytes", thousands(15 * 4 * MIB));
    let svg = std::fs::read_to_string(export("flamegraph", &rec, "inuse.svg", &[])).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("<svg"), "{}", &svg[..svg.len().min(300)]);
    assert!(!svg.contains("<script src") && !svg.contains("href=\"http"), "nothing fetched");
    assert!(svg.contains("GPU memory held now"), "the title says which bytes");
    let titles = frame_titles(&svg);
    assert!(titles.iter().any(|t| t.starts_with(&leak)), "{leak} in {titles:#?}");
    assert!(titles.iter().any(|t| t.starts_with(&format!("load_weights ({} bytes", thousands(256 * MIB)))), "{titles:#?}");
    assert!(titles.iter().any(|t| t.starts_with("GPU 0 (")), "the device frame: {titles:#?}");
    let train = format!("train_step ({} bytes", thousands(15 * 4 * MIB));
    assert!(titles.iter().any(|t| t.starts_with(&train)), "its freed 32 MiB steps hold nothing now: {titles:#?}");
    // The second view: bytes made over the session, freed or not.
    let made = std::fs::read_to_string(export("flamegraph", &rec, "alloc.svg", &["--space", "alloc"])).unwrap();
    let made_titles = frame_titles(&made);
    assert!(made.contains("allocated over the session"), "the title says which bytes");
    let train = format!("train_step ({} bytes", thousands(15 * 4 * MIB + 15 * 32 * MIB));
    assert!(made_titles.iter().any(|t| t.starts_with(&train)), "{train} in {made_titles:#?}");

    // Folded stacks: root first, one line per stack, read by inferno's own binary.
    let folded = std::fs::read_to_string(export("folded", &rec, "heap.folded", &[])).unwrap();
    let line = folded.lines().find(|l| l.contains(";leak_buffer")).unwrap_or_else(|| panic!("{folded}"));
    let (stack, bytes) = line.rsplit_once(' ').unwrap();
    assert_eq!(bytes, (15 * 4 * MIB).to_string(), "{line}");
    let frames: Vec<&str> = stack.split(';').collect();
    assert!(frames[0].starts_with("workload (") && frames[1] == "GPU 0", "{line}");
    let order: Vec<usize> = ["main", "run_model", "train_step", "leak_buffer"]
        .iter()
        .map(|f| frames.iter().position(|x| x == f).unwrap_or_else(|| panic!("{f}: {line}")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "root first: {line}");
    let total: u64 = folded.lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert_eq!(total, 256 * MIB + 15 * 4 * MIB, "every held byte once: {folded}");
    let drawn = run(Command::new(inferno_flamegraph()).args(["--countname", "bytes"]).arg(dir().join("heap.folded")));
    assert!(frame_titles(&drawn).iter().any(|t| t.starts_with(&leak)), "inferno-flamegraph read it: {leak}");

    // Chromium draws it (the README's picture).
    let shots = target_dir().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("flame.png");
    let _ = std::fs::remove_file(&png);
    let dom = chromium_screenshot(&dir().join("inuse.svg"), &png, 1200, 420);
    assert!(dom.contains("leak_buffer"), "{}", &dom[..dom.len().min(400)]);
    let (colours, ink) = png_contents(&png);
    assert!(colours >= 10 && ink > 0.2, "the flame graph looks blank: {colours} colours, {:.1} % not white", ink * 100.0);
}

/// `n` with a comma every three digits, as inferno writes counts.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
