//! How the tests wait: for a condition they ask about (`poll`), for a
//! gpumem that is still detaching, and, for a long test, which named step
//! it was in when it failed. Nothing waits a fixed time; lines a child
//! prints are waited for with `Lines`.

/// Names of loaded BPF programs that are gpumem's (the kernel truncates names to 15 bytes).
pub fn gpumem_programs() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(|p| p.ok())
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .filter(|n| n.starts_with("cuda_") || n == "mark_victim" || n.starts_with("sched_process_"))
        .collect()
}

/// A finished gpumem leaves a child that removes its uprobes (a few seconds
/// on this kernel, holding a kernel lock that attaching also takes). Until it
/// is gone the probes still fire and a new agent attaches slowly, so tests
/// and benchmarks wait for it.
pub fn wait_for_detach() {
    let gpumem_running = || {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .any(|e| std::fs::read_to_string(e.path().join("comm")).map(|c| c.trim() == "gpumem").unwrap_or(false))
    };
    poll(60, "every gpumem process to end", || (!gpumem_running()).then_some(()), String::new);
}

/// Asks `f` until it answers, for up to `secs` seconds (first at once, then
/// every 10 ms growing to every 200 ms: quick when it is quick, light when it
/// is not); at the deadline fails naming `what`, with what `context` says then.
/// The one way the tests wait for something (nothing waits a fixed time).
pub fn poll<T>(secs: u64, what: &str, f: impl FnMut() -> Option<T>, context: impl Fn() -> String) -> T {
    try_poll(secs, f).unwrap_or_else(|| panic!("timed out after {secs} s waiting for {what}{}", context()))
}

/// A long test's named steps: each is said as it starts, and a failure
/// says which step it happened in (libtest shows what a failed test said).
pub struct Steps {
    current: std::cell::Cell<&'static str>,
}

/// The steps of the test that calls it (the first named by `step`).
pub fn steps() -> Steps {
    Steps { current: std::cell::Cell::new("set-up") }
}

impl Steps {
    pub fn step(&self, name: &'static str) {
        eprintln!("step: {name}");
        self.current.set(name);
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failed in step: {}", self.current.get());
        }
    }
}

/// `poll` without failing: None if `f` did not answer in `secs` seconds
/// (for clean-up paths, which must not panic).
pub fn try_poll<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut every = std::time::Duration::from_millis(10);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
        every = (every * 2).min(std::time::Duration::from_millis(200));
    }
}
