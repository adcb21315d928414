//! Where a process's CUDA device is on the host. A process names devices by
//! ordinal; CUDA_VISIBLE_DEVICES renumbers and hides them, and in a MIG
//! process a device is a MIG instance. The process's own cuDeviceGetUuid_v2
//! says which: its UUID is an NVML GPU's (`GPU-…`) or a MIG device's
//! (`MIG-…`). Without it the ordinal is taken to be the NVML index.
use crate::{
    model::nvml::{GpuSample, MigInstance},
    state::Process,
};

/// A MIG instance a device is, as dcgm-exporter labels it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MigPlace {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub profile: String,
    pub uuid: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The NVML index of the GPU (None: the device is unknown).
    pub gpu: Option<u32>,
    /// Boxed: most devices are whole GPUs, and every view row has one.
    pub mig: Option<Box<MigPlace>>,
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of 16 bytes, as NVML writes UUIDs.
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("{}-{}-{}-{}-{}", h(0..4), h(4..6), h(6..8), h(8..10), h(10..16))
}

fn mig_place(m: &MigInstance) -> MigPlace {
    MigPlace {
        gpu_instance_id: m.gpu_instance_id,
        compute_instance_id: m.compute_instance_id,
        profile: m.profile.clone(),
        uuid: m.uuid.clone(),
    }
}

/// Where `p`'s device `device` is, by what NVML read last.
pub fn place(p: &Process, device: i32, gpus: &[GpuSample]) -> Placement {
    if let Some(bytes) = p.device_uuids.get(&device) {
        let uuid = uuid_string(bytes);
        let is = |prefix: &str, s: &str| {
            s.len() == prefix.len() + uuid.len()
                && s[..prefix.len()].eq_ignore_ascii_case(prefix)
                && s[prefix.len()..].eq_ignore_ascii_case(&uuid)
        };
        for g in gpus {
            if is("GPU-", &g.uuid) {
                return Placement { gpu: Some(g.index), mig: None };
            }
            if let Some(m) = g.mig.iter().find(|m| is("MIG-", &m.uuid)) {
                return Placement { gpu: Some(g.index), mig: Some(Box::new(mig_place(m))) };
            }
        }
    }
    Placement { gpu: u32::try_from(device).ok(), mig: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mig_process_device_is_its_instance_and_a_renumbered_one_its_gpu() {
        let mig = MigInstance {
            gpu_instance_id: 2,
            uuid: "MIG-00000000-0000-0000-0000-000000000012".into(),
            profile: "1g.18gb".into(),
            ..Default::default()
        };
        let gpus = vec![
            GpuSample { index: 0, uuid: "GPU-00000000-0000-0000-0000-000000000000".into(), mig: vec![mig], ..Default::default() },
            GpuSample { index: 1, uuid: "GPU-00000000-0000-0000-0000-000000000001".into(), ..Default::default() },
        ];
        let mut p = Process::new(1);
        let mut b = [0u8; 16];
        b[15] = 0x12;
        p.device_uuids.insert(0, b);
        let at = place(&p, 0, &gpus);
        assert_eq!((at.gpu, at.mig.as_ref().map(|m| (m.gpu_instance_id, m.profile.as_str()))), (Some(0), Some((2, "1g.18gb"))));
        b[15] = 1;
        p.device_uuids.insert(0, b);
        assert_eq!(place(&p, 0, &gpus), Placement { gpu: Some(1), mig: None }, "CUDA_VISIBLE_DEVICES=1: ordinal 0 is GPU 1");
        assert_eq!(place(&p, 3, &gpus), Placement { gpu: Some(3), mig: None }, "no UUID: the ordinal");
        assert_eq!(place(&p, -1, &gpus).gpu, None);
    }
}
