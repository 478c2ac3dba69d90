//! Residual add + RMSNorm in one pass (`residual_rms_norm`): `h = x + r` written
//! and `y = rms_norm(h)` from the same read, the norm that follows every residual
//! add of a decoder layer. Part of the norm family (its output is a norm).
//!
//! WGSL: `residual_rms_norm_wg` (one workgroup per row: h written and h² accumulated
//! in one pass, workgroup reduction, scale pass), `residual_rms_norm_subgroup` (one
//! subgroup per row). CPU: `residual_rms_norm_rows_cpu` (pool over rows, prefill)
//! and `residual_rms_norm_split_cpu` (pool over chunks of each row, decode), both on
//! the fused add + sum-of-squares and scale microkernels of [`cpu::dot`].

use super::{gains, inv_rms, prepare_sg, prepare_wg};
use crate::device::GpuCaps;
use crate::gpu::Shader;
use crate::kernels::cpu::{self, ISA, Isa, check_isa};
use crate::kernels::wgsl::{WORKGROUP_SIZE, shared_wg, storage_buffers, subgroup_fits};
use crate::kernels::{CpuArgs, CpuImpl, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, outs, param, wrong_op};
use crate::shader;

static RESNORM_WG: Shader =
    shader!("fused_residual_rms_norm_wg.wgsl", "fused_residual_rms_norm.wgsl", "row_wg.wgsl", "reduce_wg.wgsl", "rms.wgsl", "wload.wgsl");
static RESNORM_SG: Shader = shader!(
    "fused_residual_rms_norm_subgroup.wgsl",
    "fused_residual_rms_norm.wgsl",
    "row_sg.wgsl",
    "reduce_sg.wgsl",
    "rms.wgsl",
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
        let pieces = dim.div_ceil(cs);
        let parts: [std::sync::Mutex<f32>; 64] = std::array::from_fn(|_| std::sync::Mutex::new(0.0));
        // Pieces grouped into at most 64 runs, one partial each (summed in order).
        let per_run = pieces.div_ceil(64);
        cpu::pool::for_chunks_mut(hr, per_run * cs, |run, hrun| {
            let c0 = run * per_run * cs;
            let ss: f32 = hrun
                .chunks_mut(cs)
                .enumerate()
                .map(|(j, hc)| {
                    let o = c0 + j * cs;
                    cpu::add_sumsq(isa, &xr[o..o + hc.len()], &rr[o..o + hc.len()], hc)
                })
                .sum();
            if let Ok(mut p) = parts[run].lock() {
                *p = ss;
            }
        });
        let ss: f32 = parts.iter().filter_map(|p| p.lock().ok().map(|v| *v)).sum();
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
    ]
}
