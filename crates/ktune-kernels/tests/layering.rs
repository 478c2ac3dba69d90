//! The layering inside `src/kernels/`, checked on the sources: its second-level
//! modules (`cpu/`, `quant/`, `matvec/`, `wgsl.rs`, …) import each other without a
//! cycle. An import is a `crate::kernels::<module>` path or a `super::` path that
//! climbs to `kernels/` (from a file's own depth plus any inline `mod … {}` it sits
//! in), outside comments, string literals and `#[cfg(test)]` items (tests may reach
//! anywhere). `kernels/mod.rs` itself (the registry, which gathers every family) is
//! above them all and not part of the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ktune_kernels::testing::{import_cycles as cycles, rust_sources};

/// `text` without comments and without the contents of string and char literals
/// (so that no brace or path inside them counts); lifetimes stay.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |j: usize| c.get(j).copied().unwrap_or('\0');
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
        } else if c[i] == 'r' && (at(i + 1) == '"' || at(i + 1) == '#') && !at(i.wrapping_sub(1)).is_alphanumeric() {
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
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
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

/// The first path segment of each item of the use tree at the start of `rest`:
/// `quant` for `quant::QView`, `cpu` and `quant` for `{cpu, quant::{QK, QView}}`.
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |s: &str| s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let (mut out, mut depth, mut item) = (Vec::new(), 0, String::new());
    for ch in group.chars() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&item));
                item.clear();
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            item.push(ch);
        }
    }
    out.push(ident(&item));
    out
}

/// Whether `code[i..]` starts with the keyword or path segment `word` (not inside
/// a longer identifier).
fn word_at(code: &str, i: usize, word: &str) -> bool {
    code[i..].starts_with(word) && !code[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The root-level names (items of `kernels/`) that the code of the module at
/// `path` (its segments below `kernels/`, `["cpu", "qdot"]` for `cpu/qdot.rs`)
/// refers to, outside `#[cfg(test)]` items.
fn root_names(path: &[String], text: &str) -> BTreeSet<String> {
    let code = strip(text);
    let mut out = BTreeSet::new();
    // Inline modules open at a brace depth: (name, depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        if let Some(body) = rest.strip_prefix("#[cfg(test)]") {
            // Skip the item: up to its `;`, or through its braced body.
            let end = match body.find([';', '{']) {
                Some(j) if body.as_bytes()[j] == b';' => j + 1,
                Some(j) => {
                    let mut d = 0;
                    let mut k = j;
                    for (off, ch) in body[j..].char_indices() {
                        match ch {
                            '{' => d += 1,
                            '}' => d -= 1,
                            _ => {}
                        }
                        if d == 0 {
                            k = j + off + 1;
                            break;
                        }
                    }
                    k
                }
                None => body.len(),
            };
            i += "#[cfg(test)]".len() + end;
            continue;
        }
        if word_at(&code, i, "mod ") {
            let after = &rest[4..];
            let name: String = after.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let tail = after.trim_start()[name.len()..].trim_start();
            if tail.starts_with('{') {
                inline.push((name, depth + 1));
            }
        }
        if word_at(&code, i, "crate::kernels::") {
            out.extend(first_segments(&rest["crate::kernels::".len()..]));
        } else if word_at(&code, i, "super::") {
            let mut n = 0;
            let mut j = i;
            while code[j..].starts_with("super::") {
                n += 1;
                j += "super::".len();
            }
            let here = path.len() + inline.len();
            if n == here {
                out.extend(first_segments(&code[j..]));
            }
            i = j;
            continue;
        }
        let ch = rest.chars().next().expect("in range");
        match ch {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|&(_, d)| d > depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        i += ch.len_utf8();
    }
    out
}

/// The module path below `kernels/` of a file (`["cpu", "qdot"]` for
/// `cpu/qdot.rs`, `["cpu"]` for `cpu/mod.rs`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
    let file = segs.pop().expect("a file name");
    if file != "mod.rs" {
        segs.push(file.trim_end_matches(".rs").to_string());
    }
    segs
}

/// The import graph between the second-level modules of the sources `files`
/// (each a path relative to `kernels/` and its text).
fn graph_of(files: &[(PathBuf, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = files.iter().map(|(rel, _)| module_path(rel)).filter_map(|p| p.first().cloned()).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        let path = module_path(rel);
        let Some(from) = path.first() else { continue };
        for to in root_names(&path, text) {
            if &to != from && modules.contains(&to) {
                g.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    g
}

/// The graph of `src/kernels/`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
    let files: Vec<(PathBuf, String)> = rust_sources(&dir)
        .expect("readable src/kernels")
        .into_iter()
        .map(|f| (f.strip_prefix(&dir).expect("under kernels").to_path_buf(), std::fs::read_to_string(&f).expect("readable source")))
        .collect();
    graph_of(&files)
}

#[test]
fn kernels_modules_import_each_other_without_a_cycle() {
    let g = graph();
    assert!(g.len() > 8, "the import graph was not read: {g:?}");
    assert!(g.get("cpu").is_some_and(|t| t.contains("quant")), "cpu/ reads block formats from quant/: {g:#?}");
    let found = cycles(&g);
    assert!(found.is_empty(), "import cycles between kernels/ modules (each edge closes one): {found:?}\ngraph: {g:#?}");
}

#[test]
fn the_reader_resolves_paths_and_skips_comments_strings_and_tests() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let files = [
        // A second-level file reaching the root by `super::` (a group) and by `crate::kernels::`.
        file("cpu/mod.rs", "use super::{quant::QView, DType};\nfn f() { crate::kernels::memory::huge_pages(&[0u8]); }"),
        // A third-level file: `super::quant` is its sibling, `super::super::wgsl` the root's.
        file(
            "matvec/qkv.rs",
            "use super::quant::x;\nuse super::super::wgsl::y;\n// use crate::kernels::norm;\nconst S: &str = \"crate::kernels::rope {\";",
        ),
        file("matvec/quant.rs", ""),
        // An inline module climbs one level more; a test module is skipped.
        file(
            "act/mod.rs",
            "mod x86 {\n    use super::super::cpu::Lanes;\n}\nuse super::act_helper;\n#[cfg(test)]\nmod tests {\n    use crate::kernels::vision;\n}",
        ),
        file(
            "quant/mod.rs",
            "#[cfg(test)]\nuse crate::kernels::cpu::testdata;\nfn g() -> char { '{' }\nfn h<'a>(x: &'a u8) -> &'a u8 { crate::kernels::memory::id(x) }",
        ),
        file("memory.rs", ""),
        file("wgsl.rs", ""),
        file("norm/mod.rs", ""),
        file("rope/mod.rs", ""),
        file("vision/mod.rs", ""),
    ];
    let g = graph_of(&files);
    let edges = |m: &str| g.get(m).cloned().unwrap_or_default().into_iter().collect::<Vec<_>>();
    assert_eq!(edges("cpu"), ["memory", "quant"]);
    assert_eq!(edges("matvec"), ["wgsl"]);
    assert_eq!(edges("act"), ["cpu"]);
    assert_eq!(edges("quant"), ["memory"]);
    assert!(cycles(&g).is_empty());
    // A cycle is found: quant importing cpu back closes cpu -> quant.
    let mut with_cycle = files.to_vec();
    with_cycle.push(file("quant/encode.rs", "use crate::kernels::cpu::Isa;"));
    assert_eq!(cycles(&graph_of(&with_cycle)), ["cpu -> quant", "quant -> cpu"]);
}
