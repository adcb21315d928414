//! CPython seen from outside: which processes run an interpreter (its
//! libpython or a python executable that exports `_PyRuntime`), where the
//! interpreter's version keeps its threads and frames, the thread states
//! the kernel's frame walk starts from, and code objects resolved to
//! function, file and line from the process's memory.
pub mod code;
pub mod layout;
pub mod memory;
pub mod threads;

use std::{collections::HashMap, path::Path};

use memory::Memory as _;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::procfs;

/// One process's interpreter, as found in its maps.
#[derive(Clone, Debug)]
pub struct Interpreter {
    pub pid: u32,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// The layout of its version (`Py_Version` in its memory).
    pub layout: layout::Layout,
}

/// A Python process whose frames gpumem cannot walk, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unwalked {
    pub pid: u32,
    pub why: String,
}

/// Whether a mapped file may hold an interpreter: libpython3.X.so* or a
/// python3.X executable (Debian links the interpreter into it).
fn may_hold_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    name.starts_with("libpython3") || name.starts_with("python3")
}

/// Link-time addresses in a file that holds an interpreter.
#[derive(Clone, Copy, Debug)]
struct Linked {
    /// The first segment's page, against which the load bias is taken.
    first_segment: u64,
    runtime: u64,
    version: Option<u64>,
}

/// Files read at most this many before the cache starts over.
const MAX_FILES: usize = 1024;

/// Finds interpreters, reading each interpreter file (tens of MiB with its
/// symbol table) once however many processes map it.
#[derive(Default)]
pub struct Finder {
    /// By (device, inode); None: no `_PyRuntime` there.
    files: HashMap<(String, u64), Option<Linked>>,
}

impl Finder {
    /// The interpreter a process runs, if any, and a version gpumem knows.
    /// Err names why a Python process cannot be walked (an unknown version).
    pub fn find(&mut self, pid: u32) -> Result<Option<Interpreter>, String> {
        let Ok(maps) = procfs::read_maps(pid) else { return Ok(None) };
        for e in maps.iter().filter(|e| e.offset == 0 && !e.deleted) {
            let Some(path) = e.path.as_deref().filter(|p| may_hold_interpreter(p)) else { continue };
            if self.files.len() >= MAX_FILES {
                self.files.clear();
            }
            let linked = *self.files.entry((e.dev.clone(), e.inode)).or_insert_with(|| linked(&procfs::mapped_file(pid, path, e.inode)));
            let Some(l) = linked else { continue };
            let bias = e.range.start.wrapping_sub(l.first_segment);
            let runtime = bias.wrapping_add(l.runtime);
            let mem = procfs::ProcessMemory::open(pid).map_err(|e| format!("reading process {pid}'s memory: {e}"))?;
            // Py_Version came with 3.11; before, the file's name says it (python3.10, libpython3.10.so.1.0).
            let version = match l.version.and_then(|v| mem.u32(bias.wrapping_add(v))) {
                Some(hex) => ((hex >> 24) as u8, (hex >> 16) as u8),
                None => match version_in_name(path) {
                    Some(v) => v,
                    None => return Err(format!("{path} exports _PyRuntime but no Py_Version, and its name has no version")),
                },
            };
            let layout = layout::for_version(version, &mem, runtime)
                .ok_or_else(|| format!("{path} is CPython {}.{}, whose frame layout gpumem does not know", version.0, version.1))?;
            return Ok(Some(Interpreter { pid, runtime, layout }));
        }
        Ok(None)
    }
}

/// The version in an interpreter file's name: python3.10, libpython3.10.so.1.0.
fn version_in_name(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = name.strip_prefix("lib").unwrap_or(name).strip_prefix("python3.")?;
    let minor: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((3, minor.parse().ok()?))
}

/// `_PyRuntime` and `Py_Version` as the file links them; None if it has no
/// `_PyRuntime`.
fn linked(file: &Path) -> Option<Linked> {
    linked_in(&crate::formats::elf_reader(file).ok()?)
}

/// Whether a file's bytes (a process chose the file) link `_PyRuntime`.
pub fn links_interpreter(data: &[u8]) -> bool {
    linked_in(data).is_some()
}

fn linked_in<'d, R: object::ReadRef<'d>>(data: R) -> Option<Linked> {
    let elf = object::File::parse(data).ok()?;
    let first_segment = elf.segments().map(|s| s.address()).min()? & !0xfff;
    let mut runtime = None;
    let mut version = None;
    // A file named like an interpreter may hold any number of symbols.
    for sym in elf.dynamic_symbols().chain(elf.symbols()).take(crate::formats::budget::MAX_SYMBOLS) {
        match sym.name() {
            Ok("_PyRuntime") if runtime.is_none() => runtime = Some(sym.address()),
            Ok("Py_Version") if version.is_none() => version = Some(sym.address()),
            _ => {}
        }
    }
    Some(Linked { first_segment, runtime: runtime?, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_in_name("/usr/bin/python3.10"), Some((3, 10)));
        assert_eq!(version_in_name("/usr/lib/x86_64-linux-gnu/libpython3.10.so.1.0"), Some((3, 10)));
        assert_eq!(version_in_name("/opt/python3.9d"), Some((3, 9)));
        assert_eq!(version_in_name("/usr/bin/python3"), None);
        assert_eq!(version_in_name("/usr/bin/python"), None);
    }
}
