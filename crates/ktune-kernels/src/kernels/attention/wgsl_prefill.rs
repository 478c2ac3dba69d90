//! The WGSL prefill kernels' setup: `attention_prefill_naive` (scores in scratch,
//! three passes), `attention_prefill_flash`, and `attention_prefill_flash2` /
//! `_flash2_sg` with their geometry ([`Flash2Plan`]): validity, workgroup memory,
//! `prepare`. Prefill on matrix units: `mma.rs`.

use super::shape::{Shape, check_grid, check_wgsl_shape, kv_consts, per_word, shape_or_invalid};
use super::{FLASH2_WORDS, step_at};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, grid_2d, groups};
use crate::kernels::contract::{KernelError, Params, WgslSetup, param};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;

fn scores_bytes(s: &Shape) -> u64 {
    (s.tokens * s.heads * s.kv_len * 4) as u64
}

pub(super) fn check_naive(caps: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    let bytes = scores_bytes(&s);
    let limit = caps.max_storage_binding.min(caps.max_buffer_size);
    if bytes > limit {
        return Err(format!("the {bytes}-byte score matrix exceeds the adapter's {limit}-byte storage binding limit"));
    }
    if s.tokens * s.heads * s.kv_len >= u32::MAX as usize {
        return Err("the score matrix overflows the shader's u32 indices".into());
    }
    Ok(())
}

pub(super) fn prepare_naive(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let wg = s.param("workgroup_size")?;
    let [f16, q8] = kv_consts(s.dtype);
    let consts = [("WG", wg as f64), f16, q8];
    let mut words = sh.prefill_words();
    words.extend([sh.d as u32, sh.kv_scales_word(s.dtype)]);
    let u = s.gpu.uniform(s.kernel.id, &words);
    let scores = s.gpu.storage("attention scores", scores_bytes(&sh));
    let (q, k, v, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3]);
    let rows = sh.tokens * sh.heads;
    let words_per_row = sh.d / per_word(s.dtype);
    let steps = vec![
        step_at(s, "scores", &consts, &[(0, q), (1, k), (4, &u), (5, &scores)], grid_2d(groups(rows * sh.kv_len, wg)))?,
        step_at(s, "softmax", &consts, &[(4, &u), (5, &scores)], grid_2d(rows as u32))?,
        step_at(s, "pv", &consts, &[(2, v), (3, out), (4, &u), (5, &scores)], grid_2d(groups(rows * words_per_row, wg)))?,
    ];
    Ok(GpuProgram { steps, owned: vec![u, scores] })
}

pub(super) fn shared_flash(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let d = Shape::of(prob).map_or(0, |s| s.d) as u64;
    let (bq, bkv) = (param(params, "block_q")? as u64, param(params, "block_kv")? as u64);
    Ok(4 * (bq * d + bkv * d + bq * bkv))
}

pub(super) fn check_flash(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    let lanes = param(params, "lanes")? as usize;
    if s.d > 32 * lanes {
        return Err(format!(
            "head_dim = {} needs lanes >= {} (each invocation keeps at most 8 vec4 output columns)",
            s.d,
            s.d.div_ceil(32)
        ));
    }
    check_grid(caps, "query blocks", s.tokens.div_ceil(param(params, "block_q")? as usize))?;
    check_grid(caps, "heads", s.heads)
}

pub(super) fn prepare_flash(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (bq, bkv, lanes) = (s.param("block_q")?, s.param("block_kv")?, s.param("lanes")?);
    let [f16, q8] = kv_consts(s.dtype);
    let consts = [("BQ", bq as f64), ("BKV", bkv as f64), ("LANES", lanes as f64), ("HD", sh.d as f64), f16, q8];
    let mut words = sh.prefill_words();
    words.extend([0, sh.kv_scales_word(s.dtype)]);
    s.one_step("main", &consts, &words, [groups(sh.tokens, bq), sh.heads as u32, 1])
}

/// How `attention_prefill_flash2*` lays out one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flash2Plan {
    /// Query tokens and heads per workgroup (`BQ`, `GH`), lanes per query row.
    bq: usize,
    gh: usize,
    lanes: usize,
    /// Head sub-blocks per KV head (`nsub` workgroups along y per KV head).
    nsub: usize,
    /// 16-byte words per cache row (`RW`) and per lane at most (`NW`).
    rw: usize,
    nw: usize,
    bkv: usize,
    stage: bool,
    /// Words of padding after each staged row (`PAD`).
    pad: usize,
}

impl Flash2Plan {
    fn of(s: &Shape, dtype: DType, params: &Params) -> Result<Flash2Plan, KernelError> {
        let gh = (param(params, "heads_per_wg")? as usize).clamp(1, s.group());
        let lanes = param(params, "lanes")? as usize;
        let rw = s.d / per_word(dtype);
        let tile = param(params, "kv_tile")?;
        Ok(Flash2Plan {
            bq: param(params, "block_q")? as usize,
            gh,
            lanes,
            nsub: s.group().div_ceil(gh),
            rw,
            nw: rw.div_ceil(lanes.max(1)),
            bkv: param(params, "block_kv")? as usize,
            stage: tile > 0,
            pad: usize::from(tile == 2),
        })
    }

    fn invocations(&self) -> u64 {
        (self.bq * self.gh * self.lanes) as u64
    }

    /// 16-byte words of the staged K/V tile (`TILE`; 1 without staging, an array
    /// must have an element).
    fn tile_words(&self) -> usize {
        if self.stage { self.bkv * (self.rw + self.pad) } else { 1 }
    }

    /// Bytes of the staged K/V tile, if any.
    fn tile_bytes(&self) -> u64 {
        if self.stage { 16 * self.tile_words() as u64 } else { 0 }
    }

    fn grid(&self, s: &Shape) -> [u32; 3] {
        [s.tokens.div_ceil(self.bq) as u32, (s.kv_heads * self.nsub) as u32, 1]
    }
}

/// The plan of a call, or zero heads/head_dim for a problem of another op (the
/// registry's generic checks run before the kernel's own).
fn flash2_plan(prob: &Problem, dtype: DType, params: &Params) -> Result<Flash2Plan, KernelError> {
    let s = Shape::of(prob).filter(|s| s.kv_heads > 0 && s.heads % s.kv_heads == 0).unwrap_or(Shape {
        tokens: 1,
        kv_len: 1,
        kv_cap: 1,
        heads: 1,
        kv_heads: 1,
        d: 0,
        window: 0,
        scale: 1.0,
        bidi: (0, 0),
    });
    Flash2Plan::of(&s, dtype, params)
}

/// The upper bound (heads_per_wg before it is clamped to the group).
pub(super) fn flash2_wg_size(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "block_q")? * param(params, "heads_per_wg")? * param(params, "lanes")?, 1, 1])
}

pub(super) fn shared_flash2_sg(prob: &Problem, dtype: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(flash2_plan(prob, dtype, params)?.tile_bytes())
}

/// The tile, the reduce-scatter buffer (LANES partials per invocation), the row
/// values and the tile's probabilities.
pub(super) fn shared_flash2(prob: &Problem, dtype: DType, params: &Params) -> Result<u64, KernelError> {
    let p = flash2_plan(prob, dtype, params)?;
    let inv = p.invocations();
    Ok(p.tile_bytes() + 4 * (inv * p.lanes as u64 + inv + (p.bq * p.gh * p.bkv) as u64))
}

fn check_flash2_common(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<Flash2Plan, String> {
    let s = check_wgsl_shape(prob, dtype)?;
    let p = Flash2Plan::of(&s, dtype, params).map_err(|e| e.to_string())?;
    if p.nw > FLASH2_WORDS {
        return Err(format!(
            "head_dim = {} is {} {dtype} words of 16 bytes, {} per lane over {} lanes, more than the {FLASH2_WORDS} a lane holds; raise lanes",
            s.d, p.rw, p.nw, p.lanes
        ));
    }
    if p.bkv % p.lanes != 0 || p.bkv / p.lanes > 16 {
        return Err(format!("block_kv = {} must be a multiple of lanes = {} and at most 16 keys per lane", p.bkv, p.lanes));
    }
    check_grid(caps, "query blocks", s.tokens.div_ceil(p.bq))?;
    check_grid(caps, "KV head blocks", s.kv_heads * p.nsub)?;
    Ok(p)
}

pub(super) fn check_flash2(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_flash2_common(caps, prob, dtype, params).map(|_| ())
}

pub(super) fn check_flash2_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let p = check_flash2_common(caps, prob, dtype, params)?;
    let sg_min = caps.subgroup_min_size as usize;
    if sg_min == 0 {
        return Err("the adapter reports no subgroup size".into());
    }
    if p.lanes > sg_min {
        return Err(format!("rows of lanes = {} need subgroups at least that wide; the adapter's smallest is {sg_min}", p.lanes));
    }
    Ok(())
}

pub(super) fn prepare_flash2(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let p = Flash2Plan::of(&sh, s.dtype, s.params)?;
    let consts = [
        ("BQ", p.bq as f64),
        ("GH", p.gh as f64),
        ("BKV", p.bkv as f64),
        ("LANES", p.lanes as f64),
        ("HD", sh.d as f64),
        ("RW", p.rw as f64),
        ("NW", p.nw as f64),
        ("STAGE", if p.stage { 1.0 } else { 0.0 }),
        ("PAD", p.pad as f64),
        ("TILE", p.tile_words() as f64),
        ("W_F16", s.w_f16()),
    ];
    let mut words = sh.prefill_words();
    words.push(p.nsub as u32);
    s.one_step("main", &consts, &words, p.grid(&sh))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{causal_prefill, flash2_params};
    use super::*;

    #[test]
    fn flash2_plan_covers_the_group() {
        let llama = Shape::of(&causal_prefill((128, 128, 128), (32, 8, 64), 0, 0.125)).expect("attention");
        let p = Flash2Plan::of(&llama, DType::F16, &flash2_params(8, 8, 32, 4, 1)).expect("params");
        assert_eq!((p.gh, p.nsub, p.rw, p.nw, p.grid(&llama)), (4, 1, 8, 2, [16, 8, 1]));
        let six = Shape { heads: 12, kv_heads: 2, ..llama };
        let p = Flash2Plan::of(&six, DType::F32, &flash2_params(16, 4, 32, 16, 0)).expect("params");
        assert_eq!((p.gh, p.nsub, p.rw, p.nw, p.grid(&six), p.tile_bytes()), (4, 2, 16, 1, [8, 4, 1], 0));
        let p = Flash2Plan::of(&six, DType::F32, &flash2_params(16, 4, 32, 16, 2)).expect("params");
        assert_eq!((p.tile_words(), p.tile_bytes()), (32 * 17, 16 * 32 * 17));
    }
}
