//! `gpumem serve`: the daemon. Traces every process on the host and answers
//! Prometheus scrapes on /metrics until SIGTERM/SIGINT, then detaches every
//! probe before it exits.
//!
//! It is a composition of Outputs fed one session, each in a file of its
//! own: the metrics listener (metrics.rs), the local API (api.rs), the
//! OTLP pusher (otlp.rs), the actions (act.rs) and the flight recorder
//! (flight.rs). The runtime's task owns all state; a server asks it for a
//! rendering over a channel (an input of its output), so a scrape never
//! races an event and nothing is locked.
mod act;
mod api;
mod cleanup;
mod flight;
mod http;
mod metrics;
mod otlp;
mod page;
mod peer;

pub use metrics::scrape_view;

use std::{cell::RefCell, process::ExitCode, rc::Rc, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    cli::ServeArgs,
    runtime::{self, Detach, Session},
};

/// Memory actions the daemon keeps for exports' traces (about 64 bytes each).
const HISTORY_ENTRIES: usize = 1 << 16;
/// How often the traced processes' host memory, swap and cgroups are read.
const HOST_INTERVAL: Duration = Duration::from_secs(5);

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    if args.continuity.cleanup {
        let done = cleanup::run(&args.continuity.pin_dir, &args.continuity.state_dir)?;
        if args.continuity.then_wait {
            cleanup::wait_for_stop();
        }
        return Ok(done);
    }
    // The capabilities first (nothing bound or created without them), then
    // the port: a taken one is the most likely mistake, said before loading anything.
    runtime::require_privileges(crate::privileges::Role::Serve)?;
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {} (is another gpumem or exporter using it? choose one with --listen)", args.listen))?;
    let api = match &args.socket {
        Some(path) => {
            let group = args.socket_group.as_deref().map(crate::daemon::socket::group_id).transpose()?;
            let (l, note) = crate::daemon::socket::bind(path, group)?;
            if let Some(n) = note {
                eprintln!("gpumem: {n}");
            }
            // SAFETY: geteuid cannot fail.
            let access = peer::Access { own_uid: unsafe { libc::geteuid() }, group };
            Some(api::LocalApi::new(l, path.clone(), format!("http://{}/metrics", args.listen), access))
        }
        None => None,
    };
    let probing = args.probes.probing();
    let actions = args.actions.config();
    let flight = flight_recorder(&args, actions.is_some(), probing.stacks.effective_sample_bytes())?;
    let node = crate::node::name();
    let extras =
        metrics::Extras { otlp: args.otlp_endpoint.is_some().then(Default::default), actions: actions.is_some().then(Default::default) };
    let settings = metrics::Settings {
        max_process_series: args.max_process_series as usize,
        leak_age_s: args.leak_age,
        nvml_interval_s: args.nvml_interval,
        fail_renders: args.fail_renders,
        page: !args.no_page,
    };
    let metrics = metrics::Metrics::new(listener, args.listen, settings, extras.clone());
    let otlp = args.otlp_endpoint.clone().zip(extras.otlp.clone()).map(|(endpoint, pushes)| {
        let s = otlp::Settings {
            endpoint,
            every: Duration::from_secs_f64(args.otlp_interval),
            node: node.clone(),
            leak_age_s: args.leak_age,
            max_process_series: args.max_process_series as usize,
        };
        otlp::OtlpPush::new(s, pushes, extras.clone())
    });
    let acting = actions.zip(extras.actions.clone()).map(|(config, counts)| act::Acting::new(config, counts, node, flight.clone()));
    let window = flight.map(flight::Window);
    // Started in this order (the second of a pair first): the flight
    // recorder, the local API, OTLP, the actions, then /metrics with the
    // ready line; every event reaches the flight recorder before the actions.
    let mut serve = (metrics, (acting, (otlp, (api, window))));
    runtime::run(session(&args, probing), &mut serve)
}

/// The daemon's session: every process, growth sampled, history and host
/// memory kept, exited processes forgotten after their grace, probes gone at the end.
fn session(args: &ServeArgs, probing: runtime::Probing) -> Session {
    let mut s = Session::new(probing);
    s.events_ring = runtime::rings::sized(args.ringbuf_bytes);
    s.pipeline.limits.max_entries = args.max_allocations;
    s.pipeline.history = Some(HISTORY_ENTRIES);
    s.growth_every = Some(Duration::from_secs_f64(args.growth_interval));
    s.nvml_every = Duration::from_secs_f64(args.nvml_interval);
    s.host_every = Some(HOST_INTERVAL);
    s.kmsg = Some(args.kmsg.clone()).filter(|p| p.as_os_str() != "none");
    // The flight recorder keeps the lookups its recordings need.
    s.record_lookups = args.actions.flight_recorder.is_some();
    s.forget_after = Some(Duration::from_secs_f64(args.exited_grace));
    s.detach = Detach::Now;
    s.fail_counter_reads = args.fail_counter_reads;
    s.continuity = args.continuity.options();
    s.role = crate::privileges::Role::Serve;
    s
}

/// `--flight-recorder`, which only writes when something acts.
fn flight_recorder(args: &ServeArgs, acting: bool, stack_sample_bytes: u64) -> Result<Option<flight::Flight>> {
    let Some(window_s) = args.actions.flight_recorder else { return Ok(None) };
    if !acting {
        anyhow::bail!("--flight-recorder writes its window when an action fires: add --action EVENT=COMMAND or --webhook URL");
    }
    let recorder = flight::FlightRecorder::new(window_s, args.actions.flight_dir.clone(), stack_sample_bytes);
    Ok(Some(Rc::new(RefCell::new(recorder))))
}
