//! Fused RMSNorm prologue + matrix-vector product (decode), `y[n] = w[n,k] ·
//! (x * inv_rms(x) ∘ g)` ([`Problem::NormGemv`]): the input norm of a layer (or the
//! final norm) folded into the projection that consumes it, so the normalized
//! vector never goes through memory and no separate norm kernel runs. The algebra
//! that makes it free: `y_r = inv_rms · Σ_c w[r,c]·x[c]·g[c]`, so a GPU workgroup
//! sums `x²` alongside its dot products (k is the hidden size, 1–3K) and scales the
//! row sums at the end; no extra pass over `w`.
//!
//! The decode chain's forms of the same op ([`Problem::NormGemv`]'s `residual` and
//! `act`): the residual add of the layer before as part of the prologue (`x + r`,
//! or Gemma 3's `x + rmsnorm(r) * g_r`, the sum also written out as the next
//! residual stream), and the fused gate/up's two rows per output with the gated
//! activation in the epilogue; the subgroup and CPU kernels run them, the
//! workgroup-reduction ones the plain form only.
//!
//! WGSL: `norm_gemv_wg` (f32/f16 weights, scalar loads, any k, `x²` folded into the
//! rows' workgroup tree reduction), `norm_gemv_subgroup` (the prologue formed once
//! per workgroup into workgroup memory, then 16-byte loads and one `subgroupAdd` per
//! row), and for the block formats (q8_0, q4_0, q4_1, the `QFMT`
//! override; the weight buffer bound twice, quants and the 256-byte aligned scales
//! region, as in [`quant`](super::quant)) `norm_gemv_q_wg` and
//! `norm_gemv_q_subgroup`.
//! CPU: `norm_gemv_cpu` (f32/f16: `x` normalized once into a per-call k-vector, then
//! the rows in parallel with the four-row SIMD dots of the float GEMV) and
//! `norm_gemv_q_cpu` (the same prologue, then the block dot products of
//! `gemv_q_cpu`, with f32 or int8 activations).

use super::{CPU_PARAMS, ROWS_PER_TASK_DYN, gemv_dot4};
use crate::device::GpuCaps;
use crate::gpu::{Bind, BindEntry, GpuProgram, Shader, grid_2d, groups};
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{
    CpuArgs, CpuImpl, CpuIn, Impl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op,
};
use crate::kernels::cpu::{self, ACT_BITS, ActVec, ISA, Isa, RowSplit, check_isa, par_rows};
use crate::kernels::problem::{NormResidual, Op, Problem};
use crate::kernels::quant::{DType, QView, RowFormats, stack::Segment};
use crate::kernels::wgsl::{ROWS_SG_PARAMS, ROWS_WG_PARAMS, qbinds, qfmt, storage_buffers, subgroup_fits, vec_alignment};
use crate::shader;

static NORM_GEMV_WG: Shader = shader!("norm_gemv_wg.wgsl", "norm_block_wg.wgsl", "block_wg.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static NORM_GEMV_SG: Shader =
    shader!("norm_gemv_subgroup.wgsl", "wload.wgsl", "act.wgsl", "norm_gemv_sg.wgsl", "grid_sg.wgsl", "grid.wgsl");
static NORM_GEMV_Q_WG: Shader = shader!(
    "norm_gemv_q_wg.wgsl",
    "norm_gemv_q.wgsl",
    "qblock.wgsl",
    "qgeom.wgsl",
    "norm_block_wg.wgsl",
    "block_wg.wgsl",
    "reduce_wg.wgsl"
);
/// The quantized subgroup shader (`own`: its file) and its twin over per-operand
/// formats: one list of includes.
macro_rules! norm_gemv_q_sg {
    ($own:literal) => {
        shader!(
            $own,
            "norm_gemv_q.wgsl",
            "norm_gemv_q_sg.wgsl",
            "qblock.wgsl",
            "qgeom.wgsl",
            "act.wgsl",
            "norm_gemv_sg.wgsl",
            "grid_sg.wgsl",
            "grid.wgsl"
        )
    };
}
static NORM_GEMV_Q_SG: Shader = norm_gemv_q_sg!("norm_gemv_q_subgroup.wgsl");
/// `norm_gemv_q_subgroup`'s twin over a weight of per-operand formats.
const QMIX_ALT: &[&Shader] = &[&NORM_GEMV_QMIX_SG];
static NORM_GEMV_QMIX_SG: Shader = norm_gemv_q_sg!("norm_gemv_qmix_subgroup.wgsl");

const QUANT: &[DType] = DType::QUANT;

const CPU_Q_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK_DYN, ISA, ACT_BITS];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "norm_gemv_wg",
            Op::NormGemv,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "scalar loads, any k; ROWS rows per workgroup share x·g; x² summed alongside; one workgroup tree reduction",
            WgslImpl::new(&NORM_GEMV_WG, prepare_float).shared(shared_rows_plus_one).check(check_wg),
        ),
        KernelDef::new(
            "norm_gemv_subgroup",
            Op::NormGemv,
            DType::FLOAT,
            ROWS_SG_PARAMS,
            "x·g formed once per workgroup in workgroup memory (x² summed alongside), then one subgroup per row, 16-byte loads, subgroupAdd",
            WgslImpl::new(&NORM_GEMV_SG, prepare_float).subgroups().shared(shared_prologue).check(check_subgroup),
        ),
        KernelDef::new(
            "norm_gemv_q_wg",
            Op::NormGemv,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "quantized blocks dequantized in registers; ROWS rows per workgroup share x·g; x² summed alongside; workgroup reduction",
            WgslImpl::new(&NORM_GEMV_Q_WG, prepare_quant).shared(shared_rows_plus_one).check(check_q_wgsl),
        ),
        KernelDef::new(
            "norm_gemv_q_subgroup",
            Op::NormGemv,
            DType::QUANT,
            ROWS_SG_PARAMS,
            "x·g formed once per workgroup in workgroup memory (x² summed alongside), then one subgroup per row, blocks dequantized in registers, subgroupAdd; per-operand formats: each row's part sets its format",
            WgslImpl::new(&NORM_GEMV_Q_SG, prepare_quant)
                .subgroups()
                .shared(shared_prologue)
                .check(check_q_subgroup)
                .alt_shaders(QMIX_ALT),
        )
        .stacks(),
        KernelDef::new(
            "norm_gemv_cpu",
            Op::NormGemv,
            DType::FLOAT,
            CPU_PARAMS,
            "x normalized once into a k-vector (SIMD sum of squares), then four rows per SIMD dot call; pool over rows",
            CpuImpl { run: run_float, check: check_isa },
        ),
        KernelDef::new(
            "norm_gemv_q_cpu",
            Op::NormGemv,
            QUANT,
            CPU_Q_PARAMS,
            "x normalized once into a k-vector, then SIMD block dot products straight from the quants (f32 or int8 activations); pool over rows; per-operand formats: each part's rows in its format",
            CpuImpl { run: run_quant, check: cpu::check_quant },
        )
        .stacks(),
    ]
}

// ---------------------------------------------------------------------------------
// Validity
// ---------------------------------------------------------------------------------

/// The workgroup-reduction shaders run the plain form only (no residual, no activation).
fn plain_only(prob: &Problem) -> Result<(), String> {
    match *prob {
        Problem::NormGemv { residual, act, .. } if !residual.is_none() || act.is_some() => {
            Err("a residual or activation prologue/epilogue (the subgroup and CPU kernels run those)".into())
        }
        _ => Ok(()),
    }
}

fn check_wg(_: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    plain_only(prob)
}

fn check_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    storage_buffers(caps, 7)?;
    match *prob {
        Problem::NormGemv { k, .. } => vec_alignment(k, dtype),
        _ => Ok(()),
    }
}

fn check_q_wgsl(_: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    plain_only(prob)?;
    check_blocks(prob, dtype)
}

fn check_q_subgroup(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    storage_buffers(caps, 8)?;
    check_blocks(prob, dtype)
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

/// ROWS partial dot products and one partial sum of squares per invocation.
fn shared_rows_plus_one(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(4 * param(params, "workgroup_size")? as u64 * (param(params, "rows_per_wg")? as u64 + 1))
}

/// The subgroup shaders' prologue: x·g ([`k4`] vec4s) and one partial per subgroup
/// (at most WG).
fn shared_prologue(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(16 * k4_of(prob) as u64 + 4 * param(params, "workgroup_size")? as u64)
}

/// Indices of a [`Problem::NormGemv`]'s buffers in binding order (see
/// [`Problem::buffers`]): x, the residual r and its gain g_r, g, w, y, h.
struct Roles {
    x: usize,
    r: Option<usize>,
    g_r: Option<usize>,
    g: usize,
    w: usize,
    y: usize,
    h: Option<usize>,
}

impl Roles {
    fn of(residual: NormResidual) -> Roles {
        let (r, g_r, g) = match residual {
            NormResidual::None => (None, None, 1),
            NormResidual::Add => (Some(1), None, 2),
            NormResidual::Normed => (Some(1), Some(2), 3),
        };
        Roles { x: 0, r, g_r, g, w: g + 1, y: g + 2, h: r.map(|_| g + 3) }
    }
}

/// `(n, roles, the uniform block {n, k, eps, unit_offset, residual, act (0 none,
/// 1 + Activation::code), 0, 0})`.
fn uniform(s: &WgslSetup<'_>) -> Result<(usize, Roles, [u32; 8]), KernelError> {
    match *s.problem {
        Problem::NormGemv { n, k, eps, unit_offset, residual, act, .. } => Ok((
            n,
            Roles::of(residual),
            [n as u32, k as u32, eps.to_bits(), unit_offset as u32, residual.code(), act.map_or(0, |a| 1 + a.code()), 0, 0],
        )),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

/// One step of `binds` (binding, buffer), `consts` and the uniform block `u` at
/// `ub`, over `groups(n, rows_per_wg)` workgroups.
fn step(
    s: &WgslSetup<'_>,
    consts: &[(&str, f64)],
    binds: Vec<(u32, Bind<'_>)>,
    ub: u32,
    u: &[u32],
    n: usize,
) -> Result<GpuProgram, KernelError> {
    let pipe = s.gpu.pipeline(s.shader(), "main", consts)?;
    let uniform = s.gpu.uniform(s.kernel.id, u);
    let mut entries: Vec<BindEntry> = binds.iter().map(|(i, b)| b.entry(*i)).collect();
    entries.push((ub, uniform.clone(), 0, None));
    let step = s.gpu.step_entries(s.kernel.id.to_string(), pipe, entries, grid_2d(groups(n, s.param("rows_per_wg")?)))?;
    Ok(GpuProgram { steps: vec![step], owned: vec![uniform] })
}

/// The subgroup shaders' `K4`, the vec4s of x·g in workgroup memory: k / 4 rounded
/// up to a power of two, at least 256 (one pipeline for every k up to 1024, one
/// per doubling above).
fn k4_of(prob: &Problem) -> usize {
    match *prob {
        Problem::NormGemv { k, .. } => k.div_ceil(4).next_power_of_two().max(256),
        _ => 256,
    }
}

fn k4(s: &WgslSetup<'_>) -> f64 {
    k4_of(s.problem) as f64
}

/// Whether the variant is a subgroup shader (the ones with the prologue's bindings).
fn subgroups(s: &WgslSetup<'_>) -> bool {
    matches!(&s.kernel.imp, Impl::Wgsl(w) if w.needs_subgroups)
}

/// The prologue's buffers at `(r, g_r, h)`: the problem's, or x, g and y in their
/// place when it has none (bound, never read or written).
fn prologue_binds<'a>(s: &'a WgslSetup<'a>, ro: &Roles, at: [u32; 3]) -> [(u32, Bind<'a>); 3] {
    let b = |i: Option<usize>, or: usize| Bind::Whole(s.bufs[i.unwrap_or(or)]);
    [(at[0], b(ro.r, ro.x)), (at[1], b(ro.g_r, ro.g)), (at[2], b(ro.h, ro.y))]
}

/// The float shaders: x, g, w, y at 0-3, the uniform at 4; the subgroup shader's
/// prologue buffers at 5, 6 and 8.
fn prepare_float(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, ro, u) = uniform(s)?;
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("W_F16", s.w_f16()), ("K4", k4(s))];
    let consts = if subgroups(s) { &consts[..] } else { &consts[..3] };
    let mut binds: Vec<(u32, Bind<'_>)> =
        [ro.x, ro.g, ro.w, ro.y].iter().enumerate().map(|(i, &b)| (i as u32, Bind::Whole(s.bufs[b]))).collect();
    if subgroups(s) {
        binds.extend(prologue_binds(s, &ro, [5, 6, 8]));
    }
    step(s, consts, binds, 4, &u, n)
}

/// The block-format shaders: x, g, the weight's quants and scales regions, y at
/// 0-4, the uniform at 5; the subgroup shader's prologue buffers at 6, 8 and 9.
/// A weight of per-operand formats runs the subgroup shader's twin, its parts'
/// formats, rows and base blocks as overrides ([`RowFormats::layout`]).
fn prepare_quant(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, ro, u) = uniform(s)?;
    if let Some(f) = s.problem.formats() {
        return prepare_stack(s, f, n, &ro, &u);
    }
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("QFMT", qfmt(s.dtype)), ("K4", k4(s))];
    let consts = if subgroups(s) { &consts[..] } else { &consts[..3] };
    // The op's buffers with the weight expanded into its two regions.
    let q = qbinds(s, ro.w, &[])?;
    let at = |i: usize| if i > ro.w { q[i + 1] } else { q[i] };
    let mut binds = vec![(0, at(ro.x)), (1, at(ro.g)), (2, q[ro.w]), (3, q[ro.w + 1]), (4, at(ro.y))];
    if subgroups(s) {
        binds.extend(prologue_binds(s, &ro, [6, 8, 9]));
    }
    step(s, consts, binds, 5, &u, n)
}

/// [`prepare_quant`] over a stacked weight (the subgroup shader's twin).
fn prepare_stack(s: &WgslSetup<'_>, f: RowFormats, n: usize, ro: &Roles, u: &[u32]) -> Result<GpuProgram, KernelError> {
    let Problem::NormGemv { k, .. } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let l = f.layout(k);
    let buf = s.bufs[ro.w];
    if buf.size() < l.total as u64 {
        return Err(KernelError::BufferLen { kernel: s.kernel.id.into(), buffer: "w".into(), expected: l.total, got: buf.size() as usize });
    }
    // Runs of parts in one format: adjacent parts of one format lie contiguous
    // (a part's base block is where the one before ends), so they read as one.
    let mut runs: Vec<Segment> = Vec::with_capacity(l.segments.len());
    for seg in &l.segments {
        match runs.last_mut() {
            Some(r) if r.format == seg.format => r.rows += seg.rows,
            _ => runs.push(*seg),
        }
    }
    let run = |i: usize| runs.get(i).or(runs.last()).copied();
    let (Some(s0), Some(s1), Some(s2)) = (run(0), run(1), run(2)) else {
        return Err(KernelError::Invalid { kernel: s.kernel.id.into(), reason: format!("per-operand formats {f} have no part") });
    };
    let words = [s0.rows as u32, s1.rows as u32, s1.base_block as u32, s2.base_block as u32];
    let part_words = s.gpu.uniform(s.kernel.id, &words);
    let consts = [
        ("WG", s.param("workgroup_size")? as f64),
        ("ROWS", s.param("rows_per_wg")? as f64),
        ("K4", k4(s)),
        ("QFMT0", qfmt(s0.format.into())),
        ("QFMT1", qfmt(s1.format.into())),
        ("QFMT2", qfmt(s2.format.into())),
        ("RUNS", runs.len() as f64),
    ];
    let mut binds = vec![
        (0, Bind::Whole(s.bufs[ro.x])),
        (1, Bind::Whole(s.bufs[ro.g])),
        (2, Bind::Range(buf, 0, l.quants as u64)),
        (3, Bind::Range(buf, l.scales_offset as u64, l.scales.max(4) as u64)),
        (4, Bind::Whole(s.bufs[ro.y])),
        (7, Bind::Whole(&part_words)),
    ];
    binds.extend(prologue_binds(s, ro, [6, 8, 9]));
    let mut program = step(&s.with_shader(&NORM_GEMV_QMIX_SG), &consts, binds, 5, u, n)?;
    program.owned.push(part_words);
    Ok(program)
}

// ---------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------

/// The prologue: `x * inv_rms(x) * g` (or `* (1 + g)`) into a fresh k-vector, the sum
/// of squares with the SIMD dot product of `x` with itself.
pub fn normalize(isa: Isa, x: &[f32], g: CpuIn<'_>, eps: f32, unit_offset: bool) -> cpu::Scratch {
    if x.is_empty() {
        return cpu::Scratch::zeroed(0);
    }
    let inv = 1.0 / (cpu::dot_f32(isa, x, x) / x.len() as f32 + eps).sqrt();
    let off = if unit_offset { 1.0 } else { 0.0 };
    cpu::Scratch::from_fn(x.len(), |i| x[i] * inv * (g.get(i) + off))
}

/// One CPU call's prologue and epilogue around the rows' dot products `rows(xn, w,
/// first, y)`: the residual added (normed) into `h`, the normalized input, the
/// rows (both halves of the fused gate/up with `act`), the activation product.
fn run_norm(
    kd: &KernelDef,
    prob: &Problem,
    params: &Params,
    a: CpuArgs<'_>,
    rows: impl Fn(&[f32], CpuIn<'_>, usize, &mut [f32]) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let Problem::NormGemv { n, k, eps, unit_offset, residual, act, .. } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let ro = Roles::of(residual);
    let x = &a.ins[ro.x].f32()[..k];
    let mut outs = a.outs.into_iter();
    let (y, h) = (outs.next().unwrap_or_default(), outs.next());
    let xn = match (ro.r, h) {
        (Some(ri), Some(h)) => {
            let r = &a.ins[ri].f32()[..k];
            let h = &mut h[..k];
            match ro.g_r {
                Some(gi) => {
                    let rn = normalize(isa, r, a.ins[gi], eps, unit_offset);
                    h.iter_mut().zip(x.iter().zip(rn.iter())).for_each(|(h, (x, r))| *h = x + r);
                }
                None => h.iter_mut().zip(x.iter().zip(r)).for_each(|(h, (x, r))| *h = x + r),
            }
            normalize(isa, h, a.ins[ro.g], eps, unit_offset)
        }
        _ => normalize(isa, x, a.ins[ro.g], eps, unit_offset),
    };
    let w = a.ins[ro.w];
    match act {
        None => rows(&xn, w, 0, &mut y[..n]),
        Some(act) => {
            let mut gu = cpu::Scratch::zeroed(2 * n);
            rows(&xn, w, 0, &mut gu)?;
            let (g, u) = gu.split_at(n);
            crate::kernels::act::gated_simd(isa, act, g, u, &mut y[..n]);
            Ok(())
        }
    }
}

fn run_float(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (isa, split) = (Isa::of(params)?, RowSplit::of(params)?);
    run_norm(kd, prob, params, a, |xn, w, first, y| {
        par_rows(y, 1, split, |f, y| gemv_dot4(isa, xn, w, xn.len(), first + f, y));
        Ok(())
    })
}

/// The block-format rows; a weight of per-operand formats part by part, each
/// with the normalized vector as its format's dots take it.
fn run_quant(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (isa, split) = (Isa::of(params)?, RowSplit::dynamic(params)?);
    run_norm(kd, prob, params, a, |xn, w, first, y| {
        let part = |w: QView<'_>, first: usize, y: &mut [f32]| {
            // The normalized vector as gemv_q_cpu takes it: f32, or int8 blocks (act_bits 8).
            let x = ActVec::new(xn, params, w.format)?;
            par_rows(y, 1, split, |f, y| x.rows(isa, w, xn.len(), first + f, y, false));
            Ok(())
        };
        match w {
            CpuIn::Q(w) => part(w, first, y),
            CpuIn::Stack(st) => {
                let mut rest = y;
                for p in &st.parts {
                    let (head, tail) = rest.split_at_mut(p.rows.min(rest.len()));
                    part(p.view(), 0, head)?;
                    rest = tail;
                }
                Ok(())
            }
            _ => Err(KernelError::BufferType { kernel: kd.id.into(), buffer: "w".into(), expected: "a quantized matrix" }),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::verify::{HostTensor, make_inputs, run_cpu};
    use crate::kernels::{find, reference};

    /// The fused kernel equals the RMSNorm kernel followed by the GEMV kernel (the
    /// unfused plan's two steps), for both gain conventions.
    #[test]
    fn fused_equals_norm_then_gemv() {
        for unit_offset in [false, true] {
            let (n, k, eps) = (19, 96, 1e-6);
            let prob = Problem::norm_gemv(n, k, eps, unit_offset);
            let ins = make_inputs(&prob, DType::F32, 3);
            let fused =
                run_cpu(find("norm_gemv_cpu").unwrap(), &prob, DType::F32, &find("norm_gemv_cpu").unwrap().default_params(), &ins).unwrap();
            let norm = Problem::RmsNorm { rows: 1, dim: k, eps, unit_offset };
            let f64s: Vec<Vec<f64>> = ins.iter().map(HostTensor::to_f64).collect();
            let xn = reference::compute(&norm, &[f64s[0].clone(), f64s[1].clone()]).remove(0);
            let y = reference::compute(&Problem::Gemv { n, k }, &[xn, f64s[2].clone()]).remove(0);
            for (a, b) in fused[0].iter().zip(&y) {
                assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()), "unit_offset {unit_offset}: {a} vs {b}");
            }
        }
    }

    /// A weight of per-operand formats (the parity sweep's stacked problems) runs
    /// on the kernels that take it, CPU and WGSL, within the sweep's tolerance, and
    /// every other norm-fused kernel refuses it rather than read one format.
    #[test]
    fn stacked_weights_run_where_taken_and_are_refused_elsewhere() {
        use crate::device::{Caps, CpuCaps};
        use crate::kernels::verify::{Runner, check_one};
        let stacked: Vec<Problem> =
            crate::kernels::problem::test_problems(Op::NormGemv).into_iter().filter(|p| p.formats().is_some()).collect();
        assert_eq!(stacked.len(), 3);
        let (cpu, gpu) = (CpuCaps::detect(), crate::testing::test_gpu());
        for p in &stacked {
            let dtype: DType = p.formats().unwrap().parts()[0].1.into();
            for k in crate::kernels::for_op(Op::NormGemv) {
                let params = k.default_params();
                let (runner, caps) = match (&k.imp, &gpu) {
                    (Impl::Cpu(_), _) => (Runner::Cpu, Caps::Cpu(&cpu)),
                    (Impl::Wgsl(_), Some(g)) => (Runner::Gpu(g), Caps::Gpu(&g.caps)),
                    (Impl::Wgsl(_), None) => continue,
                };
                let ok = k.check(caps, p, dtype, &params);
                assert_eq!(ok.is_ok(), k.stacks, "{} on {}: {ok:?}", k.id, p.describe());
                if k.stacks {
                    let c = check_one(&runner, k, p, dtype, &params, 7);
                    assert!(c.passed, "{} on {}: rel err {} (tolerance {})", k.id, p.describe(), c.rel_err, c.tolerance);
                    // Any other dtype than the first part's is refused.
                    assert!(k.check(caps, p, DType::Q8_0, &params).is_err() || dtype == DType::Q8_0);
                }
            }
        }
    }

    #[test]
    fn zero_length_activations_normalize_to_nothing() {
        assert!(normalize(Isa::Scalar, &[], CpuIn::F32(&[]), 1e-6, false).is_empty());
    }
}
