//! `gpumem status` for people: kernel features, tracepoints, the ioctl
//! path, NVML, every libcuda found and every probe attached or skipped.
use gpumem_engine::model::agent::{RingSizing, Rings, DEBUG_BUILD_ROOM};
use std::io::Write;

use crate::{
    probes::{features, Agent, ProbeStatus},
    runtime::discovery::DiscoveryReport,
};

pub fn write_human(
    out: &mut impl Write,
    features: &features::KernelFeatures,
    agent: &Agent,
    discovery: &DiscoveryReport,
    nvml: &str,
    notes: &[String],
) -> std::io::Result<()> {
    let yes = |b: bool| if b { "yes" } else { "no" };
    writeln!(out, "kernel {}", features.release)?;
    writeln!(out, "  uprobes/uretprobes  {}", yes(features.uprobes))?;
    writeln!(
        out,
        "  kprobes             {}{}",
        yes(features.kprobes),
        if features.kprobes { "" } else { " (tracepoints are used instead)" }
    )?;
    writeln!(out, "  tracepoints         {}", yes(features.tracepoints))?;
    writeln!(out, "  ring buffer         {}", yes(features.ring_buffer))?;
    writeln!(out, "  BTF                 {}", yes(features.btf))?;
    if let Some(gate) = agent.arm64_gate() {
        writeln!(out, "  arm64 uprobe gate   {gate}")?;
    }
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
    let l = &agent.uprobe_links;
    writeln!(out, "uprobe links: {} — {} ({} link(s))", l.mode.name(), l.why, l.links)?;
    let d = discovery;
    writeln!(out, "discovery: {} — {}; every process rescanned every {} s", d.mode.replace('_', "-"), d.why, d.full_scan_every_s)?;
    write_loaders(out, d)?;
    writeln!(out, "NVML: {nvml}")?;
    if agent.libraries.is_empty() {
        writeln!(out, "libcuda: none found (not in ld.so.cache, not loaded by any process); give one with --libcuda PATH")?;
    }
    for lib in &agent.libraries {
        writeln!(out, "libcuda {} (inode {}, dev {:#x}, found by {})", shown(&lib.path), lib.inode, lib.dev, lib.source)?;
        if let Some(e) = &lib.error {
            writeln!(out, "  not attached: {}", shown(e))?;
            continue;
        }
        let links = lib.links.map(|m| format!(" ({} links)", m.name())).unwrap_or_default();
        writeln!(out, "  {} of {} probes attached{links}", lib.attached(), lib.probes.len())?;
        for p in &lib.probes {
            let arm64 = p.arm64.as_ref().map(|d| format!(" [arm64: {}: {}]", d.instruction, d.why)).unwrap_or_default();
            let what = match &p.status {
                ProbeStatus::Attached => format!("attached (uprobe + uretprobe){arm64}"),
                ProbeStatus::Refused => format!("REFUSED{arm64}"),
                ProbeStatus::NotExported { required: true } => "skipped: not exported by this library".to_string(),
                ProbeStatus::NotExported { required: false } => "skipped: not exported (newer drivers only)".to_string(),
                ProbeStatus::Failed { error } => format!("FAILED: {}", shown(error)),
            };
            writeln!(out, "  {:<30} {what}", p.symbol)?;
        }
    }
    write_torch(out, agent)?;
    // What bring-up said, as it says it (its sentences carry their own "note:").
    for n in notes {
        writeln!(out, "{n}")?;
    }
    Ok(())
}

/// Each loader copy and whether its hook is attached (where, on arm64).
fn write_loaders(out: &mut impl Write, d: &DiscoveryReport) -> std::io::Result<()> {
    for l in &d.loaders {
        match &l.error {
            None => {
                let arm64 =
                    l.arm64.as_ref().map(|d| format!(" at {:#x} [arm64: {}: {}]", d.offset, d.instruction, d.why)).unwrap_or_default();
                writeln!(out, "  loader {} (inode {}) hooked{arm64}", shown(&l.path), l.inode)?
            }
            Some(e) => writeln!(out, "  loader {} (inode {}) NOT hooked: {}", shown(&l.path), l.inode, shown(e))?,
        }
    }
    Ok(())
}

/// A path or message that may carry a traced process's file names: one
/// line, no control characters.
fn shown(s: &str) -> String {
    gpumem_engine::names::printable(s)
}

/// The driver's versions, and the mismatch named where there is one.
pub fn write_driver(out: &mut impl Write, v: &crate::driver::Versions) -> std::io::Result<()> {
    writeln!(out, "driver: {}", v.describe())?;
    if let Some(m) = v.mismatch_message() {
        writeln!(out, "  {m}")?;
    }
    Ok(())
}

/// Each PyTorch library found and its allocator probe sites.
fn write_torch(out: &mut impl Write, agent: &Agent) -> std::io::Result<()> {
    for t in &agent.torch {
        writeln!(out, "PyTorch {} (inode {}, dev {:#x}, found by {})", shown(&t.path), t.inode, t.dev, t.source)?;
        match (&t.error, t.attached) {
            (Some(e), _) => writeln!(out, "  allocator probes NOT attached: {}", shown(e))?,
            (None, true) => {
                let how = if t.links == Some(crate::probes::links::LinkMode::Multi) {
                    "one uprobe_multi link"
                } else {
                    "a perf-event uprobe per site"
                };
                writeln!(out, "  allocator probes attached ({how}, semaphores raised while gpumem runs)")?
            }
            (None, false) => {}
        }
        for site in &t.sites {
            let sem = site.semaphore.map_or("no semaphore".to_string(), |s| format!("semaphore at {s:#x}"));
            writeln!(out, "  {:<16} at {:#x}, {sem}: {}", site.probe, site.offset, site.args.join(", "))?;
            if let Some(d) = &site.arm64 {
                let what = if d.attach { "attached" } else { "REFUSED" };
                writeln!(out, "    arm64: {what}: {}: {}", d.instruction, d.why)?;
            }
        }
    }
    Ok(())
}

/// The running daemon (as it describes itself) and the pinned state on disk.
pub fn write_continuity(
    out: &mut impl Write,
    daemon: Option<&serde_json::Value>,
    pinned: &[crate::probes::pin::OnDisk],
) -> std::io::Result<()> {
    match daemon {
        Some(d) => {
            writeln!(
                out,
                "daemon: gpumem serve {} (pid {}), up {:.0} s, {} probes attached, {} processes, {}",
                d["version"].as_str().unwrap_or("?"),
                d["pid"],
                d["up_s"].as_f64().unwrap_or(0.0),
                d["probes_attached"],
                d["processes"],
                d["metrics"].as_str().unwrap_or("?")
            )?;
            let c = &d["continuity"];
            match c["pinned"].as_str() {
                Some(dir) => writeln!(out, "  state pinned in {dir} (owned by this daemon)")?,
                None => writeln!(out, "  state not pinned: {}", c["unpinned_why"].as_str().unwrap_or("--no-pin"))?,
            }
            if let Some(a) = c["adopted"].as_object() {
                writeln!(out, "  adopted at start: {} live entries of {} processes from the last agent", a["entries"], a["processes"])?;
            }
            for g in d["degraded"].as_array().into_iter().flatten() {
                writeln!(
                    out,
                    "  degraded: pid {} ({}): {}; {}",
                    g["pid"],
                    g["reason"].as_str().unwrap_or("?"),
                    shown(g["detail"].as_str().unwrap_or("")),
                    g["consequence"].as_str().unwrap_or("")
                )?;
            }
            if let Some(m) = d["memory"].as_object() {
                write_memory(out, m)?;
            }
            if let Some(t) = d["kernel_table"].as_object() {
                writeln!(
                    out,
                    "  kernel table of live entries: {} of {} ({} of kernel memory)",
                    t["entries"],
                    t["max_entries"],
                    gpumem_engine::names::bytes(t["bytes"].as_u64().unwrap_or(0))
                )?;
            }
        }
        None => writeln!(out, "daemon: none running (top, leaks and status start probes of their own)")?,
    }
    for p in pinned {
        let whose = match (daemon.is_some(), p.compatible) {
            (_, false) => "another gpumem's layout: the next serve replaces it",
            (true, true) => "the daemon's",
            (false, true) => "no agent runs: its probes keep counting, the next serve adopts it",
        };
        writeln!(out, "pinned state {} ({} links, {} maps): {whose}", p.dir, p.links, p.maps)?;
    }
    Ok(())
}

/// A daemon's memory: resident, its rings, its heap by owner and the rest.
fn write_memory(out: &mut impl Write, m: &serde_json::Map<String, serde_json::Value>) -> std::io::Result<()> {
    let b = |v: &serde_json::Value| gpumem_engine::names::bytes(v.as_u64().unwrap_or(0));
    let heap: gpumem_engine::heap::Parts = serde_json::from_value(m["heap"].clone()).unwrap_or_default();
    let named: Vec<String> = heap.labelled().iter().map(|(p, n)| format!("{p} {}", gpumem_engine::names::bytes(*n))).collect();
    writeln!(
        out,
        "  memory: resident {} ({} of it the rings mapped from the kernel); heap in use {}: {}, unattributed {}; kept free by the allocator {}",
        b(&m["resident_bytes"]),
        b(&m["ring_mapping_bytes"]),
        b(&m["heap_in_use_bytes"]),
        named.join(", "),
        b(&m["heap_unattributed_bytes"]),
        b(&m["heap_free_bytes"])
    )?;
    let caches: Vec<String> = m
        .get("caches")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().unwrap_or(0);
            let evicted = if n("evicted") > 0 { format!(", {} let go", n("evicted")) } else { String::new() };
            format!("{} {}/{}{evicted}", c["name"].as_str().unwrap_or("?"), n("entries"), n("max_entries"))
        })
        .collect();
    if !caches.is_empty() {
        writeln!(out, "  caches (entries/most): {}", caches.join(", "))?;
    }
    let maps: Vec<(String, u64)> = m
        .get("bpf_maps")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .map(|e| (e["name"].as_str().unwrap_or("?").to_string(), e["bytes"].as_u64().unwrap_or(0)))
        .collect();
    if !maps.is_empty() {
        let total: u64 = maps.iter().map(|(_, b)| b).sum();
        let largest: Vec<String> = maps.iter().take(4).map(|(n, b)| format!("{n} {}", gpumem_engine::names::bytes(*b))).collect();
        writeln!(out, "  kernel maps: {} in {} maps (largest: {})", gpumem_engine::names::bytes(total), maps.len(), largest.join(", "))?;
    }
    let rings: Option<Rings> = m.get("rings").and_then(|r| serde_json::from_value(r.clone()).ok());
    if let Some(r) = rings.filter(|r| r.events_bytes > 0) {
        writeln!(out, "  {}", rings_line(&r))?;
    }
    Ok(())
}

/// The rings' sizes, how each was chosen and what they keep resident.
fn rings_line(r: &Rings) -> String {
    let sized = |s: RingSizing, flag: &str| match s {
        RingSizing::Flag => format!("by {flag}"),
        RingSizing::OnlineCpus(n) => format!("for {n} online CPUs"),
        RingSizing::OnlineCpusDebugBuild(n) => format!("for {n} online CPUs, ×{DEBUG_BUILD_ROOM} for a debug build"),
    };
    format!(
        "rings: events {} ({}), stacks {} ({}): kernel memory, mapped twice ({} resident); by default 1 MiB per online CPU within 4-64 MiB",
        gpumem_engine::names::bytes(r.events_bytes),
        sized(r.events_sizing, "--ringbuf-bytes"),
        gpumem_engine::names::bytes(r.stacks_bytes),
        sized(r.stacks_sizing, "--stack-ring-bytes"),
        gpumem_engine::names::bytes(2 * (r.events_bytes + r.stacks_bytes)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rings_line_says_each_rings_size_and_how_it_was_chosen() {
        let r = Rings {
            events_bytes: 4 << 20,
            stacks_bytes: 8 << 20,
            events_sizing: RingSizing::OnlineCpus(2),
            stacks_sizing: RingSizing::Flag,
        };
        assert_eq!(
            rings_line(&r),
            "rings: events 4.0 MiB (for 2 online CPUs), stacks 8.0 MiB (by --stack-ring-bytes): kernel memory, mapped twice (24.0 MiB resident); by default 1 MiB per online CPU within 4-64 MiB"
        );
    }
}
