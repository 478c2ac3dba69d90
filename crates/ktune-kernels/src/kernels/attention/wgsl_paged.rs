//! The WGSL paged batch kernels' setup ([`Problem::AttentionPaged`]):
//! `attention_paged_stream` (a workgroup per query row and head, the decode
//! stream's row body through the table) and `attention_paged_rows` (an invocation
//! per query row and head): validity, workgroup memory, `prepare`. Both read the
//! sequences' lengths and blocks from the `pages` buffer (`shaders/attention_paged.wgsl`),
//! so one program serves every batch of its shape whatever the table holds.

use super::shape::{Paged, check_grid, check_kv_type, kv_consts, kv_scales_word, per_word};
use super::step_at;
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, grid_2d, groups};
use crate::kernels::contract::{KernelError, Params, WgslSetup, param};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;

/// The most head_dim `attention_paged_rows` holds in registers (`MAX_VEC4` vec4s).
const ROWS_MAX_HEAD_DIM: usize = 256;

/// The uniform words (`attention_dims.wgsl`'s `Dims`, as `attention_paged.wgsl`
/// reads them): tokens, seqs, page, heads, kv_heads, window, scale, no
/// bidirectional block, the width of a table row, and for q8_0 pools the u32
/// word where their blocks' scales start (`attention.wgsl`'s `k_word`).
fn paged_words(p: &Paged, dtype: DType) -> Vec<u32> {
    let mut w: Vec<u32> = [p.tokens, p.seqs, p.page, p.heads, p.kv_heads, p.window].map(|v| v as u32).to_vec();
    let scales = kv_scales_word(dtype, p.blocks * p.kv_heads * p.page * p.d);
    w.extend([p.scale.to_bits(), 0, 0, (2 + p.max_blocks) as u32, scales]);
    w
}

/// The rules both share: 16-byte pool loads and u32 indices.
fn check_paged(prob: &Problem, dtype: DType) -> Result<Paged, String> {
    let p = Paged::checked(prob)?;
    check_kv_type(dtype, p.d)?;
    let need = per_word(dtype);
    if p.d % need != 0 {
        return Err(format!("head_dim = {} is not a multiple of {need} (16-byte {dtype} pool loads)", p.d));
    }
    let elems = (p.blocks * p.kv_heads * p.page * p.d).max(p.tokens * p.heads * p.d).max(p.seqs * (2 + p.max_blocks)) as u64;
    if elems >= u32::MAX as u64 {
        return Err(format!("{elems} elements overflow the shader's u32 indices"));
    }
    Ok(p)
}

fn paged_of(s: &WgslSetup<'_>) -> Result<Paged, KernelError> {
    Paged::checked(s.problem).map_err(|reason| KernelError::Invalid { kernel: s.kernel.id.to_string(), reason })
}

/// One dispatch binding q, the pools, out, the uniform and the table where the
/// shaders declare them (`attention.wgsl`, `attention_paged.wgsl`).
fn paged_step(s: &WgslSetup<'_>, p: &Paged, consts: &[(&str, f64)], workgroups: [u32; 3]) -> Result<GpuProgram, KernelError> {
    let u = s.gpu.uniform(s.kernel.id, &paged_words(p, s.dtype));
    let (q, k, v, pages, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3], s.bufs[4]);
    let step = step_at(s, "main", consts, &[(0, q), (1, k), (2, v), (3, out), (4, &u), (5, pages)], workgroups)?;
    Ok(GpuProgram { steps: vec![step], owned: vec![u] })
}

pub(super) fn shared_paged_stream(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let wg = param(params, "workgroup_size")? as u64;
    let kpt = param(params, "keys_per_thread")? as u64;
    let d = Paged::checked(prob).map_or(0, |p| p.d) as u64;
    // q, tile scores, reduction, slice combine (2 vec4 per invocation)
    Ok(4 * d + 4 * wg * kpt + 4 * wg + 32 * wg)
}

pub(super) fn check_paged_stream(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let p = check_paged(prob, dtype)?;
    let wg = param(params, "workgroup_size")? as usize;
    let words = p.d / per_word(dtype);
    if words > wg {
        return Err(format!("head_dim = {} needs {words} invocations per V row, more than workgroup_size = {wg}", p.d));
    }
    check_grid(caps, "row workgroups along y", grid_2d((p.tokens * p.heads) as u32)[1] as usize)
}

pub(super) fn prepare_paged_stream(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let p = paged_of(s)?;
    let (wg, kpt) = (s.param("workgroup_size")?, s.param("keys_per_thread")?);
    let [f16, q8] = kv_consts(s.dtype);
    let consts = [("WG", wg as f64), ("KPT", kpt as f64), ("HD", p.d as f64), f16, q8];
    paged_step(s, &p, &consts, grid_2d((p.tokens * p.heads) as u32))
}

pub(super) fn check_paged_rows(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let p = check_paged(prob, dtype)?;
    if p.d > ROWS_MAX_HEAD_DIM {
        return Err(format!("head_dim = {} exceeds the {ROWS_MAX_HEAD_DIM} a row's registers hold", p.d));
    }
    let wg = param(params, "workgroup_size")?;
    check_grid(caps, "row workgroups along y", grid_2d(groups(p.tokens * p.heads, wg))[1] as usize)
}

pub(super) fn prepare_paged_rows(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let p = paged_of(s)?;
    let wg = s.param("workgroup_size")?;
    let [f16, q8] = kv_consts(s.dtype);
    let consts = [("WG", wg as f64), ("HD", p.d as f64), f16, q8];
    paged_step(s, &p, &consts, grid_2d(groups(p.tokens * p.heads, wg)))
}
