//! Where each CPython version keeps what gpumem reads (x86_64): 3.11 and
//! 3.12 from their headers (checked field by field with offsetof against
//! pyenv's 3.11 and Ubuntu noble's 3.12), 3.13 from the `_Py_DebugOffsets` the interpreter keeps at the start of
//! `_PyRuntime` for out-of-process debuggers.
use gpumem_common::python::{entry_kind, PyLayout, NO_CFRAME};

use crate::procfs::ProcessMemory;

/// Everything read in one version's interpreter.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters_head: u64,
    /// `PyInterpreterState.next` and `.threads.head`.
    pub interp_next: u64,
    pub interp_threads_head: u64,
    /// `PyThreadState.next` and `.native_thread_id`.
    pub tstate_next: u64,
    pub tstate_native_thread_id: u64,
    /// What the kernel's walk reads.
    pub frames: PyLayout,
    pub code: CodeLayout,
}

/// `PyCodeObject` and the string objects it points to.
#[derive(Clone, Debug)]
pub struct CodeLayout {
    pub filename: u64,
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

/// 3.12: the same structures as 3.11, moved; frames tell a C-stack shim by
/// their `owner` (as 3.13's do); compact ASCII strings lost `wstr`.
const V3_12: Layout = Layout {
    runtime_interpreters_head: 40,
    interp_next: 0,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_native_thread_id: 144,
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
pub fn for_version(version: (u8, u8), mem: &ProcessMemory, runtime: u64) -> Option<Layout> {
    match version {
        (3, 11) => Some(V3_11.clone()),
        (3, 12) => Some(V3_12.clone()),
        (3, 13) => from_debug_offsets(mem, runtime),
        _ => None,
    }
}

/// 3.13's `_Py_DebugOffsets` (Include/internal/pycore_runtime.h): a cookie,
/// then u64 fields, read here by their byte offsets in that struct.
fn from_debug_offsets(mem: &ProcessMemory, runtime: u64) -> Option<Layout> {
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
            filename: at(280),
            qualname: at(296),
            firstlineno: at(312),
            linetable: at(304),
            code_adaptive: at(344),
            str_length: at(552),
            str_state: at(544),
            ascii_header: ascii,
            // PyCompactUnicodeObject: the ASCII header, utf8_length, utf8.
            compact_header: ascii + 16,
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
        let dir = std::env::temp_dir().join(format!("gpumem-pyoffsets-{}-{entry_field}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("off.c");
        let program = r#"#define Py_BUILD_CORE 1
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
        std::fs::write(&src, program.replace("ENTRY_FIELD", entry_field)).unwrap();
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

    /// 3.12's, against Ubuntu noble's python3.12 headers (libpython3.12-dev
    /// in the root `cargo xtask test` debootstraps into target/py312-root).
    #[test]
    fn v3_12_matches_the_interpreters_headers() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/py312-root/usr/include");
        assert!(root.join("python3.12/internal").exists(), "no Python 3.12 headers in {}: `cargo xtask test` makes them", root.display());
        // pyconfig.h includes <x86_64-linux-gnu/python3.12/pyconfig.h>: that
        // directory alone, not the root's C library headers.
        let arch = std::env::temp_dir().join(format!("gpumem-py312-arch-{}", std::process::id()));
        std::fs::create_dir_all(arch.join("x86_64-linux-gnu")).unwrap();
        let link = arch.join("x86_64-linux-gnu/python3.12");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(root.join("x86_64-linux-gnu/python3.12"), &link).unwrap();
        let got = offsets_from_headers(&[root.join("python3.12").display().to_string(), arch.display().to_string()], "owner");
        let _ = std::fs::remove_dir_all(&arch);
        assert_eq!(got, expected(&V3_12));
    }
}
