//! USDT argument specs as GCC writes them for aarch64 (issue 33): `8@x21`,
//! `-1@x0`, `-4@w1`, `8@[sp, 40]`, `-8@[x2]`, `8@[x19, -8]`, a constant
//! `-4@5`; the registers by their offsets in arm64's `struct pt_regs`
//! (`user_pt_regs`: x0..x30, then sp), which is what the eBPF program reads.
use super::usdt::{Location, UsdtArg};

/// `user_pt_regs.sp`: after the 31 general registers.
const SP: u16 = 31 * 8;

/// A register by name: x0..x30 and their 32-bit halves w0..w30 (the low
/// half: the same pt_regs slot, read as 4 bytes), sp; its pt_regs offset.
fn register(name: &str) -> Option<u16> {
    if name == "sp" {
        return Some(SP);
    }
    let n: u16 = name.strip_prefix(['x', 'w'])?.parse().ok().filter(|n| *n <= 30)?;
    // "x01" is no register name.
    (name.len() == 2 || !name[1..].starts_with('0')).then_some(n * 8)
}

/// The name of the 64-bit register at a pt_regs offset.
pub fn register_name(pt_regs: u16) -> String {
    match pt_regs {
        SP => "sp".into(),
        off if off % 8 == 0 && off < SP => format!("x{}", off / 8),
        _ => "?".into(),
    }
}

/// Parses one aarch64 argument spec (see the module).
pub fn parse_arg(spec: &str) -> Result<UsdtArg, String> {
    let (size, signed, operand) = super::usdt::sized(spec)?;
    let reg = |r: &str| register(r.trim()).ok_or_else(|| format!("unknown register `{}`", r.trim()));
    let location = if let Some(inner) = operand.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or("unclosed `[`")?;
        let (base, offset) = match inner.split_once(',') {
            Some((base, offset)) => {
                let offset = offset.trim();
                let offset = offset.strip_prefix('#').unwrap_or(offset);
                (base, offset.parse().map_err(|_| format!("offset `{offset}` is not a number (indexed operands are not read)"))?)
            }
            None => (inner, 0),
        };
        Location::Memory { pt_regs: reg(base)?, displacement: offset }
    } else if operand.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        Location::Constant(operand.parse().map_err(|_| format!("constant `{operand}` is not a number"))?)
    } else {
        Location::Register { pt_regs: reg(operand)?, high_byte: false }
    };
    Ok(UsdtArg { size, signed, location })
}

/// How a location reads in aarch64's syntax.
pub fn describe(location: &Location) -> String {
    match *location {
        Location::Register { pt_regs, .. } => register_name(pt_regs),
        Location::Constant(c) => c.to_string(),
        Location::Memory { pt_regs, displacement: 0 } => format!("[{}]", register_name(pt_regs)),
        Location::Memory { pt_regs, displacement } => format!("[{}, {displacement}]", register_name(pt_regs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(spec: &str) -> (u8, bool, Location) {
        let a = parse_arg(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        (a.size, a.signed, a.location)
    }

    #[test]
    fn gccs_aarch64_specs_name_pt_regs_slots() {
        // As aarch64-linux-gnu-gcc writes them for the test allocator's probes (-O2 and -O0) and others.
        assert_eq!(at("8@x21"), (8, false, Location::Register { pt_regs: 21 * 8, high_byte: false }));
        assert_eq!(at("-1@x0"), (1, true, Location::Register { pt_regs: 0, high_byte: false }));
        assert_eq!(at("-4@w1"), (4, true, Location::Register { pt_regs: 8, high_byte: false }), "w1 is x1's low half");
        assert_eq!(at("8@[sp, 40]"), (8, false, Location::Memory { pt_regs: 248, displacement: 40 }));
        assert_eq!(at("-8@[x2]"), (8, true, Location::Memory { pt_regs: 16, displacement: 0 }));
        assert_eq!(at("8@[x19, -8]"), (8, false, Location::Memory { pt_regs: 152, displacement: -8 }));
        assert_eq!(at("-4@[sp, #16]"), (4, true, Location::Memory { pt_regs: 248, displacement: 16 }));
        assert_eq!(at("-4@5"), (4, true, Location::Constant(5)));
        assert_eq!(at("8@-3"), (8, false, Location::Constant(-3)));
        assert_eq!(at("8@x30").2, Location::Register { pt_regs: 240, high_byte: false });
    }

    #[test]
    fn what_is_not_an_aarch64_operand_is_refused_with_why() {
        for (spec, why) in [
            ("8@x31", "unknown register `x31`"),
            ("8@x01", "unknown register `x01`"),
            ("8@%rdi", "unknown register `%rdi`"),
            ("8@[x2, x3]", "offset `x3` is not a number (indexed operands are not read)"),
            ("8@[x2", "unclosed `[`"),
            ("3@x1", "size 3 is not 1, 2, 4 or 8 bytes"),
            ("x1", "no `size@` before the operand"),
            ("8@-", "constant `-` is not a number"),
        ] {
            assert_eq!(parse_arg(spec).unwrap_err(), why, "{spec}");
        }
    }

    #[test]
    fn locations_read_back_in_aarch64_syntax() {
        for spec in ["8@x21", "8@[sp, 40]", "-8@[x2]", "8@[x19, -8]", "4@5"] {
            let a = parse_arg(spec).unwrap();
            assert_eq!(describe(&a.location), spec.split_once('@').unwrap().1);
        }
        assert_eq!(register_name(7), "?");
    }
}
