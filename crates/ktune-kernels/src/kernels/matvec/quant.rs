//! GEMV over block-quantized weights ([`DType::Q8_0`], [`DType::Q4_0`],
//! [`DType::Q4_1`]) in the split layout of [`QMatrix`](crate::kernels::quant::QMatrix):
//! every kernel reads the blocks directly and dequantizes in registers.
//!
//! WGSL (the block format is the `QFMT` override constant; the weight buffer bound
//! twice, quants and the 256-byte aligned scales region): `gemv_q_wg` (workgroup
//! reduction), `gemv_q_subgroup` (subgroupAdd). CPU: `gemv_q_cpu` (AVX2/FMA block dot
//! products of [`cpu::qdot`](crate::kernels::cpu::qdot), f32 or int8 activations,
//! pool over rows). Every kernel needs k to be a whole number of 32-element blocks.

use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use crate::kernels::cpu::{ACT_BITS, ActVec, ISA, Isa, ROWS_PER_PASS, ROWS_PER_TASK, RowSplit, check_quant, par_rows, qin};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{ROWS_SG_UNROLL_PARAMS, ROWS_WG_PARAMS, one_q_step, qfmt, shared_rows, subgroup_fits};
use crate::shader;

static QGEMV_WG: Shader =
    shader!("qgemv_wg.wgsl", "qgemv.wgsl", "qblock.wgsl", "qgeom.wgsl", "qrows_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl");
static QGEMV_SG: Shader = shader!("qgemv_subgroup.wgsl", "qgemv.wgsl", "qblock.wgsl", "qgeom.wgsl", "row_sg.wgsl", "reduce_sg.wgsl");

const CPU_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS, ROWS_PER_PASS];

fn check_wgsl(_: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)
}

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    check_blocks(prob, dtype)
}

/// One prepare for both block-format GEMV shaders.
fn prepare(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemv { n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let mut consts = vec![("WG", wg as f64), ("ROWS", rows as f64), ("QFMT", qfmt(s.dtype))];
    consts.extend(s.params.get("unroll").map(|&u| ("UNROLL", u as f64)));
    one_q_step(s, 1, &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

fn run_gemv(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemv { n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (&a.ins[0].f32()[..k], qin("gemv_q_cpu", &a.ins[1])?);
    let x = ActVec::new(x, params, w.format)?;
    let four = param(params, "rows_per_pass")? == 4;
    par_rows(&mut a.outs[0][..n], 1, RowSplit::dynamic(params)?, |first, y| x.rows(isa, w, k, first, y, four));
    Ok(())
}

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "gemv_q_wg",
            Op::Gemv,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "quantized blocks read as u32 words, dequantized in registers; ROWS rows per workgroup; workgroup reduction",
            WgslImpl::new(&QGEMV_WG, prepare).shared(shared_rows).check(check_wgsl),
        ),
        KernelDef::new(
            "gemv_q_subgroup",
            Op::Gemv,
            DType::QUANT,
            ROWS_SG_UNROLL_PARAMS,
            "quantized blocks dequantized in registers, `unroll` units a lane in flight; one subgroup per row, subgroupAdd, no barriers",
            WgslImpl::new(&QGEMV_SG, prepare).subgroups().check(check_subgroup),
        ),
        KernelDef::new(
            "gemv_q_cpu",
            Op::Gemv,
            DType::QUANT,
            CPU_PARAMS,
            "SIMD block dot products (AVX2+FMA, scalar fallback) straight from the quants, f32 or int8 activations; pool over rows",
            CpuImpl { run: run_gemv, check: check_quant },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::contract::CpuIn;

    #[test]
    fn a_float_weight_is_an_error_not_a_panic() {
        let k = crate::kernels::find("gemv_q_cpu").unwrap();
        let prob = Problem::Gemv { n: 2, k: 32 };
        let (x, w) = (vec![0f32; 32], vec![0f32; 64]);
        let mut y = [0f32; 2];
        let args = CpuArgs { ins: smallvec::smallvec![CpuIn::F32(&x), CpuIn::F32(&w)], outs: smallvec::smallvec![&mut y[..]] };
        assert!(k.run_cpu(&prob, DType::Q8_0, &k.default_params(), args).is_err());
    }
}
