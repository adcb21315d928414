//! GPU memory limits from cgroup v2's `dmem` controller (Linux 6.14+): a
//! cgroup's `dmem.current`, `dmem.max`, `dmem.low` and `dmem.min` give, per
//! device memory region a driver registered (`drm/0000:11:00.0/vram0`), its
//! usage and limits. Read as the kernel writes them: one region per line,
//! its name, a space, a number of bytes or `max`. Kernels without the
//! controller, or drivers that register no region (NVIDIA's proprietary
//! driver today), have nothing to read: that is said, not guessed.
use crate::model::host::DmemRegion;

/// Where the cgroup v2 hierarchy is mounted: `GPUMEM_CGROUP2_ROOT` if set
/// (unusual mounts; the tests lay out files there as the kernel does),
/// else /sys/fs/cgroup/unified (hybrid hosts) or /sys/fs/cgroup.
pub fn cgroup2_root() -> String {
    if let Some(root) = std::env::var_os("GPUMEM_CGROUP2_ROOT") {
        return root.to_string_lossy().into_owned();
    }
    if std::path::Path::new("/sys/fs/cgroup/unified").is_dir() { "/sys/fs/cgroup/unified" } else { "/sys/fs/cgroup" }.to_string()
}

/// Most regions read per cgroup: a node has a few GPUs, each a region or two.
const REGIONS_MAX: usize = 64;
/// Most bytes read of one dmem file.
const FILE_MAX: u64 = 16 << 10;

/// `name value` lines: the value in bytes, None for `max`.
fn parse(text: &str) -> Vec<(String, Option<u64>)> {
    text.lines()
        .filter_map(|l| {
            let (name, value) = l.trim().rsplit_once(' ')?;
            let name = name.trim();
            // A region name is the kernel's: printable, bounded.
            if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return None;
            }
            let value = if value == "max" { None } else { Some(value.parse().ok()?) };
            Some((name.to_string(), value))
        })
        .take(REGIONS_MAX)
        .collect()
}

fn read(dir: &str, file: &str) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(format!("{dir}/{file}")).ok()?.take(FILE_MAX).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The regions of the cgroup at `dir` (None: it has no dmem files).
pub fn regions(dir: &str) -> Option<Vec<DmemRegion>> {
    let current = parse(&read(dir, "dmem.current")?);
    let limits = |file: &str| read(dir, file).map(|t| parse(&t)).unwrap_or_default();
    let (max, low, min) = (limits("dmem.max"), limits("dmem.low"), limits("dmem.min"));
    let of = |list: &[(String, Option<u64>)], name: &str| list.iter().find(|(n, _)| n == name).and_then(|(_, v)| *v);
    Some(
        current
            .into_iter()
            .map(|(region, usage)| DmemRegion {
                usage_bytes: usage.unwrap_or(0),
                limit_bytes: of(&max, &region),
                low_bytes: of(&low, &region),
                min_bytes: of(&min, &region),
                region,
            })
            .collect(),
    )
}

/// The PCI bus id a region names (`drm/0000:11:00.0/vram0` → `0000:11:00.0`).
pub fn region_pci_bus_id(region: &str) -> Option<&str> {
    let mut parts = region.split('/');
    (parts.next()? == "drm").then(|| parts.next()).flatten()
}

/// Whether this kernel has the controller, and why not when it has none.
pub fn availability() -> Result<(), String> {
    let root = cgroup2_root();
    let controllers = std::fs::read_to_string(format!("{root}/cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "dmem") {
        Ok(())
    } else {
        Err(format!("not available: no dmem controller in {root}/cgroup.controllers (Linux 6.14+ with CONFIG_CGROUP_DMEM)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_as_the_kernel_writes_them() {
        let dir = std::env::temp_dir().join(format!("gpumem-dmem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dmem.current"), "drm/0000:11:00.0/vram0 12582912\ndrm/0000:12:00.0/vram0 0\n").unwrap();
        std::fs::write(dir.join("dmem.max"), "drm/0000:11:00.0/vram0 16777216\ndrm/0000:12:00.0/vram0 max\n").unwrap();
        std::fs::write(dir.join("dmem.low"), "drm/0000:11:00.0/vram0 0\ndrm/0000:12:00.0/vram0 0\n").unwrap();
        let r = regions(dir.to_str().unwrap()).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].region.as_str(), r[0].usage_bytes, r[0].limit_bytes, r[0].low_bytes),
            ("drm/0000:11:00.0/vram0", 12 << 20, Some(16 << 20), Some(0))
        );
        assert_eq!((r[1].limit_bytes, r[1].min_bytes), (None, None), "max is no limit; no dmem.min file");
        assert_eq!(region_pci_bus_id(&r[0].region), Some("0000:11:00.0"));
        // Hostile or broken lines are skipped, never trusted.
        std::fs::write(dir.join("dmem.current"), "drm/x\u{1b}[31m/vram0 5\nnonsense\ndrm/0000:11:00.0/vram0 -3\n").unwrap();
        assert!(regions(dir.to_str().unwrap()).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(regions(dir.to_str().unwrap()).is_none());
    }
}
