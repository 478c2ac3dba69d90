//! The runtime with block-quantized weights (`--weight-dtype q8_0|q4_0|q4_1`) on
//! the tiny Hugging Face fixtures: its logits at every prompt position and over
//! greedy decode steps match the f32 runtime run on the dequantized weights (the
//! same numbers, so only accumulation order differs), on the CPU and on the test
//! GPU (lavapipe in CI), with fusions off and on; and CPU and GPU agree with each
//! other. A quantized plan keeps norm gains in f32 and stores every matrix
//! (projections, fused concatenations, LM head) quantized. Also: decode with the
//! norms folded into the projections (`norm_matmul`) gives the logits of the
//! unfused plan, for f32, f16 and block-quantized weights, CPU and GPU.

use std::path::Path;
use std::sync::Arc;

use crate::common::{hf_fixtures as fixtures, rel_err};
use ktune::device::CpuCaps;
use ktune::kernels::DType;
use ktune::kernels::quant::QFormat;
use ktune::model::Weights;
use ktune::plan::select::DeviceCaps;
use ktune::plan::{BufRole, Fusion, Plan, PlanOptions, Selection};
use ktune::runtime::cpu::HostBuf;
use ktune::runtime::{Engine, LoadOnce, RuntimeError, TensorStore, argmax};
use ktune::session::load_model;
use ktune::testing::test_gpu;

/// The weights with every 2-D tensor read through `load`/`load_range` quantized to
/// `format` and dequantized again (what the quantized runtime's matrices hold), as
/// f32; embedding rows (`row`) and 1-D tensors untouched.
struct Dequantized {
    inner: Arc<Weights>,
    dtype: DType,
}

impl Dequantized {
    fn matrix(&self, name: &str) -> Option<(usize, usize)> {
        match self.inner.meta(name).ok()?.shape[..] {
            [r, c] => Some((r, c)),
            _ => None,
        }
    }
}

impl TensorStore for Dequantized {
    fn load(&self, name: &str, dtype: DType, len: usize) -> Result<HostBuf, RuntimeError> {
        assert_eq!(dtype, DType::F32, "the reference runs in f32");
        match (self.matrix(name), self.dtype.quant()) {
            (Some(_), Some(f)) => {
                let q = self.inner.load_quant(name, f).map_err(|e| RuntimeError::Weights(e.to_string()))?;
                assert_eq!(q.rows * q.cols, len);
                Ok(HostBuf::F32(q.dequantize()))
            }
            _ => self.inner.load(name, dtype, len),
        }
    }
    fn load_range(&self, name: &str, dtype: DType, start: usize, len: usize) -> Result<HostBuf, RuntimeError> {
        match (self.matrix(name), self.dtype.quant()) {
            (Some((_, cols)), Some(f)) => {
                let q = self.inner.load_quant_rows(name, f, start / cols, len / cols).map_err(|e| RuntimeError::Weights(e.to_string()))?;
                Ok(HostBuf::F32(q.dequantize()))
            }
            _ => self.inner.load_range(name, dtype, start, len),
        }
    }
    fn row(&self, name: &str, row: usize, cols: usize) -> Result<Vec<f32>, RuntimeError> {
        self.inner.row(name, row, cols)
    }
}

const PROMPT: [u32; 9] = [1, 17, 42, 99, 3, 250, 7, 128, 64];
const DECODE: usize = 4;

/// Logits of every prompt position (prefill in chunks of 4) then of `DECODE` greedy steps.
pub(crate) fn logits(
    dir: &Path,
    caps: DeviceCaps,
    gpu: Option<Arc<ktune::gpu::GpuCtx>>,
    dtype: DType,
    fusion: Fusion,
    store: Arc<dyn TensorStore>,
) -> Vec<Vec<f32>> {
    logits_repacked(dir, caps, gpu, (dtype, Vec::new()), fusion, store)
}

/// [`logits`] with the CPU weights of the formats in `dtype.1` repacked.
fn logits_repacked(
    dir: &Path,
    caps: DeviceCaps,
    gpu: Option<Arc<ktune::gpu::GpuCtx>>,
    (dtype, cpu_repack): (DType, Vec<QFormat>),
    fusion: Fusion,
    store: Arc<dyn TensorStore>,
) -> Vec<Vec<f32>> {
    let m = load_model(None, Some(&dir.to_path_buf()), None, 0).expect("fixture loads");
    let opts = PlanOptions::new(dtype, 4, PROMPT.len() + DECODE).with_all_logits(true).with_fusion(fusion).with_cpu_repack(cpu_repack);
    let plan = Plan::new("fixture", &m.config, opts, Selection::defaults(caps)).expect("plan");
    if dtype.is_quant() {
        for b in plan.buffers.iter().filter(|b| b.role == BufRole::Weight) {
            let matrix = b.name.starts_with("lm_head")
                || [".wq", ".wk", ".wv", ".wo", ".wg", ".wu", ".wd", ".wqkv", ".wgu", ".wgu_exps", ".wd_exps"]
                    .iter()
                    .any(|s| b.name.ends_with(s));
            let want = if matrix { dtype } else { DType::F32 };
            assert_eq!(b.dtype, want, "{}: buffer {} stored as {}", dir.display(), b.name, b.dtype);
        }
        // Every matrix step runs a quantized kernel.
        for s in plan.steps(4, 0).expect("steps").iter().chain(plan.steps(1, 4).expect("steps").iter()) {
            if let ktune::plan::StepKind::Kernel { kernel, dtype: d, .. } = &s.kind
                && d.is_quant()
            {
                assert!(kernel.dtypes.contains(d), "{} runs {} on {d}", s.slot, kernel.id);
            }
        }
    }
    let mut e = match gpu {
        Some(g) => Engine::gpu(plan, store, g, true).expect("engine"),
        None => Engine::cpu(plan, store).expect("engine"),
    };
    let mut rows = Vec::new();
    for c in PROMPT.chunks(4) {
        rows.extend(e.forward(c).expect("prefill"));
    }
    for _ in 0..DECODE {
        let next = argmax(rows.last().expect("row"));
        rows.extend(e.forward(&[next]).expect("decode"));
    }
    rows
}

/// The fixtures of the four layouts of norms and projections: Llama's plain
/// pre-norms, Qwen2's Q/K/V biases, Qwen3's per-head q/k norms, Gemma 3's sandwich
/// norms with `(1 + w)` gains. The others repeat one of them as far as quantized
/// matrices, their concatenations and the norms folded into them go (Mistral's
/// window, SmolLM3's layers without RoPE, bf16 files and a vision tower change
/// none of it).
fn layouts() -> Vec<std::path::PathBuf> {
    let names = ["llama3-tiny", "qwen2-tiny-sharded", "qwen3-tiny", "gemma3-tiny"];
    let dirs: Vec<_> = fixtures().into_iter().filter(|d| d.file_name().is_some_and(|n| names.iter().any(|l| n == *l))).collect();
    assert_eq!(dirs.len(), names.len(), "the fixtures {names:?}: {dirs:?}");
    dirs
}

/// Every block format on the [`layouts`], fused and not.
#[test]
fn quantized_runtime_matches_f32_on_dequantized_weights_cpu_and_gpu() {
    let gpu = test_gpu();
    let mut failures = Vec::new();
    for dir in layouts() {
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
            for fusion in [Fusion::NONE, Fusion::ALL] {
                let deq: Arc<dyn TensorStore> = Arc::new(Dequantized { inner: m.weights.clone(), dtype });
                let cpu_caps = || DeviceCaps::Cpu(CpuCaps::detect());
                let want = logits(&dir, cpu_caps(), None, DType::F32, fusion, deq);
                let cpu = logits(&dir, cpu_caps(), None, dtype, fusion, m.weights.clone());
                let e = rel_err(&cpu, &want);
                if e > 1e-4 {
                    failures.push(format!("{} {dtype} {fusion:?} CPU: rel err {e:.2e}", dir.display()));
                }
                if let Some(g) = &gpu {
                    let got = logits(&dir, DeviceCaps::Gpu(g.caps.clone()), Some(g.clone()), dtype, fusion, m.weights.clone());
                    let e = rel_err(&got, &want);
                    let ec = rel_err(&got, &cpu);
                    if e > 1e-4 || ec > 1e-4 {
                        failures.push(format!("{} {dtype} {fusion:?} GPU {}: rel err {e:.2e} (vs CPU {ec:.2e})", dir.display(), g.name));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

type Gpu = Arc<ktune::gpu::GpuCtx>;

/// The tuner's engines load a model once between them ([`LoadOnce`]): an
/// unfused plan, a fused one (Q/K/V and gate/up concatenated from the kept
/// parts), a repacked one (repacked from a kept matrix) and a GPU one give
/// exactly the logits each gives from the model itself, in f32 and two block
/// formats, and only the first engine loads (on the [`layouts`]).
#[test]
fn engines_sharing_quantized_weights_match_their_own() {
    let gpu = test_gpu();
    let cpu = || DeviceCaps::Cpu(CpuCaps::detect());
    for dir in layouts() {
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        for dtype in [DType::F32, DType::Q8_0, DType::Q4_0] {
            let once = Arc::new(LoadOnce::new(m.weights.clone(), &[dtype]));
            let shared: Arc<dyn TensorStore> = once.clone();
            let mut runs: Vec<(String, Option<Gpu>, Vec<QFormat>, Fusion)> =
                vec![("unfused".into(), None, Vec::new(), Fusion::NONE), ("fused".into(), None, Vec::new(), Fusion::ALL)];
            if let Some(format) = dtype.quant() {
                runs.push(("repacked".into(), None, vec![format], Fusion::NONE));
            }
            if let Some(g) = &gpu {
                runs.push((format!("GPU {}", g.name), Some(g.clone()), Vec::new(), Fusion::ALL));
            }
            let mut loaded = None;
            for (what, g, repack, fusion) in runs {
                let caps = || g.as_ref().map_or_else(cpu, |g| DeviceCaps::Gpu(g.caps.clone()));
                let own = logits_repacked(&dir, caps(), g.clone(), (dtype, repack.clone()), fusion, m.weights.clone());
                let got = logits_repacked(&dir, caps(), g, (dtype, repack), fusion, shared.clone());
                assert!(
                    got == own,
                    "{} {dtype} {what}: the shared weights' logits differ (rel err {:.2e})",
                    dir.display(),
                    rel_err(&got, &own)
                );
                let spent = once.fresh_seconds();
                assert!(spent > 0.0, "{} {dtype} {what}: nothing was loaded through the shared store", dir.display());
                match loaded {
                    None => loaded = Some(spent),
                    Some(first) => assert_eq!(spent, first, "{} {dtype} {what}: loaded again", dir.display()),
                }
            }
        }
    }
}

/// Quantization error itself: q8_0 stays close to the f32 logits of the original
/// weights (q4 formats are coarser and not held to this).
#[test]
fn q8_0_logits_stay_close_to_f32() {
    for dir in fixtures() {
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        let caps = || DeviceCaps::Cpu(CpuCaps::detect());
        let f = logits(&dir, caps(), None, DType::F32, Fusion::ALL, m.weights.clone());
        let q = logits(&dir, caps(), None, DType::Q8_0, Fusion::ALL, m.weights.clone());
        // Compare the prompt rows only (greedy continuations may diverge). A mixture
        // of experts may route a token whose top experts are close differently
        // under q8_0 (this prompt's router margins are not the fixture's checked
        // ones): one such row is allowed its jump, every other row is held to 5%.
        let rows: Vec<f64> = (0..PROMPT.len()).map(|i| rel_err(&q[i..i + 1], &f[i..i + 1])).collect();
        let flips = if m.config.moe.is_some() { 1 } else { 0 };
        let over: Vec<usize> = (0..rows.len()).filter(|&i| rows[i] >= 0.05).collect();
        assert!(over.len() <= flips, "{}: q8_0 vs f32 logits rel err by row {rows:.3?}", dir.display());
    }
}

/// `norm_matmul` (decode: the input norm in the Q/K/V GEMVs, the MLP norm in the
/// gate/up GEMVs, the final norm in the LM head) against the same plan without it,
/// every other fusion held fixed: with separate and fused Q/K/V (biases: the qwen2
/// fixture), separate and fused gate/up, with and without the fused residual norm
/// (Gemma 3's extra post-norms stay). Every prompt and decode row compared, in f32,
/// f16 and two block formats, on the CPU and the test GPU, on the [`layouts`]: each
/// pair of layout, dtype and base once (a Latin square, not their whole product).
#[test]
fn norm_matmul_decode_matches_unfused_plan() {
    let gpu = test_gpu();
    let bases = [
        Fusion::NONE,
        Fusion { qkv: true, residual_norm: true, ..Fusion::NONE },
        Fusion { gate_up: true, qk_norm_rope: true, ..Fusion::NONE },
        Fusion { norm_matmul: false, ..Fusion::ALL },
    ];
    let mut failures = Vec::new();
    let mut ran = 0;
    for (l, dir) in layouts().into_iter().enumerate() {
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        for (d, dtype) in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_1].into_iter().enumerate() {
            // A Latin square: each layout meets every dtype and every base, and each
            // dtype every base, once.
            let base = bases[(l + d) % bases.len()];
            let fused = Fusion { norm_matmul: true, ..base };
            let mut devs: Vec<(String, DeviceCaps, Option<Arc<ktune::gpu::GpuCtx>>)> =
                vec![("CPU".into(), DeviceCaps::Cpu(CpuCaps::detect()), None)];
            if let Some(g) = &gpu {
                devs.push((g.name.clone(), DeviceCaps::Gpu(g.caps.clone()), Some(g.clone())));
            }
            for (name, caps, ctx) in devs {
                let want = logits(&dir, caps.clone(), ctx.clone(), dtype, base, m.weights.clone());
                let got = logits(&dir, caps, ctx, dtype, fused, m.weights.clone());
                let e = rel_err(&got, &want);
                ran += 1;
                if e > 1e-4 {
                    failures.push(format!("{} {dtype} {base:?} {name}: norm_matmul rel err {e:.2e}", dir.display()));
                }
            }
        }
    }
    assert!(ran >= 4 * 4, "{ran} comparisons");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The decode plan with `norm_matmul` has no RMSNorm step left that feeds a
/// projection: Llama-style layers keep none, Gemma 3 only its post-attention and
/// post-FF norms (and the q/k norms), those too when `residual_norm` folds them
/// into the next projection's prologue; the fused gate/up is itself a norm-fused
/// projection; prefill is unchanged.
#[test]
fn norm_matmul_removes_the_norms_that_feed_projections() {
    use ktune::plan::{Slot, StepKind};
    for dir in fixtures() {
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        let c = &m.config;
        for base in [Fusion::NONE, Fusion { norm_matmul: false, ..Fusion::ALL }] {
            let plan = |f: Fusion| {
                let opts = PlanOptions::new(DType::F32, 4, 16).with_fusion(f);
                Plan::new("fixture", c, opts, Selection::defaults(DeviceCaps::Cpu(CpuCaps::detect()))).expect("plan")
            };
            let count = |steps: &[ktune::plan::Step], slot: Slot| {
                steps.iter().filter(|s| s.slot == slot && matches!(s.kind, StepKind::Kernel { .. })).count()
            };
            let (off, on) = (plan(base), plan(Fusion { norm_matmul: true, ..base }));
            let (d_off, d_on) = (off.steps(1, 4).expect("steps"), on.steps(1, 4).expect("steps"));
            if !c.pre_norms() {
                // OLMo 2: the projections read the stream itself, no norm to fold.
                let slots = |s: &[ktune::plan::Step]| s.iter().map(|s| s.slot).collect::<Vec<_>>();
                assert_eq!(slots(&d_on), slots(&d_off), "{}: nothing to fold", dir.display());
                assert_eq!(count(&d_on, Slot::NormMatmul), 0, "{}", dir.display());
                continue;
            }
            let gemma = c.architecture == ktune::model::Architecture::Gemma3;
            // A mixture of experts keeps its norm: the router and the experts read the normed row.
            let moe_layers = (0..c.dims.num_layers).filter(|&l| c.moe_layer(l).is_some()).count();
            let kept_norms = if gemma && !base.residual_norm { 2 * c.dims.num_layers } else { 0 }
                // A q/k norm over the whole projection (OLMoE's) is a norm step of its own.
                + if c.qk_norm && (!base.qk_norm_rope || c.qk_norm_projection()) { 2 * c.dims.num_layers } else { 0 }
                + moe_layers;
            let norms = count(&d_on, Slot::Norm) + count(&d_on, Slot::ResidualNorm);
            assert_eq!(norms, kept_norms, "{}: {base:?}", dir.display());
            let (attention, mlp) = (if base.qkv { 1 } else { 3 }, if base.gate_up { 1 } else { 2 });
            let folded = c.dims.num_layers * attention + (c.dims.num_layers - moe_layers) * mlp + on.lm_head.len();
            assert_eq!(count(&d_on, Slot::NormMatmul), folded, "{}: {base:?}", dir.display());
            // Fewer kernels (the fused Q/K/V split is a runtime copy, as in prefill).
            let kernels = |s: &[ktune::plan::Step]| s.iter().filter(|s| matches!(s.kind, StepKind::Kernel { .. })).count();
            assert!(
                kernels(&d_on) < kernels(&d_off),
                "{}: {base:?}: {} kernels fused vs {} unfused",
                dir.display(),
                kernels(&d_on),
                kernels(&d_off)
            );
            let kinds = |p: &Plan| p.steps(4, 0).expect("steps").iter().map(|s| s.slot).collect::<Vec<_>>();
            assert_eq!(kinds(&on), kinds(&off), "{}: prefill must not change", dir.display());
        }
    }
}
