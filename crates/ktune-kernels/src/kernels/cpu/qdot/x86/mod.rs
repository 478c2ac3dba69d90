//! The x86 loops of the block dots (AVX2 + FMA + F16C, and AVX-512 VNNI on
//! 256-bit registers): what they share (the per-format dispatch `by_format!`,
//! block loads, the int8 lane dots, the eight-block scale step), the
//! f32-activation dots of Q8_0, Q4_0 and Q4_1, SIMD dequantization and the AVX2
//! and AVX-512 activation quantizers (one block's scale search and codes in one
//! call on AVX-512); the int8 loop family in [`int8`], the K-quant
//! super-block loops in [`kquant`], the unpacked-block paths of the other
//! formats in [`unpack`].

use std::arch::x86_64::*;

use half::f16;

use super::{GROUP, QFormat, QK, QView, Unpacked};

use crate::kernels::cpu::dot::x86::hsum256 as hsum;
use crate::kernels::cpu::prefetch_ahead as prefetch;

/// `$run::<F>(args)` with the const `F` of the block format (an index into
/// `I8_FORMATS`): one loop per format, the format resolved outside it.
macro_rules! by_format {
    ($format:expr, $run:ident($($arg:expr),*)) => {
        match $format {
            QFormat::Q8_0 => $run::<0>($($arg),*),
            QFormat::Q4_0 => $run::<1>($($arg),*),
            QFormat::Q4_1 => $run::<2>($($arg),*),
            QFormat::Q5_0 => $run::<3>($($arg),*),
            QFormat::Q5_1 => $run::<4>($($arg),*),
            QFormat::IQ4_NL => $run::<5>($($arg),*),
            _ => unreachable!("only the formats of `direct_i8` have a direct int8 loop"),
        }
    };
}

mod int8;
mod kquant;
mod unpack;

pub use int8::{avx2, vnni};
pub use kquant::{kq8_avx2, kq8_vnni};
pub use unpack::{dequantize_unpacked, dot_i8_unpacked, dot_unpacked, unpack_simd};

/// The formats of `by_format`, by index.
const I8_FORMATS: [QFormat; 6] = [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q5_1, QFormat::IQ4_NL];

/// Formats whose blocks carry a minimum (`d, m` header pairs).
#[inline]
fn has_min(format: QFormat) -> bool {
    matches!(format, QFormat::Q4_1 | QFormat::Q5_1)
}

#[inline]
#[target_feature(enable = "f16c")]
fn h(v: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v.to_bits() as i32)))
}

/// The 32 weights of a q8_0 block as four vectors of 8 (unscaled).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q8(q: *const u8) -> [__m256; 4] {
    // SAFETY: the caller passes a pointer to 32 readable bytes.
    let raw = unsafe { _mm256_loadu_si256(q as *const __m256i) };
    widen::<false>(_mm256_castsi256_si128(raw), _mm256_extracti128_si256(raw, 1))
}

/// The 32 nibbles of a 4-bit block (elements 0..32 in ggml order) as four vectors.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4(q: *const u8) -> [__m256; 4] {
    // SAFETY: the caller passes a pointer to 16 readable bytes.
    let raw = unsafe { _mm_loadu_si128(q as *const __m128i) };
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    widen::<true>(lo, hi)
}

/// The 32 bytes of `lo` then `hi` as four vectors of 8 floats: signed bytes, or
/// with `UNSIGNED` unsigned ones.
#[inline]
#[target_feature(enable = "avx2")]
fn widen<const UNSIGNED: bool>(lo: __m128i, hi: __m128i) -> [__m256; 4] {
    [widen8::<UNSIGNED>(lo), widen8::<UNSIGNED>(_mm_srli_si128(lo, 8)), widen8::<UNSIGNED>(hi), widen8::<UNSIGNED>(_mm_srli_si128(hi, 8))]
}

/// The low 8 bytes of `v` as 8 floats (see [`widen`]).
#[inline]
#[target_feature(enable = "avx2")]
fn widen8<const UNSIGNED: bool>(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(if UNSIGNED { _mm256_cvtepu8_epi32(v) } else { _mm256_cvtepi8_epi32(v) })
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot32(v: [__m256; 4], x: *const f32) -> __m256 {
    // SAFETY: the caller passes a pointer to 32 readable floats.
    unsafe {
        let mut p = _mm256_mul_ps(v[0], _mm256_loadu_ps(x));
        p = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x.add(8)), p);
        p = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x.add(16)), p);
        _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x.add(24)), p)
    }
}

/// 32 floats from `x` summed into 8 lanes (the `Σx` a block minimum multiplies).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum32(x: *const f32) -> __m256 {
    // SAFETY: the caller passes a pointer to 32 readable floats.
    unsafe {
        _mm256_add_ps(
            _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8))),
            _mm256_add_ps(_mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))),
        )
    }
}

/// # Safety
/// AVX2, FMA and F16C available; `q` holds whole blocks, `s` one scale per block
/// and `x` 32 values per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0(x: &[f32], q: &[u8], s: &[f16]) -> f32 {
    let blocks = q.len() / 32;
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut b = 0;
    // SAFETY: block b reads q[32b..32b+32] and x[32b..32b+32], inside the slices.
    unsafe {
        while b + 2 <= blocks {
            let p0 = dot32(q8(q.as_ptr().add(32 * b)), x.as_ptr().add(32 * b));
            let p1 = dot32(q8(q.as_ptr().add(32 * b + 32)), x.as_ptr().add(32 * b + 32));
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b])), p0, a0);
            a1 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b + 1])), p1, a1);
            b += 2;
        }
        if b < blocks {
            let p0 = dot32(q8(q.as_ptr().add(32 * b)), x.as_ptr().add(32 * b));
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b])), p0, a0);
        }
    }
    hsum(_mm256_add_ps(a0, a1))
}

/// # Safety
/// As [`dot_q8_0`], with 16 bytes per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0(x: &[f32], q: &[u8], s: &[f16]) -> f32 {
    let blocks = q.len() / 16;
    let eight = _mm256_set1_ps(8.0);
    let mut acc = _mm256_setzero_ps();
    #[allow(clippy::needless_range_loop)]
    for b in 0..blocks {
        // SAFETY: block b reads q[16b..16b+16] and x[32b..32b+32].
        unsafe {
            let v = q4(q.as_ptr().add(16 * b));
            let v = [_mm256_sub_ps(v[0], eight), _mm256_sub_ps(v[1], eight), _mm256_sub_ps(v[2], eight), _mm256_sub_ps(v[3], eight)];
            let p = dot32(v, x.as_ptr().add(32 * b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(h(s[b])), p, acc);
        }
    }
    hsum(acc)
}

/// # Safety
/// As [`dot_q8_0`], with 16 bytes and two scales (d, m) per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1(x: &[f32], q: &[u8], s: &[f16]) -> f32 {
    let blocks = q.len() / 16;
    let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    #[allow(clippy::needless_range_loop)]
    for b in 0..blocks {
        // SAFETY: block b reads q[16b..16b+16] and x[32b..32b+32].
        unsafe {
            let xp = x.as_ptr().add(32 * b);
            let p = dot32(q4(q.as_ptr().add(16 * b)), xp);
            let sx = sum32(xp);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(h(s[2 * b])), p, acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(h(s[2 * b + 1])), sx, accm);
        }
    }
    hsum(_mm256_add_ps(acc, accm))
}

/// Σ over 32 lanes of `|w| * sign(x, w)` for signed int8 `w` and `x`, as 8 i32
/// sums in f32 (`maddubs` needs one unsigned operand: llama.cpp's sign trick).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_s8(w: __m256i, x: __m256i) -> __m256 {
    let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, _mm256_set1_epi16(1)))
}

/// The 32 nibbles of a 4-bit block as unsigned bytes in ggml element order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles(q: *const u8) -> __m256i {
    // SAFETY: the caller passes a pointer to 16 readable bytes.
    let raw = unsafe { _mm_loadu_si128(q as *const __m128i) };
    let mask = _mm_set1_epi8(0x0f);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask))
}

/// Unsigned `w` (bytes 0..=255) times signed int8 `x`, summed by four into 8
/// f32 lanes (`maddubs` saturates pairs at ±32767, far above 2 × 31 × 127).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_u8(w: __m256i, x: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
}

/// [`dot_s8`] with VNNI: `|w|` unsigned times `sign(x, w)` in one `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_s8_vnni(w: __m256i, x: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)))
}

/// [`dot_u8`] with VNNI.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn dot_u8_vnni(w: __m256i, x: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x))
}
/// The largest magnitude of `xs` and the four candidate scales above it
/// ([`super::SCALE_STEPS`]); `None` when every value is 0.
fn candidate_scales(amax: f32) -> Option<[f32; 4]> {
    // The other steps are above 1: their scales are 0 only when the first is.
    let d = super::SCALE_STEPS.map(|s| amax / 127.0 * s);
    (d[0] != 0.0).then_some(d)
}

/// Which candidate has the least error (the first on a tie; the first when
/// every error is NaN): each candidate's 8 lane sums (lane `l` holding lanes
/// `l` and `l + 8` of the 16) added in the portable loop's order,
/// `((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7))`, the four candidates side by side
/// in one register (a 4 x 4 transpose), the minimum found without a branch.
#[inline]
#[target_feature(enable = "avx2")]
fn least_error(acc: [__m256; 4]) -> usize {
    // [l0 + l4, l1 + l5, l2 + l6, l3 + l7] per candidate, transposed so that row
    // i holds lane-pair i of candidates 0..4.
    let (f0, f1, f2, f3) = (fold_halves(acc[0]), fold_halves(acc[1]), fold_halves(acc[2]), fold_halves(acc[3]));
    let (t0, t1) = (_mm_unpacklo_ps(f0, f1), _mm_unpacklo_ps(f2, f3));
    let (t2, t3) = (_mm_unpackhi_ps(f0, f1), _mm_unpackhi_ps(f2, f3));
    let (r0, r1) = (_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0));
    let (r2, r3) = (_mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2));
    let err = _mm_add_ps(_mm_add_ps(r0, r2), _mm_add_ps(r1, r3));
    let m = _mm_min_ps(err, _mm_shuffle_ps::<0b10_11_00_01>(err, err));
    let m = _mm_min_ps(m, _mm_shuffle_ps::<0b01_00_11_10>(m, m));
    let at = _mm_movemask_ps(_mm_cmpeq_ps(err, m)) as u32;
    if at == 0 { 0 } else { at.trailing_zeros() as usize }
}

/// [`super::xq8::block_scale`] with AVX2: the largest magnitude, then every
/// candidate scale's squared error in one more pass over the values (a
/// candidate's 16 lanes in two registers, element `i` in lane `i % 16`, one FMA
/// a term), the lanes summed in the portable loop's order, so both pick the
/// same scale.
///
/// # Safety
/// AVX2 and FMA available; `xs` holds a multiple of 16 values.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn block_scale(xs: &[f32]) -> f32 {
    assert!(xs.len().is_multiple_of(16));
    // SAFETY: every load reads one whole chunk of 8 floats of `xs`.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for c in xs.chunks_exact(8) {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let Some(d) = candidate_scales(_mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))) else { return 0.0 };
        // (No closures here: they would not inherit the target features.)
        let vd = [_mm256_set1_ps(d[0]), _mm256_set1_ps(d[1]), _mm256_set1_ps(d[2]), _mm256_set1_ps(d[3])];
        let vid = [_mm256_set1_ps(1.0 / d[0]), _mm256_set1_ps(1.0 / d[1]), _mm256_set1_ps(1.0 / d[2]), _mm256_set1_ps(1.0 / d[3])];
        // Lanes 0..8 and 8..16 of each candidate.
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        for c in xs.chunks_exact(16) {
            let (a, b) = (_mm256_loadu_ps(c.as_ptr()), _mm256_loadu_ps(c.as_ptr().add(8)));
            for j in 0..4 {
                let ra = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(a, vid[j]));
                let rb = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(b, vid[j]));
                let (ea, eb) = (_mm256_fnmadd_ps(vd[j], ra, a), _mm256_fnmadd_ps(vd[j], rb, b));
                lo[j] = _mm256_fmadd_ps(ea, ea, lo[j]);
                hi[j] = _mm256_fmadd_ps(eb, eb, hi[j]);
            }
        }
        d[least_error([_mm256_add_ps(lo[0], hi[0]), _mm256_add_ps(lo[1], hi[1]), _mm256_add_ps(lo[2], hi[2]), _mm256_add_ps(lo[3], hi[3])])]
    }
}

/// The largest magnitude of `xs` (a multiple of 16 values), with AVX-512.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn amax_avx512(xs: &[f32]) -> f32 {
    let mut m = _mm512_setzero_ps();
    for c in xs.chunks_exact(16) {
        // SAFETY: a whole chunk of 16 floats.
        m = _mm512_max_ps(m, _mm512_abs_ps(unsafe { _mm512_loadu_ps(c.as_ptr()) }));
    }
    _mm512_reduce_max_ps(m)
}

/// The candidate of least error for the values `xs` (a multiple of 16) at the
/// candidate scales `d` (inverses `id`), with AVX-512: one register of 16 lanes
/// a candidate, folded to 8 (`l + (l + 8)`) for [`least_error`].
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn least_error_avx512(xs: &[f32], d: [f32; 4], id: [f32; 4]) -> usize {
    let vd = [_mm512_set1_ps(d[0]), _mm512_set1_ps(d[1]), _mm512_set1_ps(d[2]), _mm512_set1_ps(d[3])];
    let vid = [_mm512_set1_ps(id[0]), _mm512_set1_ps(id[1]), _mm512_set1_ps(id[2]), _mm512_set1_ps(id[3])];
    let mut acc = [_mm512_setzero_ps(); 4];
    for c in xs.chunks_exact(16) {
        // SAFETY: a whole chunk of 16 floats.
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        for j in 0..4 {
            acc[j] = add_sq_err(acc[j], v, vd[j], vid[j]);
        }
    }
    least_error([fold16(acc[0]), fold16(acc[1]), fold16(acc[2]), fold16(acc[3])])
}

/// `acc` plus the squared errors of the 16 values `v` rounded at the scale `d`
/// (inverse `id`): `x - d · round(x / d)` (to nearest, ties to even), one
/// fused multiply-add a term.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
fn add_sq_err(acc: __m512, v: __m512, d: __m512, id: __m512) -> __m512 {
    let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v, id));
    let e = _mm512_fnmadd_ps(d, r, v);
    _mm512_fmadd_ps(e, e, acc)
}

/// Lane `l` and lane `l + 8` of `a` added into 8 lanes.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn fold16(a: __m512) -> __m256 {
    _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))))
}

/// [`super::xq8::block_scale`] with AVX-512.
///
/// # Safety
/// AVX-512F available; `xs` holds a multiple of 16 values.
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn block_scale_avx512(xs: &[f32]) -> f32 {
    assert!(xs.len().is_multiple_of(16));
    // SAFETY: AVX-512F (the caller's promise), whole chunks of 16 (asserted).
    unsafe {
        let Some(d) = candidate_scales(amax_avx512(xs)) else { return 0.0 };
        d[least_error_avx512(xs, d, d.map(|d| 1.0 / d))]
    }
}

/// One block of 32 activations searched and quantized in one go with AVX-512:
/// [`block_scale_avx512`]'s scale and [`quantize_block_avx512`]'s codes and
/// half sums (the codes at the chosen candidate's inverse, `1 / d` as that
/// computes it), without a second call or division.
///
/// # Safety
/// AVX-512F available; `xb` and `q` hold 32 values.
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn scale_and_quantize_avx512(xb: &[f32], q: &mut [i8]) -> (f32, [i32; 2]) {
    assert!(xb.len() >= 32 && q.len() >= 32);
    let xb = &xb[..32];
    // SAFETY: AVX-512F (the caller's promise), 32 values in and out (asserted).
    unsafe {
        let Some(d) = candidate_scales(amax_avx512(xb)) else {
            q[..32].fill(0);
            return (0.0, [0, 0]);
        };
        let id = d.map(|d| 1.0 / d);
        let j = least_error_avx512(xb, d, id);
        (d[j], codes_avx512(xb, q, _mm512_set1_ps(id[j])))
    }
}

/// Four consecutive blocks of 32 activations (`xb`: 128 values) searched and
/// quantized together with AVX-512: per block what [`scale_and_quantize_avx512`]
/// gives, bit for bit, with the four blocks' work side by side (one block's
/// search is a chain of dependent steps, from its largest magnitude to the
/// chosen candidate's codes; four chains fill the ports one leaves idle). The
/// 16 candidate scales and their inverses take two vector divisions; the 16
/// error sums fold in one tree whose every addition adds the lanes
/// [`least_error`] adds (lane `l` and `l + 8`, then `l + 4`, then
/// `(0 + 2) + (1 + 3)`), leaving block `b`'s four candidates in the 128-bit lane
/// `b`, where the same minimum and comparison pick the same one.
///
/// # Safety
/// AVX-512F available; `xb` and `q` hold 128 values.
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn scale_and_quantize4_avx512(xb: &[f32], q: &mut [i8]) -> ([f32; 4], [[i32; 2]; 4]) {
    assert!(xb.len() >= 128 && q.len() >= 128);
    let steps = super::SCALE_STEPS;
    // SAFETY: AVX-512F (the caller's promise), 128 values in and out (asserted).
    unsafe {
        let p = xb.as_ptr();
        // (Loops, not closures: those would not inherit the target features.)
        let mut v = [[_mm512_setzero_ps(); 2]; 4];
        let mut amax = [0f32; 4];
        for b in 0..4 {
            v[b] = [_mm512_loadu_ps(p.add(32 * b)), _mm512_loadu_ps(p.add(32 * b + 16))];
            amax[b] = amax_avx512(&xb[32 * b..32 * b + 32]);
        }
        // Lane 4b + j: block b's candidate j, as `candidate_scales` computes it.
        let a = _mm512_setr_ps(
            amax[0], amax[0], amax[0], amax[0], amax[1], amax[1], amax[1], amax[1], amax[2], amax[2], amax[2], amax[2], amax[3], amax[3],
            amax[3], amax[3],
        );
        let s = _mm512_setr_ps(
            steps[0], steps[1], steps[2], steps[3], steps[0], steps[1], steps[2], steps[3], steps[0], steps[1], steps[2], steps[3],
            steps[0], steps[1], steps[2], steps[3],
        );
        let dv = _mm512_mul_ps(_mm512_div_ps(a, _mm512_set1_ps(127.0)), s);
        let idv = _mm512_div_ps(_mm512_set1_ps(1.0), dv);
        let (mut d, mut id) = ([0f32; 16], [0f32; 16]);
        _mm512_storeu_ps(d.as_mut_ptr(), dv);
        _mm512_storeu_ps(id.as_mut_ptr(), idv);
        // Input 4j + b of the tree: block b's candidate j (where the tree's lanes
        // put block b's four in its 128-bit lane b, in candidate order).
        let mut acc = [_mm512_setzero_ps(); 16];
        for (i, acc) in acc.iter_mut().enumerate() {
            let (j, b) = (i / 4, i % 4);
            let (vd, vid) = (_mm512_set1_ps(d[4 * b + j]), _mm512_set1_ps(id[4 * b + j]));
            for h in v[b] {
                *acc = add_sq_err(*acc, h, vd, vid);
            }
        }
        // Lane l + lane l + 8: inputs 2i and 2i + 1 side by side, 8 lanes each.
        let mut f8 = [_mm512_setzero_ps(); 8];
        for (i, f) in f8.iter_mut().enumerate() {
            let (x, y) = (acc[2 * i], acc[2 * i + 1]);
            *f = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(x, y), _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y));
        }
        // Then l + (l + 4): one 128-bit lane an input (4i .. 4i + 3).
        let mut f4 = [_mm512_setzero_ps(); 4];
        for (i, f) in f4.iter_mut().enumerate() {
            let (x, y) = (f8[2 * i], f8[2 * i + 1]);
            *f = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y));
        }
        // Then (0 + 2) and (1 + 3) in each 128-bit lane L: inputs L and L + 4
        // (L + 8 and L + 12 in the second).
        let mut f2 = [_mm512_setzero_ps(); 2];
        for (i, f) in f2.iter_mut().enumerate() {
            let (x, y) = (_mm512_castps_pd(f4[2 * i]), _mm512_castps_pd(f4[2 * i + 1]));
            *f = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
        }
        // Then their sums: 128-bit lane L holds inputs L, L + 4, L + 8 and L + 12,
        // block L's candidates.
        let err = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(f2[0], f2[1]), _mm512_shuffle_ps::<0b11_01_11_01>(f2[0], f2[1]));
        let m = _mm512_min_ps(err, _mm512_shuffle_ps::<0b10_11_00_01>(err, err));
        let m = _mm512_min_ps(m, _mm512_shuffle_ps::<0b01_00_11_10>(m, m));
        let at = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(err, m) as u32;
        let mut scales = [0f32; 4];
        let mut sums = [[0i32; 2]; 4];
        for b in 0..4 {
            let (xs, qs) = (&xb[32 * b..32 * b + 32], &mut q[32 * b..32 * b + 32]);
            if d[4 * b] == 0.0 {
                // `candidate_scales`' None: every value 0.
                qs.fill(0);
                continue;
            }
            let bits = (at >> (4 * b)) & 0xf;
            let j = if bits == 0 { 0 } else { bits.trailing_zeros() as usize };
            scales[b] = d[4 * b + j];
            sums[b] = codes_avx512(xs, qs, _mm512_set1_ps(id[4 * b + j]));
        }
        (scales, sums)
    }
}

/// The upper four lanes of `a` added to its lower four.
#[inline]
#[target_feature(enable = "avx2")]
fn fold_halves(a: __m256) -> __m128 {
    _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1))
}

/// [`super::xq8::quantize_block`] with AVX2: the same codes (conversion rounds to
/// nearest, ties to even) and half sums.
///
/// # Safety
/// AVX2 available; `xb` and `q` hold 32 values.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_block(xb: &[f32], q: &mut [i8], d: f32) -> [i32; 2] {
    assert!(xb.len() >= 32 && q.len() >= 32);
    // SAFETY: 32 readable floats and 32 writable bytes (asserted).
    unsafe {
        let p = xb.as_ptr();
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let i = v.map(|x| _mm256_cvtps_epi32(_mm256_mul_ps(x, id)));
        let half = |a: __m256i, b: __m256i| {
            let s = _mm256_add_epi32(a, b);
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
            _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01)))
        };
        let sums = [half(i[0], i[1]), half(i[2], i[3])];
        // int32 -> int16 -> int8 (saturating; |code| <= 127), then undo the
        // packs' lane interleave.
        let a = _mm256_packs_epi32(i[0], i[1]);
        let b = _mm256_packs_epi32(i[2], i[3]);
        let c = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, c);
        sums
    }
}

/// [`super::xq8::quantize_block`] with AVX-512.
///
/// # Safety
/// AVX-512F available; `xb` and `q` hold 32 values.
#[target_feature(enable = "avx2,avx512f")]
pub unsafe fn quantize_block_avx512(xb: &[f32], q: &mut [i8], d: f32) -> [i32; 2] {
    assert!(xb.len() >= 32 && q.len() >= 32);
    // SAFETY: AVX-512F (the caller's promise), 32 values in and out (asserted).
    unsafe { codes_avx512(xb, q, _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 })) }
}

/// The codes of 32 values at inverse scale `id`: each half block (16 values)
/// one register, converted (to nearest, ties to even), narrowed to bytes and
/// summed.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn codes_avx512(xb: &[f32], q: &mut [i8], id: __m512) -> [i32; 2] {
    let mut sums = [0i32; 2];
    for (h, s) in sums.iter_mut().enumerate() {
        // SAFETY: the callers hold 32 values in `xb` and `q`.
        unsafe {
            let codes = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb.as_ptr().add(16 * h)), id));
            _mm_storeu_si128(q.as_mut_ptr().add(16 * h) as *mut __m128i, _mm512_cvtsepi32_epi8(codes));
            *s = _mm512_reduce_add_epi32(codes);
        }
    }
    sums
}

/// Blocks `b..b + 8` of one row: their weight scales (`sp`: the row's f16
/// headers as 16-byte words) widened by one F16C conversion and multiplied by
/// the activation scales `xd` into `comb`; for formats with a minimum (and
/// Q4_0, whose nibbles the int8 loops take unsigned: a minimum of -8d), the
/// minima times the activation sums `xs` added to `mins`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales8(format: QFormat, sp: *const __m128i, xd: *const f32, xs: *const f32, b: usize, comb: &mut [f32; 8], mins: &mut __m256) {
    // SAFETY: the caller keeps b + 8 within the row's blocks and x's.
    unsafe {
        let d = if has_min(format) {
            // (d, m) pairs: d0 m0 d1 m1 .. d7 m7 -> d0..d7 and m0..m7.
            let lo = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(b / 4)));
            let hi = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(b / 4 + 1)));
            let even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0b10_00_10_00)), 0xD8));
            let odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0b11_01_11_01)), 0xD8));
            *mins = _mm256_fmadd_ps(odd, _mm256_loadu_ps(xs.add(b)), *mins);
            even
        } else {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(b / 8)));
            if format == QFormat::Q4_0 {
                // The int8 loops take Q4_0's nibbles unsigned: a minimum of -8d.
                *mins = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(-8.0)), _mm256_loadu_ps(xs.add(b)), *mins);
            }
            d
        };
        _mm256_storeu_ps(comb.as_mut_ptr(), _mm256_mul_ps(d, _mm256_loadu_ps(xd.add(b))));
    }
}

/// The minimum of block `b` (scale `d`) as the int8 loops see it: Q4_1's and
/// Q5_1's stored one, -8d for Q4_0 (its nibbles taken unsigned), else 0.
#[inline]
#[target_feature(enable = "f16c")]
fn block_min(format: QFormat, s: &[f16], b: usize, d: f32) -> f32 {
    match format {
        QFormat::Q4_0 => -8.0 * d,
        f if has_min(f) => h(s[2 * b + 1]),
        _ => 0.0,
    }
}

/// # Safety
/// AVX2, FMA and F16C available; `q` holds whole blocks, `s` their scales, `out`
/// 32 values per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize(format: QFormat, q: &[u8], s: &[f16], out: &mut [f32]) {
    let qb = format.quant_bytes();
    let blocks = q.len() / qb;
    for b in 0..blocks {
        // SAFETY: block b reads q[qb*b..qb*(b+1)] and writes out[32b..32b+32].
        unsafe {
            let (v, d, m) = match format {
                QFormat::Q8_0 => (q8(q.as_ptr().add(32 * b)), h(s[b]), 0.0),
                QFormat::Q4_0 => (q4(q.as_ptr().add(16 * b)), h(s[b]), -8.0 * h(s[b])),
                QFormat::Q4_1 => (q4(q.as_ptr().add(16 * b)), h(s[2 * b]), h(s[2 * b + 1])),
                _ => unreachable!("dequantize serves the formats of `four_row_path`"),
            };
            let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
            let o = out.as_mut_ptr().add(32 * b);
            for (i, vi) in v.into_iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * i), _mm256_fmadd_ps(vi, dv, mv));
            }
        }
    }
}

/// The IQ4 levels in both lanes: the `pshufb` table that maps nibbles to values.
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_table() -> __m256i {
    let l = crate::kernels::quant::IQ4_LEVELS;
    // SAFETY: the 16 bytes of the table.
    let t = unsafe { _mm_loadu_si128(l.as_ptr() as *const __m128i) };
    _mm256_set_m128i(t, t)
}

/// The 32 values of a Q5_0, Q5_1 or IQ4_NL block (quant bytes `q`) as int8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn vals32(format: QFormat, q: &[u8]) -> __m256i {
    if format == QFormat::IQ4_NL {
        assert!(q.len() >= 16);
        // SAFETY: 16 readable bytes.
        return _mm256_shuffle_epi8(iq4_table(), unsafe { nibbles(q.as_ptr()) });
    }
    assert!(q.len() >= 20);
    // SAFETY: bytes 4..20 of q.
    let n = unsafe { nibbles(q.as_ptr().add(4)) };
    let bits = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
    );
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi8(-1));
    let x = _mm256_or_si256(n, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    if format == QFormat::Q5_0 { _mm256_sub_epi8(x, _mm256_set1_epi8(16)) } else { x }
}
