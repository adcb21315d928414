//! `gpumem serve` end to end: a real Prometheus server scrapes the real agent
//! while synthetic workloads run; promtool checks the exposition and the rules;
//! the deploy/ manifests are checked against the CLI and the exporter.
//! Run as root, one test at a time (`cargo xtask test` does both).
use std::{path::PathBuf, process::Command, time::Duration};

use gpumem_tests::*;
use serde_json::Value;

fn deploy(path: &str) -> PathBuf {
    workspace().join("deploy").join(path)
}

fn rules_file() -> PathBuf {
    deploy("prometheus/gpumem-rules.yaml")
}

fn run_workload(scenario: &str, envs: &[(&str, &str)]) {
    let status = spawn_workload(scenario, envs).wait().unwrap();
    assert!(status.success(), "workload {scenario}: {status:?}");
}

/// Runs the memory hog in a fresh memory cgroup limited to 64 MiB: the kernel OOM-kills it.
fn provoke_host_oom_kill() {
    let (cg, cmd) = hog_in_memory_cgroup("gpumem-serve-oom");
    let status = Command::new("/bin/sh").args(["-c", &cmd]).status().unwrap();
    let _ = std::fs::remove_dir(cg);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "the hog was OOM-killed: {status:?}");
}

#[test]
fn prometheus_scrapes_exact_bytes_histograms_ooms_alerts_and_nvml() {
    require_root();
    let steps = steps();
    let f = fixtures();
    let pids_file = target_dir().join("gpumem-fixtures/nvml-pids");
    std::fs::write(&pids_file, "").unwrap();
    let xids_file = target_dir().join("gpumem-fixtures/nvml-xids");
    std::fs::write(&xids_file, "").unwrap();
    let serve = Serve::start(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"],
        &[("GPUMEM_FAKE_NVML_PIDS_FILE", pids_file.to_str().unwrap()), ("GPUMEM_FAKE_NVML_XIDS_FILE", xids_file.to_str().unwrap())],
    );
    let prom = Prometheus::start("serve", &[format!("127.0.0.1:{}", serve.port)], &[rules_file()]);

    steps.step("workloads run while Prometheus scrapes");
    // Holds 9 MiB (2 allocations) on GPU 0, 2 MiB on GPU 1 and 64 KiB pinned.
    let mut hold = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "120000")]);
    let pid = hold.id();
    // NVML's own figures for it: 100 MiB on GPU 0, 50 MiB on GPU 1.
    std::fs::write(&pids_file, format!("{pid}:{},1/{pid}:{}", 100 * MIB, 50 * MIB)).unwrap();
    // Alerts on counters need Prometheus to have seen them at 0 first.
    for zero in [
        "gpumem_cuda_oom_total{gpu=\"0\"}",
        "gpumem_oom_kills_total{source=\"memcg\"}",
        "gpumem_gpu_xid_errors_total{gpu=\"1\",xid=\"48\"}",
    ] {
        prom.wait_for(20, zero, || prom.value(zero).filter(|&v| v == 0.0));
    }
    std::fs::write(&xids_file, "1:48").unwrap();
    // 48 MiB then 32 MiB on a 64 MiB card: one CUDA out-of-memory (and a size-0 call that fails with 1).
    run_workload("oom", &[("GPUMEM_FAKE_CAPACITY", &(64 * MIB).to_string())]);
    provoke_host_oom_kill();

    let proc_series = |m: &str, gpu: u32| format!("{m}{{pid=\"{pid}\",gpu=\"{gpu}\"}}");
    let live0 = prom.wait_for(30, "the held memory in Prometheus", || {
        prom.value(&proc_series("gpumem_process_memory_bytes", 0)).filter(|&v| v == (9 * MIB) as f64)
    });
    assert_eq!(live0, (9 * MIB) as f64);
    assert_eq!(prom.value(&proc_series("gpumem_process_memory_bytes", 1)), Some((2 * MIB) as f64));
    assert_eq!(prom.value(&proc_series("gpumem_process_allocations", 0)), Some(2.0));
    assert_eq!(prom.value(&format!("gpumem_process_host_pinned_bytes{{pid=\"{pid}\"}}")), Some(65536.0));
    let (labels, _) = &prom.query(&proc_series("gpumem_process_memory_bytes", 1))[0];
    assert_eq!(labels["comm"], "workload");
    assert_eq!(labels["UUID"], "GPU-00000000-0000-0000-0000-000000000001");
    assert_eq!(labels["pci_bus_id"], "00000000:11:00.0");
    assert_eq!(labels["modelName"], "Fake H200");

    steps.step("exact bytes and reconciliation");
    // Reconciliation with NVML, exact.
    let untracked = |gpu| prom.wait_for(20, "untracked bytes", || prom.value(&proc_series("gpumem_process_untracked_bytes", gpu)));
    assert_eq!(untracked(0), (100 * MIB - 9 * MIB) as f64);
    assert_eq!(untracked(1), (50 * MIB - 2 * MIB) as f64);

    steps.step("histograms and counters");
    // Histograms: device allocations of hold (8, 16, 1, 2 MiB), oom (48, 32 MiB) and hog (100 MiB).
    let count = |q: &str| prom.value(q).unwrap_or_else(|| panic!("no value for {q}"));
    // Scraped after the last of them (each scrape is one consistent snapshot).
    prom.wait_for(20, "the OOM workloads to be scraped", || {
        (prom.value("gpumem_allocation_size_bytes_count{memory=\"device\"}")? == 7.0
            && prom.value("gpumem_process_exits_total{gpu=\"0\"}")? == 2.0)
            .then_some(())
    });
    assert_eq!(count("gpumem_allocation_size_bytes_sum{memory=\"device\"}"), (207 * MIB) as f64);
    for (le, n) in [("1048576", 1.0), ("4194304", 2.0), ("16777216", 4.0), ("67108864", 6.0), ("268435456", 7.0)] {
        let q = format!("gpumem_allocation_size_bytes_bucket{{memory=\"device\",le=~\"{le}(\\\\.0)?\"}}");
        assert_eq!(count(&q), n, "{q}");
    }
    assert_eq!(count("gpumem_allocation_size_bytes_count{memory=\"host_pinned\"}"), 1.0);
    // Explicit frees of tracked allocations: hold's 16 MiB and oom's 48 MiB.
    assert_eq!(count("gpumem_allocation_lifetime_seconds_count{memory=\"device\"}"), 2.0);
    // cuMemAlloc_v2: hold 4 + oom 4 + hog 1 calls.
    assert_eq!(count("gpumem_api_latency_seconds_count{api=\"cuMemAlloc_v2\"}"), 9.0);
    assert_eq!(count("sum(gpumem_api_calls_total{api=\"cuMemAlloc_v2\"})"), 9.0);
    assert_eq!(count("gpumem_api_calls_total{api=\"cuMemAlloc_v2\",result=\"CUDA_ERROR_OUT_OF_MEMORY\"}"), 1.0);
    assert_eq!(count("gpumem_api_calls_total{api=\"cuMemAlloc_v2\",result=\"CUDA_ERROR_INVALID_VALUE\"}"), 1.0);

    // Out of memory: the CUDA one on GPU 0 and the kernel's kill in a memory cgroup.
    assert_eq!(count("gpumem_cuda_oom_total{gpu=\"0\"}"), 1.0);
    assert_eq!(count("gpumem_fragmentation_failures_total{gpu=\"0\"}"), 0.0);
    assert_eq!(count("gpumem_oom_kills_total{source=\"memcg\"}"), 1.0);
    assert_eq!(count("gpumem_oom_kills_total{source=\"host\"}"), 0.0);
    // The oom workload and the killed hog both exited holding memory on GPU 0.
    assert_eq!(count("gpumem_process_exits_total{gpu=\"0\"}"), 2.0);

    steps.step("NVML series");
    // NVML series from the synthetic driver's three cards.
    assert_eq!(count("gpumem_gpu_memory_total_bytes{gpu=\"0\"}"), (144u64 << 30) as f64);
    assert_eq!(count("gpumem_gpu_temperature_celsius{gpu=\"0\"}"), 60.0);
    assert_eq!(count("gpumem_gpu_memory_temperature_celsius{gpu=\"0\"}"), 70.0);
    assert_eq!(count("gpumem_gpu_retired_pages{gpu=\"1\",cause=\"double_bit_ecc\"}"), 1.0);
    assert_eq!(count("gpumem_gpu_retired_pages{gpu=\"1\",cause=\"single_bit_ecc\"}"), 2.0);
    assert_eq!(count("gpumem_gpu_retired_pages_pending{gpu=\"1\"}"), 1.0);
    assert_eq!(count("gpumem_gpu_remapped_rows{gpu=\"1\",kind=\"correctable\"}"), 3.0);
    assert_eq!(count("gpumem_gpu_remapped_rows{gpu=\"1\",kind=\"uncorrectable\"}"), 1.0);
    assert_eq!(count("gpumem_gpu_row_remap_pending{gpu=\"1\"}"), 1.0);
    assert_eq!(count("gpumem_gpu_row_remap_failure{gpu=\"1\"}"), 0.0);
    // Addressing: none on card 0, ATS on card 1 (a Grace Hopper's), unsaid by the old card 2.
    assert_eq!(count("gpumem_gpu_addressing_mode{gpu=\"0\",mode=\"none\"}"), 1.0);
    assert_eq!(count("gpumem_gpu_addressing_mode{gpu=\"1\",mode=\"ats\"}"), 1.0);
    assert_eq!(count("count(gpumem_gpu_addressing_mode)"), 2.0, "one mode per card that says it, none for card 2");
    assert_eq!(count("gpumem_gpu_ecc_errors_total{gpu=\"0\",error_type=\"corrected\",counter=\"volatile\"}"), 0.0);
    // The failing card's corrected errors climb by 100 × the read number at every reading.
    let ecc = "gpumem_gpu_ecc_errors_total{gpu=\"1\",error_type=\"corrected\",counter=\"volatile\"}";
    let e1 = count(ecc);
    prom.wait_for(10, "the ECC counter to climb", || (prom.value(ecc)? > e1).then_some(()));
    // The old card supports none of it: no series rather than zeros.
    assert!(prom.query("gpumem_gpu_ecc_errors_total{gpu=\"2\"}").is_empty());
    assert!(prom.query("gpumem_gpu_retired_pages{gpu=\"2\"}").is_empty());
    assert_eq!(count("gpumem_gpu_health_score{gpu=\"0\"}"), 100.0);
    let xid = prom.wait_for(20, "XID 48", || prom.value("gpumem_gpu_xid_errors_total{gpu=\"1\",xid=\"48\"}"));
    assert!(xid >= 1.0);
    let h1 =
        prom.wait_for(20, "the failing card's score to drop", || prom.value("gpumem_gpu_health_score{gpu=\"1\"}").filter(|&s| s < 50.0));
    assert!(h1 < 50.0);

    // Self-telemetry.
    assert_eq!(count("sum(gpumem_lost_events_total)"), 0.0);
    assert_eq!(count("sum(gpumem_table_overflow_total)"), 0.0);
    assert_eq!(count("gpumem_probes_attached"), (gpumem_common::APIS.len() - 1) as f64, "all but cuCtxCreate_v4");
    assert_eq!(count("gpumem_nvml_up"), 1.0);
    // hold 10 calls; oom 8 calls and its exit; hog 4 calls, its kill and its exit.
    assert!(count("gpumem_events_processed_total") >= 25.0);
    assert!(count("gpumem_agent_resident_memory_bytes") > 1e6);

    steps.step("alerting rules fire");
    // The rules file, loaded by the same Prometheus, fires on what happened.
    for alert in ["GpumemCudaOutOfMemory", "GpumemHostOomKill", "GpumemCriticalXid"] {
        prom.wait_for(20, alert, || {
            prom.value(&format!("count(ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"}})")).filter(|&n| n >= 1.0)
        });
    }
    assert!(prom.query("ALERTS{alertname=\"GpumemGpuMemoryFull\"}").is_empty(), "GPU 0 is 14 % used");

    let _ = hold.kill();
    let _ = hold.wait();
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{status:?}\n{stderr}");
}

/// The metric names a text exposition declares, with each histogram's
/// `_bucket`, `_sum` and `_count` series.
fn declared_names(exposition: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            names.insert(name.to_string());
            if kind == "histogram" {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
            }
        }
    }
    names
}

/// gpumem_* metric names an expression refers to (recording-rule names like
/// gpumem:x:y are not metrics the agent exports).
fn referenced_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("gpumem_") {
        let start = i + at;
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_' || bytes[start - 1] == b':');
        let end = expr[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(expr.len(), |e| start + e);
        if before_ok && !expr[end..].starts_with(':') {
            out.push(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

#[test]
fn promtool_accepts_the_exposition_and_the_rules_and_every_name_exists() {
    require_root();
    let f = fixtures();
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()], &[]);
    run_workload("all_kinds", &[]);
    let text = serve.metrics();
    let (status, ctype, om) =
        http_get(serve.port, "/metrics", Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")).unwrap();
    assert_eq!(status, 200);
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(om.ends_with("# EOF\n"));
    assert!(om.contains("# TYPE gpumem_api_calls counter\n"), "OpenMetrics names counters without _total");
    assert!(text.contains("# TYPE gpumem_api_calls_total counter\n"), "the text format names them with it");
    let (status, _, health) = http_get(serve.port, "/healthz", None).unwrap();
    assert_eq!(status, 200);
    assert!(health.starts_with("ok: up"), "{health}");
    let (status, _) = serve.stop();
    assert!(status.success());

    // promtool parses it; its only complaints are about the two camelCase
    // label names kept for joins with dcgm-exporter (UUID, modelName).
    let (code, report) = promtool_check_metrics(&text);
    assert_ne!(code, Some(1), "promtool could not parse the exposition:\n{report}");
    let complaints: Vec<&str> =
        report.lines().filter(|l| !l.contains("label names should be written in 'snake_case' not 'camelCase'")).collect();
    assert!(complaints.is_empty(), "promtool check metrics:\n{}", complaints.join("\n"));
    assert!(report.lines().count() > 0, "the camelCase device labels are there");

    let rules = rules_file();
    let out = Command::new("promtool").args(["check", "rules"]).arg(&rules).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let out =
        Command::new("promtool").args(["test", "rules", "gpumem-rules.test.yaml"]).current_dir(deploy("prometheus")).output().unwrap();
    assert!(out.status.success(), "promtool test rules:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));

    // Every alert in the rules file has a unit test.
    let rules_yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&rules).unwrap()).unwrap();
    let tests_text = std::fs::read_to_string(deploy("prometheus/gpumem-rules.test.yaml")).unwrap();
    let mut exprs = Vec::new();
    for group in rules_yaml["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_string());
            if let Some(alert) = rule["alert"].as_str() {
                assert!(tests_text.contains(&format!("alertname: {alert}\n")), "no unit test for alert {alert}");
            }
        }
    }
    // Every gpumem metric the rules and the dashboard use is one the agent exports.
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(deploy("grafana/gpumem-dashboard.json")).unwrap()).unwrap();
    let mut dash_exprs = Vec::new();
    collect_exprs(&dashboard, &mut dash_exprs);
    assert!(dash_exprs.len() >= 20, "{dash_exprs:?}");
    let declared = declared_names(&text);
    for expr in exprs.iter().chain(&dash_exprs) {
        for name in referenced_names(expr) {
            assert!(declared.contains(&name), "`{name}` (in `{expr}`) is not exported; exported: {declared:?}");
        }
    }
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

fn series_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).collect()
}

fn value_of(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn three_hundred_short_lived_processes_stay_under_the_series_cap_and_then_go() {
    require_root();
    let f = fixtures();
    let serve =
        Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--max-process-series", "50", "--exited-grace", "2"], &[]);
    let mut all_pids = Vec::new();
    let mut most_series = 0;
    for wave in 0..3 {
        // 100 at a time, each holding 9 MiB on GPU 0 and 2 MiB on GPU 1: 200 (process, GPU) pairs.
        // Each holds until told to go (SIGUSR1), once the figures are checked.
        let mut children: Vec<_> = (0..100).map(|_| spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_SIGNAL", "1")])).collect();
        all_pids.extend(children.iter().map(|c| c.id()));
        let gpu0_total = |text: &str| -> f64 {
            series_of(text, "gpumem_process_memory_bytes").iter().filter(|l| l.contains("gpu=\"0\"")).map(|l| value_of(l)).sum()
        };
        let text = poll(
            30,
            &format!("wave {wave}'s 100 × 9 MiB on GPU 0"),
            || Some(serve.metrics()).filter(|t| gpu0_total(t) == (100 * 9 * MIB) as f64),
            || format!(": GPU 0 total {}", gpu0_total(&serve.metrics())),
        );
        let rows = series_of(&text, "gpumem_process_memory_bytes");
        most_series = most_series.max(rows.len());
        // 50 processes' own series and one "other" per GPU; the sums stay exact.
        assert!(rows.len() <= 52, "{} series:\n{}", rows.len(), rows.join("\n"));
        let other: Vec<&&str> = rows.iter().filter(|l| l.contains("comm=\"other\"")).collect();
        assert_eq!(other.len(), 2, "{other:?}");
        let total1: f64 = rows.iter().filter(|l| l.contains("gpu=\"1\"")).map(|l| value_of(l)).sum();
        assert_eq!(total1, (100 * 2 * MIB) as f64);
        assert!(sample(&text, "gpumem_exporter_aggregated_process_series").unwrap() >= 150.0);
        for c in &children {
            // SAFETY: signals our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGUSR1) };
        }
        for c in &mut children {
            assert!(c.wait().unwrap().success());
        }
    }
    assert_eq!(all_pids.len(), 300);
    // After the grace period every one of them is gone from the exposition.
    let gone =
        |text: &String| series_of(text, "gpumem_process_memory_bytes").is_empty() && sample(text, "gpumem_tracked_processes") == Some(0.0);
    let text = poll(
        20,
        "exited processes' series to go",
        || Some(serve.metrics()).filter(gone),
        || format!(":\n{}", series_of(&serve.metrics(), "gpumem_process_memory_bytes").join("\n")),
    );
    assert_eq!(sample(&text, "gpumem_lost_events_total{reason=\"ringbuf_full\"}"), Some(0.0));
    assert_eq!(sample(&text, "gpumem_process_exits_total{gpu=\"0\",UUID=\"\",pci_bus_id=\"\",modelName=\"\"}"), Some(300.0));
    assert!(most_series <= 52);
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
}

/// SIGTERM with probes attached: the daemon exits 0 and every program (so
/// every uprobe on libcuda) is gone within a second. uprobe_multi links are
/// removed in one RCU grace period; per-point links took one each (6 s for 60).
#[test]
fn sigterm_detaches_every_probe_within_a_second_and_exits_zero() {
    require_root();
    let f = fixtures();
    // Unpinned: the probes go with the agent (pinned ones stay for the
    // next agent: tests/continuity.rs).
    let serve = Serve::start(&["--no-pin", "--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"], &[]);
    let loaded = gpumem_programs();
    for name in ["cuda_m_entry", "cuda_m_return"] {
        assert!(loaded.iter().any(|n| n == name), "{name} is loaded while it serves: {loaded:?}");
    }
    let sigterm = std::time::Instant::now();
    let (status, stderr) = serve.stop();
    let exited = sigterm.elapsed();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("probes detached in"), "{stderr}");
    // It detached in its own exit: no helper process is left...
    let leftovers: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "gpumem"))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(leftovers.is_empty(), "gpumem processes left: {leftovers:?}");
    // ...and the kernel frees the programs once the last link is gone (after an RCU grace period).
    poll(
        1,
        "every program to be unloaded after SIGTERM",
        || gpumem_programs().is_empty().then_some(()),
        || format!(": {:?}", gpumem_programs()),
    );
    let gone = sigterm.elapsed();
    assert!(gone < Duration::from_secs(1), "exit after {exited:?}, probes gone after {gone:?}");
    eprintln!("SIGTERM → exit {:.0} ms, every program gone {:.0} ms", exited.as_secs_f64() * 1e3, gone.as_secs_f64() * 1e3);
}

#[test]
fn the_daemonset_matches_the_cli_and_asks_only_for_what_it_needs() {
    let text = std::fs::read_to_string(deploy("kubernetes/gpumem-daemonset.yaml")).unwrap();
    let docs: Vec<serde_yaml_ng::Value> =
        serde_yaml_ng::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).expect("well-formed YAML")).collect();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert!(pod["hostNetwork"].is_null(), "no host network: the pod IP is enough to scrape");
    let c = &pod["containers"][0];
    let image = c["image"].as_str().unwrap();
    assert!(image.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))), "image {image} is not version {}", env!("CARGO_PKG_VERSION"));
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    let caps: Vec<&str> = sc["capabilities"]["add"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    // What `gpumem` checks at start (privileges.rs) and the reliability test runs with.
    assert_eq!(caps, ["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"]);
    // The arguments are ones the CLI accepts (clap validates every value before --help).
    assert_eq!(c["command"][0], "gpumem");
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(args[0], "serve");
    let out = Command::new(gpumem_bin()).args(&args).arg("--help").output().unwrap();
    assert!(out.status.success(), "gpumem {args:?} is rejected: {}", String::from_utf8_lossy(&out.stderr));
    // The port it listens on is the one declared, probed and annotated for Prometheus.
    let listen = args.iter().find_map(|a| a.strip_prefix("--listen=")).expect("--listen");
    let port: u64 = listen.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(c["ports"][0]["containerPort"].as_u64(), Some(port));
    assert_eq!(ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as_str(), Some(port.to_string().as_str()));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    let mount = &c["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/sys/kernel/tracing");
    assert_eq!(mount["readOnly"], true);
    // What continuity writes is on host paths that outlive the pod: the
    // node's bpffs under --pin-dir, --state-dir, the socket's directory.
    let mounted = |dir: &str| {
        let m = c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| dir.starts_with(m["mountPath"].as_str().unwrap()) && m["mountPath"] != "/");
        let m = m.unwrap_or_else(|| panic!("{dir} is not on a mounted volume"));
        assert_ne!(m["readOnly"], true, "{dir} is read-only");
        let v = pod["volumes"].as_sequence().unwrap().iter().find(|v| v["name"] == m["name"]).unwrap();
        assert_eq!(v["hostPath"]["path"], m["mountPath"], "{dir}: a host path");
    };
    for flag in ["--pin-dir=", "--state-dir=", "--socket="] {
        let dir = args.iter().find_map(|a| a.strip_prefix(flag)).unwrap_or_else(|| panic!("{flag} is not set"));
        mounted(dir);
    }
}

#[test]
fn a_failed_rendering_answers_500_and_failed_counter_reads_keep_the_daemon_serving() {
    require_root();
    let f = fixtures();
    // Fault injection: the first rendering fails (as if the encoder had), and
    // so do the first three reads of the kernel's counters.
    let serve =
        Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--fail-renders", "1", "--fail-counter-reads", "3"], &[]);
    let (status, _, body) = http_get(serve.port, "/metrics", None).unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("rendering the metrics failed"), "{body}");
    // The daemon goes on: the next scrapes are whole, and say what failed
    // (each scrape and tick reads the counters again, until the three failures are spent).
    let errors = |text: &str| sample(text, "gpumem_agent_errors_total{operation=\"read_kernel_counters\"}");
    let text = poll(10, "the three failed reads counted", || Some(serve.metrics()).filter(|t| errors(t) == Some(3.0)), || serve.metrics());
    assert!(sample(&text, "gpumem_lost_events_total{reason=\"ringbuf_full\"}").is_some(), "the counters are read again: {text}");
    let (code, out) = promtool_check_metrics(&text);
    assert_eq!(code, Some(0), "{out}");
    let (status, _, health) = http_get(serve.port, "/healthz", None).unwrap();
    assert_eq!(status, 200, "{health}");
    let (status, stderr) = serve.stop();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("reading the kernel's counters failed"), "the failure is said once: {stderr}");
}

#[test]
fn the_daemon_says_what_its_memory_is_by_owner() {
    require_root();
    let f = fixtures();
    // The event ring sized by the host's class, the stack ring by its flag.
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--stack-ring-bytes", "8388608"], &[]);
    // The tests' agent is a debug build: eight times a release build's room.
    let cpus = online_cpus();
    let events_mib = (cpus as u64 * 8).next_power_of_two().clamp(4, 64);
    let mut child = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "30000")]);
    let of = |text: &str, part: &str| sample(text, &format!("gpumem_agent_heap_bytes{{part=\"{part}\"}}")).unwrap_or(f64::NAN);
    // Once the workload's events and stacks are read.
    let text = poll(10, "the workload's stacks on the heap", || Some(serve.metrics()).filter(|t| of(t, "stacks") > 0.0), String::new);
    let heap = |part: &str| of(&text, part);
    let parts = ["state", "stacks", "unwind", "python", "growth", "history", "unattributed"];
    let total: f64 = parts.iter().map(|p| heap(p)).sum();
    let rss = sample(&text, "gpumem_agent_resident_memory_bytes").unwrap();
    let rings = sample(&text, "gpumem_agent_bpf_map_resident_memory_bytes").unwrap();
    // The workload's process, its allocations and their stacks are on the heap.
    assert!(heap("state") > 0.0 && heap("stacks") > 0.0, "{:?}", parts.map(heap));
    // The workload's libraries' unwind tables (libc's .eh_frame alone is tens of KiB).
    assert!(heap("unwind") > 16384.0, "{:?}", parts.map(heap));
    assert!(heap("unattributed") > 0.0, "what blazesym keeps parsed is not estimated: {:?}", parts.map(heap));
    // Each cache with its bound: the workload's stacks are in the table and known.
    let cache = |family: &str, name: &str| sample(&text, &format!("{family}{{cache=\"{name}\"}}")).unwrap_or(f64::NAN);
    assert!(cache("gpumem_agent_cache_entries", "stacks") >= 1.0, "{text}");
    assert!(cache("gpumem_agent_cache_entries", "known_stacks") >= 1.0, "{text}");
    assert_eq!(cache("gpumem_agent_cache_max_entries", "stacks"), 65536.0);
    // Each BPF map's kernel memory: the two rings at least their size.
    let map = |name: &str| sample(&text, &format!("gpumem_agent_bpf_map_bytes{{map=\"{name}\"}}")).unwrap_or(f64::NAN);
    assert!(map("EVENTS") >= (events_mib << 20) as f64 && map("STACKS") >= 8.0 * 1048576.0, "{text}");
    assert!(map("EVENTS") < (events_mib << 21) as f64 && map("STACKS") < 16.0 * 1048576.0, "{text}");
    for name in ["stacks", "known_stacks", "symbolized_frames", "stack_owners", "process_unwinders", "unwind_tables", "python_code_objects"]
    {
        assert_eq!(cache("gpumem_agent_cache_evictions_total", name), 0.0, "{name}: nothing let go at this size");
    }
    assert!(total > 1_048_576.0 && total < rss - rings, "heap in use {total} within the resident memory {rss} less the rings {rings}");
    assert!(sample(&text, "gpumem_agent_heap_free_bytes").is_some(), "{text}");
    // `gpumem status` says it, asking the daemon.
    let state = serve.state.clone().unwrap();
    let out = Command::new(gpumem_bin())
        .args(["status", "--socket", state.socket.to_str().unwrap(), "--pin-dir", state.pin_dir.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let line = said.lines().find(|l| l.contains("memory: resident")).unwrap_or_else(|| panic!("{said}"));
    assert!(line.contains("the rings mapped from the kernel") && line.contains("state ") && line.contains("unattributed "), "{line}");
    let caches = said.lines().find(|l| l.contains("caches (entries/most):")).unwrap_or_else(|| panic!("{said}"));
    assert!(caches.contains("/65536") && caches.contains("unwind_tables "), "{caches}");
    let maps = said.lines().find(|l| l.contains("kernel maps:")).unwrap_or_else(|| panic!("{said}"));
    assert!(maps.contains(&format!("EVENTS {events_mib}.")), "{maps}");
    let rings = said.lines().find(|l| l.contains("rings: events")).unwrap_or_else(|| panic!("{said}"));
    let sizes = format!("events {events_mib}.0 MiB (for {cpus} online CPUs, ×8 for a debug build), stacks 8.0 MiB (by --stack-ring-bytes)");
    assert!(rings.contains(&sizes), "{rings}");
    let _ = child.kill();
    let _ = child.wait();
    let (status, _) = serve.stop();
    assert!(status.success());
}
