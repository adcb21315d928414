//! NVML sampling (nvml-wrapper): per GPU identity, memory, per-process
//! memory, ECC, retired pages, remapped rows and temperatures. A reading a
//! device does not support is recorded as unsupported once and not asked
//! again; NVML itself may be missing (no library, no driver, no device), and
//! the rest of gpumem works without it.
use std::{collections::HashSet, ffi::OsStr};

pub mod kmsg;
pub mod worker;
pub mod xid;

pub use worker::{Library, Worker};

use gpumem_engine::model::nvml::{mig_profile, EccCounts, GpuSample, MemoryInfo, MigInstance, RemappedRows, RetiredPages};
use nvml_wrapper::{
    enum_wrappers::device::{EccCounter, MemoryError, RetirementCause, TemperatureSensor},
    error::NvmlError,
    structs::device::FieldId,
    Nvml,
};

/// NVML field ids (nvml.h) that nvml-wrapper does not wrap.
const FI_DEV_MEMORY_TEMP: u32 = 82;
const FI_DEV_REMAPPED_COR: u32 = 142;
const FI_DEV_REMAPPED_UNC: u32 = 143;
const FI_DEV_REMAPPED_PENDING: u32 = 144;
const FI_DEV_REMAPPED_FAILURE: u32 = 145;

#[derive(Debug, thiserror::Error)]
#[error("NVML unavailable: {0}")]
pub struct Unavailable(#[source] NvmlError);

pub struct Sampler {
    nvml: Nvml,
    /// (device index, reading) found unsupported: not asked again.
    unsupported: HashSet<(u32, &'static str)>,
}

/// An NvmlError that means "this device cannot do that" rather than a failure.
fn is_unsupported(e: &NvmlError) -> bool {
    matches!(e, NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::InvalidArg)
}

impl Sampler {
    /// Loads NVML from `lib` (default: libnvidia-ml.so.1 from the library path).
    pub fn open(lib: Option<&OsStr>) -> Result<Sampler, Unavailable> {
        let mut b = Nvml::builder();
        if let Some(path) = lib {
            b.lib_path(path);
        }
        let nvml = b.init().map_err(Unavailable)?;
        Ok(Sampler { nvml, unsupported: HashSet::new() })
    }

    pub fn sample(&mut self, t_s: f64) -> Result<Vec<GpuSample>, Unavailable> {
        let count = self.nvml.device_count().map_err(Unavailable)?;
        let mut out = Vec::new();
        for index in 0..count {
            let dev = self.nvml.device_by_index(index).map_err(Unavailable)?;
            let mut s = GpuSample {
                index,
                uuid: dev.uuid().unwrap_or_default(),
                pci_bus_id: dev.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                name: dev.name().unwrap_or_default(),
                t_s,
                ..Default::default()
            };
            let u = &mut self.unsupported;
            s.memory = reading(u, index, "memory", &mut s, || {
                let m = dev.memory_info()?;
                Ok(MemoryInfo { total: m.total, used: m.used, free: m.free, reserved: m.reserved })
            });
            s.processes = reading(u, index, "processes", &mut s, || Ok(process_bytes(&dev.running_compute_processes()?)));
            s.ecc = reading(u, index, "ecc", &mut s, || ecc_counts(&dev));
            s.ecc_by_location = reading(u, index, "ecc_by_location", &mut s, || ecc_by_location(&dev));
            s.retired_pages = reading(u, index, "retired_pages", &mut s, || {
                Ok(RetiredPages {
                    single_bit: dev.retired_pages(RetirementCause::MultipleSingleBitEccErrors)?.len() as u64,
                    double_bit: dev.retired_pages(RetirementCause::DoubleBitEccError)?.len() as u64,
                    pending: dev.are_pages_pending_retired()?,
                })
            });
            s.gpu_temp_c = reading(u, index, "gpu_temperature", &mut s, || dev.temperature(TemperatureSensor::Gpu));
            s.addressing_mode = reading(u, index, "addressing_mode", &mut s, || addressing_mode(&self.nvml, &dev));
            // "Only applies to platforms where the GPUs are NUMA nodes"
            // (nvml.h): elsewhere unsupported, never the CPU node near it.
            s.numa_node = reading(u, index, "numa_node", &mut s, || dev.numa_node_id());
            field_readings(u, index, &dev, &mut s);
            s.mig = mig_instances(&dev);
            out.push(s);
        }
        Ok(out)
    }
}

/// How the GPU reaches pageable host memory (nvmlDeviceGetAddressingMode,
/// which nvml-wrapper binds but does not wrap; older drivers lack it).
fn addressing_mode(nvml: &Nvml, dev: &nvml_wrapper::Device<'_>) -> Result<&'static str, NvmlError> {
    let lib = nvml.lib();
    if lib.nvmlDeviceGetAddressingMode.is_err() {
        return Err(NvmlError::FunctionNotFound);
    }
    // NVML_STRUCT_VERSION(DeviceAddressingMode, 1): the struct's size and the version in the top byte.
    let mut mode = nvml_wrapper_sys::bindings::nvmlDeviceAddressingMode_t {
        version: std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlDeviceAddressingMode_t>() as u32 | 1 << 24,
        value: 0,
    };
    // SAFETY: the symbol is present (checked above), the handle is the live device's and `mode` outlives the call.
    nvml_wrapper::error::nvml_try(unsafe { lib.nvmlDeviceGetAddressingMode(dev.handle(), &mut mode) })?;
    Ok(match mode.value {
        0 => "none",
        1 => "hmm",
        2 => "ats",
        _ => "unknown",
    })
}

/// A GPU's MIG instances where MIG mode is on (nothing where it is off, or
/// unsupported, or NVML lacks the calls).
fn mig_instances(dev: &nvml_wrapper::Device<'_>) -> Vec<MigInstance> {
    if !dev.mig_mode().is_ok_and(|m| m.current == 1) {
        return Vec::new();
    }
    let count = dev.mig_device_count().unwrap_or(0).min(64);
    (0..count)
        .filter_map(|i| {
            let mig = dev.mig_device_by_index(i).ok()?;
            let (gpu_instance_id, compute_instance_id) = instance_ids(&mig);
            Some(MigInstance {
                gpu_instance_id,
                compute_instance_id,
                uuid: mig.uuid().unwrap_or_default(),
                profile: mig_profile(&mig.name().unwrap_or_default()),
                memory: mig.memory_info().ok().map(|m| MemoryInfo { total: m.total, used: m.used, free: m.free, reserved: m.reserved }),
                processes: mig.running_compute_processes().ok().map(|p| process_bytes(&p)),
            })
        })
        .collect()
}

/// A MIG device's GPU and compute instance ids (nvml-wrapper does not wrap them).
fn instance_ids(mig: &nvml_wrapper::Device<'_>) -> (u32, u32) {
    let lib = mig.nvml().lib();
    let (mut gi, mut ci) = (u32::MAX, u32::MAX);
    // SAFETY: the handle is a live MIG device of this NVML; the out-pointers
    // are valid u32s; a symbol NVML lacks is an Err, never called.
    unsafe {
        if let Ok(f) = lib.nvmlDeviceGetGpuInstanceId.as_ref() {
            f(mig.handle(), &mut gi);
        }
        if let Ok(f) = lib.nvmlDeviceGetComputeInstanceId.as_ref() {
            f(mig.handle(), &mut ci);
        }
    }
    (gi, ci)
}

/// (pid, bytes) of NVML's process list (bytes 0 where NVML does not say).
pub fn process_bytes(ps: &[nvml_wrapper::struct_wrappers::device::ProcessInfo]) -> Vec<(u32, u64)> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    ps.iter()
        .map(|p| {
            let bytes = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            };
            (p.pid, bytes)
        })
        .collect()
}

fn ecc_counts(dev: &nvml_wrapper::Device<'_>) -> Result<EccCounts, NvmlError> {
    Ok(EccCounts {
        corrected_volatile: dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)?,
        uncorrected_volatile: dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)?,
        corrected_aggregate: dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)?,
        uncorrected_aggregate: dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)?,
    })
}

/// Aggregate (corrected, uncorrected) ECC errors per memory location the device reports.
fn ecc_by_location(dev: &nvml_wrapper::Device<'_>) -> Result<std::collections::BTreeMap<&'static str, (u64, u64)>, NvmlError> {
    use nvml_wrapper::enum_wrappers::device::MemoryLocation as L;
    let mut by = std::collections::BTreeMap::new();
    let mut last_err = NvmlError::NotSupported;
    for (name, loc) in [
        ("l1_cache", L::L1Cache),
        ("l2_cache", L::L2Cache),
        ("device_memory", L::Device),
        ("register_file", L::RegisterFile),
        ("texture", L::Texture),
        ("shared", L::Shared),
        ("cbu", L::Cbu),
        ("sram", L::SRAM),
    ] {
        let c = dev.memory_error_counter(MemoryError::Corrected, EccCounter::Aggregate, loc);
        let u = dev.memory_error_counter(MemoryError::Uncorrected, EccCounter::Aggregate, loc);
        match (c, u) {
            (Ok(c), Ok(u)) => {
                by.insert(name, (c, u));
            }
            (Err(e), _) | (_, Err(e)) => last_err = e,
        }
    }
    if by.is_empty() {
        Err(last_err)
    } else {
        Ok(by)
    }
}

/// Field values: memory temperature and remapped rows.
fn field_readings(u: &mut HashSet<(u32, &'static str)>, index: u32, dev: &nvml_wrapper::Device<'_>, s: &mut GpuSample) {
    let ids = [FI_DEV_MEMORY_TEMP, FI_DEV_REMAPPED_COR, FI_DEV_REMAPPED_UNC, FI_DEV_REMAPPED_PENDING, FI_DEV_REMAPPED_FAILURE];
    let fields: Vec<Option<u64>> = reading(u, index, "field_values", s, || {
        let vals = dev.field_values_for(&ids.map(FieldId))?;
        Ok(vals.into_iter().map(|r| r.ok().and_then(|f| f.value.ok()).and_then(field_u64)).collect())
    })
    .unwrap_or_default();
    let field = |i: usize| fields.get(i).copied().flatten();
    s.memory_temp_c = field(0).map(|v| v as u32);
    if s.memory_temp_c.is_none() {
        s.unsupported.insert("memory_temperature");
    }
    s.remapped_rows = match (field(1), field(2), field(3), field(4)) {
        (Some(c), Some(u), Some(p), Some(f)) => Some(RemappedRows { correctable: c, uncorrectable: u, pending: p != 0, failure: f != 0 }),
        _ => {
            s.unsupported.insert("remapped_rows");
            None
        }
    };
}

/// One reading of one device; an unsupported one is remembered in
/// `unsupported` and not attempted again.
fn reading<T>(
    unsupported: &mut HashSet<(u32, &'static str)>,
    index: u32,
    what: &'static str,
    sample: &mut GpuSample,
    f: impl FnOnce() -> Result<T, NvmlError>,
) -> Option<T> {
    if unsupported.contains(&(index, what)) {
        sample.unsupported.insert(what);
        return None;
    }
    match f() {
        Ok(v) => Some(v),
        Err(e) => {
            if is_unsupported(&e) {
                unsupported.insert((index, what));
            }
            sample.unsupported.insert(what);
            None
        }
    }
}

fn field_u64(v: nvml_wrapper::enums::device::SampleValue) -> Option<u64> {
    use nvml_wrapper::enums::device::SampleValue::*;
    match v {
        U32(x) => Some(x as u64),
        U64(x) => Some(x),
        I64(x) => u64::try_from(x).ok(),
        F64(x) => Some(x as u64),
    }
}
