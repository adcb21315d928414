//! CPython seen from outside: which processes run an interpreter (its
//! libpython or a python executable that exports `_PyRuntime`), where the
//! interpreter's version keeps its threads and frames, the thread states
//! the kernel's frame walk starts from, and code objects resolved to
//! function, file and line from the process's memory.
pub mod code;
pub mod layout;
pub mod threads;

use std::path::Path;

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::procfs;

/// One process's interpreter, as found in its maps.
#[derive(Clone, Debug)]
pub struct Interpreter {
    pub pid: u32,
    /// The module that holds the interpreter, as the process maps it.
    pub module: String,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// (major, minor) from `Py_Version` in the process's memory.
    pub version: (u8, u8),
    pub layout: layout::Layout,
}

/// Whether a mapped file may hold an interpreter: libpython3.X.so* or a
/// python3.X executable (Debian links the interpreter into it).
fn may_hold_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    name.starts_with("libpython3") || name.starts_with("python3")
}

/// The interpreter a process runs, if any, and a version gpumem knows.
/// Err names why a Python process cannot be walked (an unknown version).
pub fn find(pid: u32) -> Result<Option<Interpreter>, String> {
    let Ok(maps) = procfs::read_maps(pid) else { return Ok(None) };
    for e in maps.iter().filter(|e| e.offset == 0 && !e.deleted) {
        let Some(path) = e.path.as_deref().filter(|p| may_hold_interpreter(p)) else { continue };
        let Some((runtime, version_sym)) = symbols(&procfs::mapped_file(pid, path, e.inode), e.range.start) else { continue };
        let mut word = [0u8; 8];
        let version = match version_sym {
            Some(addr) if procfs::read_memory(pid, addr, &mut word[..4]).is_ok() => {
                let hex = u32::from_ne_bytes(word[..4].try_into().unwrap_or_default());
                ((hex >> 24) as u8, (hex >> 16) as u8)
            }
            _ => return Err(format!("{path} exports _PyRuntime but no Py_Version (before 3.11)")),
        };
        let mem = procfs::ProcessMemory::open(pid).map_err(|e| format!("reading process {pid}'s memory: {e}"))?;
        let layout = layout::for_version(version, &mem, runtime)
            .ok_or_else(|| format!("{path} is CPython {}.{}, whose frame layout gpumem does not know", version.0, version.1))?;
        return Ok(Some(Interpreter { pid, module: path.to_string(), runtime, version, layout }));
    }
    Ok(None)
}

/// `_PyRuntime` and `Py_Version` in the process, for a module mapped at
/// `start` (its first mapping); None if it has no `_PyRuntime`.
fn symbols(file: &Path, start: u64) -> Option<(u64, Option<u64>)> {
    let data = std::fs::read(file).ok()?;
    let elf = object::File::parse(&*data).ok()?;
    // Load bias: where the first segment landed against where it was linked.
    let first = elf.segments().map(|s| s.address()).min()? & !0xfff;
    let bias = start.wrapping_sub(first);
    let mut runtime = None;
    let mut version = None;
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        match sym.name() {
            Ok("_PyRuntime") if runtime.is_none() => runtime = Some(bias.wrapping_add(sym.address())),
            Ok("Py_Version") if version.is_none() => version = Some(bias.wrapping_add(sym.address())),
            _ => {}
        }
    }
    Some((runtime?, version))
}
