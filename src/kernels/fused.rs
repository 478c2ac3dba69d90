//! Fused ops: the kernels that merge two or three decoder steps into one pass so the
//! intermediate never goes through memory: per-head RMSNorm + RoPE (`qk_norm_rope`,
//! Gemma 3's q/k norm), gate+up projection with the activation product in the
//! epilogue (`gate_up`), residual add + RMSNorm (`residual_rms_norm`) and the Q/K/V
//! projection of one token in one matrix-vector product (`qkv_proj`).
//!
//! WGSL (`shaders/fused_*.wgsl`), per op a workgroup-memory reduction variant and a
//! subgroup variant, plus a register-tiled GEMM-style `gate_up_tiled` for prefill.
//! CPU: SIMD microkernels (the dot products of `simd`, and this module's own fused
//! add/sum-of-squares, scale and 2x4 dot microkernels) under rayon orchestrators
//! that split tokens/rows for prefill and features/heads/k for decode (seed 003).

use half::f16;
use rayon::prelude::*;

use super::gemv::{self, par_rows, row, vec_alignment};
use super::simd::{self, Isa, Row};
use super::{
    Activation, CpuArgs, CpuImpl, CpuIn, DType, Impl, KernelDef, KernelError, Op, ParamSpec, Params, Problem, RopeLayout, WgslImpl,
    WgslSetup, p, packed_f16, wrong_op,
};
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static QKNR_WG: Shader = shader!(
    "fused_qk_norm_rope_wg.wgsl",
    "fused_qk_norm_rope.wgsl",
    "row_wg.wgsl",
    "reduce_wg.wgsl",
    "rms.wgsl",
    "rotary.wgsl",
    "wload.wgsl"
);
static QKNR_SG: Shader =
    shader!("fused_qk_norm_rope_subgroup.wgsl", "fused_qk_norm_rope.wgsl", "reduce_sg.wgsl", "rms.wgsl", "rotary.wgsl", "wload.wgsl");
static GATE_UP_WG: Shader = shader!("fused_gate_up_wg.wgsl", "act.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static GATE_UP_SG: Shader = shader!("fused_gate_up_subgroup.wgsl", "act.wgsl", "wload.wgsl");
static GATE_UP_TILED: Shader = shader!("fused_gate_up_tiled.wgsl", "act.wgsl", "wload.wgsl");
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
static QKV_WG: Shader = shader!("fused_qkv_proj_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "qkv_store.wgsl", "wload.wgsl");
static QKV_SG: Shader = shader!("fused_qkv_proj_subgroup.wgsl", "row_sg.wgsl", "reduce_sg.wgsl", "qkv_store.wgsl", "wload.wgsl");

const BOTH: &[DType] = &[DType::F32, DType::F16];

const WG_SIZE: ParamSpec =
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" };
const ISA: ParamSpec = ParamSpec { name: "isa", values: simd::ISA_VALUES, default: 0, help: simd::ISA_HELP };

const QKNR_WG_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per (token, head) workgroup" }];
const QKNR_SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per workgroup" },
    ParamSpec { name: "heads_per_wg", values: &[1, 2, 4, 8], default: 2, help: "heads per workgroup, one subgroup each" },
];
const GATE_UP_WG_PARAMS: &[ParamSpec] =
    &[WG_SIZE, ParamSpec { name: "rows_per_wg", values: &[1, 2, 4], default: 2, help: "features (gate and up row pairs) per workgroup" }];
const GATE_UP_SG_PARAMS: &[ParamSpec] = &[
    WG_SIZE,
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "features per workgroup, spread over its subgroups" },
];
const GATE_UP_TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "thread_m", values: &[1, 2, 4], default: 2, help: "token rows per invocation (tile height 16*thread_m)" },
    ParamSpec { name: "thread_n", values: &[1, 2, 4], default: 2, help: "features per invocation (tile width 16*thread_n)" },
    ParamSpec { name: "tile_k", values: &[8, 16, 32], default: 16, help: "k staged in workgroup memory per step" },
];
const ROWS_WG_PARAMS: &[ParamSpec] = &[WG_SIZE];
const ROWS_SG_PARAMS: &[ParamSpec] =
    &[WG_SIZE, ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8], default: 4, help: "rows per workgroup, one subgroup each" }];
const QKV_WG_PARAMS: &[ParamSpec] =
    &[WG_SIZE, ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8], default: 2, help: "output rows per workgroup" }];
const QKV_SG_PARAMS: &[ParamSpec] = &[
    WG_SIZE,
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "output rows per workgroup, spread over its subgroups" },
];

const HEADS_CPU_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "heads_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "(token, head) rows per rayon task" }, ISA];
const ROW_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows_per_task",
        values: &[8, 16, 32, 64, 128, 256],
        default: 32,
        help: "output rows per rayon task (dynamic strategy)",
    },
    ParamSpec {
        name: "strategy",
        values: &[0, 1],
        default: 0,
        help: "0 dynamic work stealing by rows_per_task, 1 one static row range per thread",
    },
    ISA,
];
const BLOCKED_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "block_n",
        values: &[8, 16, 32, 64, 128],
        default: 32,
        help: "features per rayon task; its weight panel is reused by every token",
    },
    ISA,
];
const RESNORM_ROWS_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "rows per rayon task" }, ISA];
const RESNORM_SPLIT_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "chunk", values: &[256, 512, 1024, 2048, 4096], default: 1024, help: "elements of a row per rayon task" }, ISA];
const SPLITK_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "k_split", values: &[2, 4, 8, 16], default: 4, help: "slices of k computed in parallel and summed" }, ISA];

pub fn variants() -> Vec<KernelDef> {
    vec![
        // ---- qk_norm_rope ----
        KernelDef {
            id: "qk_norm_rope_wg",
            op: Op::QkNormRope,
            summary: "one workgroup per (token, head): workgroup-memory x² reduction, then normalize + rotate whole pairs",
            dtypes: BOTH,
            params: QKNR_WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QKNR_WG,
                workgroup_size: wg_size,
                shared_memory: shared_wg,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_qknr_wg,
                prepare: prepare_qknr_wg,
            }),
        },
        KernelDef {
            id: "qk_norm_rope_subgroup",
            op: Op::QkNormRope,
            summary: "one subgroup per (token, head), subgroupAdd reduction, several heads per workgroup, no barriers",
            dtypes: BOTH,
            params: QKNR_SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QKNR_SG,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_qknr_sg,
                prepare: prepare_qknr_sg,
            }),
        },
        KernelDef {
            id: "qk_norm_rope_heads_cpu",
            op: Op::QkNormRope,
            summary: "rayon over (token, head) rows: SIMD x² and scale passes, then rotation with per-head sin/cos",
            dtypes: BOTH,
            params: HEADS_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_qknr_heads, check: check_qknr_cpu }),
        },
        KernelDef {
            id: "qk_norm_rope_table_cpu",
            op: Op::QkNormRope,
            summary: "sin/cos table per token computed once in parallel, then one fused normalize+rotate pass per head",
            dtypes: BOTH,
            params: HEADS_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_qknr_table, check: check_qknr_cpu }),
        },
        // ---- gate_up ----
        KernelDef {
            id: "gate_up_wg",
            op: Op::GateUp,
            summary: "GEMV style: gate and up rows of ROWS features share each x load, workgroup reduction; grid z = token row",
            dtypes: BOTH,
            params: GATE_UP_WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GATE_UP_WG,
                workgroup_size: wg_size,
                shared_memory: shared_gate_up_wg,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_gate_up_wg,
                prepare: prepare_gate_up_wg,
            }),
        },
        KernelDef {
            id: "gate_up_subgroup",
            op: Op::GateUp,
            summary: "16-byte loads, one subgroup per feature streaming its gate and up rows together, subgroupAdd",
            dtypes: BOTH,
            params: GATE_UP_SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GATE_UP_SG,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_gate_up_sg,
                prepare: prepare_gate_up_sg,
            }),
        },
        KernelDef {
            id: "gate_up_tiled",
            op: Op::GateUp,
            summary: "prefill GEMM: 16x16 workgroup, x/gate/up tiles in workgroup memory, thread_m x thread_n register blocking",
            dtypes: BOTH,
            params: GATE_UP_TILED_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &GATE_UP_TILED,
                workgroup_size: tiled_size,
                shared_memory: shared_tiled,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_gate_up_tiled,
                prepare: prepare_gate_up_tiled,
            }),
        },
        KernelDef {
            id: "gate_up_dot4_cpu",
            op: Op::GateUp,
            summary: "dot4 over interleaved gate/up rows (two features per x load); rayon over tokens and features",
            dtypes: BOTH,
            params: ROW_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gate_up_dot4, check: check_cpu }),
        },
        KernelDef {
            id: "gate_up_blocked_cpu",
            op: Op::GateUp,
            summary: "GEMM style: rayon over feature blocks, f32 weight panel packed once, 2-token x 4-row register microkernel",
            dtypes: BOTH,
            params: BLOCKED_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gate_up_blocked, check: check_cpu }),
        },
        // ---- residual_rms_norm ----
        KernelDef {
            id: "residual_rms_norm_wg",
            op: Op::ResidualRmsNorm,
            summary: "one workgroup per row: h written and h² accumulated in one pass, workgroup reduction, scale pass",
            dtypes: BOTH,
            params: ROWS_WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &RESNORM_WG,
                workgroup_size: wg_size,
                shared_memory: shared_wg,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_resnorm_wg,
                prepare: prepare_resnorm_wg,
            }),
        },
        KernelDef {
            id: "residual_rms_norm_subgroup",
            op: Op::ResidualRmsNorm,
            summary: "one subgroup per row, several rows per workgroup, subgroupAdd reduction, no barriers",
            dtypes: BOTH,
            params: ROWS_SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &RESNORM_SG,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_resnorm_sg,
                prepare: prepare_resnorm_sg,
            }),
        },
        KernelDef {
            id: "residual_rms_norm_rows_cpu",
            op: Op::ResidualRmsNorm,
            summary: "rayon over rows (prefill): fused SIMD add + sum of squares, then SIMD scale pass per row",
            dtypes: BOTH,
            params: RESNORM_ROWS_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_resnorm_rows, check: check_cpu }),
        },
        KernelDef {
            id: "residual_rms_norm_split_cpu",
            op: Op::ResidualRmsNorm,
            summary: "rayon over chunks of each row (decode): partial sums of squares per chunk, reduced, then a parallel scale pass",
            dtypes: BOTH,
            params: RESNORM_SPLIT_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_resnorm_split, check: check_cpu }),
        },
        // ---- qkv_proj ----
        KernelDef {
            id: "qkv_proj_wg",
            op: Op::QkvProj,
            summary: "scalar loads, any k; ROWS rows per workgroup share x; workgroup reduction; bias and q/k/v routing in the epilogue",
            dtypes: BOTH,
            params: QKV_WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QKV_WG,
                workgroup_size: wg_size,
                shared_memory: shared_rows,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_qkv_wg,
                prepare: prepare_qkv_wg,
            }),
        },
        KernelDef {
            id: "qkv_proj_subgroup",
            op: Op::QkvProj,
            summary: "16-byte loads, one subgroup per row, subgroupAdd; bias and q/k/v routing in the epilogue",
            dtypes: BOTH,
            params: QKV_SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QKV_SG,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_qkv_sg,
                prepare: prepare_qkv_sg,
            }),
        },
        KernelDef {
            id: "qkv_proj_dot4_cpu",
            op: Op::QkvProj,
            summary: "one rayon pass over the rows of q, k and v together, four rows per SIMD call, bias in the epilogue",
            dtypes: BOTH,
            params: ROW_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_qkv_dot4, check: check_cpu }),
        },
        KernelDef {
            id: "qkv_proj_splitk_cpu",
            op: Op::QkvProj,
            summary: "split-k: rayon over slices of k, each task dot4s every row over its slice, partials summed with the bias",
            dtypes: BOTH,
            params: SPLITK_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_qkv_splitk, check: check_cpu }),
        },
    ]
}

// ---------------------------------------------------------------------------------
// WGSL: sizes, shared memory, validity
// ---------------------------------------------------------------------------------

fn wg_size(params: &Params) -> [u32; 3] {
    [p(params, "workgroup_size"), 1, 1]
}

fn tiled_size(_: &Params) -> [u32; 3] {
    [16, 16, 1]
}

/// One f32 partial per invocation.
fn shared_wg(_: &Problem, _: DType, params: &Params) -> u64 {
    4 * p(params, "workgroup_size") as u64
}

/// One f32 partial per invocation and row.
fn shared_rows(_: &Problem, _: DType, params: &Params) -> u64 {
    4 * p(params, "workgroup_size") as u64 * p(params, "rows_per_wg") as u64
}

/// A gate and an up partial per invocation and feature.
fn shared_gate_up_wg(_: &Problem, _: DType, params: &Params) -> u64 {
    8 * p(params, "workgroup_size") as u64 * p(params, "rows_per_wg") as u64
}

/// x tile (16·thread_m × tile_k) plus gate and up tiles (16·thread_n × tile_k each), f32.
fn shared_tiled(_: &Problem, _: DType, params: &Params) -> u64 {
    let (tm, tn, tk) = (p(params, "thread_m") as u64, p(params, "thread_n") as u64, p(params, "tile_k") as u64);
    4 * 16 * tk * (tm + 2 * tn)
}

/// The adapter must bind `needed` storage buffers in one shader stage.
fn storage_buffers(caps: &GpuCaps, needed: u32) -> Result<(), String> {
    if caps.max_storage_buffers_per_stage < needed {
        return Err(format!("binds {needed} storage buffers, the adapter allows {} per stage", caps.max_storage_buffers_per_stage));
    }
    Ok(())
}

/// Subgroup variants need the workgroup to hold at least one whole subgroup.
fn subgroup_fits(caps: &GpuCaps, params: &Params) -> Result<(), String> {
    let wg = p(params, "workgroup_size");
    if caps.subgroup_max_size > wg {
        return Err(format!("workgroup of {wg} is smaller than the adapter's subgroup size {}", caps.subgroup_max_size));
    }
    Ok(())
}

/// A grid dimension of `count` workgroups must fit the adapter.
fn grid_dim(caps: &GpuCaps, count: usize, what: &str) -> Result<(), String> {
    if count as u64 > caps.max_workgroups_per_dimension as u64 {
        return Err(format!("{count} workgroups along {what} exceed the adapter's {} per dimension", caps.max_workgroups_per_dimension));
    }
    Ok(())
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
/// [`super::rope::WGSL_MAX_POSITION`].
fn qknr_positions(prob: &Problem) -> Result<(), String> {
    use super::rope::WGSL_MAX_POSITION;
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
    match *prob {
        Problem::GateUp { rows, n, .. } => {
            grid_dim(caps, groups(n, 16 * p(params, "thread_n")) as usize, "x (feature tiles)")?;
            grid_dim(caps, groups(rows, 16 * p(params, "thread_m")) as usize, "y (token tiles)")
        }
        _ => Ok(()),
    }
}

fn check_resnorm_wg(caps: &GpuCaps, _: &Problem, _: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 5)
}

fn check_resnorm_sg(caps: &GpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    storage_buffers(caps, 5)?;
    subgroup_fits(caps, params)
}

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

// ---------------------------------------------------------------------------------
// WGSL: programs
// ---------------------------------------------------------------------------------

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
    let consts = [("WG", p(s.params, "workgroup_size") as f64), ("W_F16", s.w_f16())];
    s.one_step(&QKNR_WG, "main", &consts, &u, grid_2d(heads as u32))
}

fn prepare_qknr_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (heads, u) = qknr_uniform(s)?;
    let per = p(s.params, "heads_per_wg");
    let consts = [("WG", p(s.params, "workgroup_size") as f64), ("HEADS", per as f64), ("W_F16", s.w_f16())];
    s.one_step(&QKNR_SG, "main", &consts, &u, grid_2d(groups(heads, per)))
}

fn gate_up_dims(s: &WgslSetup<'_>) -> Result<(usize, usize, usize, Activation), KernelError> {
    match *s.problem {
        Problem::GateUp { rows, n, k, act } => Ok((rows, n, k, act)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn prepare_gate_up_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, n, k, act) = gate_up_dims(s)?;
    let (wg, per) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("W_F16", s.w_f16())];
    let [gx, gy, _] = grid_2d(groups(n, per));
    s.one_step(&GATE_UP_WG, "main", &consts, &[n as u32, k as u32, act.code()], [gx, gy, rows as u32])
}

fn prepare_gate_up_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, n, k, act) = gate_up_dims(s)?;
    let (wg, per) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("W_F16", s.w_f16())];
    let [gx, gy, _] = grid_2d(groups(n, per));
    s.one_step(&GATE_UP_SG, "main", &consts, &[n as u32, k as u32, act.code()], [gx, gy, rows as u32])
}

fn prepare_gate_up_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, n, k, act) = gate_up_dims(s)?;
    let (tm, tn, tk) = (p(s.params, "thread_m"), p(s.params, "thread_n"), p(s.params, "tile_k"));
    let consts = [("TM", tm as f64), ("TN", tn as f64), ("TK", tk as f64), ("W_F16", s.w_f16())];
    let grid = [groups(n, 16 * tn), groups(rows, 16 * tm), 1];
    s.one_step(&GATE_UP_TILED, "main", &consts, &[rows as u32, n as u32, k as u32, act.code()], grid)
}

fn resnorm_uniform(s: &WgslSetup<'_>) -> Result<(usize, Vec<u32>), KernelError> {
    match *s.problem {
        Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } => {
            Ok((rows, vec![rows as u32, dim as u32, eps.to_bits(), unit_offset as u32]))
        }
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn prepare_resnorm_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = resnorm_uniform(s)?;
    let consts = [("WG", p(s.params, "workgroup_size") as f64), ("W_F16", s.w_f16())];
    s.one_step(&RESNORM_WG, "main", &consts, &u, grid_2d(rows as u32))
}

fn prepare_resnorm_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = resnorm_uniform(s)?;
    let per = p(s.params, "rows_per_wg");
    let consts = [("WG", p(s.params, "workgroup_size") as f64), ("ROWS", per as f64), ("W_F16", s.w_f16())];
    s.one_step(&RESNORM_SG, "main", &consts, &u, grid_2d(groups(rows, per)))
}

/// The qkv shaders always bind a bias at 2; without one a 16-byte placeholder the
/// program owns takes its place (never read: `HAS_BIAS` is false).
fn prepare_qkv(s: &WgslSetup<'_>, shader: &'static Shader) -> Result<GpuProgram, KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *s.problem else {
        return Err(wrong_op(s.kernel, s.problem));
    };
    let (wg, per) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("W_F16", s.w_f16()), ("HAS_BIAS", if bias { 1.0 } else { 0.0 })];
    let pipe = s.gpu.pipeline(shader, "main", &consts)?;
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

fn prepare_qkv_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    prepare_qkv(s, &QKV_WG)
}

fn prepare_qkv_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    prepare_qkv(s, &QKV_SG)
}

// ---------------------------------------------------------------------------------
// CPU: validity and shared helpers
// ---------------------------------------------------------------------------------

fn check_cpu(_: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(p(params, "isa"))
}

fn check_qknr_cpu(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    qknr_shape(prob)?;
    check_cpu(caps, prob, dtype, params)
}

/// The norm gain `w` (or `1 + w`, Gemma) widened to f32 once per call.
fn gains(w: CpuIn<'_>, dim: usize, unit_offset: bool) -> Vec<f32> {
    let off = if unit_offset { 1.0 } else { 0.0 };
    (0..dim).map(|i| w.get(i) + off).collect()
}

/// `1 / sqrt(mean + eps)` from a sum of squares over `dim` elements.
#[inline]
fn inv_rms(ss: f32, dim: usize, eps: f32) -> f32 {
    1.0 / (ss / dim as f32 + eps).sqrt()
}

/// The gated activation in f32 (`silu` or tanh-approximated `gelu`).
#[inline]
fn act_f32(act: Activation, g: f32) -> f32 {
    match act {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => 0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044715 * g * g * g)).tanh()),
    }
}

/// Where the two elements of rotary pair `i` sit in a head.
#[inline]
fn pair(layout: RopeLayout, i: usize, half: usize) -> (usize, usize) {
    match layout {
        RopeLayout::Half => (i, i + half),
        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
    }
}

/// Part `c0..c1` of row `r` of a row-major `[_, k]` weight.
#[inline]
fn sub_row(w: CpuIn<'_>, r: usize, k: usize, c0: usize, c1: usize) -> Row<'_> {
    match w {
        CpuIn::F32(s) => Row::F32(&s[r * k + c0..r * k + c1]),
        CpuIn::F16(s) => Row::F16(&s[r * k + c0..r * k + c1]),
        // Float kernels never get a quantized buffer: the registry checks dtypes.
        CpuIn::Q(_) => Row::F32(&[]),
    }
}

// ---------------------------------------------------------------------------------
// CPU: qk_norm_rope
// ---------------------------------------------------------------------------------

/// Two passes per head: SIMD scale into `y`, then rotation in place with f32 sin/cos
/// evaluated for this head (angle formed and reduced in f64, so far positions stay exact).
fn run_qknr_heads(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkNormRope { tokens, heads, head_dim: d, rot_dim, pos0, layout, eps, unit_offset } = *prob else {
        return Ok(());
    };
    let isa = Isa::from_param(p(params, "isa"));
    let per = (p(params, "heads_per_task") as usize).max(1);
    let g = gains(a.ins[1], d, unit_offset);
    let (x, inv_freq) = (a.ins[0].f32(), &a.ins[2].f32()[..rot_dim / 2]);
    let half = inv_freq.len();
    let y = &mut a.outs[0][..tokens * heads * d];
    y.par_chunks_mut(per * d).enumerate().for_each(|(ci, chunk)| {
        for (hi, yh) in chunk.chunks_mut(d).enumerate() {
            let head = ci * per + hi;
            let xh = &x[head * d..][..d];
            let inv = inv_rms(simd::dot(isa, xh, Row::F32(xh)), d, eps);
            micro::scale_mul(isa, xh, inv, &g, yh);
            let pos = (pos0 + head / heads) as f64;
            for (i, f) in inv_freq.iter().enumerate() {
                // exact angle in f64, reduced to [-pi, pi], then f32 sin/cos
                let a = pos * *f as f64;
                let (sn, cs) = ((a - (a / std::f64::consts::TAU).round() * std::f64::consts::TAU) as f32).sin_cos();
                let (ia, ib) = pair(layout, i, half);
                let (x0, x1) = (yh[ia], yh[ib]);
                yh[ia] = x0 * cs - x1 * sn;
                yh[ib] = x1 * cs + x0 * sn;
            }
        }
    });
    Ok(())
}

/// A `[tokens, rot_dim/2]` table of (cos, sin) built once (in f64, in parallel over
/// tokens), then one pass per head that normalizes and rotates each pair straight
/// from `x` into `y`; dims past `rot_dim` go through the SIMD scale microkernel.
fn run_qknr_table(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkNormRope { tokens, heads, head_dim: d, rot_dim, pos0, layout, eps, unit_offset } = *prob else {
        return Ok(());
    };
    let isa = Isa::from_param(p(params, "isa"));
    let per = (p(params, "heads_per_task") as usize).max(1);
    let g = gains(a.ins[1], d, unit_offset);
    let (x, inv_freq) = (a.ins[0].f32(), &a.ins[2].f32()[..rot_dim / 2]);
    let half = inv_freq.len();
    let mut table = vec![(0f32, 0f32); tokens * half];
    if half > 0 {
        table.par_chunks_mut(half).enumerate().for_each(|(t, tc)| {
            let pos = (pos0 + t) as f64;
            for (e, f) in tc.iter_mut().zip(inv_freq) {
                let (sn, cs) = (pos * *f as f64).sin_cos();
                *e = (cs as f32, sn as f32);
            }
        });
    }
    let y = &mut a.outs[0][..tokens * heads * d];
    y.par_chunks_mut(per * d).enumerate().for_each(|(ci, chunk)| {
        for (hi, yh) in chunk.chunks_mut(d).enumerate() {
            let head = ci * per + hi;
            let xh = &x[head * d..][..d];
            let inv = inv_rms(simd::dot(isa, xh, Row::F32(xh)), d, eps);
            let cs = &table[(head / heads) * half..][..half];
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (ia, ib) = pair(layout, i, half);
                let x0 = xh[ia] * inv * g[ia];
                let x1 = xh[ib] * inv * g[ib];
                yh[ia] = x0 * c - x1 * s;
                yh[ib] = x1 * c + x0 * s;
            }
            let r = 2 * half;
            micro::scale_mul(isa, &xh[r..], inv, &g[r..], &mut yh[r..]);
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------
// CPU: gate_up
// ---------------------------------------------------------------------------------

/// Features `first..first + y.len()` of one token: gate and up rows of two features
/// go through one dot4 call (x loaded once for four rows).
#[allow(clippy::too_many_arguments)]
fn gate_up_dot4(isa: Isa, x: &[f32], w: CpuIn<'_>, n: usize, k: usize, act: Activation, first: usize, y: &mut [f32]) {
    let len = y.len();
    let mut j = 0;
    while j + 2 <= len {
        let f = first + j;
        let v = simd::dot4(isa, x, [row(w, f, k), row(w, n + f, k), row(w, f + 1, k), row(w, n + f + 1, k)]);
        y[j] = act_f32(act, v[0]) * v[1];
        y[j + 1] = act_f32(act, v[2]) * v[3];
        j += 2;
    }
    if j < len {
        let f = first + j;
        y[j] = act_f32(act, simd::dot(isa, x, row(w, f, k))) * simd::dot(isa, x, row(w, n + f, k));
    }
}

/// Token rows in parallel, and within each token its features split by `gemv::par_rows`.
fn run_gate_up_dot4(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Ok(()) };
    if n == 0 {
        return Ok(());
    }
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (a.ins[0].f32(), a.ins[1]);
    a.outs[0][..rows * n].par_chunks_mut(n).enumerate().for_each(|(t, yt)| {
        let xt = &x[t * k..][..k];
        par_rows(yt, params, |first, y| gate_up_dot4(isa, xt, w, n, k, act, first, y));
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
        CpuIn::Q(_) => {
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

/// GEMM-style: each rayon task owns a block of features, packs its gate/up weight
/// panel once and sweeps all tokens two at a time through the 2x4 microkernel, so
/// every weight load feeds two tokens and every x load four rows.
fn run_gate_up_blocked(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Ok(()) };
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let isa = Isa::from_param(p(params, "isa"));
    let bn_max = (p(params, "block_n") as usize).max(1);
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
                    let v = if two { micro::dot2x4(isa, x0, x1, quad) } else { [simd::dot4_f32(isa, x0, quad), [0.0; 4]] };
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
                        out[(t + tt) * bn + jj] = act_f32(act, simd::dot_f32(isa, xt, gr)) * simd::dot_f32(isa, xt, ur);
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

// ---------------------------------------------------------------------------------
// CPU: residual_rms_norm
// ---------------------------------------------------------------------------------

/// Rows in parallel; per row one fused add + sum-of-squares pass and one scale pass.
fn run_resnorm_rows(prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } = *prob else { return Ok(()) };
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let isa = Isa::from_param(p(params, "isa"));
    let per = (p(params, "rows_per_task") as usize).max(1) * dim;
    let g = gains(a.ins[2], dim, unit_offset);
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    let mut outs = a.outs.into_iter();
    let (Some(h), Some(y)) = (outs.next(), outs.next()) else { return Ok(()) };
    let (h, y) = (&mut h[..rows * dim], &mut y[..rows * dim]);
    h.par_chunks_mut(per).zip(y.par_chunks_mut(per)).enumerate().for_each(|(ci, (hc, yc))| {
        let base = ci * per;
        for (ri, (hr, yr)) in hc.chunks_mut(dim).zip(yc.chunks_mut(dim)).enumerate() {
            let o = base + ri * dim;
            let ss = micro::add_sumsq(isa, &x[o..o + dim], &r[o..o + dim], hr);
            micro::scale_mul(isa, hr, inv_rms(ss, dim, eps), &g, yr);
        }
    });
    Ok(())
}

/// Each row split into `chunk`-element pieces processed in parallel: partial sums of
/// squares per piece (with h written), a reduction per row, then a parallel scale
/// pass over the same pieces. Parallel even for one row (decode).
fn run_resnorm_split(prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualRmsNorm { rows, dim, eps, unit_offset } = *prob else { return Ok(()) };
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let isa = Isa::from_param(p(params, "isa"));
    let cs = (p(params, "chunk") as usize).max(1);
    let g = gains(a.ins[2], dim, unit_offset);
    let (x, r) = (&a.ins[0].f32()[..rows * dim], &a.ins[1].f32()[..rows * dim]);
    let mut outs = a.outs.into_iter();
    let (Some(h), Some(y)) = (outs.next(), outs.next()) else { return Ok(()) };
    let (h, y) = (&mut h[..rows * dim], &mut y[..rows * dim]);
    let sums: Vec<f32> = h
        .par_chunks_mut(dim)
        .zip(x.par_chunks(dim))
        .zip(r.par_chunks(dim))
        .map(|((hr, xr), rr)| {
            hr.par_chunks_mut(cs)
                .zip(xr.par_chunks(cs))
                .zip(rr.par_chunks(cs))
                .map(|((hc, xc), rc)| micro::add_sumsq(isa, xc, rc, hc))
                .sum::<f32>()
        })
        .collect();
    y.par_chunks_mut(dim).zip(h.par_chunks(dim)).zip(sums.par_iter()).for_each(|((yr, hr), &ss)| {
        let inv = inv_rms(ss, dim, eps);
        yr.par_chunks_mut(cs).zip(hr.par_chunks(cs)).zip(g.par_chunks(cs)).for_each(|((yc, hc), gc)| {
            micro::scale_mul(isa, hc, inv, gc, yc);
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------
// CPU: qkv_proj
// ---------------------------------------------------------------------------------

/// One rayon pass over the rows of all three outputs (chained, so q, k and v share
/// the pool without a barrier between them); `gemv::gemv_dot4` per chunk, bias added.
fn run_qkv_dot4(prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let n = nq + 2 * nkv;
    let (x, w) = (&a.ins[0].f32()[..k], a.ins[1]);
    let b = if bias { Some(a.ins[2].f32()) } else { None };
    let grain = match p(params, "strategy") {
        1 => n.div_ceil(rayon::current_num_threads()).max(1),
        _ => (p(params, "rows_per_task") as usize).max(1),
    };
    let mut outs = a.outs.into_iter();
    let (Some(q), Some(ko), Some(vo)) = (outs.next(), outs.next(), outs.next()) else { return Ok(()) };
    let tasks = q[..nq]
        .par_chunks_mut(grain)
        .enumerate()
        .map(|(i, c)| (i * grain, c))
        .chain(ko[..nkv].par_chunks_mut(grain).enumerate().map(|(i, c)| (nq + i * grain, c)))
        .chain(vo[..nkv].par_chunks_mut(grain).enumerate().map(|(i, c)| (nq + nkv + i * grain, c)));
    tasks.for_each(|(first, y)| {
        gemv::gemv_dot4(isa, x, w, k, first, y);
        if let Some(b) = b {
            for (i, v) in y.iter_mut().enumerate() {
                *v += b[first + i];
            }
        }
    });
    Ok(())
}

/// Split-k: `k_split` slices of k (multiples of 16) run in parallel, each computing
/// partial dot products of every row over its slice (dot4, four rows per x load);
/// the partials are then summed per row with the bias and routed to q, k and v.
fn run_qkv_splitk(prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let n = nq + 2 * nkv;
    let (x, w) = (&a.ins[0].f32()[..k], a.ins[1]);
    let slice = k.div_ceil((p(params, "k_split") as usize).max(1)).div_ceil(16).max(1) * 16;
    let partials: Vec<Vec<f32>> = (0..k.div_ceil(slice))
        .into_par_iter()
        .map(|s| {
            let (c0, c1) = (s * slice, ((s + 1) * slice).min(k));
            let xs = &x[c0..c1];
            let mut part = vec![0f32; n];
            let mut r = 0;
            while r + 4 <= n {
                let rows4 =
                    [sub_row(w, r, k, c0, c1), sub_row(w, r + 1, k, c0, c1), sub_row(w, r + 2, k, c0, c1), sub_row(w, r + 3, k, c0, c1)];
                part[r..r + 4].copy_from_slice(&simd::dot4(isa, xs, rows4));
                r += 4;
            }
            for (j, v) in part.iter_mut().enumerate().skip(r) {
                *v = simd::dot(isa, xs, sub_row(w, j, k, c0, c1));
            }
            part
        })
        .collect();
    let b = if bias { Some(a.ins[2].f32()) } else { None };
    let mut outs = a.outs.into_iter();
    let (Some(q), Some(ko), Some(vo)) = (outs.next(), outs.next(), outs.next()) else { return Ok(()) };
    let dests = q[..nq].iter_mut().chain(ko[..nkv].iter_mut()).chain(vo[..nkv].iter_mut());
    for (j, dst) in dests.enumerate() {
        let mut s = b.map_or(0.0, |b| b[j]);
        for part in &partials {
            s += part[j];
        }
        *dst = s;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Family microkernels (single-threaded, SIMD, seed 003)
// ---------------------------------------------------------------------------------

/// Microkernels of this family: fused residual add + sum of squares, scale by a
/// scalar and a gain vector, and a 2-token x 4-row dot product block. `Isa::Simd256`
/// and `Isa::Avx512` both take the AVX2+FMA path on x86 (these are memory-bound or
/// register-limited at 2x4); other targets and `Isa::Scalar` use portable loops.
mod micro {
    use super::super::simd::{self, Isa};

    #[cfg(target_arch = "x86_64")]
    fn avx2(isa: Isa) -> bool {
        isa != Isa::Scalar && std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    /// `h = x + r`; returns `Σ h²`.
    pub fn add_sumsq(isa: Isa, x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
        let n = x.len().min(r.len()).min(h.len());
        let (x, r, h) = (&x[..n], &r[..n], &mut h[..n]);
        #[cfg(target_arch = "x86_64")]
        if avx2(isa) {
            // SAFETY: AVX2 and FMA were just detected; slices have equal length n.
            return unsafe { x86::add_sumsq(x, r, h) };
        }
        let _ = isa;
        let mut acc = [0f32; 8];
        let body = n / 8 * 8;
        for ((hc, xc), rc) in h[..body].chunks_exact_mut(8).zip(x.chunks_exact(8)).zip(r.chunks_exact(8)) {
            for (l, a) in acc.iter_mut().enumerate() {
                let v = xc[l] + rc[l];
                hc[l] = v;
                *a += v * v;
            }
        }
        let mut s: f32 = acc.iter().sum();
        for i in body..n {
            let v = x[i] + r[i];
            h[i] = v;
            s += v * v;
        }
        s
    }

    /// `dst[i] = src[i] * s * g[i]`.
    pub fn scale_mul(isa: Isa, src: &[f32], s: f32, g: &[f32], dst: &mut [f32]) {
        let n = src.len().min(g.len()).min(dst.len());
        let (src, g, dst) = (&src[..n], &g[..n], &mut dst[..n]);
        #[cfg(target_arch = "x86_64")]
        if avx2(isa) {
            // SAFETY: AVX2 and FMA were just detected; slices have equal length n.
            unsafe { x86::scale_mul(src, s, g, dst) };
            return;
        }
        let _ = isa;
        for ((d, v), w) in dst.iter_mut().zip(src).zip(g) {
            *d = v * s * w;
        }
    }

    /// Dot products of two activation rows with four weight rows: `[[x0·w_r], [x1·w_r]]`.
    pub fn dot2x4(isa: Isa, x0: &[f32], x1: &[f32], w: [&[f32]; 4]) -> [[f32; 4]; 2] {
        let n = w.iter().fold(x0.len().min(x1.len()), |m, r| m.min(r.len()));
        let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
        #[cfg(target_arch = "x86_64")]
        if avx2(isa) {
            // SAFETY: AVX2 and FMA were just detected; all six slices have length >= n.
            return unsafe { x86::dot2x4(&x0[..n], &x1[..n], w) };
        }
        [simd::dot4_f32(isa, &x0[..n], w), simd::dot4_f32(isa, &x1[..n], w)]
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        #[target_feature(enable = "avx2,fma")]
        fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn add_sumsq(x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
            let n = x.len();
            let (xp, rp, hp) = (x.as_ptr(), r.as_ptr(), h.as_mut_ptr());
            let mut a0 = _mm256_setzero_ps();
            let mut a1 = _mm256_setzero_ps();
            let mut i = 0;
            // SAFETY: x, r and h have length n; every access is in [i, i + 8) with i + 8 <= n.
            unsafe {
                while i + 16 <= n {
                    let v0 = _mm256_add_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(rp.add(i)));
                    let v1 = _mm256_add_ps(_mm256_loadu_ps(xp.add(i + 8)), _mm256_loadu_ps(rp.add(i + 8)));
                    _mm256_storeu_ps(hp.add(i), v0);
                    _mm256_storeu_ps(hp.add(i + 8), v1);
                    a0 = _mm256_fmadd_ps(v0, v0, a0);
                    a1 = _mm256_fmadd_ps(v1, v1, a1);
                    i += 16;
                }
                while i + 8 <= n {
                    let v0 = _mm256_add_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(rp.add(i)));
                    _mm256_storeu_ps(hp.add(i), v0);
                    a0 = _mm256_fmadd_ps(v0, v0, a0);
                    i += 8;
                }
            }
            let mut s = hsum(_mm256_add_ps(a0, a1));
            while i < n {
                let v = x[i] + r[i];
                h[i] = v;
                s += v * v;
                i += 1;
            }
            s
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn scale_mul(src: &[f32], s: f32, g: &[f32], dst: &mut [f32]) {
            let n = src.len();
            let (sp, gp, dp) = (src.as_ptr(), g.as_ptr(), dst.as_mut_ptr());
            let sv = _mm256_set1_ps(s);
            let mut i = 0;
            // SAFETY: src, g and dst have length n; every access is in [i, i + 8) with i + 8 <= n.
            unsafe {
                while i + 8 <= n {
                    let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sp.add(i)), sv), _mm256_loadu_ps(gp.add(i)));
                    _mm256_storeu_ps(dp.add(i), v);
                    i += 8;
                }
            }
            while i < n {
                dst[i] = src[i] * s * g[i];
                i += 1;
            }
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot2x4(x0: &[f32], x1: &[f32], w: [&[f32]; 4]) -> [[f32; 4]; 2] {
            let n = x0.len();
            let (ap, bp) = (x0.as_ptr(), x1.as_ptr());
            let wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
            let mut acc0 = [_mm256_setzero_ps(); 4];
            let mut acc1 = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            // SAFETY: all six slices have length n; loads read [i, i + 8) with i + 8 <= n.
            unsafe {
                while i + 8 <= n {
                    let xa = _mm256_loadu_ps(ap.add(i));
                    let xb = _mm256_loadu_ps(bp.add(i));
                    for r in 0..4 {
                        let wv = _mm256_loadu_ps(wp[r].add(i));
                        acc0[r] = _mm256_fmadd_ps(xa, wv, acc0[r]);
                        acc1[r] = _mm256_fmadd_ps(xb, wv, acc1[r]);
                    }
                    i += 8;
                }
            }
            let mut out = [[0f32; 4]; 2];
            for r in 0..4 {
                let (mut s0, mut s1) = (hsum(acc0[r]), hsum(acc1[r]));
                for c in i..n {
                    s0 += x0[c] * w[r][c];
                    s1 += x1[c] * w[r][c];
                }
                out[0][r] = s0;
                out[1][r] = s1;
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microkernels_agree_across_isas() {
        let n = 67;
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.1).collect();
        let r: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.2).collect();
        let ws: Vec<Vec<f32>> = (0..4).map(|s| (0..n).map(|i| ((i * (s + 3) % 9) as f32 - 4.0) * 0.05).collect()).collect();
        for v in simd::ISA_VALUES {
            let isa = Isa::from_param(*v);
            let mut h = vec![0f32; n];
            let ss = micro::add_sumsq(isa, &x, &r, &mut h);
            let want: f64 = x.iter().zip(&r).map(|(a, b)| ((a + b) as f64).powi(2)).sum();
            assert!((ss as f64 - want).abs() < 1e-4 * want.max(1.0));
            let mut y = vec![0f32; n];
            micro::scale_mul(isa, &h, 0.5, &x, &mut y);
            for i in 0..n {
                assert!((y[i] - h[i] * 0.5 * x[i]).abs() < 1e-6);
            }
            let d = micro::dot2x4(isa, &x, &r, [&ws[0], &ws[1], &ws[2], &ws[3]]);
            for (t, xt) in [&x, &r].iter().enumerate() {
                for (j, wr) in ws.iter().enumerate() {
                    let want: f64 = xt.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((d[t][j] as f64 - want).abs() < 1e-4, "isa {v} token {t} row {j}");
                }
            }
        }
    }

    /// f32 angles `pos * f` lose ~1e-3 rad at position 30000; every variant must form
    /// (or correct) and reduce the angle so far positions stay within tolerance.
    #[test]
    fn qk_norm_rope_stays_exact_at_far_positions() {
        use super::super::verify::{Runner, check_one};
        use super::super::{Caps, for_op};
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
                for dtype in BOTH {
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

    #[test]
    fn every_op_has_two_wgsl_and_two_cpu_kernels() {
        for op in [Op::QkNormRope, Op::GateUp, Op::ResidualRmsNorm, Op::QkvProj] {
            let ks: Vec<_> = variants().into_iter().filter(|k| k.op == op).collect();
            let wgsl = ks.iter().filter(|k| matches!(k.imp, Impl::Wgsl(_))).count();
            assert!(wgsl >= 2 && ks.len() - wgsl >= 2, "{op}: {wgsl} WGSL of {} kernels", ks.len());
            for k in &ks {
                assert!(k.id.starts_with(op.name()), "{} does not start with {op}", k.id);
                assert_eq!(k.dtypes, BOTH, "{} lacks a dtype", k.id);
            }
        }
    }
}
