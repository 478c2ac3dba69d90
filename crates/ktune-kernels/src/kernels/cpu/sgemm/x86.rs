//! The x86 microkernels of the blocked f32 GEMM ([`super::Micro`]): AVX2 + FMA
//! 6x16 and AVX-512F 12x32, stamped out by one macro, and the packing of eight
//! w rows at a time (f16 widened by F16C, 8x8 blocks transposed in registers).

use std::arch::x86_64::*;

use super::CpuIn;

/// One register-blocked microkernel: per depth step two NR/2-wide loads of the B
/// panel, MR broadcasts of the A panel, 2·MR FMAs into MR x 2 vector accumulators.
macro_rules! micro {
    ($name:ident, $feat:literal, $lanes:literal, $mr:literal, [$($r:literal)*],
     $zero:ident, $load:ident, $set1:ident, $fma:ident, $add:ident, $store:ident) => {
        /// # Safety
        /// `a` holds `kc*MR`, `b` `kc*NR` floats; `c` valid for MR rows of NR floats
        /// at stride `ldc`; the target features are available.
        #[target_feature(enable = $feat)]
        pub unsafe fn $name(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, add: bool) {
            let mut lo = [$zero(); $mr];
            let mut hi = [$zero(); $mr];
            // SAFETY: reads stay within the kc*MR / kc*NR panels, writes within the tile.
            unsafe {
                let (mut a, mut b) = (a, b);
                for _ in 0..kc {
                    let b0 = $load(b);
                    let b1 = $load(b.add($lanes));
                    $(
                        let av = $set1(*a.add($r));
                        lo[$r] = $fma(av, b0, lo[$r]);
                        hi[$r] = $fma(av, b1, hi[$r]);
                    )*
                    a = a.add($mr);
                    b = b.add(2 * $lanes);
                }
                $(
                    let cp = c.add($r * ldc);
                    let (mut v0, mut v1) = (lo[$r], hi[$r]);
                    if add {
                        v0 = $add(v0, $load(cp));
                        v1 = $add(v1, $load(cp.add($lanes)));
                    }
                    $store(cp, v0);
                    $store(cp.add($lanes), v1);
                )*
            }
        }
    };
}

micro!(micro_6x16_avx2, "avx2,fma", 8, 6, [0 1 2 3 4 5],
    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps);
micro!(micro_12x32_avx512, "avx512f", 16, 12, [0 1 2 3 4 5 6 7 8 9 10 11],
    _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps);

/// Eight rows of w (from `r0`, all < n), columns `pc..pc+kb`, into lanes 0..8 of a
/// panel of stride `nr`: 8x8 blocks loaded (f16 widened by F16C), transposed in
/// registers and stored 8 lanes per depth step; the depth tail goes scalar.
///
/// # Safety
/// AVX2 and F16C available; rows r0..r0+8 exist in `w`; `out` holds `kb*nr - ..` floats
/// (lanes 0..8 of kb rows of stride nr).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pack8(w: CpuIn<'_>, k: usize, r0: usize, pc: usize, kb: usize, nr: usize, out: &mut [f32]) {
    assert!(out.len() >= (kb.max(1) - 1) * nr + 8);
    let mut p = 0;
    while p + 8 <= kb {
        let mut v = [_mm256_setzero_ps(); 8];
        for (j, vj) in v.iter_mut().enumerate() {
            let off = (r0 + j) * k + pc + p;
            // SAFETY: row r0+j has columns pc+p..pc+p+8 <= k.
            *vj = unsafe {
                match w {
                    CpuIn::F32(s) => _mm256_loadu_ps(s[off..off + 8].as_ptr()),
                    CpuIn::F16(s) => _mm256_cvtph_ps(_mm_loadu_si128(s[off..off + 8].as_ptr() as *const __m128i)),
                    CpuIn::Q(_) | CpuIn::Stack(_) => {
                        let t: [f32; 8] = std::array::from_fn(|i| w.get(off + i));
                        _mm256_loadu_ps(t.as_ptr())
                    }
                }
            };
        }
        let t = transpose8(v);
        for (q, tq) in t.iter().enumerate() {
            // SAFETY: lanes 0..8 of depth row p+q, inside `out` (asserted above).
            unsafe { _mm256_storeu_ps(out[(p + q) * nr..][..8].as_mut_ptr(), *tq) };
        }
        p += 8;
    }
    for j in 0..8 {
        let off = (r0 + j) * k + pc;
        for pp in p..kb {
            out[pp * nr + j] = match w {
                CpuIn::F32(s) => s[off + pp],
                CpuIn::F16(s) => s[off + pp].to_f32(),
                CpuIn::Q(_) | CpuIn::Stack(_) => w.get(off + pp),
            };
        }
    }
}

/// 8x8 transpose: output q holds element q of each input row.
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}
