//! Resolves exported function symbols of a shared library to the file
//! offsets that uprobes attach to, reading the library once.
use std::{collections::HashMap, path::Path};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::budget;

#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not an ELF shared library: {source}")]
    Parse { path: String, source: object::Error },
    #[error("{path}: its symbol tables hold over {} symbols, more than gpumem reads of one file", budget::MAX_SYMBOLS)]
    TooMany { path: String },
    #[error("reading {path}'s symbols took over {}s (gpumem waits no longer for one file)", budget::DEADLINE.as_secs())]
    Late { path: String },
    #[error("{path}'s symbols were not read: {} earlier readings of libraries still run past their deadline", budget::MAX_LATE)]
    Refused { path: String },
    #[error("{path} is code for {machine:?}, not for this machine ({host:?}): no probe goes into it (under an emulator such as qemu-user a breakpoint would corrupt it)")]
    Machine { path: String, machine: object::Architecture, host: object::Architecture },
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("{0}")]
    Elf(#[from] object::Error),
    #[error("its symbol tables hold over {} symbols, more than gpumem reads of one file", budget::MAX_SYMBOLS)]
    TooMany,
    #[error("it is code for {0:?}, not for this machine")]
    Machine(object::Architecture),
}

impl SymbolError {
    /// Past a budget (not merely unreadable): the processes that map the
    /// file are degraded for it.
    pub fn over_budget(&self) -> bool {
        matches!(self, SymbolError::TooMany { .. } | SymbolError::Late { .. } | SymbolError::Refused { .. })
    }
}

/// Symbol name → file offset, for the defined function symbols `wanted`
/// names (only those are kept: a table may hold any number): read on its
/// own thread, waited for `budget::DEADLINE` at most.
pub fn function_offsets(path: &Path, wanted: fn(&str) -> bool) -> Result<HashMap<String, u64>, SymbolError> {
    function_offsets_for(path, super::host_architecture(), wanted)
}

/// `function_offsets` of a library built for `machine` (`gpumem preflight`
/// checks arm64 libraries on any host).
pub fn function_offsets_for(
    path: &Path,
    machine: object::Architecture,
    wanted: fn(&str) -> bool,
) -> Result<HashMap<String, u64>, SymbolError> {
    let shown = path.display().to_string();
    let owned = path.to_path_buf();
    let read = move || -> Result<_, SymbolError> {
        let data = super::elf_reader(&owned).map_err(|source| SymbolError::Read { path: owned.display().to_string(), source })?;
        let path = owned.display().to_string();
        offsets_of_machine(&data, machine, wanted).map_err(|e| match e {
            TableError::Elf(source) => SymbolError::Parse { path, source },
            TableError::TooMany => SymbolError::TooMany { path },
            TableError::Machine(found) => SymbolError::Machine { path, machine: found, host: machine },
        })
    };
    match budget::within(budget::DEADLINE, read) {
        budget::Timed::Done(r) => r,
        budget::Timed::Late(_) => Err(SymbolError::Late { path: shown }),
        budget::Timed::Refused => Err(SymbolError::Refused { path: shown }),
    }
}

/// `function_offsets` of a file's bytes (whatever they are: a process chose
/// the file), scanning `budget::MAX_SYMBOLS` symbols at most.
pub fn function_offsets_in<'d, R: object::ReadRef<'d>>(data: R, wanted: fn(&str) -> bool) -> Result<HashMap<String, u64>, TableError> {
    offsets_of_machine(data, super::host_architecture(), wanted)
}

fn offsets_of_machine<'d, R: object::ReadRef<'d>>(
    data: R,
    machine: object::Architecture,
    wanted: fn(&str) -> bool,
) -> Result<HashMap<String, u64>, TableError> {
    let file = object::File::parse(data)?;
    // Offsets found here get breakpoints: only in this machine's code.
    if file.architecture() != machine {
        return Err(TableError::Machine(file.architecture()));
    }
    // The tables' sizes say it before a name is read (each name read is
    // kept by the reader: a huge table cost tens of MiB to learn it was huge).
    let declared = match &file {
        object::File::Elf64(f) => f.elf_symbol_table().len() + f.elf_dynamic_symbol_table().len(),
        object::File::Elf32(f) => f.elf_symbol_table().len() + f.elf_dynamic_symbol_table().len(),
        _ => 0,
    };
    if declared > budget::MAX_SYMBOLS {
        return Err(TableError::TooMany);
    }
    let mut out = HashMap::new();
    for (scanned, sym) in file.dynamic_symbols().chain(file.symbols()).enumerate() {
        if scanned >= budget::MAX_SYMBOLS {
            return Err(TableError::TooMany);
        }
        if sym.is_undefined() || sym.kind() != object::SymbolKind::Text {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if !wanted(name) {
            continue;
        }
        // Versioned names (name@VER) are reported without the version by object.
        let Some(index) = sym.section_index() else { continue };
        let Ok(section) = file.section_by_index(index) else { continue };
        let Some((file_off, _)) = section.file_range() else { continue };
        let Some(rel) = sym.address().checked_sub(section.address()) else { continue };
        // A symbol table can say anything: an offset past u64 is no offset.
        let Some(offset) = file_off.checked_add(rel) else { continue };
        out.entry(name.to_string()).or_insert(offset);
    }
    Ok(out)
}
