//! The vision family's WGSL kernels: the SigLIP tower's and the projector's own
//! ops on a GPU.
//!
//! - `patch_embed_im2col`: the patches laid out as rows of a scratch matrix (one
//!   dispatch), then `linear_tiled`'s shader over it (the tiled GEMM of
//!   `gemm_tile.wgsl` with the bias in its epilogue); the GEMM's tiling parameters.
//! - `patch_embed_direct`: the column GEMM body of `gemm_col.wgsl` whose x elements
//!   are read straight from the image (no patch matrix); its parameters.
//! - `linear_tiled` / `linear_simple`: `gemm_tile.wgsl` / `gemm_col.wgsl` (the
//!   bodies `gemm_tiled` / `gemm_simple` run) with the bias and, for fc1, GELU-tanh
//!   (`act.wgsl`) fused into the epilogue (the `GELU` override, from the problem).
//! - `attention_full_rows`: one invocation per (query, head), exact two-pass
//!   softmax; `attention_full_flash`: BQ queries of a head per workgroup, K/V tiles
//!   of BKV rows staged in workgroup memory, online softmax.
//! - `avg_pool_window` (one output value per invocation, its window summed) and
//!   `avg_pool_separable` (along x into a scratch of partial sums, then along y).

use super::super::attention::step_with;
use super::super::contract::{KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use super::super::matmul::{
    SIMPLE_PARAMS, TILED_PARAMS, simple_consts, simple_grid, simple_rules, simple_wg, tiled_consts, tiled_grid, tiled_rules, tiled_shared,
    tiled_wg,
};
use super::super::problem::{Op, Problem};
use super::super::quant::DType;
use super::super::wgsl::{WORKGROUP_SIZE, grid_fits};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static PATCH_IM2COL: Shader = shader!("patch_embed_im2col.wgsl", "grid_main.wgsl", "grid.wgsl");
static PATCH_DIRECT: Shader = shader!(head "affine_head.wgsl"; "patch_embed_direct.wgsl", "gemm_col.wgsl", "wload.wgsl");
static LINEAR_TILED: Shader =
    shader!(head "gemm_tiling.wgsl"; "linear_tiled.wgsl", "gemm_tile.wgsl", "reg_tile.wgsl", "act.wgsl", "wload.wgsl");
static LINEAR_SIMPLE: Shader = shader!(head "affine_head.wgsl"; "linear_simple.wgsl", "gemm_col.wgsl", "act.wgsl", "wload.wgsl");
static ATTN_ROWS: Shader = shader!("attention_full_rows.wgsl", "attention_full.wgsl");
static ATTN_FLASH: Shader = shader!("attention_full_flash.wgsl", "attention_full.wgsl");
static POOL_WINDOW: Shader = shader!("avg_pool_window.wgsl", "grid_main.wgsl", "grid.wgsl");
static POOL_SEPARABLE: Shader = shader!("avg_pool_separable.wgsl", "grid.wgsl");

const F32: &[DType] = &[DType::F32];

/// Workgroup of the im2col dispatch (not tuned: a copy, bound by the GEMM after it).
const IM2COL_WG: u32 = 256;

/// The largest head_dim the attention shaders hold in registers (32 vec4).
const MAX_HEAD_DIM: usize = 128;

const ATTN_ROWS_PARAMS: &[ParamSpec] = &[ParamSpec {
    name: "workgroup_size",
    values: &[32, 64, 128, 256],
    default: 64,
    help: "(query, head) rows per workgroup, one per invocation",
}];

const ATTN_FLASH_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "block_q", values: &[8, 16, 32, 64], default: 16, help: "queries of one head per workgroup (one invocation each)" },
    ParamSpec { name: "block_k", values: &[16, 32, 64], default: 32, help: "keys per K/V tile staged in workgroup memory" },
];

const POOL_PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "patch_embed_im2col",
            Op::PatchEmbed,
            DType::FLOAT,
            TILED_PARAMS,
            "im2col: patches as rows of a scratch matrix (one dispatch), then the tiled GEMM with the bias in its epilogue (linear_tiled)",
            WgslImpl::new(&PATCH_IM2COL, prepare_patch_im2col).workgroup(tiled_wg).shared(tiled_shared).check(check_patch_im2col),
        ),
        KernelDef::new(
            "patch_embed_direct",
            Op::PatchEmbed,
            DType::FLOAT,
            SIMPLE_PARAMS,
            "direct conv: one feature and rows_per_thread patches per invocation, pixels read from the image in place, bias in the epilogue",
            WgslImpl::new(&PATCH_DIRECT, prepare_patch_direct).workgroup(simple_wg).check(check_patch_direct),
        ),
        KernelDef::new(
            "linear_tiled",
            Op::Linear,
            DType::FLOAT,
            TILED_PARAMS,
            "the tiled GEMM (x and w tiles in workgroup memory, reg_m x reg_n per invocation) with bias and GELU-tanh in the epilogue",
            WgslImpl::new(&LINEAR_TILED, prepare_linear_tiled).workgroup(tiled_wg).shared(tiled_shared).check(check_linear_tiled),
        ),
        KernelDef::new(
            "linear_simple",
            Op::Linear,
            DType::FLOAT,
            SIMPLE_PARAMS,
            "one column and rows_per_thread rows per invocation, scalar loads, any shape; bias and GELU-tanh in the epilogue",
            WgslImpl::new(&LINEAR_SIMPLE, prepare_linear_simple).workgroup(simple_wg).check(check_linear_simple),
        ),
        KernelDef::new(
            "attention_full_rows",
            Op::AttentionFull,
            F32,
            ATTN_ROWS_PARAMS,
            "bidirectional: one invocation per (query, head), exact two-pass softmax, output accumulated in registers",
            WgslImpl::new(&ATTN_ROWS, prepare_attn_rows).check(check_attn_rows),
        ),
        KernelDef::new(
            "attention_full_flash",
            Op::AttentionFull,
            F32,
            ATTN_FLASH_PARAMS,
            "bidirectional, flash style: block_q queries of a head per workgroup, K/V tiles of block_k rows in workgroup memory, online softmax",
            WgslImpl::new(&ATTN_FLASH, prepare_attn_flash).workgroup(flash_wg).shared(flash_shared).check(check_attn_flash),
        ),
        KernelDef::new(
            "avg_pool_window",
            Op::AvgPool,
            F32,
            POOL_PARAMS,
            "one output value per invocation, summing its kernel x kernel window",
            WgslImpl::new(&POOL_WINDOW, prepare_pool_window).check(check_pool),
        ),
        KernelDef::new(
            "avg_pool_separable",
            Op::AvgPool,
            F32,
            POOL_PARAMS,
            "separable: kernel-wide runs along x summed into a scratch of partial sums, then kernel of those along y (2 kernel reads per output)",
            WgslImpl::new(&POOL_SEPARABLE, prepare_pool_separable).check(check_pool),
        ),
    ]
}

// ---------------------------------------------------------------------------------
// patch_embed
// ---------------------------------------------------------------------------------

/// A patch embedding's GEMM view: `patches` x `hidden` outputs over
/// `k = channels * patch²`, and the image geometry the gathers read.
#[derive(Clone, Copy)]
struct PatchShape {
    patches: usize,
    hidden: usize,
    k: usize,
    image: usize,
    patch: usize,
    side: usize,
}

impl PatchShape {
    /// The uniform block of both patch shaders' `Dims` (im2col reads from `k` on).
    fn dims(&self) -> [u32; 6] {
        [self.patches as u32, self.hidden as u32, self.k as u32, self.image as u32, self.patch as u32, self.side as u32]
    }
}

/// The shape of a patch embedding; the image must be whole patches.
fn patch_shape(prob: &Problem) -> Result<Option<PatchShape>, String> {
    let Problem::PatchEmbed { channels, image, patch, hidden } = *prob else { return Ok(None) };
    if patch == 0 || !image.is_multiple_of(patch) {
        return Err(format!("image side {image} is not a whole number of {patch}-pixel patches"));
    }
    let side = image / patch;
    Ok(Some(PatchShape { patches: side * side, hidden, k: channels * patch * patch, image, patch, side }))
}

/// What `shape` reads off a setup's problem: a problem of another op is the
/// wrong op, one whose shape `shape` refuses is invalid, for its reason.
fn setup_shape<T>(s: &WgslSetup<'_>, shape: fn(&Problem) -> Result<Option<T>, String>) -> Result<T, KernelError> {
    match shape(s.problem) {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(wrong_op(s.kernel, s.problem)),
        Err(reason) => Err(KernelError::Invalid { kernel: s.kernel.id.into(), reason }),
    }
}

fn check_patch_im2col(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let Some(p) = patch_shape(prob)? else { return Ok(()) };
    grid_fits(caps, groups(p.patches * p.k, IM2COL_WG) as usize, "im2col")?;
    tiled_rules(caps, p.patches, p.hidden, p.k, dtype, params).map_err(|e| format!("the GEMM over the patch matrix: {e}"))
}

fn check_patch_direct(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some(p) = patch_shape(prob)? else { return Ok(()) };
    simple_rules(caps, p.patches, p.hidden, params)
}

fn prepare_patch_im2col(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let p = setup_shape(s, patch_shape)?;
    let [pixels, w, b, y] = bufs::<4>(s)?;
    let cols = s.gpu.storage("patch_embed_im2col:cols", (p.patches * p.k * 4) as u64);
    // im2col's Dims: patches, then k, image, patch, side
    let d = p.dims();
    let u1 = s.gpu.uniform(s.kernel.id, &[d[0], d[2], d[3], d[4], d[5]]);
    let gather = step_with(
        s,
        &PATCH_IM2COL,
        "main",
        &[("WG", IM2COL_WG as f64)],
        &[(0, pixels), (1, &cols), (2, &u1)],
        grid_2d(groups(p.patches * p.k, IM2COL_WG)),
    )?;
    let mut consts = tiled_consts(s.params, s.w_f16())?.to_vec();
    consts.push(("GELU", 0.0));
    let u2 = s.gpu.uniform(s.kernel.id, &d[..3]);
    let (gx, gy) = tiled_grid(p.patches, p.hidden, s.params)?;
    let gemm = step_with(s, &LINEAR_TILED, "main", &consts, &[(0, &cols), (1, w), (2, b), (3, y), (4, &u2)], [gx.max(1), gy.max(1), 1])?;
    Ok(GpuProgram { steps: vec![gather, gemm], owned: vec![cols, u1, u2] })
}

fn prepare_patch_direct(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let p = setup_shape(s, patch_shape)?;
    let consts = simple_consts(s.params, s.w_f16())?;
    let (gx, gy) = simple_grid(p.patches, p.hidden, s.params)?;
    s.one_step("main", &consts, &p.dims(), [gx.max(1), gy.max(1), 1])
}

/// The op's `N` buffers in binding order.
fn bufs<'a, const N: usize>(s: &WgslSetup<'a>) -> Result<[&'a wgpu::Buffer; N], KernelError> {
    <[&wgpu::Buffer; N]>::try_from(s.bufs).map_err(|_| KernelError::Buffers { kernel: s.kernel.id.into(), expected: N, got: s.bufs.len() })
}

// ---------------------------------------------------------------------------------
// linear
// ---------------------------------------------------------------------------------

fn linear_shape(prob: &Problem) -> Option<(usize, usize, usize, bool)> {
    match *prob {
        Problem::Linear { m, n, k, gelu } => Some((m, n, k, gelu)),
        _ => None,
    }
}

fn linear_dims(s: &WgslSetup<'_>) -> Result<(usize, usize, usize, bool), KernelError> {
    linear_shape(s.problem).ok_or_else(|| wrong_op(s.kernel, s.problem))
}

fn check_linear_tiled(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let Some((m, n, k, _)) = linear_shape(prob) else { return Ok(()) };
    tiled_rules(caps, m, n, k, dtype, params)
}

fn check_linear_simple(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some((m, n, ..)) = linear_shape(prob) else { return Ok(()) };
    simple_rules(caps, m, n, params)
}

/// A GEMM tiling's override constants, from the parameters and `W_F16`.
type TilingConsts<const N: usize> = fn(&Params, f64) -> Result<[(&'static str, f64); N], KernelError>;
/// A GEMM tiling's grid over an `[m, n]` output.
type TilingGrid = fn(usize, usize, &Params) -> Result<(u32, u32), KernelError>;

/// A Linear on one of the GEMM's tilings: the tiling's constants (`consts`) and
/// `GELU`, its grid (`grid`) over the `[m, n]` output.
fn prepare_linear<const N: usize>(s: &WgslSetup<'_>, consts: TilingConsts<N>, grid: TilingGrid) -> Result<GpuProgram, KernelError> {
    let (m, n, k, gelu) = linear_dims(s)?;
    let mut consts = consts(s.params, s.w_f16())?.to_vec();
    consts.push(("GELU", if gelu { 1.0 } else { 0.0 }));
    let (gx, gy) = grid(m, n, s.params)?;
    s.one_step("main", &consts, &[m as u32, n as u32, k as u32], [gx.max(1), gy.max(1), 1])
}

fn prepare_linear_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    prepare_linear(s, tiled_consts, tiled_grid)
}

fn prepare_linear_simple(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    prepare_linear(s, simple_consts, simple_grid)
}

// ---------------------------------------------------------------------------------
// attention_full
// ---------------------------------------------------------------------------------

fn attn_shape(prob: &Problem) -> Result<Option<(usize, usize, usize, f32)>, String> {
    let Problem::AttentionFull { tokens, heads, head_dim, scale } = *prob else { return Ok(None) };
    if tokens == 0 || heads == 0 {
        return Err(format!("{tokens} tokens of {heads} heads: nothing to attend"));
    }
    if head_dim == 0 || !head_dim.is_multiple_of(4) || head_dim > MAX_HEAD_DIM {
        return Err(format!("head_dim {head_dim} is not a positive multiple of 4 up to {MAX_HEAD_DIM} (vec4 rows held in registers)"));
    }
    Ok(Some((tokens, heads, head_dim, scale)))
}

fn check_attn_rows(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some((t, heads, ..)) = attn_shape(prob)? else { return Ok(()) };
    grid_fits(caps, groups(t * heads, param(params, "workgroup_size")?) as usize, "query rows")
}

fn prepare_attn_rows(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (t, heads, d, scale) = setup_shape(s, attn_shape)?;
    let wg = s.param("workgroup_size")?;
    s.one_step("main", &[("WG", wg as f64)], &[t as u32, heads as u32, (d / 4) as u32, scale.to_bits()], grid_2d(groups(t * heads, wg)))
}

fn flash_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "block_q")?, 1, 1])
}

/// The K and V tiles: `block_k` rows of head_dim f32 each.
fn flash_shared(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let d = match *prob {
        Problem::AttentionFull { head_dim, .. } => head_dim as u64,
        _ => 0,
    };
    Ok(2 * param(params, "block_k")? as u64 * d * 4)
}

fn check_attn_flash(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some((t, heads, ..)) = attn_shape(prob)? else { return Ok(()) };
    let bk = param(params, "block_k")?;
    if bk > 64 {
        return Err(format!("block_k = {bk} exceeds the shader's 64 scores per tile"));
    }
    let gx = groups(t, param(params, "block_q")?) as usize;
    super::super::wgsl::grid_dim(caps, gx, "query blocks")?;
    super::super::wgsl::grid_dim(caps, heads, "heads")
}

fn prepare_attn_flash(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (t, heads, d, scale) = setup_shape(s, attn_shape)?;
    let bq = s.param("block_q")?;
    let consts = [("BQ", bq as f64), ("BKV", s.param("block_k")? as f64), ("HD4", (d / 4) as f64)];
    s.one_step("main", &consts, &[t as u32, heads as u32, (d / 4) as u32, scale.to_bits()], [groups(t, bq).max(1), heads as u32, 1])
}

// ---------------------------------------------------------------------------------
// avg_pool
// ---------------------------------------------------------------------------------

/// `(side, kernel, dim, out)`; the grid must be whole windows.
fn pool_shape(prob: &Problem) -> Result<Option<(usize, usize, usize, usize)>, String> {
    let Problem::AvgPool { side, kernel, dim } = *prob else { return Ok(None) };
    if kernel == 0 || !side.is_multiple_of(kernel) {
        return Err(format!("a grid of side {side} is not a whole number of {kernel}-wide windows"));
    }
    Ok(Some((side, kernel, dim, side / kernel)))
}

fn check_pool(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some((side, _, dim, out)) = pool_shape(prob)? else { return Ok(()) };
    // the separable form's first pass covers side * out values, the most of either
    grid_fits(caps, groups(side.max(out) * out * dim, param(params, "workgroup_size")?) as usize, "pooled values")
}

fn prepare_pool_window(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (side, kernel, dim, out) = setup_shape(s, pool_shape)?;
    let wg = s.param("workgroup_size")?;
    s.one_step("main", &[("WG", wg as f64)], &[side as u32, kernel as u32, dim as u32, out as u32], grid_2d(groups(out * out * dim, wg)))
}

fn prepare_pool_separable(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (side, kernel, dim, out) = setup_shape(s, pool_shape)?;
    let [x, y] = bufs::<2>(s)?;
    let wg = s.param("workgroup_size")?;
    let consts = [("WG", wg as f64)];
    let part = s.gpu.storage("avg_pool_separable:part", (side * out * dim * 4) as u64);
    let u = s.gpu.uniform(s.kernel.id, &[side as u32, kernel as u32, dim as u32, out as u32]);
    let along_x = step_with(s, &POOL_SEPARABLE, "along_x", &consts, &[(0, x), (2, &u), (3, &part)], grid_2d(groups(side * out * dim, wg)))?;
    let along_y = step_with(s, &POOL_SEPARABLE, "along_y", &consts, &[(1, y), (2, &u), (3, &part)], grid_2d(groups(out * out * dim, wg)))?;
    Ok(GpuProgram { steps: vec![along_x, along_y], owned: vec![part, u] })
}
