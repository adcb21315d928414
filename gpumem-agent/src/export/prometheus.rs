//! Prometheus exposition (OpenMetrics text, prometheus-client).
//!
//! Histograms and counters accumulate event by event; gauges are read from
//! state, NVML and the agent itself at scrape time. Names follow DESIGN.md §5:
//! `gpumem_` prefix, base units, counters ending in `_total`, device labels as
//! dcgm-exporter names them (`gpu`, `UUID`, `pci_bus_id`, `modelName`),
//! workload labels `pid`, `comm`, `container`, `pod`, `namespace`.
//!
//! Cardinality is bounded: at most `max_process_series` (process, device)
//! series, the largest by live bytes; the rest are summed into one series per
//! device with `comm="other"` and empty pid. Processes that exited show 0 until
//! the caller forgets them (after its grace period), then their series go.
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap as HashMap;

use gpumem_common::DEVICE_UNKNOWN;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        counter::ConstCounter,
        family::Family,
        gauge::ConstGauge,
        histogram::Histogram,
        MetricType,
    },
    registry::Registry,
};

use super::names::{api_name, result_name};
use crate::{
    analysis::{
        distributions::{MemoryKind, Observation},
        health::Health,
        leaks::{self, GrowthTracker},
        reconcile,
    },
    events::LostEvents,
    nvml::GpuSample,
    state::{Applied, Process, State},
};

type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Allocation sizes: powers of 4 from 256 B to 64 GiB (15 buckets). CUDA
/// rounds small allocations up to 512 B and caching allocators carve 2 MiB
/// and 20 MiB segments; a factor of 4 separates those classes while keeping
/// each label set to 16 series.
pub fn size_buckets() -> impl Iterator<Item = f64> {
    (0..15).map(|i| 256.0 * 4f64.powi(i))
}

/// Allocation lifetimes: per-step temporaries live milliseconds, cached
/// blocks minutes to the life of the job (a day or more); the buckets follow
/// the units people reason in (ms, s, min, h, day).
pub const LIFETIME_BUCKETS: [f64; 12] = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 4.0 * 3600.0, 12.0 * 3600.0, 86400.0];

/// Call latency: powers of 4 from 1 µs to 4 s (12 buckets). A uprobe alone
/// costs 1–20 µs, a cached allocation a few µs, a synchronising cuMemFree or
/// a fresh cuMemAlloc of GiBs milliseconds to seconds.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    (0..12).map(|i| 1e-6 * 4f64.powi(i))
}

#[derive(Clone, Copy, Debug)]
pub struct ExportConfig {
    /// Most (process, device) series; the rest are aggregated as comm="other".
    pub max_process_series: usize,
    /// Live allocations at least this old count as leak suspects while the
    /// process's growth detector fires.
    pub leak_age_ns: u64,
}

/// What a scrape reads besides the exporter's own accumulators.
pub struct Inputs<'a> {
    pub state: &'a State,
    pub growth: &'a mut GrowthTracker,
    /// The latest NVML reading per GPU; empty without NVML.
    pub gpus: &'a [GpuSample],
    /// Health per GPU index, over the health window.
    pub health: &'a BTreeMap<u32, Health>,
    /// Why NVML cannot be used, if it cannot.
    pub nvml_error: Option<&'a str>,
    pub lost: &'a LostEvents,
    pub probes_attached: usize,
    /// Calls whose thread died inside the driver, removed from the kernel's tables.
    pub stale_calls_removed: u64,
    /// CLOCK_MONOTONIC now, the clock of the events.
    pub now_ns: u64,
}

pub struct Exporter {
    cfg: ExportConfig,
    registry: Registry,
    sizes: HistogramFamily,
    lifetimes: HistogramFamily,
    latencies: HistogramFamily,
    /// Handles into the families above, by API and kind of memory.
    latency_of: HashMap<u32, Histogram>,
    size_of: HashMap<MemoryKind, Histogram>,
    lifetime_of: HashMap<MemoryKind, Histogram>,
    /// (api, CUresult) → calls.
    api_calls: HashMap<(u32, u32), u64>,
    /// (device, fragmentation) → CUDA out-of-memory failures.
    cuda_ooms: BTreeMap<(i32, bool), u64>,
    /// "host" or "memcg" → OOM kills.
    oom_kills: BTreeMap<&'static str, u64>,
    /// (GPU index, XID) → events.
    xids: BTreeMap<(u32, u64), u64>,
    /// Device → processes that exited holding memory on it.
    exits: BTreeMap<i32, u64>,
    events: u64,
    /// Devices each process held memory on, so that its series read 0 after
    /// it exits (until it is forgotten) instead of vanishing at once.
    seen_devices: HashMap<u32, BTreeSet<i32>>,
}

/// Values for the snapshot part of a scrape.
#[derive(Clone, Copy, Debug)]
enum Value {
    Int(i64),
    Float(f64),
    Count(u64),
    /// A counter of fractional units (CPU seconds).
    FloatCount(f64),
}

#[derive(Debug)]
struct Fam {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    series: Vec<(Labels, Value)>,
}

/// The scrape-time families, encoded by prometheus-client.
#[derive(Debug)]
struct Snapshot(Vec<Fam>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let mut family = encoder.encode_descriptor(f.name, f.help, None, f.kind)?;
            for (labels, v) in &f.series {
                let m = family.encode_family(labels)?;
                match *v {
                    Value::Int(x) => ConstGauge::new(x).encode(m)?,
                    Value::Float(x) => ConstGauge::new(x).encode(m)?,
                    Value::Count(x) => ConstCounter::new(x).encode(m)?,
                    Value::FloatCount(x) => ConstCounter::new(x).encode(m)?,
                }
            }
        }
        Ok(())
    }
}

/// Builds the snapshot families in order.
struct Families(Vec<Fam>);

impl Families {
    fn add(&mut self, name: &'static str, help: &'static str, kind: MetricType) -> &mut Vec<(Labels, Value)> {
        self.0.push(Fam { name, help, kind, series: Vec::new() });
        &mut self.0.last_mut().expect("pushed").series
    }
    fn gauge(&mut self, name: &'static str, help: &'static str) -> &mut Vec<(Labels, Value)> {
        self.add(name, help, MetricType::Gauge)
    }
    /// `name` without `_total`: the encoder appends it.
    fn counter(&mut self, name: &'static str, help: &'static str) -> &mut Vec<(Labels, Value)> {
        self.add(name, help, MetricType::Counter)
    }
}

fn int(v: u64) -> Value {
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn bool_value(b: bool) -> Value {
    Value::Int(b as i64)
}

/// dcgm-exporter's device labels, filled from NVML where it has the GPU.
fn device_labels(device: i32, gpus: &[GpuSample]) -> Labels {
    let gpu = gpus.iter().find(|g| device >= 0 && g.index == device as u32);
    vec![
        ("gpu", if device == DEVICE_UNKNOWN { "unknown".to_string() } else { device.to_string() }),
        ("UUID", gpu.map(|g| g.uuid.clone()).unwrap_or_default()),
        ("pci_bus_id", gpu.map(|g| g.pci_bus_id.clone()).unwrap_or_default()),
        ("modelName", gpu.map(|g| g.name.clone()).unwrap_or_default()),
    ]
}

fn gpu_labels(g: &GpuSample) -> Labels {
    vec![("gpu", g.index.to_string()), ("UUID", g.uuid.clone()), ("pci_bus_id", g.pci_bus_id.clone()), ("modelName", g.name.clone())]
}

fn workload_labels(p: Option<&Process>, pid: Option<u32>) -> Labels {
    let c = p.and_then(|p| p.container.as_ref());
    vec![
        ("pid", pid.map(|p| p.to_string()).unwrap_or_default()),
        ("comm", match (p, pid) {
            (Some(p), _) => p.comm.clone(),
            (None, Some(_)) => String::new(),
            (None, None) => "other".to_string(),
        }),
        ("container", c.and_then(|c| c.container.clone()).unwrap_or_default()),
        // The pod's name where its container shows it, else its UID.
        ("pod", c.and_then(|c| c.pod_name.clone().or_else(|| c.pod_uid.clone())).unwrap_or_default()),
        ("namespace", c.and_then(|c| c.namespace.clone()).unwrap_or_default()),
    ]
}

/// One (process, device) series.
#[derive(Clone, Debug, Default)]
struct Row {
    pid: Option<u32>,
    device: i32,
    live_bytes: u64,
    allocs: u64,
    vmm_physical_bytes: u64,
    reserved_bytes: u64,
    leak_suspect_bytes: u64,
    growth_bytes_per_s: f64,
    leaking: bool,
}

impl Exporter {
    pub fn new(cfg: ExportConfig) -> Self {
        let mut registry = Registry::default();
        let sizes: HistogramFamily = Family::new_with_constructor(|| Histogram::new(size_buckets()));
        let lifetimes: HistogramFamily = Family::new_with_constructor(|| Histogram::new(LIFETIME_BUCKETS));
        let latencies: HistogramFamily = Family::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register("gpumem_allocation_size_bytes", "Size of successful allocations, by kind of memory", sizes.clone());
        registry.register(
            "gpumem_allocation_lifetime_seconds",
            "Time from allocation to its explicit free, by kind of memory (memory released by process exit or context destruction is not counted)",
            lifetimes.clone(),
        );
        registry.register("gpumem_api_latency_seconds", "Time spent in each traced driver call, entry to return", latencies.clone());
        Exporter {
            cfg,
            registry,
            sizes,
            lifetimes,
            latencies,
            latency_of: HashMap::default(),
            size_of: HashMap::default(),
            lifetime_of: HashMap::default(),
            api_calls: HashMap::default(),
            cuda_ooms: BTreeMap::new(),
            oom_kills: BTreeMap::new(),
            xids: BTreeMap::new(),
            exits: BTreeMap::new(),
            events: 0,
            seen_devices: HashMap::default(),
        }
    }

    /// Counts one event (call it after the state has applied it).
    pub fn observe(&mut self, ev: &gpumem_common::Event, applied: &Applied, obs: Option<&Observation>) {
        self.events += 1;
        if let Some(o) = obs {
            *self.api_calls.entry((o.api, ev.result)).or_default() += 1;
            // Histogram handles are cached: a family lookup builds its label set (allocations) every time.
            let latencies = &self.latencies;
            self.latency_of
                .entry(o.api)
                .or_insert_with(|| latencies.get_or_create(&vec![("api", api_name(o.api).to_string())]).clone())
                .observe(o.latency_ns as f64 / 1e9);
            if let Some((kind, size)) = o.allocation {
                let sizes = &self.sizes;
                self.size_of.entry(kind).or_insert_with(|| sizes.get_or_create(&kind_labels(kind)).clone()).observe(size as f64);
            }
            if let Some((kind, ns)) = o.lifetime {
                let lifetimes = &self.lifetimes;
                self.lifetime_of.entry(kind).or_insert_with(|| lifetimes.get_or_create(&kind_labels(kind)).clone()).observe(ns as f64 / 1e9);
            }
        }
        if let Some(oom) = &applied.cuda_oom {
            *self.cuda_ooms.entry((oom.device, oom.fragmentation)).or_default() += 1;
        }
        if ev.api == gpumem_common::api::PROCESS_EXIT {
            for r in &applied.released {
                *self.exits.entry(r.device).or_default() += 1;
            }
        }
        if let Some(kill) = &applied.oom_kill {
            *self.oom_kills.entry(if kill.memcg.is_some() { "memcg" } else { "host" }).or_default() += 1;
        }
    }

    pub fn observe_xid(&mut self, gpu: u32, xid: u64) {
        *self.xids.entry((gpu, xid)).or_default() += 1;
    }

    /// The process is gone from state: its series go too.
    pub fn forget_process(&mut self, pid: u32) {
        self.seen_devices.remove(&pid);
    }

    /// The whole exposition, ending with `# EOF`.
    pub fn render(&mut self, inp: Inputs<'_>) -> Result<String, std::fmt::Error> {
        let mut fams = Families(Vec::new());
        self.process_families(&mut fams, inp.state, inp.growth, inp.gpus, inp.now_ns);
        self.event_families(&mut fams, inp.state, inp.gpus);
        gpu_families(&mut fams, inp.state, inp.gpus, inp.health, &self.xids);
        self_families(&mut fams, &inp, self.events);
        let mut out = String::with_capacity(64 * 1024);
        prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)?;
        let mut snapshot = Registry::default();
        snapshot.register_collector(Box::new(Snapshot(fams.0)));
        prometheus_client::encoding::text::encode_registry(&mut out, &snapshot)?;
        prometheus_client::encoding::text::encode_eof(&mut out)?;
        Ok(out)
    }

    fn process_families(&mut self, fams: &mut Families, state: &State, growth: &mut GrowthTracker, gpus: &[GpuSample], now_ns: u64) {
        let mut rows = Vec::new();
        for p in state.processes.values() {
            let seen = self.seen_devices.entry(p.pid).or_default();
            seen.extend(p.devices.keys().copied());
            for &device in seen.iter() {
                let mut row = Row { pid: Some(p.pid), device, ..Default::default() };
                if let Some(t) = p.devices.get(&device) {
                    row.live_bytes = t.live_bytes;
                    row.allocs = t.live_allocs;
                    row.vmm_physical_bytes = t.vmm_physical_bytes;
                    row.reserved_bytes = t.reserved_bytes;
                }
                if !p.exited {
                    if let Some(v) = growth.verdict(p.pid, device) {
                        row.growth_bytes_per_s = v.rate_bytes_per_s;
                        row.leaking = v.leaking;
                    }
                    if row.leaking {
                        row.leak_suspect_bytes = leaks::bytes_allocated_before(p, device, now_ns.saturating_sub(self.cfg.leak_age_ns));
                    }
                }
                rows.push(row);
            }
        }
        let total_rows = rows.len();
        // The largest holders keep their own series; the long tail is summed per device.
        rows.sort_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then(a.pid.cmp(&b.pid)).then(a.device.cmp(&b.device)));
        let cap = self.cfg.max_process_series;
        let mut other: BTreeMap<i32, Row> = BTreeMap::new();
        for r in rows.drain(cap.min(rows.len())..) {
            let o = other.entry(r.device).or_insert(Row { device: r.device, ..Default::default() });
            o.live_bytes += r.live_bytes;
            o.allocs += r.allocs;
            o.vmm_physical_bytes += r.vmm_physical_bytes;
            o.reserved_bytes += r.reserved_bytes;
            o.leak_suspect_bytes += r.leak_suspect_bytes;
            o.growth_bytes_per_s += r.growth_bytes_per_s;
            o.leaking |= r.leaking;
        }
        let aggregated = total_rows - rows.len();
        rows.extend(other.into_values());
        let labels = |r: &Row| {
            let mut l = workload_labels(r.pid.and_then(|pid| state.processes.get(&pid)), r.pid);
            l.extend(device_labels(r.device, gpus));
            l
        };
        let series: Vec<(Labels, &Row)> = rows.iter().map(|r| (labels(r), r)).collect();
        let mut each = |name, help, f: &dyn Fn(&Row) -> Value| {
            let s = fams.gauge(name, help);
            s.extend(series.iter().map(|(l, r)| (l.clone(), f(r))));
        };
        each("gpumem_process_memory_bytes", "Device memory the process holds on the GPU, as traced: allocations plus VMM physical handles", &|r| int(r.live_bytes));
        each("gpumem_process_allocations", "Live allocations and VMM handles the process holds on the GPU", &|r| int(r.allocs));
        each("gpumem_process_vmm_physical_bytes", "Part of the process's memory held as cuMemCreate handles", &|r| int(r.vmm_physical_bytes));
        each("gpumem_process_vmm_reserved_bytes", "Address space reserved with cuMemAddressReserve (not memory)", &|r| int(r.reserved_bytes));
        each(
            "gpumem_process_leak_suspect_bytes",
            "While the growth detector fires for the process: bytes of its live allocations older than --leak-age",
            &|r| int(r.leak_suspect_bytes),
        );
        each("gpumem_process_memory_growth_bytes_per_second", "Slope of the floor of the process's live bytes (growth detector)", &|r| {
            Value::Float(r.growth_bytes_per_s)
        });
        each("gpumem_process_leak_suspected", "1 while the growth detector says the process's memory keeps growing", &|r| bool_value(r.leaking));

        let pinned = fams.gauge("gpumem_process_host_pinned_bytes", "Page-locked host memory the process holds (cuMemHostAlloc/cuMemAllocHost)");
        let mut pinned_rows: Vec<&Process> = state.processes.values().filter(|p| p.host_pinned_allocs > 0).collect();
        pinned_rows.sort_by(|a, b| b.host_pinned_bytes.cmp(&a.host_pinned_bytes).then(a.pid.cmp(&b.pid)));
        let mut pinned_other = 0u64;
        for (i, p) in pinned_rows.iter().enumerate() {
            if i < cap {
                pinned.push((workload_labels(Some(p), Some(p.pid)), int(p.host_pinned_bytes)));
            } else {
                pinned_other += p.host_pinned_bytes;
            }
        }
        if pinned_rows.len() > cap {
            pinned.push((workload_labels(None, None), int(pinned_other)));
        }

        // Only processes that lost events: their other series are uncertain.
        let lost = fams.counter("gpumem_process_events_lost", "Events of the process lost in the kernel (ring buffer or call table full): its other series may be wrong");
        for p in state.processes.values().filter(|p| p.events_lost > 0).take(cap) {
            lost.push((workload_labels(Some(p), Some(p.pid)), Value::Count(p.events_lost)));
        }

        let untracked = fams.gauge(
            "gpumem_process_untracked_bytes",
            "GPU memory NVML reports for the process minus what gpumem traced (context overhead, memory allocated before the agent started, untraced paths)",
        );
        for r in reconcile::reconcile(state, gpus).into_iter().take(cap) {
            let mut l = workload_labels(state.processes.get(&r.pid), Some(r.pid));
            l.extend(device_labels(r.gpu as i32, gpus));
            untracked.push((l, Value::Int(r.untracked_bytes)));
        }
        fams.gauge("gpumem_exporter_process_series", "(process, device) pairs known, before the cap")
            .push((vec![], int(total_rows as u64)));
        fams.gauge("gpumem_exporter_aggregated_process_series", "(process, device) pairs summed into comm=\"other\" because of --max-process-series")
            .push((vec![], int(aggregated as u64)));
    }

    fn event_families(&self, fams: &mut Families, state: &State, gpus: &[GpuSample]) {
        let calls = fams.counter("gpumem_api_calls", "Traced driver calls by API and result (success or the CUresult name)");
        // Counted in a hash map (per event), rendered in a stable order.
        let sorted: BTreeMap<(u32, u32), u64> = self.api_calls.iter().map(|(&k, &v)| (k, v)).collect();
        for ((api, result), n) in sorted {
            let result = if result == 0 { "success".to_string() } else { result_name(result).map_or_else(|| result.to_string(), str::to_string) };
            calls.push((vec![("api", api_name(api).to_string()), ("result", result)], Value::Count(n)));
        }
        // Counters start at 0 on every known GPU, so that the first event is
        // an increase Prometheus can see (increase() needs a sample before it).
        let known = known_devices(state, gpus);
        let mut by_device: BTreeMap<i32, (u64, u64)> = known.iter().map(|&d| (d, (0, 0))).collect();
        for (&(device, frag), &n) in &self.cuda_ooms {
            let e = by_device.entry(device).or_default();
            e.0 += n;
            if frag {
                e.1 += n;
            }
        }
        let ooms = fams.counter("gpumem_cuda_oom", "CUDA allocations that failed with CUDA_ERROR_OUT_OF_MEMORY");
        ooms.extend(by_device.iter().map(|(&d, &(n, _))| (device_labels(d, gpus), Value::Count(n))));
        let frag = fams.counter(
            "gpumem_fragmentation_failures",
            "CUDA out-of-memory failures while the process's own cuMemGetInfo reported at least the requested size free",
        );
        frag.extend(by_device.iter().map(|(&d, &(_, f))| (device_labels(d, gpus), Value::Count(f))));
        let exits = fams.counter(
            "gpumem_process_exits",
            "Processes that exited while holding memory on the GPU (the driver frees it): an exit explains a drop in used memory",
        );
        let mut exit_counts: BTreeMap<i32, u64> = known.iter().map(|&d| (d, 0)).collect();
        exit_counts.extend(self.exits.iter().map(|(&d, &n)| (d, n)));
        exits.extend(exit_counts.iter().map(|(&d, &n)| (device_labels(d, gpus), Value::Count(n))));
        let kills = fams.counter("gpumem_oom_kills", "Host OOM kills (oom:mark_victim), source=memcg when in a memory cgroup with a limit");
        for source in ["host", "memcg"] {
            kills.push((vec![("source", source.to_string())], Value::Count(self.oom_kills.get(source).copied().unwrap_or(0))));
        }
    }
}

/// GPUs NVML reports and devices traced processes hold memory on.
fn known_devices(state: &State, gpus: &[GpuSample]) -> BTreeSet<i32> {
    let mut known: BTreeSet<i32> = gpus.iter().map(|g| g.index as i32).collect();
    known.extend(state.processes.values().flat_map(|p| p.devices.keys().copied()).filter(|&d| d != DEVICE_UNKNOWN));
    known
}

/// XIDs that mean lost data or a lost GPU: their counters start at 0 on every
/// GPU so that alerts see the first one (others appear when they happen).
const CRITICAL_XIDS: [u64; 4] = [48, 64, 79, 95];

fn kind_labels(kind: MemoryKind) -> Labels {
    vec![("memory", kind.label().to_string())]
}

fn gpu_families(fams: &mut Families, state: &State, gpus: &[GpuSample], health: &BTreeMap<u32, Health>, xids: &BTreeMap<(u32, u64), u64>) {
    let mut per_gpu = |name, help, kind, f: &dyn Fn(&GpuSample) -> Vec<(Labels, Value)>| {
        let s = fams.add(name, help, kind);
        for g in gpus {
            for (extra, v) in f(g) {
                let mut l = gpu_labels(g);
                l.extend(extra);
                s.push((l, v));
            }
        }
    };
    use MetricType::{Counter, Gauge};
    per_gpu("gpumem_gpu_memory_total_bytes", "GPU memory size (NVML)", Gauge, &|g| g.memory.iter().map(|m| (vec![], int(m.total))).collect());
    per_gpu("gpumem_gpu_memory_used_bytes", "GPU memory in use, all processes and the driver (NVML)", Gauge, &|g| {
        g.memory.iter().map(|m| (vec![], int(m.used))).collect()
    });
    per_gpu("gpumem_gpu_traced_memory_bytes", "GPU memory held by traced processes (sum of gpumem_process_memory_bytes)", Gauge, &|g| {
        let sum: u64 = state.processes.values().filter_map(|p| p.devices.get(&(g.index as i32))).map(|t| t.live_bytes).sum();
        vec![(vec![], int(sum))]
    });
    per_gpu("gpumem_gpu_ecc_errors", "ECC errors (NVML), by error type and counter (volatile: since driver load; aggregate: lifetime)", Counter, &|g| {
        let Some(e) = &g.ecc else { return vec![] };
        let l = |t: &str, c: &str| vec![("error_type", t.to_string()), ("counter", c.to_string())];
        vec![
            (l("corrected", "volatile"), Value::Count(e.corrected_volatile)),
            (l("uncorrected", "volatile"), Value::Count(e.uncorrected_volatile)),
            (l("corrected", "aggregate"), Value::Count(e.corrected_aggregate)),
            (l("uncorrected", "aggregate"), Value::Count(e.uncorrected_aggregate)),
        ]
    });
    per_gpu("gpumem_gpu_retired_pages", "Memory pages retired (NVML), by cause", Gauge, &|g| {
        let Some(r) = &g.retired_pages else { return vec![] };
        vec![(vec![("cause", "single_bit_ecc".to_string())], int(r.single_bit)), (vec![("cause", "double_bit_ecc".to_string())], int(r.double_bit))]
    });
    per_gpu("gpumem_gpu_retired_pages_pending", "1 when a page retirement waits for the next driver reload", Gauge, &|g| {
        g.retired_pages.iter().map(|r| (vec![], bool_value(r.pending))).collect()
    });
    per_gpu("gpumem_gpu_remapped_rows", "Rows remapped (NVML), by kind of error that caused it", Gauge, &|g| {
        let Some(r) = &g.remapped_rows else { return vec![] };
        vec![(vec![("kind", "correctable".to_string())], int(r.correctable)), (vec![("kind", "uncorrectable".to_string())], int(r.uncorrectable))]
    });
    per_gpu("gpumem_gpu_row_remap_pending", "1 when a row remap waits for the next GPU reset", Gauge, &|g| {
        g.remapped_rows.iter().map(|r| (vec![], bool_value(r.pending))).collect()
    });
    per_gpu("gpumem_gpu_row_remap_failure", "1 when a row remap failed (the GPU should be replaced)", Gauge, &|g| {
        g.remapped_rows.iter().map(|r| (vec![], bool_value(r.failure))).collect()
    });
    per_gpu("gpumem_gpu_temperature_celsius", "GPU core temperature (NVML)", Gauge, &|g| g.gpu_temp_c.iter().map(|&t| (vec![], Value::Int(t as i64))).collect());
    per_gpu("gpumem_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature (NVML field 82)", Gauge, &|g| {
        g.memory_temp_c.iter().map(|&t| (vec![], Value::Int(t as i64))).collect()
    });
    per_gpu("gpumem_gpu_xid_errors", "XID events received from NVML since the agent started, by XID code", Counter, &|g| {
        let mut counts: BTreeMap<u64, u64> = CRITICAL_XIDS.iter().map(|&x| (x, 0)).collect();
        counts.extend(xids.range((g.index, 0)..=(g.index, u64::MAX)).map(|(&(_, xid), &n)| (xid, n)));
        counts.into_iter().map(|(xid, n)| (vec![("xid", xid.to_string())], Value::Count(n))).collect()
    });
    per_gpu("gpumem_gpu_health_score", "Health score 0-100 from ECC, retirement, remap, temperature and XID rules (see `gpumem health`)", Gauge, &|g| {
        health.get(&g.index).map(|h| (vec![], Value::Int(h.score as i64))).into_iter().collect()
    });
}

fn self_families(fams: &mut Families, inp: &Inputs<'_>, events: u64) {
    let lost = fams.counter("gpumem_lost_events", "Events that never reached the agent, by reason");
    for (reason, n) in [
        ("ringbuf_full", inp.lost.ringbuf_full),
        ("pending_full", inp.lost.pending_full),
        ("return_without_entry", inp.lost.return_without_entry),
        ("malformed", inp.lost.malformed),
    ] {
        lost.push((vec![("reason", reason.to_string())], Value::Count(n)));
    }
    let o = &inp.state.overflow;
    let overflow = fams.counter("gpumem_table_overflow", "Records not kept because a bounded table was full, by table");
    overflow.push((vec![("table", "allocations".to_string())], Value::Count(o.entries_dropped)));
    overflow.push((vec![("table", "processes".to_string())], Value::Count(o.process_events_dropped)));
    fams.counter("gpumem_implausible_events", "Successful calls with a size no GPU could hold (an ABI mismatch or garbled read): not applied")
        .push((vec![], Value::Count(inp.state.implausible_events)));
    fams.gauge("gpumem_probes_attached", "uprobes, uretprobes and tracepoints attached").push((vec![], int(inp.probes_attached as u64)));
    fams.counter("gpumem_stale_calls_removed", "Calls whose thread died inside the driver (never returned): their saved entries removed, nothing counted for them")
        .push((vec![], Value::Count(inp.stale_calls_removed)));
    fams.counter("gpumem_events_processed", "Events read from the ring buffer and applied").push((vec![], Value::Count(events)));
    fams.gauge("gpumem_tracked_processes", "Processes in the agent's state, live or recently exited").push((vec![], int(inp.state.processes.len() as u64)));
    fams.gauge("gpumem_nvml_up", "1 when NVML answers (GPU series come from it)").push((vec![], bool_value(inp.nvml_error.is_none())));
    let (cpu_s, rss) = (crate::selfstat::cpu_seconds(), crate::selfstat::resident_bytes());
    fams.counter("gpumem_agent_cpu_seconds", "CPU time the agent has used (user + system)").push((vec![], Value::FloatCount(cpu_s)));
    fams.gauge("gpumem_agent_resident_memory_bytes", "The agent's resident memory, BPF ring buffer mapping included").push((vec![], int(rss)));
    fams.gauge("gpumem_agent_bpf_map_resident_memory_bytes", "Part of the resident memory that is BPF maps mapped from the kernel (the event ring buffer, whose pages are mapped twice)")
        .push((vec![], int(crate::selfstat::bpf_map_resident_bytes())));
    fams.gauge("gpumem_build_info", "The agent's version").push((vec![("version", env!("CARGO_PKG_VERSION").to_string())], Value::Int(1)));
}

/// The classic Prometheus text format (0.0.4) from OpenMetrics text: the
/// same samples; a counter's HELP and TYPE name its `_total` series, and the
/// UNIT and EOF lines go.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(h) = line.strip_prefix("# HELP ") {
            help = Some(h);
            continue;
        }
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|t| t.rsplit_once(' ')) {
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), kind),
                "unknown" => (name.to_string(), "untyped"),
                _ => (name.to_string(), kind),
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(&format!("# HELP {h}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::{
        analysis::distributions::observe,
        state::{testing::ev, Limits},
    };

    const MIB: u64 = 1 << 20;

    struct Fixture {
        state: State,
        exporter: Exporter,
        growth: GrowthTracker,
    }

    impl Fixture {
        fn new(max_process_series: usize) -> Self {
            Fixture {
                state: State::new(Limits::default()),
                exporter: Exporter::new(ExportConfig { max_process_series, leak_age_ns: 0 }),
                growth: GrowthTracker::default(),
            }
        }
        fn feed(&mut self, e: Event) {
            let applied = self.state.apply(&e);
            let o = observe(&e, &applied);
            self.exporter.observe(&e, &applied, o.as_ref());
        }
        /// A process `pid` with `mib` MiB live on device 0.
        fn holder(&mut self, pid: u32, mib: u64) {
            let at = |e: Event| Event { pid, tid: pid, ..e };
            self.feed(at(Event { handle: 0xc, device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }));
            self.feed(at(Event { handle: 0xc, ..ev(api::CU_CTX_SET_CURRENT) }));
            self.feed(at(Event { addr: 0x1000, size: mib * MIB, latency_ns: 3_000, ..ev(api::CU_MEM_ALLOC_V2) }));
        }
        fn render(&mut self) -> String {
            let lost = LostEvents::default();
            let health = BTreeMap::new();
            self.exporter
                .render(Inputs {
                    state: &self.state,
                    growth: &mut self.growth,
                    gpus: &[],
                    health: &health,
                    nvml_error: Some("not loaded"),
                    lost: &lost,
                    probes_attached: 30,
                    stale_calls_removed: 0,
                    now_ns: 0,
                })
                .unwrap()
        }
    }

    /// The sample lines of one metric, without their HELP/TYPE.
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])).collect()
    }

    #[test]
    fn live_bytes_counters_and_histograms() {
        let mut f = Fixture::new(100);
        f.holder(100, 3);
        f.feed(Event { result: 2, size: 1 << 30, ..ev(api::CU_MEM_ALLOC_V2) });
        let text = f.render();
        assert_eq!(
            samples(&text, "gpumem_process_memory_bytes"),
            ["gpumem_process_memory_bytes{pid=\"100\",comm=\"python\",container=\"\",pod=\"\",namespace=\"\",gpu=\"0\",UUID=\"\",pci_bus_id=\"\",modelName=\"\"} 3145728"]
        );
        assert!(text.contains("gpumem_api_calls_total{api=\"cuMemAlloc_v2\",result=\"success\"} 1\n"), "{text}");
        assert!(text.contains("gpumem_api_calls_total{api=\"cuMemAlloc_v2\",result=\"CUDA_ERROR_OUT_OF_MEMORY\"} 1\n"), "{text}");
        assert!(text.contains("gpumem_cuda_oom_total{gpu=\"0\",UUID=\"\",pci_bus_id=\"\",modelName=\"\"} 1\n"), "{text}");
        // 3 MiB falls in the 4 MiB bucket (256 * 4^7), not the 1 MiB one.
        assert!(text.contains("gpumem_allocation_size_bytes_bucket{le=\"1048576.0\",memory=\"device\"} 0\n"), "{text}");
        assert!(text.contains("gpumem_allocation_size_bytes_bucket{le=\"4194304.0\",memory=\"device\"} 1\n"), "{text}");
        assert!(text.contains("gpumem_allocation_size_bytes_count{memory=\"device\"} 1\n"), "{text}");
        assert!(text.contains("gpumem_api_latency_seconds_count{api=\"cuMemAlloc_v2\"} 2\n"), "{text}");
        assert!(text.contains("gpumem_nvml_up 0\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn the_long_tail_is_summed_into_other() {
        let mut f = Fixture::new(2);
        for (pid, mib) in [(101, 5), (102, 1), (103, 7), (104, 2)] {
            f.holder(pid, mib);
        }
        let text = f.render();
        let rows = samples(&text, "gpumem_process_memory_bytes");
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert!(rows[0].contains("pid=\"103\"") && rows[0].ends_with(" 7340032"));
        assert!(rows[1].contains("pid=\"101\"") && rows[1].ends_with(" 5242880"));
        assert!(rows[2].contains("pid=\"\",comm=\"other\"") && rows[2].ends_with(" 3145728"), "{}", rows[2]);
        assert!(text.contains("gpumem_exporter_aggregated_process_series 2\n"));
    }

    #[test]
    fn an_exited_process_reads_zero_until_forgotten() {
        let mut f = Fixture::new(10);
        f.holder(100, 3);
        f.render();
        f.feed(Event { ts_ns: 50, ..ev(api::PROCESS_EXIT) });
        let text = f.render();
        let rows = samples(&text, "gpumem_process_memory_bytes");
        assert_eq!(rows.len(), 1);
        assert!(rows[0].ends_with(" 0"), "{rows:?}");
        for pid in f.state.forget_exited_before(51) {
            f.exporter.forget_process(pid);
        }
        assert!(samples(&f.render(), "gpumem_process_memory_bytes").is_empty());
    }

    #[test]
    fn label_values_from_traced_processes_are_escaped() {
        let mut f = Fixture::new(10);
        f.holder(100, 1);
        f.feed(Event { comm: *b"a\"b\\c\nd}\0\0\0\0\0\0\0\0", ..ev(api::CU_INIT) });
        let text = f.render();
        assert!(text.contains("comm=\"a\\\"b\\\\c\\nd}\""), "{text}");
    }

    #[test]
    fn text_format_names_counters_by_their_total_series() {
        let om = "# HELP x_calls Calls.\n# TYPE x_calls counter\nx_calls_total 3\n# HELP y Y.\n# TYPE y gauge\n# UNIT y bytes\ny 1\n# EOF\n";
        assert_eq!(to_text_format(om), "# HELP x_calls_total Calls.\n# TYPE x_calls_total counter\nx_calls_total 3\n# HELP y Y.\n# TYPE y gauge\ny 1\n");
    }
}
