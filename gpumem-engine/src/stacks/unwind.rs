//! Unwinding a captured user stack with the binaries' own CFI (.eh_frame,
//! .debug_frame) through framehop, per process, from its /proc/PID/maps.
use std::{collections::HashMap, ops::Range, sync::Arc};

#[cfg(target_arch = "aarch64")]
use framehop::aarch64::{CacheAarch64 as ArchCache, UnwinderAarch64 as ArchUnwinder};
#[cfg(not(target_arch = "aarch64"))]
use framehop::x86_64::{CacheX86_64 as ArchCache, UnwinderX86_64 as ArchUnwinder};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use crate::{formats::budget, procfs};

/// A file mapped in a process, as its frames refer to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleRef {
    /// The path as the process sees it (without " (deleted)").
    pub path: Arc<str>,
    /// Where the agent opens it: through /proc/PID/root, or for a file
    /// deleted or replaced on disk since, its /proc/PID/map_files link.
    pub open_path: Arc<str>,
    /// Deleted or replaced: the path now names another file (or none), so
    /// the open path is the only way to it, and only while the process lives.
    pub deleted: bool,
    /// The file's identity (device as maps shows it, inode): one library
    /// mapped by many processes, in any mount namespace, is loaded once.
    pub file: (Arc<str>, u64),
}

/// One file mapping of a process.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub range: Range<u64>,
    pub file_offset: u64,
    pub module: Arc<ModuleRef>,
}

/// A frame normalised to its file: enough to symbolize after the process is
/// gone (unless the file was deleted: see `ModuleRef::deleted`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawFrame {
    pub module: Arc<ModuleRef>,
    /// File offset of the call site (return address - 1 for callers).
    pub file_offset: u64,
}

/// Unwind data of one ELF file, shared by every process that maps it.
struct ModuleData {
    eh_frame: Option<(Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(Range<u64>, Arc<[u8]>)>,
    debug_frame: Option<Arc<[u8]>>,
    /// PT_LOAD segments: (p_offset range, p_vaddr) to find the load bias.
    loads: Vec<(Range<u64>, u64)>,
    /// Bytes of its unwind tables.
    bytes: u64,
}

fn section<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>, name: &str) -> Option<(Range<u64>, Arc<[u8]>)> {
    let s = file.section_by_name(name)?;
    let data = s.uncompressed_data().ok()?;
    Some((s.address()..s.address().saturating_add(s.size()), Arc::from(&*data)))
}

/// Bytes a section holds once uncompressed (what reading it would cost).
fn section_bytes<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>, name: &str) -> u64 {
    let Some(s) = file.section_by_name(name) else { return 0 };
    s.compressed_file_range().map_or(s.size(), |r| r.uncompressed_size)
}

const UNWIND_SECTIONS: [&str; 3] = [".eh_frame", ".eh_frame_hdr", ".debug_frame"];

/// A library's unwind data; Ok(None): unreadable or not ELF (its frames end
/// the unwind, as a file without CFI does); Err: over `budget::MAX_UNWIND_BYTES`.
fn load_module(path: &str) -> Result<Option<ModuleData>, String> {
    // Read, not mapped: the file's owner may truncate it (see formats::elf_reader).
    let Ok(data) = crate::formats::elf_reader(std::path::Path::new(path)) else { return Ok(None) };
    let Ok(file) = object::File::parse(&data) else { return Ok(None) };
    let bytes = UNWIND_SECTIONS.iter().fold(0u64, |sum, name| sum.saturating_add(section_bytes(&file, name)));
    if bytes > budget::MAX_UNWIND_BYTES {
        return Err(format!(
            "its unwind tables are {} MiB, over the {} MiB gpumem reads of one file",
            bytes >> 20,
            budget::MAX_UNWIND_BYTES >> 20
        ));
    }
    let loads = file
        .segments()
        .filter_map(|seg| {
            let (off, size) = seg.file_range();
            (size > 0).then_some((off..off.saturating_add(size), seg.address()))
        })
        .collect();
    Ok(Some(ModuleData {
        eh_frame: section(&file, ".eh_frame"),
        eh_frame_hdr: section(&file, ".eh_frame_hdr"),
        debug_frame: section(&file, ".debug_frame").map(|(_, d)| d),
        loads,
        bytes,
    }))
}

/// The file-backed mappings of `/proc/PID/maps`, for process `pid`.
pub fn file_mappings(pid: u32, entries: &[procfs::MapsEntry]) -> Vec<Mapping> {
    let mut modules: HashMap<(&str, u64, bool), Arc<ModuleRef>> = HashMap::new();
    let mut out = Vec::new();
    for e in entries {
        let (Some(path), Some(open)) = (e.path.as_deref(), procfs::open_path(pid, e)) else { continue };
        // One reference per file, opened through the first of its mappings.
        let module = modules
            .entry((path, e.inode, e.deleted))
            .or_insert_with(|| {
                Arc::new(ModuleRef {
                    path: Arc::from(path),
                    open_path: Arc::from(open.to_string_lossy().as_ref()),
                    deleted: e.deleted,
                    file: (Arc::from(e.dev.as_str()), e.inode),
                })
            })
            .clone();
        out.push(Mapping { range: e.range.clone(), file_offset: e.offset, module });
    }
    out
}

/// Unwind state for one process.
pub struct ProcessUnwinder {
    pid: u32,
    maps: Vec<Mapping>,
    unwinder: ArchUnwinder<Arc<[u8]>>,
    cache: ArchCache,
    /// Files whose unwind data is added (or refused), by identity.
    added: std::collections::HashSet<(Arc<str>, u64)>,
    /// Files whose reading ran past its deadline: added once it ends.
    late: std::collections::HashSet<(Arc<str>, u64)>,
    /// Bytes of unwind tables this process's modules hold.
    bytes: u64,
    /// Libraries over budget since the last `take_refused`: (path, why).
    refused: Vec<(Arc<str>, String)>,
}

/// One file's unwind data in the cache.
enum Slot {
    /// None: nothing to unwind with (unreadable, not ELF); Err: over budget.
    Ready(Result<Option<Arc<ModuleData>>, String>),
    /// Read on a thread past its deadline: the result arrives here.
    /// (A reading not started, all readers being late, is not kept.)
    Late(std::sync::mpsc::Receiver<Result<Option<ModuleData>, String>>),
}

/// What the cache has of a file now.
enum Got {
    Ready(Result<Option<Arc<ModuleData>>, String>),
    Late,
}

/// Cache of module unwind data by file identity. Each file is read on its
/// own thread (`formats::budget`): the event path waits `UNWIND_DEADLINE`
/// for it, then goes on without it until it arrives.
#[derive(Default)]
pub struct ModuleCache {
    /// By file identity, not path: paths through /proc/PID/root differ for
    /// every process, and a cache keyed by them grew with each one (the soak
    /// found it: 14 KB and a re-parse of every library per process).
    modules: HashMap<(Arc<str>, u64), Slot>,
    /// Bytes of unwind tables the cache holds.
    bytes: u64,
    /// Files let go to stay within `MAX_MODULES`.
    evicted: u64,
}

/// Distinct library files whose unwind tables are kept; beyond it the cache
/// starts over (unwinders keep the modules they use).
const MAX_MODULES: usize = 512;
/// How long an event waits for a library's unwind tables (a real one reads
/// in milliseconds; a file on a filesystem its owner serves may never answer).
pub const UNWIND_DEADLINE: std::time::Duration = std::time::Duration::from_millis(250);
/// Unwind tables one process's modules may hold, and the cache in all.
pub const MAX_PROCESS_UNWIND_BYTES: u64 = 256 << 20;
pub const MAX_CACHE_UNWIND_BYTES: u64 = 1 << 30;
/// Files of one process whose reading may be late at once; past it its
/// other new files are not read (each late one may hold a thread).
pub const MAX_LATE_PER_PROCESS: usize = 2;

impl ModuleCache {
    /// The cache, as a report.
    pub fn cache(&self) -> crate::heap::Cache {
        crate::heap::Cache::new("unwind_tables", self.modules.len(), MAX_MODULES, self.evicted)
    }

    /// Bytes of unwind tables it holds (read from the libraries' files).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn get(&mut self, file: &(Arc<str>, u64), open_path: &str) -> Got {
        if let Some(Slot::Late(rx)) = self.modules.get(file) {
            match rx.try_recv() {
                Ok(loaded) => {
                    let loaded = self.keep(loaded);
                    self.modules.insert(file.clone(), Slot::Ready(loaded));
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return Got::Late,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.modules.insert(file.clone(), Slot::Ready(Ok(None)));
                }
            }
        }
        if let Some(Slot::Ready(r)) = self.modules.get(file) {
            return Got::Ready(r.clone());
        }
        let path = open_path.to_string();
        let slot = match budget::within(UNWIND_DEADLINE, move || load_module(&path)) {
            budget::Timed::Done(loaded) => Slot::Ready(self.keep(loaded)),
            budget::Timed::Late(rx) => Slot::Late(rx),
            // Asked again at the next event (not kept: the readers free up).
            budget::Timed::Refused => return Got::Late,
        };
        let got = match &slot {
            Slot::Ready(r) => Got::Ready(r.clone()),
            Slot::Late(_) => Got::Late,
        };
        self.modules.insert(file.clone(), slot);
        got
    }

    /// A reading's result, within the cache's bytes.
    fn keep(&mut self, loaded: Result<Option<ModuleData>, String>) -> Result<Option<Arc<ModuleData>>, String> {
        let Some(data) = loaded? else { return Ok(None) };
        if self.bytes.saturating_add(data.bytes) > MAX_CACHE_UNWIND_BYTES {
            return Err(format!("gpumem already keeps {} MiB of libraries' unwind tables, its most", self.bytes >> 20));
        }
        self.bytes += data.bytes;
        Ok(Some(Arc::new(data)))
    }
}

impl ProcessUnwinder {
    pub fn new(pid: u32, modules: &mut ModuleCache) -> Option<Self> {
        let mut u = ProcessUnwinder {
            pid,
            maps: Vec::new(),
            unwinder: ArchUnwinder::new(),
            cache: ArchCache::new(),
            added: Default::default(),
            late: Default::default(),
            bytes: 0,
            refused: Vec::new(),
        };
        u.refresh(modules)?;
        Some(u)
    }

    /// Re-reads the maps (a library may have been loaded since) and adds new modules.
    pub fn refresh(&mut self, modules: &mut ModuleCache) -> Option<()> {
        self.maps = file_mappings(self.pid, &procfs::read_maps(self.pid).ok()?);
        // The kernel lists them in order; `mapping` relies on it.
        self.maps.sort_by_key(|m| m.range.start);
        if modules.modules.len() > MAX_MODULES {
            modules.evicted += modules.modules.len() as u64;
            modules.modules.clear();
            modules.bytes = 0;
        }
        self.add_modules(modules);
        Some(())
    }

    /// Whether a library's tables are still being read (`add_modules` adds them once read).
    pub fn has_late(&self) -> bool {
        !self.late.is_empty()
    }

    /// Libraries refused since the last call: (path, why).
    pub fn take_refused(&mut self) -> Vec<(Arc<str>, String)> {
        std::mem::take(&mut self.refused)
    }

    /// Adds the unwind data of the mapped files not added yet.
    pub fn add_modules(&mut self, modules: &mut ModuleCache) {
        let mut by_file: HashMap<(Arc<str>, u64), Vec<&Mapping>> = HashMap::new();
        for m in &self.maps {
            by_file.entry(m.module.file.clone()).or_default().push(m);
        }
        for (file, maps) in by_file {
            if self.added.contains(&file) {
                continue;
            }
            let module = &maps[0].module;
            let was_late = self.late.contains(&file);
            if !was_late && self.late.len() >= MAX_LATE_PER_PROCESS {
                self.added.insert(file);
                let why = format!("not read: {MAX_LATE_PER_PROCESS} of its libraries' readings run past their deadline");
                self.refused.push((module.path.clone(), why));
                continue;
            }
            let data = match modules.get(&file, &module.open_path) {
                Got::Late => {
                    if self.late.insert(file) {
                        let why = format!(
                            "its unwind tables are not read yet: reading took over {} ms, or waits for readings past their deadline",
                            UNWIND_DEADLINE.as_millis()
                        );
                        self.refused.push((module.path.clone(), why));
                    }
                    continue;
                }
                Got::Ready(r) => r,
            };
            self.late.remove(&file);
            self.added.insert(file);
            let data = match data {
                Ok(Some(d)) if self.bytes.saturating_add(d.bytes) > MAX_PROCESS_UNWIND_BYTES => {
                    let why = format!("its modules' unwind tables would pass {} MiB", MAX_PROCESS_UNWIND_BYTES >> 20);
                    self.refused.push((module.path.clone(), why));
                    continue;
                }
                Ok(Some(d)) => d,
                Ok(None) => continue,
                Err(why) => {
                    self.refused.push((module.path.clone(), why));
                    continue;
                }
            };
            self.bytes += data.bytes;
            let start = maps.iter().map(|m| m.range.start).min().expect("non-empty");
            let end = maps.iter().map(|m| m.range.end).max().expect("non-empty");
            // Load bias: where the segment holding the lowest mapped offset landed.
            let first = maps.iter().min_by_key(|m| m.file_offset).expect("non-empty");
            let Some((seg_off, seg_vaddr)) =
                data.loads.iter().find(|(r, _)| r.contains(&first.file_offset) || r.start == first.file_offset)
            else {
                continue;
            };
            let bias = first.range.start.wrapping_sub(seg_vaddr.wrapping_add(first.file_offset - seg_off.start));
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                eh_frame_svma: data.eh_frame.as_ref().map(|(r, _)| r.clone()),
                eh_frame: data.eh_frame.as_ref().map(|(_, d)| d.clone()),
                eh_frame_hdr_svma: data.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
                eh_frame_hdr: data.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
                debug_frame: data.debug_frame.clone(),
                ..Default::default()
            };
            self.unwinder.add_module(Module::new(module.path.to_string(), start..end, bias, info));
        }
    }

    /// The mapping holding an address: maps lists mappings in address
    /// order, without overlaps, so it is a binary search.
    fn mapping(&self, addr: u64) -> Option<&Mapping> {
        let i = self.maps.partition_point(|m| m.range.end <= addr);
        self.maps.get(i).filter(|m| m.range.contains(&addr))
    }

    /// Unwinds from the caller's registers over the captured stack slice:
    /// the frames, innermost first, whether a frame was outside every known
    /// mapping (worth a refresh), and how much of the slice it needed.
    pub fn unwind(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8], max_frames: usize) -> Unwound {
        let (reach, ran_out) = (std::cell::Cell::new(0usize), std::cell::Cell::new(false));
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let end = off.checked_add(8).ok_or(())?;
            let Some(bytes) = stack.get(off..end) else {
                ran_out.set(true);
                return Err(());
            };
            reach.set(reach.get().max(end));
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut frames = Vec::new();
        let mut unknown = false;
        // At the uretprobe, ip is the return address in the caller: a call site like any other.
        let highest = self.maps.last().map_or(u64::MAX, |m| m.range.end);
        let mut iter = self.unwinder.iter_frames(ip, unwind_regs(ip, sp, bp, highest), &mut self.cache, &mut read);
        let mut addrs = vec![ip.saturating_sub(1)];
        let _ = iter.next(); // the initial ip, already taken as a return address
        while addrs.len() < max_frames {
            match iter.next() {
                Ok(Some(FrameAddress::ReturnAddress(ra))) => addrs.push(ra.get() - 1),
                Ok(Some(FrameAddress::InstructionPointer(_))) => {}
                Ok(None) | Err(_) => break,
            }
        }

        for a in addrs {
            match self.mapping(a) {
                Some(m) => frames.push(RawFrame { module: m.module.clone(), file_offset: a - m.range.start + m.file_offset }),
                None => {
                    unknown = true;
                    break;
                }
            }
        }
        Unwound { frames, unknown, reach: reach.get(), ran_out: ran_out.get() }
    }
}

/// The caller's registers as the unwinder takes them: (ip, sp, frame
/// pointer) from the event. On aarch64 the link register holds the return
/// address the uretprobe stopped at (the ip), and return addresses signed by
/// pointer authentication (PAC) lose their signature bits: no code lies
/// above the process's highest mapping.
#[cfg(not(target_arch = "aarch64"))]
fn unwind_regs(ip: u64, sp: u64, bp: u64, _highest: u64) -> framehop::x86_64::UnwindRegsX86_64 {
    framehop::x86_64::UnwindRegsX86_64::new(ip, sp, bp)
}

#[cfg(target_arch = "aarch64")]
fn unwind_regs(ip: u64, sp: u64, fp: u64, highest: u64) -> framehop::aarch64::UnwindRegsAarch64 {
    let mask = framehop::aarch64::PtrAuthMask::from_max_known_address(highest);
    framehop::aarch64::UnwindRegsAarch64::new_with_ptr_auth_mask(mask, ip, sp, fp)
}

/// One unwind's result.
pub struct Unwound {
    pub frames: Vec<RawFrame>,
    /// A frame was outside every known mapping (worth a refresh).
    pub unknown: bool,
    /// Bytes of the stack slice it read, from its start to its deepest read.
    pub reach: usize,
    /// It wanted bytes past the slice's end (a deeper stack than was copied).
    pub ran_out: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_mappings_share_one_module_per_file_and_open_deleted_ones_by_map_files() {
        let m = file_mappings(
            7,
            &procfs::parse_maps(
                "55d0-55e0 r--p 00000000 fd:01 12 /usr/bin/python3.11\n\
                 55e0-55f0 r-xp 00010000 fd:01 12 /usr/bin/python3.11\n\
                 7f00-7f10 rw-p 00000000 00:00 0 \n\
                 7f10-7f20 r-xp 00002000 fd:01 13 /opt/lib dir/libx.so\n\
                 7f20-7f30 r-xp 00000000 fd:01 14 /opt/lib dir/libx.so (deleted)\n\
                 7ffc-7ffd rw-p 00000000 00:00 0 [stack]\n",
            ),
        );
        assert_eq!(m.len(), 4);
        assert_eq!((m[1].range.clone(), m[1].file_offset), (0x55e0..0x55f0, 0x10000));
        assert!(Arc::ptr_eq(&m[0].module, &m[1].module), "one module per file");
        assert_eq!(&*m[2].module.path, "/opt/lib dir/libx.so");
        assert_eq!(&*m[2].module.open_path, "/proc/7/root/opt/lib dir/libx.so");
        // The same path, replaced on disk: another file, opened by its old inode.
        assert_eq!((&*m[3].module.path, m[3].module.deleted), ("/opt/lib dir/libx.so", true));
        assert_eq!(&*m[3].module.open_path, "/proc/7/map_files/7f20-7f30");
        assert_ne!(m[2].module.file, m[3].module.file);
    }

    #[test]
    fn a_library_whose_unwind_tables_are_past_the_budget_is_refused_unread() {
        // A small library whose section header says its .eh_frame is 200 MiB.
        let mut bytes = std::fs::read("/lib/x86_64-linux-gnu/libdl.so.2").unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let index = elf.section_by_name(".eh_frame").unwrap().index().0;
        let shoff = u64::from_le_bytes(bytes[0x28..0x30].try_into().unwrap()) as usize;
        let size_at = shoff + index * 64 + 32;
        bytes[size_at..size_at + 8].copy_from_slice(&(200u64 << 20).to_le_bytes());
        let path = std::env::temp_dir().join(format!("gpumem-huge-eh-frame-{}.so", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let refused = load_module(path.to_str().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(refused.as_ref().is_err_and(|why| why.contains("over the 128 MiB")), "{:?}", refused.err());
        assert!(load_module("/lib/x86_64-linux-gnu/libdl.so.2").unwrap().is_some());
        assert!(load_module("/nonexistent").unwrap().is_none());
    }

    #[test]
    fn unwinds_this_test_process() {
        // Our own stack: the test binary has .eh_frame; unwinding from a
        // real return address must reach several frames of this binary.
        #[inline(never)]
        fn capture() -> (u64, u64, u64, Vec<u8>) {
            let sp: u64;
            let bp: u64;
            let ip: u64;
            // SAFETY: reads registers only.
            unsafe {
                std::arch::asm!("mov {}, rsp", out(reg) sp);
                std::arch::asm!("mov {}, rbp", out(reg) bp);
                std::arch::asm!("lea {}, [rip]", out(reg) ip);
            }
            // Copy at most to the end of the mapping that holds sp (the thread's stack).
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            let end = maps
                .lines()
                .filter_map(|l| l.split_whitespace().next()?.split_once('-'))
                .map(|(a, b)| (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b, 16).unwrap()))
                .find(|(a, b)| (*a..*b).contains(&sp))
                .unwrap()
                .1;
            let mut stack = vec![0u8; (end - sp).min(16384) as usize];
            // SAFETY: copying our own live stack between sp and the end of its mapping.
            unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, stack.as_mut_ptr(), stack.len()) };
            (ip, sp, bp, stack)
        }
        let (ip, sp, bp, stack) = capture();
        let mut cache = ModuleCache::default();
        let mut u = ProcessUnwinder::new(std::process::id(), &mut cache).expect("own maps");
        let frames = u.unwind(ip + 1, sp, bp, &stack, 64).frames;
        assert!(frames.len() >= 3, "{frames:?}");
        assert!(frames[0].module.path.contains("gpumem"), "{frames:?}");
    }
}
