//! The runtime against Hugging Face transformers: tiny random models of each
//! architecture (tests/fixtures/, made by tools/make_fixtures.py) whose logits at
//! every prompt position and greedy continuation transformers computed. Checked
//! on the CPU and on the test GPU (lavapipe in CI), with every fusion off and on:
//! max |error| <= 1e-3 of the logits' scale, identical greedy tokens. Also on the
//! GPU with the LM head split into blocks of vocabulary rows, as a device whose
//! storage bindings are smaller than the head needs.

use std::path::Path;
use std::sync::Arc;

use crate::common::{hf_fixtures as fixtures, ids, read_json, rel_err};
use ktune::device::CpuCaps;
use ktune::kernels::DType;
use ktune::plan::select::DeviceCaps;
use ktune::plan::{Fusion, Plan, PlanOptions, Selection};
use ktune::runtime::{Engine, TensorStore, argmax};
use ktune::session::load_model;
use ktune::testing::test_gpu;

struct Expected {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    generated: Vec<u32>,
}

fn expected(dir: &Path) -> Expected {
    let v = read_json(dir.join("expected.json"));
    Expected { tokens: ids(&v["tokens"]), logits: crate::common::logit_rows(&v["logits"]), generated: ids(&v["generated"]) }
}

enum Dev {
    Cpu,
    Gpu(Arc<ktune::gpu::GpuCtx>),
    /// The GPU, planned as if its storage binding limit were this many bytes.
    GpuLimited(Arc<ktune::gpu::GpuCtx>, u64),
}

/// Runs the fixture and returns (max abs error / scale, greedy ids, expected ids).
fn run(dir: &Path, dev: &Dev, fusion: Fusion, kv: DType, chunk: usize) -> (f64, Vec<u32>, Vec<u32>) {
    let (rel, got, want, _) = run_blocks(dir, dev, fusion, kv, chunk);
    (rel, got, want)
}

/// [`run`], also returning how many blocks the LM head was split into.
fn run_blocks(dir: &Path, dev: &Dev, fusion: Fusion, kv: DType, chunk: usize) -> (f64, Vec<u32>, Vec<u32>, usize) {
    let m = load_model(None, Some(&dir.to_path_buf()), None, 0).expect("fixture loads");
    let exp = expected(dir);
    let n_new = exp.generated.len();
    let opts = PlanOptions::new(DType::F32, chunk.min(exp.tokens.len()), exp.tokens.len() + n_new)
        .with_kv_dtype(kv)
        .with_all_logits(true)
        .with_fusion(fusion);
    let caps = match dev {
        Dev::Cpu => DeviceCaps::Cpu(CpuCaps::detect()),
        Dev::Gpu(g) => DeviceCaps::Gpu(g.caps.clone()),
        Dev::GpuLimited(g, limit) => {
            let mut caps = g.caps.clone();
            caps.max_storage_binding = *limit;
            DeviceCaps::Gpu(caps)
        }
    };
    let plan = Plan::new("fixture", &m.config, opts, Selection::defaults(caps)).expect("plan");
    let blocks = plan.lm_head.len();
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let mut e = match dev {
        Dev::Cpu => Engine::cpu(plan, store).expect("engine"),
        Dev::Gpu(g) | Dev::GpuLimited(g, _) => Engine::gpu(plan, store, g.clone(), true).expect("engine"),
    };
    // Prefill in chunks of `chunk` tokens; every chunk's rows are compared.
    let mut rows = Vec::new();
    for c in exp.tokens.chunks(chunk) {
        rows.extend(e.forward(c).expect("prefill"));
    }
    assert_eq!(rows.len(), exp.logits.len(), "{}: one logits row per prompt token", dir.display());
    let rel = rel_err(&rows, &exp.logits);
    let mut next = argmax(rows.last().expect("rows"));
    let mut ids = vec![];
    for i in 0..n_new {
        ids.push(next);
        if i + 1 < n_new {
            next = argmax(&e.forward(&[next]).expect("decode")[0]);
        }
    }
    (rel, ids, exp.generated, blocks)
}

fn check(dev: Dev, what: &str) {
    let mut failures = Vec::new();
    for dir in fixtures() {
        let name = dir.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        // Whole prompt at once, and in chunks of 7 (prefill against a filled cache);
        // the decode norms folded into separate Q/K/V and gate/up projections too.
        let norm_matmul = Fusion { norm_matmul: true, ..Fusion::NONE };
        for (fusion, kv, chunk) in
            [(Fusion::NONE, DType::F32, 64), (Fusion::ALL, DType::F32, 64), (Fusion::ALL, DType::F32, 7), (norm_matmul, DType::F32, 7)]
        {
            let (rel, got, want) = run(&dir, &dev, fusion, kv, chunk);
            eprintln!("{what} {name} fusion={fusion:?} chunk={chunk}: max err {rel:.2e} of scale, ids {got:?}");
            if rel > 1e-3 || got != want {
                failures.push(format!("{name} {fusion:?} chunk {chunk}: rel err {rel:.2e}, ids {got:?} want {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
}

#[test]
fn cpu_logits_match_transformers() {
    check(Dev::Cpu, "cpu");
}

#[test]
fn gpu_logits_match_transformers() {
    let Some(gpu) = test_gpu() else { return };
    check(Dev::Gpu(gpu), "gpu");
}

/// An f16 KV cache stays close (looser: f16 rounding of keys and values).
#[test]
fn cpu_f16_cache_stays_close() {
    for dir in fixtures() {
        let (rel, _, _) = run(&dir, &Dev::Cpu, Fusion::ALL, DType::F16, 64);
        assert!(rel < 2e-2, "{}: rel err {rel:.2e} with an f16 cache", dir.display());
    }
}

/// A decode step of a mixture of experts reads its router and its `top_k` experts
/// of each layer, not all of them: the plan's figure (what `bench` reports per
/// token) is the config's count of the active weights (less the one embedding row
/// the runtime copies outside the plan), and far below every weight buffer's sum.
#[test]
fn moe_decode_reads_the_active_experts_share() {
    let dir = fixtures().into_iter().find(|d| d.ends_with("qwen3moe-tiny")).expect("the MoE fixture");
    let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
    let c = &m.config;
    let plan = Plan::new("fixture", c, PlanOptions::new(DType::F32, 8, 32), Selection::defaults(DeviceCaps::Cpu(CpuCaps::detect())))
        .expect("plan");
    let h = c.dims.hidden_size as u64;
    assert_eq!(plan.decode_read_bytes() + 4 * h, c.weight_bytes_per_token(DType::F32));
    let moe = c.moe.as_ref().expect("experts");
    let idle = (moe.experts - moe.top_k) as u64 * 3 * (moe.expert_ff as u64 * h) * 4 * c.dims.num_layers as u64;
    assert_eq!(plan.weight_bytes() - plan.decode_read_bytes(), idle);
}

/// Experts that do not fit one binding of the device are refused when the plan is
/// made, naming the layer and the limit.
#[test]
fn experts_past_the_binding_limit_are_refused() {
    let Some(gpu) = test_gpu() else { return };
    let dir = fixtures().into_iter().find(|d| d.ends_with("qwen3moe-tiny")).expect("the MoE fixture");
    let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
    let mut caps = gpu.caps.clone();
    caps.max_storage_binding = 64 << 10;
    let opts = PlanOptions::new(DType::F32, 8, 32);
    let err = Plan::new("fixture", &m.config, opts, Selection::defaults(DeviceCaps::Gpu(caps))).expect_err("does not fit");
    let msg = err.to_string();
    assert!(msg.contains("layer 0's experts") && msg.contains(&(64u64 << 10).to_string()), "{msg}");
}

/// The LM head in blocks: planned for a binding limit above every layer buffer but
/// below the head (32 KiB without fusion: the largest layer weights are 128 x 64 f32;
/// 64 KiB with the fused gate/up), prefilled at once and in chunks of 7 (several
/// logits rows per block).
#[test]
fn gpu_lm_head_in_blocks_matches_transformers() {
    let Some(gpu) = test_gpu() else { return };
    let mut failures = Vec::new();
    let mut split = 0;
    for dir in fixtures() {
        let name = dir.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        // A mixture of experts keeps every expert of a layer in one binding (128 KiB
        // of gate/up rows in the tiny one, above its 72 KiB head): no limit splits
        // its head and fits its layers (`experts_past_the_binding_limit_are_refused`).
        if read_json(dir.join("config.json"))["num_experts_per_tok"].is_number() {
            continue;
        }
        for (fusion, limit, chunk) in [(Fusion::NONE, 32 << 10, 64), (Fusion::ALL, 64 << 10, 7)] {
            let dev = Dev::GpuLimited(gpu.clone(), limit);
            let (rel, got, want, blocks) = run_blocks(&dir, &dev, fusion, DType::F32, chunk);
            eprintln!("gpu {name} binding limit {limit}: {blocks} LM-head blocks, max err {rel:.2e} of scale, ids {got:?}");
            split += usize::from(blocks > 1);
            if rel > 1e-3 || got != want {
                failures.push(format!("{name} limit {limit} ({blocks} blocks): rel err {rel:.2e}, ids {got:?} want {want:?}"));
            }
        }
    }
    assert!(split >= 4, "the limits should split the LM head of every fixture at least once");
    assert!(failures.is_empty(), "LM head in blocks:\n{}", failures.join("\n"));
}
