//! Single-threaded SIMD microkernels (seed 003) shared by the CPU kernels: dot
//! products of f32 activations with f32 or f16 rows, one row or four at a time
//! (the activation vector loaded once for four rows), and `axpy`.
//!
//! The instruction set is picked at run time ([`Isa::best`]); kernels expose it as
//! the `isa` parameter so the tuner can compare levels (`0` = best available,
//! `2` = AVX2+FMA / NEON, `1` = portable scalar). Every path accumulates in f32
//! with several independent accumulators.

use half::f16;

/// Instruction-set level of a microkernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA (+ F16C for f16 rows) on x86, NEON on aarch64.
    Simd256,
    /// AVX-512F on x86.
    Avx512,
}

impl Isa {
    /// The widest level this CPU supports.
    pub fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Simd256;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                return Isa::Simd256;
            }
        }
        Isa::Scalar
    }

    /// From the `isa` kernel parameter: 0 best, 1 scalar, 2 AVX2/NEON; never above `best()`.
    pub fn from_param(v: u32) -> Isa {
        let best = Isa::best();
        let want = match v {
            1 => Isa::Scalar,
            2 => Isa::Simd256,
            _ => best,
        };
        if want as u8 > best as u8 { best } else { want }
    }

    /// Whether the `isa` parameter value is available on this CPU (for validity checks).
    pub fn param_available(v: u32) -> Result<(), String> {
        let best = Isa::best();
        match v {
            2 if best == Isa::Scalar => Err("isa=2 needs AVX2+FMA+F16C or NEON".into()),
            _ => Ok(()),
        }
    }
}

/// The `isa` parameter spec shared by CPU kernels.
pub const ISA_VALUES: &[u32] = &[0, 1, 2];
pub const ISA_HELP: &str = "instruction set: 0 best available (AVX-512 > AVX2 > NEON), 1 scalar, 2 AVX2+FMA or NEON";

/// A row of weights in either storage type.
#[derive(Clone, Copy)]
pub enum Row<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

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
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot_f32_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Simd256 => unsafe { x86::dot_f32_avx2(x, w) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is reported by the CPU (checked in `Isa::best`).
        Isa::Simd256 | Isa::Avx512 => unsafe { arm::dot_f32_neon(x, w) },
        _ => dot_f32_scalar(x, w),
    }
}

pub fn dot_f16(isa: Isa, x: &[f32], w: &[f16]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot_f16_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (AVX2 level includes F16C).
        Isa::Simd256 => unsafe { x86::dot_f16_avx2(x, w) },
        _ => dot_f16_scalar(x, w),
    }
}

pub fn dot4_f32(isa: Isa, x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
    let n = w.iter().fold(x.len(), |m, r| m.min(r.len()));
    let x = &x[..n];
    let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot4_f32_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Simd256 => unsafe { x86::dot4_f32_avx2(x, w) },
        _ => [dot_f32(isa, x, w[0]), dot_f32(isa, x, w[1]), dot_f32(isa, x, w[2]), dot_f32(isa, x, w[3])],
    }
}

pub fn dot4_f16(isa: Isa, x: &[f32], w: [&[f16]; 4]) -> [f32; 4] {
    let n = w.iter().fold(x.len(), |m, r| m.min(r.len()));
    let x = &x[..n];
    let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot4_f16_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Simd256 => unsafe { x86::dot4_f16_avx2(x, w) },
        _ => [dot_f16(isa, x, w[0]), dot_f16(isa, x, w[1]), dot_f16(isa, x, w[2]), dot_f16(isa, x, w[3])],
    }
}

/// `y[i] += a * x[i]`.
pub fn axpy(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::axpy_avx512(a, &x[..n], &mut y[..n]) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Simd256 => unsafe { x86::axpy_avx2(a, &x[..n], &mut y[..n]) },
        _ => {
            for (yi, xi) in y[..n].iter_mut().zip(&x[..n]) {
                *yi += a * xi;
            }
        }
    }
}

pub fn dot_f32_scalar(x: &[f32], w: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += x[c * 8 + l] * w[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..x.len() {
        s += x[i] * w[i];
    }
    s
}

pub fn dot_f16_scalar(x: &[f32], w: &[f16]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += x[c * 8 + l] * w[c * 8 + l].to_f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..x.len() {
        s += x[i] * w[i].to_f32();
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_f32_avx512(x: &[f32], w: &[f32]) -> f32 {
        let n = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut a0 = _mm512_setzero_ps();
        let mut a1 = _mm512_setzero_ps();
        let mut a2 = _mm512_setzero_ps();
        let mut a3 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads [i, i+16) with i + 16 <= n for both slices.
        unsafe {
            while i + 64 <= n {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(wp.add(i)), a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 16)), _mm512_loadu_ps(wp.add(i + 16)), a1);
                a2 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 32)), _mm512_loadu_ps(wp.add(i + 32)), a2);
                a3 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 48)), _mm512_loadu_ps(wp.add(i + 48)), a3);
                i += 64;
            }
            while i + 16 <= n {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(wp.add(i)), a0);
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp.add(i)), _mm512_maskz_loadu_ps(m, wp.add(i)), a1);
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)))
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn load_f16x16(p: *const f16) -> __m512 {
        // SAFETY: caller guarantees 16 readable halves at p.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn load_f16x16_masked(p: *const f16, count: usize) -> __m512 {
        let mut tmp = [0u16; 16];
        // SAFETY: caller guarantees `count` (< 16) readable halves at p.
        unsafe {
            std::ptr::copy_nonoverlapping(p as *const u16, tmp.as_mut_ptr(), count);
            _mm512_cvtph_ps(_mm256_loadu_si256(tmp.as_ptr() as *const __m256i))
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_f16_avx512(x: &[f32], w: &[f16]) -> f32 {
        let n = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut a0 = _mm512_setzero_ps();
        let mut a1 = _mm512_setzero_ps();
        let mut a2 = _mm512_setzero_ps();
        let mut a3 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads [i, i+16) with i + 16 <= n; the tail is masked.
        unsafe {
            while i + 64 <= n {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), load_f16x16(wp.add(i)), a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 16)), load_f16x16(wp.add(i + 16)), a1);
                a2 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 32)), load_f16x16(wp.add(i + 32)), a2);
                a3 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i + 48)), load_f16x16(wp.add(i + 48)), a3);
                i += 64;
            }
            while i + 16 <= n {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), load_f16x16(wp.add(i)), a0);
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp.add(i)), load_f16x16_masked(wp.add(i), n - i), a1);
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)))
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot4_f32_avx512(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
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
                    acc[r] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(p[r].add(i)), acc[r]);
                    acc2[r] = _mm512_fmadd_ps(xv2, _mm512_loadu_ps(p[r].add(i + 16)), acc2[r]);
                }
                i += 32;
            }
            while i < n {
                let cnt = (n - i).min(16);
                let m: __mmask16 = if cnt == 16 { 0xffff } else { ((1u32 << cnt) - 1) as u16 };
                let xv = _mm512_maskz_loadu_ps(m, xp.add(i));
                for r in 0..4 {
                    acc[r] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, p[r].add(i)), acc[r]);
                }
                i += cnt;
            }
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
        }
        out
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot4_f16_avx512(x: &[f32], w: [&[f16]; 4]) -> [f32; 4] {
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
                    acc[r] = _mm512_fmadd_ps(xv, load_f16x16(p[r].add(i)), acc[r]);
                    acc2[r] = _mm512_fmadd_ps(xv2, load_f16x16(p[r].add(i + 16)), acc2[r]);
                }
                i += 32;
            }
            while i + 16 <= n {
                let xv = _mm512_loadu_ps(xp.add(i));
                for r in 0..4 {
                    acc[r] = _mm512_fmadd_ps(xv, load_f16x16(p[r].add(i)), acc[r]);
                }
                i += 16;
            }
            if i < n {
                let cnt = n - i;
                let m: __mmask16 = ((1u32 << cnt) - 1) as u16;
                let xv = _mm512_maskz_loadu_ps(m, xp.add(i));
                for r in 0..4 {
                    acc[r] = _mm512_fmadd_ps(xv, load_f16x16_masked(p[r].add(i), cnt), acc[r]);
                }
            }
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
        }
        out
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32_avx2(x: &[f32], w: &[f32]) -> f32 {
        let n = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut a = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: loads read [i, i+8) with i + 8 <= n.
        unsafe {
            while i + 32 <= n {
                for (l, al) in a.iter_mut().enumerate() {
                    *al = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i + 8 * l)), _mm256_loadu_ps(wp.add(i + 8 * l)), *al);
                }
                i += 32;
            }
            while i + 8 <= n {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(wp.add(i)), a[0]);
                i += 8;
            }
        }
        // SAFETY: avx2 enabled on this function.
        let mut s = unsafe { hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]))) };
        while i < n {
            s += x[i] * w[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_avx2(x: &[f32], w: &[f16]) -> f32 {
        let n = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut a = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: loads read [i, i+8) with i + 8 <= n.
        unsafe {
            while i + 32 <= n {
                for (l, al) in a.iter_mut().enumerate() {
                    let wv = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(i + 8 * l) as *const __m128i));
                    *al = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i + 8 * l)), wv, *al);
                }
                i += 32;
            }
            while i + 8 <= n {
                let wv = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(i) as *const __m128i));
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), wv, a[0]);
                i += 8;
            }
        }
        // SAFETY: avx2 enabled on this function.
        let mut s = unsafe { hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]))) };
        while i < n {
            s += x[i] * w[i].to_f32();
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4_f32_avx2(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
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
                    acc[r] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(p[r].add(i)), acc[r]);
                    acc2[r] = _mm256_fmadd_ps(xv2, _mm256_loadu_ps(p[r].add(i + 8)), acc2[r]);
                }
                i += 16;
            }
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            // SAFETY: avx2 enabled on this function.
            out[r] = unsafe { hsum256(_mm256_add_ps(acc[r], acc2[r])) };
            for j in i..n {
                out[r] += x[j] * w[r][j];
            }
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot4_f16_avx2(x: &[f32], w: [&[f16]; 4]) -> [f32; 4] {
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
                    let w0 = _mm256_cvtph_ps(_mm_loadu_si128(p[r].add(i) as *const __m128i));
                    let w1 = _mm256_cvtph_ps(_mm_loadu_si128(p[r].add(i + 8) as *const __m128i));
                    acc[r] = _mm256_fmadd_ps(xv, w0, acc[r]);
                    acc2[r] = _mm256_fmadd_ps(xv2, w1, acc2[r]);
                }
                i += 16;
            }
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            // SAFETY: avx2 enabled on this function.
            out[r] = unsafe { hsum256(_mm256_add_ps(acc[r], acc2[r])) };
            for j in i..n {
                out[r] += x[j] * w[r][j].to_f32();
            }
        }
        out
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy_avx512(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let av = _mm512_set1_ps(a);
        let mut i = 0;
        // SAFETY: loads/stores in [0, n) for both slices of length n.
        unsafe {
            while i + 16 <= n {
                let yv = _mm512_fmadd_ps(av, _mm512_loadu_ps(x.as_ptr().add(i)), _mm512_loadu_ps(y.as_ptr().add(i)));
                _mm512_storeu_ps(y.as_mut_ptr().add(i), yv);
                i += 16;
            }
        }
        while i < n {
            y[i] += a * x[i];
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY: loads/stores in [0, n) for both slices of length n.
        unsafe {
            while i + 8 <= n {
                let yv = _mm256_fmadd_ps(av, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(y.as_ptr().add(i)));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), yv);
                i += 8;
            }
        }
        while i < n {
            y[i] += a * x[i];
            i += 1;
        }
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
    use super::*;

    fn data(n: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
        let x: Vec<f32> = (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect();
        let w: Vec<f32> = (0..n).map(|i| (((i as u32).wrapping_mul(40503) ^ seed) % 997) as f32 / 498.0 - 1.0).collect();
        (x, w)
    }

    #[test]
    fn every_isa_matches_f64_dot_at_odd_lengths() {
        for n in [0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 1153] {
            let (x, w) = data(n, n as u32);
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
            }
        }
    }
}
