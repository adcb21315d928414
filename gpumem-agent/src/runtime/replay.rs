//! A recording fed through the same pipeline and outputs as a live
//! session: stacks and lookups as recorded, growth samples where they were
//! taken, NVML readings, XIDs and host-memory readings where they came.
use std::{io::Read, process::ExitCode};

use anyhow::Result;

use super::{Ctx, End, Flow, Output};
use gpumem_engine::{
    pipeline::{self, Lookups, Pipeline, Stack},
    record::{Footer, Header, Reader, Record},
};

/// Replays `reader` into `out`; the recording's own end (or what was read
/// of it) is handed to `out.finish`.
pub fn replay<R: Read, O: Output>(reader: &mut Reader<R>, options: pipeline::Options, out: &mut O) -> Result<ExitCode> {
    let mut pipeline = Pipeline::new(options, Lookups::recorded());
    // A recording does not say which processes its session chose: NVML's
    // untraced ones are not shown (their names were never recorded either).
    pipeline.untraced_scope = Some(Vec::new());
    let mut agent = crate::selfstat::status();
    out.started(&mut Ctx { pipeline: &mut pipeline, agent: &agent, elapsed_s: 0.0 })?;
    let (mut header, mut footer, mut damage): (Option<Header>, Option<Footer>, _) = (None, None, None);
    let mut last_ts = 0u64;
    while let Some(rec) = reader.next_record() {
        let elapsed_s = header.as_ref().map_or(0.0, |h| last_ts.saturating_sub(h.started_ns) as f64 / 1e9);
        let mut ctx = Ctx { pipeline: &mut pipeline, agent: &agent, elapsed_s };
        match rec {
            Ok(Record::Header(h)) => {
                ctx.pipeline.stacks.sample_bytes = h.stack_sample_bytes;
                header = Some(*h);
            }
            Ok(Record::Event { event, stack }) => {
                last_ts = event.ts_ns;
                let o = ctx.pipeline.apply(&event, stack.map_or(Stack::None, Stack::Recorded));
                if out.event(&mut ctx, &o)? == Flow::Stop {
                    break;
                }
            }
            Ok(Record::Stack { id, frames }) => ctx.pipeline.stacks.insert_symbolized(id, frames),
            Ok(Record::Lookup(l)) => ctx.pipeline.lookups.add(*l),
            Ok(Record::Tick(t)) => {
                ctx.pipeline.sample_growth(t);
                out.sampled(&mut ctx, t)?;
            }
            Ok(Record::Nvml(p)) => ctx.pipeline.recorded_nvml(*p),
            Ok(Record::Xid(x)) => ctx.pipeline.recorded_xid(*x),
            Ok(Record::Host(h)) => {
                let t = h.t_s;
                ctx.pipeline.recorded_host(*h);
                out.host(&mut ctx, t)?;
            }
            Ok(Record::Footer(f)) => footer = Some(*f),
            Err(e) => {
                damage = Some(e);
                break;
            }
        }
    }
    pipeline.apply_recorded_reading();
    let complete = footer.is_some();
    let footer = footer.unwrap_or_else(|| Footer {
        duration_s: header.as_ref().map_or(0.0, |h| last_ts.saturating_sub(h.started_ns) as f64 / 1e9),
        ended_ns: last_ts,
        nvml: "unknown: the recording has no footer".into(),
        ..Default::default()
    });
    if let (Some(t), Some(h)) = (pipeline.timeline.as_mut(), &header) {
        t.align(h.started_ns);
    }
    pipeline.state.mark_lost(&footer.lost.by_pid);
    agent.probes_attached = footer.probes_attached;
    agent.kernel.lost = footer.lost.clone();
    agent.kernel.tables_full = footer.tables_full.clone();
    agent.kernel.stacks_dropped = footer.stacks_dropped;
    agent.stale_calls_removed = footer.stale_calls_removed;
    agent.discovery = footer.discovery.clone();
    out.drained(&mut Ctx { pipeline: &mut pipeline, agent: &agent, elapsed_s: footer.duration_s })?;
    let end = End { header, footer, complete, damage, events: reader.events };
    out.finish(&mut Ctx { pipeline: &mut pipeline, agent: &agent, elapsed_s: end.footer.duration_s }, &end)
}
