//! The NVIDIA driver's versions: the loaded kernel module's
//! (`/proc/driver/nvidia/version`) against the user-space libraries' (the
//! version in libcuda's and NVML's file names, as the driver installs them:
//! `libcuda.so.1 -> libcuda.so.535.261.03`). When they differ — the driver
//! was upgraded and the old module is still loaded — every CUDA and NVML
//! call fails with the classic "Driver/library version mismatch"; gpumem
//! names it and says what to do.
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where the loaded kernel module says its version.
pub const VERSION_FILE: &str = "/proc/driver/nvidia/version";

/// One user-space library and the driver version it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Library {
    pub name: &'static str,
    pub path: PathBuf,
    /// From its file name once links are followed; None when it names none.
    pub version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Versions {
    /// The loaded kernel module's version; None when no module is loaded
    /// (the file is missing) or it could not be read (`kernel_error`).
    pub kernel_module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_error: Option<String>,
    pub libraries: Vec<Library>,
}

/// A driver version: `535.261.03`, `550.54.14`, `560.28`.
fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The version in `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed …`
/// (or `… Open Kernel Module for x86_64  550.54.14  Release Build …`).
pub fn parse_version_file(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace().find(|w| is_version(w)).map(str::to_string)
}

/// The driver version a library file belongs to, from its real file name.
pub fn library_version(path: &Path) -> Option<String> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = real.file_name()?.to_str()?;
    let (_, after) = name.split_once(".so.")?;
    is_version(after).then(|| after.to_string())
}

/// Where the NVML library `lib` (a path, or None: `libnvidia-ml.so.1` by
/// the dynamic linker's search) is, as far as it can be told.
pub fn nvml_path(lib: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if let Some(p) = lib.filter(|p| p.as_encoded_bytes().contains(&b'/')) {
        return Some(PathBuf::from(p));
    }
    let name = lib.and_then(|l| l.to_str()).unwrap_or("libnvidia-ml.so.1");
    crate::probes::ld_cache::read(Path::new("/etc/ld.so.cache")).ok()?.into_iter().find(|e| e.name == name).map(|e| e.path)
}

impl Versions {
    /// Reads the kernel module's version from `version_file` and each library's.
    pub fn read(version_file: &Path, libraries: Vec<(&'static str, PathBuf)>) -> Versions {
        let (kernel_module, kernel_error) = match std::fs::read_to_string(version_file) {
            Ok(text) => match parse_version_file(&text) {
                Some(v) => (Some(v), None),
                None => (None, Some(format!("{} names no version", version_file.display()))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
            Err(e) => (None, Some(format!("cannot read {}: {e}", version_file.display()))),
        };
        let libraries = libraries.into_iter().map(|(name, path)| Library { name, version: library_version(&path), path }).collect();
        Versions { kernel_module, kernel_error, libraries }
    }

    /// The libraries whose version is not the loaded module's.
    pub fn mismatched(&self) -> Vec<&Library> {
        let Some(k) = &self.kernel_module else { return Vec::new() };
        self.libraries.iter().filter(|l| l.version.as_ref().is_some_and(|v| v != k)).collect()
    }

    /// "Driver/library version mismatch", named, with what to do; None when they agree.
    pub fn mismatch_message(&self) -> Option<String> {
        let bad = self.mismatched();
        let k = self.kernel_module.as_ref()?;
        if bad.is_empty() {
            return None;
        }
        let libs: Vec<String> =
            bad.iter().map(|l| format!("{} {} ({})", l.name, l.version.as_deref().unwrap_or("?"), l.path.display())).collect();
        Some(format!(
            "driver/library version mismatch: the loaded kernel module is {k}, but {}; CUDA and NVML calls fail until they agree \
             (the driver was upgraded without reloading its module: reboot the node, or stop the GPU processes and reload the nvidia modules)",
            libs.join(", ")
        ))
    }

    /// One line for `status`.
    pub fn describe(&self) -> String {
        let kernel = match (&self.kernel_module, &self.kernel_error) {
            (Some(v), _) => format!("kernel module {v}"),
            (None, Some(e)) => e.clone(),
            (None, None) => "no NVIDIA kernel module loaded".to_string(),
        };
        let libs: Vec<String> =
            self.libraries.iter().map(|l| format!("{} {}", l.name, l.version.as_deref().unwrap_or("(version not in its name)"))).collect();
        if libs.is_empty() {
            kernel
        } else {
            format!("{kernel}; {}", libs.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_files_of_the_proprietary_and_open_modules() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jun  4 13:49:15 UTC 2025\n\
            GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(parse_version_file(proprietary).as_deref(), Some("535.261.03"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:25:25 UTC 2024\n";
        assert_eq!(parse_version_file(open).as_deref(), Some("550.54.14"));
        assert_eq!(parse_version_file("GCC version: 12.2\n"), None);
    }

    #[test]
    fn a_mismatch_is_named_with_what_to_do() {
        let v = Versions {
            kernel_module: Some("550.54.14".into()),
            kernel_error: None,
            libraries: vec![
                Library { name: "libcuda", path: "/usr/lib/libcuda.so.1".into(), version: Some("535.261.03".into()) },
                Library { name: "NVML", path: "/usr/lib/libnvidia-ml.so.1".into(), version: Some("550.54.14".into()) },
            ],
        };
        let m = v.mismatch_message().unwrap();
        assert!(m.starts_with("driver/library version mismatch: the loaded kernel module is 550.54.14, but libcuda 535.261.03"), "{m}");
        assert!(m.contains("reboot"), "{m}");
        assert_eq!(v.mismatched().len(), 1);
        let agree = Versions { kernel_module: Some("535.261.03".into()), ..v.clone() };
        assert_eq!(agree.mismatched().len(), 1, "NVML 550 against module 535");
        let none = Versions { kernel_module: None, ..v };
        assert_eq!(none.mismatch_message(), None, "no module loaded: nothing to compare");
    }

    #[test]
    fn library_versions_come_from_their_real_file_names() {
        let dir = std::env::temp_dir().join(format!("gpumem-driver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libcuda.so.535.261.03"), b"").unwrap();
        std::os::unix::fs::symlink("libcuda.so.535.261.03", dir.join("libcuda.so.1")).unwrap();
        std::fs::write(dir.join("libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(library_version(&dir.join("libcuda.so.1")).as_deref(), Some("535.261.03"));
        assert_eq!(library_version(&dir.join("libnvidia-ml.so.1")), None, "a plain .so.1 names no driver version");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
