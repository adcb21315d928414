//! The view every output shares at a point in time: one row per (process,
//! device) with its live bytes, growth verdict, leak-suspect bytes and
//! workload name, one row per GPU, and NVML's figures reconciled with the
//! traced ones. `top` draws it, the exporter renders it, the summary prints it.
use std::collections::BTreeMap;

use gpumem_common::DEVICE_UNKNOWN;

use super::{
    breakdown::Breakdown,
    fragmentation::{self, DeviceLayout},
    growth::Verdict,
    health::{GpuWatch, Health},
    leaks,
    reconcile::{self, Reconciliation},
    series::{GrowthTracker, LeakingGroup},
};
use crate::{
    model::container::ContainerInfo,
    model::nvml::GpuSample,
    names::short_id,
    state::{process::DeviceTotals, tensor::FreeBlocks, Failure, State},
};

#[derive(Clone, Copy, Debug)]
pub struct ViewOptions {
    /// CLOCK_MONOTONIC now, the clock of the events.
    pub now_ns: u64,
    /// While a process's memory grows, its live allocations at least this
    /// old are leak suspects.
    pub leak_age_ns: u64,
    /// Samples of recent live bytes kept per row (a trend line).
    pub trend: usize,
    /// Rows of exited processes too (at 0, until they are forgotten).
    pub exited: bool,
    /// How each row's memory is cut up (fragmentation signals).
    pub layouts: bool,
    /// Each row's memory by owner (walks every live allocation: for scrapes and summaries).
    pub owners: bool,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions { now_ns: 0, leak_age_ns: u64::MAX, trend: 0, exited: false, layouts: false, owners: false }
    }
}

/// Who a process runs for: its container and pod, as every output names them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    pub container: Option<String>,
    /// The pod's name where its container shows it, else its UID.
    pub pod: Option<String>,
    pub namespace: Option<String>,
}

impl Workload {
    pub fn of(c: Option<&ContainerInfo>) -> Self {
        let Some(c) = c else { return Workload::default() };
        Workload { container: c.container.clone(), pod: c.pod_name.clone().or_else(|| c.pod_uid.clone()), namespace: c.namespace.clone() }
    }

    /// The pod as `namespace/name` (or what is known of it), else the short
    /// container id, else "-".
    pub fn name(&self) -> String {
        match (&self.namespace, &self.pod, &self.container) {
            (Some(ns), Some(pod), _) => format!("{ns}/{pod}"),
            (None, Some(pod), _) => pod.clone(),
            (_, None, Some(id)) => short_id(id).to_string(),
            _ => "-".to_string(),
        }
    }
}

/// One process on one device.
#[derive(Clone, Debug)]
pub struct Row {
    pub pid: u32,
    pub comm: String,
    pub workload: Workload,
    pub device: i32,
    pub exited: bool,
    pub totals: DeviceTotals,
    pub growth: Option<Verdict>,
    /// Bytes of live allocations older than the leak age, while growing.
    pub leak_suspect_bytes: u64,
    /// The last live-byte samples, oldest first.
    pub trend: Vec<u64>,
    /// The stack groups whose own verdict is `leak`, the largest first.
    pub leaking_groups: Vec<LeakingGroup>,
    /// Where its memory went (by owner, by pool, imports), where asked
    /// (`ViewOptions::owners`) and the process is alive: boxed, as a view
    /// has a row for every process and device kept.
    pub breakdown: Option<Box<Breakdown>>,
    pub last_failure: Option<Failure>,
    pub events_lost: u64,
    pub layout: Option<DeviceLayout>,
    /// Where PyTorch's allocator probes fired: how its tensors use the
    /// segments (`totals.allocated_bytes` is then known).
    pub free_blocks: Option<FreeBlocks>,
    /// Which GPU (and MIG instance) the device is on the host.
    pub placement: super::placement::Placement,
}

impl Row {
    /// Live tensor bytes, where PyTorch's probes show them.
    pub fn allocated_bytes(&self) -> Option<u64> {
        self.free_blocks.map(|_| self.totals.allocated_bytes)
    }

    pub fn cache_growth(&self) -> bool {
        self.growth.as_ref().is_some_and(|g| g.verdict == super::growth::Finding::CacheGrowth)
    }

    pub fn leaking(&self) -> bool {
        self.growth.as_ref().is_some_and(|g| g.leaking)
    }

    pub fn growth_bytes_per_s(&self) -> f64 {
        self.growth.as_ref().map_or(0.0, |g| g.rate_bytes_per_s)
    }
}

/// One GPU: what NVML says of it, where NVML is there, and what is traced on it.
#[derive(Clone, Debug, Default)]
pub struct GpuRow {
    pub index: i32,
    pub nvml: Option<GpuSample>,
    pub health: Option<Health>,
    /// Live bytes of traced processes on it.
    pub traced_bytes: u64,
}

/// Pinned host memory of one process.
#[derive(Clone, Debug)]
pub struct PinnedRow {
    pub pid: u32,
    pub comm: String,
    pub workload: Workload,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct View {
    /// By pid, then device.
    pub rows: Vec<Row>,
    /// GPUs NVML reports and devices traced processes hold memory on, by index.
    pub gpus: Vec<GpuRow>,
    /// Largest first.
    pub pinned: Vec<PinnedRow>,
    /// NVML's per-process figures against the traced ones (empty without NVML).
    pub reconciliation: Vec<Reconciliation>,
    /// Processes NVML lists that made no traced call: what they hold was
    /// allocated before tracing began (NVML's bytes), by pid then GPU.
    pub untraced: Vec<UntracedRow>,
}

/// A process NVML lists on a GPU whose calls were never traced.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UntracedRow {
    pub pid: u32,
    /// Its name, where it could be looked up ("?" else).
    pub comm: String,
    #[serde(skip)]
    pub workload: Workload,
    pub gpu: u32,
    /// What NVML says it holds there: allocated before tracing began.
    pub nvml_bytes: u64,
}

impl View {
    pub fn build(state: &State, growth: &mut GrowthTracker, gpus: &GpuWatch, o: &ViewOptions) -> View {
        let mut rows = Vec::new();
        let mut pinned = Vec::new();
        let mut traced: BTreeMap<i32, u64> = BTreeMap::new();
        for p in state.processes.values().filter(|p| o.exited || !p.exited) {
            let workload = Workload::of(p.container.as_ref());
            if p.held.pinned.allocs > 0 {
                pinned.push(PinnedRow { pid: p.pid, comm: p.comm.clone(), workload: workload.clone(), bytes: p.held.pinned.bytes });
            }
            for &device in &p.devices_seen {
                let totals = p.totals(device);
                // A checkpointed process's memory is off the GPU until restored.
                let off_gpu = matches!(p.suspension, Some((crate::state::Suspension::Checkpointed, ..)));
                let placement = super::placement::place(p, device, &gpus.latest);
                let on = placement.gpu.map_or(device, |g| g as i32);
                *traced.entry(on).or_default() += if off_gpu { 0 } else { totals.live_bytes };
                let verdict = if p.exited { None } else { growth.verdict(p.pid, device) };
                let leak_suspect_bytes = match &verdict {
                    Some(v) if v.leaking => leaks::bytes_allocated_before(p, device, o.now_ns.saturating_sub(o.leak_age_ns)),
                    _ => 0,
                };
                rows.push(Row {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    workload: workload.clone(),
                    device,
                    exited: p.exited,
                    totals,
                    growth: verdict,
                    leak_suspect_bytes,
                    trend: if o.trend > 0 { growth.recent(p.pid, device, o.trend) } else { Vec::new() },
                    leaking_groups: if p.exited { Vec::new() } else { growth.leaking_groups(p.pid, device) },
                    breakdown: None,
                    last_failure: p.last_failure,
                    events_lost: p.events_lost,
                    layout: o.layouts.then(|| fragmentation::layout(p, device)),
                    free_blocks: p.free_blocks(device),
                    placement,
                });
            }
        }
        pinned.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
        View {
            rows,
            gpus: gpu_rows(gpus, &traced),
            pinned,
            reconciliation: reconcile::reconcile(state, &gpus.latest),
            untraced: Vec::new(),
        }
    }

    /// GPUs NVML reports and devices traced processes hold memory on.
    pub fn devices(&self) -> impl Iterator<Item = i32> + '_ {
        self.gpus.iter().map(|g| g.index)
    }
}

/// The processes NVML lists that no traced call came from, by pid then GPU
/// (`names`: what the pipeline looked up about them; `scope`: only these
/// pids, where the session traces chosen processes).
pub fn untraced(
    state: &State,
    reconciliation: &[Reconciliation],
    names: &rustc_hash::FxHashMap<u32, (String, Option<ContainerInfo>)>,
    scope: Option<&[u32]>,
) -> Vec<UntracedRow> {
    let mut out = Vec::new();
    for r in reconciliation {
        // An MPS server's bytes are its traced clients': not held before tracing.
        let traced = state.processes.get(&r.pid).is_some_and(|p| !p.exited) || !r.mps_clients.is_empty();
        if traced || scope.is_some_and(|s| !s.contains(&r.pid)) {
            continue;
        }
        let (comm, workload) = match names.get(&r.pid) {
            Some((comm, c)) => (comm.clone(), Workload::of(c.as_ref())),
            None => ("?".to_string(), Workload::default()),
        };
        out.push(UntracedRow { pid: r.pid, comm, workload, gpu: r.gpu, nvml_bytes: r.nvml_bytes });
    }
    out.sort_by_key(|u| (u.pid, u.gpu));
    out
}

fn gpu_rows(gpus: &GpuWatch, traced: &BTreeMap<i32, u64>) -> Vec<GpuRow> {
    let mut out: Vec<GpuRow> = gpus
        .latest
        .iter()
        .map(|g| GpuRow {
            index: g.index as i32,
            nvml: Some(g.clone()),
            health: gpus.health.get(&g.index).cloned(),
            traced_bytes: traced.get(&(g.index as i32)).copied().unwrap_or(0),
        })
        .collect();
    // GPUs traced but not known to NVML (no NVML, or CUDA_VISIBLE_DEVICES).
    for (&index, &traced_bytes) in traced.iter().filter(|(&d, _)| d != DEVICE_UNKNOWN) {
        if !out.iter().any(|g| g.index == index) {
            out.push(GpuRow { index, traced_bytes, ..Default::default() });
        }
    }
    out.sort_by_key(|g| g.index);
    out
}

/// The rows over a cap, summed per device: keeps the number of series an
/// exporter writes bounded however many processes come and go.
#[derive(Clone, Debug, Default)]
pub struct Capped<'a> {
    /// The largest holders, most first.
    pub rows: Vec<&'a Row>,
    /// Per device, the sum of the rest.
    pub other: Vec<OtherRow>,
    /// Rows summed into `other`.
    pub aggregated: usize,
    /// The largest holders of pinned host memory, and the sum of the rest (if any).
    pub pinned: &'a [PinnedRow],
    pub pinned_other: Option<u64>,
}

/// The sum of the rows beyond the cap on one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OtherRow {
    pub device: i32,
    pub totals: DeviceTotals,
    pub leak_suspect_bytes: u64,
    pub growth_bytes_per_s: f64,
    pub leaking: bool,
    /// Sums over the rows whose tensors are seen (None: none of them).
    pub allocated_bytes: Option<u64>,
    pub reserved_unused_bytes: Option<u64>,
}

impl View {
    /// The view within `max` series per family (see `cap`).
    pub fn capped(&self, max: usize) -> Capped<'_> {
        let pinned = &self.pinned[..max.min(self.pinned.len())];
        let rest = &self.pinned[pinned.len()..];
        let pinned_other = (!rest.is_empty()).then(|| rest.iter().map(|p| p.bytes).sum());
        Capped { pinned, pinned_other, ..cap(&self.rows, max) }
    }
}

/// The `max` largest rows by live bytes, and the rest summed per device.
pub fn cap(rows: &[Row], max: usize) -> Capped<'_> {
    let mut sorted: Vec<&Row> = rows.iter().collect();
    sorted.sort_by(|a, b| b.totals.live_bytes.cmp(&a.totals.live_bytes).then(a.pid.cmp(&b.pid)).then(a.device.cmp(&b.device)));
    let rest = sorted.split_off(max.min(sorted.len()));
    let mut other: BTreeMap<i32, OtherRow> = BTreeMap::new();
    for r in &rest {
        let o = other.entry(r.device).or_insert(OtherRow { device: r.device, ..Default::default() });
        o.totals.absorb(&r.totals);
        o.leak_suspect_bytes += r.leak_suspect_bytes;
        o.growth_bytes_per_s += r.growth_bytes_per_s();
        o.leaking |= r.leaking();
        if let Some(fb) = r.free_blocks {
            *o.allocated_bytes.get_or_insert(0) += r.totals.allocated_bytes;
            *o.reserved_unused_bytes.get_or_insert(0) += fb.unused_bytes;
        }
    }
    Capped { rows: sorted, other: other.into_values().collect(), aggregated: rest.len(), pinned: &[], pinned_other: None }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing::ev, Limits};

    fn holder(s: &mut State, pid: u32, dev: i32, mib: u64) {
        let at = |e: Event| Event { pid, tid: pid, ..e };
        s.apply(&at(Event { handle: 0xc0 + dev as u64, device: dev, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }));
        s.apply(&at(Event { handle: 0xc0 + dev as u64, ..ev(api::CU_CTX_SET_CURRENT) }));
        s.apply(&at(Event { addr: 0x1000 * mib, size: mib << 20, ..ev(api::CU_MEM_ALLOC_V2) }));
    }

    #[test]
    fn rows_per_process_and_device_gpus_and_exited_processes() {
        let mut s = State::new(Limits::default());
        holder(&mut s, 10, 0, 5);
        holder(&mut s, 11, 1, 9);
        holder(&mut s, 12, 0, 1);
        s.apply(&Event { pid: 12, tid: 12, ts_ns: 5, ..ev(api::PROCESS_EXIT) });
        let mut g = GrowthTracker::default();
        let watch = GpuWatch::default();
        let live = View::build(&s, &mut g, &watch, &ViewOptions::default());
        assert_eq!(live.rows.iter().map(|r| (r.pid, r.device, r.totals.live_bytes >> 20)).collect::<Vec<_>>(), [(10, 0, 5), (11, 1, 9)]);
        assert_eq!(live.gpus.iter().map(|g| (g.index, g.traced_bytes >> 20)).collect::<Vec<_>>(), [(0, 5), (1, 9)]);
        // With exited processes: the one that exited reads 0 where it held memory.
        let all = View::build(&s, &mut g, &watch, &ViewOptions { exited: true, ..Default::default() });
        let gone: Vec<(u32, i32, u64, bool)> =
            all.rows.iter().filter(|r| r.pid == 12).map(|r| (r.pid, r.device, r.totals.live_bytes, r.exited)).collect();
        assert_eq!(gone, [(12, 0, 0, true)]);
    }

    #[test]
    fn the_long_tail_is_summed_per_device() {
        let mut s = State::new(Limits::default());
        for (pid, mib) in [(101, 5), (102, 1), (103, 7), (104, 2)] {
            holder(&mut s, pid, 0, mib);
        }
        let v = View::build(&s, &mut GrowthTracker::default(), &GpuWatch::default(), &ViewOptions::default());
        let c = cap(&v.rows, 2);
        assert_eq!(c.rows.iter().map(|r| r.pid).collect::<Vec<_>>(), [103, 101]);
        assert_eq!((c.aggregated, c.other.len(), c.other[0].totals.live_bytes), (2, 1, 3 << 20));
    }

    #[test]
    fn workloads_are_named_alike_everywhere() {
        let c = ContainerInfo { container: Some("0123456789abcdef0123".into()), pod_uid: Some("uid".into()), ..Default::default() };
        assert_eq!(Workload::of(Some(&c)).name(), "uid");
        let named = ContainerInfo { pod_name: Some("trainer".into()), namespace: Some("ml".into()), ..c.clone() };
        assert_eq!(Workload::of(Some(&named)).name(), "ml/trainer");
        assert_eq!(Workload::of(Some(&ContainerInfo { pod_uid: None, ..c })).name(), "0123456789ab");
        assert_eq!(Workload::of(None).name(), "-");
    }
}
