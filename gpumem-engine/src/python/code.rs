//! Code objects to function, file and line, read from the process's memory
//! once per (process, code object) and cached. Line numbers come from the
//! code object's location table (3.11's format, PEP 657).
use std::collections::HashMap;

use gpumem_common::python::{PyFrameRef, ENTRY};

use super::{
    layout::{CodeLayout, Lines},
    memory::{Counted, Memory, ReadBudget},
    Interpreter,
};
use crate::{model::degraded::Reason, procfs::ProcessMemory};

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

pub struct CodeInfo {
    pub(crate) qualname: String,
    pub(crate) filename: String,
    pub(crate) firstlineno: i32,
    pub(crate) linetable: Vec<u8>,
    /// Lines found so far, by instruction index (a table is read from its
    /// start for each lookup, and a loop allocates from the same few).
    lines: HashMap<u64, Option<u32>>,
}

/// Longest location table read from a process, and the characters of a
/// name kept (a longer one is cut, marked `…`: every output shows names).
const MAX_READ: u64 = 64 * 1024;
pub const MAX_NAME_CHARS: u64 = 1024;
/// Code objects cached per process, at most, and the bytes their names and
/// tables hold: past either the cache starts over (re-reads are charged
/// to the process's read budget).
pub const MAX_CODES: usize = 16384;
pub const MAX_CACHED_BYTES: usize = 4 << 20;
/// Lines kept per code object (by instruction).
const MAX_LINES: usize = 1024;
/// A code object that could not be read is read again after this long: the
/// read may have raced the interpreter (an object being made or freed), and
/// a stack resolved with it is not final until it reads.
const RETRY_FAILED: std::time::Duration = std::time::Duration::from_secs(1);

/// A code object as read, or when its read failed.
enum Code {
    Read(CodeInfo),
    Failed(std::time::Instant),
}

/// A Python process's interpreter and its code objects read so far.
struct ProcessCodes {
    interp: Interpreter,
    codes: HashMap<u64, Code>,
    cached_bytes: usize,
    budget: ReadBudget,
    /// Changes whenever the code objects cached start over (see `Resolved`).
    generation: u64,
}

/// A stack's Python frames, resolved, and whether the same frame references
/// would resolve the same way for as long as `generation` holds: not where
/// the read budget refused a code object (it is read again once refilled),
/// a code object's read failed (read again after `RETRY_FAILED`), or the
/// process's interpreter is not known yet.
pub struct Resolved {
    pub frames: Vec<PyFrame>,
    pub generation: Option<u64>,
}

/// Resolves the Python frames of the processes whose interpreter it was
/// given (the thread tracker finds them: the kernel walks no process's
/// frames before that).
#[derive(Default)]
pub struct Resolver {
    processes: HashMap<u32, ProcessCodes>,
    /// Processes over their read budget since the last `take_degraded`.
    degraded: Vec<(u32, Reason, String)>,
    /// The last generation handed out (see `ProcessCodes::generation`).
    generations: u64,
    /// Code objects let go to stay within `MAX_CODES` and `MAX_CACHED_BYTES`.
    evicted: u64,
}

impl Resolver {
    pub fn add(&mut self, interp: Interpreter) {
        self.generations += 1;
        let codes =
            ProcessCodes { interp, codes: HashMap::new(), cached_bytes: 0, budget: ReadBudget::default(), generation: self.generations };
        self.processes.insert(codes.interp.pid, codes);
    }

    /// The code objects cached, as a report (the bound is per process).
    pub fn cache(&self) -> crate::heap::Cache {
        let entries = self.processes.values().map(|p| p.codes.len()).sum();
        crate::heap::Cache::new("python_code_objects", entries, MAX_CODES, self.evicted)
    }

    /// The generation of a process's code objects (see `Resolved`).
    pub fn generation(&self, pid: u32) -> Option<u64> {
        self.processes.get(&pid).map(|p| p.generation)
    }

    /// What the code-object caches take on the agent's heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        let tables = crate::heap::hash_table::<u32, ProcessCodes>(self.processes.capacity());
        tables
            + self.processes.values().map(|p| crate::heap::hash_table::<u64, Code>(p.codes.capacity()) + p.cached_bytes as u64).sum::<u64>()
    }

    /// Resolves a stack's Python frames (innermost first). A code object
    /// not cached is read only while the process's read budget lasts; past
    /// it the frame is `?` (and read again once the budget refills).
    pub fn resolve(&mut self, pid: u32, frames: impl Iterator<Item = PyFrameRef>) -> Resolved {
        self.resolve_in(pid, frames, || ProcessMemory::open(pid).ok())
    }

    /// `resolve`, reading the memory `open` gives.
    fn resolve_in<M: Memory>(&mut self, pid: u32, frames: impl Iterator<Item = PyFrameRef>, open: impl FnOnce() -> Option<M>) -> Resolved {
        let Some(p) = self.processes.get_mut(&pid) else { return Resolved { frames: Vec::new(), generation: None } };
        // Opened for code objects not seen yet only: the cache still answers
        // once the process is gone (its last stacks are read after its exit).
        let mut open = Some(open);
        let mut mem: Option<Option<M>> = None;
        let l = &p.interp.layout.code;
        let now = std::time::Instant::now();
        let mut refused = false;
        let mut failed = false;
        let resolved = frames
            .map(|f| {
                if p.codes.len() >= MAX_CODES || p.cached_bytes >= MAX_CACHED_BYTES {
                    self.evicted += p.codes.len() as u64;
                    p.codes.clear();
                    p.cached_bytes = 0;
                    self.generations += 1;
                    p.generation = self.generations;
                }
                let stale = match p.codes.get(&f.code) {
                    None => true,
                    Some(Code::Failed(at)) => now.duration_since(*at) >= RETRY_FAILED,
                    Some(Code::Read(_)) => false,
                };
                if stale {
                    if !p.budget.allows(now) {
                        refused = true;
                        return PyFrame::unknown(f.instr & ENTRY != 0);
                    }
                    let read = mem.get_or_insert_with(|| open.take().and_then(|open| open())).as_ref().and_then(|mem| {
                        let counted = Counted::new(mem);
                        let info = read_code(&counted, l, f.code);
                        p.budget.charge(counted.bytes.get());
                        info
                    });
                    p.cached_bytes += read.as_ref().map_or(0, CodeInfo::size);
                    p.codes.insert(f.code, read.map_or(Code::Failed(now), Code::Read));
                }
                let Some(info) = p.codes.get_mut(&f.code) else { return PyFrame::unknown(f.instr & ENTRY != 0) };
                let instr = f.instr & !ENTRY;
                // The instruction's index in code units.
                let index = match l.lines {
                    Lines::Locations => instr.checked_sub(f.code.wrapping_add(l.code_adaptive)).map(|b| b / 2),
                    // f_lasti, an int (−1 before the first instruction).
                    Lines::Pep626 => u64::try_from(instr as u32 as i32).ok(),
                };
                match info {
                    Code::Read(c) => {
                        let line = match index {
                            Some(i) => {
                                if c.lines.len() >= MAX_LINES {
                                    c.lines.clear();
                                }
                                *c.lines.entry(i).or_insert_with(|| match l.lines {
                                    Lines::Locations => line_of(&c.linetable, c.firstlineno, i),
                                    Lines::Pep626 => line_of_pep626(&c.linetable, c.firstlineno, i.saturating_mul(2)),
                                })
                            }
                            None => None,
                        };
                        PyFrame { function: c.qualname.clone(), file: c.filename.clone(), line, entry: f.instr & ENTRY != 0 }
                    }
                    Code::Failed(_) => {
                        failed = true;
                        PyFrame::unknown(f.instr & ENTRY != 0)
                    }
                }
            })
            .collect::<Vec<_>>();
        if refused {
            let why = format!(
                "its frames asked more of its memory than {} KiB/s (bursts of {} KiB)",
                super::memory::READ_BYTES_PER_SECOND >> 10,
                super::memory::READ_BURST_BYTES >> 10
            );
            self.degraded.push((pid, Reason::PythonReads, why));
        }
        Resolved { frames: resolved, generation: (!refused && !failed).then_some(p.generation) }
    }

    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    /// The processes over their read budget since the last call.
    pub fn take_degraded(&mut self) -> Vec<(u32, Reason, String)> {
        std::mem::take(&mut self.degraded)
    }

    pub fn has_degraded(&self) -> bool {
        !self.degraded.is_empty()
    }
}

impl PyFrame {
    fn unknown(entry: bool) -> Self {
        PyFrame { function: "?".into(), file: "?".into(), line: None, entry }
    }
}

impl CodeInfo {
    /// Bytes it keeps (what the per-process cache bound counts).
    fn size(&self) -> usize {
        self.qualname.len() + self.filename.len() + self.linetable.len() + self.lines.len() * 16 + 64
    }
}

/// A code object's names, first line and line table (None where a read
/// fails: the process may have made any pointer or size up).
pub fn read_code(mem: &impl Memory, l: &CodeLayout, code: u64) -> Option<CodeInfo> {
    let qualname = read_str(mem, l, mem.u64(code.wrapping_add(l.qualname))?)?;
    let filename = read_str(mem, l, mem.u64(code.wrapping_add(l.filename))?)?;
    let firstlineno = mem.u32(code.wrapping_add(l.firstlineno))? as i32;
    let table = mem.u64(code.wrapping_add(l.linetable))?;
    let size = mem.u64(table.wrapping_add(l.bytes_size))?.min(MAX_READ);
    let mut linetable = vec![0u8; size as usize];
    mem.read(table.wrapping_add(l.bytes_data), &mut linetable).ok()?;
    Some(CodeInfo { qualname, filename, firstlineno, linetable, lines: HashMap::new() })
}

/// A `str` object's text: compact strings, ASCII or of 1, 2 or 4 bytes per
/// character (3.11's layout).
pub fn read_str(mem: &impl Memory, l: &CodeLayout, s: u64) -> Option<String> {
    let whole = mem.u64(s.wrapping_add(l.str_length))?;
    let length = whole.min(MAX_NAME_CHARS);
    let state = mem.u32(s.wrapping_add(l.str_state))?;
    // state: interned (2 bits), kind (3 bits), compact (1), ascii (1).
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
    if !compact || !(1..=4).contains(&kind) || kind == 3 {
        return None;
    }
    let start = if ascii { s.wrapping_add(l.ascii_header) } else { s.wrapping_add(l.compact_header) };
    let mut raw = vec![0u8; (length * kind as u64) as usize];
    mem.read(start, &mut raw).ok()?;
    let mut text: String = match kind {
        1 => raw.iter().map(|&b| b as char).collect(),
        2 => raw.as_chunks::<2>().0.iter().filter_map(|c| char::from_u32(u16::from_ne_bytes(*c) as u32)).collect(),
        _ => raw.as_chunks::<4>().0.iter().filter_map(|c| char::from_u32(u32::from_ne_bytes(*c))).collect(),
    };
    if whole > length {
        text.push('…');
    }
    Some(text)
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
    use super::{
        super::{layout, memory::Image},
        *,
    };

    /// `n` code objects (3.11) of one function, each with a location table
    /// of `table_bytes`, in memory from `BASE`.
    const BASE: u64 = 0x10000;
    fn codes(n: u64, table_bytes: u64) -> (Vec<u8>, Interpreter) {
        let l = layout::for_version((3, 11), &Image { base: 0, bytes: &[] }, 0).unwrap();
        let c = &l.code;
        let (name, table) = (BASE + n * 0x100, BASE + n * 0x100 + 0x100);
        let mut m = vec![0u8; (n * 0x100 + 0x200 + table_bytes) as usize];
        let mut put = |addr: u64, bytes: &[u8]| {
            let at = (addr - BASE) as usize;
            m[at..at + bytes.len()].copy_from_slice(bytes);
        };
        put(name + c.str_length, &3u64.to_ne_bytes());
        put(name + c.str_state, &((1u32 << 5) | (1 << 6) | (1 << 2)).to_ne_bytes());
        put(name + c.ascii_header, b"run");
        put(table + c.bytes_size, &table_bytes.to_ne_bytes());
        put(table + c.bytes_data, &[0x80 | (11 << 3) | 3, 4, 9]);
        for k in 0..n {
            let code = BASE + k * 0x100;
            put(code + c.qualname, &name.to_ne_bytes());
            put(code + c.filename, &name.to_ne_bytes());
            put(code + c.firstlineno, &1u32.to_ne_bytes());
            put(code + c.linetable, &table.to_ne_bytes());
        }
        (m, Interpreter { pid: 7, runtime: 0, layout: l })
    }

    #[test]
    fn a_process_whose_frames_read_past_its_budget_gets_question_marks_and_is_named() {
        // 300 code objects of 64 KiB tables each: 19 MiB asked at once,
        // past the 2 MiB burst.
        let (m, interp) = codes(300, 64 << 10);
        let mut r = Resolver::default();
        r.add(interp.clone());
        let frames = (0..300).map(|k| PyFrameRef { code: BASE + k * 0x100, instr: BASE + k * 0x100 + 184 });
        let first = r.resolve_in(7, frames.clone(), || Some(Image { base: BASE, bytes: &m }));
        assert_eq!(first.generation, None, "refused frames are read again later: not final");
        let out = first.frames;
        let read = out.iter().filter(|f| f.function == "run").count();
        assert!((25..40).contains(&read), "about 2 MiB of 64 KiB objects read: {read}");
        assert!(out[..read].iter().all(|f| f.line == Some(2)));
        assert!(out[read..].iter().all(|f| f.function == "?"), "the rest refused");
        let degraded = r.take_degraded();
        assert_eq!(degraded.len(), 1);
        assert_eq!((degraded[0].0, degraded[0].1), (7, Reason::PythonReads));
        // What was read stays answered without reading again.
        let again = r.resolve_in(7, frames.take(read), || None::<Image>);
        assert!(again.frames.iter().all(|f| f.function == "run"));
        assert_eq!(again.generation, r.generation(7), "all answered: final");
        assert!(r.take_degraded().is_empty());
        // Another process is not charged for this one.
        let (small, mut other) = codes(10, 64);
        other.pid = 8;
        r.add(other);
        let out =
            r.resolve_in(8, (0..10).map(|k| PyFrameRef { code: BASE + k * 0x100, instr: 0 }), || Some(Image { base: BASE, bytes: &small }));
        assert!(out.frames.iter().all(|f| f.function == "run"));
        assert!(out.generation.is_some() && out.generation != r.generation(7));
        // A process whose interpreter is not known yet: nothing final.
        let unknown = r.resolve_in(9, std::iter::once(PyFrameRef { code: BASE, instr: 0 }), || None::<Image>);
        assert!(unknown.frames.is_empty() && unknown.generation.is_none());
    }

    #[test]
    fn a_code_object_that_failed_to_read_is_read_again_later_and_its_stack_is_not_final() {
        let (m, interp) = codes(1, 64);
        let mut r = Resolver::default();
        r.add(interp);
        let frame = || std::iter::once(PyFrameRef { code: BASE, instr: 0 });
        // Read while the object was not there yet (all zeros: its name pointer is null).
        let blank = vec![0u8; m.len()];
        let first = r.resolve_in(7, frame(), || Some(Image { base: BASE, bytes: &blank }));
        assert_eq!((first.frames[0].function.as_str(), first.generation), ("?", None));
        // Within the retry interval nothing is read again (the open is not even asked).
        let soon = r.resolve_in(7, frame(), || -> Option<Image> { panic!("read again at once") });
        assert_eq!((soon.frames[0].function.as_str(), soon.generation), ("?", None));
        assert!(r.take_degraded().is_empty(), "a failed read is not the read budget's refusal");
        // After it, the object is read again and the stack is final.
        let Some(Code::Failed(at)) = r.processes.get_mut(&7).unwrap().codes.get_mut(&BASE) else { panic!("kept as failed") };
        *at -= RETRY_FAILED;
        let later = r.resolve_in(7, frame(), || Some(Image { base: BASE, bytes: &m }));
        assert_eq!(later.frames[0].function, "run");
        assert_eq!(later.generation, r.generation(7));
    }

    #[test]
    fn the_cache_of_one_process_stays_within_its_bytes() {
        let (m, interp) = codes(200, 60 << 10);
        let mut r = Resolver::default();
        r.add(interp);
        for k in 0..200 {
            r.resolve_in(7, std::iter::once(PyFrameRef { code: BASE + k * 0x100, instr: 0 }), || Some(Image { base: BASE, bytes: &m }));
            assert!(r.processes[&7].cached_bytes <= MAX_CACHED_BYTES + (64 << 10));
        }
    }

    #[test]
    fn a_cache_that_starts_over_is_a_new_generation() {
        let n = MAX_CODES as u64 + 1;
        let (m, interp) = codes(n, 16);
        let mut r = Resolver::default();
        r.add(interp);
        let first = r.generation(7);
        let frames = (0..n).map(|k| PyFrameRef { code: BASE + k * 0x100, instr: 0 });
        let out = r.resolve_in(7, frames, || Some(Image { base: BASE, bytes: &m }));
        assert!(out.frames.iter().all(|f| f.function == "run"), "within the read budget");
        assert!(first.is_some() && r.generation(7) != first, "full at the last one: started over");
        assert_eq!(out.generation, r.generation(7));
    }

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
