//! Out-of-memory events kept for the reports that come at the end (the
//! leaks report lists them): CUDA OOMs with their holders' stacks, host
//! OOM kills. Bounded; what does not fit is counted.
use gpumem_common::Event;

use super::leaks::LeakGroup;
use crate::{events::Kind, state::Applied};

/// Records kept; later ones are counted in `dropped`.
const MAX_RECORDS: usize = 100;

#[derive(Clone, Debug)]
pub struct OomRecord {
    pub event: Event,
    pub kind: Kind,
    pub applied: Applied,
    /// For a CUDA OOM: each holder's top stacks on the device (in holder order).
    pub holder_stacks: Vec<Vec<LeakGroup>>,
}

#[derive(Clone, Debug, Default)]
pub struct OomLog {
    pub records: Vec<OomRecord>,
    pub dropped: u64,
}

impl OomLog {
    /// Keeps the event if it was an out-of-memory of either kind.
    /// Inlined for the check every event makes; an OOM is kept out of line.
    #[inline]
    pub fn observe(&mut self, event: &Event, kind: &Kind, applied: &Applied, holder_stacks: &[Vec<LeakGroup>]) {
        if applied.cuda_oom.is_some() || applied.oom_kill.is_some() {
            self.keep(event, kind, applied, holder_stacks);
        }
    }

    #[cold]
    fn keep(&mut self, event: &Event, kind: &Kind, applied: &Applied, holder_stacks: &[Vec<LeakGroup>]) {
        if self.records.len() >= MAX_RECORDS {
            self.dropped += 1;
            return;
        }
        self.records.push(OomRecord { event: *event, kind: *kind, applied: applied.clone(), holder_stacks: holder_stacks.to_vec() });
    }
}
