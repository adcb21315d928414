//! tracefs: tracepoint programs need it; a fresh machine may not have it mounted.
use std::{ffi::CString, fs, path::Path};

pub const TRACEFS: &str = "/sys/kernel/tracing";

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error("tracefs is mounted on {TRACEFS} but its files are not readable: give gpumem CAP_DAC_READ_SEARCH (or run it as root)")]
    Unreadable,
    #[error("tracefs is not mounted and mounting it on {TRACEFS} failed ({0}); mount it with `mount -t tracefs nodev {TRACEFS}`")]
    Mount(#[source] std::io::Error),
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} has no field `{field}`")]
    NoField { path: String, field: String },
}

/// Makes sure tracefs is mounted, mounting it if needed (root only).
/// Returns a note saying what was done, or an error explaining why not.
pub fn ensure_mounted() -> Result<Option<String>, TracefsError> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(None);
    }
    if Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        return Ok(None);
    }
    // Mounted but not readable by us: mounting again would not help.
    if is_mounted() {
        return Err(TracefsError::Unreadable);
    }
    let src = CString::new("nodev").expect("no NUL");
    let target = CString::new(TRACEFS).expect("no NUL");
    let fstype = CString::new("tracefs").expect("no NUL");
    // SAFETY: valid NUL-terminated strings, no data argument.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(TracefsError::Mount(std::io::Error::last_os_error()));
    }
    Ok(Some(format!("mounted tracefs on {TRACEFS}")))
}

/// Whether /proc/self/mounts lists tracefs on TRACEFS.
fn is_mounted() -> bool {
    gpumem_engine::procfs::mounted(TRACEFS, "tracefs")
}

fn events_dir() -> &'static str {
    if Path::new(TRACEFS).join("events").is_dir() {
        "/sys/kernel/tracing/events"
    } else {
        "/sys/kernel/debug/tracing/events"
    }
}

/// Offset of a field in a tracepoint's record, read from its `format` file.
pub fn field_offset(category: &str, name: &str, field: &str) -> Result<u32, TracefsError> {
    let path = format!("{}/{category}/{name}/format", events_dir());
    let text = fs::read_to_string(&path).map_err(|source| TracefsError::Read { path: path.clone(), source })?;
    parse_field_offset(&text, field).ok_or_else(|| TracefsError::NoField { path, field: field.to_string() })
}

/// Finds `offset:N;` on the line declaring `field` in a tracepoint format.
pub fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    for line in format.lines() {
        let line = line.trim();
        let Some(decl) = line.strip_prefix("field:") else { continue };
        let decl = decl.split(';').next()?;
        let ident = decl.split_whitespace().last()?.split('[').next()?;
        if ident != field {
            continue;
        }
        let off = line.split("offset:").nth(1)?.split(';').next()?;
        return off.trim().parse().ok();
    }
    None
}

/// Where this kernel's records keep what the programs read: the fork
/// record's `child_pid` (0, with a note, when unknown: children are then
/// not followed) and each oom:mark_victim field (`FIELD_ABSENT` for one it
/// lacks: older kernels have only pid).
pub fn record_offsets(notes: &mut Vec<String>) -> (u32, [u32; gpumem_common::oom_field::COUNT]) {
    use gpumem_common::oom_field;
    let fork_offset = match field_offset("sched", "sched_process_fork", "child_pid") {
        Ok(off) => off,
        Err(e) => {
            notes.push(format!("child processes will not be followed: {e}"));
            0
        }
    };
    let mut oom_offsets = [oom_field::FIELD_ABSENT; oom_field::COUNT];
    for (i, name) in oom_field::NAMES.iter().enumerate() {
        if let Ok(off) = field_offset("oom", "mark_victim", name) {
            oom_offsets[i] = off;
        }
    }
    (fork_offset, oom_offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_format() {
        let f = "name: sched_process_fork\nID: 300\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
            \tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
            \tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n\
            \tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";
        assert_eq!(parse_field_offset(f, "child_pid"), Some(44));
        assert_eq!(parse_field_offset(f, "parent_pid"), Some(24));
        assert_eq!(parse_field_offset(f, "child_comm"), Some(28));
        assert_eq!(parse_field_offset(f, "nope"), None);
    }
}
