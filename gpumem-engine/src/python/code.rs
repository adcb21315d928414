//! Code objects to function, file and line, read from the process's memory
//! once per (process, code object) and cached. Line numbers come from the
//! code object's location table (3.11's format, PEP 657).
use std::collections::HashMap;

use gpumem_common::python::{PyFrameRef, ENTRY};

use super::{
    layout::{CodeLayout, Lines},
    Interpreter,
};
use crate::procfs::ProcessMemory;

/// One Python frame of a stack, resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// The qualified name (`Class.method`), `?` where it could not be read.
    pub function: String,
    pub file: String,
    pub line: Option<u32>,
    /// The first frame its native `_PyEval_EvalFrameDefault` call ran.
    pub entry: bool,
}

struct CodeInfo {
    qualname: String,
    filename: String,
    firstlineno: i32,
    linetable: Vec<u8>,
    /// Lines found so far, by instruction index (a table is read from its
    /// start for each lookup, and a loop allocates from the same few).
    lines: HashMap<u64, Option<u32>>,
}

/// Longest string or location table read from a process.
const MAX_READ: u64 = 64 * 1024;
/// Code objects cached per process, at most.
const MAX_CODES: usize = 16384;

/// A Python process's interpreter and its code objects read so far (None:
/// unreadable).
type ProcessCodes = (Interpreter, HashMap<u64, Option<CodeInfo>>);

/// Resolves the Python frames of the processes whose interpreter it was
/// given (the thread tracker finds them: the kernel walks no process's
/// frames before that).
#[derive(Default)]
pub struct Resolver {
    processes: HashMap<u32, ProcessCodes>,
}

impl Resolver {
    pub fn add(&mut self, interp: Interpreter) {
        self.processes.insert(interp.pid, (interp, HashMap::new()));
    }

    /// Resolves a stack's Python frames (innermost first).
    pub fn resolve(&mut self, pid: u32, frames: impl Iterator<Item = PyFrameRef>) -> Vec<PyFrame> {
        let Some((interp, codes)) = self.processes.get_mut(&pid) else { return Vec::new() };
        // Opened for code objects not seen yet only: the cache still answers
        // once the process is gone (its last stacks are read after its exit).
        let mut mem: Option<Option<ProcessMemory>> = None;
        let l = &interp.layout.code;
        frames
            .map(|f| {
                if codes.len() >= MAX_CODES {
                    codes.clear();
                }
                let info = codes.entry(f.code).or_insert_with(|| {
                    let mem = mem.get_or_insert_with(|| ProcessMemory::open(pid).ok()).as_ref()?;
                    read_code(mem, l, f.code)
                });
                let instr = f.instr & !ENTRY;
                // The instruction's index in code units.
                let index = match l.lines {
                    Lines::Locations => instr.checked_sub(f.code + l.code_adaptive).map(|b| b / 2),
                    // f_lasti, an int (−1 before the first instruction).
                    Lines::Pep626 => u64::try_from(instr as u32 as i32).ok(),
                };
                match info {
                    Some(c) => {
                        let line = match index {
                            Some(i) => *c.lines.entry(i).or_insert_with(|| match l.lines {
                                Lines::Locations => line_of(&c.linetable, c.firstlineno, i),
                                Lines::Pep626 => line_of_pep626(&c.linetable, c.firstlineno, i * 2),
                            }),
                            None => None,
                        };
                        PyFrame { function: c.qualname.clone(), file: c.filename.clone(), line, entry: f.instr & ENTRY != 0 }
                    }
                    None => PyFrame { function: "?".into(), file: "?".into(), line: None, entry: f.instr & ENTRY != 0 },
                }
            })
            .collect()
    }

    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }
}

fn read_code(mem: &ProcessMemory, l: &CodeLayout, code: u64) -> Option<CodeInfo> {
    let qualname = read_str(mem, l, mem.u64(code + l.qualname)?)?;
    let filename = read_str(mem, l, mem.u64(code + l.filename)?)?;
    let firstlineno = mem.u32(code + l.firstlineno)? as i32;
    let table = mem.u64(code + l.linetable)?;
    let size = mem.u64(table + l.bytes_size)?.min(MAX_READ);
    let mut linetable = vec![0u8; size as usize];
    mem.read(table + l.bytes_data, &mut linetable).ok()?;
    Some(CodeInfo { qualname, filename, firstlineno, linetable, lines: HashMap::new() })
}

/// A `str` object's text: compact strings, ASCII or of 1, 2 or 4 bytes per
/// character (3.11's layout).
fn read_str(mem: &ProcessMemory, l: &CodeLayout, s: u64) -> Option<String> {
    let length = mem.u64(s + l.str_length)?.min(MAX_READ);
    let state = mem.u32(s + l.str_state)?;
    // state: interned (2 bits), kind (3 bits), compact (1), ascii (1).
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
    if !compact || !(1..=4).contains(&kind) || kind == 3 {
        return None;
    }
    let start = if ascii { s + l.ascii_header } else { s + l.compact_header };
    let mut raw = vec![0u8; (length * kind as u64) as usize];
    mem.read(start, &mut raw).ok()?;
    Some(match kind {
        1 => raw.iter().map(|&b| b as char).collect(),
        2 => raw.as_chunks::<2>().0.iter().filter_map(|c| char::from_u32(u16::from_ne_bytes(*c) as u32)).collect(),
        _ => raw.as_chunks::<4>().0.iter().filter_map(|c| char::from_u32(u32::from_ne_bytes(*c))).collect(),
    })
}

/// The line of instruction `index` (in code units) from a 3.11+ location
/// table; None where the table says the instruction has no location.
pub fn line_of(table: &[u8], firstlineno: i32, index: u64) -> Option<u32> {
    let mut line = firstlineno as i64;
    let mut addr = 0u64;
    let mut i = 0;
    while i < table.len() {
        let first = table[i];
        if first & 0x80 == 0 {
            return None; // not the start of an entry: a garbled table
        }
        i += 1;
        let code = (first >> 3) & 15;
        let length = (first & 7) as u64 + 1;
        let delta: i64 = match code {
            15 => 0,
            14 => {
                let d = svarint(table, &mut i)?;
                for _ in 0..3 {
                    varint(table, &mut i)?;
                }
                d
            }
            13 => svarint(table, &mut i)?,
            10..=12 => {
                i += 2;
                code as i64 - 10
            }
            _ => {
                i += 1;
                0
            }
        };
        // The table is read from the process: its deltas may be anything.
        line = line.saturating_add(delta);
        if index < addr + length {
            return (code != 15).then_some(line.clamp(0, u32::MAX as i64) as u32);
        }
        addr += length;
    }
    None
}

/// The line of the instruction at byte offset `addr` from a 3.10 line
/// table (PEP 626: pairs of an unsigned byte delta and a signed line
/// delta, −128 for "no line"; empty ranges only move the line).
pub fn line_of_pep626(table: &[u8], firstlineno: i32, addr: u64) -> Option<u32> {
    let (mut line, mut end) = (firstlineno as i64, 0u64);
    for pair in table.as_chunks::<2>().0 {
        let start = end;
        end += pair[0] as u64;
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += delta as i64;
            Some(line.max(0) as u32)
        };
        if start <= addr && addr < end {
            return this;
        }
    }
    None
}

fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let b = *t.get(*i)?;
        *i += 1;
        v |= ((b & 63) as u64) << shift;
        shift += 6;
        if b & 64 == 0 || shift > 60 {
            return Some(v);
        }
    }
}

fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
    let v = varint(t, i)?;
    Some(if v & 1 == 1 { -((v >> 1) as i64) } else { (v >> 1) as i64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_tables_give_lines() {
        // def f():        (firstlineno 1)
        //     x = 1       one-line form, line +1, 2 code units
        //     return x    one-line form, line +1, 3 code units
        // then a no-location entry of 1 unit and a long form: line +5 over 2 units.
        let table = [0x80 | (11 << 3) | 1, 4, 9, 0x80 | (11 << 3) | 2, 4, 12, 0x80 | (15 << 3), 0x80 | (14 << 3) | 1, 10, 0, 1, 1];
        assert_eq!(line_of(&table, 1, 0), Some(2));
        assert_eq!(line_of(&table, 1, 1), Some(2));
        assert_eq!(line_of(&table, 1, 2), Some(3));
        assert_eq!(line_of(&table, 1, 4), Some(3));
        assert_eq!(line_of(&table, 1, 5), None, "no location");
        assert_eq!(line_of(&table, 1, 6), Some(8));
        assert_eq!(line_of(&table, 1, 99), None, "beyond the table");
        assert_eq!(line_of(&[0x01], 1, 0), None, "garbled");
    }

    #[test]
    fn pep_626_line_tables_give_lines() {
        // firstlineno 10: bytes 0-3 line 11, an empty range moving to 13,
        // bytes 4-9 line 13, bytes 10-11 no line, bytes 12-13 line 12.
        let table = [4, 1, 0, 2, 6, 0, 2, 0x80, 2, 0xff];
        assert_eq!(line_of_pep626(&table, 10, 0), Some(11));
        assert_eq!(line_of_pep626(&table, 10, 3), Some(11));
        assert_eq!(line_of_pep626(&table, 10, 4), Some(13));
        assert_eq!(line_of_pep626(&table, 10, 9), Some(13));
        assert_eq!(line_of_pep626(&table, 10, 10), None, "no line");
        assert_eq!(line_of_pep626(&table, 10, 12), Some(12));
        assert_eq!(line_of_pep626(&table, 10, 14), None, "beyond the table");
    }
}
