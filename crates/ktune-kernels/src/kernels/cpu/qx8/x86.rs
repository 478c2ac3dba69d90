//! The x86 loops over X8 records: the int8 family (`vpdpbusd` on AVX-512 VNNI,
//! `maddubs` + `madd` on AVX2) and the f32-activation family (FMA on AVX2, or
//! AVX-512VL's EVEX forms), each stamped out per instruction set. The K-quants'
//! int8 loops are written once over [`Lanes`]: one group of 8 rows in a 256-bit
//! vector, or on AVX-512 two groups side by side in a 512-bit one ([`Wide`]),
//! every lane's arithmetic the same, so a row gets the same bits either way.

/// One group's columns: `$dp(acc, u8 codes, s8 activations)` adds 4-element
/// dot products into 32-bit lanes (`vpdpbusd`, or `maddubs` + `madd`); the
/// K-quants' loops take their lanes `L` (of this instruction set or below).
macro_rules! x8_loops {
    ($name:ident, $feat:literal, $dp:ident) => {
        pub mod $name {
            use std::arch::x86_64::*;

            use half::f16;

            use super::super::super::XQ8;
            use super::super::{X8_BYTES, X8_ROWS};
            use super::{Lanes, $dp};

            /// The dot products of `L::G` groups' rows with each of the `T`
            /// tokens `xs`, every record read and its nibbles unpacked once for
            /// all of them; each token's lanes go through the arithmetic of `T =
            /// 1` (the decode's lone dots) in the same order, so a token gets
            /// the same bits among others as alone. Row `8 i + r` of the
            /// groups in lane `8 i + r` of the result (the rest zero).
            ///
            /// # Safety
            /// The features of `$feat` and `L`'s; `rec` holds `L::G` groups of
            /// `bpr` records, `sc` their 16 scales each (group after group),
            /// each `x` `bpr` super-blocks with one scale per 256.
            #[target_feature(enable = $feat)]
            pub unsafe fn group<L: Lanes, const T: usize>(rec: &[u8], sc: &[f16], xs: [&XQ8; T], bpr: usize) -> [[f32; 16]; T] {
                let pf = crate::kernels::cpu::prefetch_bytes();
                let (next, snext) = (bpr * X8_BYTES, bpr * 16);
                assert!(rec.len() >= L::G * next && sc.len() >= L::G * snext);
                assert!(xs.iter().all(|x| x.q.len() >= 256 * bpr && x.d.len() >= 8 * bpr && x.dsum.len() >= 8 * bpr));
                // SAFETY (every call of `L`'s): its features are the caller's.
                unsafe {
                    let (mut acc, mut accm) = ([L::zf(); T], [L::zf(); T]);
                    for c in 0..bpr {
                        // SAFETY: record c of each group, its scales and super-block c of each x (asserted above).
                        let r = super::record::<L>(rec, c, X8_BYTES, next, pf);
                        let mut isum = [L::zi(); T];
                        for p in 0..4 {
                            let scales = |h: usize| L::u8s(r.add(16 * p + 8 * h), next);
                            if T <= 4 {
                                let (mut lo, mut hi) = ([L::zi(); T], [L::zi(); T]);
                                for t in 0..8 {
                                    let (wl, wh) = super::nibbles::<L>(r, 8 * p + t, next);
                                    for j in 0..T {
                                        let xq = xs[j].q.as_ptr().add(256 * c + 64 * p + 4 * t);
                                        lo[j] = L::dp(lo[j], wl, L::bcast(xq));
                                        hi[j] = L::dp(hi[j], wh, L::bcast(xq.add(32)));
                                    }
                                }
                                let (sl, sh) = (scales(0), scales(1));
                                for j in 0..T {
                                    let s = L::add(L::mullo(lo[j], sl), L::mullo(hi[j], sh));
                                    isum[j] = L::add(isum[j], s);
                                }
                            } else {
                                // More tokens than registers for both halves' sums:
                                // the low codes' sums, then the high ones' (the
                                // same integers).
                                for h in 0..2 {
                                    let mut part = [L::zi(); T];
                                    for t in 0..8 {
                                        let (wl, wh) = super::nibbles::<L>(r, 8 * p + t, next);
                                        let w = if h == 0 { wl } else { wh };
                                        for j in 0..T {
                                            let xq = xs[j].q.as_ptr().add(256 * c + 64 * p + 32 * h + 4 * t);
                                            part[j] = L::dp(part[j], w, L::bcast(xq));
                                        }
                                    }
                                    let s = scales(h);
                                    for j in 0..T {
                                        isum[j] = L::add(isum[j], L::mullo(part[j], s));
                                    }
                                }
                            }
                        }
                        let (d, dmin) = (L::ph(sc.as_ptr().add(16 * c), snext), L::ph(sc.as_ptr().add(16 * c + 8), snext));
                        for j in 0..T {
                            let dd = L::mul(d, L::splat(xs[j].d[8 * c]));
                            acc[j] = L::fmadd(L::cvt(isum[j]), dd, acc[j]);
                            accm[j] = super::add_mins::<L>(r, next, xs[j].dsum.as_ptr().add(8 * c), dmin, accm[j]);
                        }
                    }
                    let mut out = [[0f32; 16]; T];
                    for j in 0..T {
                        out[j] = L::store(L::sub(acc[j], accm[j]));
                    }
                    out
                }
            }

            /// The Q6_K super-block columns of `L::G` groups' rows with each of
            /// the `T` tokens `xs`, as [`super::super::group_k6_portable`]
            /// computes them: every record's runs decoded into 6-bit codes once
            /// for all the tokens; each 16-element group's integer sums, times
            /// its 8 rows' int8 scales (`vpmulld`), into the column's sum (exact
            /// integers: any order gives the same bits); the `-32` through the
            /// activations' sums per 16. Rows as [`group`]'s.
            ///
            /// # Safety
            /// The features of `$feat` and `L`'s; `rec` holds `L::G` groups of
            /// `bpr` records, `sc` their 8 scales each (group after group),
            /// each `x` `bpr` super-blocks with one scale per 256.
            #[target_feature(enable = $feat)]
            pub unsafe fn group_k6<L: Lanes, const T: usize>(rec: &[u8], sc: &[f16], xs: [&XQ8; T], bpr: usize) -> [[f32; 16]; T] {
                use super::super::X8_K6_BYTES;
                let (next, snext) = (bpr * X8_K6_BYTES, bpr * X8_ROWS);
                let x_holds = |x: &&XQ8| x.q.len() >= 256 * bpr && x.d.len() >= 8 * bpr && x.dsum16.len() >= 16 * bpr;
                assert!(rec.len() >= L::G * next && sc.len() >= L::G * snext && xs.iter().all(x_holds));
                let pf = crate::kernels::cpu::prefetch_bytes();
                // SAFETY (every call of `L`'s): its features are the caller's.
                unsafe {
                    let (mut acc, mut accm) = ([L::zf(); T], [L::zf(); T]);
                    for c in 0..bpr {
                        // SAFETY: record c of each group, its scales and super-block c of each x (asserted above).
                        let r = super::record::<L>(rec, c, X8_K6_BYTES, next, pf);
                        let (mut isum, mut off) = ([L::zi(); T], [L::zf(); T]);
                        // One 16-element group at a time, in order (`g = 8 h +
                        // 2 s + q`): its four runs' codes against every token,
                        // times its 8 rows' scales; the scales, loaded once, into
                        // the offsets' sum too.
                        for h in 0..2 {
                            for s in 0..4 {
                                for q in 0..2 {
                                    let g = 8 * h + 2 * s + q;
                                    let mut a = [L::zi(); T];
                                    for t in 4 * q..4 * q + 4 {
                                        let v = super::k6_codes::<L>(r, next, h, t, s);
                                        for j in 0..T {
                                            let xq = xs[j].q.as_ptr().add(256 * c + 128 * h + 32 * s + 4 * t);
                                            a[j] = L::dp(a[j], v, L::bcast(xq));
                                        }
                                    }
                                    let scv = L::i8s(r.add(8 * g), next);
                                    let scf = L::cvt(scv);
                                    for j in 0..T {
                                        isum[j] = L::add(isum[j], L::mullo(a[j], scv));
                                        off[j] = L::fmadd(scf, L::splat(xs[j].dsum16[16 * c + g]), off[j]);
                                    }
                                }
                            }
                        }
                        let d = L::ph(sc.as_ptr().add(X8_ROWS * c), snext);
                        for j in 0..T {
                            let dd = L::mul(d, L::splat(xs[j].d[8 * c]));
                            acc[j] = L::fmadd(L::cvt(isum[j]), dd, acc[j]);
                            accm[j] = L::fmadd(off[j], d, accm[j]);
                        }
                    }
                    let mut out = [[0f32; 16]; T];
                    for j in 0..T {
                        out[j] = L::store(L::fnmadd(L::splat(32.0), accm[j], acc[j]));
                    }
                    out
                }
            }

            /// One group's block columns of a 32-element format (`F`: 0 Q4_0,
            /// 1 Q8_0, 2 IQ4_NL) with each of the `T` tokens `xs`, as
            /// [`super::super::group32_portable`] computes them: every record read
            /// and decoded (nibbles split, IQ4_NL's levels looked up, signs taken
            /// for the sign trick: `|w|` times `x` with `w`'s sign) once for all the
            /// tokens, each token's lanes as at `T = 1`.
            ///
            /// # Safety
            /// The features of `$feat`; `rec` holds `bpr` records of the format, `sc`
            /// their 8 scales each, each `x` `bpr` blocks (codes, scales and sums).
            #[target_feature(enable = $feat)]
            pub unsafe fn group32<const F: u8, const T: usize>(rec: &[u8], sc: &[f16], xs: [&XQ8; T], bpr: usize) -> [[f32; X8_ROWS]; T] {
                let pf = crate::kernels::cpu::prefetch_bytes();
                let rb = if F == 1 { 256 } else { 128 };
                assert!(rec.len() >= bpr * rb && sc.len() >= bpr * 8);
                assert!(xs.iter().all(|x| x.q.len() >= 32 * bpr && x.d.len() >= bpr && x.dsum.len() >= bpr));
                let m4 = _mm256_set1_epi8(0x0f);
                // SAFETY: the 16 bytes of the table.
                let table = unsafe {
                    let t = _mm_loadu_si128(crate::kernels::quant::IQ4_LEVELS.as_ptr() as *const __m128i);
                    _mm256_set_m128i(t, t)
                };
                let (mut acc, mut accm) = ([_mm256_setzero_ps(); T], [_mm256_setzero_ps(); T]);
                let (xq0, xd, xs_) = (xs.map(|x| x.q.as_ptr()), xs.map(|x| x.d.as_ptr()), xs.map(|x| x.dsum.as_ptr()));
                for c in 0..bpr {
                    // SAFETY: record c, its scales and block c of each x (asserted above).
                    unsafe {
                        let r = super::record::<super::Avx2Lanes>(rec, c, rb, 0, pf);
                        // Each token's integer sums, the low and the high codes' (exact:
                        // the same bits in any order): two chains of `vpdpbusd` up to
                        // 4 tokens, one beyond, so 8 tokens' sums and running sums
                        // fit AVX-512's 32 registers and still make 8 chains.
                        let mut dot = [[_mm256_setzero_si256(); 2]; T];
                        for t in 0..4 {
                            // The step's two code vectors and their activations' offsets
                            // in the block (Q8_0: loads 2t and 2t + 1; the nibble
                            // formats: load t's low and high nibbles).
                            let (wl, wh, el, eh) = if F == 1 {
                                let w0 = _mm256_loadu_si256(r.add(64 * t) as *const __m256i);
                                (w0, _mm256_loadu_si256(r.add(64 * t + 32) as *const __m256i), 8 * t, 8 * t + 4)
                            } else {
                                let w = _mm256_loadu_si256(r.add(32 * t) as *const __m256i);
                                let (wl, wh) = (_mm256_and_si256(w, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4));
                                if F == 0 {
                                    (wl, wh, 4 * t, 16 + 4 * t)
                                } else {
                                    (_mm256_shuffle_epi8(table, wl), _mm256_shuffle_epi8(table, wh), 4 * t, 16 + 4 * t)
                                }
                            };
                            // Unsigned codes as they are; signed ones by the sign trick.
                            let (ul, uh) = if F == 0 { (wl, wh) } else { (_mm256_sign_epi8(wl, wl), _mm256_sign_epi8(wh, wh)) };
                            for j in 0..T {
                                let xq = xq0[j].add(32 * c);
                                let xl = _mm256_set1_epi32((xq.add(el) as *const i32).read_unaligned());
                                let xh = _mm256_set1_epi32((xq.add(eh) as *const i32).read_unaligned());
                                let (xl, xh) = if F == 0 { (xl, xh) } else { (_mm256_sign_epi8(xl, wl), _mm256_sign_epi8(xh, wh)) };
                                if T <= 4 {
                                    dot[j] = [$dp(dot[j][0], ul, xl), $dp(dot[j][1], uh, xh)];
                                } else {
                                    dot[j][0] = $dp($dp(dot[j][0], ul, xl), uh, xh);
                                }
                            }
                        }
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.as_ptr().add(8 * c) as *const __m128i));
                        for j in 0..T {
                            let isum = if T <= 4 { _mm256_add_epi32(dot[j][0], dot[j][1]) } else { dot[j][0] };
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(*xd[j].add(c))), acc[j]);
                            if F == 0 {
                                accm[j] = _mm256_fmadd_ps(d, _mm256_set1_ps(*xs_[j].add(c)), accm[j]);
                            }
                        }
                    }
                }
                let mut out = [[0f32; X8_ROWS]; T];
                for j in 0..T {
                    // SAFETY: 8 floats into an 8-float array.
                    unsafe { _mm256_storeu_ps(out[j].as_mut_ptr(), _mm256_fnmadd_ps(_mm256_set1_ps(8.0), accm[j], acc[j])) };
                }
                out
            }
        }
    };
}

use std::arch::x86_64::*;

/// `acc + Σ4 u·s` per 32-bit lane with AVX2 (`u` ≤ 128, so `maddubs`' pairs,
/// at most 2 · 128 · 127, never saturate).
#[inline]
#[target_feature(enable = "avx2")]
fn dp_avx2(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
}

/// [`dp_avx2`] in one `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dp_vnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

/// Record `c` of `rec` (records of `rb` bytes; the `L::G` groups' `next`
/// bytes apart), the bytes `pf` past each prefetched: where each loop's step
/// over its records begins.
///
/// # Safety
/// `rec` holds record `c` of each group.
#[inline(always)]
unsafe fn record<L: Lanes>(rec: &[u8], c: usize, rb: usize, next: usize, pf: usize) -> *const u8 {
    // SAFETY: record c lies within `rec` (the caller's promise); a prefetch never faults.
    unsafe {
        let r = rec.as_ptr().add(c * rb);
        for i in 0..L::G {
            crate::kernels::cpu::prefetch_ahead(r.add(i * next), pf, rb);
        }
        r
    }
}

/// The low and high nibbles of the records at `r` (each group's, `next`
/// apart): their 32 code bytes of step `i` (0..32: 4 passes of 8).
///
/// # Safety
/// `L`'s features; `r` points to a whole X8 record of each group.
#[inline(always)]
unsafe fn nibbles<L: Lanes>(r: *const u8, i: usize, next: usize) -> (L::I, L::I) {
    // SAFETY: the 32 bytes at 128 + 32i of each record (the caller's promise).
    unsafe {
        let (w, m4) = (L::load(r.add(128 + 32 * i), next), L::splat8(0x0f));
        (L::and(w, m4), L::and(L::shr4(w), m4))
    }
}

/// The 6-bit codes of Q6_K records' runs (each group's, `next` apart) for
/// half `h`, `t < 8` and `s < 4` (see `quant/repack.rs`): in 32-bit lane `i`,
/// row `i`'s codes of elements `128 h + 32 s + 4 t..+4` as unsigned bytes (the
/// low nibbles of run `16 h + 8 (s % 2) + t`, or its high ones for `s >= 2`,
/// with bits `2 s` of the `qh` run `32 + 8 h + t` above them).
///
/// # Safety
/// `L`'s features; `r` points to a whole Q6_K X8 record of each group.
#[inline(always)]
unsafe fn k6_codes<L: Lanes>(r: *const u8, next: usize, h: usize, t: usize, s: usize) -> L::I {
    // SAFETY: runs 16h + 8(s % 2) + t and 32 + 8h + t of each record (the caller's promise).
    unsafe {
        let (m4, m30) = (L::splat8(0x0f), L::splat8(0x30));
        let ql = L::load(r.add(128 + 32 * (16 * h + 8 * (s % 2) + t)), next);
        let qh = L::load(r.add(128 + 32 * (32 + 8 * h + t)), next);
        let lo = if s < 2 { L::and(ql, m4) } else { L::and(L::shr4(ql), m4) };
        let hi = match s {
            0 => L::shl4(qh),
            1 => L::shl2(qh),
            2 => qh,
            _ => L::shr2(qh),
        };
        L::or(lo, L::and(hi, m30))
    }
}

/// `accm + dmin · Σj min_j · sums[j]`: the eight 6-bit mins of the Q4_K
/// records at `r` (each group's, `next` apart; bytes 64..128, one byte per
/// row for each 32 of the super-block) against the eight sums of the activations.
///
/// # Safety
/// `L`'s features; `r` points to a whole X8 record of each group and `sums`
/// to 8 readable floats.
#[inline(always)]
unsafe fn add_mins<L: Lanes>(r: *const u8, next: usize, sums: *const f32, dmin: L::F, accm: L::F) -> L::F {
    // SAFETY: bytes 64 + 8j.. of each record and sum j (the caller's promise).
    unsafe {
        let mut ms = L::zf();
        for j in 0..8 {
            ms = L::fmadd(L::cvt(L::u8s(r.add(64 + 8 * j), next)), L::splat(*sums.add(j)), ms);
        }
        L::fmadd(ms, dmin, accm)
    }
}

/// The lanes of a pass over X8 records: `G` groups of 8 rows, one 32-bit lane
/// a row (group `i`'s in lanes `8 i..8 i + 8`), group `i`'s record bytes `i ·
/// next` past the first's. Every method is one lane-wise operation, the same
/// in every lane whatever the width.
///
/// # Safety
/// Each method needs its implementation's target features.
pub trait Lanes {
    /// Groups side by side.
    const G: usize;
    /// 32-bit integer lanes and f32 lanes.
    type I: Copy;
    type F: Copy;
    unsafe fn zi() -> Self::I;
    unsafe fn zf() -> Self::F;
    /// The 32 bytes at `r` of each group.
    unsafe fn load(r: *const u8, next: usize) -> Self::I;
    /// The 8 bytes at `r` of each group, zero-extended to one a lane.
    unsafe fn u8s(r: *const u8, next: usize) -> Self::I;
    /// The same, sign-extended.
    unsafe fn i8s(r: *const u8, next: usize) -> Self::I;
    /// The 8 f16s at `s` of each group (`next` f16s apart), one a lane.
    unsafe fn ph(s: *const half::f16, next: usize) -> Self::F;
    /// The 4 bytes at `p` in every lane.
    unsafe fn bcast(p: *const i8) -> Self::I;
    unsafe fn splat8(v: i8) -> Self::I;
    /// `acc + Σ4 u·s` per lane (unsigned `u` up to 128, signed `s`).
    unsafe fn dp(acc: Self::I, u: Self::I, s: Self::I) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mullo(a: Self::I, b: Self::I) -> Self::I;
    /// 16-bit lane shifts.
    unsafe fn shr4(v: Self::I) -> Self::I;
    unsafe fn shr2(v: Self::I) -> Self::I;
    unsafe fn shl4(v: Self::I) -> Self::I;
    unsafe fn shl2(v: Self::I) -> Self::I;
    unsafe fn cvt(v: Self::I) -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn sub(a: Self::F, b: Self::F) -> Self::F;
    /// The lanes, the first `8 G` of 16.
    unsafe fn store(v: Self::F) -> [f32; 16];
}

/// Each function `$f`, inline with the target features `$feat`.
macro_rules! featured {
    ($feat:literal; $($f:item)*) => {
        $(
            #[inline]
            #[target_feature(enable = $feat)]
            $f
        )*
    };
}

/// The lane-wise operations of [`Lanes`] that are one intrinsic at either
/// width, each listed once with its 256-bit and 512-bit form, stamped into an
/// implementation of one width (`y` or `z`) with the target features `$feat`.
macro_rules! lane_ops {
    ($w:ident, $feat:literal) => {
        lane_ops! { @ $w, $feat;
            and(a: I, b: I) -> I = _mm256_and_si256, _mm512_and_si512;
            or(a: I, b: I) -> I = _mm256_or_si256, _mm512_or_si512;
            add(a: I, b: I) -> I = _mm256_add_epi32, _mm512_add_epi32;
            mullo(a: I, b: I) -> I = _mm256_mullo_epi32, _mm512_mullo_epi32;
            shr4(v: I) -> I = _mm256_srli_epi16::<4>, _mm512_srli_epi16::<4>;
            shr2(v: I) -> I = _mm256_srli_epi16::<2>, _mm512_srli_epi16::<2>;
            shl4(v: I) -> I = _mm256_slli_epi16::<4>, _mm512_slli_epi16::<4>;
            shl2(v: I) -> I = _mm256_slli_epi16::<2>, _mm512_slli_epi16::<2>;
            cvt(v: I) -> F = _mm256_cvtepi32_ps, _mm512_cvtepi32_ps;
            splat(v: f32) -> F = _mm256_set1_ps, _mm512_set1_ps;
            splat8(v: i8) -> I = _mm256_set1_epi8, _mm512_set1_epi8;
            mul(a: F, b: F) -> F = _mm256_mul_ps, _mm512_mul_ps;
            fmadd(a: F, b: F, c: F) -> F = _mm256_fmadd_ps, _mm512_fmadd_ps;
            fnmadd(a: F, b: F, c: F) -> F = _mm256_fnmadd_ps, _mm512_fnmadd_ps;
            sub(a: F, b: F) -> F = _mm256_sub_ps, _mm512_sub_ps;
            zi() -> I = _mm256_setzero_si256, _mm512_setzero_si512;
            zf() -> F = _mm256_setzero_ps, _mm512_setzero_ps;
        }
    };
    (@ y, $feat:literal; $($n:ident($($a:ident: $t:tt),*) -> $r:ident = $y:path, $z:path;)*) => {
        featured! { $feat; $(unsafe fn $n($($a: lane_ops!(@t $t)),*) -> Self::$r { $y($($a),*) })* }
    };
    (@ z, $feat:literal; $($n:ident($($a:ident: $t:tt),*) -> $r:ident = $y:path, $z:path;)*) => {
        featured! { $feat; $(unsafe fn $n($($a: lane_ops!(@t $t)),*) -> Self::$r { $z($($a),*) })* }
    };
    (@t I) => { Self::I };
    (@t F) => { Self::F };
    (@t $t:ty) => { $t };
}

/// One group in 256-bit vectors, `$dp` its dot product (the int8 loops of `$feat`).
macro_rules! ymm_lanes {
    ($name:ident, $feat:literal, $dp:ident) => {
        /// One group of 8 rows in 256-bit vectors.
        pub struct $name;

        impl Lanes for $name {
            const G: usize = 1;
            type I = __m256i;
            type F = __m256;
            lane_ops!(y, $feat);
            featured! { $feat;
                unsafe fn load(r: *const u8, _: usize) -> __m256i {
                    // SAFETY: the caller's.
                    unsafe { _mm256_loadu_si256(r as *const __m256i) }
                }
                unsafe fn u8s(r: *const u8, _: usize) -> __m256i {
                    // SAFETY: the caller's.
                    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(r as *const __m128i)) }
                }
                unsafe fn i8s(r: *const u8, _: usize) -> __m256i {
                    // SAFETY: the caller's.
                    unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(r as *const __m128i)) }
                }
                unsafe fn ph(s: *const half::f16, _: usize) -> __m256 {
                    // SAFETY: the caller's.
                    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i)) }
                }
                unsafe fn bcast(p: *const i8) -> __m256i {
                    // SAFETY: the caller's.
                    unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
                }
                unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
                    $dp(acc, u, s)
                }
                unsafe fn store(v: __m256) -> [f32; 16] {
                    let mut out = [0f32; 16];
                    // SAFETY: 8 floats into a 16-float array.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
                    out
                }
            }
        }
    };
}

ymm_lanes!(Avx2Lanes, "avx2,fma,f16c", dp_avx2);
ymm_lanes!(VnniLanes, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni);

/// Two groups of 8 rows side by side in 512-bit vectors (AVX-512 VNNI): each
/// group's lanes as [`VnniLanes`] computes them, half the instructions.
pub struct Wide;

impl Lanes for Wide {
    const G: usize = 2;
    type I = __m512i;
    type F = __m512;
    lane_ops!(z, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
    featured! { "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni";
        unsafe fn load(r: *const u8, next: usize) -> __m512i {
            // SAFETY: the caller's (32 bytes of each group).
            unsafe {
                let (a, b) = (_mm256_loadu_si256(r as *const __m256i), _mm256_loadu_si256(r.add(next) as *const __m256i));
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
            }
        }
        unsafe fn u8s(r: *const u8, next: usize) -> __m512i {
            // SAFETY: the caller's (8 bytes of each group).
            unsafe { _mm512_cvtepu8_epi32(two_u64(r, next)) }
        }
        unsafe fn i8s(r: *const u8, next: usize) -> __m512i {
            // SAFETY: the caller's (8 bytes of each group).
            unsafe { _mm512_cvtepi8_epi32(two_u64(r, next)) }
        }
        unsafe fn ph(s: *const half::f16, next: usize) -> __m512 {
            // SAFETY: the caller's (8 f16s of each group).
            unsafe {
                let (a, b) = (_mm_loadu_si128(s as *const __m128i), _mm_loadu_si128(s.add(next) as *const __m128i));
                _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b))
            }
        }
        unsafe fn bcast(p: *const i8) -> __m512i {
            // SAFETY: the caller's.
            unsafe { _mm512_set1_epi32((p as *const i32).read_unaligned()) }
        }
        unsafe fn dp(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
            _mm512_dpbusd_epi32(acc, u, s)
        }
        unsafe fn store(v: __m512) -> [f32; 16] {
            let mut out = [0f32; 16];
            // SAFETY: 16 floats into a 16-float array.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
            out
        }
    }
}

/// The 8 bytes at `r` and the 8 at `r + next`, in one 128-bit vector.
///
/// # Safety
/// SSE2; 8 readable bytes at each.
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn two_u64(r: *const u8, next: usize) -> __m128i {
    // SAFETY: the caller's.
    unsafe { _mm_unpacklo_epi64(_mm_loadl_epi64(r as *const __m128i), _mm_loadl_epi64(r.add(next) as *const __m128i)) }
}

x8_loops!(avx2, "avx2,fma,f16c", dp_avx2);
x8_loops!(vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dp_vnni);

/// The f32-activation loops: a 32-bit lane per row, as the portable loops
/// [`super::group32_f32_portable`] and [`super::group_k_f32_portable`]
/// compute them, chain for chain, stamped out per instruction set (`avx2`:
/// AVX2 + FMA + F16C; `avx512`: the same code with AVX-512VL's 32 registers
/// and broadcast operands).
macro_rules! f32_loops {
    ($name:ident, $feat:literal) => {
        pub mod $name {
            use std::arch::x86_64::*;

            use half::f16;

            use super::super::{X8_BYTES, X8_ROWS};
            use super::{Avx2Lanes as L, Lanes};

            /// Byte `l` of each 32-bit lane of `v`, sign-extended, as 8 floats (`l` = 0..4).
            #[inline]
            #[target_feature(enable = $feat)]
            fn bytes_ps(v: __m256i) -> [__m256; 4] {
                [
                    _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(v))),
                    _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(v))),
                    _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(v))),
                    _mm256_cvtepi32_ps(_mm256_srai_epi32::<24>(v)),
                ]
            }

            /// `a[l] += bytes_ps(va)[l] · x[ea + l]` and `b[l] += bytes_ps(vb)[l] · x[eb + l]`.
            ///
            /// # Safety
            /// `x.add(ea)` and `x.add(eb)` point to 4 readable floats each.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn step(a: &mut [__m256; 4], b: &mut [__m256; 4], va: __m256i, vb: __m256i, x: *const f32, ea: usize, eb: usize) {
                let (wa, wb) = (bytes_ps(va), bytes_ps(vb));
                for l in 0..4 {
                    // SAFETY: the caller's contract.
                    unsafe {
                        a[l] = _mm256_fmadd_ps(wa[l], _mm256_broadcast_ss(&*x.add(ea + l)), a[l]);
                        b[l] = _mm256_fmadd_ps(wb[l], _mm256_broadcast_ss(&*x.add(eb + l)), b[l]);
                    }
                }
            }

            /// `((a0 + a1) + (a2 + a3)) + ((b0 + b1) + (b2 + b3))`, as [`super::super::chains`].
            #[inline]
            #[target_feature(enable = $feat)]
            fn chains(a: [__m256; 4], b: [__m256; 4]) -> __m256 {
                _mm256_add_ps(half4(a), half4(b))
            }

            #[inline]
            #[target_feature(enable = $feat)]
            fn half4(a: [__m256; 4]) -> __m256 {
                _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]))
            }

            /// One group's block columns of a 32-element format (`F`: 0 Q4_0, 1
            /// Q8_0, 2 IQ4_NL) with f32 activations.
            ///
            /// # Safety
            /// The features of `$feat`.
            #[target_feature(enable = $feat)]
            pub unsafe fn group32<const F: u8>(rec: &[u8], sc: &[f16], x: &[f32], bpr: usize) -> [f32; X8_ROWS] {
                let pf = crate::kernels::cpu::prefetch_bytes();
                let rb = if F == 1 { 256 } else { 128 };
                assert!(rec.len() >= bpr * rb && sc.len() >= bpr * X8_ROWS && x.len() >= 32 * bpr);
                let (m4, eight) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(8));
                // SAFETY: the 16 bytes of the table.
                let table = unsafe {
                    let t = _mm_loadu_si128(crate::kernels::quant::IQ4_LEVELS.as_ptr() as *const __m128i);
                    _mm256_set_m128i(t, t)
                };
                let mut acc = _mm256_setzero_ps();
                for c in 0..bpr {
                    // SAFETY: record c, its 8 scales and block c of x (asserted above).
                    unsafe {
                        let r = super::record::<super::Avx2Lanes>(rec, c, rb, 0, pf);
                        let xp = x.as_ptr().add(32 * c);
                        let (mut a, mut b) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
                        for s in 0..4 {
                            if F == 1 {
                                let va = _mm256_loadu_si256(r.add(64 * s) as *const __m256i);
                                let vb = _mm256_loadu_si256(r.add(64 * s + 32) as *const __m256i);
                                step(&mut a, &mut b, va, vb, xp, 8 * s, 8 * s + 4);
                            } else {
                                let w = _mm256_loadu_si256(r.add(32 * s) as *const __m256i);
                                let wl = _mm256_and_si256(w, m4);
                                let wh = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                                let (va, vb) = if F == 0 {
                                    (_mm256_sub_epi8(wl, eight), _mm256_sub_epi8(wh, eight))
                                } else {
                                    (_mm256_shuffle_epi8(table, wl), _mm256_shuffle_epi8(table, wh))
                                };
                                step(&mut a, &mut b, va, vb, xp, 4 * s, 16 + 4 * s);
                            }
                        }
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.as_ptr().add(X8_ROWS * c) as *const __m128i));
                        acc = _mm256_fmadd_ps(chains(a, b), d, acc);
                    }
                }
                let mut out = [0f32; X8_ROWS];
                // SAFETY: 8 floats into an 8-float array.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
                out
            }

            /// One group's Q6_K super-block columns with f32 activations, as
            /// [`super::super::group_k6_f32_portable`] adds them.
            ///
            /// # Safety
            /// The features of `$feat`.
            #[target_feature(enable = $feat)]
            pub unsafe fn group_k6(rec: &[u8], sc: &[f16], x: &[f32], bpr: usize) -> [f32; X8_ROWS] {
                use super::super::X8_K6_BYTES;
                let pf = crate::kernels::cpu::prefetch_bytes();
                assert!(rec.len() >= bpr * X8_K6_BYTES && sc.len() >= bpr * X8_ROWS && x.len() >= 256 * bpr);
                let bias = _mm256_set1_epi8(32);
                let mut acc = _mm256_setzero_ps();
                for c in 0..bpr {
                    // SAFETY: record c, its 8 scales and super-block c of x (asserted above).
                    unsafe {
                        let r = super::record::<super::Avx2Lanes>(rec, c, X8_K6_BYTES, 0, pf);
                        let xp = x.as_ptr().add(256 * c);
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.as_ptr().add(X8_ROWS * c) as *const __m128i));
                        for h in 0..2 {
                            for q in 0..2 {
                                let mut ch = [[_mm256_setzero_ps(); 4]; 4];
                                for t in 4 * q..4 * q + 4 {
                                    let v = [
                                        _mm256_sub_epi8(super::k6_codes::<super::Avx2Lanes>(r, 0, h, t, 0), bias),
                                        _mm256_sub_epi8(super::k6_codes::<super::Avx2Lanes>(r, 0, h, t, 1), bias),
                                        _mm256_sub_epi8(super::k6_codes::<super::Avx2Lanes>(r, 0, h, t, 2), bias),
                                        _mm256_sub_epi8(super::k6_codes::<super::Avx2Lanes>(r, 0, h, t, 3), bias),
                                    ];
                                    let e = 128 * h + 4 * t;
                                    let [c0, c1, c2, c3] = &mut ch;
                                    step(c0, c1, v[0], v[1], xp, e, e + 32);
                                    step(c2, c3, v[2], v[3], xp, e + 64, e + 96);
                                }
                                for (s, ch) in ch.into_iter().enumerate() {
                                    let g = 8 * h + 2 * s + q;
                                    let scf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(r.add(8 * g) as *const __m128i)));
                                    acc = _mm256_fmadd_ps(half4(ch), _mm256_mul_ps(d, scf), acc);
                                }
                            }
                        }
                    }
                }
                let mut out = [0f32; X8_ROWS];
                // SAFETY: 8 floats into an 8-float array.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
                out
            }

            /// One group's Q4_K super-block columns with f32 activations (`sums`: `Σx`
            /// of each 32 of `x`).
            ///
            /// # Safety
            /// The features of `$feat`.
            #[target_feature(enable = $feat)]
            pub unsafe fn group_k(rec: &[u8], sc: &[f16], x: &[f32], sums: &[f32], bpr: usize) -> [f32; X8_ROWS] {
                let pf = crate::kernels::cpu::prefetch_bytes();
                assert!(rec.len() >= bpr * X8_BYTES && sc.len() >= bpr * 16 && x.len() >= 256 * bpr && sums.len() >= 8 * bpr);
                let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for c in 0..bpr {
                    // SAFETY: record c, its 16 scales, super-block c of x and its 8 sums (asserted above).
                    unsafe {
                        let r = super::record::<super::Avx2Lanes>(rec, c, X8_BYTES, 0, pf);
                        let xp = x.as_ptr().add(256 * c);
                        let (d, dmin) = (L::ph(sc.as_ptr().add(16 * c), 0), L::ph(sc.as_ptr().add(16 * c + 8), 0));
                        for p in 0..4 {
                            let (mut a, mut b) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
                            for t in 0..8 {
                                let (wl, wh) = super::nibbles::<L>(r, 8 * p + t, 0);
                                step(&mut a, &mut b, wl, wh, xp, 64 * p + 4 * t, 64 * p + 32 + 4 * t);
                            }
                            let sl = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(r.add(16 * p) as *const __m128i)));
                            let sh = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(r.add(16 * p + 8) as *const __m128i)));
                            acc = _mm256_fmadd_ps(half4(a), _mm256_mul_ps(d, sl), acc);
                            acc = _mm256_fmadd_ps(half4(b), _mm256_mul_ps(d, sh), acc);
                        }
                        accm = super::add_mins::<L>(r, 0, sums.as_ptr().add(8 * c), dmin, accm);
                    }
                }
                let mut out = [0f32; X8_ROWS];
                // SAFETY: 8 floats into an 8-float array.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, accm)) };
                out
            }
        }
    };
}

f32_loops!(f32_avx2, "avx2,fma,f16c");
f32_loops!(f32_avx512, "avx2,fma,f16c,avx512f,avx512bw,avx512vl");
