//! `gpumem status`: kernel features, libcuda copies, probes attached or skipped.
use std::io::Write as _;

use anyhow::Result;
use serde_json::json;

use super::{
    load_agent,attach_discovered, attach_given, require_privileges};
use crate::{
    cli::StatusArgs,
    probes::{features, ProbeSet, ProbeStatus},
};

pub fn run(args: StatusArgs) -> Result<()> {
    require_privileges()?;
    let mut notes = Vec::new();
    let mut agent = load_agent(&args.probes, false, ProbeSet::Full, gpumem_common::RINGBUF_BYTES)?;
    // Features after load: loading mounts tracefs when it can.
    let features = features::detect();
    attach_given(&mut agent, &args.probes, |m| notes.push(m))?;
    attach_discovered(&mut agent, &args.probes, true, |m| notes.push(m));
    notes.splice(0..0, agent.notes.iter().cloned());

    // NVML is optional: say whether it is there, keep going either way.
    let nvml = match crate::nvml::Sampler::open(args.probes.nvml.as_deref().map(|p| p.as_os_str())) {
        Ok(mut s) => match s.sample(0.0) {
            Ok(gpus) => format!("available, {} GPU(s)", gpus.len()),
            Err(e) => format!("{e}"),
        },
        Err(e) => format!("{e}; `gpumem health` needs it, tracing does not"),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = json!({
            "kernel": features,
            "tracepoints": agent.tracepoints,
            "ioctl": agent.ioctl,
            "nvml": nvml,
            "libraries": agent.libraries,
            "notes": notes,
        });
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
        out.flush()?;
        agent.detach_in_background();
        return Ok(());
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    writeln!(out, "kernel {}", features.release)?;
    writeln!(out, "  uprobes/uretprobes  {}", yes(features.uprobes))?;
    writeln!(out, "  kprobes             {}{}", yes(features.kprobes), if features.kprobes { "" } else { " (tracepoints are used instead)" })?;
    writeln!(out, "  tracepoints         {}", yes(features.tracepoints))?;
    writeln!(out, "  ring buffer         {}", yes(features.ring_buffer))?;
    writeln!(out, "  BTF                 {}", yes(features.btf))?;
    writeln!(out, "tracepoints")?;
    for t in &agent.tracepoints {
        match &t.error {
            None => writeln!(out, "  {:<28} attached", t.tracepoint)?,
            Some(e) => writeln!(out, "  {:<28} NOT attached: {e}", t.tracepoint)?,
        }
    }
    let io = &agent.ioctl;
    let path = match io.path {
        crate::probes::ioctl::IoctlPath::Kprobes => "kprobes",
        crate::probes::ioctl::IoctlPath::Tracepoints => "tracepoints",
        crate::probes::ioctl::IoctlPath::Off => "off",
    };
    writeln!(out, "NVIDIA ioctls: {path} — {}", io.why)?;
    writeln!(out, "  device nodes {}*, {} descriptor(s) open before start seeded from /proc", io.prefix, io.seeded_fds)?;
    if let Some(e) = &io.error {
        writeln!(out, "  NOT attached: {e}")?;
    }
    writeln!(out, "NVML: {nvml}")?;
    if agent.libraries.is_empty() {
        writeln!(out, "libcuda: none found (not in ld.so.cache, not loaded by any process); give one with --libcuda PATH")?;
    }
    for lib in &agent.libraries {
        writeln!(out, "libcuda {} (inode {}, dev {:#x}, found by {})", lib.path, lib.inode, lib.dev, lib.source)?;
        if let Some(e) = &lib.error {
            writeln!(out, "  not attached: {e}")?;
            continue;
        }
        writeln!(out, "  {} of {} probes attached", lib.attached(), lib.probes.len())?;
        for p in &lib.probes {
            let what = match &p.status {
                ProbeStatus::Attached => "attached (uprobe + uretprobe)".to_string(),
                ProbeStatus::NotExported { required: true } => "skipped: not exported by this library".to_string(),
                ProbeStatus::NotExported { required: false } => "skipped: not exported (newer drivers only)".to_string(),
                ProbeStatus::Failed { error } => format!("FAILED: {error}"),
            };
            writeln!(out, "  {:<30} {what}", p.symbol)?;
        }
    }
    for n in &notes {
        writeln!(out, "note: {n}")?;
    }
    out.flush()?;
    agent.detach_in_background();
    Ok(())
}
