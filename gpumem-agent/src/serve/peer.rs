//! Who may use the local API. The socket file is the agent's (mode 0600, or
//! 0660 with `--socket-group`), and each connection's peer is checked as
//! well (SO_PEERCRED, SO_PEERGROUPS): the kernel's word on who connected,
//! whatever the file's mode was when it connected. Others get one line
//! saying why, and the connection is closed.
use std::{os::fd::AsRawFd as _, time::Duration};

use tokio::net::{unix::SocketAddr, UnixListener, UnixStream};

/// The socket option for a peer's supplementary groups (asm-generic, x86_64
/// and arm64 alike; Linux 4.13).
const SO_PEERGROUPS: libc::c_int = 59;
/// How long a refused peer is read from and written to.
const REFUSE_WAIT: Duration = Duration::from_millis(200);
/// Groups read of a peer at most.
const MAX_GROUPS: usize = 256;

/// Who is let in: root, the agent's own user, and members of `group`.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    pub own_uid: u32,
    pub group: Option<u32>,
}

impl Access {
    pub fn allows(&self, uid: u32, gid: u32, groups: &[u32]) -> bool {
        uid == 0 || uid == self.own_uid || self.group.is_some_and(|g| gid == g || groups.contains(&g))
    }

    fn who(&self) -> String {
        match self.group {
            Some(g) => format!("root, uid {} or group {g}", self.own_uid),
            None => format!("root or uid {}", self.own_uid),
        }
    }
}

/// The peer's supplementary groups; none if the kernel does not say.
fn peer_groups(s: &UnixStream) -> Vec<u32> {
    let mut groups = vec![0u32; MAX_GROUPS];
    let mut len = (groups.len() * std::mem::size_of::<u32>()) as libc::socklen_t;
    // SAFETY: the buffer is `len` bytes long and lives through the call.
    let rc = unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return Vec::new();
    }
    groups.truncate(len as usize / std::mem::size_of::<u32>());
    groups
}

/// A Unix listener that hands axum only the connections `access` allows.
pub struct Guarded {
    inner: UnixListener,
    access: Access,
    /// Connections refused so far.
    refused: u64,
}

impl Guarded {
    pub fn new(inner: UnixListener, access: Access) -> Self {
        Guarded { inner, access, refused: 0 }
    }

    fn refuse(&mut self, s: UnixStream, uid: Option<u32>) {
        self.refused += 1;
        let n = self.refused;
        let who = uid.map_or("a peer the kernel does not name".to_string(), |u| format!("uid {u}"));
        let why = format!("gpumem: {who} may not use this agent's local API ({} only)\n", self.access.who());
        if n == 1 || n.is_power_of_two() {
            eprint!("{}", why.replace('\n', &format!(" (refused {n} connection(s) so far)\n")));
        }
        let reply = format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{why}",
            why.len()
        );
        // Off the accept loop, briefly: the request is read (closing over
        // unread bytes would reset the connection before the peer reads why),
        // the reason written, and the connection closed.
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut s = s;
            let mut request = [0u8; 8192];
            let _ = tokio::time::timeout(REFUSE_WAIT, s.read(&mut request)).await;
            let _ = tokio::time::timeout(REFUSE_WAIT, s.write_all(reply.as_bytes())).await;
            let _ = s.shutdown().await;
        });
    }
}

impl axum::serve::Listener for Guarded {
    type Io = UnixStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (UnixStream, SocketAddr) {
        loop {
            let (s, addr) = match self.inner.accept().await {
                Ok(c) => c,
                // Out of descriptors and the like: wait, then go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match s.peer_cred() {
                Ok(c) if self.access.allows(c.uid(), c.gid(), &peer_groups(&s)) => return (s, addr),
                Ok(c) => self.refuse(s, Some(c.uid())),
                Err(_) => self.refuse(s, None),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_the_agents_user_and_the_group_only() {
        let a = Access { own_uid: 0, group: None };
        assert!(a.allows(0, 0, &[]));
        assert!(!a.allows(1000, 1000, &[0]), "group 0 is not root");
        let g = Access { own_uid: 0, group: Some(42) };
        assert!(g.allows(1000, 42, &[]) && g.allows(1000, 1000, &[7, 42]));
        assert!(!g.allows(1000, 1000, &[7]));
        assert_eq!(g.who(), "root, uid 0 or group 42");
    }
}
