//! Finding libcuda copies on the host: the one ld.so.cache resolves, the ones
//! mapped by running processes (through /proc/PID/root, so containers count),
//! and the ones named on the command line. Copies are told apart by inode.
use std::{
    fs,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use gpumem_engine::procfs;

/// How a library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    CommandLine,
    LdCache,
    ProcessMaps {
        pid: u32,
    },
    /// Mapped by a process from a file since deleted or replaced on disk.
    DeletedInProcess {
        pid: u32,
    },
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
    /// A path the agent opens and attaches to: for a mapped file, its
    /// /proc/PID/map_files link (that file whatever its name says, and
    /// nothing another process could swap in); else through /proc/PID/root.
    pub path: PathBuf,
    /// How it is named to the user: the path through the process's root,
    /// as the process names it (may hold any character: print it escaped).
    pub name: String,
    pub dev: u64,
    pub ino: u64,
    pub source: Source,
    /// The process found mapping it (None: named on the command line or in ld.so.cache).
    pub pid: Option<u32>,
}

impl Library {
    pub fn key(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// The library opened for reading and attaching. A map_files link is
    /// named by its mapping's address range, which the process can change
    /// between discovery and the attach (the loader maps a library in
    /// steps, and a split or a new mapping renames it): the file opened
    /// once and named by its descriptor stays the same file.
    pub fn open(&self) -> std::io::Result<Opened> {
        let file = fs::File::open(&self.path)?;
        let md = file.metadata()?;
        if (md.dev(), md.ino()) != self.key() {
            return Err(std::io::Error::other(format!("{} is another file since it was found", self.path.display())));
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Ok(Opened { _file: file, path, name: self.name.clone() })
    }
}

/// A library held open while it is read and attached to (see [`Library::open`]).
pub struct Opened {
    _file: fs::File,
    /// This process's link to the open file: what the kernel resolves for a
    /// uprobe, and what the ELF readers open.
    pub path: PathBuf,
    /// The library's name, for what is said about it.
    pub name: String,
}

impl Opened {
    /// A message about the open file as users read it: naming the library,
    /// not this process's descriptor link, which means nothing to them.
    pub fn said(&self, message: impl std::fmt::Display) -> String {
        message.to_string().replace(&*self.path.to_string_lossy(), &self.name)
    }
}

pub fn stat_library(path: &Path, source: Source) -> std::io::Result<Library> {
    let md = fs::metadata(path)?;
    Ok(Library { path: path.to_path_buf(), name: path.display().to_string(), dev: md.dev(), ino: md.ino(), source, pid: None })
}

/// The library a process maps with `entry`, opened by its inode (see
/// `procfs::open_path`) and named by its path in the process's root.
fn mapped_library(pid: u32, entry: &procfs::MapsEntry, source: Source) -> Option<Library> {
    let lib = stat_library(&procfs::open_path(pid, entry)?, source).ok()?;
    let name = procfs::in_root(pid, entry.path.as_deref()?).display().to_string();
    (lib.ino == entry.inode).then_some(Library { name, pid: Some(pid), ..lib })
}

/// Is this file name a libcuda driver library (libcuda.so, libcuda.so.1, libcuda.so.535.x)?
pub fn is_libcuda_name(name: &str) -> bool {
    name == "libcuda.so" || name.starts_with("libcuda.so.")
}

/// libcuda paths the dynamic linker's cache resolves (what `ldconfig -p`
/// lists), read from the file itself.
pub fn from_ld_cache() -> Result<Vec<PathBuf>, super::ld_cache::LdCacheError> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for e in super::ld_cache::read(Path::new("/etc/ld.so.cache"))? {
        if is_libcuda_name(&e.name) && !paths.contains(&e.path) {
            paths.push(e.path);
        }
    }
    Ok(paths)
}

/// The first mapping of each file one process maps whose name passes
/// `is_name` — deleted or replaced ones only with `deleted_too` (their
/// map_files link opens the old inode, which is what the process still
/// runs: a driver upgrade under a running job).
fn named_in_maps(maps: &[procfs::MapsEntry], is_name: fn(&str) -> bool, deleted_too: bool) -> Vec<&procfs::MapsEntry> {
    let mut out: Vec<&procfs::MapsEntry> = Vec::new();
    let named = |e: &&procfs::MapsEntry| e.path.as_deref().is_some_and(|p| is_name(p.rsplit('/').next().unwrap_or("")));
    for e in maps.iter().filter(|e| deleted_too || !e.deleted).filter(named) {
        if !out.iter().any(|o| (o.path == e.path && o.deleted == e.deleted) || (o.dev == e.dev && o.inode == e.inode)) {
            out.push(e);
        }
    }
    out
}

/// Is this file name a dynamic loader (glibc's ld-linux-x86-64.so.2,
/// ld-linux.so.2, old ld-2.31.so; musl's ld-musl-x86_64.so.1)? Each has the
/// debugger hook `_dl_debug_state`.
pub fn is_loader_name(name: &str) -> bool {
    name.starts_with("ld-") && name.contains(".so")
}

/// What one process maps that the agent attaches to.
#[derive(Debug, Default)]
pub struct Found {
    pub libcuda: Vec<Library>,
    pub loaders: Vec<Library>,
    /// PyTorch's libc10_cuda.so copies (their allocator probes).
    pub torch: Vec<Library>,
}

/// The libcuda copies and dynamic loaders one process maps; None if its
/// maps cannot be read (exited meanwhile, a kernel thread).
pub fn in_process(pid: u32) -> Option<Found> {
    let maps = procfs::read_maps(pid).ok()?;
    let source = |e: &procfs::MapsEntry| if e.deleted { Source::DeletedInProcess { pid } } else { Source::ProcessMaps { pid } };
    let libraries = |is_name: fn(&str) -> bool, deleted_too: bool| -> Vec<Library> {
        named_in_maps(&maps, is_name, deleted_too).into_iter().filter_map(|e| mapped_library(pid, e, source(e))).collect()
    };
    // A deleted copy opens only through map_files (CAP_SYS_ADMIN or
    // CAP_CHECKPOINT_RESTORE); without, it is missed.
    Some(Found {
        libcuda: libraries(is_libcuda_name, true),
        loaders: libraries(is_loader_name, false),
        torch: libraries(super::torch::is_torch_cuda_name, false),
    })
}

/// Scans every process's maps for libcuda copies and dynamic loaders;
/// returns them and how many processes were read.
pub fn from_processes(skip_pid: u32) -> (Found, u64) {
    let mut all = Found::default();
    let mut read = 0;
    for pid in procfs::pids().filter(|&p| p != skip_pid) {
        let Some(found) = in_process(pid) else { continue };
        read += 1;
        all.libcuda.extend(found.libcuda);
        all.loaders.extend(found.loaders);
        all.torch.extend(found.torch);
    }
    (all, read)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paths `named_in_maps` picks (deleted or not, as asked).
    fn paths(maps: &str, is_name: fn(&str) -> bool, deleted: bool) -> Vec<String> {
        let maps = procfs::parse_maps(maps);
        named_in_maps(&maps, is_name, deleted).into_iter().filter(|e| e.deleted == deleted).filter_map(|e| e.path.clone()).collect()
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
            paths(maps, is_libcuda_name, false),
            vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03".to_string(), "/opt/my dir/libcuda.so.1".to_string()]
        );
    }

    #[test]
    fn deleted_mappings_are_found_by_their_range() {
        let maps = "7f00-7f10 r--p 00000000 fd:01 98 /usr/lib/libcuda.so.535.1 (deleted)\n\
            7f10-7f20 r-xp 00010000 fd:01 98 /usr/lib/libcuda.so.535.1 (deleted)\n\
            7f20-7f30 r-xp 00000000 fd:01 99 /usr/lib/libcuda.so.1\n\
            7f30-7f40 r-xp 00000000 fd:01 97 /tmp/x (deleted)\n";
        let maps = procfs::parse_maps(maps);
        let found: Vec<(String, Option<&str>)> =
            named_in_maps(&maps, is_libcuda_name, true).iter().filter(|e| e.deleted).map(|e| (e.range_name(), e.path.as_deref())).collect();
        assert_eq!(found, vec![("7f00-7f10".to_string(), Some("/usr/lib/libcuda.so.535.1"))]);
    }

    #[test]
    fn loaders_are_found_by_name() {
        let maps = "7f00-7f10 r--p 00000000 fd:01 5 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n\
            7f10-7f20 r-xp 00001000 fd:01 5 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n\
            7f20-7f30 r-xp 00000000 fd:01 6 /lib/ld-musl-x86_64.so.1\n\
            7f30-7f40 r-xp 00000000 fd:01 7 /usr/lib/libld-helper.so\n\
            7f40-7f50 r-xp 00000000 fd:01 8 /usr/bin/ld-tool\n";
        assert_eq!(
            paths(maps, is_loader_name, false),
            vec!["/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2".to_string(), "/lib/ld-musl-x86_64.so.1".to_string()]
        );
    }

    #[test]
    fn names() {
        assert!(is_libcuda_name("libcuda.so.1"));
        assert!(is_libcuda_name("libcuda.so"));
        assert!(!is_libcuda_name("libcudart.so.12"));
        assert!(!is_libcuda_name("libcuda.so1"));
    }

    #[test]
    fn an_opened_library_stays_the_same_file_after_its_path_goes() {
        let dir = std::env::temp_dir().join(format!("gpumem-open-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (path, other) = (dir.join("libcuda.so.1"), dir.join("other"));
        fs::write(&path, b"the library").unwrap();
        fs::write(&other, b"another file").unwrap();
        let lib = stat_library(&path, Source::CommandLine).unwrap();
        let opened = lib.open().unwrap();
        // What a map_files link does when its mapping changes: the name goes.
        fs::remove_file(&path).unwrap();
        assert_eq!(fs::read(&opened.path).unwrap(), b"the library");
        // What is said about it names the library, not the descriptor link.
        let err = gpumem_engine::formats::symbols::function_offsets(&opened.path, |_| true).unwrap_err();
        let said = opened.said(&err);
        assert!(said.contains(&path.display().to_string()) && !said.contains("/proc/self/fd/"), "{said}");
        // A name that now opens another file is refused, not read.
        fs::rename(&other, &path).unwrap();
        let err = lib.open().err().expect("another inode");
        assert!(err.to_string().contains("another file since it was found"), "{err}");
        drop(opened);
        fs::remove_dir_all(&dir).unwrap();
    }
}
