//! The int8 GEMM of the CPU layer (prefill on block-format weights): activations
//! quantized once per token to int8 blocks of 32 (as the decode kernels'
//! [`XQ8`]), weight rows unpacked once per pool task into one uniform layout
//! whatever their format, then integer dot products of 64 elements per
//! instruction (AVX-512 VNNI `vpdpbusd`) in a 4-row × 4-token register tile.
//!
//! The uniform layout ([`Panel`]) is what lets every block format share one
//! microkernel: a weight's value is `scale[g] * v + off[g]` with `v` an int8
//! value and `g` its group of 16 ([`Unpacked`]). `vpdpbusd` multiplies unsigned
//! by signed bytes, so a row keeps `v ^ 0x80 = v + 128` (0..=255) and the group's
//! offset becomes `off - 128 * scale`; the activations stay signed. Per 64
//! elements and (row, token) pair: one `vpdpbusd` (sums of four products in 16
//! lanes, four lanes per group of 16), one conversion, one multiply of the two
//! lane scales (row: the group's scale; token: the block's), one FMA. The offsets
//! enter the same accumulators 16 groups at a time (`off'[g] * d * Σq[g]`).

use std::cell::RefCell;

use super::XQ8;
use super::qdot::{check_quant, unpack_fast};
use super::{Isa, features};
use crate::device::CpuCaps;
use crate::kernels::quant::{GROUP, QFormat, QK, QView, Unpacked};
use crate::kernels::{DType, ParamSpec, Params, Problem, param};

/// The parameters of the int8 GEMM kernels (`gemm_q_i8_cpu`, `gate_up_q_i8_cpu`).
pub const I8_GEMM_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[8, 16, 32, 64], default: 32, help: "weight rows unpacked per pool task" },
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
/// on the unsigned uniform layout; the f32 panel kernels serve those CPUs), and
/// several tokens (one token is a GEMV's work).
pub fn check_i8_gemm(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_quant(caps, prob, dtype, params)?;
    if param(params, "isa")? == 0 && !i8_gemm_simd(Isa::best()) {
        return Err("isa 0 needs AVX-512 VNNI, which this CPU lacks (the f32 panel kernels serve it)".into());
    }
    Ok(())
}

/// Elements per lane of a `vpdpbusd` (its four products' sum).
const LANE: usize = 4;

/// Activations of `m` tokens as int8 blocks, laid out for [`rows_times_tokens_i8`].
pub struct XPanel {
    pub k: usize,
    pub m: usize,
    /// `[m][k]` int8 codes.
    q: Vec<i8>,
    /// `[m][k / 4]`: the block scale `d` of each lane (8 lanes a block).
    lane_d: Vec<f32>,
    /// `[m][k / 16]`: `d * Σ q` per group of 16.
    gsum: Vec<f32>,
}

impl XPanel {
    /// Quantizes the `m` rows of `x` (`[m][k]`, k a multiple of 32).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> XPanel {
        let (mut q, mut lane_d, mut gsum) = (vec![0i8; m * k], vec![0f32; m * k / LANE], vec![0f32; m * k / GROUP]);
        for t in 0..m {
            let xq = XQ8::quantize(&x[t * k..(t + 1) * k]);
            q[t * k..(t + 1) * k].copy_from_slice(&xq.q[..k]);
            for (b, &d) in xq.d.iter().enumerate() {
                lane_d[(t * k + b * QK) / LANE..][..QK / LANE].fill(d);
            }
            gsum[t * k / GROUP..][..k / GROUP].copy_from_slice(&xq.dsum16[..k / GROUP]);
        }
        XPanel { k, m, q, lane_d, gsum }
    }
}

/// Weight rows in the uniform layout (see the module docs), reused by a thread.
#[derive(Default)]
struct Panel {
    /// `[rows][k]`: `v ^ 0x80`.
    vals: Vec<u8>,
    /// `[rows][k / 4]`: the group scale of each lane.
    lane_s: Vec<f32>,
    /// `[rows][k / 16]`: `off - 128 * scale` per group.
    goff: Vec<f32>,
}

impl Panel {
    fn pack(&mut self, isa: Isa, w: QView<'_>, r0: usize, rows: usize, k: usize) {
        self.vals.resize(rows * k, 0);
        self.lane_s.resize(rows * k / LANE, 0.0);
        self.goff.resize(rows * k / GROUP, 0.0);
        let be = w.format.block_elems();
        let per_row = k / be;
        if matches!(w.format, QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q8_0) {
            self.pack_32(w, r0, rows, k);
            return;
        }
        let mut u = Unpacked::default();
        for i in 0..rows {
            for b in 0..per_row {
                let (q, s) = w.block((r0 + i) * per_row + b);
                unpack_fast(isa, w.format, q, s, &mut u);
                let e0 = i * k + b * be;
                for (o, &v) in self.vals[e0..e0 + be].iter_mut().zip(&u.vals[..be]) {
                    *o = (v as u8) ^ 0x80;
                }
                for g in 0..be / GROUP {
                    let s = u.scale[g];
                    self.lane_s[(e0 + g * GROUP) / LANE..][..GROUP / LANE].fill(s);
                    self.goff[e0 / GROUP + g] = u.off[g] - 128.0 * s;
                }
            }
        }
    }
}

impl Panel {
    /// The 32-element formats with one scale a block, straight from their bytes
    /// (loops the compiler vectorizes): Q4_0 and Q4_1 keep their nibbles as the
    /// unsigned values (offsets -8d and m), Q8_0 its codes plus 128 (offset -128d).
    fn pack_32(&mut self, w: QView<'_>, r0: usize, rows: usize, k: usize) {
        let per_row = k / QK;
        for i in 0..rows {
            for b in 0..per_row {
                let (q, s) = w.block((r0 + i) * per_row + b);
                let e0 = i * k + b * QK;
                let out: &mut [u8; QK] = (&mut self.vals[e0..e0 + QK]).try_into().expect("one block");
                let d = s[0].to_f32();
                let off = match w.format {
                    QFormat::Q8_0 => {
                        for (o, &c) in out.iter_mut().zip(&q[..QK]) {
                            *o = c ^ 0x80;
                        }
                        -128.0 * d
                    }
                    _ => {
                        let q: &[u8; 16] = q[..16].try_into().expect("16 bytes of nibbles");
                        let (lo, hi) = out.split_at_mut(16);
                        for j in 0..16 {
                            lo[j] = q[j] & 0x0f;
                            hi[j] = q[j] >> 4;
                        }
                        if w.format == QFormat::Q4_1 { s[1].to_f32() } else { -8.0 * d }
                    }
                };
                self.lane_s[e0 / LANE..][..QK / LANE].fill(d);
                self.goff[e0 / GROUP..][..QK / GROUP].fill(off);
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
/// unpacked once, then the int8 tile kernel (VNNI when `isa` has it, else the
/// portable loops of the same arithmetic). Returns `[count][m]`.
pub fn rows_times_tokens_i8(isa: Isa, x: &XPanel, w: QView<'_>, r0: usize, count: usize) -> Vec<f32> {
    let (m, k) = (x.m, x.k);
    let mut out = vec![0f32; count * m];
    let mut run = |p: &mut Panel| {
        p.pack(isa, w, r0, count, k);
        #[cfg(target_arch = "x86_64")]
        if i8_gemm_simd(isa) {
            // SAFETY: AVX-512F/BW/VL/VNNI checked; the panel holds `count` rows of k
            // and `x` m tokens of k (k a multiple of 32).
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

/// The portable loops: per group of 16, the integer sum of products, scaled as
/// the SIMD lanes are (`scale * d`), plus the group's offset term.
fn scalar(p: &Panel, x: &XPanel, count: usize, out: &mut [f32]) {
    let (m, k) = (x.m, x.k);
    for i in 0..count {
        for t in 0..m {
            let mut acc = 0f32;
            for g in 0..k / GROUP {
                let e = g * GROUP;
                let wv = &p.vals[i * k + e..][..GROUP];
                let xv = &x.q[t * k + e..][..GROUP];
                let dot: i32 = wv.iter().zip(xv).map(|(&a, &b)| a as i32 * b as i32).sum();
                let scale = p.lane_s[(i * k + e) / LANE] * x.lane_d[(t * k + e) / LANE];
                acc += scale * dot as f32 + p.goff[(i * k) / GROUP + g] * x.gsum[(t * k) / GROUP + g];
            }
            out[i * m + t] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{GROUP, LANE, Panel, XPanel};

    /// Every (row, token) of the panel and `x` in 4 × 4 tiles (then the rows and
    /// tokens left over one at a time).
    ///
    /// # Safety
    /// AVX-512F/BW/VL/VNNI available; `p` holds `count` rows of `x.k`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn rows_times_tokens(p: &Panel, x: &XPanel, count: usize, out: &mut [f32]) {
        let (m, k) = (x.m, x.k);
        let mut i = 0;
        while i < count {
            let r = if count - i >= 4 { 4 } else { 1 };
            let mut t = 0;
            while t < m {
                let n = if m - t >= 4 { 4 } else { 1 };
                // SAFETY: rows i..i + r < count and tokens t..t + n < m, each with k
                // elements in the layouts of `Panel` and `XPanel`.
                unsafe {
                    match (r, n) {
                        (4, 4) => tile::<4, 4>(p, x, i, t, k, m, out),
                        (4, _) => tile::<4, 1>(p, x, i, t, k, m, out),
                        (_, 4) => tile::<1, 4>(p, x, i, t, k, m, out),
                        _ => tile::<1, 1>(p, x, i, t, k, m, out),
                    }
                }
                t += n;
            }
            i += r;
        }
    }

    /// Rows `i..i + R` times tokens `t..t + T` into `out[row][token]` (`[count][m]`).
    // Index loops over the register arrays: each (row, token) pairs two of them.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, const T: usize>(p: &Panel, x: &XPanel, i: usize, t: usize, k: usize, m: usize, out: &mut [f32]) {
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let (vals, lane_s, goff) = (p.vals.as_ptr(), p.lane_s.as_ptr(), p.goff.as_ptr());
        let (xq, lane_d, gsum) = (x.q.as_ptr(), x.lane_d.as_ptr(), x.gsum.as_ptr());
        // SAFETY (every load): rows i..i + R of the panel and tokens t..t + T of x
        // exist (the caller); element offsets stay below k per row (full steps of 64
        // below k, the masked tail reads only its valid bytes and lanes).
        unsafe {
            // One step of 64 elements (two blocks of 32); `bmask`/`lmask` keep the
            // bytes and lanes of a 32-element tail.
            let step = |acc: &mut [[__m512; T]; R], e: usize, bmask: u64, lmask: u16| {
                let mut w = [_mm512_setzero_si512(); R];
                let mut s = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    w[r] = _mm512_maskz_loadu_epi8(bmask, vals.add((i + r) * k + e) as *const i8);
                    s[r] = _mm512_maskz_loadu_ps(lmask, lane_s.add(((i + r) * k + e) / LANE));
                }
                for c in 0..T {
                    let xv = _mm512_maskz_loadu_epi8(bmask, xq.add((t + c) * k + e));
                    let xd = _mm512_maskz_loadu_ps(lmask, lane_d.add(((t + c) * k + e) / LANE));
                    for r in 0..R {
                        let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r], xv);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s[r], xd), acc[r][c]);
                    }
                }
            };
            let mut e = 0;
            while e + 64 <= k {
                step(&mut acc, e, u64::MAX, u16::MAX);
                e += 64;
            }
            if e < k {
                step(&mut acc, e, (1u64 << (k - e)) - 1, (1u16 << ((k - e) / LANE)) - 1);
            }
            // The offsets, 16 groups a vector: off'[g] * d * Σq[g].
            let groups = k / GROUP;
            let mut g = 0;
            while g < groups {
                let lmask: u16 = if groups - g >= 16 { u16::MAX } else { (1u16 << (groups - g)) - 1 };
                let mut o = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    o[r] = _mm512_maskz_loadu_ps(lmask, goff.add((i + r) * groups + g));
                }
                for c in 0..T {
                    let xs = _mm512_maskz_loadu_ps(lmask, gsum.add((t + c) * groups + g));
                    for r in 0..R {
                        acc[r][c] = _mm512_fmadd_ps(o[r], xs, acc[r][c]);
                    }
                }
                g += 16;
            }
        }
        for r in 0..R {
            for c in 0..T {
                out[(i + r) * m + t + c] = _mm512_reduce_add_ps(acc[r][c]);
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
            let (n, m) = (7, 6);
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
