//! `gpumem trace` event lines: aligned text for people, one JSON object per
//! line for machines.
use std::io::{self, Write};

use gpumem_common::{api, api_info, ApiClass, Event, DEVICE_UNKNOWN};
use serde_json::{json, Value};

use super::names::{api_name, bytes, event_type, result_name};
use crate::state::Applied;

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

/// The JSON object of one event.
pub fn event_json(ev: &Event, applied: &Applied) -> Value {
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
    if let Some(name) = result_name(ev.result) {
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
        let released: Vec<Value> = applied
            .released
            .iter()
            .map(|r| json!({"device": device_value(r.device), "bytes": r.bytes, "allocs": r.allocs}))
            .collect();
        obj.insert("released".into(), Value::Array(released));
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

    pub fn event(&mut self, ev: &Event, applied: &Applied) -> io::Result<()> {
        if !self.filter.shows(ev, applied) {
            return Ok(());
        }
        if self.json {
            serde_json::to_writer(&mut self.out, &event_json(ev, applied))?;
            return writeln!(self.out);
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
        writeln!(
            self.out,
            "{:<10.6} {:>7} {:>7} {:<15} {:<11} {:<28} {:>3} {:<16} {:>11} {:<20} {:>9.1}{}",
            t,
            ev.pid,
            ev.tid,
            String::from_utf8_lossy(ev.comm_bytes()),
            event_type(ev.api),
            api_name(ev.api),
            dev,
            format!("{:#x}", ev.addr),
            bytes(applied.size),
            result,
            ev.latency_ns as f64 / 1e3,
            extra
        )
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
        let v = event_json(&event(api::CU_MEM_ALLOC_PITCH_V2), &applied);
        assert_eq!(v["type"], "alloc");
        assert_eq!(v["api"], "cuMemAllocPitch_v2");
        assert_eq!(v["addr"], "0x7f00");
        assert_eq!(v["size"], 8192);
        assert_eq!(v["device"], 1);
        assert_eq!(v["pitch"], 1024);
        assert_eq!(v["comm"], "python3");
        assert_eq!(v["result_name"], "CUDA_SUCCESS");
        assert!(v.get("handle").is_none());
    }

    #[test]
    fn unknown_device_is_null_and_releases_are_listed() {
        let applied = Applied {
            device: DEVICE_UNKNOWN,
            size: 3,
            released: vec![Release { device: 0, bytes: 3, allocs: 1 }],
            ..Default::default()
        };
        let v = event_json(&event(api::PROCESS_EXIT), &applied);
        assert_eq!(v["type"], "exit");
        assert!(v["device"].is_null());
        assert_eq!(v["released"][0]["bytes"], 3);
        let v = event_json(&event(api::CU_CTX_DESTROY_V2), &Applied::default());
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
        p.event(&event(api::CU_MEM_ALLOC_V2), &Applied { device: 0, size: 4096, ..Default::default() }).unwrap();
        let text = String::from_utf8(p.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("TIME(s)"));
        assert!(lines[1].contains("cuMemAlloc_v2") && lines[1].contains("4.0 KiB"));
        let col = |l: &str, w: &str| l.find(w).unwrap();
        assert_eq!(col(lines[0], "API"), col(lines[1], "cuMemAlloc_v2"));
    }
}
