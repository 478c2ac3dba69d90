//! The module layering ARCHITECTURE.md describes, checked on the sources with the
//! kernels crate's reader (`ktune::testing::layering`: what an import is, the
//! layers, the faults). At every depth of `src/` the files, subdirectories and
//! `mod.rs` import each other without a cycle and no arrow runs back up into a
//! `mod.rs` that gathers its children, except that in the directories of
//! [`MIXED`] (a `mod.rs` still both its files' contract and their gatherer)
//! `mod.rs` is left out. At the top, `crate::Result` and `crate::Error` count as
//! `error` (their home, which `lib.rs` re-exports) and the kernels crate's
//! modules (`crate::kernels`, `crate::gpu`, …) as another crate. Then: the lower
//! floors (the model, plan, runtime, profile, tuner, eval, session and the plain
//! modules beneath them) reach none of `error`, `commands`, `app`, `cli` (each
//! has its own error type, which the command layer converts); `output/` imports
//! no command module, and `commands/` neither `output/` nor `app`, nor one
//! command another; `profile/` imports nothing from `tuner/` (the tuner hands it
//! plain data), `session.rs` and `output/` no type from `cli.rs` (the settings
//! types live outside the parser); in `tuner/` the measurement (`measure.rs`)
//! does not reach the `bench-kernels` driver (`kbench.rs`).

use std::path::Path;

use ktune::testing::layering::{Graph, MOD, Module, assert_layered, crate_sources, faults, layer_graph, read_modules};
use ktune::testing::reaches;

/// Directories whose `mod.rs` is still both their files' contract (what they
/// import from it) and their gatherer (it uses them): there the test leaves
/// `mod.rs` out. A directory split fails the test until it is struck from here.
const MIXED: &[&str] = &["commands/serve/", "eval/", "model/", "output/", "plan/", "profile/", "runtime/", "tuner/"];

/// The floors below the command layer: none of them may reach [`COMMAND_LAYER`].
const LOWER_FLOORS: &[&str] =
    &["atomic", "eval", "input", "model", "plan", "profile", "progress", "report", "runtime", "session", "stats", "text", "tuner"];

/// What gathers every module's errors and drives the commands.
const COMMAND_LAYER: &[&str] = &["error", "commands", "app", "cli"];

/// The modules of `src/` with the files `extra` added (a path relative to `src/`
/// and its text), `crate::Result`/`crate::Error`/`crate::ExitCode` read as
/// `error`'s and the kernels crate's re-exported modules dropped.
fn modules_with(extra: &[(&str, &str)]) -> Vec<Module> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = crate_sources(&src).expect("readable src/");
    files.extend(extra.iter().map(|(p, t)| (p.into(), t.to_string())));
    let mut m = read_modules(&files);
    let other_crate = ["device", "gpu", "hash", "kernels", "testing"];
    for module in &mut m {
        module.imports = std::mem::take(&mut module.imports)
            .into_iter()
            .filter(|p| !p.first().is_some_and(|s| other_crate.contains(&s.as_str())))
            .map(|p| match p.first().map(String::as_str) {
                Some("Result" | "Error" | "ExitCode") => ["error".to_string()].into_iter().chain(p).collect(),
                _ => p,
            })
            .collect();
    }
    m
}

fn modules() -> Vec<Module> {
    modules_with(&[])
}

/// The import graph between the top-level modules.
fn graph() -> Graph {
    layer_graph(&modules(), &[])
}

fn dir_graph(dir: &str) -> Graph {
    layer_graph(&modules(), &[dir.to_string()])
}

#[test]
fn every_layer_is_acyclic_and_no_arrow_climbs_into_a_gatherer() {
    let m = modules();
    let g = layer_graph(&m, &[]);
    assert!(g.len() > 10, "the import graph was not read: {g:?}");
    // The reader sees the sibling imports there are (race.rs runs measure.rs's races).
    let tuner = layer_graph(&m, &["tuner".to_string()]);
    assert!(tuner.get("race").is_some_and(|s| s.contains("measure")), "{tuner:#?}");
    // The list of mixed directories stays true: each still has a fault with its mod.rs.
    assert_layered(&m, MIXED);
}

#[test]
fn the_lower_floors_reach_no_command_layer() {
    let g = graph();
    for floor in LOWER_FLOORS {
        assert!(g.contains_key(*floor) || g.values().any(|t| t.contains(*floor)), "`{floor}` is not in the graph: {g:#?}");
        for top in COMMAND_LAYER {
            assert!(!reaches(&g, floor, top), "{floor} reaches {top}: {:?}", g.get(*floor));
        }
    }
    // The test fails on a floor that reaches one: the command layer does.
    assert!(reaches(&g, "commands", "error"));
}

/// A lower floor planted with `crate::Result`, or a circle planted three
/// directories down, fails.
#[test]
fn planted_faults_fail() {
    let m = modules_with(&[("plan/plant.rs", "fn f() -> crate::Result<()> { Ok(()) }")]);
    assert!(reaches(&layer_graph(&m, &[]), "plan", "error"));
    let m = modules_with(&[
        ("commands/serve/deep/mod.rs", "pub mod a;\npub mod b;"),
        ("commands/serve/deep/a.rs", "use super::b::X;"),
        ("commands/serve/deep/b.rs", "use crate::commands::serve::deep::a::Y;"),
    ]);
    assert_eq!(faults(&m, MIXED), ["commands/serve/deep/: cycle: a -> b", "commands/serve/deep/: cycle: b -> a"]);
}

#[test]
fn profile_session_and_output_stay_below_the_tuner_and_the_parser() {
    let g = graph();
    // The profile records what the tuner found from plain data; the tuner sits above it.
    assert!(!reaches(&g, "profile", "tuner"), "profile/ reaches tuner/: {:?}", g.get("profile"));
    // The profile format holds the limits it checks (the decode chain's among them).
    assert!(!reaches(&g, "profile", "runtime"), "profile/ reaches runtime/: {:?}", g.get("profile"));
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
    // No command module imports another (they share session.rs and commands/mod.rs instead).
    let m = modules();
    let read = m.iter().filter(|x| x.path.first().is_some_and(|s| s == "commands")).count();
    assert!(read > 10, "the commands were not read ({read} modules)");
    let c = layer_graph(&m, &["commands".to_string()]);
    for (from, to) in &c {
        let others: Vec<_> = to.iter().filter(|t| *t != MOD).collect();
        assert!(from == MOD || others.is_empty(), "the command module `{from}` imports {others:?}");
    }
}
