//! The VMM API (PyTorch's expandable segments): physical handles, not
//! reservations, counted; mappings and handles released while mapped.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;

#[test]
fn expandable_segments_count_physical_handles_not_reservations() {
    require_root();
    let t = trace_workload("expandable", &[]);
    let pid = single_pid(&t);
    let reserve = t.of_type("va_reserve");
    assert_eq!(sizes(&reserve), [1152 * MIB]);
    let creates = t.of_type("vmm_create");
    assert_eq!(sizes(&creates), [20 * MIB; 6]);
    assert_eq!(devices(&creates), [0, 0, 0, 0, 0, 1], "the last handle names device 1 in prop->location");
    assert_eq!(t.of_type("vmm_map").len(), 6);
    let unmaps = t.of_type("vmm_unmap");
    assert_eq!(unmaps.len(), 2);
    // Handle 0 was unmapped before its release: the release frees it.
    // Handle 1 was released while mapped: its unmap frees it.
    assert_eq!(released(unmaps[0]), []);
    assert_eq!(released(unmaps[1]), [(0, 20 * MIB, 1)]);
    let releases = t.of_type("vmm_release");
    assert_eq!(releases.len(), 2);
    assert_eq!(releases[0]["handle"], creates[0]["handle"]);
    assert_eq!(released(releases[0]), [(0, 20 * MIB, 1)], "unmapped handle: the release frees it");
    assert_eq!(released(releases[1]), [], "still mapped: freed at its unmap");
    assert_eq!(t.released_at_exit(pid), [(0, 60 * MIB, 3), (1, 20 * MIB, 1)]);
}

#[test]
fn vmm_reserved_mapped_and_released_but_mapped_are_reported() {
    require_root();
    let f = fixtures();
    let cmd = workload_cmd("expandable_held");
    let v = leaks(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--older-than", "0", "--duration", "2", "-c", &cmd],
        &[("GPUMEM_WORKLOAD_HOLD_MS", "4000")],
    );
    let dev0 = v["processes"].as_array().unwrap().iter().find(|p| p["device"] == 0).expect("device 0").clone();
    let l = &dev0["layout"];
    assert_eq!(l["vmm_reserved_bytes"].as_u64(), Some(1152 * MIB));
    // Handles 2..4 mapped; handle 2 released while still mapped.
    assert_eq!(l["vmm_mapped_bytes"].as_u64(), Some(60 * MIB));
    assert_eq!(l["vmm_physical_bytes"].as_u64(), Some(60 * MIB));
    assert_eq!((l["released_but_mapped_handles"].as_u64(), l["released_but_mapped_bytes"].as_u64()), (Some(1), Some(20 * MIB)));
    assert_eq!(dev0["outstanding_bytes"].as_u64(), Some(60 * MIB), "reserved address space is not memory");
}
