//! Recordings: a session replays to the same reports; damaged ones say what
//! was readable.
//! Run as root, one test at a time (`cargo xtask test` does both).
use gpumem_tests::*;
use serde_json::Value;

/// A recording made while tracing, replayed: the same answers, exactly.
#[test]
fn a_recorded_session_replays_to_the_same_leak_report_and_trace() {
    require_root();
    let f = fixtures();
    let dir = target_dir().join("gpumem-fixtures");
    let rec = dir.join("leaks.gpumemrec");
    let cmd = workload_cmd("deep_leak");
    let args = ["--older-than", "0.5", "--libcuda", f.libcuda.to_str().unwrap()];
    let mut live_args = args.to_vec();
    // Stopped while the workload still runs: memory freed by its exit is not a leak.
    live_args.extend(["--record", rec.to_str().unwrap(), "--duration", "1.5", "-c", &cmd]);
    let live = leaks(&live_args, &[("GPUMEM_STEPS", "30")]);
    assert!(live["processes"][0]["stacks"].as_array().is_some_and(|s| !s.is_empty()), "{live:#}");
    let mut replay_args = args.to_vec();
    replay_args.extend(["--from", rec.to_str().unwrap()]);
    let replayed = leaks(&replay_args, &[]);
    assert_eq!(replayed, live, "leaks --from gives the live report");

    // trace: every event line and the summary, including an OOM with its holders' stacks.
    let rec2 = dir.join("trace.gpumemrec");
    let cap = (64 * MIB).to_string();
    let live = trace(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--record", rec2.to_str().unwrap(), "-c", &workload_cmd("oom")],
        &[("GPUMEM_FAKE_CAPACITY", &cap)],
    );
    assert!(live.status.success(), "{}", live.stderr);
    assert!(live.stderr.contains("recorded 9 events"), "{}", live.stderr);
    let replayed = trace(&["--from", rec2.to_str().unwrap()], &[]);
    assert!(replayed.status.success(), "{}", replayed.stderr);
    assert_eq!(replayed.events, live.events);
    assert_eq!(replayed.summary, live.summary);
    // `replay FILE` is `trace --from FILE`.
    let out = run_gpumem(&["replay", "--json", rec2.to_str().unwrap()], &[]);
    assert!(out.status.success());
    let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last, live.summary);
}

#[test]
fn damaged_recordings_give_clear_errors_and_what_was_readable() {
    require_root();
    let f = fixtures();
    let dir = target_dir().join("gpumem-fixtures");
    let rec = dir.join("damage.gpumemrec");
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "--record", rec.to_str().unwrap(), "-c", &workload_cmd("threads")], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let full = std::fs::read(&rec).unwrap();
    let replay = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = run_gpumem(&["trace", "--json", "--from", path.to_str().unwrap()], &[]);
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // The frame that holds the file's middle byte: cuts and flips land
    // inside its payload (on its length a flip reads as a frame too large).
    let (middle, middle_len) = recording_frame_at(&full, full.len() / 2);
    let inside = middle + 5 + middle_len / 2;
    // Cut in the middle of a frame: the events before it, a summary of them, and where it broke.
    let (code, stdout, stderr) = replay("cut.gpumemrec", &full[..inside]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("truncated at byte") && stderr.contains("the report above covers the"), "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    let events = lines.len() - 1;
    assert!(events > 100 && events < t.events.len(), "{events} of {}", t.events.len());
    assert_eq!(lines[..events], t.events[..events], "what was read is what was recorded");
    // A flipped byte in the middle of that frame's payload: caught by the checksum, same treatment.
    let mut bad = full.clone();
    bad[inside] ^= 0x10;
    let (code, _, stderr) = replay("flipped.gpumemrec", &bad);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("damaged at byte") && stderr.contains("checksum mismatch"), "{stderr}");
    // A newer format, and a file that is not a recording: refused, nothing misread.
    let mut newer = full.clone();
    newer[8] = 3;
    let (code, stdout, stderr) = replay("newer.gpumemrec", &newer);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(stderr.contains("recording format version 3 is newer than this gpumem reads (2)"), "{stderr}");
    let (code, stdout, stderr) = replay("not-a-recording.gpumemrec", b"{\"type\":\"summary\"}\n");
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty());
    assert!(stderr.contains("not a gpumem recording"), "{stderr}");
}
