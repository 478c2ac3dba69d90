//! GEMM over block-quantized weights (prefill): `y[m,n] = x[m,k] · w[n,k]ᵀ` with
//! `w` in ggml blocks (the split layout of [`QMatrix`](crate::kernels::quant::QMatrix)).
//!
//! WGSL: `gemm_q_tiled` (block columns of w dequantized into workgroup memory with
//! the x tile, 4x4 register blocks; `QFMT` override, weight bound as quants and
//! scales). CPU: `gemm_q_rows_cpu` (each weight row dequantized once into L1, dotted
//! with tiles of tokens), `gemm_q_panel_cpu` (blocks of weight rows dequantized
//! into an f32 panel, then the cache-blocked f32 GEMM of [`super`]) and
//! `gemm_q_i8_cpu` (int8 activations, interleaved rows, VNNI: [`crate::kernels::cpu::qgemm`]).
//! k must be a whole number of 32-element blocks.

use super::{Blocking, Micro, Split, gemm_blocked};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, groups};
use crate::kernels::cpu::qgemm::{I8_GEMM_PARAMS, XPanel, check_i8_gemm, rows_times_tokens_i8};
use crate::kernels::cpu::{ISA, Isa, check_quant, dequantize_row, par_row_blocks, qin, rows_times_tokens, scatter_row_blocks};
use crate::kernels::wgsl::{check_blocks, grid_dim, one_q_step, qfmt};
use crate::kernels::{
    CpuArgs, CpuImpl, CpuIn, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, param, wrong_op,
};
use crate::shader;

static QGEMM_TILED: Shader = shader!("qgemm_tiled.wgsl", "qblock.wgsl");

const TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "tile_m", values: &[16, 32, 64], default: 32, help: "rows of y per workgroup (4 per invocation)" },
    ParamSpec { name: "tile_n", values: &[16, 32, 64, 128], default: 64, help: "columns of y per workgroup (4 per invocation)" },
];

const CPU_GEMM_ROWS_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[4, 8, 16, 32, 64], default: 16, help: "weight rows per pool task" },
    ParamSpec::new("tokens_per_tile", &[4, 16, 64], 16, "tokens swept per dequantized weight row while it is in L1"),
    ISA,
];

const CPU_PANEL_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "nc", values: &[64, 128, 256, 512], default: 256, help: "weight rows dequantized into one f32 panel" },
    ParamSpec { name: "kc", values: &[128, 256, 512], default: 256, help: "depth of a packed block of the f32 GEMM" },
    ISA,
];

fn check_tiled(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    if let Problem::Gemm { m, n, .. } = *prob {
        grid_dim(caps, groups(n, param(params, "tile_n")?) as usize, "n")?;
        grid_dim(caps, groups(m, param(params, "tile_m")?) as usize, "m")?;
    }
    Ok(())
}

fn tiled_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([(param(params, "tile_m")? / 4) * (param(params, "tile_n")? / 4), 1, 1])
}

fn tiled_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(4 * (param(params, "tile_m")? as u64 * 32 + param(params, "tile_n")? as u64 * 33))
}

fn prepare_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemm { m, n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (tm, tn) = (s.param("tile_m")?, s.param("tile_n")?);
    let [wgs, _, _] = tiled_wg(s.params)?;
    let consts = [("TILE_M", tm as f64), ("TILE_N", tn as f64), ("WGS", wgs as f64), ("QFMT", qfmt(s.dtype))];
    one_q_step(s, 1, &consts, &[m as u32, n as u32, k as u32], [groups(n, tn).max(1), groups(m, tm).max(1), 1])
}

fn run_gemm_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let tile = param(params, "tokens_per_tile")? as usize;
    let parts = par_row_blocks(n, grain, |r0, count| rows_times_tokens(isa, x, m, k, w, r0, count, tile));
    scatter_row_blocks(parts, m, n, &mut a.outs[0][..m * n]);
    Ok(())
}

fn run_gemm_i8(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let xp = XPanel::quantize(&x[..m * k], m, k);
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let parts = par_row_blocks(n, grain, |r0, count| rows_times_tokens_i8(isa, &xp, w, r0, count));
    scatter_row_blocks(parts, m, n, &mut a.outs[0][..m * n]);
    Ok(())
}

fn run_gemm_panel(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let micro = Micro::for_isa(isa);
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let nc = (param(params, "nc")? as usize).max(1);
    let blk = Blocking { mc: 96, nc: 128.min(nc), kc: (param(params, "kc")? as usize).max(1) };
    let y = &mut a.outs[0][..m * n];
    let mut panel = vec![0f32; nc.min(n) * k];
    let mut tmp = vec![0f32; m * nc.min(n)];
    for j0 in (0..n).step_by(nc) {
        let nb = nc.min(n - j0);
        crate::kernels::cpu::pool::for_chunks_mut(&mut panel[..nb * k], k, |i, row| dequantize_row(isa, w, j0 + i, k, row));
        gemm_blocked(micro, blk, Split::Auto, m, nb, k, x, CpuIn::F32(&panel[..nb * k]), &mut tmp[..m * nb]);
        for t in 0..m {
            y[t * n + j0..][..nb].copy_from_slice(&tmp[t * nb..][..nb]);
        }
    }
    Ok(())
}

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "gemm_q_tiled",
            Op::Gemm,
            DType::QUANT,
            TILED_PARAMS,
            "block columns of w dequantized into workgroup memory with the x tile; 4x4 register blocks",
            WgslImpl::new(&QGEMM_TILED, prepare_tiled).workgroup(tiled_wg).shared(tiled_shared).check(check_tiled),
        ),
        KernelDef::new(
            "gemm_q_rows_cpu",
            Op::Gemm,
            DType::QUANT,
            CPU_GEMM_ROWS_PARAMS,
            "each weight row dequantized once into L1, dotted with tiles of tokens; pool over rows",
            CpuImpl { run: run_gemm_rows, check: check_quant },
        ),
        KernelDef::new(
            "gemm_q_i8_cpu",
            Op::Gemm,
            DType::QUANT,
            I8_GEMM_PARAMS,
            "activations quantized to int8 blocks once; weight rows interleaved 16 to a vector per task; VNNI tiles of 32 rows x 4 tokens",
            CpuImpl { run: run_gemm_i8, check: check_i8_gemm },
        ),
        KernelDef::new(
            "gemm_q_panel_cpu",
            Op::Gemm,
            DType::QUANT,
            CPU_PANEL_PARAMS,
            "nc weight rows dequantized into an f32 panel, then the cache-blocked f32 GEMM microkernel",
            CpuImpl { run: run_gemm_panel, check: check_quant },
        ),
    ]
}
