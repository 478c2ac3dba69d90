//! The gate and up projections with the activation product in the epilogue
//! (`gate_up`, `y = act(x·w_gateᵀ) * (x·w_upᵀ)` over one concatenated `[2n, k]`
//! weight): a GEMV in decode and a GEMM in prefill whose output is the MLP's gated
//! activation. It lives in the matrix-vector family (the projection it fuses is the
//! bulk of its work); float and block-format variants are both here.
//!
//! WGSL: `gate_up_wg` (GEMV style, gate and up rows of ROWS features share each x
//! load, workgroup reduction), `gate_up_subgroup` (16-byte loads, one subgroup per
//! feature), `gate_up_tiled` (prefill GEMM with register blocking), `gate_up_q_wg`
//! (block formats), `gate_up_q_subgroup` (block formats, a subgroup per feature),
//! `gate_up_q_dp4a_wg` / `_subgroup` (decode, second generation:
//! the token quantized once for the gate and up rows, int8 block dots; the shared
//! program is in [`qdp4a`](super::qdp4a)), and on the matrix-tile GEMM's tiling
//! (cooperative matrices or their emulation, gate and up accumulated side by side,
//! the activation in the epilogue): `gate_up_coop16/8`, `gate_up_mma_emu` and the
//! block-format `gate_up_q_coop16/8`, `gate_up_q_mma_emu`
//! ([`crate::kernels::matmul::mma`]). CPU: `gate_up_dot4_cpu` (dot4 over interleaved gate/up rows),
//! `gate_up_blocked_cpu` (feature blocks with a packed f32 panel and the 2x4
//! microkernel), `gate_up_q_cpu` (block dot products in decode, each row
//! dequantized once in prefill) and `gate_up_q_dots_cpu` (a decode batch: each
//! token's dots as the decode's).

use half::f16;
use rayon::prelude::*;

use super::qdp4a;
use super::qkv::ROW_CPU_PARAMS;
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::kernels::act::gated_simd;
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use crate::kernels::cpu::qgemm::{I8_GEMM_PARAMS, I8Kernel, XPanel, active_panels, check_i8_gemm, rows_times_tokens_i8};
use crate::kernels::cpu::{
    self, ACT_BITS, ActVec, ISA, Isa, ROWS_PER_TASK, RowSplit, act_f32, check_isa, check_quant, par_rows, qin, row, row_blocks,
    rows_times_tokens, with_scratch,
};
use crate::kernels::problem::{Activation, Op, Problem};
use crate::kernels::quant::{DType, QView};
use crate::kernels::wgsl::{
    ROWS_WG_PARAMS, UNROLL, WORKGROUP_SIZE, grid_dim, grid_fits, one_q_step, qfmt, storage_buffers, subgroup_fits, vec_alignment,
};
use crate::shader;

static GATE_UP_WG: Shader = shader!("fused_gate_up_wg.wgsl", "act.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static GATE_UP_SG: Shader = shader!("fused_gate_up_subgroup.wgsl", "act.wgsl", "wload.wgsl", "grid_sg.wgsl", "grid.wgsl");
static GATE_UP_TILED: Shader = shader!("fused_gate_up_tiled.wgsl", "act.wgsl", "wload.wgsl");
static QGATE_UP_WG: Shader = shader!("qgate_up_wg.wgsl", "qgate_up.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl", "reduce_wg.wgsl");
static QGATE_UP_SG: Shader =
    shader!("qgate_up_subgroup.wgsl", "qgate_up.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl", "grid_sg.wgsl", "grid.wgsl");
static QGATE_UP_DP4A_WG: Shader = shader!(head "qdp4a_head.wgsl"; "qdp4a_gate_up.wgsl", "qdp4a_rows.wgsl", "qdp4a_main_wg.wgsl", "qdp4a.wgsl", "qgeom.wgsl", "act.wgsl", "reduce_wg.wgsl");
static QGATE_UP_DP4A_SG: Shader =
    shader!(head "qdp4a_head.wgsl"; "qdp4a_gate_up.wgsl", "qdp4a_rows.wgsl", "qdp4a_main_sg.wgsl", "qdp4a.wgsl", "qgeom.wgsl", "act.wgsl");

const GATE_UP_WG_PARAMS: &[ParamSpec] = &[
    WORKGROUP_SIZE,
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4], default: 2, help: "features (gate and up row pairs) per workgroup" },
];
const FEATURES_PER_WG: ParamSpec =
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "features per workgroup, spread over its subgroups" };
const GATE_UP_SG_PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE, FEATURES_PER_WG];
const Q_GATE_UP_SG_PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE, FEATURES_PER_WG, UNROLL];
const GATE_UP_TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "thread_m", values: &[1, 2, 4], default: 2, help: "token rows per invocation (tile height 16*thread_m)" },
    ParamSpec { name: "thread_n", values: &[1, 2, 4], default: 2, help: "features per invocation (tile width 16*thread_n)" },
    ParamSpec { name: "tile_k", values: &[8, 16, 32], default: 16, help: "k staged in workgroup memory per step" },
];
const BLOCKED_CPU_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("block_n", &[8, 16, 32, 64, 128], 32, "features per rayon task; its weight panel is reused by every token"), ISA];
/// `act_bits` applies to decode (one token); prefill rows stay f32.
const CPU_Q_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS];
const CPU_Q_PANEL_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("nc", &[32, 64, 128, 256], 128, "features per panel: their gate and up rows dequantized into one f32 panel"),
    ParamSpec::new("kc", &[128, 256, 512], 256, "depth of a packed block of the f32 GEMM"),
    ISA,
];

pub fn variants() -> Vec<KernelDef> {
    let mut v = vec![
        KernelDef::new(
            "gate_up_wg",
            Op::GateUp,
            DType::FLOAT,
            GATE_UP_WG_PARAMS,
            "GEMV style: gate and up rows of ROWS features share each x load, workgroup reduction; grid z = token row",
            WgslImpl::new(&GATE_UP_WG, prepare_rows).shared(shared_gate_up).check(check_gate_up_wg),
        ),
        KernelDef::new(
            "gate_up_subgroup",
            Op::GateUp,
            DType::FLOAT,
            GATE_UP_SG_PARAMS,
            "16-byte loads, one subgroup per feature streaming its gate and up rows together, subgroupAdd",
            WgslImpl::new(&GATE_UP_SG, prepare_rows).subgroups().check(check_gate_up_sg),
        ),
        KernelDef::new(
            "gate_up_tiled",
            Op::GateUp,
            DType::FLOAT,
            GATE_UP_TILED_PARAMS,
            "prefill GEMM: 16x16 workgroup, x/gate/up tiles in workgroup memory, thread_m x thread_n register blocking",
            WgslImpl::new(&GATE_UP_TILED, prepare_gate_up_tiled).workgroup(tiled_size).shared(shared_tiled).check(check_gate_up_tiled),
        ),
        KernelDef::new(
            "gate_up_dot4_cpu",
            Op::GateUp,
            DType::FLOAT,
            ROW_CPU_PARAMS,
            "dot4 over interleaved gate/up rows (two features per x load); rayon over tokens and features",
            CpuImpl { run: run_gate_up_dot4, check: check_isa },
        ),
        KernelDef::new(
            "gate_up_blocked_cpu",
            Op::GateUp,
            DType::FLOAT,
            BLOCKED_CPU_PARAMS,
            "GEMM style (prefill): rayon over feature blocks, f32 weight panel packed once, 2-token x 4-row register microkernel",
            CpuImpl { run: run_gate_up_blocked, check: check_blocked },
        ),
        KernelDef::new(
            "gate_up_q_wg",
            Op::GateUp,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "quantized gate and up rows dequantized in registers, workgroup reduction, activation product in the epilogue",
            WgslImpl::new(&QGATE_UP_WG, prepare_q).shared(shared_gate_up).check(check_q_wgsl),
        ),
        KernelDef::new(
            "gate_up_q_subgroup",
            Op::GateUp,
            DType::QUANT,
            Q_GATE_UP_SG_PARAMS,
            "quantized gate and up rows dequantized in registers, one subgroup per feature striding both rows (each activation \
             load feeds both; `unroll` units of each a lane in flight), subgroupAdd, activation product by lane 0; no workgroup memory",
            WgslImpl::new(&QGATE_UP_SG, prepare_q_sg).subgroups().check(check_q_subgroup),
        ),
        KernelDef::new(
            "gate_up_q_dp4a_wg",
            Op::GateUp,
            qdp4a::DTYPES,
            qdp4a::PARAMS,
            "decode: the token quantized once (int8 blocks, or f16 / f32) for the gate and the up rows, dot4I8Packed block dots, \
             16-byte quant loads; ROWS features' gate and up rows share each activation load in registers, one workgroup \
             reduction, the activation product in registers (after the split-K sum)",
            WgslImpl::new(&QGATE_UP_DP4A_WG, qdp4a::prepare).shared(qdp4a::shared).check(qdp4a::check),
        ),
        KernelDef::new(
            "gate_up_q_dp4a_subgroup",
            Op::GateUp,
            qdp4a::DTYPES,
            qdp4a::PARAMS,
            "as gate_up_q_dp4a_wg, finished by one subgroupAdd per gate and up row and one pass over the subgroups",
            WgslImpl::new(&QGATE_UP_DP4A_SG, qdp4a::prepare).shared(qdp4a::shared_sg).subgroups().check(qdp4a::check_subgroup),
        ),
        KernelDef::new(
            "gate_up_q_cpu",
            Op::GateUp,
            DType::QUANT,
            CPU_Q_PARAMS,
            "gate and up rows of each feature dequantized once and dotted with every token (decode: block dots, f32 or int8 activations); activation product; pool over features",
            CpuImpl { run: run_gate_up_q, check: check_quant },
        ),
        KernelDef::new(
            "gate_up_q_dots_cpu",
            Op::GateUp,
            DType::QUANT,
            &cpu::DOT_ROWS_PARAMS[..3],
            "a few tokens (a decode batch): each token's gate and up dots as the decode's (int8 or f32 activations), eight rows at \
             a time through every token, read from memory once; activation product; pool over features",
            CpuImpl { run: run_gate_up_q_dots, check: check_q_dots },
        ),
        KernelDef::new(
            "gate_up_q_panel_cpu",
            Op::GateUp,
            DType::QUANT,
            CPU_Q_PANEL_PARAMS,
            "GEMM style (prefill): the gate and up rows of nc features dequantized into one f32 panel, the cache-blocked f32 GEMM \
             microkernel over it, activation product on the way out",
            CpuImpl { run: run_gate_up_q_panel, check: check_q_panel },
        ),
        KernelDef::new(
            "gate_up_q_i8_cpu",
            Op::GateUp,
            DType::QUANT,
            I8_GEMM_PARAMS,
            "GEMM style (prefill): tokens quantized to int8 blocks once, gate and up rows interleaved 16 to a vector per task, \
             VNNI tiles of 32 rows x 4 tokens (or, `amx` 1 and 2, AMX tile multiplies of 16 rows x 16 tokens, the same bits), \
             activation product on the way out",
            CpuImpl { run: run_gate_up_q_i8, check: check_q_i8 },
        ),
    ];
    // prefill on the matrix-tile GEMM's tiling (matmul/mma.rs)
    v.extend(crate::kernels::matmul::mma::gate_up_variants());
    v
}

fn tiled_size(_: &Params) -> Result<[u32; 3], KernelError> {
    Ok([16, 16, 1])
}

/// A gate and an up partial per invocation and feature.
fn shared_gate_up(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(8 * param(params, "workgroup_size")? as u64 * param(params, "rows_per_wg")? as u64)
}

/// x tile (16·thread_m rows) plus gate and up tiles (16·thread_n rows each) of
/// tile_k f32, each row padded by one vec4 (an odd row stride in 16-byte units).
fn shared_tiled(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let (tm, tn, tk) = (param(params, "thread_m")? as u64, param(params, "thread_n")? as u64, param(params, "tile_k")? as u64);
    Ok(16 * 16 * (tk / 4 + 1) * (tm + 2 * tn))
}

fn check_gate_up_wg(caps: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 3)?;
    match *prob {
        Problem::GateUp { rows, .. } => grid_dim(caps, rows, "z (one per token row)"),
        _ => Ok(()),
    }
}

fn check_gate_up_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 3)?;
    subgroup_fits(caps, params)?;
    match *prob {
        Problem::GateUp { rows, k, .. } => {
            vec_alignment(k, dtype)?;
            grid_dim(caps, rows, "z (one per token row)")
        }
        _ => Ok(()),
    }
}

fn check_gate_up_tiled(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 3)?;
    let tk = param(params, "tile_k")?;
    if tk == 0 || tk % 8 != 0 {
        return Err(format!("tile_k = {tk} is not a multiple of 8 (vec4 tile rows of an odd padded stride)"));
    }
    match *prob {
        Problem::GateUp { rows, n, .. } => {
            grid_dim(caps, groups(n, 16 * param(params, "thread_n")?) as usize, "x (feature tiles)")?;
            grid_dim(caps, groups(rows, 16 * param(params, "thread_m")?) as usize, "y (token tiles)")
        }
        _ => Ok(()),
    }
}

fn check_q_wgsl(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    if let Problem::GateUp { rows, n, .. } = *prob {
        grid_dim(caps, groups(n, param(params, "rows_per_wg")?) as usize, "features")?;
        grid_dim(caps, rows, "tokens")?;
    }
    Ok(())
}

fn check_q_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    check_blocks(prob, dtype)?;
    if let Problem::GateUp { rows, n, .. } = *prob {
        grid_fits(caps, groups(n, param(params, "rows_per_wg")?) as usize, "features")?;
        grid_dim(caps, rows, "z (one per token row)")?;
    }
    Ok(())
}

fn gate_up_dims(s: &WgslSetup<'_>) -> Result<(usize, usize, usize, Activation), KernelError> {
    match *s.problem {
        Problem::GateUp { rows, n, k, act } => Ok((rows, n, k, act)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

/// One prepare for the GEMV-style shaders (`gate_up_wg`, `gate_up_subgroup`).
fn prepare_rows(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, n, k, act) = gate_up_dims(s)?;
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("W_F16", s.w_f16())];
    let [gx, gy, _] = grid_2d(groups(n, per));
    s.one_step("main", &consts, &[n as u32, k as u32, act.code()], [gx, gy, rows as u32])
}

fn prepare_gate_up_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, n, k, act) = gate_up_dims(s)?;
    let (tm, tn, tk) = (s.param("thread_m")?, s.param("thread_n")?, s.param("tile_k")?);
    let consts = [("TM", tm as f64), ("TN", tn as f64), ("TK", tk as f64), ("W_F16", s.w_f16())];
    let grid = [groups(n, 16 * tn), groups(rows, 16 * tm), 1];
    s.one_step("main", &consts, &[rows as u32, n as u32, k as u32, act.code()], grid)
}

fn prepare_q(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::GateUp { rows, n, k, act } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("QFMT", qfmt(s.dtype))];
    let uniform = [rows as u32, n as u32, k as u32, act.code()];
    one_q_step(s, 1, &consts, &uniform, [groups(n, per).max(1), (rows as u32).max(1), 1])
}

/// `gate_up_q_subgroup`: ROWS features a workgroup over the 2D grid, tokens along z.
fn prepare_q_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::GateUp { rows, n, k, act } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("QFMT", qfmt(s.dtype)), ("UNROLL", s.param("unroll")? as f64)];
    let [gx, gy, _] = grid_2d(groups(n, per));
    one_q_step(s, 1, &consts, &[rows as u32, n as u32, k as u32, act.code()], [gx, gy, (rows as u32).max(1)])
}

/// Features `first..first + y.len()` of one token: gate and up rows of two features
/// go through one dot4 call (x loaded once for four rows).
#[allow(clippy::too_many_arguments)]
fn gate_up_dot4(isa: Isa, x: &[f32], w: CpuIn<'_>, n: usize, k: usize, act: Activation, first: usize, y: &mut [f32]) {
    let len = y.len();
    let mut j = 0;
    while j + 2 <= len {
        let f = first + j;
        let v = cpu::dot4(isa, x, [row(w, f, k), row(w, n + f, k), row(w, f + 1, k), row(w, n + f + 1, k)]);
        y[j] = act_f32(act, v[0]) * v[1];
        y[j + 1] = act_f32(act, v[2]) * v[3];
        j += 2;
    }
    if j < len {
        let f = first + j;
        y[j] = act_f32(act, cpu::dot(isa, x, row(w, f, k))) * cpu::dot(isa, x, row(w, n + f, k));
    }
}

/// Token rows in parallel, and within each token its features split by [`par_rows`].
fn run_gate_up_dot4(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    if n == 0 {
        return Ok(());
    }
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    let split = RowSplit::of(params)?;
    a.outs[0][..rows * n].par_chunks_mut(n).enumerate().for_each(|(t, yt)| {
        let xt = &x[t * k..][..k];
        par_rows(yt, 1, split, |first, y| gate_up_dot4(isa, xt, w, n, k, act, first, y));
    });
    Ok(())
}

/// Gate and up rows of features `j0..j0 + bn`, interleaved (g0, u0, g1, u1, ...),
/// as f32: borrowed for f32 weights, converted once into `buf` for f16.
fn gate_up_panel<'a>(w: CpuIn<'a>, n: usize, k: usize, j0: usize, bn: usize, buf: &'a mut Vec<f32>) -> Vec<&'a [f32]> {
    match w {
        CpuIn::F32(s) => (0..2 * bn).map(|i| &s[(if i % 2 == 0 { j0 } else { n + j0 } + i / 2) * k..][..k]).collect(),
        CpuIn::F16(s) => {
            buf.clear();
            buf.reserve(2 * bn * k);
            for i in 0..2 * bn {
                let r = if i % 2 == 0 { j0 } else { n + j0 } + i / 2;
                buf.extend(s[r * k..][..k].iter().map(|h: &f16| h.to_f32()));
            }
            let done: &'a Vec<f32> = buf;
            (0..2 * bn).map(|i| &done[i * k..(i + 1) * k]).collect()
        }
        // Float kernels never get a quantized buffer (the registry checks dtypes);
        // dequantize element-wise rather than fail if one did.
        CpuIn::Q(_) | CpuIn::Stack(_) => {
            buf.clear();
            for i in 0..2 * bn {
                let r = if i % 2 == 0 { j0 } else { n + j0 } + i / 2;
                buf.extend((0..k).map(|c| w.get(r * k + c)));
            }
            let done: &'a Vec<f32> = buf;
            (0..2 * bn).map(|i| &done[i * k..(i + 1) * k]).collect()
        }
    }
}

/// The packed panel pays off only when several tokens reuse it: one token
/// (decode) goes to `gate_up_dot4_cpu`, which reads the rows in place.
fn check_blocked(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    match *prob {
        Problem::GateUp { rows, .. } if rows < 2 => {
            Err("gate_up_blocked_cpu packs a weight panel for several tokens; one token uses gate_up_dot4_cpu".into())
        }
        _ => check_isa(caps, prob, dtype, params),
    }
}

/// GEMM-style: each rayon task owns a block of features, packs its gate/up weight
/// panel once and sweeps all tokens two at a time through the 2x4 microkernel, so
/// every weight load feeds two tokens and every x load four rows.
fn run_gate_up_blocked(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let isa = Isa::of(params)?;
    let bn_max = (param(params, "block_n")? as usize).max(1);
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    let blocks: Vec<(usize, usize, Vec<f32>)> = (0..n.div_ceil(bn_max))
        .into_par_iter()
        .map(|b| {
            let j0 = b * bn_max;
            let bn = bn_max.min(n - j0);
            let mut buf = Vec::new();
            let panel = gate_up_panel(w, n, k, j0, bn, &mut buf);
            let mut out = vec![0f32; rows * bn];
            let mut t = 0;
            while t < rows {
                let two = t + 1 < rows;
                let x0 = &x[t * k..][..k];
                let x1 = if two { &x[(t + 1) * k..][..k] } else { x0 };
                let mut jj = 0;
                while jj + 2 <= bn {
                    let quad = [panel[2 * jj], panel[2 * jj + 1], panel[2 * jj + 2], panel[2 * jj + 3]];
                    let v = if two { cpu::dot2x4(isa, x0, x1, quad) } else { [cpu::dot4_f32(isa, x0, quad), [0.0; 4]] };
                    out[t * bn + jj] = act_f32(act, v[0][0]) * v[0][1];
                    out[t * bn + jj + 1] = act_f32(act, v[0][2]) * v[0][3];
                    if two {
                        out[(t + 1) * bn + jj] = act_f32(act, v[1][0]) * v[1][1];
                        out[(t + 1) * bn + jj + 1] = act_f32(act, v[1][2]) * v[1][3];
                    }
                    jj += 2;
                }
                if jj < bn {
                    let (gr, ur) = (panel[2 * jj], panel[2 * jj + 1]);
                    for (tt, xt) in [x0, x1].into_iter().enumerate().take(if two { 2 } else { 1 }) {
                        out[(t + tt) * bn + jj] = act_f32(act, cpu::dot_f32(isa, xt, gr)) * cpu::dot_f32(isa, xt, ur);
                    }
                }
                t += 2;
            }
            (j0, bn, out)
        })
        .collect();
    let y = &mut a.outs[0][..rows * n];
    for (j0, bn, out) in blocks {
        for t in 0..rows {
            y[t * n + j0..][..bn].copy_from_slice(&out[t * bn..][..bn]);
        }
    }
    Ok(())
}

/// The GEMM-style block-format kernels serve prefill: one token is refused with
/// `why` (and sent to `gate_up_q_cpu`), else the `base` check decides.
fn prefill_only(why: &str, prob: &Problem, base: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    match *prob {
        Problem::GateUp { rows, .. } if rows < 2 => Err(format!("{why}; one token uses gate_up_q_cpu")),
        _ => base(),
    }
}

fn check_q_dots(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    prefill_only("gate_up_q_dots_cpu is for a few tokens together", prob, || check_quant(caps, prob, dtype, params))
}

fn check_q_panel(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    prefill_only("gate_up_q_panel_cpu dequantizes a weight panel for several tokens", prob, || check_quant(caps, prob, dtype, params))
}

/// Prefill over block formats as `gemm_q_panel_cpu` does a projection: per block of
/// `nc` features, their gate rows then their up rows dequantized into one panel
/// (`2·nc × k`), one blocked GEMM of every token against it, and the activation
/// product of each feature's two columns written to `y`.
fn run_gate_up_q_panel(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    use crate::kernels::cpu::sgemm::{Blocking, Micro, Split, gemm_blocked};
    let Problem::GateUp { rows, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let Some((isa, x, w)) = q_inputs(kd, params, &a, (rows, n))? else { return Ok(()) };
    let y = &mut a.outs[0][..rows * n];
    let nc = (param(params, "nc")? as usize).clamp(1, n);
    let blk = Blocking { mc: 96, nc: 128.min(2 * nc), kc: (param(params, "kc")? as usize).max(1) };
    let mut panel = vec![0f32; 2 * nc * k];
    let mut tmp = vec![0f32; rows * 2 * nc];
    for j0 in (0..n).step_by(nc) {
        let nb = nc.min(n - j0);
        cpu::pool::for_chunks_mut(&mut panel[..2 * nb * k], k, |i, r| {
            let src = if i < nb { j0 + i } else { n + j0 + i - nb };
            cpu::qdot::dequantize_row(isa, w, src, k, r)
        });
        gemm_blocked(
            Micro::for_isa(isa),
            blk,
            Split::Auto,
            rows,
            2 * nb,
            k,
            x,
            CpuIn::F32(&panel[..2 * nb * k]),
            &mut tmp[..rows * 2 * nb],
        );
        for t in 0..rows {
            let (g, u) = tmp[t * 2 * nb..][..2 * nb].split_at(nb);
            gated_simd(isa, act, g, u, &mut y[t * n + j0..][..nb]);
        }
    }
    Ok(())
}

fn check_q_i8(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    prefill_only("gate_up_q_i8_cpu is a prefill GEMM", prob, || check_i8_gemm(caps, prob, dtype, params))
}

/// Prefill over block formats with int8 activations: the tokens quantized once,
/// then per task of features their gate and up rows through the int8 tile kernel
/// ([`rows_times_tokens_i8`]) and the activation product.
fn run_gate_up_q_i8(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let Some((isa, x, w)) = q_inputs(kd, params, &a, (rows, n))? else { return Ok(()) };
    let xp = XPanel::quantize(&x[..rows * k], rows, k);
    let kept = active_panels().and_then(|c| c.weight(isa, w, k));
    let kernel = I8Kernel::of(params)?;
    gated_row_blocks(isa, act, params, (rows, n), &mut a.outs[0][..rows * n], |r0, count, out| {
        rows_times_tokens_i8(kernel, &xp, w, r0, count, kept.as_ref(), out)
    })
}

/// A few tokens (a server's decode batch): each token's gate and up dots as the
/// decode's ([`rows_times_vectors`]), every weight row read once for all of them.
fn run_gate_up_q_dots(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let Some((isa, x, w)) = q_inputs(kd, params, &a, (rows, n))? else { return Ok(()) };
    let xs = cpu::token_vectors(x, rows, k, params, w.format)?;
    // One row a pass, as the decode's `gate_up_q_cpu` (four rows a pass sum in
    // another order).
    gated_row_blocks(isa, act, params, (rows, n), &mut a.outs[0][..rows * n], |r0, count, out| {
        cpu::rows_times_vectors(isa, &xs, w, k, r0, count, false, out)
    })
}

/// A block-format call's ISA, activations and weights.
type QInputs<'a> = (Isa, &'a [f32], QView<'a>);

/// The ISA and the inputs of a block-format call of `rows` tokens and `n`
/// features: `x` (f32) and `w` (the gate rows, then the up rows); `None` when
/// there is nothing to compute.
fn q_inputs<'a>(kd: &KernelDef, params: &Params, a: &CpuArgs<'a>, (rows, n): (usize, usize)) -> Result<Option<QInputs<'a>>, KernelError> {
    if n == 0 || rows == 0 {
        return Ok(None);
    }
    Ok(Some((Isa::of(params)?, a.ins[0].f32(), qin(kd.id, &a.ins[1])?)))
}

/// Prefill of `rows` tokens in tasks of `rows_per_task` of the `n` features:
/// `times_tokens(r0, count, out)` gives weight rows `r0..r0 + count` against
/// every token (into `out`, token-major `[rows][count]`), once for the gate rows and once for
/// the up rows; their activation product goes to `y` (`[rows, n]`).
fn gated_row_blocks(
    isa: Isa,
    act: Activation,
    params: &Params,
    (rows, n): (usize, usize),
    y: &mut [f32],
    times_tokens: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Result<(), KernelError> {
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    row_blocks(y, rows, n, grain, |j0, count, out| {
        with_scratch(&GATE_UP, 2 * count * rows, |gu| {
            let (g, u) = gu.split_at_mut(count * rows);
            times_tokens(j0, count, g);
            times_tokens(n + j0, count, u);
            gated_simd(isa, act, g, u, out);
        })
    });
    Ok(())
}

thread_local! {
    /// One task's gate and up blocks in [`gated_row_blocks`].
    static GATE_UP: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn run_gate_up_q(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let Some((isa, x, w)) = q_inputs(kd, params, &a, (rows, n))? else { return Ok(()) };
    let y = &mut a.outs[0][..rows * n];
    if rows == 1 {
        let x = ActVec::new(&x[..k], params, w.format)?;
        par_rows(y, 1, RowSplit::dynamic(params)?, |first, yc| {
            // The up rows of each run of 64 into a stack buffer, the gate rows
            // into `yc`, then combined (every layout's `rows` path).
            for (c, yc) in yc.chunks_mut(64).enumerate() {
                let j0 = first + 64 * c;
                let (mut gate, mut up) = ([0f32; 64], [0f32; 64]);
                let (gate, up) = (&mut gate[..yc.len()], &mut up[..yc.len()]);
                x.rows(isa, w, k, j0, gate, false);
                x.rows(isa, w, k, n + j0, up, false);
                gated_simd(isa, act, gate, up, yc);
            }
        });
        return Ok(());
    }
    gated_row_blocks(isa, act, params, (rows, n), y, |r0, count, out| rows_times_tokens(isa, x, rows, k, w, r0, count, 16, out))
}
