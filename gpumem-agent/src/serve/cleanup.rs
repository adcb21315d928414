//! `serve --cleanup [--then-wait]`: what gpumem leaves on a node removed
//! (the chart's uninstall mode runs it on every node).
use std::process::ExitCode;

use anyhow::Result;

/// `serve --cleanup`: every pinned link and map under the directory
/// removed, and the stacks kept for the next agent.
pub fn run(root: &std::path::Path, state_dir: &std::path::Path) -> Result<ExitCode> {
    crate::runtime::require_privileges(crate::privileges::Role::Serve)?;
    let stacks = state_dir.join(crate::runtime::continuity::STACK_FILE);
    match std::fs::remove_file(&stacks) {
        Ok(()) => eprintln!("gpumem: removed {}", stacks.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!("gpumem: cannot remove {}: {e}", stacks.display()),
    }
    if !root.exists() {
        eprintln!("gpumem: nothing pinned in {}", root.display());
        return Ok(ExitCode::SUCCESS);
    }
    let (links, maps) = crate::probes::pin::remove_all(root);
    eprintln!("gpumem: removed the pinned state in {}: {links} links detached, {maps} maps unpinned", root.display());
    Ok(ExitCode::SUCCESS)
}

/// Blocks until SIGTERM or SIGINT arrives (nothing else runs: a plain sigwait).
pub fn wait_for_stop() {
    eprintln!("gpumem: cleaned up; waiting for SIGTERM");
    // SAFETY: a signal set on the stack, the mask changed for this (only) thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
    }
}
