//! The local API of a running `gpumem serve`: a Unix socket (root only)
//! through which `top`, `leaks` and `status` show what the daemon knows
//! instead of starting probes of their own. HTTP/1.1 over the socket; the
//! daemon renders with the same code the commands use, so the output is the
//! same whichever side built it.
pub mod client;
pub mod socket;

/// Where `serve` listens and the commands look by default.
pub const DEFAULT_SOCKET: &str = "/run/gpumem/gpumem.sock";
/// Every answer says which gpumem made it: output of another version is not used.
pub const VERSION_HEADER: &str = "x-gpumem-version";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

use gpumem_engine::model::Holding;

/// The holdings of these processes (all, if none is named).
pub fn holdings(state: &gpumem_engine::state::State, pids: &[u32]) -> Vec<Holding> {
    let mut out = Vec::new();
    for p in state.processes.values().filter(|p| !p.exited && (pids.is_empty() || pids.contains(&p.pid))) {
        for &device in &p.devices_seen {
            let t = p.totals(device);
            out.push(Holding { pid: p.pid, comm: p.comm.clone(), device, live_bytes: t.live_bytes, live_allocs: t.live_allocs });
        }
    }
    out
}

/// Parses `pids=1,2` (the query of /v1/holdings).
pub fn parse_pids(q: &str) -> Result<Vec<u32>, String> {
    let v = q.strip_prefix("pids=").unwrap_or(q);
    v.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().map_err(|_| format!("bad pid {s:?}"))).collect()
}

/// `leaks` asked of the daemon.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LeaksQuery {
    /// Only these processes (empty: all).
    #[serde(default)]
    pub pids: Vec<u32>,
    pub older_than_s: f64,
    pub top: usize,
    #[serde(default)]
    pub json: bool,
}

impl LeaksQuery {
    /// The query string of /v1/leaks.
    pub fn to_query(&self) -> String {
        let pids: Vec<String> = self.pids.iter().map(u32::to_string).collect();
        format!("pids={}&older_than_s={}&top={}&json={}", pids.join(","), self.older_than_s, self.top, self.json)
    }

    /// Parses the query string of /v1/leaks.
    pub fn parse(q: &str) -> Result<Self, String> {
        let mut out = LeaksQuery { top: 10, ..Default::default() };
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |what: &str| format!("bad {k}={v}: {what}");
            match k {
                "pids" => {
                    out.pids =
                        v.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().map_err(|_| bad("not a pid"))).collect::<Result<_, _>>()?
                }
                "older_than_s" => out.older_than_s = v.parse().map_err(|_| bad("not a number"))?,
                "top" => out.top = v.parse().map_err(|_| bad("not a count"))?,
                "json" => out.json = v == "true",
                _ => return Err(format!("unknown parameter {k}")),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaks_query_goes_through_its_query_string() {
        let q = LeaksQuery { pids: vec![12, 34], older_than_s: 1.5, top: 3, json: true };
        assert_eq!(LeaksQuery::parse(&q.to_query()).unwrap(), q);
        assert_eq!(LeaksQuery::parse("").unwrap().top, 10);
        assert!(LeaksQuery::parse("pids=x").unwrap_err().contains("not a pid"));
        assert!(LeaksQuery::parse("color=red").unwrap_err().contains("unknown parameter color"));
    }
}
