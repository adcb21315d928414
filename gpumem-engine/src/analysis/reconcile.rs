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
    /// An MPS server (NVML names it for its clients' memory): the traced
    /// processes on this GPU NVML does not list, whose bytes `traced_bytes` sums.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_clients: Vec<u32>,
    /// The MIG instance (GPU_I_ID) NVML lists it on; `UUID` is then the instance's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
}

/// The comm of `nvidia-cuda-mps-server` (the kernel keeps 15 bytes of it).
pub const MPS_SERVER_COMM: &str = "nvidia-cuda-mps";

/// Under MPS, NVML may list only the server, for all its clients' memory,
/// while each client is traced as itself (its uprobes run in it). A row of
/// an untraced process named like the server is reconciled against the
/// traced processes on its GPU that NVML does not list, instead of calling
/// the server untraced and its clients "not in NVML".
pub fn account_mps(rows: &mut [Reconciliation], state: &State, gpus: &[GpuSample], comm_of: impl Fn(u32) -> Option<String>) {
    let listed: Vec<(u32, u32)> = rows.iter().map(|r| (r.gpu, r.pid)).collect();
    for r in rows.iter_mut() {
        let traced = state.processes.get(&r.pid).is_some_and(|p| !p.exited);
        if traced || comm_of(r.pid).as_deref() != Some(MPS_SERVER_COMM) {
            continue;
        }
        let clients: Vec<(u32, u64)> = state
            .processes
            .values()
            .filter(|p| !p.exited && !listed.contains(&(r.gpu, p.pid)))
            .filter_map(|p| Some((p.pid, Some(traced_on(p, gpus, r.gpu, r.gpu_instance_id)).filter(|&b| b > 0)?)))
            .collect();
        r.traced_bytes = clients.iter().map(|c| c.1).sum();
        r.untracked_bytes = r.nvml_bytes as i64 - r.traced_bytes as i64;
        r.mps_clients = clients.into_iter().map(|c| c.0).collect();
    }
}

/// The live bytes `p` holds on NVML's GPU `gpu` (in its MIG instance
/// `instance`, or on the whole GPU), its devices placed by its own device
/// UUIDs (placement.rs).
fn traced_on(p: &crate::state::Process, gpus: &[GpuSample], gpu: u32, instance: Option<u32>) -> u64 {
    let on = |d: i32| {
        let at = super::placement::place(p, d, gpus);
        at.gpu == Some(gpu) && at.mig.map(|m| m.gpu_instance_id) == instance
    };
    p.held.devices.iter().filter(|(&d, _)| on(d)).map(|(_, t)| t.live_bytes).sum()
}

/// One row per (process, GPU or MIG instance) that NVML reports.
pub fn reconcile(state: &State, gpus: &[GpuSample]) -> Vec<Reconciliation> {
    let row = |pid: u32, gpu: u32, uuid: &str, nvml_bytes: u64, instance: Option<u32>| {
        let traced_bytes = state.processes.get(&pid).filter(|p| !p.exited).map_or(0, |p| traced_on(p, gpus, gpu, instance));
        Reconciliation {
            pid,
            gpu,
            uuid: uuid.to_string(),
            nvml_bytes,
            traced_bytes,
            untracked_bytes: nvml_bytes as i64 - traced_bytes as i64,
            mps_clients: Vec::new(),
            gpu_instance_id: instance,
        }
    };
    let mut out = Vec::new();
    for g in gpus {
        out.extend(g.processes.iter().flatten().map(|&(pid, bytes)| row(pid, g.index, &g.uuid, bytes, None)));
        for m in &g.mig {
            out.extend(m.processes.iter().flatten().map(|&(pid, bytes)| row(pid, g.index, &m.uuid, bytes, Some(m.gpu_instance_id))));
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

    #[test]
    fn an_mps_server_is_reconciled_against_its_clients() {
        let mut s = State::new(Limits::default());
        for (pid, bytes) in [(100, 100), (101, 50)] {
            s.apply(&Event { pid, tid: pid, handle: 0xc, device: 0, ..ev(api::CU_CTX_CREATE_V2) });
            s.apply(&Event { pid, tid: pid, addr: 1, size: bytes, ..ev(api::CU_MEM_ALLOC_V2) });
        }
        // NVML lists the server (pid 7) for 400 B and an unrelated untraced process.
        let gpus = vec![GpuSample { index: 0, processes: Some(vec![(7, 400), (8, 30)]), ..Default::default() }];
        let mut r = reconcile(&s, &gpus);
        account_mps(&mut r, &s, &gpus, |pid| (pid == 7).then(|| MPS_SERVER_COMM.to_string()));
        let rows: Vec<(u32, u64, i64, Vec<u32>)> =
            r.iter().map(|x| (x.pid, x.traced_bytes, x.untracked_bytes, x.mps_clients.clone())).collect();
        assert_eq!(rows, [(7, 150, 250, vec![100, 101]), (8, 0, 30, vec![])]);
    }
}
