//! The agent's own families: what it lost, dropped, counted, costs and is.
use gpumem_common::counters::Exit;

use super::{
    catalog as m,
    families::{Families, Value},
    Scrape,
};
use crate::model::actions::Target;

pub(super) fn self_families(fams: &mut Families, s: &Scrape<'_>) {
    let a = s.agent;
    let (lost, full) = (&a.kernel.lost, &a.kernel.tables_full);
    let reasons = [
        ("ringbuf_full", lost.ringbuf_full),
        ("pending_full", lost.pending_full),
        ("return_without_entry", lost.return_without_entry),
        ("malformed", lost.malformed),
    ];
    fams.add(m::LOST_EVENTS).extend(reasons.iter().map(|&(r, n)| (vec![("reason", r.to_string())], Value::Count(n))));
    let outcomes = [("sampled", s.stacks.sampled), ("not_sampled", s.stacks.not_sampled)];
    fams.add(m::STACKS_SAMPLING).extend(outcomes.iter().map(|&(o, n)| (vec![("outcome", o.to_string())], Value::Count(n))));
    let d = &a.kernel.stacks_dropped;
    let reasons = [("ring_full", d.ring_full), ("unmatched", d.unmatched)];
    fams.add(m::STACKS_DROPPED).extend(reasons.iter().map(|&(r, n)| (vec![("reason", r.to_string())], Value::Count(n))));
    let exits = &a.kernel.exits.0;
    fams.add(m::PROBE_EXITS).extend(
        Exit::ALL.iter().map(|e| (vec![("reason", e.name().to_string())], Value::Count(exits.get(e.name()).copied().unwrap_or(0)))),
    );
    let o = &s.state.overflow;
    let tables = [
        ("allocations", o.entries_dropped),
        ("processes", o.process_events_dropped),
        ("stacks", s.stacks.table_full),
        ("xid_history", s.gpus.xids_dropped),
        ("kernel_tracked_processes", full.tracked_processes),
        ("kernel_pid_filter", full.pid_filter),
        ("kernel_live_entries", full.kernel_table),
    ];
    fams.add(m::TABLE_OVERFLOW).extend(tables.iter().map(|&(t, n)| (vec![("table", t.to_string())], Value::Count(n))));
    fams.add(m::IMPLAUSIBLE_EVENTS).push((vec![], Value::Count(s.state.implausible_events)));
    fams.add(m::UNKNOWN_EVENTS).push((vec![], Value::Count(s.state.unknown_events)));
    fams.add(m::PROBES_ATTACHED).push((vec![], Value::int(a.probes_attached as u64)));
    if let Some((ok, failed)) = s.otlp_pushes {
        let outcomes = [("ok", ok), ("failed", failed)];
        fams.add(m::OTLP_PUSHES).extend(outcomes.iter().map(|&(o, n)| (vec![("outcome", o.to_string())], Value::Count(n))));
    }
    if let Some(counts) = &s.actions {
        for (family, of) in [(m::ACTIONS, Target::Command), (m::WEBHOOKS, Target::Webhook)] {
            let series = counts.iter().filter(|((target, ..), _)| *target == of).map(|(&(_, kind, outcome), &n)| {
                (vec![("event", kind.name().to_string()), ("outcome", outcome.name().to_string())], Value::Count(n))
            });
            fams.add(family).extend(series);
        }
    }
    fams.add(m::STALE_CALLS_REMOVED).push((vec![], Value::Count(a.stale_calls_removed)));
    fams.add(m::EVENTS_PROCESSED).push((vec![], Value::Count(s.state.events)));
    fams.add(m::TRACKED_PROCESSES).push((vec![], Value::int(s.state.processes.len() as u64)));
    fams.add(m::NVML_UP).push((vec![], Value::flag(s.gpus.error.is_none())));
    fams.add(m::DEGRADED).extend(s.degraded.totals.iter().map(|(r, &n)| (vec![("reason", r.name().to_string())], Value::Count(n))));
    fams.add(m::AGENT_ERRORS).extend(a.errors.iter().map(|(&op, &n)| (vec![("operation", op.to_string())], Value::Count(n))));
    fams.add(m::AGENT_CPU).push((vec![], Value::FloatCount(a.usage.cpu_seconds)));
    fams.add(m::AGENT_RSS).push((vec![], Value::int(a.usage.resident_bytes)));
    fams.add(m::AGENT_BPF_MAP_RSS).push((vec![], Value::int(a.usage.bpf_map_resident_bytes)));
    fams.add(m::AGENT_BPF_MAP_BYTES).extend(a.bpf_maps.iter().map(|b| (vec![("map", b.name.clone())], Value::int(b.bytes))));
    let parts = s.heap.labelled();
    let unattributed = s.heap.unattributed(a.usage.heap_in_use_bytes);
    let heap = parts.into_iter().chain([("unattributed", unattributed)]);
    fams.add(m::AGENT_HEAP).extend(heap.map(|(part, b)| (vec![("part", part.to_string())], Value::int(b))));
    fams.add(m::AGENT_HEAP_FREE).push((vec![], Value::int(a.usage.heap_free_bytes)));
    let cache = |c: &crate::heap::Cache| vec![("cache", c.name.clone())];
    fams.add(m::AGENT_CACHE_ENTRIES).extend(s.caches.iter().map(|c| (cache(c), Value::int(c.entries))));
    fams.add(m::AGENT_CACHE_MAX).extend(s.caches.iter().map(|c| (cache(c), Value::int(c.max_entries))));
    fams.add(m::AGENT_CACHE_EVICTIONS).extend(s.caches.iter().map(|c| (cache(c), Value::Count(c.evicted))));
    if let Some(t) = &a.kernel_table {
        fams.add(m::KERNEL_TABLE_ENTRIES).push((vec![], Value::int(t.entries)));
        fams.add(m::KERNEL_TABLE_CAPACITY).push((vec![], Value::int(t.max_entries)));
        fams.add(m::KERNEL_TABLE_BYTES).push((vec![], Value::int(t.bytes)));
    }
    let build = vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("revision", a.revision.to_string())];
    fams.add(m::BUILD_INFO).push((build, Value::Int(1)));
}
