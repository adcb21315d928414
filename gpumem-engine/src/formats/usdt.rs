//! USDT probes (SystemTap SDT notes in `.note.stapsdt`): where each probe of
//! a library is, the file offset of its semaphore (the counter the kernel
//! raises while a uprobe with `ref_ctr_offset` is attached, so that
//! semaphore-gated probes such as PyTorch's fire at all), and how to read
//! its arguments from the registers and memory at the probe. A building
//! block for PyTorch's `pytorch:malloc`/`pytorch:free` (issue 15, part 2).
use std::path::Path;

use object::{Object as _, ObjectSection as _, ObjectSegment as _};

#[derive(Debug, thiserror::Error)]
pub enum UsdtError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not an ELF file: {source}")]
    Parse { path: String, source: object::Error },
    #[error("{path}: probe {provider}:{name}: argument `{spec}`: {why}")]
    Argument { path: String, provider: String, name: String, spec: String, why: String },
    #[error("{path}: probe {provider}:{name}: {why}")]
    Misplaced { path: String, provider: String, name: String, why: String },
    #[error("{path}: {why}")]
    OverBudget { path: String, why: String },
    #[error("{path} is built for {arch}, whose registers gpumem does not read")]
    Arch { path: String, arch: String },
}

impl UsdtError {
    /// Past a budget (not merely malformed): the processes that map the
    /// file are degraded for it.
    pub fn over_budget(&self) -> bool {
        matches!(self, UsdtError::OverBudget { .. })
    }
}

/// Bytes of `.note.stapsdt` read of one library, and probes kept of it
/// (libc10_cuda has 6, libpython's ~20, the largest seen a few hundred).
pub const MAX_NOTE_BYTES: u64 = 4 << 20;
pub const MAX_PROBES: usize = 4096;

/// ELF program header flags.
const PF_X: u32 = 1;
const PF_W: u32 = 2;

/// The instruction set of a file's probes: their operands name its
/// registers, at offsets of its `struct pt_regs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arch {
    #[default]
    X86_64,
    Aarch64,
}

impl Arch {
    /// The syntax of an ELF machine's probes; None for one gpumem does not read.
    pub fn of(machine: object::Architecture) -> Option<Arch> {
        match machine {
            object::Architecture::X86_64 => Some(Arch::X86_64),
            object::Architecture::Aarch64 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// The machine this agent runs on (the eBPF program reads its pt_regs).
    pub fn host() -> Arch {
        Arch::of(super::host_architecture()).unwrap_or_default()
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Parses one argument spec in this instruction set's syntax.
    pub fn parse_arg(self, spec: &str) -> Result<UsdtArg, String> {
        match self {
            Arch::X86_64 => parse_arg(spec),
            Arch::Aarch64 => super::usdt_aarch64::parse_arg(spec),
        }
    }

    /// How a location reads in this instruction set's syntax.
    pub fn describe(self, location: &Location) -> String {
        match (self, *location) {
            (Arch::Aarch64, _) => super::usdt_aarch64::describe(location),
            (Arch::X86_64, Location::Register { pt_regs, high_byte: false }) => format!("%{}", register_name(pt_regs)),
            (Arch::X86_64, Location::Register { pt_regs, high_byte: true }) => format!("%{} (second byte)", register_name(pt_regs)),
            (Arch::X86_64, Location::Constant(c)) => format!("${c}"),
            (Arch::X86_64, Location::Memory { pt_regs, displacement }) => format!("{displacement}(%{})", register_name(pt_regs)),
        }
    }
}

/// One probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// The instruction set its arguments are written for.
    pub arch: Arch,
    /// File offset of the probed instruction (where the uprobe goes).
    pub offset: u64,
    /// File offset of the semaphore (`ref_ctr_offset`), if the probe has one.
    pub semaphore: Option<u64>,
    pub args: Vec<UsdtArg>,
}

/// One argument: its size in bytes, signedness and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsdtArg {
    pub size: u8,
    pub signed: bool,
    pub location: Location,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// A register (its offset in `struct pt_regs`; `high_byte` for ah..dh).
    Register { pt_regs: u16, high_byte: bool },
    /// A constant (`$5`).
    Constant(i64),
    /// Memory at a register plus a displacement (`-56(%rbp)`).
    Memory { pt_regs: u16, displacement: i64 },
}

/// Offsets of the x86_64 general registers in `struct pt_regs`, by their
/// 64-bit names.
const PT_REGS: [(&str, u16); 17] = [
    ("r15", 0),
    ("r14", 8),
    ("r13", 16),
    ("r12", 24),
    ("rbp", 32),
    ("rbx", 40),
    ("r11", 48),
    ("r10", 56),
    ("r9", 64),
    ("r8", 72),
    ("rax", 80),
    ("rcx", 88),
    ("rdx", 96),
    ("rsi", 104),
    ("rdi", 112),
    ("rip", 128),
    ("rsp", 152),
];

/// The 64-bit name of the register at a pt_regs offset.
pub fn register_name(pt_regs: u16) -> &'static str {
    PT_REGS.iter().find(|&&(_, off)| off == pt_regs).map_or("?", |&(name, _)| name)
}

/// A register by any of its names (rax, eax, ax, al, ah; r8, r8d, r8w, r8b):
/// its pt_regs offset and whether it is a high byte.
fn register(name: &str) -> Option<(u16, bool)> {
    let full = |n: &str| PT_REGS.iter().find(|(r, _)| *r == n).map(|&(_, off)| off);
    if let Some(off) = full(name) {
        return Some((off, false));
    }
    // r8..r15 with d/w/b suffixes.
    if let Some(base) = name.strip_suffix(['d', 'w', 'b']).filter(|b| b.starts_with('r') && b[1..].parse::<u8>().is_ok()) {
        return full(base).map(|off| (off, false));
    }
    let legacy = [("a", "rax"), ("b", "rbx"), ("c", "rcx"), ("d", "rdx")];
    for (l, full_name) in legacy {
        let off = full(full_name)?;
        if name == format!("e{l}x") || name == format!("{l}x") || name == format!("{l}l") {
            return Some((off, false));
        }
        if name == format!("{l}h") {
            return Some((off, true));
        }
    }
    for (short, full_name) in [("si", "rsi"), ("di", "rdi"), ("bp", "rbp"), ("sp", "rsp")] {
        if name == short || name == format!("e{short}") || name == format!("{short}l") {
            return full(full_name).map(|off| (off, false));
        }
    }
    None
}

/// A spec's `size@operand` (the same in every instruction set): the size
/// in bytes (negative: signed), whether signed, and the operand.
pub(super) fn sized(spec: &str) -> Result<(u8, bool, &str), String> {
    let (size, operand) = spec.split_once('@').ok_or("no `size@` before the operand")?;
    let size: i8 = size.parse().map_err(|_| format!("size `{size}` is not a number"))?;
    let (signed, size) = (size < 0, size.unsigned_abs());
    if ![1, 2, 4, 8].contains(&size) {
        return Err(format!("size {size} is not 1, 2, 4 or 8 bytes"));
    }
    Ok((size, signed, operand))
}

/// Parses one argument spec: `8@%rax`, `-1@$0`, `-4@-56(%rbp)`, `8@(%rdi)`.
pub fn parse_arg(spec: &str) -> Result<UsdtArg, String> {
    let (size, signed, operand) = sized(spec)?;
    let reg = |r: &str| -> Result<(u16, bool), String> {
        let name = r.strip_prefix('%').ok_or_else(|| format!("`{r}` is not a register"))?;
        register(name).ok_or_else(|| format!("unknown register `{name}`"))
    };
    let location = if let Some(c) = operand.strip_prefix('$') {
        Location::Constant(c.parse().map_err(|_| format!("constant `{c}` is not a number"))?)
    } else if let Some((disp, rest)) = operand.split_once('(') {
        let base = rest.strip_suffix(')').ok_or("unclosed `(`")?;
        if base.contains(',') {
            return Err("indexed memory operands are not read".into());
        }
        let displacement = if disp.is_empty() { 0 } else { disp.parse().map_err(|_| format!("displacement `{disp}` is not a number"))? };
        Location::Memory { pt_regs: reg(base)?.0, displacement }
    } else {
        let (pt_regs, high_byte) = reg(operand)?;
        Location::Register { pt_regs, high_byte }
    };
    Ok(UsdtArg { size, signed, location })
}

/// Every USDT probe in a file.
/// Read on its own thread, waited for `budget::DEADLINE` at most.
pub fn probes(path: &Path) -> Result<Vec<UsdtProbe>, UsdtError> {
    let shown = path.display().to_string();
    let owned = path.to_path_buf();
    let read = move || {
        let data = super::elf_reader(&owned).map_err(|source| UsdtError::Read { path: owned.display().to_string(), source })?;
        probes_in(&data, &owned.display().to_string())
    };
    let over = |why: String| Err(UsdtError::OverBudget { path: shown.clone(), why });
    match super::budget::within(super::budget::DEADLINE, read) {
        super::budget::Timed::Done(r) => r,
        super::budget::Timed::Late(_) => {
            over(format!("reading its USDT notes took over {}s (gpumem waits no longer for one file)", super::budget::DEADLINE.as_secs()))
        }
        super::budget::Timed::Refused => over(format!(
            "its notes were not read: {} earlier readings of libraries still run past their deadline",
            super::budget::MAX_LATE
        )),
    }
}

/// `probes` of a file's bytes (whatever they are: a process chose the
/// file), `path` naming it in errors.
pub fn probes_in<'d, R: object::ReadRef<'d>>(data: R, path: &str) -> Result<Vec<UsdtProbe>, UsdtError> {
    let shown = || path.to_string();
    let elf = object::File::parse(data).map_err(|source| UsdtError::Parse { path: shown(), source })?;
    let Some(section) = elf.section_by_name(".note.stapsdt") else { return Ok(Vec::new()) };
    let arch = Arch::of(elf.architecture()).ok_or_else(|| UsdtError::Arch { path: shown(), arch: format!("{:?}", elf.architecture()) })?;
    if section.size() > MAX_NOTE_BYTES {
        let why = format!("its .note.stapsdt is {} KiB, over the {} KiB gpumem reads", section.size() >> 10, MAX_NOTE_BYTES >> 10);
        return Err(UsdtError::OverBudget { path: shown(), why });
    }
    let Ok(notes) = section.data() else { return Ok(Vec::new()) };
    let base_section = elf.section_by_name(".stapsdt.base").map(|s| s.address());
    // The file offset of `vaddr` in a loaded segment with all of `flags`
    // (PF_X for a probe, PF_W for a semaphore): the notes may say anything,
    // and a uprobe or a counter the kernel increments must land where the
    // code or the data is, nowhere else.
    let file_offset = |vaddr: u64, flags: u32| {
        elf.segments().find_map(|s| {
            let object::SegmentFlags::Elf { p_flags } = s.flags() else { return None };
            let (off, size) = s.file_range();
            (p_flags & flags == flags).then_some(())?;
            vaddr.checked_sub(s.address()).filter(|&d| d < size).and_then(|d| d.checked_add(off))
        })
    };
    let misplaced = |provider: &str, name: &str, why: String| UsdtError::Misplaced {
        path: shown(),
        provider: provider.to_string(),
        name: name.to_string(),
        why,
    };
    let mut out = Vec::new();
    for note in note_descs(notes) {
        if out.len() >= MAX_PROBES {
            return Err(UsdtError::OverBudget { path: shown(), why: format!("it has over {MAX_PROBES} USDT probes") });
        }
        let Some((pc, base, semaphore, provider, name, args)) = desc(note) else { continue };
        // Prelinked or moved: the note's base says where .stapsdt.base was.
        let pc = match base_section {
            Some(actual) if base != 0 => pc.wrapping_add(actual).wrapping_sub(base),
            _ => pc,
        };
        let Some(offset) = file_offset(pc, PF_X) else {
            return Err(misplaced(&provider, &name, format!("its address {pc:#x} is in no executable segment")));
        };
        let args = split_args(&args)
            .into_iter()
            .map(|spec| {
                arch.parse_arg(spec).map_err(|why| UsdtError::Argument {
                    path: shown(),
                    provider: provider.clone(),
                    name: name.clone(),
                    spec: spec.to_string(),
                    why,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let semaphore = match semaphore {
            0 => None,
            at => Some(
                file_offset(at, PF_W)
                    .ok_or_else(|| misplaced(&provider, &name, format!("its semaphore {at:#x} is in no writable segment")))?,
            ),
        };
        out.push(UsdtProbe { provider, name, arch, offset, semaphore, args });
    }
    Ok(out)
}

/// A note's argument specs: separated by spaces, except inside brackets
/// (aarch64's memory operands: `-1@x0 8@[sp, 40]`).
fn split_args(args: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, None);
    for (i, c) in args.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            c if c.is_whitespace() && depth <= 0 => {
                out.extend(start.take().map(|s| &args[s..i]));
                continue;
            }
            _ => {}
        }
        start.get_or_insert(i);
    }
    out.extend(start.map(|s| &args[s..]));
    out
}

/// The descriptors of the `stapsdt` notes (type 3) of a note section.
fn note_descs(mut data: &[u8]) -> Vec<&[u8]> {
    let word = |d: &[u8], i: usize| d.get(i..i + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()) as usize);
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut out = Vec::new();
    while let (Some(namesz), Some(descsz), Some(kind)) = (word(data, 0), word(data, 4), word(data, 8)) {
        let name_end = 12 + pad(namesz);
        let Some(desc) = data.get(name_end..name_end + descsz) else { break };
        if kind == 3 && data.get(12..12 + namesz) == Some(b"stapsdt\0".as_slice()) {
            out.push(desc);
        }
        let Some(rest) = data.get(name_end + pad(descsz)..) else { break };
        data = rest;
    }
    out
}

/// pc, base, semaphore, provider, name and argument specs of a descriptor.
fn desc(d: &[u8]) -> Option<(u64, u64, u64, String, String, String)> {
    let addr = |i: usize| d.get(i..i + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
    let mut strings = d.get(24..)?.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned());
    Some((addr(0)?, addr(8)?, addr(16)?, strings.next()?, strings.next()?, strings.next().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed fuzz seed (the test allocator's libc10_cuda.so) with
    /// its first note's pc or semaphore overwritten.
    fn with_first_note(field: usize, value: u64) -> Vec<u8> {
        let mut data = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/stapsdt/libc10_cuda.so")).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let (at, _) = elf.section_by_name(".note.stapsdt").unwrap().file_range().unwrap();
        // namesz, descsz, type, "stapsdt\0", then pc, base, semaphore.
        let at = at as usize + 20 + 8 * field;
        data[at..at + 8].copy_from_slice(&value.to_ne_bytes());
        data
    }

    #[test]
    fn a_probe_or_semaphore_outside_its_segments_is_refused_with_why() {
        let ok = probes_in(
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/stapsdt/libc10_cuda.so")).unwrap().as_slice(),
            "x",
        )
        .unwrap();
        assert!(ok.iter().all(|p| p.semaphore.is_some()), "{ok:?}");
        let e = probes_in(with_first_note(0, 0xdead_0000).as_slice(), "lib.so").unwrap_err().to_string();
        assert!(e.starts_with("lib.so: probe pytorch:") && e.contains("its address 0xdead0000 is in no executable segment"), "{e}");
        // A semaphore in the code (or the headers) would have the kernel
        // count into the library's text: refused.
        let e = probes_in(with_first_note(2, 0x10).as_slice(), "lib.so").unwrap_err().to_string();
        assert!(e.contains("its semaphore 0x10 is in no writable segment"), "{e}");
    }

    #[test]
    fn argument_specs_of_every_kind() {
        let reg = |r: u16| Location::Register { pt_regs: r, high_byte: false };
        assert_eq!(parse_arg("8@%rax"), Ok(UsdtArg { size: 8, signed: false, location: reg(80) }));
        assert_eq!(parse_arg("-1@%dl"), Ok(UsdtArg { size: 1, signed: true, location: reg(96) }));
        assert_eq!(parse_arg("-8@%r8"), Ok(UsdtArg { size: 8, signed: true, location: reg(72) }));
        assert_eq!(parse_arg("4@%r9d").map(|a| a.location), Ok(reg(64)));
        assert_eq!(parse_arg("2@%si").map(|a| a.location), Ok(reg(104)));
        assert_eq!(parse_arg("1@%ah").map(|a| a.location), Ok(Location::Register { pt_regs: 80, high_byte: true }));
        assert_eq!(parse_arg("-1@$0"), Ok(UsdtArg { size: 1, signed: true, location: Location::Constant(0) }));
        assert_eq!(parse_arg("-4@-56(%rbp)").map(|a| a.location), Ok(Location::Memory { pt_regs: 32, displacement: -56 }));
        assert_eq!(parse_arg("8@(%rdi)").map(|a| a.location), Ok(Location::Memory { pt_regs: 112, displacement: 0 }));
        for bad in ["8%rax", "3@%rax", "8@%xyz", "8@rax", "8@$x", "8@8(%rax,%rbx,2)", "8@-8(%rbp"] {
            assert!(parse_arg(bad).is_err(), "{bad}");
        }
    }

    /// A library built with sys/sdt.h (systemtap-sdt-dev), PyTorch's probe
    /// shapes with semaphores: the notes, offsets and arguments as readelf
    /// has them.
    #[test]
    fn probes_of_a_library_built_with_sdt_h() {
        let dir = std::env::temp_dir().join(format!("gpumem-usdt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("t.c");
        std::fs::write(
            &src,
            "#define _SDT_HAS_SEMAPHORES 1\n#include <sys/sdt.h>\n#include <stdint.h>\n\
             unsigned short pytorch_malloc_semaphore __attribute__((unused)) __attribute__((section(\".probes\")));\n\
             unsigned short pytorch_free_semaphore __attribute__((unused)) __attribute__((section(\".probes\")));\n\
             __attribute__((noinline)) void *carve(void *seg, long off, int8_t device, uint64_t size, int64_t stream) {\n\
               void *p = (char *)seg + off;\n\
               if (pytorch_malloc_semaphore) STAP_PROBE4(pytorch, malloc, p, device, size, stream);\n  return p; }\n\
             __attribute__((noinline)) void release(void *p) { if (pytorch_free_semaphore) STAP_PROBE1(pytorch, free, p); }\n",
        )
        .unwrap();
        let lib = dir.join("libt.so");
        let cc = std::process::Command::new("cc").args(["-O2", "-shared", "-fPIC"]).arg(&src).arg("-o").arg(&lib).output().expect("cc");
        assert!(cc.status.success(), "needs sys/sdt.h (systemtap-sdt-dev): {}", String::from_utf8_lossy(&cc.stderr));
        let found = probes(&lib).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<(&str, &str, usize)> = found.iter().map(|p| (p.provider.as_str(), p.name.as_str(), p.args.len())).collect();
        assert_eq!(names, [("pytorch", "malloc", 4), ("pytorch", "free", 1)]);
        let malloc = &found[0];
        assert_eq!((malloc.args[1].size, malloc.args[1].signed), (1, true), "device is an i8: {:?}", malloc.args);
        assert_eq!((malloc.args[2].size, malloc.args[3].signed), (8, true), "size u64, stream i64: {:?}", malloc.args);
        // Both semaphores are in .probes, two bytes apart, away from the code.
        let (a, b) = (malloc.semaphore.unwrap(), found[1].semaphore.unwrap());
        assert_eq!(a.abs_diff(b), 2);
        assert!(a > malloc.offset && b > found[1].offset);
    }

    #[test]
    fn argument_lists_split_at_spaces_outside_brackets() {
        assert_eq!(split_args("-8@%rbp -1@%al -8@%r12 -8@56(%rsp)"), ["-8@%rbp", "-1@%al", "-8@%r12", "-8@56(%rsp)"]);
        assert_eq!(split_args("8@[sp, 40] -1@[sp, 39]  8@x19"), ["8@[sp, 40]", "-1@[sp, 39]", "8@x19"]);
        assert_eq!(split_args(" "), Vec::<&str>::new());
        assert_eq!(split_args("8@[sp, 4"), ["8@[sp, 4"], "an unclosed bracket is one spec (refused when parsed)");
        assert_eq!(split_args("8@x1] 4@x2"), ["8@x1]", "4@x2"]);
    }
}
