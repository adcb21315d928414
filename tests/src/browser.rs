//! Headless Chromium and PNG checks, for the report's screenshots.
use std::{path::Path, process::Command};

/// Headless Chromium opens `page` and saves a screenshot of `width`×`height`
/// to `png`; returns the DOM as Chromium parsed it.
pub fn chromium_screenshot(page: &Path, png: &Path, width: u32, height: u32) -> String {
    chromium_url(&format!("file://{}", page.display()), png, width, height, None)
}

/// Headless Chromium opens `url`, lets its scripts run for `run_ms` of
/// virtual time (their fetches included) when given, and saves a screenshot
/// to `png`; returns the DOM as it stands then.
pub fn chromium_url(url: &str, png: &Path, width: u32, height: u32, run_ms: Option<u32>) -> String {
    let bin = which::which("chromium").expect("chromium is not installed: `apt-get install chromium` (cargo xtask setup does)");
    let budget = run_ms.map(|ms| format!("--virtual-time-budget={ms}"));
    let mut common = vec!["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"];
    common.extend(budget.as_deref());
    let shot = Command::new(&bin)
        .args(&common)
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .output()
        .expect("running chromium");
    assert!(shot.status.success() && png.exists(), "chromium could not screenshot {url}: {}", String::from_utf8_lossy(&shot.stderr));
    let dom = Command::new(&bin)
        .args(&common)
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(url)
        .output()
        .expect("running chromium");
    let console = String::from_utf8_lossy(&dom.stderr);
    assert!(dom.status.success(), "chromium could not open {url}: {console}");
    // The page's console: a script error or a blocked load is a defect.
    let complaints: Vec<&str> = console
        .lines()
        .filter(|l| l.contains(":CONSOLE") && ["Uncaught", "Content Security Policy", "Failed to load"].iter().any(|w| l.contains(w)))
        .collect();
    assert!(complaints.is_empty(), "{url} complained in Chromium's console:\n{}", complaints.join("\n"));
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

/// (distinct colours, fraction of pixels that are not white) of a PNG.
pub fn png_contents(path: &Path) -> (usize, f64) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).expect("the screenshot")));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let mut colours = std::collections::HashSet::new();
    let mut not_white = 0usize;
    let total = pixels.len() / channels;
    for px in pixels.chunks(channels) {
        let rgb = (px[0], px[1], px[2]);
        colours.insert(rgb);
        if rgb != (255, 255, 255) {
            not_white += 1;
        }
    }
    (colours.len(), not_white as f64 / total.max(1) as f64)
}
