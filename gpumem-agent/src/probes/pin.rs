//! Pinned kernel state (`gpumem serve`): the maps that hold what is live and
//! what is in flight, and every link, pinned in bpffs under
//! `<root>/<layout>/{maps,links}`, so that the probes keep running and
//! counting while no agent runs and a restarted agent takes over where the
//! last one stopped. The layout name says which gpumem made it: state of
//! another layout is removed (its links detached), never read.
use std::{
    collections::HashSet,
    ffi::CString,
    os::{fd::AsRawFd as _, unix::ffi::OsStrExt as _},
    path::{Path, PathBuf},
};

use gpumem_common::{counters::Stat, live, Event, PendingKey, StackEvent};

/// Where `serve` pins by default (a DaemonSet mounts the host's /sys/fs/bpf).
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/gpumem";

/// The maps shared across agents (see `gpumem_common::names::map::PINNED`).
pub const PINNED_MAPS: &[&str] = &gpumem_common::names::map::PINNED;

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// Makes the loader open the shared maps from the pin directory (or create
/// and pin them there).
pub fn share_maps(loader: &mut aya::EbpfLoader<'_>, pinned: Option<&Pinned>) {
    if let Some(p) = pinned {
        for name in PINNED_MAPS {
            loader.map_pin_path(name, p.maps.join(name));
        }
    }
}

impl super::Agent {
    /// With pinning: pins the links made since the last call, so that they
    /// outlive this process (a SIGKILL included).
    pub fn pin_new_links(&mut self) -> Result<(), super::ProbeError> {
        let Some(p) = &self.options.pin else { return Ok(()) };
        if !std::mem::replace(&mut self.links_changed, false) {
            return Ok(());
        }
        let programs: HashSet<u32> = self.ebpf.programs().filter_map(|(_, prog)| prog.info().ok().map(|i| i.id())).collect();
        pin_links_of(&programs, &p.links, &mut self.pinned_links).map(|_| ()).map_err(super::ProbeError::Pin)
    }

    /// Links this agent pinned.
    pub fn pinned_link_count(&self) -> usize {
        self.pinned_links.len()
    }

    /// Whether this agent pins its state.
    pub fn pinned(&self) -> Option<&Pinned> {
        self.options.pin.as_ref()
    }
}

/// The layout's name: its version and the sizes of what the pinned maps hold.
pub fn layout_name() -> String {
    let sizes = [
        std::mem::size_of::<Event>(),
        std::mem::size_of::<StackEvent>(),
        std::mem::size_of::<live::LiveKey>(),
        std::mem::size_of::<live::LiveEntry>(),
        std::mem::size_of::<PendingKey>(),
        Stat::COUNT as usize,
    ];
    // FNV-1a: stable across builds and Rust versions (unlike DefaultHasher).
    let mut h: u32 = 0x811c9dc5;
    for b in sizes.iter().flat_map(|s| (*s as u32).to_le_bytes()) {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    format!("v{}-{h:08x}", live::LAYOUT_VERSION)
}

/// One layout's directories.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Pinned {
    pub root: PathBuf,
    pub layout: String,
    pub maps: PathBuf,
    pub links: PathBuf,
}

impl Pinned {
    pub fn at(root: &Path) -> Self {
        let layout = layout_name();
        let dir = root.join(&layout);
        Pinned { root: root.to_path_buf(), maps: dir.join("maps"), links: dir.join("links"), layout }
    }

    /// Whether a previous agent left maps to adopt.
    pub fn has_state(&self) -> bool {
        self.maps.join(gpumem_common::names::map::LIVE).exists()
    }

    /// Links pinned now (by a previous agent, before this one pins its own).
    pub fn links_pinned(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.links).into_iter().flatten().filter_map(|e| e.ok().map(|e| e.path())).collect();
        v.sort();
        v
    }
}

/// What was found under the root before this agent started.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Said to the user: bpffs mounted, state of other layouts replaced.
    pub notes: Vec<String>,
}

/// Makes the root usable: bpffs mounted where it lives, state of other
/// layouts removed (their links detached), our layout's directories made.
pub fn prepare(p: &Pinned) -> Result<Prepared, String> {
    let mut out = Prepared::default();
    let mount_point = p.root.parent().unwrap_or(Path::new("/sys/fs/bpf"));
    if !is_bpffs(mount_point) {
        mount_bpffs(mount_point)?;
        out.notes.push(format!("mounted bpffs on {}", mount_point.display()));
    }
    for entry in std::fs::read_dir(&p.root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != p.layout {
            let (links, maps) = remove_tree(&entry.path());
            out.notes.push(format!(
                "pinned state of another gpumem layout ({name}, this one is {}) replaced: {links} links detached, {maps} maps unpinned",
                p.layout
            ));
        }
    }
    for dir in [&p.maps, &p.links] {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {} on bpffs: {e}", dir.display()))?;
    }
    Ok(out)
}

/// Removes one layout's pinned objects: links first (their programs stop),
/// then maps. Returns (links, maps) removed.
pub fn remove_tree(dir: &Path) -> (usize, usize) {
    let remove_all = |sub: &str| -> usize {
        let d = dir.join(sub);
        let n = std::fs::read_dir(&d).into_iter().flatten().flatten().filter(|e| std::fs::remove_file(e.path()).is_ok()).count();
        let _ = std::fs::remove_dir(&d);
        n
    };
    let counts = (remove_all("links"), remove_all("maps"));
    // Anything else a foreign layout holds.
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let _ = std::fs::remove_dir(dir);
    counts
}

/// Removes every layout under the root (`serve --cleanup`): (links, maps).
pub fn remove_all(root: &Path) -> (usize, usize) {
    let mut total = (0, 0);
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let (l, m) = remove_tree(&e.path());
        total = (total.0 + l, total.1 + m);
    }
    let _ = std::fs::remove_dir(root);
    total
}

/// One layout's pinned state found on disk (for `status`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct OnDisk {
    pub dir: String,
    pub layout: String,
    /// Whether this gpumem can adopt it (same layout) or would replace it.
    pub compatible: bool,
    pub links: usize,
    pub maps: usize,
}

/// What is pinned under the root.
pub fn inspect(root: &Path) -> Vec<OnDisk> {
    let count = |d: PathBuf| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    let ours = layout_name();
    let mut v: Vec<OnDisk> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let layout = e.file_name().to_string_lossy().into_owned();
            OnDisk {
                dir: e.path().display().to_string(),
                compatible: layout == ours,
                links: count(e.path().join("links")),
                maps: count(e.path().join("maps")),
                layout,
            }
        })
        .collect();
    v.sort_by(|a, b| a.dir.cmp(&b.dir));
    v
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs fills the struct; a zeroed one is a valid start.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a writable struct.
    unsafe { libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == BPF_FS_MAGIC }
}

fn mount_bpffs(at: &Path) -> Result<(), String> {
    std::fs::create_dir_all(at).map_err(|e| format!("bpffs: cannot create {}: {e}", at.display()))?;
    let target = CString::new(at.as_os_str().as_bytes()).map_err(|_| "bpffs path has a NUL byte".to_string())?;
    let (src, fstype) = (CString::new("bpf").expect("no NUL"), CString::new("bpf").expect("no NUL"));
    // SAFETY: valid NUL-terminated strings, no data argument.
    if unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) } != 0 {
        return Err(format!("bpffs is not mounted on {} and mounting it failed: {}", at.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

/// `bpf_attr` for BPF_OBJ_PIN.
#[repr(C)]
struct PinAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// `bpf_attr` for BPF_*_GET_FD_BY_ID.
#[repr(C)]
struct GetFdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
    _pad: u32,
}

/// Pins every link of these programs not pinned yet, named by link id; how
/// many were pinned. A link that goes away meanwhile is skipped.
pub fn pin_links_of(programs: &HashSet<u32>, dir: &Path, pinned: &mut HashSet<u32>) -> Result<usize, String> {
    let mut n = 0;
    for info in aya::programs::loaded_links().flatten() {
        if !programs.contains(&info.program_id()) || pinned.contains(&info.id()) {
            continue;
        }
        let attr = GetFdAttr { id: info.id(), next_id: 0, open_flags: 0, _pad: 0 };
        // SAFETY: a valid bpf_attr of the size given.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_GET_FD_BY_ID, &attr as *const _, std::mem::size_of::<GetFdAttr>()) };
        if fd < 0 {
            continue;
        }
        // SAFETY: the kernel gave us this descriptor.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        let path = dir.join(info.id().to_string());
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "pin path has a NUL byte".to_string())?;
        let attr = PinAttr { pathname: c.as_ptr() as u64, bpf_fd: fd.as_raw_fd() as u32, file_flags: 0, path_fd: 0, _pad: 0 };
        // SAFETY: a valid bpf_attr; the path outlives the call.
        if unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_PIN, &attr as *const _, std::mem::size_of::<PinAttr>()) } != 0 {
            return Err(format!("pinning link {} at {}: {}", info.id(), path.display(), std::io::Error::last_os_error()));
        }
        pinned.insert(info.id());
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_name_is_stable_and_says_its_version() {
        let name = layout_name();
        assert_eq!(name, layout_name());
        assert!(name.starts_with(&format!("v{}-", live::LAYOUT_VERSION)), "{name}");
        assert_eq!(name.len(), 2 + live::LAYOUT_VERSION.to_string().len() + 8);
    }
}
