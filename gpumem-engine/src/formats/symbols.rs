//! Resolves exported function symbols of a shared library to the file
//! offsets that uprobes attach to, reading the library once.
use std::{collections::HashMap, path::Path};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not an ELF shared library: {source}")]
    Parse { path: String, source: object::Error },
}

/// Symbol name → file offset, for every defined function symbol.
pub fn function_offsets(path: &Path) -> Result<HashMap<String, u64>, SymbolError> {
    let data = super::elf_reader(path).map_err(|source| SymbolError::Read { path: path.display().to_string(), source })?;
    function_offsets_in(&data).map_err(|source| SymbolError::Parse { path: path.display().to_string(), source })
}

/// `function_offsets` of a file's bytes (whatever they are: a process chose the file).
pub fn function_offsets_in<'d, R: object::ReadRef<'d>>(data: R) -> Result<HashMap<String, u64>, object::Error> {
    let file = object::File::parse(data)?;
    let mut out = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_undefined() || sym.kind() != object::SymbolKind::Text {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
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
