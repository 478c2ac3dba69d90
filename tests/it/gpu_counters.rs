//! The decode counters `run` and `bench` report per token (`decode_counters`),
//! on the CPU and on a GPU adapter (lavapipe here; skipped loudly without one
//! unless KTUNE_REQUIRE_GPU=1): averaged over the right tokens, the host phases a
//! backend has and null for the others, and on a GPU what a decode token asks of
//! the device. Pinned: the token picked on the GPU and its id alone read back
//! (4 bytes, and 4 a chain for its GPU time: `Engine::decode_chain`), the same command stream every token (no GPU
//! object created, the embedding looked up on the GPU, no queue write once the
//! GPU advances the position itself), and with K steps chained a submit one
//! submit and one host wait per K tokens; the GPU's time per token beside the
//! host's (timestamps).

use std::path::{Path, PathBuf};

use crate::common::{fixture, gpu_index, ktune_in, tempdir};

/// The tiny Llama fixture: 2 layers, a vocabulary of 256.
fn model() -> PathBuf {
    fixture("llama3-tiny")
}
const LAYERS: f64 = 2.0;

/// `ktune run` of `tokens` tokens after a 3-token prompt on `device`, decode
/// steps chained `k` a submit, as JSON.
fn run(cache: &Path, device: &str, tokens: usize, k: usize) -> serde_json::Value {
    let o = ktune_in(cache)
        .args(["run", "--device", device, "--no-profile", "--model-dir"])
        .arg(model())
        .args(["--tokens", "1,2,3", "--max-tokens", &tokens.to_string(), "--ignore-eos", "--format", "json"])
        .args(["--decode-chain", &k.to_string()])
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
    let r = run(cache.path(), "cpu", 8, 8);
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
    assert!(c["gpu_ms"].is_null() && r["step_timing"].is_null() && r["profiled_step_gpu_ms"].is_null(), "no GPU time on the CPU: {r}");
}

#[test]
fn gpu_decode_counters_pin_the_chained_command_stream() {
    let cache = tempdir();
    let Some(dev) = gpu_index(cache.path(), "decode counters") else { return };
    // K = 1: 7 decode steps, the first (warm-up, profiled) left out; K = 8: 17,
    // the first left out, then two chains of 8.
    for (tokens, k, tallied) in [(8, 1, 6), (18, 8, 16)] {
        let r = run(cache.path(), &dev, tokens, k);
        assert_eq!(r["decode_chain"].as_u64(), Some(k as u64), "{r}");
        let c = &r["decode_counters"];
        assert_eq!(c["tokens"].as_u64(), Some(tallied), "K = {k}: {c}");
        check_host(c);
        let h = &c["host_us"];
        for key in ["encode", "submit", "wait"] {
            assert!(h[key].as_f64().is_some_and(|v| v >= 0.0), "GPU phase `{key}`: {h}");
        }
        assert!(h["compute"].is_null(), "{h}");
        // The GPU's own time per token (every chained step's timestamps), and
        // how the slot breakdown was taken.
        assert!(f(c, "gpu_ms") > 0.0, "K = {k}: {c}");
        match r["step_timing"].as_str() {
            // The profiled step's own span, which its slots fit in.
            Some("inside_pass") => {
                let slots: f64 = r["slots"].as_array().expect("slots").iter().map(|s| f(s, "decode_ms_per_token")).sum();
                assert!(slots > 0.0 && slots <= f(&r, "profiled_step_gpu_ms") * 1.05 + 1e-3, "{slots} ms in slots: {r}");
            }
            Some("pass_per_step") => assert!(r["profiled_step_gpu_ms"].is_null(), "{r}"),
            other => panic!("step_timing {other:?}"),
        }
        let g = &c["gpu"];
        let per_chain = 1.0 / k as f64;
        // One submit and one host wait (the chain's ids mapped) per chain; the
        // token's id read back (4 bytes, and 4 a chain: its GPU time), not the
        // vocabulary's logits; every pipeline built at warm-up, no query set
        // created (the token stamps' is the engine's, made with it).
        assert_eq!(f(g, "submits"), per_chain, "K = {k}: {g}");
        assert_eq!(f(g, "host_waits"), per_chain, "K = {k}: {g}");
        assert!(f(g, "read_back_bytes") <= 8.0, "K = {k}: {g}");
        assert_eq!(f(g, "pipelines_created"), 0.0, "{g}");
        assert_eq!(f(g, "query_sets_created"), 0.0, "{g}");
        let per_layer = r["dispatches_per_layer"].as_f64().expect("dispatches per layer");
        assert!(f(g, "dispatches") >= LAYERS * per_layer && f(g, "dispatches") <= LAYERS * per_layer + 8.0, "{g} ({per_layer} a layer)");
        assert!((1.0..=f(g, "dispatches")).contains(&f(g, "compute_passes")), "{g}");
        // The same command stream every token: nothing created or rebuilt, the
        // embedding looked up on the GPU (the fixture's table is its tied LM
        // head), at most one write of at most 64 bytes a chain (the GPU moves the
        // position and the token from one step to the next).
        assert_eq!(f(g, "objects_created"), 0.0, "{g}");
        assert_eq!(g["embedding_on_gpu"], true, "{g}");
        assert!(f(g, "write_buffer_calls") <= per_chain, "K = {k}: {g}");
        assert!(f(g, "write_buffer_bytes") <= 64.0 * f(g, "write_buffer_calls"), "K = {k}: {g}");
    }
    // The table view shows the host's time and the readback per token.
    let o = ktune_in(cache.path())
        .args(["run", "--device", &dev, "--no-profile", "--model-dir"])
        .arg(model())
        .args(["--tokens", "1,2,3", "--max-tokens", "4", "--ignore-eos"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("µs per decode token") && text.contains("ms per decode token (timestamps)"), "{text}");
    assert!(text.contains("B read back, embedding on the GPU") && text.contains("slot times: timestamps"), "{text}");
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
        // 3 rounds of 3 decode steps; the engine's first decode step (it compiles
        // the schedule) runs before them, untimed and untallied.
        assert_eq!(c["tokens"].as_u64(), Some(9), "{device}: {c}");
        check_host(c);
        assert_eq!(c["gpu"].is_null(), device == "cpu", "{device}: {c}");
        // The GPU's time per token from timestamps (lavapipe has them), none on the CPU.
        assert_eq!(c["gpu_ms"].as_f64().is_some_and(|ms| ms > 0.0), device != "cpu", "{device}: {c}");
    }
}
