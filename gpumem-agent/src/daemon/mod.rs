//! The local API of a running `gpumem serve`: a Unix socket (root only)
//! through which `top`, `leaks`, `trace`, `export` and `status` ask the
//! daemon what it knows instead of starting probes of their own. The
//! protocol is the engine's queries (gpumem_engine::query): a query goes as
//! an HTTP/1.1 GET of its path, its answer comes back as the bytes the
//! command prints or the JSON of its typed answer.
pub mod client;
pub mod socket;

/// Where `serve` listens and the commands look by default.
pub const DEFAULT_SOCKET: &str = "/run/gpumem/gpumem.sock";
