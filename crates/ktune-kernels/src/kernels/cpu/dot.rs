//! Single-threaded SIMD microkernels on f32 activations and f32 or f16 weight rows:
//! dot products one row or four at a time (the activation vector loaded once for
//! four rows), two activation rows by four weight rows, `axpy`, and the fused
//! add + sum of squares and scale-by-gain passes of the norm kernels.
//!
//! Every path accumulates in f32 with several independent accumulators. Each x86
//! microkernel is written once, generic over the weight element ([`Weight`]: an f32
//! load or an f16 load widened by F16C), so f32 and f16 rows run the same code.

use half::f16;

use super::Isa;
use super::lanes::{Elem, Lanes, isa_dispatch};

/// A row of weights in either storage type.
#[derive(Clone, Copy)]
pub enum Row<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

/// `$e` with `$w` bound to the f32 or the f16 slice of a [`Row`] (one generic body
/// for both storage types).
macro_rules! with_row {
    ($row:expr, |$w:ident| $e:expr) => {
        match $row {
            $crate::kernels::cpu::Row::F32($w) => $e,
            $crate::kernels::cpu::Row::F16($w) => $e,
        }
    };
}
pub(crate) use with_row;

/// `$e` with `$a` and `$b` bound to the slices of two rows of the same storage type
/// (the registry checks both against the variant's dtype; mixed rows do nothing).
macro_rules! with_row_pair {
    ($ra:expr, $rb:expr, |$a:ident, $b:ident| $e:expr) => {
        match ($ra, $rb) {
            ($crate::kernels::cpu::Row::F32($a), $crate::kernels::cpu::Row::F32($b)) => $e,
            ($crate::kernels::cpu::Row::F16($a), $crate::kernels::cpu::Row::F16($b)) => $e,
            _ => {}
        }
    };
}
pub(crate) use with_row_pair;

/// A weight element the SIMD microkernels load (f32, or f16 widened on load).
#[cfg(target_arch = "x86_64")]
pub trait Weight: Elem + x86::Load {}
/// A weight element the SIMD microkernels load (f32, or f16 widened on load).
#[cfg(not(target_arch = "x86_64"))]
pub trait Weight: Elem {}
impl Weight for f32 {}
impl Weight for f16 {}

/// `Σ x[i] * w[i]` over `x.len()` elements.
#[inline]
pub fn dot(isa: Isa, x: &[f32], w: Row<'_>) -> f32 {
    match w {
        Row::F32(w) => dot_f32(isa, x, w),
        Row::F16(w) => dot_f16(isa, x, w),
    }
}

/// Four dot products sharing `x`.
#[inline]
pub fn dot4(isa: Isa, x: &[f32], w: [Row<'_>; 4]) -> [f32; 4] {
    match w {
        [Row::F32(a), Row::F32(b), Row::F32(c), Row::F32(d)] => dot4_f32(isa, x, [a, b, c, d]),
        [Row::F16(a), Row::F16(b), Row::F16(c), Row::F16(d)] => dot4_f16(isa, x, [a, b, c, d]),
        _ => [dot(isa, x, w[0]), dot(isa, x, w[1]), dot(isa, x, w[2]), dot(isa, x, w[3])],
    }
}

pub fn dot_f32(isa: Isa, x: &[f32], w: &[f32]) -> f32 {
    #[cfg(target_arch = "aarch64")]
    if isa != Isa::Scalar {
        let n = x.len().min(w.len());
        // SAFETY: NEON is reported by the CPU (checked in `Isa::best`).
        return unsafe { arm::dot_f32_neon(&x[..n], &w[..n]) };
    }
    dot_w(isa, x, w)
}

pub fn dot_f16(isa: Isa, x: &[f32], w: &[f16]) -> f32 {
    dot_w(isa, x, w)
}

fn dot_w<W: Weight>(isa: Isa, x: &[f32], w: &[W]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (the AVX2 level includes FMA and F16C).
        Isa::Simd256 => unsafe { x86::dot_avx2(x, w) },
        _ => dot_scalar(x, w),
    }
}

pub fn dot4_f32(isa: Isa, x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
    dot4_w(isa, x, w, dot_f32)
}

pub fn dot4_f16(isa: Isa, x: &[f32], w: [&[f16]; 4]) -> [f32; 4] {
    dot4_w(isa, x, w, dot_f16)
}

fn dot4_w<W: Weight>(isa: Isa, x: &[f32], w: [&[W]; 4], one: fn(Isa, &[f32], &[W]) -> f32) -> [f32; 4] {
    let n = w.iter().fold(x.len(), |m, r| m.min(r.len()));
    let x = &x[..n];
    let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot4_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Simd256 => unsafe { x86::dot4_avx2(x, w) },
        _ => w.map(|r| one(isa, x, r)),
    }
}

/// `y[i] += a * x[i]`.
pub fn axpy(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    axpy_row(isa, a, Row::F32(x), y)
}

/// `y += a * x` for an f32 or f16 row (one FMA per lane on the SIMD levels).
#[inline]
pub fn axpy_row(isa: Isa, a: f32, x: Row<'_>, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (a: f32 = a, x: Row<'_> = x, y: &mut [f32] = y) -> () {
        with_row!(x, |x| axpy_k(l, a, x, y))
    })
}

#[inline(always)]
fn axpy_k<L: Lanes, W: Elem>(l: L, a: f32, x: &[W], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    let av = l.splat(a);
    let mut ys = y.chunks_exact_mut(L::N);
    for (yc, xc) in (&mut ys).zip(x.chunks_exact(L::N)) {
        let v = l.fma(av, W::load(l, xc), l.load(yc));
        l.store(yc, v);
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o += a * x[t + i].f32();
    }
}

/// Portable dot product: eight interleaved accumulators.
pub fn dot_scalar<W: Elem>(x: &[f32], w: &[W]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += x[c * 8 + l] * w[c * 8 + l].f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..x.len() {
        s += x[i] * w[i].f32();
    }
    s
}

pub fn dot_f32_scalar(x: &[f32], w: &[f32]) -> f32 {
    dot_scalar(x, w)
}

/// `h = x + r`; returns `Σ h²`. `Isa::Simd256` and `Isa::Avx512` both take the
/// AVX2+FMA path on x86 (memory-bound); other targets use portable loops.
pub fn add_sumsq(isa: Isa, x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
    let n = x.len().min(r.len()).min(h.len());
    let (x, r, h) = (&x[..n], &r[..n], &mut h[..n]);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 and FMA are reported by the CPU; slices have equal length n.
        return unsafe { x86::add_sumsq(x, r, h) };
    }
    let _ = isa;
    let mut acc = [0f32; 8];
    let body = n / 8 * 8;
    for ((hc, xc), rc) in h[..body].chunks_exact_mut(8).zip(x.chunks_exact(8)).zip(r.chunks_exact(8)) {
        for (l, a) in acc.iter_mut().enumerate() {
            let v = xc[l] + rc[l];
            hc[l] = v;
            *a += v * v;
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in body..n {
        let v = x[i] + r[i];
        h[i] = v;
        s += v * v;
    }
    s
}

/// `dst[i] = src[i] * s * g[i]` (AVX2+FMA on x86 at any SIMD level).
pub fn scale_mul(isa: Isa, src: &[f32], s: f32, g: &[f32], dst: &mut [f32]) {
    let n = src.len().min(g.len()).min(dst.len());
    let (src, g, dst) = (&src[..n], &g[..n], &mut dst[..n]);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 and FMA are reported by the CPU; slices have equal length n.
        unsafe { x86::scale_mul(src, s, g, dst) };
        return;
    }
    let _ = isa;
    for ((d, v), w) in dst.iter_mut().zip(src).zip(g) {
        *d = v * s * w;
    }
}

/// Dot products of two activation rows with four weight rows: `[[x0·w_r], [x1·w_r]]`
/// (AVX2+FMA on x86 at any SIMD level: register-limited at 2x4).
pub fn dot2x4(isa: Isa, x0: &[f32], x1: &[f32], w: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let n = w.iter().fold(x0.len().min(x1.len()), |m, r| m.min(r.len()));
    let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 and FMA are reported by the CPU; all six slices have length >= n.
        return unsafe { x86::dot2x4(&x0[..n], &x1[..n], w) };
    }
    [dot4_f32(isa, &x0[..n], w), dot4_f32(isa, &x1[..n], w)]
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
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
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    #[target_feature(enable = "neon")]
    pub unsafe fn dot_f32_neon(x: &[f32], w: &[f32]) -> f32 {
        let n = x.len();
        let mut a = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        // SAFETY: loads read [i, i+4) with i + 4 <= n.
        unsafe {
            while i + 16 <= n {
                for l in 0..4 {
                    a[l] = vfmaq_f32(a[l], vld1q_f32(x.as_ptr().add(i + 4 * l)), vld1q_f32(w.as_ptr().add(i + 4 * l)));
                }
                i += 16;
            }
        }
        let mut s = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
        while i < n {
            s += x[i] * w[i];
            i += 1;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata;
    use super::*;

    #[test]
    fn every_isa_matches_f64_dot_at_odd_lengths() {
        for n in [0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 1153] {
            let (x, w) = (testdata::signed(n, 2 * n as u64), testdata::signed(n, 2 * n as u64 + 1));
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let exact: f64 = x.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum();
            let exact_h: f64 = x.iter().zip(&wh).map(|(a, b)| *a as f64 * b.to_f64()).sum();
            for isa in [Isa::Scalar, Isa::from_param(2), Isa::best()] {
                let tol = 1e-5 * (n as f64).max(1.0);
                assert!((dot_f32(isa, &x, &w) as f64 - exact).abs() < tol, "f32 {isa:?} n={n}");
                assert!((dot_f16(isa, &x, &wh) as f64 - exact_h).abs() < tol, "f16 {isa:?} n={n}");
                let four = dot4_f32(isa, &x, [&w, &w, &w, &w]);
                let four_h = dot4_f16(isa, &x, [&wh, &wh, &wh, &wh]);
                for r in 0..4 {
                    assert!((four[r] as f64 - exact).abs() < tol, "dot4 f32 {isa:?} n={n}");
                    assert!((four_h[r] as f64 - exact_h).abs() < tol, "dot4 f16 {isa:?} n={n}");
                }
                let mut y = x.clone();
                axpy(isa, 0.5, &w, &mut y);
                for i in 0..n {
                    assert!((y[i] - (x[i] + 0.5 * w[i])).abs() < 1e-6);
                }
                let mut yh = x.clone();
                axpy_row(isa, 0.5, Row::F16(&wh), &mut yh);
                for i in 0..n {
                    assert!((yh[i] - (x[i] + 0.5 * wh[i].to_f32())).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn fused_microkernels_agree_across_isas() {
        let n = 67;
        let (x, r) = (testdata::signed(n, 1), testdata::signed(n, 2));
        let ws: Vec<Vec<f32>> = (0..4).map(|s| testdata::uniform(n, 3 + s, -0.2, 0.2)).collect();
        for v in super::super::ISA_VALUES {
            let isa = Isa::from_param(*v);
            let mut h = vec![0f32; n];
            let ss = add_sumsq(isa, &x, &r, &mut h);
            let want: f64 = x.iter().zip(&r).map(|(a, b)| ((a + b) as f64).powi(2)).sum();
            assert!((ss as f64 - want).abs() < 1e-4 * want.max(1.0));
            let mut y = vec![0f32; n];
            scale_mul(isa, &h, 0.5, &x, &mut y);
            for i in 0..n {
                assert!((y[i] - h[i] * 0.5 * x[i]).abs() < 1e-6);
            }
            let d = dot2x4(isa, &x, &r, [&ws[0], &ws[1], &ws[2], &ws[3]]);
            for (t, xt) in [&x, &r].iter().enumerate() {
                for (j, wr) in ws.iter().enumerate() {
                    let want: f64 = xt.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((d[t][j] as f64 - want).abs() < 1e-4, "isa {v} token {t} row {j}");
                }
            }
        }
    }
}
