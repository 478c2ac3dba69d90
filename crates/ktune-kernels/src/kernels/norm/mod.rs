//! The norm family: RMSNorm (`rms_norm`, with Gemma's `x * (1 + w)` unit offset)
//! and LayerNorm (`layer_norm`), weights in f32 or f16, here; the fused residual add
//! + RMSNorm and residual add + LayerNorm in [`residual`].
//!
//! WGSL: `rms_norm_wg` (one workgroup per row, workgroup-memory tree reduction, any
//! dim), `rms_norm_subgroup` (one subgroup per row, `subgroupAdd`, several rows per
//! workgroup, no barriers), `rms_norm_vec4` (16-byte loads, the row held in
//! registers so x is read once); `layer_norm_wg` (single-read Welford statistics
//! merged pairwise in workgroup memory) and `layer_norm_subgroup` (exact two-pass
//! mean / centred variance per subgroup).
//! CPU: SIMD microkernels (AVX-512 / AVX2+F16C / portable, see
//! [`super::cpu::lanes`]) under two orchestrators: rows split over pool
//! tasks (`*_rows_cpu`, prefill) and one row's features split over tasks with the
//! partial statistics combined between phases (`*_split_cpu`, decode).

pub mod residual;

use super::contract::{CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use super::cpu::dot::{with_row, with_row_pair};
use super::cpu::{Elem, Isa, Lanes, ROWS_PARAMS, Row, RowSplit, SPLIT_PARAMS, check_isa, isa_dispatch, par_rows, pool};
use super::problem::{Op, Problem};
use super::quant::DType;
use super::wgsl::{grid_fits, one_wg_per_row, shared_wg, subgroup_fits, subgroup_per_row};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static RMS_WG: Shader =
    shader!("norm_rms_wg.wgsl", "norm_rms.wgsl", "rms_rows.wgsl", "row_wg.wgsl", "reduce_wg.wgsl", "rms.wgsl", "wload.wgsl");
static RMS_SG: Shader =
    shader!("norm_rms_subgroup.wgsl", "norm_rms.wgsl", "rms_rows.wgsl", "row_sg.wgsl", "reduce_sg.wgsl", "rms.wgsl", "wload.wgsl");
static RMS_VEC4: Shader = shader!("norm_rms_vec4.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static LN_WG: Shader =
    shader!(head "affine_head.wgsl"; "norm_layer_wg.wgsl", "norm_layer.wgsl", "layer_write.wgsl", "row_wg.wgsl", "wload.wgsl");
static LN_SG: Shader = shader!(head "affine_head.wgsl"; "norm_layer_subgroup.wgsl", "norm_layer.wgsl", "layer_write.wgsl", "row_sg.wgsl", "reduce_sg.wgsl", "wload.wgsl");

const WG_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("workgroup_size", &[32, 64, 128, 256, 512], 128, "invocations per row (one workgroup per row)")];

const SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "rows per workgroup, one subgroup each" },
];

const VEC4_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[64, 128, 256, 512], default: 128, help: "invocations per row (one workgroup per row)" },
    ParamSpec {
        name: "vec_per_thread",
        values: &[1, 2, 4, 8],
        default: 4,
        help: "vec4s of the row each invocation holds in registers (row capacity 4 * workgroup_size * vec_per_thread)",
    },
];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "rms_norm_wg",
            Op::RmsNorm,
            DType::FLOAT,
            WG_PARAMS,
            "one workgroup per row, scalar strided loads, workgroup-memory tree reduction; any dim",
            WgslImpl::new(&RMS_WG, prepare_wg).shared(shared_wg).check(check_rows_wg),
        ),
        KernelDef::new(
            "rms_norm_subgroup",
            Op::RmsNorm,
            DType::FLOAT,
            SG_PARAMS,
            "one subgroup per row, subgroupAdd reduction, rows_per_wg rows per workgroup, no barriers; any dim",
            WgslImpl::new(&RMS_SG, prepare_sg).subgroups().check(check_rows_sg),
        ),
        KernelDef::new(
            "rms_norm_vec4",
            Op::RmsNorm,
            DType::FLOAT,
            VEC4_PARAMS,
            "16-byte loads, row held in registers (x read once), workgroup reduction; dim % 4 == 0 and dim <= 4*wg*vpt",
            WgslImpl::new(&RMS_VEC4, prepare_rms_vec4).shared(shared_wg).check(check_rms_vec4),
        ),
        KernelDef::new(
            "rms_norm_rows_cpu",
            Op::RmsNorm,
            DType::FLOAT,
            ROWS_PARAMS,
            "SIMD sum-of-squares and scale microkernels per row; pool over rows (prefill)",
            CpuImpl { run: run_rms_rows, check: check_isa },
        ),
        KernelDef::new(
            "rms_norm_split_cpu",
            Op::RmsNorm,
            DType::FLOAT,
            SPLIT_PARAMS,
            "each row's features split over pool tasks: parallel partial sums of squares, then a parallel scale (decode)",
            CpuImpl { run: run_rms_split, check: check_isa },
        ),
        KernelDef::new(
            "layer_norm_wg",
            Op::LayerNorm,
            DType::FLOAT,
            WG_PARAMS,
            "one workgroup per row, single-read Welford statistics merged pairwise (Chan) in workgroup memory; any dim",
            WgslImpl::new(&LN_WG, prepare_wg).shared(shared_welford).check(check_rows_wg),
        ),
        KernelDef::new(
            "layer_norm_subgroup",
            Op::LayerNorm,
            DType::FLOAT,
            SG_PARAMS,
            "one subgroup per row, exact two-pass mean and centred variance with subgroupAdd, no barriers; any dim",
            WgslImpl::new(&LN_SG, prepare_sg).subgroups().check(check_rows_sg),
        ),
        KernelDef::new(
            "layer_norm_rows_cpu",
            Op::LayerNorm,
            DType::FLOAT,
            ROWS_PARAMS,
            "SIMD two-pass mean / centred variance and affine microkernels per row; pool over rows (prefill)",
            CpuImpl { run: run_ln_rows, check: check_isa },
        ),
        KernelDef::new(
            "layer_norm_split_cpu",
            Op::LayerNorm,
            DType::FLOAT,
            SPLIT_PARAMS,
            "each row's features split over pool tasks: parallel sum, parallel centred squares, parallel affine (decode)",
            CpuImpl { run: run_ln_split, check: check_isa },
        ),
    ]
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

/// Welford triples (count, mean, M2) per invocation.
pub(super) fn shared_welford(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(12 * param(params, "workgroup_size")? as u64)
}

fn rows_dim(prob: &Problem) -> (usize, usize) {
    match *prob {
        Problem::RmsNorm { rows, dim, .. } | Problem::LayerNorm { rows, dim, .. } | Problem::ResidualLayerNorm { rows, dim, .. } => {
            (rows, dim)
        }
        _ => (0, 0),
    }
}

pub(super) fn check_rows_wg(caps: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    grid_fits(caps, rows_dim(prob).0, "one per row")
}

pub(super) fn check_rows_sg(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    grid_fits(caps, groups(rows_dim(prob).0, param(params, "rows_per_wg")?) as usize, "one per rows_per_wg rows")
}

fn check_rms_vec4(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let (rows, dim) = rows_dim(prob);
    if dim % 4 != 0 {
        return Err(format!("dim = {dim} is not a multiple of 4 (x and y are read as vec4<f32>)"));
    }
    let cap = 4 * param(params, "workgroup_size")? as usize * param(params, "vec_per_thread")? as usize;
    if dim > cap {
        return Err(format!("dim = {dim} does not fit the registers of one workgroup (4 * workgroup_size * vec_per_thread = {cap})"));
    }
    grid_fits(caps, rows, "one per row")
}

/// The uniform block of an RMSNorm or residual RMSNorm (`rows, dim, eps,
/// unit_offset`) or LayerNorm or residual LayerNorm (`rows, dim, eps`) problem, and
/// its row count.
fn norm_uniform(s: &WgslSetup<'_>) -> Result<(usize, Vec<u32>), KernelError> {
    match *s.problem {
        Problem::RmsNorm { rows, dim, eps, unit_offset } | Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } => {
            Ok((rows, vec![rows as u32, dim as u32, eps.to_bits(), unit_offset as u32]))
        }
        Problem::LayerNorm { rows, dim, eps } | Problem::ResidualLayerNorm { rows, dim, eps } => {
            Ok((rows, vec![rows as u32, dim as u32, eps.to_bits()]))
        }
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

/// One prepare for the one-workgroup-per-row shaders (`rms_norm_wg`, `layer_norm_wg`,
/// `residual_rms_norm_wg`, `residual_layer_norm_wg`).
pub(super) fn prepare_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = norm_uniform(s)?;
    one_wg_per_row(s, rows, &u)
}

/// One prepare for the subgroup-per-row shaders (`rms_norm_subgroup`,
/// `layer_norm_subgroup`, `residual_rms_norm_subgroup`, `residual_layer_norm_subgroup`).
pub(super) fn prepare_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = norm_uniform(s)?;
    subgroup_per_row(s, rows, &u, "rows_per_wg")
}

fn prepare_rms_vec4(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = norm_uniform(s)?;
    let consts = [("WG", s.param("workgroup_size")? as f64), ("VPT", s.param("vec_per_thread")? as f64), ("W_F16", s.w_f16())];
    s.one_step("main", &consts, &u, grid_2d(rows as u32))
}

// ---------------------------------------------------------------------------------
// CPU microkernels (generic over the lane width, see `cpu::lanes`)
// ---------------------------------------------------------------------------------

/// `Σ f(x)` with four independent vector accumulators.
#[inline(always)]
fn reduce4<L: Lanes>(l: L, x: &[f32], f: impl Fn(L::V) -> L::V, fs: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [l.splat(0.0); 4];
    let mut quads = x.chunks_exact(4 * L::N);
    for q in &mut quads {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = l.add(*a, f(l.load(&q[k * L::N..])));
        }
    }
    let mut rest = quads.remainder().chunks_exact(L::N);
    for c in &mut rest {
        acc[0] = l.add(acc[0], f(l.load(c)));
    }
    let s = l.hsum(l.add(l.add(acc[0], acc[1]), l.add(acc[2], acc[3])));
    rest.remainder().iter().fold(s, |a, &v| a + fs(v))
}

#[inline(always)]
fn sumsq_k<L: Lanes>(l: L, x: &[f32]) -> f32 {
    reduce4(l, x, |v| l.mul(v, v), |v| v * v)
}

#[inline(always)]
fn sum_k<L: Lanes>(l: L, x: &[f32]) -> f32 {
    reduce4(l, x, |v| v, |v| v)
}

/// `h = x + r`, returning `Σ h` (the residual add and the mean's sum in one pass).
#[inline(always)]
fn add_sum_k<L: Lanes>(l: L, x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
    let n = h.len();
    let (x, r) = (&x[..n], &r[..n]);
    let mut acc = [l.splat(0.0); 2];
    let mut hs = h.chunks_exact_mut(L::N);
    for (i, ((hc, xc), rc)) in (&mut hs).zip(x.chunks_exact(L::N)).zip(r.chunks_exact(L::N)).enumerate() {
        let v = l.add(l.load(xc), l.load(rc));
        l.store(hc, v);
        acc[i & 1] = l.add(acc[i & 1], v);
    }
    let mut s = l.hsum(l.add(acc[0], acc[1]));
    let t = n - n % L::N;
    for (i, o) in hs.into_remainder().iter_mut().enumerate() {
        *o = x[t + i] + r[t + i];
        s += *o;
    }
    s
}

/// `Σ (x - mean)²`.
#[inline(always)]
fn sqdev_k<L: Lanes>(l: L, x: &[f32], mean: f32) -> f32 {
    let mv = l.splat(mean);
    reduce4(
        l,
        x,
        |v| {
            let t = l.sub(v, mv);
            l.mul(t, t)
        },
        |v| (v - mean) * (v - mean),
    )
}

/// `y = x * inv * (w + off)` (RMSNorm apply; `off` = 1 for Gemma's unit offset).
#[inline(always)]
fn rms_apply_k<L: Lanes, W: Elem>(l: L, x: &[f32], w: &[W], off: f32, inv: f32, y: &mut [f32]) {
    let n = y.len();
    let (x, w) = (&x[..n], &w[..n]);
    let (ov, iv) = (l.splat(off), l.splat(inv));
    let mut ys = y.chunks_exact_mut(L::N);
    for ((yc, xc), wc) in (&mut ys).zip(x.chunks_exact(L::N)).zip(w.chunks_exact(L::N)) {
        let g = l.add(W::load(l, wc), ov);
        l.store(yc, l.mul(l.mul(l.load(xc), iv), g));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = x[t + i] * inv * (w[t + i].f32() + off);
    }
}

/// `y = (x - mean) * rs * w + b` (LayerNorm apply).
#[inline(always)]
fn ln_apply_k<L: Lanes, W: Elem>(l: L, x: &[f32], w: &[W], b: &[W], mean: f32, rs: f32, y: &mut [f32]) {
    let n = y.len();
    let (x, w, b) = (&x[..n], &w[..n], &b[..n]);
    let (mv, rv) = (l.splat(mean), l.splat(rs));
    let mut ys = y.chunks_exact_mut(L::N);
    for (((yc, xc), wc), bc) in (&mut ys).zip(x.chunks_exact(L::N)).zip(w.chunks_exact(L::N)).zip(b.chunks_exact(L::N)) {
        let t = l.mul(l.sub(l.load(xc), mv), rv);
        l.store(yc, l.fma(t, W::load(l, wc), W::load(l, bc)));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = (x[t + i] - mean) * rs * w[t + i].f32() + b[t + i].f32();
    }
}

/// RMSNorm of consecutive rows `x` (row length `dim`) into `y`.
#[inline(always)]
fn rms_rows_k<L: Lanes, W: Elem>(l: L, x: &[f32], w: &[W], dim: usize, eps: f32, off: f32, y: &mut [f32]) {
    for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let inv = 1.0 / (sumsq_k(l, xr) / dim as f32 + eps).sqrt();
        rms_apply_k(l, xr, w, off, inv, yr);
    }
}

/// LayerNorm of consecutive rows: two-pass mean and centred variance, then affine.
#[inline(always)]
fn ln_rows_k<L: Lanes, W: Elem>(l: L, x: &[f32], w: &[W], b: &[W], dim: usize, eps: f32, y: &mut [f32]) {
    for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let mean = sum_k(l, xr) / dim as f32;
        let rs = 1.0 / (sqdev_k(l, xr, mean) / dim as f32 + eps).sqrt();
        ln_apply_k(l, xr, w, b, mean, rs, yr);
    }
}

// Dispatchers: one `#[target_feature]` entry per call, over whole row ranges.

#[allow(clippy::too_many_arguments)]
fn rms_rows(isa: Isa, x: &[f32], w: Row<'_>, dim: usize, eps: f32, off: f32, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: Row<'_> = w, dim: usize = dim, eps: f32 = eps, off: f32 = off, y: &mut [f32] = y) -> () {
        with_row!(w, |w| rms_rows_k(l, x, w, dim, eps, off, y))
    })
}

fn ln_rows(isa: Isa, x: &[f32], w: Row<'_>, b: Row<'_>, dim: usize, eps: f32, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: Row<'_> = w, b: Row<'_> = b, dim: usize = dim, eps: f32 = eps, y: &mut [f32] = y) -> () {
        with_row_pair!(w, b, |w, b| ln_rows_k(l, x, w, b, dim, eps, y))
    })
}

fn sumsq(isa: Isa, x: &[f32]) -> f32 {
    isa_dispatch!(isa, |l| (x: &[f32] = x) -> f32 { sumsq_k(l, x) })
}

fn sum(isa: Isa, x: &[f32]) -> f32 {
    isa_dispatch!(isa, |l| (x: &[f32] = x) -> f32 { sum_k(l, x) })
}

/// `h = x + r` over `h.len()` elements, returning `Σ h`.
pub(super) fn add_sum(isa: Isa, x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
    isa_dispatch!(isa, |l| (x: &[f32] = x, r: &[f32] = r, h: &mut [f32] = h) -> f32 { add_sum_k(l, x, r, h) })
}

pub(super) fn sqdev(isa: Isa, x: &[f32], mean: f32) -> f32 {
    isa_dispatch!(isa, |l| (x: &[f32] = x, mean: f32 = mean) -> f32 { sqdev_k(l, x, mean) })
}

fn rms_apply(isa: Isa, x: &[f32], w: Row<'_>, off: f32, inv: f32, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: Row<'_> = w, off: f32 = off, inv: f32 = inv, y: &mut [f32] = y) -> () {
        with_row!(w, |w| rms_apply_k(l, x, w, off, inv, y))
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn ln_apply(isa: Isa, x: &[f32], w: Row<'_>, b: Row<'_>, mean: f32, rs: f32, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: Row<'_> = w, b: Row<'_> = b, mean: f32 = mean, rs: f32 = rs, y: &mut [f32] = y) -> () {
        with_row_pair!(w, b, |w, b| ln_apply_k(l, x, w, b, mean, rs, y))
    })
}

// ---------------------------------------------------------------------------------
// CPU kernels
// ---------------------------------------------------------------------------------

/// The norm gain `w` (or `1 + w`, Gemma) widened to f32 once per call.
pub fn gains(w: CpuIn<'_>, dim: usize, unit_offset: bool) -> super::cpu::Scratch {
    let off = if unit_offset { 1.0 } else { 0.0 };
    // Matched once, not per element (`CpuIn::get`: a hundredth of a SmolLM2
    // 8-sequence pass's time, on the engine's thread alone).
    let mut g = super::cpu::Scratch::zeroed(dim);
    match w {
        CpuIn::F32(s) => g.iter_mut().zip(&s[..dim]).for_each(|(d, &v)| *d = v + off),
        CpuIn::F16(s) => g.iter_mut().zip(&s[..dim]).for_each(|(d, v)| *d = v.to_f32() + off),
        other => g.iter_mut().enumerate().for_each(|(i, d)| *d = other.get(i) + off),
    }
    g
}

/// `1 / sqrt(mean + eps)` from a sum of squares over `dim` elements.
#[inline]
pub fn inv_rms(ss: f32, dim: usize, eps: f32) -> f32 {
    1.0 / (ss / dim as f32 + eps).sqrt()
}

/// Elements `c0 .. c0 + len` of a weight vector.
pub(super) fn part(w: CpuIn<'_>, c0: usize, len: usize) -> Row<'_> {
    match w {
        CpuIn::F32(s) => Row::F32(&s[c0..c0 + len]),
        CpuIn::F16(s) => Row::F16(&s[c0..c0 + len]),
        // Norm gains are never quantized: the registry checks dtypes.
        CpuIn::Q(_) | CpuIn::Stack(_) => Row::F32(&[]),
    }
}

fn run_rms_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::RmsNorm { rows, dim, eps, unit_offset } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let off = if unit_offset { 1.0 } else { 0.0 };
    let (x, w) = (a.ins[0].f32(), part(a.ins[1], 0, dim));
    par_rows(&mut a.outs[0][..rows * dim], dim, RowSplit::of(params)?, |first, y| rms_rows(isa, &x[first * dim..], w, dim, eps, off, y));
    Ok(())
}

fn run_rms_split(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::RmsNorm { rows, dim, eps, unit_offset } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let chunk = (param(params, "chunk")? as usize).max(1);
    let off = if unit_offset { 1.0 } else { 0.0 };
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    for (r, y) in a.outs[0][..rows * dim].chunks_mut(dim.max(1)).enumerate() {
        let xr = &x[r * dim..][..dim];
        let ss: f32 = pool::sum_chunks(xr, chunk, |c| sumsq(isa, c));
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        pool::for_chunks_mut(y, chunk, |i, yc| {
            let c0 = i * chunk;
            rms_apply(isa, &xr[c0..], part(w, c0, yc.len()), off, inv, yc)
        });
    }
    Ok(())
}

fn run_ln_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::LayerNorm { rows, dim, eps } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w, b) = (a.ins[0].f32(), part(a.ins[1], 0, dim), part(a.ins[2], 0, dim));
    par_rows(&mut a.outs[0][..rows * dim], dim, RowSplit::of(params)?, |first, y| ln_rows(isa, &x[first * dim..], w, b, dim, eps, y));
    Ok(())
}

fn run_ln_split(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::LayerNorm { rows, dim, eps } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let chunk = (param(params, "chunk")? as usize).max(1);
    let (x, w, b) = (a.ins[0].f32(), a.ins[1], a.ins[2]);
    for (r, y) in a.outs[0][..rows * dim].chunks_mut(dim.max(1)).enumerate() {
        let xr = &x[r * dim..][..dim];
        let mean = pool::sum_chunks(xr, chunk, |c| sum(isa, c)) / dim as f32;
        let var = pool::sum_chunks(xr, chunk, |c| sqdev(isa, c, mean)) / dim as f32;
        let rs = 1.0 / (var + eps).sqrt();
        pool::for_chunks_mut(y, chunk, |i, yc| {
            let c0 = i * chunk;
            ln_apply(isa, &xr[c0..], part(w, c0, yc.len()), part(b, c0, yc.len()), mean, rs, yc)
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn microkernels_agree_with_f64_on_every_isa() {
        for n in [1, 7, 8, 31, 32, 33, 64, 65, 577, 1152] {
            // a large common offset: the centred variance must not cancel
            let x: Vec<f32> = (0..n).map(|i| 100.0 + ((i * 37 % 101) as f32 / 50.0 - 1.0)).collect();
            let wf: Vec<f32> = (0..n).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
            let wh: Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let dev: f64 = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum();
            for isa in [Isa::Scalar, Isa::from_param(2), Isa::best()] {
                assert!((sumsq(isa, &x) as f64 - ss).abs() < 1e-6 * ss, "sumsq {isa:?} n={n}");
                assert!((sum(isa, &x) as f64 / n as f64 - mean).abs() < 1e-5, "sum {isa:?} n={n}");
                assert!((sqdev(isa, &x, mean as f32) as f64 - dev).abs() < 1e-3 * dev.max(1.0), "sqdev {isa:?} n={n}");
                let r: Vec<f32> = x.iter().map(|v| 0.5 - v / 400.0).collect();
                let mut hsum = vec![0f32; n];
                let s = add_sum(isa, &x, &r, &mut hsum);
                let want: f64 = x.iter().zip(&r).map(|(a, b)| (a + b) as f64).sum();
                assert!((s as f64 - want).abs() < 1e-5 * want.abs().max(1.0), "add_sum {isa:?} n={n}");
                assert!(hsum.iter().zip(x.iter().zip(&r)).all(|(h, (a, b))| *h == a + b), "add_sum h {isa:?} n={n}");
                for w in [Row::F32(&wf), Row::F16(&wh)] {
                    let mut y = vec![0f32; n];
                    rms_apply(isa, &x, w, 1.0, 0.5, &mut y);
                    for i in 0..n {
                        let g = match w {
                            Row::F32(s) => s[i],
                            Row::F16(s) => s[i].to_f32(),
                            Row::Q8(s) => crate::kernels::cpu::Elems::get(s, i),
                        };
                        assert!((y[i] - x[i] * 0.5 * (g + 1.0)).abs() < 1e-4, "rms_apply {isa:?} n={n}");
                    }
                    ln_apply(isa, &x, w, w, 100.0, 2.0, &mut y);
                    for i in 0..n {
                        let g = match w {
                            Row::F32(s) => s[i],
                            Row::F16(s) => s[i].to_f32(),
                            Row::Q8(s) => crate::kernels::cpu::Elems::get(s, i),
                        };
                        assert!((y[i] - ((x[i] - 100.0) * 2.0 * g + g)).abs() < 1e-4, "ln_apply {isa:?} n={n}");
                    }
                }
            }
        }
    }
}
