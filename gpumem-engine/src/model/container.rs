//! Container and Kubernetes pod of a process, from its cgroup path (parsing
//! only: pipeline/lookups.rs reads /proc and the cgroup file system).
//!
//! Shapes recognised (cgroup v1 and v2, cgroupfs and systemd drivers):
//! - cgroupfs: `/kubepods/burstable/pod<uid>/<64-hex>`, `/kubepods/pod<uid>/<64-hex>`
//!   (guaranteed QoS), `/docker/<64-hex>`
//! - systemd: `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/cri-containerd-<64-hex>.scope`,
//!   `crio-<64-hex>.scope`, `docker-<64-hex>.scope`, `libpod-<64-hex>.scope` (podman)
use serde::Serialize;

use crate::procfs;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ContainerInfo {
    /// Container id (64 hex digits).
    pub container: Option<String>,
    /// The runtime that named the container scope, when the path says.
    pub runtime: Option<&'static str>,
    /// Kubernetes pod UID, with dashes.
    pub pod_uid: Option<String>,
    /// Kubernetes QoS class: guaranteed, burstable or besteffort.
    pub qos: Option<&'static str>,
    /// The process id inside its own pid namespace (innermost).
    pub ns_pid: Option<u32>,
    /// Pod name and namespace, as the pod's own container sees them (see pipeline/lookups.rs).
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    /// The limit file of the process's memory cgroup, when it has a limit:
    /// kept so that an OOM kill is placed in it even when the victim is gone
    /// before /proc can be read.
    pub memory_limit_file: Option<(String, String)>,
    /// The process's cgroup v2 path where it has dmem files: its GPU memory
    /// usage and limits are read there (under pipeline::dmem::cgroup2_root).
    pub dmem_cgroup: Option<String>,
    /// Why its cgroup file was not believed (see `procfs::read_cgroup`):
    /// then nothing else here is filled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forged_cgroup: Option<String>,
}

/// ContainerInfo as read back from a recording.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordedContainerInfo {
    container: Option<String>,
    runtime: Option<String>,
    pod_uid: Option<String>,
    qos: Option<String>,
    ns_pid: Option<u32>,
    pod_name: Option<String>,
    namespace: Option<String>,
    #[serde(default)]
    memory_limit_file: Option<(String, String)>,
    #[serde(default)]
    dmem_cgroup: Option<String>,
    #[serde(default)]
    forged_cgroup: Option<String>,
}

// By hand: a derive would ask the input to outlive 'static for the &'static str fields.
impl<'de> serde::Deserialize<'de> for ContainerInfo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RecordedContainerInfo::deserialize(d).map(Into::into)
    }
}

impl From<RecordedContainerInfo> for ContainerInfo {
    /// Runtime and QoS names: only the ones this module produces are taken
    /// (anything else reads as unknown).
    fn from(r: RecordedContainerInfo) -> Self {
        const KNOWN: [&str; 7] = ["containerd", "cri-o", "docker", "podman", "guaranteed", "burstable", "besteffort"];
        let known = |s: Option<String>| s.and_then(|s| KNOWN.iter().copied().find(|k| *k == s));
        ContainerInfo {
            container: r.container,
            runtime: known(r.runtime),
            pod_uid: r.pod_uid,
            qos: known(r.qos),
            ns_pid: r.ns_pid,
            pod_name: r.pod_name,
            namespace: r.namespace,
            memory_limit_file: r.memory_limit_file,
            dmem_cgroup: r.dmem_cgroup,
            forged_cgroup: r.forged_cgroup,
        }
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID as written in a path: 36 chars with dashes (cgroupfs) or
/// underscores (systemd).
fn pod_uid(s: &str) -> Option<String> {
    let uid = s.replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() });
    ok.then_some(uid)
}

fn container_of(component: &str) -> Option<(String, Option<&'static str>)> {
    if is_hex64(component) {
        return Some((component.to_string(), None));
    }
    let scope = component.strip_suffix(".scope")?;
    if scope.starts_with("crio-conmon-") {
        return None;
    }
    for (prefix, runtime) in [("cri-containerd-", "containerd"), ("crio-", "cri-o"), ("docker-", "docker"), ("libpod-", "podman")] {
        if let Some(id) = scope.strip_prefix(prefix) {
            if is_hex64(id) {
                return Some((id.to_string(), Some(runtime)));
            }
        }
    }
    None
}

/// Container, pod and QoS from one cgroup path.
pub fn parse_path(path: &str) -> ContainerInfo {
    let mut info = ContainerInfo::default();
    let mut in_kubepods = false;
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        let name = part.strip_suffix(".slice").unwrap_or(part);
        if name == "kubepods" {
            in_kubepods = true;
            continue;
        }
        if in_kubepods {
            // cgroupfs: kubepods/<qos>/pod<uid>; systemd: kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice
            let tail = name.strip_prefix("kubepods-").unwrap_or(name);
            for qos in ["burstable", "besteffort"] {
                if tail == qos || tail.starts_with(&format!("{qos}-")) {
                    info.qos = Some(qos);
                }
            }
            let tail = tail.strip_prefix("burstable-").or_else(|| tail.strip_prefix("besteffort-")).unwrap_or(tail);
            if let Some(uid) = tail.strip_prefix("pod").and_then(pod_uid) {
                info.pod_uid = Some(uid);
            }
        }
        if let Some((id, runtime)) = container_of(part) {
            info.container = Some(id);
            info.runtime = runtime.or(if i > 0 && parts[i - 1] == "docker" { Some("docker") } else { None });
        }
    }
    if info.pod_uid.is_some() && info.qos.is_none() {
        info.qos = Some("guaranteed");
    }
    info
}

/// Container info from `/proc/PID/cgroup` text: the first line (v2 `0::`
/// first, then v1 controllers) whose path names a container or pod.
pub fn parse_cgroup_file(text: &str) -> ContainerInfo {
    from_cgroups(&procfs::parse_cgroup(text))
}

pub fn from_cgroups(lines: &[procfs::CgroupLine]) -> ContainerInfo {
    let mut lines: Vec<&procfs::CgroupLine> = lines.iter().collect();
    lines.sort_by_key(|l| !l.is_v2());
    for line in lines {
        let info = parse_path(&line.path);
        if info.container.is_some() || info.pod_uid.is_some() {
            return info;
        }
    }
    ContainerInfo::default()
}

/// `max` (v2) or a page-rounded i64::MAX (v1) mean no limit.
pub fn is_limited(limit: &str) -> bool {
    match limit.parse::<u64>() {
        Ok(v) => v < (1u64 << 62),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_limits() {
        assert!(super::is_limited("67108864"));
        assert!(!super::is_limited("max"));
        assert!(!super::is_limited("9223372036854771712"));
    }

    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "6b1c2d3e-4f50-4a1b-9c2d-3e4f5a6b7c8d";

    fn uid_underscored() -> String {
        UID.replace('-', "_")
    }

    #[test]
    fn cgroupfs_kubernetes() {
        let i = parse_path(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(i.pod_uid.as_deref(), Some(UID));
        assert_eq!(i.container.as_deref(), Some(ID));
        assert_eq!(i.qos, Some("burstable"));
        let i = parse_path(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
        assert_eq!(i.qos, Some("besteffort"));
        let i = parse_path(&format!("/kubepods/pod{UID}/{ID}"));
        assert_eq!(i.qos, Some("guaranteed"));
        assert_eq!(i.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn systemd_kubernetes_runtimes() {
        for (prefix, runtime) in [("cri-containerd", "containerd"), ("crio", "cri-o"), ("docker", "docker")] {
            let path =
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/{prefix}-{ID}.scope", uid_underscored());
            let i = parse_path(&path);
            assert_eq!(i.pod_uid.as_deref(), Some(UID), "{path}");
            assert_eq!(i.container.as_deref(), Some(ID), "{path}");
            assert_eq!(i.qos, Some("burstable"));
            assert_eq!(i.runtime, Some(runtime));
        }
        let i = parse_path(&format!("/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope", uid_underscored()));
        assert_eq!(i.qos, Some("guaranteed"));
        assert_eq!(i.pod_uid.as_deref(), Some(UID));
        let i = parse_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-conmon-{ID}.scope",
            uid_underscored()
        ));
        assert_eq!(i.container, None, "conmon is not the container");
        assert_eq!(i.qos, Some("besteffort"));
    }

    #[test]
    fn plain_docker_and_podman() {
        let i = parse_path(&format!("/docker/{ID}"));
        assert_eq!((i.container.as_deref(), i.runtime, i.pod_uid), (Some(ID), Some("docker"), None));
        let i = parse_path(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!((i.container.as_deref(), i.runtime), (Some(ID), Some("docker")));
        let i = parse_path(&format!("/machine.slice/libpod-{ID}.scope/container"));
        assert_eq!((i.container.as_deref(), i.runtime), (Some(ID), Some("podman")));
    }

    #[test]
    fn not_containers() {
        assert_eq!(parse_path("/"), ContainerInfo::default());
        assert_eq!(parse_path("/user.slice/user-0.slice/session-3.scope"), ContainerInfo::default());
        assert_eq!(parse_path("/process_api/0b67dfdd6c93eff6b455116651b1f5f3"), ContainerInfo::default());
        assert_eq!(parse_path("/kubepods/burstable/podnot-a-uid/abc"), ContainerInfo { qos: Some("burstable"), ..Default::default() });
    }

    #[test]
    fn cgroup_file_v1_and_v2() {
        let v1 = format!("12:pids:/\n4:memory:/kubepods/burstable/pod{UID}/{ID}\n0::/\n");
        let i = parse_cgroup_file(&v1);
        assert_eq!((i.pod_uid.as_deref(), i.container.as_deref()), (Some(UID), Some(ID)));
        let v2 = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{ID}.scope\n",
            uid_underscored()
        );
        let i = parse_cgroup_file(&v2);
        assert_eq!((i.pod_uid.as_deref(), i.container.as_deref(), i.qos), (Some(UID), Some(ID), Some("besteffort")));
        assert_eq!(parse_cgroup_file("0::/\n4:memory:/\n"), ContainerInfo::default());
    }
}
