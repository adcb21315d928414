//! The NVIDIA driver's XID lines in the kernel log (`NVRM: Xid
//! (PCI:0000:3b:00): 79, pid=1234, name=python3, ...`); any process that
//! may write /dev/kmsg can write one, so they are parsed as untrusted text.
/// One `NVRM: Xid` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KmsgXid {
    /// `0000:3b:00` as the driver writes it.
    pub pci: String,
    pub xid: u64,
    pub pid: Option<u32>,
}

/// The XID in a kernel log line, if it is one.
pub fn parse(line: &str) -> Option<KmsgXid> {
    let rest = &line[line.find("NVRM: Xid (")? + "NVRM: Xid (".len()..];
    let (inside, after) = rest.split_once("):")?;
    let pci = inside.strip_prefix("PCI:").unwrap_or(inside).trim().to_ascii_lowercase();
    let mut fields = after.split(',').map(str::trim);
    let xid = fields.next()?.parse().ok()?;
    let pid = fields.find_map(|f| f.strip_prefix("pid=")?.parse().ok());
    Some(KmsgXid { pci, xid, pid })
}

/// `domain:bus:device` of a PCI id, lower-case with the domain's leading
/// zeros gone: NVML's `00000000:3B:00.0` and the driver's `0000:3b:00` agree.
pub fn pci_key(id: &str) -> String {
    let id = id.to_ascii_lowercase();
    let id = id.split('.').next().unwrap_or(&id);
    match id.split_once(':') {
        Some((domain, rest)) => {
            let domain = domain.trim_start_matches('0');
            format!("{}:{rest}", if domain.is_empty() { "0" } else { domain })
        }
        None => id.to_string(),
    }
}
