//! Decode matrix-vector product (GEMV), `y[n] = w[n,k] · x[k]`: the op that bounds
//! decode speed, so every kernel here is judged in GB/s against the device's read
//! bandwidth.
//!
//! WGSL: `gemv_wg` (scalar loads, any k, workgroup tree reduction), `gemv_vec`
//! (16-byte loads, workgroup reduction), `gemv_subgroup` (16-byte loads, one
//! `subgroupAdd` per row), `gemv_f16native` (`enable f16` storage).
//! CPU: `gemv_rows_cpu` (one row at a time) and `gemv_dot4_cpu` (four rows share
//! each activation load), both SIMD microkernels under a rayon orchestrator that
//! splits rows (dynamic grain or one static range per thread).

use rayon::prelude::*;

use super::simd::{self, Isa, Row};
use super::{
    CpuArgs, CpuImpl, CpuIn, DType, Impl, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, native_f16, p,
    packed_f16, wgsl_any, wrong_op,
};
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static GEMV_WG: Shader = shader!("gemv_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static GEMV_VEC: Shader = shader!("gemv_vec.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static GEMV_SUBGROUP: Shader = shader!("gemv_subgroup.wgsl", "row_sg.wgsl", "reduce_sg.wgsl", "wload.wgsl");
static GEMV_F16: Shader = shader!("gemv_f16.wgsl", "block_wg.wgsl", "reduce_wg.wgsl");

const BOTH: &[DType] = &[DType::F32, DType::F16];

const WG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8], default: 2, help: "output rows per workgroup" },
];

const SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "output rows per workgroup, spread over its subgroups" },
];

const CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[8, 16, 32, 64, 128, 256], default: 64, help: "rows per rayon task (dynamic strategy)" },
    ParamSpec {
        name: "strategy",
        values: &[0, 1],
        default: 0,
        help: "0 dynamic work stealing by rows_per_task, 1 one static row range per thread",
    },
    ParamSpec { name: "isa", values: simd::ISA_VALUES, default: 0, help: simd::ISA_HELP },
];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef {
            id: "gemv_wg",
            op: Op::Gemv,
            summary: "scalar loads, any k; ROWS rows per workgroup share x; workgroup tree reduction",
            dtypes: BOTH,
            params: WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GEMV_WG,
                workgroup_size: wg_size,
                shared_memory: shared_rows,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: wgsl_any,
                prepare: prepare_wg,
            }),
        },
        KernelDef {
            id: "gemv_vec",
            op: Op::Gemv,
            summary: "16-byte vector loads (4 f32 or 8 f16 weights), register partials, workgroup reduction",
            dtypes: BOTH,
            params: WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GEMV_VEC,
                workgroup_size: wg_size,
                shared_memory: shared_rows,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_vec,
                prepare: prepare_vec,
            }),
        },
        KernelDef {
            id: "gemv_subgroup",
            op: Op::Gemv,
            summary: "16-byte loads, one subgroup per row, subgroupAdd reduction, no barriers",
            dtypes: BOTH,
            params: SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GEMV_SUBGROUP,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_subgroup,
                prepare: prepare_subgroup,
            }),
        },
        KernelDef {
            id: "gemv_f16native",
            op: Op::Gemv,
            summary: "native f16 weight storage (enable f16), vec4<f16> loads, f32 accumulation",
            dtypes: &[DType::F16],
            params: WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GEMV_F16,
                workgroup_size: wg_size,
                shared_memory: shared_rows,
                needs_f16: native_f16,
                needs_subgroups: false,
                check: check_f16native,
                prepare: prepare_f16native,
            }),
        },
        KernelDef {
            id: "gemv_rows_cpu",
            op: Op::Gemv,
            summary: "one SIMD dot product per row; rayon over rows",
            dtypes: BOTH,
            params: CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_rows, check: check_cpu }),
        },
        KernelDef {
            id: "gemv_dot4_cpu",
            op: Op::Gemv,
            summary: "four rows per SIMD microkernel call sharing each x load; rayon over rows",
            dtypes: BOTH,
            params: CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_dot4, check: check_cpu }),
        },
    ]
}

fn wg_size(params: &Params) -> [u32; 3] {
    [p(params, "workgroup_size"), 1, 1]
}

fn shared_rows(_: &Problem, _: DType, params: &Params) -> u64 {
    4 * p(params, "workgroup_size") as u64 * p(params, "rows_per_wg") as u64
}

fn dims(s: &WgslSetup<'_>) -> Result<(usize, usize), KernelError> {
    match *s.problem {
        Problem::Gemv { n, k } => Ok((n, k)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

/// k must fill whole 16-byte loads: 4 f32 or 8 f16 weights.
pub fn vec_alignment(k: usize, dtype: DType) -> Result<(), String> {
    let need = if dtype == DType::F16 { 8 } else { 4 };
    if !k.is_multiple_of(need) {
        return Err(format!("k = {k} is not a multiple of {need} (16-byte {dtype} loads)"));
    }
    Ok(())
}

fn check_vec(_: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    match *prob {
        Problem::Gemv { k, .. } => vec_alignment(k, dtype),
        _ => Ok(()),
    }
}

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let wg = p(params, "workgroup_size");
    if caps.subgroup_max_size > wg {
        return Err(format!("workgroup of {wg} is smaller than the adapter's subgroup size {}", caps.subgroup_max_size));
    }
    check_vec(caps, prob, dtype, params)
}

fn check_f16native(_: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    match *prob {
        Problem::Gemv { k, .. } if k % 4 != 0 => Err(format!("k = {k} is not a multiple of 4 (vec4<f16> loads)")),
        _ => Ok(()),
    }
}

fn prepare_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, k) = dims(s)?;
    let (wg, rows) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("W_F16", s.w_f16())];
    s.one_step(&GEMV_WG, "main", &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

fn prepare_vec(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, k) = dims(s)?;
    let (wg, rows) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("W_F16", s.w_f16())];
    s.one_step(&GEMV_VEC, "main", &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

fn prepare_subgroup(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, k) = dims(s)?;
    let (wg, rows) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("W_F16", s.w_f16())];
    s.one_step(&GEMV_SUBGROUP, "main", &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

fn prepare_f16native(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, k) = dims(s)?;
    let (wg, rows) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", rows as f64)];
    s.one_step(&GEMV_F16, "main", &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

fn check_cpu(_: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(p(params, "isa"))
}

/// Row `r` of a row-major `[_, k]` weight.
#[inline]
pub fn row(w: CpuIn<'_>, r: usize, k: usize) -> Row<'_> {
    match w {
        CpuIn::F32(s) => Row::F32(&s[r * k..(r + 1) * k]),
        CpuIn::F16(s) => Row::F16(&s[r * k..(r + 1) * k]),
        // Float kernels never get a quantized buffer: the registry checks dtypes.
        CpuIn::Q(_) => Row::F32(&[]),
    }
}

/// Splits `y` into chunks by the CPU orchestration parameters and runs `f(first_row, chunk)`
/// on each, in parallel. Shared by every row-parallel CPU kernel.
pub fn par_rows(y: &mut [f32], params: &Params, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let n = y.len();
    if n == 0 {
        return;
    }
    let grain = match p(params, "strategy") {
        1 => n.div_ceil(rayon::current_num_threads()).max(1),
        _ => (p(params, "rows_per_task") as usize).max(1),
    };
    y.par_chunks_mut(grain).enumerate().for_each(|(i, chunk)| f(i * grain, chunk));
}

/// One dot product per row.
pub fn gemv_rows(isa: Isa, x: &[f32], w: CpuIn<'_>, k: usize, first: usize, y: &mut [f32]) {
    for (i, out) in y.iter_mut().enumerate() {
        *out = simd::dot(isa, x, row(w, first + i, k));
    }
}

/// Four rows per microkernel call.
pub fn gemv_dot4(isa: Isa, x: &[f32], w: CpuIn<'_>, k: usize, first: usize, y: &mut [f32]) {
    let n = y.len();
    let mut i = 0;
    while i + 4 <= n {
        let r = first + i;
        let v = simd::dot4(isa, x, [row(w, r, k), row(w, r + 1, k), row(w, r + 2, k), row(w, r + 3, k)]);
        y[i..i + 4].copy_from_slice(&v);
        i += 4;
    }
    for (j, yj) in y.iter_mut().enumerate().take(n).skip(i) {
        *yj = simd::dot(isa, x, row(w, first + j, k));
    }
}

fn run_rows(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemv { n, k } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    par_rows(&mut a.outs[0][..n], params, |first, y| gemv_rows(isa, &x[..k], w, k, first, y));
    Ok(())
}

fn run_dot4(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemv { n, k } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    par_rows(&mut a.outs[0][..n], params, |first, y| gemv_dot4(isa, &x[..k], w, k, first, y));
    Ok(())
}
