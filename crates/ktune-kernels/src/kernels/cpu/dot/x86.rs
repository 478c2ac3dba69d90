//! The x86 dot microkernels (AVX2 + FMA + F16C, AVX-512F): one and four rows,
//! two by four, axpy and the norm passes, each written once over the weight
//! element ([`Weight`](super::Weight): f32, or f16 widened by F16C); the horizontal sums the
//! other x86 loops of the CPU layer share.

use half::f16;
use std::arch::x86_64::*;

/// Loads of 8 or 16 weights as f32 lanes (f16 widened by F16C).
///
/// # Safety (every method)
/// The pointer must reach the stated number of readable elements, and the CPU
/// must have the features of the calling microkernel.
pub trait Load: Copy {
    unsafe fn load8(p: *const Self) -> __m256;
    unsafe fn load16(p: *const Self) -> __m512;
    /// `count` (< 16) elements, the other lanes zero.
    unsafe fn load16_masked(p: *const Self, count: usize) -> __m512;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load16_masked(p: *const f32, count: usize) -> __m512 {
        // SAFETY: the caller's contract; masked lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(mask16(count), p) }
    }
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load16_masked(p: *const f16, count: usize) -> __m512 {
        let mut tmp = [0u16; 16];
        // SAFETY: the caller guarantees `count` (< 16) readable halves at p.
        unsafe {
            std::ptr::copy_nonoverlapping(p as *const u16, tmp.as_mut_ptr(), count);
            _mm512_cvtph_ps(_mm256_loadu_si256(tmp.as_ptr() as *const __m256i))
        }
    }
}

/// The first `count` (<= 16) lanes.
#[inline(always)]
fn mask16(count: usize) -> __mmask16 {
    if count >= 16 { 0xffff } else { ((1u32 << count) - 1) as u16 }
}

/// Horizontal sum of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_avx512<W: super::Weight>(x: &[f32], w: &[W]) -> f32 {
    let n = x.len();
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut a = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads [i, i+16) with i + 16 <= n for both slices; the tail is masked.
    unsafe {
        while i + 64 <= n {
            for (l, al) in a.iter_mut().enumerate() {
                *al = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 16 * l)), W::load16(wp.add(i + 16 * l)), *al);
            }
            i += 64;
        }
        while i + 16 <= n {
            a[0] = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), W::load16(wp.add(i)), a[0]);
            i += 16;
        }
        if i < n {
            let m = mask16(n - i);
            a[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp.add(i)), W::load16_masked(wp.add(i), n - i), a[1]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])))
}

#[inline]
#[target_feature(enable = "avx512f")]
pub unsafe fn dot4_avx512<W: super::Weight>(x: &[f32], w: [&[W]; 4]) -> [f32; 4] {
    let n = x.len();
    let xp = x.as_ptr();
    let p = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut acc2 = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: all five slices have length n; loads stay in [0, n).
    unsafe {
        while i + 32 <= n {
            let xv = _mm512_loadu_ps(xp.add(i));
            let xv2 = _mm512_loadu_ps(xp.add(i + 16));
            for r in 0..4 {
                acc[r] = _mm512_fmadd_ps(xv, W::load16(p[r].add(i)), acc[r]);
                acc2[r] = _mm512_fmadd_ps(xv2, W::load16(p[r].add(i + 16)), acc2[r]);
            }
            i += 32;
        }
        while i + 16 <= n {
            let xv = _mm512_loadu_ps(xp.add(i));
            for r in 0..4 {
                acc[r] = _mm512_fmadd_ps(xv, W::load16(p[r].add(i)), acc[r]);
            }
            i += 16;
        }
        if i < n {
            let cnt = n - i;
            let xv = _mm512_maskz_loadu_ps(mask16(cnt), xp.add(i));
            for r in 0..4 {
                acc[r] = _mm512_fmadd_ps(xv, W::load16_masked(p[r].add(i), cnt), acc[r]);
            }
        }
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
    }
    out
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_avx2<W: super::Weight>(x: &[f32], w: &[W]) -> f32 {
    let n = x.len();
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: loads read [i, i+8) with i + 8 <= n.
    unsafe {
        while i + 32 <= n {
            for (l, al) in a.iter_mut().enumerate() {
                *al = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i + 8 * l)), W::load8(wp.add(i + 8 * l)), *al);
            }
            i += 32;
        }
        while i + 8 <= n {
            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), W::load8(wp.add(i)), a[0]);
            i += 8;
        }
    }
    let mut s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    while i < n {
        s += x[i] * w[i].f32();
        i += 1;
    }
    s
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_avx2<W: super::Weight>(x: &[f32], w: [&[W]; 4]) -> [f32; 4] {
    let n = x.len();
    let xp = x.as_ptr();
    let p = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc2 = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: loads stay in [0, n) for all slices of length n.
    unsafe {
        while i + 16 <= n {
            let xv = _mm256_loadu_ps(xp.add(i));
            let xv2 = _mm256_loadu_ps(xp.add(i + 8));
            for r in 0..4 {
                acc[r] = _mm256_fmadd_ps(xv, W::load8(p[r].add(i)), acc[r]);
                acc2[r] = _mm256_fmadd_ps(xv2, W::load8(p[r].add(i + 8)), acc2[r]);
            }
            i += 16;
        }
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        out[r] = hsum256(_mm256_add_ps(acc[r], acc2[r]));
        for j in i..n {
            out[r] += x[j] * w[r][j].f32();
        }
    }
    out
}

/// `out[c] = x · w_c` over `out.len()` rows of `w` of `x.len()` each, back to
/// back, stamped out per instruction set: four rows a `$dot4` (inlined), the
/// rest one at a time by `$dot` (the bits of calling them row by row).
macro_rules! dot_rows {
    ($name:ident, $feat:literal, $dot4:ident, $dot:ident) => {
        /// # Safety
        /// The CPU has the function's features; `w` holds `out.len()` rows of `x.len()`.
        #[target_feature(enable = $feat)]
        pub unsafe fn $name<W: super::Weight>(x: &[f32], w: &[W], out: &mut [f32]) {
            let n = x.len();
            let row = |c: usize| &w[c * n..][..n];
            let mut c = 0;
            // SAFETY: the caller's features; every row has `n` elements.
            unsafe {
                while c + 4 <= out.len() {
                    let r = $dot4(x, [row(c), row(c + 1), row(c + 2), row(c + 3)]);
                    out[c..c + 4].copy_from_slice(&r);
                    c += 4;
                }
                while c < out.len() {
                    out[c] = $dot(x, row(c));
                    c += 1;
                }
            }
        }
    };
}
dot_rows!(dot_rows_avx512, "avx512f", dot4_avx512, dot_avx512);
dot_rows!(dot_rows_avx2, "avx2,fma,f16c", dot4_avx2, dot_avx2);

#[target_feature(enable = "avx2,fma")]
pub unsafe fn add_sumsq(x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
    let n = x.len();
    let (xp, rp, hp) = (x.as_ptr(), r.as_ptr(), h.as_mut_ptr());
    let mut a0 = _mm256_setzero_ps();
    let mut a1 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: x, r and h have length n; every access is in [i, i + 8) with i + 8 <= n.
    unsafe {
        while i + 16 <= n {
            let v0 = _mm256_add_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(rp.add(i)));
            let v1 = _mm256_add_ps(_mm256_loadu_ps(xp.add(i + 8)), _mm256_loadu_ps(rp.add(i + 8)));
            _mm256_storeu_ps(hp.add(i), v0);
            _mm256_storeu_ps(hp.add(i + 8), v1);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
            a1 = _mm256_fmadd_ps(v1, v1, a1);
            i += 16;
        }
        while i + 8 <= n {
            let v0 = _mm256_add_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(rp.add(i)));
            _mm256_storeu_ps(hp.add(i), v0);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
            i += 8;
        }
    }
    let mut s = hsum256(_mm256_add_ps(a0, a1));
    while i < n {
        let v = x[i] + r[i];
        h[i] = v;
        s += v * v;
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn scale_mul(src: &[f32], s: f32, g: &[f32], dst: &mut [f32]) {
    let n = src.len();
    let (sp, gp, dp) = (src.as_ptr(), g.as_ptr(), dst.as_mut_ptr());
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    // SAFETY: src, g and dst have length n; every access is in [i, i + 8) with i + 8 <= n.
    unsafe {
        while i + 8 <= n {
            let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sp.add(i)), sv), _mm256_loadu_ps(gp.add(i)));
            _mm256_storeu_ps(dp.add(i), v);
            i += 8;
        }
    }
    while i < n {
        dst[i] = src[i] * s * g[i];
        i += 1;
    }
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot2x4(x0: &[f32], x1: &[f32], w: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let n = x0.len();
    let (ap, bp) = (x0.as_ptr(), x1.as_ptr());
    let wp = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: all six slices have length n; loads read [i, i + 8) with i + 8 <= n.
    unsafe {
        while i + 8 <= n {
            let xa = _mm256_loadu_ps(ap.add(i));
            let xb = _mm256_loadu_ps(bp.add(i));
            for r in 0..4 {
                let wv = _mm256_loadu_ps(wp[r].add(i));
                acc0[r] = _mm256_fmadd_ps(xa, wv, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(xb, wv, acc1[r]);
            }
            i += 8;
        }
    }
    let mut out = [[0f32; 4]; 2];
    for r in 0..4 {
        let (mut s0, mut s1) = (hsum256(acc0[r]), hsum256(acc1[r]));
        for c in i..n {
            s0 += x0[c] * w[r][c];
            s1 += x1[c] * w[r][c];
        }
        out[0][r] = s0;
        out[1][r] = s1;
    }
    out
}
