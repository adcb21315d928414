//! A stand-in NVIDIA device for gpumem's tests: a FUSE file system with
//! `nvidiactl`, `nvidia0` and `nvidia-uvm`, to which the real kernel routes
//! real ioctl(2) calls. FUSE passes `_IOC`-encoded ioctls (the RM escapes are
//! `_IOWR('F', nr, size)`) to this server with their parameter struct and
//! copies the answer back, as the driver would; UVM's plain command numbers
//! carry no data. The server answers like the resource manager: a new handle
//! in `hObjectNew`, the status in the struct.
//!
//! Usage: fake_nvidia_dev MOUNTPOINT   (runs until killed; as root)
use std::{
    collections::HashSet,
    ffi::OsStr,
    sync::Mutex,
    time::{Duration, UNIX_EPOCH},
};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, INodeNo, IoctlFlags, ReplyAttr, ReplyDirectory, ReplyEntry, ReplyIoctl, Request,
};
use std::mem::offset_of;

use gpumem_common::nv::{self, Nvos00, Nvos21, Nvos33WithFd, Nvos54, Nvos64};

const TTL: Duration = Duration::from_secs(60);
const FILES: [(u64, &str); 3] = [(2, "nvidiactl"), (3, "nvidia0"), (4, "nvidia-uvm")];
/// A parent handle the stand-in refuses, to produce a failed allocation.
pub const BAD_PARENT: u32 = 0xbad;
/// NV_ERR_INVALID_OBJECT_PARENT.
const STATUS_BAD_PARENT: u32 = 0x38;
/// NV_ERR_OBJECT_NOT_FOUND.
const STATUS_NOT_FOUND: u32 = 0x57;

struct FakeNvidia {
    next_handle: Mutex<u32>,
    live: Mutex<HashSet<u32>>,
}

fn attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: if kind == FileType::Directory { 0o755 } else { 0o666 },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

impl Filesystem for FakeNvidia {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match FILES.iter().find(|(_, n)| Some(*n) == name.to_str()) {
            Some((ino, _)) if parent == INodeNo::ROOT => reply.entry(&TTL, &attr(*ino, FileType::RegularFile), fuser::Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            reply.attr(&TTL, &attr(1, FileType::Directory));
        } else if FILES.iter().any(|(i, _)| *i == ino.0) {
            reply.attr(&TTL, &attr(ino.0, FileType::RegularFile));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::ENOENT);
            return;
        }
        let mut entries = vec![(1, FileType::Directory, "."), (1, FileType::Directory, "..")];
        entries.extend(FILES.iter().map(|(i, n)| (*i, FileType::RegularFile, *n)));
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if ino.0 == 4 {
            // UVM commands are plain numbers: no data crosses FUSE.
            return match cmd {
                nv::UVM_MAP_EXTERNAL_ALLOCATION | nv::UVM_FREE => reply.ioctl(0, &[]),
                _ => reply.error(Errno::ENOTTY),
            };
        }
        if nv::ioc_type(cmd) != nv::IOC_TYPE {
            return reply.error(Errno::ENOTTY);
        }
        let mut p = in_data.to_vec();
        p.resize(out_size.max(in_data.len() as u32) as usize, 0);
        match (nv::ioc_nr(cmd), nv::ioc_size(cmd)) {
            (nv::ESC_RM_ALLOC, size @ (nv::NVOS21_SIZE | nv::NVOS64_SIZE)) => {
                // The two forms share their first fields (checked in gpumem_common::nv).
                let status_at = if size == nv::NVOS64_SIZE { offset_of!(Nvos64, status) } else { offset_of!(Nvos21, status) };
                let new_at = offset_of!(Nvos21, h_object_new);
                if u32_at(&p, offset_of!(Nvos21, h_object_parent)) == BAD_PARENT {
                    put_u32(&mut p, status_at, STATUS_BAD_PARENT);
                } else {
                    let mut handle = u32_at(&p, new_at);
                    if handle == 0 {
                        let mut next = self.next_handle.lock().expect("lock");
                        *next += 1;
                        handle = *next;
                    }
                    self.live.lock().expect("lock").insert(handle);
                    put_u32(&mut p, new_at, handle);
                    put_u32(&mut p, status_at, 0);
                }
            }
            (nv::ESC_RM_FREE, nv::NVOS00_SIZE) => {
                let known = self.live.lock().expect("lock").remove(&u32_at(&p, offset_of!(Nvos00, h_object_old)));
                put_u32(&mut p, offset_of!(Nvos00, status), if known { 0 } else { STATUS_NOT_FOUND });
            }
            (nv::ESC_RM_CONTROL, nv::NVOS54_SIZE) => put_u32(&mut p, offset_of!(Nvos54, status), 0),
            (nv::ESC_RM_MAP_MEMORY, nv::NVOS33_WITH_FD_SIZE) => {
                let at = offset_of!(Nvos33WithFd, offset);
                let offset = u64::from_ne_bytes(p[at..at + 8].try_into().expect("8 bytes"));
                let at = offset_of!(Nvos33WithFd, p_linear_address);
                p[at..at + 8].copy_from_slice(&(0x7f00_0000_0000u64 + offset).to_ne_bytes());
                put_u32(&mut p, offset_of!(Nvos33WithFd, status), 0);
            }
            _ => return reply.error(Errno::ENOTTY),
        }
        reply.ioctl(0, &p[..out_size as usize]);
    }
}

fn main() {
    let Some(mountpoint) = std::env::args().nth(1) else {
        eprintln!("usage: fake_nvidia_dev MOUNTPOINT");
        std::process::exit(2);
    };
    let mut config = fuser::Config::default();
    config.mount_options.push(fuser::MountOption::FSName("fake-nvidia".into()));
    config.acl = fuser::SessionACL::All;
    let fs = FakeNvidia { next_handle: Mutex::new(0xcaf0_0000), live: Mutex::new(HashSet::new()) };
    if let Err(e) = fuser::mount(fs, &mountpoint, &config) {
        eprintln!("fake_nvidia_dev: mounting on {mountpoint}: {e}");
        std::process::exit(1);
    }
}
