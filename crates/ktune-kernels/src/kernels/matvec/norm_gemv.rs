//! Fused RMSNorm prologue + matrix-vector product (decode), `y[n] = w[n,k] ·
//! (x * inv_rms(x) ∘ g)` ([`Problem::NormGemv`]): the input norm of a layer (or the
//! final norm) folded into the projection that consumes it, so the normalized
//! vector never goes through memory and no separate norm kernel runs. The algebra
//! that makes it free: `y_r = inv_rms · Σ_c w[r,c]·x[c]·g[c]`, so a GPU workgroup
//! sums `x²` alongside its dot products (k is the hidden size, 1–3K) and scales the
//! row sums at the end; no extra pass over `w`.
//!
//! WGSL: `norm_gemv_wg` (f32/f16 weights, scalar loads, any k, `x²` folded into the
//! rows' workgroup tree reduction), `norm_gemv_subgroup` (16-byte loads, one
//! `subgroupAdd` per row), and for the block formats (q8_0, q4_0, q4_1, the `QFMT`
//! override; the weight buffer bound twice, quants and the 256-byte aligned scales
//! region, as in [`quant`](super::quant)) `norm_gemv_q_wg` and
//! `norm_gemv_q_subgroup`.
//! CPU: `norm_gemv_cpu` (f32/f16: `x` normalized once into a per-call k-vector, then
//! the rows in parallel with the four-row SIMD dots of the float GEMV) and
//! `norm_gemv_q_cpu` (the same prologue, then the block dot products of
//! `gemv_q_cpu`, with f32 or int8 activations).

use super::{CPU_PARAMS, ROWS_PER_TASK_DYN, gemv_dot4};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::kernels::cpu::{self, ACT_BITS, ActVec, ISA, Isa, RowSplit, check_isa, par_rows};
use crate::kernels::quant::check_blocks;
use crate::kernels::wgsl::{ROWS_SG_PARAMS, ROWS_WG_PARAMS, qbinds, qfmt, subgroup_fits, vec_alignment};
use crate::kernels::{
    CpuArgs, CpuImpl, CpuIn, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, param, wrong_op,
};
use crate::shader;

static NORM_GEMV_WG: Shader = shader!("norm_gemv_wg.wgsl", "norm_block_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static NORM_GEMV_SG: Shader = shader!("norm_gemv_subgroup.wgsl", "wload.wgsl", "grid_sg.wgsl", "grid.wgsl");
static NORM_GEMV_Q_WG: Shader = shader!(
    "norm_gemv_q_wg.wgsl",
    "norm_gemv_q.wgsl",
    "qblock.wgsl",
    "qgeom.wgsl",
    "norm_block_wg.wgsl",
    "block_wg.wgsl",
    "reduce_wg.wgsl"
);
static NORM_GEMV_Q_SG: Shader =
    shader!("norm_gemv_q_subgroup.wgsl", "norm_gemv_q.wgsl", "qblock.wgsl", "qgeom.wgsl", "grid_sg.wgsl", "grid.wgsl");

const QUANT: &[DType] = DType::QUANT;

const CPU_Q_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK_DYN, ISA, ACT_BITS];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "norm_gemv_wg",
            Op::NormGemv,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "scalar loads, any k; ROWS rows per workgroup share x·g; x² summed alongside; one workgroup tree reduction",
            WgslImpl::new(&NORM_GEMV_WG, prepare_float).shared(shared_rows_plus_one),
        ),
        KernelDef::new(
            "norm_gemv_subgroup",
            Op::NormGemv,
            DType::FLOAT,
            ROWS_SG_PARAMS,
            "16-byte loads; each subgroup sums x² itself, then one subgroup per row, subgroupAdd, no barriers",
            WgslImpl::new(&NORM_GEMV_SG, prepare_float).subgroups().check(check_subgroup),
        ),
        KernelDef::new(
            "norm_gemv_q_wg",
            Op::NormGemv,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "quantized blocks dequantized in registers; ROWS rows per workgroup share x·g; x² summed alongside; workgroup reduction",
            WgslImpl::new(&NORM_GEMV_Q_WG, prepare_quant).shared(shared_rows_plus_one).check(check_q_wgsl),
        ),
        KernelDef::new(
            "norm_gemv_q_subgroup",
            Op::NormGemv,
            DType::QUANT,
            ROWS_SG_PARAMS,
            "quantized blocks dequantized in registers; each subgroup sums x² itself, then one subgroup per row, subgroupAdd",
            WgslImpl::new(&NORM_GEMV_Q_SG, prepare_quant).subgroups().check(check_q_subgroup),
        ),
        KernelDef::new(
            "norm_gemv_cpu",
            Op::NormGemv,
            DType::FLOAT,
            CPU_PARAMS,
            "x normalized once into a k-vector (SIMD sum of squares), then four rows per SIMD dot call; pool over rows",
            CpuImpl { run: run_float, check: check_isa },
        ),
        KernelDef::new(
            "norm_gemv_q_cpu",
            Op::NormGemv,
            QUANT,
            CPU_Q_PARAMS,
            "x normalized once into a k-vector, then SIMD block dot products straight from the quants (f32 or int8 activations); pool over rows",
            CpuImpl { run: run_quant, check: cpu::check_quant },
        ),
    ]
}

// ---------------------------------------------------------------------------------
// Validity
// ---------------------------------------------------------------------------------

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    match *prob {
        Problem::NormGemv { k, .. } => vec_alignment(k, dtype),
        _ => Ok(()),
    }
}

fn check_q_wgsl(_: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)
}

fn check_q_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    check_blocks(prob, dtype)
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

/// ROWS partial dot products and one partial sum of squares per invocation.
fn shared_rows_plus_one(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(4 * param(params, "workgroup_size")? as u64 * (param(params, "rows_per_wg")? as u64 + 1))
}

/// `(n, the uniform block {n, k, eps, unit_offset})`.
fn uniform(s: &WgslSetup<'_>) -> Result<(usize, [u32; 4]), KernelError> {
    match *s.problem {
        Problem::NormGemv { n, k, eps, unit_offset } => Ok((n, [n as u32, k as u32, eps.to_bits(), unit_offset as u32])),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

/// One prepare for both float shaders.
fn prepare_float(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, u) = uniform(s)?;
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("W_F16", s.w_f16())];
    s.one_step("main", &consts, &u, grid_2d(groups(n, rows)))
}

/// One prepare for both block-format shaders: binds x, the gain, the weight's quants and scales regions, y and the uniform.
fn prepare_quant(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, u) = uniform(s)?;
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("QFMT", qfmt(s.dtype))];
    let pipe = s.gpu.pipeline(s.shader(), "main", &consts)?;
    let ub = s.gpu.uniform(s.kernel.id, &u);
    let step = {
        let binds = qbinds(s, 2, &[&ub])?;
        s.gpu.step_ranges(s.kernel.id, pipe, &binds, grid_2d(groups(n, rows)))?
    };
    Ok(GpuProgram { steps: vec![step], owned: vec![ub] })
}

// ---------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------

/// The prologue: `x * inv_rms(x) * g` (or `* (1 + g)`) into a fresh k-vector, the sum
/// of squares with the SIMD dot product of `x` with itself.
pub fn normalize(isa: Isa, x: &[f32], g: CpuIn<'_>, eps: f32, unit_offset: bool) -> cpu::Scratch {
    if x.is_empty() {
        return cpu::Scratch::zeroed(0);
    }
    let inv = 1.0 / (cpu::dot_f32(isa, x, x) / x.len() as f32 + eps).sqrt();
    let off = if unit_offset { 1.0 } else { 0.0 };
    cpu::Scratch::from_fn(x.len(), |i| x[i] * inv * (g.get(i) + off))
}

fn run_float(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::NormGemv { n, k, eps, unit_offset } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let xn = normalize(isa, &a.ins[0].f32()[..k], a.ins[1], eps, unit_offset);
    let w = a.ins[2];
    par_rows(&mut a.outs[0][..n], 1, RowSplit::of(params)?, |first, y| gemv_dot4(isa, &xn, w, k, first, y));
    Ok(())
}

fn run_quant(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::NormGemv { n, k, eps, unit_offset } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let w = a.ins[2].quant().ok_or_else(|| KernelError::BufferType {
        kernel: "norm_gemv_q_cpu".into(),
        buffer: "w".into(),
        expected: "a quantized matrix",
    })?;
    let xn = normalize(isa, &a.ins[0].f32()[..k], a.ins[1], eps, unit_offset);
    // The normalized vector as gemv_q_cpu takes it: f32, or int8 blocks (act_bits 8).
    let x = ActVec::new(&xn, params, w.format)?;
    par_rows(&mut a.outs[0][..n], 1, RowSplit::dynamic(params)?, |first, y| x.rows(isa, w, k, first, y, false));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::verify::{HostTensor, make_inputs, run_cpu};
    use crate::kernels::{find, reference};

    /// The fused kernel equals the RMSNorm kernel followed by the GEMV kernel (the
    /// unfused plan's two steps), for both gain conventions.
    #[test]
    fn fused_equals_norm_then_gemv() {
        for unit_offset in [false, true] {
            let (n, k, eps) = (19, 96, 1e-6);
            let prob = Problem::NormGemv { n, k, eps, unit_offset };
            let ins = make_inputs(&prob, DType::F32, 3);
            let fused =
                run_cpu(find("norm_gemv_cpu").unwrap(), &prob, DType::F32, &find("norm_gemv_cpu").unwrap().default_params(), &ins).unwrap();
            let norm = Problem::RmsNorm { rows: 1, dim: k, eps, unit_offset };
            let f64s: Vec<Vec<f64>> = ins.iter().map(HostTensor::to_f64).collect();
            let xn = reference::compute(&norm, &[f64s[0].clone(), f64s[1].clone()]).remove(0);
            let y = reference::compute(&Problem::Gemv { n, k }, &[xn, f64s[2].clone()]).remove(0);
            for (a, b) in fused[0].iter().zip(&y) {
                assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()), "unit_offset {unit_offset}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn zero_length_activations_normalize_to_nothing() {
        assert!(normalize(Isa::Scalar, &[], CpuIn::F32(&[]), 1e-6, false).is_empty());
    }
}
