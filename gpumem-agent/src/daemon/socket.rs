//! The daemon's side of the socket: a stale one (its agent died) is
//! replaced, one answered by another daemon or owned by another user is not.
use std::{
    os::unix::{fs::MetadataExt as _, fs::PermissionsExt as _, net::UnixListener},
    path::Path,
};

use anyhow::{bail, Context as _, Result};

/// Binds the socket, readable and writable by its owner (root) only, or by
/// `group` too; a note when a stale socket was replaced.
pub fn bind(path: &Path, group: Option<u32>) -> Result<(UnixListener, Option<String>)> {
    let mut note = None;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {} for the local API's socket", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            bail!(
                "{} belongs to uid {}, not to this agent (uid {me}): not replacing it (remove it, or choose another --socket)",
                path.display(),
                meta.uid()
            );
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => bail!("another gpumem serve answers at {}: stop it first, or give this one another --socket", path.display()),
            Err(_) => {
                std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
                note = Some(format!("removed a stale socket at {} (its agent is gone)", path.display()));
            }
        }
    }
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    if let Some(g) = group {
        std::os::unix::fs::chown(path, None, Some(g)).with_context(|| format!("cannot give {} to group {g}", path.display()))?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot make {} private", path.display()))?;
    Ok((listener, note))
}

/// A group given by number or by name (as /etc/group names it).
pub fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group for --socket-group")?;
    groups
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(group)).then(|| f.nth(1)?.parse().ok()).flatten()
        })
        .with_context(|| format!("--socket-group {group}: no such group in /etc/group (give its name or number)"))
}
