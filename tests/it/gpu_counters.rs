//! The decode counters `run` and `bench` report per token (`decode_counters`),
//! on the CPU and on a GPU adapter (lavapipe here; skipped loudly without one
//! unless KTUNE_REQUIRE_GPU=1): averaged over the right tokens, the host phases a
//! backend has and null for the others, and on a GPU what a decode token asks of
//! the device. Pinned exactly: one submit, 8 bytes read back (greedy decoding's
//! argmax taken on the GPU, `Engine::decode_next`), and the same command stream
//! every token (no GPU object created, the embedding looked up on the GPU, the
//! 16-byte position and token id the only queue write); pinned loosely, as the
//! baseline later work brings down: the host waits.

use std::path::{Path, PathBuf};

use crate::common::{fixture, gpu_index, ktune_in, tempdir};

/// The tiny Llama fixture: 2 layers, a vocabulary of 256.
fn model() -> PathBuf {
    fixture("llama3-tiny")
}
const LAYERS: f64 = 2.0;

/// `ktune run` of 8 tokens after a 3-token prompt on `device`, as JSON.
fn run(cache: &Path, device: &str) -> serde_json::Value {
    let o = ktune_in(cache)
        .args(["run", "--device", device, "--no-profile", "--model-dir"])
        .arg(model())
        .args(["--tokens", "1,2,3", "--max-tokens", "8", "--ignore-eos", "--format", "json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "run: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

/// The host phases every backend has, positive, and their sum.
fn check_host(c: &serde_json::Value) {
    let h = &c["host_us"];
    for k in ["prepare", "post", "total"] {
        assert!(f(h, k) >= 0.0, "{h}");
    }
    assert!(f(h, "total") > 0.0, "{h}");
    let sum: f64 = ["prepare", "encode", "submit", "wait", "compute", "post"].iter().filter_map(|k| h[*k].as_f64()).sum();
    assert!((sum - f(h, "total")).abs() <= 1e-6 * sum.max(1.0), "the phases add up to the total: {h}");
}

#[test]
fn cpu_decode_counters_have_the_cpus_phases_and_no_gpu_counts() {
    let cache = tempdir();
    let r = run(cache.path(), "cpu");
    let c = &r["decode_counters"];
    // 7 decode steps (the 8th id comes from the last one): all but the first.
    assert_eq!(c["tokens"].as_u64(), Some(6), "{c}");
    check_host(c);
    let h = &c["host_us"];
    assert!(h["compute"].as_f64().is_some_and(|v| v > 0.0), "the kernels' time: {h}");
    for k in ["encode", "submit", "wait"] {
        assert!(h[k].is_null(), "no GPU phase `{k}` on the CPU: {h}");
    }
    assert!(c["gpu"].is_null(), "no dispatches or readback on the CPU: {c}");
}

#[test]
fn gpu_decode_counters_pin_todays_command_stream() {
    let cache = tempdir();
    let Some(dev) = gpu_index(cache.path(), "decode counters") else { return };
    let r = run(cache.path(), &dev);
    let c = &r["decode_counters"];
    // 7 decode steps: the first (warm-up) and the profiled second left out.
    assert_eq!(c["tokens"].as_u64(), Some(5), "{c}");
    check_host(c);
    let h = &c["host_us"];
    for k in ["encode", "submit", "wait"] {
        assert!(h[k].as_f64().is_some_and(|v| v >= 0.0), "GPU phase `{k}`: {h}");
    }
    assert!(h["compute"].is_null(), "{h}");
    let g = &c["gpu"];
    // Structural: one submit per token, greedy decoding reads back the GPU's
    // argmax (index and logit, 8 bytes: one LM-head block) and not the
    // vocabulary's logits, every pipeline built at warm-up, no timestamp queries.
    assert_eq!(f(g, "submits"), 1.0, "{g}");
    assert_eq!(f(g, "read_back_bytes"), 8.0, "{g}");
    assert_eq!(f(g, "pipelines_created"), 0.0, "{g}");
    assert_eq!(f(g, "query_sets_created"), 0.0, "{g}");
    let per_layer = r["dispatches_per_layer"].as_f64().expect("dispatches per layer");
    assert!(f(g, "dispatches") >= LAYERS * per_layer && f(g, "dispatches") <= LAYERS * per_layer + 8.0, "{g} ({per_layer} a layer)");
    assert!((1.0..=f(g, "dispatches")).contains(&f(g, "compute_passes")), "{g}");
    // The same command stream every token: nothing created or rebuilt, one
    // 16-byte write of the position and the token id, whose embedding row the
    // GPU looks up (the fixture's table is its tied LM head).
    assert_eq!(f(g, "objects_created"), 0.0, "{g}");
    assert_eq!(g["embedding_on_gpu"], true, "{g}");
    assert_eq!(f(g, "write_buffer_calls"), 1.0, "{g}");
    assert_eq!(f(g, "write_buffer_bytes"), 16.0, "{g}");
    // Today's baseline, to come down: a wait for the pass and one for the mapped pick.
    assert!((1.0..=2.0).contains(&f(g, "host_waits")), "{g}");
    // The table view shows the host's time and the readback per token.
    let o = ktune_in(cache.path())
        .args(["run", "--device", &dev, "--no-profile", "--model-dir"])
        .arg(model())
        .args(["--tokens", "1,2,3", "--max-tokens", "4", "--ignore-eos"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("µs per decode token") && text.contains("8 B read back, embedding on the GPU"), "{text}");
}

#[test]
fn bench_reports_decode_counters_per_entry() {
    let cache = tempdir();
    let dev = gpu_index(cache.path(), "bench decode counters");
    for device in std::iter::once("cpu".to_string()).chain(dev) {
        let o = ktune_in(cache.path())
            .args(["bench", "--device", &device, "--no-profile", "--model-dir"])
            .arg(model())
            .args(["--rounds", "3", "--prefill-tokens", "4", "--decode-tokens", "3", "--format", "json"])
            .output()
            .expect("runs");
        assert!(o.status.success(), "bench on {device}: {}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        let c = &r["entries"][0]["decode_counters"];
        // 3 rounds of 3 decode steps, the engine's first left out.
        assert_eq!(c["tokens"].as_u64(), Some(8), "{device}: {c}");
        check_host(c);
        assert_eq!(c["gpu"].is_null(), device == "cpu", "{device}: {c}");
    }
}
