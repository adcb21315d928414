//! `gpumem kube cordon|taint|delete-pod`: isolation done the Kubernetes way,
//! as `serve --action` commands. Each reads the action's event (JSON on
//! stdin) and makes one change through the API with the pod's service
//! account: cordon the node, taint it `gpumem.io/gpu-unhealthy=<GPU
//! UUID>:NoSchedule` (the scheduler then keeps new pods off it; a device
//! plugin or operator can act on the taint per GPU), or delete the pod of
//! the process the event names, so that its controller recreates it.
use std::{io::Read as _, process::ExitCode};

use anyhow::{bail, Context as _, Result};
use hyper::Method;
use serde_json::{json, Value};

use crate::{
    cli::kube::{KubeAction, KubeArgs},
    kube::{Answer, Client},
};

/// Tries of a taint when the node changed under it (its resourceVersion).
const TAINT_TRIES: u32 = 3;

pub fn run(args: KubeArgs) -> Result<ExitCode> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the event from stdin")?;
    let event: Value = serde_json::from_str(&text).context("stdin is not the JSON event of a gpumem action")?;
    let client = Client::new(args.api_server.as_deref(), args.token_file.as_deref(), args.ca_file.as_deref())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let said = rt.block_on(async {
        match &args.action {
            KubeAction::Cordon => cordon(&client, &node(&args, &event)?, &event).await,
            KubeAction::Taint { key, effect } => taint(&client, &node(&args, &event)?, key, effect, &event).await,
            KubeAction::DeletePod => delete_pod(&client, &event).await,
        }
    })?;
    eprintln!("gpumem kube: {said}");
    Ok(ExitCode::SUCCESS)
}

fn node(args: &KubeArgs, event: &Value) -> Result<String> {
    match args.node.clone().or_else(|| event["node"].as_str().filter(|n| !n.is_empty()).map(str::to_string)) {
        Some(n) => Ok(n),
        None => bail!("the event names no node (set NODE_NAME in the agent's pod, or pass --node)"),
    }
}

/// A non-success answer as an error naming what was asked.
fn check(what: &str, a: Answer) -> Result<Answer> {
    if (200..300).contains(&a.status) {
        return Ok(a);
    }
    let why = serde_json::from_slice::<Value>(&a.body).ok().and_then(|v| v["message"].as_str().map(str::to_string));
    bail!("{what}: the API server answered {}: {}", a.status, why.unwrap_or_else(|| String::from_utf8_lossy(&a.body).into_owned()))
}

async fn cordon(c: &Client, node: &str, event: &Value) -> Result<String> {
    let reason = event["summary"].as_str().unwrap_or("gpumem");
    let patch = json!({"metadata": {"annotations": {"gpumem.io/cordon-reason": reason}}, "spec": {"unschedulable": true}});
    let path = format!("/api/v1/nodes/{node}");
    check(
        &format!("cordoning {node}"),
        c.request(Method::PATCH, &path, Some("application/merge-patch+json"), patch.to_string().into_bytes()).await?,
    )?;
    Ok(format!("cordoned node {node}: {reason}"))
}

async fn taint(c: &Client, node: &str, key: &str, effect: &str, event: &Value) -> Result<String> {
    let Some(uuid) = event["gpu"]["UUID"].as_str() else {
        bail!("the event names no GPU UUID (NVML is not read, or the event is not about one GPU): nothing to taint for")
    };
    let taint = json!({"key": key, "value": uuid, "effect": effect});
    let path = format!("/api/v1/nodes/{node}");
    for _ in 0..TAINT_TRIES {
        let n = check(&format!("reading node {node}"), c.request(Method::GET, &path, None, Vec::new()).await?)?.json()?;
        let taints = n["spec"]["taints"].as_array();
        if taints.is_some_and(|t| t.iter().any(|t| t["key"] == key && t["value"] == uuid && t["effect"] == effect)) {
            return Ok(format!("node {node} is already tainted {key}={uuid}:{effect}"));
        }
        let version = n["metadata"]["resourceVersion"].clone();
        // Added only if the node is still the one read: taints are a list the patch appends to.
        let add = match taints {
            Some(_) => json!({"op": "add", "path": "/spec/taints/-", "value": taint}),
            None => json!({"op": "add", "path": "/spec/taints", "value": [taint]}),
        };
        let patch = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": version}, add]);
        let a = c.request(Method::PATCH, &path, Some("application/json-patch+json"), patch.to_string().into_bytes()).await?;
        if a.status == 409 || a.status == 422 {
            continue; // the node changed since it was read: read it again
        }
        check(&format!("tainting {node}"), a)?;
        return Ok(format!("tainted node {node} {key}={uuid}:{effect}"));
    }
    bail!("tainting {node}: the node kept changing ({TAINT_TRIES} tries)")
}

async fn delete_pod(c: &Client, event: &Value) -> Result<String> {
    let (Some(ns), Some(pod)) = (event["namespace"].as_str(), event["pod_name"].as_str()) else {
        bail!("the event names no pod by namespace and name (the process is not in a pod, or its container does not show them)")
    };
    // Only that pod: not one recreated under the same name since.
    let body = match event["pod_uid"].as_str() {
        Some(uid) => json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}),
        None => json!({"apiVersion": "v1", "kind": "DeleteOptions"}),
    };
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}");
    check(
        &format!("deleting pod {ns}/{pod}"),
        c.request(Method::DELETE, &path, Some("application/json"), body.to_string().into_bytes()).await?,
    )?;
    Ok(format!("deleted pod {ns}/{pod}: {}", event["summary"].as_str().unwrap_or("")))
}
