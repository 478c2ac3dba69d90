//! The matrix-vector family (decode): GEMV, `y[n] = w[n,k] · x[k]`, the op that
//! bounds decode speed, so every kernel here is judged in GB/s against the device's
//! read bandwidth; and the kernels that fuse into it or produce their output from it:
//! [`norm_gemv`] (RMSNorm prologue + GEMV), [`gate_up`] (gate and up projections
//! with the activation product in the epilogue, decode and prefill forms) and
//! [`qkv`] (the Q/K/V projections of one token in one pass). Block formats of the
//! GEMV are in [`quant`] and, second generation (activation quantized once,
//! `dot4I8Packed` block dots, register accumulators, split-K), in [`qdp4a`]; each
//! fused op's module holds its float and block forms.
//!
//! This file, float GEMV. WGSL: `gemv_wg` (scalar loads, any k, workgroup tree reduction), `gemv_vec`
//! (16-byte loads, workgroup reduction), `gemv_subgroup` (16-byte loads, one
//! `subgroupAdd` per row), `gemv_f16native` (`enable f16` storage), `gemv_thread`
//! (one invocation per row, no reduction).
//! CPU: `gemv_rows_cpu` (one row at a time) and `gemv_dot4_cpu` (four rows share
//! each activation load), both SIMD microkernels under a pool orchestrator that
//! splits rows (dynamic grain or one static range per thread).
//!
//! A new GEMV variant is its shader, one `KernelDef::new` line in `variants()` below
//! (reusing `prepare` when it takes `WG`/`ROWS`), and its test.

pub mod gate_up;
pub mod norm_gemv;
pub mod qdp4a;
pub mod qkv;
pub mod quant;

use super::contract::{CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, wrong_op};
use super::cpu::{self, ISA, Isa, ROWS_PER_TASK, RowSplit, STRATEGY, check_isa, par_rows, row};
use super::problem::{Op, Problem};
use super::quant::DType;
use super::wgsl::{ROWS_SG_UNROLL_PARAMS, ROWS_WG_PARAMS, shared_rows, subgroup_fits, vec_alignment};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static GEMV_WG: Shader = shader!("gemv_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static GEMV_VEC: Shader = shader!("gemv_vec.wgsl", "gemv16.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static GEMV_SUBGROUP: Shader =
    shader!("gemv_subgroup.wgsl", "gemv16.wgsl", "row_dot16.wgsl", "row_sg.wgsl", "reduce_sg.wgsl", "wload.wgsl");
static GEMV_F16: Shader = shader!("gemv_f16.wgsl", "block_wg.wgsl", "reduce_wg.wgsl");
static GEMV_THREAD: Shader = shader!("gemv_thread.wgsl", "gemv16.wgsl", "wload.wgsl");

/// One invocation per row: only the workgroup size is tuned.
const THREAD_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations (rows) per workgroup" }];

/// `rows_per_task` of the float GEMV orchestrators (dynamic strategy).
pub(super) const ROWS_PER_TASK_DYN: ParamSpec =
    ParamSpec { name: "rows_per_task", help: "rows per pool task (dynamic strategy)", ..ROWS_PER_TASK };
/// The row-parallel GEMV orchestration: grain, strategy and ISA.
pub(super) const CPU_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK_DYN, STRATEGY, ISA];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "gemv_wg",
            Op::Gemv,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "scalar loads, any k; ROWS rows per workgroup share x; workgroup tree reduction",
            WgslImpl::new(&GEMV_WG, prepare).shared(shared_rows),
        ),
        KernelDef::new(
            "gemv_vec",
            Op::Gemv,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "16-byte vector loads (4 f32 or 8 f16 weights), register partials, workgroup reduction",
            WgslImpl::new(&GEMV_VEC, prepare).shared(shared_rows).check(check_vec),
        ),
        KernelDef::new(
            "gemv_subgroup",
            Op::Gemv,
            DType::FLOAT,
            ROWS_SG_UNROLL_PARAMS,
            "16-byte loads, `unroll` a lane in flight, one subgroup per row, subgroupAdd reduction, no barriers",
            WgslImpl::new(&GEMV_SUBGROUP, prepare).subgroups().check(check_subgroup),
        ),
        KernelDef::new(
            "gemv_f16native",
            Op::Gemv,
            &[DType::F16],
            ROWS_WG_PARAMS,
            "native f16 weight storage (enable f16), vec4<f16> loads, f32 accumulation",
            WgslImpl::new(&GEMV_F16, prepare).shared(shared_rows).native_f16().check(check_f16native),
        ),
        KernelDef::new(
            "gemv_thread",
            Op::Gemv,
            DType::FLOAT,
            THREAD_PARAMS,
            "one invocation per row, 16-byte loads into two register accumulators; no workgroup memory, no barrier",
            WgslImpl::new(&GEMV_THREAD, prepare_thread).check(check_vec),
        ),
        KernelDef::new(
            "gemv_rows_cpu",
            Op::Gemv,
            DType::FLOAT,
            CPU_PARAMS,
            "one SIMD dot product per row; pool over rows",
            CpuImpl { run: run_rows, check: check_isa },
        ),
        KernelDef::new(
            "gemv_dot4_cpu",
            Op::Gemv,
            DType::FLOAT,
            CPU_PARAMS,
            "four rows per SIMD microkernel call sharing each x load; pool over rows",
            CpuImpl { run: run_dot4, check: check_isa },
        ),
    ]
}

/// One prepare for the four GEMV shaders: `WG` and `ROWS`, plus `W_F16` for the
/// packed-f16 shaders (the native-f16 one declares its storage type instead).
fn prepare(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, k) = dims(s)?;
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let unroll = s.params.get("unroll").map(|&u| ("UNROLL", u as f64));
    let consts: Vec<_> = [("WG", wg as f64), ("ROWS", rows as f64)].into_iter().chain(s.w_f16_const()).chain(unroll).collect();
    s.one_step("main", &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

/// `gemv_thread`: a workgroup of `WG` rows.
fn prepare_thread(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, k) = dims(s)?;
    let wg = s.param("workgroup_size")?;
    let consts: Vec<_> = [("WG", wg as f64)].into_iter().chain(s.w_f16_const()).collect();
    s.one_step("main", &consts, &[n as u32, k as u32], grid_2d(groups(n, wg)))
}

fn dims(s: &WgslSetup<'_>) -> Result<(usize, usize), KernelError> {
    match *s.problem {
        Problem::Gemv { n, k } => Ok((n, k)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn check_vec(_: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    match *prob {
        Problem::Gemv { k, .. } => vec_alignment(k, dtype),
        _ => Ok(()),
    }
}

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    check_vec(caps, prob, dtype, params)
}

fn check_f16native(_: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    match *prob {
        Problem::Gemv { k, .. } if k % 4 != 0 => Err(format!("k = {k} is not a multiple of 4 (vec4<f16> loads)")),
        _ => Ok(()),
    }
}

/// One dot product per row.
pub fn gemv_rows(isa: Isa, x: &[f32], w: CpuIn<'_>, k: usize, first: usize, y: &mut [f32]) {
    for (i, out) in y.iter_mut().enumerate() {
        *out = cpu::dot(isa, x, row(w, first + i, k));
    }
}

/// Four rows per microkernel call.
pub fn gemv_dot4(isa: Isa, x: &[f32], w: CpuIn<'_>, k: usize, first: usize, y: &mut [f32]) {
    let n = y.len();
    let mut i = 0;
    while i + 4 <= n {
        let r = first + i;
        let v = cpu::dot4(isa, x, [row(w, r, k), row(w, r + 1, k), row(w, r + 2, k), row(w, r + 3, k)]);
        y[i..i + 4].copy_from_slice(&v);
        i += 4;
    }
    for (j, yj) in y.iter_mut().enumerate().take(n).skip(i) {
        *yj = cpu::dot(isa, x, row(w, first + j, k));
    }
}

/// A row-parallel float GEMV over one of the microkernels above.
type GemvMicro = fn(Isa, &[f32], CpuIn<'_>, usize, usize, &mut [f32]);

fn run_gemv(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>, micro: GemvMicro) -> Result<(), KernelError> {
    let Problem::Gemv { n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    par_rows(&mut a.outs[0][..n], 1, RowSplit::of(params)?, |first, y| micro(isa, &x[..k], w, k, first, y));
    Ok(())
}

fn run_rows(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_gemv(kd, prob, params, a, gemv_rows)
}

fn run_dot4(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_gemv(kd, prob, params, a, gemv_dot4)
}
