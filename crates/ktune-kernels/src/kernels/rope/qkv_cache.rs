//! One decode token's split-QKV + RoPE (+ Gemma 3's q/k norm) + KV-cache write in
//! one kernel ([`Problem::QkvRopeCache`], the plan's `fused.qkv_rope_cache`): the
//! fused QKV projection's row goes straight to the rotated q and the cache rows,
//! where the unfused decode runs a split, two RoPE (or q/k norm + RoPE) kernels and
//! two cache writes. Part of the RoPE family (its q and k come out rotated).
//!
//! WGSL: `qkv_rope_cache_wg` (one workgroup per head row of q, k and v: x² reduced
//! through workgroup memory, pairs normalized and rotated into workgroup memory,
//! then stored as f32 or packed f16 cache words; the position from the pass's
//! position buffer). CPU: `qkv_rope_cache_cpu` (the reference's order per head:
//! SIMD x² and scale, the rotation of `qk_norm_rope_heads_cpu`; f32 caches only,
//! the CPU engine's f16 cache is written by the unfused steps).

use super::WGSL_MAX_POSITION;
use super::qk_norm::rotate_head;
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, POSITION_BINDING, Shader, grid_2d};
use crate::kernels::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, outs, param, wrong_op};
use crate::kernels::cpu::{self, ISA, Isa, Row, check_isa};
use crate::kernels::norm::{gains, inv_rms};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::storage_buffers;
use crate::shader;

static QKV_ROPE_CACHE: Shader = shader!("fused_qkv_rope_cache.wgsl", "rotary.wgsl", "reduce_wg.wgsl", "wload.wgsl", "position.wgsl");

const WG_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per head row (q, k or v)" }];

/// The caches' storage types: f32 and f16 on a GPU; the CPU kernel writes f32 caches.
const CPU_DTYPES: &[DType] = &[DType::F32];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "qkv_rope_cache_wg",
            Op::QkvRopeCache,
            DType::FLOAT,
            WG_PARAMS,
            "one workgroup per q/k/v head row: x² workgroup reduction (q/k norm), pairs rotated into workgroup memory, q and the f32/f16 cache rows stored",
            WgslImpl::new(&QKV_ROPE_CACHE, prepare_wg).shared(shared).check(check_wg),
        ),
        KernelDef::new(
            "qkv_rope_cache_cpu",
            Op::QkvRopeCache,
            CPU_DTYPES,
            &[ISA],
            "per head: SIMD x² and scale (q/k norm), rotation with f64-reduced angles, rows copied into the f32 caches",
            CpuImpl { run: run_cpu, check: check_cpu },
        ),
    ]
}

/// Shape rules every variant shares: the rotated dims fit the head, the written
/// row exists.
fn shape(prob: &Problem) -> Result<(), String> {
    match *prob {
        Problem::QkvRopeCache { head_dim, rot_dim, pos0, kv_cap, .. } => {
            if head_dim == 0 || rot_dim > head_dim || !rot_dim.is_multiple_of(2) {
                return Err(format!("rot_dim = {rot_dim} must be even and at most head_dim = {head_dim} (> 0)"));
            }
            if pos0 >= kv_cap {
                return Err(format!("position {pos0} is past the cache's {kv_cap} rows"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_wg(caps: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    storage_buffers(caps, 7)?;
    shape(prob)?;
    match *prob {
        Problem::QkvRopeCache { head_dim, .. } if !head_dim.is_multiple_of(2) => Err(format!("head_dim = {head_dim} is odd (f16 pairs)")),
        Problem::QkvRopeCache { pos0, .. } if pos0 >= WGSL_MAX_POSITION => {
            Err(format!("position {pos0} exceeds {WGSL_MAX_POSITION}, where the f32 angle reduction stops being exact"))
        }
        _ => Ok(()),
    }
}

fn check_cpu(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    shape(prob)?;
    check_isa(caps, prob, dtype, params)
}

/// The x² partials and the row's values.
fn shared(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let d = match *prob {
        Problem::QkvRopeCache { head_dim, .. } => head_dim,
        _ => 0,
    };
    Ok(4 * (param(params, "workgroup_size")? as u64 + d.max(1) as u64))
}

/// Binds the buffers at 0-6 (inv_freq in the gains' place without norm), the
/// position at 7 and the uniform block at 8.
fn prepare_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::QkvRopeCache { heads, kv_heads, head_dim, rot_dim, kv_cap, layout, norm, eps, unit_offset, gain, .. } = *s.problem else {
        return Err(wrong_op(s.kernel, s.problem));
    };
    let b = s.bufs;
    let (qkv, qn, kn, freq, q, kc, vc) =
        if norm { (b[0], b[1], b[2], b[3], b[4], b[5], b[6]) } else { (b[0], b[1], b[1], b[1], b[2], b[3], b[4]) };
    let words = [
        heads as u32,
        kv_heads as u32,
        head_dim as u32,
        (rot_dim / 2) as u32,
        kv_cap as u32,
        layout.code(),
        norm as u32,
        unit_offset as u32,
        eps.to_bits(),
        0,
        0,
        0,
    ];
    let consts = [
        ("WG", s.param("workgroup_size")? as f64),
        ("W_F16", if gain == DType::F16 { 1.0 } else { 0.0 }),
        ("KV_F16", s.w_f16()),
        ("MAX_D", head_dim.max(1) as f64),
    ];
    let pipe = s.gpu.pipeline(s.shader(), "main", &consts)?;
    let u = s.gpu.uniform(s.kernel.id, &words);
    let mut entries: Vec<crate::gpu::BindEntry> =
        [qkv, qn, kn, freq, q, kc, vc].iter().enumerate().map(|(i, b)| (i as u32, (*b).clone(), 0, None)).collect();
    entries.push((8, u.clone(), 0, None));
    let mut owned = vec![u];
    if let Some((pos, own)) = s.position() {
        entries.push((POSITION_BINDING, pos, 0, None));
        owned.extend(own);
    }
    let step = s.gpu.step_entries(s.kernel.id.to_string(), pipe, entries, grid_2d((heads + 2 * kv_heads) as u32))?;
    Ok(GpuProgram { steps: vec![step], owned })
}

fn run_cpu(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::QkvRopeCache { heads, kv_heads, head_dim: d, rot_dim, pos0, kv_cap, layout, norm, eps, unit_offset, .. } = *prob else {
        return Err(wrong_op(kd, prob));
    };
    let isa = Isa::of(params)?;
    let qkv = a.ins[0].f32();
    let (g, freq) = if norm {
        (Some([gains(a.ins[1], d, unit_offset), gains(a.ins[2], d, unit_offset)]), a.ins[3].f32())
    } else {
        (None, a.ins[1].f32())
    };
    let freq = &freq[..rot_dim / 2];
    let [q, kc, vc] = outs::<3>(kd, a.outs)?;
    // Head `r` of the row, normed with gains `which` (0 q, 1 k) and rotated, into `dst`.
    let head = |r: usize, which: usize, dst: &mut [f32]| {
        let x = &qkv[r * d..][..d];
        match &g {
            Some(g) => cpu::scale_mul(isa, x, inv_rms(cpu::dot(isa, x, Row::F32(x)), d, eps), &g[which], dst),
            None => dst.copy_from_slice(x),
        }
        rotate_head(dst, freq, pos0 as f64, layout);
    };
    for h in 0..heads {
        head(h, 0, &mut q[h * d..][..d]);
    }
    for h in 0..kv_heads {
        let row = (h * kv_cap + pos0) * d;
        head(heads + h, 1, &mut kc[row..row + d]);
        vc[row..row + d].copy_from_slice(&qkv[(heads + kv_heads + h) * d..][..d]);
    }
    Ok(())
}
