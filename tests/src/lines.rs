//! A child's stderr, read line by line on a thread of its own, that a test
//! can wait on: for the ready line, for a milestone the agent reports
//! (`--milestones`), for a line a workload prints; and, at the end, all of it.
use std::{
    io::{BufRead as _, BufReader, Read},
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

#[derive(Default)]
struct Seen {
    lines: Vec<String>,
    ended: bool,
}

/// The lines so far, and the thread that reads the rest.
pub struct Lines {
    seen: Arc<(Mutex<Seen>, Condvar)>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Lines {
    /// Starts reading `from` (a child's piped stderr or stdout).
    pub fn spawn(from: impl Read + Send + 'static) -> Lines {
        let seen = Arc::new((Mutex::new(Seen::default()), Condvar::new()));
        let shared = seen.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let (lock, cv) = &*shared;
                lock.lock().expect("lines").lines.push(line.unwrap_or_default());
                cv.notify_all();
            }
            let (lock, cv) = &*shared;
            lock.lock().expect("lines").ended = true;
            cv.notify_all();
        });
        Lines { seen, reader: Some(reader) }
    }

    /// How many lines have come so far (a mark for `wait_after`).
    pub fn mark(&self) -> usize {
        self.seen.0.lock().expect("lines").lines.len()
    }

    /// The first line containing `what`, waiting up to `secs` for it; fails
    /// naming it, with everything said so far, if it does not come.
    pub fn wait_for(&self, what: &str, secs: u64) -> String {
        self.wait_after(0, what, secs)
    }

    /// The first line containing `what` after line `mark` (see `mark`).
    pub fn wait_after(&self, mark: usize, what: &str, secs: u64) -> String {
        self.wait_where(mark, what, secs, |l| l.contains(what)).0
    }

    /// The first line that starts with `what`.
    pub fn wait_for_start(&self, what: &str, secs: u64) -> String {
        self.wait_where(0, what, secs, |l| l.starts_with(what)).0
    }

    /// Waits for a line containing `what`; the mark just after it (for a
    /// `wait_after` that wants what comes next).
    pub fn wait_for_mark(&self, what: &str, secs: u64) -> usize {
        self.wait_where(0, what, secs, |l| l.contains(what)).1
    }

    fn wait_where(&self, mark: usize, what: &str, secs: u64, matches: impl Fn(&str) -> bool) -> (String, usize) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let (lock, cv) = &*self.seen;
        let mut seen = lock.lock().expect("lines");
        loop {
            if let Some((i, l)) = seen.lines.iter().enumerate().skip(mark).find(|(_, l)| matches(l)) {
                return (l.clone(), i + 1);
            }
            let now = Instant::now();
            assert!(!seen.ended, "the output ended before a line with `{what}`:\n{}", seen.lines.join("\n"));
            assert!(now < deadline, "no line with `{what}` after {secs} s:\n{}", seen.lines.join("\n"));
            seen = cv.wait_timeout(seen, deadline - now).expect("lines").0;
        }
    }

    /// Everything said so far.
    pub fn text(&self) -> String {
        let seen = self.seen.0.lock().expect("lines");
        let mut s = seen.lines.join("\n");
        s.push('\n');
        s
    }

    /// Everything, once the output has ended (the child exited or closed it).
    pub fn join(mut self) -> std::thread::Result<String> {
        if let Some(r) = self.reader.take() {
            r.join()?;
        }
        Ok(self.text())
    }
}
