//! Parsers of files and text other processes shape, with no I/O policy of
//! their own: the symbol tables and USDT notes of the libraries a process
//! loads, the dynamic linker's cache, the driver's XID lines. Every one is
//! fed arbitrary bytes by `crate::untrusted`'s fuzz targets.
pub mod arm64_probe;
pub mod budget;
pub mod kmsg_xid;
pub mod ld_cache;
pub mod symbols;
pub mod usdt;
pub mod usdt_aarch64;

/// The machine the agent runs on, as ELF files name it: uprobes go into
/// its code only (a process under qemu-user maps another machine's
/// libraries as data, which a breakpoint would corrupt).
pub fn host_architecture() -> object::Architecture {
    if cfg!(target_arch = "aarch64") {
        object::Architecture::Aarch64
    } else {
        object::Architecture::X86_64
    }
}

/// A file another process chose, opened for its ELF structures: not mapped
/// (its owner truncating it under a mapping would kill the agent with
/// SIGBUS), not read whole (a library of any size costs what its headers,
/// tables and the sections asked for take, read into the cache on demand).
pub fn elf_reader(path: &std::path::Path) -> std::io::Result<object::ReadCache<std::fs::File>> {
    Ok(object::ReadCache::new(std::fs::File::open(path)?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_library_truncated_while_it_is_read_is_an_error_not_a_crash() {
        let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/elf_symbols/libcuda.so.1");
        let path = std::env::temp_dir().join(format!("gpumem-truncated-{}.so", std::process::id()));
        std::fs::copy(seed, &path).unwrap();
        let reader = super::elf_reader(&path).unwrap();
        // Its owner cuts it after the agent opened it (a mapping would SIGBUS).
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(64).unwrap();
        assert!(super::symbols::function_offsets_in(&reader, |_| true).is_err());
        std::fs::remove_file(&path).unwrap();
        let whole = super::symbols::function_offsets(std::path::Path::new(seed), |_| true).unwrap();
        assert!(whole.contains_key("cuMemAlloc_v2"), "{whole:?}");
    }

    #[test]
    fn a_library_for_another_machine_gets_no_probe() {
        // The same libcuda, its ELF header saying aarch64 (e_machine 183): what
        // an emulated process under qemu-user maps.
        let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/elf_symbols/libcuda.so.1");
        let mut bytes = std::fs::read(seed).unwrap();
        let other: u16 = if cfg!(target_arch = "aarch64") { 62 } else { 183 };
        bytes[18..20].copy_from_slice(&other.to_le_bytes());
        let path = std::env::temp_dir().join(format!("gpumem-other-machine-{}.so", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let err = super::symbols::function_offsets(&path, |_| true).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        let said = err.to_string();
        assert!(said.contains("not for this machine") && said.contains("no probe goes into it"), "{said}");
    }
}
