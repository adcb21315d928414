//! What the pipeline looks up about a process: its container and pod, and
//! for an OOM kill its memory cgroup. From /proc while tracing (kept in a
//! log when recording), from the recording when replaying.
use rustc_hash::FxHashMap as HashMap;

use super::host;
use crate::{
    model::container::{self, ContainerInfo},
    model::{host::ProcessHost, readings::Lookup},
    procfs,
};

pub enum Lookups {
    Live { log: Option<Vec<Lookup>> },
    Recorded { containers: HashMap<u32, ContainerInfo>, memcg: HashMap<u32, String>, hosts: HashMap<u32, ProcessHost> },
}

impl Lookups {
    /// Tracing; `recording` keeps a log of the lookups for the recording.
    pub fn live(recording: bool) -> Self {
        Lookups::Live { log: recording.then(Vec::new) }
    }

    pub fn recorded() -> Self {
        Lookups::Recorded { containers: HashMap::default(), memcg: HashMap::default(), hosts: HashMap::default() }
    }

    /// Looking at live processes (not a recording).
    pub fn is_live(&self) -> bool {
        matches!(self, Lookups::Live { .. })
    }

    #[inline]
    pub fn container(&mut self, pid: u32) -> Option<ContainerInfo> {
        match self {
            Lookups::Live { log } => {
                let c = lookup(pid);
                if let (Some(log), Some(c)) = (log, &c) {
                    log.push(Lookup { pid, container: Some(c.clone()), memcg: None, host: None });
                }
                c
            }
            // (Most recordings have none: no hashing then, for each of their events.)
            Lookups::Recorded { containers, .. } if containers.is_empty() => None,
            Lookups::Recorded { containers, .. } => containers.remove(&pid),
        }
    }

    /// The name and container of a process NVML lists but whose calls were
    /// never traced (it allocated before tracing began); None when replaying
    /// or when it is gone.
    pub fn untraced(&mut self, pid: u32) -> Option<(String, Option<ContainerInfo>)> {
        match self {
            Lookups::Live { .. } => {
                let name = procfs::read_status(pid).ok().filter(|s| !s.gone())?.name?;
                Some((name, lookup(pid)))
            }
            Lookups::Recorded { .. } => None,
        }
    }

    /// `known`: the memory cgroup read while the process was alive, for when
    /// the victim is already gone (its cgroup directory is still there).
    pub fn memcg(&mut self, pid: u32, tid: u32, known: Option<&(String, String)>) -> Option<String> {
        match self {
            Lookups::Live { log } => {
                let m = limited_memory_cgroup(pid).or_else(|| limited_memory_cgroup(tid)).or_else(|| known.and_then(limited));
                if let (Some(log), Some(m)) = (log, &m) {
                    log.push(Lookup { pid, container: None, memcg: Some(m.clone()), host: None });
                }
                m
            }
            Lookups::Recorded { memcg, .. } => memcg.remove(&pid),
        }
    }

    /// An OOM kill's victim's host memory (`last`: what the last refresh
    /// read, for a victim already gone).
    pub fn victim_host(&mut self, pid: u32, last: Option<ProcessHost>) -> Option<ProcessHost> {
        match self {
            Lookups::Live { log } => {
                let h = host::of_process(pid).or(last);
                if let (Some(log), Some(h)) = (log, h) {
                    log.push(Lookup { pid, container: None, memcg: None, host: Some(h) });
                }
                h
            }
            Lookups::Recorded { hosts, .. } => hosts.remove(&pid),
        }
    }

    /// A recorded lookup, for the events that follow it.
    pub fn add(&mut self, l: Lookup) {
        if let Lookups::Recorded { containers, memcg, hosts } = self {
            if let Some(h) = l.host {
                hosts.insert(l.pid, h);
            }
            if let Some(c) = l.container {
                containers.insert(l.pid, c);
            }
            if let Some(m) = l.memcg {
                memcg.insert(l.pid, m);
            }
        }
    }

    /// The lookups made since the last call (when recording).
    pub fn take_log(&mut self) -> Vec<Lookup> {
        match self {
            Lookups::Live { log: Some(log) } => std::mem::take(log),
            _ => Vec::new(),
        }
    }
}

/// Looks a live process up in /proc. None when it is already gone (or a
/// zombie, whose cgroup and namespaces are no longer shown): the caller may
/// try again on its next event.
fn lookup(pid: u32) -> Option<ContainerInfo> {
    let status = procfs::read_status(pid).ok()?;
    if status.gone() {
        return None;
    }
    let cgroups = match procfs::read_cgroup(pid) {
        Ok(c) => c,
        // Attributed to no container, and said (never to the one it names).
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Some(ContainerInfo { forged_cgroup: Some(e.to_string()), ..Default::default() })
        }
        Err(_) => return None,
    };
    let mut info = container::from_cgroups(&cgroups);
    info.memory_limit_file = memory_cgroup(&cgroups);
    info.dmem_cgroup = dmem_cgroup(&cgroups);
    info.ns_pid = status.ns_pid().filter(|&p| p != 0);
    if info.pod_uid.is_some() {
        (info.pod_name, info.namespace) = pod_identity(std::path::Path::new(&format!("/proc/{pid}/root")));
    }
    Some(info)
}

/// A pod's name and namespace from inside its container's root file system,
/// with no API server or kubelet access: the kubelet writes the pod's
/// hostname (its name, unless `spec.hostname` overrides it) to /etc/hostname
/// and the namespace to the service-account volume (absent when
/// `automountServiceAccountToken: false`).
fn pod_identity(root: &std::path::Path) -> (Option<String>, Option<String>) {
    // Inside the container's root only, a regular file of a name's size: its
    // owner may have made it a link to the host's files, a FIFO or /dev/zero.
    let read = |rel: &str| {
        procfs::read_within(root, rel, 512)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s.len() <= 253 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
    };
    // /var/run is usually an absolute symlink to /run (resolved in the root).
    let namespace = read("run/secrets/kubernetes.io/serviceaccount/namespace")
        .or_else(|| read("var/run/secrets/kubernetes.io/serviceaccount/namespace"));
    (read("etc/hostname"), namespace)
}

/// The memory cgroup of a process (path, limit file), from its cgroup lines.
fn memory_cgroup(lines: &[procfs::CgroupLine]) -> Option<(String, String)> {
    for line in lines {
        let path = &line.path;
        let limit_file = if line.has_controller("memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else if line.controllers.is_empty() {
            let v2 = if std::path::Path::new("/sys/fs/cgroup/unified").is_dir() { "/sys/fs/cgroup/unified" } else { "/sys/fs/cgroup" };
            format!("{v2}{path}/memory.max")
        } else {
            continue;
        };
        if path != "/" && std::path::Path::new(&limit_file).exists() {
            return Some((path.clone(), limit_file));
        }
    }
    None
}

/// The cgroup v2 path of a process, where it has dmem files.
fn dmem_cgroup(lines: &[procfs::CgroupLine]) -> Option<String> {
    let line = lines.iter().find(|l| l.is_v2())?;
    let dir = format!("{}{}", super::dmem::cgroup2_root(), line.path);
    std::path::Path::new(&format!("{dir}/dmem.current")).exists().then(|| line.path.clone())
}

/// The cgroup path, if its limit file says it has a memory limit.
fn limited(cgroup: &(String, String)) -> Option<String> {
    let limit = std::fs::read_to_string(&cgroup.1).ok()?;
    container::is_limited(limit.trim()).then(|| cgroup.0.clone())
}

/// The memory cgroup of a process, if it has a memory limit: an OOM kill
/// inside it is a memory-cgroup kill rather than a host-wide one.
fn limited_memory_cgroup(pid: u32) -> Option<String> {
    limited(&memory_cgroup(&procfs::read_cgroup(pid).ok()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_name_and_namespace_from_the_containers_root() {
        let root = std::env::temp_dir().join(format!("gpumem-pod-root-{}", std::process::id()));
        let sa = root.join("var/run/secrets/kubernetes.io/serviceaccount");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/hostname"), "trainer-7d9f-x2x\n").unwrap();
        std::fs::write(sa.join("namespace"), "ml-team").unwrap();
        assert_eq!(pod_identity(&root), (Some("trainer-7d9f-x2x".into()), Some("ml-team".into())));
        // Whatever is not a DNS name is not taken (a label value must not carry junk).
        std::fs::write(sa.join("namespace"), "bad\"name\n{}").unwrap();
        assert_eq!(pod_identity(&root).1, None);
        // Links resolve inside the root, never to the host's files; a FIFO
        // is refused without blocking, an endless file is not read to its end.
        std::fs::create_dir_all(root.join("host")).unwrap();
        std::fs::write(root.join("host/name"), "inside").unwrap();
        std::fs::remove_file(root.join("etc/hostname")).unwrap();
        std::os::unix::fs::symlink("/host/name", root.join("etc/hostname")).unwrap();
        assert_eq!(pod_identity(&root).0.as_deref(), Some("inside"));
        std::fs::remove_file(root.join("etc/hostname")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/hostname", root.join("etc/hostname")).unwrap();
        assert_eq!(pod_identity(&root).0, None, "/etc/hostname of the host is not reached");
        std::fs::remove_file(root.join("etc/hostname")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", root.join("etc/hostname")).unwrap();
        assert_eq!(pod_identity(&root).0, None);
        std::fs::remove_file(root.join("etc/hostname")).unwrap();
        let fifo = std::ffi::CString::new(root.join("etc/hostname").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert_eq!(pod_identity(&root).0, None);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(pod_identity(&root), (None, None));
    }
}
