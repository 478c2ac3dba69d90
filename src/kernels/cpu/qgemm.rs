//! The int8 GEMM of the CPU layer (prefill on block-format weights): activations
//! quantized once per token to int8 blocks of 32 (as the decode kernels'
//! [`XQ8`]), weight rows unpacked once per pool task into one row-interleaved
//! layout whatever their format, then AVX-512 VNNI `vpdpbusd` with each of the
//! 16 lanes a different weight row (llama.cpp's repacked CPU layout, here built
//! per task instead of kept beside the weights).
//!
//! The layout ([`Panel`]): a weight's value is `scale * u + off` with `u` an
//! unsigned byte and one scale and offset per row and *scale group* (32 elements
//! where the format's scales span 32, else 16: Q2_K, Q3_K, Q6_K). Rows go in
//! blocks of 16; for each scale group, each run of 4 elements of the 16 rows is
//! one 64-byte vector. A `vpdpbusd` of that vector with 4 activation bytes
//! broadcast adds 4 products into each row's lane, so a scale group's integer
//! dot products accumulate in registers with no per-block conversion; then one
//! conversion and two FMAs per group and token apply `scale · d` and
//! `off · d · Σq`. Values come from the formats' bytes directly for Q4_0, Q4_1
//! and Q8_0 (nibbles as they are with offsets -8d or m; Q8_0 codes + 128 with
//! -128d), else from [`Unpacked`] (`v + 128`, offset `off - 128 · scale`).

use std::cell::RefCell;

use super::XQ8;
use super::qdot::{check_quant, unpack_fast};
use super::{Isa, features};
use crate::device::CpuCaps;
use crate::kernels::quant::{GROUP, QFormat, QK, QView, Unpacked};
use crate::kernels::{DType, ParamSpec, Params, Problem, param};

/// The parameters of the int8 GEMM kernels (`gemm_q_i8_cpu`, `gate_up_q_i8_cpu`).
pub const I8_GEMM_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[16, 32, 64, 128], default: 32, help: "weight rows unpacked per pool task" },
    ParamSpec {
        name: "act_bits",
        values: &[8],
        default: 8,
        help: "activations as int8 blocks of 32 (llama.cpp's q8 activations: about 0.5% error)",
    },
    ParamSpec {
        name: "isa",
        values: &[0, 1],
        default: 0,
        help: "0 AVX-512 VNNI (invalid on a CPU without it), 1 portable loops of the same arithmetic",
    },
];

/// The int8 GEMM kernels: VNNI at `isa` 0 only (AVX2's `maddubs` would saturate
/// on unsigned bytes up to 255; the f32 panel kernels serve those CPUs).
pub fn check_i8_gemm(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_quant(caps, prob, dtype, params)?;
    if param(params, "isa")? == 0 && !i8_gemm_simd(Isa::best()) {
        return Err("isa 0 needs AVX-512 VNNI, which this CPU lacks (the f32 panel kernels serve it)".into());
    }
    Ok(())
}

/// Weight rows per interleaved block (the lanes of a 512-bit vector).
const RB: usize = 16;
/// Elements per `vpdpbusd` lane.
const LANE: usize = 4;

/// Elements sharing one scale and offset in the panel: 16 for the formats whose
/// scales change every 16 elements, else 32.
fn scale_group(format: QFormat) -> usize {
    if matches!(format, QFormat::Q2_K | QFormat::Q3_K | QFormat::Q6_K) { GROUP } else { QK }
}

/// Activations of `m` tokens as int8 blocks, laid out for [`rows_times_tokens_i8`].
pub struct XPanel {
    pub k: usize,
    pub m: usize,
    /// `[m][k]` int8 codes.
    q: Vec<i8>,
    /// `[m][k / 32]` block scales `d`.
    d: Vec<f32>,
    /// `[m][k / 16]`: `d * Σ q` per group of 16.
    sum16: Vec<f32>,
    /// `[m][k / 32]`: `d * Σ q` per block.
    sum32: Vec<f32>,
}

impl XPanel {
    /// Quantizes the `m` rows of `x` (`[m][k]`, k a multiple of 32).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> XPanel {
        let nb = k / QK;
        let mut p = XPanel { k, m, q: vec![0; m * k], d: vec![0.0; m * nb], sum16: vec![0.0; m * 2 * nb], sum32: vec![0.0; m * nb] };
        for t in 0..m {
            let xq = XQ8::quantize(&x[t * k..(t + 1) * k]);
            p.q[t * k..(t + 1) * k].copy_from_slice(&xq.q[..k]);
            p.d[t * nb..][..nb].copy_from_slice(&xq.d[..nb]);
            p.sum32[t * nb..][..nb].copy_from_slice(&xq.dsum[..nb]);
            p.sum16[t * 2 * nb..][..2 * nb].copy_from_slice(&xq.dsum16[..2 * nb]);
        }
        p
    }

    /// `d · Σq` per scale group of `sg` elements (16 or 32), per token.
    fn group_sums(&self, sg: usize) -> &[f32] {
        if sg == GROUP { &self.sum16 } else { &self.sum32 }
    }
}

/// Weight rows in the interleaved layout (see the module docs), reused by a thread.
#[derive(Default)]
struct Panel {
    /// Scale group size (16 or 32) and the number of row blocks.
    sg: usize,
    blocks: usize,
    /// `[block][group][run of 4][row 16][4]`.
    vals: Vec<u8>,
    /// `[block][group][row 16]`.
    scale: Vec<f32>,
    off: Vec<f32>,
    /// One row's values, scales and offsets before they are interleaved.
    row: Vec<u8>,
    row_scale: Vec<f32>,
    row_off: Vec<f32>,
}

impl Panel {
    fn pack(&mut self, isa: Isa, w: QView<'_>, r0: usize, rows: usize, k: usize) {
        let sg = scale_group(w.format);
        let (blocks, groups) = (rows.div_ceil(RB), k / sg);
        self.sg = sg;
        self.blocks = blocks;
        self.vals.clear();
        self.vals.resize(blocks * RB * k, 0);
        self.scale.clear();
        self.scale.resize(blocks * groups * RB, 0.0);
        self.off.clear();
        self.off.resize(blocks * groups * RB, 0.0);
        let be = w.format.block_elems();
        let per_row = k / be;
        let mut u = Unpacked::default();
        let (row, sc, of) = (&mut self.row, &mut self.row_scale, &mut self.row_off);
        row.resize(k, 0);
        sc.resize(groups, 0.0);
        of.resize(groups, 0.0);
        for i in 0..rows {
            for b in 0..per_row {
                let (q, s) = w.block((r0 + i) * per_row + b);
                let e0 = b * be;
                let vals = &mut row[e0..e0 + be];
                match w.format {
                    QFormat::Q8_0 => {
                        for (o, &c) in vals.iter_mut().zip(&q[..QK]) {
                            *o = c ^ 0x80;
                        }
                        let d = s[0].to_f32();
                        (sc[b], of[b]) = (d, -128.0 * d);
                    }
                    QFormat::Q4_0 | QFormat::Q4_1 => {
                        let (lo, hi) = vals.split_at_mut(16);
                        for j in 0..16 {
                            lo[j] = q[j] & 0x0f;
                            hi[j] = q[j] >> 4;
                        }
                        let d = s[0].to_f32();
                        (sc[b], of[b]) = (d, if w.format == QFormat::Q4_1 { s[1].to_f32() } else { -8.0 * d });
                    }
                    _ => {
                        unpack_fast(isa, w.format, q, s, &mut u);
                        for (o, &v) in vals.iter_mut().zip(&u.vals[..be]) {
                            *o = (v as u8) ^ 0x80;
                        }
                        // Unpacked has a scale and offset per 16; a group of 32 takes
                        // the first of its two (equal for these formats).
                        for g in 0..be / sg {
                            let j = g * sg / GROUP;
                            (sc[e0 / sg + g], of[e0 / sg + g]) = (u.scale[j], u.off[j] - 128.0 * u.scale[j]);
                        }
                    }
                }
            }
            // Interleave: row i of block i / 16, lane i % 16.
            let (blk, lane) = (i / RB, i % RB);
            for g in 0..groups {
                let base = (blk * groups + g) * sg * RB;
                for r in 0..sg / LANE {
                    let dst = base + r * RB * LANE + lane * LANE;
                    self.vals[dst..dst + LANE].copy_from_slice(&row[g * sg + r * LANE..][..LANE]);
                }
                self.scale[(blk * groups + g) * RB + lane] = sc[g];
                self.off[(blk * groups + g) * RB + lane] = of[g];
            }
        }
    }
}

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
}

/// Whether the SIMD path can run at `isa` (AVX-512 VNNI with BW).
pub fn i8_gemm_simd(isa: Isa) -> bool {
    isa.vnni() && features().avx512f
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and every token of `x`: the rows
/// packed once, then the interleaved int8 kernel (VNNI when `isa` has it, else
/// the portable loops of the same arithmetic). Returns `[count][m]`.
pub fn rows_times_tokens_i8(isa: Isa, x: &XPanel, w: QView<'_>, r0: usize, count: usize) -> Vec<f32> {
    let (m, k) = (x.m, x.k);
    let mut out = vec![0f32; count * m];
    let mut run = |p: &mut Panel| {
        p.pack(isa, w, r0, count, k);
        #[cfg(target_arch = "x86_64")]
        if i8_gemm_simd(isa) {
            // SAFETY: AVX-512F/BW/VL/VNNI checked; the panel holds `count` rows of k
            // in whole blocks of 16 and `x` m tokens of k (k a multiple of 32).
            unsafe { vnni::rows_times_tokens(p, x, count, &mut out) };
            return;
        }
        scalar(p, x, count, &mut out);
    };
    PANEL.with(|c| match c.try_borrow_mut() {
        Ok(mut p) => run(&mut p),
        Err(_) => run(&mut Panel::default()),
    });
    out
}

/// The portable loops: per scale group, each row's integer sum of products, then
/// `scale · d · Σ + off · d · Σq`, as the SIMD lanes do.
fn scalar(p: &Panel, x: &XPanel, count: usize, out: &mut [f32]) {
    let (m, k, sg) = (x.m, x.k, p.sg);
    let groups = k / sg;
    let sums = x.group_sums(sg);
    for i in 0..count {
        let (blk, lane) = (i / RB, i % RB);
        for t in 0..m {
            let mut acc = 0f32;
            for g in 0..groups {
                let base = (blk * groups + g) * sg * RB;
                let mut dot = 0i32;
                for r in 0..sg / LANE {
                    let wv = &p.vals[base + r * RB * LANE + lane * LANE..][..LANE];
                    let xv = &x.q[t * k + g * sg + r * LANE..][..LANE];
                    dot += wv.iter().zip(xv).map(|(&a, &b)| a as i32 * b as i32).sum::<i32>();
                }
                let j = (blk * groups + g) * RB + lane;
                let d = x.d[t * (k / QK) + g * sg / QK];
                acc += p.scale[j] * d * dot as f32 + p.off[j] * sums[t * groups + g];
            }
            out[i * m + t] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{LANE, Panel, QK, RB, XPanel};

    /// Every (row, token): two row blocks (32 rows) × 4 tokens a tile, then what
    /// is left one block and one token at a time.
    ///
    /// # Safety
    /// AVX-512F/BW/VL/VNNI available; `p` holds `count` rows of `x.k` (in whole
    /// blocks of 16).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn rows_times_tokens(p: &Panel, x: &XPanel, count: usize, out: &mut [f32]) {
        let m = x.m;
        let mut b = 0;
        while b < p.blocks {
            let r = if p.blocks - b >= 2 { 2 } else { 1 };
            let mut t = 0;
            while t < m {
                let n = if m - t >= 4 { 4 } else { 1 };
                // SAFETY: blocks b..b + r < p.blocks and tokens t..t + n < m.
                unsafe {
                    match (r, n, p.sg == QK) {
                        (2, 4, true) => tile::<2, 4, 8>(p, x, b, t, count, out),
                        (2, 4, false) => tile::<2, 4, 4>(p, x, b, t, count, out),
                        (2, _, true) => tile::<2, 1, 8>(p, x, b, t, count, out),
                        (2, _, false) => tile::<2, 1, 4>(p, x, b, t, count, out),
                        (_, 4, true) => tile::<1, 4, 8>(p, x, b, t, count, out),
                        (_, 4, false) => tile::<1, 4, 4>(p, x, b, t, count, out),
                        (_, _, true) => tile::<1, 1, 8>(p, x, b, t, count, out),
                        (_, _, false) => tile::<1, 1, 4>(p, x, b, t, count, out),
                    }
                }
                t += n;
            }
            b += r;
        }
    }

    /// Row blocks `b..b + R` times tokens `t..t + T`; `RUNS` runs of 4 elements
    /// per scale group (8: groups of 32, 4: of 16). Writes rows below `count` of
    /// `out[row][token]` (`[count][m]`).
    // Index loops over the register arrays: each (block, token) pairs two of them.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, const T: usize, const RUNS: usize>(
        p: &Panel,
        x: &XPanel,
        b: usize,
        t: usize,
        count: usize,
        out: &mut [f32],
    ) {
        let (m, k) = (x.m, x.k);
        let sg = RUNS * LANE;
        let groups = k / sg;
        let nb = k / QK;
        let sums = x.group_sums(sg);
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let (vals, scale, off) = (p.vals.as_ptr(), p.scale.as_ptr(), p.off.as_ptr());
        let (xq, xd, xs) = (x.q.as_ptr(), x.d.as_ptr(), sums.as_ptr());
        // SAFETY (every read): blocks b..b + R and groups below `groups` are inside
        // the panel; tokens t..t + T and elements below k inside x (the caller).
        unsafe {
            for g in 0..groups {
                let mut dot = [[_mm512_setzero_si512(); T]; R];
                for run in 0..RUNS {
                    let mut w = [_mm512_setzero_si512(); R];
                    for r in 0..R {
                        w[r] = _mm512_loadu_si512(vals.add((((b + r) * groups + g) * RUNS + run) * RB * LANE) as *const __m512i);
                    }
                    for c in 0..T {
                        let xv = _mm512_set1_epi32((xq.add((t + c) * k + g * sg + run * LANE) as *const i32).read_unaligned());
                        for r in 0..R {
                            dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], w[r], xv);
                        }
                    }
                }
                let mut s = [_mm512_setzero_ps(); R];
                let mut o = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    s[r] = _mm512_loadu_ps(scale.add(((b + r) * groups + g) * RB));
                    o[r] = _mm512_loadu_ps(off.add(((b + r) * groups + g) * RB));
                }
                for c in 0..T {
                    let d = _mm512_set1_ps(*xd.add((t + c) * nb + g * sg / QK));
                    let sum = _mm512_set1_ps(*xs.add((t + c) * groups + g));
                    for r in 0..R {
                        let a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot[r][c]), d), s[r], acc[r][c]);
                        acc[r][c] = _mm512_fmadd_ps(o[r], sum, a);
                    }
                }
            }
        }
        let mut lanes = [0f32; RB];
        for r in 0..R {
            for c in 0..T {
                // SAFETY: 16 writable floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r][c]) };
                for (l, &v) in lanes.iter().enumerate() {
                    let row = (b + r) * RB + l;
                    if row < count {
                        out[row * m + t + c] = v;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::QMatrix;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The SIMD tiles (every remainder shape, a 32-element tail) and the portable
    /// loops compute the same sums, and both stay within int8-activation error of
    /// the dequantized product.
    #[test]
    fn int8_gemm_tiles_agree_with_the_scalar_loops_and_the_f32_product() {
        for format in [QFormat::Q4_0, QFormat::Q8_0, QFormat::Q4_1, QFormat::Q4_K, QFormat::Q6_K, QFormat::IQ4_NL] {
            let k = if format.block_elems() == 256 { 512 } else { 96 };
            let (n, m) = (37, 6);
            let wf = data(n * k, 3);
            let w = QMatrix::quantize(format, n, k, &wf).expect("quantizes");
            let x = data(m * k, 5);
            let xp = XPanel::quantize(&x, m, k);
            let deq = w.dequantize();
            let simd = rows_times_tokens_i8(Isa::best(), &xp, w.view(), 0, n);
            let portable = rows_times_tokens_i8(Isa::Scalar, &xp, w.view(), 0, n);
            let scale = (k as f32).sqrt();
            for r in 0..n {
                for t in 0..m {
                    let exact: f32 = (0..k).map(|e| deq[r * k + e] * x[t * k + e]).sum();
                    let (a, b) = (simd[r * m + t], portable[r * m + t]);
                    assert!((a - b).abs() <= 1e-4 * scale, "{format:?} r{r} t{t}: simd {a} scalar {b}");
                    assert!((a - exact).abs() <= 1e-2 * scale, "{format:?} r{r} t{t}: {a} vs {exact}");
                }
            }
        }
    }
}
