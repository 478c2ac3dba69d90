//! The CPU layer's blocked f32 GEMM engine, `y[m,n] = x[m,k] · w[n,k]ᵀ` with w in
//! f32 or f16: x packed into MR-row panels, w packed into NR-row panels (f16
//! widened while packing), an MR x NR register-blocked FMA microkernel ([`Micro`])
//! swept over them in BLIS loop order, tasks over tokens or features on the pool
//! ([`gemm_blocked`], [`Blocking`], [`Split`]). Run by `gemm_blocked_cpu`, the
//! block-format panel GEMM (`matmul/quant.rs`), gate_up's prefill and the vision
//! tower's linear, patch embedding and flash attention. The x86 microkernels: `x86.rs`.

use std::cell::RefCell;

use super::{Isa, with_scratch};
use crate::kernels::contract::CpuIn;
use crate::kernels::cpu;

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

thread_local! {
    /// Packed x of the calling thread (shared read-only with the tasks it spawns).
    static PACK_X: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Packed w block of one rayon task.
    static PACK_W: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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
            CpuIn::Q(_) | CpuIn::Stack(_) => lanes.enumerate().for_each(|(i, d)| *d = w.get(r * k + pc + i)),
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
mod x86;

#[cfg(test)]
mod tests {
    use half::f16;

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
}
