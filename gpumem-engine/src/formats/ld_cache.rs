//! The dynamic linker's cache (`/etc/ld.so.cache`), read directly: what
//! `ldconfig -p` prints, without needing ldconfig (the image has none).
//! glibc writes the "new" format since 2.32, and before that the old one
//! followed by the new one; only the new part is read (it has the flags that
//! name the architecture). Layout: glibc's `elf/dl-cache.h`.
use std::path::{Path, PathBuf};

const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
/// magic(20) nlibs(4) len_strings(4) flags(1) pad(3) extension_offset(4) unused(12).
const NEW_HEADER: usize = 48;
/// flags(4) key(4) value(4) osversion(4) hwcap(8).
const NEW_ENTRY: usize = 24;
/// flags(4) key(4) value(4).
const OLD_ENTRY: usize = 12;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_REQUIRED_MASK: i32 = 0xff00;
/// This build's architecture, as ldconfig marks it.
const FLAG_THIS_ARCH: i32 = if cfg!(target_arch = "x86_64") {
    0x0300
} else if cfg!(target_arch = "aarch64") {
    0x0a00
} else {
    0
};

#[derive(Debug, thiserror::Error)]
pub enum LdCacheError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a dynamic linker cache glibc 2.32+ understands ({why})")]
    Format { path: PathBuf, why: &'static str },
}

/// One library the cache resolves: its soname and the file it points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn c_str(data: &[u8], at: usize) -> Option<&str> {
    let rest = data.get(at..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// Where the new-format part starts: at 0, or after the old-format table
/// (aligned to the new header's alignment, 8 bytes).
fn new_part(data: &[u8]) -> Result<usize, &'static str> {
    if data.starts_with(NEW_MAGIC) {
        return Ok(0);
    }
    if !data.starts_with(OLD_MAGIC) {
        return Err("no glibc-ld.so.cache magic");
    }
    let nlibs = u32_at(data, 12).ok_or("cut short")? as usize;
    let start = (16 + nlibs * OLD_ENTRY).next_multiple_of(8);
    match data.get(start..) {
        Some(rest) if rest.starts_with(NEW_MAGIC) => Ok(start),
        _ => Err("an old-format cache without the new-format part"),
    }
}

/// The libc6 libraries of this architecture in a cache file's bytes.
pub fn parse(data: &[u8]) -> Result<Vec<Entry>, &'static str> {
    let base = new_part(data)?;
    let part = &data[base..];
    let nlibs = u32_at(part, 20).ok_or("cut short")? as usize;
    if part.len() < NEW_HEADER + nlibs.saturating_mul(NEW_ENTRY) {
        return Err("fewer entries than its header says");
    }
    let mut entries = Vec::new();
    for i in 0..nlibs {
        let at = NEW_HEADER + i * NEW_ENTRY;
        let flags = u32_at(part, at).ok_or("cut short")? as i32;
        if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6 || flags & FLAG_REQUIRED_MASK != FLAG_THIS_ARCH {
            continue;
        }
        // String offsets count from the new part's start.
        let (key, value) = (u32_at(part, at + 4).ok_or("cut short")?, u32_at(part, at + 8).ok_or("cut short")?);
        let (Some(name), Some(path)) = (c_str(part, key as usize), c_str(part, value as usize)) else {
            return Err("an entry's name lies outside the file");
        };
        entries.push(Entry { name: name.to_string(), path: PathBuf::from(path) });
    }
    Ok(entries)
}

/// Reads and parses the cache at `path`.
pub fn read(path: &Path) -> Result<Vec<Entry>, LdCacheError> {
    let data = std::fs::read(path).map_err(|source| LdCacheError::Read { path: path.to_path_buf(), source })?;
    parse(&data).map_err(|why| LdCacheError::Format { path: path.to_path_buf(), why })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `ldconfig -p` prints for this architecture's libc6 libraries:
    /// `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    fn ldconfig_p() -> Vec<Entry> {
        let out = std::process::Command::new("/sbin/ldconfig").arg("-p").output().expect("ldconfig -p runs here");
        let arch = if cfg!(target_arch = "x86_64") { "(libc6,x86-64" } else { "(libc6,AArch64" };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().split_once(' ')?;
                let path = rest.starts_with(arch).then(|| rest.split_once("=> "))??.1;
                Some(Entry { name: name.to_string(), path: PathBuf::from(path) })
            })
            .collect()
    }

    #[test]
    fn reads_this_machines_cache_as_ldconfig_does() {
        let entries = read(Path::new("/etc/ld.so.cache")).expect("this machine's cache");
        assert!(entries.len() > 10, "{entries:?}");
        assert_eq!(entries, ldconfig_p());
    }

    #[test]
    fn refuses_what_is_not_a_cache() {
        assert!(parse(b"hello").is_err());
        let mut cut = std::fs::read("/etc/ld.so.cache").unwrap();
        cut.truncate(NEW_HEADER + NEW_ENTRY);
        assert_eq!(parse(&cut), Err("fewer entries than its header says"));
        assert!(matches!(read(Path::new("/nonexistent/ld.so.cache")), Err(LdCacheError::Read { .. })));
    }

    #[test]
    fn reads_the_new_part_after_an_old_table() {
        let new = std::fs::read("/etc/ld.so.cache").unwrap();
        assert!(new.starts_with(NEW_MAGIC), "this machine's glibc writes the new format alone");
        // An old-format header with one (ignored) entry, then the new part.
        let mut both = OLD_MAGIC.to_vec();
        both.push(0);
        both.extend_from_slice(&1u32.to_ne_bytes());
        both.extend_from_slice(&[0; OLD_ENTRY]);
        both.resize((16 + OLD_ENTRY).next_multiple_of(8), 0);
        both.extend_from_slice(&new);
        assert_eq!(parse(&both), parse(&new));
    }
}
