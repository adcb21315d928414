//! The JSON object an action gets on stdin and a webhook in its body: one
//! trigger with who it concerns (process, container, pod, GPU) and the
//! process's top stacks where there are some.
use serde::Serialize;

use gpumem_engine::{
    analysis::{leaks, triggers::Trigger, view::Workload},
    clock,
    pipeline::Pipeline,
};

/// Top stacks an event carries.
const TOP_STACKS: usize = 3;

#[derive(Clone, Debug, Serialize)]
pub struct Gpu {
    pub index: i32,
    #[serde(rename = "UUID", skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stack {
    pub bytes: u64,
    pub allocations: u64,
    /// Unbiased estimates (the stack was sampled), not exact counts.
    pub estimated: bool,
    /// Innermost first: `function+0x1c (file.c:42) [module]`.
    pub frames: Vec<String>,
    /// The group's own growth verdict (`leak`, `plateau`, ...), where it is tracked.
    pub verdict: Option<&'static str>,
}

/// What an action is told.
#[derive(Clone, Debug, Serialize)]
pub struct ActionEvent {
    pub event: &'static str,
    /// RFC 3339, UTC.
    pub time: String,
    pub time_unix_ns: u64,
    pub node: String,
    pub summary: String,
    pub gpu: Option<Gpu>,
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub container: Option<String>,
    /// The pod's name where its container shows it, else its UID.
    pub pod: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub namespace: Option<String>,
    pub bytes: Option<u64>,
    pub details: serde_json::Value,
    pub stacks: Vec<Stack>,
    /// The flight recorder's recording of the moments before, where one was written.
    pub recording: Option<String>,
}

impl ActionEvent {
    /// The trigger with what the pipeline knows of its process and GPU.
    pub fn of(t: &Trigger, p: &mut Pipeline, node: &str) -> ActionEvent {
        let unix = clock::unix_ns_of(t.ts_ns);
        let gpu = t.device.map(|index| {
            let nvml = p.gpus.latest.iter().find(|g| g.index as i32 == index);
            Gpu { index, uuid: nvml.map(|g| g.uuid.clone()), pci_bus_id: nvml.map(|g| g.pci_bus_id.clone()) }
        });
        let process = t.pid.and_then(|pid| p.state.processes.get(&pid));
        let container = process.and_then(|p| p.container.as_ref());
        let workload = Workload::of(container);
        let stacks = match (process, t.device) {
            (Some(proc), Some(device)) => {
                // All of them: the leaking groups come first, then the largest.
                let mut groups = leaks::top_stacks(proc, device, &mut p.stacks, &mut p.growth, usize::MAX, t.ts_ns);
                groups.sort_by_key(|g| !g.verdict.as_ref().is_some_and(|v| v.leaking));
                groups
                    .into_iter()
                    .take(TOP_STACKS)
                    .map(|g| Stack {
                        bytes: g.bytes,
                        allocations: g.count,
                        estimated: g.estimated,
                        frames: g.frames.iter().map(|f| f.display()).collect(),
                        verdict: g.verdict.map(|v| v.verdict.name()),
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        ActionEvent {
            event: t.kind.name(),
            time: clock::rfc3339(unix),
            time_unix_ns: unix,
            node: node.to_string(),
            summary: t.summary.clone(),
            gpu,
            pid: t.pid,
            comm: process.map(|p| p.comm.clone()),
            container: workload.container,
            pod: workload.pod,
            pod_name: container.and_then(|c| c.pod_name.clone()),
            pod_uid: container.and_then(|c| c.pod_uid.clone()),
            namespace: workload.namespace,
            bytes: t.bytes,
            details: t.details.clone(),
            stacks,
            recording: None,
        }
    }
}
