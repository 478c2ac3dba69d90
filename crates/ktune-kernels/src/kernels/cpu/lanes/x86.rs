//! The x86 [`Lanes`]: `Avx2` (8 f32 lanes, AVX2 + FMA + F16C) and
//! `Avx512` (16 lanes, AVX-512F), each primitive one intrinsic.

use half::f16;
use std::arch::x86_64::*;

use super::Lanes;

const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// The element-wise binary primitives of the `$w`-bit vector type, each its
/// `_mm{w}_{op}_ps` intrinsic.
macro_rules! binary_ops {
    ($w:literal: $($op:ident)*) => { pastey::paste! { $(
        #[inline(always)]
        fn $op(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see `x86_lanes`.
            unsafe { [<_mm $w _ $op _ps>](a, b) }
        }
    )* } };
}

/// The [`Lanes`] impl of an x86 instruction set from its intrinsics: the
/// element-wise primitives are one intrinsic each, named from the vector width
/// `$w` (`256`: `__m256`, `_mm256_add_ps`, …), the others an expression of the
/// named argument. Every body runs in `unsafe`: a value of the type exists only
/// on a CPU with its features, and loads/stores go through slices checked to
/// hold `N` elements. Also declares the type and its `new_unchecked`.
macro_rules! x86_lanes {
    (
        $(#[$doc:meta])* $t:ident ($features:literal), $w:literal bits, $n:literal lanes,
        load_f16: |$hp:ident| $load_f16:expr,
        load_i8: |$bp:ident| $load_i8:expr,
        splat_f16: |$hb:ident| $splat_f16:expr,
        round: |$ra:ident| $round:expr,
        hsum: |$sa:ident| $hsum:expr,
        hmax: |$ma:ident| $hmax:expr $(,)?
    ) => { pastey::paste! {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $t(());

        impl $t {
            #[doc = concat!("# Safety\nThe CPU must support ", $features, ".")]
            #[inline(always)]
            pub unsafe fn new_unchecked() -> $t {
                $t(())
            }
        }

        // SAFETY (every `unsafe` block of this impl): see the macro's doc.
        impl Lanes for $t {
            type V = [<__m $w>];
            const N: usize = $n;
            #[inline(always)]
            fn splat(self, a: f32) -> Self::V {
                unsafe { [<_mm $w _set1_ps>](a) }
            }
            #[inline(always)]
            fn load(self, s: &[f32]) -> Self::V {
                let s = &s[..$n];
                unsafe { [<_mm $w _loadu_ps>](s.as_ptr()) }
            }
            #[inline(always)]
            fn load_f16(self, s: &[f16]) -> Self::V {
                let $hp = s[..$n].as_ptr();
                unsafe { $load_f16 }
            }
            #[inline(always)]
            fn load_i8(self, s: &[i8]) -> Self::V {
                let $bp = s[..$n].as_ptr();
                unsafe { $load_i8 }
            }
            #[inline(always)]
            fn splat_f16(self, h: f16) -> Self::V {
                let $hb = h.to_bits() as i16;
                unsafe { $splat_f16 }
            }
            #[inline(always)]
            fn store(self, s: &mut [f32], v: Self::V) {
                let s = &mut s[..$n];
                unsafe { [<_mm $w _storeu_ps>](s.as_mut_ptr(), v) }
            }
            binary_ops!($w: add sub mul div max min);
            #[inline(always)]
            fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
                unsafe { [<_mm $w _fmadd_ps>](a, b, c) }
            }
            #[inline(always)]
            fn round(self, $ra: Self::V) -> Self::V {
                unsafe { $round }
            }
            #[inline(always)]
            fn pow2i(self, n: Self::V) -> Self::V {
                // 2^n for integral n: n + 127 into the exponent field.
                unsafe { [<_mm $w _castsi $w _ps>]([<_mm $w _slli_epi32>]::<23>([<_mm $w _add_epi32>]([<_mm $w _cvtps_epi32>](n), [<_mm $w _set1_epi32>](127)))) }
            }
            #[inline(always)]
            fn hsum(self, $sa: Self::V) -> f32 {
                unsafe { $hsum }
            }
            #[inline(always)]
            fn hmax(self, $ma: Self::V) -> f32 {
                unsafe { $hmax }
            }
            #[inline(always)]
            fn swap_pairs(self, a: Self::V) -> Self::V {
                unsafe { [<_mm $w _permute_ps>]::<0xB1>(a) }
            }
        }
    }};
}

x86_lanes! {
    /// AVX2 + FMA + F16C, 8 lanes. Exists only where the CPU has them.
    Avx2 ("AVX2, FMA and F16C"), 256 bits, 8 lanes,
    load_f16: |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
    load_i8: |p| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))),
    splat_f16: |h| _mm256_cvtph_ps(_mm_set1_epi16(h)),
    round: |a| _mm256_round_ps::<NEAREST>(a),
    hsum: |a| {
        let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    },
    hmax: |a| {
        let s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps::<1>(s, s)))
    },
}

x86_lanes! {
    /// AVX-512F, 16 lanes. Exists only where the CPU has it.
    Avx512 ("AVX-512F"), 512 bits, 16 lanes,
    load_f16: |p| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
    load_i8: |p| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))),
    splat_f16: |h| _mm512_cvtph_ps(_mm256_set1_epi16(h)),
    round: |a| _mm512_roundscale_ps::<NEAREST>(a),
    hsum: |a| _mm512_reduce_add_ps(a),
    hmax: |a| _mm512_reduce_max_ps(a),
}
