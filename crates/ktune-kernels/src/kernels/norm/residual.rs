//! Residual add + RMSNorm in one pass (`residual_rms_norm`): `h = x + r` written
//! and `y = rms_norm(h)` from the same read, the norm that follows every residual
//! add of a decoder layer; and residual add + LayerNorm with bias
//! (`residual_layer_norm`), the same for a SigLIP encoder layer (the vision
//! tower's `h = x + attn_out; LN2(h)`, and the next layer's LN1 or the post
//! LayerNorm after the MLP's residual). Part of the norm family (its output is a norm).
//!
//! WGSL: `residual_rms_norm_wg` (one workgroup per row: h written and h² accumulated
//! in one pass, workgroup reduction, scale pass), `residual_rms_norm_subgroup` (one
//! subgroup per row). CPU: `residual_rms_norm_rows_cpu` (pool over rows, prefill)
//! and `residual_rms_norm_split_cpu` (pool over chunks of each row, decode), both on
//! the fused add + sum-of-squares and scale microkernels of [`cpu::dot`].
//!
//! LayerNorm: `residual_layer_norm_wg` (h written with single-read Welford
//! statistics, merged pairwise in workgroup memory), `residual_layer_norm_subgroup`
//! (one subgroup per row: h written with its sum, then the exact centred
//! variance from the h it wrote). CPU: `residual_layer_norm_rows_cpu` (pool over
//! rows: fused add + sum, centred squares, affine, per row in cache) and
//! `residual_layer_norm_split_cpu` (pool over chunks of each row, each phase in
//! parallel), on the norm family's SIMD microkernels.

use super::{add_sum, check_rows_sg, check_rows_wg, gains, inv_rms, ln_apply, part, prepare_sg, prepare_wg, shared_welford, sqdev};
use crate::device::GpuCaps;
use crate::gpu::Shader;
use crate::kernels::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, outs, param, wrong_op};
use crate::kernels::cpu::{self, ISA, Isa, ROWS_PARAMS, RowSplit, check_isa};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{WORKGROUP_SIZE, shared_wg, storage_buffers, subgroup_fits};
use crate::shader;

static RESNORM_WG: Shader =
    shader!("norm_rms_wg.wgsl", "fused_residual_rms_norm.wgsl", "rms_rows.wgsl", "row_wg.wgsl", "reduce_wg.wgsl", "rms.wgsl", "wload.wgsl");
static RESNORM_SG: Shader = shader!(
    "norm_rms_subgroup.wgsl",
    "fused_residual_rms_norm.wgsl",
    "rms_rows.wgsl",
    "row_sg.wgsl",
    "reduce_sg.wgsl",
    "rms.wgsl",
    "wload.wgsl"
);

static RESLN_WG: Shader = shader!("norm_layer_wg.wgsl", "fused_residual_layer_norm.wgsl", "layer_write.wgsl", "row_wg.wgsl", "wload.wgsl");
static RESLN_SG: Shader = shader!(
    "norm_layer_subgroup.wgsl",
    "fused_residual_layer_norm.wgsl",
    "layer_write.wgsl",
    "row_sg.wgsl",
    "reduce_sg.wgsl",
    "wload.wgsl"
);

const WG_PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE];
const SG_PARAMS: &[ParamSpec] =
    &[WORKGROUP_SIZE, ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8], default: 4, help: "rows per workgroup, one subgroup each" }];
const RESNORM_ROWS_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "rows per pool task" }, ISA];
const RESNORM_SPLIT_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "chunk", values: &[256, 512, 1024, 2048, 4096], default: 1024, help: "elements of a row per pool task" }, ISA];

fn check_resnorm_wg(caps: &GpuCaps, _: &Problem, _: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 5)
}

fn check_resnorm_sg(caps: &GpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 5)?;
    subgroup_fits(caps, params)
}

fn check_resln_wg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 6)?;
    check_rows_wg(caps, prob, dtype, params)
}

fn check_resln_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 6)?;
    check_rows_sg(caps, prob, dtype, params)
}

/// Rows split as `strategy` says (dynamic tasks of `rows_per_task` rows, one
/// range per thread, or the calling thread alone: a small tower's few rows); per
/// row one fused add + sum pass (h written), one centred sum-of-squares pass over
/// h and one affine pass, the row in cache throughout.
fn run_resln_rows(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualLayerNorm { rows, dim, eps } = *prob else { return Err(wrong_op(kd, prob)) };
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let isa = Isa::of(params)?;
    let split = RowSplit::of(params)?;
    let grain = match split {
        RowSplit::Caller => rows,
        RowSplit::PerThread => rows.div_ceil(cpu::pool::pool().threads()).max(1),
        RowSplit::Dynamic(g) => g.max(1),
    };
    let per = grain * dim;
    let (w, b) = (part(a.ins[2], 0, dim), part(a.ins[3], 0, dim));
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    let [h, y] = outs::<2>(kd, a.outs)?;
    let (h, y) = (&mut h[..rows * dim], &mut y[..rows * dim]);
    let body = |ci: usize, hc: &mut [f32], yc: &mut [f32]| {
        let base = ci * per;
        for (ri, (hr, yr)) in hc.chunks_mut(dim).zip(yc.chunks_mut(dim)).enumerate() {
            let o = base + ri * dim;
            let mean = add_sum(isa, &x[o..o + dim], &r[o..o + dim], hr) / dim as f32;
            let rs = 1.0 / (sqdev(isa, hr, mean) / dim as f32 + eps).sqrt();
            ln_apply(isa, hr, w, b, mean, rs, yr);
        }
    };
    if split == RowSplit::Caller {
        body(0, h, y);
    } else {
        cpu::pool::for_chunks_mut2(h, per, y, per, body);
    }
    Ok(())
}

/// Each row split into `chunk`-element pieces processed in parallel in three
/// phases: h written with a partial sum per piece, the centred sum of squares per
/// piece, the affine pass; the partials reduced per row between phases.
fn run_resln_split(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualLayerNorm { rows, dim, eps } = *prob else { return Err(wrong_op(kd, prob)) };
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let isa = Isa::of(params)?;
    let cs = (param(params, "chunk")? as usize).max(1);
    let (w, b) = (a.ins[2], a.ins[3]);
    let (x, r) = (&a.ins[0].f32()[..rows * dim], &a.ins[1].f32()[..rows * dim]);
    let [h, y] = outs::<2>(kd, a.outs)?;
    let (h, y) = (&mut h[..rows * dim], &mut y[..rows * dim]);
    for (row, (hr, yr)) in h.chunks_mut(dim).zip(y.chunks_mut(dim)).enumerate() {
        let (xr, rr) = (&x[row * dim..][..dim], &r[row * dim..][..dim]);
        let mean = add_in_pieces(xr, rr, hr, cs, |x, r, h| add_sum(isa, x, r, h)) / dim as f32;
        let hr: &[f32] = hr;
        let var = cpu::pool::sum_chunks(hr, cs, |c| sqdev(isa, c, mean)) / dim as f32;
        let rs = 1.0 / (var + eps).sqrt();
        cpu::pool::for_chunks_mut(yr, cs, |i, yc| {
            let c0 = i * cs;
            ln_apply(isa, &hr[c0..], part(w, c0, yc.len()), part(b, c0, yc.len()), mean, rs, yc)
        });
    }
    Ok(())
}

/// `h = x + r` over one row on the pool, in `cs`-element pieces grouped into at
/// most 64 runs: `piece(x, r, h)` writes a piece of `h` and returns its partial
/// (a sum, a sum of squares), each run sums its pieces', and the runs' sums are
/// summed in order (the same total at any thread count).
fn add_in_pieces(
    xr: &[f32],
    rr: &[f32],
    hr: &mut [f32],
    cs: usize,
    piece: impl Fn(&[f32], &[f32], &mut [f32]) -> f32 + Sync + Send,
) -> f32 {
    let per_run = hr.len().div_ceil(cs).div_ceil(64);
    let parts: [std::sync::Mutex<f32>; 64] = std::array::from_fn(|_| std::sync::Mutex::new(0.0));
    cpu::pool::for_chunks_mut(hr, per_run * cs, |run, hrun| {
        let c0 = run * per_run * cs;
        let s: f32 = hrun
            .chunks_mut(cs)
            .enumerate()
            .map(|(j, hc)| {
                let o = c0 + j * cs;
                piece(&xr[o..o + hc.len()], &rr[o..o + hc.len()], hc)
            })
            .sum();
        if let Ok(mut p) = parts[run].lock() {
            *p = s;
        }
    });
    parts.iter().filter_map(|p| p.lock().ok().map(|v| *v)).sum()
}

/// Rows in parallel; per row one fused add + sum-of-squares pass and one scale pass.
fn run_resnorm_rows(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } = *prob else { return Err(wrong_op(kd, prob)) };
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let isa = Isa::of(params)?;
    let per = (param(params, "rows_per_task")? as usize).max(1) * dim;
    let g = gains(a.ins[2], dim, unit_offset);
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    let [h, y] = outs::<2>(kd, a.outs)?;
    let (h, y) = (&mut h[..rows * dim], &mut y[..rows * dim]);
    cpu::pool::for_chunks_mut2(h, per, y, per, |ci, hc, yc| {
        let base = ci * per;
        for (ri, (hr, yr)) in hc.chunks_mut(dim).zip(yc.chunks_mut(dim)).enumerate() {
            let o = base + ri * dim;
            let ss = cpu::add_sumsq(isa, &x[o..o + dim], &r[o..o + dim], hr);
            cpu::scale_mul(isa, hr, inv_rms(ss, dim, eps), &g, yr);
        }
    });
    Ok(())
}

/// Each row split into `chunk`-element pieces processed in parallel: partial sums of
/// squares per piece (with h written), a reduction per row, then a parallel scale
/// pass over the same pieces. Parallel even for one row (decode).
fn run_resnorm_split(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } = *prob else { return Err(wrong_op(kd, prob)) };
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let isa = Isa::of(params)?;
    let cs = (param(params, "chunk")? as usize).max(1);
    let g = gains(a.ins[2], dim, unit_offset);
    let (x, r) = (&a.ins[0].f32()[..rows * dim], &a.ins[1].f32()[..rows * dim]);
    let [h, y] = outs::<2>(kd, a.outs)?;
    let (h, y) = (&mut h[..rows * dim], &mut y[..rows * dim]);
    // Per row: h = x + r with partial sums of squares per piece, then the scale.
    for (row, (hr, yr)) in h.chunks_mut(dim).zip(y.chunks_mut(dim)).enumerate() {
        let (xr, rr) = (&x[row * dim..][..dim], &r[row * dim..][..dim]);
        let ss = add_in_pieces(xr, rr, hr, cs, |x, r, h| cpu::add_sumsq(isa, x, r, h));
        let inv = inv_rms(ss, dim, eps);
        cpu::pool::for_chunks_mut(yr, cs, |i, yc| {
            let o = i * cs;
            cpu::scale_mul(isa, &hr[o..o + yc.len()], inv, &g[o..o + yc.len()], yc);
        });
    }
    Ok(())
}

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "residual_rms_norm_wg",
            Op::ResidualRmsNorm,
            DType::FLOAT,
            WG_PARAMS,
            "one workgroup per row: h written and h² accumulated in one pass, workgroup reduction, scale pass",
            WgslImpl::new(&RESNORM_WG, prepare_wg).shared(shared_wg).check(check_resnorm_wg),
        ),
        KernelDef::new(
            "residual_rms_norm_subgroup",
            Op::ResidualRmsNorm,
            DType::FLOAT,
            SG_PARAMS,
            "one subgroup per row, several rows per workgroup, subgroupAdd reduction, no barriers",
            WgslImpl::new(&RESNORM_SG, prepare_sg).subgroups().check(check_resnorm_sg),
        ),
        KernelDef::new(
            "residual_rms_norm_rows_cpu",
            Op::ResidualRmsNorm,
            DType::FLOAT,
            RESNORM_ROWS_PARAMS,
            "pool over rows (prefill): fused SIMD add + sum of squares, then SIMD scale pass per row",
            CpuImpl { run: run_resnorm_rows, check: check_isa },
        ),
        KernelDef::new(
            "residual_rms_norm_split_cpu",
            Op::ResidualRmsNorm,
            DType::FLOAT,
            RESNORM_SPLIT_PARAMS,
            "pool over chunks of each row (decode): partial sums of squares per chunk, reduced, then a parallel scale pass",
            CpuImpl { run: run_resnorm_split, check: check_isa },
        ),
        KernelDef::new(
            "residual_layer_norm_wg",
            Op::ResidualLayerNorm,
            DType::FLOAT,
            WG_PARAMS,
            "one workgroup per row: h written with single-read Welford statistics, merged pairwise (Chan) in workgroup memory, affine pass",
            WgslImpl::new(&RESLN_WG, prepare_wg).shared(shared_welford).check(check_resln_wg),
        ),
        KernelDef::new(
            "residual_layer_norm_subgroup",
            Op::ResidualLayerNorm,
            DType::FLOAT,
            SG_PARAMS,
            "one subgroup per row: h written with its sum, exact centred variance from the h it wrote, subgroupAdd, no barriers",
            WgslImpl::new(&RESLN_SG, prepare_sg).subgroups().check(check_resln_sg),
        ),
        KernelDef::new(
            "residual_layer_norm_rows_cpu",
            Op::ResidualLayerNorm,
            DType::FLOAT,
            ROWS_PARAMS,
            "rows over pool tasks (dynamic, per thread or the calling thread): fused SIMD add + sum, centred squares, affine per row in cache",
            CpuImpl { run: run_resln_rows, check: check_isa },
        ),
        KernelDef::new(
            "residual_layer_norm_split_cpu",
            Op::ResidualLayerNorm,
            DType::FLOAT,
            RESNORM_SPLIT_PARAMS,
            "pool over chunks of each row: parallel add + partial sums, parallel centred squares, parallel affine",
            CpuImpl { run: run_resln_split, check: check_isa },
        ),
    ]
}
