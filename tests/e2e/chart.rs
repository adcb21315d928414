//! The Helm chart (deploy/helm/gpumem): `helm lint --strict` and `helm
//! template` (helm 4) pass, every object rendered with every option on
//! validates against the Kubernetes 1.30–1.34 schemas with
//! `kubernetes-validate --strict` (the prometheus-operator custom resources
//! have no schema there: the PrometheusRule's rules go through `promtool
//! check rules` instead), the chart's rules and dashboard are
//! deploy/prometheus's and deploy/grafana's, and the plain manifest is the
//! chart's defaults rendered (`cargo xtask manifests`), so the two cannot drift.
use std::process::Command;

use gpumem_tests::*;

/// Success, and stdout and stderr together.
fn output(cmd: &mut Command) -> (bool, String) {
    let (ok, out, err) = command_output(cmd);
    (ok, format!("{out}{err}"))
}

fn helm(args: &[&str]) -> String {
    let (ok, out) = output(Command::new(gpumem_tests::helm()).args(args).current_dir(workspace()));
    assert!(ok, "helm {args:?}:\n{out}");
    out
}

/// Every option on: what the validation sees.
const ALL_ON: &str = "createNamespace=true,serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true,\
    serve.otlpEndpoint=http://otel-collector.monitoring:4318/v1/metrics,isolation.enabled=true,isolation.cordon=true,isolation.deleteLeakingPods=true";

fn documents(yaml: &str) -> Vec<serde_yaml_ng::Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("well-formed YAML"))
        .filter(|v: &serde_yaml_ng::Value| !v.is_null())
        .collect()
}

#[test]
fn the_chart_lints_renders_and_validates_for_kubernetes_1_30_to_1_34() {
    let lint = helm(&["lint", "--strict", "deploy/helm/gpumem"]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    let rendered = helm(&["template", "gpumem", "deploy/helm/gpumem", "--namespace", "monitoring", "--set", ALL_ON]);
    let docs = documents(&rendered);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ConfigMap",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "DaemonSet",
            "PrometheusRule",
            "ServiceMonitor"
        ],
        "{rendered}"
    );
    let dir = target_dir().join("chart");
    std::fs::create_dir_all(&dir).unwrap();
    let core = dir.join("core.yaml");
    let core_docs: Vec<String> = docs
        .iter()
        .filter(|d| !d["apiVersion"].as_str().unwrap().starts_with("monitoring.coreos.com/"))
        .map(|d| serde_yaml_ng::to_string(d).unwrap())
        .collect();
    std::fs::write(&core, core_docs.join("---\n")).unwrap();
    for minor in 30..=34 {
        let version = format!("1.{minor}.0");
        let (ok, out) = output(Command::new(kubernetes_validate()).args(["--strict", "-k", &version]).arg(&core));
        assert!(ok, "Kubernetes {version}:\n{out}");
        assert_eq!(out.matches("passed for resource").count(), 7, "{version}: {out}");
    }
    // The validator does refuse what is wrong: an unknown field in the pod spec.
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, core_docs.join("---\n").replace("hostPID: true", "hostPID: true\n      hostPIDs: true")).unwrap();
    let (ok, out) = output(Command::new(kubernetes_validate()).args(["--strict", "-k", "1.34.0"]).arg(&broken));
    assert!(!ok && out.contains("hostPIDs"), "{out}");

    // The PrometheusRule carries the rules promtool tests (deploy/prometheus).
    let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, serde_yaml_ng::to_string(&rule["spec"]).unwrap()).unwrap();
    let (ok, out) = output(Command::new("promtool").args(["check", "rules"]).arg(&rules));
    assert!(ok, "{out}");
    let deployed: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(workspace().join("deploy/prometheus/gpumem-rules.yaml")).unwrap()).unwrap();
    assert_eq!(rule["spec"], deployed, "the chart's rules are deploy/prometheus's");
    // The dashboard ConfigMap, for the Grafana sidecar, is deploy/grafana's.
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = cm["data"]["gpumem-dashboard.json"].as_str().unwrap();
    let ours: serde_json::Value = serde_json::from_str(json).unwrap();
    let deployed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace().join("deploy/grafana/gpumem-dashboard.json")).unwrap()).unwrap();
    assert_eq!(ours, deployed, "the chart's dashboard is deploy/grafana's");
    // The ServiceMonitor scrapes the Service's port, in the release's namespace.
    let sm = docs.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
    let svc = docs.iter().find(|d| d["kind"] == "Service").unwrap();
    assert_eq!(sm["spec"]["endpoints"][0]["port"], svc["spec"]["ports"][0]["name"]);
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], "monitoring");
    assert_eq!(sm["spec"]["selector"]["matchLabels"], svc["spec"]["selector"]);
    // The agent's arguments, OTLP included, are ones the CLI accepts.
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let args: Vec<&str> =
        ds["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.iter().any(|a| a.starts_with("--otlp-endpoint=http://")), "{args:?}");
    // Isolation: the agent's own service account, bound to exactly the verbs turned on.
    assert!(args.contains(&"--action=health=gpumem kube taint") && args.contains(&"--action=leak=gpumem kube delete-pod"), "{args:?}");
    assert_eq!(ds["spec"]["template"]["spec"]["serviceAccountName"], "gpumem");
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let rules: Vec<(String, Vec<String>)> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            let words =
                |v: &serde_yaml_ng::Value| v.as_sequence().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect::<Vec<_>>();
            (words(&r["resources"]).join(","), words(&r["verbs"]))
        })
        .collect();
    assert_eq!(
        rules,
        [("nodes".to_string(), vec!["get".to_string(), "patch".to_string()]), ("pods".to_string(), vec!["delete".to_string()])]
    );
    let (ok, out) = output(Command::new(gpumem_bin()).args(&args).arg("--help"));
    assert!(ok, "gpumem {args:?}: {out}");
}

/// Uninstall mode (`--set cleanupNodes=true`) renders a valid DaemonSet
/// whose pods clean the node and wait, mounting what the cleanup removes
/// even with continuity off (tests/tests/image.rs runs it from the image).
#[test]
fn the_uninstall_mode_renders_and_validates() {
    let rendered = helm(&["template", "gpumem", "deploy/helm/gpumem", "--set", "cleanupNodes=true,continuity.enabled=false"]);
    let ds = documents(&rendered).into_iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args, ["serve", "--cleanup", "--then-wait", "--pin-dir=/sys/fs/bpf/gpumem", "--state-dir=/var/lib/gpumem"]);
    let mounts: Vec<&str> = c["volumeMounts"].as_sequence().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(mounts, ["tracefs", "bpffs", "state", "run"]);
    let (ok, out) = output(Command::new(gpumem_bin()).args(&args).arg("--help"));
    assert!(ok, "gpumem {args:?}: {out}");
    let file = target_dir().join("chart-uninstall.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&ds).unwrap()).unwrap();
    let (ok, out) = output(Command::new(kubernetes_validate()).args(["--strict", "-k", "1.34.0"]).arg(&file));
    assert!(ok, "{out}");
    let notes = helm(&["install", "gpumem", "deploy/helm/gpumem", "--dry-run=client", "--set", "cleanupNodes=true"]);
    assert!(notes.contains("rollout status ds/gpumem"), "{notes}");
}

#[test]
fn the_plain_manifest_is_the_chart_rendered() {
    let rendered = helm(PLAIN_MANIFEST_HELM_ARGS);
    let on_disk = std::fs::read_to_string(workspace().join(PLAIN_MANIFEST)).unwrap();
    assert!(
        on_disk == format!("{PLAIN_MANIFEST_HEADER}{rendered}"),
        "{PLAIN_MANIFEST} is not the chart's rendering: run `cargo xtask manifests` after changing the chart"
    );
    // Without continuity the pod mounts nothing writable from the host.
    let unpinned = helm(&["template", "gpumem", "deploy/helm/gpumem", "--set", "continuity.enabled=false"]);
    let ds = documents(&unpinned).into_iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert!(c["args"].as_sequence().unwrap().iter().any(|a| a == "--no-pin"));
    assert_eq!(c["volumeMounts"].as_sequence().unwrap().len(), 1, "tracefs only: {c:?}");
}

#[test]
fn the_chart_files_are_the_deployed_ones() {
    for (chart, deployed) in [
        ("files/gpumem-rules.yaml", "deploy/prometheus/gpumem-rules.yaml"),
        ("files/gpumem-dashboard.json", "deploy/grafana/gpumem-dashboard.json"),
    ] {
        let a = std::fs::read(workspace().join("deploy/helm/gpumem").join(chart)).unwrap();
        let b = std::fs::read(workspace().join(deployed)).unwrap();
        assert!(a == b, "deploy/helm/gpumem/{chart} differs from {deployed}: copy it");
    }
}
