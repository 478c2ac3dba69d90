//! The vision family: the ops of a SigLIP vision tower and Gemma 3's multimodal
//! projector that the decoder families do not cover. The tower's LayerNorms are
//! `layer_norm` ([`super::norm`]), its residual adds `residual_add`, the
//! projector's `(1 + w)` RMSNorm `rms_norm` and its projection `gemm`.
//!
//! CPU:
//! - `patch_embed` (the conv with kernel = stride = patch): `patch_embed_im2col_cpu`
//!   lays the patches out as rows (im2col) and runs the blocked GEMM of
//!   [`super::matmul::gemm_blocked`] over them; `patch_embed_direct_cpu` reads each
//!   patch's pixel runs straight from the image (one SIMD dot per run of `patch`
//!   pixels and output feature), no patch matrix.
//! - `linear` (Linear with bias, GELU-tanh fused into the epilogue for fc1):
//!   `linear_blocked_cpu` (the blocked GEMM, then bias and activation per row) and
//!   `linear_dot_cpu` (one SIMD dot per output element, rows over the pool).
//! - `attention_full` (bidirectional attention over the patch sequence):
//!   `attention_full_rows_cpu` (exact two-pass softmax per query and head) and
//!   `attention_full_tiled_cpu` (flash style: key blocks with an online softmax).
//! - `avg_pool` (the projector's pool to `mm_tokens_per_image`):
//!   `avg_pool_window_cpu` (each output sums its window) and
//!   `avg_pool_separable_cpu` (pool along x into a row of partial sums, then along y).
//!
//!
//! WGSL: [`wgsl`] (`patch_embed_im2col`, `patch_embed_direct`, `linear_tiled`,
//! `linear_simple`, `attention_full_rows`, `attention_full_flash`,
//! `avg_pool_window`, `avg_pool_separable`).

use super::cpu::{ISA, Isa, Row, RowSplit, axpy, check_isa, dot, par_rows, row, with_scratch};
use super::matmul::{BLOCKED_PARAMS, Blocking, Micro, Split, gemm_blocked};
use super::{CpuArgs, CpuImpl, CpuIn, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, param, wrong_op};
use crate::device::CpuCaps;
use std::cell::RefCell;

pub mod wgsl;

const F32: &[DType] = &[DType::F32];

/// Rows per pool task and the `isa` level (row-wise kernels).
const ROW_TASK_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "output rows (patches, tokens) per pool task" },
    ISA,
];

const ATTN_ROWS_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "queries_per_task", values: &[1, 2, 4, 8, 16], default: 4, help: "queries (all heads) per pool task" }, ISA];

const ATTN_TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "queries_per_task", values: &[1, 2, 4, 8, 16], default: 4, help: "queries (all heads) per pool task" },
    ParamSpec { name: "block_k", values: &[16, 32, 64, 128, 256], default: 64, help: "keys per block of the online softmax" },
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

/// `y[r, j] = act(y[r, j] + b[j])` over rows of `n`.
fn bias_act(y: &mut [f32], b: CpuIn<'_>, n: usize, gelu: bool) {
    par_rows(y, n, RowSplit::Dynamic(16), |_, rows| {
        for yr in rows.chunks_mut(n) {
            for (j, v) in yr.iter_mut().enumerate() {
                let s = *v + b.get(j);
                *v = if gelu { gelu_tanh(s) } else { s };
            }
        }
    });
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`), in f32.
#[inline]
fn gelu_tanh(x: f32) -> f32 {
    super::cpu::act_f32(super::Activation::GeluTanh, x)
}

thread_local! {
    /// The im2col patch matrix of the calling thread.
    static PATCHES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-task scores of the attention kernels.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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
    bias_act(y, b, hidden, false);
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
    bias_act(y, a.ins[2], n, gelu);
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

fn run_attn_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (t, heads, d, scale) = attn_dims(kd, prob)?;
    let isa = Isa::of(params)?;
    let (q, k, v) = (a.ins[0].f32(), a.ins[1].f32(), a.ins[2].f32());
    let split = RowSplit::Dynamic((param(params, "queries_per_task")? as usize).max(1));
    let width = heads * d;
    par_rows(&mut a.outs[0][..t * width], width, split, |first, rows| {
        with_scratch(&SCORES, t, |s| {
            for (i, orow) in rows.chunks_mut(width).enumerate() {
                let qi = first + i;
                for h in 0..heads {
                    let qv = &q[(qi * heads + h) * d..][..d];
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
                    let o = &mut orow[h * d..][..d];
                    o.fill(0.0);
                    for (j, sj) in s.iter().enumerate() {
                        axpy(isa, *sj / z, &v[(j * heads + h) * d..][..d], o);
                    }
                }
            }
        })
    });
    Ok(())
}

fn run_attn_tiled(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (t, heads, d, scale) = attn_dims(kd, prob)?;
    let isa = Isa::of(params)?;
    let bk = (param(params, "block_k")? as usize).max(1);
    let (q, k, v) = (a.ins[0].f32(), a.ins[1].f32(), a.ins[2].f32());
    let split = RowSplit::Dynamic((param(params, "queries_per_task")? as usize).max(1));
    let width = heads * d;
    par_rows(&mut a.outs[0][..t * width], width, split, |first, rows| {
        with_scratch(&SCORES, bk, |s| {
            for (i, orow) in rows.chunks_mut(width).enumerate() {
                let qi = first + i;
                for h in 0..heads {
                    let qv = &q[(qi * heads + h) * d..][..d];
                    let o = &mut orow[h * d..][..d];
                    o.fill(0.0);
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
                }
            }
        })
    });
    Ok(())
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
