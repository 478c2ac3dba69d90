//! `ktune bench-kernels`: every WGSL family's best variant at a model's real
//! shapes, against the adapter's limits measured in the same run. The limits: the
//! memory bandwidth of a streaming copy kernel (`shaders/bench_copy.wgsl`, bytes
//! read plus written per second over buffers larger than any L2) and the f32
//! peak of an FMA-chain kernel (`shaders/bench_fma.wgsl`). Each (model, shape,
//! dtype) entry races its valid variants (a quick sweep of their parameters, or
//! their defaults with `quick`) through the tuner's measurement ([`Workload`]:
//! rotating input copies past the L2, GPU timestamps), and its winner is checked
//! against the CPU reference on the op's test shapes. Measurement code never
//! prints.

use std::time::{Duration, Instant};

use super::measure::{Cand, Deadline, Rotation, Runner, Strategy, Workload, race};
use super::warm::{FMA_ITERS, FMA_WG, fma_program};
use crate::gpu::builtin::BENCH_COPY as COPY;
use crate::gpu::{GpuCtx, GpuError, GpuProgram, grid_2d};
use crate::kernels::problem::{Activation, RopeLayout, test_problems};
use crate::kernels::verify::{self, check_one};
use crate::kernels::{self, Backend, Caps, DType, KernelDef, Op, Params, Problem};
use crate::model::ModelConfig;
use crate::stats::pick;

#[derive(Debug, thiserror::Error)]
pub enum KBenchError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{0}")]
    Invalid(String),
}

/// The adapter's limits, measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Peaks {
    /// Copy bandwidth: bytes read plus bytes written per second, GB/s.
    pub copy_gbps: f64,
    /// Bytes the copy kernel read (and wrote) per execution.
    pub copy_bytes: u64,
    /// f32 FMA peak, GFLOP/s (an FMA counts 2).
    pub fma_gflops: f64,
}

/// Seconds per execution of `prog` (best of five timings of `reps` back to back):
/// timestamps when the adapter has them, else the wall clock.
fn best_time(ctx: &GpuCtx, prog: &GpuProgram, reps: u32) -> Result<f64, GpuError> {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = match ctx.time_program(prog, reps)? {
            Some(t) => t,
            None => {
                let all: Vec<&GpuProgram> = (0..reps).map(|_| prog).collect();
                let t0 = Instant::now();
                ctx.run("bench limits", &all)?;
                t0.elapsed().as_secs_f64() / reps as f64
            }
        };
        best = best.min(t);
    }
    Ok(best)
}

/// Repetitions that make one timing span about 20 ms, from one execution's time.
fn reps_for(one: f64) -> u32 {
    (0.02 / one.max(1e-7)).ceil().clamp(1.0, 1000.0) as u32
}

/// The copy kernel over `bytes` (at most 256 MiB, and what the adapter binds).
pub fn copy_bandwidth(ctx: &GpuCtx, bytes: u64) -> Result<(f64, u64), GpuError> {
    let limit = ctx.caps.max_storage_binding.min(ctx.caps.max_buffer_size);
    let bytes = bytes.min(limit).max(1 << 16) / 16 * 16;
    let src = ctx.storage("bench copy src", bytes);
    let dst = ctx.storage("bench copy dst", bytes);
    let (wg, vpt) = (256u32, 4u32);
    let pipe = ctx.pipeline(&COPY, "copy", &[("WG", wg as f64), ("VPT", vpt as f64)])?;
    let groups = (bytes / 16).div_ceil((wg * vpt) as u64) as u32;
    let step = ctx.step("bench copy", pipe, &[&src, &dst], grid_2d(groups))?;
    let prog = GpuProgram { steps: vec![step], owned: Vec::new() };
    let one = best_time(ctx, &prog, 1)?;
    let t = best_time(ctx, &prog, reps_for(one))?;
    Ok((2.0 * bytes as f64 / t / 1e9, bytes))
}

/// The FMA-chain kernel, grown until one execution takes at least 5 ms (or the
/// grid is as large as it may be): f32 GFLOP/s.
pub fn fma_peak(ctx: &GpuCtx) -> Result<f64, GpuError> {
    let max_groups = (ctx.caps.max_workgroups_per_dimension as u64 * 64).min(1 << 20) as u32;
    let mut groups = 256u32;
    loop {
        let prog = fma_program(ctx, groups)?;
        let one = best_time(ctx, &prog, 1)?;
        if one >= 0.005 || groups >= max_groups {
            let t = best_time(ctx, &prog, reps_for(one))?;
            let flops = groups as f64 * FMA_WG as f64 * FMA_ITERS as f64 * 64.0;
            return Ok(flops / t / 1e9);
        }
        let grow = (0.006 / one.max(1e-7)).ceil().clamp(2.0, 64.0) as u32;
        groups = groups.saturating_mul(grow).min(max_groups);
    }
}

/// Both limits.
pub fn peaks(ctx: &GpuCtx, copy_bytes: u64) -> Result<Peaks, GpuError> {
    let (copy_gbps, copy_bytes) = copy_bandwidth(ctx, copy_bytes)?;
    Ok(Peaks { copy_gbps, copy_bytes, fma_gflops: fma_peak(ctx)? })
}

/// One shape to benchmark: the model, what the shape is in its pass, the op's
/// problem and the storage type.
#[derive(Clone, Debug)]
pub struct Entry {
    pub model: String,
    /// Where the shape comes from in the pass (`decode gate_up`, `prefill qkv`, ...).
    pub what: &'static str,
    pub problem: Problem,
    pub dtype: DType,
}

/// The shapes of one forward pass of `cfg` worth a row each: decode projections
/// (f16, and the q8_0, q4_0 and q4_k block formats, and the q5_0 and q6_k that published Q4_K_M files
/// mix in; the fused gate+up and qkv too), the prefill GEMM over `tokens`,
/// attention over `tokens` new tokens and one token at `context`, and the norms,
/// RoPE and elementwise ops at `tokens` rows. Every op of the kernel set appears.
pub fn entries(model: &str, cfg: &ModelConfig, tokens: usize, context: usize) -> Vec<Entry> {
    let (h, inter, hd) = (cfg.dims.hidden_size, cfg.dims.intermediate_size, cfg.dims.head_dim);
    let (heads, kv_heads) = (cfg.dims.num_heads, cfg.dims.num_kv_heads);
    let eps = cfg.rms_norm_eps as f32;
    let unit_offset = cfg.norm_unit_offset;
    let act = if cfg.is_gelu() { Activation::GeluTanh } else { Activation::Silu };
    let scale = cfg.attention_scale() as f32;
    let e = |what: &'static str, problem: Problem, dtype: DType| Entry { model: model.to_string(), what, problem, dtype };
    let mut v = vec![
        e("decode gate/up", Problem::Gemv { n: inter, k: h }, DType::F16),
        e("decode gate/up", Problem::Gemv { n: inter, k: h }, DType::Q8_0),
        e("decode gate/up", Problem::Gemv { n: inter, k: h }, DType::Q4_0),
        e("decode gate/up", Problem::Gemv { n: inter, k: h }, DType::Q4_K),
        e("decode gate/up", Problem::Gemv { n: inter, k: h }, DType::Q5_0),
        e("decode down", Problem::Gemv { n: h, k: inter }, DType::F16),
        e("decode down", Problem::Gemv { n: h, k: inter }, DType::Q6_K),
        e("decode gate+up fused", Problem::GateUp { rows: 1, n: inter, k: h, act }, DType::F16),
        e("decode gate+up fused", Problem::GateUp { rows: 1, n: inter, k: h, act }, DType::Q8_0),
        e("decode gate+up fused", Problem::GateUp { rows: 1, n: inter, k: h, act }, DType::Q4_0),
        e("decode gate+up fused", Problem::GateUp { rows: 1, n: inter, k: h, act }, DType::Q4_K),
        e("decode qkv fused", Problem::QkvProj { k: h, nq: heads * hd, nkv: kv_heads * hd, bias: cfg.attention_bias }, DType::F16),
        e("decode qkv fused", Problem::QkvProj { k: h, nq: heads * hd, nkv: kv_heads * hd, bias: cfg.attention_bias }, DType::Q8_0),
        e("decode qkv fused", Problem::QkvProj { k: h, nq: heads * hd, nkv: kv_heads * hd, bias: cfg.attention_bias }, DType::Q4_0),
        e("decode norm+o/qkv", Problem::norm_gemv(heads * hd, h, eps, unit_offset), DType::F16),
        e(
            "decode qkv+rope+cache",
            Problem::QkvRopeCache {
                heads,
                kv_heads,
                head_dim: hd,
                rot_dim: hd,
                pos0: context - 1,
                kv_cap: context,
                layout: RopeLayout::Half,
                norm: cfg.qk_norm_per_head(),
                eps,
                unit_offset,
                gain: DType::F32,
            },
            DType::F16,
        ),
        e("prefill gate/up", Problem::Gemm { m: tokens, n: inter, k: h }, DType::F16),
        e("prefill gate/up", Problem::Gemm { m: tokens, n: inter, k: h }, DType::Q8_0),
        e(
            "prefill attention",
            Problem::AttentionPrefill {
                tokens,
                kv_len: tokens,
                kv_cap: tokens,
                heads,
                kv_heads,
                head_dim: hd,
                window: 0,
                scale,
                bidi_start: 0,
                bidi_end: 0,
            },
            DType::F16,
        ),
        e(
            "decode attention",
            Problem::AttentionDecode { kv_len: context, kv_cap: context, heads, kv_heads, head_dim: hd, window: 0, scale },
            DType::F16,
        ),
        // A server's decode batch: eight sequences' tokens over one paged cache
        // (the runtime's blocks), their lengths up to the context (`verify::paged_layout`).
        e(
            "batch decode attention (8 paged)",
            Problem::attention_paged(
                (8, 8),
                (heads, kv_heads, hd),
                (crate::runtime::KV_PAGE, 8 * context.div_ceil(crate::runtime::KV_PAGE), context.div_ceil(crate::runtime::KV_PAGE)),
                0,
                scale,
            ),
            DType::F16,
        ),
        e("prefill rms_norm", Problem::RmsNorm { rows: tokens, dim: h, eps, unit_offset }, DType::F32),
        e("prefill residual+norm", Problem::ResidualRmsNorm { rows: tokens, dim: h, eps, unit_offset }, DType::F32),
        e("prefill layer_norm", Problem::LayerNorm { rows: tokens, dim: h, eps }, DType::F32),
        e("prefill residual+layer_norm", Problem::ResidualLayerNorm { rows: tokens, dim: h, eps }, DType::F32),
        e("prefill rope q", Problem::Rope { tokens, heads, head_dim: hd, rot_dim: hd, pos0: 0, layout: RopeLayout::Half }, DType::F32),
        e(
            "prefill q norm+rope",
            Problem::QkNormRope { tokens, heads, head_dim: hd, rot_dim: hd, pos0: 0, layout: RopeLayout::Half, eps, unit_offset },
            DType::F32,
        ),
        e("prefill gated act", Problem::GatedAct { rows: tokens, dim: inter, act }, DType::F32),
        e("prefill residual", Problem::ResidualAdd { n: tokens * h }, DType::F32),
        e("decode logits softmax", Problem::Softmax { rows: 1, dim: cfg.dims.vocab_size }, DType::F32),
    ];
    v.retain(|x| x.problem.op() != Op::QkNormRope || cfg.qk_norm_per_head());
    if let Some(m) = &cfg.moe {
        let (experts, top_k, ff) = (m.experts, m.top_k, m.expert_ff);
        let gate_up = |rows| Problem::MoeGateUp { rows, experts, top_k, n: ff, k: h, act };
        v.extend([
            e("decode router", Problem::Gemv { n: experts, k: h }, DType::F32),
            e("decode router top-k", Problem::MoeRoute { rows: 1, experts, top_k, norm: m.norm_top_k }, DType::F32),
            e("decode experts gate/up", gate_up(1), DType::Q4_K),
            e("decode experts down", Problem::MoeDown { rows: 1, experts, top_k, n: h, k: ff }, DType::Q6_K),
            e("prefill router top-k", Problem::MoeRoute { rows: tokens, experts, top_k, norm: m.norm_top_k }, DType::F32),
            e("prefill experts gate/up", gate_up(tokens), DType::Q4_K),
            e("prefill experts down", Problem::MoeDown { rows: tokens, experts, top_k, n: h, k: ff }, DType::Q6_K),
        ]);
    }
    v
}

/// How an entry's race runs.
#[derive(Clone, Debug)]
pub struct RaceOptions {
    /// Only each kernel's default parameters (else the parity sweep's sets: the
    /// defaults and each parameter through its values).
    pub quick: bool,
    pub rotation: Rotation,
    pub seed: u64,
    /// Only these kernel ids race (all of the op's WGSL kernels when empty).
    pub only: Vec<&'static str>,
}

/// An entry's best variant.
#[derive(Clone, Debug)]
pub struct Best {
    pub kernel: &'static KernelDef,
    pub params: Params,
    /// Median seconds per execution.
    pub median_s: f64,
    /// Variants raced (valid on the shape and the device).
    pub candidates: usize,
    /// Input copies the executions rotated through.
    pub copies: usize,
    /// The winner's parity check on the op's test shapes (None: it passed).
    pub failed_check: Option<String>,
    pub timestamps: bool,
    /// Every variant with a time (the winner included), fastest first: label
    /// and median seconds.
    pub all: Vec<(String, f64)>,
}

/// The candidates of `entry` on this adapter, in the order they are prepared:
/// every kernel's first valid set (its defaults when valid) first, then the rest
/// of each kernel's sweep taken in turns, so a short budget still races every
/// kernel.
fn candidates(ctx: &GpuCtx, entry: &Entry, quick: bool, only: &[&str]) -> Vec<Cand> {
    let caps = Caps::Gpu(&ctx.caps);
    let per_kernel: Vec<Vec<Cand>> = kernels::for_op(entry.problem.op())
        .filter(|k| k.backend() == Backend::Wgsl && k.dtypes.contains(&entry.dtype))
        .filter(|k| only.is_empty() || only.contains(&k.id))
        .map(|k| {
            let sets = if quick { vec![k.default_params()] } else { verify::param_sweep(k, false) };
            let mut valid: Vec<Params> = Vec::new();
            for params in sets {
                if k.check(caps, &entry.problem, entry.dtype, &params).is_ok() && !valid.contains(&params) {
                    valid.push(params);
                }
            }
            valid.into_iter().map(|params| Cand { kernel: k, params }).collect()
        })
        .collect();
    let longest = per_kernel.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest).flat_map(|i| per_kernel.iter().filter_map(move |c| c.get(i).cloned())).collect()
}

/// Races the valid variants of `entry` until `deadline` and checks the winner.
/// `Ok(None)` when no WGSL variant accepts the shape on this adapter; an error
/// when every variant failed to build or run (the first failure).
pub fn best_variant(ctx: &std::sync::Arc<GpuCtx>, entry: &Entry, o: &RaceOptions, deadline: Instant) -> Result<Option<Best>, String> {
    let cands = candidates(ctx, entry, o.quick, &o.only);
    if cands.is_empty() {
        return Ok(None);
    }
    let rotate = usize::try_from(o.rotation.rotate_bytes).unwrap_or(usize::MAX);
    let w = Workload::new(vec![(entry.problem.clone(), 1)], entry.dtype, Some(ctx.clone()), o.seed, rotate);
    // Each kernel's first set is prepared (and timed) whatever the time; further
    // sets only while the entry's share lasts.
    let kernels_n = cands.iter().map(|c| c.kernel.id).collect::<std::collections::BTreeSet<_>>().len();
    let mut runners: Vec<Runner> = Vec::new();
    for (i, c) in cands.into_iter().enumerate() {
        if i >= kernels_n && Instant::now() > deadline {
            break;
        }
        runners.push(Runner::new(c, &w));
    }
    race(&mut runners, &w, Strategy::Auto, Deadline::soft(deadline), o.seed, 0, |_| {});
    let stats: Vec<_> = runners.iter().map(|r| if r.error.is_some() { Default::default() } else { r.stats() }).collect();
    let finalists: Vec<_> =
        runners.iter().zip(&stats).map(|(r, s)| if r.dropped.is_some() { Default::default() } else { s.clone() }).collect();
    let Some(i) = pick(&finalists, 0.01).or_else(|| pick(&stats, 0.01)) else {
        let first = runners.iter().find_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.cand.kernel.label(&r.cand.params))));
        return Err(format!("every variant failed while timing ({})", first.unwrap_or_else(|| "no sample".into())));
    };
    let r = &runners[i];
    let mut all: Vec<(String, f64)> = runners
        .iter()
        .zip(&stats)
        .filter(|(r, s)| r.error.is_none() && s.n > 0 && s.median.is_finite())
        .map(|(r, s)| (kernels::variant_label(r.cand.kernel.id, &r.cand.params), s.median))
        .collect();
    all.sort_by(|a, b| a.1.total_cmp(&b.1));
    let failed_check = test_problems(entry.problem.op())
        .into_iter()
        .filter(|p| r.cand.kernel.check(Caps::Gpu(&ctx.caps), p, entry.dtype, &r.cand.params).is_ok())
        .take(2)
        .map(|p| check_one(&verify::Runner::Gpu(ctx), r.cand.kernel, &p, entry.dtype, &r.cand.params, o.seed))
        .find(|c| !c.passed)
        .map(|c| match c.error {
            Some(e) => format!("{}: {e}", c.problem),
            None => format!("{}: relative error {:.2e} > {:.0e}", c.problem, c.rel_err, c.tolerance),
        });
    Ok(Some(Best {
        kernel: r.cand.kernel,
        params: r.cand.params.clone(),
        median_s: stats[i].median,
        candidates: runners.len(),
        copies: w.copies(0),
        failed_check,
        timestamps: r.timestamps,
        all,
    }))
}

/// Time left per entry when `left` is shared by `entries` (at least 50 ms each).
pub fn share(left: Duration, entries: usize) -> Duration {
    (left / entries.max(1) as u32).max(Duration::from_millis(50))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op of the kernel set has a shape in a Gemma 3 pass, and the shapes
    /// are the model's (hidden 1152, intermediate 6912, head_dim 256).
    #[test]
    fn gemma_entries_cover_every_op_at_its_shapes() {
        let cfg = crate::model::builtin("gemma3-1b").expect("built in");
        let e = entries("gemma3-1b", &cfg, 64, 512);
        // The entries are a text pass's: the vision tower's ops (issue 16) are
        // not in one, and bench-kernels does not measure them yet.
        let vision = [Op::PatchEmbed, Op::Linear, Op::AttentionFull, Op::AvgPool];
        // A mixture of experts' ops are a MoE model's (Qwen3-30B-A3B's, below).
        let moe = [Op::MoeRoute, Op::MoeGateUp, Op::MoeDown];
        for op in Op::ALL.into_iter().filter(|op| op.has_wgsl() && !vision.contains(op) && !moe.contains(op)) {
            assert!(e.iter().any(|x| x.problem.op() == op), "{op} has no entry");
        }
        assert!(!e.iter().any(|x| moe.contains(&x.problem.op())), "gemma3-1b has no experts");
        let qwen = crate::model::builtin("qwen3-30b-a3b").expect("built in");
        let q = entries("qwen3-30b-a3b", &qwen, 64, 512);
        for op in moe {
            assert!(q.iter().any(|x| x.problem.op() == op), "{op} has no entry for qwen3-30b-a3b");
        }
        assert!(
            q.iter().any(|x| x.problem == Problem::MoeGateUp { rows: 1, experts: 128, top_k: 8, n: 768, k: 2048, act: Activation::Silu })
        );
        assert!(e.iter().any(|x| x.problem == Problem::Gemv { n: 6912, k: 1152 } && x.dtype == DType::Q4_0));
        assert!(e.iter().any(|x| matches!(x.problem, Problem::AttentionDecode { kv_len: 512, head_dim: 256, .. })));
        let llama = crate::model::builtin("llama-3.2-1b").expect("built in");
        assert!(!entries("llama-3.2-1b", &llama, 64, 512).iter().any(|x| x.problem.op() == Op::QkNormRope), "llama has no q/k norm");
    }

    /// The limit kernels on the test GPU: positive figures, and a copy that
    /// really copies.
    #[test]
    fn limit_kernels_measure_and_copy() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let p = peaks(&gpu, 1 << 20).expect("measures");
        assert!(p.copy_gbps > 0.0 && p.fma_gflops > 0.0 && p.copy_bytes == 1 << 20, "{p:?}");
        let data: Vec<u32> = (0..4096u32).map(|i| i.wrapping_mul(2654435761)).collect();
        let src = gpu.upload("src", bytemuck::cast_slice(&data));
        let dst = gpu.storage("dst", 4096 * 4);
        let pipe = gpu.pipeline(&COPY, "copy", &[("WG", 64.0), ("VPT", 2.0)]).expect("pipeline");
        let step = gpu.step("copy", pipe, &[&src, &dst], grid_2d(8)).expect("step");
        gpu.run("copy", &[&GpuProgram { steps: vec![step], owned: Vec::new() }]).expect("runs");
        let back: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu.read(&dst, 4096 * 4).expect("reads"));
        assert_eq!(back, data);
    }

    /// A sweep lists every kernel once before any kernel's second set, and only
    /// sets valid on the shape; `quick` keeps the first of each.
    #[test]
    fn sweeps_take_every_kernel_before_any_second_set() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let e = Entry { model: "m".into(), what: "decode", problem: Problem::Gemv { n: 256, k: 512 }, dtype: DType::F16 };
        let all = candidates(&gpu, &e, false, &[]);
        let quick = candidates(&gpu, &e, true, &[]);
        let kernels: std::collections::BTreeSet<_> = all.iter().map(|c| c.kernel.id).collect();
        assert!(kernels.len() >= 2 && all.len() > kernels.len(), "{} sets of {} kernels", all.len(), kernels.len());
        let first: std::collections::BTreeSet<_> = all[..kernels.len()].iter().map(|c| c.kernel.id).collect();
        assert_eq!(first, kernels, "a kernel's second set came before another kernel's first");
        assert!(all.iter().all(|c| c.kernel.check(Caps::Gpu(&gpu.caps), &e.problem, e.dtype, &c.params).is_ok()));
        assert!(quick.len() <= kernels.len() && quick.iter().all(|c| c.params == c.kernel.default_params()));
        let one = *kernels.iter().next().expect("a kernel");
        let only = candidates(&gpu, &e, false, &[one]);
        assert!(!only.is_empty() && only.iter().all(|c| c.kernel.id == one), "--kernel {one} raced others");
    }
}
