//! A local HTTP server that keeps what it is sent: the webhook receiver of
//! the action tests, and the stand-in for the Kubernetes API server that
//! checks the requests the isolation actions make. It answers 503 to the
//! first `fail_first` requests (to see retries), then `status`, or as it is
//! told (`answering`).
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpListener,
    sync::{Arc, Mutex},
};

#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// What it was answered.
    pub status: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

pub struct Receiver {
    pub ip: std::net::Ipv4Addr,
    pub port: u16,
    pub received: Arc<Mutex<Vec<Received>>>,
}

/// What to answer a request (the requests before it counted): status and body.
pub type Answer = Box<dyn Fn(&Received, usize) -> (u16, String) + Send>;

impl Receiver {
    pub fn start(fail_first: usize, status: u16) -> Receiver {
        Self::answering(Box::new(move |_, before| (if before < fail_first { 503 } else { status }, "{}".to_string())))
    }

    /// Answers each request as `answer` says.
    pub fn answering(answer: Answer) -> Receiver {
        Self::answering_on(std::net::Ipv4Addr::LOCALHOST, answer)
    }

    /// Listening on `ip` (a pod network's host end, say).
    pub fn answering_on(ip: std::net::Ipv4Addr, answer: Answer) -> Receiver {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let keep = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut r = BufReader::new(stream);
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
                let len = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                let mut all = keep.lock().unwrap();
                let mut got = Received { method, path, headers, body, status: 0 };
                let (status, reply) = answer(&got, all.len());
                got.status = status;
                all.push(got);
                drop(all);
                let _ = write!(
                    r.get_mut(),
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            }
        });
        Receiver { ip, port, received }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.ip, self.port)
    }

    pub fn all(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}
