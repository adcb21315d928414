//! A small client of the Kubernetes API for the isolation actions (`gpumem
//! kube`): the API server and credentials a pod gets (its service account's
//! token and CA, `KUBERNETES_SERVICE_HOST`), HTTPS verified against that CA
//! (rustls), one request per connection. http:// servers are accepted for
//! tests and local proxies (`kubectl proxy`).
use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{bail, Context as _, Result};
use http_body_util::Full;
use hyper::{body::Bytes, Method, Request};

use crate::http_post;

/// Where a pod's service account credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// A request not answered by then has failed.
const TIMEOUT: Duration = Duration::from_secs(15);

pub struct Client {
    host: String,
    port: u16,
    token: Option<String>,
    /// https: the TLS to speak (None: plain http).
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// An answer: status and body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("the API server's answer is not JSON: {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Client {
    /// `server`: a URL, else the in-cluster one; `token_file` and
    /// `ca_file`: else the service account's (a missing token file is no
    /// token: a proxy may not need one).
    pub fn new(server: Option<&str>, token_file: Option<&Path>, ca_file: Option<&Path>) -> Result<Client> {
        let url = match server {
            Some(s) => s.to_string(),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .context("not in a pod (no KUBERNETES_SERVICE_HOST): name the API server with --api-server URL")?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                let host = if host.contains(':') { format!("[{host}]") } else { host };
                format!("https://{host}:{port}")
            }
        };
        let uri: hyper::Uri = url.parse().with_context(|| format!("{url:?} is not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => bail!("{url}: the API server's URL is https://HOST:PORT (or http:// for a local proxy)"),
        };
        let host = uri.host().context("the API server's URL has no host")?.trim_matches(['[', ']']).to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let sa = Path::new(SERVICE_ACCOUNT_DIR);
        let token_path = token_file.map_or_else(|| sa.join("token"), Path::to_path_buf);
        let token = match std::fs::read_to_string(&token_path) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) if token_file.is_none() && e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => bail!("cannot read the token {}: {e}", token_path.display()),
        };
        let tls = if https { Some(Arc::new(tls_config(&ca_file.map_or_else(|| sa.join("ca.crt"), Path::to_path_buf))?)) } else { None };
        Ok(Client { host, port, token, tls })
    }

    /// One request; the answer whatever its status.
    pub async fn request(&self, method: Method, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Result<Answer> {
        tokio::time::timeout(TIMEOUT, self.send(method, path, content_type, body))
            .await
            .with_context(|| format!("the API server {}:{} did not answer in {} s", self.host, self.port, TIMEOUT.as_secs()))?
    }

    async fn send(&self, method: Method, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Result<Answer> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("connecting to the API server {}:{}", self.host, self.port))?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, format!("{}:{}", self.host, self.port))
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, concat!("gpumem/", env!("CARGO_PKG_VERSION")));
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(c) = content_type {
            req = req.header(hyper::header::CONTENT_TYPE, c);
        }
        let req = req.body(Full::new(Bytes::from(body)))?;
        let (status, body) = match &self.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone()).context("the API server's host name")?;
                let stream = tokio_rustls::TlsConnector::from(tls.clone())
                    .connect(name, tcp)
                    .await
                    .with_context(|| format!("TLS with the API server {}", self.host))?;
                http_post::exchange(stream, req).await?
            }
            None => http_post::exchange(tcp, req).await?,
        };
        let body = body.to_vec();
        Ok(Answer { status, body })
    }
}

/// TLS that trusts the CA file only (the cluster's), rustls with ring.
fn tls_config(ca: &Path) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("cannot read the CA {}", ca.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate bundle", ca.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", ca.display());
    }
    for c in certs {
        roots.add(c).with_context(|| format!("a certificate in {}", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
