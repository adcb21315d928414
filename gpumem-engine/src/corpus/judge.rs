//! Replaying the corpus through the pipeline and scoring its verdicts.
use std::collections::BTreeMap;

use super::{recording, shapes, Shape, PID};
use crate::{
    analysis::{
        growth::{Finding, GrowthConfig, SAMPLE_INTERVAL_S},
        series::{Layer, GROUP_SAMPLE_INTERVAL_S},
    },
    pipeline::{Lookups, Options, Pipeline, Stack},
    record::{self, Reader, Record},
    stacks::StackId,
};

/// One group's verdicts over a replay.
#[derive(Clone, Debug, Default)]
pub struct GroupRun {
    pub leaks: bool,
    /// (tick seconds, verdict, bytes outstanding) at every tick it had a verdict.
    pub verdicts: Vec<(f64, Finding, u64)>,
}

impl GroupRun {
    pub fn last(&self) -> Option<Finding> {
        self.verdicts.last().map(|v| v.1)
    }

    /// When the verdict became `leak` and stayed so to the end.
    pub fn time_to_leak(&self) -> Option<f64> {
        if self.last() != Some(Finding::Leak) {
            return None;
        }
        let from = self.verdicts.iter().rposition(|v| v.1 != Finding::Leak).map_or(0, |i| i + 1);
        self.verdicts.get(from).map(|v| v.0)
    }

    /// Seconds called `leak` at some tick, in total.
    pub fn leak_seconds(&self) -> f64 {
        self.verdicts.iter().filter(|v| v.1 == Finding::Leak).count() as f64 * SAMPLE_INTERVAL_S
    }

    /// Ticks where `leak` turned to `plateau` while the group's bytes rose
    /// over the quiet window before.
    pub fn flips_while_rising(&self) -> usize {
        let quiet = GrowthConfig::default().quiet_s;
        self.verdicts
            .windows(2)
            .filter(|w| w[0].1 == Finding::Leak && w[1].1 == Finding::Plateau)
            .filter(|w| {
                let before = self.verdicts.iter().find(|v| v.0 >= w[1].0 - quiet).map_or(0, |v| v.2);
                w[1].2 > before
            })
            .count()
    }

    /// Ticks called `plateau` less than the quiet window after the group's
    /// bytes last rose (a rise is seen at the group's next sample, up to
    /// GROUP_SAMPLE_INTERVAL_S later: plateaus before it are not counted).
    pub fn early_plateaus(&self) -> usize {
        let quiet = GrowthConfig::default().quiet_s;
        let mut last_rise = f64::NEG_INFINITY;
        let mut early = 0;
        for w in self.verdicts.windows(2) {
            if w[1].2 > w[0].2 {
                last_rise = w[1].0;
            }
            let seen = w[1].0 - last_rise >= GROUP_SAMPLE_INTERVAL_S;
            if w[1].1 == Finding::Plateau && seen && w[1].0 - last_rise < quiet {
                early += 1;
            }
        }
        early
    }
}

/// A replay's verdicts: each group's and the process's at every tick.
pub struct Judged {
    pub groups: BTreeMap<StackId, GroupRun>,
    pub process: Vec<(f64, Finding)>,
}

/// Replays `bytes` through the pipeline, taking every group's verdict at
/// every growth tick (and the process's).
pub fn judge(shape: &Shape, bytes: &[u8]) -> Result<Judged, record::ReadError> {
    let mut p = Pipeline::new(Options::default(), Lookups::recorded());
    let mut reader = Reader::new(bytes)?;
    let mut groups: BTreeMap<StackId, GroupRun> = BTreeMap::new();
    let mut process = Vec::new();
    while let Some(rec) = reader.next_record() {
        match rec? {
            Record::Header(h) => p.stacks.sample_bytes = h.stack_sample_bytes,
            Record::Stack { id, frames } => p.stacks.insert_symbolized(id, frames),
            Record::Event { event, stack } => {
                p.apply(&event, stack.map_or(Stack::None, Stack::Recorded));
            }
            Record::Tick(t) => {
                p.sample_growth(t);
                let mut ids: Vec<StackId> = p.state.processes.get(&PID).map_or(Vec::new(), stacks_held);
                // Groups freed since stay judged: their verdict is what a reader sees.
                ids.extend(groups.keys().copied());
                ids.sort();
                ids.dedup();
                for id in ids {
                    let bytes = p.state.processes.get(&PID).map_or(0, |proc| held_by(proc, id));
                    if let Some(v) = p.growth.group_verdict(PID, 0, Layer::Driver, Some(id)) {
                        let run = groups.entry(id).or_insert_with(|| GroupRun { leaks: shape.leaks.contains(&id), ..Default::default() });
                        run.verdicts.push((t, v.verdict, bytes));
                    }
                }
                if let Some(v) = p.growth.verdict(PID, 0) {
                    process.push((t, v.verdict));
                }
            }
            _ => {}
        }
    }
    Ok(Judged { groups, process })
}

fn stacks_held(p: &crate::state::Process) -> Vec<StackId> {
    let mut ids: Vec<StackId> = p.held.allocs.values().filter_map(|a| a.stack()).collect();
    ids.sort();
    ids.dedup();
    ids
}

fn held_by(p: &crate::state::Process, id: StackId) -> u64 {
    p.held.allocs.values().filter(|a| a.stack() == Some(id)).map(|a| a.size).sum()
}

/// The corpus's figures: per shape, and recall and precision of `leak` over all groups.
#[derive(Debug, Default)]
pub struct Scores {
    pub rows: Vec<Row>,
    pub true_leaks: usize,
    pub called_leaks: usize,
    pub correct_leaks: usize,
}

#[derive(Debug)]
pub struct Row {
    pub shape: &'static str,
    pub about: &'static str,
    /// The leaking groups' time to a lasting `leak` (None: not called at the end).
    pub time_to_verdict: Vec<Option<f64>>,
    /// Groups called `leak` at the end that do not leak.
    pub false_leaks: usize,
    /// Seconds non-leaking groups were called `leak` at some tick (warm-ups).
    pub false_leak_seconds: f64,
    pub flips_while_rising: usize,
    pub early_plateaus: usize,
    /// The process's verdict at the end.
    pub process: Option<Finding>,
}

impl Scores {
    /// The table the README shows: one line per shape, then recall and precision.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| shape | what it does | time to `leak` (s) | false `leak` at the end | seconds falsely `leak` on the way | leak→plateau while rising | early plateaus | process |\n|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            let ttv: Vec<String> = r.time_to_verdict.iter().map(|t| t.map_or("missed".into(), |t| format!("{t:.1}"))).collect();
            let ttv = if ttv.is_empty() { "— (no leak)".to_string() } else { ttv.join(", ") };
            t.push_str(&format!(
                "| `{}` | {} | {ttv} | {} | {:.1} | {} | {} | {} |\n",
                r.shape,
                r.about,
                r.false_leaks,
                r.false_leak_seconds,
                r.flips_while_rising,
                r.early_plateaus,
                r.process.map_or("-", Finding::name)
            ));
        }
        t.push_str(&format!(
            "\nleak groups: {} true, {} called at the end, {} rightly: recall {:.2}, precision {:.2}\n",
            self.true_leaks,
            self.called_leaks,
            self.correct_leaks,
            self.recall(),
            self.precision()
        ));
        t
    }

    pub fn recall(&self) -> f64 {
        if self.true_leaks == 0 {
            1.0
        } else {
            self.correct_leaks as f64 / self.true_leaks as f64
        }
    }

    pub fn precision(&self) -> f64 {
        if self.called_leaks == 0 {
            1.0
        } else {
            self.correct_leaks as f64 / self.called_leaks as f64
        }
    }
}

/// Generates, replays and scores every shape.
pub fn score() -> Result<Scores, record::ReadError> {
    let mut s = Scores::default();
    for shape in shapes() {
        let bytes = recording(shape).map_err(record::ReadError::Io)?;
        let j = judge(shape, &bytes)?;
        let mut row = Row {
            shape: shape.name,
            about: shape.about,
            time_to_verdict: Vec::new(),
            false_leaks: 0,
            false_leak_seconds: 0.0,
            flips_while_rising: 0,
            early_plateaus: 0,
            process: j.process.last().map(|p| p.1),
        };
        for &id in shape.leaks {
            s.true_leaks += 1;
            row.time_to_verdict.push(j.groups.get(&id).and_then(GroupRun::time_to_leak));
        }
        for run in j.groups.values() {
            let called = run.last() == Some(Finding::Leak);
            s.called_leaks += called as usize;
            s.correct_leaks += (called && run.leaks) as usize;
            row.false_leaks += (called && !run.leaks) as usize;
            if !run.leaks {
                row.false_leak_seconds += run.leak_seconds();
            }
            row.flips_while_rising += run.flips_while_rising();
            row.early_plateaus += run.early_plateaus();
        }
        s.rows.push(row);
    }
    Ok(s)
}
