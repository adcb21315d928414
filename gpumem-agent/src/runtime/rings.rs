//! The kernel's rings' sizes: given by flag, or chosen by the host's class
//! (its online CPUs; `gpumem_common::ring_bytes_for_cpus`).
use gpumem_engine::model::agent::RingSize;

/// The host's online CPUs, not this process's share of them: a DaemonSet's
/// CPU limit does not bound how many traced threads fill the rings at once.
pub fn online_cpus() -> u32 {
    match aya::util::online_cpus() {
        Ok(cpus) if !cpus.is_empty() => cpus.len().try_into().unwrap_or(u32::MAX),
        _ => std::thread::available_parallelism().map_or(1, |n| n.get().try_into().unwrap_or(u32::MAX)),
    }
}

/// The size given on the command line, or else the host class's (more for
/// a debug build, which drains about ten times slower).
pub fn sized(flag: Option<u32>) -> RingSize {
    RingSize::chosen(flag, online_cpus(), cfg!(debug_assertions))
}

#[cfg(test)]
mod tests {
    use gpumem_engine::model::agent::RingSizing;

    use super::*;

    #[test]
    fn a_ring_without_a_flag_is_sized_for_this_hosts_cpus() {
        let cpus = online_cpus();
        assert!(cpus >= 1);
        let auto = sized(None);
        if cfg!(debug_assertions) {
            assert_eq!(auto.sizing, RingSizing::OnlineCpusDebugBuild(cpus));
            assert_eq!(auto.bytes, gpumem_common::ring_bytes_for_cpus(cpus * gpumem_engine::model::agent::DEBUG_BUILD_ROOM));
        } else {
            assert_eq!(auto.sizing, RingSizing::OnlineCpus(cpus));
            assert_eq!(auto.bytes, gpumem_common::ring_bytes_for_cpus(cpus));
        }
        assert_eq!(sized(Some(1 << 20)), RingSize { bytes: 1 << 20, sizing: RingSizing::Flag });
    }
}
