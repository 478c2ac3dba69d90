//! The activation family: elementwise and row-wise ops of the MLP and attention glue: the gated activation
//! (`gated_act`, `silu(gate) * up` or `gelu_tanh(gate) * up`), row softmax
//! (`softmax`) and the residual add (`residual_add`).
//!
//! WGSL: one element per invocation (`*_scalar`, any n) vs 16-byte vectors with
//! several per invocation (`*_vec4`, n % 4 == 0); softmax three-pass with workgroup
//! reductions (`softmax_wg`), online single pass with a workgroup (max, sum) merge
//! (`softmax_online`) and one subgroup per row (`softmax_subgroup`).
//! CPU: AVX-512 / AVX2 / portable microkernels (vectorised exp and sigmoid, written
//! once over [`cpu::lanes`](super::cpu::lanes)) under pool chunking, and a second kernel per op with another orchestration: static
//! per-thread ranges with libm (`*_static_cpu`), or a feature-split online softmax
//! for few long rows (`softmax_split_cpu`, decode).

use super::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use super::cpu::lanes::{self, Lanes};
use super::cpu::{
    ISA, Isa, ROWS_PARAMS, RowSplit, SPLIT_PARAMS, THREADS, check_isa, check_threads, isa_dispatch, merge_stats, par_elems, par_rows, pool,
    static_ranges,
};
use super::problem::{Activation, Op, Problem};
use super::quant::DType;
use super::wgsl::{grid_fits, shared_wg, subgroup_fits};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static SCALAR: Shader = shader!("elementwise_scalar.wgsl", "act.wgsl", "grid.wgsl");
static VEC4: Shader = shader!("elementwise_vec4.wgsl", "act.wgsl", "grid.wgsl");
static SOFTMAX_WG: Shader = shader!("elementwise_softmax_wg.wgsl", "elementwise_softmax.wgsl", "row_wg.wgsl", "reduce_wg.wgsl");
static SOFTMAX_ONLINE: Shader = shader!("elementwise_softmax_online.wgsl", "elementwise_softmax.wgsl", "row_wg.wgsl");
static SOFTMAX_SG: Shader = shader!("elementwise_softmax_subgroup.wgsl", "elementwise_softmax.wgsl", "row_sg.wgsl", "reduce_sg.wgsl");

/// These ops have no weight buffer: the dtype changes no buffer, so only f32 is listed.
const F32_ONLY: &[DType] = &[DType::F32];

const SCALAR_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[64, 128, 256, 512], default: 256, help: "invocations (elements) per workgroup" }];

const VEC4_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "vec_per_thread", values: &[1, 2, 4, 8], default: 2, help: "vec4s per invocation (strided by the workgroup size)" },
];

const SOFTMAX_WG_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per row (one workgroup per row)" }];

const SOFTMAX_SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "rows per workgroup, one subgroup each" },
];

const ELEM_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "elems_per_task",
        values: &[2048, 8192, 32768, 131072],
        default: 8192,
        help: "elements per pool task (a problem no larger runs on the calling thread)",
    },
    ISA,
];

const STATIC_CPU_PARAMS: &[ParamSpec] = &[THREADS];

pub fn variants() -> Vec<KernelDef> {
    vec![
        // gated_act
        KernelDef::new(
            "gated_act_scalar",
            Op::GatedAct,
            F32_ONLY,
            SCALAR_PARAMS,
            "one element per invocation, any n; activation specialised as a pipeline constant",
            WgslImpl::new(&SCALAR, prepare_scalar).check(check_scalar),
        ),
        KernelDef::new(
            "gated_act_vec4",
            Op::GatedAct,
            F32_ONLY,
            VEC4_PARAMS,
            "16-byte vec4 loads, vec_per_thread vec4s per invocation; n % 4 == 0",
            WgslImpl::new(&VEC4, prepare_vec4).check(check_vec4),
        ),
        KernelDef::new(
            "gated_act_simd_cpu",
            Op::GatedAct,
            F32_ONLY,
            ELEM_CPU_PARAMS,
            "SIMD microkernel (AVX-512/AVX2/portable) with a polynomial exp and sigmoid; pool over element chunks",
            CpuImpl { run: run_gated_simd, check: check_isa },
        ),
        KernelDef::new(
            "gated_act_static_cpu",
            Op::GatedAct,
            F32_ONLY,
            STATIC_CPU_PARAMS,
            "scalar libm exp per element (reference-accurate); one static contiguous range per thread",
            CpuImpl { run: run_gated_static, check: check_threads },
        ),
        // softmax
        KernelDef::new(
            "softmax_wg",
            Op::Softmax,
            F32_ONLY,
            SOFTMAX_WG_PARAMS,
            "three passes (max, sum of exp, write), one workgroup per row, workgroup-memory tree reductions",
            WgslImpl::new(&SOFTMAX_WG, prepare_softmax_rows).shared(shared_wg).check(check_rows_grid),
        ),
        KernelDef::new(
            "softmax_online",
            Op::Softmax,
            F32_ONLY,
            SOFTMAX_WG_PARAMS,
            "online softmax: max and sum fused in one pass per invocation, (max, sum) pairs merged in workgroup memory",
            WgslImpl::new(&SOFTMAX_ONLINE, prepare_softmax_rows).shared(shared_wg_pairs).check(check_rows_grid),
        ),
        KernelDef::new(
            "softmax_subgroup",
            Op::Softmax,
            F32_ONLY,
            SOFTMAX_SG_PARAMS,
            "online softmax, one subgroup per row (subgroupMax + subgroupAdd), several rows per workgroup, no barriers",
            WgslImpl::new(&SOFTMAX_SG, prepare_softmax_sg).subgroups().check(check_softmax_sg),
        ),
        KernelDef::new(
            "softmax_rows_cpu",
            Op::Softmax,
            F32_ONLY,
            ROWS_PARAMS,
            "three-pass SIMD row microkernel (max, exp and sum, scale); pool over rows (prefill)",
            CpuImpl { run: run_softmax_rows, check: check_isa },
        ),
        KernelDef::new(
            "softmax_split_cpu",
            Op::Softmax,
            F32_ONLY,
            SPLIT_PARAMS,
            "online (max, sum) SIMD pass over feature chunks in parallel, merged, then a parallel write (decode: few long rows)",
            CpuImpl { run: run_softmax_split, check: check_isa },
        ),
        // residual_add
        KernelDef::new(
            "residual_add_scalar",
            Op::ResidualAdd,
            F32_ONLY,
            SCALAR_PARAMS,
            "one element per invocation, any n",
            WgslImpl::new(&SCALAR, prepare_scalar).check(check_scalar),
        ),
        KernelDef::new(
            "residual_add_vec4",
            Op::ResidualAdd,
            F32_ONLY,
            VEC4_PARAMS,
            "16-byte vec4 loads, vec_per_thread vec4s per invocation; n % 4 == 0",
            WgslImpl::new(&VEC4, prepare_vec4).check(check_vec4),
        ),
        KernelDef::new(
            "residual_add_simd_cpu",
            Op::ResidualAdd,
            F32_ONLY,
            ELEM_CPU_PARAMS,
            "explicit SIMD add (AVX-512/AVX2/portable); pool over element chunks",
            CpuImpl { run: run_add_simd, check: check_isa },
        ),
        KernelDef::new(
            "residual_add_static_cpu",
            Op::ResidualAdd,
            F32_ONLY,
            STATIC_CPU_PARAMS,
            "autovectorised add over one static contiguous range per thread (threads = 1: single-threaded)",
            CpuImpl { run: run_add_static, check: check_threads },
        ),
    ]
}

// ---------------------------------------------------------------------------------
// CPU microkernels
// ---------------------------------------------------------------------------------

const GELU_K: f32 = 1.595_769; // 2 * sqrt(2 / pi)

/// The sigmoid argument of the activation: `act(g) = g * sigmoid(k(g))`
/// (gelu_tanh: `0.5 (1 + tanh(z)) = sigmoid(2z)`).
#[inline(always)]
fn act_arg<L: Lanes>(l: L, act: Activation, g: L::V) -> L::V {
    match act {
        Activation::Silu => g,
        Activation::GeluTanh => {
            let g2 = l.mul(g, g);
            l.mul(l.mul(g, l.splat(GELU_K)), l.fma(g2, l.splat(0.044715), l.splat(1.0)))
        }
    }
}

/// The activation in scalar f32 with libm's exp.
#[inline]
pub(crate) fn act_scalar(act: Activation, g: f32) -> f32 {
    let k = match act {
        Activation::Silu => g,
        Activation::GeluTanh => GELU_K * g * (1.0 + 0.044715 * g * g),
    };
    g / (1.0 + (-k).exp())
}

/// `y = act(gate) * up` over equal-length slices.
#[inline(always)]
fn gated_k<L: Lanes>(l: L, act: Activation, gate: &[f32], up: &[f32], y: &mut [f32]) {
    let n = y.len();
    let (gate, up) = (&gate[..n], &up[..n]);
    // A function, not a closure: a closure does not inherit the target features
    // of the `isa_dispatch!` function it is inlined into, so its intrinsics
    // would be calls (perf showed `_mm512_fmadd_ps` out of line, ~10% of a
    // decode batch).
    #[inline(always)]
    fn one<L: Lanes>(l: L, act: Activation, gc: &[f32], uc: &[f32], yc: &mut [f32]) {
        let g = l.load(gc);
        let e = lanes::exp(l, l.sub(l.splat(0.0), act_arg(l, act, g)));
        l.store(yc, l.div(l.mul(g, l.load(uc)), l.add(l.splat(1.0), e)));
    }
    let mut ys = y.chunks_exact_mut(L::N);
    for ((yc, gc), uc) in (&mut ys).zip(gate.chunks_exact(L::N)).zip(up.chunks_exact(L::N)) {
        one(l, act, gc, uc, yc);
    }
    // The tail through one padded vector, the same arithmetic: an element's
    // value does not depend on where it stands in the call (a decode batch's
    // features and a lone decode's fall differently into vectors).
    let t = n - n % L::N;
    let rest = ys.into_remainder();
    if !rest.is_empty() {
        let (mut g, mut u, mut o) = ([0f32; 16], [0f32; 16], [0f32; 16]);
        g[..rest.len()].copy_from_slice(&gate[t..]);
        u[..rest.len()].copy_from_slice(&up[t..]);
        one(l, act, &g[..L::N], &u[..L::N], &mut o[..L::N]);
        rest.copy_from_slice(&o[..rest.len()]);
    }
}

/// `y = a + b` over equal-length slices.
#[inline(always)]
fn add_k<L: Lanes>(l: L, a: &[f32], b: &[f32], y: &mut [f32]) {
    let n = y.len();
    let (a, b) = (&a[..n], &b[..n]);
    let mut ys = y.chunks_exact_mut(L::N);
    for ((yc, ac), bc) in (&mut ys).zip(a.chunks_exact(L::N)).zip(b.chunks_exact(L::N)) {
        l.store(yc, l.add(l.load(ac), l.load(bc)));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = a[t + i] + b[t + i];
    }
}

/// Row maximum.
#[inline(always)]
fn max_k<L: Lanes>(l: L, x: &[f32]) -> f32 {
    let mut m = l.splat(f32::MIN);
    let mut xs = x.chunks_exact(L::N);
    for c in &mut xs {
        m = l.max(m, l.load(c));
    }
    xs.remainder().iter().fold(l.hmax(m), |a, &v| if v > a { v } else { a })
}

/// `y = exp(y - m)` in place; returns the sum of `y`.
#[inline(always)]
fn exp_sum_k<L: Lanes>(l: L, y: &mut [f32], m: f32) -> f32 {
    let mv = l.splat(m);
    let mut acc = l.splat(0.0);
    let mut ys = y.chunks_exact_mut(L::N);
    for yc in &mut ys {
        let e = lanes::exp(l, l.sub(l.load(yc), mv));
        acc = l.add(acc, e);
        l.store(yc, e);
    }
    let mut s = l.hsum(acc);
    for o in ys.into_remainder() {
        *o = (*o - m).exp();
        s += *o;
    }
    s
}

/// `y *= s`.
#[inline(always)]
fn scale_k<L: Lanes>(l: L, y: &mut [f32], s: f32) {
    let sv = l.splat(s);
    let mut ys = y.chunks_exact_mut(L::N);
    for yc in &mut ys {
        let v = l.mul(l.load(yc), sv);
        l.store(yc, v);
    }
    for o in ys.into_remainder() {
        *o *= s;
    }
}

/// `y = exp(x - m) * s`.
#[inline(always)]
fn exp_scale_k<L: Lanes>(l: L, x: &[f32], m: f32, s: f32, y: &mut [f32]) {
    let n = y.len();
    let x = &x[..n];
    let (mv, sv) = (l.splat(m), l.splat(s));
    let mut ys = y.chunks_exact_mut(L::N);
    for (yc, xc) in (&mut ys).zip(x.chunks_exact(L::N)) {
        l.store(yc, l.mul(lanes::exp(l, l.sub(l.load(xc), mv)), sv));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = (x[t + i] - m).exp() * s;
    }
}

/// Online softmax statistics of a slice: `(max, sum of exp(x - max))`, each lane
/// running its own recurrence, merged at the end. `(f32::MIN, 0)` when empty.
#[inline(always)]
fn online_k<L: Lanes>(l: L, x: &[f32]) -> (f32, f32) {
    let mut m = l.splat(f32::MIN);
    let mut s = l.splat(0.0);
    let mut xs = x.chunks_exact(L::N);
    for c in &mut xs {
        let v = l.load(c);
        let mn = l.max(m, v);
        s = l.fma(s, lanes::exp(l, l.sub(m, mn)), lanes::exp(l, l.sub(v, mn)));
        m = mn;
    }
    let (mut mb, mut sb) = ([0f32; 16], [0f32; 16]);
    l.store(&mut mb[..L::N], m);
    l.store(&mut sb[..L::N], s);
    let mut acc = (f32::MIN, 0.0);
    for i in 0..L::N {
        acc = merge_stats(acc, (mb[i], sb[i]));
    }
    for &v in xs.remainder() {
        acc = merge_stats(acc, (v, 1.0));
    }
    acc
}

// ---------------------------------------------------------------------------------
// CPU kernels
// ---------------------------------------------------------------------------------

/// `y = act(gate) * up` with the SIMD exponential (what the fused gate/up kernels
/// apply to their blocks of features, as the separate activation kernel does).
pub(crate) fn gated_simd(isa: Isa, act: Activation, gate: &[f32], up: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (act: Activation = act, gate: &[f32] = gate, up: &[f32] = up, y: &mut [f32] = y) -> () {
        gated_k(l, act, gate, up, y)
    })
}

fn run_gated_simd(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GatedAct { rows, dim, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (gate, up) = (a.ins[0].f32(), a.ins[1].f32());
    par_elems(&mut a.outs[0][..rows * dim], param(params, "elems_per_task")? as usize, |first, y| {
        gated_simd(isa, act, &gate[first..], &up[first..], y)
    });
    Ok(())
}

fn run_gated_static(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GatedAct { rows, dim, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let (gate, up) = (a.ins[0].f32(), a.ins[1].f32());
    static_ranges(&mut a.outs[0][..rows * dim], param(params, "threads")?, |first, y| {
        for (i, o) in y.iter_mut().enumerate() {
            *o = act_scalar(act, gate[first + i]) * up[first + i];
        }
    });
    Ok(())
}

fn add_simd(isa: Isa, a: &[f32], b: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (a: &[f32] = a, b: &[f32] = b, y: &mut [f32] = y) -> () { add_k(l, a, b, y) })
}

fn run_add_simd(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualAdd { n } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    par_elems(&mut a.outs[0][..n], param(params, "elems_per_task")? as usize, |first, y| add_simd(isa, &x[first..], &r[first..], y));
    Ok(())
}

fn run_add_static(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualAdd { n } = *prob else { return Err(wrong_op(kd, prob)) };
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    static_ranges(&mut a.outs[0][..n], param(params, "threads")?, |first, y| {
        let len = y.len();
        for ((o, u), v) in y.iter_mut().zip(&x[first..first + len]).zip(&r[first..first + len]) {
            *o = u + v;
        }
    });
    Ok(())
}

/// Softmax of one row into `y` ([`softmax_in_place`] of a copy).
pub(crate) fn softmax_row(isa: Isa, x: &[f32], y: &mut [f32]) {
    y.copy_from_slice(&x[..y.len()]);
    softmax_in_place(isa, y)
}

/// Softmax of one row in place, three SIMD passes: max, exp and sum, scale (a
/// decode attention's scores too).
pub(crate) fn softmax_in_place(isa: Isa, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (y: &mut [f32] = y) -> () {
        let m = max_k(l, y);
        let s = exp_sum_k(l, y, m);
        scale_k(l, y, 1.0 / s);
    })
}

fn online_stats(isa: Isa, x: &[f32]) -> (f32, f32) {
    isa_dispatch!(isa, |l| (x: &[f32] = x) -> (f32, f32) { online_k(l, x) })
}

fn exp_scale(isa: Isa, x: &[f32], m: f32, s: f32, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, m: f32 = m, s: f32 = s, y: &mut [f32] = y) -> () { exp_scale_k(l, x, m, s, y) })
}

fn run_softmax_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Softmax { rows, dim } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let x = a.ins[0].f32();
    par_rows(&mut a.outs[0][..rows * dim], dim, RowSplit::of(params)?, |first, ys| {
        for (r, y) in ys.chunks_mut(dim).enumerate() {
            softmax_row(isa, &x[(first + r) * dim..][..dim], y);
        }
    });
    Ok(())
}

fn run_softmax_split(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Softmax { rows, dim } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let chunk = (param(params, "chunk")? as usize).max(1);
    let x = a.ins[0].f32();
    for (r, y) in a.outs[0][..rows * dim].chunks_mut(dim.max(1)).enumerate() {
        let xr = &x[r * dim..][..dim];
        let (m, s) = pool::map_reduce(xr, chunk, (f32::MIN, 0.0), |c| online_stats(isa, c), merge_stats);
        let inv = 1.0 / s;
        pool::for_chunks_mut(y, chunk, |i, yc| exp_scale(isa, &xr[i * chunk..], m, inv, yc));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

fn shared_wg_pairs(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(8 * param(params, "workgroup_size")? as u64)
}

/// Elements of an elementwise problem.
fn elems(prob: &Problem) -> usize {
    match *prob {
        Problem::GatedAct { rows, dim, .. } => rows * dim,
        Problem::ResidualAdd { n } => n,
        Problem::Softmax { rows, dim } => rows * dim,
        _ => 0,
    }
}

fn check_scalar(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    grid_fits(caps, groups(elems(prob), param(params, "workgroup_size")?) as usize, "one per workgroup_size elements")
}

fn check_vec4(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let n = elems(prob);
    if !n.is_multiple_of(4) {
        return Err(format!("n = {n} elements is not a multiple of 4 (the buffers are read as vec4<f32>)"));
    }
    let per = param(params, "workgroup_size")? * param(params, "vec_per_thread")?;
    grid_fits(caps, groups(n / 4, per) as usize, "one per workgroup_size * vec_per_thread vec4s")
}

fn check_rows_grid(caps: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    match *prob {
        Problem::Softmax { rows, .. } => grid_fits(caps, rows, "one per row"),
        _ => Ok(()),
    }
}

fn check_softmax_sg(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    match *prob {
        Problem::Softmax { rows, .. } => grid_fits(caps, groups(rows, param(params, "rows_per_wg")?) as usize, "one per rows_per_wg rows"),
        _ => Ok(()),
    }
}

/// The entry point, element count and `ACT` constant of a gated_act or residual_add
/// problem (the elementwise shaders hold both ops).
fn elementwise_call(s: &WgslSetup<'_>) -> Result<(&'static str, usize, u32), KernelError> {
    match *s.problem {
        Problem::GatedAct { rows, dim, act } => Ok(("gated_act", rows * dim, act.code())),
        Problem::ResidualAdd { n } => Ok(("residual_add", n, 0)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn softmax_dims(s: &WgslSetup<'_>) -> Result<(usize, usize), KernelError> {
    match *s.problem {
        Problem::Softmax { rows, dim } => Ok((rows, dim)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

/// `*_scalar`: one element per invocation.
fn prepare_scalar(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (entry, n, act) = elementwise_call(s)?;
    let wg = s.param("workgroup_size")?;
    let consts = [("WG", wg as f64), ("ACT", act as f64)];
    s.one_step(entry, &consts, &[n as u32], grid_2d(groups(n, wg)))
}

/// `*_vec4`: `vec_per_thread` vec4s per invocation.
fn prepare_vec4(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (entry, n, act) = elementwise_call(s)?;
    let (wg, vpt) = (s.param("workgroup_size")?, s.param("vec_per_thread")?);
    let consts = [("WG", wg as f64), ("VPT", vpt as f64), ("ACT", act as f64)];
    s.one_step(entry, &consts, &[(n / 4) as u32], grid_2d(groups(n / 4, wg * vpt)))
}

/// `softmax_wg` and `softmax_online`: one workgroup per row.
fn prepare_softmax_rows(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, dim) = softmax_dims(s)?;
    let consts = [("WG", s.param("workgroup_size")? as f64)];
    s.one_step("main", &consts, &[rows as u32, dim as u32], grid_2d(rows as u32))
}

fn prepare_softmax_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, dim) = softmax_dims(s)?;
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", per as f64)];
    s.one_step("main", &consts, &[rows as u32, dim as u32], grid_2d(groups(rows, per)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isas() -> Vec<Isa> {
        vec![Isa::Scalar, Isa::from_param(2), Isa::best()]
    }

    fn data(n: usize, seed: u64) -> Vec<f32> {
        crate::kernels::cpu::testdata::uniform(n, seed, -4.0, 4.0)
    }

    #[test]
    fn vector_exp_matches_libm_on_every_isa() {
        let x: Vec<f32> = (0..4000).map(|i| -90.0 + i as f32 * 0.0445).collect();
        for isa in isas() {
            let mut y = vec![0f32; x.len()];
            // exp_scale with m = 0, s = 1 is exp itself (tail included)
            exp_scale(isa, &x, 0.0, 1.0, &mut y);
            for (v, e) in x.iter().zip(&y) {
                let want = (*v as f64).exp();
                if *v > -87.0 {
                    assert!(((*e as f64) - want).abs() <= 5e-7 * want, "{isa:?} exp({v}) = {e}, want {want}");
                } else {
                    assert!(*e < 1e-37, "{isa:?} exp({v}) = {e}");
                }
            }
        }
    }

    #[test]
    fn gated_and_softmax_microkernels_agree_across_isas() {
        for n in [0, 1, 7, 8, 15, 16, 17, 33, 100, 1027] {
            let (g, u) = (data(n, 1), data(n, 7));
            for act in [Activation::Silu, Activation::GeluTanh] {
                let want: Vec<f64> = g.iter().zip(&u).map(|(g, u)| act.apply_f64(*g as f64) * *u as f64).collect();
                for isa in isas() {
                    let mut y = vec![0f32; n];
                    gated_simd(isa, act, &g, &u, &mut y);
                    for i in 0..n {
                        assert!((y[i] as f64 - want[i]).abs() < 1e-5, "{isa:?} {act:?} n={n} i={i}");
                    }
                }
            }
            if n == 0 {
                continue;
            }
            let m = g.iter().cloned().fold(f64::MIN, |a, b| a.max(b as f64));
            let z: f64 = g.iter().map(|v| (*v as f64 - m).exp()).sum();
            for isa in isas() {
                let mut y = vec![0f32; n];
                softmax_row(isa, &g, &mut y);
                let (om, os) = online_stats(isa, &g);
                assert!((om as f64 - m).abs() < 1e-6 && (os as f64 - z).abs() < 1e-5 * z, "{isa:?} online n={n}");
                for i in 0..n {
                    assert!((y[i] as f64 - (g[i] as f64 - m).exp() / z).abs() < 1e-6, "{isa:?} softmax n={n}");
                }
            }
        }
    }
}
