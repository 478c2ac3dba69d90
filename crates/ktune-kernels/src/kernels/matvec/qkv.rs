//! The Q/K/V projection of one token (`qkv_proj`): one matrix-vector product over
//! the concatenated Q/K/V weight with the bias and the routing of rows to q, k and v
//! in the epilogue. It is a GEMV producing three outputs, so it lives in the
//! matrix-vector family; float and block-format variants are both here.
//!
//! WGSL: `qkv_proj_wg` (scalar loads, any k, workgroup reduction), `qkv_proj_subgroup`
//! (16-byte loads, one subgroup per row), `qkv_proj_q_wg` (block formats, `QFMT`),
//! `qkv_proj_q_dp4a_wg` / `_subgroup` (second generation: the input quantized once
//! for the Q, K and V rows, int8 block dots; the shared program is in
//! [`qdp4a`](super::qdp4a)).
//! CPU: `qkv_proj_dot4_cpu` (one pool pass over the rows of q, k and v together,
//! four rows per SIMD call), `qkv_proj_splitk_cpu` (slices of k in parallel, partials
//! summed with the bias) and `qkv_proj_q_cpu` (block dot products, f32 or int8
//! activations).

use super::{gemv_dot4, qdp4a};
use crate::device::GpuCaps;
use crate::gpu::{Bind, GpuProgram, Shader, grid_2d, groups};
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, outs, param, wrong_op};
use crate::kernels::cpu::{self, ACT_BITS, ActVec, ISA, Isa, ROWS_PER_PASS, ROWS_PER_TASK, check_isa, check_quant, pool, qin, sub_row};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{ROWS_SG_PARAMS, ROWS_WG_PARAMS, qbinds, qfmt, shared_rows, storage_buffers, subgroup_fits, vec_alignment};
use crate::shader;

static QKV_WG: Shader =
    shader!(head "qkv_head.wgsl"; "fused_qkv_proj_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "qkv_store.wgsl", "wload.wgsl");
static QKV_SG: Shader = shader!(
    head "qkv_head.wgsl";
    "fused_qkv_proj_subgroup.wgsl",
    "row_dot16.wgsl",
    "row_sg.wgsl",
    "reduce_sg.wgsl",
    "qkv_store.wgsl",
    "wload.wgsl"
);
static QQKV_WG: Shader =
    shader!("qqkv_proj_wg.wgsl", "qblock.wgsl", "qgeom.wgsl", "qrows_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "qkv_store.wgsl");
static QQKV_DP4A_WG: Shader =
    shader!(head "qdp4a_head.wgsl"; "qdp4a_qkv.wgsl", "qdp4a_main_wg.wgsl", "qdp4a.wgsl", "qgeom.wgsl", "qkv_store.wgsl", "reduce_wg.wgsl");
static QQKV_DP4A_SG: Shader =
    shader!(head "qdp4a_head.wgsl"; "qdp4a_qkv.wgsl", "qdp4a_main_sg.wgsl", "qdp4a.wgsl", "qgeom.wgsl", "qkv_store.wgsl");

/// Shared with gate_up's dot4 kernel.
pub(super) const ROW_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("rows_per_task", &[8, 16, 32, 64, 128, 256], 32, "output rows per pool task (dynamic strategy)"),
    ParamSpec::new("strategy", &[0, 1], 0, "0 dynamic work stealing by rows_per_task, 1 one static row range per thread"),
    ISA,
];

const SPLITK_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "k_split", values: &[2, 4, 8, 16], default: 4, help: "slices of k computed in parallel and summed" }, ISA];

/// `act_bits` applies to decode (one token); prefill rows stay f32.
const CPU_Q_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS, ROWS_PER_PASS];

fn check_qkv_wg(caps: &GpuCaps, _: &Problem, _: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 6)
}

fn check_qkv_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 6)?;
    subgroup_fits(caps, params)?;
    match *prob {
        Problem::QkvProj { k, .. } => vec_alignment(k, dtype),
        _ => Ok(()),
    }
}

fn check_q_wgsl(caps: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 7)?;
    check_blocks(prob, dtype)
}

/// One prepare for both float shaders. They always bind a bias at 2; without one a 16-byte placeholder the
/// program owns takes its place (never read: `HAS_BIAS` is false).
fn prepare(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *s.problem else {
        return Err(wrong_op(s.kernel, s.problem));
    };
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("W_F16", s.w_f16()), ("HAS_BIAS", if bias { 1.0 } else { 0.0 })];
    let pipe = s.gpu.pipeline(s.shader(), "main", &consts)?;
    let u = s.gpu.uniform(s.kernel.id, &[k as u32, nq as u32, nkv as u32]);
    let placeholder = if bias { None } else { Some(s.gpu.storage("qkv_no_bias", 16)) };
    let mut binds: Vec<&wgpu::Buffer> = s.bufs[..2].to_vec();
    if let Some(b) = &placeholder {
        binds.push(b);
    }
    binds.extend_from_slice(&s.bufs[2..]);
    binds.push(&u);
    let step = s.gpu.step(s.kernel.id, pipe, &binds, grid_2d(groups(nq + 2 * nkv, per)))?;
    let mut owned = vec![u];
    owned.extend(placeholder);
    Ok(GpuProgram { steps: vec![step], owned })
}

/// The block-format shader binds the bias at 3 (after the quants and scales regions);
/// without one a 16-byte placeholder the program owns takes its place.
fn prepare_q(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("QFMT", qfmt(s.dtype)), ("HAS_BIAS", if bias { 1.0 } else { 0.0 })];
    let pipe = s.gpu.pipeline(s.shader(), "main", &consts)?;
    let u = s.gpu.uniform(s.kernel.id, &[k as u32, nq as u32, nkv as u32]);
    let placeholder = if bias { None } else { Some(s.gpu.storage("qkv_no_bias", 16)) };
    let step = {
        let mut binds = qbinds(s, 1, &[&u])?;
        if let Some(b) = &placeholder {
            // x, quants, scales, then the placeholder in the bias slot.
            binds.insert(3, Bind::Whole(b));
        }
        s.gpu.step_ranges(s.kernel.id, pipe, &binds, grid_2d(groups(nq + 2 * nkv, per)))?
    };
    let mut owned = vec![u];
    owned.extend(placeholder);
    Ok(GpuProgram { steps: vec![step], owned })
}

/// Runs `f(first_row, chunk)` over chunks of `grain` rows of q, k and v in one pool
/// pass (chained, so the three share the pool without a barrier between them), row
/// numbers counted through the concatenated weight, then adds the bias.
#[allow(clippy::too_many_arguments)]
fn qkv_rows(
    kd: &KernelDef,
    outs_: crate::kernels::contract::CpuOuts<'_>,
    nq: usize,
    nkv: usize,
    grain: usize,
    bias: Option<&[f32]>,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Result<(), KernelError> {
    let [q, ko, vo] = outs::<3>(kd, outs_)?;
    let grain = grain.max(1);
    let run = |first: usize, y: &mut [f32]| {
        f(first, y);
        if let Some(b) = bias {
            for (i, v) in y.iter_mut().enumerate() {
                *v += b[first + i];
            }
        }
    };
    // One pool pass over the chunks of all three (no barrier between them).
    pool::for_chunks_mut3([&mut q[..nq], &mut ko[..nkv], &mut vo[..nkv]], grain, |part, i, y| run([0, nq, nq + nkv][part] + i * grain, y));
    Ok(())
}

/// `gemv_dot4` per chunk of the rows of q, k and v.
fn run_qkv_dot4(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let n = nq + 2 * nkv;
    let (x, w) = (&a.ins[0].f32()[..k], a.ins[1]);
    let b = if bias { Some(a.ins[2].f32()) } else { None };
    let grain = match param(params, "strategy")? {
        1 => n.div_ceil(pool::pool().threads()).max(1),
        _ => (param(params, "rows_per_task")? as usize).max(1),
    };
    qkv_rows(kd, a.outs, nq, nkv, grain, b, |first, y| gemv_dot4(isa, x, w, k, first, y))
}

/// Block dot products per chunk of the rows of q, k and v.
fn run_qkv_q(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (&a.ins[0].f32()[..k], qin(kd.id, &a.ins[1])?);
    let x = ActVec::new(x, params, w.format)?;
    let four = param(params, "rows_per_pass")? == 4;
    let b = if bias { Some(a.ins[2].f32()) } else { None };
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    qkv_rows(kd, a.outs, nq, nkv, grain, b, |first, y| x.rows(isa, w, k, first, y, four))
}

/// Split-k: `k_split` slices of k (multiples of 16) run in parallel, each computing
/// partial dot products of every row over its slice (dot4, four rows per x load);
/// the partials are then summed per row with the bias and routed to q, k and v.
fn run_qkv_splitk(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let n = nq + 2 * nkv;
    let (x, w) = (&a.ins[0].f32()[..k], a.ins[1]);
    let slice = k.div_ceil((param(params, "k_split")? as usize).max(1)).div_ceil(16).max(1) * 16;
    let slices = k.div_ceil(slice);
    // partials[s * n + j]: row j over slice s of k
    let mut partials = cpu::Scratch::zeroed(slices * n);
    cpu::pool::for_chunks_mut(&mut partials, n, |s, part| {
        let (c0, c1) = (s * slice, ((s + 1) * slice).min(k));
        let xs = &x[c0..c1];
        let mut r = 0;
        while r + 4 <= n {
            let rows4 =
                [sub_row(w, r, k, c0, c1), sub_row(w, r + 1, k, c0, c1), sub_row(w, r + 2, k, c0, c1), sub_row(w, r + 3, k, c0, c1)];
            part[r..r + 4].copy_from_slice(&cpu::dot4(isa, xs, rows4));
            r += 4;
        }
        for (j, v) in part.iter_mut().enumerate().skip(r) {
            *v = cpu::dot(isa, xs, sub_row(w, j, k, c0, c1));
        }
    });
    let b = if bias { Some(a.ins[2].f32()) } else { None };
    let [q, ko, vo] = outs::<3>(kd, a.outs)?;
    let dests = q[..nq].iter_mut().chain(ko[..nkv].iter_mut()).chain(vo[..nkv].iter_mut());
    for (j, dst) in dests.enumerate() {
        let mut s = b.map_or(0.0, |b| b[j]);
        for part in partials.chunks_exact(n) {
            s += part[j];
        }
        *dst = s;
    }
    Ok(())
}

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "qkv_proj_wg",
            Op::QkvProj,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "scalar loads, any k; ROWS rows per workgroup share x; workgroup reduction; bias and q/k/v routing in the epilogue",
            WgslImpl::new(&QKV_WG, prepare).shared(shared_rows).check(check_qkv_wg),
        ),
        KernelDef::new(
            "qkv_proj_subgroup",
            Op::QkvProj,
            DType::FLOAT,
            ROWS_SG_PARAMS,
            "16-byte loads, one subgroup per row, subgroupAdd; bias and q/k/v routing in the epilogue",
            WgslImpl::new(&QKV_SG, prepare).subgroups().check(check_qkv_sg),
        ),
        KernelDef::new(
            "qkv_proj_dot4_cpu",
            Op::QkvProj,
            DType::FLOAT,
            ROW_CPU_PARAMS,
            "one pool pass over the rows of q, k and v together, four rows per SIMD call, bias in the epilogue",
            CpuImpl { run: run_qkv_dot4, check: check_isa },
        ),
        KernelDef::new(
            "qkv_proj_splitk_cpu",
            Op::QkvProj,
            DType::FLOAT,
            SPLITK_PARAMS,
            "split-k: the pool over slices of k, each task dot4s every row over its slice, partials summed with the bias",
            CpuImpl { run: run_qkv_splitk, check: check_isa },
        ),
        KernelDef::new(
            "qkv_proj_q_wg",
            Op::QkvProj,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "one quantized GEMV over the concatenated Q/K/V weight, bias and routing in the epilogue, workgroup reduction",
            WgslImpl::new(&QQKV_WG, prepare_q).shared(shared_rows).check(check_q_wgsl),
        ),
        KernelDef::new(
            "qkv_proj_q_dp4a_wg",
            Op::QkvProj,
            qdp4a::DTYPES,
            qdp4a::PARAMS_NO_SPLIT,
            "the normed input quantized once (int8 blocks, or f16 / f32) for the Q, K and V rows, dot4I8Packed block dots, \
             16-byte quant loads, ROWS rows share each activation load in registers; one workgroup reduction, bias and \
             q/k/v routing in the epilogue",
            WgslImpl::new(&QQKV_DP4A_WG, qdp4a::prepare).shared(qdp4a::shared).check(qdp4a::check),
        ),
        KernelDef::new(
            "qkv_proj_q_dp4a_subgroup",
            Op::QkvProj,
            qdp4a::DTYPES,
            qdp4a::PARAMS_NO_SPLIT,
            "as qkv_proj_q_dp4a_wg, finished by one subgroupAdd per row and one pass over the subgroups",
            WgslImpl::new(&QQKV_DP4A_SG, qdp4a::prepare).shared(qdp4a::shared_sg).subgroups().check(qdp4a::check_subgroup),
        ),
        KernelDef::new(
            "qkv_proj_q_cpu",
            Op::QkvProj,
            DType::QUANT,
            CPU_Q_PARAMS,
            "SIMD block dot products over the concatenated Q/K/V rows, f32 or int8 activations, bias added; pool over rows of all three",
            CpuImpl { run: run_qkv_q, check: check_quant },
        ),
    ]
}
