//! What the eBPF side counts instead of doing: losses (`Stat`, the STATS
//! per-CPU array; the agent surfaces every one in its loss accounting) and
//! the early exits of every program by reason (`Exit`, the EXITS per-CPU
//! array; status and /metrics show them), so that no path out of a program
//! goes uncounted.

/// Things the kernel side could not do: indices of the STATS array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stat {
    /// Ring buffer full: event lost.
    RingbufFull = 0,
    /// In-flight call table full: the call's return cannot be decoded.
    PendingFull = 1,
    /// Return seen without its entry (probe attached mid-call): event lost.
    ReturnWithoutEntry = 2,
    /// Traced-process table full: exits of some processes may be missed.
    TrackedFull = 3,
    /// Pid filter table full: a child of a `-c` command is not followed.
    FilterFull = 4,
    /// Stack ring full (or the per-CPU scratch taken by a preempting probe):
    /// the event went without its stack. Accounting is not affected.
    StacksDropped = 5,
    /// The kernel's table of live entries was full: a restarted agent will
    /// not know of the entry (its process is marked uncertain then).
    KernelTableFull = 6,
}

impl Stat {
    pub const COUNT: u32 = 7;
    pub const ALL: [Stat; Stat::COUNT as usize] = [
        Stat::RingbufFull,
        Stat::PendingFull,
        Stat::ReturnWithoutEntry,
        Stat::TrackedFull,
        Stat::FilterFull,
        Stat::StacksDropped,
        Stat::KernelTableFull,
    ];

    pub const fn index(self) -> usize {
        self as usize
    }

    /// Names for reports.
    pub const fn name(self) -> &'static str {
        match self {
            Stat::RingbufFull => "ringbuf_full",
            Stat::PendingFull => "pending_full",
            Stat::ReturnWithoutEntry => "return_without_entry",
            Stat::TrackedFull => "tracked_full",
            Stat::FilterFull => "filter_full",
            Stat::StacksDropped => "stacks_dropped",
            Stat::KernelTableFull => "kernel_table_full",
        }
    }
}

/// Why a program (or a step of one) ended early: indices of the EXITS
/// array. Most are the programs doing their job (a process not traced, an
/// ioctl that is not NVIDIA's); the rest say what could not be read.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    /// The process is not one the session traces (the pid filter).
    NotTraced = 0,
    /// A return, exit or close with nothing of ours in flight.
    NothingInFlight = 1,
    /// A thread ended (only a process's leader ending is its exit).
    ThreadExit = 2,
    /// A process that made no traced call exited.
    UntracedExit = 3,
    /// A fork of a process whose children are not followed.
    ChildNotFollowed = 4,
    /// A file opened, a command or a descriptor that is not an NVIDIA one.
    NotNvidia = 5,
    /// An NVIDIA command gpumem does not decode.
    UnknownCommand = 6,
    /// The syscall failed (an open of an NVIDIA node that did not succeed).
    CallFailed = 7,
    /// A field of the tracepoint's record could not be read.
    RecordUnreadable = 8,
    /// Memory of the traced process could not be read.
    UserUnreadable = 9,
    /// A tracepoint field this kernel does not have (oom:mark_victim's pid).
    FieldAbsent = 10,
    /// A PyTorch probe site without its spec (the agent's table).
    NoUsdtSpec = 11,
    /// A call in flight could not be saved (counted as a loss in STATS too).
    PendingFull = 12,
    /// A record could not be reserved (counted as a loss in STATS too).
    RingFull = 13,
    /// The Python frame walk: the thread has no thread state known (not
    /// a Python thread, or one started since the agent last looked).
    PyNoThreadState = 14,
    /// The Python frame walk: the process's layout is not known.
    PyNoLayout = 15,
    /// The Python frame walk: a frame could not be read (the walk ends there).
    PyFrameUnreadable = 16,
}

impl Exit {
    pub const COUNT: u32 = 17;
    pub const ALL: [Exit; Exit::COUNT as usize] = [
        Exit::NotTraced,
        Exit::NothingInFlight,
        Exit::ThreadExit,
        Exit::UntracedExit,
        Exit::ChildNotFollowed,
        Exit::NotNvidia,
        Exit::UnknownCommand,
        Exit::CallFailed,
        Exit::RecordUnreadable,
        Exit::UserUnreadable,
        Exit::FieldAbsent,
        Exit::NoUsdtSpec,
        Exit::PendingFull,
        Exit::RingFull,
        Exit::PyNoThreadState,
        Exit::PyNoLayout,
        Exit::PyFrameUnreadable,
    ];

    pub const fn index(self) -> usize {
        self as usize
    }

    /// The `reason` label.
    pub const fn name(self) -> &'static str {
        match self {
            Exit::NotTraced => "not_traced",
            Exit::NothingInFlight => "nothing_in_flight",
            Exit::ThreadExit => "thread_exit",
            Exit::UntracedExit => "untraced_exit",
            Exit::ChildNotFollowed => "child_not_followed",
            Exit::NotNvidia => "not_nvidia",
            Exit::UnknownCommand => "unknown_command",
            Exit::CallFailed => "call_failed",
            Exit::RecordUnreadable => "record_unreadable",
            Exit::UserUnreadable => "user_unreadable",
            Exit::FieldAbsent => "field_absent",
            Exit::NoUsdtSpec => "no_usdt_spec",
            Exit::PendingFull => "pending_full",
            Exit::RingFull => "ring_full",
            Exit::PyNoThreadState => "py_no_thread_state",
            Exit::PyNoLayout => "py_no_layout",
            Exit::PyFrameUnreadable => "py_frame_unreadable",
        }
    }

    /// Whether it says something went wrong (rather than that the program
    /// had nothing to do).
    pub const fn is_failure(self) -> bool {
        matches!(
            self,
            Exit::RecordUnreadable
                | Exit::UserUnreadable
                | Exit::FieldAbsent
                | Exit::NoUsdtSpec
                | Exit::PendingFull
                | Exit::RingFull
                | Exit::PyFrameUnreadable
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_dense_and_names_unique() {
        for (i, s) in Stat::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
            assert!(Stat::ALL[i + 1..].iter().all(|t| t.name() != s.name()));
        }
        for (i, e) in Exit::ALL.iter().enumerate() {
            assert_eq!(e.index(), i);
            assert!(Exit::ALL[i + 1..].iter().all(|f| f.name() != e.name()));
        }
    }
}
