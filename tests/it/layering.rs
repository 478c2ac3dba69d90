//! The module layering ARCHITECTURE.md describes, checked on the sources: the
//! top-level modules of `src/` import each other without a cycle, `output/` imports
//! no command module, and `commands/` imports neither `output/` nor `app`, nor one
//! command another; `profile/` imports nothing from `tuner/` (the tuner hands it
//! plain data), `session.rs` and `output/` no type from `cli.rs` (the settings
//! types live outside the parser); inside each top-level directory the files
//! import each other without a cycle, and in `tuner/` the measurement
//! (`measure.rs`) does not reach the `bench-kernels` driver (`kbench.rs`). Imports
//! are the `crate::<module>` (and, between the files of a directory, `super::<file>`
//! and `crate::<dir>::<file>`) paths outside `//` comments and outside
//! `#[cfg(test)]` modules (tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ktune::testing::{import_cycles as cycles, reaches, rust_sources};

/// The code of a file without its test module and its `//` comments.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The first segment of every path in `code` that starts with `prefix` (`crate::`,
/// `super::`), also inside `use prefix{a, b::c, d::{e, f}}` groups (their top
/// level only).
fn paths_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices(prefix) {
        // `crate::` inside `$crate::` or a longer path (`foo::super::`) is not one.
        if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.insert(ident(rest));
            continue;
        };
        // The group up to its matching brace, split at its top-level commas.
        let (mut depth, mut start) = (0usize, 0usize);
        for (j, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.insert(ident(&group[start..j]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.insert(ident(&group[start..j]));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    out.remove("");
    out
}

/// `crate::<name>` paths in `code` (the first segment after `crate::`).
fn crate_paths(code: &str) -> BTreeSet<String> {
    paths_after(code, "crate::")
}

/// Top-level module of a file under `src/` (`kernels` for `src/kernels/cpu/dot.rs`).
fn top(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The import graph between top-level modules (`crate::Result` / `crate::Error`
/// count as `error`, their home).
fn graph() -> Graph {
    let src = src();
    let files = rust_sources(&src).expect("readable src dir");
    let modules: BTreeSet<String> = files.iter().map(|f| top(&src, f)).collect();
    let mut g = Graph::new();
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

/// The import graph between the files of the directory `src/<dir>/` (its `mod.rs`
/// left out: every file is its child, and may use what it declares): a file
/// imports a sibling through `super::<sibling>` or `crate::<dir>::<sibling>`.
fn dir_graph(dir: &str) -> Graph {
    let root = src().join(dir);
    let files: Vec<PathBuf> =
        rust_sources(&root).expect("readable src dir").into_iter().filter(|f| f.file_stem().is_some_and(|s| s != "mod")).collect();
    let name = |f: &Path| top(&root, f);
    let siblings: BTreeSet<String> = files.iter().map(|f| name(f)).collect();
    let mut g = Graph::new();
    for f in &files {
        let from = name(f);
        let code = code(&std::fs::read_to_string(f).expect("readable source"));
        let mut found = paths_after(&code, "super::");
        found.extend(paths_after(&code, &format!("crate::{dir}::")));
        for to in found.into_iter().filter(|n| *n != from && siblings.contains(n)) {
            g.entry(from.clone()).or_default().insert(to);
        }
    }
    g
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let g = graph();
    assert!(g.len() > 10, "the import graph was not read: {g:?}");
    let c = cycles(&g);
    assert!(c.is_empty(), "import cycles between modules (each edge closes one): {c:?}\ngraph: {g:#?}");
}

#[test]
fn the_files_of_each_directory_import_each_other_without_a_cycle() {
    let src = src();
    let mut dirs: Vec<String> = std::fs::read_dir(&src)
        .expect("readable src dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .map(|p| top(&src, &p))
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5 && dirs.contains(&"tuner".to_string()), "the directories were not read: {dirs:?}");
    // The reader sees the sibling imports there are (race.rs runs measure.rs's races).
    assert!(dir_graph("tuner").get("race").is_some_and(|s| s.contains("measure")), "{:#?}", dir_graph("tuner"));
    for dir in dirs {
        let g = dir_graph(&dir);
        let c = cycles(&g);
        assert!(c.is_empty(), "import cycles between the files of src/{dir}/ (each edge closes one): {c:?}\ngraph: {g:#?}");
    }
}

#[test]
fn profile_session_and_output_stay_below_the_tuner_and_the_parser() {
    let g = graph();
    // The profile records what the tuner found from plain data; the tuner sits above it.
    assert!(!reaches(&g, "profile", "tuner"), "profile/ reaches tuner/: {:?}", g.get("profile"));
    // The settings types live outside the parser: cli.rs converts into them.
    for m in ["session", "output"] {
        assert!(!reaches(&g, m, "cli"), "{m} reaches cli.rs: {:?}", g.get(m));
    }
    // `bench-kernels` (kbench.rs) drives the tuner's measurement, never the other way round.
    let t = dir_graph("tuner");
    assert!(!reaches(&t, "measure", "kbench"), "tuner/measure.rs reaches kbench.rs: {:?}", t.get("measure"));
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
    for f in rust_sources(&dir).expect("readable src dir") {
        let text = code(&std::fs::read_to_string(&f).expect("readable"));
        for other in rust_sources(&dir).expect("readable src dir") {
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
    // Nested groups name their top level only; `$crate::` is a macro's, not an import.
    let text = "use super::{doc::{self as pd, Cand}, measure, x::{a, b}};\nfn g() { super::race::run(); $crate::stats::x(); }";
    let found = paths_after(&code(text), "super::");
    assert_eq!(found, ["doc", "measure", "race", "x"].map(String::from).into_iter().collect());
    assert!(crate_paths(text).is_empty());
}
