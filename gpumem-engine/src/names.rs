//! The vocabulary every output shares: names of APIs, event types and
//! CUresults, byte counts, short container ids, text made printable.
use gpumem_common::{api, api_info, ApiClass};

/// Events that are not libcuda calls: (id, `type` in trace output, what fired).
const OTHER_EVENTS: [(u32, &str, &str); 11] = [
    (api::PROCESS_EXIT, "exit", "sched_process_exit"),
    (api::OOM_KILL, "oom_kill", "oom:mark_victim"),
    (api::RM_ALLOC, "rm_alloc", "NV_ESC_RM_ALLOC"),
    (api::RM_FREE, "rm_free", "NV_ESC_RM_FREE"),
    (api::RM_MAP_MEMORY, "rm_map", "NV_ESC_RM_MAP_MEMORY"),
    (api::RM_MAP_MEMORY_DMA, "rm_map_dma", "NV_ESC_RM_MAP_MEMORY_DMA"),
    (api::RM_CONTROL, "rm_control", "NV_ESC_RM_CONTROL"),
    (api::UVM_MAP_EXTERNAL_ALLOCATION, "uvm_map", "UVM_MAP_EXTERNAL_ALLOCATION"),
    (api::UVM_FREE, "uvm_free", "UVM_FREE"),
    (api::TENSOR_ALLOC, "tensor_alloc", "pytorch:malloc"),
    (api::TENSOR_FREE, "tensor_free", "pytorch:free"),
];

fn other_event(api_id: u32) -> Option<&'static (u32, &'static str, &'static str)> {
    OTHER_EVENTS.iter().find(|e| e.0 == api_id)
}

/// The `type` of an event in trace output.
pub fn event_type(api_id: u32) -> &'static str {
    if let Some(e) = other_event(api_id) {
        return e.1;
    }
    match api_info(api_id).map(|a| a.class) {
        Some(ApiClass::Init) => "init",
        Some(ApiClass::DeviceAlloc) => "alloc",
        Some(ApiClass::DeviceFree) => "free",
        Some(ApiClass::HostAlloc) => "host_alloc",
        Some(ApiClass::HostFree) => "host_free",
        Some(ApiClass::VmmCreate) => "vmm_create",
        Some(ApiClass::VmmRelease) => "vmm_release",
        Some(ApiClass::VmmMap) => "vmm_map",
        Some(ApiClass::VmmUnmap) => "vmm_unmap",
        Some(ApiClass::VaReserve) => "va_reserve",
        Some(ApiClass::VaFree) => "va_free",
        Some(ApiClass::CtxRetainPrimary) => "ctx_retain",
        Some(ApiClass::CtxReleasePrimary) => "ctx_release",
        Some(ApiClass::CtxResetPrimary) => "ctx_reset",
        Some(ApiClass::CtxCreate) => "ctx_create",
        Some(ApiClass::CtxSetCurrent) => "ctx_set",
        Some(ApiClass::CtxPush) => "ctx_push",
        Some(ApiClass::CtxPop) => "ctx_pop",
        Some(ApiClass::CtxDestroy) => "ctx_destroy",
        Some(ApiClass::MemGetInfo) => "mem_info",
        Some(ApiClass::Export) => "export",
        Some(ApiClass::Import) => "import",
        Some(ApiClass::ImportClose) => "import_close",
        Some(ApiClass::PoolCreate) => "pool_create",
        Some(ApiClass::PoolDestroy) => "pool_destroy",
        Some(ApiClass::PoolTrim) => "pool_trim",
        Some(ApiClass::PoolSetDevice) => "pool_set",
        Some(ApiClass::GreenCtxCreate) => "green_ctx_create",
        Some(ApiClass::CtxFromGreen) => "ctx_from_green",
        Some(ApiClass::GreenCtxDestroy) => "green_ctx_destroy",
        Some(ApiClass::GraphAlloc) => "graph_alloc",
        Some(ApiClass::GraphFree) => "graph_free",
        Some(ApiClass::GraphTrim) => "graph_trim",
        Some(ApiClass::GraphDestroy) => "graph_destroy",
        Some(ApiClass::Checkpoint) => "checkpoint",
        Some(ApiClass::MulticastCreate) => "multicast_create",
        Some(ApiClass::MulticastAddDevice) => "multicast_add_device",
        Some(ApiClass::MulticastBind) => "multicast_bind",
        Some(ApiClass::MulticastUnbind) => "multicast_unbind",
        Some(ApiClass::HandleExport) => "handle_export",
        Some(ApiClass::HandleImport) => "handle_import",
        Some(ApiClass::HandleRetain) => "handle_retain",
        Some(ApiClass::DeviceUuid) => "device_uuid",
        Some(ApiClass::ProcessExit) => "exit",
        None => "unknown",
    }
}

pub fn api_name(api_id: u32) -> &'static str {
    if let Some(e) = other_event(api_id) {
        return e.2;
    }
    api_info(api_id).map(|a| a.symbol).unwrap_or("unknown")
}

/// CUDA_ERROR_* name of a CUresult (the common ones; others by number).
pub fn result_name(result: u32) -> Option<&'static str> {
    Some(match result {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

/// The first 12 characters of a container id, as `docker ps` shows it.
pub fn short_id(id: &str) -> &str {
    &id[..12.min(id.len())]
}

/// Bytes in binary units, e.g. `20.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_has_a_type() {
        for a in gpumem_common::APIS {
            assert_ne!(event_type(a.id), "unknown", "{}", a.symbol);
        }
        assert_eq!(event_type(api::CU_MEM_ALLOC_PITCH_V2), "alloc");
        assert_eq!(event_type(api::CU_MEM_ADDRESS_RESERVE), "va_reserve");
        assert_eq!(event_type(api::PROCESS_EXIT), "exit");
        assert_eq!(event_type(api::OOM_KILL), "oom_kill");
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(20 << 20), "20.0 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}

/// Text from a traced process (comm, container names, paths) made safe for
/// a terminal or a column of text: control characters, escape sequences
/// and newlines included, become '?'. JSON, Prometheus labels and HTML have
/// their own escaping and get the text as it is.
pub fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() || is_invisible_format(c) { '?' } else { c }).collect()
}

/// Characters that reorder or hide text on a terminal without being
/// control characters: bidirectional overrides and isolates (a name that
/// reads backwards), zero-width ones.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod printable_tests {
    #[test]
    fn control_characters_cannot_reach_the_terminal() {
        assert_eq!(super::printable("evil\x1b[2Jname\x07"), "evil?[2Jname?");
        assert_eq!(super::printable("a\nb\r\u{9b}c"), "a?b??c", "newlines and C1 controls too");
        assert_eq!(super::printable("python3 ü"), "python3 ü");
        assert_eq!(super::printable("job\u{202e}gnp.exe\u{200b}"), "job?gnp.exe?", "bidi overrides and zero-width");
    }
}
