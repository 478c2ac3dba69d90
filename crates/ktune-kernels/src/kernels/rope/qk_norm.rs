//! Per-head RMSNorm + RoPE in one pass (`qk_norm_rope`, Gemma 3's q/k norm): each
//! (token, head) row normalized with its gain and rotated, so the normalized head
//! never goes through memory. Part of the RoPE family (its output is rotated).
//!
//! WGSL: `qk_norm_rope_wg` (one workgroup per (token, head), workgroup-memory x²
//! reduction) and `qk_norm_rope_subgroup` (one subgroup per (token, head), several
//! heads per workgroup). CPU: `qk_norm_rope_heads_cpu` (pool over rows: SIMD x² and
//! scale passes, then rotation with per-head sin/cos) and `qk_norm_rope_table_cpu`
//! (a sin/cos table per token first, then one fused normalize + rotate pass).

use super::WGSL_MAX_POSITION;
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader};
use crate::kernels::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use crate::kernels::cpu::{self, ISA, Isa, Row, check_isa};
use crate::kernels::norm::{gains, inv_rms};
use crate::kernels::problem::{Op, Problem, RopeLayout};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{one_wg_per_row, shared_wg, storage_buffers, subgroup_fits, subgroup_per_row};
use crate::shader;

static QKNR_WG: Shader = shader!(
    "fused_qk_norm_rope_wg.wgsl",
    "fused_qk_norm_rope.wgsl",
    "row_wg.wgsl",
    "reduce_wg.wgsl",
    "rms.wgsl",
    "rotary.wgsl",
    "wload.wgsl",
    "position.wgsl"
);
static QKNR_SG: Shader = shader!(
    "fused_qk_norm_rope_subgroup.wgsl",
    "fused_qk_norm_rope.wgsl",
    "row_sg.wgsl",
    "reduce_sg.wgsl",
    "rms.wgsl",
    "rotary.wgsl",
    "wload.wgsl",
    "position.wgsl"
);

const QKNR_WG_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per (token, head) workgroup" }];
const QKNR_SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per workgroup" },
    ParamSpec { name: "heads_per_wg", values: &[1, 2, 4, 8], default: 2, help: "heads per workgroup, one subgroup each" },
];
const HEADS_CPU_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "heads_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "(token, head) rows per pool task" }, ISA];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "qk_norm_rope_wg",
            Op::QkNormRope,
            DType::FLOAT,
            QKNR_WG_PARAMS,
            "one workgroup per (token, head): workgroup-memory x² reduction, then normalize + rotate whole pairs",
            WgslImpl::new(&QKNR_WG, prepare_qknr_wg).shared(shared_wg).check(check_qknr_wg),
        ),
        KernelDef::new(
            "qk_norm_rope_subgroup",
            Op::QkNormRope,
            DType::FLOAT,
            QKNR_SG_PARAMS,
            "one subgroup per (token, head), subgroupAdd reduction, several heads per workgroup, no barriers",
            WgslImpl::new(&QKNR_SG, prepare_qknr_sg).subgroups().check(check_qknr_sg),
        ),
        KernelDef::new(
            "qk_norm_rope_heads_cpu",
            Op::QkNormRope,
            DType::FLOAT,
            HEADS_CPU_PARAMS,
            "pool over (token, head) rows: SIMD x² and scale passes, then rotation with per-head sin/cos",
            CpuImpl { run: run_qknr_heads, check: check_qknr_cpu },
        ),
        KernelDef::new(
            "qk_norm_rope_table_cpu",
            Op::QkNormRope,
            DType::FLOAT,
            HEADS_CPU_PARAMS,
            "sin/cos table per token computed once in parallel, then one fused normalize+rotate pass per head",
            CpuImpl { run: run_qknr_table, check: check_qknr_cpu },
        ),
    ]
}

/// QkNormRope shape rule shared by every variant: the rotated dims fit in the head.
fn qknr_shape(prob: &Problem) -> Result<(), String> {
    match *prob {
        Problem::QkNormRope { head_dim, rot_dim, .. } if rot_dim > head_dim => {
            Err(format!("rot_dim = {rot_dim} exceeds head_dim = {head_dim}"))
        }
        Problem::QkNormRope { head_dim: 0, .. } => Err("head_dim = 0".into()),
        _ => Ok(()),
    }
}

/// WGSL angle reduction (shared with `rope_pair.wgsl`) is exact only below
/// [`WGSL_MAX_POSITION`].
fn qknr_positions(prob: &Problem) -> Result<(), String> {
    match *prob {
        Problem::QkNormRope { tokens, pos0, .. } if pos0 + tokens > WGSL_MAX_POSITION => {
            Err(format!("positions up to {} exceed {WGSL_MAX_POSITION}, where the f32 angle reduction stops being exact", pos0 + tokens))
        }
        _ => Ok(()),
    }
}

fn check_qknr_wg(caps: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 4)?;
    qknr_positions(prob)?;
    qknr_shape(prob)
}

fn check_qknr_sg(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 4)?;
    subgroup_fits(caps, params)?;
    qknr_positions(prob)?;
    qknr_shape(prob)
}

fn check_qknr_cpu(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    qknr_shape(prob)?;
    check_isa(caps, prob, dtype, params)
}

/// Uniform block of the qk_norm_rope shaders.
fn qknr_uniform(s: &WgslSetup<'_>) -> Result<(usize, Vec<u32>), KernelError> {
    match *s.problem {
        Problem::QkNormRope { tokens, heads, head_dim, rot_dim, pos0, layout, eps, unit_offset } => Ok((
            tokens * heads,
            vec![
                tokens as u32,
                heads as u32,
                head_dim as u32,
                (rot_dim / 2) as u32,
                pos0 as u32,
                layout.code(),
                eps.to_bits(),
                unit_offset as u32,
            ],
        )),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn prepare_qknr_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (heads, u) = qknr_uniform(s)?;
    one_wg_per_row(s, heads, &u)
}

fn prepare_qknr_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (heads, u) = qknr_uniform(s)?;
    subgroup_per_row(s, heads, &u, "heads_per_wg")
}

/// Where the two elements of rotary pair `i` sit in a head.
#[inline]
fn pair(layout: RopeLayout, i: usize, half: usize) -> (usize, usize) {
    match layout {
        RopeLayout::Half => (i, i + half),
        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
    }
}

/// The operands of one CPU call and the (token, head) orchestration both CPU
/// variants share: pool over chunks of `heads_per_task` rows, `head(row, x_row,
/// inv_rms, y_row)` per row.
struct QkCall<'a> {
    tokens: usize,
    heads: usize,
    d: usize,
    pos0: usize,
    layout: RopeLayout,
    isa: Isa,
    g: cpu::Scratch,
    x: &'a [f32],
    inv_freq: &'a [f32],
}

impl<'a> QkCall<'a> {
    fn new(kd: &KernelDef, prob: &Problem, params: &Params, a: &CpuArgs<'a>) -> Result<(QkCall<'a>, f32, usize), KernelError> {
        let Problem::QkNormRope { tokens, heads, head_dim: d, rot_dim, pos0, layout, eps, unit_offset } = *prob else {
            return Err(wrong_op(kd, prob));
        };
        let per = (param(params, "heads_per_task")? as usize).max(1);
        let (x, inv_freq) = (a.ins[0].f32(), &a.ins[2].f32()[..rot_dim / 2]);
        let g = gains(a.ins[1], d, unit_offset);
        Ok((QkCall { tokens, heads, d, pos0, layout, isa: Isa::of(params)?, g, x, inv_freq }, eps, per))
    }

    fn half(&self) -> usize {
        self.inv_freq.len()
    }

    fn each_head(&self, y: &mut [f32], eps: f32, per: usize, head: impl Fn(usize, &[f32], f32, &mut [f32]) + Sync + Send) {
        let d = self.d;
        cpu::pool::for_chunks_mut(&mut y[..self.tokens * self.heads * d], per * d, |ci, chunk| {
            for (hi, yh) in chunk.chunks_mut(d).enumerate() {
                let row = ci * per + hi;
                let xh = &self.x[row * d..][..d];
                let inv = inv_rms(cpu::dot(self.isa, xh, Row::F32(xh)), d, eps);
                head(row, xh, inv, yh);
            }
        });
    }
}

/// Two passes per head: SIMD scale into `y`, then rotation in place with f32 sin/cos
/// evaluated for this head (angle formed and reduced in f64, so far positions stay exact).
fn run_qknr_heads(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (c, eps, per) = QkCall::new(kd, prob, params, &a)?;
    c.each_head(a.outs[0], eps, per, |row, xh, inv, yh| {
        cpu::scale_mul(c.isa, xh, inv, &c.g, yh);
        rotate_head(yh, c.inv_freq, (c.pos0 + row / c.heads) as f64, c.layout);
    });
    Ok(())
}

/// Rotates the first `2 * inv_freq.len()` dims of one head in place at position
/// `pos`: f32 sin/cos of the angle formed and reduced to [-pi, pi] in f64, so far
/// positions stay exact (shared with the fused QKV + RoPE + KV write).
pub(super) fn rotate_head(yh: &mut [f32], inv_freq: &[f32], pos: f64, layout: RopeLayout) {
    let half = inv_freq.len();
    for (i, f) in inv_freq.iter().enumerate() {
        let a = pos * *f as f64;
        let (sn, cs) = ((a - (a / std::f64::consts::TAU).round() * std::f64::consts::TAU) as f32).sin_cos();
        let (ia, ib) = pair(layout, i, half);
        let (x0, x1) = (yh[ia], yh[ib]);
        yh[ia] = x0 * cs - x1 * sn;
        yh[ib] = x1 * cs + x0 * sn;
    }
}

/// A `[tokens, rot_dim/2]` table of (cos, sin) built once (in f64, in parallel over
/// tokens), then one pass per head that normalizes and rotates each pair straight
/// from `x` into `y`; dims past `rot_dim` go through the SIMD scale microkernel.
fn run_qknr_table(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (c, eps, per) = QkCall::new(kd, prob, params, &a)?;
    let half = c.half();
    // (cos, sin) pairs, `2 * half` floats a token, from the shared spares
    let mut table = cpu::Scratch::zeroed(c.tokens * 2 * half);
    if half > 0 {
        cpu::pool::for_chunks_mut(&mut table, 2 * half, |t, tc| {
            let pos = (c.pos0 + t) as f64;
            for (e, f) in tc.chunks_exact_mut(2).zip(c.inv_freq) {
                let (sn, cs) = (pos * *f as f64).sin_cos();
                e[0] = cs as f32;
                e[1] = sn as f32;
            }
        });
    }
    c.each_head(a.outs[0], eps, per, |row, xh, inv, yh| {
        let g = &c.g;
        let cs = &table[(row / c.heads) * 2 * half..][..2 * half];
        for (i, e) in cs.chunks_exact(2).enumerate() {
            let (co, s) = (e[0], e[1]);
            let (ia, ib) = pair(c.layout, i, half);
            let x0 = xh[ia] * inv * g[ia];
            let x1 = xh[ib] * inv * g[ib];
            yh[ia] = x0 * co - x1 * s;
            yh[ib] = x1 * co + x0 * s;
        }
        let r = 2 * half;
        cpu::scale_mul(c.isa, &xh[r..], inv, &g[r..], &mut yh[r..]);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 angles `pos * f` lose ~1e-3 rad at position 30000; every variant must form
    /// (or correct) and reduce the angle so far positions stay within tolerance.
    #[test]
    fn qk_norm_rope_stays_exact_at_far_positions() {
        use crate::device::Caps;
        use crate::kernels::contract::Impl;
        use crate::kernels::for_op;
        use crate::kernels::verify::{Runner, check_one};
        let probs = [
            Problem::QkNormRope {
                tokens: 3,
                heads: 2,
                head_dim: 64,
                rot_dim: 64,
                pos0: 30000,
                layout: RopeLayout::Half,
                eps: 1e-6,
                unit_offset: true,
            },
            Problem::QkNormRope {
                tokens: 2,
                heads: 3,
                head_dim: 96,
                rot_dim: 32,
                pos0: 65000,
                layout: RopeLayout::Interleaved,
                eps: 1e-5,
                unit_offset: false,
            },
        ];
        let cpu = CpuCaps::detect();
        let gpu = crate::testing::test_gpu();
        let mut failures = Vec::new();
        for k in for_op(Op::QkNormRope) {
            let (runner, caps) = match (&k.imp, &gpu) {
                (Impl::Cpu(_), _) => (Runner::Cpu, Caps::Cpu(&cpu)),
                (Impl::Wgsl(_), Some(g)) => (Runner::Gpu(g), Caps::Gpu(&g.caps)),
                (Impl::Wgsl(_), None) => continue,
            };
            for prob in &probs {
                for dtype in DType::FLOAT {
                    let params = k.default_params();
                    if k.check(caps, prob, *dtype, &params).is_err() {
                        continue;
                    }
                    let c = check_one(&runner, k, prob, *dtype, &params, 7);
                    if !c.passed {
                        failures.push(format!("{} {dtype} {}: rel err {:.2e} {:?}", k.id, c.problem, c.rel_err, c.error));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
