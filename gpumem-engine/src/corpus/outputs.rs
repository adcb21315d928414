//! One recording held through every output: `leaks` (JSON), `top`'s
//! snapshot, `/metrics`, the report and the actions' triggers all give the
//! verdicts of the one detector.
use gpumem_common::DEVICE_UNKNOWN;

use super::{recording, shapes, LEAK, PID, TEMPS, WEIGHTS};
use crate::{
    analysis::{
        growth::Finding,
        leaks,
        triggers::{Edges, TriggerKind},
        view::ViewOptions,
    },
    export::{
        prometheus::{self, Scrape},
        report::ReportData,
    },
    model::agent::AgentStatus,
    pipeline::{Lookups, Options, Pipeline, Stack},
    query::{self, Answer, Asked, Query},
    record::{Reader, Record},
};

/// The pipeline at the end of the shape's replay, and the last event's time.
fn replayed(name: &str) -> (Pipeline, u64) {
    let shape = shapes().iter().find(|s| s.name == name).expect("a corpus shape");
    let bytes = recording(shape).unwrap();
    let mut p = Pipeline::new(Options::default(), Lookups::recorded());
    let mut r = Reader::new(bytes.as_slice()).unwrap();
    let mut now = 0;
    while let Some(rec) = r.next_record() {
        match rec.unwrap() {
            Record::Stack { id, frames } => p.stacks.insert_symbolized(id, frames),
            Record::Event { event, stack } => {
                now = event.ts_ns;
                p.apply(&event, stack.map_or(Stack::None, Stack::Recorded));
            }
            Record::Tick(t) => p.sample_growth(t),
            _ => {}
        }
    }
    (p, now)
}

#[test]
fn every_output_gives_the_same_verdicts_for_one_recording() {
    let (mut p, now_ns) = replayed("leak_40mib_s_batched_frees_11");
    let agent = AgentStatus::default();
    let asked = Asked { agent: &agent, now_ns, duration_s: 40.0, wall_end_ns: 0, recorded_by: "test".into(), serving: None };
    let leak_id = format!("{LEAK:016x}");

    // leaks: the process leaks, and of its groups only the leaking stack.
    let q = Query::Leaks(query::leaks::LeaksQuery { pids: vec![], older_than_s: 0.0, top: 10, json: true });
    let Answer::Leaks { report, .. } = query::answer(&mut p, &asked, &q).unwrap() else { panic!("a leaks answer") };
    let proc = report.processes.iter().find(|l| l.pid == PID).expect("the process");
    let growth = proc.growth.as_ref().expect("a verdict");
    assert_eq!(growth.verdict, Finding::Leak, "{growth:?}");
    let called: Vec<(&str, Finding)> =
        proc.stacks.iter().filter_map(|g| Some((g.stack_id.as_deref()?, g.verdict.as_ref()?.verdict))).collect();
    let leaking: Vec<&str> = called.iter().filter(|c| c.1 == Finding::Leak).map(|c| c.0).collect();
    assert_eq!(leaking, [leak_id.as_str()], "{called:?}");
    for id in [WEIGHTS, TEMPS] {
        assert!(called.iter().any(|c| c.0 == format!("{id:016x}") && c.1 != Finding::Leak), "{called:?}");
    }

    // top's snapshot: LEAK, and the growth rate of the leaking group (never 0 B/s).
    let Answer::Snapshot(s) = query::answer(&mut p, &asked, &Query::Snapshot).unwrap() else { panic!("a snapshot") };
    let row = s.snapshot.rows.iter().find(|r| r.pid == PID).expect("a top row");
    assert_eq!((row.verdict.as_str(), row.leaking), ("LEAK", true), "{row:?}");
    assert!((row.growth_bytes_per_s - growth.rate_bytes_per_s).abs() < 1.0, "{row:?} vs {growth:?}");

    // /metrics: the process flagged, the leaking group's bytes by stack_id, no other group.
    let view = p.view(&ViewOptions { now_ns, ..Default::default() });
    let text = prometheus::render(&Scrape::of(&p, &view, &agent, 16)).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with("gpumem_process_leak_suspected{") && l.contains(&format!("pid=\"{PID}\"")) && l.ends_with(" 1")),
        "{text}"
    );
    let group_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("gpumem_leak_group_bytes{")).collect();
    assert_eq!(group_lines.len(), 1, "{group_lines:?}");
    assert!(group_lines[0].contains(&format!("stack_id=\"{leak_id}\"")), "{group_lines:?}");

    // The report: the process's verdict and the group's, in words.
    let found = leaks::find(&p.state, &mut p.stacks, &mut p.growth, now_ns, 0, 10);
    let html = ReportData { leaks: found, ..Default::default() }.html().unwrap();
    assert!(html.contains("growth: growing") && html.contains("— LEAK (growing"), "the report's leak suspects");
    assert_eq!(html.matches("— LEAK (").count(), 1, "one leaking group in the report");

    // The actions: one leak trigger, for this process.
    let triggers = Edges::default().growth(&view.rows, now_ns);
    let kinds: Vec<(TriggerKind, Option<u32>)> = triggers.iter().map(|t| (t.kind, t.pid)).collect();
    assert_eq!(kinds, [(TriggerKind::Leak, Some(PID))]);
    assert!(view.rows.iter().all(|r| r.device != DEVICE_UNKNOWN));
}

#[test]
fn a_daemon_with_history_answers_with_a_verdict_at_once() {
    // What top over a daemon shows is the daemon's snapshot: after a
    // minute of a plateaued cache, not "not enough data".
    let (mut p, now_ns) = replayed("cache_steps_then_flat");
    let agent = AgentStatus::default();
    let asked = Asked { agent: &agent, now_ns, duration_s: 60.0, wall_end_ns: 0, recorded_by: "test".into(), serving: None };
    let Answer::Snapshot(s) = query::answer(&mut p, &asked, &Query::Snapshot).unwrap() else { panic!("a snapshot") };
    let row = s.snapshot.rows.iter().find(|r| r.pid == PID).expect("a top row");
    assert_eq!(row.verdict, "plateau", "{row:?}");
}
