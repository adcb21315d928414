//! `gpumem kube`'s options: which change, and how to reach the API server.
use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct KubeArgs {
    #[command(subcommand)]
    pub action: KubeAction,
    /// The API server (default: the in-cluster one, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
    #[arg(long, value_name = "URL", global = true)]
    pub api_server: Option<String>,
    /// The bearer token (default: the pod's service account token).
    #[arg(long, value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
    /// The CA the API server's certificate is checked against (default: the service account's ca.crt).
    #[arg(long, value_name = "PATH", global = true)]
    pub ca_file: Option<PathBuf>,
    /// The node to cordon or taint (default: the event's `node`, NODE_NAME in the DaemonSet).
    #[arg(long, value_name = "NAME", global = true)]
    pub node: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum KubeAction {
    /// Mark the node unschedulable, with the event's summary as the reason (an annotation).
    Cordon,
    /// Taint the node KEY=<the event's GPU UUID>:EFFECT (once).
    Taint {
        #[arg(long, default_value = "gpumem.io/gpu-unhealthy")]
        key: String,
        #[arg(long, default_value = "NoSchedule", value_parser = ["NoSchedule", "PreferNoSchedule", "NoExecute"])]
        effect: String,
    },
    /// Delete the pod of the event's process (only that pod: its UID is a precondition), so that its controller recreates it.
    DeletePod,
}
