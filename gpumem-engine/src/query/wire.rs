//! How a query and its answer travel between a command and a running
//! daemon: a query is an HTTP path and query string (`/v1/leaks?top=5`),
//! an answer its bytes — the rendering the command would print (leaks,
//! top's text, an export's file) or JSON of the typed answer (snapshot,
//! stacks, holdings, status) that the command reads back into the same type.
use super::{
    export::{ExportQuery, Format},
    leaks::LeaksQuery,
    Answer, Query, QueryError,
};
use crate::{analysis::profile::Layers, export::flame::Space};

/// Every answer carries the version of the gpumem that made it (output
/// of another version is not used).
pub const VERSION_HEADER: &str = "x-gpumem-version";

/// Why a path and query string are not a query.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no such question: {0}")]
    Unknown(String),
    #[error("{0}")]
    Bad(String),
}

/// The pairs of a query string; an empty string has none.
fn pairs(q: &str) -> impl Iterator<Item = (&str, &str)> {
    q.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")))
}

fn bad(k: &str, v: &str, what: &str) -> String {
    format!("bad {k}={v}: {what}")
}

fn pid_list(k: &str, v: &str) -> Result<Vec<u32>, String> {
    v.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().map_err(|_| bad(k, v, "not a pid"))).collect()
}

fn join(pids: &[u32]) -> String {
    pids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

impl Query {
    /// The path and query string that ask it.
    pub fn to_path(&self) -> String {
        match self {
            Query::Leaks(q) => {
                format!("/v1/leaks?pids={}&older_than_s={}&top={}&json={}", join(&q.pids), q.older_than_s, q.top, q.json)
            }
            Query::Top => "/v1/top".into(),
            Query::Snapshot => "/v1/snapshot".into(),
            Query::Stacks { pid, device } => format!("/v1/stacks?pid={pid}&device={device}"),
            Query::Holdings { pids } => format!("/v1/holdings?pids={}", join(pids)),
            Query::Status => "/v1/status".into(),
            Query::Events => "/v1/events".into(),
            Query::Export(e) => {
                let layers = if e.layers == Layers::Tensors { "tensors" } else { "driver" };
                let pid = e.pid.map_or_else(String::new, |p| p.to_string());
                format!(
                    "/v1/export?format={}&pid={pid}&layers={layers}&older_than_s={}&space={}",
                    e.format.name(),
                    e.older_than_s,
                    e.space.name()
                )
            }
        }
    }

    /// The query a path and query string ask; Err says what is wrong with them.
    pub fn parse(path: &str, query: &str) -> Result<Query, ParseError> {
        let bad = ParseError::Bad;
        Ok(match path {
            "/v1/leaks" => Query::Leaks(parse_leaks(query).map_err(bad)?),
            "/v1/top" => Query::Top,
            "/v1/snapshot" => Query::Snapshot,
            "/v1/stacks" => parse_stacks(query).map_err(bad)?,
            "/v1/holdings" => Query::Holdings { pids: pid_list("pids", query.strip_prefix("pids=").unwrap_or(query)).map_err(bad)? },
            "/v1/status" => Query::Status,
            "/v1/events" => Query::Events,
            "/v1/export" => Query::Export(parse_export(query).map_err(bad)?),
            _ => return Err(ParseError::Unknown(path.to_string())),
        })
    }

    /// Whether its answer is a file's bytes rather than text.
    pub fn is_binary(&self) -> bool {
        matches!(self, Query::Export(_))
    }
}

fn parse_leaks(q: &str) -> Result<LeaksQuery, String> {
    let mut out = LeaksQuery { top: 10, ..Default::default() };
    for (k, v) in pairs(q) {
        match k {
            "pids" => out.pids = pid_list(k, v)?,
            "older_than_s" => out.older_than_s = v.parse().map_err(|_| bad(k, v, "not a number"))?,
            "top" => out.top = v.parse().map_err(|_| bad(k, v, "not a count"))?,
            "json" => out.json = v == "true",
            _ => return Err(format!("unknown parameter {k}")),
        }
    }
    Ok(out)
}

/// `pid=N&device=D`.
fn parse_stacks(q: &str) -> Result<Query, String> {
    let (mut pid, mut device) = (None, None);
    for pair in q.split('&') {
        match pair.split_once('=') {
            Some(("pid", v)) => pid = v.parse().ok(),
            Some(("device", v)) => device = v.parse().ok(),
            _ => return Err(format!("unknown parameter {pair:?}")),
        }
    }
    Ok(Query::Stacks { pid: pid.ok_or("pid=N is missing")?, device: device.ok_or("device=D is missing")? })
}

fn parse_export(q: &str) -> Result<ExportQuery, String> {
    let mut out = ExportQuery { format: Format::Pprof, pid: None, layers: Layers::Driver, older_than_s: 5.0, space: Space::Inuse };
    let mut format = None;
    for (k, v) in pairs(q) {
        match k {
            "format" => format = Some(Format::parse(v).ok_or_else(|| bad(k, v, "not a format"))?),
            "pid" if v.is_empty() => out.pid = None,
            "pid" => out.pid = Some(v.parse().map_err(|_| bad(k, v, "not a pid"))?),
            "layers" => {
                out.layers = match v {
                    "driver" => Layers::Driver,
                    "tensors" => Layers::Tensors,
                    _ => return Err(bad(k, v, "driver or tensors")),
                }
            }
            "older_than_s" => out.older_than_s = v.parse().map_err(|_| bad(k, v, "not a number"))?,
            "space" => out.space = Space::parse(v).ok_or_else(|| bad(k, v, "inuse or alloc"))?,
            _ => return Err(format!("unknown parameter {k}")),
        }
    }
    out.format = format.ok_or("format=F is missing")?;
    Ok(out)
}

impl Answer {
    /// The answer's bytes as they travel (and as a command prints them).
    pub fn to_bytes(&self) -> Result<Vec<u8>, QueryError> {
        let mut out = Vec::new();
        match self {
            Answer::Leaks { report, json: true } => report.write_json(&mut out)?,
            Answer::Leaks { report, json: false } => report.write_human(&mut out)?,
            Answer::Top(snap) => snap.write_text(&mut out)?,
            Answer::Snapshot(s) => out = json(s)?,
            Answer::Stacks(groups) => out = json(groups)?,
            Answer::Holdings(h) => out = json(h)?,
            Answer::Status(s) => out = json(s)?,
            Answer::Events(e) => out = json(e)?,
            Answer::Export(r) => out.clone_from(&r.bytes),
        }
        Ok(out)
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, QueryError> {
    serde_json::to_vec(v).map_err(|e| QueryError::Render(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_goes_through_its_path() {
        let queries = [
            Query::Leaks(LeaksQuery { pids: vec![12, 34], older_than_s: 1.5, top: 3, json: true }),
            Query::Top,
            Query::Snapshot,
            Query::Stacks { pid: 7, device: -1 },
            Query::Holdings { pids: vec![1, 2] },
            Query::Holdings { pids: vec![] },
            Query::Status,
            Query::Events,
            Query::Export(ExportQuery {
                format: Format::TorchSnapshot,
                pid: Some(42),
                layers: Layers::Tensors,
                older_than_s: 1.5,
                space: Space::Inuse,
            }),
            Query::Export(ExportQuery {
                format: Format::Perfetto,
                pid: None,
                layers: Layers::Driver,
                older_than_s: 5.0,
                space: Space::Inuse,
            }),
            Query::Export(ExportQuery {
                format: Format::Flamegraph,
                pid: Some(7),
                layers: Layers::Driver,
                older_than_s: 5.0,
                space: Space::Alloc,
            }),
        ];
        for q in queries {
            let path = q.to_path();
            let (p, s) = path.split_once('?').unwrap_or((&path, ""));
            assert_eq!(Query::parse(p, s).unwrap(), q, "{path}");
        }
    }

    #[test]
    fn a_bad_query_says_what_is_wrong() {
        assert_eq!(Query::parse("/v1/leaks", "").unwrap(), Query::Leaks(LeaksQuery { top: 10, ..Default::default() }));
        assert!(Query::parse("/v1/leaks", "pids=x").unwrap_err().to_string().contains("not a pid"));
        assert!(Query::parse("/v1/leaks", "color=red").unwrap_err().to_string().contains("unknown parameter color"));
        assert!(Query::parse("/v1/export", "pid=1").unwrap_err().to_string().contains("format=F is missing"));
        assert!(Query::parse("/v1/export", "format=svg").unwrap_err().to_string().contains("not a format"));
        assert!(Query::parse("/v1/stacks", "pid=1").unwrap_err().to_string().contains("device=D is missing"));
        assert!(Query::parse("/v1/holdings", "pids=1,x").unwrap_err().to_string().contains("not a pid"));
        assert!(Query::parse("/v2/anything", "").unwrap_err().to_string().contains("no such question"));
    }
}
