//! `gpumem trace` event lines: aligned text for people, one JSON object per
//! line for machines.
use std::io::{self, Write};

use gpumem_common::{api, api_info, ApiClass, Event, DEVICE_UNKNOWN};
use serde_json::{json, Value};

use super::names::{api_name, bytes, event_type, printable, result_name};
use crate::state::{container::ContainerInfo, Applied, CudaOom, Release};

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

fn has_handle(api_id: u32) -> bool {
    matches!(
        api_info(api_id).map(|a| a.class),
        Some(
            ApiClass::VmmCreate
                | ApiClass::VmmRelease
                | ApiClass::VmmMap
                | ApiClass::CtxRetainPrimary
                | ApiClass::CtxCreate
                | ApiClass::CtxSetCurrent
                | ApiClass::CtxPush
                | ApiClass::CtxPop
                | ApiClass::CtxDestroy
        )
    )
}

fn releases_json(rs: &[Release]) -> Value {
    rs.iter().map(|r| json!({"device": device_value(r.device), "bytes": r.bytes, "allocs": r.allocs})).collect()
}

/// The extra `cuda_oom` object that follows an allocation failing with out-of-memory.
/// `holder_stacks[i]`: the top stacks of `oom.holders[i]` on the device.
pub fn cuda_oom_json(ev: &Event, oom: &CudaOom, holder_stacks: &[Value]) -> Value {
    let mut holders = serde_json::to_value(&oom.holders).unwrap_or_default();
    if let Some(hs) = holders.as_array_mut() {
        for (h, stacks) in hs.iter_mut().zip(holder_stacks) {
            h["top_stacks"] = stacks.clone();
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
        "fragmentation": oom.fragmentation,
        "holders": holders,
    })
}

/// The JSON object of one event.
pub fn event_json(ev: &Event, applied: &Applied, container: Option<&ContainerInfo>) -> Value {
    let mut v = json!({
        "type": event_type(ev.api),
        "ts_ns": ev.ts_ns,
        "pid": ev.pid,
        "tid": ev.tid,
        "comm": String::from_utf8_lossy(ev.comm_bytes()),
        "api": api_name(ev.api),
        "device": device_value(applied.device),
        "addr": format!("{:#x}", ev.addr),
        "size": applied.size,
        "result": ev.result,
        "latency_ns": ev.latency_ns,
    });
    let obj = v.as_object_mut().expect("object");
    let c = container.cloned().unwrap_or_default();
    obj.insert("container".into(), json!(c.container));
    obj.insert("pod_uid".into(), json!(c.pod_uid));
    obj.insert("pod".into(), json!(c.pod_name));
    obj.insert("namespace".into(), json!(c.namespace));
    obj.insert("ns_pid".into(), json!(c.ns_pid));
    if let Some(name) = result_name(ev.result).filter(|_| !api::is_ioctl(ev.api)) {
        obj.insert("result_name".into(), json!(name));
    }
    if has_handle(ev.api) {
        obj.insert("handle".into(), json!(format!("{:#x}", ev.handle)));
    }
    if ev.api == api::CU_MEM_ALLOC_PITCH_V2 {
        obj.insert("pitch".into(), json!(ev.aux));
    }
    // Events that can free memory implicitly always say what they freed.
    if !applied.released.is_empty()
        || matches!(event_type(ev.api), "exit" | "ctx_destroy" | "ctx_release" | "ctx_reset" | "vmm_release" | "vmm_unmap")
    {
        obj.insert("released".into(), releases_json(&applied.released));
    }
    if api::is_ioctl(ev.api) {
        // The RM status, as the driver wrote it in the parameters.
        obj.insert("status".into(), json!(ev.result));
        obj.insert("result_name".into(), json!(if ev.result == 0 { "NV_OK" } else { "NV_ERR" }));
        match ev.api {
            api::RM_ALLOC | api::RM_FREE => {
                obj.insert("handle".into(), json!(format!("{:#x}", ev.handle)));
                obj.insert("parent".into(), json!(format!("{:#x}", ev.addr as u32)));
                obj.insert("root".into(), json!(format!("{:#x}", ev.addr >> 32)));
                obj.remove("addr");
                if ev.api == api::RM_ALLOC {
                    obj.insert("class".into(), json!(format!("{:#x}", ev.aux as u32)));
                    obj.insert("flags".into(), json!(ev.aux >> 32));
                }
            }
            api::RM_CONTROL => {
                obj.insert("handle".into(), json!(format!("{:#x}", ev.handle)));
                obj.insert("cmd".into(), json!(format!("{:#x}", ev.aux)));
            }
            api::RM_MAP_MEMORY | api::RM_MAP_MEMORY_DMA => {
                obj.insert("handle".into(), json!(format!("{:#x}", ev.handle)));
            }
            _ => {}
        }
    }
    if let Some(kill) = &applied.oom_kill {
        obj.insert("trigger_pid".into(), json!(ev.tid));
        obj.insert("total_vm_bytes".into(), json!(ev.addr * 1024));
        obj.insert("anon_rss_bytes".into(), json!(ev.size * 1024));
        obj.insert("file_rss_bytes".into(), json!(ev.handle * 1024));
        obj.insert("shmem_rss_bytes".into(), json!(ev.aux * 1024));
        obj.insert("memcg".into(), json!(kill.memcg.is_some()));
        obj.insert("memcg_path".into(), json!(kill.memcg));
        obj.insert("gpu_holdings".into(), releases_json(&kill.holdings));
        obj.insert("size".into(), json!(kill.holdings.iter().map(|r| r.bytes).sum::<u64>()));
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

    pub fn event(&mut self, ev: &Event, applied: &Applied, container: Option<&ContainerInfo>, oom_stacks: &[Value]) -> io::Result<()> {
        if !self.filter.shows(ev, applied) {
            return Ok(());
        }
        if self.json {
            serde_json::to_writer(&mut self.out, &event_json(ev, applied, container))?;
            writeln!(self.out)?;
            if let Some(oom) = &applied.cuda_oom {
                serde_json::to_writer(&mut self.out, &cuda_oom_json(ev, oom, oom_stacks))?;
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
        let result = match result_name(ev.result) {
            // RM status codes are not CUresults.
            _ if api::is_ioctl(ev.api) && ev.result != 0 => format!("{:#x} (RM)", ev.result),
            Some(name) if ev.result != 0 => format!("{} {}", ev.result, name.trim_start_matches("CUDA_ERROR_")),
            Some(_) => "0".to_string(),
            None => ev.result.to_string(),
        };
        let mut extra = String::new();
        if !applied.released.is_empty() {
            let parts: Vec<String> = applied.released.iter().map(|r| format!("dev {}: {} in {}", r.device, bytes(r.bytes), r.allocs)).collect();
            extra = format!(" released {}", parts.join(", "));
        }
        if applied.untracked {
            extra.push_str(" (untracked)");
        }
        if let Some(kill) = &applied.oom_kill {
            let held: Vec<String> = kill.holdings.iter().map(|r| format!("dev {}: {} in {}", r.device, bytes(r.bytes), r.allocs)).collect();
            extra = format!(
                " HOST OOM KILL, triggered by pid {}, anon rss {}, {}; GPU memory held: {}",
                ev.tid,
                bytes(ev.size * 1024),
                kill.memcg.as_deref().map_or("host-wide".to_string(), |p| format!("memory cgroup {p}")),
                if held.is_empty() { "none".to_string() } else { held.join(", ") }
            );
        }
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
            result,
            ev.latency_ns as f64 / 1e3,
            extra
        )?;
        if let Some(oom) = &applied.cuda_oom {
            let free = oom.reported_free.map_or("not reported".to_string(), |f| format!("{} reported free", bytes(f)));
            let holders: Vec<String> = oom.holders.iter().map(|h| format!("{} ({}) {}", h.pid, printable(&h.comm), bytes(h.bytes))).collect();
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

    #[test]
    fn json_keys_and_values() {
        let applied = Applied { device: 1, size: 8192, ..Default::default() };
        let v = event_json(&event(api::CU_MEM_ALLOC_PITCH_V2), &applied, None);
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
        let v = event_json(&event(api::CU_MEM_ALLOC_V2), &applied, Some(&c));
        assert_eq!((v["container"].as_str(), v["pod_uid"].as_str(), v["ns_pid"].as_u64()), (Some("ab"), Some("u"), Some(7)));
    }

    #[test]
    fn unknown_device_is_null_and_releases_are_listed() {
        let applied = Applied {
            device: DEVICE_UNKNOWN,
            size: 3,
            released: vec![Release { device: 0, bytes: 3, allocs: 1 }],
            ..Default::default()
        };
        let v = event_json(&event(api::PROCESS_EXIT), &applied, None);
        assert_eq!(v["type"], "exit");
        assert!(v["device"].is_null());
        assert_eq!(v["released"][0]["bytes"], 3);
        let v = event_json(&event(api::CU_CTX_DESTROY_V2), &Applied::default(), None);
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
        p.event(&event(api::CU_MEM_ALLOC_V2), &Applied { device: 0, size: 4096, ..Default::default() }, None, &[]).unwrap();
        let text = String::from_utf8(p.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("TIME(s)"));
        assert!(lines[1].contains("cuMemAlloc_v2") && lines[1].contains("4.0 KiB"));
        let col = |l: &str, w: &str| l.find(w).unwrap();
        assert_eq!(col(lines[0], "API"), col(lines[1], "cuMemAlloc_v2"));
    }
}
