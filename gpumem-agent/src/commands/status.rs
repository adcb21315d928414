//! `gpumem status`: kernel features, libcuda copies, probes attached or skipped.
use std::io::Write;

use anyhow::Result;
use gpumem_engine::query::Query;
use serde_json::json;

use crate::{
    cli::StatusArgs,
    probes::{features, pin, ProbeSet},
    runtime,
};

pub fn run(args: StatusArgs) -> Result<()> {
    runtime::require_privileges(crate::privileges::Role::Probing)?;
    let daemon: Option<serde_json::Value> = args.daemon.daemon().ask_typed(&Query::Status)?;
    let pinned = pin::inspect(&args.daemon.pin_dir);
    let probing = args.probes.probing();
    let mut notes = Vec::new();
    // It attaches to say what attaches and reads no event: a page of ring.
    let ring = gpumem_engine::model::agent::RingSize { bytes: 4096, sizing: gpumem_engine::model::agent::RingSizing::Flag };
    let mut agent = runtime::load(&probing, false, ProbeSet::Full, ring)?;
    // Features after load: loading mounts tracefs when it can.
    let features = features::detect();
    runtime::attach_given(&mut agent, &probing, |m| notes.push(m))?;
    runtime::attach_discovered(&mut agent, &probing, true, |m| notes.push(m));
    notes.splice(0..0, agent.notes.iter().cloned());

    // NVML is optional: say whether it is there, keep going either way.
    let nvml = match &probing.nvml {
        None => "not used (--no-nvml)".to_string(),
        Some(lib) => match crate::nvml::Sampler::open(lib.path()) {
            Ok(mut s) => match s.sample(0.0) {
                Ok(gpus) => format!("available, {} GPU(s){}", gpus.len(), addressing(&gpus)),
                Err(e) => format!("{e}"),
            },
            Err(e) => format!("{e}; `gpumem health` needs it, tracing does not"),
        },
    };
    let mut libraries: Vec<(&'static str, std::path::PathBuf)> =
        agent.libraries.iter().map(|l| ("libcuda", std::path::PathBuf::from(&l.path))).collect();
    if let Some(path) = probing.nvml.as_ref().and_then(|l| crate::driver::nvml_path(l.path())) {
        libraries.push(("NVML", path));
    }
    let driver = crate::driver::Versions::read(&args.driver_version_file, libraries);
    // GPU memory limits per container: cgroup v2's dmem controller where the kernel has it.
    let gpu_limits = match gpumem_engine::pipeline::dmem::availability() {
        Ok(()) => "dmem: cgroup v2 dmem controller available (usage and limits read per traced process's cgroup, where its driver registers regions)".to_string(),
        Err(why) => format!("dmem: {why}; limits set through NVML or MPS are not read"),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = json!({
            "kernel": features,
            "tracepoints": agent.tracepoints,
            "ioctl": agent.ioctl,
            "uprobe_links": agent.uprobe_links,
            "arm64_uprobe_gate": agent.arm64_gate(),
            "discovery": runtime::discovery::report(&agent),
            "nvml": nvml,
            "gpu_memory_limits": gpu_limits,
            "driver": driver,
            "driver_mismatch": driver.mismatch_message(),
            "libraries": agent.libraries,
            "pytorch": agent.torch,
            "notes": notes,
            "daemon": daemon,
            "pinned": pinned,
        });
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
        out.flush()?;
        agent.detach_in_background();
        return Ok(());
    }
    crate::commands::status_text::write_human(&mut out, &features, &agent, &runtime::discovery::report(&agent), &nvml, &notes)?;
    writeln!(out, "GPU memory limits: {gpu_limits}")?;
    crate::commands::status_text::write_driver(&mut out, &driver)?;
    crate::commands::status_text::write_continuity(&mut out, daemon.as_ref(), &pinned)?;
    out.flush()?;
    agent.detach_in_background();
    Ok(())
}

/// Each GPU's addressing mode, where the driver says it (NVML 570+): under
/// HMM or ATS (Grace Hopper and Blackwell hosts) the GPU reaches host memory
/// from malloc or mmap, which no driver call allocates.
fn addressing(gpus: &[gpumem_engine::model::nvml::GpuSample]) -> String {
    if gpus.iter().all(|g| g.addressing_mode.is_none() && g.numa_node.is_none()) {
        return String::new();
    }
    let each: Vec<String> = gpus
        .iter()
        .map(|g| {
            let node = g.numa_node.map(|n| format!(" (its memory is NUMA node {n})")).unwrap_or_default();
            format!("GPU {} {}{node}", g.index, g.addressing_mode.unwrap_or("not said"))
        })
        .collect();
    let mut why = Vec::new();
    if gpus.iter().any(|g| g.reaches_host_memory()) {
        why.push("host memory the GPU reaches under hmm or ats is not in the per-process figures");
    }
    if gpus.iter().any(|g| g.numa_node.is_some()) {
        why.push("each process's pages on a GPU's node are in gpumem_process_gpu_node_resident_bytes");
    }
    let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) };
    format!("; addressing: {}{why}", each.join(", "))
}
