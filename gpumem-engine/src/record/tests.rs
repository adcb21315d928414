//! Round trips, and every truncation and flipped byte caught.
use gpumem_common::api;

use super::*;
use crate::{model::container::ContainerInfo, state::testing::ev};

fn sample() -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    w.header(&Header {
        gpumem_version: "0.1.0".into(),
        recorded_by: "test".into(),
        command: None,
        pids: vec![],
        started_ns: 5,
        stack_sample_bytes: 0,
        host: String::new(),
        started_unix_ns: 0,
    })
    .unwrap();
    w.lookup(&Lookup {
        pid: 100,
        container: Some(ContainerInfo { qos: Some("burstable"), ..Default::default() }),
        memcg: None,
        host: None,
    })
    .unwrap();
    for i in 0..3 {
        w.event(&Event { addr: i, size: 4096, ..ev(api::CU_MEM_ALLOC_V2) }, (i == 1).then_some(77)).unwrap();
    }
    w.tick(0.1).unwrap();
    w.host(&host_point()).unwrap();
    w.finish(&Footer { duration_s: 1.5, ..Default::default() }).unwrap()
}

fn host_point() -> HostPoint {
    let mut host = crate::model::host::HostMemory { swap_in_bytes: Some(4096), swap_out_bytes: None, ..Default::default() };
    host.processes.insert(100, crate::model::host::ProcessHost { resident_bytes: 5 << 20, swap_bytes: 8192 });
    host.cgroups
        .insert("/kubepods/pod1".into(), crate::model::host::CgroupMemory { usage_bytes: 3 << 20, limit_bytes: Some(1 << 30), pid: 100 });
    HostPoint { t_s: 0.5, host }
}

fn read_all(bytes: &[u8]) -> (Vec<Record>, Option<ReadError>) {
    let mut r = match Reader::new(bytes) {
        Ok(r) => r,
        Err(e) => return (vec![], Some(e)),
    };
    let mut out = Vec::new();
    while let Some(x) = r.next_record() {
        match x {
            Ok(rec) => out.push(rec),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

#[test]
fn round_trip() {
    let (recs, err) = read_all(&sample());
    assert!(err.is_none(), "{err:?}");
    assert_eq!(recs.len(), 8);
    assert_eq!(recs[2], Record::Event { event: Event { addr: 0, size: 4096, ..ev(api::CU_MEM_ALLOC_V2) }, stack: None });
    assert_eq!(recs[3], Record::Event { event: Event { addr: 1, size: 4096, ..ev(api::CU_MEM_ALLOC_V2) }, stack: Some(77) });
    let Record::Lookup(l) = &recs[1] else { panic!() };
    assert_eq!(l.container.as_ref().unwrap().qos, Some("burstable"));
    assert_eq!(recs[5], Record::Tick(0.1));
    assert_eq!(recs[6], Record::Host(Box::new(host_point())), "pids (map keys) survive JSON");
    assert!(matches!(&recs[7], Record::Footer(f) if f.duration_s == 1.5));
}

#[test]
fn every_truncation_keeps_what_came_before_and_says_where() {
    let full = sample();
    for cut in 12..full.len() {
        let (recs, err) = read_all(&full[..cut]);
        match err {
            Some(ReadError::Truncated { offset, events }) => {
                assert!(offset <= cut as u64);
                assert_eq!(events, recs.iter().filter(|r| matches!(r, Record::Event { .. })).count() as u64);
            }
            // A cut exactly between frames is a clean end without a footer.
            None => assert!(!recs.iter().any(|r| matches!(r, Record::Footer(_))), "cut {cut}"),
            Some(e) => panic!("cut at {cut}: {e}"),
        }
    }
}

/// A frame whose length says 64 MiB in a file that holds a few bytes after
/// it: truncated, said as such, without reserving what the length claims
/// (zeroing 64 MiB first took the fuzzer past its 5 s per input).
#[test]
fn a_frame_claiming_more_than_the_file_holds_costs_only_the_file() {
    let mut bytes = sample()[..12].to_vec();
    bytes.push(tag::EVENT);
    bytes.extend_from_slice(&(MAX_PAYLOAD - 1).to_le_bytes());
    bytes.extend_from_slice(&[0x55; 100]);
    let mut r = Reader::new(&bytes[..]).unwrap();
    let err = r.next_record().unwrap().unwrap_err();
    assert!(matches!(err, ReadError::Truncated { offset: 12, events: 0 }), "{err}");
    assert!(r.next_record().is_none());
    assert!(r.payload.capacity() < 1 << 16, "reserved {} bytes for a 100-byte tail", r.payload.capacity());
}

#[test]
fn every_flipped_byte_is_caught() {
    let full = sample();
    for i in 12..full.len() {
        let mut bad = full.clone();
        bad[i] ^= 0x40;
        let (recs, err) = read_all(&bad);
        let err = err.unwrap_or_else(|| panic!("byte {i} flipped went unnoticed: {recs:?}"));
        assert!(matches!(err, ReadError::Corrupt { .. } | ReadError::Truncated { .. }), "byte {i}: {err}");
    }
}

#[test]
fn other_versions_and_other_files_are_refused_clearly() {
    let mut newer = sample();
    newer[8] = 9;
    let (_, err) = read_all(&newer);
    let msg = err.unwrap().to_string();
    assert!(msg.contains("version 9 is newer than this gpumem reads (2)"), "{msg}");
    // Version 1 (before host frames) is read; nothing older was ever written.
    let mut v1 = sample();
    v1[8] = 1;
    assert!(read_all(&v1).1.is_none());
    let mut v0 = sample();
    v0[8] = 0;
    let msg = read_all(&v0).1.unwrap().to_string();
    assert!(msg.contains("version 0 is no longer read by this gpumem (it reads 1 and newer)"), "{msg}");
    let (_, err) = read_all(b"{\"type\":\"summary\"}");
    assert!(matches!(err, Some(ReadError::NotARecording)));
    let (_, err) = read_all(b"");
    assert!(matches!(err, Some(ReadError::NotARecording)));
}

#[test]
fn a_session_is_titled_by_its_program_node_start_and_length() {
    assert_eq!(program("GPUMEM_STEPS=60 /work/x/workload /lib/libcuda.so.1 deep_leak & b"), Some("workload"));
    assert_eq!(program("python3 train.py --lr=3"), Some("python3"));
    assert_eq!(program("A=1 B=2"), None);
    let h = Header {
        gpumem_version: "0.1.0".into(),
        recorded_by: "record".into(),
        command: Some("GPUMEM_STEPS=60 /w/train x".into()),
        pids: vec![],
        started_ns: 5,
        stack_sample_bytes: 0,
        host: "node-3\x1b[2J".into(),
        started_unix_ns: 1_796_397_611_000_000_000,
    };
    assert_eq!(session_title(Some(&h), &[], 10.04), "train on node-3?[2J, 2026-12-04 15:20:11 UTC, 10.0 s");
    let bare = Header { command: None, host: String::new(), started_unix_ns: 0, ..h };
    assert_eq!(session_title(Some(&bare), &["python3", "a"], 2.0), "python3, a, 2.0 s");
    assert_eq!(session_title(Some(&bare), &[], 2.0), "record, 2.0 s");
    assert_eq!(session_title(None, &[], 2.0), "a session, 2.0 s");
}
