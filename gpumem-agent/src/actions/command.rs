//! One `--action EVENT=COMMAND` run: `/bin/sh -c COMMAND` in a process
//! group of its own, the event's JSON on stdin, `GPUMEM_EVENT` set; killed
//! (the whole group) at the timeout. Where there is no /bin/sh (gpumem's
//! image has none), COMMAND is split on white space and run as it is.
use std::{process::Stdio, time::Duration};

use tokio::io::AsyncWriteExt as _;

use gpumem_engine::model::actions::Outcome;

/// What a run ended with, and what to say of it when it did not succeed.
pub async fn run(command: &str, event: &str, json: &[u8], timeout: Duration) -> (Outcome, Option<String>) {
    let mut cmd = if std::path::Path::new("/bin/sh").exists() {
        let mut c = tokio::process::Command::new("/bin/sh");
        c.arg("-c").arg(command);
        c
    } else {
        let mut words = command.split_whitespace();
        let mut c = tokio::process::Command::new(words.next().unwrap_or(command));
        c.args(words);
        c
    };
    cmd.env("GPUMEM_EVENT", event)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (Outcome::Failed, Some(format!("cannot run it: {e}"))),
    };
    let pid = child.id();
    let io = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A command that does not read its stdin closes it: not a failure.
            let _ = stdin.write_all(json).await;
            let _ = stdin.shutdown().await;
        }
        child.wait().await
    };
    match tokio::time::timeout(timeout, io).await {
        Ok(Ok(status)) if status.success() => (Outcome::Ok, None),
        Ok(Ok(status)) => (Outcome::Failed, Some(format!("exited with {status}"))),
        Ok(Err(e)) => (Outcome::Failed, Some(format!("waiting for it: {e}"))),
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: a signal to the process group the command leads.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            let _ = child.wait().await;
            (Outcome::Timeout, Some(format!("killed after {} s", timeout.as_secs_f64())))
        }
    }
}
