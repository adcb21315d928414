//! Property tests ("fuzzing") of everything that reads bytes this process did
//! not write: ring-buffer records, recordings, and the state and outputs fed
//! with whatever such a record may say. No input may panic, hang or make a
//! figure wrap; damaged input must say what is wrong.
//!
//! The corpus (`tests/corpus/*.gpumemrec`, committed) replays to known
//! outcomes and seeds the mutations; proptest saves any failing case under
//! `proptest-regressions/` (committed too), so that it is replayed first.
use std::{collections::BTreeMap, convert::Infallible, process::ExitCode};

use gpumem_common::{Event, EVENT_SIZE, STACK_HEADER_SIZE};
use proptest::prelude::*;

use crate::runtime::{self, Ctx, End, Flow, Output};
use gpumem_engine::{
    analysis::{leaks, view::ViewOptions},
    events,
    export::{
        leaks::LeaksReport,
        prometheus::{self, Scrape},
        report::ReportData,
        summary::Summary,
        top,
        trace::{Filter, Printer},
    },
    model::agent::AgentStatus,
    pipeline::{self, Lookups, Outcome, Pipeline, Stack},
    record::{self, ReadError},
    state::{Limits, State},
};

/// Bounded tables, as a loaded agent has them, and the report's timeline kept.
fn options() -> pipeline::Options {
    pipeline::Options { limits: Limits { max_entries: 4096, max_processes: 64 }, timeline: true, ..Default::default() }
}

/// How a replay ended, in words.
struct Replayed {
    complete: bool,
    damage: Option<String>,
}

/// Every output, fed every event and rendered at the end.
struct Everything {
    json: Printer<Vec<u8>>,
    human: Printer<Vec<u8>>,
    replayed: Option<Replayed>,
}

impl Everything {
    fn new() -> Self {
        Everything {
            json: Printer::new(Vec::new(), true, Filter::default()),
            human: Printer::new(Vec::new(), false, Filter::default()),
            replayed: None,
        }
    }
}

impl Output for Everything {
    type Input = Infallible;

    fn event(&mut self, ctx: &mut Ctx<'_>, o: &Outcome) -> anyhow::Result<Flow> {
        let frames = o.stack.map(|id| ctx.pipeline.stacks.frames(id));
        let container = ctx.pipeline.state.processes.get(&o.event.pid).and_then(|p| p.container.as_ref());
        self.json.event(o, container, frames.as_deref())?;
        self.human.event(o, container, frames.as_deref())?;
        Ok(Flow::Continue)
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> anyhow::Result<ExitCode> {
        render_all(ctx.pipeline, end);
        self.replayed = Some(Replayed { complete: end.complete, damage: end.damage.as_ref().map(|e| e.to_string()) });
        Ok(ExitCode::SUCCESS)
    }
}

/// Replays `bytes` through every output.
fn replay_all(bytes: &[u8]) -> Result<Replayed, ReadError> {
    let mut reader = record::Reader::new(bytes)?;
    let mut out = Everything::new();
    runtime::replay(&mut reader, options(), &mut out).expect("every output renders");
    Ok(out.replayed.take().expect("finished"))
}

fn render_all(p: &mut Pipeline, end: &End) {
    check_totals(&p.state);
    let view = p.view(&ViewOptions {
        exited: true,
        layouts: true,
        owners: true,
        trend: top::model::TREND_LEN,
        leak_age_ns: 0,
        now_ns: end.footer.ended_ns,
    });
    let summary = Summary::build(&p.state, &view, &end.footer, p.distributions.summary());
    summary.write_human(&mut Vec::new()).unwrap();
    summary.write_json(&mut Vec::new()).unwrap();
    let now = p.state.processes.values().map(|p| p.exited_ns).max().unwrap_or(0);
    let found = leaks::find(&p.state, &mut p.stacks, &mut p.growth, now, 0, 5);
    let report = LeaksReport {
        kind: "leaks",
        duration_s: 1.0,
        now_ns: now,
        older_than_s: 0.0,
        processes: found,
        oom: p.state.oom.clone(),
        oom_events: vec![],
        oom_events_dropped: 0,
        stacks: p.stacks.stats.clone(),
        stacks_dropped: Default::default(),
        lost_events: 0,
        distributions: p.distributions.summary(),
        held_before_tracing: view.untraced.clone(),
        exited: p.wound_down.iter().cloned().collect(),
    };
    report.write_human(&mut Vec::new()).unwrap();
    report.write_json(&mut Vec::new()).unwrap();
    let agent = AgentStatus::default();
    let text = prometheus::render(&Scrape::of(p, &view, &agent, 16)).unwrap();
    assert!(text.ends_with("# EOF\n"));
    top::build(&view, &p.host, p.state.events, 0, Default::default()).write_text(&mut Vec::new()).unwrap();
    let data = ReportData { timeline: p.timeline.take().unwrap_or_default(), footer: end.footer.clone(), ..Default::default() };
    data.html().unwrap();
}

/// The per-device totals are the sum of the allocations they count: no
/// sequence of events may make them drift, wrap or go negative.
fn check_totals(state: &State) {
    use gpumem_engine::state::process::Memory;
    for p in state.processes.values() {
        let mut sums: BTreeMap<i32, (u64, u64)> = BTreeMap::new();
        for a in p.held.allocs.values().filter(|a| a.memory() == Memory::Device) {
            let s = sums.entry(a.device()).or_default();
            s.0 = s.0.wrapping_add(a.size);
            s.1 += 1;
        }
        for (dev, t) in &p.held.devices {
            let (bytes, n) = sums.get(dev).copied().unwrap_or_default();
            // Device memory is plain allocations plus VMM physical handles.
            assert_eq!(t.live_allocs, n + t.vmm_handles, "pid {} device {dev}: {t:?}", p.pid);
            assert_eq!(t.live_bytes, bytes.wrapping_add(t.vmm_physical_bytes), "pid {} device {dev}: {t:?}", p.pid);
        }
    }
}

/// The corpus, each file with the outcome it must replay to.
const CORPUS: &[(&str, &str)] = &[
    ("trace.gpumemrec", "complete"),
    ("leaks.gpumemrec", "complete"),
    ("top.gpumemrec", "complete"),
    ("header-only.gpumemrec", "incomplete"),
    ("cut-inside-a-frame.gpumemrec", "damage: recording truncated at byte"),
    ("bit-flipped.gpumemrec", "damage: checksum mismatch"),
    ("huge-frame-length.gpumemrec", "damage: a frame claims 1073741824 bytes"),
    ("newer-version.gpumemrec", "error: recording format version 99 is newer than this gpumem reads"),
    ("not-a-recording.gpumemrec", "error: not a gpumem recording"),
    ("empty.gpumemrec", "error: not a gpumem recording"),
];

fn corpus(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn outcome(r: &Result<Replayed, ReadError>) -> String {
    match r {
        Err(e) => format!("error: {e}"),
        Ok(end) => match &end.damage {
            Some(e) => format!("damage: {e}"),
            None if end.complete => "complete".into(),
            None => "incomplete".into(),
        },
    }
}

#[test]
fn every_corpus_file_replays_to_its_known_outcome() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let on_disk = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(on_disk, CORPUS.len(), "every file in {} has an expected outcome here", dir.display());
    for (name, want) in CORPUS {
        let got = outcome(&replay_all(&corpus(name)));
        assert!(got.starts_with(want) || got.contains(want.trim_start_matches("damage: ")) && got.starts_with("damage"), "{name}: {got}");
    }
}

/// An event of a known API (or not), from a few pids and addresses so that
/// allocations, frees, contexts and exits meet each other.
fn any_event() -> impl Strategy<Value = Event> {
    let apis: Vec<u32> = (1..=62).chain([100, 101]).chain(200..=206).chain([0, 999]).collect();
    (
        proptest::sample::select(apis),
        1u32..4,
        prop_oneof![Just(0u64), 0x1000u64..0x1008, any::<u64>()],
        prop_oneof![Just(0u64), 1u64..(1 << 30), any::<u64>()],
        prop_oneof![Just(0u32), Just(2u32), any::<u32>()],
        prop_oneof![Just(-1i32), 0i32..3, any::<i32>()],
        any::<u64>(),
        any::<u64>(),
        any::<[u8; 16]>(),
    )
        .prop_map(|(api, pid, addr, size, result, device, ts_ns, handle, comm)| Event {
            pid,
            tid: pid + (ts_ns % 2) as u32,
            addr,
            size,
            result,
            device,
            ts_ns: ts_ns % 1_000_000,
            latency_ns: handle % 1000,
            handle: handle % 4,
            comm,
            ..Event::empty(api)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Ring-buffer records of any length and content, read as events and as
    /// stacks: decoded or refused as too short, never read out of bounds.
    #[test]
    fn ring_records_of_any_bytes_decode_safely(bytes in proptest::collection::vec(any::<u8>(), 0..(gpumem_common::STACK_EVENT_SIZE + 64))) {
        let mut buf = events::decode::stack_buffer();
        prop_assert_eq!(events::decode_event(&bytes).is_some(), bytes.len() >= EVENT_SIZE);
        match events::decode_stack(&bytes, &mut buf) {
            None => prop_assert!(bytes.len() < STACK_HEADER_SIZE),
            Some((tid, ts_ns)) => {
                prop_assert_eq!((tid, ts_ns), (buf.event.tid, buf.event.ts_ns));
                let held = bytes.len().min(gpumem_common::STACK_EVENT_SIZE) - STACK_HEADER_SIZE;
                prop_assert!(buf.len as usize + buf.py_frames as usize * gpumem_common::python::PY_FRAME_SIZE <= held);
                prop_assert!(buf.stack().len() == buf.len as usize && buf.python_frames().count() == buf.py_frames as usize);
            }
        }
    }

    /// Any sequence of events, however absurd, keeps the state consistent
    /// and every output renderable.
    #[test]
    fn any_event_sequence_keeps_the_state_consistent(events in proptest::collection::vec(any_event(), 0..300)) {
        let mut p = Pipeline::new(options(), Lookups::recorded());
        let mut out = Everything::new();
        let agent = AgentStatus::default();
        for ev in &events {
            let stack = if ev.handle == 1 { Stack::Recorded(ev.addr) } else { Stack::None };
            let o = p.apply(ev, stack);
            out.event(&mut Ctx { pipeline: &mut p, agent: &agent, elapsed_s: 0.0 }, &o).unwrap();
        }
        render_all(&mut p, &End::default());
    }

    /// Random bytes after a valid file header: the reader ends with a clear
    /// error or a clean end, never a panic.
    #[test]
    fn random_frames_after_a_valid_header(tail in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let mut bytes = corpus("header-only.gpumemrec");
        bytes.extend_from_slice(&tail);
        let r = replay_all(&bytes);
        prop_assert!(r.is_ok());
        if let Ok(end) = &r {
            if let Some(d) = &end.damage {
                prop_assert!(!d.to_string().is_empty());
            }
        }
    }

    /// The corpus recordings with bytes flipped, cut or inserted.
    #[test]
    fn mutated_recordings_replay_or_say_why(
        which in 0usize..3,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut bytes = corpus(["trace.gpumemrec", "leaks.gpumemrec", "top.gpumemrec"][which]);
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        if do_cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let got = outcome(&replay_all(&bytes));
        prop_assert!(got.starts_with("complete") || got.starts_with("incomplete") || got.starts_with("damage: ") || got.starts_with("error: "), "{}", got);
    }
}

#[test]
fn every_api_in_the_state_table_is_exercised_by_the_generator() {
    // The generator draws from 1..=62, 100..=101 and 200..=206: keep it in step with the ABI.
    for info in gpumem_common::APIS {
        assert!(
            (1..=62).contains(&info.id) || (100..=101).contains(&info.id) || (200..=206).contains(&info.id),
            "api {} ({})",
            info.id,
            info.symbol
        );
    }
}

/// OOM and RM figures at their extremes, as a crafted recording may carry
/// them: every output renders them (KiB that do not fit in 64 bits of
/// bytes are unknown, never wrapped).
#[test]
fn a_crafted_recording_with_extreme_oom_and_rm_fields_renders_everywhere() {
    use gpumem_common::api;
    let mut w = record::Writer::new(Vec::new()).unwrap();
    let header = record::Header {
        gpumem_version: "test".into(),
        recorded_by: "test".into(),
        command: None,
        pids: vec![],
        started_ns: 0,
        stack_sample_bytes: 0,
        host: String::new(),
        started_unix_ns: 0,
    };
    w.header(&header).unwrap();
    let max = |api_id| Event {
        pid: 7,
        tid: u32::MAX,
        addr: u64::MAX,
        size: u64::MAX,
        handle: u64::MAX,
        aux: u64::MAX,
        ts_ns: 5,
        ..Event::empty(api_id)
    };
    for id in
        [api::OOM_KILL, api::RM_ALLOC, api::RM_FREE, api::RM_CONTROL, api::RM_MAP_MEMORY, api::UVM_MAP_EXTERNAL_ALLOCATION, api::UVM_FREE]
    {
        w.event(&max(id), None).unwrap();
        w.event(&Event { result: u32::MAX, ..max(id) }, None).unwrap();
    }
    let bytes = w.finish(&record::Footer::default()).unwrap();
    assert_eq!(outcome(&replay_all(&bytes)), "complete");
}
