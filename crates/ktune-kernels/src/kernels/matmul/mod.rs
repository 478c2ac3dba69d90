//! The matrix-matrix family: prefill GEMM, `y[m,n] = x[m,k] · w[n,k]ᵀ` (a Hugging Face
//! Linear, weight row-major `[n,k]`): the op that bounds prefill speed, judged in
//! GFLOP/s.
//!
//! WGSL: `gemm_simple` (one column and `rows_per_thread` rows per invocation, scalar
//! loads, any shape) and `gemm_tiled` (workgroup-memory tiles of x and w staged with
//! 16-byte loads, each invocation accumulating a `reg_m x reg_n` register block),
//! `gemm_coop16` / `gemm_coop8` / `gemm_mma_emu` (the matrix-tile GEMM on
//! cooperative matrices and its plain-loop emulation, shared with the block formats
//! and gate_up: [`mma`]).
//! CPU: `gemm_blocked_cpu` (our own cache-blocked GEMM: x packed into MR-row panels,
//! w packed into NR-row panels with f16 → f32 conversion, an MR x NR register-blocked
//! FMA microkernel, rayon over tokens or features) and `gemm_crate_cpu` (the `gemm`
//! crate, as the yardstick the tuner measures ours against). Block-format weights:
//! [`quant`]. The register-blocked microkernels and w packing stay here: they are
//! GEMM-specific (the quantized panel kernel reuses them).

pub mod mma;
pub mod quant;

use std::cell::RefCell;

use half::f16;
use rayon::prelude::*;

use super::cpu::{self, ISA, Isa, with_scratch};
use super::wgsl::vec_alignment;
use super::{CpuArgs, CpuImpl, CpuIn, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, param, wrong_op};
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, groups};
use crate::shader;

static GEMM_SIMPLE: Shader = shader!("gemm_simple.wgsl", "gemm_col.wgsl", "wload.wgsl");
static GEMM_TILED: Shader = shader!(head "gemm_tiling.wgsl"; "gemm_tiled.wgsl", "gemm_tile.wgsl", "wload.wgsl");

pub(crate) const SIMPLE_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_x", values: &[8, 16, 32, 64], default: 16, help: "invocations per workgroup along n (columns of y)" },
    ParamSpec { name: "workgroup_y", values: &[1, 2, 4, 8, 16], default: 4, help: "invocations per workgroup along m (rows of y)" },
    ParamSpec { name: "rows_per_thread", values: &[1, 2, 4], default: 1, help: "rows of y per invocation, sharing each weight load" },
];

pub(crate) const TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "tile_m", values: &[16, 32, 64, 128], default: 64, help: "rows of y per workgroup" },
    ParamSpec { name: "tile_n", values: &[16, 32, 64, 128], default: 64, help: "columns of y per workgroup" },
    ParamSpec { name: "tile_k", values: &[8, 16, 32], default: 16, help: "depth of the x and w tiles staged in workgroup memory per step" },
    ParamSpec { name: "reg_m", values: &[4, 8], default: 4, help: "rows of y per invocation (register block)" },
    ParamSpec { name: "reg_n", values: &[4, 8], default: 4, help: "columns of y per invocation (register block)" },
];

pub(crate) const BLOCKED_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("mc", &[48, 96, 144, 192, 384], 96, "rows of x per L2 block (and per task when splitting tokens)"),
    ParamSpec::new("nc", &[64, 128, 256, 512, 1024], 256, "rows of w per packed block (and per task when splitting features)"),
    ParamSpec { name: "kc", values: &[64, 128, 256, 384, 512], default: 256, help: "depth of a packed block (k per pass)" },
    ParamSpec {
        name: "split",
        values: &[0, 1, 2],
        default: 0,
        help: "rayon split: 0 auto (features unless n is too narrow, balanced), 1 tokens (m) by mc, 2 features (n) by nc",
    },
    ISA,
];

const CRATE_PARAMS: &[ParamSpec] = &[ParamSpec::new(
    "threads",
    &[0, 1, 2, 4],
    0,
    "gemm crate parallelism: 0 Rayon over the whole pool, 1 Parallelism::None, t > 1 Rayon(t)",
)];

pub fn variants() -> Vec<KernelDef> {
    let mut v = vec![
        KernelDef::new(
            "gemm_simple",
            Op::Gemm,
            DType::FLOAT,
            SIMPLE_PARAMS,
            "one column and rows_per_thread rows of y per invocation, scalar loads, any shape",
            WgslImpl::new(&GEMM_SIMPLE, prepare_simple).workgroup(simple_wg).check(check_simple),
        ),
        KernelDef::new(
            "gemm_tiled",
            Op::Gemm,
            DType::FLOAT,
            TILED_PARAMS,
            "x and w tiles in workgroup memory via 16-byte loads, reg_m x reg_n outputs per invocation",
            WgslImpl::new(&GEMM_TILED, prepare_tiled).workgroup(tiled_wg).shared(tiled_shared).check(check_tiled),
        ),
        KernelDef::new(
            "gemm_blocked_cpu",
            Op::Gemm,
            DType::FLOAT,
            BLOCKED_PARAMS,
            "cache-blocked, packed panels (f16 widened while packing), MR x NR FMA microkernel; rayon over tokens or features",
            CpuImpl { run: run_blocked, check: check_blocked },
        ),
        KernelDef::new(
            "gemm_crate_cpu",
            Op::Gemm,
            DType::FLOAT,
            CRATE_PARAMS,
            "the `gemm` crate (f16 weights widened to f32 first), the yardstick for gemm_blocked_cpu",
            CpuImpl { run: run_crate, check: crate::kernels::cpu_any },
        ),
    ];
    // the matrix-tile GEMMs (mma.rs) after the SIMT ones
    v.splice(2..2, mma::gemm_variants());
    v
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

pub(crate) fn simple_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "workgroup_x")?, param(params, "workgroup_y")?, 1])
}

fn tiled_threads(params: &Params) -> Result<(u32, u32), KernelError> {
    let (tm, tn) = (param(params, "tile_m")?, param(params, "tile_n")?);
    let (rm, rn) = (param(params, "reg_m")?.max(1), param(params, "reg_n")?.max(1));
    Ok((tm / rm, tn / rn))
}

pub(crate) fn tiled_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    let (ty, tx) = tiled_threads(params)?;
    Ok([tx * ty, 1, 1])
}

/// The x tile `[tile_m, tile_k]` and the w tile `[tile_n, tile_k]` as f32, each row
/// padded by one vec4 (16 bytes) against bank conflicts.
pub(crate) fn tiled_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let (tm, tn, tk) = (param(params, "tile_m")? as u64, param(params, "tile_n")? as u64, param(params, "tile_k")? as u64);
    Ok(16 * (tm + tn) * (tk / 4 + 1))
}

fn gemm_dims(prob: &Problem) -> Option<(usize, usize, usize)> {
    match *prob {
        Problem::Gemm { m, n, k } => Some((m, n, k)),
        _ => None,
    }
}

fn dims(s: &WgslSetup<'_>) -> Result<(usize, usize, usize), KernelError> {
    gemm_dims(s.problem).ok_or_else(|| wrong_op(s.kernel, s.problem))
}

/// Workgroup counts along x (columns of y) and y (rows of y) against the adapter's
/// per-dimension limit (this family dispatches 2D grids: no linearised index).
fn check_grid(caps: &GpuCaps, gx: u32, gy: u32) -> Result<(), String> {
    let lim = caps.max_workgroups_per_dimension;
    if gx > lim || gy > lim {
        return Err(format!("needs a {gx}x{gy} grid of workgroups, over the adapter's {lim} per dimension"));
    }
    Ok(())
}

pub(crate) fn simple_grid(m: usize, n: usize, params: &Params) -> Result<(u32, u32), KernelError> {
    let rows = param(params, "workgroup_y")? * param(params, "rows_per_thread")?;
    Ok((groups(n, param(params, "workgroup_x")?), groups(m, rows)))
}

fn check_simple(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let Some((m, n, _)) = gemm_dims(prob) else { return Ok(()) };
    simple_rules(caps, m, n, params)
}

/// The column GEMM's grid (`gemm_col.wgsl`) for a `[m, n]` output.
pub(crate) fn simple_rules(caps: &GpuCaps, m: usize, n: usize, params: &Params) -> Result<(), String> {
    let (gx, gy) = simple_grid(m, n, params)?;
    check_grid(caps, gx, gy)
}

/// The rules of the `gemm_tile.wgsl` body: whole register blocks, at most 8x8 of
/// them, whole 16-byte f16 loads per tile step, k in whole 16-byte loads, the grid.
pub(crate) fn tiled_rules(caps: &GpuCaps, m: usize, n: usize, k: usize, dtype: DType, params: &Params) -> Result<(), String> {
    let (tm, tn, tk) = (param(params, "tile_m")?, param(params, "tile_n")?, param(params, "tile_k")?);
    let (rm, rn) = (param(params, "reg_m")?, param(params, "reg_n")?);
    if rm == 0 || rn == 0 || tm % rm != 0 || tn % rn != 0 {
        return Err(format!("tile {tm}x{tn} is not a whole number of {rm}x{rn} register blocks"));
    }
    if rm > 8 || rn > 8 {
        return Err(format!("register block {rm}x{rn} exceeds the shader's 8x8 accumulator array"));
    }
    if tk % 8 != 0 {
        return Err(format!("tile_k = {tk} is not a multiple of 8 (one 16-byte load of f16 weights)"));
    }
    vec_alignment(k, dtype)?;
    let (gx, gy) = tiled_grid(m, n, params)?;
    check_grid(caps, gx, gy)
}

/// The override constants of the `gemm_tile.wgsl` body.
pub(crate) fn tiled_consts(params: &Params, w_f16: f64) -> Result<[(&'static str, f64); 7], KernelError> {
    let [wgs, _, _] = tiled_wg(params)?;
    Ok([
        ("TILE_M", param(params, "tile_m")? as f64),
        ("TILE_N", param(params, "tile_n")? as f64),
        ("TILE_K", param(params, "tile_k")? as f64),
        ("REG_M", param(params, "reg_m")? as f64),
        ("REG_N", param(params, "reg_n")? as f64),
        ("WGS", wgs as f64),
        ("W_F16", w_f16),
    ])
}

/// The override constants of the `gemm_col.wgsl` body.
pub(crate) fn simple_consts(params: &Params, w_f16: f64) -> Result<[(&'static str, f64); 4], KernelError> {
    Ok([
        ("WG_X", param(params, "workgroup_x")? as f64),
        ("WG_Y", param(params, "workgroup_y")? as f64),
        ("ROWS", param(params, "rows_per_thread")? as f64),
        ("W_F16", w_f16),
    ])
}

fn prepare_simple(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (m, n, k) = dims(s)?;
    let consts = simple_consts(s.params, s.w_f16())?;
    let (gx, gy) = simple_grid(m, n, s.params)?;
    s.one_step("main", &consts, &[m as u32, n as u32, k as u32], [gx.max(1), gy.max(1), 1])
}

pub(crate) fn tiled_grid(m: usize, n: usize, params: &Params) -> Result<(u32, u32), KernelError> {
    Ok((groups(n, param(params, "tile_n")?), groups(m, param(params, "tile_m")?)))
}

fn check_tiled(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    match gemm_dims(prob) {
        Some((m, n, k)) => tiled_rules(caps, m, n, k, dtype, params),
        // (no shape: the parameter rules alone, on a problem k = 8 always meets)
        None => tiled_rules(caps, 0, 0, 8, dtype, params),
    }
}

fn prepare_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (m, n, k) = dims(s)?;
    let consts = tiled_consts(s.params, s.w_f16())?;
    let (gx, gy) = tiled_grid(m, n, s.params)?;
    s.one_step("main", &consts, &[m as u32, n as u32, k as u32], [gx.max(1), gy.max(1), 1])
}

// ---------------------------------------------------------------------------------
// CPU: orchestration
// ---------------------------------------------------------------------------------

fn check_blocked(_: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)
}

/// Cache block sizes of [`gemm_blocked`]; rounded up to the microkernel's MR / NR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub mc: usize,
    pub nc: usize,
    pub kc: usize,
}

/// How [`gemm_blocked`] spreads work over the rayon pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Features unless n has fewer blocks than threads and m has more; block widths
    /// capped so every thread gets several tasks.
    Auto,
    /// Token-parallel (prefill): tasks of `mc` rows of x/y; each packs w itself.
    Tokens,
    /// Feature-parallel: tasks of `nc` rows of w (columns of y); x packed once, shared.
    Features,
}

impl Split {
    pub fn from_param(v: u32) -> Split {
        match v {
            1 => Split::Tokens,
            2 => Split::Features,
            _ => Split::Auto,
        }
    }
}

fn run_blocked(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let micro = Micro::for_isa(Isa::of(params)?);
    let blk = Blocking { mc: param(params, "mc")? as usize, nc: param(params, "nc")? as usize, kc: param(params, "kc")? as usize };
    let split = Split::from_param(param(params, "split")?);
    gemm_blocked(micro, blk, split, m, n, k, a.ins[0].f32(), a.ins[1], &mut a.outs[0][..m * n]);
    Ok(())
}

thread_local! {
    /// Packed x of the calling thread (shared read-only with the tasks it spawns).
    static PACK_X: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Packed w block of one rayon task.
    static PACK_W: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// f16 weights widened for the `gemm` crate.
    static WIDE_W: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y` shared by feature-parallel tasks that write disjoint column ranges.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks holding a copy write disjoint elements of the buffer (see `gemm_blocked`),
// and the buffer outlives the rayon scope that uses it.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// The GEMM driver: packs x once into MR-row panels per `kc` block, then runs tasks
/// (token or feature ranges) that pack `nc x kc` blocks of w into NR-row panels and
/// sweep the microkernel over them (BLIS loop order jc → pc → ic → jr → ir).
#[allow(clippy::too_many_arguments)]
pub fn gemm_blocked(micro: Micro, blk: Blocking, split: Split, m: usize, n: usize, k: usize, x: &[f32], w: CpuIn<'_>, y: &mut [f32]) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        y[..m * n].fill(0.0);
        return;
    }
    let (mr, nr) = (micro.mr(), micro.nr());
    let threads = cpu::pool::pool().threads().max(1);
    let mut mc = blk.mc.max(1).next_multiple_of(mr);
    let mut nc = blk.nc.max(1).next_multiple_of(nr);
    let kc = blk.kc.max(1);
    let tokens = match split {
        Split::Tokens => true,
        Split::Features => false,
        Split::Auto => {
            let (n_tasks, m_tasks) = (n.div_ceil(nc), m.div_ceil(mc));
            let tokens = n_tasks < threads && m_tasks > n_tasks;
            // several tasks per thread so uneven tails balance out
            if tokens {
                mc = mc.min(m.div_ceil(2 * threads).next_multiple_of(mr));
            } else {
                nc = nc.min(n.div_ceil(4 * threads).next_multiple_of(nr));
            }
            tokens
        }
    };
    let mp = m.next_multiple_of(mr);
    with_scratch(&PACK_X, mp * k, |xp| {
        pack_x(x, m, k, kc, mr, xp);
        let xp: &[f32] = xp;
        let job = Job { micro, m, n, k, kc, mc, mp, x: xp, w };
        if tokens {
            cpu::pool::for_chunks_mut(&mut y[..m * n], mc * n, |t, rows| {
                let i0 = t * mc;
                let mb = rows.len() / n;
                // SAFETY: `rows` is exactly y rows i0..i0+mb.
                unsafe { job.block(i0, mb, 0, n, nc, SharedOut(rows.as_mut_ptr()), n) };
            });
        } else {
            let out = SharedOut(y.as_mut_ptr());
            cpu::pool::for_each(n.div_ceil(nc), |t| {
                let j0 = t * nc;
                let nb = nc.min(n - j0);
                // SAFETY: every task writes only columns j0..j0+nb of all m rows of y
                // (m x n, row stride n); the ranges of different tasks are disjoint.
                unsafe { job.block(0, m, j0, nb, nb, out, n) };
            });
        }
    });
}

/// What every task of one GEMM call shares.
struct Job<'a> {
    micro: Micro,
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
    mc: usize,
    /// m rounded up to MR (rows of packed x).
    mp: usize,
    /// x packed by [`pack_x`].
    x: &'a [f32],
    w: CpuIn<'a>,
}

impl Job<'_> {
    /// Computes y rows `i0..i0+mb` x columns `j0..j0+nb` in column blocks of `nc`.
    /// `out` points at y row `i0`, column 0, with row stride `ldy`.
    ///
    /// # Safety
    /// `out` must be valid for writes of rows `0..mb` x columns `j0..j0+nb` at row
    /// stride `ldy`, and no other thread may touch those elements during the call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(&self, i0: usize, mb: usize, j0: usize, nb: usize, nc: usize, out: SharedOut, ldy: usize) {
        let (mr, nr) = (self.micro.mr(), self.micro.nr());
        let ncp = nc.next_multiple_of(nr);
        with_scratch(&PACK_W, ncp * self.kc.min(self.k), |wp| {
            let mut jc = j0;
            while jc < j0 + nb {
                let nbc = nc.min(j0 + nb - jc);
                let mut pc = 0;
                while pc < self.k {
                    let kb = self.kc.min(self.k - pc);
                    pack_w(self.micro, self.w, self.n, self.k, jc, nbc, pc, kb, wp);
                    let xblock = &self.x[pc * self.mp..][..self.mp * kb];
                    let mut ic = 0;
                    while ic < mb {
                        let mcb = self.mc.min(mb - ic);
                        for s in 0..nbc.div_ceil(nr) {
                            let bpan = &wp[s * nr * kb..][..nr * kb];
                            let col = jc + s * nr;
                            let cols = nr.min(self.n - col).min(j0 + nb - col);
                            let mut ir = 0;
                            while ir < mcb {
                                let row = i0 + ic + ir;
                                let rows = mr.min(self.m - row).min(mb - ic - ir);
                                let apan = &xblock[(row / mr) * mr * kb..][..mr * kb];
                                // SAFETY: the tile is rows ic+ir.. (< mb) x columns
                                // col.. (< j0+nb) of `out`, per the caller's contract.
                                unsafe {
                                    let c = out.0.add((ic + ir) * ldy + col);
                                    self.tile(kb, apan, bpan, c, ldy, rows, cols, pc > 0);
                                }
                                ir += mr;
                            }
                        }
                        ic += mcb;
                    }
                    pc += kb;
                }
                jc += nbc;
            }
        });
    }

    /// One MR x NR tile; partial tiles go through a local buffer.
    ///
    /// # Safety
    /// `c` valid for `rows` rows of `cols` floats at stride `ldc`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn tile(&self, kb: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize, rows: usize, cols: usize, add: bool) {
        let (mr, nr) = (self.micro.mr(), self.micro.nr());
        if rows == mr && cols == nr {
            // SAFETY: full tile inside y (caller), panels hold kb*MR / kb*NR floats.
            unsafe { self.micro.run(kb, a, b, c, ldc, add) };
            return;
        }
        let mut tmp = [0f32; MAX_TILE];
        // SAFETY: tmp holds MR x NR floats at stride NR (MR*NR <= MAX_TILE).
        unsafe { self.micro.run(kb, a, b, tmp.as_mut_ptr(), nr, false) };
        for i in 0..rows {
            // SAFETY: row i < rows, columns < cols, inside the caller's tile.
            let dst = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), cols) };
            let src = &tmp[i * nr..][..cols];
            if add {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            } else {
                dst.copy_from_slice(src);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// CPU: packing
// ---------------------------------------------------------------------------------

/// Packs `x[m,k]` for the microkernel: per `kc` block starting at `pc` (depth
/// `kb`), MR-row panels, each depth-major: `out[pc*mp + q*MR*kb + p*MR + i] =
/// x[q*MR + i, pc + p]`, zero past row m (`mp` = m rounded up to MR).
pub fn pack_x(x: &[f32], m: usize, k: usize, kc: usize, mr: usize, out: &mut [f32]) {
    let mp = m.next_multiple_of(mr);
    let mut pc = 0;
    while pc < k {
        let kb = kc.min(k - pc);
        cpu::pool::for_chunks_mut(&mut out[pc * mp..][..mp * kb], mr * kb, |q, panel| {
            for i in 0..mr {
                let r = q * mr + i;
                if r < m {
                    let src = &x[r * k + pc..][..kb];
                    for (pp, &v) in src.iter().enumerate() {
                        panel[pp * mr + i] = v;
                    }
                } else {
                    for pp in 0..kb {
                        panel[pp * mr + i] = 0.0;
                    }
                }
            }
        });
        pc += kb;
    }
}

/// Packs rows `j0..j0+nb` of `w[n,k]`, columns `pc..pc+kb`, into NR-row panels,
/// depth-major, widening f16: `out[s*NR*kb + p*NR + j] = w[j0 + s*NR + j, pc + p]`,
/// zero past row n. SIMD 8x8 transposes on x86 with AVX2 + F16C.
#[allow(clippy::too_many_arguments)]
pub fn pack_w(micro: Micro, w: CpuIn<'_>, n: usize, k: usize, j0: usize, nb: usize, pc: usize, kb: usize, out: &mut [f32]) {
    let nr = micro.nr();
    #[cfg(target_arch = "x86_64")]
    {
        if micro.simd_pack() {
            for s in 0..nb.div_ceil(nr) {
                let panel = &mut out[s * nr * kb..][..nr * kb];
                for g in 0..nr / 8 {
                    let r0 = j0 + s * nr + g * 8;
                    if r0 + 8 <= n {
                        // SAFETY: `simd_pack` checked AVX2 and F16C; rows r0..r0+8 exist.
                        unsafe { x86::pack8(w, k, r0, pc, kb, nr, &mut panel[g * 8..]) };
                    } else {
                        pack_rows_scalar(w, n, k, r0, 8, pc, kb, nr, &mut panel[g * 8..]);
                    }
                }
            }
            return;
        }
    }
    for s in 0..nb.div_ceil(nr) {
        let panel = &mut out[s * nr * kb..][..nr * kb];
        pack_rows_scalar(w, n, k, j0 + s * nr, nr, pc, kb, nr, panel);
    }
}

/// Scalar packing of `count` rows from `r0` into lanes `0..count` of a panel of
/// stride `nr` (`out[p*nr + j]`), zero for rows past n.
#[allow(clippy::too_many_arguments)]
fn pack_rows_scalar(w: CpuIn<'_>, n: usize, k: usize, r0: usize, count: usize, pc: usize, kb: usize, nr: usize, out: &mut [f32]) {
    for j in 0..count {
        let r = r0 + j;
        let lanes = out.iter_mut().skip(j).step_by(nr).take(kb);
        if r >= n {
            lanes.for_each(|v| *v = 0.0);
            continue;
        }
        match w {
            CpuIn::F32(s) => lanes.zip(&s[r * k + pc..][..kb]).for_each(|(d, v)| *d = *v),
            CpuIn::F16(s) => lanes.zip(&s[r * k + pc..][..kb]).for_each(|(d, v)| *d = v.to_f32()),
            CpuIn::Q(_) => lanes.enumerate().for_each(|(i, d)| *d = w.get(r * k + pc + i)),
        }
    }
}

// ---------------------------------------------------------------------------------
// CPU: microkernels
// ---------------------------------------------------------------------------------

/// Largest MR x NR of any microkernel.
const MAX_TILE: usize = 12 * 32;

/// A register-blocked microkernel: `C[MR,NR] (+)= A-panel · B-panel` over a depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Micro {
    /// Portable 6x16 (plain Rust; the compiler vectorises it for the baseline ISA,
    /// NEON on aarch64).
    Scalar,
    /// The AVX-512 geometry run by portable code, so tests cover its packing on any CPU.
    #[cfg(test)]
    ScalarWide,
    /// AVX2 + FMA, 6x16: 12 ymm accumulators.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512F, 12x32: 24 zmm accumulators.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Micro {
    pub fn for_isa(isa: Isa) -> Micro {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Micro::Avx512,
            #[cfg(target_arch = "x86_64")]
            Isa::Simd256 => Micro::Avx2,
            _ => Micro::Scalar,
        }
    }

    pub fn mr(self) -> usize {
        match self {
            Micro::Scalar => 6,
            #[cfg(test)]
            Micro::ScalarWide => 12,
            #[cfg(target_arch = "x86_64")]
            Micro::Avx2 => 6,
            #[cfg(target_arch = "x86_64")]
            Micro::Avx512 => 12,
        }
    }

    pub fn nr(self) -> usize {
        match self {
            Micro::Scalar => 16,
            #[cfg(test)]
            Micro::ScalarWide => 32,
            #[cfg(target_arch = "x86_64")]
            Micro::Avx2 => 16,
            #[cfg(target_arch = "x86_64")]
            Micro::Avx512 => 32,
        }
    }

    /// Whether w panels are packed with the AVX2 + F16C transposes.
    #[cfg(target_arch = "x86_64")]
    fn simd_pack(self) -> bool {
        matches!(self, Micro::Avx2 | Micro::Avx512) && crate::kernels::cpu::features().avx2
    }

    /// `C = A·B` (or `C += A·B` when `add`) for one MR x NR tile over depth `kc`.
    ///
    /// # Safety
    /// `a` holds `kc*MR` and `b` `kc*NR` floats; `c` is valid for MR rows of NR floats
    /// at row stride `ldc`; the variant's ISA is available (`Micro::for_isa`).
    #[inline]
    pub unsafe fn run(self, kc: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize, add: bool) {
        debug_assert!(a.len() >= kc * self.mr() && b.len() >= kc * self.nr());
        match self {
            // SAFETY: forwarded contract.
            Micro::Scalar => unsafe { micro_portable::<6, 16>(kc, a, b, c, ldc, add) },
            #[cfg(test)]
            // SAFETY: forwarded contract.
            Micro::ScalarWide => unsafe { micro_portable::<12, 32>(kc, a, b, c, ldc, add) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: forwarded contract; AVX2+FMA present (Isa::Simd256).
            Micro::Avx2 => unsafe { x86::micro_6x16_avx2(kc, a.as_ptr(), b.as_ptr(), c, ldc, add) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: forwarded contract; AVX-512F present (Isa::Avx512).
            Micro::Avx512 => unsafe { x86::micro_12x32_avx512(kc, a.as_ptr(), b.as_ptr(), c, ldc, add) },
        }
    }
}

/// Portable microkernel: MR x NR accumulators in a local array.
///
/// # Safety
/// As [`Micro::run`].
unsafe fn micro_portable<const MR: usize, const NR: usize>(kc: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize, add: bool) {
    let mut acc = [[0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(kc) {
        for (row, &av) in acc.iter_mut().zip(ap) {
            for (o, &bv) in row.iter_mut().zip(bp) {
                *o += av * bv;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i < MR of the tile, NR floats (caller contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), NR) };
        if add {
            dst.iter_mut().zip(row).for_each(|(d, s)| *d += s);
        } else {
            dst.copy_from_slice(row);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::CpuIn;

    /// One register-blocked microkernel: per depth step two NR/2-wide loads of the B
    /// panel, MR broadcasts of the A panel, 2·MR FMAs into MR x 2 vector accumulators.
    macro_rules! micro {
        ($name:ident, $feat:literal, $lanes:literal, $mr:literal, [$($r:literal)*],
         $zero:ident, $load:ident, $set1:ident, $fma:ident, $add:ident, $store:ident) => {
            /// # Safety
            /// `a` holds `kc*MR`, `b` `kc*NR` floats; `c` valid for MR rows of NR floats
            /// at stride `ldc`; the target features are available.
            #[target_feature(enable = $feat)]
            pub unsafe fn $name(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, add: bool) {
                let mut lo = [$zero(); $mr];
                let mut hi = [$zero(); $mr];
                // SAFETY: reads stay within the kc*MR / kc*NR panels, writes within the tile.
                unsafe {
                    let (mut a, mut b) = (a, b);
                    for _ in 0..kc {
                        let b0 = $load(b);
                        let b1 = $load(b.add($lanes));
                        $(
                            let av = $set1(*a.add($r));
                            lo[$r] = $fma(av, b0, lo[$r]);
                            hi[$r] = $fma(av, b1, hi[$r]);
                        )*
                        a = a.add($mr);
                        b = b.add(2 * $lanes);
                    }
                    $(
                        let cp = c.add($r * ldc);
                        let (mut v0, mut v1) = (lo[$r], hi[$r]);
                        if add {
                            v0 = $add(v0, $load(cp));
                            v1 = $add(v1, $load(cp.add($lanes)));
                        }
                        $store(cp, v0);
                        $store(cp.add($lanes), v1);
                    )*
                }
            }
        };
    }

    micro!(micro_6x16_avx2, "avx2,fma", 8, 6, [0 1 2 3 4 5],
        _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps);
    micro!(micro_12x32_avx512, "avx512f", 16, 12, [0 1 2 3 4 5 6 7 8 9 10 11],
        _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps);

    /// Eight rows of w (from `r0`, all < n), columns `pc..pc+kb`, into lanes 0..8 of a
    /// panel of stride `nr`: 8x8 blocks loaded (f16 widened by F16C), transposed in
    /// registers and stored 8 lanes per depth step; the depth tail goes scalar.
    ///
    /// # Safety
    /// AVX2 and F16C available; rows r0..r0+8 exist in `w`; `out` holds `kb*nr - ..` floats
    /// (lanes 0..8 of kb rows of stride nr).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn pack8(w: CpuIn<'_>, k: usize, r0: usize, pc: usize, kb: usize, nr: usize, out: &mut [f32]) {
        assert!(out.len() >= (kb.max(1) - 1) * nr + 8);
        let mut p = 0;
        while p + 8 <= kb {
            let mut v = [_mm256_setzero_ps(); 8];
            for (j, vj) in v.iter_mut().enumerate() {
                let off = (r0 + j) * k + pc + p;
                // SAFETY: row r0+j has columns pc+p..pc+p+8 <= k.
                *vj = unsafe {
                    match w {
                        CpuIn::F32(s) => _mm256_loadu_ps(s[off..off + 8].as_ptr()),
                        CpuIn::F16(s) => _mm256_cvtph_ps(_mm_loadu_si128(s[off..off + 8].as_ptr() as *const __m128i)),
                        CpuIn::Q(_) => {
                            let t: [f32; 8] = std::array::from_fn(|i| w.get(off + i));
                            _mm256_loadu_ps(t.as_ptr())
                        }
                    }
                };
            }
            let t = transpose8(v);
            for (q, tq) in t.iter().enumerate() {
                // SAFETY: lanes 0..8 of depth row p+q, inside `out` (asserted above).
                unsafe { _mm256_storeu_ps(out[(p + q) * nr..][..8].as_mut_ptr(), *tq) };
            }
            p += 8;
        }
        for j in 0..8 {
            let off = (r0 + j) * k + pc;
            for pp in p..kb {
                out[pp * nr + j] = match w {
                    CpuIn::F32(s) => s[off + pp],
                    CpuIn::F16(s) => s[off + pp].to_f32(),
                    CpuIn::Q(_) => w.get(off + pp),
                };
            }
        }
    }

    /// 8x8 transpose: output q holds element q of each input row.
    #[target_feature(enable = "avx2")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}

// ---------------------------------------------------------------------------------
// CPU: the gemm crate
// ---------------------------------------------------------------------------------

fn run_crate(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let par = match param(params, "threads")? {
        1 => gemm::Parallelism::None,
        t => gemm::Parallelism::Rayon(t as usize),
    };
    let x = &a.ins[0].f32()[..m * k];
    let y = &mut a.outs[0][..m * n];
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    match a.ins[1] {
        CpuIn::F32(w) => crate_gemm(m, n, k, x, &w[..n * k], y, par),
        CpuIn::F16(w) => with_scratch(&WIDE_W, n * k, |wide| {
            widen(&w[..n * k], wide);
            crate_gemm(m, n, k, x, wide, y, par)
        }),
        CpuIn::Q(_) => {
            return Err(KernelError::BufferType { kernel: "gemm_crate_cpu".into(), buffer: "w".into(), expected: "f32 or f16" });
        }
    }
    Ok(())
}

/// f16 → f32 over the rayon pool.
fn widen(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| s.convert_to_f32_slice(d));
}

fn crate_gemm(m: usize, n: usize, k: usize, x: &[f32], w: &[f32], y: &mut [f32], par: gemm::Parallelism) {
    assert!(x.len() >= m * k && w.len() >= n * k && y.len() >= m * n);
    // SAFETY: dst m x n (row stride n), lhs = x m x k (row stride k), rhs = wᵀ k x n
    // (element (p, j) at j*k + p): every access is inside the slices asserted above.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        crate::kernels::cpu::testdata::signed(len, seed)
    }

    fn reference(m: usize, n: usize, k: usize, x: &[f32], w: &[f32]) -> Vec<f64> {
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k).map(|c| x[i * k + c] as f64 * w[j * k + c] as f64).sum();
            }
        }
        y
    }

    fn micros() -> Vec<Micro> {
        let mut v = vec![Micro::Scalar, Micro::ScalarWide];
        for isa in [Isa::from_param(2), Isa::best()] {
            let m = Micro::for_isa(isa);
            if !v.contains(&m) {
                v.push(m);
            }
        }
        v
    }

    #[test]
    fn blocked_matches_reference_at_edges_with_small_blocks() {
        let shapes = [(1, 1, 1), (1, 7, 5), (7, 1, 9), (13, 17, 3), (37, 53, 67), (25, 70, 41), (12, 33, 64), (6, 16, 17)];
        let blocks = [
            Blocking { mc: 12, nc: 32, kc: 16 },
            Blocking { mc: 24, nc: 64, kc: 7 },
            Blocking { mc: 96, nc: 256, kc: 256 },
            Blocking { mc: 1, nc: 1, kc: 1 },
        ];
        for &(m, n, k) in &shapes {
            let x = data(m * k, 1);
            let w = data(n * k, 2);
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let wr: Vec<f32> = wh.iter().map(|v| v.to_f32()).collect();
            let want = reference(m, n, k, &x, &w);
            let want_h = reference(m, n, k, &x, &wr);
            for micro in micros() {
                for blk in blocks {
                    for split in [Split::Auto, Split::Tokens, Split::Features] {
                        for (w_in, want) in [(CpuIn::F32(&w), &want), (CpuIn::F16(&wh), &want_h)] {
                            let mut y = vec![1.0e4f32; m * n];
                            gemm_blocked(micro, blk, split, m, n, k, &x, w_in, &mut y);
                            for (idx, (got, exp)) in y.iter().zip(want.iter()).enumerate() {
                                assert!(
                                    (*got as f64 - exp).abs() < 1e-4 * (k as f64).max(1.0),
                                    "{micro:?} {blk:?} {split:?} {m}x{n}x{k} {:?} at {idx}: {got} vs {exp}",
                                    w_in.dtype()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pack_w_matches_definition() {
        let (n, k) = (45, 29);
        let w = data(n * k, 3);
        let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
        for micro in micros() {
            let nr = micro.nr();
            for (j0, nb, pc, kb) in [(0usize, 45usize, 0usize, 29usize), (8, 37, 3, 17), (40, 5, 20, 9), (16, 16, 0, 8)] {
                for w_in in [CpuIn::F32(&w), CpuIn::F16(&wh)] {
                    let mut out = vec![f32::NAN; nb.div_ceil(nr) * nr * kb];
                    pack_w(micro, w_in, n, k, j0, nb, pc, kb, &mut out);
                    for s in 0..nb.div_ceil(nr) {
                        for pp in 0..kb {
                            for j in 0..nr {
                                let r = j0 + s * nr + j;
                                let want = if r < n { w_in.get(r * k + pc + pp) } else { 0.0 };
                                assert_eq!(out[s * nr * kb + pp * nr + j], want, "{micro:?} j0={j0} s={s} p={pp} j={j}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn crate_variant_matches_reference() {
        let (m, n, k) = (19, 23, 31);
        let x = data(m * k, 4);
        let w = data(n * k, 5);
        let want = reference(m, n, k, &x, &w);
        for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(0)] {
            let mut y = vec![0.0; m * n];
            crate_gemm(m, n, k, &x, &w, &mut y, par);
            for (got, exp) in y.iter().zip(&want) {
                assert!((*got as f64 - exp).abs() < 1e-4 * k as f64);
            }
        }
    }
}
