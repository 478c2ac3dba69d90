//! The layering of this crate, checked on its sources at every depth: in every
//! directory (`kernels/`, `kernels/cpu/`, `kernels/cpu/qdot/x86/`, …) the files,
//! the subdirectories and the `mod.rs` import each other without a cycle, and no
//! arrow runs back up into a `mod.rs` that gathers its children. What counts as an
//! import, how an arrow is placed in its layer, and the rule for `mod.rs` (a
//! directory's contract or its gatherer, never both) are
//! `ktune_kernels::testing::layering`'s, the one reader this test and ktune's
//! share.
//!
//! `kernels/mod.rs` is the registry, the gatherer of every family; what every
//! family builds on is `kernels/contract.rs`, below them all. The directories in
//! [`MIXED`] still have a `mod.rs` that is both (a SIMD module's dispatch in
//! `mod.rs` over helpers its `x86.rs` reads back, a format's tables beside its
//! codecs): there `mod.rs` is left out and the rest must still be acyclic; a
//! directory split as `kernels/` was fails the test until it is struck from the
//! list, and no other may join it unnoticed.

use std::path::{Path, PathBuf};

use ktune_kernels::testing::layering::{MOD, Module, assert_layered, crate_sources, faults, layer_graph, read_modules};

/// Directories whose `mod.rs` is still both their children's contract and their
/// gatherer.
const MIXED: &[&str] = &[
    "device/",
    "gpu/",
    "kernels/attention/",
    "kernels/cpu/",
    "kernels/cpu/dot/",
    "kernels/cpu/lanes/",
    "kernels/cpu/qdot/",
    "kernels/cpu/qdot/x86/",
    "kernels/cpu/qgemm/",
    "kernels/cpu/qx8/",
    "kernels/cpu/sgemm/",
    "kernels/quant/",
];

fn sources() -> Vec<(PathBuf, String)> {
    crate_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).expect("readable src/")
}

fn segs(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

/// The sources with `extra` files added (a path relative to `src/` and its text).
fn planted(extra: &[(&str, &str)]) -> Vec<Module> {
    let mut files = sources();
    files.extend(extra.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())));
    read_modules(&files)
}

#[test]
fn every_layer_is_acyclic_and_no_arrow_climbs_into_a_gatherer() {
    let m = read_modules(&sources());
    let kernels = layer_graph(&m, &segs(&["kernels"]));
    // The reader sees the arrows there are: families build on the contract, the
    // registry gathers them, cpu/ reads block formats from quant/.
    assert!(kernels.get("matvec").is_some_and(|t| t.contains("contract") && t.contains("cpu")), "{kernels:#?}");
    assert!(kernels.get(MOD).is_some_and(|t| t.contains("matvec") && t.contains("contract")), "{kernels:#?}");
    assert!(kernels.get("cpu").is_some_and(|t| t.contains("quant")), "{kernels:#?}");
    let qdot = layer_graph(&m, &segs(&["kernels", "cpu", "qdot"]));
    assert!(qdot.get("xq8").is_some_and(|t| t.contains("x86")), "xq8 runs the x86 block quantizers: {qdot:#?}");
    // The list of mixed directories stays true: each still has a fault with its mod.rs.
    assert_layered(&m, MIXED);
}

/// A circle three directories down (the one this crate had: the x86 block
/// quantizers reading the portable quantizer's file, which runs them) fails.
#[test]
fn a_planted_circle_at_depth_three_fails() {
    let m = planted(&[("kernels/cpu/qdot/x86/plant.rs", "use super::super::xq8::block_scale;")]);
    assert_eq!(faults(&m, MIXED), ["kernels/cpu/qdot/: cycle: x86 -> xq8", "kernels/cpu/qdot/: cycle: xq8 -> x86"]);
}

/// A family importing through the registry fails, as an arrow back up and as the
/// cycle it closes; the same item from the contract passes.
#[test]
fn a_planted_arrow_back_up_into_the_registry_fails() {
    let m = planted(&[("kernels/act/plant.rs", "fn f(k: &crate::kernels::KernelDef) {}")]);
    let found = faults(&m, MIXED);
    assert!(found.contains(&"kernels/: cycle: act -> mod.rs".to_string()), "{found:#?}");
    assert!(found.iter().any(|f| f.starts_with("kernels/: back up: act -> mod.rs, which imports act, attention, contract")), "{found:#?}");
    let m = planted(&[("kernels/act/plant.rs", "fn f(k: &crate::kernels::contract::KernelDef) {}")]);
    assert_eq!(faults(&m, MIXED), Vec::<String>::new());
    // A leaf reaching a gatherer that does not gather it is still an arrow back up.
    let m = planted(&[("kernels/memory_plant.rs", "use super::registry;")]);
    assert_eq!(faults(&m, MIXED).len(), 1, "{:#?}", faults(&m, MIXED));
}

#[test]
fn the_reader_resolves_paths_and_skips_comments_strings_and_tests() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let files = [
        file("lib.rs", "pub mod a;"),
        // Declaring children is no arrow; using one is (a bare child path, a re-export).
        file("a/mod.rs", "pub mod b;\npub mod c;\nmod d;\npub use c::Thing;\nfn f() { b::run(); }"),
        // `super::` groups, nested groups, `self`, globs and renames; `crate::` from deeper.
        file("a/b.rs", "use super::{c::{self, X as Y}, d::*};\nuse crate::a::e::deep::Z;"),
        // Comments, strings, char literals, lifetimes, test items and visibilities name nothing.
        file(
            "a/c.rs",
            "// use super::b;\n/* super::d */\nconst S: &str = \"super::b {\";\nfn g<'a>(x: &'a u8) -> char { '{' }\n#[cfg(test)]\nmod tests { use super::super::b; }\npub(in crate::a) fn h() {}",
        ),
        // An inline module, and a macro's, climb one level more.
        file("a/d.rs", "mod inner {\n    use super::super::c::X;\n}\nmacro_rules! m { () => { pub mod $n { use super::super::c::Q; } } }"),
        file("a/e/mod.rs", "pub mod deep;"),
        file("a/e/deep.rs", ""),
    ];
    let m = read_modules(&files);
    let imports = |p: &[&str]| m.iter().find(|x| x.path == segs(p)).expect("read").imports.iter().map(|i| i.join("::")).collect::<Vec<_>>();
    assert_eq!(imports(&["a"]), ["a::b::run", "a::c::Thing"]);
    assert_eq!(imports(&["a", "b"]), ["a::c", "a::c::X", "a::d", "a::e::deep::Z"]);
    assert!(imports(&["a", "c"]).is_empty(), "{:?}", imports(&["a", "c"]));
    assert_eq!(imports(&["a", "d"]), ["a::c::Q", "a::c::X"]);
    let g = layer_graph(&m, &segs(&["a"]));
    let edges = |n: &str| g.get(n).map(|t| t.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(edges(MOD), ["b", "c"]);
    assert_eq!(edges("b"), ["c", "d", "e"]);
    assert_eq!(edges("d"), ["c"]);
    assert!(faults(&m, &[]).is_empty(), "{:?}", faults(&m, &[]));
}
