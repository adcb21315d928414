//! Every parser of bytes that another process or tenant shapes, behind one
//! signature: what the cargo-fuzz targets (`fuzz/`, `cargo xtask fuzz`) and
//! the property tests (`fuzz.rs`) feed arbitrary bytes. Each must return
//! whatever the bytes say: no panic, no hang, nothing allocated beyond
//! what its input bounds.
use crate::{
    formats::{kmsg_xid, ld_cache, symbols, usdt},
    model::container,
    procfs,
    python::{self, code, layout, memory::Image, threads},
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

/// Where a fuzzed interpreter's memory starts, its thread's id, and where
/// its code object is (the fuzzer shapes everything they point to).
const PY_BASE: u64 = 0x10000;
const PY_TID: u32 = 4242;
const PY_CODE: u64 = PY_BASE + 0x4000;

/// An interpreter's memory as the agent reads it: the first byte picks the
/// version (3.10 to 3.13, whose layout is read from the memory itself), the
/// rest stands at `PY_BASE` with `_PyRuntime` at its start; the thread
/// lists are walked and the code object at `PY_CODE` read, names, table
/// and lines.
fn python_memory(data: &[u8]) {
    let Some((&v, bytes)) = data.split_first() else { return };
    let mem = Image { base: PY_BASE, bytes };
    let Some(l) = layout::for_version((3, 10 + v % 4), &mem, PY_BASE) else { return };
    let _ = threads::walk(&mem, &l, PY_BASE, PY_TID);
    let Some(c) = code::read_code(&mem, &l.code, PY_CODE) else { return };
    for i in 0..64 {
        let _ = match l.code.lines {
            layout::Lines::Locations => code::line_of(&c.linetable, c.firstlineno, i),
            layout::Lines::Pep626 => code::line_of_pep626(&c.linetable, c.firstlineno, i * 2),
        };
    }
}

/// A well-formed interpreter memory for `python_memory` (version 3.`minor`):
/// one interpreter, one thread, a code object `Trainer.step` in `train.py`
/// at line 10 whose table puts its first instructions on line 11. The seeds
/// of its fuzz target are these.
pub fn python_image(minor: u8) -> Vec<u8> {
    let mut m = vec![0u8; 0x7000];
    let put = |m: &mut Vec<u8>, addr: u64, bytes: &[u8]| {
        let at = (addr - PY_BASE) as usize;
        m[at..at + bytes.len()].copy_from_slice(bytes);
    };
    if minor == 13 {
        // _Py_DebugOffsets: the cookie, the version, then each offset gpumem reads.
        put(&mut m, PY_BASE, b"xdebugpy");
        put(&mut m, PY_BASE + 8, &0x030d_00f0u64.to_ne_bytes());
        for (at, v) in [
            (40u64, 0x300u64),
            (64, 0),
            (72, 72),
            (168, 8),
            (200, 144),
            (184, 56),
            (240, 0),
            (232, 8),
            (248, 56),
            (264, 70),
            (280, 112),
            (296, 128),
            (312, 68),
            (304, 136),
            (344, 192),
            (552, 16),
            (544, 32),
            (560, 40),
            (520, 16),
            (528, 32),
        ] {
            put(&mut m, PY_BASE + at, &v.to_ne_bytes());
        }
    }
    let l = layout::for_version((3, minor), &Image { base: PY_BASE, bytes: &m }, PY_BASE).expect("a version gpumem knows");
    let (interp, tstate, pthread, qualname, filename, table) =
        (PY_BASE + 0x1000, PY_BASE + 0x2000, PY_BASE + 0x3000, PY_BASE + 0x5000, PY_BASE + 0x5800, PY_BASE + 0x6000);
    put(&mut m, PY_BASE + l.runtime_interpreters_head, &interp.to_ne_bytes());
    put(&mut m, interp + l.interp_threads_head, &tstate.to_ne_bytes());
    match l.thread_id {
        layout::ThreadId::Native => put(&mut m, tstate + l.tstate_native_thread_id, &u64::from(PY_TID).to_ne_bytes()),
        layout::ThreadId::Pthread => {
            put(&mut m, tstate + l.tstate_native_thread_id, &pthread.to_ne_bytes());
            put(&mut m, pthread + layout::PTHREAD_TID, &PY_TID.to_ne_bytes());
        }
    }
    let c = &l.code;
    for (s, text) in [(qualname, "Trainer.step"), (filename, "train.py")] {
        put(&mut m, s + c.str_length, &(text.len() as u64).to_ne_bytes());
        // compact (bit 5), ASCII (bit 6), one byte per character (kind 1).
        put(&mut m, s + c.str_state, &((1u32 << 5) | (1 << 6) | (1 << 2)).to_ne_bytes());
        put(&mut m, s + c.ascii_header, text.as_bytes());
    }
    put(&mut m, PY_CODE + c.qualname, &qualname.to_ne_bytes());
    put(&mut m, PY_CODE + c.filename, &filename.to_ne_bytes());
    put(&mut m, PY_CODE + c.firstlineno, &10u32.to_ne_bytes());
    put(&mut m, PY_CODE + c.linetable, &table.to_ne_bytes());
    let lines: &[u8] = match c.lines {
        // One-line form: line +1 over 4 code units.
        layout::Lines::Locations => &[0x80 | (11 << 3) | 3, 4, 9],
        // 8 bytes on line +1.
        layout::Lines::Pep626 => &[8, 1],
    };
    put(&mut m, table + c.bytes_size, &(lines.len() as u64).to_ne_bytes());
    put(&mut m, table + c.bytes_data, lines);
    let mut out = vec![minor - 10];
    out.extend(m);
    out
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
    Target {
        name: "usdt_argument",
        reads: "one USDT argument spec (x86_64's and aarch64's syntax)",
        run: |d| {
            let spec = text(d);
            drop(usdt::Arch::X86_64.parse_arg(&spec));
            drop(usdt::Arch::Aarch64.parse_arg(&spec));
        },
    },
    Target { name: "elf_symbols", reads: "a libcuda copy's symbol tables", run: |d| drop(symbols::function_offsets_in(d, |_| true)) },
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
        name: "python_memory",
        reads: "an interpreter's memory (3.10-3.13): thread lists, code objects, strings, line tables",
        run: python_memory,
    },
    Target {
        name: "kmsg_xid",
        reads: "kernel log lines (a process can write to /dev/kmsg)",
        run: |d| text(d).lines().for_each(|l| drop(kmsg_xid::parse(l))),
    },
    Target {
        name: "numa_maps",
        reads: "a process's pages per NUMA node (its mappings and file names)",
        run: |d| drop(procfs::numa_maps::bytes_on_nodes(d, &[0, 1, 2, 9])),
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

    #[test]
    fn the_python_memory_seeds_decode_as_built() {
        for minor in 10..=13 {
            let image = python_image(minor);
            let mem = Image { base: PY_BASE, bytes: &image[1..] };
            let l = layout::for_version((3, minor), &mem, PY_BASE).unwrap();
            let threads = threads::walk(&mem, &l, PY_BASE, PY_TID).unwrap();
            assert_eq!(threads, vec![(PY_TID, PY_BASE + 0x2000)], "3.{minor}");
            let c = code::read_code(&mem, &l.code, PY_CODE).unwrap();
            assert_eq!((c.qualname.as_str(), c.filename.as_str(), c.firstlineno), ("Trainer.step", "train.py", 10), "3.{minor}");
            let line = match l.code.lines {
                layout::Lines::Locations => code::line_of(&c.linetable, 10, 0),
                layout::Lines::Pep626 => code::line_of_pep626(&c.linetable, 10, 0),
            };
            assert_eq!(line, Some(11), "3.{minor}");
            // The committed seeds are these images.
            let seed = std::fs::read(format!("{}/../fuzz/corpus/python_memory/3.{minor}", env!("CARGO_MANIFEST_DIR")));
            if std::env::var_os("GPUMEM_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(format!("{}/../fuzz/corpus/python_memory", env!("CARGO_MANIFEST_DIR"))).unwrap();
                std::fs::write(format!("{}/../fuzz/corpus/python_memory/3.{minor}", env!("CARGO_MANIFEST_DIR")), &image).unwrap();
            } else {
                assert_eq!(
                    seed.ok().as_deref(),
                    Some(image.as_slice()),
                    "fuzz/corpus/python_memory/3.{minor}: rewrite it with GPUMEM_WRITE_SEEDS=1"
                );
            }
        }
    }

    #[test]
    fn a_forged_interpreter_memory_is_refused_or_read_never_past_it() {
        // Cycles: the thread list points at itself.
        let mut image = python_image(11);
        let l = layout::for_version((3, 11), &Image { base: PY_BASE, bytes: &image[1..] }, PY_BASE).unwrap();
        let at = (PY_BASE + 0x2000 + l.tstate_next - PY_BASE) as usize + 1;
        image[at..at + 8].copy_from_slice(&(PY_BASE + 0x2000).to_ne_bytes());
        let mem = Image { base: PY_BASE, bytes: &image[1..] };
        assert!(threads::walk(&mem, &l, PY_BASE, PY_TID).unwrap_err().contains("loops"));
        // A name that says it is 2^64 characters long: its first ones read, cut and marked.
        let mut image = python_image(11);
        let at = (PY_BASE + 0x5000 + l.code.str_length - PY_BASE) as usize + 1;
        image[at..at + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
        let mem = Image { base: PY_BASE, bytes: &image[1..] };
        let c = code::read_code(&mem, &l.code, PY_CODE).unwrap();
        assert!(c.qualname.starts_with("Trainer.step") && c.qualname.ends_with('…'), "{}", c.qualname);
        assert_eq!(c.qualname.chars().count() as u64, code::MAX_NAME_CHARS + 1);
        // A line table that says it is 2^64 bytes: unreadable past the memory, not a huge read.
        let mut image = python_image(11);
        let at = (PY_BASE + 0x6000 + l.code.bytes_size - PY_BASE) as usize + 1;
        image[at..at + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert!(code::read_code(&Image { base: PY_BASE, bytes: &image[1..] }, &l.code, PY_CODE).is_none());
        // Pointers at unmapped memory and past the end of the address space.
        for bad in [0u64, 8, u64::MAX - 4, PY_BASE + 0x7ff8] {
            let mut image = python_image(11);
            let at = (PY_CODE + l.code.qualname - PY_BASE) as usize + 1;
            image[at..at + 8].copy_from_slice(&bad.to_ne_bytes());
            assert!(code::read_code(&Image { base: PY_BASE, bytes: &image[1..] }, &l.code, PY_CODE).is_none(), "{bad:#x}");
        }
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
