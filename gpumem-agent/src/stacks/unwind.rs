//! Unwinding a captured user stack with the binaries' own CFI (.eh_frame,
//! .debug_frame) through framehop, per process, from its /proc/PID/maps.
use std::{collections::HashMap, ops::Range, sync::Arc};

use framehop::{
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// One file mapped in a process.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub range: Range<u64>,
    pub file_offset: u64,
    /// Path inside the process's mount namespace.
    pub path: Arc<str>,
    /// The file's identity (device as maps shows it, inode): one library
    /// mapped by many processes, in any mount namespace, is loaded once.
    pub file: (Arc<str>, u64),
}

/// A frame normalised to its file: enough to symbolize after the process is gone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawFrame {
    /// The module's path as the process sees it.
    pub module: Arc<str>,
    /// The module's path as the agent can open it (/proc/PID/root/...).
    pub open_path: Arc<str>,
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
}

fn section(file: &object::File<'_>, name: &str) -> Option<(Range<u64>, Arc<[u8]>)> {
    let s = file.section_by_name(name)?;
    let data = s.uncompressed_data().ok()?;
    Some((s.address()..s.address() + s.size(), Arc::from(&*data)))
}

fn load_module(path: &str) -> Option<ModuleData> {
    let f = std::fs::File::open(path).ok()?;
    // SAFETY: read-only map of a file we do not modify; a library replaced
    // meanwhile is replaced by rename (new inode), not rewritten in place.
    let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
    let file = object::File::parse(&*map).ok()?;
    let loads = file
        .segments()
        .filter_map(|seg| {
            let (off, size) = seg.file_range();
            (size > 0).then_some((off..off + size, seg.address()))
        })
        .collect();
    Some(ModuleData {
        eh_frame: section(&file, ".eh_frame"),
        eh_frame_hdr: section(&file, ".eh_frame_hdr"),
        debug_frame: section(&file, ".debug_frame").map(|(_, d)| d),
        loads,
    })
}

/// Parses `/proc/PID/maps` file-backed mappings.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || !fields[5].starts_with('/') {
            continue;
        }
        let Some((start, end)) = fields[0].split_once('-') else { continue };
        let (Ok(start), Ok(end), Ok(off)) =
            (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16), u64::from_str_radix(fields[2], 16))
        else {
            continue;
        };
        let file = (Arc::from(fields[3]), fields[4].parse().unwrap_or(0));
        out.push(Mapping { range: start..end, file_offset: off, path: Arc::from(fields[5..].join(" ")), file });
    }
    out
}

/// Unwind state for one process.
pub struct ProcessUnwinder {
    pid: u32,
    maps: Vec<Mapping>,
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    cache: CacheX86_64,
    added: std::collections::HashSet<Arc<str>>,
}

/// Cache of module unwind data by path (as opened by the agent).
#[derive(Default)]
pub struct ModuleCache {
    /// By file identity, not path: paths through /proc/PID/root differ for
    /// every process, and a cache keyed by them grew with each one (the soak
    /// found it: 14 KB and a re-parse of every library per process).
    modules: HashMap<(Arc<str>, u64), Option<Arc<ModuleData>>>,
}

/// Distinct library files whose unwind tables are kept; beyond it the cache
/// starts over (unwinders keep the modules they use).
const MAX_MODULES: usize = 512;

impl ProcessUnwinder {
    pub fn new(pid: u32, modules: &mut ModuleCache) -> Option<Self> {
        let mut u = ProcessUnwinder {
            pid,
            maps: Vec::new(),
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            added: Default::default(),
        };
        u.refresh(modules)?;
        Some(u)
    }

    /// Re-reads the maps (a library may have been loaded since) and adds new modules.
    pub fn refresh(&mut self, modules: &mut ModuleCache) -> Option<()> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
        self.maps = parse_maps(&text);
        if modules.modules.len() > MAX_MODULES {
            modules.modules.clear();
        }
        let mut by_path: HashMap<Arc<str>, Vec<&Mapping>> = HashMap::new();
        for m in &self.maps {
            by_path.entry(m.path.clone()).or_default().push(m);
        }
        for (path, maps) in by_path {
            if self.added.contains(&path) {
                continue;
            }
            let open_path = format!("/proc/{}/root{}", self.pid, path);
            let data = modules
                .modules
                .entry(maps[0].file.clone())
                .or_insert_with(|| load_module(&open_path).map(Arc::new))
                .clone();
            self.added.insert(path.clone());
            let Some(data) = data else { continue };
            let start = maps.iter().map(|m| m.range.start).min().expect("non-empty");
            let end = maps.iter().map(|m| m.range.end).max().expect("non-empty");
            // Load bias: where the segment holding the lowest mapped offset landed.
            let first = maps.iter().min_by_key(|m| m.file_offset).expect("non-empty");
            let Some((seg_off, seg_vaddr)) = data.loads.iter().find(|(r, _)| r.contains(&first.file_offset) || r.start == first.file_offset)
            else {
                continue;
            };
            let bias = first.range.start.wrapping_sub(seg_vaddr + (first.file_offset - seg_off.start));
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                eh_frame_svma: data.eh_frame.as_ref().map(|(r, _)| r.clone()),
                eh_frame: data.eh_frame.as_ref().map(|(_, d)| d.clone()),
                eh_frame_hdr_svma: data.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
                eh_frame_hdr: data.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
                debug_frame: data.debug_frame.clone(),
                ..Default::default()
            };
            self.unwinder.add_module(Module::new(path.to_string(), start..end, bias, info));
        }
        Some(())
    }

    fn mapping(&self, addr: u64) -> Option<&Mapping> {
        self.maps.iter().find(|m| m.range.contains(&addr))
    }

    /// Unwinds from the caller's registers over the captured stack slice.
    /// Returns the frames, innermost first, and whether a frame was outside
    /// every known mapping (worth a refresh).
    pub fn unwind(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8], max_frames: usize) -> (Vec<RawFrame>, bool) {
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(off..off + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut frames = Vec::new();
        let mut unknown = false;
        // At the uretprobe, ip is the return address in the caller: a call site like any other.
        let mut iter = self.unwinder.iter_frames(ip, UnwindRegsX86_64::new(ip, sp, bp), &mut self.cache, &mut read);
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
                Some(m) => frames.push(RawFrame {
                    module: m.path.clone(),
                    open_path: Arc::from(format!("/proc/{}/root{}", self.pid, m.path)),
                    file_offset: a - m.range.start + m.file_offset,
                }),
                None => {
                    unknown = true;
                    break;
                }
            }
        }
        (frames, unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parsing() {
        let m = parse_maps(
            "55d0-55e0 r--p 00000000 fd:01 12 /usr/bin/python3.11\n\
             55e0-55f0 r-xp 00010000 fd:01 12 /usr/bin/python3.11\n\
             7f00-7f10 rw-p 00000000 00:00 0 \n\
             7f10-7f20 r-xp 00002000 fd:01 13 /opt/lib dir/libx.so\n\
             7ffc-7ffd rw-p 00000000 00:00 0 [stack]\n",
        );
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].range, 0x55e0..0x55f0);
        assert_eq!(m[1].file_offset, 0x10000);
        assert_eq!(&*m[2].path, "/opt/lib dir/libx.so");
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
        let (frames, _) = u.unwind(ip + 1, sp, bp, &stack, 64);
        assert!(frames.len() >= 3, "{frames:?}");
        assert!(frames[0].module.contains("gpumem"), "{frames:?}");
    }
}
