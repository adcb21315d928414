//! `gpumem serve` in the background, Debian's Prometheus scraping it, and
//! promtool checking what it serves.
use std::{path::PathBuf, process::Command};

use serde_json::Value;

use crate::{free_port, gpumem_bin, http_get, stderr_after_line, target_dir, url_encode, wait_for_detach};

/// `gpumem serve` running in the background, ready (its "serving" line seen).
pub struct Serve {
    pub child: std::process::Child,
    pub port: u16,
    stderr: Option<crate::Lines>,
    /// Its pinned state, removed when the test is done with it.
    pub state: Option<ServeState>,
}

/// Where a test's `serve` keeps what outlives it: pinned kernel state, the
/// stacks directory and the local API's socket. Unique per test, so that no
/// test adopts another's state; removed (probes detached) on drop.
#[derive(Clone, Debug)]
pub struct ServeState {
    pub pin_dir: PathBuf,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
}

impl ServeState {
    pub fn new(name: &str) -> Self {
        let state = ServeState {
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/gpumem-test-{name}")),
            state_dir: target_dir().join("serve-state").join(name),
            socket: target_dir().join("serve-state").join(format!("{name}.sock")),
        };
        state.remove();
        std::fs::create_dir_all(state.socket.parent().unwrap()).unwrap();
        state
    }

    /// The arguments that put a `serve` here.
    pub fn args(&self) -> Vec<String> {
        [
            "--pin-dir",
            self.pin_dir.to_str().unwrap(),
            "--state-dir",
            self.state_dir.to_str().unwrap(),
            "--socket",
            self.socket.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// Detaches what is pinned and removes the rest.
    pub fn remove(&self) {
        if self.pin_dir.exists() {
            let out =
                Command::new(gpumem_bin()).args(["serve", "--cleanup", "--pin-dir", self.pin_dir.to_str().unwrap()]).output().unwrap();
            assert!(out.status.success(), "serve --cleanup: {}", String::from_utf8_lossy(&out.stderr));
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Serve {
    /// A `serve` with pinned state of its own (see `ServeState`), unless
    /// `args` say where (or `--no-pin`).
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Serve {
        let own = !args.iter().any(|a| *a == "--no-pin" || *a == "--pin-dir");
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let state = own.then(|| ServeState::new(&format!("{}-{n}", std::process::id())));
        let mut all: Vec<String> = state.as_ref().map(ServeState::args).unwrap_or_default();
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut serve = Self::start_with(&all, envs);
        serve.state = state;
        serve
    }

    /// A `serve` with exactly these arguments (a test that restarts it
    /// passes the same `ServeState::args` to each and removes the state).
    pub fn start_with(args: &[&str], envs: &[(&str, &str)]) -> Serve {
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
        Serve { child, port, stderr: Some(stderr), state: None }
    }

    /// Sends a signal, then the exit status and everything it said on
    /// stderr; its pinned state stays (for the next `serve`).
    pub fn signal(mut self, sig: i32) -> (std::process::ExitStatus, String) {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let status = self.child.wait().unwrap();
        self.state = None;
        (status, self.stderr.take().unwrap().join().unwrap())
    }

    /// What it said on stderr so far, to wait on (`--milestones` lines).
    pub fn stderr(&self) -> &crate::Lines {
        self.stderr.as_ref().expect("serve's stderr")
    }

    /// The exposition in the classic text format (what curl and promtool get).
    pub fn metrics(&self) -> String {
        let (status, _, body) = http_get(self.port, "/metrics", None).expect("scraping gpumem");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// SIGTERM, then the exit status and everything it said on stderr; its
    /// own pinned state is removed.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        let state = self.state.take();
        let out = self.signal(libc::SIGTERM);
        if let Some(s) = state {
            s.remove();
        }
        out
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // A failed test must not leave the daemon running, nor its probes.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(s) = self.state.take() {
            s.remove();
        }
    }
}

/// The value of the first series of `name` for this process in a text exposition.
pub fn pid_series(exposition: &str, name: &str, pid: u32) -> Option<f64> {
    let prefix = format!("{name}{{pid=\"{pid}\"");
    exposition.lines().find(|l| l.starts_with(&prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The value of one sample in a text exposition (exact line match on name+labels).
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// `gpumem_agent_heap_bytes{part="..."}` of an exposition, by part, in its order.
pub fn heap_parts(exposition: &str) -> Vec<(String, f64)> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("gpumem_agent_heap_bytes{part=\""))
        .filter_map(|l| {
            let (part, rest) = l.split_once('"')?;
            Some((part.to_string(), rest.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
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
        let (status, _, body) =
            http_get(self.port, &format!("/api/v1/query?query={}", url_encode(promql)), None).expect("querying Prometheus");
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
    pub fn wait_for<T>(&self, secs: u64, what: &str, f: impl FnMut() -> Option<T>) -> T {
        let log = || format!("; Prometheus said:\n{}", std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default());
        crate::poll(secs, what, f, log)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
