use gpumem_common::{api, Event};

use super::*;
use crate::{
    analysis::view::ViewOptions,
    pipeline::{Lookups, Options, Pipeline, Stack},
    state::testing::ev,
};

const MIB: u64 = 1 << 20;

struct Fixture {
    pipeline: Pipeline,
    max_process_series: usize,
}

impl Fixture {
    fn new(max_process_series: usize) -> Self {
        Fixture { pipeline: Pipeline::new(Options::default(), Lookups::recorded()), max_process_series }
    }
    fn feed(&mut self, e: Event) {
        self.pipeline.apply(&e, Stack::None);
    }
    /// A process `pid` with `mib` MiB live on device 0.
    fn holder(&mut self, pid: u32, mib: u64) {
        let at = |e: Event| Event { pid, tid: pid, ..e };
        self.feed(at(Event { handle: 0xc, device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }));
        self.feed(at(Event { handle: 0xc, ..ev(api::CU_CTX_SET_CURRENT) }));
        self.feed(at(Event { addr: 0x1000, size: mib * MIB, latency_ns: 3_000, ..ev(api::CU_MEM_ALLOC_V2) }));
    }
    fn render(&mut self) -> String {
        self.scrape(|s| render(s).unwrap())
    }
    fn scrape<T>(&mut self, f: impl FnOnce(&Scrape<'_>) -> T) -> T {
        let p = &mut self.pipeline;
        p.gpus.error = Some("not loaded".into());
        let view = p.view(&ViewOptions { exited: true, leak_age_ns: 0, ..Default::default() });
        // As `serve` runs: the kernel's table of live entries kept.
        let kernel_table = Some(crate::model::agent::KernelTable { entries: 3, max_entries: 262_144, bytes: 456 });
        let agent = AgentStatus { probes_attached: 30, kernel_table, ..Default::default() };
        // And pushing OTLP, acting on events, reading host memory.
        use crate::{
            analysis::triggers::TriggerKind,
            model::actions::{Outcome, Target},
            model::host::{CgroupMemory, GpuNodeBytes, HostMemory, ProcessHost},
        };
        let actions =
            [((Target::Command, TriggerKind::CudaOom, Outcome::Ok), 2), ((Target::Webhook, TriggerKind::CudaOom, Outcome::RateLimited), 3)];
        let mut host = HostMemory { swap_in_bytes: Some(8192), swap_out_bytes: Some(12288), refreshed: true, ..Default::default() };
        host.processes.insert(100, ProcessHost { resident_bytes: 5 * MIB, swap_bytes: 4096 });
        // On a coherent platform: 3 MiB of it on GPU 1's node (a GPU NVML has not listed: its index alone).
        host.gpu_node_bytes.insert(100, vec![GpuNodeBytes { gpu: 1, node: 9, bytes: 3 * MIB }]);
        host.cgroups.insert("/kubepods/pod1".into(), CgroupMemory { usage_bytes: 7 * MIB, limit_bytes: Some(64 * MIB), pid: 100 });
        host.cgroups.insert("/kubepods/pod2".into(), CgroupMemory { usage_bytes: 9 * MIB, limit_bytes: None, pid: 100 });
        let scrape = Scrape {
            otlp_pushes: Some((7, 1)),
            actions: Some(actions.into_iter().collect()),
            host: &host,
            ..Scrape::of(p, &view, &agent, self.max_process_series)
        };
        f(&scrape)
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
    f.pipeline.forget_exited_before(51);
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
fn kernel_tables_and_agent_errors_are_exported() {
    let mut f = Fixture::new(10);
    f.holder(100, 1);
    let p = &mut f.pipeline;
    let view = p.view(&ViewOptions { exited: true, ..Default::default() });
    let mut agent = AgentStatus::default();
    agent.kernel.tables_full.tracked_processes = 4;
    agent.kernel.tables_full.pid_filter = 5;
    agent.errors.insert("read_kernel_counters", 2);
    let text = render(&Scrape::of(p, &view, &agent, 10)).unwrap();
    assert!(text.contains("gpumem_table_overflow_total{table=\"kernel_tracked_processes\"} 4\n"), "{text}");
    assert!(text.contains("gpumem_table_overflow_total{table=\"kernel_pid_filter\"} 5\n"), "{text}");
    assert!(text.contains("gpumem_agent_errors_total{operation=\"read_kernel_counters\"} 2\n"), "{text}");
}

#[test]
fn every_catalogued_metric_is_in_the_exposition() {
    let mut f = Fixture::new(10);
    f.holder(100, 1);
    let text = f.render();
    for metric in catalog::ALL {
        let declared = text.matches(&format!("# TYPE {} ", metric.name)).count();
        assert_eq!(declared, 1, "{} is declared {declared} times", metric.name);
    }
    for (series, value) in [
        ("gpumem_otlp_pushes_total{outcome=\"ok\"} ", "7"),
        ("gpumem_kernel_table_entries ", "3"),
        ("gpumem_kernel_table_capacity_entries ", "262144"),
        ("gpumem_kernel_table_bytes ", "456"),
        ("gpumem_actions_total{event=\"cuda_oom\",outcome=\"ok\"} ", "2"),
        ("gpumem_webhooks_total{event=\"cuda_oom\",outcome=\"rate_limited\"} ", "3"),
        ("gpumem_process_host_resident_bytes{pid=\"100\",comm=\"python\",container=\"\",pod=\"\",namespace=\"\"} ", "5242880"),
        ("gpumem_process_host_swap_bytes{pid=\"100\",comm=\"python\",container=\"\",pod=\"\",namespace=\"\"} ", "4096"),
        (
            "gpumem_process_gpu_node_resident_bytes{pid=\"100\",comm=\"python\",container=\"\",pod=\"\",namespace=\"\",gpu=\"1\",node=\"9\"} ",
            "3145728",
        ),
        ("gpumem_host_swap_in_bytes_total ", "8192"),
        ("gpumem_host_swap_out_bytes_total ", "12288"),
        ("gpumem_container_memory_limit_bytes{container=\"\",pod=\"\",namespace=\"\",cgroup=\"/kubepods/pod1\"} ", "67108864"),
    ] {
        assert!(text.lines().any(|l| l.strip_prefix(series) == Some(value)), "{series}{value} is not in:\n{text}");
    }
}

#[test]
fn a_whole_scrape_is_written_as_prometheus_client_writes_it() {
    let mut f = Fixture::new(1);
    f.holder(100, 64);
    f.holder(200, 8);
    f.holder(300, 2);
    let (ours, reference) = f.scrape(|s| (families(s).encode(), super::families::tests::reference(families(s))));
    assert!(ours.contains("comm=\"other\"") && ours.contains("gpumem_api_latency_seconds_bucket{le="), "{ours}");
    assert_eq!(ours, reference);
}

#[test]
fn the_agents_heap_is_said_by_owner_and_the_rest_is_unattributed() {
    let mut f = Fixture::new(10);
    for pid in 1..=50 {
        f.holder(pid, 1);
    }
    let p = &mut f.pipeline;
    let view = p.view(&ViewOptions { exited: true, ..Default::default() });
    let mut agent = AgentStatus::default();
    agent.usage.heap_in_use_bytes = 64 * MIB;
    agent.usage.heap_free_bytes = 3 * MIB;
    let scrape = Scrape::of(p, &view, &agent, 10);
    assert!(scrape.heap.state >= 50 * std::mem::size_of::<crate::state::Process>() as u64, "{:?}", scrape.heap);
    assert!(scrape.heap.growth == 0 && scrape.heap.history == 0, "nothing sampled, no history: {:?}", scrape.heap);
    let text = render(&scrape).unwrap();
    let value = |part: &str| -> u64 {
        let line = samples(&text, "gpumem_agent_heap_bytes").into_iter().find(|l| l.contains(&format!("part=\"{part}\""))).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("state"), scrape.heap.state);
    let parts: u64 = ["state", "stacks", "python", "growth", "history"].iter().map(|p| value(p)).sum();
    assert_eq!(parts + value("unattributed"), 64 * MIB, "the parts and the rest are the allocator's bytes in use");
    assert!(text.contains("gpumem_agent_heap_free_bytes 3145728\n"), "{text}");
}

/// The OTLP push of a full scrape (every family the fixture fills, shared row
/// labels) decodes to the same request built of opentelemetry-proto's messages.
#[test]
fn the_otlp_push_is_the_scrapes_families() {
    use prost::Message as _;
    let mut f = Fixture::new(100);
    for pid in 100..110 {
        f.holder(pid, 3);
    }
    let t = crate::export::otlp::Times { start_ns: 5, now_ns: 9 };
    let (bytes, want) = f.scrape(|s| {
        let fams = families(s);
        (crate::export::otlp::request(&fams, "node", t), crate::export::otlp::reference(&fams, "node", t))
    });
    let got = opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap();
    let points: usize = want.resource_metrics[0].scope_metrics[0].metrics.len();
    assert!(points > 40, "{points} families");
    assert_eq!(got, want);
    assert_eq!(bytes.len(), want.encoded_len(), "no field written that prost leaves out");
}
