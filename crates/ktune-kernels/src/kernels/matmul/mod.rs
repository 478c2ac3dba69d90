//! The matrix-matrix family: prefill GEMM, `y[m,n] = x[m,k] · w[n,k]ᵀ` (a Hugging Face
//! Linear, weight row-major `[n,k]`): the op that bounds prefill speed, judged in
//! GFLOP/s.
//!
//! WGSL: `gemm_simple` (one column and `rows_per_thread` rows per invocation, scalar
//! loads, any shape) and `gemm_tiled` (workgroup-memory tiles of x and w staged with
//! 16-byte loads, each invocation accumulating a `reg_m x reg_n` register block),
//! `gemm_coop16` / `gemm_coop8` / `gemm_mma_emu` (the matrix-tile GEMM on
//! cooperative matrices and its plain-loop emulation, shared with the block formats
//! and gate_up: [`mma`]).
//! CPU: `gemm_blocked_cpu` (our own cache-blocked GEMM, the CPU layer's engine
//! [`cpu::sgemm`](crate::kernels::cpu::sgemm): x packed into MR-row panels, w packed into NR-row panels with
//! f16 → f32 conversion, an MR x NR register-blocked FMA microkernel, tasks over
//! tokens or features) and `gemm_crate_cpu` (the `gemm` crate, as the yardstick the
//! tuner measures ours against). Block-format weights: [`quant`].

pub mod mma;
pub mod quant;

use std::cell::RefCell;

use half::f16;
use rayon::prelude::*;

use super::contract::{CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use super::cpu::sgemm::{Blocking, Micro, Split, gemm_blocked};
use super::cpu::{ISA, Isa, with_scratch};
use super::problem::{Op, Problem};
use super::quant::DType;
use super::wgsl::vec_alignment;
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, groups};
use crate::shader;

static GEMM_SIMPLE: Shader = shader!("gemm_simple.wgsl", "gemm_col.wgsl", "wload.wgsl");
static GEMM_TILED: Shader = shader!(head "gemm_tiling.wgsl"; "gemm_tiled.wgsl", "gemm_tile.wgsl", "reg_tile.wgsl", "wload.wgsl");

pub(crate) const SIMPLE_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_x", values: &[8, 16, 32, 64], default: 16, help: "invocations per workgroup along n (columns of y)" },
    ParamSpec { name: "workgroup_y", values: &[1, 2, 4, 8, 16], default: 4, help: "invocations per workgroup along m (rows of y)" },
    ParamSpec { name: "rows_per_thread", values: &[1, 2, 4], default: 1, help: "rows of y per invocation, sharing each weight load" },
];

pub(crate) const TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "tile_m", values: &[16, 32, 64, 128], default: 64, help: "rows of y per workgroup" },
    ParamSpec { name: "tile_n", values: &[16, 32, 64, 128], default: 64, help: "columns of y per workgroup" },
    ParamSpec { name: "tile_k", values: &[8, 16, 32], default: 16, help: "depth of the x and w tiles staged in workgroup memory per step" },
    ParamSpec { name: "reg_m", values: &[4, 8], default: 4, help: "rows of y per invocation (register block)" },
    ParamSpec { name: "reg_n", values: &[4, 8], default: 4, help: "columns of y per invocation (register block)" },
];

pub(crate) const BLOCKED_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("mc", &[48, 96, 144, 192, 384], 96, "rows of x per L2 block (and per task when splitting tokens)"),
    ParamSpec::new("nc", &[64, 128, 256, 512, 1024], 256, "rows of w per packed block (and per task when splitting features)"),
    ParamSpec { name: "kc", values: &[64, 128, 256, 384, 512], default: 256, help: "depth of a packed block (k per pass)" },
    ParamSpec {
        name: "split",
        values: &[0, 1, 2],
        default: 0,
        help: "rayon split: 0 auto (features unless n is too narrow, balanced), 1 tokens (m) by mc, 2 features (n) by nc",
    },
    ISA,
];

const CRATE_PARAMS: &[ParamSpec] = &[ParamSpec::new(
    "threads",
    &[0, 1, 2, 4],
    0,
    "gemm crate parallelism: 0 Rayon over the whole pool, 1 Parallelism::None, t > 1 Rayon(t)",
)];

pub fn variants() -> Vec<KernelDef> {
    let mut v = vec![
        KernelDef::new(
            "gemm_simple",
            Op::Gemm,
            DType::FLOAT,
            SIMPLE_PARAMS,
            "one column and rows_per_thread rows of y per invocation, scalar loads, any shape",
            WgslImpl::new(&GEMM_SIMPLE, prepare_simple).workgroup(simple_wg).check(check_simple),
        ),
        KernelDef::new(
            "gemm_tiled",
            Op::Gemm,
            DType::FLOAT,
            TILED_PARAMS,
            "x and w tiles in workgroup memory via 16-byte loads, reg_m x reg_n outputs per invocation",
            WgslImpl::new(&GEMM_TILED, prepare_tiled).workgroup(tiled_wg).shared(tiled_shared).check(check_tiled),
        ),
        KernelDef::new(
            "gemm_blocked_cpu",
            Op::Gemm,
            DType::FLOAT,
            BLOCKED_PARAMS,
            "cache-blocked, packed panels (f16 widened while packing), MR x NR FMA microkernel; rayon over tokens or features",
            CpuImpl { run: run_blocked, check: check_blocked },
        ),
        KernelDef::new(
            "gemm_crate_cpu",
            Op::Gemm,
            DType::FLOAT,
            CRATE_PARAMS,
            "the `gemm` crate (f16 weights widened to f32 first), the yardstick for gemm_blocked_cpu",
            CpuImpl { run: run_crate, check: crate::kernels::contract::cpu_any },
        ),
    ];
    // the matrix-tile GEMMs (mma.rs) after the SIMT ones
    v.splice(2..2, mma::gemm_variants());
    v
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

pub(crate) fn simple_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "workgroup_x")?, param(params, "workgroup_y")?, 1])
}

fn tiled_threads(params: &Params) -> Result<(u32, u32), KernelError> {
    let (tm, tn) = (param(params, "tile_m")?, param(params, "tile_n")?);
    let (rm, rn) = (param(params, "reg_m")?.max(1), param(params, "reg_n")?.max(1));
    Ok((tm / rm, tn / rn))
}

pub(crate) fn tiled_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    let (ty, tx) = tiled_threads(params)?;
    Ok([tx * ty, 1, 1])
}

/// The x tile `[tile_m, tile_k]` and the w tile `[tile_n, tile_k]` as f32, each row
/// padded by one vec4 (16 bytes) against bank conflicts.
pub(crate) fn tiled_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let (tm, tn, tk) = (param(params, "tile_m")? as u64, param(params, "tile_n")? as u64, param(params, "tile_k")? as u64);
    Ok(16 * (tm + tn) * (tk / 4 + 1))
}

fn gemm_dims(prob: &Problem) -> Option<(usize, usize, usize)> {
    match *prob {
        Problem::Gemm { m, n, k } => Some((m, n, k)),
        _ => None,
    }
}

fn dims(s: &WgslSetup<'_>) -> Result<(usize, usize, usize), KernelError> {
    gemm_dims(s.problem).ok_or_else(|| wrong_op(s.kernel, s.problem))
}

/// Workgroup counts along x (columns of y) and y (rows of y) against the adapter's
/// per-dimension limit (this family dispatches 2D grids: no linearised index).
fn check_grid(caps: &GpuCaps, gx: u32, gy: u32) -> Result<(), String> {
    let lim = caps.max_workgroups_per_dimension;
    if gx > lim || gy > lim {
        return Err(format!("needs a {gx}x{gy} grid of workgroups, over the adapter's {lim} per dimension"));
    }
    Ok(())
}

pub(crate) fn simple_grid(m: usize, n: usize, params: &Params) -> Result<(u32, u32), KernelError> {
    let rows = param(params, "workgroup_y")? * param(params, "rows_per_thread")?;
    Ok((groups(n, param(params, "workgroup_x")?), groups(m, rows)))
}

fn check_simple(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some((m, n, _)) = gemm_dims(prob) else { return Ok(()) };
    simple_rules(caps, m, n, params)
}

/// The column GEMM's grid (`gemm_col.wgsl`) for a `[m, n]` output.
pub(crate) fn simple_rules(caps: &GpuCaps, m: usize, n: usize, params: &Params) -> Result<(), String> {
    let (gx, gy) = simple_grid(m, n, params)?;
    check_grid(caps, gx, gy)
}

/// The rules of the `gemm_tile.wgsl` body: whole register blocks, at most 8x8 of
/// them, whole 16-byte f16 loads per tile step, k in whole 16-byte loads, the grid.
pub(crate) fn tiled_rules(caps: &GpuCaps, m: usize, n: usize, k: usize, dtype: DType, params: &Params) -> Result<(), String> {
    let (tm, tn, tk) = (param(params, "tile_m")?, param(params, "tile_n")?, param(params, "tile_k")?);
    let (rm, rn) = (param(params, "reg_m")?, param(params, "reg_n")?);
    if rm == 0 || rn == 0 || tm % rm != 0 || tn % rn != 0 {
        return Err(format!("tile {tm}x{tn} is not a whole number of {rm}x{rn} register blocks"));
    }
    if rm > 8 || rn > 8 {
        return Err(format!("register block {rm}x{rn} exceeds the shader's 8x8 accumulator array"));
    }
    if tk % 8 != 0 {
        return Err(format!("tile_k = {tk} is not a multiple of 8 (one 16-byte load of f16 weights)"));
    }
    vec_alignment(k, dtype)?;
    let (gx, gy) = tiled_grid(m, n, params)?;
    check_grid(caps, gx, gy)
}

/// The override constants of the `gemm_tile.wgsl` body.
pub(crate) fn tiled_consts(params: &Params, w_f16: f64) -> Result<[(&'static str, f64); 7], KernelError> {
    let [wgs, _, _] = tiled_wg(params)?;
    Ok([
        ("TILE_M", param(params, "tile_m")? as f64),
        ("TILE_N", param(params, "tile_n")? as f64),
        ("TILE_K", param(params, "tile_k")? as f64),
        ("REG_M", param(params, "reg_m")? as f64),
        ("REG_N", param(params, "reg_n")? as f64),
        ("WGS", wgs as f64),
        ("W_F16", w_f16),
    ])
}

/// The override constants of the `gemm_col.wgsl` body.
pub(crate) fn simple_consts(params: &Params, w_f16: f64) -> Result<[(&'static str, f64); 4], KernelError> {
    Ok([
        ("WG_X", param(params, "workgroup_x")? as f64),
        ("WG_Y", param(params, "workgroup_y")? as f64),
        ("ROWS", param(params, "rows_per_thread")? as f64),
        ("W_F16", w_f16),
    ])
}

fn prepare_simple(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (m, n, k) = dims(s)?;
    let consts = simple_consts(s.params, s.w_f16())?;
    let (gx, gy) = simple_grid(m, n, s.params)?;
    s.one_step("main", &consts, &[m as u32, n as u32, k as u32], [gx.max(1), gy.max(1), 1])
}

pub(crate) fn tiled_grid(m: usize, n: usize, params: &Params) -> Result<(u32, u32), KernelError> {
    Ok((groups(n, param(params, "tile_n")?), groups(m, param(params, "tile_m")?)))
}

fn check_tiled(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    match gemm_dims(prob) {
        Some((m, n, k)) => tiled_rules(caps, m, n, k, dtype, params),
        // (no shape: the parameter rules alone, on a problem k = 8 always meets)
        None => tiled_rules(caps, 0, 0, 8, dtype, params),
    }
}

fn prepare_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (m, n, k) = dims(s)?;
    let consts = tiled_consts(s.params, s.w_f16())?;
    let (gx, gy) = tiled_grid(m, n, s.params)?;
    s.one_step("main", &consts, &[m as u32, n as u32, k as u32], [gx.max(1), gy.max(1), 1])
}

// ---------------------------------------------------------------------------------
// CPU: orchestration
// ---------------------------------------------------------------------------------

fn check_blocked(_: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)
}

fn run_blocked(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let micro = Micro::for_isa(Isa::of(params)?);
    let blk = Blocking { mc: param(params, "mc")? as usize, nc: param(params, "nc")? as usize, kc: param(params, "kc")? as usize };
    let split = Split::from_param(param(params, "split")?);
    gemm_blocked(micro, blk, split, m, n, k, a.ins[0].f32(), a.ins[1], &mut a.outs[0][..m * n]);
    Ok(())
}

thread_local! {
    /// f16 weights widened for the `gemm` crate.
    static WIDE_W: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

// ---------------------------------------------------------------------------------
// CPU: the gemm crate
// ---------------------------------------------------------------------------------

fn run_crate(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let par = match param(params, "threads")? {
        1 => gemm::Parallelism::None,
        t => gemm::Parallelism::Rayon(t as usize),
    };
    let x = &a.ins[0].f32()[..m * k];
    let y = &mut a.outs[0][..m * n];
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    match a.ins[1] {
        CpuIn::F32(w) => crate_gemm(m, n, k, x, &w[..n * k], y, par),
        CpuIn::F16(w) => with_scratch(&WIDE_W, n * k, |wide| {
            widen(&w[..n * k], wide);
            crate_gemm(m, n, k, x, wide, y, par)
        }),
        CpuIn::Q(_) | CpuIn::Stack(_) => {
            return Err(KernelError::BufferType { kernel: "gemm_crate_cpu".into(), buffer: "w".into(), expected: "f32 or f16" });
        }
    }
    Ok(())
}

/// f16 → f32 over the rayon pool.
fn widen(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| s.convert_to_f32_slice(d));
}

fn crate_gemm(m: usize, n: usize, k: usize, x: &[f32], w: &[f32], y: &mut [f32], par: gemm::Parallelism) {
    assert!(x.len() >= m * k && w.len() >= n * k && y.len() >= m * n);
    // SAFETY: dst m x n (row stride n), lhs = x m x k (row stride k), rhs = wᵀ k x n
    // (element (p, j) at j*k + p): every access is inside the slices asserted above.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        crate::kernels::cpu::testdata::signed(len, seed)
    }

    #[test]
    fn crate_variant_matches_reference() {
        let (m, n, k) = (19, 23, 31);
        let x = data(m * k, 4);
        let w = data(n * k, 5);
        let wide = |v: &[f32]| v.iter().map(|&e| e as f64).collect::<Vec<f64>>();
        let want = crate::kernels::reference::compute(&Problem::Gemm { m, n, k }, &[wide(&x), wide(&w)]).remove(0);
        for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(0)] {
            let mut y = vec![0.0; m * n];
            crate_gemm(m, n, k, &x, &w, &mut y, par);
            for (got, exp) in y.iter().zip(&want) {
                assert!((*got as f64 - exp).abs() < 1e-4 * k as f64);
            }
        }
    }
}
