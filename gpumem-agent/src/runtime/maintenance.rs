//! The maintenance tick every live session runs: new libcuda copies
//! attached, NVIDIA descriptors rescanned, stale calls swept, exited
//! processes forgotten (state, growth, stacks, the kernel's loss counts),
//! and the kernel's counters read.
use std::time::{Duration, Instant};

use super::{bringup, discovery::Signals, Session};
use crate::probes::Agent;
use gpumem_engine::{clock::monotonic_ns, model::agent::AgentStatus, model::lost::ReaderCounts, pipeline::Pipeline};

/// How often the tick runs.
pub const EVERY: Duration = Duration::from_millis(500);
/// NVIDIA descriptors the open tracepoint cannot see (inherited, dup'ed) are
/// picked up from /proc, and calls of dead threads swept, every this many
/// ticks (2 s).
const SLOW_TICKS: u64 = 4;
/// The name of the kernel-counter read in `AgentStatus::errors`.
const READ_COUNTERS: &str = "read_kernel_counters";

pub struct Maintenance {
    ticks: u64,
    /// The last scan of every process for libraries (see `discovery`).
    last_full_scan: Instant,
    /// Fault injection: reads of the kernel counters still to fail.
    fail_reads: u32,
    /// Say what fails on stderr (not while a full-screen UI runs).
    announce: bool,
}

impl Maintenance {
    pub fn new(s: &Session) -> Self {
        Maintenance { ticks: 0, last_full_scan: Instant::now(), fail_reads: s.fail_counter_reads, announce: s.announce }
    }

    /// One tick; true when every process traced with -p has exited.
    pub fn tick(
        &mut self,
        agent: &mut Agent,
        s: &Session,
        pipeline: &mut Pipeline,
        status: &mut AgentStatus,
        reader: ReaderCounts,
    ) -> bool {
        if self.last_full_scan.elapsed() >= Signals::full_scan_every(agent) {
            self.last_full_scan = Instant::now();
            bringup::attach_discovered(agent, &s.probing, false, |m| {
                if s.announce {
                    eprintln!("gpumem: {m}");
                }
            });
        }
        status.probes_attached = agent.attached_probe_count();
        status.discovery = agent.scan_stats.clone();
        self.ticks += 1;
        if self.ticks.is_multiple_of(SLOW_TICKS) {
            agent.seed_nvidia_fds();
            agent.sweep_stale_calls();
            status.stale_calls_removed = agent.stale_calls_removed;
            let state = &pipeline.state;
            agent.forget_lost(|pid| state.processes.contains_key(&pid));
        }
        // Exited processes keep their (zero) figures for the grace period.
        if let Some(grace) = s.forget_after {
            pipeline.forget_exited_before(monotonic_ns().saturating_sub(grace.as_nanos() as u64));
        }
        if pipeline.stacks.release_idle() {
            crate::selfstat::return_freed_memory();
        }
        self.refresh(agent, pipeline, status, reader);
        !s.pids.is_empty() && s.pids.iter().all(|&p| !gpumem_engine::procfs::alive(p, None))
    }

    /// Reads the kernel's counters into the status and marks the processes
    /// that lost events. A failed read keeps the last figures and is counted.
    pub fn refresh(&mut self, agent: &Agent, pipeline: &mut Pipeline, status: &mut AgentStatus, reader: ReaderCounts) {
        let read = if self.fail_reads > 0 {
            self.fail_reads -= 1;
            Err(crate::probes::ProbeError::Injected("reading the kernel's counters"))
        } else {
            agent.kernel_counters(reader)
        };
        match read {
            Ok(k) => {
                pipeline.state.mark_lost(&k.lost.by_pid);
                status.kernel = k;
            }
            Err(e) => {
                let n = status.errors.entry(READ_COUNTERS).or_default();
                if *n == 0 && self.announce {
                    eprintln!("gpumem: reading the kernel's counters failed ({e}); the last figures stay until a read succeeds");
                }
                *n += 1;
                // The reader's own counts need no kernel read: keep them current.
                status.kernel = status.kernel.with_reader(reader);
            }
        }
    }
}
