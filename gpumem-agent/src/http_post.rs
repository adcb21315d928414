//! Plain HTTP/1.1 POSTs to a receiver the operator names (OTLP pushes,
//! action webhooks): http only, the receiver on the node or in the cluster
//! terminating TLS.
use anyhow::{bail, Context as _, Result};
use http_body_util::{BodyExt as _, Full};
use hyper::{body::Bytes, Request as HttpRequest, Request};

/// Where to POST: `http://host[:port][/path]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// `host:port`, for the Host header.
    pub authority: String,
    pub path: String,
}

impl Endpoint {
    /// Parses `url`, its path `default_path` when it names none.
    pub fn parse(url: &str, default_path: &str) -> Result<Self, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!("{url}: {other} is not supported, only http (send to a receiver on the node that forwards with TLS)"))
            }
            None => return Err(format!("{url}: no scheme; write http://HOST:PORT/PATH")),
        }
        let host = uri.host().ok_or_else(|| format!("{url}: no host"))?.to_string();
        let port = uri.port_u16().unwrap_or(80);
        let path = match uri.path() {
            "" | "/" if uri.query().is_none() => default_path.to_string(),
            p => uri.path_and_query().map_or(p, |pq| pq.as_str()).to_string(),
        };
        Ok(Endpoint { authority: format!("{host}:{port}"), host, port, path })
    }

    /// An OTLP/HTTP receiver: `http://host[:port][/path]`, the path OTLP's
    /// `/v1/metrics` when it names none (http only; a collector on the node
    /// or in the cluster terminates TLS).
    pub fn otlp(url: &str) -> Result<Self, String> {
        Endpoint::parse(url, "/v1/metrics")
    }

    /// `http://host:port/path`, as the operator wrote it.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// Sends one request over `io`, a connected stream (plain or TLS): the
/// answer's status and body.
pub async fn exchange<S>(io: S, req: Request<Full<Bytes>>) -> Result<(u16, Bytes)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

/// A body gzipped for the wire (fast level: scrapes and pushes are made
/// often, and most of the gain is in the first level).
pub fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 8), flate2::Compression::fast());
    gz.write_all(body)?;
    gz.finish()
}

/// POSTs one body (`encoding`: its Content-Encoding, if any); the
/// receiver's status when it is a success, else why not.
pub async fn post(e: &Endpoint, content_type: &str, encoding: Option<&str>, body: Vec<u8>) -> Result<u16> {
    let stream =
        tokio::net::TcpStream::connect((e.host.as_str(), e.port)).await.with_context(|| format!("connecting to {}", e.authority))?;
    let mut req = HttpRequest::post(e.path.as_str())
        .header(hyper::header::HOST, e.authority.as_str())
        .header(hyper::header::CONTENT_TYPE, content_type)
        .header(hyper::header::USER_AGENT, concat!("gpumem/", env!("CARGO_PKG_VERSION")));
    if let Some(encoding) = encoding {
        req = req.header(hyper::header::CONTENT_ENCODING, encoding);
    }
    let req = req.body(Full::new(Bytes::from(body)))?;
    let (status, body) = exchange(stream, req).await?;
    if !(200..300).contains(&status) {
        bail!("{} answered {status}: {}", e.authority, String::from_utf8_lossy(&body).trim());
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls_with_a_default_path() {
        let e = Endpoint::parse("http://127.0.0.1:8428/opentelemetry/v1/metrics", "/v1/metrics").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("127.0.0.1", 8428, "/opentelemetry/v1/metrics"));
        let e = Endpoint::parse("http://collector", "/v1/metrics").unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("collector:80", "/v1/metrics"));
        assert_eq!(e.url(), "http://collector:80/v1/metrics");
        let e = Endpoint::parse("http://hooks.local:8080/?token=abc", "/").unwrap();
        assert_eq!(e.path, "/?token=abc");
        assert!(Endpoint::parse("https://x/v1/metrics", "/").unwrap_err().contains("only http"));
        assert!(Endpoint::parse("collector:4318", "/").is_err());
    }
}
