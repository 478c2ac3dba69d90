//! The x86 [`Lanes`]: `Avx2` (8 f32 lanes, AVX2 + FMA + F16C) and
//! `Avx512` (16 lanes, AVX-512F), each primitive one intrinsic.

use half::f16;
use std::arch::x86_64::*;

use super::Lanes;

const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// The [`Lanes`] impl of an x86 instruction set from its intrinsics: the
/// element-wise primitives are one intrinsic each, the others an expression of
/// the named argument. Every body runs in `unsafe`: a value of the type exists
/// only on a CPU with its features, and loads/stores go through slices checked
/// to hold `N` elements. Also declares the type and its `new_unchecked`.
macro_rules! x86_lanes {
    (
        $(#[$doc:meta])* $t:ident ($features:literal), $v:ty, $n:literal,
        splat: $splat:ident, load: $load:ident, store: $store:ident,
        binary: [$($op:ident: $opf:ident),*], fma: $fma:ident,
        load_f16: |$hp:ident| $load_f16:expr,
        round: |$ra:ident| $round:expr,
        pow2i: |$pn:ident| $pow2i:expr,
        hsum: |$sa:ident| $hsum:expr,
        hmax: |$ma:ident| $hmax:expr,
        swap_pairs: |$wa:ident| $swap:expr $(,)?
    ) => {
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
            type V = $v;
            const N: usize = $n;
            #[inline(always)]
            fn splat(self, a: f32) -> $v {
                unsafe { $splat(a) }
            }
            #[inline(always)]
            fn load(self, s: &[f32]) -> $v {
                let s = &s[..$n];
                unsafe { $load(s.as_ptr()) }
            }
            #[inline(always)]
            fn load_f16(self, s: &[f16]) -> $v {
                let $hp = s[..$n].as_ptr();
                unsafe { $load_f16 }
            }
            #[inline(always)]
            fn store(self, s: &mut [f32], v: $v) {
                let s = &mut s[..$n];
                unsafe { $store(s.as_mut_ptr(), v) }
            }
            $(
                #[inline(always)]
                fn $op(self, a: $v, b: $v) -> $v {
                    unsafe { $opf(a, b) }
                }
            )*
            #[inline(always)]
            fn fma(self, a: $v, b: $v, c: $v) -> $v {
                unsafe { $fma(a, b, c) }
            }
            #[inline(always)]
            fn round(self, $ra: $v) -> $v {
                unsafe { $round }
            }
            #[inline(always)]
            fn pow2i(self, $pn: $v) -> $v {
                unsafe { $pow2i }
            }
            #[inline(always)]
            fn hsum(self, $sa: $v) -> f32 {
                unsafe { $hsum }
            }
            #[inline(always)]
            fn hmax(self, $ma: $v) -> f32 {
                unsafe { $hmax }
            }
            #[inline(always)]
            fn swap_pairs(self, $wa: $v) -> $v {
                unsafe { $swap }
            }
        }
    };
}

x86_lanes! {
    /// AVX2 + FMA + F16C, 8 lanes. Exists only where the CPU has them.
    Avx2 ("AVX2, FMA and F16C"), __m256, 8,
    splat: _mm256_set1_ps, load: _mm256_loadu_ps, store: _mm256_storeu_ps,
    binary: [add: _mm256_add_ps, sub: _mm256_sub_ps, mul: _mm256_mul_ps, div: _mm256_div_ps, max: _mm256_max_ps, min: _mm256_min_ps],
    fma: _mm256_fmadd_ps,
    load_f16: |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
    round: |a| _mm256_round_ps::<NEAREST>(a),
    pow2i: |n| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)))),
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
    swap_pairs: |a| _mm256_permute_ps::<0xB1>(a),
}

x86_lanes! {
    /// AVX-512F, 16 lanes. Exists only where the CPU has it.
    Avx512 ("AVX-512F"), __m512, 16,
    splat: _mm512_set1_ps, load: _mm512_loadu_ps, store: _mm512_storeu_ps,
    binary: [add: _mm512_add_ps, sub: _mm512_sub_ps, mul: _mm512_mul_ps, div: _mm512_div_ps, max: _mm512_max_ps, min: _mm512_min_ps],
    fma: _mm512_fmadd_ps,
    load_f16: |p| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
    round: |a| _mm512_roundscale_ps::<NEAREST>(a),
    pow2i: |n| _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)))),
    hsum: |a| _mm512_reduce_add_ps(a),
    hmax: |a| _mm512_reduce_max_ps(a),
    swap_pairs: |a| _mm512_permute_ps::<0xB1>(a),
}
