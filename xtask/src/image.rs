//! `cargo xtask image`: the OCI image the DaemonSet runs, as an OCI image
//! layout archive (target/image/gpumem-oci.tar), built with Debian's umoci
//! from a fresh machine, no registry and no daemon: an image index carrying
//! linux/amd64 and linux/arm64 (Grace) images, each with the release binary
//! for its architecture, the shared libraries it links (its ELF's needed
//! libraries and loader: the host's for amd64, Debian's aarch64 cross
//! libraries for arm64) and /etc/passwd, nothing else (no shell, no package
//! manager). Reproducible: the binaries are built with their paths
//! remapped, every time stamp is SOURCE_DATE_EPOCH (the last commit's
//! time), files are added in name order, the archive is written by tar in
//! name order, and the binaries are built from a clone of HEAD at a fixed
//! path, so the same commit gives the same digest from any checkout (with
//! the same toolchain and $HOME). The binaries are built with clippy
//! linting the workspace's crates as they compile (`cargo xtask test`
//! builds the aarch64 agent only here).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

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

/// Where one architecture's libraries come from on this machine and where
/// they go in its image (Debian's multiarch directory).
struct Sysroot {
    from: &'static str,
    to: &'static str,
}

fn sysroot(arch: &str) -> Result<Sysroot> {
    match arch {
        "amd64" => Ok(Sysroot { from: "/lib/x86_64-linux-gnu", to: "/lib/x86_64-linux-gnu" }),
        // libc6-arm64-cross: Debian's glibc built for aarch64 (cargo xtask setup installs it).
        "arm64" => Ok(Sysroot { from: "/usr/aarch64-linux-gnu/lib", to: "/lib/aarch64-linux-gnu" }),
        _ => bail!("no libraries known for {arch}"),
    }
}

/// An ELF's loader (PT_INTERP) and needed libraries, as readelf reads them.
fn dynamic(elf: &Path) -> Result<(Option<String>, Vec<String>)> {
    let text = output(Command::new("readelf").args(["-W", "-l", "-d"]).arg(elf))?;
    let bracketed = |l: &str, key: &str| Some(l.split_once(key)?.1.split_once(']')?.0.trim().to_string());
    let interp = text.lines().find_map(|l| bracketed(l, "[Requesting program interpreter:"));
    let needed = text.lines().filter(|l| l.contains("(NEEDED)")).filter_map(|l| bracketed(l, "Shared library: [")).collect();
    Ok((interp, needed))
}

/// The shared libraries a binary loads at start, loader included: (the file
/// here, its path in the image), each library's own needs followed.
fn libraries(bin: &Path, arch: &str) -> Result<Vec<(PathBuf, PathBuf)>> {
    let root = sysroot(arch)?;
    let (interp, mut todo) = dynamic(bin)?;
    let (mut libs, mut seen) = (Vec::new(), std::collections::BTreeSet::new());
    if let Some(interp) = interp {
        // The loader by the path the binary names; libc's need of it is that one.
        let name = Path::new(&interp).file_name().and_then(|n| n.to_str()).context("an interpreter's name")?;
        libs.push((Path::new(root.from).join(name), PathBuf::from(&interp)));
        seen.insert(name.to_string());
    }
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let from = Path::new(root.from).join(&name);
        if !from.exists() {
            bail!("{} needs {name}, which is not in {}", bin.display(), root.from);
        }
        todo.extend(dynamic(&from)?.1);
        libs.push((from, Path::new(root.to).join(&name)));
    }
    // Each name once (`seen`): sorted by where it goes, for a stable layer.
    libs.sort_by(|a, b| a.1.cmp(&b.1));
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
fn rootfs(root: &Path, bin: &Path, arch: &str) -> Result<()> {
    place(root, bin, Path::new("/usr/bin/gpumem"))?;
    for (from, at) in libraries(bin, arch)? {
        place(root, &from, &at)?;
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
use gpumem_tests::IMAGE_BUILD_ROOT as BUILD_ROOT;

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

/// The release binaries, one per Rust target, built from the fixed-path
/// clone with its own target directory, the clone's and cargo's paths
/// mapped to fixed names, clippy linting the workspace's crates (warnings
/// are errors) as they compile. The build scripts and proc macros are built
/// once for both.
fn release_binaries(root: &Path, targets: &[&str]) -> Result<Vec<PathBuf>> {
    let src = source_at_head(root)?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let target_dir = root.join("target");
    let flags = format!("--remap-path-prefix={}=/build/gpumem --remap-path-prefix={home}/.cargo=/build/cargo", src.display());
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--locked", "-p", "gpumem-agent"]);
    for t in targets {
        cmd.args(["--target", t]);
    }
    run(crate::linted(cmd.current_dir(&src).env("CARGO_TARGET_DIR", &target_dir).env("RUSTFLAGS", flags))?)?;
    Ok(targets.iter().map(|t| target_dir.join(t).join("release/gpumem")).collect())
}

/// The aarch64 agent (release) from the fixed-path clone of HEAD, built
/// alone: what the tests run under qemu-user and in the arm64 VM
/// (gpumem_tests::aarch64_gpumem_bin).
pub fn aarch64_binary() -> Result<PathBuf> {
    let root = Path::new(BUILD_ROOT);
    let _lock = BuildLock::take(root)?;
    Ok(release_binaries(root, &["aarch64-unknown-linux-gnu"])?.remove(0))
}

/// One platform's image in the layout, tagged `VERSION-ARCH`.
fn platform_image(layout: &Path, bundle: &Path, bin: &Path, arch: &str, epoch: &str, created: &str) -> Result<()> {
    let image = format!("{}:{}", layout.display(), gpumem_tests::image_tag(arch));
    let _ = std::fs::remove_dir_all(bundle);
    run(Command::new("umoci").args(["new", "--image", &image]))?;
    run(Command::new("umoci").args(["unpack", "--image", &image]).arg(bundle))?;
    let root = bundle.join("rootfs");
    rootfs(&root, bin, arch)?;
    stamp(&root, epoch)?;
    run(Command::new("umoci")
        .args(["repack", "--image", &image, "--history.created", created, "--history.created_by", "cargo xtask image"])
        .arg(bundle))?;
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--os",
        "linux",
        "--architecture",
        arch,
        "--created",
        created,
        "--history.created",
        created,
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
    let _ = std::fs::remove_dir_all(bundle);
    Ok(())
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Writes `bytes` as a blob of the layout; its descriptor.
fn blob(layout: &Path, media_type: &str, bytes: &[u8]) -> Result<Value> {
    let dir = layout.join("blobs/sha256");
    let tmp = dir.join("incoming");
    std::fs::write(&tmp, bytes)?;
    let sum = output(Command::new("sha256sum").arg(&tmp))?;
    let hex = sum.split_whitespace().next().context("sha256sum printed nothing")?.to_string();
    std::fs::rename(&tmp, dir.join(&hex))?;
    Ok(json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()}))
}

/// The image index of the platforms' images (what a registry serves for
/// the version's tag: a node pulls its own architecture's), tagged with
/// the version; the platforms' own tags stay beside it.
fn index_platforms(layout: &Path) -> Result<()> {
    let path = layout.join("index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let tagged = index["manifests"].as_array().context("index.json without manifests")?.clone();
    let mut manifests = Vec::new();
    for (arch, _) in gpumem_tests::IMAGE_PLATFORMS {
        let tag = gpumem_tests::image_tag(arch);
        let mut d =
            tagged.iter().find(|d| d["annotations"][REF_NAME] == tag.as_str()).with_context(|| format!("no image tagged {tag}"))?.clone();
        d.as_object_mut().context("a descriptor")?.remove("annotations");
        // arm64 images are ARMv8 (the variant containerd and the registries assume when none is said).
        d["platform"] = if arch == "arm64" {
            json!({"architecture": arch, "os": "linux", "variant": "v8"})
        } else {
            json!({"architecture": arch, "os": "linux"})
        };
        manifests.push(d);
    }
    let media_type = "application/vnd.oci.image.index.v1+json";
    let body = json!({"schemaVersion": 2, "mediaType": media_type, "manifests": manifests});
    let mut d = blob(layout, media_type, &serde_json::to_vec(&body)?)?;
    d["annotations"] = json!({ REF_NAME: env!("CARGO_PKG_VERSION") });
    let mut all = tagged;
    all.push(d);
    all.sort_by_key(|d| d["annotations"][REF_NAME].as_str().unwrap_or_default().to_string());
    index["manifests"] = json!(all);
    std::fs::write(&path, serde_json::to_vec(&index)?)?;
    Ok(())
}

pub fn build() -> Result<PathBuf> {
    let build_root = Path::new(BUILD_ROOT);
    let _lock = BuildLock::take(build_root)?;
    let targets: Vec<&str> = gpumem_tests::IMAGE_PLATFORMS.iter().map(|(_, t)| *t).collect();
    let bins = release_binaries(build_root, &targets)?;
    let dir = gpumem_tests::target_dir().join("image");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (layout, bundle) = (dir.join("layout"), dir.join("bundle"));
    let epoch = source_date_epoch()?;
    let created = output(Command::new("date").args(["-u", "-d"]).arg(format!("@{epoch}")).arg("+%Y-%m-%dT%H:%M:%SZ"))?.trim().to_string();
    run(Command::new("umoci").args(["init", "--layout"]).arg(&layout))?;
    for ((arch, _), bin) in gpumem_tests::IMAGE_PLATFORMS.iter().zip(&bins) {
        platform_image(&layout, &bundle, bin, arch, &epoch, &created)?;
    }
    // Unreferenced blobs (the empty images' configs) go before the index and the archive are made.
    run(Command::new("umoci").args(["gc", "--layout"]).arg(&layout))?;
    index_platforms(&layout)?;
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
    Ok(tar)
}
