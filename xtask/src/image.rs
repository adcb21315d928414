//! `cargo xtask image`: the OCI image the DaemonSet runs, as an OCI image
//! layout archive (target/image/gpumem-oci.tar), built with Debian's umoci
//! from a fresh machine, no registry and no daemon: the release binary, the
//! shared libraries it links (what `ldd` names, the dynamic loader) and
//! /etc/passwd, nothing else (no shell, no package manager). Reproducible:
//! the binary is built with its paths remapped, every time stamp is
//! SOURCE_DATE_EPOCH (the last commit's time), files are added in name
//! order, the archive is written by tar in name order, and the binary is
//! built from a clone of HEAD at a fixed path, so the same commit gives the
//! same digest from any checkout (with the same toolchain and $HOME).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, run};

/// The archive `cargo xtask image` writes.
pub fn archive() -> PathBuf {
    gpumem_tests::target_dir().join(gpumem_tests::IMAGE_ARCHIVE)
}

fn output(cmd: &mut Command) -> Result<String> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8(o.stdout)?)
}

/// The shared libraries a binary loads at start, loader included (ldd's
/// resolved paths).
fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let text = output(Command::new("ldd").arg(bin))?;
    let mut libs: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").nth(1).unwrap_or(l).split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    libs.sort();
    libs.dedup();
    Ok(libs)
}

/// Copies `from` to `root` + `at`, with its parents.
fn place(root: &Path, from: &Path, at: &Path) -> Result<()> {
    let dest = root.join(at.strip_prefix("/").unwrap_or(at));
    std::fs::create_dir_all(dest.parent().expect("a parent"))?;
    std::fs::copy(from, &dest).with_context(|| format!("copying {}", from.display()))?;
    Ok(())
}

/// The last commit's time: every time stamp in the image.
fn source_date_epoch() -> Result<String> {
    if let Ok(e) = std::env::var("SOURCE_DATE_EPOCH") {
        return Ok(e);
    }
    Ok(output(Command::new("git").args(["log", "-1", "--format=%ct"]).current_dir(gpumem_tests::workspace()))?.trim().to_string())
}

/// The root file system: the binary, its libraries, who its user is.
fn rootfs(root: &Path, bin: &Path) -> Result<()> {
    place(root, bin, Path::new("/usr/bin/gpumem"))?;
    for lib in libraries(bin)? {
        // The loader by the path the binary names (PT_INTERP), the rest where ldd found them.
        place(root, &lib, &lib)?;
    }
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc)?;
    std::fs::write(etc.join("passwd"), "root:x:0:0:root:/:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/usr/sbin/nologin\n")?;
    std::fs::write(etc.join("group"), "root:x:0:\nnonroot:x:65532:\n")?;
    // Mount points the DaemonSet uses (the root file system is read-only).
    for dir in ["sys/kernel/tracing", "sys/fs/bpf", "var/lib/gpumem", "run/gpumem", "proc", "tmp"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    Ok(())
}

/// Sets every time stamp under `root` to `epoch` (links not followed).
fn stamp(root: &Path, epoch: &str) -> Result<()> {
    run(Command::new("find").arg(root).args(["-exec", "touch", "-h", "-d"]).arg(format!("@{epoch}")).args(["{}", "+"]))
}

/// Where the image's binary is built: a clone of the checkout's HEAD at a
/// fixed path, with its own target directory. The eBPF object's BTF line
/// information names absolute source paths, and aya-build sets that nested
/// build's flags itself (no --remap-path-prefix reaches it), so only a fixed
/// path makes the same commit give the same bytes from any checkout.
const BUILD_ROOT: &str = "/var/tmp/gpumem-image";

/// Holds an exclusive lock on the build root while it lives (two image
/// builds share one clone).
struct BuildLock(#[allow(dead_code)] std::fs::File);

impl BuildLock {
    fn take(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root)?;
        let file = std::fs::File::create(root.join("lock"))?;
        use std::os::fd::AsRawFd as _;
        // SAFETY: flock on a descriptor this struct owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("locking {}: {}", root.display(), std::io::Error::last_os_error());
        }
        Ok(BuildLock(file))
    }
}

fn git(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(dir);
    cmd
}

/// The fixed-path clone, checked out at this checkout's HEAD (uncommitted
/// changes are not in the image: said).
fn source_at_head(root: &Path) -> Result<PathBuf> {
    let ws = gpumem_tests::workspace();
    let head = output(git(&ws).args(["rev-parse", "HEAD"]))?.trim().to_string();
    if !output(git(&ws).args(["status", "--porcelain", "--untracked-files=no"]))?.trim().is_empty() {
        eprintln!("xtask image: building commit {head}; this checkout's uncommitted changes are not in the image");
    }
    let src = root.join("src");
    if !src.join(".git").exists() {
        let _ = std::fs::remove_dir_all(&src);
        run(Command::new("git").args(["clone", "--quiet", "--no-checkout"]).arg(&ws).arg(&src))?;
    }
    run(git(&src).args(["fetch", "--quiet"]).arg(&ws).arg(&head))?;
    run(git(&src).args(["checkout", "--quiet", "--force", "--detach", &head]))?;
    run(git(&src).args(["clean", "-q", "-f", "-d", "-x"]))?;
    Ok(src)
}

/// The release binary, built from the fixed-path clone with its own target
/// directory, the clone's and cargo's paths mapped to fixed names.
fn release_binary(root: &Path) -> Result<PathBuf> {
    let src = source_at_head(root)?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let target = root.join("target");
    let flags = format!("--remap-path-prefix={}=/build/gpumem --remap-path-prefix={home}/.cargo=/build/cargo", src.display());
    run(cargo()
        .args(["build", "--release", "--locked", "-p", "gpumem-agent"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        .env("RUSTFLAGS", flags))?;
    Ok(target.join("release/gpumem"))
}

pub fn build() -> Result<PathBuf> {
    let build_root = Path::new(BUILD_ROOT);
    let _lock = BuildLock::take(build_root)?;
    let bin = release_binary(build_root)?;
    let dir = gpumem_tests::target_dir().join("image");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (layout, bundle) = (dir.join("layout"), dir.join("bundle"));
    let epoch = source_date_epoch()?;
    let created = output(Command::new("date").args(["-u", "-d"]).arg(format!("@{epoch}")).arg("+%Y-%m-%dT%H:%M:%SZ"))?.trim().to_string();
    let image = format!("{}:{}", layout.display(), env!("CARGO_PKG_VERSION"));
    run(Command::new("umoci").args(["init", "--layout"]).arg(&layout))?;
    run(Command::new("umoci").args(["new", "--image", &image]))?;
    run(Command::new("umoci").args(["unpack", "--image", &image]).arg(&bundle))?;
    let root = bundle.join("rootfs");
    rootfs(&root, &bin)?;
    stamp(&root, &epoch)?;
    run(Command::new("umoci")
        .args(["repack", "--image", &image, "--history.created", &created, "--history.created_by", "cargo xtask image"])
        .arg(&bundle))?;
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--created",
        &created,
        "--history.created",
        &created,
        "--config.entrypoint",
        "/usr/bin/gpumem",
        "--config.cmd",
        "serve",
        "--config.user",
        "0:0",
        "--config.workingdir",
        "/",
        // The chart's `command: ["gpumem"]` and `kubectl exec … -- gpumem` resolve through it.
        "--config.env",
        "PATH=/usr/bin",
        "--config.label",
        &format!("org.opencontainers.image.version={}", env!("CARGO_PKG_VERSION")),
        "--config.label",
        "org.opencontainers.image.title=gpumem",
    ]))?;
    // Unreferenced blobs (the empty image's config) go before the archive is made.
    run(Command::new("umoci").args(["gc", "--layout"]).arg(&layout))?;
    stamp(&layout, &epoch)?;
    let tar = archive();
    run(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--format=posix"])
        .arg("--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime")
        .arg(format!("--mtime=@{epoch}"))
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&layout)
        .arg("."))?;
    let _ = std::fs::remove_dir_all(&bundle);
    Ok(tar)
}
