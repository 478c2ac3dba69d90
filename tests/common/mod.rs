//! Helpers shared by the integration tests (`mod common;` in each test file; each
//! test binary uses a subset, hence the `dead_code` allowances): fixture paths and
//! lists, the `ktune` binary with an isolated cache, JSON fixture reading, and the
//! logits tolerance comparison.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use assert_cmd::Command;

pub mod vision;

/// `tests/fixtures/`.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A file or directory under `tests/fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    fixtures_dir().join(rel)
}

/// The tiny Hugging Face model fixtures (directories with an `expected.json` made by
/// tools/make_fixtures.py), sorted.
pub fn hf_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("expected.json").exists())
        .collect();
    v.sort();
    assert!(v.len() >= 4, "expected the llama, qwen2, gemma3 and smollm2 fixtures, found {v:?}");
    v
}

/// `tests/fixtures/gguf/`.
pub fn gguf_dir() -> PathBuf {
    fixture("gguf")
}

/// The GGUF fixtures (tools/make_gguf.py), sorted.
pub fn gguf_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(gguf_dir())
        .expect("tests/fixtures/gguf exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        // A model fixture has its expected outputs beside it (blocks.gguf, the block
        // formats' dequantization fixture, has none).
        .filter(|p| p.extension().is_some_and(|e| e == "gguf") && p.with_extension("json").exists())
        .collect();
    v.sort();
    assert!(v.len() >= 9, "expected the smollm2, qwen2 and gemma3 GGUF fixtures, found {v:?}");
    v
}

/// A JSON file, parsed (panics naming the file).
pub fn read_json(path: impl AsRef<Path>) -> serde_json::Value {
    let path = path.as_ref();
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// A JSON array of token ids, as u64.
pub fn ids_u64(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id")).collect()
}

/// A JSON array of logits rows (one per position).
pub fn logit_rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("logits")
        .iter()
        .map(|r| r.as_array().expect("row").iter().map(|x| x.as_f64().expect("f") as f32).collect())
        .collect()
}

/// The `ktune` binary, as a user runs it (the environment of the test process).
/// (Not with the unoptimized lavapipe code of `testing::test_gpu`: these runs
/// execute whole models, and without LLVM's passes they took 13% more CPU.)
pub fn ktune() -> Command {
    Command::cargo_bin("ktune").expect("binary built")
}

/// The `ktune` binary with its cache in `cache` (`KTUNE_CACHE_DIR`), never the user's.
pub fn ktune_in(cache: &Path) -> Command {
    let mut c = ktune();
    c.env("KTUNE_CACHE_DIR", cache);
    c
}

/// The `list-devices` index of the first GPU adapter, for `--device`; None with a
/// loud skip naming `what` unless GPUs are required (CI / KTUNE_REQUIRE_GPU=1),
/// when it fails.
pub fn gpu_index(cache: &Path, what: &str) -> Option<String> {
    let o = ktune_in(cache).args(["list-devices", "--format", "json"]).output().expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let idx = v["devices"].as_array().expect("devices").iter().find(|d| d["kind"] == "gpu").map(|d| d["index"].to_string());
    if idx.is_none() {
        assert!(!ktune::testing::gpu_required(), "a GPU adapter is required (CI / KTUNE_REQUIRE_GPU=1) but none was found");
        eprintln!("\n!!!! SKIPPING GPU {what} TEST: no GPU adapter (install mesa-vulkan-drivers) !!!!\n");
    }
    idx
}

/// A fresh temporary directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Largest |got - want| over every row, relative to the largest |want|: the
/// logits comparison of the runtime tests. A NaN anywhere counts as an infinite
/// error (`f64::max` alone would skip it).
pub fn rel_err(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    assert_eq!(got.len(), want.len(), "rows");
    let (mut err, mut scale) = (0f64, 0f64);
    for (x, y) in got.iter().zip(want) {
        assert_eq!(x.len(), y.len(), "row length");
        for (p, q) in x.iter().zip(y) {
            let d = (*p as f64 - *q as f64).abs();
            if d.is_nan() {
                return f64::INFINITY;
            }
            err = err.max(d);
            scale = scale.max((*q as f64).abs());
        }
    }
    err / scale.max(1e-6)
}

/// The `ktune` binary as a `std::process::Command` (one that can be spawned and
/// talked to while it runs: `chat` on a pipe, `serve`) with its cache in `cache`.
pub fn ktune_process(cache: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ktune"));
    c.env("KTUNE_CACHE_DIR", cache);
    c
}
