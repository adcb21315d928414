//! `gpumem health`: NVML readings and health per GPU, once or `--watch`ed.
use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use crate::{
    cli::HealthArgs,
    nvml::{xid::XidWatcher, Sampler},
};
use gpumem_engine::{
    analysis::health::{self, GpuWatch},
    clock::monotonic_ns,
    export::health::Report,
};

/// Exit status when NVML cannot be used (no library, no driver, no device).
pub const EXIT_NO_NVML: u8 = 3;

fn now_s() -> f64 {
    monotonic_ns() as f64 / 1e9
}

pub fn run(args: HealthArgs) -> Result<ExitCode> {
    // A driver upgraded under a loaded module fails NVML: say so first, by name.
    let lib = args.nvml.as_deref().map(|p| p.as_os_str());
    let nvml_lib = crate::driver::nvml_path(lib).map(|p| ("NVML", p));
    let driver = crate::driver::Versions::read(&args.driver_version_file, nvml_lib.into_iter().collect());
    if let Some(m) = driver.mismatch_message() {
        eprintln!("gpumem: {m}");
    }
    let mut sampler = match Sampler::open(lib) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpumem: {e}; GPU health needs NVML (the NVIDIA driver). Tracing works without it.");
            return Ok(ExitCode::from(EXIT_NO_NVML));
        }
    };
    let t = health::Thresholds {
        ecc_warn_per_hour: args.ecc_warn_per_hour,
        ecc_critical_per_hour: args.ecc_critical_per_hour,
        hbm_temp_c: args.hbm_temp_c,
    };
    // XIDs arrive on their own thread, from the start.
    let (tx, xids) = std::sync::mpsc::channel();
    let watcher = XidWatcher::start(args.nvml.as_ref().map(|p| p.as_os_str().to_os_string()), monotonic_ns, move |x| tx.send(x).is_ok());
    let xid_watch = match &watcher {
        Ok(w) if w.unsupported.is_empty() => "watching".to_string(),
        Ok(w) => format!("watching; not supported on GPU(s) {:?}", w.unsupported),
        Err(e) => format!("not watched: {e}"),
    };
    let mut watch = GpuWatch::new(t);
    let mut reports = 0u64;
    loop {
        let now = now_s();
        match sampler.sample(now) {
            Ok(r) => watch.reading(r, now),
            Err(e) => {
                eprintln!("gpumem: {e}");
                return Ok(ExitCode::from(EXIT_NO_NVML));
            }
        }
        for x in xids.try_iter() {
            watch.xid(x);
        }
        if let Some(gpus) = watch.assessments() {
            Report { kind: "health", interval_s: args.interval, xid_watch: xid_watch.clone(), gpus }.print(args.json)?;
            reports += 1;
            if !args.watch || args.count.is_some_and(|c| reports >= c) {
                return Ok(ExitCode::SUCCESS);
            }
        }
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}
