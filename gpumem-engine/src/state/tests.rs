//! State fed with event sequences: exact live bytes per process and device.
use gpumem_common::{api, Event};

use super::{process::DeviceTotals, testing::ev, *};

const MIB: u64 = 1 << 20;

fn alloc(addr: u64, size: u64) -> Event {
    Event { addr, size, ..ev(api::CU_MEM_ALLOC_V2) }
}

fn free(addr: u64) -> Event {
    Event { addr, ..ev(api::CU_MEM_FREE_V2) }
}

fn retain(ctx: u64, device: i32) -> Event {
    Event { handle: ctx, device, ..ev(api::CU_DEVICE_PRIMARY_CTX_RETAIN) }
}

fn set_current(ctx: u64) -> Event {
    Event { handle: ctx, ..ev(api::CU_CTX_SET_CURRENT) }
}

fn totals(s: &State, pid: u32, dev: i32) -> DeviceTotals {
    s.processes[&pid].totals(dev)
}

fn state() -> State {
    let mut s = State::new(Limits::default());
    s.apply(&retain(0xc0, 0));
    s.apply(&set_current(0xc0));
    s
}

#[test]
fn alloc_and_free_track_live_bytes() {
    let mut s = state();
    s.apply(&alloc(0x1000, 4 * MIB));
    s.apply(&alloc(0x2000, MIB));
    let a = s.apply(&free(0x1000));
    assert_eq!((a.device, a.size), (0, 4 * MIB));
    assert_eq!(totals(&s, 100, 0), DeviceTotals { live_bytes: MIB, live_allocs: 1, ..Default::default() });
    assert_eq!(s.live_entries(), 1);
}

#[test]
fn failed_calls_count_but_change_nothing() {
    let mut s = state();
    s.apply(&alloc(0x1000, MIB));
    s.apply(&Event { result: 2, ..alloc(0, 8 * MIB) });
    s.apply(&Event { result: 1, ..free(0x1000) });
    assert_eq!(totals(&s, 100, 0).live_bytes, MIB);
    let st = &s.processes[&100].apis[&api::CU_MEM_ALLOC_V2];
    assert_eq!((st.calls, st.failures), (2, 1));
    assert_eq!(st.failures_by_result.get(&2), Some(&1));
    assert_eq!(s.processes[&100].apis[&api::CU_MEM_FREE_V2].failures, 1);
}

#[test]
fn free_of_unknown_pointer_is_untracked() {
    let mut s = state();
    let a = s.apply(&free(0xdead));
    assert!(a.untracked);
    assert_eq!(s.processes[&100].untracked_frees, 1);
    assert_eq!(totals(&s, 100, 0).live_bytes, 0);
}

#[test]
fn device_follows_thread_context() {
    let mut s = state();
    s.apply(&retain(0xc1, 1));
    s.apply(&Event { tid: 101, ..set_current(0xc1) });
    s.apply(&Event { tid: 101, ..alloc(0x1000, 2 * MIB) });
    s.apply(&alloc(0x2000, 3 * MIB));
    assert_eq!(totals(&s, 100, 1).live_bytes, 2 * MIB);
    assert_eq!(totals(&s, 100, 0).live_bytes, 3 * MIB);
}

#[test]
fn context_stack_push_pop() {
    let mut s = State::new(Limits::default());
    s.apply(&Event { handle: 0xa, device: 0, ..ev(api::CU_CTX_CREATE_V2) });
    s.apply(&Event { handle: 0xb, device: 1, ..ev(api::CU_CTX_CREATE_V3) });
    s.apply(&alloc(0x1, 10));
    s.apply(&Event { handle: 0xb, ..ev(api::CU_CTX_POP_CURRENT_V2) });
    s.apply(&alloc(0x2, 20));
    s.apply(&Event { handle: 0xb, ..ev(api::CU_CTX_PUSH_CURRENT_V2) });
    s.apply(&alloc(0x3, 40));
    assert_eq!(totals(&s, 100, 1).live_bytes, 50);
    assert_eq!(totals(&s, 100, 0).live_bytes, 20);
    // Destroying ctx b frees its memory on device 1.
    let a = s.apply(&Event { handle: 0xb, ..ev(api::CU_CTX_DESTROY_V2) });
    assert_eq!(a.released, vec![Release { device: 1, bytes: 50, allocs: 2 }]);
    assert_eq!(totals(&s, 100, 1).live_bytes, 0);
    assert_eq!(totals(&s, 100, 0).live_bytes, 20);
}

#[test]
fn primary_context_release_frees_only_at_zero_refs() {
    let mut s = state();
    s.apply(&retain(0xc0, 0)); // second reference
    s.apply(&alloc(0x1, MIB));
    let a = s.apply(&Event { device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RELEASE_V2) });
    assert!(a.released.is_empty());
    let a = s.apply(&Event { device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RELEASE_V2) });
    assert_eq!(a.released, vec![Release { device: 0, bytes: MIB, allocs: 1 }]);
    // A release we cannot pair with a retain (made before the trace) frees nothing.
    s.apply(&alloc(0x2, MIB));
    let a = s.apply(&Event { device: 0, ..ev(api::CU_DEVICE_PRIMARY_CTX_RELEASE_V2) });
    assert!(a.released.is_empty());
}

#[test]
fn vmm_physical_bytes_are_handles_not_reservations() {
    let mut s = state();
    s.apply(&Event { addr: 0x100000, size: 1152 * MIB, ..ev(api::CU_MEM_ADDRESS_RESERVE) });
    for i in 0..3u64 {
        s.apply(&Event { handle: 10 + i, size: 20 * MIB, device: 0, ..ev(api::CU_MEM_CREATE) });
        s.apply(&Event { addr: 0x100000 + i * 20 * MIB, size: 20 * MIB, handle: 10 + i, ..ev(api::CU_MEM_MAP) });
    }
    let t = totals(&s, 100, 0);
    assert_eq!((t.live_bytes, t.vmm_physical_bytes, t.vmm_handles, t.reserved_bytes), (60 * MIB, 60 * MIB, 3, 1152 * MIB));
    // Released while mapped: still held until unmapped.
    let a = s.apply(&Event { handle: 10, ..ev(api::CU_MEM_RELEASE) });
    assert!(a.released.is_empty());
    assert_eq!(totals(&s, 100, 0).live_bytes, 60 * MIB);
    let a = s.apply(&Event { addr: 0x100000, size: 20 * MIB, ..ev(api::CU_MEM_UNMAP) });
    assert_eq!(a.released, vec![Release { device: 0, bytes: 20 * MIB, allocs: 1 }]);
    // Unmapped first, then released: the release frees it.
    s.apply(&Event { addr: 0x100000 + 20 * MIB, size: 20 * MIB, ..ev(api::CU_MEM_UNMAP) });
    let a = s.apply(&Event { handle: 11, ..ev(api::CU_MEM_RELEASE) });
    assert_eq!(a.released, vec![Release { device: 0, bytes: 20 * MIB, allocs: 1 }]);
    s.apply(&Event { addr: 0x100000, size: 1152 * MIB, ..ev(api::CU_MEM_ADDRESS_FREE) });
    let t = totals(&s, 100, 0);
    assert_eq!((t.live_bytes, t.vmm_handles, t.reserved_bytes), (20 * MIB, 1, 0));
}

#[test]
fn one_unmap_can_cover_several_mappings() {
    let mut s = state();
    for i in 0..4u64 {
        s.apply(&Event { handle: i + 1, size: MIB, device: 0, ..ev(api::CU_MEM_CREATE) });
        s.apply(&Event { addr: 0x1000_0000 + i * MIB, size: MIB, handle: i + 1, ..ev(api::CU_MEM_MAP) });
        s.apply(&Event { handle: i + 1, ..ev(api::CU_MEM_RELEASE) });
    }
    let a = s.apply(&Event { addr: 0x1000_0000, size: 3 * MIB, ..ev(api::CU_MEM_UNMAP) });
    assert_eq!(a.released.iter().map(|r| r.bytes).sum::<u64>(), 3 * MIB);
    assert_eq!(totals(&s, 100, 0).live_bytes, MIB);
}

#[test]
fn exit_releases_everything() {
    let mut s = state();
    s.apply(&alloc(0x1, MIB));
    s.apply(&Event { addr: 0x9, size: 4096, ..ev(api::CU_MEM_HOST_ALLOC) });
    s.apply(&Event { handle: 7, size: 2 * MIB, device: 1, ..ev(api::CU_MEM_CREATE) });
    let a = s.apply(&ev(api::PROCESS_EXIT));
    assert_eq!(a.released, vec![Release { device: 0, bytes: MIB, allocs: 1 }, Release { device: 1, bytes: 2 * MIB, allocs: 1 }]);
    let p = &s.processes[&100];
    assert!(p.exited);
    assert_eq!(p.held_at_exit_bytes, 3 * MIB);
    assert!(p.held.devices.is_empty());
    assert_eq!(p.held.pinned.bytes, 0);
    assert_eq!(s.live_entries(), 0);
}

#[test]
fn host_pinned_memory_is_not_device_memory() {
    let mut s = state();
    s.apply(&Event { addr: 0x9, size: 4096, ..ev(api::CU_MEM_ALLOC_HOST_V2) });
    assert_eq!(s.processes[&100].held.pinned.bytes, 4096);
    assert_eq!(totals(&s, 100, 0).live_bytes, 0);
    let a = s.apply(&Event { addr: 0x9, ..ev(api::CU_MEM_FREE_HOST) });
    assert_eq!(a.size, 4096);
    assert_eq!(s.processes[&100].held.pinned.bytes, 0);
}

#[test]
fn full_table_counts_what_it_drops() {
    let mut s = State::new(Limits { max_entries: 2, max_processes: 8 });
    s.apply(&retain(0xc0, 0));
    s.apply(&set_current(0xc0));
    s.apply(&alloc(0x1, 10));
    s.apply(&alloc(0x2, 10));
    let a = s.apply(&alloc(0x3, 10));
    assert!(a.dropped);
    assert_eq!(s.overflow.entries_dropped, 1);
    assert_eq!(totals(&s, 100, 0).live_allocs, 2);
    // Room again after a free.
    s.apply(&free(0x1));
    assert!(!s.apply(&alloc(0x3, 10)).dropped);
}

#[test]
fn full_process_table_evicts_exited_then_counts() {
    let mut s = State::new(Limits { max_entries: 100, max_processes: 2 });
    s.apply(&Event { pid: 1, ..ev(api::CU_INIT) });
    s.apply(&Event { pid: 2, ..ev(api::CU_INIT) });
    assert!(s.apply(&Event { pid: 3, ..ev(api::CU_INIT) }).dropped);
    assert_eq!(s.overflow.process_events_dropped, 1);
    s.apply(&Event { pid: 1, ..ev(api::PROCESS_EXIT) });
    assert!(!s.apply(&Event { pid: 3, ..ev(api::CU_INIT) }).dropped);
    assert!(!s.processes.contains_key(&1));
}

#[test]
fn pointer_reused_without_seen_free_replaces_old_allocation() {
    let mut s = state();
    s.apply(&alloc(0x1, 10));
    s.apply(&alloc(0x1, 30));
    assert_eq!(totals(&s, 100, 0), DeviceTotals { live_bytes: 30, live_allocs: 1, ..Default::default() });
}

#[test]
fn comm_comes_from_the_main_thread() {
    let mut s = State::new(Limits::default());
    s.apply(&Event { tid: 101, comm: *b"pt_worker\0\0\0\0\0\0\0", ..ev(api::CU_INIT) });
    assert_eq!(s.processes[&100].comm, "pt_worker");
    s.apply(&ev(api::CU_INIT));
    assert_eq!(s.processes[&100].comm, "python");
}

#[test]
fn cuda_oom_snapshot_and_fragmentation() {
    let mut s = state();
    s.apply(&alloc(0x1, 300 * MIB));
    s.apply(&Event { pid: 200, tid: 200, ..retain(0xd0, 0) });
    s.apply(&Event { pid: 200, tid: 200, ..set_current(0xd0) });
    s.apply(&Event { pid: 200, tid: 200, ..alloc(0x2, 500 * MIB) });
    // No cuMemGetInfo seen: not called fragmentation.
    let a = s.apply(&Event { result: 2, ..alloc(0, 64 * MIB) });
    let oom = a.cuda_oom.expect("snapshot");
    assert_eq!((oom.device, oom.requested, oom.reported_free, oom.fragmentation), (0, 64 * MIB, None, false));
    assert_eq!(oom.holders.iter().map(|h| (h.pid, h.bytes)).collect::<Vec<_>>(), [(200, 500 * MIB), (100, 300 * MIB)]);
    // The process saw 100 MiB free, then 64 MiB failed: fragmentation.
    s.apply(&Event { size: 100 * MIB, aux: 1024 * MIB, ..ev(api::CU_MEM_GET_INFO_V2) });
    assert!(s.apply(&Event { result: 2, ..alloc(0, 64 * MIB) }).cuda_oom.unwrap().fragmentation);
    assert!(!s.apply(&Event { result: 2, ..alloc(0, 128 * MIB) }).cuda_oom.unwrap().fragmentation);
    // Other failures are not OOMs.
    assert!(s.apply(&Event { result: 1, ..alloc(0, 0) }).cuda_oom.is_none());
    assert_eq!(s.oom, OomCounters { cuda_ooms: 3, fragmentation_ooms: 1, host_oom_kills: 0 });
}

#[test]
fn host_oom_kill_reports_victim_holdings_without_creating_processes() {
    let mut s = state();
    s.apply(&alloc(0x1, 7 * MIB));
    let a = s.apply(&Event { pid: 100, tid: 300, ..ev(api::OOM_KILL) });
    assert_eq!(a.oom_kill.unwrap().holdings, vec![Release { device: 0, bytes: 7 * MIB, allocs: 1 }]);
    let a = s.apply(&Event { pid: 999, tid: 999, ..ev(api::OOM_KILL) });
    assert!(a.oom_kill.unwrap().holdings.is_empty());
    assert!(!s.processes.contains_key(&999), "a non-CUDA victim is not a traced process");
    assert_eq!(s.oom.host_oom_kills, 2);
}

#[test]
fn free_seen_after_the_address_was_reused_by_another_thread() {
    let mut s = state();
    // Thread 100 allocates X at t=10.
    s.apply(&Event { ts_ns: 10, latency_ns: 1, ..alloc(0x1000, 4096) });
    // Thread 101 frees X (call from t=20 to t=40); meanwhile thread 102 gets X
    // back (call t=25..30), and 102's event is read first.
    s.apply(&Event { tid: 101, ..set_current(0xc0) });
    s.apply(&Event { tid: 102, ..set_current(0xc0) });
    s.apply(&Event { tid: 102, ts_ns: 30, latency_ns: 5, ..alloc(0x1000, 8192) });
    let a = s.apply(&Event { tid: 101, ts_ns: 40, latency_ns: 20, ..free(0x1000) });
    assert_eq!(a.size, 0, "the free belonged to the displaced allocation");
    // Thread 102's allocation is still live, exactly once.
    assert_eq!(totals(&s, 100, 0), DeviceTotals { live_bytes: 8192, live_allocs: 1, ..Default::default() });
    assert_eq!(s.processes[&100].reordered_frees, 1);
    // A later free of it is credited normally.
    let a = s.apply(&Event { tid: 102, ts_ns: 50, latency_ns: 2, ..free(0x1000) });
    assert_eq!(a.size, 8192);
    assert_eq!(totals(&s, 100, 0).live_allocs, 0);
}

#[test]
fn explicit_free_reports_the_allocation_lifetime() {
    let mut s = state();
    s.apply(&Event { ts_ns: 1_000, ..alloc(0x1000, MIB) });
    let a = s.apply(&Event { ts_ns: 5_000, latency_ns: 10, ..free(0x1000) });
    assert_eq!(a.lifetime_ns, Some(4_000));
    // An untracked free has no lifetime.
    assert_eq!(s.apply(&free(0x7777)).lifetime_ns, None);
}

#[test]
fn exited_processes_are_forgotten_after_their_grace_period() {
    let mut s = state();
    s.apply(&Event { pid: 200, tid: 200, ..alloc(0x1, MIB) });
    s.apply(&Event { ts_ns: 10, ..ev(api::PROCESS_EXIT) });
    s.apply(&Event { pid: 200, tid: 200, ts_ns: 50, ..ev(api::PROCESS_EXIT) });
    assert_eq!(s.forget_exited_before(10), Vec::<u32>::new());
    assert_eq!(s.forget_exited_before(11), vec![100]);
    assert!(s.processes.contains_key(&200));
    assert_eq!(s.forget_exited_before(51), vec![200]);
    assert!(s.processes.is_empty());
    assert_eq!(s.live_entries(), 0);
}

#[test]
fn free_seen_after_the_reusing_thread_freed_the_address_too() {
    let mut s = state();
    s.apply(&Event { tid: 101, ..set_current(0xc0) });
    s.apply(&Event { tid: 102, ..set_current(0xc0) });
    // Thread 101 allocates X; frees it (call t=20..60, its event read last).
    s.apply(&Event { tid: 101, ts_ns: 10, latency_ns: 1, ..alloc(0x1000, 4096) });
    // Meanwhile thread 102 gets X back (t=25..30) and frees it (t=35..40).
    s.apply(&Event { tid: 102, ts_ns: 30, latency_ns: 5, ..alloc(0x1000, 8192) });
    assert_eq!(s.apply(&Event { tid: 102, ts_ns: 40, latency_ns: 5, ..free(0x1000) }).size, 8192);
    let a = s.apply(&Event { tid: 101, ts_ns: 60, latency_ns: 40, ..free(0x1000) });
    assert!(!a.untracked, "the late free belongs to the displaced allocation");
    assert_eq!(a.size, 0);
    let p = &s.processes[&100];
    assert_eq!((p.untracked_frees, p.reordered_frees), (0, 1));
    assert!(p.held.displaced.is_empty());
    assert_eq!(totals(&s, 100, 0).live_allocs, 0);
    // A free of a pointer never seen is still untracked.
    assert!(s.apply(&Event { tid: 101, ts_ns: 70, ..free(0x9000) }).untracked);
}

#[test]
fn a_reused_pid_starts_a_new_process() {
    let mut s = state();
    s.apply(&Event { ts_ns: 10, ..alloc(0x1000, MIB) });
    s.apply(&Event { ts_ns: 20, ..ev(api::PROCESS_EXIT) });
    assert_eq!(s.processes[&100].held_at_exit_bytes, MIB);
    // A call that started before the exit was seen is the old process's.
    let a = s.apply(&Event { ts_ns: 25, latency_ns: 10, ..alloc(0x2000, MIB) });
    assert_eq!((a.size, s.pid_reuses, s.late_events), (0, 0, 1));
    assert!(s.processes[&100].held.allocs.is_empty(), "a dead process holds nothing");
    // One that started after it is a new process on the same pid: fresh state.
    s.apply(&Event { ts_ns: 40, latency_ns: 5, comm: *b"other\0\0\0\0\0\0\0\0\0\0\0", ..retain(0xd0, 1) });
    assert_eq!(s.pid_reuses, 1);
    let p = &s.processes[&100];
    assert!(!p.exited);
    assert_eq!((p.held_at_exit_bytes, p.comm.as_str()), (0, "other"));
    assert_eq!(p.apis.keys().copied().collect::<Vec<_>>(), [api::CU_DEVICE_PRIMARY_CTX_RETAIN]);
    assert!(p.apis[&api::CU_DEVICE_PRIMARY_CTX_RETAIN].calls == 1);
}

/// Process `pid` (tid = pid) with its primary context on `device` current.
fn state_of(s: &mut State, pid: u32, device: i32) {
    let on = |e: Event| Event { pid, tid: pid, ts_ns: 1, ..e };
    s.apply(&on(retain(0xc0 + device as u64, device)));
    s.apply(&on(set_current(0xc0 + device as u64)));
}

fn of(pid: u32, ts_ns: u64, e: Event) -> Event {
    Event { pid, tid: pid, ts_ns, ..e }
}

#[test]
fn an_ipc_import_is_its_exporters_memory_counted_once() {
    let mut s = State::new(Limits::default());
    state_of(&mut s, 100, 1);
    state_of(&mut s, 200, 0);
    s.apply(&of(100, 2, alloc(0x1000, 64 * MIB)));
    s.apply(&of(200, 2, alloc(0x9000, MIB)));
    let export = s.apply(&of(100, 3, Event { addr: 0x1000, handle: 0xabc, ..ev(api::CU_IPC_GET_MEM_HANDLE) }));
    assert_eq!((export.device, export.size, export.untracked), (1, 64 * MIB, false));
    let import = s.apply(&of(200, 4, Event { addr: 0x7000_0000, handle: 0xabc, ..ev(api::CU_IPC_OPEN_MEM_HANDLE_V2) }));
    assert_eq!((import.device, import.size, import.untracked), (1, 64 * MIB, false), "on the exporter's device");
    let t = totals(&s, 200, 1);
    assert_eq!((s.processes[&200].imports_on(1), t.live_bytes), ((64 * MIB, 1), 0), "imported, not the importer's own");
    assert_eq!(totals(&s, 200, 0).live_bytes, MIB);
    assert_eq!(totals(&s, 100, 1).live_bytes, 64 * MIB);
    let i = &s.processes[&200].held.sharing().imports[&0x7000_0000];
    assert_eq!((i.from_pid, i.via), (Some(100), Via::Ipc));
    // Every live byte on device 1 is the exporter's, once.
    assert_eq!(s.live_totals(), (2, 65 * MIB));
    let close = s.apply(&of(200, 5, Event { addr: 0x7000_0000, ..ev(api::CU_IPC_CLOSE_MEM_HANDLE) }));
    assert_eq!((close.size, close.untracked), (64 * MIB, false));
    assert_eq!(s.processes[&200].imports_on(1), (0, 0));
    assert_eq!(s.live_entries(), 2);
}

#[test]
fn an_import_of_a_freed_or_unseen_export_names_no_exporter() {
    let mut s = State::new(Limits::default());
    state_of(&mut s, 100, 0);
    state_of(&mut s, 200, 0);
    s.apply(&of(100, 2, alloc(0x1000, 8 * MIB)));
    s.apply(&of(100, 3, Event { addr: 0x1000, handle: 0xabc, ..ev(api::CU_IPC_GET_MEM_HANDLE) }));
    s.apply(&of(100, 4, free(0x1000)));
    let stale = s.apply(&of(200, 5, Event { addr: 0x7000, handle: 0xabc, ..ev(api::CU_IPC_OPEN_MEM_HANDLE_V2) }));
    assert!(stale.untracked, "the exporter freed it: not believed");
    let unseen = s.apply(&of(200, 6, Event { addr: 0x8000, handle: 0xdef, ..ev(api::CU_IPC_OPEN_MEM_HANDLE_V2) }));
    assert!(unseen.untracked);
    let p = &s.processes[&200];
    assert_eq!(p.held.sharing().imports.len(), 2);
    assert!(p.held.sharing().imports.values().all(|i| i.from_pid.is_none() && i.size == 0));
    // The exporter's exit forgets its exports.
    s.apply(&of(100, 7, alloc(0x2000, MIB)));
    s.apply(&of(100, 8, Event { addr: 0x2000, handle: 0x123, ..ev(api::CU_IPC_GET_MEM_HANDLE) }));
    s.apply(&of(100, 9, ev(api::PROCESS_EXIT)));
    assert!(s.exports.is_empty());
}

#[test]
fn a_pool_pointer_import_is_freed_by_cu_mem_free_in_the_importer() {
    let mut s = State::new(Limits::default());
    state_of(&mut s, 100, 0);
    state_of(&mut s, 200, 0);
    s.apply(&of(100, 2, Event { addr: 0x1000, size: 4 * MIB, handle: 0x77, ..ev(api::CU_MEM_ALLOC_FROM_POOL_ASYNC) }));
    s.apply(&of(100, 3, Event { addr: 0x1000, handle: 0x55, ..ev(api::CU_MEM_POOL_EXPORT_POINTER) }));
    let import = s.apply(&of(200, 4, Event { addr: 0x5000, handle: 0x55, aux: 0x88, ..ev(api::CU_MEM_POOL_IMPORT_POINTER) }));
    assert_eq!(import.size, 4 * MIB);
    assert_eq!(s.processes[&200].held.sharing().imports[&0x5000].via, Via::PoolPointer);
    let f = s.apply(&of(200, 5, free(0x5000)));
    assert!(!f.untracked, "an imported pointer, not an untracked free");
    assert_eq!((f.size, s.processes[&200].untracked_frees), (0, 0));
    assert_eq!(s.processes[&200].imports_on(0).0, 0);
}

#[test]
fn pool_allocations_are_counted_to_their_pool_on_its_device() {
    let mut s = state();
    // A pool on device 1 while device 0's context is current.
    s.apply(&Event { handle: 0x77, device: 1, ..ev(api::CU_MEM_POOL_CREATE) });
    s.apply(&Event { addr: 0x1000, size: 4 * MIB, handle: 0x77, ..ev(api::CU_MEM_ALLOC_FROM_POOL_ASYNC) });
    s.apply(&Event { addr: 0x2000, size: 2 * MIB, ..ev(api::CU_MEM_ALLOC_ASYNC) });
    s.apply(&alloc(0x3000, MIB));
    assert_eq!(totals(&s, 100, 1).live_bytes, 4 * MIB, "the pool's device");
    let p = &s.processes[&100];
    let pool = &p.held.sharing().pools[&PoolKey { pool: 0x77, device: 1 }];
    assert_eq!((pool.bytes, pool.allocs), (4 * MIB, 1));
    let default = &p.held.sharing().pools[&PoolKey { pool: 0, device: 0 }];
    assert_eq!((default.bytes, default.allocs), (2 * MIB, 1), "cuMemAllocAsync: the device's default pool");
    // cuDeviceSetMemPool sends later cuMemAllocAsync to the chosen pool.
    s.apply(&Event { handle: 0x66, device: 0, ..ev(api::CU_MEM_POOL_CREATE) });
    s.apply(&Event { handle: 0x66, device: 0, ..ev(api::CU_DEVICE_SET_MEM_POOL) });
    s.apply(&Event { addr: 0x4000, size: MIB, ..ev(api::CU_MEM_ALLOC_ASYNC) });
    assert_eq!(s.processes[&100].held.sharing().pools[&PoolKey { pool: 0x66, device: 0 }].bytes, MIB);
    s.apply(&Event { handle: 0x77, size: 0, ..ev(api::CU_MEM_POOL_TRIM_TO) });
    s.apply(&Event { addr: 0x1000, ..ev(api::CU_MEM_FREE_ASYNC) });
    s.apply(&Event { handle: 0x77, ..ev(api::CU_MEM_POOL_DESTROY) });
    let p = &s.processes[&100];
    assert!(!p.held.sharing().pools.contains_key(&PoolKey { pool: 0x77, device: 1 }), "destroyed and empty: gone");
    assert_eq!(p.held.sharing().pools[&PoolKey { pool: 0, device: 0 }].bytes, 2 * MIB);
    assert_eq!(p.held.sharing().pool_of.len(), 2);
    assert_eq!(p.held.sharing().pools.len(), 2);
}

#[test]
fn green_contexts_send_allocations_to_their_device() {
    let mut s = state();
    s.apply(&Event { handle: 0x6000, device: 1, ..ev(api::CU_GREEN_CTX_CREATE) });
    s.apply(&Event { handle: 0x6100, aux: 0x6000, ..ev(api::CU_CTX_FROM_GREEN_CTX) });
    s.apply(&set_current(0x6100));
    s.apply(&alloc(0x1000, 3 * MIB));
    assert_eq!(totals(&s, 100, 1).live_bytes, 3 * MIB);
}

#[test]
fn registered_host_memory_is_pinned_host_memory() {
    let mut s = state();
    s.apply(&Event { addr: 0x1000, size: 3 * MIB, ..ev(api::CU_MEM_HOST_REGISTER_V2) });
    assert_eq!(s.processes[&100].held.pinned.bytes, 3 * MIB);
    assert_eq!(totals(&s, 100, 0).live_bytes, 0, "host memory is not VRAM");
    s.apply(&Event { addr: 0x1000, ..ev(api::CU_MEM_HOST_UNREGISTER) });
    assert_eq!(s.processes[&100].held.pinned.bytes, 0);
}

fn create(handle: u64, size: u64, device: i32) -> Event {
    Event { handle, size, device, ..ev(api::CU_MEM_CREATE) }
}

fn map(addr: u64, size: u64, handle: u64) -> Event {
    Event { addr, size, handle, ..ev(api::CU_MEM_MAP) }
}

#[test]
fn a_fabric_handle_mapped_by_its_importer_is_the_exporters_memory() {
    let mut s = State::new(Limits::default());
    state_of(&mut s, 100, 0);
    state_of(&mut s, 200, 0);
    s.apply(&of(100, 2, create(0x1000, 32 * MIB, 0)));
    let fabric = gpumem_common::handle_type::FABRIC;
    let export = s.apply(&of(100, 3, Event { handle: 0x1000, addr: 0xfab, aux: fabric, ..ev(api::CU_MEM_EXPORT_TO_SHAREABLE_HANDLE) }));
    assert_eq!(export.size, 32 * MIB);
    let import = s.apply(&of(200, 4, Event { handle: 0x2000, addr: 0xfab, aux: fabric, ..ev(api::CU_MEM_IMPORT_FROM_SHAREABLE_HANDLE) }));
    assert_eq!(import.exporter, Some(100));
    let mapped = s.apply(&of(200, 5, map(0x7000_0000, 32 * MIB, 0x2000)));
    assert!(!mapped.untracked, "an imported handle is no longer mapped without a create");
    assert_eq!(mapped.exporter, Some(100));
    let t = totals(&s, 200, 0);
    assert_eq!((s.processes[&200].imports_on(0).0, t.live_bytes), (32 * MIB, 0));
    s.apply(&of(200, 6, Event { addr: 0x7000_0000, size: 32 * MIB, ..ev(api::CU_MEM_UNMAP) }));
    assert_eq!(s.processes[&200].imports_on(0).0, 0);
    let release = s.apply(&of(200, 7, Event { handle: 0x2000, ..ev(api::CU_MEM_RELEASE) }));
    assert!(!release.untracked);
    assert!(s.processes[&200].held.sharing().imported_handles.is_empty());
    // A file descriptor joins nothing: the mapping is still an import, its exporter unnamed.
    let fd = gpumem_common::handle_type::POSIX_FILE_DESCRIPTOR;
    s.apply(&of(200, 8, Event { handle: 0x3000, addr: 0, aux: fd, ..ev(api::CU_MEM_IMPORT_FROM_SHAREABLE_HANDLE) }));
    s.apply(&of(200, 9, map(0x8000_0000, 4 * MIB, 0x3000)));
    assert_eq!(s.processes[&200].imports_on(0).0, 4 * MIB);
    assert_eq!(s.processes[&200].held.sharing().imports[&0x8000_0000].from_pid, None);
}

#[test]
fn a_retained_handle_needs_one_more_release() {
    let mut s = state();
    s.apply(&create(0x1000, 8 * MIB, 0));
    s.apply(&Event { handle: 0x1000, addr: 0x5000, ..ev(api::CU_MEM_RETAIN_ALLOCATION_HANDLE) });
    let first = s.apply(&Event { handle: 0x1000, ..ev(api::CU_MEM_RELEASE) });
    assert_eq!((first.released.len(), totals(&s, 100, 0).live_bytes), (0, 8 * MIB), "the retain's release");
    let second = s.apply(&Event { handle: 0x1000, ..ev(api::CU_MEM_RELEASE) });
    assert_eq!(second.released, [Release { device: 0, bytes: 8 * MIB, allocs: 1 }]);
}

#[test]
fn multicast_objects_hold_no_memory_of_their_own() {
    let mut s = state();
    s.apply(&Event { handle: 0x9000, size: 64 * MIB, aux: 2, ..ev(api::CU_MULTICAST_CREATE) });
    s.apply(&Event { handle: 0x9000, device: 0, ..ev(api::CU_MULTICAST_ADD_DEVICE) });
    s.apply(&create(0x1000, 64 * MIB, 0));
    let bind = s.apply(&Event { handle: 0x9000, addr: 0x1000, size: 64 * MIB, aux: 0, ..ev(api::CU_MULTICAST_BIND_MEM) });
    assert_eq!(bind.device, 0);
    let m = s.apply(&map(0x7000_0000, 64 * MIB, 0x9000));
    assert!(!m.untracked, "a multicast object is mapped without a create, and known");
    assert_eq!(totals(&s, 100, 0).live_bytes, 64 * MIB, "the bound handle only");
    let mc = &s.processes[&100].held.sharing().multicast[&0x9000];
    assert_eq!((mc.added.as_slice(), mc.bound.as_slice()), (&[0][..], &[(0, 0, 64 * MIB)][..]));
    s.apply(&Event { handle: 0x9000, device: 0, aux: 0, size: 64 * MIB, ..ev(api::CU_MULTICAST_UNBIND) });
    assert!(s.processes[&100].held.sharing().multicast[&0x9000].bound.is_empty());
    let r = s.apply(&Event { handle: 0x9000, ..ev(api::CU_MEM_RELEASE) });
    assert!(!r.untracked && s.processes[&100].held.sharing().multicast.is_empty());
}

#[test]
fn graph_allocation_nodes_declare_the_graph_pool_not_live_bytes() {
    let mut s = state();
    s.apply(&Event { addr: 0x1000, size: 16 * MIB, handle: 0x77, device: 1, ..ev(api::CU_GRAPH_ADD_MEM_ALLOC_NODE) });
    s.apply(&Event { addr: 0x2000, size: 4 * MIB, handle: 0x77, device: 1, ..ev(api::CU_GRAPH_ADD_MEM_ALLOC_NODE) });
    s.apply(&Event { addr: 0x3000, size: MIB, handle: 0x88, device: 1, ..ev(api::CU_GRAPH_ADD_MEM_ALLOC_NODE) });
    assert_eq!(totals(&s, 100, 1).live_bytes, 0);
    let f = s.apply(&Event { addr: 0x2000, handle: 0x77, ..ev(api::CU_GRAPH_ADD_MEM_FREE_NODE) });
    assert_eq!((f.device, f.size), (1, 4 * MIB));
    let d = s.apply(&Event { handle: 0x77, ..ev(api::CU_GRAPH_DESTROY) });
    assert_eq!(d.size, 16 * MIB);
    let p = &s.processes[&100];
    assert_eq!(p.held.sharing().graph_nodes.len(), 1);
    assert_eq!(p.held.sharing().graph_nodes[&0x3000], process::GraphNode { graph: 0x88, size: MIB, device: 1 });
}

#[test]
fn a_checkpointed_process_keeps_its_memory_suspended() {
    let mut s = state();
    s.apply(&alloc(0x1000, 12 * MIB));
    let tool = |api_id: u32, ts: u64| Event { addr: 100, ..of(300, ts, ev(api_id)) };
    s.apply(&tool(api::CU_CHECKPOINT_PROCESS_LOCK, 2));
    let c = s.apply(&tool(api::CU_CHECKPOINT_PROCESS_CHECKPOINT, 3));
    assert_eq!(c.size, 12 * MIB);
    let p = &s.processes[&100];
    assert_eq!(p.suspension, Some((Suspension::Checkpointed, 300, 3)));
    assert_eq!(totals(&s, 100, 0).live_bytes, 12 * MIB, "not freed");
    assert_eq!(s.processes[&300].apis[&api::CU_CHECKPOINT_PROCESS_CHECKPOINT].calls, 1, "counted for the tool");
    s.apply(&tool(api::CU_CHECKPOINT_PROCESS_RESTORE, 4));
    s.apply(&tool(api::CU_CHECKPOINT_PROCESS_UNLOCK, 5));
    assert_eq!(s.processes[&100].suspension, None);
}
