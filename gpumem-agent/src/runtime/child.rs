//! `-c CMD`: the command started blocked, so that it is in the pid filter
//! before it runs its first instruction, and its exit status passed on.
use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result};

/// A command started blocked (see `start_blocked`).
pub struct Child {
    pub pid: u32,
    release: OwnedFd,
    pub exited: tokio::sync::oneshot::Receiver<std::io::Result<i32>>,
}

impl Child {
    /// Lets the command run.
    pub fn release(&self) {
        // SAFETY: writes one byte to a pipe we own.
        unsafe { libc::write(self.release.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    }
}

/// Forks `/bin/sh -c CMD`, held before exec until `Child::release`.
/// (std's Command cannot do this: its spawn waits for the exec.)
pub fn start_blocked(cmd: &str) -> Result<Child> {
    let sh = CString::new("/bin/sh").expect("no NUL");
    let dash_c = CString::new("-c").expect("no NUL");
    let cmd_c = CString::new(cmd).context("the command contains a NUL byte")?;
    let argv = [sh.as_ptr(), dash_c.as_ptr(), cmd_c.as_ptr(), std::ptr::null()];
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating a pipe to start the command");
    }
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only calls async-signal-safe functions (close, read,
    // execv, _exit) before exec, on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        // SAFETY: in the child before exec: only async-signal-safe calls,
        // on descriptors and strings made before the fork.
        unsafe {
            libc::close(write_end.as_raw_fd());
            let mut b = 0u8;
            // Wait until the agent has put us in its pid filter (or went away).
            libc::read(read_end.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::execv(sh.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    drop(read_end);
    let (tx, exited) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("gpumem-wait".into())
        .spawn(move || {
            let mut status = 0;
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            let _ = tx.send(if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(status) });
        })
        .context("starting the wait thread")?;
    Ok(Child { pid: pid as u32, release: write_end, exited })
}

/// Shell-style exit status: the code, or 128 + the signal that killed it.
pub fn exit_code(status: i32) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        128u8.wrapping_add(libc::WTERMSIG(status) as u8)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shell_style_exit_codes() {
        // Wait statuses as waitpid writes them: code << 8, or the signal.
        assert_eq!(super::exit_code(3 << 8), 3);
        assert_eq!(super::exit_code(libc::SIGKILL), 128 + 9);
    }
}
