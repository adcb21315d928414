//! Finding libcuda copies on the host: the one ld.so.cache resolves, the ones
//! mapped by running processes (through /proc/PID/root, so containers count),
//! and the ones named on the command line. Copies are told apart by inode.
use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
};

/// How a library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    CommandLine,
    LdCache,
    ProcessMaps { pid: u32 },
    /// Mapped by a process from a file since deleted or replaced on disk.
    DeletedInProcess { pid: u32 },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::CommandLine => write!(f, "--libcuda"),
            Source::LdCache => write!(f, "ld.so.cache"),
            Source::ProcessMaps { pid } => write!(f, "/proc/{pid}/maps"),
            Source::DeletedInProcess { pid } => write!(f, "/proc/{pid}/maps, deleted or replaced on disk since it was loaded"),
        }
    }
}

/// One libcuda file, identified by (device, inode).
#[derive(Clone, Debug)]
pub struct Library {
    /// A path the agent can open (through /proc/PID/root for other mount namespaces).
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub source: Source,
}

impl Library {
    pub fn key(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

pub fn stat_library(path: &Path, source: Source) -> std::io::Result<Library> {
    let md = fs::metadata(path)?;
    Ok(Library { path: path.to_path_buf(), dev: md.dev(), ino: md.ino(), source })
}

/// Is this file name a libcuda driver library (libcuda.so, libcuda.so.1, libcuda.so.535.x)?
pub fn is_libcuda_name(name: &str) -> bool {
    name == "libcuda.so" || name.starts_with("libcuda.so.")
}

/// libcuda paths known to the dynamic linker cache (`ldconfig -p`).
/// Returns an explanation instead when ldconfig cannot be run.
pub fn from_ld_cache() -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldconfig").arg("-p").output().or_else(|_| Command::new("/sbin/ldconfig").arg("-p").output());
    let out = out.map_err(|e| format!("cannot run ldconfig -p: {e}"))?;
    Ok(parse_ldconfig(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `ldconfig -p` lines such as
/// `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`.
pub fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some((name, rest)) = line.split_once(' ') else { continue };
        if !is_libcuda_name(name) || !rest.contains("x86-64") && cfg!(target_arch = "x86_64") {
            continue;
        }
        if let Some((_, path)) = rest.split_once("=> ") {
            let p = PathBuf::from(path.trim());
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    paths
}

/// The libcuda mappings of one process's maps: (address range, path inside
/// its mount namespace, whether the file was deleted or replaced since).
fn libcuda_mappings(maps: &str) -> impl Iterator<Item = (&str, String, bool)> {
    maps.lines().filter_map(|line| {
        // address perms offset dev inode pathname (the pathname may hold spaces)
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 {
            return None;
        }
        let path = fields[5..].join(" ");
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p.to_string(), true),
            None => (path, false),
        };
        let name = path.rsplit('/').next().unwrap_or("");
        (path.starts_with('/') && is_libcuda_name(name)).then(|| (fields[0], path, deleted))
    })
}

/// The libcuda files one process maps, each once: paths inside its mount namespace.
pub fn libcuda_in_maps(maps: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, path, deleted) in libcuda_mappings(maps) {
        if !deleted && !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// libcuda mappings whose file was deleted or replaced on disk while in use
/// (a driver upgrade under a running job): (address range, path it had).
/// The first mapping of each is kept; its /proc/PID/map_files/RANGE link
/// opens the old inode, which is what the process still runs.
pub fn deleted_libcuda_in_maps(maps: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (range, path, deleted) in libcuda_mappings(maps) {
        if deleted && !out.iter().any(|(_, p)| *p == path) {
            out.push((range.to_string(), path));
        }
    }
    out
}

/// What the periodic scans of /proc cost, for the summary.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScanStats {
    pub scans: u64,
    pub total_us: u64,
    pub max_us: u64,
    /// Processes whose maps the last scan read.
    pub last_processes: u64,
}

impl ScanStats {
    pub fn record(&mut self, took: std::time::Duration, processes: u64) {
        let us = took.as_micros() as u64;
        self.scans += 1;
        self.total_us += us;
        self.max_us = self.max_us.max(us);
        self.last_processes = processes;
    }
}

/// Scans every process's maps for libcuda copies; returns them and how many
/// processes were read. Unreadable processes (exited meanwhile, kernel
/// threads) are skipped.
pub fn from_processes(skip_pid: u32) -> (Vec<Library>, u64) {
    let mut libs = Vec::new();
    let mut read = 0;
    let Ok(dir) = fs::read_dir("/proc") else { return (libs, 0) };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == skip_pid {
            continue;
        }
        let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else { continue };
        read += 1;
        for path in libcuda_in_maps(&maps) {
            let through_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
            if let Ok(lib) = stat_library(&through_root, Source::ProcessMaps { pid }) {
                libs.push(lib);
            }
        }
        for (range, _) in deleted_libcuda_in_maps(&maps) {
            // Needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE; without, the copy is missed.
            let old_inode = PathBuf::from(format!("/proc/{pid}/map_files/{range}"));
            if let Ok(lib) = stat_library(&old_inode, Source::DeletedInProcess { pid }) {
                libs.push(lib);
            }
        }
    }
    (libs, read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_lines() {
        let text = "3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/lib/libcudart.so.12\n";
        assert_eq!(
            parse_ldconfig(text),
            vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so")]
        );
    }

    #[test]
    fn maps_lines() {
        let maps = "7f00-7f10 r--p 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03\n\
            7f10-7f20 r-xp 00010000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03\n\
            7f20-7f30 r-xp 00000000 fd:01 99 /opt/my dir/libcuda.so.1\n\
            7f30-7f40 r-xp 00000000 fd:01 98 /old/libcuda.so.1 (deleted)\n\
            7f40-7f50 r-xp 00000000 fd:01 97 /usr/lib/libcudart.so.12\n\
            7f50-7f60 rw-p 00000000 00:00 0 \n";
        assert_eq!(
            libcuda_in_maps(maps),
            vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03".to_string(), "/opt/my dir/libcuda.so.1".to_string()]
        );
    }

    #[test]
    fn deleted_mappings_are_found_by_their_range() {
        let maps = "7f00-7f10 r--p 00000000 fd:01 98 /usr/lib/libcuda.so.535.1 (deleted)\n\
            7f10-7f20 r-xp 00010000 fd:01 98 /usr/lib/libcuda.so.535.1 (deleted)\n\
            7f20-7f30 r-xp 00000000 fd:01 99 /usr/lib/libcuda.so.1\n\
            7f30-7f40 r-xp 00000000 fd:01 97 /tmp/x (deleted)\n";
        assert_eq!(deleted_libcuda_in_maps(maps), vec![("7f00-7f10".to_string(), "/usr/lib/libcuda.so.535.1".to_string())]);
    }

    #[test]
    fn names() {
        assert!(is_libcuda_name("libcuda.so.1"));
        assert!(is_libcuda_name("libcuda.so"));
        assert!(!is_libcuda_name("libcudart.so.12"));
        assert!(!is_libcuda_name("libcuda.so1"));
    }
}
