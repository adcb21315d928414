//! `gpumem kube cordon|taint|delete-pod`, the isolation actions, against a
//! local HTTP server standing in for the Kubernetes API server (none runs
//! here) that checks each request: method, path, bearer token, content type
//! and body as the API expects them; the taint's optimistic concurrency
//! (a 409 reads the node again); HTTPS verified against a CA file (a
//! Python TLS server with a certificate made by openssl); and the chain from
//! `serve --action health=…` to the API request.
use std::{io::Write as _, process::Stdio};

use gpumem_tests::*;
use serde_json::{json, Value};

const NODE: &str = "gpu-node-7";
const UUID: &str = "GPU-00000000-0000-0000-0000-000000000001";

fn event() -> Value {
    json!({
        "event": "health", "node": NODE, "summary": "GPU 1 health critical (score 25): page retirement pending",
        "gpu": {"index": 1, "UUID": UUID}, "pid": 4242, "namespace": NAMESPACE, "pod": POD_NAME,
        "pod_name": POD_NAME, "pod_uid": POD_UID,
    })
}

fn token() -> std::path::PathBuf {
    let t = target_dir().join("kube-token");
    std::fs::write(&t, "s3cr3t-service-account-token\n").unwrap();
    t
}

/// `gpumem kube ARGS` with the event on stdin: (success, stderr).
fn kube(args: &[&str], event: &Value) -> (bool, String) {
    let mut child =
        std::process::Command::new(gpumem_bin()).arg("kube").args(args).stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(event.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn node_json(version: &str) -> String {
    json!({"kind": "Node", "metadata": {"name": NODE, "resourceVersion": version}, "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}).to_string()
}

fn authorized(r: &Received) {
    assert_eq!(r.header("authorization"), Some("Bearer s3cr3t-service-account-token"), "{r:?}");
}

#[test]
fn taint_reads_the_node_and_appends_its_taint_only_if_the_node_did_not_change() {
    // The first PATCH finds the node changed (409): it is read again, then patched.
    let api = Receiver::answering(Box::new(|r, before| match (r.method.as_str(), before) {
        ("GET", 0) => (200, node_json("4711")),
        ("PATCH", 1) => (409, json!({"kind": "Status", "message": "the object has been modified"}).to_string()),
        ("GET", _) => (200, node_json("4712")),
        _ => (200, "{}".into()),
    }));
    let t = token();
    let (ok, said) = kube(&["taint", "--api-server", &api.url(""), "--token-file", t.to_str().unwrap()], &event());
    assert!(ok, "{said}");
    assert!(said.contains(&format!("tainted node {NODE} gpumem.io/gpu-unhealthy={UUID}:NoSchedule")), "{said}");
    let got = api.all();
    let asked: Vec<(&str, &str)> = got.iter().map(|r| (r.method.as_str(), r.path.as_str())).collect();
    let path = format!("/api/v1/nodes/{NODE}");
    assert_eq!(asked, [("GET", path.as_str()), ("PATCH", path.as_str()), ("GET", path.as_str()), ("PATCH", path.as_str())]);
    for r in &got {
        authorized(r);
    }
    let patch = &got[3];
    assert_eq!(patch.header("content-type"), Some("application/json-patch+json"));
    assert_eq!(
        patch.json(),
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "4712"},
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "gpumem.io/gpu-unhealthy", "value": UUID, "effect": "NoSchedule"}}
        ])
    );
    // A node already tainted so is left alone.
    let tainted = json!({"metadata": {"name": NODE, "resourceVersion": "9"}, "spec": {"taints": [{"key": "gpumem.io/gpu-unhealthy", "value": UUID, "effect": "NoSchedule"}]}}).to_string();
    let api = Receiver::answering(Box::new(move |_, _| (200, tainted.clone())));
    let (ok, said) = kube(&["taint", "--api-server", &api.url(""), "--token-file", t.to_str().unwrap()], &event());
    assert!(ok && said.contains("already tainted"), "{said}");
    assert_eq!(api.all().len(), 1, "no PATCH");
    // Refused (RBAC off): the API server's message, and a failure.
    let api =
        Receiver::answering(Box::new(|_, _| (403, json!({"kind": "Status", "message": "nodes \"gpu-node-7\" is forbidden"}).to_string())));
    let (ok, said) = kube(&["taint", "--api-server", &api.url(""), "--token-file", t.to_str().unwrap()], &event());
    assert!(!ok && said.contains("answered 403: nodes \"gpu-node-7\" is forbidden"), "{said}");
}

#[test]
fn cordon_and_delete_pod_make_the_requests_the_api_expects() {
    let api = Receiver::answering(Box::new(|_, _| (200, "{}".into())));
    let t = token();
    let (ok, said) = kube(&["cordon", "--api-server", &api.url(""), "--token-file", t.to_str().unwrap()], &event());
    assert!(ok, "{said}");
    let (ok, said) = kube(&["delete-pod", "--api-server", &api.url(""), "--token-file", t.to_str().unwrap()], &event());
    assert!(ok, "{said}");
    let got = api.all();
    assert_eq!((got[0].method.as_str(), got[0].path.as_str()), ("PATCH", format!("/api/v1/nodes/{NODE}").as_str()));
    assert_eq!(got[0].header("content-type"), Some("application/merge-patch+json"));
    assert_eq!(
        got[0].json(),
        json!({"metadata": {"annotations": {"gpumem.io/cordon-reason": event()["summary"]}}, "spec": {"unschedulable": true}})
    );
    assert_eq!(
        (got[1].method.as_str(), got[1].path.as_str()),
        ("DELETE", format!("/api/v1/namespaces/{NAMESPACE}/pods/{POD_NAME}").as_str())
    );
    assert_eq!(got[1].json(), json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": POD_UID}}));
    for r in &got {
        authorized(r);
    }
    // An event without a pod: said, nothing sent.
    let mut no_pod = event();
    no_pod["pod_name"] = Value::Null;
    let (ok, said) = kube(&["delete-pod", "--api-server", &api.url(""), "--token-file", t.to_str().unwrap()], &no_pod);
    assert!(!ok && said.contains("names no pod"), "{said}");
    assert_eq!(api.all().len(), 2);
}

/// A TLS API server (Python's http.server behind ssl, a certificate for
/// 127.0.0.1 made by openssl): verified against --ca-file, refused against another CA.
#[test]
fn https_to_the_api_server_is_verified_against_its_ca() {
    let dir = target_dir().join("kube-tls");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A cluster's CA, the API server's certificate it signs, and another CA.
    let openssl = |args: &[&str]| {
        let (ok, _, err) = command_output(std::process::Command::new("openssl").args(args).current_dir(&dir));
        assert!(ok, "openssl {args:?}: {err}");
    };
    for ca in ["ca", "other"] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
        ]);
    }
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver", "-keyout", "server.key", "-out", "server.csr"]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
    let server = r#"
import http.server, json, ssl, sys
log = open(sys.argv[2], "a")
class H(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        n = int(self.headers.get("Content-Length") or 0)
        sent = self.rfile.read(n).decode()
        log.write(json.dumps([self.command, self.path, self.headers.get("Authorization"), sent]) + "\n"); log.flush()
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self.answer({"metadata": {"name": "gpu-node-7", "resourceVersion": "1"}, "spec": {}})
    def do_PATCH(self): self.answer({})
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[1] + ".crt", sys.argv[1] + ".key")
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;
    let script = dir.join("api.py");
    std::fs::write(&script, server).unwrap();
    let log = dir.join("requests.jsonl");
    let mut py =
        std::process::Command::new("python3").arg(&script).arg(dir.join("server")).arg(&log).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(py.stdout.take().unwrap()), &mut line).unwrap();
    let url = format!("https://127.0.0.1:{}", line.trim());
    let t = token();
    let ca = dir.join("ca.crt");
    let (ok, said) =
        kube(&["taint", "--api-server", &url, "--token-file", t.to_str().unwrap(), "--ca-file", ca.to_str().unwrap()], &event());
    let other = dir.join("other.crt");
    let (refused, why) =
        kube(&["taint", "--api-server", &url, "--token-file", t.to_str().unwrap(), "--ca-file", other.to_str().unwrap()], &event());
    let _ = py.kill();
    let _ = py.wait();
    assert!(ok, "{said}");
    let requests: Vec<Value> = std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[1][0], "PATCH");
    assert_eq!(requests[1][2], "Bearer s3cr3t-service-account-token");
    let patch: Value = serde_json::from_str(requests[1][3].as_str().unwrap()).unwrap();
    assert_eq!(
        patch[1],
        json!({"op": "add", "path": "/spec/taints", "value": [{"key": "gpumem.io/gpu-unhealthy", "value": UUID, "effect": "NoSchedule"}]})
    );
    assert!(!refused && why.contains("TLS with the API server"), "another CA is refused: {why}");
}

/// `serve --action health='gpumem kube taint …'`: the synthetic NVML's GPU 1
/// is critical (a retirement pending) from the first readings, and the node
/// (NODE_NAME, as the DaemonSet sets it) is tainted for that GPU.
#[test]
fn a_gpu_turning_critical_taints_the_node_through_serve() {
    require_root();
    let f = fixtures();
    let api = Receiver::answering(Box::new(|r, _| if r.method == "GET" { (200, node_json("7")) } else { (200, "{}".into()) }));
    let t = token();
    let hook = format!("health={} kube taint --api-server {} --token-file {}", gpumem_bin().display(), api.url(""), t.display());
    let serve = Serve::start(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1", "--action", &hook],
        &[("NODE_NAME", NODE)],
    );
    let patch = poll(20, "the taint's PATCH", || api.all().into_iter().find(|r| r.method == "PATCH"), || serve.metrics());
    assert_eq!(patch.path, format!("/api/v1/nodes/{NODE}"));
    assert_eq!(patch.json()[1]["value"], json!({"key": "gpumem.io/gpu-unhealthy", "value": UUID, "effect": "NoSchedule"}));
    poll(
        10,
        "the action counted",
        || Some(serve.metrics()).filter(|m| m.contains("gpumem_actions_total{event=\"health\",outcome=\"ok\"} 1")),
        || serve.metrics(),
    );
    serve.stop();
}
