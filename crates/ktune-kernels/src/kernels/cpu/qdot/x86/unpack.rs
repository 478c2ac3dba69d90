//! The formats without a dedicated loop on x86: a block's values unpacked by AVX2
//! (`unpack_simd`), then f32 or int8 activations dotted with them per 16-element
//! group, and their dequantization.

use std::arch::x86_64::*;

use half::f16;

use super::{GROUP, QFormat, QK, QView, Unpacked, dot_s8, dot32, h, hsum, iq4_table, nibbles, sum32, vals32};

/// The block's values into `v` with AVX2 (the scalar
/// [`unpack_vals`](crate::kernels::quant::unpack_vals) for the 32-element
/// formats with a loop of their own).
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_vals_simd(format: QFormat, q: &[u8], v: &mut [i8; crate::kernels::quant::QK_K]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let vp = v.as_mut_ptr() as *mut __m256i;
    let load = |o: usize| {
        assert!(o + 32 <= q.len());
        // SAFETY: 32 bytes from offset o, inside q (checked above).
        unsafe { _mm256_loadu_si256(q.as_ptr().add(o) as *const __m256i) }
    };
    let lo = |x: __m256i| _mm256_and_si256(x, m4);
    let hi = |x: __m256i| _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    // 0xff in the bytes whose bit `mask` is set.
    let bit = |x: __m256i, mask: i8| {
        let m = _mm256_set1_epi8(mask);
        _mm256_cmpeq_epi8(_mm256_and_si256(x, m), m)
    };
    let levels = iq4_table();
    // SAFETY (every store): vp indexes 32-byte chunks 0..8 of the 256-byte `v`.
    unsafe {
        match format {
            QFormat::Q5_0 | QFormat::Q5_1 | QFormat::IQ4_NL => _mm256_storeu_si256(vp, vals32(format, q)),
            QFormat::Q4_K | QFormat::Q5_K => {
                let (qh, qs) = if format == QFormat::Q5_K { (Some(load(12)), 44) } else { (None, 12) };
                for j in 0..4 {
                    let raw = load(qs + 32 * j);
                    let (mut a, mut b) = (lo(raw), hi(raw));
                    if let Some(h) = qh {
                        let sixteen = _mm256_set1_epi8(0x10);
                        a = _mm256_or_si256(a, _mm256_and_si256(bit(h, (1u8 << (2 * j)) as i8), sixteen));
                        b = _mm256_or_si256(b, _mm256_and_si256(bit(h, (1u8 << (2 * j + 1)) as i8), sixteen));
                    }
                    _mm256_storeu_si256(vp.add(2 * j), a);
                    _mm256_storeu_si256(vp.add(2 * j + 1), b);
                }
            }
            QFormat::Q2_K | QFormat::Q3_K => {
                let three = _mm256_set1_epi8(3);
                let (hm, qs) = if format == QFormat::Q3_K { (Some(load(0)), 32) } else { (None, 16) };
                for h in 0..2 {
                    let raw = load(qs + 32 * h);
                    for sh in 0..4 {
                        let mut x = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * sh as i32)), three);
                        if let Some(m) = hm {
                            let off = _mm256_andnot_si256(bit(m, (1u8 << (4 * h + sh)) as i8), _mm256_set1_epi8(4));
                            x = _mm256_sub_epi8(x, off);
                        }
                        _mm256_storeu_si256(vp.add(4 * h + sh), x);
                    }
                }
            }
            QFormat::Q6_K => {
                let (three, bias) = (_mm256_set1_epi8(3), _mm256_set1_epi8(32));
                for h in 0..2 {
                    let (l0, l1, qh) = (load(64 * h), load(64 * h + 32), load(128 + 32 * h));
                    let high = |k: i32| _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(k)), three), 4);
                    for (sh, low) in [lo(l0), lo(l1), hi(l0), hi(l1)].into_iter().enumerate() {
                        let x = _mm256_sub_epi8(_mm256_or_si256(low, high(2 * sh as i32)), bias);
                        _mm256_storeu_si256(vp.add(4 * h + sh), x);
                    }
                }
            }
            QFormat::IQ4_XS => {
                for ib in 0..8 {
                    assert!(4 + 16 * ib + 16 <= q.len());
                    let n = nibbles(q.as_ptr().add(4 + 16 * ib));
                    _mm256_storeu_si256(vp.add(ib), _mm256_shuffle_epi8(levels, n));
                }
            }
            QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q4_1 => crate::kernels::quant::unpack_vals(format, q, v),
        }
    }
}

/// [`unpack`](crate::kernels::quant::unpack) with the values through AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub fn unpack_simd(format: QFormat, q: &[u8], s: &[f16], u: &mut Unpacked) {
    unpack_vals_simd(format, q, &mut u.vals);
    crate::kernels::quant::unpack_scales(format, q, s, &mut u.scale, &mut u.off);
}

/// 16 unpacked int8 values as two vectors of 8 f32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn vals16(v: *const i8) -> (__m256, __m256) {
    // SAFETY: the caller passes a pointer to 16 readable bytes.
    let raw = unsafe { _mm_loadu_si128(v as *const __m128i) };
    (_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8))))
}

/// f32 activations against a format without a dedicated loop: each block
/// unpacked ([`unpack`](crate::kernels::quant::unpack)) into int8 values with
/// a scale and offset per 16, then 16-wide FMAs.
///
/// # Safety
/// AVX2, FMA and F16C available; `x` holds `w.elems()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_unpacked(x: &[f32], w: QView<'_>) -> f32 {
    let be = w.format.block_elems();
    if be == QK {
        // The 32-element formats: values straight into registers, no unpack.
        let ns = w.format.scales_per_block();
        let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..w.blocks() {
            let (q, s) = w.block(b);
            let v = vals32(w.format, q);
            let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let f = |x: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
            let vv = [f(lo), f(_mm_srli_si128(lo, 8)), f(hi), f(_mm_srli_si128(hi, 8))];
            // SAFETY: block b reads x[32b..32b+32], inside x.
            unsafe {
                let xp = x.as_ptr().add(QK * b);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(h(s[0])), dot32(vv, xp), acc);
                if ns == 2 {
                    accm = _mm256_fmadd_ps(_mm256_set1_ps(h(s[1])), sum32(xp), accm);
                }
            }
        }
        return hsum(_mm256_add_ps(acc, accm));
    }
    let offset = w.format.has_offset();
    let mut u = Unpacked::default();
    let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..w.blocks() {
        let (q, s) = w.block(b);
        unpack_simd(w.format, q, s, &mut u);
        for g in 0..be / GROUP {
            // SAFETY: group g of block b reads x[be*b + 16g..][..16], inside x.
            unsafe {
                let xp = x.as_ptr().add(be * b + GROUP * g);
                let (v0, v1) = vals16(u.vals.as_ptr().add(GROUP * g));
                let (x0, x1) = (_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8)));
                let p = _mm256_fmadd_ps(v1, x1, _mm256_mul_ps(v0, x0));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(u.scale[g]), p, acc);
                if offset {
                    accm = _mm256_fmadd_ps(_mm256_set1_ps(u.off[g]), _mm256_add_ps(x0, x1), accm);
                }
            }
        }
    }
    hsum(_mm256_add_ps(acc, accm))
}

/// int8 activations against a format without a dedicated loop: unpacked
/// int8 weights, 32-lane integer dots per activation block, the two 16-element
/// groups' scales applied per half.
///
/// # Safety
/// AVX2, FMA and F16C available; `x` holds at least `w.elems() / 32` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_i8_unpacked(x: &super::super::XQ8, w: QView<'_>) -> f32 {
    let be = w.format.block_elems();
    if be == QK {
        let ns = w.format.scales_per_block();
        let (mut a0, mut m) = (_mm256_setzero_ps(), 0f32);
        for b in 0..w.blocks() {
            let (q, s) = w.block(b);
            // SAFETY: activation block b holds 32 values of x.q.
            let xv = unsafe { _mm256_loadu_si256(x.q.as_ptr().add(QK * b) as *const __m256i) };
            let p = dot_s8(vals32(w.format, q), xv);
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[0]) * x.d[b]), p, a0);
            if ns == 2 {
                m += h(s[1]) * x.dsum[b];
            }
        }
        return hsum(a0) + m;
    }
    if w.format == QFormat::Q4_K {
        // Q4_K straight from the quants: each 32-byte group of nibbles is two
        // 32-element sub-blocks (low, high), unsigned, so `maddubs` needs no
        // sign trick; the minimum enters through the activation block's Σx.
        let (m4, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        let (mut a0, mut a1, mut m) = (_mm256_setzero_ps(), _mm256_setzero_ps(), 0f32);
        for b in 0..w.blocks() {
            let (q, s) = w.block(b);
            let (d, dmin) = (h(s[0]), h(s[1]));
            assert!(q.len() >= 140);
            for jj in 0..4 {
                let xb = 8 * b + 2 * jj;
                let (sc0, m0) = crate::kernels::quant::scale_min_k4(2 * jj, &q[..12]);
                let (sc1, m1) = crate::kernels::quant::scale_min_k4(2 * jj + 1, &q[..12]);
                // SAFETY: bytes 12 + 32jj .. + 32 of q (checked above); activation blocks xb, xb + 1.
                unsafe {
                    let raw = _mm256_loadu_si256(q.as_ptr().add(12 + 32 * jj) as *const __m256i);
                    let (lo, hi) = (_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
                    let x0 = _mm256_loadu_si256(x.q.as_ptr().add(QK * xb) as *const __m256i);
                    let x1 = _mm256_loadu_si256(x.q.as_ptr().add(QK * (xb + 1)) as *const __m256i);
                    let p0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), ones));
                    let p1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), ones));
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(d * sc0 as f32 * x.d[xb]), p0, a0);
                    a1 = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1 as f32 * x.d[xb + 1]), p1, a1);
                }
                m -= dmin * (m0 as f32 * x.dsum[xb] + m1 as f32 * x.dsum[xb + 1]);
            }
        }
        return hsum(_mm256_add_ps(a0, a1)) + m;
    }
    let per = be / QK;
    let offset = w.format.has_offset();
    let mut u = Unpacked::default();
    let mut acc = _mm256_setzero_ps();
    let mut m = 0f32;
    for b in 0..w.blocks() {
        let (q, s) = w.block(b);
        unpack_simd(w.format, q, s, &mut u);
        for a in 0..per {
            let xb = b * per + a;
            // SAFETY: activation block xb holds 32 values of x.q; the unpacked block 32 per a.
            unsafe {
                let wv = _mm256_loadu_si256(u.vals.as_ptr().add(QK * a) as *const __m256i);
                let xv = _mm256_loadu_si256(x.q.as_ptr().add(QK * xb) as *const __m256i);
                let p = dot_s8(wv, xv);
                let xd = x.d[xb];
                let sc = _mm256_set_m128(_mm_set1_ps(u.scale[2 * a + 1] * xd), _mm_set1_ps(u.scale[2 * a] * xd));
                acc = _mm256_fmadd_ps(sc, p, acc);
            }
            if offset {
                m += u.off[2 * a] * x.dsum16[2 * xb] + u.off[2 * a + 1] * x.dsum16[2 * xb + 1];
            }
        }
    }
    hsum(acc) + m
}

/// Dequantizes blocks of a format without a dedicated loop (bit-identical to
/// the reference: products and sums rounded separately).
///
/// # Safety
/// AVX2 available; `out` holds `w.elems()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize_unpacked(w: QView<'_>, out: &mut [f32]) {
    let be = w.format.block_elems();
    let offset = w.format.has_offset();
    let mut u = Unpacked::default();
    for b in 0..w.blocks() {
        let (q, s) = w.block(b);
        unpack_simd(w.format, q, s, &mut u);
        for g in 0..be / GROUP {
            // SAFETY: writes out[be*b + 16g..][..16], inside out.
            unsafe {
                let (v0, v1) = vals16(u.vals.as_ptr().add(GROUP * g));
                let sc = _mm256_set1_ps(u.scale[g]);
                let (mut y0, mut y1) = (_mm256_mul_ps(v0, sc), _mm256_mul_ps(v1, sc));
                if offset {
                    let o = _mm256_set1_ps(u.off[g]);
                    (y0, y1) = (_mm256_add_ps(y0, o), _mm256_add_ps(y1, o));
                }
                let op = out.as_mut_ptr().add(be * b + GROUP * g);
                _mm256_storeu_ps(op, y0);
                _mm256_storeu_ps(op.add(8), y1);
            }
        }
    }
}
