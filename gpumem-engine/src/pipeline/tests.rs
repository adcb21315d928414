//! The pipeline keeps what an exiting process wound down with, before the exit releases it.

use gpumem_common::{api, Event};

use super::{Lookups, Options, Pipeline, Stack};
use crate::state::testing;

const MIB: u64 = 1 << 20;

fn ev(api_id: u32, addr: u64, size: u64, t_s: f64) -> Event {
    Event { addr, size, ts_ns: 1_000_000_000 + (t_s * 1e9) as u64, ..testing::ev(api_id) }
}

#[test]
fn a_leak_freed_at_teardown_is_named_with_its_peak_and_was_still_growing() {
    let mut p = Pipeline::new(Options::default(), Lookups::recorded());
    p.apply(&Event { handle: 0xc, device: 0, ..ev(api::CU_CTX_CREATE_V2, 0, 0, 0.0) }, Stack::None);
    p.apply(&ev(api::CU_MEM_ALLOC_V2, 0x10, 256 * MIB, 0.0), Stack::Recorded(1));
    let mut leaked = Vec::new();
    let mut t = 0.0;
    // 20 s of 8 MiB/s kept (stack 2) and 4 MiB temporaries freed (stack 3).
    for i in 0..80u64 {
        t = i as f64 * 0.25;
        p.apply(&ev(api::CU_MEM_ALLOC_V2, 0x1000 + i, 2 * MIB, t), Stack::Recorded(2));
        leaked.push(0x1000 + i);
        p.apply(&ev(api::CU_MEM_ALLOC_V2, 0x9000 + i, 4 * MIB, t), Stack::Recorded(3));
        p.apply(&ev(api::CU_MEM_FREE_V2, 0x9000 + i, 0, t + 0.01), Stack::None);
        p.sample_growth(t + 0.02);
    }
    // Teardown: everything freed, then the exit.
    for a in leaked.iter().chain([&0x10]) {
        p.apply(&ev(api::CU_MEM_FREE_V2, *a, 0, t + 0.5), Stack::None);
    }
    p.apply(&ev(api::PROCESS_EXIT, 0, 0, t + 0.6), Stack::None);
    let w = p.wound_down.back().expect("the exit kept its wind-down");
    assert_eq!((w.pid, w.device), (testing::ev(0).pid, Some(0)));
    let g: Vec<(Option<&str>, u64, bool, bool)> =
        w.groups.iter().map(|g| (g.stack_id.as_deref(), g.held_at_wind_down_bytes, g.released_only_at_exit, g.still_growing)).collect();
    assert_eq!(
        g,
        [
            (Some("0000000000000001"), 256 * MIB, true, false),
            (Some("0000000000000002"), 160 * MIB, true, true),
            // The last step's temporary, freed after the last allocation: by definition in the wind-down.
            (Some("0000000000000003"), 4 * MIB, true, false),
        ],
        "{w:#?}"
    );
    assert!(w.groups[1].peak_bytes >= 158 * MIB, "{w:#?}");
    assert!(w.wind_down_s > 0.4 && w.wind_down_s < 0.7, "{w:#?}");
    assert!(p.state.processes.values().all(|p| p.held.allocs.is_empty()), "the live state is released as before");
}
