//! The second-generation quantized GEMV (decode): `gemv_q_dp4a_wg` and
//! `gemv_q_dp4a_subgroup`, over [`DType::Q8_0`], [`DType::Q4_0`], [`DType::Q4_1`],
//! [`DType::Q4_K`] and [`DType::Q6_K`] weights in the split layout of
//! [`QMatrix`](crate::kernels::quant::QMatrix).
//!
//! One program of two or three dispatches (`shaders/qdp4a.wgsl`):
//! 1. `quantize`: the activation once per call into a scratch buffer, in the form
//!    `act_bits` names: 8, int8 blocks of 32 q8_1 style (an f32 scale `d` and the
//!    block sum `d·Σq`, four codes a `u32`), dotted with `dot4I8Packed`; 16, f16
//!    pairs; 32, f32 (the block sums are kept in every form).
//! 2. `main`: each invocation walks items of `k_vec` quant words (4: one 16-byte
//!    load where the block layout keeps segments 16-byte aligned; Q4_K's 140-byte
//!    blocks are read word by word) for all `rows_per_wg` rows of its workgroup,
//!    sharing each activation load, into register accumulators; unsigned weight
//!    codes (Q4_0, Q4_1, Q4_K nibbles) are dotted as they are and their offsets
//!    come through the activation block sums; Q6_K codes become signed bytes in
//!    registers. One reduction at the end: a workgroup tree (`_wg`) or
//!    `subgroupAdd` plus one pass over the subgroups' values (`_subgroup`).
//! 3. with `split_k` > 1, workgroups cover `split_k` ranges of each row's blocks
//!    and write partial sums; `sum_splits` adds them in a fixed order.
//!
//! The Q8_0 / Q4_0 / Q4_1 weight codes are signed or unsigned bytes and nibbles
//! and the activation codes are signed, so every int8 dot is `dot4I8Packed`
//! (`dot4U8Packed` would need unsigned activations: a zero point per block and a
//! weight-sum correction instead of the activation-sum one).

use crate::device::GpuCaps;
use crate::gpu::{Bind, GpuProgram, GpuStep, Shader, grid_2d, groups, padded};
use crate::kernels::wgsl::{WORKGROUP_SIZE, check_blocks, grid_fits, qbinds, qfmt, shared_rows, storage_buffers, subgroup_fits};
use crate::kernels::{DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, param, wrong_op};
use crate::shader;

static DP4A_WG: Shader = shader!("qgemv_dp4a_wg.wgsl", "qdp4a.wgsl", "reduce_wg.wgsl");
static DP4A_SG: Shader = shader!("qgemv_dp4a_subgroup.wgsl", "qdp4a.wgsl");

/// The block formats the shader decodes.
pub const DTYPES: &[DType] = &[DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K];

const PARAMS: &[ParamSpec] = &[
    WORKGROUP_SIZE,
    ParamSpec {
        name: "rows_per_wg",
        values: &[1, 2, 4, 8],
        default: 4,
        help: "output rows per workgroup, sharing each activation load (register accumulators)",
    },
    ParamSpec { name: "k_vec", values: &[1, 2, 4], default: 4, help: "quant words per invocation and step along k (4: 16-byte loads)" },
    ParamSpec {
        name: "act_bits",
        values: &[8, 16, 32],
        default: 8,
        help: "activation format: 8 int8 blocks (dot4I8Packed), 16 f16, 32 f32",
    },
    ParamSpec {
        name: "split_k",
        values: &[1, 2, 4, 8],
        default: 1,
        help: "workgroups per row group, each over a range of the row's blocks, summed by a second pass",
    },
];

/// Storage buffers the `main` entry binds (quants, scales, xq, xs, y, part).
const STORAGE_BUFFERS: u32 = 6;

/// Quantization blocks of the activation (32 elements each).
const ACT_BLOCK: usize = 32;

fn check(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    if !DTYPES.contains(&dtype) {
        return Err(format!("{dtype} is not one of the formats this kernel decodes (q8_0, q4_0, q4_1, q4_k, q6_k)"));
    }
    check_blocks(prob, dtype)?;
    let Problem::Gemv { n, k } = *prob else { return Err(format!("{} is not a GEMV", prob.describe())) };
    let be = dtype.quant().map_or(ACT_BLOCK, |f| f.block_elems());
    let (split, rows) = (param(params, "split_k")? as usize, param(params, "rows_per_wg")?);
    if split > k / be {
        return Err(format!("split_k = {split} exceeds the {} blocks of a row (k = {k}, {dtype})", k / be));
    }
    storage_buffers(caps, STORAGE_BUFFERS)?;
    grid_fits(caps, groups(n, rows) as usize * split, "row groups × splits")?;
    let part = (split * n * 4) as u64;
    if split > 1 && part > caps.max_storage_binding {
        return Err(format!("the {part}-byte split partials exceed the adapter's storage binding limit"));
    }
    Ok(())
}

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    check(caps, prob, dtype, params)
}

/// One dispatch of `entry` binding `binds` at the given binding numbers.
fn step(
    s: &WgslSetup<'_>,
    entry: &str,
    consts: &[(&str, f64)],
    binds: &[(u32, Bind<'_>)],
    groups: [u32; 3],
) -> Result<GpuStep, KernelError> {
    let pipe = s.gpu.pipeline(s.shader(), entry, consts)?;
    let label = format!("{}:{entry}", s.kernel.id);
    let scope = s.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let entries: Vec<wgpu::BindGroupEntry<'_>> = binds
        .iter()
        .map(|&(binding, b)| wgpu::BindGroupEntry {
            binding,
            resource: match b {
                Bind::Whole(buf) => buf.as_entire_binding(),
                Bind::Range(buf, offset, size) => {
                    wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: buf, offset, size: wgpu::BufferSize::new(size) })
                }
            },
        })
        .collect();
    let layout = pipe.get_bind_group_layout(0);
    let bind_group = s.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&label), layout: &layout, entries: &entries });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(crate::gpu::GpuError::Validation { what: format!("binding `{label}`"), message: e.to_string() }.into());
    }
    Ok(GpuStep { label, pipeline: pipe, bind_group, workgroups: groups })
}

fn prepare(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemv { n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, rows, vw, act, split) =
        (s.param("workgroup_size")?, s.param("rows_per_wg")?, s.param("k_vec")?, s.param("act_bits")?, s.param("split_k")?);
    let consts = [
        ("WG", wg as f64),
        ("ROWS", rows as f64),
        ("QFMT", qfmt(s.dtype)),
        ("VW", vw as f64),
        ("ACT", act as f64),
        ("SPLIT", split as f64),
    ];
    // x, quants, scales, y: the quants region bound padded to whole 16-byte words
    // (it ends at or before the 256-aligned scales region, so the padding is inside).
    let mut b = qbinds(s, 1, &[])?;
    if let Bind::Range(buf, off, size) = b[1] {
        b[1] = Bind::Range(buf, off, padded(size));
    }
    let u = s.gpu.uniform(s.kernel.id, &[n as u32, k as u32]);
    let xq = s.gpu.storage("qdp4a activation", (k * act as usize / 8) as u64);
    let xs = s.gpu.storage("qdp4a activation blocks", (k / ACT_BLOCK * 8) as u64);
    let part = s.gpu.storage("qdp4a split partials", if split > 1 { (split as usize * n * 4) as u64 } else { 16 });
    let (wu, wxq, wxs, wpart) = (Bind::Whole(&u), Bind::Whole(&xq), Bind::Whole(&xs), Bind::Whole(&part));
    let mut steps = vec![
        step(s, "quantize", &consts, &[(0, b[0]), (4, wu), (5, wxq), (6, wxs)], grid_2d(groups(k / ACT_BLOCK, 64)))?,
        step(
            s,
            "main",
            &consts,
            &[(1, b[1]), (2, b[2]), (3, b[3]), (4, wu), (5, wxq), (6, wxs), (7, wpart)],
            grid_2d(groups(n, rows) * split),
        )?,
    ];
    if split > 1 {
        steps.push(step(s, "sum_splits", &consts, &[(3, b[3]), (4, wu), (7, wpart)], grid_2d(groups(n, 64)))?);
    }
    Ok(GpuProgram { steps, owned: vec![u, xq, xs, part] })
}

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "gemv_q_dp4a_wg",
            Op::Gemv,
            DTYPES,
            PARAMS,
            "activation quantized once (int8 blocks, or f16 / f32), dot4I8Packed block dots, 16-byte quant loads, ROWS rows share each activation load in registers; one workgroup reduction at the end; split-K",
            WgslImpl::new(&DP4A_WG, prepare).shared(shared_rows).check(check),
        ),
        KernelDef::new(
            "gemv_q_dp4a_subgroup",
            Op::Gemv,
            DTYPES,
            PARAMS,
            "as gemv_q_dp4a_wg, finished by one subgroupAdd per row and one pass over the subgroups",
            WgslImpl::new(&DP4A_SG, prepare).shared(shared_rows).subgroups().check(check_subgroup),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::verify::{Runner, check_one};
    use crate::kernels::{Caps, find};
    use crate::testing::test_gpu;

    fn caps() -> GpuCaps {
        crate::testing::typical_gpu_caps()
    }

    fn with(k: &KernelDef, kv: &[(&str, u32)]) -> Params {
        let mut p = k.default_params();
        for &(name, v) in kv {
            p.insert(name.to_string(), v);
        }
        p
    }

    #[test]
    fn validity_rejects_what_the_shader_cannot_do_with_a_reason() {
        let wg = find("gemv_q_dp4a_wg").unwrap();
        let sg = find("gemv_q_dp4a_subgroup").unwrap();
        let c = caps();
        let base = wg.default_params();
        let reason =
            |k: &KernelDef, p: &Problem, d: DType, params: &Params, caps: &GpuCaps| k.check(Caps::Gpu(caps), p, d, params).unwrap_err();
        // k not whole blocks (a 32-block format, then a super-block one).
        assert!(reason(wg, &Problem::Gemv { n: 8, k: 48 }, DType::Q8_0, &base, &c).contains("multiple of 32"));
        assert!(reason(wg, &Problem::Gemv { n: 8, k: 288 }, DType::Q4_K, &base, &c).contains("multiple of 256"));
        // More splits than blocks in a row.
        let split8 = with(wg, &[("split_k", 8)]);
        assert!(reason(wg, &Problem::Gemv { n: 8, k: 512 }, DType::Q6_K, &split8, &c).contains("split_k = 8"));
        assert!(wg.check(Caps::Gpu(&c), &Problem::Gemv { n: 8, k: 2048 }, DType::Q6_K, &split8).is_ok());
        // Formats the shader does not decode, and float weights.
        assert!(reason(wg, &Problem::Gemv { n: 8, k: 256 }, DType::Q5_K, &base, &c).contains("q5_k"));
        assert!(wg.check(Caps::Gpu(&c), &Problem::Gemv { n: 8, k: 256 }, DType::F32, &base).is_err());
        // The subgroup form on an adapter without subgroups, or with wider subgroups than the workgroup.
        let p = Problem::Gemv { n: 8, k: 256 };
        assert!(reason(sg, &p, DType::Q4_K, &base, &GpuCaps { subgroups: false, ..c.clone() }).contains("subgroup"));
        let wg32 = with(sg, &[("workgroup_size", 32)]);
        assert!(reason(sg, &p, DType::Q4_K, &wg32, &GpuCaps { subgroup_max_size: 64, ..c.clone() }).contains("subgroup size 64"));
        assert!(wg.check(Caps::Gpu(&GpuCaps { subgroups: false, ..c.clone() }), &p, DType::Q4_K, &base).is_ok());
        // Too few storage buffers per stage, too little workgroup memory.
        assert!(reason(wg, &p, DType::Q8_0, &base, &GpuCaps { max_storage_buffers_per_stage: 4, ..c.clone() }).contains("storage buffers"));
        let big = with(wg, &[("workgroup_size", 256), ("rows_per_wg", 8)]);
        assert!(reason(wg, &p, DType::Q8_0, &big, &GpuCaps { max_workgroup_storage: 4096, ..c }).contains("workgroup memory"));
    }

    /// Every variant form × format × shapes with a partial last workgroup, split-K
    /// over an uneven number of blocks, and each vector width and activation format,
    /// against the f64 reference on the dequantized weights, on the test GPU.
    #[test]
    fn every_form_and_format_matches_the_reference() {
        let Some(gpu) = test_gpu() else { return };
        let mut failures = Vec::new();
        let mut ran = 0;
        for id in ["gemv_q_dp4a_wg", "gemv_q_dp4a_subgroup"] {
            let kd = find(id).unwrap();
            for &dtype in DTYPES {
                let be = dtype.quant().unwrap().block_elems();
                // 37 rows: never a whole number of 2/4/8-row workgroups; 3 and 5 blocks a row.
                let shapes = [Problem::Gemv { n: 37, k: 3 * be }, Problem::Gemv { n: 5, k: 5 * be }];
                let sets: Vec<Params> = [
                    vec![],
                    vec![("k_vec", 1)],
                    vec![("k_vec", 2), ("rows_per_wg", 8)],
                    vec![("act_bits", 16), ("rows_per_wg", 1)],
                    vec![("act_bits", 32), ("k_vec", 2)],
                    vec![("split_k", 2)],
                    vec![("split_k", 4), ("k_vec", 1), ("workgroup_size", 32)],
                    vec![("workgroup_size", 256), ("rows_per_wg", 2), ("act_bits", 16)],
                ]
                .iter()
                .map(|kv| with(kd, kv))
                .collect();
                for (si, prob) in shapes.iter().enumerate() {
                    for (pi, params) in sets.iter().enumerate() {
                        if kd.check(Caps::Gpu(&gpu.caps), prob, dtype, params).is_err() {
                            continue;
                        }
                        let c = check_one(&Runner::Gpu(&gpu), kd, prob, dtype, params, 0xd4a ^ ((si as u64) << 8) ^ pi as u64);
                        ran += 1;
                        if !c.passed {
                            failures.push(format!(
                                "{id} {dtype} {params:?} {}: rel {:.2e} (tol {:.0e}) {:?}",
                                c.problem, c.rel_err, c.tolerance, c.error
                            ));
                        }
                    }
                }
            }
        }
        assert!(ran >= 2 * DTYPES.len() * 8, "only {ran} checks ran on {}", gpu.name);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
