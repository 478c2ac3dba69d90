//! The vision family: the ops of a SigLIP vision tower and Gemma 3's multimodal
//! projector that the decoder families do not cover. The tower's LayerNorms are
//! `layer_norm` ([`super::norm`]), its residual adds `residual_add`, the
//! projector's `(1 + w)` RMSNorm `rms_norm` and its projection `gemm`.
//!
//! CPU:
//! - `patch_embed` (the conv with kernel = stride = patch): `patch_embed_im2col_cpu`
//!   lays the patches out as rows (im2col) and runs the blocked GEMM of
//!   [`super::cpu::sgemm::gemm_blocked`] over them; `patch_embed_direct_cpu` reads each
//!   patch's pixel runs straight from the image (one SIMD dot per run of `patch`
//!   pixels and output feature), no patch matrix.
//! - `linear` (Linear with bias, GELU-tanh fused into the epilogue for fc1):
//!   `linear_blocked_cpu` (the blocked GEMM, then bias and activation per row) and
//!   `linear_dot_cpu` (one SIMD dot per output element, rows over the pool).
//! - `attention_full` (bidirectional attention over the patch sequence):
//!   `attention_full_rows_cpu` (exact two-pass softmax per query and head) and
//!   `attention_full_tiled_cpu` (flash style: key blocks with an online softmax),
//!   both one query and head at a time, and `attention_full_flash_cpu`: flash
//!   attention on the packed-GEMM microkernel ([`super::cpu::sgemm::Micro`]): per head
//!   and panel of NR queries, a block of keys' scores as MR-key x NR-query tiles,
//!   the online softmax across the panel's queries in SIMD lanes, the values
//!   accumulated as `Oᵀ += Vᵀ·P` by the same microkernel (K and V packed once per
//!   call into its panels).
//! - `avg_pool` (the projector's pool to `mm_tokens_per_image`):
//!   `avg_pool_window_cpu` (each output sums its window) and
//!   `avg_pool_separable_cpu` (pool along x into a row of partial sums, then along y).
//!
//!
//! WGSL: [`wgsl`] (`patch_embed_im2col`, `patch_embed_direct`, `linear_tiled`,
//! `linear_simple`, `attention_full_rows`, `attention_full_flash`,
//! `avg_pool_window`, `avg_pool_separable`).

use super::contract::{CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, param, wrong_op};
use super::cpu::lanes::{self, Lanes, isa_dispatch};
use super::cpu::sgemm::{Blocking, Micro, Split, gemm_blocked};
use super::cpu::{ISA, Isa, Row, RowSplit, axpy, check_isa, dot, par_rows, pool, row, with_scratch};
use super::matmul::BLOCKED_PARAMS;
use super::problem::{Op, Problem};
use super::quant::DType;
use crate::device::CpuCaps;
use std::cell::RefCell;

pub mod wgsl;

const F32: &[DType] = &[DType::F32];

/// Rows per pool task and the `isa` level (row-wise kernels).
const ROW_TASK_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "output rows (patches, tokens) per pool task" },
    ISA,
];

const QUERIES_PER_TASK: ParamSpec =
    ParamSpec { name: "queries_per_task", values: &[1, 2, 4, 8, 16], default: 4, help: "queries (all heads) per pool task" };

const ATTN_ROWS_PARAMS: &[ParamSpec] = &[QUERIES_PER_TASK, ISA];

const ATTN_TILED_PARAMS: &[ParamSpec] = &[
    QUERIES_PER_TASK,
    ParamSpec { name: "block_k", values: &[16, 32, 64, 128, 256], default: 64, help: "keys per block of the online softmax" },
    ISA,
];

const ATTN_FLASH_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "block_k",
        values: &[64, 128, 256, 512, 1024],
        default: 256,
        help: "keys per block of the online softmax (rounded up to the microkernel's rows)",
    },
    ISA,
];

const POOL_PARAMS: &[ParamSpec] = &[ParamSpec {
    name: "rows_per_task",
    values: &[1, 2, 4, 8, 16],
    default: 2,
    help: "output tokens (or output grid rows) per pool task",
}];

pub fn variants() -> Vec<KernelDef> {
    let mut v = cpu_variants();
    v.extend(wgsl::variants());
    v
}

fn cpu_variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "patch_embed_im2col_cpu",
            Op::PatchEmbed,
            DType::FLOAT,
            BLOCKED_PARAMS,
            "im2col: patches laid out as rows, then the blocked GEMM with the conv weight, bias added per row",
            CpuImpl { run: run_patch_im2col, check: check_patch },
        ),
        KernelDef::new(
            "patch_embed_direct_cpu",
            Op::PatchEmbed,
            DType::FLOAT,
            ROW_TASK_PARAMS,
            "direct conv: each patch's runs of `patch` pixels dotted with the weight rows in place (SIMD), patches over the pool",
            CpuImpl { run: run_patch_direct, check: check_patch },
        ),
        KernelDef::new(
            "linear_blocked_cpu",
            Op::Linear,
            DType::FLOAT,
            BLOCKED_PARAMS,
            "the blocked GEMM, then bias and GELU-tanh (when asked) over each output row",
            CpuImpl { run: run_linear_blocked, check: check_isa },
        ),
        KernelDef::new(
            "linear_dot_cpu",
            Op::Linear,
            DType::FLOAT,
            ROW_TASK_PARAMS,
            "one SIMD dot per output element with bias and GELU-tanh in its epilogue; rows of x over the pool",
            CpuImpl { run: run_linear_dot, check: check_isa },
        ),
        KernelDef::new(
            "attention_full_flash_cpu",
            Op::AttentionFull,
            F32,
            ATTN_FLASH_PARAMS,
            "bidirectional flash attention on the GEMM microkernel: per head and NR queries, MR x NR score tiles per block of keys, \
             online softmax across the queries' lanes, O^T += V^T P; K/V packed once; (head, query panel) tasks over the pool",
            CpuImpl { run: run_attn_flash, check: check_isa },
        ),
        KernelDef::new(
            "attention_full_rows_cpu",
            Op::AttentionFull,
            F32,
            ATTN_ROWS_PARAMS,
            "bidirectional: per query and head all scores (SIMD dots), exact max / exp / sum, weighted sum of values (axpy)",
            CpuImpl { run: run_attn_rows, check: check_isa },
        ),
        KernelDef::new(
            "attention_full_tiled_cpu",
            Op::AttentionFull,
            F32,
            ATTN_TILED_PARAMS,
            "bidirectional, flash style: keys in blocks of block_k with an online softmax (running max and sum, rescaled output)",
            CpuImpl { run: run_attn_tiled, check: check_isa },
        ),
        KernelDef::new(
            "avg_pool_window_cpu",
            Op::AvgPool,
            F32,
            POOL_PARAMS,
            "each output token sums its kernel x kernel window of input rows, then scales; output tokens over the pool",
            CpuImpl { run: run_pool_window, check: check_pool },
        ),
        KernelDef::new(
            "avg_pool_separable_cpu",
            Op::AvgPool,
            F32,
            POOL_PARAMS,
            "separable: each output grid row pools its kernel input rows along y into a row of sums, then along x; grid rows over the pool",
            CpuImpl { run: run_pool_separable, check: check_pool },
        ),
    ]
}

// ---------------------------------------------------------------------------------
// Validity
// ---------------------------------------------------------------------------------

fn check_patch_shape(prob: &Problem) -> Result<(), String> {
    if let Problem::PatchEmbed { image, patch, .. } = *prob
        && (patch == 0 || !image.is_multiple_of(patch))
    {
        return Err(format!("image side {image} is not a whole number of {patch}-pixel patches"));
    }
    Ok(())
}

fn check_patch(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_patch_shape(prob)?;
    check_isa(caps, prob, dtype, params)
}

fn check_pool(_: &CpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    if let Problem::AvgPool { side, kernel, .. } = *prob
        && (kernel == 0 || !side.is_multiple_of(kernel))
    {
        return Err(format!("a grid of side {side} is not a whole number of {kernel}-wide windows"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

fn blocking(params: &Params) -> Result<(Micro, Blocking, Split), KernelError> {
    let micro = Micro::for_isa(Isa::of(params)?);
    let blk = Blocking { mc: param(params, "mc")? as usize, nc: param(params, "nc")? as usize, kc: param(params, "kc")? as usize };
    Ok((micro, blk, Split::from_param(param(params, "split")?)))
}

/// `y[r, j] = act(y[r, j] + b[j])` over rows of `n`, in SIMD lanes of `isa`
/// (GELU-tanh as `s * sigmoid(2z)` with the vector exp, as `gated_act` computes it).
fn bias_act(isa: Isa, y: &mut [f32], b: CpuIn<'_>, n: usize, gelu: bool) {
    let wide: Vec<f32>;
    let b: &[f32] = match b {
        CpuIn::F32(s) => &s[..n],
        _ => {
            wide = (0..n).map(|j| b.get(j)).collect();
            &wide
        }
    };
    par_rows(y, n, RowSplit::Dynamic(16), |_, rows| {
        for yr in rows.chunks_mut(n) {
            isa_dispatch!(isa, |l| (y: &mut [f32] = yr, b: &[f32] = b, gelu: bool = gelu) -> () { bias_act_k(l, y, b, gelu) })
        }
    });
}

/// `2 sqrt(2 / pi)`: GELU-tanh's `0.5 (1 + tanh(z)) = sigmoid(2z)`.
const GELU_K: f32 = 1.595_769;

#[inline(always)]
fn bias_act_k<L: Lanes>(l: L, y: &mut [f32], b: &[f32], gelu: bool) {
    let n = y.len();
    let vn = n - n % L::N;
    for c in (0..vn).step_by(L::N) {
        let s = l.add(l.load(&y[c..]), l.load(&b[c..]));
        let v = if gelu {
            let arg = l.mul(l.mul(s, l.splat(GELU_K)), l.fma(l.mul(s, s), l.splat(0.044715), l.splat(1.0)));
            l.div(s, l.add(l.splat(1.0), lanes::exp(l, l.sub(l.splat(0.0), arg))))
        } else {
            s
        };
        l.store(&mut y[c..], v);
    }
    for j in vn..n {
        let s = y[j] + b[j];
        y[j] = if gelu { gelu_tanh(s) } else { s };
    }
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`), in f32.
#[inline]
fn gelu_tanh(x: f32) -> f32 {
    super::cpu::act_f32(super::problem::Activation::GeluTanh, x)
}

thread_local! {
    /// The im2col patch matrix of the calling thread.
    static PATCHES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-task scores of the attention kernels.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// K and V of every head packed into microkernel panels (the calling thread).
    static ATTN_PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The flash kernel's output, head-major (the calling thread).
    static ATTN_HEADS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// One flash task's query panel, scores, Oᵀ, running maxima and sums.
    static ATTN_TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-task row of sums of the separable pool.
    static POOL_ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

// ---------------------------------------------------------------------------------
// patch_embed
// ---------------------------------------------------------------------------------

fn patch_dims(kd: &KernelDef, prob: &Problem) -> Result<(usize, usize, usize, usize, usize), KernelError> {
    let Problem::PatchEmbed { channels, image, patch, hidden } = *prob else { return Err(wrong_op(kd, prob)) };
    if patch == 0 || !image.is_multiple_of(patch) {
        return Err(KernelError::Invalid { kernel: kd.id.into(), reason: format!("image {image} is not whole {patch}-pixel patches") });
    }
    Ok((channels, image, patch, hidden, image / patch))
}

fn run_patch_im2col(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (channels, image, patch, hidden, side) = patch_dims(kd, prob)?;
    let (micro, blk, split) = blocking(params)?;
    let kk = channels * patch * patch;
    let patches = side * side;
    let px = a.ins[0].f32();
    let (w, b) = (a.ins[1], a.ins[2]);
    let y = &mut a.outs[0][..patches * hidden];
    with_scratch(&PATCHES, patches * kk, |cols| {
        // Row p of the patch matrix: channel-major, then ky, then kx (the conv
        // weight's flattening).
        for (p, dst) in cols.chunks_mut(kk.max(1)).enumerate() {
            let (py, pxx) = (p / side, p % side);
            for c in 0..channels {
                for ky in 0..patch {
                    let src = (c * image + py * patch + ky) * image + pxx * patch;
                    dst[(c * patch + ky) * patch..][..patch].copy_from_slice(&px[src..src + patch]);
                }
            }
        }
        gemm_blocked(micro, blk, split, patches, hidden, kk, cols, w, y);
    });
    bias_act(Isa::of(params)?, y, b, hidden, false);
    Ok(())
}

fn run_patch_direct(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (channels, image, patch, hidden, side) = patch_dims(kd, prob)?;
    let isa = Isa::of(params)?;
    let kk = channels * patch * patch;
    let px = a.ins[0].f32();
    let (w, b) = (a.ins[1], a.ins[2]);
    par_rows(&mut a.outs[0][..side * side * hidden], hidden, RowSplit::dynamic(params)?, |first, rows| {
        for (i, yr) in rows.chunks_mut(hidden).enumerate() {
            let p = first + i;
            let (py, pxx) = (p / side, p % side);
            for (j, v) in yr.iter_mut().enumerate() {
                let mut acc = b.get(j);
                for c in 0..channels {
                    for ky in 0..patch {
                        let src = (c * image + py * patch + ky) * image + pxx * patch;
                        let c0 = (c * patch + ky) * patch;
                        acc += dot(isa, &px[src..src + patch], super::cpu::sub_row(w, j, kk, c0, c0 + patch));
                    }
                }
                *v = acc;
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------
// linear
// ---------------------------------------------------------------------------------

fn run_linear_blocked(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Linear { m, n, k, gelu } = *prob else { return Err(wrong_op(kd, prob)) };
    let (micro, blk, split) = blocking(params)?;
    let y = &mut a.outs[0][..m * n];
    gemm_blocked(micro, blk, split, m, n, k, &a.ins[0].f32()[..m * k], a.ins[1], y);
    bias_act(Isa::of(params)?, y, a.ins[2], n, gelu);
    Ok(())
}

fn run_linear_dot(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Linear { m, n, k, gelu } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w, b) = (a.ins[0].f32(), a.ins[1], a.ins[2]);
    par_rows(&mut a.outs[0][..m * n], n, RowSplit::dynamic(params)?, |first, rows| {
        for (i, yr) in rows.chunks_mut(n).enumerate() {
            let xr = &x[(first + i) * k..][..k];
            for (j, v) in yr.iter_mut().enumerate() {
                let s = dot(isa, xr, row(w, j, k)) + b.get(j);
                *v = if gelu { gelu_tanh(s) } else { s };
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------
// attention_full
// ---------------------------------------------------------------------------------

fn attn_dims(kd: &KernelDef, prob: &Problem) -> Result<(usize, usize, usize, f32), KernelError> {
    let Problem::AttentionFull { tokens, heads, head_dim, scale } = *prob else { return Err(wrong_op(kd, prob)) };
    Ok((tokens, heads, head_dim, scale))
}

/// The query loop of the row kernels: `queries_per_task` queries a pool task, and
/// per query and head `head(s, qv, h, o)`, with `qv` the query's head `h` (of
/// `q[t, heads, d]`), `o` its output row in `out`, zeroed, and `s` a scratch of
/// `scratch` scores.
fn per_query_head(
    params: &Params,
    (t, heads, d): (usize, usize, usize),
    q: &[f32],
    out: &mut [f32],
    scratch: usize,
    head: impl Fn(&mut [f32], &[f32], usize, &mut [f32]) + Sync + Send,
) -> Result<(), KernelError> {
    let split = RowSplit::Dynamic((param(params, "queries_per_task")? as usize).max(1));
    let width = heads * d;
    par_rows(&mut out[..t * width], width, split, |first, rows| {
        with_scratch(&SCORES, scratch, |s| {
            for (i, orow) in rows.chunks_mut(width).enumerate() {
                for h in 0..heads {
                    let qv = &q[((first + i) * heads + h) * d..][..d];
                    let o = &mut orow[h * d..][..d];
                    o.fill(0.0);
                    head(s, qv, h, o);
                }
            }
        })
    });
    Ok(())
}

fn run_attn_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (t, heads, d, scale) = attn_dims(kd, prob)?;
    let isa = Isa::of(params)?;
    let (q, k, v) = (a.ins[0].f32(), a.ins[1].f32(), a.ins[2].f32());
    per_query_head(params, (t, heads, d), q, a.outs[0], t, |s, qv, h, o| {
        let mut m = f32::NEG_INFINITY;
        for (j, sj) in s.iter_mut().enumerate() {
            *sj = dot(isa, qv, Row::F32(&k[(j * heads + h) * d..][..d])) * scale;
            m = m.max(*sj);
        }
        let mut z = 0.0;
        for sj in s.iter_mut() {
            *sj = (*sj - m).exp();
            z += *sj;
        }
        for (j, sj) in s.iter().enumerate() {
            axpy(isa, *sj / z, &v[(j * heads + h) * d..][..d], o);
        }
    })
}

fn run_attn_tiled(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (t, heads, d, scale) = attn_dims(kd, prob)?;
    let isa = Isa::of(params)?;
    let bk = (param(params, "block_k")? as usize).max(1);
    let (q, k, v) = (a.ins[0].f32(), a.ins[1].f32(), a.ins[2].f32());
    per_query_head(params, (t, heads, d), q, a.outs[0], bk, |s, qv, h, o| {
        let (mut m, mut z) = (f32::NEG_INFINITY, 0.0f32);
        for j0 in (0..t).step_by(bk) {
            let n = bk.min(t - j0);
            let mut bm = f32::NEG_INFINITY;
            for (jj, sj) in s[..n].iter_mut().enumerate() {
                *sj = dot(isa, qv, Row::F32(&k[((j0 + jj) * heads + h) * d..][..d])) * scale;
                bm = bm.max(*sj);
            }
            let m_new = m.max(bm);
            // Rescale what was accumulated under the old maximum.
            let r = (m - m_new).exp();
            if r != 1.0 {
                z *= r;
                o.iter_mut().for_each(|x| *x *= r);
            }
            for (jj, sj) in s[..n].iter().enumerate() {
                let p = (*sj - m_new).exp();
                z += p;
                axpy(isa, p, &v[((j0 + jj) * heads + h) * d..][..d], o);
            }
            m = m_new;
        }
        let inv = 1.0 / z;
        o.iter_mut().for_each(|x| *x *= inv);
    })
}

/// Widest query panel (the microkernels' NR).
const MAX_NR: usize = 64;

fn run_attn_flash(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (t, heads, d, scale) = attn_dims(kd, prob)?;
    let isa = Isa::of(params)?;
    let micro = Micro::for_isa(isa);
    let (mr, nr) = (micro.mr(), micro.nr());
    let bk = (param(params, "block_k")? as usize).max(1).next_multiple_of(mr);
    let width = heads * d;
    let out = &mut a.outs[0][..t * width];
    if out.is_empty() {
        return Ok(());
    }
    debug_assert!(nr <= MAX_NR);
    let (q, k, v) = (a.ins[0].f32(), a.ins[1].f32(), a.ins[2].f32());
    let (kpanels, dpanels, qpanels) = (t.div_ceil(mr), d.div_ceil(mr), t.div_ceil(nr));
    // Per head: K as MR-key panels over depth d (`[p][i] = K[key s*MR + i, p]`), and
    // V as MR-dimension panels over the keys (`[j][i] = V[j, dim g*MR + i]`), zero
    // past the last key / dimension: the A panels of the score and value tiles.
    let (k_len, v_len) = (kpanels * mr * d, dpanels * t * mr);
    with_scratch(&ATTN_PACK, heads * (k_len + v_len), |pack| {
        let (kp, vp) = pack.split_at_mut(heads * k_len);
        pool::for_chunks_mut(kp, mr * d, |c, panel| {
            let (h, s) = (c / kpanels, c % kpanels);
            for i in 0..mr {
                let key = s * mr + i;
                let src = (key < t).then(|| &k[key * width + h * d..][..d]);
                for p in 0..d {
                    panel[p * mr + i] = src.map_or(0.0, |r| r[p]);
                }
            }
        });
        pool::for_chunks_mut(vp, t * mr, |c, panel| {
            let (h, g) = (c / dpanels, c % dpanels);
            let c0 = g * mr;
            let cols = mr.min(d - c0);
            for (j, dst) in panel.chunks_exact_mut(mr).enumerate() {
                dst[..cols].copy_from_slice(&v[j * width + h * d + c0..][..cols]);
                dst[cols..].fill(0.0);
            }
        });
        let (kp, vp): (&[f32], &[f32]) = (kp, vp);
        let dp = dpanels * mr;
        // The output head-major, NR-query panels padded: `[head][query][d]`; one
        // task per (head, query panel), heads outermost so the threads share a
        // head's K/V in cache.
        with_scratch(&ATTN_HEADS, heads * qpanels * nr * d, |hout| {
            pool::for_chunks_mut(hout, nr * d, |c, chunk| {
                let (h, b) = (c / qpanels, c % qpanels);
                let (q0, kh, vh) = (b * nr, &kp[h * k_len..][..k_len], &vp[h * v_len..][..v_len]);
                with_scratch(&ATTN_TILE, d * nr + bk * nr + dp * nr + 2 * nr, |sc| {
                    let (qp, rest) = sc.split_at_mut(d * nr);
                    let (s, rest) = rest.split_at_mut(bk * nr);
                    let (ot, rest) = rest.split_at_mut(dp * nr);
                    let (mx, sum) = rest.split_at_mut(nr);
                    // The query panel, scaled: `[p][j] = scale * Q[q0 + j, p]`.
                    for j in 0..nr {
                        let src = (q0 + j < t).then(|| &q[(q0 + j) * width + h * d..][..d]);
                        for p in 0..d {
                            qp[p * nr + j] = src.map_or(0.0, |r| r[p] * scale);
                        }
                    }
                    let mut j0 = 0;
                    while j0 < t {
                        let nk = bk.min(t - j0);
                        // Scores: MR keys x NR queries per tile, key-major.
                        for (i, sp) in (j0 / mr..(j0 + nk).div_ceil(mr)).enumerate() {
                            // SAFETY: the K panel holds d*MR floats, the query panel
                            // d*NR; tile i is rows i*MR.. of `s` (bk >= (i+1)*MR rows of NR).
                            unsafe { micro.run(d, &kh[sp * mr * d..][..mr * d], qp, s.as_mut_ptr().add(i * mr * nr), nr, false) };
                        }
                        let first = j0 == 0;
                        let s = &mut s[..nk * nr];
                        online_softmax(isa, s, nr, mx, sum, ot, first);
                        // Oᵀ (+)= Vᵀ·P over this block's keys.
                        for g in 0..dpanels {
                            // SAFETY: the V panel slice holds nk*MR floats, P nk*NR;
                            // rows g*MR.. of Oᵀ are MR rows of NR floats.
                            unsafe { micro.run(nk, &vh[(g * t + j0) * mr..][..nk * mr], s, ot.as_mut_ptr().add(g * mr * nr), nr, !first) };
                        }
                        j0 += nk;
                    }
                    for (j, o) in chunk.chunks_exact_mut(d).enumerate() {
                        let inv = 1.0 / sum[j];
                        for (p, x) in o.iter_mut().enumerate() {
                            *x = ot[p * nr + j] * inv;
                        }
                    }
                });
            });
            // Head-major panels to `[query][head * d]`.
            let hout: &[f32] = hout;
            par_rows(out, width, RowSplit::Dynamic(64), |first, rows| {
                for (i, orow) in rows.chunks_mut(width).enumerate() {
                    for (h, o) in orow.chunks_exact_mut(d).enumerate() {
                        o.copy_from_slice(&hout[(h * qpanels * nr + first + i) * d..][..d]);
                    }
                }
            });
        });
    });
    Ok(())
}

/// One block of the online softmax over key-major scores `s` (`[key][nr]`, one
/// query per lane): the running maxima `mx` and sums `sum` updated, Oᵀ's rows
/// (`ot`, `[dim][nr]`) rescaled to the new maxima, `s` turned into `exp(s - max)`.
/// On the `first` block the state starts from it (`ot` is then overwritten).
fn online_softmax(isa: Isa, s: &mut [f32], nr: usize, mx: &mut [f32], sum: &mut [f32], ot: &mut [f32], first: bool) {
    isa_dispatch!(isa, |l| (s: &mut [f32] = s, nr: usize = nr, mx: &mut [f32] = mx, sum: &mut [f32] = sum, ot: &mut [f32] = ot, first: bool = first) -> () {
        online_softmax_k(l, s, nr, mx, sum, ot, first)
    })
}

#[inline(always)]
fn online_softmax_k<L: Lanes>(l: L, s: &mut [f32], nr: usize, mx: &mut [f32], sum: &mut [f32], ot: &mut [f32], first: bool) {
    let mut bm = [f32::NEG_INFINITY; MAX_NR];
    let bm = &mut bm[..nr];
    // Lanes in whole vectors, the rest (none for the microkernels' NR) one by one.
    let vn = nr - nr % L::N;
    for row in s.chunks_exact(nr) {
        for c in (0..vn).step_by(L::N) {
            let v = l.max(l.load(&bm[c..]), l.load(&row[c..]));
            l.store(&mut bm[c..], v);
        }
        for c in vn..nr {
            bm[c] = bm[c].max(row[c]);
        }
    }
    if first {
        mx.copy_from_slice(bm);
        sum.fill(0.0);
    } else {
        let mut r = [0f32; MAX_NR];
        let r = &mut r[..nr];
        for c in (0..vn).step_by(L::N) {
            let (old, new) = (l.load(&mx[c..]), l.max(l.load(&mx[c..]), l.load(&bm[c..])));
            let f = lanes::exp(l, l.sub(old, new));
            l.store(&mut r[c..], f);
            l.store(&mut mx[c..], new);
            let v = l.mul(l.load(&sum[c..]), f);
            l.store(&mut sum[c..], v);
        }
        for c in vn..nr {
            let new = mx[c].max(bm[c]);
            r[c] = (mx[c] - new).exp();
            mx[c] = new;
            sum[c] *= r[c];
        }
        for row in ot.chunks_exact_mut(nr) {
            for c in (0..vn).step_by(L::N) {
                let v = l.mul(l.load(&row[c..]), l.load(&r[c..]));
                l.store(&mut row[c..], v);
            }
            for c in vn..nr {
                row[c] *= r[c];
            }
        }
    }
    for row in s.chunks_exact_mut(nr) {
        for c in (0..vn).step_by(L::N) {
            let e = lanes::exp(l, l.sub(l.load(&row[c..]), l.load(&mx[c..])));
            l.store(&mut row[c..], e);
            let v = l.add(l.load(&sum[c..]), e);
            l.store(&mut sum[c..], v);
        }
        for c in vn..nr {
            let e = (row[c] - mx[c]).exp();
            row[c] = e;
            sum[c] += e;
        }
    }
}

// ---------------------------------------------------------------------------------
// avg_pool
// ---------------------------------------------------------------------------------

fn pool_dims(kd: &KernelDef, prob: &Problem) -> Result<(usize, usize, usize, usize), KernelError> {
    let Problem::AvgPool { side, kernel, dim } = *prob else { return Err(wrong_op(kd, prob)) };
    if kernel == 0 || !side.is_multiple_of(kernel) {
        return Err(KernelError::Invalid { kernel: kd.id.into(), reason: format!("grid {side} is not whole {kernel}-wide windows") });
    }
    Ok((side, kernel, dim, side / kernel))
}

fn run_pool_window(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (side, kernel, dim, out) = pool_dims(kd, prob)?;
    let x = a.ins[0].f32();
    let inv = 1.0 / (kernel * kernel) as f32;
    par_rows(&mut a.outs[0][..out * out * dim], dim, RowSplit::dynamic(params)?, |first, rows| {
        for (i, yr) in rows.chunks_mut(dim.max(1)).enumerate() {
            let (oy, ox) = ((first + i) / out, (first + i) % out);
            yr.fill(0.0);
            for ky in 0..kernel {
                for kx in 0..kernel {
                    let src = &x[((oy * kernel + ky) * side + ox * kernel + kx) * dim..][..dim];
                    yr.iter_mut().zip(src).for_each(|(a, b)| *a += b);
                }
            }
            yr.iter_mut().for_each(|v| *v *= inv);
        }
    });
    Ok(())
}

fn run_pool_separable(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (side, kernel, dim, out) = pool_dims(kd, prob)?;
    let x = a.ins[0].f32();
    let inv = 1.0 / (kernel * kernel) as f32;
    // One task per `rows_per_task` output grid rows (each `out * dim` floats).
    par_rows(&mut a.outs[0][..out * out * dim], out * dim, RowSplit::dynamic(params)?, |first, grid_rows| {
        with_scratch(&POOL_ROW, side * dim, |sums| {
            for (i, yrow) in grid_rows.chunks_mut((out * dim).max(1)).enumerate() {
                let oy = first + i;
                // Along y: the kernel input rows of this output row summed per column.
                sums.copy_from_slice(&x[oy * kernel * side * dim..][..side * dim]);
                for ky in 1..kernel {
                    let src = &x[(oy * kernel + ky) * side * dim..][..side * dim];
                    sums.iter_mut().zip(src).for_each(|(a, b)| *a += b);
                }
                // Along x.
                for (ox, y) in yrow.chunks_mut(dim.max(1)).enumerate() {
                    y.copy_from_slice(&sums[ox * kernel * dim..][..dim]);
                    for kx in 1..kernel {
                        y.iter_mut().zip(&sums[(ox * kernel + kx) * dim..][..dim]).for_each(|(a, b)| *a += b);
                    }
                    y.iter_mut().for_each(|v| *v *= inv);
                }
            }
        })
    });
    Ok(())
}
