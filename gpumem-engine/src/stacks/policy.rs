//! Which allocation stacks the kernel copies: every one while a process stays
//! under its stack budget, byte-weighted samples beyond it (see
//! `gpumem_common::sampling`), and how an allocation is weighed so that
//! per-stack figures stay unbiased. Accounting is never sampled.
use gpumem_common::{flags, sampling};
use serde::{Deserialize, Serialize};

/// Stacks per second a process may have copied in full, by default.
pub const DEFAULT_BUDGET_PER_S: u32 = 2000;
/// Mean bytes between sampled stacks beyond the budget, by default (Go's
/// MemProfileRate).
pub const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;
/// Full stacks a process's budget holds at most, by default: what a new
/// (or long-idle) process that allocates in a hot loop gets at once before
/// the budget's rate applies. An eighth of a second's worth: a process
/// starting a burst of 20 000 allocations pays full stacks for 256 of them
/// plus the rate's refill, not a whole second's 2 000; sampling by bytes
/// keeps its per-stack figures unbiased beyond that.
pub const DEFAULT_BURST: u32 = 256;
/// Largest budget (and burst): keeps the kernel's token arithmetic in 64 bits.
pub const MAX_BUDGET_PER_S: u32 = 1_000_000;

/// What the kernel is told about stacks at load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackPolicy {
    /// Copy stacks at all (`--stacks`).
    pub capture: bool,
    /// Size of the stack ring.
    pub ring_bytes: u32,
    /// How that size was chosen.
    #[serde(default)]
    pub ring_sizing: crate::model::agent::RingSizing,
    /// Stacks per second per process copied in full; 0: no budget.
    pub budget_per_s: u32,
    /// Mean bytes between samples beyond the budget.
    pub sample_bytes: u64,
    /// Stacks the budget holds at most and starts with (0: one second's worth).
    #[serde(default = "default_burst")]
    pub burst: u32,
}

fn default_burst() -> u32 {
    DEFAULT_BURST
}

impl StackPolicy {
    /// The stack ring's size as the kernel makes it: a page where no stack
    /// is captured.
    pub fn kernel_ring_bytes(&self) -> u32 {
        if self.capture {
            self.ring_bytes
        } else {
            4096
        }
    }
}

impl Default for StackPolicy {
    fn default() -> Self {
        StackPolicy {
            capture: true,
            ring_bytes: gpumem_common::STACK_RING_BYTES,
            ring_sizing: crate::model::agent::RingSizing::Flag,
            budget_per_s: DEFAULT_BUDGET_PER_S,
            sample_bytes: DEFAULT_SAMPLE_BYTES,
            burst: DEFAULT_BURST,
        }
    }
}

impl StackPolicy {
    /// The rate sampled stacks are weighed with; 0 when nothing is sampled.
    pub fn effective_sample_bytes(&self) -> u64 {
        if self.capture && self.budget_per_s > 0 {
            self.sample_bytes
        } else {
            0
        }
    }
}

/// Stack bytes kept beyond the deepest read an unwind made: room for a
/// slightly deeper call path without a truncated stack.
const COPY_MARGIN: usize = 1024;

/// How much stack each process's unwinds need, learned from them: the
/// kernel then copies that much rather than all of STACK_BYTES. Only grows:
/// an unwind that ran off the end of a shorter copy asks for all of it.
#[derive(Default)]
pub struct CopyLengths {
    need: std::collections::HashMap<u32, u32>,
    /// (pid, bytes) not yet told to the kernel.
    pub updates: Vec<(u32, u32)>,
}

impl CopyLengths {
    /// Learns from one unwind of `copied` bytes of a process's stack.
    pub fn learn(&mut self, pid: u32, copied: usize, u: &super::unwind::Unwound) {
        use gpumem_common::{STACK_BYTES, STACK_CHUNK};
        let need = if u.ran_out && copied < STACK_BYTES {
            STACK_BYTES
        } else {
            (u.reach + COPY_MARGIN).div_ceil(STACK_CHUNK).saturating_mul(STACK_CHUNK).min(STACK_BYTES)
        } as u32;
        let known = self.need.entry(pid).or_insert(0);
        if need > *known {
            *known = need;
            self.updates.push((pid, need));
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.need.remove(&pid);
    }
}

/// How an allocation's stack was taken, from its event's flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Sampling {
    /// Under the budget: taken (or tried) for every allocation.
    #[default]
    Every,
    /// Taken by sampling: stands for 1/p allocations like it.
    Sampled,
    /// Not sampled: the sampled stacks' estimates stand for it.
    NotSampled,
}

impl Sampling {
    pub fn of(event_flags: u32) -> Self {
        if event_flags & flags::STACK_SAMPLED != 0 {
            Sampling::Sampled
        } else if event_flags & flags::STACK_NOT_SAMPLED != 0 {
            Sampling::NotSampled
        } else {
            Sampling::Every
        }
    }
}

/// How many allocations one of `size` bytes stands for at sampling rate
/// `sample_bytes`: the inverse of the probability the kernel sampled it with.
pub fn weight(sampling: Sampling, size: u64, sample_bytes: u64) -> f64 {
    match sampling {
        Sampling::Sampled => sampling::P_ONE as f64 / sampling::probability(size, sample_bytes) as f64,
        Sampling::Every => 1.0,
        Sampling::NotSampled => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimator is unbiased: simulated with the kernel's own coin
    /// (probability from the same function), a stack's estimated bytes
    /// come out at its true bytes.
    #[test]
    fn weighted_samples_estimate_the_true_bytes() {
        let rate = DEFAULT_SAMPLE_BYTES;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand24 = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as u32 & (sampling::P_ONE - 1)
        };
        for size in [512u64, 16 * 1024, 300 * 1024, 4 << 20] {
            let n = 2_000_000u64;
            let mut estimate = 0.0;
            for _ in 0..n {
                if rand24() < sampling::probability(size, rate) {
                    estimate += size as f64 * weight(Sampling::Sampled, size, rate);
                }
            }
            let truth = (n * size) as f64;
            assert!((estimate - truth).abs() / truth < 0.04, "size {size}: estimate {estimate} vs {truth}");
        }
        assert_eq!(weight(Sampling::Every, 10, rate), 1.0);
        assert_eq!(weight(Sampling::NotSampled, 10, rate), 0.0);
    }

    #[test]
    fn sampling_is_read_from_the_event_flags() {
        assert_eq!(Sampling::of(flags::HAS_STACK), Sampling::Every);
        assert_eq!(Sampling::of(flags::HAS_STACK | flags::STACK_SAMPLED), Sampling::Sampled);
        assert_eq!(Sampling::of(flags::STACK_NOT_SAMPLED), Sampling::NotSampled);
    }
}
