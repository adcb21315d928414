//! Event builders for unit tests of state and analyses.
use gpumem_common::Event;

/// An event of `api_id` from pid/tid 100 ("python"), successful, at t = 1 ns.
pub fn ev(api_id: u32) -> Event {
    Event { ts_ns: 1, latency_ns: 0, pid: 100, tid: 100, comm: *b"python\0\0\0\0\0\0\0\0\0\0", ..Event::empty(api_id) }
}
