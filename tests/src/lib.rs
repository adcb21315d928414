//! Harness for gpumem's end-to-end tests: builds the C fixtures (synthetic
//! libcuda.so.1 and workload programs), runs the real `gpumem` binary as root
//! against real processes, and parses its JSON output.
//!
//! Nothing here skips: a test that cannot do its job (not root, binary not
//! built, real NVIDIA library not fetched) fails with the reason.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use serde_json::Value;

pub mod soak;

pub const MIB: u64 = 1024 * 1024;
pub const KIB: u64 = 1024;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The cargo target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target"))
}

/// The gpumem binary under test: $GPUMEM_BIN, or target/debug/gpumem.
pub fn gpumem_bin() -> PathBuf {
    let bin = std::env::var_os("GPUMEM_BIN").map(PathBuf::from).unwrap_or_else(|| target_dir().join("debug/gpumem"));
    assert!(
        bin.exists(),
        "{} does not exist: build it first (`cargo build -p gpumem-agent`) or run `cargo xtask test`",
        bin.display()
    );
    bin
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the end-to-end tests load eBPF and must run as root");
}

pub struct Fixtures {
    pub dir: PathBuf,
    /// The synthetic driver, named like the real one.
    pub libcuda: PathBuf,
    pub workload: PathBuf,
    /// A raw-ioctl NVIDIA client (no libcuda).
    pub nvioctl: PathBuf,
    /// The synthetic NVML, named like the real one.
    pub nvml: PathBuf,
}

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("running cc (install gcc)");
    assert!(out.status.success(), "cc {:?} failed:\n{}", args, String::from_utf8_lossy(&out.stderr));
}

/// Builds the C fixtures once per test binary.
pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let src = workspace().join("tests/fixtures");
        let dir = target_dir().join("gpumem-fixtures");
        let libdir = dir.join("fake");
        std::fs::create_dir_all(&libdir).expect("creating the fixtures dir");
        let libcuda = libdir.join("libcuda.so.1");
        let workload = dir.join("workload");
        let lib_tmp = libdir.join("libcuda.so.1.tmp");
        cc(&["-shared", "-fPIC", "-O2", "-Wall", "-o", lib_tmp.to_str().unwrap(), src.join("fake_libcuda.c").to_str().unwrap(), "-lpthread"]);
        // Replace by rename: a running process keeps the old inode intact.
        std::fs::rename(&lib_tmp, &libcuda).expect("installing the synthetic libcuda");
        // No frame pointers, like libcuda and PyTorch: stacks must come from .eh_frame.
        cc(&[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-Wall",
            "-o",
            workload.to_str().unwrap(),
            src.join("workload.c").to_str().unwrap(),
            "-ldl",
            "-lpthread",
        ]);
        let nvioctl = dir.join("nvioctl");
        cc(&["-O2", "-Wall", "-o", nvioctl.to_str().unwrap(), src.join("nvioctl.c").to_str().unwrap()]);
        let nvml_dir = dir.join("fake-nvml");
        std::fs::create_dir_all(&nvml_dir).unwrap();
        let nvml = nvml_dir.join("libnvidia-ml.so.1");
        cc(&["-shared", "-fPIC", "-O2", "-Wall", "-o", nvml.to_str().unwrap(), src.join("fake_nvml.c").to_str().unwrap()]);
        Fixtures { dir, libcuda, workload, nvioctl, nvml }
    })
}

/// NVIDIA's real NVML (fetched with libcuda by `cargo xtask nvidia-libs`).
pub fn real_nvml() -> PathBuf {
    let path = real_libcuda().with_file_name("libnvidia-ml.so.1");
    assert!(path.exists(), "{} is missing: run `cargo xtask nvidia-libs`", path.display());
    path
}

/// Where `cargo xtask nvidia-libs` leaves the real NVIDIA user-space libraries.
pub fn real_libcuda() -> PathBuf {
    let path = std::env::var_os("GPUMEM_REAL_LIBCUDA")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("nvidia/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"));
    assert!(
        path.exists(),
        "the real NVIDIA libcuda is not at {}: fetch it with `cargo xtask nvidia-libs` (part of `cargo xtask test`)",
        path.display()
    );
    path
}

/// A finished `gpumem trace --json` run.
#[derive(Debug)]
pub struct Trace {
    pub events: Vec<Value>,
    pub summary: Value,
    pub status: std::process::ExitStatus,
    pub stderr: String,
}

impl Trace {
    pub fn of_type(&self, t: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["type"] == t).collect()
    }

    pub fn for_pid(&self, pid: u64) -> Vec<&Value> {
        self.events.iter().filter(|e| e["pid"] == pid).collect()
    }

    /// The `released` list of a process's exit event, as (device, bytes, allocs).
    pub fn released_at_exit(&self, pid: u64) -> Vec<(i64, u64, u64)> {
        let exits: Vec<&Value> = self.events.iter().filter(|e| e["type"] == "exit" && e["pid"] == pid).collect();
        assert_eq!(exits.len(), 1, "one exit event for pid {pid}: {:#?}", self.events);
        released(exits[0])
    }

    pub fn summary_process(&self, pid: u64) -> &Value {
        self.summary["processes"]
            .as_array()
            .expect("processes array")
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in summary {:#}", self.summary))
    }

    /// Pids seen in events, in order of first appearance.
    pub fn pids(&self) -> Vec<u64> {
        let mut pids = Vec::new();
        for e in &self.events {
            let p = e["pid"].as_u64().expect("pid");
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        pids
    }
}

/// (device, bytes, allocs) of an event's `released` list; device -1 = unknown.
pub fn released(ev: &Value) -> Vec<(i64, u64, u64)> {
    ev["released"]
        .as_array()
        .unwrap_or_else(|| panic!("no released list in {ev}"))
        .iter()
        .map(|r| (r["device"].as_i64().unwrap_or(-1), r["bytes"].as_u64().unwrap(), r["allocs"].as_u64().unwrap()))
        .collect()
}

/// A finished gpumem leaves a child that removes its uprobes (a few seconds
/// on this kernel, holding a kernel lock that attaching also takes). Until it
/// is gone the probes still fire and a new agent attaches slowly, so tests
/// and benchmarks wait for it.
pub fn wait_for_detach() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let busy = std::fs::read_dir("/proc").expect("/proc").flatten().any(|e| {
            std::fs::read_to_string(e.path().join("comm")).map(|c| c.trim() == "gpumem").unwrap_or(false)
        });
        if !busy {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "a gpumem process is still running after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub fn run_gpumem(args: &[&str], envs: &[(&str, &str)]) -> Output {
    wait_for_detach();
    let mut cmd = Command::new(gpumem_bin());
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("running gpumem")
}

/// Runs `gpumem trace --json ARGS` and parses every line.
pub fn trace(args: &[&str], envs: &[(&str, &str)]) -> Trace {
    let mut full = vec!["trace", "--json"];
    full.extend_from_slice(args);
    let out = run_gpumem(&full, envs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut events = Vec::new();
    let mut summary = None;
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\nstderr: {stderr}"));
        if v["type"] == "summary" {
            assert!(summary.is_none(), "two summaries");
            summary = Some(v);
        } else {
            assert!(summary.is_none(), "event after the summary: {line}");
            events.push(v);
        }
    }
    let summary = summary.unwrap_or_else(|| panic!("no summary; status {:?}\nstdout: {stdout}\nstderr: {stderr}", out.status));
    Trace { events, summary, status: out.status, stderr }
}

/// The shell command that runs one workload scenario on the synthetic driver.
pub fn workload_cmd(scenario: &str) -> String {
    let f = fixtures();
    format!("{} {} {}", f.workload.display(), f.libcuda.display(), scenario)
}

/// Starts one workload scenario on the synthetic driver in the background
/// (stdout, where `churn` prints its timing, discarded; stderr kept).
pub fn spawn_workload(scenario: &str, envs: &[(&str, &str)]) -> std::process::Child {
    let f = fixtures();
    let mut cmd = Command::new(&f.workload);
    cmd.args([f.libcuda.to_str().unwrap(), scenario]).stdout(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("starting the workload")
}

/// Traces one workload scenario against the synthetic driver (attached by path).
pub fn trace_workload(scenario: &str, envs: &[(&str, &str)]) -> Trace {
    let f = fixtures();
    let cmd = workload_cmd(scenario);
    let t = trace(&["--libcuda", f.libcuda.to_str().unwrap(), "-c", &cmd], envs);
    assert!(t.status.success(), "workload {scenario} failed: {:?}\nstderr: {}", t.status, t.stderr);
    assert_eq!(t.summary["lost_events"], 0, "events lost: {:#}", t.summary);
    t
}

/// Sizes of the events of one type, in order.
pub fn sizes(events: &[&Value]) -> Vec<u64> {
    events.iter().map(|e| e["size"].as_u64().unwrap()).collect()
}

pub fn devices(events: &[&Value]) -> Vec<i64> {
    events.iter().map(|e| e["device"].as_i64().unwrap_or(-1)).collect()
}

pub fn results(events: &[&Value]) -> Vec<u64> {
    events.iter().map(|e| e["result"].as_u64().unwrap()).collect()
}

/// The stand-in NVIDIA device (a FUSE server), mounted for one test.
pub struct FakeDevice {
    pub dir: PathBuf,
    server: std::process::Child,
}

impl FakeDevice {
    /// Mounts `server` (the fake_nvidia_dev binary) on a fresh directory.
    pub fn mount(server: &str, name: &str) -> FakeDevice {
        let dir = fixtures().dir.join(format!("nvdev-{name}"));
        // A mount left by an earlier run that died.
        let _ = Command::new("umount").arg("-l").arg(&dir).stderr(std::process::Stdio::null()).status();
        std::fs::create_dir_all(&dir).unwrap();
        let server = Command::new(server).arg(&dir).spawn().expect("starting the stand-in NVIDIA device");
        let ctl = dir.join("nvidiactl");
        for _ in 0..100 {
            if ctl.exists() {
                return FakeDevice { dir, server };
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the stand-in device did not appear at {}", dir.display());
    }

    /// The `--nvidia-dev-prefix` that names its nodes.
    pub fn prefix(&self) -> String {
        format!("{}/nvidia", self.dir.display())
    }
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.dir).stderr(std::process::Stdio::null()).status();
    }
}

/// A free TCP port on loopback (bound and released: another process could
/// take it in between, which on a test machine does not happen).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Percent-encodes a query-string value (RFC 3986 unreserved characters kept).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain HTTP/1.1 GET on loopback: (status, content type, body).
pub fn http_get(port: u16, path_and_query: &str, accept: Option<&str>) -> std::io::Result<(u16, String, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(s, "GET {path_and_query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{accept}Connection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other(format!("no HTTP header in {text:?}")))?;
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let ctype = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string()))
        .unwrap_or_default();
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    Ok((status, ctype, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Reads the child's stderr until a line starting with `ready` (the agent's
/// "everything is attached" line); the rest is collected on a thread whose
/// result is all of stderr. Panics if stderr ends first.
pub fn stderr_after_line(child: &mut std::process::Child, ready: &str) -> std::thread::JoinHandle<String> {
    use std::io::{BufRead as _, BufReader};
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr piped"));
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "gpumem ended before `{ready}`: {seen}");
        seen.push_str(&line);
        if line.starts_with(ready) {
            break;
        }
    }
    std::thread::spawn(move || {
        let mut s = seen;
        for line in stderr.lines() {
            s.push_str(&line.unwrap_or_default());
            s.push('\n');
        }
        s
    })
}

/// A memory cgroup (v1) limited to 64 MiB and a shell command that runs the
/// memory hog workload in it: the kernel OOM-kills the hog. Remove the
/// directory after the command.
pub fn hog_in_memory_cgroup(name: &str) -> (PathBuf, String) {
    let f = fixtures();
    let cg = PathBuf::from("/sys/fs/cgroup/memory").join(name);
    let _ = std::fs::remove_dir(&cg);
    std::fs::create_dir_all(&cg).expect("creating a memory cgroup (cgroup v1 memory controller)");
    std::fs::write(cg.join("memory.limit_in_bytes"), (64 * MIB).to_string()).unwrap();
    let _ = std::fs::write(cg.join("memory.memsw.limit_in_bytes"), (64 * MIB).to_string());
    let cmd = format!("echo $$ > {}/cgroup.procs && exec {} {} hog", cg.display(), f.workload.display(), f.libcuda.display());
    (cg, cmd)
}

/// `gpumem serve` running in the background, ready (its "serving" line seen).
pub struct Serve {
    pub child: std::process::Child,
    pub port: u16,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Serve {
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Serve {
        wait_for_detach();
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(gpumem_bin());
        cmd.args(["serve", "--listen", &listen]).args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting gpumem serve");
        let stderr = stderr_after_line(&mut child, "gpumem: serving");
        Serve { child, port, stderr: Some(stderr) }
    }

    /// The exposition in the classic text format (what curl and promtool get).
    pub fn metrics(&self) -> String {
        let (status, _, body) = http_get(self.port, "/metrics", None).expect("scraping gpumem");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// SIGTERM, then the exit status and everything it said on stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        (status, self.stderr.take().unwrap().join().unwrap())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // A failed test must not leave the daemon running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one sample in a text exposition (exact line match on name+labels).
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// Debian's Prometheus server on loopback, scraping what it is told every second.
pub struct Prometheus {
    child: std::process::Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Prometheus {
    /// `targets`: host:port of gpumem endpoints; `rules`: rule files to load.
    pub fn start(name: &str, targets: &[String], rules: &[PathBuf]) -> Prometheus {
        let bin = which::which("prometheus").expect("prometheus is not installed: `apt-get install prometheus` (cargo xtask setup does)");
        let dir = target_dir().join("prometheus").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let rules: Vec<String> = rules.iter().map(|r| format!("'{}'", r.display())).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{}]\nscrape_configs:\n  - job_name: gpumem\n    static_configs:\n      - targets: [{}]\n",
            rules.join(", "),
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(std::fs::File::create(dir.join("stdout.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("starting prometheus");
        let p = Prometheus { child, port, dir };
        p.wait_for(30, "Prometheus to be ready", || matches!(http_get(p.port, "/-/ready", None), Ok((200, _, _))).then_some(()));
        p
    }

    /// An instant query: each result's labels and value.
    pub fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let (status, _, body) = http_get(self.port, &format!("/api/v1/query?query={}", url_encode(promql)), None).expect("querying Prometheus");
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
        assert_eq!(status, 200, "{promql}: {body}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse().unwrap()))
            .collect()
    }

    /// The single value of a query, None while it has no result.
    pub fn value(&self, promql: &str) -> Option<f64> {
        let r = self.query(promql);
        assert!(r.len() <= 1, "{promql}: more than one series: {r:?}");
        r.first().map(|(_, v)| *v)
    }

    /// Polls `f` every 200 ms for up to `secs` seconds.
    pub fn wait_for<T>(&self, secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(v) = f() {
                return v;
            }
            let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
            assert!(std::time::Instant::now() < deadline, "timed out after {secs} s waiting for {what}; Prometheus said:\n{log}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless Chromium opens `page` and saves a screenshot of `width`×`height`
/// to `png`; returns the DOM as Chromium parsed it.
pub fn chromium_screenshot(page: &Path, png: &Path, width: u32, height: u32) -> String {
    let bin = which::which("chromium").expect("chromium is not installed: `apt-get install chromium` (cargo xtask setup does)");
    let url = format!("file://{}", page.display());
    let common = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"];
    let shot = Command::new(&bin)
        .args(common)
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .expect("running chromium");
    assert!(shot.status.success() && png.exists(), "chromium could not screenshot {url}: {}", String::from_utf8_lossy(&shot.stderr));
    let dom = Command::new(&bin).args(common).arg("--dump-dom").arg(&url).output().expect("running chromium");
    assert!(dom.status.success(), "chromium could not open {url}: {}", String::from_utf8_lossy(&dom.stderr));
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

/// Starts `gpumem trace --json ARGS` in the background and waits until it
/// traces (its "tracing" line on stderr).
pub fn start_agent(args: &[&str]) -> (std::process::Child, std::thread::JoinHandle<String>) {
    wait_for_detach();
    let mut child = std::process::Command::new(gpumem_bin())
        .args(["trace", "--json"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rest = stderr_after_line(&mut child, "gpumem: tracing");
    (child, rest)
}

pub fn finish_agent(child: std::process::Child, stderr: std::thread::JoinHandle<String>) -> (Vec<Value>, String) {
    let out = child.wait_with_output().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect(), stderr)
}

/// `promtool check metrics` on an exposition: its exit status and what it said.
pub fn promtool_check_metrics(exposition: &str) -> (Option<i32>, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), exposition.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
