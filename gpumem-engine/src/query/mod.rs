//! The questions every reader asks of what gpumem knows — a leaks report,
//! top's snapshot or text, a process's stacks, holdings, an export, the
//! daemon's status — and the one function that answers them from a
//! pipeline. A command at the end of its own session and a running daemon
//! asked over its socket answer with this same code, so the answer is the
//! same whichever side built it; `wire` is how a query and its answer
//! travel over the socket.
pub mod events;
pub mod export;
pub mod holdings;
pub mod leaks;
pub mod status;
pub mod top;
pub mod wire;

use crate::{
    analysis::leaks::LeakGroup,
    export::{leaks::LeaksReport, top::Snapshot},
    model::{agent::AgentStatus, Holding},
    pipeline::Pipeline,
};

/// A question.
#[derive(Clone, Debug, PartialEq)]
pub enum Query {
    /// Outstanding allocations by stack, with verdicts.
    Leaks(leaks::LeaksQuery),
    /// `top --once`'s text.
    Top,
    /// The live top's snapshot.
    Snapshot,
    /// A process's largest live stacks on a device.
    Stacks { pid: u32, device: i32 },
    /// What these processes hold (all, if none is named).
    Holdings { pids: Vec<u32> },
    /// The daemon's own status.
    Status,
    /// Recent OOMs and XIDs.
    Events,
    /// An export (pprof, PyTorch snapshot, Perfetto) of what is known now.
    Export(export::ExportQuery),
}

/// What the asker knows beside the pipeline: the agent's status and the
/// span of the session the pipeline saw.
pub struct Asked<'a> {
    pub agent: &'a AgentStatus,
    /// CLOCK_MONOTONIC now (the events' clock).
    pub now_ns: u64,
    /// Seconds since the session began.
    pub duration_s: f64,
    /// Wall-clock nanoseconds now, where known (exports' time).
    pub wall_end_ns: i64,
    /// Who gathered what is exported (a line in the export).
    pub recorded_by: String,
    /// A daemon's own facts (its status answer).
    pub serving: Option<&'a status::Serving>,
}

/// An answer, typed.
#[derive(Debug)]
pub enum Answer {
    Leaks {
        report: LeaksReport,
        json: bool,
    },
    Top(Snapshot),
    Snapshot(top::SnapshotAnswer),
    /// None: the process is gone.
    Stacks(Option<Vec<LeakGroup>>),
    Holdings(Vec<Holding>),
    Status(status::DaemonStatus),
    Events(events::EventsAnswer),
    Export(export::Rendered),
}

/// Why a question could not be answered: what was asked does not exist
/// (an export of what this session did not keep) or rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    Unanswerable(String),
    #[error("rendering the answer failed: {0}")]
    Render(#[from] std::io::Error),
}

/// Answers `q` from what the pipeline holds now.
pub fn answer(p: &mut Pipeline, at: &Asked<'_>, q: &Query) -> Result<Answer, QueryError> {
    let k = &at.agent.kernel;
    Ok(match q {
        Query::Leaks(l) => {
            let span = leaks::Span { now_ns: at.now_ns, duration_s: at.duration_s };
            Answer::Leaks { report: leaks::report(p, l, span, k.stacks_dropped, k.lost.total()), json: l.json }
        }
        Query::Top => Answer::Top(top::snapshot(p, at.now_ns, k.lost.total())),
        Query::Snapshot => Answer::Snapshot(top::SnapshotAnswer {
            snapshot: top::snapshot(p, at.now_ns, k.lost.total()),
            probes_attached: at.agent.probes_attached,
        }),
        Query::Stacks { pid, device } => Answer::Stacks(top::stacks(p, *pid, *device, at.now_ns)),
        Query::Holdings { pids } => Answer::Holdings(holdings::of(&p.state, pids)),
        Query::Status => Answer::Status(status::of(p, at)),
        Query::Events => Answer::Events(events::recent(p, at.now_ns)),
        Query::Export(e) => {
            let span = export::Span {
                ended_ns: at.now_ns,
                duration_s: at.duration_s,
                wall_end_ns: at.wall_end_ns,
                recorded_by: at.recorded_by.clone(),
                title: at.recorded_by.clone(),
            };
            Answer::Export(export::render(p, e, &span)?)
        }
    })
}
