//! The growth detector's labelled corpus: recordings of the shapes real
//! allocators make (frees deferred and released in batches, a cache that
//! grows in steps then holds, a CUDA-graph pool made once, checkpoint
//! spikes, warm-up then plateau, slow leaks under churn, leaks that stop or
//! are freed at teardown), each with the stack groups that truly leak.
//!
//! Every recording is generated here, deterministically, as a real
//! recording file (events, stacks, growth ticks every
//! [`SAMPLE_INTERVAL_S`](crate::analysis::growth::SAMPLE_INTERVAL_S)), and
//! [`judge`] replays it through the pipeline, reading every group's verdict
//! at every tick: recall and precision of `leak`, time to verdict, flips.
//! `cargo xtask bench-verdicts` prints the table; the engine's tests hold
//! it to its targets.
mod judge;
#[cfg(test)]
mod outputs;
mod shapes;

use std::{io, sync::Arc};

use gpumem_common::{api, Event};
pub use judge::{judge, score, GroupRun, Judged, Row, Scores};

use crate::{
    analysis::growth::SAMPLE_INTERVAL_S,
    record::{self, Footer, Header},
    stacks::{Frame, StackId},
};

/// Every shape, labelled.
pub fn shapes() -> &'static [Shape] {
    shapes::SHAPES
}

const MIB: u64 = 1 << 20;
const PID: u32 = 4242;
const COMM: [u8; 16] = *b"python3\0\0\0\0\0\0\0\0\0";

/// The stack groups of the corpus: what each allocates.
pub const WEIGHTS: StackId = 0x11;
pub const TEMPS: StackId = 0x12;
pub const LEAK: StackId = 0x13;
pub const LEAK2: StackId = 0x14;
pub const CACHE: StackId = 0x15;
pub const POOL: StackId = 0x16;
pub const CHECKPOINT: StackId = 0x17;
/// Layers' weights of a many-layer model: one group each (0x100 + layer).
const LAYER_BASE: StackId = 0x100;

/// One labelled shape.
pub struct Shape {
    pub name: &'static str,
    pub about: &'static str,
    pub seconds: f64,
    /// The groups that leak (all others do not).
    pub leaks: &'static [StackId],
    build: fn(&mut Script),
}

/// A workload's calls, in time.
#[derive(Default)]
pub struct Script {
    calls: Vec<(u64, Event, Option<StackId>)>,
    next_addr: u64,
}

impl Script {
    fn at(t: f64) -> u64 {
        1_000_000_000 + (t * 1e9) as u64
    }

    /// An allocation of `size` from `stack` at `t` seconds: its address.
    pub fn alloc(&mut self, t: f64, stack: StackId, size: u64) -> u64 {
        self.next_addr += 1;
        let addr = 0x7f00_0000_0000 + self.next_addr * 0x1_0000;
        self.calls.push((Self::at(t), Event { addr, size, ..Event::empty(api::CU_MEM_ALLOC_V2) }, Some(stack)));
        addr
    }

    pub fn free(&mut self, t: f64, addr: u64) {
        self.calls.push((Self::at(t), Event { addr, ..Event::empty(api::CU_MEM_FREE_V2) }, None));
    }

    /// Steps of `every` seconds from `from` to `to`, as times.
    fn steps(from: f64, to: f64, every: f64) -> impl Iterator<Item = f64> {
        (0..).map(move |i| from + i as f64 * every).take_while(move |&t| t < to)
    }

    /// Temporaries of `size` every `every` seconds, freed `batch` at a time
    /// (a library that defers frees): what every training step does.
    fn batched_temps(&mut self, from: f64, to: f64, every: f64, size: u64, batch: usize) {
        let mut pending = Vec::new();
        for t in Self::steps(from, to, every) {
            pending.push(self.alloc(t, TEMPS, size));
            if pending.len() == batch {
                for a in pending.drain(..) {
                    self.free(t + 0.001, a);
                }
            }
        }
    }

    /// A leak: `size` from `stack` every `every` seconds, never freed.
    fn leak(&mut self, stack: StackId, from: f64, to: f64, every: f64, size: u64) -> Vec<u64> {
        Self::steps(from, to, every).map(|t| self.alloc(t, stack, size)).collect()
    }
}

/// A frame naming the group, so reports show which it is.
fn frames(stack: StackId) -> Vec<Frame> {
    let name = match stack {
        WEIGHTS => "load_weights".to_string(),
        TEMPS => "step_temporaries".to_string(),
        LEAK => "leaky_step".to_string(),
        LEAK2 => "second_leak".to_string(),
        CACHE => "cache_grow".to_string(),
        POOL => "graph_pool".to_string(),
        CHECKPOINT => "checkpoint".to_string(),
        s => format!("layer_{}", s - LAYER_BASE),
    };
    vec![Frame {
        function: Some(name),
        offset: Some(0x10),
        file: Some("train.py".into()),
        line: Some(stack as u32),
        module: Arc::from("/usr/bin/python3"),
        module_offset: stack * 0x100,
        python: true,
    }]
}

/// The shape as a recording: its calls in time order, a growth tick every
/// sampling interval.
pub fn recording(shape: &Shape) -> io::Result<Vec<u8>> {
    let mut script = Script::default();
    (shape.build)(&mut script);
    script.calls.sort_by_key(|c| c.0);
    let mut w = record::Writer::new(Vec::new())?;
    let started_ns = Script::at(0.0) - 1_000_000;
    w.header(&Header {
        gpumem_version: env!("CARGO_PKG_VERSION").into(),
        recorded_by: format!("corpus {}", shape.name),
        command: None,
        pids: vec![PID],
        started_ns,
        stack_sample_bytes: 0,
        host: String::new(),
        started_unix_ns: 0,
    })?;
    let mut stacks: Vec<StackId> = script.calls.iter().filter_map(|c| c.2).collect();
    stacks.sort();
    stacks.dedup();
    for id in stacks {
        w.stack(id, frames(id))?;
    }
    let at = |ts: u64, e: Event| Event { pid: PID, tid: PID, comm: COMM, ts_ns: ts, latency_ns: 10_000, ..e };
    w.event(&at(started_ns, Event { handle: 0xc0, device: 0, ..Event::empty(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }), None)?;
    w.event(&at(started_ns + 1, Event { handle: 0xc0, ..Event::empty(api::CU_CTX_SET_CURRENT) }), None)?;
    let mut calls = script.calls.into_iter().peekable();
    for tick in Script::steps(SAMPLE_INTERVAL_S, shape.seconds, SAMPLE_INTERVAL_S) {
        while let Some((ts, e, stack)) = calls.next_if(|c| c.0 <= Script::at(tick)) {
            w.event(&at(ts, e), stack)?;
        }
        w.tick(tick)?;
    }
    for (ts, e, stack) in calls {
        w.event(&at(ts, e), stack)?;
    }
    let ended_ns = Script::at(shape.seconds);
    w.finish(&Footer { duration_s: (ended_ns - started_ns) as f64 / 1e9, ended_ns, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analysis::growth::Finding,
        record::{Reader, Record},
    };

    #[test]
    fn the_corpus_has_twenty_shapes_and_its_recordings_read_back() {
        let shapes = shapes();
        assert!(shapes.len() >= 20, "{}", shapes.len());
        let bytes = recording(&shapes[0]).unwrap();
        let mut r = Reader::new(bytes.as_slice()).unwrap();
        let mut ticks = 0;
        while let Some(rec) = r.next_record() {
            ticks += matches!(rec.unwrap(), Record::Tick(_)) as usize;
        }
        assert_eq!(ticks, (shapes[0].seconds / SAMPLE_INTERVAL_S) as usize - 1);
    }

    #[test]
    fn the_detector_meets_its_targets_on_the_corpus() {
        let s = score().unwrap();
        let table: Vec<String> = s.rows.iter().map(|r| format!("{r:?}")).collect();
        let table = table.join("\n");
        assert_eq!((s.recall(), s.precision()), (1.0, 1.0), "recall, precision:\n{table}");
        for r in &s.rows {
            assert_eq!((r.flips_while_rising, r.early_plateaus), (0, 0), "{r:?}");
            if r.shape == "leak_40mib_s_batched_frees_11" {
                assert!(r.time_to_verdict[0].is_some_and(|t| t <= 10.0), "{r:?}");
            }
            let process_leaks = r.process == Some(Finding::Leak);
            assert_eq!(process_leaks, !r.time_to_verdict.is_empty(), "the process's verdict derives from its groups: {r:?}");
        }
    }
}
