//! The K-quant dots (Q4_K, Q6_K) against activations with one scale per
//! super-block, a whole super-block summed in integers: `kq8_avx2` and `kq8_vnni`.

use std::arch::x86_64::*;

use super::{h, hsum, prefetch};

/// `acc + Σ pairs a·b` of 16-bit lanes into 32-bit ones: `vpmaddwd` + add.
#[inline]
#[target_feature(enable = "avx2")]
fn dpw_avx2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
}

/// [`dpw_avx2`] in one VNNI `vpdpwssd`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dpw_vnni(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

/// The K-quant dots against activations with one scale per super-block
/// ([`XQ8::per256`](crate::kernels::cpu::XQ8::per256)), as llama.cpp's q4_K/q6_K x q8_K: the codes
/// times the int8 activations by `maddubs` (pairs into 16 bits), times the
/// sub-block scales into 32-bit lanes by `$dpw`, a whole super-block summed in
/// integers, then one conversion and one multiply by `d · d_x`. The offsets
/// (Q4_K's minima, Q6_K's -32) go through the activation sums in f32.
macro_rules! kq8_loops {
    ($name:ident, $feat:literal, $dpw:ident) => {
        pub mod $name {
            use std::arch::x86_64::*;

            use half::f16;

            use super::{h, hsum, prefetch, $dpw};
            use crate::kernels::cpu::XQ8;
            use crate::kernels::quant::scales_mins_k4;

            /// `vpshufb` masks that broadcast 16-bit lane `i` (of each 128-bit half).
            #[inline]
            #[target_feature(enable = "avx2")]
            fn lane16(lo: u8, hi: u8) -> __m256i {
                let (a, b) = ((2 * lo) as i8, (2 * hi) as i8);
                let l = _mm_set1_epi16(i16::from_le_bytes([a as u8, (a + 1) as u8]));
                let r = _mm_set1_epi16(i16::from_le_bytes([b as u8, (b + 1) as u8]));
                _mm256_set_m128i(r, l)
            }

            /// `Σ x[i] * w[i]` of one Q4_K row (`q`: 140-byte blocks, i.e. the
            /// 144-byte blocks less d and dmin; `s`: d, dmin per block).
            ///
            /// # Safety
            /// The features of `$feat` available; `x` has one scale per 256
            /// (`per256`) and 8 blocks of 32 per block of `q`.
            #[target_feature(enable = $feat)]
            pub unsafe fn dot_q4k(q: &[u8], s: &[f16], x: &XQ8) -> f32 {
                const QB: usize = 140;
                let blocks = q.len() / QB;
                assert!(s.len() >= 2 * blocks && x.d.len() >= 8 * blocks && x.q.len() >= 256 * blocks && x.dsum.len() >= 8 * blocks);
                let m4 = _mm256_set1_epi8(0x0f);
                // Sub-block j's scale over all 16 lanes.
                let pick: [__m256i; 8] = std::array::from_fn(|j| lane16(j as u8, j as u8));
                let (mut acc, mut mins) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let pf = crate::kernels::cpu::prefetch_bytes();
                for b in 0..blocks {
                    let qb = &q[QB * b..QB * (b + 1)];
                    prefetch(qb.as_ptr(), pf, QB);
                    let (d, dmin) = (h(s[2 * b]), h(s[2 * b + 1]));
                    let sm = scales_mins_k4(qb);
                    // SAFETY: the block's 140 bytes and its 256 activations (asserted above).
                    unsafe {
                        let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr() as *const __m128i)));
                        let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(sm.as_ptr().add(8) as *const __m128i)));
                        mins = _mm256_fmadd_ps(_mm256_mul_ps(mn, _mm256_set1_ps(dmin)), _mm256_loadu_ps(x.dsum.as_ptr().add(8 * b)), mins);
                        let xq = x.q.as_ptr().add(256 * b);
                        let mut ai = _mm256_setzero_si256();
                        for jj in 0..4 {
                            // 32 bytes: sub-block 2jj in the low nibbles, 2jj + 1 in the high.
                            let raw = _mm256_loadu_si256(qb.as_ptr().add(12 + 32 * jj) as *const __m256i);
                            let lo = _mm256_and_si256(raw, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                            let p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(xq.add(64 * jj) as *const __m256i));
                            let p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xq.add(64 * jj + 32) as *const __m256i));
                            ai = $dpw(ai, p0, _mm256_shuffle_epi8(sc, pick[2 * jj]));
                            ai = $dpw(ai, p1, _mm256_shuffle_epi8(sc, pick[2 * jj + 1]));
                        }
                        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(d * x.d[8 * b]), acc);
                    }
                }
                hsum(acc) - hsum(mins)
            }

            /// `Σ x[i] * w[i]` of one Q6_K row (`q`: 208-byte blocks less their f16
            /// scale: ql, qh, 16 int8 scales; `s`: d per block). Codes 0..63
            /// unsigned; the -32 enters as `-32 d sc Σx` per 16 elements.
            ///
            /// # Safety
            /// As [`dot_q4k`].
            #[target_feature(enable = $feat)]
            pub unsafe fn dot_q6k(q: &[u8], s: &[f16], x: &XQ8) -> f32 {
                const QB: usize = 208;
                let blocks = q.len() / QB;
                assert!(s.len() >= blocks && x.d.len() >= 8 * blocks && x.q.len() >= 256 * blocks && x.dsum16.len() >= 16 * blocks);
                let (m4, m3) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
                // The k-th 32 elements of a half take scales 2k (first 16) and 2k + 1.
                let pick: [__m256i; 4] = std::array::from_fn(|k| lane16(2 * k as u8, 2 * k as u8 + 1));
                let (mut acc, mut off) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let pf = crate::kernels::cpu::prefetch_bytes();
                for b in 0..blocks {
                    let qb = &q[QB * b..QB * (b + 1)];
                    prefetch(qb.as_ptr(), pf, QB);
                    let d = h(s[b]);
                    // SAFETY: the block's 208 bytes and its 256 activations (asserted above).
                    unsafe {
                        let sc8 = _mm_loadu_si128(qb.as_ptr().add(192) as *const __m128i);
                        let dv = _mm256_set1_ps(d);
                        let scf0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), dv);
                        let scf1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc8))), dv);
                        let ds = x.dsum16.as_ptr().add(16 * b);
                        off = _mm256_fmadd_ps(scf0, _mm256_loadu_ps(ds), off);
                        off = _mm256_fmadd_ps(scf1, _mm256_loadu_ps(ds.add(8)), off);
                        let xq = x.q.as_ptr().add(256 * b);
                        let mut ai = _mm256_setzero_si256();
                        for half in 0..2 {
                            // This half's 8 scales as 16-bit lanes, in both 128-bit halves.
                            let sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(if half == 0 { sc8 } else { _mm_srli_si128::<8>(sc8) }));
                            let ql0 = _mm256_loadu_si256(qb.as_ptr().add(64 * half) as *const __m256i);
                            let ql1 = _mm256_loadu_si256(qb.as_ptr().add(64 * half + 32) as *const __m256i);
                            let qh = _mm256_loadu_si256(qb.as_ptr().add(128 + 32 * half) as *const __m256i);
                            let v = [
                                _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3))),
                                _mm256_or_si256(
                                    _mm256_and_si256(ql1, m4),
                                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m3)),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m3)),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                                    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m3)),
                                ),
                            ];
                            for (k, vk) in v.into_iter().enumerate() {
                                let p = _mm256_maddubs_epi16(vk, _mm256_loadu_si256(xq.add(128 * half + 32 * k) as *const __m256i));
                                ai = $dpw(ai, p, _mm256_shuffle_epi8(sc, pick[k]));
                            }
                        }
                        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(d * x.d[8 * b]), acc);
                    }
                }
                hsum(acc) - 32.0 * hsum(off)
            }
        }
    };
}

kq8_loops!(kq8_avx2, "avx2,fma,f16c", dpw_avx2);
kq8_loops!(kq8_vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dpw_vnni);
