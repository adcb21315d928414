//! Detaching without making the caller wait.
use super::{links::LinkMode, Agent};

impl Agent {
    /// Detaches everything without making the caller wait.
    ///
    /// uprobe_multi links go in one RCU grace period: dropped here. Per-point
    /// links (kernels before 6.6) go one at a time, each waiting for its own
    /// grace period (about 0.1 s on this VM: 6 s for 60 links). For those a
    /// forked child keeps references to the probes until this process has
    /// exited, so that the slow removal happens in the child, not in our
    /// exit. Call it from the main thread (the parent-death signal follows
    /// the thread that forked).
    pub fn detach_in_background(self) {
        if self.uprobe_links.mode == LinkMode::Multi || self.uprobe_links.links < 8 {
            drop(self);
            return;
        }
        // SAFETY: the child only calls async-signal-safe functions (setsid,
        // close, prctl, getppid, pause, _exit).
        unsafe {
            let parent = libc::getpid();
            let pid = libc::fork();
            if pid == 0 {
                libc::setsid();
                // Whoever reads our output sees end-of-file when we exit.
                for fd in 0..3 {
                    libc::close(fd);
                }
                // Killed once the parent is fully gone (after its fds closed);
                // our exit then drops the last references.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            }
        }
        // In the parent (and if fork failed): closing our references is
        // cheap while the child holds its own.
        drop(self);
    }
}
