//! PyTorch's caching allocator from outside: the `pytorch:malloc` and
//! `pytorch:free` USDT probes of every libc10_cuda.so a process maps.
//!
//! The probes are semaphore-gated (PyTorch evaluates its arguments only
//! while the semaphore is nonzero), so they are linked with each site's
//! `ref_ctr_offset`: the kernel raises the semaphore in every process that
//! maps the library, now and later, and lowers it when the link goes (when
//! gpumem stops, however it stops: the link is a file descriptor). aya has
//! no way to pass `ref_ctr_offsets`, so the uprobe_multi link is made with
//! BPF_LINK_CREATE directly, each site's spec index as its cookie. Kernels
//! without uprobe_multi links (before 6.6) get one perf-event uprobe per
//! site, its `ref_ctr_offset` in the event's config, linked with a cookie
//! (5.15+).
use gpumem_common::names::{map, program};
use std::{
    ffi::CString,
    os::{
        fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya::programs::UProbe;
use gpumem_common::{
    api,
    usdt::{arg_kind, UsdtArgSpec, UsdtSpec, ARGS_MAX, SPECS_MAX},
};

use gpumem_engine::{
    formats::arm64_probe::{Decision, Site},
    model::degraded::Reason,
};

use super::{
    usdt::{self, Location, UsdtProbe},
    Agent, Library, ProbeError, ProbeSet,
};

/// Is this file name PyTorch's CUDA library (libc10_cuda.so)?
pub fn is_torch_cuda_name(name: &str) -> bool {
    name == "libc10_cuda.so" || name.starts_with("libc10_cuda.so.")
}

/// One probe site of a library, as `gpumem status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SiteReport {
    /// `pytorch:malloc` or `pytorch:free`.
    pub probe: String,
    pub offset: u64,
    /// File offset of its semaphore (the link's ref_ctr_offset).
    pub semaphore: Option<u64>,
    /// The argument specs as the note has them, decoded.
    pub args: Vec<String>,
    /// On arm64: the site's instruction (a `nop`) and what the gate decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm64: Option<Decision>,
}

/// What was attached to one libc10_cuda.so.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TorchReport {
    pub path: String,
    pub source: String,
    pub dev: u64,
    pub inode: u64,
    pub sites: Vec<SiteReport>,
    /// Why nothing (or not everything) was attached.
    pub error: Option<String>,
    pub attached: bool,
    /// How the sites are linked: one uprobe_multi link, or a perf-event uprobe each.
    pub links: Option<super::links::LinkMode>,
}

/// The probe a note describes, and the arguments it must have.
fn probe_id(p: &UsdtProbe) -> Option<(u32, usize)> {
    match (p.provider.as_str(), p.name.as_str()) {
        ("pytorch", "malloc") => Some((api::TENSOR_ALLOC, 4)),
        ("pytorch", "free") => Some((api::TENSOR_FREE, 1)),
        _ => None,
    }
}

/// The kernel side's spec of one site; an error names what does not fit.
pub fn spec_of(p: &UsdtProbe) -> Result<UsdtSpec, String> {
    let (probe, wanted) = probe_id(p).ok_or_else(|| format!("{}:{} is not a probe gpumem reads", p.provider, p.name))?;
    if p.arch != usdt::Arch::host() {
        // Its operands name another machine's registers (pt_regs offsets differ).
        return Err(format!(
            "{}:{} is written for {}; this agent runs on {}",
            p.provider,
            p.name,
            p.arch.name(),
            usdt::Arch::host().name()
        ));
    }
    if p.args.len() < wanted {
        return Err(format!("{}:{} has {} arguments, {wanted} expected", p.provider, p.name, p.args.len()));
    }
    let mut spec = UsdtSpec { probe, ..Default::default() };
    for (slot, a) in spec.args.iter_mut().zip(p.args.iter().take(ARGS_MAX)) {
        let (kind, reg_off, value, high_byte) = match a.location {
            Location::Register { pt_regs, high_byte } => (arg_kind::REGISTER, pt_regs, 0, high_byte),
            Location::Constant(c) => (arg_kind::CONSTANT, 0, c, false),
            Location::Memory { pt_regs, displacement } => (arg_kind::MEMORY, pt_regs, displacement, false),
        };
        *slot =
            UsdtArgSpec { value, reg_off, kind, shift: 64 - 8 * a.size, signed: a.signed as u8, high_byte: high_byte as u8, _pad: [0; 2] };
    }
    Ok(spec)
}

fn describe_arg(arch: usdt::Arch, a: &usdt::UsdtArg) -> String {
    let sign = if a.signed { "i" } else { "u" };
    format!("{sign}{} {}", a.size * 8, arch.describe(&a.location))
}

/// `bpf_attr` for BPF_LINK_CREATE of a uprobe_multi link (uapi linux/bpf.h).
#[repr(C)]
struct UprobeMultiAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_PERF_EVENT: u32 = 41;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `bpf_attr` for BPF_LINK_CREATE of a perf-event link with a cookie.
#[repr(C)]
struct PerfLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
}

/// `struct perf_event_attr` as far as PERF_ATTR_SIZE_VER5 (112 bytes):
/// only what a uprobe event sets is named.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    /// The uprobe PMU's: bit 0 retprobe, bits 32-63 the ref_ctr_offset.
    config: u64,
    _sample_and_flags: [u64; 4],
    _wakeup_and_bp_type: [u32; 2],
    /// The path of the probed file.
    config1: u64,
    /// The probe's file offset.
    config2: u64,
    _rest: [u64; 5],
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 112);

/// The kernel's uprobe PMU type and where it wants the ref_ctr_offset.
fn uprobe_pmu() -> Result<(u32, u32), String> {
    let dir = std::path::Path::new("/sys/bus/event_source/devices/uprobe");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map_err(|e| format!("{}: {e}", dir.join(f).display()));
    let kind = read("type")?.trim().parse().map_err(|_| "the uprobe PMU type is not a number".to_string())?;
    // "config:32-63" on every kernel with ref_ctr_offset support (4.20+).
    let shift = read("format/ref_ctr_offset")?
        .trim()
        .strip_prefix("config:")
        .and_then(|r| r.split('-').next()?.parse().ok())
        .ok_or("the uprobe PMU has no ref_ctr_offset field (before 4.20): semaphore-gated probes cannot fire")?;
    Ok((kind, shift))
}

/// One perf-event uprobe on every process (pid −1, any CPU: cpu 0 as the
/// kernel asks of a pid −1 event), with its semaphore.
fn perf_uprobe(pmu: (u32, u32), path: &CString, offset: u64, ref_ctr: u64) -> std::io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        kind: pmu.0,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: ref_ctr << pmu.1,
        config1: path.as_ptr() as u64,
        config2: offset,
        ..Default::default()
    };
    // SAFETY: the attribute and the path outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr as *const _, -1, 0, -1, PERF_FLAG_FD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Links a program to a perf event with a cookie.
fn perf_link(prog_fd: i32, event: &OwnedFd, cookie: u64) -> std::io::Result<OwnedFd> {
    let attr = PerfLinkAttr {
        prog_fd: prog_fd as u32,
        target_fd: event.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        flags: 0,
        bpf_cookie: cookie,
    };
    // SAFETY: as for link_create.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_CREATE, &attr as *const _, std::mem::size_of::<PerfLinkAttr>()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// One uprobe_multi link with semaphores, for every process.
fn link_create(prog_fd: i32, path: &CString, offsets: &[u64], ref_ctr: &[u64], cookies: &[u64]) -> std::io::Result<OwnedFd> {
    let attr = UprobeMultiAttr {
        prog_fd: prog_fd as u32,
        target_fd: 0,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        flags: 0,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        ref_ctr_offsets: ref_ctr.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: 0,
        pid: 0,
        _pad: 0,
    };
    // SAFETY: the attribute and every array it points to outlive the call;
    // the kernel reads `size` bytes of the attribute.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_CREATE, &attr as *const _, std::mem::size_of::<UprobeMultiAttr>()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl Agent {
    /// Attaches PyTorch's allocator probes of one libc10_cuda.so (once per inode).
    pub fn attach_torch(&mut self, lib: &Library) -> Option<&TorchReport> {
        let opened = self.claim(lib)?;
        self.links_changed = true;
        let mut report = TorchReport {
            path: lib.name.clone(),
            source: lib.source.to_string(),
            dev: lib.dev,
            inode: lib.ino,
            sites: Vec::new(),
            error: None,
            attached: false,
            links: None,
        };
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                report.error = Some(format!("opening it: {e}"));
                self.torch.push(report);
                return self.torch.last();
            }
        };
        match usdt::probes(&opened.path) {
            Err(e) => {
                if let (true, Some(pid)) = (e.over_budget(), lib.pid) {
                    self.degraded.push((pid, Reason::LibraryTables, format!("{}: {}", lib.name, opened.said(&e))));
                }
                report.error = Some(opened.said(e));
            }
            Ok(probes) => {
                let sites: Vec<&UsdtProbe> = probes.iter().filter(|p| probe_id(p).is_some()).collect();
                report.sites = sites
                    .iter()
                    .map(|p| SiteReport {
                        probe: format!("{}:{}", p.provider, p.name),
                        offset: p.offset,
                        semaphore: p.semaphore,
                        args: p.args.iter().map(|a| describe_arg(p.arch, a)).collect(),
                        arm64: self.gate.check(&opened.path, p.offset, Site::Usdt).map(|d| Decision { why: opened.said(&d.why), ..d }),
                    })
                    .collect();
                let allowed: Vec<&UsdtProbe> =
                    sites.iter().zip(&report.sites).filter(|(_, r)| r.arm64.as_ref().is_none_or(|d| d.attach)).map(|(p, _)| *p).collect();
                let refused = report.sites.iter().find_map(|r| r.arm64.as_ref().filter(|d| !d.attach));
                let linked = match refused {
                    Some(d) if allowed.is_empty() => Err(format!("every probe site refused on arm64: {}: {}", d.instruction, d.why)),
                    _ => self.link_torch(&allowed, &opened.path),
                };
                match linked {
                    Ok(()) => {
                        report.attached = true;
                        report.links = Some(self.uprobe_links.mode);
                    }
                    Err(e) => report.error = Some(opened.said(e)),
                }
            }
        }
        self.torch.push(report);
        self.torch.last()
    }

    fn link_torch(&mut self, sites: &[&UsdtProbe], lib_path: &Path) -> Result<(), String> {
        if sites.is_empty() {
            return Err("no pytorch:malloc or pytorch:free probes in its .note.stapsdt (a PyTorch built without USDT probes)".into());
        }
        let specs = sites.iter().map(|p| spec_of(p)).collect::<Result<Vec<_>, _>>()?;
        let first = self.usdt_specs_used;
        if first as usize + specs.len() > SPECS_MAX as usize {
            return Err(format!("more than {SPECS_MAX} PyTorch probe sites across libraries: not attached"));
        }
        let mut table: aya::maps::Array<_, UsdtSpec> = aya::maps::Array::try_from(
            self.ebpf.map_mut(map::USDT_SPECS).ok_or(ProbeError::MissingMap(map::USDT_SPECS)).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        for (i, spec) in specs.iter().enumerate() {
            table.set(first + i as u32, spec, 0).map_err(|e| format!("USDT_SPECS: {e}"))?;
        }
        let multi = self.uprobe_links.mode == super::links::LinkMode::Multi;
        let program = match (self.options.probe_set, multi) {
            (ProbeSet::Empty, true) => program::bench::USDT_MULTI,
            (ProbeSet::Empty, false) => program::bench::USDT,
            (ProbeSet::Full, true) => program::TORCH_USDT_MULTI,
            (ProbeSet::Full, false) => program::TORCH_USDT,
        };
        let prog: &mut UProbe = self.program(program).map_err(|e| e.to_string())?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| format!("eBPF program {program} failed to load: {e}"))?;
        }
        let prog_fd = prog.fd().map_err(|e| e.to_string())?.as_fd().as_raw_fd();
        let path = CString::new(lib_path.as_os_str().as_bytes()).map_err(|_| "a path with a NUL byte".to_string())?;
        let offsets: Vec<u64> = sites.iter().map(|p| p.offset).collect();
        let ref_ctr: Vec<u64> = sites.iter().map(|p| p.semaphore.unwrap_or(0)).collect();
        let cookies: Vec<u64> = (0..sites.len() as u64).map(|i| first as u64 + i).collect();
        let linked = if multi {
            link_create(prog_fd, &path, &offsets, &ref_ctr, &cookies)
                .map(|link| vec![link])
                .map_err(|e| format!("linking {} probe sites with their semaphores: {e}", sites.len()))?
        } else {
            let pmu = uprobe_pmu()?;
            let mut fds = Vec::new();
            for i in 0..sites.len() {
                let event = perf_uprobe(pmu, &path, offsets[i], ref_ctr[i])
                    .map_err(|e| format!("a uprobe event for probe site {:#x}: {e}", offsets[i]))?;
                let link = perf_link(prog_fd, &event, cookies[i])
                    .map_err(|e| format!("linking probe site {:#x} (bpf_cookie needs 5.15+): {e}", offsets[i]))?;
                fds.extend([event, link]);
            }
            fds
        };
        self.usdt_specs_used += specs.len() as u32;
        self.uprobe_links.links += if multi { 1 } else { sites.len() };
        self.torch_links.extend(linked);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_of_pytorch_probes_as_the_wheel_has_them() {
        // torch 2.15.0's libc10_cuda.so: `-8@%rbp -1@%al -8@%r12 -8@56(%rsp)` and `-8@%rdi`.
        let args = |specs: &[&str]| specs.iter().map(|s| usdt::parse_arg(s).unwrap()).collect::<Vec<_>>();
        let malloc = UsdtProbe {
            provider: "pytorch".into(),
            name: "malloc".into(),
            arch: usdt::Arch::X86_64,
            offset: 0x4a173,
            semaphore: Some(0x867ca),
            args: args(&["-8@%rbp", "-1@%al", "-8@%r12", "-8@56(%rsp)"]),
        };
        let s = spec_of(&malloc).unwrap();
        assert_eq!(s.probe, api::TENSOR_ALLOC);
        assert_eq!((s.args[0].kind, s.args[0].reg_off, s.args[0].shift, s.args[0].signed), (arg_kind::REGISTER, 32, 0, 1));
        assert_eq!((s.args[1].reg_off, s.args[1].shift), (80, 56), "the device is an i8 in al");
        assert_eq!((s.args[3].kind, s.args[3].reg_off, s.args[3].value), (arg_kind::MEMORY, 152, 56), "the stream at 56(%rsp)");
        let free = UsdtProbe { name: "free".into(), args: args(&["-8@%rdi"]), ..malloc.clone() };
        assert_eq!(spec_of(&free).unwrap().probe, api::TENSOR_FREE);
        let short = UsdtProbe { args: args(&["-8@%rdi"]), ..malloc.clone() };
        assert!(spec_of(&short).unwrap_err().contains("1 arguments, 4 expected"));
        // An aarch64 library's probes (as aarch64-linux-gnu-gcc writes the test allocator's)
        // are read for the registers of the machine the agent runs on only.
        let aarch64 = |specs: &[&str]| specs.iter().map(|s| usdt::Arch::Aarch64.parse_arg(s).unwrap()).collect::<Vec<_>>();
        let arm = UsdtProbe { arch: usdt::Arch::Aarch64, args: aarch64(&["8@x21", "-1@x0", "8@x19", "-8@[sp, 16]"]), ..malloc.clone() };
        assert_eq!(describe_arg(arm.arch, &arm.args[3]), "i64 [sp, 16]");
        assert_eq!(describe_arg(malloc.arch, &malloc.args[3]), "i64 56(%rsp)");
        match spec_of(&arm) {
            Ok(s) if cfg!(target_arch = "aarch64") => {
                assert_eq!((s.args[0].kind, s.args[0].reg_off), (arg_kind::REGISTER, 21 * 8));
                assert_eq!((s.args[3].kind, s.args[3].reg_off, s.args[3].value), (arg_kind::MEMORY, 31 * 8, 16), "sp after x0..x30");
            }
            Err(why) => assert!(cfg!(target_arch = "x86_64") && why.contains("written for aarch64; this agent runs on x86_64"), "{why}"),
            Ok(s) => panic!("aarch64 registers read on x86_64: {s:?}"),
        }
        let other = UsdtProbe { provider: "python".into(), ..malloc };
        assert!(spec_of(&other).is_err());
        assert!(is_torch_cuda_name("libc10_cuda.so") && !is_torch_cuda_name("libc10.so"));
    }
}
