//! What a process had piled up when it wound down, kept after it exits: a
//! leak freed by interpreter teardown (PyTorch, array libraries, atexit
//! handlers) is gone from the live state, but not from this.
//!
//! "At exit" is precise: the wind-down is the process's last phase, from
//! its last device allocation to its exit (`sched_process_exit`); what a
//! stack group held when it began is what it still held at exit plus what
//! it freed in it. A group whose memory was at least 90 % freed there was
//! *released only at exit*; it was *still growing* if its own verdict at
//! the wind-down's start was a leak (or growth too recent to call). Its
//! peak is the most it held while tracked, or at the wind-down's start.
use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    growth::{Finding, Verdict},
    series::{GrowthTracker, Layer},
};
use crate::{
    model::container::ContainerInfo,
    stacks::{Frame, StackId, Stacks},
    state::{Memory, Process},
};

/// Groups reported per process and device, the largest at wind-down first.
pub const GROUPS_REPORTED: usize = 10;
/// Exited processes whose wind-down is kept (the most recent).
pub const PROCESSES_KEPT: usize = 64;
/// Share of a group's bytes freed in the wind-down that makes it "released only at exit".
const RELEASED_SHARE: f64 = 0.9;
/// Groups holding less than this at the wind-down's start are left out.
const MIN_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, Serialize)]
pub struct WoundDown {
    pub pid: u32,
    pub comm: String,
    pub container: Option<String>,
    pub device: Option<i32>,
    /// CLOCK_MONOTONIC time of the exit.
    pub exited_ns: u64,
    /// From the last device allocation to the exit.
    pub wind_down_s: f64,
    pub groups: Vec<WoundDownGroup>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WoundDownGroup {
    pub stack_id: Option<String>,
    pub frames: Vec<Frame>,
    pub peak_bytes: u64,
    /// Held when the wind-down began.
    pub held_at_wind_down_bytes: u64,
    /// Of those, freed by the program in its wind-down.
    pub freed_at_exit_bytes: u64,
    pub released_only_at_exit: bool,
    pub still_growing: bool,
    /// The group's own verdict when the wind-down began (where it was tracked).
    pub verdict: Option<Verdict>,
}

/// A process about to exit (its state not yet released): its groups at wind-down, per device.
pub fn wind_down(p: &Process, exit_ns: u64, stacks: &mut Stacks, growth: &mut GrowthTracker) -> Vec<WoundDown> {
    let mut held: BTreeMap<i32, BTreeMap<Option<StackId>, (u64, u64)>> = BTreeMap::new();
    for a in p.held.allocs.values().filter(|a| a.memory() == Memory::Device) {
        held.entry(a.device()).or_default().entry(a.stack()).or_default().0 += a.size;
    }
    for (&(dev, stack), &freed) in &p.wind_down.freed {
        held.entry(dev).or_default().entry(stack).or_default().1 += freed;
    }
    let since = p.wind_down.since_ns;
    let mut out = Vec::new();
    for (dev, groups) in held {
        let mut groups: Vec<WoundDownGroup> = groups
            .into_iter()
            .map(|(stack, (left, freed))| {
                let at_start = left + freed;
                let judged = growth.group_until(p.pid, dev, Layer::Driver, stack, since);
                let verdict = judged.as_ref().map(|(v, _)| v.clone());
                let still_growing =
                    verdict.as_ref().is_some_and(|v| v.leaking || (v.verdict == Finding::Insufficient && v.rate_bytes_per_s > 0.0));
                WoundDownGroup {
                    stack_id: stack.map(|i| format!("{i:016x}")),
                    frames: Vec::new(),
                    peak_bytes: judged.map_or(0, |(_, peak)| peak).max(at_start),
                    held_at_wind_down_bytes: at_start,
                    freed_at_exit_bytes: freed,
                    released_only_at_exit: freed > 0 && freed as f64 >= RELEASED_SHARE * at_start as f64,
                    still_growing,
                    verdict,
                }
            })
            .filter(|g| g.held_at_wind_down_bytes >= MIN_BYTES || g.still_growing)
            .collect();
        groups.sort_by(|a, b| b.held_at_wind_down_bytes.cmp(&a.held_at_wind_down_bytes).then(a.stack_id.cmp(&b.stack_id)));
        groups.truncate(GROUPS_REPORTED);
        for g in &mut groups {
            if let Some(id) = g.stack_id.as_deref().and_then(|s| u64::from_str_radix(s, 16).ok()) {
                g.frames = stacks.frames(id);
            }
        }
        if groups.is_empty() {
            continue;
        }
        out.push(WoundDown {
            pid: p.pid,
            comm: p.comm.clone(),
            container: p.container.as_ref().and_then(|c: &ContainerInfo| c.container.clone()),
            device: (dev != gpumem_common::DEVICE_UNKNOWN).then_some(dev),
            exited_ns: exit_ns,
            wind_down_s: if since == 0 { 0.0 } else { exit_ns.saturating_sub(since) as f64 / 1e9 },
            groups,
        });
    }
    out
}
