//! What the WGSL kernels of every family share: the common parameter specs
//! (`workgroup_size`, `rows_per_wg`), workgroup size and workgroup-memory rules, the
//! validity checks against adapter limits (subgroup size, grid size, storage buffers
//! per stage, 16-byte alignment), and the bindings of block-quantized weights (the
//! `QFMT` override and the weight bound twice: quants, then the 256-byte aligned
//! scales region).

use super::contract::{KernelError, ParamSpec, Params, WgslSetup, param};
use super::problem::Problem;
use super::quant::DType;
use crate::device::GpuCaps;
use crate::gpu::{Bind, GpuProgram, grid_2d, groups};

/// `workgroup_size` with the common range.
pub const WORKGROUP_SIZE: ParamSpec =
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per workgroup" };

/// Row-per-workgroup kernels with a workgroup reduction (GEMV and its fused forms).
pub const ROWS_WG_PARAMS: &[ParamSpec] =
    &[WORKGROUP_SIZE, ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8], default: 2, help: "output rows per workgroup" }];

const ROWS_PER_WG_SG: ParamSpec =
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "output rows per workgroup, spread over its subgroups" };

/// Row-per-subgroup kernels (GEMV and its fused forms).
pub const ROWS_SG_PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE, ROWS_PER_WG_SG];

/// Weight words (block units) a lane of a row-per-subgroup kernel loads per round
/// before using any: the shader's `UNROLL` override.
pub const UNROLL: ParamSpec = ParamSpec {
    name: "unroll",
    values: &[1, 2, 4],
    default: 1,
    help: "weight words (block units) each lane loads per round before using any: loads in flight per lane",
};

/// The row-per-subgroup GEMVs with [`UNROLL`].
pub const ROWS_SG_UNROLL_PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE, ROWS_PER_WG_SG, UNROLL];

/// One f32 partial per invocation.
pub fn shared_wg(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(4 * param(params, "workgroup_size")? as u64)
}

/// One f32 partial per invocation and row.
pub fn shared_rows(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(4 * param(params, "workgroup_size")? as u64 * param(params, "rows_per_wg")? as u64)
}

/// Subgroup variants need the workgroup to hold at least one whole subgroup.
pub fn subgroup_fits(caps: &GpuCaps, params: &Params) -> Result<(), String> {
    let wg = param(params, "workgroup_size")?;
    if caps.subgroup_max_size > wg {
        return Err(format!("workgroup of {wg} is smaller than the adapter's subgroup size {}", caps.subgroup_max_size));
    }
    Ok(())
}

/// A launch of `count` workgroups must fit the 2D grid the kernels decode.
pub fn grid_fits(caps: &GpuCaps, count: usize, what: &str) -> Result<(), String> {
    let lim = caps.max_workgroups_per_dimension.max(1) as usize;
    if count > lim * lim {
        return Err(format!("{count} workgroups ({what}) exceed the adapter's {lim}x{lim} grid"));
    }
    Ok(())
}

/// A grid dimension of `count` workgroups must fit the adapter.
pub fn grid_dim(caps: &GpuCaps, count: usize, what: &str) -> Result<(), String> {
    if count as u64 > caps.max_workgroups_per_dimension as u64 {
        return Err(format!("{count} workgroups along {what} exceed the adapter's {} per dimension", caps.max_workgroups_per_dimension));
    }
    Ok(())
}

/// The adapter must bind `needed` storage buffers in one shader stage.
pub fn storage_buffers(caps: &GpuCaps, needed: u32) -> Result<(), String> {
    if caps.max_storage_buffers_per_stage < needed {
        return Err(format!("binds {needed} storage buffers, the adapter allows {} per stage", caps.max_storage_buffers_per_stage));
    }
    Ok(())
}

/// k must fill whole 16-byte loads: 4 f32 or 8 f16 weights.
pub fn vec_alignment(k: usize, dtype: DType) -> Result<(), String> {
    let need = if dtype == DType::F16 { 8 } else { 4 };
    if !k.is_multiple_of(need) {
        return Err(format!("k = {k} is not a multiple of {need} (16-byte {dtype} loads)"));
    }
    Ok(())
}

/// The `QFMT` override value of a quantized dtype: [`QFormat::wgsl_id`](super::quant::QFormat::wgsl_id).
pub fn qfmt(dtype: DType) -> f64 {
    dtype.quant().map_or(0, super::quant::QFormat::wgsl_id) as f64
}

/// The bindings of a quantized kernel: the op's buffers in order with the weight
/// (binding `wi`) expanded into its quants and scales regions, then `extra`.
pub fn qbinds<'a>(s: &'a WgslSetup<'a>, wi: usize, extra: &[&'a wgpu::Buffer]) -> Result<Vec<Bind<'a>>, KernelError> {
    let spec = s.problem.buffers(s.dtype);
    let (Some(w), Some(fmt)) = (spec.get(wi), s.dtype.quant()) else {
        return Err(KernelError::Invalid { kernel: s.kernel.id.into(), reason: format!("{} is not a quantized format", s.dtype) });
    };
    let l = fmt.layout(fmt.blocks_for(w.len()));
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

/// One dispatch of the variant's shader (`main`) binding the op's buffers with the
/// quantized weight at binding `wi` split in two, then a uniform block of `uniform`.
pub fn one_q_step(
    s: &WgslSetup<'_>,
    wi: usize,
    consts: &[(&str, f64)],
    uniform: &[u32],
    workgroups: [u32; 3],
) -> Result<GpuProgram, KernelError> {
    let pipe = s.gpu.pipeline(s.shader(), "main", consts)?;
    let u = s.gpu.uniform(s.kernel.id, uniform);
    let step = {
        let binds = qbinds(s, wi, &[&u])?;
        s.gpu.step_ranges(s.kernel.id, pipe, &binds, workgroups)?
    };
    Ok(GpuProgram { steps: vec![step], owned: vec![u] })
}

/// One workgroup per row (the norm-style shaders: `WG`, `W_F16`).
pub fn one_wg_per_row(s: &WgslSetup<'_>, rows: usize, uniform: &[u32]) -> Result<GpuProgram, KernelError> {
    let consts = [("WG", s.param("workgroup_size")? as f64), ("W_F16", s.w_f16())];
    s.one_step("main", &consts, uniform, grid_2d(rows as u32))
}

/// One subgroup per row (the shaders' shared `row_sg.wgsl` entry point), the
/// parameter `per_param` rows per workgroup, passed as `ROWS` with `WG` and `W_F16`.
pub fn subgroup_per_row(s: &WgslSetup<'_>, rows: usize, uniform: &[u32], per_param: &str) -> Result<GpuProgram, KernelError> {
    let per = s.param(per_param)?;
    let consts = [("WG", s.param("workgroup_size")? as f64), ("ROWS", per as f64), ("W_F16", s.w_f16())];
    s.one_step("main", &consts, uniform, grid_2d(groups(rows, per)))
}
