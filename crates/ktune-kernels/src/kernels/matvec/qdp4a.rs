//! The second-generation quantized projections (decode): the GEMV
//! `gemv_q_dp4a_wg` and `gemv_q_dp4a_subgroup` registered here, and the program,
//! validity and tunables of the fused forms registered by their families,
//! `gate_up_q_dp4a_*` ([`gate_up`](super::gate_up): the gate and up rows of ROWS
//! features, the activation product in registers) and `qkv_proj_q_dp4a_*`
//! ([`qkv`](super::qkv): the Q, K and V rows, bias and routing as
//! `qkv_proj_q_wg`), over weights of every block format ([`DType::QUANT`]) in the GPU layout of
//! [`QMatrix`](crate::kernels::quant::QMatrix). Their WGSL shares one core,
//! `shaders/qdp4a.wgsl` (the quantize pass, the block dots, the register
//! accumulation), one entry point per reduction (`qdp4a_main_wg.wgsl`,
//! `qdp4a_main_sg.wgsl`) and one include per op (`qdp4a_gemv.wgsl`,
//! `qdp4a_gate_up.wgsl`, `qdp4a_qkv.wgsl`: outputs, rows, split sums).
//!
//! One program of two or three dispatches (`shaders/qdp4a.wgsl`):
//! 1. `quantize`: the activation once per call into a scratch buffer, in the form
//!    `act_bits` names: 8, int8 blocks of 32 q8_1 style (an f32 scale `d` and the
//!    block sum `d·Σq`, four codes a `u32`), dotted with `dot4I8Packed`; 16, f16
//!    pairs; 32, f32 (the block sums are kept in every form).
//! 2. `main`: each invocation walks items of `k_vec` quant words (4: one 16-byte
//!    load; the GPU layout keeps every segment 16-byte aligned, Q4_K's blocks
//!    padded from 140 to 144 bytes, [`QFormat::gpu_quant_bytes`](crate::kernels::quant::QFormat::gpu_quant_bytes))
//!    for all `rows_per_wg` rows of its workgroup,
//!    sharing each activation load, into register accumulators; unsigned weight
//!    codes (Q4_0, Q4_1, Q4_K nibbles) are dotted as they are and their offsets
//!    come through the activation block sums; Q6_K codes become signed bytes in
//!    registers. One reduction at the end: a workgroup tree (`_wg`) or
//!    `subgroupAdd` plus one pass over the subgroups' values (`_subgroup`).
//! 3. with `split_k` > 1, workgroups cover `split_k` ranges of each row's blocks
//!    and write partial sums; `sum_splits` adds them in a fixed order (gate_up:
//!    then the activation product). The Q/K/V projection has no split-K: its
//!    `main` binds eight storage buffers already.
//!
//! The Q8_0 / Q4_0 / Q4_1 weight codes are signed or unsigned bytes and nibbles
//! and the activation codes are signed, so every int8 dot is `dot4I8Packed`
//! (`dot4U8Packed` would need unsigned activations: a zero point per block and a
//! weight-sum correction instead of the activation-sum one).

use crate::device::GpuCaps;
use crate::gpu::{Bind, GpuProgram, GpuStep, Shader, grid_2d, groups, padded};
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{WORKGROUP_SIZE, grid_fits, qbinds, qfmt, storage_buffers, subgroup_fits};
use crate::shader;

static DP4A_WG: Shader = shader!(head "qdp4a_head.wgsl"; "qdp4a_gemv.wgsl", "qdp4a_rows.wgsl", "qdp4a_main_wg.wgsl", "qdp4a.wgsl", "qgeom.wgsl", "reduce_wg.wgsl");
static DP4A_SG: Shader =
    shader!(head "qdp4a_head.wgsl"; "qdp4a_gemv.wgsl", "qdp4a_rows.wgsl", "qdp4a_main_sg.wgsl", "qdp4a.wgsl", "qgeom.wgsl");

/// The block formats the shader decodes: every one.
pub const DTYPES: &[DType] = DType::QUANT;

const ROWS_PER_WG: ParamSpec = ParamSpec {
    name: "rows_per_wg",
    values: &[1, 2, 4, 8],
    default: 4,
    help: "outputs per workgroup, sharing each activation load (register accumulators; gate_up: a gate and an up row each)",
};
const K_VEC: ParamSpec =
    ParamSpec { name: "k_vec", values: &[1, 2, 4], default: 4, help: "quant words per invocation and step along k (4: 16-byte loads)" };
const ACT_BITS: ParamSpec = ParamSpec {
    name: "act_bits",
    values: &[8, 16, 32],
    default: 8,
    help: "activation format: 8 int8 blocks (dot4I8Packed), 16 f16, 32 f32",
};
const SPLIT_K: ParamSpec = ParamSpec {
    name: "split_k",
    values: &[1, 2, 4, 8],
    default: 1,
    help: "workgroups per row group, each over a range of the row's blocks, summed by a second pass",
};

/// The GEMV's and the fused gate+up's tunables.
pub(super) const PARAMS: &[ParamSpec] = &[WORKGROUP_SIZE, ROWS_PER_WG, K_VEC, ACT_BITS, SPLIT_K];
/// The fused Q/K/V projection's: no split-K (its `main` binds eight storage
/// buffers already, the WebGPU default per stage; a partials buffer would be a ninth).
pub(super) const PARAMS_NO_SPLIT: &[ParamSpec] = &[WORKGROUP_SIZE, ROWS_PER_WG, K_VEC, ACT_BITS];

/// Quantization blocks of the activation (32 elements each).
const ACT_BLOCK: usize = 32;

/// What the three ops ask of the shared core: the depth k, the outputs, the storage buffers
/// `main` binds, the f32 partials one split writes (`None`: no split-K), the
/// uniform words and the output buffers' binding numbers (after x, the quants and
/// the scales in [`qbinds`] order; the Q/K/V projection without a bias binds a
/// placeholder at 3).
struct Shape {
    k: usize,
    outs: usize,
    storage: u32,
    split_part: Option<usize>,
    uniform: Vec<u32>,
    out_bindings: &'static [u32],
    bias_placeholder: bool,
}

fn shape(prob: &Problem) -> Result<Shape, String> {
    Ok(match *prob {
        Problem::Gemv { n, k } => Shape {
            k,
            outs: n,
            storage: 6,
            split_part: Some(n),
            uniform: vec![n as u32, k as u32],
            out_bindings: &[3],
            bias_placeholder: false,
        },
        Problem::GateUp { rows, n, k, act } => {
            if rows != 1 {
                return Err(format!(
                    "a decode kernel (one token; the activation is quantized once for it), not {rows} tokens: prefill uses the \
                     gate_up GEMMs"
                ));
            }
            Shape {
                k,
                outs: n,
                storage: 6,
                split_part: Some(2 * n),
                uniform: vec![n as u32, k as u32, act.code()],
                out_bindings: &[3],
                bias_placeholder: false,
            }
        }
        Problem::QkvProj { k, nq, nkv, bias } => Shape {
            k,
            outs: nq + 2 * nkv,
            storage: 8,
            split_part: None,
            uniform: vec![k as u32, nq as u32, nkv as u32],
            out_bindings: if bias { &[3, 7, 8, 9] } else { &[7, 8, 9] },
            bias_placeholder: !bias,
        },
        _ => return Err(format!("{} is not a GEMV, a decode gate_up or a qkv_proj", prob.describe())),
    })
}

/// `split_k`, 1 for the kernels without it.
fn split_of(params: &Params) -> u32 {
    params.get("split_k").copied().unwrap_or(1)
}

/// The validity of every second-generation kernel (GEMV, gate_up, qkv_proj).
pub(super) fn check(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    if !DTYPES.contains(&dtype) {
        return Err(format!("{dtype} is not a block format: this kernel decodes quantized weights"));
    }
    check_blocks(prob, dtype)?;
    let sh = shape(prob)?;
    let k = sh.k;
    let be = dtype.quant().map_or(ACT_BLOCK, |f| f.block_elems());
    let (split, rows) = (split_of(params) as usize, param(params, "rows_per_wg")?);
    if split > k / be {
        return Err(format!("split_k = {split} exceeds the {} blocks of a row (k = {k}, {dtype})", k / be));
    }
    storage_buffers(caps, sh.storage)?;
    grid_fits(caps, groups(sh.outs, rows) as usize * split, "row groups × splits")?;
    let part = (split * sh.split_part.unwrap_or(0) * 4) as u64;
    if split > 1 && part > caps.max_storage_binding {
        return Err(format!("the {part}-byte split partials exceed the adapter's storage binding limit"));
    }
    Ok(())
}

pub(super) fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    check(caps, prob, dtype, params)
}

/// Workgroup memory of the `_wg` forms: one f32 per invocation and accumulator.
pub(super) fn shared(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let per = if matches!(prob, Problem::GateUp { .. }) { 2 } else { 1 };
    Ok(4 * per * param(params, "workgroup_size")? as u64 * param(params, "rows_per_wg")? as u64)
}

/// The `_subgroup` forms: as [`shared`], plus the 16 accumulator totals.
pub(super) fn shared_sg(prob: &Problem, dtype: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(shared(prob, dtype, params)? + 64)
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
    let entries = binds.iter().map(|&(binding, b)| b.entry(binding)).collect();
    Ok(s.gpu.step_entries(label, pipe, entries, groups)?)
}

/// The program of every second-generation kernel: `quantize` (the activation
/// once), `main` (all the op's weight rows against it), and with `split_k` > 1
/// the family's `sum_splits`.
pub(super) fn prepare(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape(s.problem).map_err(|_| wrong_op(s.kernel, s.problem))?;
    let k = sh.k;
    let (wg, rows, vw, act, split) =
        (s.param("workgroup_size")?, s.param("rows_per_wg")?, s.param("k_vec")?, s.param("act_bits")?, split_of(s.params));
    let mut consts = vec![
        ("WG", wg as f64),
        ("ROWS", rows as f64),
        ("QFMT", qfmt(s.dtype)),
        ("VW", vw as f64),
        ("ACT", act as f64),
        ("SPLIT", split as f64),
    ];
    if let Problem::QkvProj { bias, .. } = *s.problem {
        consts.push(("HAS_BIAS", if bias { 1.0 } else { 0.0 }));
    }
    // x, quants, scales, the op's other buffers: the quants region bound padded to
    // whole 16-byte words (it ends at or before the 256-aligned scales region, so
    // the padding is inside).
    let mut b = qbinds(s, 1, &[])?;
    if let Bind::Range(buf, off, size) = b[1] {
        b[1] = Bind::Range(buf, off, padded(size));
    }
    if b.len() != 3 + sh.out_bindings.len() {
        return Err(wrong_op(s.kernel, s.problem));
    }
    let u = s.gpu.uniform(s.kernel.id, &sh.uniform);
    let xq = s.gpu.storage("qdp4a activation", (k * act as usize / 8) as u64);
    let xs = s.gpu.storage("qdp4a activation blocks", (k / ACT_BLOCK * 8) as u64);
    let part =
        sh.split_part.map(|per| s.gpu.storage("qdp4a split partials", if split > 1 { (split as usize * per * 4) as u64 } else { 16 }));
    let placeholder = sh.bias_placeholder.then(|| s.gpu.storage("qkv_no_bias", 16));
    let (wu, wxq, wxs) = (Bind::Whole(&u), Bind::Whole(&xq), Bind::Whole(&xs));
    let mut main_binds = vec![(1, b[1]), (2, b[2]), (4, wu), (5, wxq), (6, wxs)];
    main_binds.extend(sh.out_bindings.iter().copied().zip(b[3..].iter().copied()));
    if let Some(p) = &placeholder {
        main_binds.push((3, Bind::Whole(p)));
    }
    if let Some(p) = &part {
        main_binds.push((7, Bind::Whole(p)));
    }
    let mut steps = vec![
        step(s, "quantize", &consts, &[(0, b[0]), (4, wu), (5, wxq), (6, wxs)], grid_2d(groups(k / ACT_BLOCK, 64)))?,
        step(s, "main", &consts, &main_binds, grid_2d(groups(sh.outs, rows) * split))?,
    ];
    if let (true, Some(p)) = (split > 1, &part) {
        steps.push(step(s, "sum_splits", &consts, &[(3, b[3]), (4, wu), (7, Bind::Whole(p))], grid_2d(groups(sh.outs, 64)))?);
    }
    let mut owned = vec![u, xq, xs];
    owned.extend(part);
    owned.extend(placeholder);
    Ok(GpuProgram { steps, owned })
}

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "gemv_q_dp4a_wg",
            Op::Gemv,
            DTYPES,
            PARAMS,
            "activation quantized once (int8 blocks, or f16 / f32), dot4I8Packed block dots, 16-byte quant loads, ROWS rows share each activation load in registers; one workgroup reduction at the end; split-K",
            WgslImpl::new(&DP4A_WG, prepare).shared(shared).check(check),
        ),
        KernelDef::new(
            "gemv_q_dp4a_subgroup",
            Op::Gemv,
            DTYPES,
            PARAMS,
            "as gemv_q_dp4a_wg, finished by one subgroupAdd per row and one pass over the subgroups",
            WgslImpl::new(&DP4A_SG, prepare).shared(shared_sg).subgroups().check(check_subgroup),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Caps;
    use crate::kernels::find;
    use crate::kernels::verify::{Runner, check_one};
    use crate::testing::test_gpu;

    fn caps() -> GpuCaps {
        crate::testing::typical_gpu_caps()
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
        let split8 = wg.params_with(&[("split_k", 8)]);
        assert!(reason(wg, &Problem::Gemv { n: 8, k: 512 }, DType::Q6_K, &split8, &c).contains("split_k = 8"));
        assert!(wg.check(Caps::Gpu(&c), &Problem::Gemv { n: 8, k: 2048 }, DType::Q6_K, &split8).is_ok());
        // Float weights.
        assert!(reason(wg, &Problem::Gemv { n: 8, k: 256 }, DType::F32, &base, &c).contains("no f32 variant"));
        // The subgroup form on an adapter without subgroups, or with wider subgroups than the workgroup.
        let p = Problem::Gemv { n: 8, k: 256 };
        assert!(reason(sg, &p, DType::Q4_K, &base, &GpuCaps { subgroups: false, ..c.clone() }).contains("subgroup"));
        let wg32 = sg.params_with(&[("workgroup_size", 32)]);
        assert!(reason(sg, &p, DType::Q4_K, &wg32, &GpuCaps { subgroup_max_size: 64, ..c.clone() }).contains("subgroup size 64"));
        assert!(wg.check(Caps::Gpu(&GpuCaps { subgroups: false, ..c.clone() }), &p, DType::Q4_K, &base).is_ok());
        // Too few storage buffers per stage, too little workgroup memory.
        assert!(reason(wg, &p, DType::Q8_0, &base, &GpuCaps { max_storage_buffers_per_stage: 4, ..c.clone() }).contains("storage buffers"));
        let big = wg.params_with(&[("workgroup_size", 256), ("rows_per_wg", 8)]);
        assert!(reason(wg, &p, DType::Q8_0, &big, &GpuCaps { max_workgroup_storage: 4096, ..c }).contains("workgroup memory"));
    }

    /// The fused forms: gate_up is decode only, qkv_proj has no split-K and binds
    /// eight storage buffers; both say so.
    #[test]
    fn fused_forms_say_what_they_refuse() {
        use crate::kernels::problem::Activation;
        let c = caps();
        let gu = find("gate_up_q_dp4a_wg").unwrap();
        let qkv = find("qkv_proj_q_dp4a_subgroup").unwrap();
        let one = Problem::GateUp { rows: 1, n: 24, k: 512, act: Activation::Silu };
        assert!(gu.check(Caps::Gpu(&c), &one, DType::Q4_K, &gu.default_params()).is_ok());
        let three = Problem::GateUp { rows: 3, n: 24, k: 512, act: Activation::Silu };
        let r = gu.check(Caps::Gpu(&c), &three, DType::Q4_K, &gu.default_params()).unwrap_err();
        assert!(r.contains("decode") && r.contains("3 tokens"), "{r}");
        let split8 = gu.params_with(&[("split_k", 8)]);
        assert!(gu.check(Caps::Gpu(&c), &one, DType::Q6_K, &split8).unwrap_err().contains("split_k = 8"));
        assert!(qkv.params.iter().all(|p| p.name != "split_k"));
        let p = Problem::QkvProj { k: 512, nq: 32, nkv: 16, bias: true };
        assert!(qkv.check(Caps::Gpu(&c), &p, DType::Q8_0, &qkv.default_params()).is_ok());
        let seven = GpuCaps { max_storage_buffers_per_stage: 7, ..c.clone() };
        assert!(qkv.check(Caps::Gpu(&seven), &p, DType::Q8_0, &qkv.default_params()).unwrap_err().contains("8 storage buffers"));
        assert!(qkv.check(Caps::Gpu(&c), &p, DType::F16, &qkv.default_params()).unwrap_err().contains("f16"));
        // The gate_up form keeps a gate and an up accumulator per feature in workgroup memory.
        let (pg, pq) = (gu.default_params(), qkv.default_params());
        let wg_mem = |k: &KernelDef, prob: &Problem, params: &Params| match &k.imp {
            crate::kernels::Impl::Wgsl(w) => (w.shared_memory)(prob, DType::Q8_0, params).unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(wg_mem(gu, &one, &pg), 2 * 4 * 128 * 4);
        assert_eq!(wg_mem(qkv, &p, &pq), 4 * 128 * 4 + 64);
    }

    // Every variant form (GEMV, gate_up, qkv_proj; workgroup and subgroup), one
    // test each so that libtest runs them side by side (on lavapipe the sweep is
    // mostly compiling: one test of all six was the library's longest by far).
    #[test]
    fn gemv_wg_matches_the_reference_in_every_format() {
        every_format_matches_the_reference("gemv_q_dp4a_wg");
    }
    #[test]
    fn gemv_subgroup_matches_the_reference_in_every_format() {
        every_format_matches_the_reference("gemv_q_dp4a_subgroup");
    }
    #[test]
    fn gate_up_wg_matches_the_reference_in_every_format() {
        every_format_matches_the_reference("gate_up_q_dp4a_wg");
    }
    #[test]
    fn gate_up_subgroup_matches_the_reference_in_every_format() {
        every_format_matches_the_reference("gate_up_q_dp4a_subgroup");
    }
    #[test]
    fn qkv_proj_wg_matches_the_reference_in_every_format() {
        every_format_matches_the_reference("qkv_proj_q_dp4a_wg");
    }
    #[test]
    fn qkv_proj_subgroup_matches_the_reference_in_every_format() {
        every_format_matches_the_reference("qkv_proj_q_dp4a_subgroup");
    }

    /// The variant `id` in every format × parameter sets of each vector width and
    /// activation format, on one of two shapes with a partial last workgroup and
    /// split-K over an uneven number of blocks (alternating, so that every set and
    /// every format meets both), against the f64 reference on the dequantized
    /// weights, on the test GPU.
    fn every_format_matches_the_reference(id: &str) {
        use crate::kernels::problem::Activation;
        let Some(gpu) = test_gpu() else { return };
        let mut failures = Vec::new();
        let mut ran = 0;
        {
            let kd = find(id).unwrap();
            for (fi, &dtype) in DTYPES.iter().enumerate() {
                let be = dtype.quant().unwrap().block_elems();
                // 37 outputs: never a whole number of 2/4/8-row workgroups; 3 and 5 blocks a row.
                let shapes = match kd.op {
                    Op::Gemv => [Problem::Gemv { n: 37, k: 3 * be }, Problem::Gemv { n: 5, k: 5 * be }],
                    // (More features than the GEMV's 5: an output is a product of two
                    // dots, judged against the largest output; with a handful of
                    // features all gelu-damped, int8 activation noise is not.)
                    Op::GateUp => [
                        Problem::GateUp { rows: 1, n: 37, k: 3 * be, act: Activation::Silu },
                        Problem::GateUp { rows: 1, n: 29, k: 5 * be, act: Activation::GeluTanh },
                    ],
                    _ => [
                        Problem::QkvProj { k: 3 * be, nq: 24, nkv: 7, bias: true },
                        Problem::QkvProj { k: 5 * be, nq: 8, nkv: 2, bias: false },
                    ],
                };
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
                .filter(|kv| kv.iter().all(|(name, _)| kd.params.iter().any(|p| p.name == *name)))
                .map(|kv| kd.params_with(kv))
                .collect();
                for (si, prob) in shapes.iter().enumerate() {
                    for (pi, params) in sets.iter().enumerate() {
                        // each set on one of the two shapes, alternating with the
                        // format: every set meets both shapes, every format both
                        if (fi + pi) % 2 != si {
                            continue;
                        }
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
        assert!(ran >= DTYPES.len() * 3, "{id}: only {ran} checks ran on {}", gpu.name);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
