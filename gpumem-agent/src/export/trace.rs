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
                "{:<10} {:>7} {:>7} {:<15} {:<11} {:<28} {:>3} {:<16} {:>11} {:<28} {:>9}",
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
            "{:<10.6} {:>7} {:>7} {:<15} {:<11} {:<28} {:>3} {:<16} {:>11} {:<28} {:>9.1}{}",
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
