//! /metrics rendered for a synthetic host: every process holding memory on
//! every GPU, no cap, from `owners` call sites in as many libraries (none:
//! no stacks); its size and the median render time.
use std::time::Instant;

use anyhow::Result;
use gpumem_agent::serve::scrape_view;
use gpumem_common::{api, Event};
use gpumem_engine::model::{
    agent::AgentStatus,
    nvml::{GpuSample, MemoryInfo},
};
use gpumem_engine::{
    export::prometheus::{self, Scrape},
    pipeline::{Lookups, Options, Pipeline, Stack},
    stacks::Frame,
};

use super::COMM;

/// `gpumem serve --leak-age`'s default.
const LEAK_AGE_NS: u64 = 600_000_000_000;

/// The first owner's stack id.
const OWNER_STACK: u64 = 0x5_0000;

pub fn run(processes: u32, gpus: u32, owners: u32, rounds: u32) -> Result<()> {
    let mut p = Pipeline::new(Options::default(), Lookups::recorded());
    // Each owner's stack: the driver, called from a library of its own.
    let frame = |module: &str| Frame {
        function: None,
        offset: None,
        file: None,
        line: None,
        module: module.into(),
        module_offset: 0x1000,
        python: false,
    };
    for k in 0..owners {
        p.stacks.insert_symbolized(
            OWNER_STACK + k as u64,
            vec![frame("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), frame(&format!("/opt/app/lib/libowner{k}.so"))],
        );
    }
    let readings: Vec<GpuSample> = (0..gpus)
        .map(|i| GpuSample {
            index: i,
            uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
            name: "NVIDIA H200".into(),
            memory: Some(MemoryInfo { total: 141 << 30, used: 1 << 30, free: 140 << 30, reserved: 0 }),
            gpu_temp_c: Some(40),
            memory_temp_c: Some(45),
            ..Default::default()
        })
        .collect();
    p.gpus.reading(readings, 0.0);
    for pid in 1..=processes {
        let at = |e: Event| Event { pid, tid: pid, comm: COMM, ts_ns: 1, latency_ns: 5_000, ..e };
        for dev in 0..gpus as i32 {
            let ctx = 0x100 + dev as u64;
            p.apply(&at(Event { handle: ctx, device: dev, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }), Stack::None);
            p.apply(&at(Event { handle: ctx, ..Event::empty(api::CU_CTX_SET_CURRENT) }), Stack::None);
            if owners == 0 {
                p.apply(&at(Event { addr: 0x1000 + dev as u64, size: 2 << 20, ..Event::empty(api::CU_MEM_ALLOC_V2) }), Stack::None);
            }
            for k in 0..owners as u64 {
                let addr = (dev as u64 + 1) << 32 | (k + 1) << 21;
                let alloc = Event { addr, size: (k + 1) << 20, ..Event::empty(api::CU_MEM_ALLOC_V2) };
                p.apply(&at(alloc), Stack::Recorded(OWNER_STACK + k));
            }
        }
    }
    let agent = AgentStatus { probes_attached: 30, ..Default::default() };
    let mut times = Vec::new();
    let mut body = String::new();
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        // A scrape: the view, then the rendering.
        let view = p.view(&scrape_view(LEAK_AGE_NS));
        body = prometheus::render(&Scrape::of(&p, &view, &agent, usize::MAX))?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    // What travels: the scrape gzipped (Prometheus asks for it) and an OTLP push of the same series.
    let gzip = |b: &[u8]| gpumem_agent::http_post::gzip(b).map(|z| z.len());
    let gz = gzip(body.as_bytes())?;
    let view = p.view(&scrape_view(LEAK_AGE_NS));
    let (otlp, push_times) = pushes(&Scrape::of(&p, &view, &agent, usize::MAX), rounds);
    let (otlp_gz, otlp) = (gzip(&otlp)?, otlp.len());
    let samples = body.lines().filter(|l| !l.starts_with('#')).count();
    let series = |family: &str| body.lines().filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{')).count();
    let (process_series, owner_series) = (series("gpumem_process_memory_bytes"), series("gpumem_process_memory_by_owner_bytes"));
    println!(
        "process_series={process_series} owner_series={owner_series} samples={samples} bytes={} gzip_bytes={gz} otlp_bytes={otlp} otlp_gzip_bytes={otlp_gz} text_bytes={} median_ms={:.2} min_ms={:.2} otlp_median_ms={:.2}",
        body.len(),
        prometheus::to_text_format(&body).len(),
        times[times.len() / 2] * 1e3,
        times[0] * 1e3,
        push_times[push_times.len() / 2] * 1e3
    );
    Ok(())
}

/// An OTLP push (serve --otlp-endpoint) of the scrape's families, `rounds`
/// times: its body, and the times sorted.
fn pushes(scrape: &Scrape<'_>, rounds: u32) -> (Vec<u8>, Vec<f64>) {
    let times_ns = gpumem_engine::export::otlp::Times { start_ns: 1, now_ns: 2 };
    let mut times = Vec::new();
    let mut body = Vec::new();
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        body = gpumem_engine::export::otlp::request(&prometheus::families(scrape), "node", times_ns);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    (body, times)
}
