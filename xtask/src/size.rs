//! The house's size rules, checked by `cargo xtask lint`: no module over 500
//! lines and no function over 80, outside tests (`tests/e2e`,
//! `#[cfg(test)]` modules, `tests.rs` files and `#[test]` functions).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use syn::{spanned::Spanned as _, visit::Visit};

pub const MAX_MODULE_LINES: usize = 500;
pub const MAX_FUNCTION_LINES: usize = 80;

/// The source folders the rules apply to.
const SOURCES: [&str; 7] =
    ["gpumem-agent/src", "gpumem-agent/benches", "gpumem-engine/src", "gpumem-common/src", "gpumem-ebpf/src", "xtask/src", "tests/src"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("test") || (a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")))
}

fn lines(span: proc_macro2::Span) -> usize {
    span.end().line + 1 - span.start().line
}

/// A function's lines, from its signature to its closing brace (doc comments and attributes left out).
fn fn_lines(sig: &syn::Signature, block: &syn::Block) -> (usize, usize) {
    let (start, end) = (sig.span().start().line, block.span().end().line);
    (start, end + 1 - start)
}

/// A file's functions outside tests (name, first line, lines) and the lines of its test modules.
#[derive(Default)]
struct Sizes {
    functions: Vec<(String, usize, usize)>,
    test_lines: usize,
}

impl Sizes {
    fn function(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let (line, n) = fn_lines(sig, block);
        self.functions.push((sig.ident.to_string(), line, n));
    }
}

impl<'ast> Visit<'ast> for Sizes {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test(&m.attrs) {
            self.test_lines += lines(m.span());
        } else {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.function(&f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.function(&f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
}

/// Checks every module and function; says the largest of each, and fails
/// naming what is over.
pub fn check(root: &Path) -> Result<()> {
    let mut files = Vec::new();
    for dir in SOURCES {
        rust_files(&root.join(dir), &mut files)?;
    }
    files.sort();
    let mut problems = Vec::new();
    let (mut largest, mut longest) = ((String::new(), 0), (String::new(), 0));
    for path in &files {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
        let mut sizes = Sizes::default();
        sizes.visit_file(&file);
        let rel = path.strip_prefix(root).unwrap_or(path).display().to_string();
        let module_lines = text.lines().count() - sizes.test_lines;
        if !rel.ends_with("tests.rs") {
            if module_lines > largest.1 {
                largest = (rel.clone(), module_lines);
            }
            if module_lines > MAX_MODULE_LINES {
                problems.push(format!("{rel}: {module_lines} lines (at most {MAX_MODULE_LINES} outside tests)"));
            }
        }
        for (name, line, n) in sizes.functions {
            if n > longest.1 {
                longest = (format!("{rel}: fn {name}"), n);
            }
            if n > MAX_FUNCTION_LINES {
                problems.push(format!("{rel}:{line}: fn {name} is {n} lines (at most {MAX_FUNCTION_LINES})"));
            }
        }
    }
    eprintln!(
        "xtask: {} source files; largest module {} ({} lines), longest function {} ({} lines)",
        files.len(),
        largest.0,
        largest.1,
        longest.0,
        longest.1
    );
    if !problems.is_empty() {
        bail!("over the house's size rules:\n  {}", problems.join("\n  "));
    }
    Ok(())
}
