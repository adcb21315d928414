//! Event-driven discovery: a process that ran a new program or changed its
//! link map (the kernel's discovery signals) has its maps read at once, and
//! only it; a full scan of every process stays as a slow safety net for
//! loaders without the hook and for signals lost to a full ring.
use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use gpumem_common::{api, Event};

use super::bringup;
use crate::probes::Agent;

/// The safety net's pace while discovery is event-driven.
pub const FULL_SCAN_EVERY: Duration = Duration::from_secs(30);
/// The pace where no loader could be hooked: signals cover exec only.
pub const FALLBACK_SCAN_EVERY: Duration = Duration::from_millis(500);
/// A process that exec'd through a loader not hooked before is read again
/// this long after: its libraries may have been loaded before the hook.
const RECHECKS: [Duration; 2] = [Duration::from_millis(100), Duration::from_secs(1)];

#[derive(Default)]
pub struct Signals {
    /// Python processes among those that map libcuda.
    pub python: crate::probes::python::Tracker,
    pending: BTreeSet<u32>,
    /// Signals taken since the last run (several may name one process).
    received: u64,
    rechecks: Vec<(Instant, u32)>,
}

impl Signals {
    /// Takes a discovery signal; false for any other event.
    pub fn take(&mut self, ev: &Event) -> bool {
        if !api::is_discovery(ev.api) {
            return false;
        }
        self.pending.insert(ev.pid);
        self.received += 1;
        true
    }

    /// Reads the processes signalled (and the second looks due), attaching
    /// what they map that is new.
    pub fn run(&mut self, agent: &mut Agent, now: Instant, mut say: impl FnMut(String)) {
        let due: Vec<u32> = self.rechecks.iter().filter(|(at, _)| *at <= now).map(|&(_, pid)| pid).collect();
        self.rechecks.retain(|(at, _)| *at > now);
        agent.scan_stats.signals += std::mem::take(&mut self.received);
        self.python.refresh_stale(agent, now);
        for pid in std::mem::take(&mut self.pending).into_iter().chain(due) {
            let (new_loader, cuda) = bringup::attach_in_process(agent, pid, &mut say);
            if new_loader {
                self.rechecks.extend(RECHECKS.iter().map(|d| (now + *d, pid)));
            }
            if cuda {
                // Before its first allocation, as a rule: dlopen of libcuda signalled it.
                self.python.check(agent, pid);
            }
        }
    }

    /// The full scan's pace: slow while loaders are hooked and exec is traced.
    pub fn full_scan_every(agent: &Agent) -> Duration {
        if event_driven(agent) {
            FULL_SCAN_EVERY
        } else {
            FALLBACK_SCAN_EVERY
        }
    }
}

fn event_driven(agent: &Agent) -> bool {
    let exec = agent.tracepoints.iter().any(|t| t.tracepoint == "sched:sched_process_exec" && t.attached);
    exec && agent.hooked_loaders() > 0
}

/// How new libraries are found, for `gpumem status`.
#[derive(Debug, serde::Serialize)]
pub struct DiscoveryReport {
    /// `event_driven` or `periodic`.
    pub mode: &'static str,
    pub why: String,
    pub full_scan_every_s: f64,
    pub loaders: Vec<crate::probes::loaders::LoaderReport>,
}

pub fn report(agent: &Agent) -> DiscoveryReport {
    let (mode, why) = if event_driven(agent) {
        (
            "event_driven",
            format!(
                "sched_process_exec and the {} hook of {} dynamic loader(s): a process is read when it execs or loads a library",
                crate::probes::loaders::HOOK,
                agent.hooked_loaders()
            ),
        )
    } else {
        ("periodic", "no dynamic loader hooked or no exec tracepoint: every process is read at each scan".to_string())
    };
    DiscoveryReport { mode, why, full_scan_every_s: Signals::full_scan_every(agent).as_secs_f64(), loaders: agent.loaders.clone() }
}
