//! Plain HTTP (on loopback, or to a pod's address), for scraping the agent and querying Prometheus.
/// A free TCP port on loopback (bound and released: another process could
/// take it in between, which on a test machine does not happen).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Percent-encodes a query-string value (RFC 3986 unreserved characters kept).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain HTTP/1.1 GET on loopback: (status, content type, body).
pub fn http_get(port: u16, path_and_query: &str, accept: Option<&str>) -> std::io::Result<(u16, String, String)> {
    http_get_from(std::net::Ipv4Addr::LOCALHOST, port, path_and_query, accept)
}

/// A plain HTTP/1.1 GET to `ip:port`: (status, content type, body).
pub fn http_get_from(
    ip: std::net::Ipv4Addr,
    port: u16,
    path_and_query: &str,
    accept: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect((ip, port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(s, "GET {path_and_query} HTTP/1.1\r\nHost: {ip}:{port}\r\n{accept}Connection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other(format!("no HTTP header in {text:?}")))?;
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let ctype =
        head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string())).unwrap_or_default();
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    Ok((status, ctype, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
