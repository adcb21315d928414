//! `gpumem trace` event lines: aligned text for people, one JSON object per
//! line for machines.
use std::io::{self, Write};

use gpumem_common::{
    api,
    payload::{Payload, PitchAlloc, TensorAlloc},
    ApiClass, Event, DEVICE_UNKNOWN,
};
use serde_json::{json, Value};

use crate::names::{api_name, bytes, event_type, printable, result_name};
use crate::{
    analysis::leaks::LeakGroup,
    events::kind::{Kind, OomKill, Rm},
    model::container::ContainerInfo,
    pipeline::Outcome,
    state::{Applied, CudaOom, Release},
};

/// Which events are shown (state always sees every event).
#[derive(Clone, Copy, Debug, Default)]
pub struct Filter {
    pub min_size: u64,
    pub failed_only: bool,
}

impl Filter {
    pub fn shows(&self, ev: &Event, applied: &Applied) -> bool {
        if self.failed_only && ev.result == 0 {
            return false;
        }
        if self.min_size > 0 && applied.size < self.min_size {
            return false;
        }
        true
    }
}

fn device_value(device: i32) -> Value {
    if device == DEVICE_UNKNOWN {
        Value::Null
    } else {
        json!(device)
    }
}

fn has_handle(kind: &Kind) -> bool {
    let Kind::Cuda(info) = kind else { return false };
    matches!(
        info.class,
        ApiClass::VmmCreate
            | ApiClass::VmmRelease
            | ApiClass::VmmMap
            | ApiClass::CtxRetainPrimary
            | ApiClass::CtxCreate
            | ApiClass::CtxSetCurrent
            | ApiClass::CtxPush
            | ApiClass::CtxPop
            | ApiClass::CtxDestroy
            | ApiClass::PoolCreate
            | ApiClass::PoolDestroy
            | ApiClass::PoolTrim
            | ApiClass::PoolSetDevice
            | ApiClass::GreenCtxCreate
            | ApiClass::CtxFromGreen
            | ApiClass::GreenCtxDestroy
            | ApiClass::GraphAlloc
            | ApiClass::GraphFree
            | ApiClass::GraphDestroy
            | ApiClass::MulticastCreate
            | ApiClass::MulticastAddDevice
            | ApiClass::MulticastBind
            | ApiClass::MulticastUnbind
            | ApiClass::HandleExport
            | ApiClass::HandleImport
            | ApiClass::HandleRetain
    )
}

fn releases_json(rs: &[Release]) -> Value {
    rs.iter().map(|r| json!({"device": device_value(r.device), "bytes": r.bytes, "allocs": r.allocs})).collect()
}

fn hex(v: impl std::fmt::LowerHex) -> Value {
    json!(format!("{v:#x}"))
}

/// The extra `cuda_oom` object that follows an allocation failing with
/// out-of-memory; `holder_stacks[i]`: the top stacks of `oom.holders[i]`.
pub fn cuda_oom_json(ev: &Event, oom: &CudaOom, holder_stacks: &[Vec<LeakGroup>]) -> Value {
    let mut holders = serde_json::to_value(&oom.holders).unwrap_or_default();
    if let Some(hs) = holders.as_array_mut() {
        for (h, stacks) in hs.iter_mut().zip(holder_stacks) {
            h["top_stacks"] = serde_json::to_value(stacks).unwrap_or_default();
        }
    }
    json!({
        "type": "cuda_oom",
        "ts_ns": ev.ts_ns,
        "pid": ev.pid,
        "tid": ev.tid,
        "comm": String::from_utf8_lossy(ev.comm_bytes()),
        "api": api_name(ev.api),
        "device": device_value(oom.device),
        "size": oom.requested,
        "reported_free": oom.reported_free,
        "reserved_unused": oom.reserved_unused,
        "largest_free_block": oom.largest_free_block,
        "fragmentation": oom.fragmentation,
        "holders": holders,
    })
}

/// The JSON object of one event.
pub fn event_json(ev: &Event, kind: &Kind, applied: &Applied, container: Option<&ContainerInfo>) -> Value {
    let mut v = json!({
        "type": event_type(ev.api),
        "ts_ns": ev.ts_ns,
        "pid": ev.pid,
        "tid": ev.tid,
        "comm": String::from_utf8_lossy(ev.comm_bytes()),
        "api": api_name(ev.api),
        "device": device_value(applied.device),
        "addr": hex(ev.addr),
        "size": applied.size,
        "result": ev.result,
        "latency_ns": ev.latency_ns,
    });
    let obj = v.as_object_mut().expect("object");
    let c = container.cloned().unwrap_or_default();
    obj.insert("container".into(), json!(c.container));
    obj.insert("pod_uid".into(), json!(c.pod_uid));
    obj.insert("qos".into(), json!(c.qos));
    obj.insert("pod".into(), json!(c.pod_name));
    obj.insert("namespace".into(), json!(c.namespace));
    obj.insert("ns_pid".into(), json!(c.ns_pid));
    let is_call = !kind.is_ioctl() && !matches!(kind, Kind::TensorAlloc | Kind::TensorFree);
    if let Some(name) = result_name(ev.result).filter(|_| is_call) {
        obj.insert("result_name".into(), json!(name));
    }
    if has_handle(kind) {
        obj.insert("handle".into(), hex(ev.handle));
    }
    if applied.exporter.is_some() || matches!(event_type(ev.api), "import" | "handle_import") {
        obj.insert("exporter".into(), json!(applied.exporter));
    }
    if event_type(ev.api) == "checkpoint" {
        obj.insert("target".into(), json!(gpumem_common::payload::CheckpointCall::unpack(ev).target));
    }
    if ev.api == api::CU_MEM_ALLOC_PITCH_V2 {
        obj.insert("pitch".into(), json!(PitchAlloc::unpack(ev).pitch));
    }
    // Events that can free memory implicitly always say what they freed.
    if !applied.released.is_empty()
        || matches!(event_type(ev.api), "exit" | "ctx_destroy" | "ctx_release" | "ctx_reset" | "vmm_release" | "vmm_unmap")
    {
        obj.insert("released".into(), releases_json(&applied.released));
    }
    match kind {
        Kind::Rm(call) => rm_fields(obj, ev, call),
        Kind::Uvm(_) => ioctl_status(obj, ev),
        Kind::OomKill(k) => oom_fields(obj, k, applied),
        Kind::TensorAlloc => {
            obj.insert("stream".into(), hex(TensorAlloc::unpack(ev).stream));
            obj.remove("latency_ns");
        }
        Kind::TensorFree => {
            obj.remove("latency_ns");
        }
        _ => {}
    }
    if applied.untracked {
        obj.insert("untracked".into(), json!(true));
    }
    if applied.dropped {
        obj.insert("dropped".into(), json!(true));
    }
    if ev.flags & gpumem_common::flags::OUT_READ_FAILED != 0 {
        obj.insert("out_read_failed".into(), json!(true));
    }
    v
}

type Object = serde_json::Map<String, Value>;

/// The RM status, as the driver wrote it in the parameters.
fn ioctl_status(obj: &mut Object, ev: &Event) {
    obj.insert("status".into(), json!(ev.result));
    obj.insert("result_name".into(), json!(if ev.result == 0 { "NV_OK" } else { "NV_ERR" }));
}

fn rm_fields(obj: &mut Object, ev: &Event, call: &Rm) {
    ioctl_status(obj, ev);
    match *call {
        Rm::Alloc { object, parent, root, class, flags, .. } => {
            obj.insert("handle".into(), hex(object));
            obj.insert("parent".into(), hex(parent));
            obj.insert("root".into(), hex(root));
            obj.remove("addr");
            obj.insert("class".into(), hex(class));
            obj.insert("flags".into(), json!(flags));
        }
        Rm::Free { object, parent, root } => {
            obj.insert("handle".into(), hex(object));
            obj.insert("parent".into(), hex(parent));
            obj.insert("root".into(), hex(root));
            obj.remove("addr");
        }
        Rm::Control { object, cmd } => {
            obj.insert("handle".into(), hex(object));
            obj.insert("cmd".into(), hex(cmd));
        }
        Rm::Map { memory, .. } => {
            obj.insert("handle".into(), hex(memory));
        }
    }
}

fn oom_fields(obj: &mut Object, k: &OomKill, applied: &Applied) {
    obj.insert("trigger_pid".into(), json!(k.trigger_tid));
    obj.insert("total_vm_bytes".into(), json!(k.total_vm_bytes));
    obj.insert("anon_rss_bytes".into(), json!(k.anon_rss_bytes));
    obj.insert("file_rss_bytes".into(), json!(k.file_rss_bytes));
    obj.insert("shmem_rss_bytes".into(), json!(k.shmem_rss_bytes));
    if let Some(kill) = &applied.oom_kill {
        obj.insert("memcg".into(), json!(kill.memcg.is_some()));
        obj.insert("memcg_path".into(), json!(kill.memcg));
        obj.insert("gpu_holdings".into(), releases_json(&kill.holdings));
        obj.insert("size".into(), json!(kill.holdings.iter().map(|r| r.bytes).sum::<u64>()));
        obj.insert("host_resident_bytes".into(), json!(kill.host.map(|h| h.resident_bytes)));
        obj.insert("host_swap_bytes".into(), json!(kill.host.map(|h| h.swap_bytes)));
        obj.insert("pinned_host_bytes".into(), json!(kill.pinned_host_bytes));
    }
}

pub struct Printer<W: Write> {
    out: W,
    json: bool,
    filter: Filter,
    start_ns: Option<u64>,
    header: bool,
}

impl<W: Write> Printer<W> {
    pub fn new(out: W, json: bool, filter: Filter) -> Self {
        Printer { out, json, filter, start_ns: None, header: false }
    }

    /// Whether `o` is printed (its stack is only symbolized for those).
    pub fn shows(&self, o: &Outcome) -> bool {
        self.filter.shows(&o.event, &o.applied)
    }

    /// Prints `o`; in JSON with its allocation stack's id and frames (native
    /// and Python), where it has one.
    pub fn event(&mut self, o: &Outcome, container: Option<&ContainerInfo>, frames: Option<&[crate::stacks::Frame]>) -> io::Result<()> {
        let (ev, applied) = (&o.event, &o.applied);
        if !self.filter.shows(ev, applied) {
            return Ok(());
        }
        if self.json {
            let mut v = event_json(ev, &o.kind, applied, container);
            if let (Some(id), Some(frames), Some(obj)) = (o.stack, frames, v.as_object_mut()) {
                obj.insert("stack_id".into(), json!(format!("{id:016x}")));
                obj.insert("frames".into(), json!(frames));
            }
            serde_json::to_writer(&mut self.out, &v)?;
            writeln!(self.out)?;
            if let Some(oom) = &applied.cuda_oom {
                serde_json::to_writer(&mut self.out, &cuda_oom_json(ev, oom, &o.oom_stacks))?;
                writeln!(self.out)?;
            }
            return Ok(());
        }
        if !self.header {
            self.header = true;
            writeln!(
                self.out,
                "{:<10} {:>7} {:>7} {:<15} {:<11} {:<28} {:>3} {:<16} {:>11} {:<20} {:>9}",
                "TIME(s)", "PID", "TID", "COMM", "TYPE", "API", "DEV", "ADDR", "SIZE", "RESULT", "LAT(us)"
            )?;
        }
        let start = *self.start_ns.get_or_insert(ev.ts_ns);
        let t = ev.ts_ns.saturating_sub(start) as f64 / 1e9;
        let dev = if applied.device == DEVICE_UNKNOWN { "-".to_string() } else { applied.device.to_string() };
        writeln!(
            self.out,
            "{:<10.6} {:>7} {:>7} {:<15} {:<11} {:<28} {:>3} {:<16} {:>11} {:<20} {:>9.1}{}",
            t,
            ev.pid,
            ev.tid,
            printable(&String::from_utf8_lossy(ev.comm_bytes())),
            event_type(ev.api),
            api_name(ev.api),
            dev,
            format!("{:#x}", ev.addr),
            bytes(applied.size),
            result_text(ev, &o.kind),
            ev.latency_ns as f64 / 1e3,
            extra_text(&o.kind, applied)
        )?;
        if let Some(oom) = &applied.cuda_oom {
            let mut free = oom.reported_free.map_or("not reported".to_string(), |f| format!("{} reported free", bytes(f)));
            if let (Some(unused), Some(largest)) = (oom.reserved_unused, oom.largest_free_block) {
                free.push_str(&format!(", {} cached by PyTorch (largest free block {})", bytes(unused), bytes(largest)));
            }
            let holders: Vec<String> =
                oom.holders.iter().map(|h| format!("{} ({}) {}", h.pid, printable(&h.comm), bytes(h.bytes))).collect();
            writeln!(
                self.out,
                "           CUDA OOM on device {}: {} requested, {}{}; holders: {}",
                oom.device,
                bytes(oom.requested),
                free,
                if oom.fragmentation { " -> FRAGMENTATION (enough memory was free)" } else { "" },
                if holders.is_empty() { "none traced".to_string() } else { holders.join(", ") }
            )?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn inner(&mut self) -> &mut W {
        &mut self.out
    }
}

/// The RESULT column: the CUresult with its name, or an RM status.
fn result_text(ev: &Event, kind: &Kind) -> String {
    match result_name(ev.result) {
        // RM status codes are not CUresults.
        _ if kind.is_ioctl() && ev.result != 0 => format!("{:#x} (RM)", ev.result),
        Some(name) if ev.result != 0 => format!("{} {}", ev.result, name.trim_start_matches("CUDA_ERROR_")),
        Some(_) => "0".to_string(),
        None => ev.result.to_string(),
    }
}

fn held_text(rs: &[Release]) -> Vec<String> {
    rs.iter().map(|r| format!("dev {}: {} in {}", r.device, bytes(r.bytes), r.allocs)).collect()
}

/// What follows the columns: implicit releases, untracked frees, OOM kills.
fn extra_text(kind: &Kind, applied: &Applied) -> String {
    let mut extra = String::new();
    if !applied.released.is_empty() {
        extra = format!(" released {}", held_text(&applied.released).join(", "));
    }
    if applied.untracked {
        extra.push_str(" (untracked)");
    }
    if let (Some(kill), Kind::OomKill(k)) = (&applied.oom_kill, kind) {
        let held = held_text(&kill.holdings);
        let swap = kill.host.map_or(String::new(), |h| format!(", swap {}", bytes(h.swap_bytes)));
        let pinned = if kill.pinned_host_bytes > 0 { format!(", pinned {}", bytes(kill.pinned_host_bytes)) } else { String::new() };
        extra = format!(
            " HOST OOM KILL, triggered by pid {}, anon rss {}{swap}{pinned}, {}; GPU memory held: {}",
            k.trigger_tid,
            k.anon_rss_bytes.map_or("?".to_string(), bytes),
            kill.memcg.as_deref().map_or("host-wide".to_string(), |p| format!("memory cgroup {}", printable(p))),
            if held.is_empty() { "none".to_string() } else { held.join(", ") }
        );
    }
    extra
}

#[cfg(test)]
mod tests {
    use gpumem_common::api;

    use super::*;
    use crate::state::Release;

    fn event(api_id: u32) -> Event {
        Event {
            ts_ns: 5,
            latency_ns: 7,
            addr: 0x7f00,
            size: 4096,
            handle: 0x1001,
            aux: 1024,
            pid: 1,
            tid: 2,
            api: api_id,
            result: 0,
            device: 0,
            flags: 0,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
        }
    }

    fn json_of(ev: &Event, applied: &Applied, c: Option<&ContainerInfo>) -> Value {
        event_json(ev, &Kind::of(ev), applied, c)
    }

    fn outcome(event: Event, applied: Applied) -> Outcome {
        Outcome { kind: Kind::of(&event), event, applied, stack: None, oom_stacks: Box::default() }
    }

    #[test]
    fn oom_and_rm_fields_at_their_extremes() {
        let kill = Event { addr: u64::MAX, size: u64::MAX / 1024, handle: 1 << 60, aux: 0, tid: 9, ..event(api::OOM_KILL) };
        let applied = Applied { oom_kill: Some(Box::default()), ..Default::default() };
        let v = json_of(&kill, &applied, None);
        assert!(v["total_vm_bytes"].is_null(), "KiB beyond 64 bits of bytes: unknown, not wrapped");
        assert_eq!(v["anon_rss_bytes"], (u64::MAX / 1024) * 1024);
        assert!(v["file_rss_bytes"].is_null());
        assert_eq!(v["trigger_pid"], 9);
        let mut p = Printer::new(Vec::new(), false, Filter::default());
        p.event(&outcome(kill, applied), None, None).unwrap();
        let rm = Event { handle: u64::MAX, addr: u64::MAX, aux: u64::MAX, ..event(api::RM_ALLOC) };
        let v = json_of(&rm, &Applied::default(), None);
        assert_eq!(
            (v["handle"].as_str(), v["root"].as_str(), v["flags"].as_u64()),
            (Some("0xffffffff"), Some("0xffffffff"), Some(0xffff_ffff))
        );
    }

    #[test]
    fn json_keys_and_values() {
        let applied = Applied { device: 1, size: 8192, ..Default::default() };
        let v = json_of(&event(api::CU_MEM_ALLOC_PITCH_V2), &applied, None);
        assert_eq!(v["type"], "alloc");
        assert_eq!(v["api"], "cuMemAllocPitch_v2");
        assert_eq!(v["addr"], "0x7f00");
        assert_eq!(v["size"], 8192);
        assert_eq!(v["device"], 1);
        assert_eq!(v["pitch"], 1024);
        assert_eq!(v["comm"], "python3");
        assert_eq!(v["result_name"], "CUDA_SUCCESS");
        assert!(v.get("handle").is_none());
        assert!(v["container"].is_null() && v["pod_uid"].is_null() && v["ns_pid"].is_null());
        let c = ContainerInfo { container: Some("ab".into()), pod_uid: Some("u".into()), ns_pid: Some(7), ..Default::default() };
        let v = json_of(&event(api::CU_MEM_ALLOC_V2), &applied, Some(&c));
        assert_eq!((v["container"].as_str(), v["pod_uid"].as_str(), v["ns_pid"].as_u64()), (Some("ab"), Some("u"), Some(7)));
    }

    #[test]
    fn unknown_device_is_null_and_releases_are_listed() {
        let applied =
            Applied { device: DEVICE_UNKNOWN, size: 3, released: vec![Release { device: 0, bytes: 3, allocs: 1 }], ..Default::default() };
        let v = json_of(&event(api::PROCESS_EXIT), &applied, None);
        assert_eq!(v["type"], "exit");
        assert!(v["device"].is_null());
        assert_eq!(v["released"][0]["bytes"], 3);
        let v = json_of(&event(api::CU_CTX_DESTROY_V2), &Applied::default(), None);
        assert_eq!(v["released"], serde_json::json!([]));
        assert_eq!(v["handle"], "0x1001");
    }

    #[test]
    fn filters() {
        let f = Filter { min_size: 4096, failed_only: true };
        let mut e = event(api::CU_MEM_ALLOC_V2);
        let big = Applied { size: 4096, ..Default::default() };
        let small = Applied { size: 4095, ..Default::default() };
        assert!(!f.shows(&e, &big), "successful call hidden by --failed-only");
        e.result = 2;
        assert!(f.shows(&e, &big));
        assert!(!f.shows(&e, &small));
    }

    #[test]
    fn human_line_is_aligned() {
        let mut p = Printer::new(Vec::new(), false, Filter::default());
        p.event(&outcome(event(api::CU_MEM_ALLOC_V2), Applied { device: 0, size: 4096, ..Default::default() }), None, None).unwrap();
        let text = String::from_utf8(p.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("TIME(s)"));
        assert!(lines[1].contains("cuMemAlloc_v2") && lines[1].contains("4.0 KiB"));
        let col = |l: &str, w: &str| l.find(w).unwrap();
        assert_eq!(col(lines[0], "API"), col(lines[1], "cuMemAlloc_v2"));
    }
}
