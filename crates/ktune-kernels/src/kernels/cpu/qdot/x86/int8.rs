//! The direct int8 loops of the 32-element formats (`direct_i8`), one block dot
//! and the four-row pass, stamped out per instruction set: `avx2` (`maddubs` +
//! `madd`) and `vnni` (`vpdpbusd`).

use super::*;

/// The direct int8 loops (the formats of `direct_i8`), stamped out once per
/// instruction set: `$sdot` dots signed weights with int8 activations, `$udot`
/// unsigned ones (formats with a minimum), each into 8 f32 lanes; everything
/// else is shared. `avx2`: `maddubs` + `madd` (llama.cpp's sign trick);
/// `vnni`: AVX-512 VNNI's `vpdpbusd` on 256-bit registers (one instruction for
/// the 32 products and their sums by four, no 16-bit intermediate).
macro_rules! int8_loops {
    ($name:ident, $feat:literal, $sdot:ident, $udot:ident) => {
        pub mod $name {
            use super::*;

            /// Block `b`'s integer dot product with `x` (f32 lanes to be summed) and the
            /// weight scale.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_i8(format: QFormat, q: &[u8], s: &[f16], x: &crate::kernels::cpu::XQ8, b: usize) -> (__m256, f32) {
                // SAFETY: the caller keeps b below the block count of `q`, `s` and `x`.
                unsafe { (block_dot_i8(format, q.as_ptr(), x.q.as_ptr(), b), h(s[if has_min(format) { 2 * b } else { b }])) }
            }

            /// Block `b`'s integer dot product of the quants at `q` with the int8
            /// activations at `xq` (f32 lanes to be summed), unscaled.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_dot_i8(format: QFormat, q: *const u8, xq: *const i8, b: usize) -> __m256 {
                // SAFETY: the caller keeps b below the block count of both.
                unsafe { block_dot_xv(format, q, _mm256_loadu_si256(xq.add(32 * b) as *const __m256i), b) }
            }

            /// [`block_dot_i8`] with block `b`'s activations already loaded (`xv`), so
            /// several rows share one load.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_dot_xv(format: QFormat, q: *const u8, xv: __m256i, b: usize) -> __m256 {
                // SAFETY: the caller keeps b below the block count of `q`.
                unsafe {
                    match format {
                        QFormat::Q8_0 => $sdot(_mm256_loadu_si256(q.add(32 * b) as *const __m256i), xv),
                        // The nibbles as unsigned weights (no sign trick); their -8
                        // enters as a minimum of -8d through Σx (`x.dsum`), as Q4_1's does.
                        QFormat::Q4_0 => $udot(nibbles(q.add(16 * b)), xv),
                        // Unsigned nibbles times int8 x; the minimum m enters through Σx (`x.dsum`).
                        QFormat::Q4_1 => $udot(nibbles(q.add(16 * b)), xv),
                        // Five-bit values (high bits from qh): signed for Q5_0 and, through
                        // the non-linear table, IQ4_NL; unsigned with a minimum for Q5_1.
                        QFormat::Q5_0 | QFormat::IQ4_NL => {
                            let qb = format.quant_bytes();
                            $sdot(vals32(format, std::slice::from_raw_parts(q.add(qb * b), qb)), xv)
                        }
                        QFormat::Q5_1 => $udot(vals32(format, std::slice::from_raw_parts(q.add(20 * b), 20)), xv),
                        _ => unreachable!("block_dot_i8 serves the formats of `direct_i8`"),
                    }
                }
            }

            /// # Safety
            /// AVX2, FMA and F16C available; `q` holds whole blocks, `s` their scales and
            /// `x` at least as many blocks.
            #[target_feature(enable = $feat)]
            pub unsafe fn dot_i8(format: QFormat, q: &[u8], s: &[f16], x: &crate::kernels::cpu::XQ8) -> f32 {
                // One loop per format (the match is resolved outside the loop), two blocks
                // per step into two accumulators so the FMA chains overlap.
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn run<const F: u8>(q: &[u8], s: &[f16], x: &crate::kernels::cpu::XQ8) -> f32 {
                    let format = I8_FORMATS[F as usize];
                    let blocks = q.len() / format.quant_bytes();
                    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                    let mut mins = _mm256_setzero_ps();
                    let (sp, xd, xs) = (s.as_ptr() as *const __m128i, x.d.as_ptr(), x.dsum.as_ptr());
                    let mut comb = [0f32; 8];
                    let mut b = 0;
                    // SAFETY (every pointer read and block_i8 call): b + 8 <= blocks, the
                    // block count of q, s (one f16 a block, two for Q4_1) and x.
                    unsafe {
                        // Eight blocks a step: their weight scales widened in one F16C
                        // conversion and multiplied by the activation scales in one vector
                        // (Q4_1: the minima times Σx accumulate as a vector too), then each
                        // block's integer dot scaled by a broadcast from `comb`.
                        let pf = crate::kernels::cpu::prefetch_bytes();
                        let qb8 = 8 * format.quant_bytes();
                        while b + 8 <= blocks {
                            prefetch(q.as_ptr().wrapping_add(b * format.quant_bytes()), pf, qb8);
                            scales8(format, sp, xd, xs, b, &mut comb, &mut mins);
                            let mut j = 0;
                            while j < 8 {
                                let p0 = block_dot_i8(format, q.as_ptr(), x.q.as_ptr(), b + j);
                                let p1 = block_dot_i8(format, q.as_ptr(), x.q.as_ptr(), b + j + 1);
                                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&comb[j]), p0, a0);
                                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&comb[j + 1]), p1, a1);
                                j += 2;
                            }
                            b += 8;
                        }
                    }
                    let mut m0 = hsum(mins);
                    // SAFETY: b < blocks, as above.
                    unsafe {
                        while b < blocks {
                            let (p0, d0) = block_i8(format, q, s, x, b);
                            a0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x.d[b]), p0, a0);
                            m0 += block_min(format, s, b, d0) * x.dsum[b];
                            b += 1;
                        }
                    }
                    hsum(_mm256_add_ps(a0, a1)) + m0
                }
                // SAFETY: as the caller's contract.
                unsafe { by_format!(format, run(q, s, x)) }
            }

            /// Four rows at once: [`dot_i8`] of `x` with each of `q[r]`/`s[r]` (the same
            /// block count), every activation block loaded once for the four.
            ///
            /// # Safety
            /// As [`dot_i8`], for each row.
            #[target_feature(enable = $feat)]
            pub unsafe fn dot_i8_x4(format: QFormat, q: [&[u8]; 4], s: [&[f16]; 4], x: &crate::kernels::cpu::XQ8) -> [f32; 4] {
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn run<const F: u8>(q: [&[u8]; 4], s: [&[f16]; 4], x: &crate::kernels::cpu::XQ8) -> [f32; 4] {
                    let format = I8_FORMATS[F as usize];
                    let blocks = q[0].len() / format.quant_bytes();
                    let mut acc = [_mm256_setzero_ps(); 4];
                    let mut m = [0f32; 4];
                    let mut mins = [_mm256_setzero_ps(); 4];
                    let mut comb = [[0f32; 8]; 4];
                    let (xd, xs, xq) = (x.d.as_ptr(), x.dsum.as_ptr(), x.q.as_ptr());
                    let mut b = 0;
                    // SAFETY: b + 8 <= blocks, the block count of every row and of x.
                    unsafe {
                        // Eight blocks a step, as in `dot_i8`; each activation block is
                        // loaded once for the four rows.
                        let pf = crate::kernels::cpu::prefetch_bytes();
                        let qb8 = 8 * format.quant_bytes();
                        while b + 8 <= blocks {
                            for qr in &q {
                                prefetch(qr.as_ptr().wrapping_add(b * format.quant_bytes()), pf, qb8);
                            }
                            for r in 0..4 {
                                scales8(format, s[r].as_ptr() as *const __m128i, xd, xs, b, &mut comb[r], &mut mins[r]);
                            }
                            for j in 0..8 {
                                let xv = _mm256_loadu_si256(xq.add(32 * (b + j)) as *const __m256i);
                                for ((a, qr), cr) in acc.iter_mut().zip(&q).zip(&comb) {
                                    let p = block_dot_xv(format, qr.as_ptr(), xv, b + j);
                                    *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&cr[j]), p, *a);
                                }
                            }
                            b += 8;
                        }
                    }
                    for r in 0..4 {
                        m[r] = hsum(mins[r]);
                    }
                    for b in b..blocks {
                        let xd = x.d[b];
                        for r in 0..4 {
                            // SAFETY: b < blocks, the block count of every row and of x.
                            let (p, d) = unsafe { block_i8(format, q[r], s[r], x, b) };
                            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd), p, acc[r]);
                            m[r] += block_min(format, s[r], b, d) * x.dsum[b];
                        }
                    }
                    [hsum(acc[0]) + m[0], hsum(acc[1]) + m[1], hsum(acc[2]) + m[2], hsum(acc[3]) + m[3]]
                }
                // SAFETY: as the caller's contract.
                unsafe { by_format!(format, run(q, s, x)) }
            }
        }
    };
}

int8_loops!(avx2, "avx2,fma,f16c", dot_s8, dot_u8);
int8_loops!(vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dot_s8_vnni, dot_u8_vnni);
