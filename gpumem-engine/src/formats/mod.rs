//! Parsers of files and text other processes shape, with no I/O policy of
//! their own: the symbol tables and USDT notes of the libraries a process
//! loads, the dynamic linker's cache, the driver's XID lines. Every one is
//! fed arbitrary bytes by `crate::untrusted`'s fuzz targets.
pub mod kmsg_xid;
pub mod ld_cache;
pub mod symbols;
pub mod usdt;
