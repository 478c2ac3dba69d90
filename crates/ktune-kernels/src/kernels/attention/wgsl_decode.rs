//! The WGSL decode kernels' setup: `attention_decode_stream`,
//! `attention_decode_splitkv` (split-KV partials, then the `reduce` merge) and
//! `attention_decode_splitkv_sg` with its geometry ([`SgPlan`]): validity, workgroup
//! memory, `prepare`. All three read the KV length from the pass-position buffer
//! (`shaders/position.wgsl`), so a program serves every position up to the cache's
//! capacity: the split-KV grids and partial buffers are sized for the most keys a
//! query can see there, and the splits past the visible keys exit at once.

use super::shape::{Shape, check_grid, check_row_fits, check_wgsl_shape, kv_consts, per_word, shape_or_invalid};
use super::{DECODE_SPLITKV, SPLITKV_MAX_HEADS, SPLITKV_SG_SLOTS, step_at, step_with};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, POSITION_BINDING, grid_2d, groups};
use crate::kernels::contract::{KernelError, Params, WgslSetup, param};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;
use crate::kernels::wgsl::subgroup_fits;

fn head_dim_of(prob: &Problem) -> u64 {
    Shape::of(prob).map_or(0, |s| s.d) as u64
}

pub(super) fn shared_stream(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let wg = param(params, "workgroup_size")? as u64;
    let kpt = param(params, "keys_per_thread")? as u64;
    // q, tile scores, reduction, slice combine (2 vec4 per invocation)
    Ok(4 * head_dim_of(prob) + 4 * wg * kpt + 4 * wg + 32 * wg)
}

pub(super) fn check_stream(_: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    check_row_fits(&s, dtype, param(params, "workgroup_size")?)
}

pub(super) fn prepare_stream(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (wg, kpt) = (s.param("workgroup_size")?, s.param("keys_per_thread")?);
    let [f16, q8] = kv_consts(s.dtype);
    let consts = [("WG", wg as f64), ("KPT", kpt as f64), ("HD", sh.d as f64), f16, q8];
    let mut words = sh.prefill_words();
    words.extend([0, sh.kv_scales_word(s.dtype)]);
    s.one_step("main", &consts, &words, grid_2d(sh.heads as u32))
}

/// How `attention_decode_splitkv` covers a GQA group: `nsub` workgroups of at most
/// `gh` heads each per KV head.
pub(super) fn splitkv_groups(s: &Shape) -> (usize, usize) {
    let g = s.group();
    let nsub = g.div_ceil(SPLITKV_MAX_HEADS);
    (nsub, g.div_ceil(nsub))
}

/// Number of `chunk`-key splits of the most keys the query sees at any position
/// up to the cache's capacity (the window, or the whole cache): the grid's, of
/// which those past the visible keys exit.
pub(super) fn splitkv_splits(s: &Shape, chunk: usize) -> usize {
    let most = if s.window > 0 { s.window.min(s.kv_cap) } else { s.kv_cap };
    most.div_ceil(chunk.max(1))
}

pub(super) fn shared_splitkv(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let wg = param(params, "workgroup_size")? as u64;
    let (d, gh) = match Shape::of(prob) {
        Some(s) if s.kv_heads > 0 => (s.d as u64, splitkv_groups(&s).1 as u64),
        _ => (0, 1),
    };
    // q of the group, per-head tile probabilities, reductions (2 vec4 per invocation)
    Ok(4 * gh * d + 4 * gh * wg + 32 * wg)
}

pub(super) fn check_splitkv(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    check_row_fits(&s, dtype, param(params, "workgroup_size")?)?;
    let splits = splitkv_splits(&s, param(params, "chunk")? as usize);
    check_grid(caps, "splits", splits)?;
    check_grid(caps, "KV head groups", s.kv_heads * splitkv_groups(&s).0)?;
    let bytes = (splits * s.heads * (s.d + 2) * 4) as u64;
    if bytes > caps.max_storage_binding.min(caps.max_buffer_size) {
        return Err(format!("the {bytes}-byte partial buffer exceeds the adapter's storage binding limit"));
    }
    Ok(())
}

pub(super) fn prepare_splitkv(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (wg, chunk) = (s.param("workgroup_size")?, s.param("chunk")?);
    let (nsub, gh) = splitkv_groups(&sh);
    let splits = splitkv_splits(&sh, chunk as usize);
    let ml_off = splits * sh.heads * sh.d;
    let consts = [("WG", wg as f64), ("HD", sh.d as f64), ("GH", gh as f64), ("CHUNK", chunk as f64), ("W_F16", s.w_f16())];
    let mut words = sh.prefill_words();
    words.extend([nsub as u32, ml_off as u32]);
    let u = s.gpu.uniform(s.kernel.id, &words);
    let part = s.gpu.storage("attention partials", ((ml_off + 2 * splits * sh.heads) * 4) as u64);
    let (pos, own) = positioned(s)?;
    let (q, k, v, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3]);
    let p = (POSITION_BINDING, &pos);
    let steps = vec![
        step_at(s, "split", &consts, &[(0, q), (1, k), (2, v), (4, &u), (5, &part), p], [(sh.kv_heads * nsub) as u32, splits as u32, 1])?,
        step_at(s, "reduce", &consts, &[(3, out), (4, &u), (5, &part), p], grid_2d(groups(sh.heads * sh.d, wg)))?,
    ];
    Ok(GpuProgram { steps, owned: [u, part].into_iter().chain(own).collect() })
}

/// The pass-position buffer of a decode attention program, and the one the
/// program owns when it holds its own ([`WgslSetup::position`]).
fn positioned(s: &WgslSetup<'_>) -> Result<(wgpu::Buffer, Option<wgpu::Buffer>), KernelError> {
    s.position().ok_or_else(|| KernelError::Invalid { kernel: s.kernel.id.to_string(), reason: "not a decode attention problem".into() })
}

/// How `attention_decode_splitkv_sg` lays out one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SgPlan {
    /// Workgroups per KV head and query heads per workgroup (`GH`).
    nsub: usize,
    gh: usize,
    /// 16-byte words of a cache row each lane takes at most (`WPL`).
    wpl: usize,
    /// Partials per workgroup (`SPW`) and in all.
    spw: usize,
    parts: usize,
}

impl SgPlan {
    /// `None` when the adapter reports no subgroup size.
    fn of(s: &Shape, dtype: DType, caps: &GpuCaps, wg: u32, heads_per_wg: u32, chunk: u32) -> Option<SgPlan> {
        let sg_min = caps.subgroup_min_size as usize;
        if sg_min == 0 {
            return None;
        }
        let gh = (heads_per_wg as usize).clamp(1, s.group());
        let nsub = s.group().div_ceil(gh);
        let gh = s.group().div_ceil(nsub);
        let wpl = (s.d / per_word(dtype)).div_ceil(sg_min);
        let spw = (wg as usize / sg_min).max(1);
        Some(SgPlan { nsub, gh, wpl, spw, parts: splitkv_splits(s, chunk as usize) })
    }

    fn workgroups_y(&self) -> usize {
        self.parts.div_ceil(self.spw)
    }
}

pub(super) fn check_splitkv_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    subgroup_fits(caps, params)?;
    let (wg, hpw, chunk) = (param(params, "workgroup_size")?, param(params, "heads_per_wg")?, param(params, "chunk")?);
    let p = SgPlan::of(&s, dtype, caps, wg, hpw, chunk).ok_or("the adapter reports no subgroup size")?;
    if p.gh * p.wpl > SPLITKV_SG_SLOTS {
        return Err(format!(
            "head_dim = {} is {} words per lane on subgroups of {}, times {} heads per workgroup is over the {SPLITKV_SG_SLOTS} accumulator slots; lower heads_per_wg",
            s.d, p.wpl, caps.subgroup_min_size, p.gh
        ));
    }
    check_grid(caps, "partial blocks", p.workgroups_y())?;
    check_grid(caps, "KV head groups", s.kv_heads * p.nsub)?;
    let floats = p.parts * s.heads * (s.d + 2);
    if floats as u64 >= u32::MAX as u64 {
        return Err(format!("{floats} partial values overflow the shader's u32 indices"));
    }
    let bytes = (floats * 4) as u64;
    if bytes > caps.max_storage_binding.min(caps.max_buffer_size) {
        return Err(format!("the {bytes}-byte partial buffer exceeds the adapter's storage binding limit"));
    }
    Ok(())
}

pub(super) fn prepare_splitkv_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (wg, hpw, chunk) = (s.param("workgroup_size")?, s.param("heads_per_wg")?, s.param("chunk")?);
    let p = SgPlan::of(&sh, s.dtype, &s.gpu.caps, wg, hpw, chunk)
        .ok_or_else(|| KernelError::Invalid { kernel: s.kernel.id.to_string(), reason: "the adapter reports no subgroup size".into() })?;
    let ml_off = p.parts * sh.heads * sh.d;
    let consts = [
        ("WG", wg as f64),
        ("HD", sh.d as f64),
        ("GH", p.gh as f64),
        ("CHUNK", chunk as f64),
        ("SPW", p.spw as f64),
        ("WPL", p.wpl as f64),
        ("W_F16", s.w_f16()),
    ];
    // splitkv's merge, over the same partial layout with CHUNK keys per partial
    let merge = [("WG", wg as f64), ("HD", sh.d as f64), ("CHUNK", chunk as f64), ("W_F16", s.w_f16())];
    let mut words = sh.prefill_words();
    words.extend([p.nsub as u32, ml_off as u32]);
    let u = s.gpu.uniform(s.kernel.id, &words);
    let part = s.gpu.storage("attention partials", ((ml_off + 2 * p.parts * sh.heads) * 4) as u64);
    let (pos, own) = positioned(s)?;
    let (q, k, v, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3]);
    let at = (POSITION_BINDING, &pos);
    let grid = [(sh.kv_heads * p.nsub) as u32, p.workgroups_y() as u32, 1];
    let steps = vec![
        step_with(s, s.shader(), "split", &consts, &[(0, q), (1, k), (2, v), (4, &u), (5, &part), at], grid)?,
        step_with(s, &DECODE_SPLITKV, "reduce", &merge, &[(3, out), (4, &u), (5, &part), at], grid_2d(groups(sh.heads * sh.d, wg)))?,
    ];
    Ok(GpuProgram { steps, owned: [u, part].into_iter().chain(own).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::problem::Problem;

    #[test]
    fn splitkv_sg_plan_clamps_heads_to_the_group() {
        let caps_min = |n: u32| GpuCaps {
            shader_f16: false,
            subgroup_min_size: n,
            subgroup_max_size: 64,
            timestamp_query: false,
            ..crate::testing::typical_gpu_caps()
        };
        // 6 heads per KV head, 8 asked: one workgroup of 6; 4 asked: two of 3
        let s =
            Shape::of(&Problem::AttentionDecode { kv_len: 300, kv_cap: 300, heads: 12, kv_heads: 2, head_dim: 64, window: 0, scale: 0.1 })
                .expect("attention");
        let p = SgPlan::of(&s, DType::F32, &caps_min(32), 128, 8, 64).expect("subgroups");
        assert_eq!((p.nsub, p.gh, p.wpl, p.spw, p.parts, p.workgroups_y()), (1, 6, 1, 4, 5, 2));
        let p = SgPlan::of(&s, DType::F16, &caps_min(4), 64, 4, 64).expect("subgroups");
        assert_eq!((p.nsub, p.gh, p.wpl, p.spw), (2, 3, 2, 16));
        assert!(SgPlan::of(&s, DType::F32, &caps_min(0), 64, 4, 64).is_none());
    }
}
