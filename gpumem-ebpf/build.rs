use which::which;

/// Rebuild when bpf-linker changes (it is what links the eBPF object).
/// `bpf_target_arch` is the machine whose registers the programs read
/// (gpumem-agent's build.rs sets it to the agent's target).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\"))");
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
