//! `gpumem top`: the text snapshot against a running workload, the live view
//! driven in a real terminal (tmux), and a recording shown by `--from`.
//! Run as root, one test at a time (`cargo xtask test` does both).
use std::{process::Command, time::Duration};

use gpumem_tests::*;

/// The `hold` workload, returned once its allocations are made.
fn spawn_hold(hold_ms: u32) -> std::process::Child {
    let (child, said) = spawn_workload_watched("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", &hold_ms.to_string())]);
    said.wait_for("workload: holding", 10);
    child
}

/// The rows of a `top --once` snapshot for one pid: (GPU, live, allocations).
fn rows_for(text: &str, pid: u32) -> Vec<(String, String, String)> {
    text.lines()
        .filter(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // PID POD COMM GPU LIVE(2 words) ALLOCS ...
            (w[3].to_string(), format!("{} {}", w[4], w[5]), w[6].to_string())
        })
        .collect()
}

#[test]
fn top_once_shows_the_running_workload_per_gpu() {
    require_root();
    wait_for_detach();
    let f = fixtures();
    let mut top = Command::new(gpumem_bin())
        .args(["top", "--once", "--duration", "4", "--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = stderr_after_line(&mut top, "gpumem: tracing for");
    let mut hold = spawn_hold(10_000);
    let out = top.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    let _ = hold.kill();
    let _ = hold.wait();
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("gpumem top: 3 GPU(s), 1 process(es), 10 events, 0 lost\n"), "{text}");
    assert!(text.contains("GPU 0 Fake H200: 20.0 GiB / 144.0 GiB used, traced 9.0 MiB, 60 °C, HBM 70 °C, health 100\n"), "{text}");
    assert!(text.contains("GPU 2 Fake GPU Old: 1.0 GiB / 144.0 GiB used, traced 0 B"), "{text}");
    let rows = rows_for(&text, hold.id());
    assert_eq!(rows, [("0".into(), "9.0 MiB".into(), "2".into()), ("1".into(), "2.0 MiB".into(), "1".into())], "{text}");
    // Its host memory beside its VRAM: resident bytes (TENSORS is "-", then HOST, SWAP).
    assert!(text.contains(" HOST ") && text.contains(" SWAP "), "{text}");
    let row = text.lines().find(|l| l.split_whitespace().next() == Some(&hold.id().to_string())).unwrap();
    let w: Vec<&str> = row.split_whitespace().collect();
    assert!(w[8].parse::<f64>().is_ok_and(|v| v > 0.0) && w[9].ends_with('B'), "host resident bytes: {row}");
}

/// A tmux session running one command, read with capture-pane and driven with send-keys.
struct Tmux {
    name: String,
}

impl Tmux {
    fn start(name: &str, command: &str) -> Tmux {
        let _ = Command::new("tmux").args(["kill-session", "-t", name]).output();
        let ok = Command::new("tmux")
            .args(["new-session", "-d", "-s", name, "-x", "160", "-y", "32", command])
            .status()
            .expect("tmux (apt-get install tmux)");
        assert!(ok.success());
        Tmux { name: name.into() }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux").args(["capture-pane", "-p", "-t", &self.name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut cmd = Command::new("tmux");
        cmd.args(["send-keys", "-t", &self.name]).args(keys);
        assert!(cmd.status().unwrap().success());
    }

    /// Polls the screen until `f` accepts it.
    fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        poll(20, what, || Some(self.screen()).filter(|s| f(s)), || format!("; the screen:\n{}", self.screen()))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.name]).output();
    }
}

#[test]
fn top_in_a_real_terminal_sorts_filters_switches_gpu_shows_stacks_and_quits() {
    require_root();
    wait_for_detach();
    let f = fixtures();
    let exit_file = target_dir().join("gpumem-fixtures/top.exit");
    let _ = std::fs::remove_file(&exit_file);
    let cmd = format!(
        "{} top --interval 0.3 --libcuda {} --nvml {} 2>/dev/null; echo $? > {}",
        gpumem_bin().display(),
        f.libcuda.display(),
        f.nvml.display(),
        exit_file.display()
    );
    let tmux = Tmux::start("gpumem-top-test", &cmd);
    tmux.wait_for("the title", |s| s.contains("gpumem top · sort: live bytes"));
    let mut hold = spawn_hold(30_000);
    let pid = hold.id().to_string();
    let screen = tmux.wait_for("the workload's rows", |s| s.contains(&pid) && s.contains("9.0 MiB") && s.contains("2.0 MiB"));
    // Largest first: GPU 0's 9 MiB row above GPU 1's 2 MiB row.
    let table = &screen[screen.find("PID ").unwrap()..];
    let (i9, i2) = (table.find("9.0 MiB").unwrap(), table.find("2.0 MiB").unwrap());
    assert!(i9 < i2, "{screen}");
    // A gauge per GPU (NVML's 20 of 144 GiB used on GPU 0), the selected row's
    // memory over time and its stacks as bars by bytes.
    let screen = tmux.wait_for("the panes", |s| s.contains("largest stacks by bytes") && s.contains("8.0 MiB in 1"));
    assert!(
        screen.contains("GPU 0 Fake H200") && screen.contains(" 14% ") && screen.contains("20.0 GiB of 144.0 GiB used · traced 9.0 MiB"),
        "{screen}"
    );
    assert!(screen.contains(&format!("workload (pid {pid}) on GPU 0: live MiB, last ")), "{screen}");
    assert!(screen.contains(&format!("pid {pid} on GPU 0: largest stacks by bytes")) && screen.contains("1.0 MiB in 1"), "{screen}");
    std::fs::create_dir_all(target_dir().join("screenshots")).unwrap();
    let colored = Command::new("tmux").args(["capture-pane", "-p", "-e", "-t", "gpumem-top-test"]).output().unwrap();
    std::fs::write(target_dir().join("screenshots/top.ansi"), &colored.stdout).unwrap();
    std::fs::write(target_dir().join("screenshots/top.txt"), &screen).unwrap();
    // A picture of the terminal: the capture's colours as HTML (aha), drawn by Chromium.
    let html = Command::new("aha")
        .args(["--black", "--title", "gpumem top"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn();
    let mut aha = html.expect("aha (apt-get install aha)");
    std::io::Write::write_all(&mut aha.stdin.take().unwrap(), &colored.stdout).unwrap();
    let page = aha.wait_with_output().unwrap();
    assert!(page.status.success());
    let page_path = target_dir().join("screenshots/top.html");
    std::fs::write(&page_path, &page.stdout).unwrap();
    let png = target_dir().join("screenshots/top.png");
    chromium_screenshot(&page_path, &png, 1300, 560);
    let (colours, ink) = png_contents(&png);
    assert!(colours >= 10 && ink > 0.5, "the terminal screenshot looks blank: {colours} colours, {:.0} % ink", ink * 100.0);

    // From here on a second process allocates and frees as fast as the probes
    // let it (tens of thousands of events a second): keys must still work.
    let mut churn = spawn_workload("churn", &[("GPUMEM_BENCH_N", "300000")]);
    let before = events_in_title(&tmux.screen());
    tmux.wait_for("the churn to show", |s| events_in_title(s) > before + 20_000);
    tmux.keys(&["s"]);
    tmux.wait_for("sort by growth", |s| s.contains("sort: growth"));
    tmux.keys(&["g"]);
    let s = tmux.wait_for("GPU 0 only", |s| s.contains("GPU: 0"));
    assert!(s.contains("9.0 MiB") && !s.contains("2.0 MiB      1"), "{s}");
    tmux.keys(&["g", "g", "g"]);
    tmux.wait_for("all GPUs again", |s| s.contains("GPU: all"));
    tmux.keys(&["/", "n", "o", "p", "e", "Enter"]);
    let s = tmux.wait_for("the filter", |s| s.contains("filter: nope"));
    assert!(!s.contains(&pid), "filtered out: {s}");
    tmux.keys(&["/", "w", "o", "r", "k", "Enter"]);
    tmux.wait_for("the filter to match", |s| s.contains("filter: work") && s.contains(&pid));
    // Sorted by growth the churn may come first (its floor moves): the held workload by its pid.
    tmux.keys(&["/", &pid, "Enter"]);
    tmux.wait_for("the pid filter", |s| s.contains(&format!("filter: {pid}")));
    tmux.keys(&["p"]);
    tmux.wait_for("pause", |s| s.contains("PAUSED"));
    tmux.keys(&["p", "Enter"]);
    let s = tmux.wait_for("the stacks", |s| s.contains("largest live allocation stacks"));
    assert!(s.contains("allocation(s), oldest"), "{s}");
    // Above them, where its memory went: all of it the program's own.
    assert!(s.contains("where its memory went") && s.contains("by owner: workload "), "{s}");
    tmux.keys(&["x"]);
    tmux.wait_for("the stacks to close", |s| !s.contains("largest live allocation stacks"));
    let busy = events_in_title(&tmux.screen());
    assert!(busy > before + 20_000, "the churn kept running meanwhile: {before} → {busy} events");
    tmux.keys(&["q"]);
    poll(20, "top to quit", || exit_file.exists().then_some(()), || format!("; the screen:\n{}", tmux.screen()));
    assert_eq!(std::fs::read_to_string(&exit_file).unwrap().trim(), "0");
    for c in [&mut hold, &mut churn] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The event count in top's title line ("... · 1234 events, 0 lost, ...").
fn events_in_title(screen: &str) -> u64 {
    let title = screen.lines().next().unwrap_or_default();
    title.find(" events,").and_then(|i| title[..i].rsplit(' ').next()?.parse().ok()).unwrap_or(0)
}

#[test]
fn top_from_a_recording_shows_the_state_at_its_end() {
    require_root();
    let f = fixtures();
    let rec = target_dir().join("gpumem-fixtures/top.gpumemrec");
    // Recorded for 3 s while the workload still holds its memory.
    let cmd = format!("{} {} hold", f.workload.display(), f.libcuda.display());
    let out = run_gpumem(
        &["record", "-o", rec.to_str().unwrap(), "--duration", "3", "--libcuda", f.libcuda.to_str().unwrap(), "-c", &cmd],
        &[("GPUMEM_WORKLOAD_HOLD_MS", "6000")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_gpumem(&["top", "--once", "--from", rec.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("gpumem top: 2 GPU(s), 1 process(es), 10 events, 0 lost\n"), "{text}");
    assert!(text.contains("GPU 0: NVML n/a, traced 9.0 MiB\n"), "{text}");
    let pid: u32 = text.lines().nth(4).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(rows_for(&text, pid), [("0".into(), "9.0 MiB".into(), "2".into()), ("1".into(), "2.0 MiB".into(), "1".into())]);
}

/// `kept: N process(es) (M exited, peak P), G growth series (peak Q)` of a snapshot.
fn kept(text: &str) -> (u64, u64, u64, u64) {
    let line = text.lines().find(|l| l.starts_with("kept: ")).unwrap_or_else(|| panic!("no kept line in:\n{text}"));
    let n: Vec<u64> = line.split(|c: char| !c.is_ascii_digit()).filter(|w| !w.is_empty()).map(|w| w.parse().unwrap()).collect();
    (n[0], n[2], n[3], n[4])
}

#[test]
fn top_under_process_churn_forgets_exited_processes_everywhere() {
    require_root();
    wait_for_detach();
    let f = fixtures();
    // 300 short-lived CUDA processes, 100 at a time, each holding memory on
    // two GPUs; exited ones are forgotten 1 s after their exit.
    let mut top = Command::new(gpumem_bin())
        .args([
            "top",
            "--once",
            "--duration",
            "60",
            "--exited-grace",
            "1",
            "--milestones",
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--no-nvml",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = stderr_after_line(&mut top, "gpumem: tracing for");
    let started = std::time::Instant::now();
    for _ in 0..3 {
        let children: Vec<_> = (0..100).map(|_| spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "3000")])).collect();
        for mut c in children {
            assert!(c.wait().unwrap().success());
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20), "the churn must end well before the snapshot");
    // Every one has exited; a tick that runs once the grace (1 s) is over
    // forgets them: ticks are waited for until one began after it, then the
    // snapshot is taken (top --once reports when interrupted).
    let grace_over = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < grace_over {
        stderr.wait_after(stderr.mark(), "milestone tick", 10);
    }
    for _ in 0..2 {
        stderr.wait_after(stderr.mark(), "milestone tick", 10);
    }
    interrupt(&top);
    let out = top.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let (processes, peak_processes, growth_series, peak_growth_series) = kept(&text);
    // They were all seen, and kept while they ran ...
    assert!(peak_processes >= 100, "{text}");
    assert!(peak_growth_series >= 100, "{text}");
    // ... and every table is back to its size before the churn: empty.
    assert_eq!((processes, growth_series), (0, 0), "{text}");
    assert!(text.starts_with("gpumem top: 0 GPU(s), 0 process(es), "), "{text}");
}

#[test]
fn top_and_leaks_list_what_nvml_says_a_process_held_before_tracing_began() {
    require_root();
    wait_for_detach();
    let f = fixtures();
    // A job that allocated before top started: no call of it is traced.
    let mut hold = spawn_hold(20_000);
    let listed = format!("{}:{}", hold.id(), 123u64 << 20);
    let out = run_gpumem(
        &["top", "--once", "--duration", "2", "--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()],
        &[("GPUMEM_FAKE_NVML_PIDS", &listed)],
    );
    // leaks says the same: bytes with no stack, held since before it started.
    let v = leaks(
        &["--duration", "2", "--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap()],
        &[("GPUMEM_FAKE_NVML_PIDS", &listed)],
    );
    let _ = hold.kill();
    let _ = hold.wait();
    let held = v["held_before_tracing"].as_array().unwrap();
    let h = held.iter().find(|h| h["pid"] == hold.id()).unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!((h["gpu"].as_u64(), h["nvml_bytes"].as_u64(), h["comm"].as_str()), (Some(0), Some(123 << 20), Some("workload")), "{h}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("gpumem top: 3 GPU(s), 1 process(es)"), "never 0 processes while NVML lists one:\n{text}");
    let row = text.lines().find(|l| l.split_whitespace().next() == Some(&hold.id().to_string())).unwrap_or_else(|| panic!("{text}"));
    let w: Vec<&str> = row.split_whitespace().collect();
    // PID POD COMM GPU LIVE(2 words) ALLOCS ...
    assert_eq!((w[2], w[3], w[4], w[5], w[6]), ("workload", "0", "123.0", "MiB", "-"), "NVML's bytes, no traced allocation: {row}");
    assert!(row.contains("BEFORE TRACING (NVML)"), "{row}");
}

#[test]
fn the_live_top_over_a_running_daemon_shows_what_was_allocated_before_it_started_with_stacks() {
    require_root();
    let f = fixtures();
    let state = ServeState::new("top-daemon");
    let mut args = state.args();
    args.extend(["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml"].map(String::from));
    let mut serve = Serve::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let socket = state.socket.clone();
    serve.state = Some(state);
    // Allocated before top starts: the daemon saw it, top asks the daemon.
    let mut hold = spawn_hold(30_000);
    let pid = hold.id().to_string();
    poll(
        10,
        "the daemon to see the workload's 9 MiB",
        || (pid_series(&serve.metrics(), "gpumem_process_memory_bytes", hold.id()) == Some((9 * MIB) as f64)).then_some(()),
        || serve.metrics(),
    );
    let exit_file = target_dir().join("gpumem-fixtures/top-daemon.exit");
    let _ = std::fs::remove_file(&exit_file);
    let cmd = format!(
        "{} top --interval 0.3 --socket {} 2>/dev/null; echo $? > {}",
        gpumem_bin().display(),
        socket.display(),
        exit_file.display()
    );
    let tmux = Tmux::start("gpumem-top-daemon", &cmd);
    tmux.wait_for("the workload's rows", |s| s.contains(&pid) && s.contains("9.0 MiB") && s.contains("2.0 MiB"));
    // The bars pane, asked of the daemon for the selected row.
    tmux.wait_for("the stacks pane", |s| s.contains(&format!("pid {pid} on GPU 0: largest stacks by bytes")) && s.contains("8.0 MiB in 1"));
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("the stacks", |s| s.contains("largest live allocation stacks"));
    assert!(s.contains("workload.c"), "the stacks of what was allocated before top started: {s}");
    tmux.keys(&["x", "q"]);
    poll(20, "top to quit", || exit_file.exists().then_some(()), || format!("; the screen:\n{}", tmux.screen()));
    assert_eq!(std::fs::read_to_string(&exit_file).unwrap().trim(), "0");
    let _ = hold.kill();
    let _ = hold.wait();
    serve.stop();
}
