//! The module layering ARCHITECTURE.md describes, checked on the sources: the
//! top-level modules of `src/` import each other without a cycle, `output/` imports
//! no command module, and `commands/` imports neither `output/` nor `app`, nor one
//! command another. Imports are the `crate::<module>` paths outside `//` comments
//! and outside `#[cfg(test)]` modules (tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ktune::testing::{import_cycles, rust_sources};

/// The code of a file without its test module and its `//` comments.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// `crate::<name>` paths in `code` (the first segment after `crate::`, also inside
/// `use crate::{a, b}` groups).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.insert(name);
            }
        } else {
            out.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

/// Top-level module of a file under `src/` (`kernels` for `src/kernels/cpu/dot.rs`).
fn top(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// The import graph between top-level modules (`crate::Result` / `crate::Error`
/// count as `error`, their home).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_sources(&src).expect("readable src dir");
    let modules: BTreeSet<String> = files.iter().map(|f| top(&src, f)).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = top(&src, f);
        let text = std::fs::read_to_string(f).expect("readable source");
        for name in crate_paths(&code(&text)) {
            let to = match name.as_str() {
                "Result" | "Error" => "error".to_string(),
                n => n.to_string(),
            };
            if to != from && modules.contains(&to) {
                g.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    g
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let g = graph();
    assert!(g.len() > 10, "the import graph was not read: {g:?}");
    let cycles = import_cycles(&g);
    assert!(cycles.is_empty(), "import cycles between modules (each edge closes one): {cycles:?}\ngraph: {g:#?}");
}

#[test]
fn output_and_commands_keep_their_sides() {
    let g = graph();
    let out = g.get("output").cloned().unwrap_or_default();
    assert!(!out.contains("commands") && !out.contains("app"), "output/ imports {out:?}");
    let cmd = g.get("commands").cloned().unwrap_or_default();
    assert!(!cmd.contains("output") && !cmd.contains("app"), "commands/ imports {cmd:?}");
    // No command module imports another (they share session.rs instead).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/commands");
    for f in rust_sources(&dir).expect("readable src/commands") {
        let text = code(&std::fs::read_to_string(&f).expect("readable"));
        for other in rust_sources(&dir).expect("readable src/commands") {
            let stem = other.file_stem().expect("stem").to_string_lossy().to_string();
            if other == f || stem == "mod" {
                continue;
            }
            for pat in [format!("commands::{stem}"), format!("super::{stem}")] {
                assert!(!text.contains(&pat), "{} imports the command module `{stem}`", f.display());
            }
        }
    }
}

#[test]
fn the_reader_finds_imports_and_skips_comments_and_tests() {
    let text = "use crate::{device::Device, kernels};\n// use crate::output;\nfn f() { crate::plan::x(); }\n#[cfg(test)]\nmod tests { use crate::tuner; }";
    let found = crate_paths(&code(text));
    assert_eq!(found, ["device", "kernels", "plan"].map(String::from).into_iter().collect());
}
