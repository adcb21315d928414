//! The commands' side of the socket: asks a running daemon a query, or
//! says why there is none to ask (then the command starts its own probes).
use std::{
    io::{Read as _, Write as _},
    os::unix::{fs::MetadataExt as _, net::UnixStream},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use gpumem_engine::{
    query::{wire::VERSION_HEADER, Query},
    VERSION,
};

/// A running daemon to ask, if there is one.
#[derive(Clone, Debug)]
pub struct Daemon {
    /// Its local API's socket.
    pub socket: PathBuf,
    /// `--no-daemon`: never ask, start probes of our own.
    pub disabled: bool,
}

/// What asking gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer<B = String> {
    /// The daemon's rendering.
    Body(B),
    /// No daemon to use, and why (said when the command falls back).
    NoDaemon(String),
}

const TIMEOUT: Duration = Duration::from_secs(15);

/// GETs `path_and_query` from the daemon at `socket`: a text answer.
pub fn get(socket: &Path, path_and_query: &str) -> Result<Answer> {
    Ok(match get_bytes(socket, path_and_query)? {
        Answer::Body(b) => Answer::Body(String::from_utf8_lossy(&b).into_owned()),
        Answer::NoDaemon(why) => Answer::NoDaemon(why),
    })
}

/// The same, the answer's bytes as they came (exports are binary).
pub fn get_bytes(socket: &Path, path_and_query: &str) -> Result<Answer<Vec<u8>>> {
    let meta = match std::fs::metadata(socket) {
        Ok(m) => m,
        Err(_) => return Ok(Answer::NoDaemon(format!("no gpumem serve at {}", socket.display()))),
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        bail!(
            "{} belongs to uid {}, neither root nor you: not trusting what it says (remove it, or pass --no-daemon)",
            socket.display(),
            meta.uid()
        );
    }
    let mut stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => return Ok(Answer::NoDaemon(format!("stale socket {} ({e}): its gpumem serve is gone", socket.display()))),
    };
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    // One write: a peer that answers on the first read sees the whole request.
    stream.write_all(format!("GET {path_and_query} HTTP/1.1\r\nHost: gpumem\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let (status, version, body) = parse_response(&raw)?;
    if version.as_deref() != Some(VERSION) {
        let theirs = version.unwrap_or_else(|| "unknown".into());
        return Ok(Answer::NoDaemon(format!(
            "the gpumem serve at {} is version {theirs}, this gpumem is {VERSION}: not using it (run the same version on both sides)",
            socket.display()
        )));
    }
    if status != 200 {
        bail!("the gpumem serve at {} answered {status}: {}", socket.display(), String::from_utf8_lossy(&body).trim());
    }
    Ok(Answer::Body(body))
}

impl Daemon {
    /// What the daemon answers `q`, or None (said on stderr where a socket
    /// was there but could not be used) when the command should start its
    /// own probes: no daemon, `--no-daemon`, a stale socket, another version.
    pub fn ask(&self, q: &Query) -> Result<Option<Vec<u8>>> {
        if self.disabled {
            return Ok(None);
        }
        match get_bytes(&self.socket, &q.to_path())? {
            Answer::Body(b) => Ok(Some(b)),
            Answer::NoDaemon(why) => {
                if self.socket.exists() {
                    eprintln!("gpumem: {why}; using probes of its own");
                }
                Ok(None)
            }
        }
    }

    /// The answer as text (what the command prints).
    pub fn ask_text(&self, q: &Query) -> Result<Option<String>> {
        Ok(self.ask(q)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// The answer read back into its type.
    pub fn ask_typed<T: serde::de::DeserializeOwned>(&self, q: &Query) -> Result<Option<T>> {
        let Some(body) = self.ask(q)? else { return Ok(None) };
        Ok(Some(serde_json::from_slice(&body).context("the running gpumem serve's answer is not understood")?))
    }
}

/// (status, version header, body) of an HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> Result<(u16, Option<String>, Vec<u8>)> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { bail!("the daemon's answer was cut short") };
    let head = String::from_utf8_lossy(&raw[..end]);
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok());
    let Some(status) = status else { bail!("the daemon's answer has no HTTP status line") };
    let mut version = None;
    let mut chunked = false;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                k if k == VERSION_HEADER => version = Some(v.trim().to_string()),
                "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
    }
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    Ok((status, version, body))
}

fn dechunk(mut s: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = s.windows(2).position(|w| w == b"\r\n") else { bail!("a chunk of the daemon's answer was cut short") };
        let size = String::from_utf8_lossy(&s[..eol]);
        let n = usize::from_str_radix(size.trim(), 16).map_err(|_| anyhow::anyhow!("bad chunk size {size:?}"))?;
        if n == 0 {
            return Ok(out);
        }
        let rest = &s[eol + 2..];
        let Some(chunk) = rest.get(..n) else { bail!("a chunk of the daemon's answer was cut short") };
        out.extend_from_slice(chunk);
        s = rest.get(n + 2..).unwrap_or(b"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_with_their_version_plain_or_chunked() {
        let plain = format!("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n{VERSION_HEADER}: 1.2.3\r\n\r\nhello");
        assert_eq!(parse_response(plain.as_bytes()).unwrap(), (200, Some("1.2.3".into()), b"hello".to_vec()));
        let chunked = "HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked.as_bytes()).unwrap(), (503, None, b"abcde".to_vec()));
        assert!(parse_response(b"HTTP/1.1 200").is_err());
    }

    #[test]
    fn no_socket_is_no_daemon_and_a_dead_one_is_stale() {
        let dir = std::env::temp_dir().join(format!("gpumem-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("none.sock");
        assert!(matches!(get(&path, &Query::Status.to_path()).unwrap(), Answer::NoDaemon(m) if m.contains("no gpumem serve")));
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(matches!(get(&path, &Query::Status.to_path()).unwrap(), Answer::NoDaemon(m) if m.contains("stale socket")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
