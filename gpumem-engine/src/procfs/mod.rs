//! One parser per /proc file the agent reads, so that every reader agrees
//! on the details (a mapping's path may hold spaces and end in
//! " (deleted)"; a status line's value is tab-separated; cgroup v1 and v2
//! lines share one shape).
pub mod numa_maps;

use std::{
    io,
    ops::Range,
    path::{Path, PathBuf},
};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub range: Range<u64>,
    /// `r-xp` and the like.
    pub perms: String,
    /// File offset of the mapping's start.
    pub offset: u64,
    /// Device of the file, as maps shows it (`fd:01`).
    pub dev: String,
    pub inode: u64,
    /// The file's path inside the process's mount namespace, without the
    /// " (deleted)" suffix; None for anonymous mappings and pseudo-paths
    /// (`[stack]`, `[vdso]`).
    pub path: Option<String>,
    /// The file was deleted or replaced on disk since it was mapped: its
    /// path now names another file (or none); the old one opens through
    /// `map_files_path`.
    pub deleted: bool,
}

impl MapsEntry {
    /// The `START-END` name of the mapping in `/proc/PID/map_files`.
    pub fn range_name(&self) -> String {
        format!("{:x}-{:x}", self.range.start, self.range.end)
    }

    /// Whether the mapping is executable.
    pub fn executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }
}

/// Parses `/proc/PID/maps`; lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    parse_maps_bytes(text.as_bytes())
}

/// Parses `/proc/PID/maps` as the kernel writes it: bytes, since a file name
/// need not be UTF-8 (such a name is kept lossily; the file still opens
/// through `map_files`), and one unreadable name must not hide the process.
pub fn parse_maps_bytes(text: &[u8]) -> Vec<MapsEntry> {
    text.split(|&b| b == b'\n').filter_map(parse_maps_line).collect()
}

/// The kernel writes a newline in a mapped file's name as `\012` (its
/// only escape there: `seq_file_path(m, file, "\n")`), so that one mapping
/// stays one line.
fn unescape_maps_path(path: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    const NEWLINE: &[u8] = b"\\012";
    if !path.windows(NEWLINE.len()).any(|w| w == NEWLINE) {
        return std::borrow::Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(path.len());
    let mut rest = path;
    while !rest.is_empty() {
        if rest.starts_with(NEWLINE) {
            out.push(b'\n');
            rest = &rest[NEWLINE.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    std::borrow::Cow::Owned(out)
}

fn parse_maps_line(line: &[u8]) -> Option<MapsEntry> {
    // address perms offset dev inode [pathname]; the pathname may hold spaces.
    let mut fields = line.splitn(6, |&b| b == b' ');
    let mut text = || std::str::from_utf8(fields.next()?).ok();
    let (range, perms, offset, dev, inode) = (text()?, text()?, text()?, text()?, text()?);
    let rest = fields.next().unwrap_or(b"");
    let rest = &rest[rest.iter().position(|&b| b != b' ').unwrap_or(rest.len())..];
    let (start, end) = range.split_once('-')?;
    let range = u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?;
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let inode = inode.parse().ok()?;
    let (path, deleted) = match rest.strip_suffix(b" (deleted)") {
        Some(p) => (p, true),
        None => (rest, false),
    };
    let file = path.starts_with(b"/");
    let deleted = deleted && file;
    let path = file.then(|| String::from_utf8_lossy(&unescape_maps_path(path)).into_owned());
    Some(MapsEntry { range, perms: perms.to_string(), offset, dev: dev.to_string(), inode, path, deleted })
}

/// Reads and parses `/proc/PID/maps`.
pub fn read_maps(pid: u32) -> io::Result<Vec<MapsEntry>> {
    Ok(parse_maps_bytes(&std::fs::read(format!("/proc/{pid}/maps"))?))
}

/// A path inside a process's mount namespace, as the agent can open it.
pub fn in_root(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// Whether `path` is (now) the file with inode `inode`.
fn is_inode(path: &Path, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.ino() == inode)
}

/// Whether `path` is the file maps names by device (`fd:01`) and inode.
pub fn is_file_of(path: &Path, dev: &str, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path)
        .is_ok_and(|m| m.is_file() && m.ino() == inode && format!("{:02x}:{:02x}", libc::major(m.dev()), libc::minor(m.dev())) == dev)
}

/// Where the agent opens the file a process maps at `path` (inode
/// `inode`): through the process's root (its mount namespace), or, for a
/// process that chroot'ed without a mount namespace of its own (whose maps
/// name paths as the host sees them), the path itself: whichever is the
/// mapped file. A path through the root must lead to the mapped file both
/// as the kernel walks it and resolved inside that root only
/// ([`open_in_root`]): an absolute symlink in a container would otherwise
/// reach the host's files.
pub fn mapped_file(pid: u32, path: &str, inode: u64) -> PathBuf {
    use std::os::unix::fs::MetadataExt as _;
    let through_root = in_root(pid, path);
    let within = || open_in_root(pid, path).and_then(|f| f.metadata()).is_ok_and(|m| m.ino() == inode);
    if !(is_inode(&through_root, inode) && within()) && is_inode(Path::new(path), inode) {
        PathBuf::from(path)
    } else {
        through_root
    }
}

/// The link that opens a mapping's file as the process mapped it, even
/// when it was deleted or replaced since (needs CAP_SYS_ADMIN or
/// CAP_CHECKPOINT_RESTORE).
pub fn map_files_path(pid: u32, entry: &MapsEntry) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/map_files/{}", entry.range_name()))
}

/// Where the agent opens a mapped file: its `map_files` link, which is the
/// mapped file itself whatever its name says (escaped characters, a name
/// that is not UTF-8, a file renamed or swapped under the same path since);
/// without the capability for it, the path through the process's root
/// when that is the mapped inode.
pub fn open_path(pid: u32, entry: &MapsEntry) -> Option<PathBuf> {
    let path = entry.path.as_deref()?;
    let link = map_files_path(pid, entry);
    Some(if entry.deleted || is_inode(&link, entry.inode) { link } else { mapped_file(pid, path, entry.inode) })
}

/// Opens `path` as process `pid` sees it (see [`open_within`]).
pub fn open_in_root(pid: u32, path: &str) -> io::Result<std::fs::File> {
    open_within(Path::new(&format!("/proc/{pid}/root")), path)
}

/// Opens `path` resolved inside the directory `root` only, as if it were
/// `/` (`..` and symlinks, absolute ones included, cannot leave it; no
/// magic links), as a regular file (a FIFO or a device in its place would
/// block or never end).
pub fn open_within(root: &Path, path: &str) -> io::Result<std::fs::File> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;
    let root = std::fs::File::open(root)?;
    let name = std::ffi::CString::new(Path::new(path).as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    use std::os::fd::AsRawFd as _;
    // SAFETY: the pointers are valid for the call; the size is open_how's.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{path} is not a regular file")));
    }
    Ok(file)
}

/// Reads at most `limit` bytes of a file inside `root` (see
/// [`open_within`]); a longer file is an error, not a truncated read.
pub fn read_within(root: &Path, path: &str, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut data = Vec::new();
    open_within(root, path)?.take(limit + 1).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{path} is over {limit} bytes")));
    }
    Ok(data)
}

/// The fields of `/proc/PID/status` the agent uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The process's name (its comm).
    pub name: Option<String>,
    /// The state letter (`R`, `S`, `Z`, `X`, ...).
    pub state: Option<char>,
    /// Effective capabilities.
    pub cap_eff: Option<u64>,
    /// The pid in each nested pid namespace, outermost first.
    pub ns_pids: Vec<u32>,
    /// Resident and swapped-out memory (VmRSS, VmSwap), bytes.
    pub resident_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
}

impl Status {
    /// A zombie or dead process shows neither its cgroup nor its namespaces.
    pub fn gone(&self) -> bool {
        matches!(self.state, Some('Z' | 'X'))
    }

    /// The pid inside the process's own (innermost) pid namespace.
    pub fn ns_pid(&self) -> Option<u32> {
        self.ns_pids.last().copied()
    }
}

pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match key {
            "Name" => s.name = Some(value.to_string()),
            "State" => s.state = value.chars().next(),
            "CapEff" => s.cap_eff = u64::from_str_radix(value, 16).ok(),
            "NSpid" => s.ns_pids = value.split_whitespace().filter_map(|p| p.parse().ok()).collect(),
            "VmRSS" => s.resident_bytes = kib(value),
            "VmSwap" => s.swap_bytes = kib(value),
            _ => {}
        }
    }
    s
}

/// `123 kB` in bytes.
fn kib(value: &str) -> Option<u64> {
    value.strip_suffix("kB")?.trim().parse::<u64>().ok()?.checked_mul(1024)
}

/// Pages swapped in and out since boot (`/proc/vmstat` pswpin, pswpout), in bytes.
pub fn swap_bytes_since_boot() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    let page = page_size();
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
    Some((field("pswpin")? * page, field("pswpout")? * page))
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
}

/// `pid`: a number, or `self`.
pub fn read_status(pid: impl std::fmt::Display) -> io::Result<Status> {
    Ok(parse_status(&String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/status"))?)))
}

/// One line of `/proc/PID/cgroup`: `hierarchy:controllers:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLine {
    pub hierarchy: u32,
    /// Empty for the v2 unified hierarchy (`0::/path`).
    pub controllers: Vec<String>,
    pub path: String,
}

impl CgroupLine {
    pub fn is_v2(&self) -> bool {
        self.hierarchy == 0 && self.controllers.is_empty()
    }

    pub fn has_controller(&self, name: &str) -> bool {
        self.controllers.iter().any(|c| c == name)
    }
}

pub fn parse_cgroup(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.parse().ok()?;
            let controllers = parts.next()?;
            let path = parts.next()?.to_string();
            let controllers = controllers.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
            Some(CgroupLine { hierarchy, controllers, path })
        })
        .collect()
}

/// Reads `/proc/PID/cgroup`. The kernel writes cgroup paths unescaped, so
/// a cgroup named with a newline (one a user was delegated) adds lines of
/// its owner's choosing — another container's, to be attributed to it. A
/// file whose hierarchies are not this kernel's (those of the agent's own
/// file, in its order) is refused: `InvalidData`, saying why.
pub fn read_cgroup(pid: u32) -> io::Result<Vec<CgroupLine>> {
    let lines = parse_cgroup(&String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cgroup"))?));
    match cgroup_forgery(&lines, own_hierarchies()) {
        Some(why) => Err(io::Error::new(io::ErrorKind::InvalidData, why)),
        None => Ok(lines),
    }
}

/// Each line's hierarchy and controllers: what every process's file shows alike.
type Hierarchies = Vec<(u32, Vec<String>)>;

fn hierarchies(lines: &[CgroupLine]) -> Hierarchies {
    lines.iter().map(|l| (l.hierarchy, l.controllers.clone())).collect()
}

fn own_hierarchies() -> &'static Hierarchies {
    static OWN: std::sync::OnceLock<Hierarchies> = std::sync::OnceLock::new();
    OWN.get_or_init(|| std::fs::read_to_string("/proc/self/cgroup").map(|t| hierarchies(&parse_cgroup(&t))).unwrap_or_default())
}

/// Why `lines` cannot be the kernel's own writing, if they cannot.
fn cgroup_forgery(lines: &[CgroupLine], own: &Hierarchies) -> Option<String> {
    let theirs = hierarchies(lines);
    if own.is_empty() || theirs == *own {
        return None;
    }
    Some(format!(
        "its cgroup file has {} hierarchy line(s) where this kernel writes {} (a cgroup name with a newline in it)",
        theirs.len(),
        own.len()
    ))
}

/// Resident pages from `/proc/PID/statm` (its second field).
pub fn parse_statm_resident_pages(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// This process's resident pages (`/proc/self/statm`).
pub fn own_resident_pages() -> Option<u64> {
    parse_statm_resident_pages(&std::fs::read_to_string("/proc/self/statm").ok()?)
}

/// Resident KiB of this process's mappings whose header ends with `suffix`
/// (`/proc/self/smaps`); 0 if unreadable.
pub fn own_smaps_resident_kib(suffix: &str) -> u64 {
    std::fs::read_to_string("/proc/self/smaps").map_or(0, |smaps| smaps_resident_kib(&smaps, suffix))
}

/// Whether `/proc/self/mounts` has a file system of type `fstype` on `target`.
pub fn mounted(target: &str, fstype: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| parse_mounts(&m).any(|(t, f)| t == target && f == fstype))
}

/// (mount point, type) of each line of `/proc/PID/mounts`.
pub fn parse_mounts(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines().filter_map(|l| {
        let mut w = l.split_whitespace();
        let _source = w.next()?;
        Some((w.next()?, w.next()?))
    })
}

/// The open descriptors of a process and what each points to (`/proc/PID/fd`).
pub fn fd_targets(pid: u32) -> impl Iterator<Item = (u32, PathBuf)> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten().filter_map(|fd| {
        let n = fd.file_name().to_str()?.parse().ok()?;
        Some((n, std::fs::read_link(fd.path()).ok()?))
    })
}

/// Resident KiB of the mappings of `/proc/PID/smaps` whose header line
/// ends with `suffix` (e.g. `anon_inode:bpf-map`).
pub fn smaps_resident_kib(smaps: &str, suffix: &str) -> u64 {
    let mut matching = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("Rss:") if matching => kib += words.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
            // A mapping's header line starts with its address range.
            Some(first) if first.contains('-') && first.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') => {
                matching = line.ends_with(suffix);
            }
            _ => {}
        }
    }
    kib
}

/// The numeric entries of /proc (process ids).
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// Whether the process (or thread `tid` of `pid`) still exists.
pub fn alive(pid: u32, tid: Option<u32>) -> bool {
    match tid {
        Some(tid) => Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
        None => Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// A process's memory, read through /proc/PID/mem (python::memory::Memory) (needs ptrace access:
/// root or CAP_SYS_PTRACE, as for its maps).
pub struct ProcessMemory(std::fs::File);

impl ProcessMemory {
    pub fn open(pid: u32) -> io::Result<Self> {
        Ok(ProcessMemory(std::fs::File::open(format!("/proc/{pid}/mem"))?))
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_with_spaces_deleted_files_and_pseudo_paths() {
        let m = parse_maps(
            "55d0-55e0 r--p 00000000 fd:01 12 /usr/bin/python3.11\n\
             55e0-55f0 r-xp 00010000 fd:01 12 /usr/bin/python3.11\n\
             7f00-7f10 rw-p 00000000 00:00 0 \n\
             7f10-7f20 r-xp 00002000 fd:01 13 /opt/lib dir/libx.so\n\
             7f20-7f30 r-xp 00000000 fd:01 98 /old/libcuda.so.1 (deleted)\n\
             7ffc-7ffd rw-p 00000000 00:00 0                          [stack]\n\
             not a maps line\n",
        );
        assert_eq!(m.len(), 6);
        assert_eq!((m[1].range.clone(), m[1].offset, m[1].inode), (0x55e0..0x55f0, 0x10000, 12));
        assert!(m[1].executable() && !m[0].executable());
        assert_eq!(m[2].path, None);
        assert_eq!(m[3].path.as_deref(), Some("/opt/lib dir/libx.so"));
        assert_eq!((m[4].path.as_deref(), m[4].deleted), (Some("/old/libcuda.so.1"), true));
        assert_eq!(m[4].range_name(), "7f20-7f30");
        assert_eq!(map_files_path(7, &m[4]), PathBuf::from("/proc/7/map_files/7f20-7f30"));
        assert_eq!(open_path(7, &m[4]), Some(PathBuf::from("/proc/7/map_files/7f20-7f30")));
        assert_eq!(open_path(7, &m[3]), Some(PathBuf::from("/proc/7/root/opt/lib dir/libx.so")));
        assert_eq!((m[5].path.as_deref(), m[5].deleted), (None, false));
    }

    #[test]
    fn maps_names_as_the_kernel_writes_them() {
        // A newline is written as \012; a name need not be UTF-8; one such
        // name does not lose the other lines.
        let mut text = b"7f00-7f10 r-xp 00000000 fd:01 5 /tmp/a\\012b c/libcuda.so.1\n".to_vec();
        text.extend_from_slice(b"7f10-7f20 r-xp 00000000 fd:01 6 /tmp/\xff\xfe/libx.so (deleted)\n");
        text.extend_from_slice(b"7f20-7f30 r-xp 00000000 fd:01 7 /usr/lib/liby.so\n");
        let m = parse_maps_bytes(&text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].path.as_deref(), Some("/tmp/a\nb c/libcuda.so.1"));
        assert_eq!((m[1].path.as_deref(), m[1].deleted), (Some("/tmp/\u{fffd}\u{fffd}/libx.so"), true));
        assert_eq!(m[2].path.as_deref(), Some("/usr/lib/liby.so"));
    }

    #[test]
    fn a_mapped_file_opens_by_its_inode() {
        // This process's own executable: its map_files link is the file.
        let maps = read_maps(std::process::id()).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let e = maps.iter().find(|e| e.path.as_deref() == exe.to_str()).unwrap();
        let opened = open_path(std::process::id(), e).unwrap();
        assert!(is_inode(&opened, e.inode), "{}", opened.display());
        // Resolved inside this process's root, which is /.
        assert!(open_in_root(std::process::id(), exe.to_str().unwrap()).is_ok());
        assert!(open_in_root(std::process::id(), "/proc/self/exe").is_err(), "no magic links");
    }

    #[test]
    fn status_fields() {
        let s = parse_status("Name:\tx\nState:\tZ (zombie)\nCapEff:\t000001ffffffffff\nNSpid:\t4242\t17\n");
        assert_eq!((s.state, s.cap_eff, s.ns_pid()), (Some('Z'), Some(0x1ff_ffff_ffff), Some(17)));
        assert!(s.gone());
        let s = parse_status("Name:\tx\nState:\tS (sleeping)\nNSpid:\t4242\n");
        assert_eq!((s.cap_eff, s.ns_pid(), s.gone()), (None, Some(4242), false));
        assert_eq!(parse_status("Name:\tx\n").ns_pid(), None);
    }

    #[test]
    fn cgroup_lines_v1_and_v2() {
        let c = parse_cgroup("12:pids:/\n4:memory,hugetlb:/kubepods/pod1\n1:name=systemd:/user.slice\n0::/init.scope\n");
        assert_eq!(c.len(), 4);
        assert!(c[1].has_controller("memory") && !c[1].is_v2());
        assert_eq!(c[1].path, "/kubepods/pod1");
        assert!(c[3].is_v2());
        assert_eq!(c[3].path, "/init.scope");
    }

    #[test]
    fn a_cgroup_name_with_a_newline_cannot_forge_another_containers_line() {
        let own = hierarchies(&parse_cgroup("12:memory:/user.slice\n0::/user.slice\n"));
        assert_eq!(cgroup_forgery(&parse_cgroup("12:memory:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\n"), &own), None);
        let forged = parse_cgroup("12:memory:/user.slice\n0::/user.slice/x\n0::/kubepods/podvictim/0123\n");
        assert!(cgroup_forgery(&forged, &own).unwrap().contains("3 hierarchy line(s) where this kernel writes 2"));
        let extra_v1 = parse_cgroup("12:memory:/user.slice\n3:memory:/kubepods/podvictim/0123\n0::/u\n");
        assert!(cgroup_forgery(&extra_v1, &own).is_some());
        // This process's own file is this kernel's.
        assert!(read_cgroup(std::process::id()).is_ok());
    }

    #[test]
    fn mounts_lines() {
        let m: Vec<(&str, &str)> = parse_mounts("proc /proc proc rw 0 0\nnodev /sys/kernel/tracing tracefs rw 0 0\n").collect();
        assert_eq!(m, [("/proc", "proc"), ("/sys/kernel/tracing", "tracefs")]);
    }

    #[test]
    fn statm_and_smaps() {
        assert_eq!(parse_statm_resident_pages("1000 250 30 1 0 200 0\n"), Some(250));
        let smaps = "7f00-7f10 rw-s 00000000 00:0f 1 anon_inode:bpf-map\nRss:  8 kB\n7f10-7f20 rw-p 00000000 00:00 0 \nRss: 100 kB\n";
        assert_eq!(smaps_resident_kib(smaps, "anon_inode:bpf-map"), 8);
    }
}
