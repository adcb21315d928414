//! serve's live page: `/` on the metrics listener, a self-contained page
//! that asks the agent's read-only questions (snapshot, leaks, events, a
//! flame graph) and draws them; opened in headless Chromium against a
//! running workload. Run as root, one test at a time (`cargo xtask test`).
use std::process::Command;

use gpumem_tests::*;

/// The `hold` workload: 8 + 1 MiB on GPU 0, 2 MiB on GPU 1, 64 KiB pinned.
const GPU0_BYTES: u64 = 9 * MIB;

#[test]
fn the_live_page_shows_the_running_workload_with_exact_bytes_and_draws_its_flame_graph() {
    require_root();
    let f = fixtures();
    // The synthetic NVML reports XID 48 on GPU 1.
    let xids = target_dir().join("gpumem-fixtures/live-page-xids");
    std::fs::write(&xids, "1:48").unwrap();
    let serve = Serve::start(
        &["--libcuda", f.libcuda.to_str().unwrap(), "--nvml", f.nvml.to_str().unwrap(), "--nvml-interval", "1"],
        &[("GPUMEM_FAKE_NVML_XIDS_FILE", xids.to_str().unwrap())],
    );
    // A CUDA OOM: a process asking more than the synthetic GPU's 64 MiB.
    let mut oom = spawn_workload("oom", &[("GPUMEM_FAKE_CAPACITY", &(64 * MIB).to_string())]);
    let oom_pid = oom.id();
    oom.wait().unwrap();
    let mut child = spawn_workload("hold", &[("GPUMEM_WORKLOAD_HOLD_MS", "30000")]);
    let pid = child.id();
    poll(
        15,
        &format!("{pid} to hold {GPU0_BYTES} bytes on GPU 0"),
        || (pid_series(&serve.metrics(), "gpumem_process_memory_bytes", pid) == Some(GPU0_BYTES as f64)).then_some(()),
        || serve.metrics(),
    );

    // The page itself: HTML with everything inline, a policy that lets it fetch nothing but this listener.
    let (status, kind, page) = http_get(serve.port, "/", None).unwrap();
    assert_eq!((status, kind.as_str()), (200, "text/html; charset=utf-8"));
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<script>"), "{}", &page[..200]);
    let (ok, headers, err) =
        command_output(Command::new("curl").args(["-sS", "-D", "-", "-o", "/dev/null"]).arg(format!("http://127.0.0.1:{}/", serve.port)));
    assert!(ok, "{err}");
    let csp =
        headers.lines().find(|l| l.to_ascii_lowercase().starts_with("content-security-policy:")).unwrap_or_else(|| panic!("{headers}"));
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");

    // Its questions: the same answers as the local API's; nothing else is asked there.
    let (status, kind, snap) = http_get(serve.port, "/api/v1/snapshot", None).unwrap();
    assert_eq!((status, kind.as_str()), (200, "application/json"), "{snap}");
    let snap: serde_json::Value = serde_json::from_str(&snap).unwrap();
    let row = snap["snapshot"]["rows"].as_array().unwrap().iter().find(|r| r["pid"] == pid && r["device"] == 0).cloned();
    assert_eq!(row.unwrap_or_default()["live_bytes"], GPU0_BYTES, "{snap:#}");
    for refused in ["/api/v1/status", "/api/v1/holdings", "/api/v1/export?format=pprof", "/api/v1/nope"] {
        assert_eq!(http_get(serve.port, refused, None).unwrap().0, 404, "{refused}");
    }
    assert_eq!(http_get(serve.port, "/api/v1/leaks?pids=x", None).unwrap().0, 400);
    let (status, kind, svg) = http_get(serve.port, &format!("/api/v1/export?format=flamegraph&pid={pid}"), None).unwrap();
    assert_eq!((status, kind.as_str()), (200, "image/svg+xml"), "{svg}");
    assert!(svg.contains("main (9,437,184 bytes"), "GPU 0's 9 MiB under main: {svg}");

    // Headless Chromium runs the page's script against the agent.
    let shots = target_dir().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("live.png");
    let _ = std::fs::remove_file(&png);
    let url = format!("http://127.0.0.1:{}/", serve.port);
    let dom = chromium_url(&url, &png, 1280, 1100, Some(6000));
    assert!(dom.contains("Live: "), "the page asked and was answered: {}", &dom[..dom.len().min(3000)]);
    let row = format!("data-pid=\"{pid}\" data-device=\"0\"");
    let at = dom.find(&row).unwrap_or_else(|| panic!("no row for {pid} on GPU 0: {dom}"));
    let tr = &dom[at..at + dom[at..].find("</tr>").unwrap()];
    assert!(tr.contains(&format!("data-bytes=\"{GPU0_BYTES}\"")) && tr.contains("9.0 MiB"), "exact bytes in its row: {tr}");
    assert!(dom.contains("class=\"proc selected\""), "a process is selected: {dom}");
    assert!(dom.contains("data-gpu=\"0\"") && dom.contains("data-gpu=\"1\""), "a card per GPU: {dom}");
    let frames =
        dom.split("data-frames=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_else(|| panic!("no flame graph drawn: {dom}"));
    assert!(frames.parse::<u32>().unwrap() >= 3, "the flame graph has the process's frames: {frames}");
    assert!(dom.contains("(8388608 bytes) in 1 allocation(s)"), "its stacks are listed with their bytes: {dom}");
    // The recent OOM and XID, in their table.
    let events = &dom[dom.find("<table id=\"events\">").unwrap()..];
    assert!(events.contains("<td>CUDA out of memory</td>") && events.contains(&format!("workload ({oom_pid}) on GPU 0")), "{events}");
    assert!(events.contains("<td>XID 48</td><td>GPU 1</td>"), "{events}");
    let (colours, ink) = png_contents(&png);
    assert!(colours >= 20 && ink > 0.05, "the screenshot looks blank: {colours} colours, {:.1} % not white", ink * 100.0);

    child.kill().unwrap();
    child.wait().unwrap();
    assert!(serve.stop().0.success());

    // --no-page: /metrics alone.
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--no-page"], &[]);
    assert_eq!(http_get(serve.port, "/", None).unwrap().0, 404);
    assert_eq!(http_get(serve.port, "/api/v1/snapshot", None).unwrap().0, 404);
    assert_eq!(http_get(serve.port, "/metrics", None).unwrap().0, 200);
    assert!(serve.stop().0.success());
}
