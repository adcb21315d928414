use which::which;

/// Rebuild when bpf-linker changes (it is what links the eBPF object).
fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
