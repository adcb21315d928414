//! Every parser of bytes that another process or tenant shapes, behind one
//! signature: what the cargo-fuzz targets (`fuzz/`, `cargo xtask fuzz`) and
//! the property tests (`fuzz.rs`) feed arbitrary bytes. Each must return
//! whatever the bytes say: no panic, no hang, nothing allocated beyond
//! what its input bounds.
use crate::{
    formats::{kmsg_xid, ld_cache, symbols, usdt},
    model::container,
    procfs,
    python::{self, code},
    record,
};

/// One parser and what reaches it.
pub struct Target {
    pub name: &'static str,
    /// Where its bytes come from.
    pub reads: &'static str,
    pub run: fn(&[u8]),
}

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// A line table and the indices asked of it: the first 4 bytes are the
/// code object's first line, the next 2 how many instructions are asked.
fn line_table(data: &[u8], line: fn(&[u8], i32, u64) -> Option<u32>) {
    let Some((head, table)) = data.split_first_chunk::<6>() else { return };
    let first = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    for i in 0..u16::from_le_bytes([head[4], head[5]]).min(4096) {
        let _ = line(table, first, u64::from(i) * 2);
    }
}

pub const TARGETS: &[Target] = &[
    Target { name: "maps", reads: "/proc/PID/maps (file names any process chooses)", run: |d| drop(procfs::parse_maps_bytes(d)) },
    Target { name: "status", reads: "/proc/PID/status (a comm any process sets)", run: |d| drop(procfs::parse_status(&text(d))) },
    Target {
        name: "cgroup",
        reads: "/proc/PID/cgroup (delegated cgroup names) and the container and pod read from its paths",
        run: |d| drop(container::parse_cgroup_file(&text(d))),
    },
    Target { name: "mounts", reads: "/proc/PID/mounts", run: |d| procfs::parse_mounts(&text(d)).for_each(drop) },
    Target { name: "ld_so_cache", reads: "ld.so.cache (both formats)", run: |d| drop(ld_cache::parse(d)) },
    Target { name: "stapsdt", reads: "a library's .note.stapsdt notes and argument specs", run: |d| drop(usdt::probes_in(d, "fuzz")) },
    Target { name: "usdt_argument", reads: "one USDT argument spec", run: |d| drop(usdt::parse_arg(&text(d))) },
    Target { name: "elf_symbols", reads: "a libcuda copy's symbol tables", run: |d| drop(symbols::function_offsets_in(d)) },
    Target {
        name: "python_elf",
        reads: "an interpreter's ELF (_PyRuntime, Py_Version)",
        run: |d| {
            let _ = python::links_interpreter(d);
        },
    },
    Target {
        name: "python_location_table",
        reads: "a code object's 3.11+ location table, read from the process",
        run: |d| line_table(d, code::line_of),
    },
    Target {
        name: "python_line_table",
        reads: "a code object's 3.10 (PEP 626) line table, read from the process",
        run: |d| line_table(d, code::line_of_pep626),
    },
    Target {
        name: "kmsg_xid",
        reads: "kernel log lines (a process can write to /dev/kmsg)",
        run: |d| text(d).lines().for_each(|l| drop(kmsg_xid::parse(l))),
    },
    Target {
        name: "recording",
        reads: "a recording handed to replay",
        run: |d| {
            let Ok(mut r) = record::Reader::new(d) else { return };
            for _ in 0..100_000 {
                if r.next_record().is_none() {
                    break;
                }
            }
        },
    },
];

/// Runs the target named `name` on `data`; false if there is none.
pub fn run(name: &str, data: &[u8]) -> bool {
    TARGETS.iter().find(|t| t.name == name).map(|t| (t.run)(data)).is_some()
}

/// A target's seeds (`fuzz/corpus/NAME`, committed) and the crashes found
/// and fixed since (`fuzz/regressions/NAME`, committed: each stays a test).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else { continue };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        out.extend(files.iter().filter_map(|f| std::fs::read(f).ok()));
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn every_target_has_seeds_and_takes_them_and_their_regressions() {
        for t in TARGETS {
            let seeds = seeds(t.name);
            assert!(!seeds.is_empty(), "fuzz/corpus/{} has no seed", t.name);
            for s in &seeds {
                (t.run)(s);
            }
        }
        assert!(!run("no such target", b""));
    }

    /// A seed with bytes overwritten and its end cut: inputs close to real
    /// ones, where parsers go deepest.
    fn mutated(seed: &[u8], writes: &[(usize, u8)], cut: usize) -> Vec<u8> {
        let mut d = seed.to_vec();
        for &(at, b) in writes {
            if !d.is_empty() {
                let n = d.len();
                d[at % n] = b;
            }
        }
        d.truncate(d.len().saturating_sub(cut % (d.len() / 4 + 1)));
        d
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn every_parser_takes_any_bytes(target in 0..TARGETS.len(), data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            (TARGETS[target].run)(&data);
        }

        #[test]
        fn every_parser_takes_its_seeds_damaged(
            target in 0..TARGETS.len(),
            pick in any::<usize>(),
            writes in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..24),
            cut in any::<usize>(),
        ) {
            let seeds = seeds(TARGETS[target].name);
            let seed = &seeds[pick % seeds.len()];
            (TARGETS[target].run)(&mutated(seed, &writes, cut));
        }
    }
}
