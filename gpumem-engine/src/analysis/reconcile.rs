//! Bytes traced by eBPF against bytes NVML reports, per process and GPU.
//! The difference, "untracked", is what gpumem does not see through the
//! driver API: context overhead, memory allocated before the agent started,
//! paths it does not probe. CUDA device ordinals are taken to be NVML
//! indices (true unless CUDA_VISIBLE_DEVICES reorders or hides GPUs).
use serde::Serialize;

use crate::{model::nvml::GpuSample, state::State};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Reconciliation {
    pub pid: u32,
    pub gpu: u32,
    #[serde(rename = "UUID")]
    pub uuid: String,
    pub nvml_bytes: u64,
    pub traced_bytes: u64,
    /// nvml_bytes − traced_bytes (negative: traced memory NVML does not count).
    pub untracked_bytes: i64,
}

/// One row per (process, GPU) that NVML reports.
pub fn reconcile(state: &State, gpus: &[GpuSample]) -> Vec<Reconciliation> {
    let mut out = Vec::new();
    for g in gpus {
        for &(pid, nvml_bytes) in g.processes.iter().flatten() {
            let traced_bytes = state
                .processes
                .get(&pid)
                .filter(|p| !p.exited)
                .and_then(|p| p.held.devices.get(&(g.index as i32)))
                .map_or(0, |t| t.live_bytes);
            out.push(Reconciliation {
                pid,
                gpu: g.index,
                uuid: g.uuid.clone(),
                nvml_bytes,
                traced_bytes,
                untracked_bytes: nvml_bytes as i64 - traced_bytes as i64,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, Event};

    use super::*;
    use crate::state::{testing::ev, Limits};

    #[test]
    fn untracked_is_nvml_minus_traced() {
        let mut s = State::new(Limits::default());
        s.apply(&Event { handle: 0xc, device: 1, ..ev(api::CU_CTX_CREATE_V2) });
        s.apply(&Event { addr: 1, size: 100, ..ev(api::CU_MEM_ALLOC_V2) });
        let gpus = vec![
            GpuSample { index: 0, processes: Some(vec![(100, 50)]), ..Default::default() },
            GpuSample { index: 1, uuid: "GPU-1".into(), processes: Some(vec![(100, 400), (7, 10)]), ..Default::default() },
        ];
        let r = reconcile(&s, &gpus);
        let rows: Vec<(u32, u32, u64, u64, i64)> =
            r.iter().map(|x| (x.pid, x.gpu, x.nvml_bytes, x.traced_bytes, x.untracked_bytes)).collect();
        assert_eq!(rows, [(100, 0, 50, 0, 50), (100, 1, 400, 100, 300), (7, 1, 10, 0, 10)]);
    }
}
