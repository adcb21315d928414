//! The Python interpreter frames an allocation's stack record carries: the
//! eBPF program walks the thread's CPython frame chain at the allocation
//! (the agent reads the record later, when the interpreter has moved on)
//! and sends each frame's code object and instruction pointer; the agent
//! resolves them to names, files and lines from the process's memory.

/// Python threads whose thread state the kernel side knows, at most.
pub const PY_THREADS_MAX: u32 = 65536;

/// Python frames walked per allocation, at most (innermost first).
pub const PY_FRAMES_MAX: usize = 32;

/// One interpreter frame: its code object and the instruction it is at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrameRef {
    pub code: u64,
    /// The frame's last instruction (`prev_instr`, 3.11-3.12; `instr_ptr`,
    /// 3.13), with `ENTRY` or-ed in for the first frame its C-level
    /// `_PyEval_EvalFrameDefault` call ran (frames up to it belong to that
    /// native frame, for interleaving).
    pub instr: u64,
}

/// Bit of `PyFrameRef::instr` marking an entry frame (user addresses are
/// below 2^47).
pub const ENTRY: u64 = 1 << 63;

pub const PY_FRAME_SIZE: usize = core::mem::size_of::<PyFrameRef>();
pub const PY_BYTES_MAX: usize = PY_FRAMES_MAX * PY_FRAME_SIZE;

/// How `PyLayout::entry_byte` tells an entry frame.
pub mod entry_kind {
    /// 3.11: the byte is `is_entry`, nonzero for an entry frame.
    pub const IS_ENTRY: u32 = 0;
    /// 3.12+: the byte is `owner`; a frame owned by the C stack (3) is a
    /// shim between two native calls: the frame before it is the entry one.
    pub const CSTACK_OWNER: u32 = 1;
    /// 3.10: every frame object is run by a native call of its own.
    pub const EVERY_FRAME: u32 = 2;
}

/// Value of `owner` for the shim frames of 3.12+.
pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Where a CPython version keeps what the walk reads (the agent fills the
/// eBPF `PY_LAYOUTS` map with this per Python process).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// Offset in PyThreadState of `cframe` (3.11, 3.12) or of
    /// `current_frame` itself (3.13: `cframe_current` is NO_CFRAME).
    pub tstate_frame: u32,
    /// Offset of `current_frame` in `_PyCFrame`.
    pub cframe_current: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_instr: u32,
    /// Offset of the byte that tells an entry frame (see `entry_kind`).
    pub entry_byte: u32,
    pub entry_kind: u32,
    pub _pad: u32,
}

/// `PyLayout::cframe_current` of versions without `_PyCFrame` (3.13).
pub const NO_CFRAME: u32 = u32::MAX;

impl crate::StackEvent {
    /// The Python frames the record holds, innermost first.
    pub fn python_frames(&self) -> impl Iterator<Item = PyFrameRef> + '_ {
        let n = (self.py_frames as usize).min(PY_FRAMES_MAX);
        self.data[..n * PY_FRAME_SIZE].as_chunks::<PY_FRAME_SIZE>().0.iter().map(|c| {
            let (code, instr) = c.split_at(8);
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
            PyFrameRef { code: word(code), instr: word(instr) }
        })
    }

    /// The stack bytes copied, from `sp` up (after the Python frames).
    pub fn stack(&self) -> &[u8] {
        let start = (self.py_frames as usize).min(PY_FRAMES_MAX) * PY_FRAME_SIZE;
        let end = (start + self.len as usize).min(self.data.len());
        &self.data[start..end]
    }
}
