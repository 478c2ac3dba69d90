//! Quantized matrix products: GEMV (decode), GEMM (prefill), the fused gate+up
//! (activation in the epilogue) and the fused QKV GEMV over weights stored as
//! ggml blocks ([`DType::Q8_0`], [`DType::Q4_0`], [`DType::Q4_1`]) in the split
//! layout of [`QMatrix`](super::quant::QMatrix): every kernel reads the blocks
//! directly and dequantizes in registers (or, for the GEMM panels, into a small
//! f32 buffer that the f32 microkernel then reuses across tokens).
//!
//! WGSL (the block format is the `QFMT` override constant): `gemv_q_wg`
//! (workgroup reduction), `gemv_q_subgroup` (subgroupAdd), `gemm_q_tiled` (block
//! columns of w dequantized into workgroup memory, 4x4 register blocks),
//! `gate_up_q_wg`, `qkv_proj_q_wg`. Each binds the weight buffer twice: the quants
//! region, and the scales region from its 256-byte aligned offset (seed 004).
//! CPU: `gemv_q_cpu` (AVX2/FMA block dot products, rayon over rows),
//! `gemm_q_rows_cpu` (each weight row dequantized once, dotted with every token),
//! `gemm_q_panel_cpu` (blocks of weight rows dequantized into an f32 panel, then
//! the cache-blocked f32 GEMM of `gemm`), `gate_up_q_cpu`, `qkv_proj_q_cpu`.
//! Every kernel needs k to be a whole number of 32-element blocks.

use std::cell::RefCell;

use rayon::prelude::*;

use super::gemm::{self, Blocking, Micro, Split};
use super::gemv::par_rows;
use super::quant::{QFormat, QK, QView, dequantize_block};
use super::simd::{self, Isa};
use super::{
    Activation, CpuArgs, CpuImpl, CpuIn, DType, Impl, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, p,
    packed_f16, wrong_op,
};
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{Bind, GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static QGEMV_WG: Shader = shader!("qgemv_wg.wgsl", "qgemv.wgsl", "qblock.wgsl", "block_wg.wgsl", "reduce_wg.wgsl");
static QGEMV_SG: Shader = shader!("qgemv_subgroup.wgsl", "qgemv.wgsl", "qblock.wgsl", "row_sg.wgsl", "reduce_sg.wgsl");
static QGEMM_TILED: Shader = shader!("qgemm_tiled.wgsl", "qblock.wgsl");
static QGATE_UP_WG: Shader = shader!("qgate_up_wg.wgsl", "qblock.wgsl", "act.wgsl", "reduce_wg.wgsl");
static QQKV_WG: Shader = shader!("qqkv_proj_wg.wgsl", "qblock.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "qkv_store.wgsl");

const QUANT: &[DType] = DType::QUANT;

const ISA: ParamSpec = ParamSpec { name: "isa", values: simd::ISA_VALUES, default: 0, help: simd::ISA_HELP };
const ROWS_PER_TASK: ParamSpec =
    ParamSpec { name: "rows_per_task", values: &[8, 16, 32, 64, 128, 256], default: 64, help: "weight rows per rayon task" };

const WG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8], default: 2, help: "output rows per workgroup" },
];
const SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "output rows per workgroup, spread over its subgroups" },
];
const TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "tile_m", values: &[16, 32, 64], default: 32, help: "rows of y per workgroup (4 per invocation)" },
    ParamSpec { name: "tile_n", values: &[16, 32, 64, 128], default: 64, help: "columns of y per workgroup (4 per invocation)" },
];
/// `act_bits`: f32 activations, or int8 ones (see [`verify::tolerance_for`](super::verify::tolerance_for)).
pub const ACT_BITS: ParamSpec = ParamSpec {
    name: "act_bits",
    values: &[32, 8],
    default: 32,
    help: "activations: 32 f32 (exact dot with the dequantized weights), 8 int8 blocks of 32 with integer dot products \
           (llama.cpp's q8 activations: about 0.5% error, far fewer instructions per weight)",
};
/// `rows_per_pass`: with int8 activations, weight rows per pass over the activation blocks.
pub const ROWS_PER_PASS: ParamSpec = ParamSpec {
    name: "rows_per_pass",
    values: &[1, 4],
    default: 1,
    help: "weight rows dotted per pass over the int8 activation blocks (act_bits 8): 4 loads each activation block once for \
           four rows and keeps four accumulator chains (measured: q4_1 +38%, q8_0 -10% single-threaded on AVX2)",
};
const CPU_GEMV_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS, ROWS_PER_PASS];
/// gate_up and qkv: `act_bits` applies to decode (one token); prefill rows stay f32.
const CPU_QKV_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS, ROWS_PER_PASS];
const CPU_FUSED_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS];
const CPU_GEMM_ROWS_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[4, 8, 16, 32, 64], default: 16, help: "weight rows per rayon task" },
    ParamSpec {
        name: "tokens_per_tile",
        values: &[4, 16, 64],
        default: 16,
        help: "tokens swept per dequantized weight row while it is in L1",
    },
    ISA,
];
const CPU_PANEL_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "nc", values: &[64, 128, 256, 512], default: 256, help: "weight rows dequantized into one f32 panel" },
    ParamSpec { name: "kc", values: &[128, 256, 512], default: 256, help: "depth of a packed block of the f32 GEMM" },
    ISA,
];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef {
            id: "gemv_q_wg",
            op: Op::Gemv,
            summary: "quantized blocks read as u32 words, dequantized in registers; ROWS rows per workgroup; workgroup reduction",
            dtypes: QUANT,
            params: WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QGEMV_WG,
                workgroup_size: wg_size,
                shared_memory: shared_rows,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_wgsl,
                prepare: prepare_gemv_wg,
            }),
        },
        KernelDef {
            id: "gemv_q_subgroup",
            op: Op::Gemv,
            summary: "quantized blocks dequantized in registers; one subgroup per row, subgroupAdd, no barriers",
            dtypes: QUANT,
            params: SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QGEMV_SG,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_subgroup,
                prepare: prepare_gemv_sg,
            }),
        },
        KernelDef {
            id: "gemv_q_cpu",
            op: Op::Gemv,
            summary: "SIMD block dot products (AVX2+FMA, scalar fallback) straight from the quants, f32 or int8 activations; rayon over rows",
            dtypes: QUANT,
            params: CPU_GEMV_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gemv, check: check_cpu }),
        },
        KernelDef {
            id: "gemm_q_tiled",
            op: Op::Gemm,
            summary: "block columns of w dequantized into workgroup memory with the x tile; 4x4 register blocks",
            dtypes: QUANT,
            params: TILED_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QGEMM_TILED,
                workgroup_size: tiled_wg,
                shared_memory: tiled_shared,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_tiled,
                prepare: prepare_tiled,
            }),
        },
        KernelDef {
            id: "gemm_q_rows_cpu",
            op: Op::Gemm,
            summary: "each weight row dequantized once into L1, dotted with tiles of tokens; rayon over rows",
            dtypes: QUANT,
            params: CPU_GEMM_ROWS_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gemm_rows, check: check_cpu }),
        },
        KernelDef {
            id: "gemm_q_panel_cpu",
            op: Op::Gemm,
            summary: "nc weight rows dequantized into an f32 panel, then the cache-blocked f32 GEMM microkernel",
            dtypes: QUANT,
            params: CPU_PANEL_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gemm_panel, check: check_cpu }),
        },
        KernelDef {
            id: "gate_up_q_wg",
            op: Op::GateUp,
            summary: "quantized gate and up rows dequantized in registers, workgroup reduction, activation product in the epilogue",
            dtypes: QUANT,
            params: WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QGATE_UP_WG,
                workgroup_size: wg_size,
                shared_memory: shared_gate_up,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_gate_up_wgsl,
                prepare: prepare_gate_up,
            }),
        },
        KernelDef {
            id: "gate_up_q_cpu",
            op: Op::GateUp,
            summary: "gate and up rows of each feature dequantized once and dotted with every token (decode: block dots, f32 or int8 activations); activation product; rayon over features",
            dtypes: QUANT,
            params: CPU_FUSED_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gate_up, check: check_cpu }),
        },
        KernelDef {
            id: "qkv_proj_q_wg",
            op: Op::QkvProj,
            summary: "one quantized GEMV over the concatenated Q/K/V weight, bias and routing in the epilogue, workgroup reduction",
            dtypes: QUANT,
            params: WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &QQKV_WG,
                workgroup_size: wg_size,
                shared_memory: shared_rows,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_qkv_wgsl,
                prepare: prepare_qkv,
            }),
        },
        KernelDef {
            id: "qkv_proj_q_cpu",
            op: Op::QkvProj,
            summary: "SIMD block dot products over the concatenated Q/K/V rows, f32 or int8 activations, bias added; rayon over rows of all three",
            dtypes: QUANT,
            params: CPU_QKV_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_qkv, check: check_cpu }),
        },
    ]
}

// ---------------------------------------------------------------------------------
// Validity
// ---------------------------------------------------------------------------------

/// The reduction depth of each op's weight, for the block rule.
fn depth(prob: &Problem) -> Option<usize> {
    match *prob {
        Problem::Gemv { k, .. }
        | Problem::Gemm { k, .. }
        | Problem::GateUp { k, .. }
        | Problem::QkvProj { k, .. }
        | Problem::NormGemv { k, .. } => Some(k),
        _ => None,
    }
}

/// k must be a whole number of 32-element blocks (rows are whole blocks).
pub fn check_blocks(prob: &Problem, dtype: DType) -> Result<(), String> {
    if !dtype.is_quant() {
        return Err(format!("{dtype} is not a quantized format"));
    }
    match depth(prob) {
        Some(k) if k == 0 || !k.is_multiple_of(QK) => {
            Err(format!("k = {k} is not a positive multiple of {QK} (the {dtype} block size); quantized rows are whole blocks"))
        }
        _ => Ok(()),
    }
}

fn check_cpu(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(p(params, "isa"))?;
    if params.get("rows_per_pass").is_some_and(|&r| r != 1) && params.get("act_bits") != Some(&8) {
        return Err("rows_per_pass 4 needs int8 activations (act_bits 8)".into());
    }
    check_blocks(prob, dtype)
}

fn grid_ok(caps: &GpuCaps, count: u32, what: &str) -> Result<(), String> {
    if count > caps.max_workgroups_per_dimension {
        return Err(format!("{count} workgroups along {what} exceed the adapter's {}", caps.max_workgroups_per_dimension));
    }
    Ok(())
}

fn check_wgsl(_: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)
}

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let wg = p(params, "workgroup_size");
    if caps.subgroup_max_size > wg {
        return Err(format!("workgroup of {wg} is smaller than the adapter's subgroup size {}", caps.subgroup_max_size));
    }
    check_blocks(prob, dtype)
}

fn check_gate_up_wgsl(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    if let Problem::GateUp { rows, n, .. } = *prob {
        grid_ok(caps, groups(n, p(params, "rows_per_wg")), "features")?;
        grid_ok(caps, rows as u32, "tokens")?;
    }
    Ok(())
}

fn check_qkv_wgsl(caps: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    if caps.max_storage_buffers_per_stage < 7 {
        return Err(format!("needs 7 storage buffers per stage, the adapter allows {}", caps.max_storage_buffers_per_stage));
    }
    check_blocks(prob, dtype)
}

fn check_tiled(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    if let Problem::Gemm { m, n, .. } = *prob {
        grid_ok(caps, groups(n, p(params, "tile_n")), "n")?;
        grid_ok(caps, groups(m, p(params, "tile_m")), "m")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

fn wg_size(params: &Params) -> [u32; 3] {
    [p(params, "workgroup_size"), 1, 1]
}

fn shared_rows(_: &Problem, _: DType, params: &Params) -> u64 {
    4 * p(params, "workgroup_size") as u64 * p(params, "rows_per_wg") as u64
}

fn shared_gate_up(_: &Problem, _: DType, params: &Params) -> u64 {
    8 * p(params, "workgroup_size") as u64 * p(params, "rows_per_wg") as u64
}

fn tiled_wg(params: &Params) -> [u32; 3] {
    [(p(params, "tile_m") / 4) * (p(params, "tile_n") / 4), 1, 1]
}

fn tiled_shared(_: &Problem, _: DType, params: &Params) -> u64 {
    4 * (p(params, "tile_m") as u64 * 32 + p(params, "tile_n") as u64 * 33)
}

/// The `QFMT` override value of a quantized dtype.
pub fn qfmt(dtype: DType) -> f64 {
    match dtype {
        DType::Q4_0 => 1.0,
        DType::Q4_1 => 2.0,
        _ => 0.0,
    }
}

/// The bindings of a quantized kernel: the op's buffers in order with the weight
/// (binding `wi`) expanded into its quants and scales regions, then `extra`.
pub(super) fn qbinds<'a>(s: &'a WgslSetup<'a>, wi: usize, extra: &[&'a wgpu::Buffer]) -> Result<Vec<Bind<'a>>, KernelError> {
    let spec = s.problem.buffers(s.dtype);
    let (Some(w), Some(fmt)) = (spec.get(wi), s.dtype.quant()) else {
        return Err(KernelError::Invalid { kernel: s.kernel.id.into(), reason: format!("{} is not a quantized format", s.dtype) });
    };
    let l = fmt.layout(w.len() / QK);
    let buf = s.bufs[wi];
    if buf.size() < l.total as u64 {
        return Err(KernelError::BufferLen {
            kernel: s.kernel.id.into(),
            buffer: w.id.into(),
            expected: l.total,
            got: buf.size() as usize,
        });
    }
    let mut out: Vec<Bind<'a>> = s.bufs[..wi].iter().map(|b| Bind::Whole(b)).collect();
    out.push(Bind::Range(buf, 0, l.quants.max(16) as u64));
    out.push(Bind::Range(buf, l.scales_offset as u64, l.scales.max(4) as u64));
    out.extend(s.bufs[wi + 1..].iter().map(|b| Bind::Whole(b)));
    out.extend(extra.iter().map(|b| Bind::Whole(b)));
    Ok(out)
}

fn one_q_step(
    s: &WgslSetup<'_>,
    shader: &'static Shader,
    consts: &[(&str, f64)],
    uniform: &[u32],
    workgroups: [u32; 3],
) -> Result<GpuProgram, KernelError> {
    let pipe = s.gpu.pipeline(shader, "main", consts)?;
    let u = s.gpu.uniform(s.kernel.id, uniform);
    let step = {
        let binds = qbinds(s, 1, &[&u])?;
        s.gpu.step_ranges(s.kernel.id, pipe, &binds, workgroups)?
    };
    Ok(GpuProgram { steps: vec![step], owned: vec![u] })
}

fn prepare_gemv(s: &WgslSetup<'_>, shader: &'static Shader) -> Result<GpuProgram, KernelError> {
    let Problem::Gemv { n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, rows) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("QFMT", qfmt(s.dtype))];
    one_q_step(s, shader, &consts, &[n as u32, k as u32], grid_2d(groups(n, rows)))
}

fn prepare_gemv_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    prepare_gemv(s, &QGEMV_WG)
}

fn prepare_gemv_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    prepare_gemv(s, &QGEMV_SG)
}

fn prepare_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemm { m, n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (tm, tn) = (p(s.params, "tile_m"), p(s.params, "tile_n"));
    let [wgs, _, _] = tiled_wg(s.params);
    let consts = [("TILE_M", tm as f64), ("TILE_N", tn as f64), ("WGS", wgs as f64), ("QFMT", qfmt(s.dtype))];
    one_q_step(s, &QGEMM_TILED, &consts, &[m as u32, n as u32, k as u32], [groups(n, tn).max(1), groups(m, tm).max(1), 1])
}

fn prepare_gate_up(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::GateUp { rows, n, k, act } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("QFMT", qfmt(s.dtype))];
    let uniform = [rows as u32, n as u32, k as u32, act.code()];
    one_q_step(s, &QGATE_UP_WG, &consts, &uniform, [groups(n, per).max(1), (rows as u32).max(1), 1])
}

/// The bias is always bound at 3; without one a 16-byte placeholder the program
/// owns takes its place (never read: `HAS_BIAS` is false).
fn prepare_qkv(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", per as f64), ("QFMT", qfmt(s.dtype)), ("HAS_BIAS", if bias { 1.0 } else { 0.0 })];
    let pipe = s.gpu.pipeline(&QQKV_WG, "main", &consts)?;
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

// ---------------------------------------------------------------------------------
// CPU microkernels
// ---------------------------------------------------------------------------------

/// `Σ x[i] * w[i]` where `w` is the dequantized view (`x.len()` = `w.elems()`).
pub fn dot_q(isa: Isa, x: &[f32], w: QView<'_>) -> f32 {
    let blocks = w.blocks().min(x.len() / QK);
    let w = w.blocks_range(0, blocks);
    #[cfg(target_arch = "x86_64")]
    {
        if isa != Isa::Scalar && x86::available() {
            // SAFETY: `available` checked AVX2, FMA and F16C; lengths are whole blocks of `x`.
            return unsafe {
                match w.format {
                    QFormat::Q8_0 => x86::dot_q8_0(x, w.quants, w.scales),
                    QFormat::Q4_0 => x86::dot_q4_0(x, w.quants, w.scales),
                    QFormat::Q4_1 => x86::dot_q4_1(x, w.quants, w.scales),
                }
            };
        }
    }
    let _ = isa;
    dot_q_scalar(x, w)
}

/// Activations quantized to int8 blocks of 32 (llama.cpp's q8_0 activations):
/// per block `d = max|x| / 127`, `q = round(x / d)`, and `Σ q` for the offset terms.
pub struct XQ8 {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
    /// `d * Σ q` per block: the q4_1 minimum's term is `m * dsum`.
    pub dsum: Vec<f32>,
}

impl XQ8 {
    pub fn quantize(x: &[f32]) -> XQ8 {
        let blocks = x.len() / QK;
        let mut out = XQ8 { q: vec![0; blocks * QK], d: vec![0.0; blocks], sum: vec![0; blocks], dsum: vec![0.0; blocks] };
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.d[b] = d;
            let mut s = 0i32;
            for (q, &v) in out.q[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
                *q = (v * id).round() as i8;
                s += *q as i32;
            }
            out.sum[b] = s;
            out.dsum[b] = d * s as f32;
        }
        out
    }
}

/// `Σ x[i] * w[i]` with `x` as int8 blocks: integer dot products per block, scaled
/// by both blocks' scales (and the q4 offsets through `Σ q`).
pub fn dot_q_i8(isa: Isa, x: &XQ8, w: QView<'_>) -> f32 {
    let blocks = w.blocks().min(x.d.len());
    let w = w.blocks_range(0, blocks);
    #[cfg(target_arch = "x86_64")]
    {
        if isa != Isa::Scalar && x86::available() {
            // SAFETY: `available` checked AVX2, FMA and F16C; `x` holds `blocks` blocks.
            return unsafe { x86::dot_i8(w.format, w.quants, w.scales, x) };
        }
    }
    let _ = isa;
    let mut s = 0f32;
    for b in 0..blocks {
        let (q, sc) = w.block(b);
        let xq = &x.q[b * QK..(b + 1) * QK];
        let (dot, off) = match w.format {
            QFormat::Q8_0 => (q.iter().zip(xq).map(|(&a, &c)| a as i8 as i32 * c as i32).sum::<i32>(), 0.0),
            QFormat::Q4_0 | QFormat::Q4_1 => {
                let d: i32 = (0..QK / 2).map(|j| (q[j] & 15) as i32 * xq[j] as i32 + (q[j] >> 4) as i32 * xq[j + QK / 2] as i32).sum();
                let off = match w.format {
                    QFormat::Q4_0 => -8.0 * sc[0].to_f32() * x.d[b] * x.sum[b] as f32,
                    _ => sc[1].to_f32() * x.d[b] * x.sum[b] as f32,
                };
                (d, off)
            }
        };
        s += sc[0].to_f32() * x.d[b] * dot as f32 + off;
    }
    s
}

/// A decode activation vector as a kernel's `act_bits` asks: f32, or int8 blocks.
pub enum ActVec<'a> {
    F32(&'a [f32]),
    I8(XQ8),
}

impl<'a> ActVec<'a> {
    pub fn new(x: &'a [f32], params: &Params) -> ActVec<'a> {
        if params.get("act_bits") == Some(&8) { ActVec::I8(XQ8::quantize(x)) } else { ActVec::F32(x) }
    }
    #[inline]
    pub fn dot(&self, isa: Isa, w: QView<'_>) -> f32 {
        match self {
            ActVec::F32(x) => dot_q(isa, x, w),
            ActVec::I8(x) => dot_q_i8(isa, x, w),
        }
    }
    /// Rows `first..first + y.len()` of `w` (`k` columns) dotted with this vector
    /// into `y`; with `four`, int8 activations take four rows per pass on AVX2.
    pub fn rows(&self, isa: Isa, w: QView<'_>, k: usize, first: usize, y: &mut [f32], four: bool) {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = four;
        #[cfg(target_arch = "x86_64")]
        if let ActVec::I8(x) = self
            && four
            && isa != Isa::Scalar
            && x86::available()
            && x.d.len() * QK >= k
        {
            let mut i = 0;
            while i + 4 <= y.len() {
                let r: [QView<'_>; 4] = std::array::from_fn(|j| qrow(w, first + i + j, k));
                // SAFETY: AVX2/FMA/F16C checked; each row holds k / 32 blocks, as x does (or more).
                let out = unsafe { x86::dot_i8_x4(w.format, r.map(|v| v.quants), r.map(|v| v.scales), x) };
                y[i..i + 4].copy_from_slice(&out);
                i += 4;
            }
            for (j, out) in y[i..].iter_mut().enumerate() {
                *out = self.dot(isa, qrow(w, first + i + j, k));
            }
            return;
        }
        for (i, out) in y.iter_mut().enumerate() {
            *out = self.dot(isa, qrow(w, first + i, k));
        }
    }
}

/// Portable block-by-block dot product.
pub fn dot_q_scalar(x: &[f32], w: QView<'_>) -> f32 {
    let mut tmp = [0f32; QK];
    let mut s = 0f32;
    for b in 0..w.blocks() {
        let (q, sc) = w.block(b);
        dequantize_block(w.format, q, sc, &mut tmp);
        s += simd::dot_f32_scalar(&x[b * QK..(b + 1) * QK], &tmp);
    }
    s
}

/// Dequantizes a view into `out` (SIMD where available).
pub fn dequantize(isa: Isa, w: QView<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa != Isa::Scalar && x86::available() {
            let blocks = w.blocks().min(out.len() / QK);
            // SAFETY: as in `dot_q`; `out` holds `blocks * 32` values.
            unsafe { x86::dequantize(w.format, &w.quants[..blocks * w.format.quant_bytes()], w.scales, &mut out[..blocks * QK]) };
            return;
        }
    }
    let _ = isa;
    w.dequantize_into(out);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::QFormat;

    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "f16c")]
    fn h(v: f16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v.to_bits() as i32)))
    }

    /// The 32 weights of a q8_0 block as four vectors of 8 (unscaled).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q8(q: *const u8) -> [__m256; 4] {
        // SAFETY: the caller passes a pointer to 32 readable bytes.
        let raw = unsafe { _mm256_loadu_si256(q as *const __m256i) };
        let (lo, hi) = (_mm256_castsi256_si128(raw), _mm256_extracti128_si256(raw, 1));
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))),
        ]
    }

    /// The 32 nibbles of a 4-bit block (elements 0..32 in ggml order) as four vectors.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q4(q: *const u8) -> [__m256; 4] {
        // SAFETY: the caller passes a pointer to 16 readable bytes.
        let raw = unsafe { _mm_loadu_si128(q as *const __m128i) };
        let mask = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(raw, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        [
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
        ]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot32(v: [__m256; 4], x: *const f32) -> __m256 {
        // SAFETY: the caller passes a pointer to 32 readable floats.
        unsafe {
            let mut p = _mm256_mul_ps(v[0], _mm256_loadu_ps(x));
            p = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x.add(8)), p);
            p = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x.add(16)), p);
            _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x.add(24)), p)
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C available; `q` holds whole blocks, `s` one scale per block
    /// and `x` 32 values per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0(x: &[f32], q: &[u8], s: &[f16]) -> f32 {
        let blocks = q.len() / 32;
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut b = 0;
        // SAFETY: block b reads q[32b..32b+32] and x[32b..32b+32], inside the slices.
        unsafe {
            while b + 2 <= blocks {
                let p0 = dot32(q8(q.as_ptr().add(32 * b)), x.as_ptr().add(32 * b));
                let p1 = dot32(q8(q.as_ptr().add(32 * b + 32)), x.as_ptr().add(32 * b + 32));
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b])), p0, a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b + 1])), p1, a1);
                b += 2;
            }
            if b < blocks {
                let p0 = dot32(q8(q.as_ptr().add(32 * b)), x.as_ptr().add(32 * b));
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b])), p0, a0);
            }
        }
        hsum(_mm256_add_ps(a0, a1))
    }

    /// # Safety
    /// As [`dot_q8_0`], with 16 bytes per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_0(x: &[f32], q: &[u8], s: &[f16]) -> f32 {
        let blocks = q.len() / 16;
        let eight = _mm256_set1_ps(8.0);
        let mut acc = _mm256_setzero_ps();
        #[allow(clippy::needless_range_loop)]
        for b in 0..blocks {
            // SAFETY: block b reads q[16b..16b+16] and x[32b..32b+32].
            unsafe {
                let v = q4(q.as_ptr().add(16 * b));
                let v = [_mm256_sub_ps(v[0], eight), _mm256_sub_ps(v[1], eight), _mm256_sub_ps(v[2], eight), _mm256_sub_ps(v[3], eight)];
                let p = dot32(v, x.as_ptr().add(32 * b));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b])), p, acc);
            }
        }
        hsum(acc)
    }

    /// # Safety
    /// As [`dot_q8_0`], with 16 bytes and two scales (d, m) per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1(x: &[f32], q: &[u8], s: &[f16]) -> f32 {
        let blocks = q.len() / 16;
        let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        #[allow(clippy::needless_range_loop)]
        for b in 0..blocks {
            // SAFETY: block b reads q[16b..16b+16] and x[32b..32b+32].
            unsafe {
                let xp = x.as_ptr().add(32 * b);
                let p = dot32(q4(q.as_ptr().add(16 * b)), xp);
                let sx = _mm256_add_ps(
                    _mm256_add_ps(_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8))),
                    _mm256_add_ps(_mm256_loadu_ps(xp.add(16)), _mm256_loadu_ps(xp.add(24))),
                );
                acc = _mm256_fmadd_ps(_mm256_set1_ps(h(s[2 * b])), p, acc);
                accm = _mm256_fmadd_ps(_mm256_set1_ps(h(s[2 * b + 1])), sx, accm);
            }
        }
        hsum(_mm256_add_ps(acc, accm))
    }

    /// Σ over 32 lanes of `|w| * sign(x, w)` for signed int8 `w` and `x`, as 8 i32
    /// sums in f32 (`maddubs` needs one unsigned operand: llama.cpp's sign trick).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn dot_s8(w: __m256i, x: __m256i) -> __m256 {
        let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, _mm256_set1_epi16(1)))
    }

    /// The 32 nibbles of a 4-bit block as unsigned bytes in ggml element order.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn nibbles(q: *const u8) -> __m256i {
        // SAFETY: the caller passes a pointer to 16 readable bytes.
        let raw = unsafe { _mm_loadu_si128(q as *const __m128i) };
        let mask = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask))
    }

    /// Block `b`'s integer dot product with `x` (f32 lanes to be summed) and the
    /// weight scale.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_i8(format: QFormat, q: &[u8], s: &[f16], x: &super::XQ8, b: usize) -> (__m256, f32) {
        // SAFETY: the caller keeps b below the block count of `q`, `s` and `x`.
        unsafe {
            let xv = _mm256_loadu_si256(x.q.as_ptr().add(32 * b) as *const __m256i);
            match format {
                QFormat::Q8_0 => (dot_s8(_mm256_loadu_si256(q.as_ptr().add(32 * b) as *const __m256i), xv), h(s[b])),
                // Nibbles minus 8 are signed weights: no offset term.
                QFormat::Q4_0 => (dot_s8(_mm256_sub_epi8(nibbles(q.as_ptr().add(16 * b)), _mm256_set1_epi8(8)), xv), h(s[b])),
                // Unsigned nibbles times int8 x; the minimum m enters through Σx (`x.dsum`).
                QFormat::Q4_1 => {
                    let prod = _mm256_maddubs_epi16(nibbles(q.as_ptr().add(16 * b)), xv);
                    (_mm256_cvtepi32_ps(_mm256_madd_epi16(prod, _mm256_set1_epi16(1))), h(s[2 * b]))
                }
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C available; `q` holds whole blocks, `s` their scales and
    /// `x` at least as many blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_i8(format: QFormat, q: &[u8], s: &[f16], x: &super::XQ8) -> f32 {
        // One loop per format (the match is resolved outside the loop), two blocks
        // per step into two accumulators so the FMA chains overlap.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run<const F: u8>(q: &[u8], s: &[f16], x: &super::XQ8) -> f32 {
            let format = [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1][F as usize];
            let blocks = q.len() / format.quant_bytes();
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut m0, mut m1) = (0f32, 0f32);
            let mut b = 0;
            // SAFETY (every block_i8 call): b < blocks, the block count of q, s and x.
            unsafe {
                while b + 2 <= blocks {
                    let (p0, d0) = block_i8(format, q, s, x, b);
                    let (p1, d1) = block_i8(format, q, s, x, b + 1);
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x.d[b]), p0, a0);
                    a1 = _mm256_fmadd_ps(_mm256_set1_ps(d1 * x.d[b + 1]), p1, a1);
                    if format == QFormat::Q4_1 {
                        m0 += h(s[2 * b + 1]) * x.dsum[b];
                        m1 += h(s[2 * b + 3]) * x.dsum[b + 1];
                    }
                    b += 2;
                }
                if b < blocks {
                    let (p0, d0) = block_i8(format, q, s, x, b);
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x.d[b]), p0, a0);
                    if format == QFormat::Q4_1 {
                        m0 += h(s[2 * b + 1]) * x.dsum[b];
                    }
                }
            }
            hsum(_mm256_add_ps(a0, a1)) + m0 + m1
        }
        // SAFETY: as the caller's contract.
        unsafe {
            match format {
                QFormat::Q8_0 => run::<0>(q, s, x),
                QFormat::Q4_0 => run::<1>(q, s, x),
                QFormat::Q4_1 => run::<2>(q, s, x),
            }
        }
    }

    /// Four rows at once: [`dot_i8`] of `x` with each of `q[r]`/`s[r]` (the same
    /// block count), every activation block loaded once for the four.
    ///
    /// # Safety
    /// As [`dot_i8`], for each row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_i8_x4(format: QFormat, q: [&[u8]; 4], s: [&[f16]; 4], x: &super::XQ8) -> [f32; 4] {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run<const F: u8>(q: [&[u8]; 4], s: [&[f16]; 4], x: &super::XQ8) -> [f32; 4] {
            let format = [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1][F as usize];
            let blocks = q[0].len() / format.quant_bytes();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut m = [0f32; 4];
            for b in 0..blocks {
                let xd = x.d[b];
                for r in 0..4 {
                    // SAFETY: b < blocks, the block count of every row and of x.
                    let (p, d) = unsafe { block_i8(format, q[r], s[r], x, b) };
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd), p, acc[r]);
                    if format == QFormat::Q4_1 {
                        m[r] += h(s[r][2 * b + 1]) * x.dsum[b];
                    }
                }
            }
            [hsum(acc[0]) + m[0], hsum(acc[1]) + m[1], hsum(acc[2]) + m[2], hsum(acc[3]) + m[3]]
        }
        // SAFETY: as the caller's contract.
        unsafe {
            match format {
                QFormat::Q8_0 => run::<0>(q, s, x),
                QFormat::Q4_0 => run::<1>(q, s, x),
                QFormat::Q4_1 => run::<2>(q, s, x),
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C available; `q` holds whole blocks, `s` their scales, `out`
    /// 32 values per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dequantize(format: QFormat, q: &[u8], s: &[f16], out: &mut [f32]) {
        let qb = format.quant_bytes();
        let blocks = q.len() / qb;
        for b in 0..blocks {
            // SAFETY: block b reads q[qb*b..qb*(b+1)] and writes out[32b..32b+32].
            unsafe {
                let (v, d, m) = match format {
                    QFormat::Q8_0 => (q8(q.as_ptr().add(32 * b)), h(s[b]), 0.0),
                    QFormat::Q4_0 => (q4(q.as_ptr().add(16 * b)), h(s[b]), -8.0 * h(s[b])),
                    QFormat::Q4_1 => (q4(q.as_ptr().add(16 * b)), h(s[2 * b]), h(s[2 * b + 1])),
                };
                let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
                let o = out.as_mut_ptr().add(32 * b);
                for (i, vi) in v.into_iter().enumerate() {
                    _mm256_storeu_ps(o.add(8 * i), _mm256_fmadd_ps(vi, dv, mv));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// CPU orchestration
// ---------------------------------------------------------------------------------

fn qin<'a>(k: &str, a: &CpuIn<'a>) -> Result<QView<'a>, KernelError> {
    a.quant().ok_or_else(|| KernelError::BufferType { kernel: k.into(), buffer: "w".into(), expected: "a quantized matrix" })
}

/// Row `r` of a `[_, k]` quantized matrix.
#[inline]
fn qrow<'a>(w: QView<'a>, r: usize, k: usize) -> QView<'a> {
    let bpr = k / QK;
    w.blocks_range(r * bpr, bpr)
}

fn run_gemv(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemv { n, k } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (&a.ins[0].f32()[..k], qin("gemv_q_cpu", &a.ins[1])?);
    let x = ActVec::new(x, params);
    let four = p(params, "rows_per_pass") == 4;
    par_rows(&mut a.outs[0][..n], params, |first, y| x.rows(isa, w, k, first, y, four));
    Ok(())
}

fn run_qkv(prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvProj { k, nq, nkv, bias } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (&a.ins[0].f32()[..k], qin("qkv_proj_q_cpu", &a.ins[1])?);
    let x = ActVec::new(x, params);
    let four = p(params, "rows_per_pass") == 4;
    let b = if bias { Some(a.ins[2].f32()) } else { None };
    let grain = (p(params, "rows_per_task") as usize).max(1);
    let mut outs = a.outs.into_iter();
    let (Some(q), Some(ko), Some(vo)) = (outs.next(), outs.next(), outs.next()) else { return Ok(()) };
    let tasks = q[..nq]
        .par_chunks_mut(grain)
        .enumerate()
        .map(|(i, c)| (i * grain, c))
        .chain(ko[..nkv].par_chunks_mut(grain).enumerate().map(|(i, c)| (nq + i * grain, c)))
        .chain(vo[..nkv].par_chunks_mut(grain).enumerate().map(|(i, c)| (nq + nkv + i * grain, c)));
    tasks.for_each(|(first, y)| {
        x.rows(isa, w, k, first, y, four);
        if let Some(b) = b {
            y.iter_mut().zip(&b[first..]).for_each(|(o, b)| *o += b);
        }
    });
    Ok(())
}

thread_local! {
    /// Dequantized weight rows of one rayon task.
    static ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a per-thread scratch buffer of `len` floats (a fresh one when nested).
fn with_rows<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    ROWS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0.0);
            }
            f(&mut v[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and every token: each row dequantized
/// once into L1, then dotted with the tokens `tile` at a time. Returns `[count][m]`.
#[allow(clippy::too_many_arguments)]
fn rows_times_tokens(isa: Isa, x: &[f32], m: usize, k: usize, w: QView<'_>, r0: usize, count: usize, tile: usize) -> Vec<f32> {
    let mut out = vec![0f32; count * m];
    with_rows(count * k, |buf| {
        for i in 0..count {
            dequantize(isa, qrow(w, r0 + i, k), &mut buf[i * k..(i + 1) * k]);
        }
        for t0 in (0..m).step_by(tile.max(1)) {
            for i in 0..count {
                let wr = &buf[i * k..(i + 1) * k];
                for t in t0..(t0 + tile).min(m) {
                    out[i * m + t] = simd::dot_f32(isa, &x[t * k..(t + 1) * k], wr);
                }
            }
        }
    });
    out
}

fn run_gemm_rows(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (a.ins[0].f32(), qin("gemm_q_rows_cpu", &a.ins[1])?);
    let grain = (p(params, "rows_per_task") as usize).max(1);
    let tile = p(params, "tokens_per_tile") as usize;
    let parts: Vec<(usize, usize, Vec<f32>)> = (0..n.div_ceil(grain))
        .into_par_iter()
        .map(|c| {
            let r0 = c * grain;
            let count = grain.min(n - r0);
            (r0, count, rows_times_tokens(isa, x, m, k, w, r0, count, tile))
        })
        .collect();
    let y = &mut a.outs[0][..m * n];
    for (r0, count, part) in parts {
        for i in 0..count {
            for t in 0..m {
                y[t * n + r0 + i] = part[i * m + t];
            }
        }
    }
    Ok(())
}

fn run_gemm_panel(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let micro = Micro::for_isa(isa);
    let (x, w) = (a.ins[0].f32(), qin("gemm_q_panel_cpu", &a.ins[1])?);
    let nc = (p(params, "nc") as usize).max(1);
    let blk = Blocking { mc: 96, nc: 128.min(nc), kc: (p(params, "kc") as usize).max(1) };
    let y = &mut a.outs[0][..m * n];
    let mut panel = vec![0f32; nc.min(n) * k];
    let mut tmp = vec![0f32; m * nc.min(n)];
    for j0 in (0..n).step_by(nc) {
        let nb = nc.min(n - j0);
        panel[..nb * k].par_chunks_mut(k).enumerate().for_each(|(i, row)| dequantize(isa, qrow(w, j0 + i, k), row));
        gemm::gemm_blocked(micro, blk, Split::Auto, m, nb, k, x, CpuIn::F32(&panel[..nb * k]), &mut tmp[..m * nb]);
        for t in 0..m {
            y[t * n + j0..][..nb].copy_from_slice(&tmp[t * nb..][..nb]);
        }
    }
    Ok(())
}

/// The gated activation in f32, as the f32 fused kernels compute it.
#[inline]
fn act_f32(act: Activation, g: f32) -> f32 {
    match act {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => 0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044715 * g * g * g)).tanh()),
    }
}

fn run_gate_up(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GateUp { rows, n, k, act } = *prob else { return Ok(()) };
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let isa = Isa::from_param(p(params, "isa"));
    let (x, w) = (a.ins[0].f32(), qin("gate_up_q_cpu", &a.ins[1])?);
    let y = &mut a.outs[0][..rows * n];
    if rows == 1 {
        let x = ActVec::new(&x[..k], params);
        par_rows(y, params, |first, yc| {
            for (i, out) in yc.iter_mut().enumerate() {
                let j = first + i;
                *out = act_f32(act, x.dot(isa, qrow(w, j, k))) * x.dot(isa, qrow(w, n + j, k));
            }
        });
        return Ok(());
    }
    let grain = (p(params, "rows_per_task") as usize).max(1);
    let parts: Vec<(usize, usize, Vec<f32>)> = (0..n.div_ceil(grain))
        .into_par_iter()
        .map(|c| {
            let j0 = c * grain;
            let count = grain.min(n - j0);
            let g = rows_times_tokens(isa, x, rows, k, w, j0, count, 16);
            let u = rows_times_tokens(isa, x, rows, k, w, n + j0, count, 16);
            (j0, count, g.iter().zip(&u).map(|(&g, &u)| act_f32(act, g) * u).collect())
        })
        .collect();
    for (j0, count, part) in parts {
        for i in 0..count {
            for t in 0..rows {
                y[t * n + j0 + i] = part[i * rows + t];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::QMatrix;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(7);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                s as f32 / u32::MAX as f32 * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn simd_and_scalar_block_dots_agree_with_dequantized_dots() {
        let (rows, k) = (5, 32 * 9);
        let x = data(k, 1);
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, rows, k, &data(rows * k, 2)).unwrap();
            let deq = m.dequantize();
            for r in 0..rows {
                let want: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                for isa in [Isa::Scalar, Isa::best()] {
                    let got = dot_q(isa, &x, qrow(m.view(), r, k));
                    assert!((got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "{f} {isa:?} row {r}: {got} vs {want}");
                }
                let mut out = vec![0f32; k];
                dequantize(Isa::best(), qrow(m.view(), r, k), &mut out);
                for (a, b) in out.iter().zip(&deq[r * k..(r + 1) * k]) {
                    // q4_1's q * d + m is one fused rounding in SIMD, two in scalar.
                    assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{f} SIMD dequantize row {r}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn int8_activation_dots_agree_scalar_simd_and_stay_close() {
        let (rows, k) = (6, 32 * 12);
        let x = data(k, 5);
        let xq = XQ8::quantize(&x);
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, rows, k, &data(rows * k, 6)).unwrap();
            let deq = m.dequantize();
            for r in 0..rows {
                let exact: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                let norm: f64 = (0..k).map(|i| (x[i] as f64 * deq[r * k + i] as f64).abs()).sum();
                let s = dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k));
                let v = dot_q_i8(Isa::best(), &xq, qrow(m.view(), r, k));
                assert!((s - v).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r}: scalar {s} vs SIMD {v}");
                // int8 activations: error well under 1% of the absolute sum.
                assert!((v as f64 - exact).abs() <= 1e-2 * norm, "{f} row {r}: {v} vs {exact} (|sum| {norm})");
            }
            // The four-row pass gives each row's single-row result (rows 1..5: a group of four and a tail).
            let mut y = vec![0f32; rows - 1];
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::best(), m.view(), k, 1, &mut y, true);
            for (i, &v) in y.iter().enumerate() {
                let one = dot_q_i8(Isa::best(), &xq, qrow(m.view(), i + 1, k));
                assert!((v - one).abs() <= 1e-5 * (1.0 + one.abs()), "{f} row {}: four-row {v} vs one-row {one}", i + 1);
            }
        }
    }

    #[test]
    fn k_must_be_whole_blocks() {
        assert!(check_blocks(&Problem::Gemv { n: 4, k: 48 }, DType::Q8_0).is_err());
        assert!(check_blocks(&Problem::Gemv { n: 4, k: 0 }, DType::Q4_0).is_err());
        assert!(check_blocks(&Problem::Gemm { m: 3, n: 4, k: 64 }, DType::Q4_1).is_ok());
        assert!(check_blocks(&Problem::Gemm { m: 3, n: 4, k: 64 }, DType::F32).is_err());
    }

    #[test]
    fn a_float_weight_is_an_error_not_a_panic() {
        let k = crate::kernels::find("gemv_q_cpu").unwrap();
        let prob = Problem::Gemv { n: 2, k: 32 };
        let (x, w) = (vec![0f32; 32], vec![0f32; 64]);
        let mut y = vec![0f32; 2];
        let args = CpuArgs { ins: vec![CpuIn::F32(&x), CpuIn::F32(&w)], outs: vec![&mut y] };
        assert!(k.run_cpu(&prob, DType::Q8_0, &k.default_params(), args).is_err());
    }
}
