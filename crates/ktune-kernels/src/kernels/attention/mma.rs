//! Prefill attention on matrix units: `attention_prefill_coop16` (16x16x16
//! cooperative matrices through wgpu's `EXPERIMENTAL_COOPERATIVE_MATRIX`) and
//! `attention_prefill_mma_emu` (the same tiling in plain WGSL loops, which is how it
//! is tested where there are no matrix units). Flash style in two passes over a
//! query block's visible keys (`shaders/attn_mma.wgsl`): the first for the rows'
//! maxima, the second for P = exp(S - m) and O += P·V with O held in the matrix
//! registers (no rescaling), Q, K/V tiles and P as f16 in workgroup memory, f32
//! accumulation. Tunables: query tokens per workgroup (`block_q`), keys per tile
//! (`block_kv`), subgroups per workgroup (`subgroups`).

use super::{Shape, check_grid, check_wgsl_shape, shape_or_invalid};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader};
use crate::kernels::contract::{KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::shader;

static COOP16: Shader =
    shader!(head "coop.wgsl", "coop16.wgsl", "attention_dims.wgsl"; "attn_mma.wgsl", "attn_mma_coop.wgsl", "attention.wgsl", "wload.wgsl");
static EMU: Shader =
    shader!(head "coop_emu.wgsl", "attention_dims.wgsl"; "attn_mma.wgsl", "attn_mma_emu.wgsl", "attention.wgsl", "wload.wgsl");

/// Lanes of a subgroup in the tiling (the coop shader needs subgroups of exactly
/// this size; the emulation groups invocations by it).
const LANES: u32 = 32;
/// O matrices a subgroup keeps in registers at most.
const MAX_O: u32 = 8;

const PARAMS: &[ParamSpec] = &[
    ParamSpec::new("block_q", &[16, 32, 64], 16, "query tokens per workgroup (16-row matrices along the queries)"),
    ParamSpec::new("block_kv", &[16, 32, 64], 32, "keys per K/V tile staged in workgroup memory (16-key matrices)"),
    ParamSpec::new("subgroups", &[1, 2, 4], 2, "subgroups of 32 per workgroup sharing the S and O matrices"),
    // Marks the f16 rounding of Q, K, V and P (the matrix units' input type), which
    // the parity check judges with the f16-activation tolerance.
    ParamSpec::new("act_bits", &[16], 16, "Q, K, V and P rounded to f16 in workgroup memory (matrix input type)"),
];

/// One call's tiling: (block_q, block_kv, subgroups, S matrices per subgroup and
/// tile, O matrices per subgroup).
fn plan(s: &Shape, params: &Params) -> Result<(u32, u32, u32, u32, u32), KernelError> {
    let (bq, bk, nsg) = (param(params, "block_q")?, param(params, "block_kv")?, param(params, "subgroups")?);
    let hd = s.d as u32;
    let ns = ((bq / 16) * (bk / 16)).div_ceil(nsg);
    let no = ((bq / 16) * (hd / 16)).div_ceil(nsg);
    Ok((bq, bk, nsg, ns, no))
}

fn wg(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "subgroups")? * LANES, 1, 1])
}

/// Q and the K/V tile (f16 rows of head_dim + 8), S (f32), P (f16 rows of
/// block_kv + 8), the row maxima and sums, and (coop) one f32 16x16 slot per subgroup.
fn shared(prob: &Problem, params: &Params, slots: bool) -> Result<u64, KernelError> {
    let d = Shape::of(prob).map_or(0, |s| s.d) as u64;
    let (bq, bk, nsg) = (param(params, "block_q")? as u64, param(params, "block_kv")? as u64, param(params, "subgroups")? as u64);
    let slots = if slots { 4 * nsg * 256 } else { 0 };
    Ok(2 * (bq + bk) * (d + 8) + 4 * bq * bk + 2 * bq * (bk + 8) + 8 * bq + slots)
}

fn shared_coop(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    shared(prob, params, true)
}

fn shared_emu(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    shared(prob, params, false)
}

/// What the tiling needs of any adapter.
fn check_tiling(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    if !caps.shader_f16 {
        return Err("needs SHADER_F16 (f16 tiles in workgroup memory), which this adapter lacks".into());
    }
    if s.d % 16 != 0 {
        return Err(format!("head_dim = {} is not a multiple of the 16-wide matrices", s.d));
    }
    let (bq, _, nsg, _, no) = plan(&s, params).map_err(|e| e.to_string())?;
    if no > MAX_O {
        return Err(format!(
            "block_q = {bq} x head_dim = {} is {} output matrices, {no} per subgroup over {nsg} subgroups, more than the {MAX_O} a \
             subgroup keeps; lower block_q or raise subgroups",
            s.d,
            (bq / 16) * (s.d as u32 / 16)
        ));
    }
    check_grid(caps, "query blocks", s.tokens.div_ceil(bq as usize))?;
    check_grid(caps, "heads", s.heads)
}

fn check_coop16(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    caps.coop_f16_f32(16)?;
    if caps.subgroup_min_size != LANES || caps.subgroup_max_size != LANES {
        return Err(format!(
            "the matrix tiling needs subgroups of exactly {LANES} invocations; the adapter's are {}..{}",
            caps.subgroup_min_size, caps.subgroup_max_size
        ));
    }
    check_tiling(caps, prob, dtype, params)
}

fn prepare(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (bq, bk, nsg, ns, no) = plan(&sh, s.params)?;
    let consts = [
        ("BQ", bq as f64),
        ("BK", bk as f64),
        ("NSG", nsg as f64),
        ("WGS", (nsg * LANES) as f64),
        ("NS", ns as f64),
        ("NO", no as f64),
        ("HD", sh.d as f64),
        ("W_F16", s.w_f16()),
    ];
    s.one_step("main", &consts, &sh.prefill_words(), [sh.tokens.div_ceil(bq as usize) as u32, sh.heads as u32, 1])
}

pub(super) fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "attention_prefill_coop16",
            Op::AttentionPrefill,
            DType::FLOAT,
            PARAMS,
            "flash attention on 16x16x16 cooperative matrices (matrix units): S = QKᵀ and O += PV as f16 matrices with f32 \
             accumulation, two passes (row maxima, then P with the final maxima) so O stays in matrix registers",
            WgslImpl::new(&COOP16, prepare).workgroup(wg).shared(shared_coop).subgroups().check(check_coop16),
        ),
        KernelDef::new(
            "attention_prefill_mma_emu",
            Op::AttentionPrefill,
            DType::FLOAT,
            PARAMS,
            "the tiling of attention_prefill_coop16 (same f16 tiles, passes and matrix assignment) with the matrix operations as \
             plain loops over 32-invocation groups",
            WgslImpl::new(&EMU, prepare).workgroup(wg).shared(shared_emu).check(check_tiling),
        ),
    ]
}
