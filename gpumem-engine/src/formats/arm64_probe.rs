//! Whether a uprobe may go on an arm64 instruction (docs/arm64-uprobe-safety.md).
//!
//! A uprobe replaces the probed instruction with a breakpoint; at a hit the
//! arm64 kernel either *simulates* the instruction (branches, `adr`/`adrp`,
//! `nop` since 6.13) or copies it to an out-of-line page and *single-steps*
//! it there (XOL: almost every function-entry instruction, `paciasp`,
//! `bti c`, `stp x29, x30, ...`). XOL is the path blamed for traced
//! processes resumed at the wrong PC on GB300 hosts, and `bti` is stepped in
//! an unguarded page; some instructions the kernel refuses outright or
//! handles wrongly. So on arm64 gpumem attaches, by default, only where the
//! kernel simulates, and says for each site what it decided and why.
use std::{fs::File, io, os::unix::fs::FileExt as _, path::Path};

use serde::Serialize;

/// How the running kernel handles a uprobe hit on an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Handling {
    /// Emulated in the kernel: no copy, no single-step.
    Simulated,
    /// Copied to the XOL page and single-stepped there.
    SteppedOutOfLine,
    /// The kernel refuses the probe, or would handle it wrongly.
    Refused,
}

/// One instruction word, named and classified for a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instruction {
    pub word: u32,
    pub name: &'static str,
    pub handling: Handling,
    /// Why, when the kernel refuses it or handles it wrongly.
    pub why: &'static str,
}

/// A kernel release as (major, minor): distributions backport fixes, so
/// it is a lower bound of what the kernel does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Kernel(pub u32, pub u32);

impl Kernel {
    /// `6.12.43+deb13-arm64` → 6.12; None for what is not a release.
    pub fn parse(release: &str) -> Option<Kernel> {
        let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Kernel(major, minor))
    }

    /// `nop` is simulated since 6.13 (ac4ad5c09b34), stepped out of line before.
    fn simulates_nop(self) -> bool {
        self >= Kernel(6, 13)
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// Before 5.10 the kernel stepped AUT* hints out of line (which faults)
/// and treated hints differently: no uprobe at all on arm64 there.
pub const KERNEL_FLOOR: Kernel = Kernel(5, 10);

const fn is(w: u32, mask: u32, value: u32) -> bool {
    w & mask == value
}

/// What the kernel's uprobe decoder (arch/arm64/kernel/probes/decode-insn.c)
/// does with `w`, and a name for it. Masks are the kernel's `__AARCH64_INSN_FUNCS`.
pub fn classify(w: u32, kernel: Kernel) -> Instruction {
    use Handling::*;
    let (name, handling, why): (&'static str, Handling, &'static str) = if is(w, 0xFFE0_001F, 0xD420_0000) {
        ("brk", Refused, "already a breakpoint (another tracer or debugger has a probe here)")
    } else if is(w, 0xFFFF_F01F, 0xD503_201F) {
        hint((w >> 5) & 0x7F, kernel)
    } else if is(w, 0xFF00_0010, 0x5400_0010) {
        ("bc.cond", Refused, "a hinted conditional branch is stepped out of line and resumes at a wrong PC before the 2026 fix (2ccd8ff980b5), which cannot be detected")
    } else if is(w, 0xFF00_0010, 0x5400_0000) {
        ("b.cond", Simulated, "")
    } else if is(w, 0xFC00_0000, 0x1400_0000) {
        ("b", Simulated, "")
    } else if is(w, 0xFC00_0000, 0x9400_0000) {
        ("bl", Simulated, "")
    } else if is(w, 0x7E00_0000, 0x3400_0000) {
        ("cbz/cbnz", Simulated, "")
    } else if is(w, 0x7E00_0000, 0x3600_0000) {
        ("tbz/tbnz", Simulated, "")
    } else if is(w, 0x1F00_0000, 0x1000_0000) {
        ("adr/adrp", Simulated, "")
    } else if is(w, 0xFFFF_FC1F, 0xD65F_0000) {
        ("ret", Simulated, "")
    } else if is(w, 0xFFFF_FC1F, 0xD61F_0000) || is(w, 0xFFFF_FC1F, 0xD63F_0000) {
        ("br/blr", Simulated, "")
    } else if is(w, 0xFE00_0000, 0xD600_0000) {
        ("branch to register with pointer authentication (braa/blraa/retaa/eret...)", Refused, "the kernel refuses probes on it (5.10+)")
    } else if is(w, 0xBF00_0000, 0x1800_0000) || is(w, 0xFF00_0000, 0x9800_0000) || is(w, 0xFF00_0000, 0xD800_0000) {
        (
            "ldr/ldrsw/prfm (literal)",
            Refused,
            "the kernel refuses uprobes on PC-relative loads since 6.12 and simulated them unsafely before (CVE-2024-50099)",
        )
    } else if is(w, 0x3F00_0000, 0x1C00_0000) {
        ("ldr (literal, SIMD&FP)", Refused, "stepped out of line, its PC-relative load would read beside the XOL page")
    } else if is(w, 0x3F80_0000, 0x0800_0000) {
        ("load/store exclusive", Refused, "the kernel refuses probes on exclusives (the step would break the monitor)")
    } else if is(w, 0xFF00_0000, 0xD400_0000) {
        ("exception generation (svc/hvc/smc/hlt)", Refused, "the kernel refuses probes on it")
    } else if is(w, 0xFFF8_F01F, 0xD500_401F) || is(w, 0xFFF0_0000, 0xD510_0000) || is(w, 0xFFFF_FFE0, 0xD53B_4220) {
        ("msr / mrs daif", Refused, "the kernel refuses probes on it")
    } else if is(w, 0xFFC0_7FFF, 0xA980_7BFD) {
        ("stp x29, x30, [sp, #-n]! (frame record)", SteppedOutOfLine, "")
    } else if is(w, 0xFF00_03FF, 0xD100_03FF) {
        ("sub sp, sp, #n", SteppedOutOfLine, "")
    } else {
        ("an instruction the kernel does not simulate", SteppedOutOfLine, "")
    };
    Instruction { word: w, name, handling, why }
}

/// Hints (`hint #n`): nop, pointer authentication and branch target landing pads.
fn hint(n: u32, kernel: Kernel) -> (&'static str, Handling, &'static str) {
    use Handling::*;
    match n {
        0 if kernel.simulates_nop() => ("nop", Simulated, ""),
        0 => ("nop", SteppedOutOfLine, ""),
        25 => ("paciasp", SteppedOutOfLine, ""),
        27 => ("pacibsp", SteppedOutOfLine, ""),
        7 | 8 | 10 | 24 | 26 => ("pac hint (xpaclri/pacia1716/paciaz...)", SteppedOutOfLine, ""),
        32 | 34 | 36 | 38 => ("bti", SteppedOutOfLine, ""),
        12 | 14 | 28..=31 => {
            ("aut hint (autiasp/autibsp...)", Refused, "the kernel refuses probes on pointer authentication checks (5.10+)")
        }
        _ => ("hint (yield/wfe/wfi/sev...)", Refused, "the kernel refuses probes on hints it cannot step"),
    }
}

/// Which uprobes the operator allows on arm64 (`--arm64-uprobes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Only sites whose instruction the kernel simulates (no out-of-line single-step).
    #[default]
    Strict,
    /// Also sites the kernel single-steps out of line (most function entries:
    /// `paciasp`, `bti c`, `stp x29, x30, ...`); never those it refuses.
    AllowXol,
    /// No uprobe at all (NVML and tracepoints only).
    Off,
}

impl Policy {
    pub fn flag(self) -> &'static str {
        match self {
            Policy::Strict => "strict",
            Policy::AllowXol => "allow-xol",
            Policy::Off => "off",
        }
    }
}

/// What a probe site does with the registers: a site that reads none (the
/// loader's hook) may move past a landing pad to the instruction after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A function entry with a return probe: arguments read, LR replaced.
    EntryAndReturn,
    /// A USDT site (a `nop`): arguments read there.
    Usdt,
    /// Only that it ran matters.
    Signal,
}

/// The decision for one probe site, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub attach: bool,
    /// The probed instruction, in hex, and its name.
    pub instruction: String,
    pub handling: Handling,
    /// The file offset probed (the landing pad's successor for a signal site).
    pub offset: u64,
    pub why: String,
}

/// Decides one site from the instruction words at its file offset
/// (`words[0]` at the site, `words[1]` after it when readable).
pub fn decide(words: &[u32], offset: u64, site: Site, kernel: Kernel, policy: Policy) -> Decision {
    let Some(&first) = words.first() else {
        return unreadable(offset, "its instruction could not be read".into());
    };
    let insn = classify(first, kernel);
    let shown = |i: &Instruction| format!("{:#010x} ({})", i.word, i.name);
    let no = |i: &Instruction, offset, why: String| Decision { attach: false, instruction: shown(i), handling: i.handling, offset, why };
    if policy == Policy::Off {
        return no(&insn, offset, "--arm64-uprobes off: no uprobe on arm64".into());
    }
    if kernel < KERNEL_FLOOR {
        return no(
            &insn,
            offset,
            format!("kernel {kernel} is older than {KERNEL_FLOOR}: its arm64 uprobes step pointer-authentication checks out of line"),
        );
    }
    if !offset.is_multiple_of(4) {
        return no(&insn, offset, "not 4-byte aligned: not an instruction boundary".into());
    }
    // A site that reads no register may probe the instruction after a landing pad.
    if site == Site::Signal && insn.handling == Handling::SteppedOutOfLine && is_landing_pad(first) {
        if let Some(next) = words.get(1).map(|&w| classify(w, kernel)).filter(|n| n.handling == Handling::Simulated) {
            let why = format!("{} after the landing pad {}: simulated by the kernel", next.name, shown(&insn));
            return Decision { attach: true, instruction: shown(&next), handling: next.handling, offset: offset + 4, why };
        }
    }
    match (insn.handling, policy) {
        (Handling::Simulated, _) => Decision { attach: true, instruction: shown(&insn), handling: insn.handling, offset, why: "simulated by the kernel: no out-of-line step".into() },
        (Handling::SteppedOutOfLine, Policy::AllowXol) => Decision {
            attach: true,
            instruction: shown(&insn),
            handling: insn.handling,
            offset,
            why: format!("stepped out of line by kernel {kernel}: allowed by --arm64-uprobes allow-xol"),
        },
        (Handling::SteppedOutOfLine, _) => no(
            &insn,
            offset,
            format!("kernel {kernel} steps it out of line (the path that resumed processes at a wrong PC on GB300): pass --arm64-uprobes allow-xol to attach anyway"),
        ),
        (Handling::Refused, _) => no(&insn, offset, format!("{} (not overridable)", insn.why)),
    }
}

/// One library's entry points are attached all or none: a part would
/// miscount (an allocation seen and its free not is a leak that is not
/// there). Refuses every decision when one is refused, saying so.
pub fn all_or_none<'a>(decisions: impl IntoIterator<Item = &'a mut Decision>) {
    let mut decisions: Vec<&mut Decision> = decisions.into_iter().collect();
    let refused = decisions.iter().filter(|d| !d.attach).count();
    if refused == 0 {
        return;
    }
    for d in decisions.iter_mut().filter(|d| d.attach) {
        d.attach = false;
        d.why = format!(
            "{}; not attached: {refused} other entry points of this library are refused, and a part would miscount (an allocation seen, its free not)",
            d.why
        );
    }
}

/// A site whose instruction is not known: refused, saying why.
pub fn unreadable(offset: u64, why: String) -> Decision {
    Decision { attach: false, instruction: "unknown".into(), handling: Handling::Refused, offset, why }
}

/// `bti c|j|jc`, `paciasp`, `pacibsp`: what a function may start with.
fn is_landing_pad(w: u32) -> bool {
    matches!(w, 0xD503_241F | 0xD503_245F | 0xD503_249F | 0xD503_24DF | 0xD503_233F | 0xD503_237F)
}

/// The instruction words at a file offset (two: the site and the next),
/// read from the file the kernel copies the instruction from. An error for
/// a file shorter than one word there.
pub fn words_at(path: &Path, offset: u64) -> io::Result<Vec<u32>> {
    let file = File::open(path)?;
    let mut bytes = [0u8; 8];
    let mut got = 0;
    while got < bytes.len() {
        match file.read_at(&mut bytes[got..], offset + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    if got < 4 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("no instruction at file offset {offset:#x}")));
    }
    Ok(bytes[..got / 4 * 4].as_chunks::<4>().0.iter().map(|c| u32::from_le_bytes(*c)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const K612: Kernel = Kernel(6, 12);
    const K613: Kernel = Kernel(6, 13);

    #[test]
    fn kernel_releases_parse_as_lower_bounds() {
        assert_eq!(Kernel::parse("6.12.43+deb13-arm64"), Some(Kernel(6, 12)));
        assert_eq!(Kernel::parse("6.14.0-1013-nvidia-64k\n"), Some(Kernel(6, 14)));
        assert_eq!(Kernel::parse("5.4"), Some(Kernel(5, 4)));
        assert_eq!(Kernel::parse("garbage"), None);
        assert_eq!(Kernel::parse(""), None);
        assert!(Kernel(6, 9) < Kernel(6, 12) && Kernel(5, 15) < Kernel(6, 1));
    }

    /// Words as GNU as encodes them (aarch64-linux-gnu-as, checked by objdump).
    #[test]
    fn the_kernels_classes_by_encoding() {
        let cases: &[(u32, &str, Handling)] = &[
            (0xD503_201F, "nop", Handling::SteppedOutOfLine),
            (0xD503_233F, "paciasp", Handling::SteppedOutOfLine),
            (0xD503_237F, "pacibsp", Handling::SteppedOutOfLine),
            (0xD503_245F, "bti", Handling::SteppedOutOfLine),
            (0xD503_23BF, "aut hint (autiasp/autibsp...)", Handling::Refused),
            (0xA9BF_7BFD, "stp x29, x30, [sp, #-n]! (frame record)", Handling::SteppedOutOfLine), // stp x29, x30, [sp, #-16]!
            (0xD100_43FF, "sub sp, sp, #n", Handling::SteppedOutOfLine),                          // sub sp, sp, #0x10
            (0xAA00_03E1, "an instruction the kernel does not simulate", Handling::SteppedOutOfLine), // mov x1, x0
            (0xD65F_03C0, "ret", Handling::Simulated),
            (0xD61F_0220, "br/blr", Handling::Simulated), // br x17
            (0x1400_0010, "b", Handling::Simulated),
            (0x9400_0010, "bl", Handling::Simulated),
            (0x5400_0040, "b.cond", Handling::Simulated), // b.eq .+8
            (0x5400_0050, "bc.cond", Handling::Refused),
            (0xB400_0040, "cbz/cbnz", Handling::Simulated), // cbz x0, .+8
            (0x3600_0040, "tbz/tbnz", Handling::Simulated),
            (0x9000_0010, "adr/adrp", Handling::Simulated),               // adrp x16, ...
            (0x5800_0040, "ldr/ldrsw/prfm (literal)", Handling::Refused), // ldr x0, .+8
            (0x1C00_0040, "ldr (literal, SIMD&FP)", Handling::Refused),
            (0xC85F_7C20, "load/store exclusive", Handling::Refused), // ldxr x0, [x1]
            (0xD400_0001, "exception generation (svc/hvc/smc/hlt)", Handling::Refused), // svc #0
            (0xD420_0000, "brk", Handling::Refused),
            (0xD65F_0BFF, "branch to register with pointer authentication (braa/blraa/retaa/eret...)", Handling::Refused), // retaa
            (0xD503_203F, "hint (yield/wfe/wfi/sev...)", Handling::Refused),                                               // yield
        ];
        for &(w, name, handling) in cases {
            let got = classify(w, K612);
            assert_eq!((got.name, got.handling), (name, handling), "{w:#010x}");
            assert_eq!(got.why.is_empty(), handling != Handling::Refused, "{w:#010x}: refusals say why");
        }
        assert_eq!(classify(0xD503_201F, K613).handling, Handling::Simulated, "nop is simulated since 6.13");
    }

    #[test]
    fn strict_attaches_only_where_the_kernel_simulates() {
        let d = decide(&[0xA9BF_7BFD], 0x1000, Site::EntryAndReturn, K612, Policy::Strict);
        assert!(!d.attach && d.why.contains("--arm64-uprobes allow-xol"), "{d:?}");
        assert_eq!(d.instruction, "0xa9bf7bfd (stp x29, x30, [sp, #-n]! (frame record))");
        let d = decide(&[0xA9BF_7BFD], 0x1000, Site::EntryAndReturn, K612, Policy::AllowXol);
        assert!(d.attach && d.why.contains("allowed by --arm64-uprobes allow-xol"), "{d:?}");
        let d = decide(&[0xB400_0040], 0x1000, Site::EntryAndReturn, K612, Policy::Strict);
        assert!(d.attach && d.offset == 0x1000, "{d:?}");
        // USDT's nop: stepped before 6.13, simulated after.
        assert!(!decide(&[0xD503_201F], 8, Site::Usdt, K612, Policy::Strict).attach);
        assert!(decide(&[0xD503_201F], 8, Site::Usdt, K613, Policy::Strict).attach);
    }

    #[test]
    fn what_no_override_lifts() {
        for policy in [Policy::Strict, Policy::AllowXol] {
            for w in [0xD503_23BF, 0x5800_0040, 0xD420_0000, 0x5400_0050, 0xC85F_7C20] {
                let d = decide(&[w], 0x1000, Site::EntryAndReturn, K613, policy);
                assert!(!d.attach && d.why.contains("not overridable"), "{w:#x} {policy:?}: {d:?}");
            }
            assert!(!decide(&[0xD65F_03C0], 0x1002, Site::Signal, K613, policy).attach, "unaligned");
            assert!(!decide(&[0xD65F_03C0], 0x1000, Site::Signal, Kernel(5, 4), policy).attach, "below the floor");
        }
        assert!(!decide(&[0xD65F_03C0], 0x1000, Site::Signal, K613, Policy::Off).attach);
        assert!(!decide(&[], 0x1000, Site::Signal, K613, Policy::AllowXol).attach);
    }

    #[test]
    fn a_signal_site_moves_past_its_landing_pad_an_entry_does_not() {
        // bti c; ret: glibc's _dl_debug_state built with branch protection.
        let d = decide(&[0xD503_245F, 0xD65F_03C0], 0x40, Site::Signal, K612, Policy::Strict);
        assert!(d.attach && d.offset == 0x44 && d.instruction.contains("ret"), "{d:?}");
        // An entry reads its arguments and replaces LR at the entry: it stays.
        let d = decide(&[0xD503_233F, 0xD65F_03C0], 0x40, Site::EntryAndReturn, K612, Policy::Strict);
        assert!(!d.attach && d.offset == 0x40, "{d:?}");
        // A landing pad followed by what is stepped: nothing to move to.
        assert!(!decide(&[0xD503_245F, 0xA9BF_7BFD], 0x40, Site::Signal, K612, Policy::Strict).attach);
    }

    #[test]
    fn a_library_is_attached_all_or_none() {
        let mut ds = vec![
            decide(&[0x9000_0010], 0, Site::EntryAndReturn, K612, Policy::Strict),
            decide(&[0xA9BF_7BFD], 4, Site::EntryAndReturn, K612, Policy::Strict),
        ];
        all_or_none(ds.iter_mut());
        assert!(ds.iter().all(|d| !d.attach), "{ds:?}");
        assert!(ds[0].why.starts_with("simulated by the kernel") && ds[0].why.contains("1 other entry points of this library are refused"));
        let mut fine = [decide(&[0x9000_0010], 0, Site::EntryAndReturn, K612, Policy::Strict)];
        all_or_none(fine.iter_mut());
        assert!(fine[0].attach);
    }

    #[test]
    fn words_are_read_from_the_file_and_a_short_one_is_an_error() {
        let path = std::env::temp_dir().join(format!("gpumem-arm64-words-{}", std::process::id()));
        std::fs::write(&path, [0x1F, 0x20, 0x03, 0xD5, 0xC0, 0x03, 0x5F, 0xD6, 0xAA]).unwrap();
        assert_eq!(words_at(&path, 0).unwrap(), vec![0xD503_201F, 0xD65F_03C0]);
        assert_eq!(words_at(&path, 4).unwrap(), vec![0xD65F_03C0]);
        assert!(words_at(&path, 6).is_err());
        assert!(words_at(&path, u64::MAX - 2).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
