//! The layering tests' one reader of Rust sources (this crate's and ktune's):
//! which modules each file's code names, and the import graph of every directory
//! of a crate built from it, with the faults the tests refuse.
//!
//! **Imports.** A file's imports are the paths in its code, outside comments,
//! string and char literals and `#[cfg(test)]` items (tests may reach anywhere):
//! `crate::…`, `super::…` (from the file's module, plus any inline `mod … {}` it
//! sits in), `self::…`, and a path whose first segment is a child module of the
//! module it is in (`matvec::variants()` in `kernels/mod.rs`). Each is resolved to
//! its segments from the crate root; `use` groups are expanded (`a::{b, c::{d}}`
//! is `a::b` and `a::c::d`, `self` in a group is the group's prefix, a glob its
//! module).
//!
//! **Layers.** Every directory is a layer: its nodes are its files, its
//! subdirectories (everything below one counts as that node) and its `mod.rs`
//! (node [`MOD`]). A file's import is an arrow of the deepest layer holding both
//! the file and what the path names: to the node the path enters (a child module
//! of the layer), or to [`MOD`] when it names an item of the layer's module
//! itself (what `mod.rs` defines or re-exports). `mod.rs` declaring its children
//! (`mod x;`) is no arrow; `mod.rs` using one (`x::f()`, `pub use x::Y`) is.
//!
//! **Faults** ([`faults`]): a cycle in any layer; and an arrow back up, from a
//! node to the layer's [`MOD`] while that `mod.rs` itself imports from one of
//! its children. A `mod.rs` is either the contract its children build on (they
//! import it; it imports none of them) or the gatherer of its children (a
//! registry, a façade re-exporting their items for the users above; none of them
//! imports it), never both: what every child needs lives in a contract file
//! beside them (`kernels/contract.rs`), which the gatherer may re-export.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An import graph: node -> the nodes it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The node of a layer that stands for its `mod.rs` (no file or directory is
/// named so).
pub const MOD: &str = "mod.rs";

/// One source file of a crate: its module path from the crate root (`["kernels",
/// "cpu"]` for `kernels/cpu/mod.rs`, `[]` for `lib.rs`) and the paths its code
/// names, resolved from the crate root.
#[derive(Clone, Debug)]
pub struct Module {
    pub path: Vec<String>,
    pub imports: BTreeSet<Vec<String>>,
}

/// The module path of a file from its path relative to the crate's `src/`.
pub fn module_path(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
    let file = segs.pop().unwrap_or_default();
    if !(file == "mod.rs" || (segs.is_empty() && (file == "lib.rs" || file == "main.rs"))) {
        segs.push(file.trim_end_matches(".rs").to_string());
    }
    segs
}

/// Reads every module of the sources `files` (each a path relative to the
/// crate's `src/` and its text).
pub fn read_modules(files: &[(PathBuf, String)]) -> Vec<Module> {
    let paths: BTreeSet<Vec<String>> = files.iter().map(|(rel, _)| module_path(rel)).collect();
    files
        .iter()
        .map(|(rel, text)| {
            let path = module_path(rel);
            let imports = imports(&path, text, &paths);
            Module { path, imports }
        })
        .collect()
}

/// Every `.rs` file under `src` (a crate's source directory) but `main.rs` (a
/// binary's root, another crate): its path relative to `src` and its text, for
/// [`read_modules`].
pub fn crate_sources(src: &Path) -> std::io::Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    for f in super::rust_sources(src)? {
        let rel = f.strip_prefix(src).unwrap_or(&f).to_path_buf();
        if rel != Path::new("main.rs") {
            files.push((rel, std::fs::read_to_string(&f)?));
        }
    }
    Ok(files)
}

/// Every layer of the modules: the module path of each directory (the crate
/// root `[]` included), shallowest first.
pub fn layers(modules: &[Module]) -> Vec<Vec<String>> {
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for m in modules {
        for n in 0..m.path.len() {
            out.insert(m.path[..n].to_vec());
        }
    }
    let mut out: Vec<_> = out.into_iter().collect();
    out.sort_by_key(|p| (p.len(), p.clone()));
    out
}

/// The import graph of the layer `dir` (see the module doc).
pub fn layer_graph(modules: &[Module], dir: &[String]) -> Graph {
    let known: BTreeSet<&[String]> = modules.iter().map(|m| m.path.as_slice()).collect();
    let node = |path: &[String]| -> Option<String> {
        let rest = path.strip_prefix(dir)?;
        Some(match rest.first() {
            Some(first) if known.iter().any(|k| k.len() > dir.len() && k[..=dir.len()] == path[..=dir.len()]) => first.clone(),
            _ => MOD.to_string(),
        })
    };
    let mut g = Graph::new();
    for m in modules {
        let Some(from) = node(&m.path) else { continue };
        for to in m.imports.iter().filter_map(|p| node(p)) {
            if to != from {
                g.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    g
}

/// The name of a layer in faults: `kernels/cpu/`, `/` for the crate root.
pub fn layer_name(dir: &[String]) -> String {
    format!("{}/", dir.join("/"))
}

/// Every layering fault of the modules, one line each naming the layer
/// ([`layer_name`]): a cycle (`cycle: a -> b`, each edge closing one) and an
/// arrow back up into a gathering `mod.rs` (`back up: a -> mod.rs, which imports
/// b, c`). In the layers named in `mixed` (whose `mod.rs` is known to be both
/// its children's contract and their gatherer) `mod.rs` is left out: their files
/// and subdirectories must still import each other without a cycle.
pub fn faults(modules: &[Module], mixed: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for dir in layers(modules) {
        let name = layer_name(&dir);
        let mut g = layer_graph(modules, &dir);
        if mixed.contains(&name.as_str()) {
            g.remove(MOD);
            g.values_mut().for_each(|to| {
                to.remove(MOD);
            });
        }
        out.extend(super::import_cycles(&g).into_iter().map(|c| format!("{name}: cycle: {c}")));
        let Some(gathered) = g.get(MOD) else { continue };
        let gathered: Vec<&str> = gathered.iter().map(String::as_str).collect();
        for (from, tos) in &g {
            if from != MOD && tos.contains(MOD) {
                out.push(format!("{name}: back up: {from} -> {MOD}, which imports {}", gathered.join(", ")));
            }
        }
    }
    out
}

/// Panics with every fault of the modules outside the `mixed` layers, and with
/// every `mixed` layer that no longer needs its exception (so the list of mixed
/// directories only shrinks): what both crates' layering tests assert.
pub fn assert_layered(modules: &[Module], mixed: &[&str]) {
    let found = faults(modules, mixed);
    assert!(found.is_empty(), "layering faults:\n{}", found.join("\n"));
    let all = faults(modules, &[]);
    let stale: Vec<_> = mixed.iter().filter(|d| !all.iter().any(|f| f.starts_with(&format!("{d}:")))).collect();
    assert!(stale.is_empty(), "these directories no longer mix contract and gatherer; strike them from MIXED: {stale:?}");
}

/// The paths the code of the module `module` names (see the module doc), given
/// every module path of its crate (`modules`) to tell a child module's path.
pub fn imports(module: &[String], text: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code: Vec<char> = strip(text).chars().collect();
    let mut out = BTreeSet::new();
    // Inline modules open at a brace depth: (name, depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < code.len() {
        if starts(&code, i, "#[cfg(test)]") {
            i = item_end(&code, i + "#[cfg(test)]".len());
            continue;
        }
        let boundary = i == 0 || !(is_ident(code[i - 1]) || matches!(code[i - 1], ':' | '$' | '.' | '\''));
        if boundary && is_ident(code[i]) {
            let word: String = code[i..].iter().take_while(|&&c| is_ident(c)).collect();
            let after = i + word.len();
            if word == "pub" && code.get(skip_space(&code, after)) == Some(&'(') {
                // A visibility (`pub(in crate::a)`) names a module, but imports nothing.
                i = (after..code.len()).find(|&j| code[j] == ')').map_or(code.len(), |j| j + 1);
                continue;
            }
            if word == "mod" {
                let name_at = skip_space(&code, after);
                // A macro's module (`mod $name {`) is one level like any other.
                let name: String = code[name_at..].iter().take_while(|&&c| is_ident(c) || c == '$').collect();
                if code.get(skip_space(&code, name_at + name.len())) == Some(&'{') {
                    inline.push((name, depth + 1));
                }
            } else if starts(&code, after, "::") {
                let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
                let (trees, end) = use_tree(&code, i);
                for t in trees {
                    if let Some(p) = resolve(&here, &t, modules) {
                        out.insert(p);
                    }
                }
                i = end.max(after);
                continue;
            }
            i = after;
            continue;
        }
        match code[i] {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|&(_, d)| d > depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A path (its segments as written) named from the module `here`, from the
/// crate root; None for a path outside the crate (`std::…`, another crate).
fn resolve(here: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let first = path.first()?;
    let (base, rest): (Vec<String>, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => {
            let n = path.iter().take_while(|s| *s == "super").count();
            (here[..here.len().checked_sub(n)?].to_vec(), &path[n..])
        }
        _ => {
            let child: Vec<String> = here.iter().chain([first]).cloned().collect();
            if !modules.contains(&child) {
                return None;
            }
            (here.to_vec(), path)
        }
    };
    Some(base.into_iter().chain(rest.iter().filter(|s| *s != "self").cloned()).collect())
}

/// The paths of the use tree (or expression path) at `code[i..]`, each as its
/// segments, and where it ends: `a::b::{c, d::{e, f as g}, self, *}` is `a::b::c`,
/// `a::b::d::e`, `a::b::d::f`, `a::b::self` and `a::b`.
fn use_tree(code: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        i = skip_space(code, i);
        if code.get(i) == Some(&'{') {
            let mut out = Vec::new();
            i += 1;
            loop {
                i = skip_space(code, i);
                match code.get(i) {
                    None => return (out, i),
                    Some('}') => return (out, i + 1),
                    Some(',') => i += 1,
                    Some(_) => {
                        let (trees, end) = use_tree(code, i);
                        out.extend(trees.into_iter().map(|t| prefix.iter().cloned().chain(t).collect()));
                        // Skip what the item has after its path (`as name`).
                        i = end;
                        while i < code.len() && !matches!(code[i], ',' | '}') {
                            i += 1;
                        }
                    }
                }
            }
        }
        if code.get(i) == Some(&'*') {
            return (vec![prefix], i + 1);
        }
        let word: String = code[i.min(code.len())..].iter().take_while(|&&c| is_ident(c)).collect();
        if word.is_empty() {
            return (vec![prefix], i);
        }
        prefix.push(word.clone());
        i += word.len();
        if !starts(code, i, "::") {
            return (vec![prefix], i);
        }
        i += 2;
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn starts(code: &[char], i: usize, s: &str) -> bool {
    s.chars().enumerate().all(|(k, c)| code.get(i + k) == Some(&c))
}

fn skip_space(code: &[char], mut i: usize) -> usize {
    while code.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// The end of the item starting at `code[i..]`: past its `;`, or past its braced
/// body, whichever comes first.
fn item_end(code: &[char], i: usize) -> usize {
    let Some(j) = (i..code.len()).find(|&j| matches!(code[j], ';' | '{')) else { return code.len() };
    if code[j] == ';' {
        return j + 1;
    }
    let mut d = 0usize;
    for (k, &c) in code.iter().enumerate().skip(j) {
        match c {
            '{' => d += 1,
            '}' => {
                d -= 1;
                if d == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// `text` without comments and without the contents of string and char literals
/// (so that no brace or path inside them counts); lifetimes stay.
pub fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let at = |j: usize| c.get(j).copied().unwrap_or('\0');
    while i < c.len() {
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (at(i + 1) == '"' || at(i + 1) == '#') && !is_ident(at(i.wrapping_sub(1))) {
            // A raw string: r"…" or r#"…"#.
            let mut hashes = 0;
            let mut j = i + 1;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#')) {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + 1 + hashes;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (at(i + 2) == '\'' || at(i + 1) == '\\') {
            // A char literal ('{', '\n', '\u{7f}'); a lifetime has no closing quote.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}
