//! Turning (module, file offset) into function, offset and file:line with
//! blazesym, cached per frame.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolized};
use serde::Serialize;

use super::unwind::RawFrame;

#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Frame {
    /// Function name (demangled), or None when the module has no symbol for it.
    pub function: Option<String>,
    /// Offset of the call site in the function.
    pub offset: Option<u64>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The module's path as the process sees it.
    pub module: Arc<str>,
    pub module_offset: u64,
    /// A Python frame (function, file, line of the interpreter's code);
    /// `module` is then the interpreter's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
}

impl Frame {
    /// The function, or where it is (`libcuda.so.1+0x1c2a0`) when the module
    /// has no symbol for it: a frame's name for tools that key on names.
    pub fn name(&self) -> String {
        match &self.function {
            Some(f) => f.clone(),
            None => format!("{}+{:#x}", self.module.rsplit('/').next().unwrap_or(&self.module), self.module_offset),
        }
    }

    /// `function+0x1c (file.c:42) [module]`
    pub fn display(&self) -> String {
        let module = self.module.rsplit('/').next().unwrap_or(&self.module);
        let mut s = match (&self.function, self.offset) {
            (Some(f), Some(o)) => format!("{f}+{o:#x}"),
            (Some(f), None) => f.clone(),
            _ => format!("{:#x}", self.module_offset),
        };
        if let (Some(file), Some(line)) = (&self.file, self.line) {
            let file = file.rsplit('/').next().unwrap_or(file);
            s.push_str(&format!(" ({file}:{line})"));
        }
        if self.python {
            s.push_str(" [python]");
            return s;
        }
        s.push_str(&format!(" [{module}]"));
        s
    }
}

impl Frame {
    /// The heap bytes of its own strings (the module's path is shared).
    pub fn string_bytes(&self) -> u64 {
        use crate::heap::string;
        self.function.as_deref().map_or(0, string) + self.file.as_deref().map_or(0, string)
    }

    /// A native frame's module and offset, before symbolization.
    pub fn unsymbolized(raw: &RawFrame) -> Frame {
        Frame {
            function: None,
            offset: None,
            file: None,
            line: None,
            module: raw.module.path.clone(),
            module_offset: raw.file_offset,
            python: false,
        }
    }
}

/// blazesym keeps every file it opened parsed (symbol tables, DWARF, the
/// mapped debug file): kept while new frames come, let go after this long
/// without one. Frames already symbolized stay cached.
pub const IDLE_RELEASE: Duration = Duration::from_secs(5);

/// Frames kept symbolized, at most (a few hundred bytes each with their
/// names); past it the cache starts over.
pub const MAX_CACHED_FRAMES: usize = 65536;

#[derive(Default)]
pub struct Symbolizer {
    inner: blazesym::symbolize::Symbolizer,
    /// By file identity and offset: a path names different files in
    /// different containers, and a deleted file and its replacement.
    cache: HashMap<((Arc<str>, u64), u64), Frame>,
    /// When `inner` last read a file; None while it holds nothing.
    last_used: Option<Instant>,
    /// Frames let go to stay within `MAX_CACHED_FRAMES`.
    pub evicted: u64,
}

impl Symbolizer {
    /// Lets blazesym's parsed files go if no frame needed them for
    /// [`IDLE_RELEASE`]; true if it did.
    pub fn release_if_idle(&mut self) -> bool {
        if !self.last_used.is_some_and(|t| t.elapsed() >= IDLE_RELEASE) {
            return false;
        }
        self.inner = blazesym::symbolize::Symbolizer::default();
        self.last_used = None;
        true
    }

    pub fn frame(&mut self, raw: &RawFrame) -> Frame {
        let key = (raw.module.file.clone(), raw.file_offset);
        if let Some(f) = self.cache.get(&key) {
            return f.clone();
        }
        let module = &raw.module;
        let mut frame = Frame::unsymbolized(raw);
        self.last_used = Some(Instant::now());
        // The process may be gone: try its view of the file, then the host
        // path if that is the same file (device and inode): a container's
        // path names another file on the host, or one its owner chose.
        let host = (!module.deleted && crate::procfs::is_file_of(std::path::Path::new(&*module.path), &module.file.0, module.file.1))
            .then_some(&*module.path);
        for path in std::iter::once(&*module.open_path).chain(host) {
            let src = Source::Elf(Elf::new(path));
            let Ok(mut syms) = self.inner.symbolize(&src, Input::FileOffset(&[raw.file_offset])) else { continue };
            if let Some(Symbolized::Sym(sym)) = syms.pop() {
                frame.function = Some(sym.name.to_string());
                frame.offset = Some(sym.offset as u64);
                if let Some(ci) = sym.code_info {
                    frame.file = Some(ci.to_path().display().to_string());
                    frame.line = ci.line;
                }
                break;
            }
        }
        if self.cache.len() >= MAX_CACHED_FRAMES {
            self.evicted += self.cache.len() as u64;
            self.cache.clear();
        }
        self.cache.insert(key, frame.clone());
        frame
    }

    /// The frame cache, as a report.
    pub fn cache(&self) -> crate::heap::Cache {
        crate::heap::Cache::new("symbolized_frames", self.cache.len(), MAX_CACHED_FRAMES, self.evicted)
    }

    /// What the frame cache takes on the heap (estimated, see `heap`).
    pub fn heap_bytes(&self) -> u64 {
        crate::heap::hash_table::<((Arc<str>, u64), u64), Frame>(self.cache.capacity())
            + self.cache.values().map(Frame::string_bytes).sum::<u64>()
    }
}
