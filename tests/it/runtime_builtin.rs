//! The CPU and GPU backends agree on every built-in model (`ktune::model::builtin_names`)
//! at its real widths and head layout, cut to one layer (two where its layers differ in
//! kind), with synthetic f16 weights
//! (the CPU and the GPU read the same values): a short prompt, then greedy decode
//! steps against the KV cache. Every step's logits must agree within 1e-3 of the
//! logits' scale, and the greedy tokens must be identical.
//!
//! A model whose layers are all alike runs one (every layer runs the same kernels at
//! the same shapes; the hand-over from layer to layer is the fixtures' business, in
//! `runtime_hf.rs` and `runtime_gguf.rs`). Two layers cover the models whose layers
//! differ: Gemma 3 gets one sliding-window layer and one global layer (its
//! published pattern has five local layers first), with the window shrunk below the
//! sequence length so it masks; SmolLM3 one layer with RoPE and one without.
//!
//! The GPU in CI is lavapipe (software Vulkan on 2 cores), where a decode step of
//! all seven models reads ~0.7 G weights at ~0.1 G/s and a prefill GEMM costs ten
//! times that. So the default test keeps the run under a minute: the vocabulary is
//! cut to [`FAST_VOCAB`] rows (the LM head split into blocks is checked by
//! `runtime_hf.rs` and the plan's unit tests), and only models below
//! [`FAST_PREFILL_PARAMS`] take the prompt in one prefill pass; the others feed it
//! token by token through the decode kernels (so every model still runs three
//! decode steps against a growing KV cache). The ignored test runs the full
//! vocabularies (on lavapipe Gemma 3's LM head exceeds the 128 MiB binding limit
//! and is split) and prefills every model:
//!
//!     cargo test --test runtime_builtin -- --ignored    # ~2.5 min on lavapipe
//!
//! Without a GPU adapter the tests skip loudly (fail under CI, see `ktune::testing`).

use std::sync::Arc;
use std::time::Instant;

use ktune::device::CpuCaps;
use ktune::gpu::GpuCtx;
use ktune::kernels::DType;
use ktune::model::{LayerKind, ModelConfig, Weights, builtin, builtin_names};
use ktune::plan::select::DeviceCaps;
use ktune::plan::{Fusion, Plan, PlanOptions, Selection};
use ktune::runtime::{Engine, TensorStore, argmax};
use ktune::testing::test_gpu;

/// Layers of a reduced model whose layers differ in kind (else one).
const LAYERS: usize = 2;
const PROMPT_LEN: usize = 2;
const DECODE_STEPS: usize = 1;
/// Sliding window of the reduced Gemma 3 models: shorter than the sequence.
const WINDOW: usize = 2;
const TOLERANCE: f64 = 1e-3;
/// Vocabulary rows kept by the fast test.
const FAST_VOCAB: usize = 2048;
/// Models with fewer parameters (reduced) prefill the prompt in the fast test.
const FAST_PREFILL_PARAMS: usize = 40_000_000;

/// How much of each model to run.
#[derive(Clone, Copy)]
struct Scope {
    /// Vocabulary rows kept (`None`: all).
    vocab: Option<usize>,
    /// Prefill the prompt in one pass when the reduced model has fewer parameters.
    prefill_below: usize,
    /// The models compared: every `of`-th built-in model from the `part`-th
    /// (so that libtest can run the parts side by side).
    part: usize,
    of: usize,
}

/// `name` cut to one layer, or to [`LAYERS`] where its layers differ in kind (a local
/// then a global layer for sliding-window models, the last without RoPE where some
/// have none), and, when asked, to fewer
/// vocabulary rows.
fn reduced(name: &str, vocab: Option<usize>) -> ModelConfig {
    let mut c = builtin(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let has_local = c.layer_types.contains(&LayerKind::Local);
    let has_nope = !c.nope_layers.is_empty();
    c.dims.num_layers = if has_local || has_nope { LAYERS } else { 1 };
    c.layer_types = if has_local { vec![LayerKind::Local, LayerKind::Global] } else { vec![LayerKind::Global; c.dims.num_layers] };
    if has_local {
        c.sliding_window = Some(WINDOW);
    }
    // A model with layers without RoPE keeps one (the last).
    if has_nope {
        c.nope_layers = vec![LAYERS - 1];
    }
    // A mixture of experts keeps its experts' shapes and its top-k, with one expert
    // more than a token takes (Qwen3-30B-A3B's 128 would hold 2.4 GB of f32 in one
    // layer): the router still leaves one out.
    if let Some(m) = &mut c.moe {
        m.experts = m.experts.min(m.top_k + 1);
    }
    if let Some(v) = vocab.filter(|&v| v < c.dims.vocab_size) {
        c.dims.vocab_size = v;
        // The published special tokens lie beyond the cut (the runtime does not use them).
        c.bos_token_id = None;
        c.eos_token_ids.clear();
    }
    c.validate().unwrap_or_else(|e| panic!("{name} reduced: {e}"));
    c
}

/// A prompt spread over the vocabulary (ids below 3 avoided: special tokens).
fn prompt(vocab: usize) -> Vec<u32> {
    (0..PROMPT_LEN).map(|i| (3 + (i * 7919 + 104_729 * (i + 1)) % (vocab - 3)) as u32).collect()
}

/// Whether the reduced model `c` takes the prompt in one prefill pass in `scope`.
fn prefills(c: &ModelConfig, scope: Scope) -> bool {
    c.param_count() < scope.prefill_below as u64
}

/// The plan the test runs `c` with on a device with `caps`: f16 weights, the prompt
/// in one pass when `prefill`, else token by token.
fn plan(c: &ModelConfig, caps: DeviceCaps, prefill: bool) -> Plan {
    let opts = PlanOptions::new(DType::F16, if prefill { PROMPT_LEN } else { 1 }, PROMPT_LEN + DECODE_STEPS);
    Plan::new("builtin", c, opts, Selection::defaults(caps)).expect("plan")
}

fn engine(c: &ModelConfig, store: Arc<dyn TensorStore>, gpu: Option<Arc<GpuCtx>>, prefill: bool) -> Engine {
    let caps = match &gpu {
        Some(g) => DeviceCaps::Gpu(g.caps.clone()),
        None => DeviceCaps::Cpu(CpuCaps::detect()),
    };
    let plan = plan(c, caps, prefill);
    match gpu {
        Some(g) => Engine::gpu(plan, store, g, true).expect("GPU engine"),
        None => Engine::cpu(plan, store).expect("CPU engine"),
    }
}

/// The last prompt row's logits, then one row per decode step. The continuation is
/// `feed` when given (the GPU is fed the CPU's picks, so that one disagreement does
/// not hide the comparison of the later steps), else the greedy choice.
fn trace(e: &mut Engine, prompt: &[u32], feed: Option<&[u32]>) -> Vec<Vec<f32>> {
    let mut rows = vec![e.forward(prompt).expect("prefill").pop().expect("a logits row")];
    for i in 0..DECODE_STEPS {
        let next = feed.map_or_else(|| argmax(&rows[i]), |f| f[i]);
        rows.push(e.forward(&[next]).expect("decode").pop().expect("a logits row"));
    }
    rows
}

/// The built-in models whose reduced plans differ on `gpu`: a model whose prefill and
/// decode steps (every kernel, its problem and its buffers) are an earlier model's
/// runs what that one ran (Mistral 7B's reduced layer is Llama 3.1 8B's), so it is
/// left out, saying so.
fn distinct_models(gpu: &GpuCtx, scope: Scope) -> Vec<&'static str> {
    let mut seen: Vec<(String, &str)> = Vec::new();
    let mut names = Vec::new();
    for name in builtin_names() {
        let c = reduced(name, scope.vocab);
        let prefill = prefills(&c, scope);
        let plan = plan(&c, DeviceCaps::Gpu(gpu.caps.clone()), prefill);
        let steps = |tokens, pos0| serde_json::to_string(&plan.steps(tokens, pos0).expect("steps")).expect("json");
        let key = format!("{} {}", steps(if prefill { PROMPT_LEN } else { 1 }, 0), steps(1, PROMPT_LEN));
        match seen.iter().find(|(k, _)| *k == key) {
            Some((_, first)) => eprintln!("{name}: the same steps as {first}, left out"),
            None => {
                seen.push((key, name));
                names.push(name);
            }
        }
    }
    names
}

/// Runs the built-in models of `scope` on the CPU and the GPU; returns the disagreements.
fn compare_all(gpu: &Arc<GpuCtx>, scope: Scope) -> Vec<String> {
    let mut failures = Vec::new();
    for name in distinct_models(gpu, scope).into_iter().skip(scope.part).step_by(scope.of) {
        let t0 = Instant::now();
        let c = reduced(name, scope.vocab);
        let prefill = prefills(&c, scope);
        let store: Arc<dyn TensorStore> = Arc::new(Weights::synthetic(&c, 7));
        let prompt = prompt(c.dims.vocab_size);
        let cpu = trace(&mut engine(&c, store.clone(), None, prefill), &prompt, None);
        let cpu_ids: Vec<u32> = cpu.iter().map(|r| argmax(r)).collect();
        let gpu_rows = trace(&mut engine(&c, store, Some(gpu.clone()), prefill), &prompt, Some(&cpu_ids));
        let gpu_ids: Vec<u32> = gpu_rows.iter().map(|r| argmax(r)).collect();
        let scale = cpu.iter().flatten().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
        let mut worst = 0.0f64;
        for (a, b) in cpu.iter().zip(&gpu_rows) {
            assert_eq!((a.len(), b.len()), (c.dims.vocab_size, c.dims.vocab_size), "{name}: one logit per vocabulary entry");
            for (x, y) in a.iter().zip(b) {
                let d = (*x as f64 - *y as f64).abs();
                // NaN never compares greater: count it as the worst error.
                worst = if d.is_nan() { f64::INFINITY } else { worst.max(d) };
            }
        }
        let rel = worst / scale.max(f64::MIN_POSITIVE);
        eprintln!(
            "{name} ({}, vocab {}, layers {:?}, {}): max |cpu - gpu| {worst:.2e} = {rel:.2e} of scale {scale:.2}, ids cpu {cpu_ids:?} gpu {gpu_ids:?} ({:.1} s)",
            c.architecture,
            c.dims.vocab_size,
            c.layer_types,
            if prefill { "prefill + decode" } else { "decode only" },
            t0.elapsed().as_secs_f64()
        );
        if !(scale > 0.0 && scale.is_finite()) {
            failures.push(format!("{name}: CPU logits scale is {scale}"));
        }
        if rel > TOLERANCE {
            failures.push(format!("{name}: max |cpu - gpu| is {rel:.2e} of the logits' scale (limit {TOLERANCE:.0e})"));
        }
        if cpu_ids != gpu_ids {
            failures.push(format!("{name}: greedy ids differ: cpu {cpu_ids:?}, gpu {gpu_ids:?}"));
        }
    }
    failures
}

#[test]
fn reduced_models_keep_their_layer_kinds() {
    for name in builtin_names() {
        let full = builtin(name).expect("builtin");
        let c = reduced(name, Some(FAST_VOCAB));
        let kinds = full.layer_types.contains(&LayerKind::Local) || !full.nope_layers.is_empty();
        assert_eq!(c.dims.num_layers, if kinds { LAYERS } else { 1 }, "{name}");
        if !full.nope_layers.is_empty() {
            assert_eq!(c.nope_layers, [LAYERS - 1], "{name}: one layer with RoPE, one without");
        }
        assert_eq!(
            (c.dims.hidden_size, c.dims.head_dim, c.dims.num_heads),
            (full.dims.hidden_size, full.dims.head_dim, full.dims.num_heads),
            "{name}"
        );
        if full.layer_types.contains(&LayerKind::Local) {
            assert_eq!(c.layer_types, [LayerKind::Local, LayerKind::Global], "{name}");
            assert!(c.sliding_window.is_some_and(|w| w < PROMPT_LEN + DECODE_STEPS), "{name}: the window must mask");
        }
    }
}

/// Every built-in model, in three parts run side by side (one took 40 s on
/// lavapipe at the end of the run).
fn cpu_and_gpu_agree_on_builtin_models(part: usize) {
    let Some(gpu) = test_gpu() else { return };
    let failures = compare_all(&gpu, Scope { vocab: Some(FAST_VOCAB), prefill_below: FAST_PREFILL_PARAMS, part, of: 3 });
    assert!(failures.is_empty(), "CPU and GPU disagree:\n{}", failures.join("\n"));
}

#[test]
fn cpu_and_gpu_agree_on_every_builtin_model_part_1() {
    cpu_and_gpu_agree_on_builtin_models(0);
}

#[test]
fn cpu_and_gpu_agree_on_every_builtin_model_part_2() {
    cpu_and_gpu_agree_on_builtin_models(1);
}

#[test]
fn cpu_and_gpu_agree_on_every_builtin_model_part_3() {
    cpu_and_gpu_agree_on_builtin_models(2);
}

/// Full vocabularies, every model prefilled (minutes on lavapipe).
#[test]
#[ignore = "minutes on a software GPU: cargo test --test it -- --ignored full_vocabulary"]
fn cpu_and_gpu_agree_on_every_builtin_model_full_vocabulary() {
    let Some(gpu) = test_gpu() else { return };
    let failures = compare_all(&gpu, Scope { vocab: None, prefill_below: usize::MAX, part: 0, of: 1 });
    assert!(failures.is_empty(), "CPU and GPU disagree:\n{}", failures.join("\n"));
}

/// A compiled schedule moved to another position (`Plan::rebase`) is the schedule
/// `Plan::steps` builds there: every built-in model (sliding-window Gemma layers
/// included), decode and prefill, several positions.
#[test]
fn rebased_schedules_equal_fresh_ones() {
    for name in ktune::model::builtin_names() {
        let c = reduced(name, Some(512));
        let opts = PlanOptions::new(DType::F32, 8, 64);
        let plan = Plan::new("builtin", &c, opts, Selection::defaults(DeviceCaps::Cpu(CpuCaps::detect()))).expect("plan");
        for tokens in [1, 8] {
            let mut compiled = plan.steps(tokens, 0).expect("steps");
            for pos in [3, 17, 40, 56] {
                assert!(plan.rebase(&mut compiled, tokens, pos).expect("rebase"), "{name}: kernel no longer valid at {pos}");
                let fresh = plan.steps(tokens, pos).expect("steps");
                assert_eq!(
                    serde_json::to_value(&compiled).expect("json"),
                    serde_json::to_value(&fresh).expect("json"),
                    "{name}: {tokens} tokens at {pos}"
                );
            }
        }
    }
}

/// An explicit choice that cannot run its step falls back to the default, and the
/// warning stays with the compiled step (the selection itself is immutable): the
/// engine reports it once, whatever number of passes ran.
#[test]
fn a_fallback_warning_stays_with_the_step() {
    use ktune::kernels::find;
    use ktune::plan::select::{Choice, Slot};
    use ktune::plan::{Regime, StepKind};
    let c = reduced("smollm2-135m", Some(512));
    let opts = PlanOptions::new(DType::F32, 4, 16).with_fusion(Fusion::NONE);
    let mut sel = Selection::defaults(DeviceCaps::Cpu(CpuCaps::detect()));
    // A block-format GEMV for an f32 LM head: it cannot run it.
    let k = find("gemv_q_cpu").expect("kernel");
    sel.slots.insert((Slot::MatmulLmHead, Regime::Decode), Choice::new(k, k.default_params()));
    let plan = Plan::new("builtin", &c, opts, sel).expect("plan");
    let steps = plan.steps(1, 3).expect("steps");
    let head: Vec<_> = steps.iter().filter(|s| s.slot == Slot::MatmulLmHead).collect();
    assert!(!head.is_empty());
    for s in &head {
        let StepKind::Kernel { kernel, .. } = &s.kind else { panic!("a kernel step") };
        assert_ne!(kernel.id, "gemv_q_cpu", "the default serves");
        let w = s.warning.as_deref().expect("a warning");
        assert!(w.contains("gemv_q_cpu") && w.contains("using the default"), "{w}");
    }
    assert!(steps.iter().filter(|s| s.slot != Slot::MatmulLmHead).all(|s| s.warning.is_none()));
    let store: Arc<dyn TensorStore> = Arc::new(ktune::model::Weights::synthetic(&c, 0));
    let mut e = Engine::cpu(plan, store).expect("engine");
    e.forward(&[1, 2, 3]).expect("prefill");
    for t in 0..3 {
        e.decode_step(t).expect("decode");
    }
    assert_eq!(e.warnings().len(), 1, "{:?}", e.warnings());
}
