//! The arm64 uprobe gate applied to every site the agent probes: libcuda's
//! entry points, the loaders' hook, PyTorch's USDT sites. On arm64 each is
//! attached only where the kernel simulates its instruction (or where the
//! operator allowed out-of-line steps), and `status` says why per site.
//! The rules are the engine's (`formats::arm64_probe`).
use std::path::Path;

use gpumem_engine::formats::arm64_probe::{self, Decision, Kernel, Policy, Site};

/// The policy and the running kernel, read once.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    pub policy: Policy,
    pub kernel: Option<Kernel>,
}

impl Gate {
    pub fn running(policy: Policy) -> Gate {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        Gate { policy, kernel: Kernel::parse(&release) }
    }

    /// The decision for a site of this agent's host: None on x86_64, where
    /// every probed instruction is emulated or stepped by the kernel's
    /// long-proven path and no gate applies.
    pub fn check(&self, path: &Path, offset: u64, site: Site) -> Option<Decision> {
        cfg!(target_arch = "aarch64").then(|| self.decide(path, offset, site))
    }

    /// What `status` says of the gate on an arm64 host (None elsewhere).
    pub fn describe(&self) -> Option<String> {
        if !cfg!(target_arch = "aarch64") {
            return None;
        }
        let kernel = self.kernel.map_or("unknown".to_string(), |k| k.to_string());
        let what = match self.policy {
            Policy::Strict => "probe sites whose instruction the kernel simulates only (branches, adr/adrp, ret; nop from 6.13)",
            Policy::AllowXol => "also sites the kernel single-steps out of line (--arm64-uprobes allow-xol)",
            Policy::Off => "no uprobe at all (--arm64-uprobes off)",
        };
        Some(format!("{} on kernel {kernel}: {what}", self.policy.flag()))
    }

    /// The decision for a site of an arm64 file, on any host (`gpumem preflight`).
    pub fn decide(&self, path: &Path, offset: u64, site: Site) -> Decision {
        let Some(kernel) = self.kernel else {
            return arm64_probe::unreadable(offset, "the kernel's release could not be read".into());
        };
        match arm64_probe::words_at(path, offset) {
            Ok(words) => arm64_probe::decide(&words, offset, site, kernel, self.policy),
            Err(e) => arm64_probe::unreadable(offset, format!("its instruction could not be read: {e}")),
        }
    }
}
