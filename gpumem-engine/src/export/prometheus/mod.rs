//! Prometheus exposition (OpenMetrics text, written as prometheus-client writes it: families.rs), rendered
//! from what the analyses and the agent hold: the view's rows (capped by
//! `analysis::view::cap`), the event counters and distributions, NVML's
//! readings and the agent's own status. Nothing here computes or reads /proc.
//!
//! Device labels as dcgm-exporter names them (`gpu`, `UUID`, `pci_bus_id`,
//! `modelName`), workload labels `pid`, `comm`, `container`, `pod`,
//! `namespace`. Processes that exited read 0 until they are forgotten (after
//! the grace period), then their series go.
mod agent;
pub mod catalog;
pub mod families;
pub mod text;

use std::collections::BTreeMap;

use gpumem_common::DEVICE_UNKNOWN;

use crate::names::{api_name, result_name};
use crate::{
    analysis::{
        counters::{EventCounts, KillSource, OomCount},
        distributions::Distributions,
        health::{self, GpuWatch},
        triggers::TriggerKind,
        view::{View, Workload},
    },
    model::actions::{Outcome as ActionOutcome, Target},
    model::agent::AgentStatus,
    model::nvml::GpuSample,
    pipeline::Pipeline,
    stacks::StackStats,
    state::{process::DeviceTotals, State},
};
use catalog as m;

/// `serve --action`/`--webhook` outcomes by (target, event, outcome).
pub type ActionCounts = BTreeMap<(Target, TriggerKind, ActionOutcome), u64>;
use families::{Families, Labels, Pairs, Value};
pub use text::to_text_format;

/// Everything a scrape renders.
pub struct Scrape<'a> {
    /// With exited processes' rows (they read 0 until forgotten).
    pub view: &'a View,
    /// Most (process, device) series; the rest are summed as comm="other".
    pub max_process_series: usize,
    pub state: &'a State,
    pub counts: &'a EventCounts,
    pub distributions: &'a Distributions,
    pub gpus: &'a GpuWatch,
    pub stacks: &'a StackStats,
    pub agent: &'a AgentStatus,
    /// The host side: traced processes' host memory, swap, memory cgroups.
    pub host: &'a crate::model::host::HostMemory,
    /// OTLP pushes done and failed, where serve pushes.
    pub otlp_pushes: Option<(u64, u64)>,
    /// `serve --action`/`--webhook` outcomes, where something acts.
    pub actions: Option<ActionCounts>,
    pub degraded: &'a crate::model::degraded::Degradations,
    /// The agent's heap by owner (estimates).
    pub heap: crate::heap::Parts,
    /// The agent's caches, their bounds and evictions.
    pub caches: Vec<crate::heap::Cache>,
}

impl<'a> Scrape<'a> {
    /// A scrape of what the pipeline holds, with its view (exited processes
    /// included) and the agent's status.
    pub fn of(p: &'a Pipeline, view: &'a View, agent: &'a AgentStatus, max_process_series: usize) -> Self {
        Scrape {
            view,
            max_process_series,
            state: &p.state,
            counts: &p.counts,
            distributions: &p.distributions,
            gpus: &p.gpus,
            stacks: &p.stacks.stats,
            agent,
            host: &p.host,
            otlp_pushes: None,
            actions: None,
            degraded: &p.degraded,
            heap: p.heap(),
            caches: p.stacks.caches(),
        }
    }
}

/// The whole exposition, ending with `# EOF`.
/// (Writing to a String does not fail; serve's error path keeps the Result.)
pub fn render(s: &Scrape<'_>) -> Result<String, std::fmt::Error> {
    Ok(families(s).encode())
}

/// Every family of a scrape, with its series: what /metrics shows (and
/// OTLP pushes).
pub fn families(s: &Scrape<'_>) -> Families {
    let mut fams = Families::default();
    histograms(&mut fams, s.distributions);
    process_families(&mut fams, s);
    event_families(&mut fams, s);
    gpu_families(&mut fams, s);
    agent::self_families(&mut fams, s);
    fams
}

/// dcgm-exporter's device labels, filled from NVML where it has the GPU.
fn device_labels(device: i32, view: &View) -> Pairs {
    let gpu = view.gpus.iter().find(|g| g.index == device).and_then(|g| g.nvml.as_ref());
    vec![
        ("gpu", if device == DEVICE_UNKNOWN { "unknown".to_string() } else { device.to_string() }),
        ("UUID", gpu.map(|g| g.uuid.clone()).unwrap_or_default()),
        ("pci_bus_id", gpu.map(|g| g.pci_bus_id.clone()).unwrap_or_default()),
        ("modelName", gpu.map(|g| g.name.clone()).unwrap_or_default()),
    ]
}

/// A process row's workload and device labels: its GPU as NVML numbers it
/// (by the process's own device UUIDs) and, in a MIG instance,
/// dcgm-exporter's GPU_I_ID and GPU_I_PROFILE.
fn row_labels<'v>(r: &'v crate::analysis::view::Row, sets: &mut RowLabelSets<'v>) -> Labels {
    let device = r.placement.gpu.map_or(r.device, |g| g as i32);
    let mig = r.placement.mig.as_ref().map(|m| (m.gpu_instance_id, m.profile.as_str()));
    let workload = sets.workload(r);
    Labels::joined(&workload, sets.of(device, mig))
}

/// The label sets process rows are made of, each made and escaped once per
/// scrape: each GPU's (or MIG instance's), which a node's hundreds of rows
/// share, and each process's, which its rows on every GPU share.
struct RowLabelSets<'v> {
    view: &'v View,
    made: Vec<(GpuKey, Labels)>,
    /// By pid, with the row that made them: an exited process and its
    /// pid's next owner may both be in a view.
    workloads: rustc_hash::FxHashMap<u32, (&'v crate::analysis::view::Row, Labels)>,
}

/// A device index, and the MIG instance (GPU instance id, profile) where there is one.
type GpuKey = (i32, Option<(u32, String)>);

impl<'v> RowLabelSets<'v> {
    fn new(view: &'v View) -> Self {
        RowLabelSets { view, made: Vec::new(), workloads: Default::default() }
    }

    /// A row's workload labels: its process's, made once.
    fn workload(&mut self, r: &'v crate::analysis::view::Row) -> Labels {
        let make = || Labels::shared(workload_labels(Some((r.pid, &r.comm, &r.workload))));
        match self.workloads.get(&r.pid) {
            Some((made_by, labels)) if made_by.comm == r.comm && made_by.workload == r.workload => labels.clone(),
            Some(_) => make(),
            None => self.workloads.entry(r.pid).or_insert_with(|| (r, make())).1.clone(),
        }
    }

    fn of(&mut self, device: i32, mig: Option<(u32, &str)>) -> &Labels {
        let same = |((d, m), _): &(GpuKey, Labels)| *d == device && m.as_ref().map(|(i, p)| (*i, p.as_str())) == mig;
        let at = match self.made.iter().position(same) {
            Some(at) => at,
            None => {
                let mut pairs = device_labels(device, self.view);
                if let Some((id, profile)) = mig {
                    pairs.push(("GPU_I_ID", id.to_string()));
                    pairs.push(("GPU_I_PROFILE", profile.to_string()));
                }
                self.made.push(((device, mig.map(|(i, p)| (i, p.to_string()))), Labels::shared(pairs)));
                self.made.len() - 1
            }
        };
        &self.made[at].1
    }
}

/// A MIG reconciliation row's GPU_I_ID and GPU_I_PROFILE (nothing for a whole GPU).
fn instance_labels(r: &crate::analysis::reconcile::Reconciliation, view: &View) -> Pairs {
    let Some(id) = r.gpu_instance_id else { return Vec::new() };
    let gpu = view.gpus.iter().find(|g| g.index == r.gpu as i32).and_then(|g| g.nvml.as_ref());
    let profile = gpu.and_then(|g| g.mig.iter().find(|m| m.gpu_instance_id == id)).map(|m| m.profile.clone()).unwrap_or_default();
    vec![("GPU_I_ID", id.to_string()), ("GPU_I_PROFILE", profile)]
}

fn gpu_labels(g: &GpuSample) -> Pairs {
    vec![("gpu", g.index.to_string()), ("UUID", g.uuid.clone()), ("pci_bus_id", g.pci_bus_id.clone()), ("modelName", g.name.clone())]
}

/// A process's labels; None: the long tail summed as comm="other".
/// The traced processes' host memory (largest resident first, capped as the
/// process series are), the node's swap traffic, their containers' memory
/// cgroups: what to read beside VRAM when a GPU job spills to the host.
fn host_memory(fams: &mut Families, s: &Scrape<'_>) {
    let h = s.host;
    let mut procs: Vec<_> = h.processes.iter().filter_map(|(pid, m)| Some((s.state.processes.get(pid)?, m))).collect();
    procs.sort_by(|a, b| b.1.resident_bytes.cmp(&a.1.resident_bytes).then(a.0.pid.cmp(&b.0.pid)));
    procs.truncate(s.max_process_series);
    let labels = |p: &crate::state::process::Process| workload_labels(Some((p.pid, &p.comm, &Workload::of(p.container.as_ref()))));
    fams.add(m::PROCESS_HOST_RESIDENT).extend(procs.iter().map(|(p, m)| (labels(p), Value::int(m.resident_bytes))));
    fams.add(m::PROCESS_HOST_SWAP).extend(procs.iter().map(|(p, m)| (labels(p), Value::int(m.swap_bytes))));
    let on_gpu_nodes = procs.iter().flat_map(|(p, _)| h.gpu_node_bytes.get(&p.pid).into_iter().flatten().map(move |n| (*p, n)));
    fams.add(m::PROCESS_GPU_NODE_RESIDENT).extend(on_gpu_nodes.map(|(p, n)| {
        let gpu = s.gpus.latest.iter().find(|g| g.index == n.gpu).map_or_else(|| vec![("gpu", n.gpu.to_string())], gpu_labels);
        ([labels(p), gpu, vec![("node", n.node.to_string())]].concat(), Value::int(n.bytes))
    }));
    let gpu_nodes = s.gpus.latest.iter().any(|g| g.numa_node.is_some());
    fams.add(m::GPU_NODE_READS_CUT).extend(gpu_nodes.then(|| (vec![], Value::Count(h.gpu_node_reads_cut))));
    let swap = h.swap_in_bytes.zip(h.swap_out_bytes);
    fams.add(m::HOST_SWAP_IN).extend(swap.map(|(i, _)| (vec![], Value::Count(i))));
    fams.add(m::HOST_SWAP_OUT).extend(swap.map(|(_, o)| (vec![], Value::Count(o))));
    let (mut usage, mut limits) = (Vec::new(), Vec::new());
    for (cgroup, mem) in &h.cgroups {
        let owner = s
            .state
            .processes
            .values()
            .find(|p| p.container.as_ref().and_then(|c| c.memory_limit_file.as_ref()).is_some_and(|(c, _)| c == cgroup));
        let w = Workload::of(owner.and_then(|p| p.container.as_ref()));
        let labels = vec![
            ("container", w.container.unwrap_or_default()),
            ("pod", w.pod.unwrap_or_default()),
            ("namespace", w.namespace.unwrap_or_default()),
            ("cgroup", cgroup.clone()),
        ];
        usage.push((labels.clone(), Value::int(mem.usage_bytes)));
        if let Some(limit) = mem.limit_bytes {
            limits.push((labels, Value::int(limit)));
        }
    }
    fams.add(m::CONTAINER_MEMORY_USAGE).extend(usage);
    fams.add(m::CONTAINER_MEMORY_LIMIT).extend(limits);
}

/// The GPU memory of traced processes' cgroups (cgroup v2 `dmem`), per
/// region, against its limit; the region's GPU by its PCI bus id.
fn gpu_cgroups(fams: &mut Families, s: &Scrape<'_>) {
    let (mut usage, mut limits) = (Vec::new(), Vec::new());
    for (cgroup, mem) in &s.host.gpu_cgroups {
        let w = Workload::of(s.state.processes.get(&mem.pid).and_then(|p| p.container.as_ref()));
        for r in &mem.regions {
            let bus = crate::pipeline::dmem::region_pci_bus_id(&r.region).unwrap_or_default().to_ascii_lowercase();
            let gpu = s.gpus.latest.iter().find(|g| !bus.is_empty() && g.pci_bus_id.to_ascii_lowercase().ends_with(&bus));
            let labels = vec![
                ("container", w.container.clone().unwrap_or_default()),
                ("pod", w.pod.clone().unwrap_or_default()),
                ("namespace", w.namespace.clone().unwrap_or_default()),
                ("cgroup", cgroup.clone()),
                ("region", r.region.clone()),
                ("gpu", gpu.map(|g| g.index.to_string()).unwrap_or_default()),
                ("UUID", gpu.map(|g| g.uuid.clone()).unwrap_or_default()),
            ];
            usage.push((labels.clone(), Value::int(r.usage_bytes)));
            if let Some(limit) = r.limit_bytes {
                limits.push((labels, Value::int(limit)));
            }
        }
    }
    fams.add(m::CONTAINER_GPU_MEMORY_USAGE).extend(usage);
    fams.add(m::CONTAINER_GPU_MEMORY_LIMIT).extend(limits);
}

fn workload_labels(process: Option<(u32, &str, &Workload)>) -> Pairs {
    let (pid, comm, w) = match process {
        Some((pid, comm, w)) => (pid.to_string(), comm.to_string(), w.clone()),
        None => (String::new(), "other".to_string(), Workload::default()),
    };
    vec![
        ("pid", pid),
        ("comm", comm),
        ("container", w.container.unwrap_or_default()),
        ("pod", w.pod.unwrap_or_default()),
        ("namespace", w.namespace.unwrap_or_default()),
    ]
}

fn histograms(fams: &mut Families, d: &Distributions) {
    let kind = |k: crate::analysis::distributions::MemoryKind| vec![("memory", k.label().to_string())];
    fams.add(m::ALLOCATION_SIZE).extend(d.sizes().map(|(k, b)| (kind(k), Value::Histogram(b.clone()))));
    fams.add(m::ALLOCATION_LIFETIME).extend(d.lifetimes().map(|(k, b)| (kind(k), Value::Histogram(b.clone()))));
    fams.add(m::API_LATENCY).extend(d.latencies().map(|(api, b)| (vec![("api", api_name(api).to_string())], Value::Histogram(b.clone()))));
}

/// Where the memory of the processes shown went (by owner, by pool,
/// imported): bounded per process and GPU. `series` begin with the rows'
/// own, in their order: their labels are made once per scrape.
fn owner_families(fams: &mut Families, rows: &[&crate::analysis::view::Row], series: &[Series]) {
    let (mut owners, mut pools, mut imported, mut graphs, mut checkpointed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (labels, b) in series.iter().zip(rows).filter_map(|(x, r)| Some((&x.labels, r.breakdown.as_deref()?))) {
        let with = |name: &'static str, value: &str| {
            let mut l = labels.clone();
            l.push((name, value.to_string()));
            l
        };
        owners.extend(b.by_owner.iter().map(|o| (with("owner", &o.owner), Value::int(o.bytes))));
        pools.extend(b.pools.iter().map(|p| (with("pool", &p.pool), Value::int(p.bytes))));
        if !b.imported.is_empty() {
            imported.push((labels.clone(), Value::int(b.imported_bytes)));
        }
        if let Some(g) = &b.graph_pool {
            graphs.push((labels.clone(), Value::int(g.bytes)));
        }
        if let Some(s) = &b.suspension {
            checkpointed.push((labels.clone(), Value::int((s.state == crate::state::Suspension::Checkpointed) as u64)));
        }
    }
    fams.add(m::PROCESS_BY_OWNER).extend(owners);
    fams.add(m::PROCESS_BY_POOL).extend(pools);
    fams.add(m::PROCESS_IMPORTED).extend(imported);
    fams.add(m::PROCESS_GRAPH_POOL).extend(graphs);
    fams.add(m::PROCESS_CHECKPOINTED).extend(checkpointed);
}

/// The leaking stack groups of the processes shown: bounded per process
/// and GPU. `series` begin with the rows' own, in their order.
fn leak_group_families(fams: &mut Families, rows: &[&crate::analysis::view::Row], series: &[Series]) {
    let groups: Vec<(Labels, &crate::analysis::series::LeakingGroup)> = series
        .iter()
        .zip(rows)
        .flat_map(|(Series { labels, .. }, r)| {
            r.leaking_groups.iter().map(move |g| {
                let mut l = labels.clone();
                l.push(("stack_id", g.stack_id.clone().unwrap_or_default()));
                l.push(("layer", g.layer.name().to_string()));
                (l, g)
            })
        })
        .collect();
    fams.add(m::LEAK_GROUP_BYTES).extend(groups.iter().map(|(l, g)| (l.clone(), Value::int(g.bytes))));
    fams.add(m::LEAK_GROUP_GROWTH).extend(groups.iter().map(|(l, g)| (l.clone(), Value::Float(g.rate_bytes_per_s))));
}

/// One (process, device) series: its labels and figures.
struct Series {
    labels: Labels,
    totals: DeviceTotals,
    leak_suspect_bytes: u64,
    growth_bytes_per_s: f64,
    leaking: bool,
    cache_growth: bool,
    /// Allocated, reserved-unused and largest free block, where tensors are seen.
    tensors: Option<(u64, u64, Option<u64>)>,
}

fn process_families(fams: &mut Families, s: &Scrape<'_>) {
    let view = s.view;
    let capped = view.capped(s.max_process_series);
    let mut sets = RowLabelSets::new(view);
    let mut series: Vec<Series> = capped
        .rows
        .iter()
        .map(|r| Series {
            labels: row_labels(r, &mut sets),
            totals: r.totals.clone(),
            leak_suspect_bytes: r.leak_suspect_bytes,
            growth_bytes_per_s: r.growth_bytes_per_s(),
            leaking: r.leaking(),
            cache_growth: r.cache_growth(),
            tensors: r.free_blocks.map(|fb| (r.totals.allocated_bytes, fb.unused_bytes, Some(fb.largest_free_block))),
        })
        .collect();
    series.extend(capped.other.iter().map(|o| Series {
        labels: Labels::shared_then(workload_labels(None), sets.of(o.device, None)),
        totals: o.totals.clone(),
        leak_suspect_bytes: o.leak_suspect_bytes,
        growth_bytes_per_s: o.growth_bytes_per_s,
        leaking: o.leaking,
        cache_growth: false,
        tensors: o.allocated_bytes.map(|a| (a, o.reserved_unused_bytes.unwrap_or(0), None)),
    }));
    let mut each = |metric, f: &dyn Fn(&Series) -> Value| {
        fams.add(metric).extend(series.iter().map(|x| (x.labels.clone(), f(x))));
    };
    each(m::PROCESS_MEMORY, &|x| Value::int(x.totals.live_bytes));
    each(m::PROCESS_ALLOCATIONS, &|x| Value::int(x.totals.live_allocs));
    each(m::PROCESS_VMM_PHYSICAL, &|x| Value::int(x.totals.vmm_physical_bytes));
    each(m::PROCESS_VMM_RESERVED, &|x| Value::int(x.totals.reserved_bytes));
    each(m::PROCESS_LEAK_SUSPECT, &|x| Value::int(x.leak_suspect_bytes));
    each(m::PROCESS_GROWTH, &|x| Value::Float(x.growth_bytes_per_s));
    each(m::PROCESS_LEAK_SUSPECTED, &|x| Value::flag(x.leaking));
    each(m::PROCESS_CACHE_GROWTH, &|x| Value::flag(x.cache_growth));
    leak_group_families(fams, &capped.rows, &series);
    owner_families(fams, &capped.rows, &series);
    // Tensor figures only where PyTorch's probes fired: no series is "unknown", not 0.
    let mut tensors = |metric, f: &dyn Fn((u64, u64, Option<u64>)) -> Option<u64>| {
        let known = series.iter().filter_map(|x| Some((x.labels.clone(), Value::int(f(x.tensors?)?))));
        fams.add(metric).extend(known);
    };
    tensors(m::PROCESS_ALLOCATED, &|t| Some(t.0));
    tensors(m::PROCESS_RESERVED_UNUSED, &|t| Some(t.1));
    tensors(m::PROCESS_LARGEST_FREE_BLOCK, &|t| t.2);

    let cap = s.max_process_series;
    let mut pinned = fams.add(m::PROCESS_HOST_PINNED);
    pinned.extend(capped.pinned.iter().map(|p| (workload_labels(Some((p.pid, &p.comm, &p.workload))), Value::int(p.bytes))));
    pinned.extend(capped.pinned_other.map(|bytes| (workload_labels(None), Value::int(bytes))));
    host_memory(fams, s);
    gpu_cgroups(fams, s);
    // Only processes that lost events: their other series are uncertain.
    let mut lost = fams.add(m::PROCESS_EVENTS_LOST);
    for p in s.state.processes.values().filter(|p| p.events_lost > 0).take(cap) {
        lost.push((workload_labels(Some((p.pid, &p.comm, &Workload::of(p.container.as_ref())))), Value::Count(p.events_lost)));
    }
    let mut untracked = fams.add(m::PROCESS_UNTRACKED);
    for r in view.reconciliation.iter().take(cap) {
        let p = s.state.processes.get(&r.pid).filter(|p| !p.exited);
        let w = Workload::of(p.and_then(|p| p.container.as_ref()));
        let comm = p.map_or("", |p| p.comm.as_str());
        untracked.push((
            [workload_labels(Some((r.pid, comm, &w))), device_labels(r.gpu as i32, view), instance_labels(r, view)].concat(),
            Value::Int(r.untracked_bytes),
        ));
    }
    fams.add(m::EXPORTER_PROCESS_SERIES).push((vec![], Value::int(view.rows.len() as u64)));
    fams.add(m::EXPORTER_AGGREGATED_SERIES).push((vec![], Value::int(capped.aggregated as u64)));
}

fn event_families(fams: &mut Families, s: &Scrape<'_>) {
    let c = s.counts;
    let mut calls = fams.add(m::API_CALLS);
    for ((api, result), n) in c.api_calls() {
        let result =
            if result == 0 { "success".to_string() } else { result_name(result).map_or_else(|| result.to_string(), str::to_string) };
        calls.push((vec![("api", api_name(api).to_string()), ("result", result)], Value::Count(n)));
    }
    // Counters start at 0 on every known GPU, so that the first event is
    // an increase Prometheus can see (increase() needs a sample before it).
    let mut ooms: BTreeMap<i32, OomCount> = s.view.devices().map(|d| (d, OomCount::default())).collect();
    ooms.extend(c.cuda_ooms.iter().map(|(&d, &n)| (d, n)));
    fams.add(m::CUDA_OOM).extend(ooms.iter().map(|(&d, n)| (device_labels(d, s.view), Value::Count(n.all))));
    fams.add(m::FRAGMENTATION_FAILURES).extend(ooms.iter().map(|(&d, n)| (device_labels(d, s.view), Value::Count(n.fragmentation))));
    let mut exits: BTreeMap<i32, u64> = s.view.devices().map(|d| (d, 0)).collect();
    exits.extend(c.exits.iter().map(|(&d, &n)| (d, n)));
    fams.add(m::PROCESS_EXITS).extend(exits.iter().map(|(&d, &n)| (device_labels(d, s.view), Value::Count(n))));
    let mut kills = fams.add(m::OOM_KILLS);
    for source in KillSource::ALL {
        kills.push((vec![("source", source.label().to_string())], Value::Count(c.oom_kills.get(&source).copied().unwrap_or(0))));
    }
}

fn gpu_families(fams: &mut Families, s: &Scrape<'_>) {
    let gpus = &s.gpus.latest;
    let mut per_gpu = |metric, f: &dyn Fn(&GpuSample) -> Vec<(Pairs, Value)>| {
        let mut series = fams.add(metric);
        for g in gpus {
            series.extend(f(g).into_iter().map(|(extra, v)| ([gpu_labels(g), extra].concat(), v)));
        }
    };
    let one = |v: Option<Value>| v.map(|v| (vec![], v)).into_iter().collect::<Vec<_>>();
    per_gpu(m::GPU_MEMORY_TOTAL, &|g| one(g.memory.as_ref().map(|x| Value::int(x.total))));
    per_gpu(m::GPU_MEMORY_USED, &|g| one(g.memory.as_ref().map(|x| Value::int(x.used))));
    per_gpu(m::GPU_TRACED_MEMORY, &|g| {
        let traced = s.view.gpus.iter().find(|r| r.index == g.index as i32).map_or(0, |r| r.traced_bytes);
        one(Some(Value::int(traced)))
    });
    per_gpu(m::GPU_ECC_ERRORS, &|g| {
        let Some(e) = &g.ecc else { return vec![] };
        let l = |t: &str, c: &str| vec![("error_type", t.to_string()), ("counter", c.to_string())];
        vec![
            (l("corrected", "volatile"), Value::Count(e.corrected_volatile)),
            (l("uncorrected", "volatile"), Value::Count(e.uncorrected_volatile)),
            (l("corrected", "aggregate"), Value::Count(e.corrected_aggregate)),
            (l("uncorrected", "aggregate"), Value::Count(e.uncorrected_aggregate)),
        ]
    });
    per_gpu(m::GPU_RETIRED_PAGES, &|g| {
        let Some(r) = &g.retired_pages else { return vec![] };
        vec![
            (vec![("cause", "single_bit_ecc".to_string())], Value::int(r.single_bit)),
            (vec![("cause", "double_bit_ecc".to_string())], Value::int(r.double_bit)),
        ]
    });
    per_gpu(m::GPU_RETIRED_PAGES_PENDING, &|g| one(g.retired_pages.as_ref().map(|r| Value::flag(r.pending))));
    per_gpu(m::GPU_REMAPPED_ROWS, &|g| {
        let Some(r) = &g.remapped_rows else { return vec![] };
        vec![
            (vec![("kind", "correctable".to_string())], Value::int(r.correctable)),
            (vec![("kind", "uncorrectable".to_string())], Value::int(r.uncorrectable)),
        ]
    });
    per_gpu(m::GPU_ROW_REMAP_PENDING, &|g| one(g.remapped_rows.as_ref().map(|r| Value::flag(r.pending))));
    per_gpu(m::GPU_ROW_REMAP_FAILURE, &|g| one(g.remapped_rows.as_ref().map(|r| Value::flag(r.failure))));
    per_gpu(m::GPU_ADDRESSING_MODE, &|g| {
        g.addressing_mode.map(|mode| (vec![("mode", mode.to_string())], Value::Int(1))).into_iter().collect()
    });
    per_gpu(m::GPU_TEMPERATURE, &|g| one(g.gpu_temp_c.map(|t| Value::Int(t as i64))));
    per_gpu(m::GPU_MEMORY_TEMPERATURE, &|g| one(g.memory_temp_c.map(|t| Value::Int(t as i64))));
    per_gpu(m::GPU_XID_ERRORS, &|g| {
        // The critical XIDs' counters start at 0 on every GPU, so that alerts
        // see the first one (others appear when they happen).
        let mut counts: BTreeMap<u64, u64> = health::CRITICAL_XIDS.iter().map(|&x| (x, 0)).collect();
        counts.extend(s.counts.xids.range((g.index, 0)..=(g.index, u64::MAX)).map(|(&(_, xid), &n)| (xid, n)));
        counts.into_iter().map(|(xid, n)| (vec![("xid", xid.to_string())], Value::Count(n))).collect()
    });
    per_gpu(m::GPU_HEALTH_SCORE, &|g| one(s.gpus.health.get(&g.index).map(|h| Value::Int(h.score as i64))));
}

#[cfg(test)]
mod tests;
