//! Where each CPython version keeps what gpumem reads (x86_64 and aarch64
//! alike: both LP64, same alignment): 3.10, 3.11
//! and 3.12 from their headers (checked field by field with offsetof
//! against Ubuntu jammy's 3.10, pyenv's 3.11 and Ubuntu noble's 3.12), 3.13 from the `_Py_DebugOffsets` the interpreter keeps at the start of
//! `_PyRuntime` for out-of-process debuggers.
use gpumem_common::python::{entry_kind, PyLayout, NO_CFRAME};

use super::memory::Memory;

/// Everything read in one version's interpreter.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters_head: u64,
    /// `PyInterpreterState.next` and `.threads.head`.
    pub interp_next: u64,
    pub interp_threads_head: u64,
    /// `PyThreadState.next` and `.native_thread_id` (3.10: `.thread_id`,
    /// the pthread_t, see `thread_id`).
    pub tstate_next: u64,
    pub tstate_native_thread_id: u64,
    pub thread_id: ThreadId,
    /// What the kernel's walk reads.
    pub frames: PyLayout,
    pub code: CodeLayout,
}

/// What a thread state says of its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadId {
    /// The kernel's thread id (3.11+).
    Native,
    /// Only the pthread_t (3.10): glibc's thread descriptor, which holds the
    /// kernel's thread id at `PTHREAD_TID` (checked on the main thread).
    Pthread,
}

/// Where glibc keeps the kernel thread id in `struct pthread` (the
/// pthread_t points at it): after a header of 24 words or, on x86_64, the
/// larger TCB that overlaps them, and the descriptor's list links. Read in
/// a traced process of the agent's own architecture.
pub const PTHREAD_TID: u64 = if cfg!(target_arch = "aarch64") { 0xd0 } else { 0x2d0 };

/// How a frame's instruction turns into a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// 3.11+: the frame points at its instruction; the location table (PEP 657).
    Locations,
    /// 3.10: the frame holds its instruction's index (`f_lasti`, code
    /// units); the line table of PEP 626 (byte deltas, line deltas).
    Pep626,
}

/// `PyCodeObject` and the string objects it points to.
#[derive(Clone, Debug)]
pub struct CodeLayout {
    pub lines: Lines,
    pub filename: u64,
    /// `co_qualname` (3.10 has only `co_name`, the bare function name).
    pub qualname: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// Where the instructions start (`co_code_adaptive`).
    pub code_adaptive: u64,
    /// `PyASCIIObject.length` and `.state`, and the size of the header
    /// before a compact ASCII string's characters.
    pub str_length: u64,
    pub str_state: u64,
    pub ascii_header: u64,
    /// `PyCompactUnicodeObject`'s size (before other compact strings' characters).
    pub compact_header: u64,
    /// `PyVarObject.ob_size` and `PyBytesObject.ob_sval`.
    pub bytes_size: u64,
    pub bytes_data: u64,
}

const V3_11: Layout = Layout {
    runtime_interpreters_head: 40,
    interp_next: 0,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_native_thread_id: 160,
    thread_id: ThreadId::Native,
    frames: PyLayout {
        tstate_frame: 56,
        cframe_current: 8,
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        entry_byte: 68,
        entry_kind: entry_kind::IS_ENTRY,
        _pad: 0,
    },
    code: CodeLayout {
        lines: Lines::Locations,
        filename: 112,
        qualname: 128,
        firstlineno: 72,
        linetable: 136,
        code_adaptive: 184,
        str_length: 16,
        str_state: 32,
        ascii_header: 48,
        compact_header: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.10: frame objects chained by `f_back`, each run by a native
/// `_PyEval_EvalFrameDefault` of its own; no `co_qualname`, no native
/// thread id; PEP 626 line tables. (`frame_instr` is `f_lasti`, an int:
/// the walk reads 8 bytes there, the agent keeps the low 32 bits.)
const V3_10: Layout = Layout {
    runtime_interpreters_head: 32,
    interp_next: 0,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_native_thread_id: 176,
    thread_id: ThreadId::Pthread,
    frames: PyLayout {
        tstate_frame: 24,
        cframe_current: NO_CFRAME,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 96,
        entry_byte: 96,
        entry_kind: entry_kind::EVERY_FRAME,
        _pad: 0,
    },
    code: CodeLayout {
        lines: Lines::Pep626,
        filename: 104,
        qualname: 112,
        firstlineno: 40,
        linetable: 120,
        code_adaptive: 0,
        str_length: 16,
        str_state: 32,
        ascii_header: 48,
        compact_header: 72,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// 3.12: the same structures as 3.11, moved; frames tell a C-stack shim by
/// their `owner` (as 3.13's do); compact ASCII strings lost `wstr`.
const V3_12: Layout = Layout {
    runtime_interpreters_head: 40,
    interp_next: 0,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_native_thread_id: 144,
    thread_id: ThreadId::Native,
    frames: PyLayout {
        tstate_frame: 56,
        cframe_current: 0,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        entry_byte: 70,
        entry_kind: entry_kind::CSTACK_OWNER,
        _pad: 0,
    },
    code: CodeLayout {
        lines: Lines::Locations,
        filename: 112,
        qualname: 128,
        firstlineno: 68,
        linetable: 136,
        code_adaptive: 192,
        str_length: 16,
        str_state: 32,
        ascii_header: 40,
        compact_header: 56,
        bytes_size: 16,
        bytes_data: 32,
    },
};

/// The layout of a CPython version, if gpumem knows it; `runtime` is the
/// process's `_PyRuntime` (3.13 describes itself there).
pub fn for_version(version: (u8, u8), mem: &impl Memory, runtime: u64) -> Option<Layout> {
    match version {
        (3, 10) => Some(V3_10.clone()),
        (3, 11) => Some(V3_11.clone()),
        (3, 12) => Some(V3_12.clone()),
        (3, 13) => from_debug_offsets(mem, runtime),
        _ => None,
    }
}

/// 3.13's `_Py_DebugOffsets` (Include/internal/pycore_runtime.h): a cookie,
/// then u64 fields, read here by their byte offsets in that struct.
fn from_debug_offsets(mem: &impl Memory, runtime: u64) -> Option<Layout> {
    let mut raw = [0u8; 584];
    mem.read(runtime, &mut raw).ok()?;
    if &raw[..8] != b"xdebugpy" {
        return None;
    }
    let at = |off: usize| u64::from_ne_bytes(raw[off..off + 8].try_into().unwrap_or_default());
    // version: PY_VERSION_HEX; free_threaded builds keep other layouts.
    if at(8) >> 16 != 0x030d || at(16) != 0 {
        return None;
    }
    let field = |off: usize| u32::try_from(at(off)).ok();
    let ascii = at(560);
    Some(Layout {
        runtime_interpreters_head: at(40),
        interp_next: at(64),
        interp_threads_head: at(72),
        tstate_next: at(168),
        tstate_native_thread_id: at(200),
        thread_id: ThreadId::Native,
        frames: PyLayout {
            tstate_frame: field(184)?,
            cframe_current: NO_CFRAME,
            frame_code: field(240)?,
            frame_previous: field(232)?,
            frame_instr: field(248)?,
            entry_byte: field(264)?,
            entry_kind: entry_kind::CSTACK_OWNER,
            _pad: 0,
        },
        code: CodeLayout {
            lines: Lines::Locations,
            filename: at(280),
            qualname: at(296),
            firstlineno: at(312),
            linetable: at(304),
            code_adaptive: at(344),
            str_length: at(552),
            str_state: at(544),
            ascii_header: ascii,
            // PyCompactUnicodeObject: the ASCII header, utf8_length, utf8.
            compact_header: ascii.wrapping_add(16),
            bytes_size: at(520),
            bytes_data: at(528),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// The offsets a C program built with a version's own headers prints
    /// (offsetof of each field gpumem reads), in `expected`'s order.
    fn offsets_from_headers(includes: &[String], entry_field: &str) -> Vec<u64> {
        compile_and_run(includes, &PROGRAM.replace("ENTRY_FIELD", entry_field), entry_field)
    }

    /// 3.11+'s structures (3.11 tells an entry frame by `is_entry`, 3.12 by `owner`).
    const PROGRAM: &str = r#"#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %zu\n", offsetof(_PyRuntimeState, interpreters.head), offsetof(PyInterpreterState, next),
         offsetof(PyInterpreterState, threads.head), offsetof(PyThreadState, next), offsetof(PyThreadState, native_thread_id),
         offsetof(PyThreadState, cframe), offsetof(_PyCFrame, current_frame));
  printf("%zu %zu %zu %zu\n", offsetof(_PyInterpreterFrame, f_code), offsetof(_PyInterpreterFrame, previous),
         offsetof(_PyInterpreterFrame, prev_instr), offsetof(_PyInterpreterFrame, ENTRY_FIELD));
  printf("%zu %zu %zu %zu %zu\n", offsetof(PyCodeObject, co_filename), offsetof(PyCodeObject, co_qualname),
         offsetof(PyCodeObject, co_firstlineno), offsetof(PyCodeObject, co_linetable), offsetof(PyCodeObject, co_code_adaptive));
  printf("%zu %zu %zu %zu %zu %zu\n", offsetof(PyASCIIObject, length), offsetof(PyASCIIObject, state), sizeof(PyASCIIObject),
         sizeof(PyCompactUnicodeObject), offsetof(PyVarObject, ob_size), offsetof(PyBytesObject, ob_sval));
  return 0;
}
"#;

    /// 3.10's: frame objects, `tstate_head`, `thread_id`, `co_name`.
    const PROGRAM_3_10: &str = r#"#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <frameobject.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu\n", offsetof(_PyRuntimeState, interpreters.head), offsetof(PyInterpreterState, next),
         offsetof(PyInterpreterState, tstate_head), offsetof(PyThreadState, next), offsetof(PyThreadState, thread_id),
         offsetof(PyThreadState, frame));
  printf("%zu %zu %zu\n", offsetof(PyFrameObject, f_code), offsetof(PyFrameObject, f_back), offsetof(PyFrameObject, f_lasti));
  printf("%zu %zu %zu %zu\n", offsetof(PyCodeObject, co_filename), offsetof(PyCodeObject, co_name),
         offsetof(PyCodeObject, co_firstlineno), offsetof(PyCodeObject, co_linetable));
  printf("%zu %zu %zu %zu %zu %zu\n", offsetof(PyASCIIObject, length), offsetof(PyASCIIObject, state), sizeof(PyASCIIObject),
         sizeof(PyCompactUnicodeObject), offsetof(PyVarObject, ob_size), offsetof(PyBytesObject, ob_sval));
  return 0;
}
"#;

    fn compile_and_run(includes: &[String], program: &str, tag: &str) -> Vec<u64> {
        let dir = std::env::temp_dir().join(format!("gpumem-pyoffsets-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("off.c");
        std::fs::write(&src, program).unwrap();
        let bin = dir.join("off");
        let mut cc = Command::new("cc");
        cc.args(includes.iter().map(|i| format!("-I{i}"))).arg(&src).arg("-o").arg(&bin);
        let cc = cc.output().expect("cc");
        assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
        let out = String::from_utf8(Command::new(&bin).output().unwrap().stdout).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        out.split_whitespace().map(|v| v.parse().unwrap()).collect()
    }

    fn expected(l: &Layout) -> Vec<u64> {
        let (f, c) = (&l.frames, &l.code);
        vec![
            l.runtime_interpreters_head,
            l.interp_next,
            l.interp_threads_head,
            l.tstate_next,
            l.tstate_native_thread_id,
            f.tstate_frame as u64,
            f.cframe_current as u64,
            f.frame_code as u64,
            f.frame_previous as u64,
            f.frame_instr as u64,
            f.entry_byte as u64,
            c.filename,
            c.qualname,
            c.firstlineno,
            c.linetable,
            c.code_adaptive,
            c.str_length,
            c.str_state,
            c.ascii_header,
            c.compact_header,
            c.bytes_size,
            c.bytes_data,
        ]
    }

    /// 3.11's offsets, against the interpreter's own headers (pyenv's).
    #[test]
    fn v3_11_matches_the_interpreters_headers() {
        let include = Command::new("python3")
            .args([
                "-c",
                "import sys, sysconfig; assert sys.version_info[:2] == (3, 11), sys.version; print(sysconfig.get_paths()['include'])",
            ])
            .output()
            .expect("python3 (pyenv's 3.11) on PATH");
        assert!(include.status.success(), "python3 must be 3.11: {}", String::from_utf8_lossy(&include.stderr));
        let include = String::from_utf8(include.stdout).unwrap().trim().to_string();
        assert_eq!(offsets_from_headers(&[include], "is_entry"), expected(&V3_11));
    }

    /// The include directories of a root's python3.X headers: the headers,
    /// and a directory holding only the root's x86_64-linux-gnu/python3.X
    /// (pyconfig.h includes it), not the root's C library headers.
    fn root_includes(root: &str, python: &str) -> (Vec<String>, std::path::PathBuf) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target").join(root).join("usr/include");
        assert!(root.join(python).join("internal").exists(), "no {python} headers in {}: `cargo xtask test` makes them", root.display());
        let arch = std::env::temp_dir().join(format!("gpumem-{python}-arch-{}", std::process::id()));
        std::fs::create_dir_all(arch.join("x86_64-linux-gnu")).unwrap();
        let link = arch.join("x86_64-linux-gnu").join(python);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(root.join("x86_64-linux-gnu").join(python), &link).unwrap();
        (vec![root.join(python).display().to_string(), arch.display().to_string()], arch)
    }

    /// 3.12's, against Ubuntu noble's python3.12 headers (libpython3.12-dev
    /// in the root `cargo xtask test` debootstraps into target/py312-root).
    #[test]
    fn v3_12_matches_the_interpreters_headers() {
        let (includes, arch) = root_includes("py312-root", "python3.12");
        let got = offsets_from_headers(&includes, "owner");
        let _ = std::fs::remove_dir_all(&arch);
        assert_eq!(got, expected(&V3_12));
    }

    /// 3.10's, against Ubuntu jammy's (target/py310-root).
    #[test]
    fn v3_10_matches_the_interpreters_headers() {
        let (includes, arch) = root_includes("py310-root", "python3.10");
        let got = compile_and_run(&includes, PROGRAM_3_10, "3.10");
        let _ = std::fs::remove_dir_all(&arch);
        let (l, f, c) = (&V3_10, &V3_10.frames, &V3_10.code);
        let want = [
            l.runtime_interpreters_head,
            l.interp_next,
            l.interp_threads_head,
            l.tstate_next,
            l.tstate_native_thread_id,
            f.tstate_frame as u64,
            f.frame_code as u64,
            f.frame_previous as u64,
            f.frame_instr as u64,
            c.filename,
            c.qualname,
            c.firstlineno,
            c.linetable,
            c.str_length,
            c.str_state,
            c.ascii_header,
            c.compact_header,
            c.bytes_size,
            c.bytes_data,
        ];
        assert_eq!(got, want);
    }
}
