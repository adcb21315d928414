//! The direction data flows in, checked by `cargo xtask lint`: no import
//! cycle between the top-level modules of any crate (a module that uses
//! `crate::b` depends on `b`; `super::…` paths are resolved from the file's
//! own module), and the engine depends on neither aya nor tokio (its
//! `cargo tree`). What fails names the cycle and one import of each edge.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use syn::visit::Visit;

/// Each crate's source folder (its top-level modules are its entries).
const CRATES: [&str; 6] = ["gpumem-common/src", "gpumem-engine/src", "gpumem-ebpf/src", "gpumem-agent/src", "xtask/src", "tests/src"];

/// What the engine must never depend on (it would let it reach the kernel
/// or an async runtime, and data flow backwards).
const ENGINE_FORBIDDEN: [&str; 3] = ["aya", "aya-obj", "tokio"];

/// One import between top-level modules: where it is.
type Edges = BTreeMap<(String, String), String>;

/// The module path of a file under a crate's `src` (`a/b.rs` and
/// `a/b/mod.rs` are `[a, b]`; `lib.rs` and `main.rs` the root, `[]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let Some(last) = parts.pop() else { return parts };
    let stem = last.trim_end_matches(".rs");
    let names_its_folder = stem == "mod" || (parts.is_empty() && matches!(stem, "lib" | "main"));
    if !names_its_folder {
        parts.push(stem.to_string());
    }
    parts
}

/// The top-level module a path names from module `at`, if it leaves it
/// (`crate::x::…`, `super::…` climbing out, `self::…` staying).
fn target(at: &[String], segments: &[String]) -> Option<String> {
    match segments.first().map(String::as_str)? {
        "crate" => segments.get(1).cloned(),
        "super" => {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            match at[..at.len().saturating_sub(ups)].first() {
                Some(own) => Some(own.clone()),
                None => segments.get(ups).cloned(),
            }
        }
        _ => None,
    }
}

/// Collects the top-level modules a file's paths name.
struct Imports<'a> {
    /// The module the code being visited is in (inline modules included).
    at: Vec<String>,
    file: &'a str,
    found: Vec<(String, usize)>,
}

impl Imports<'_> {
    fn note(&mut self, segments: &[String], line: usize) {
        if let Some(t) = target(&self.at, segments) {
            self.found.push((t, line));
        }
    }

    /// Every path a `use` tree names, noted at its leaves.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
            syn::UseTree::Name(syn::UseName { ident }) | syn::UseTree::Rename(syn::UseRename { ident, .. }) => {
                prefix.push(ident.to_string());
                self.note(prefix, ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Glob(g) => self.note(prefix, g.star_token.span.start().line),
        }
    }
}

impl<'ast> Visit<'ast> for Imports<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = p.segments.first() {
            self.note(&segments, first.ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.at.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.at.pop();
        }
    }
}

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

/// The imports between one crate's top-level modules.
fn edges(root: &Path, src: &str) -> Result<Edges> {
    let dir = root.join(src);
    let mut files = Vec::new();
    rust_files(&dir, &mut files)?;
    let mut edges = Edges::new();
    for path in files {
        let rel = path.strip_prefix(&dir).unwrap_or(&path);
        let at = module_path(rel);
        // A binary's own files (src/bin/*) are crates of their own.
        let Some(from) = at.first().filter(|m| *m != "bin").cloned() else { continue };
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
        let shown = format!("{src}/{}", rel.display());
        let mut imports = Imports { at, file: &shown, found: Vec::new() };
        imports.visit_file(&file);
        for (to, line) in imports.found {
            if to != from {
                edges.entry((from.clone(), to)).or_insert_with(|| format!("{}:{line}", imports.file));
            }
        }
    }
    Ok(edges)
}

/// The cycles among `edges` (strongly connected components of more than one module).
fn cycles(edges: &Edges) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for (_, to) in edges.keys().filter(|(a, _)| *a == n) {
                if seen.insert(to.clone()) {
                    todo.push(to.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for n in &nodes {
        let mut comp: Vec<String> =
            nodes.iter().filter(|m| reachable[*n].contains(**m) && reachable[**m].contains(*n)).map(|m| (*m).clone()).collect();
        comp.sort();
        if comp.len() > 1 && !out.contains(&comp) {
            out.push(comp);
        }
    }
    out
}

/// Fails naming every import cycle between top-level modules, with where
/// each of its imports is.
pub fn check_cycles(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    let mut modules = 0;
    for src in CRATES {
        let edges = edges(root, src)?;
        modules += edges.keys().flat_map(|(a, b)| [a, b]).collect::<BTreeSet<_>>().len();
        for cycle in cycles(&edges) {
            let inside: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| cycle.contains(a) && cycle.contains(b))
                .map(|((a, b), at)| format!("{a} -> {b} ({at})"))
                .collect();
            problems.push(format!("{src}: {{{}}} import each other: {}", cycle.join(", "), inside.join("; ")));
        }
    }
    if !problems.is_empty() {
        bail!("data must flow one way, and these modules form import cycles:\n  {}", problems.join("\n  "));
    }
    eprintln!("xtask: no import cycle between the top-level modules of {} crates ({modules} modules)", CRATES.len());
    Ok(())
}

/// Fails if the engine's dependency tree holds aya or tokio.
pub fn check_engine_deps(root: &Path) -> Result<()> {
    let out = crate::cargo()
        .args(["tree", "-p", "gpumem-engine", "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(root)
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree -p gpumem-engine failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    let found: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| ENGINE_FORBIDDEN.contains(n)).collect();
    if !found.is_empty() {
        bail!("gpumem-engine depends on {found:?}: it must reach neither the kernel nor an async runtime (move that code to gpumem-agent)");
    }
    eprintln!("xtask: gpumem-engine's dependency tree has none of {ENGINE_FORBIDDEN:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges_of(pairs: &[(&str, &str)]) -> Edges {
        pairs.iter().map(|(a, b)| ((a.to_string(), b.to_string()), String::new())).collect()
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        assert!(cycles(&edges_of(&[("a", "b"), ("b", "c")])).is_empty());
        assert_eq!(cycles(&edges_of(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])), vec![vec!["a", "b", "c"]]);
    }

    #[test]
    fn paths_are_resolved_from_the_files_module() {
        let at = module_path(Path::new("pipeline/host.rs"));
        assert_eq!(at, ["pipeline", "host"]);
        assert_eq!(module_path(Path::new("pipeline/mod.rs")), ["pipeline"]);
        assert_eq!(module_path(Path::new("lib.rs")), Vec::<String>::new());
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(target(&at, &s(&["crate", "state", "State"])), Some("state".into()));
        assert_eq!(target(&at, &s(&["super", "lookups"])), Some("pipeline".into()), "inside its own module");
        assert_eq!(target(&at, &s(&["super", "super", "state"])), Some("state".into()));
        assert_eq!(target(&at, &s(&["std", "fmt"])), None);
    }

    /// The check itself, on a crate that has a cycle.
    #[test]
    fn a_crate_with_a_cycle_fails_naming_it() {
        let dir = std::env::temp_dir().join(format!("xtask-layers-{}", std::process::id()));
        let src = dir.join("gpumem-engine/src");
        std::fs::create_dir_all(src.join("a")).unwrap();
        std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
        std::fs::write(src.join("a/mod.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
        std::fs::write(src.join("b.rs"), "pub struct B(super::a::A);\n").unwrap();
        let e = edges(&dir, "gpumem-engine/src").unwrap();
        assert_eq!(cycles(&e), vec![vec!["a".to_string(), "b".to_string()]]);
        assert_eq!(e[&("a".into(), "b".into())], "gpumem-engine/src/a/mod.rs:1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
