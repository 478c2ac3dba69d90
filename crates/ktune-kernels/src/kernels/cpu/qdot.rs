//! Block-format (quantized) microkernels of the CPU layer: dot products of f32 or
//! int8-block activations with rows of ggml blocks read straight from the quants
//! (AVX2+FMA+F16C, portable fallback), SIMD dequantization, the decode activation
//! vector a kernel's `act_bits` asks for ([`ActVec`]), and the "dequantize a few
//! weight rows once, dot them with every token" step the prefill kernels share.
//! Also the `act_bits` / `rows_per_pass` parameters and the validity rule of every
//! CPU block-format kernel.

use std::cell::RefCell;

use super::dot::dot_f32;
use super::{Isa, with_scratch};
use crate::device::CpuCaps;
use crate::kernels::quant::{GROUP, Layout, QFormat, QK, QK_K, QView, Unpacked, check_blocks, dequantize_block, unpack};
use crate::kernels::{CpuIn, DType, KernelError, ParamSpec, Params, Problem, param};

/// `act_bits`: f32 activations, or int8 ones (see [`verify::tolerance_for`](crate::kernels::verify::tolerance_for)).
pub const ACT_BITS: ParamSpec = ParamSpec {
    name: "act_bits",
    values: &[32, 8],
    default: 32,
    help: "activations: 32 f32 (exact dot with the dequantized weights), 8 int8 blocks of 32 with integer dot products \
           (llama.cpp's q8 activations: about 0.5% error, far fewer instructions per weight)",
};
/// `rows_per_pass`: with int8 activations, weight rows per pass over the activation blocks.
pub const ROWS_PER_PASS: ParamSpec = ParamSpec {
    name: "rows_per_pass",
    values: &[1, 4],
    default: 1,
    help: "weight rows dotted per pass over the int8 activation blocks (act_bits 8): 4 loads each activation block once for \
           four rows and keeps four accumulator chains (measured: q4_1 +38%, q8_0 -10% single-threaded on AVX2)",
};

/// CPU block-format kernels: the `isa` level, `rows_per_pass` 4 only with int8
/// activations, and k in whole blocks.
pub fn check_quant(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)?;
    if params.get("rows_per_pass").is_some_and(|&r| r != 1) {
        if params.get("act_bits") != Some(&8) {
            return Err("rows_per_pass 4 needs int8 activations (act_bits 8)".into());
        }
        if !dtype.quant().is_some_and(direct_i8) {
            return Err(format!(
                "rows_per_pass 4 has a path for the 32-element formats (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) only, not {dtype}"
            ));
        }
    }
    check_blocks(prob, dtype)
}

/// Whether `format` has dedicated f32-activation loops (dot, dequantize).
pub fn four_row_path(format: QFormat) -> bool {
    matches!(format, QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q4_1)
}

/// Whether `format` has the direct int8-activation block dot (values straight
/// into registers, eight blocks' scales a step) and the four-row pass
/// (`rows_per_pass` 4): the 32-element formats.
pub fn direct_i8(format: QFormat) -> bool {
    matches!(format, QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q5_1 | QFormat::IQ4_NL)
}

/// One block's int8 values, scales and offsets ([`unpack`]), through AVX2 where
/// `isa` allows.
pub fn unpack_fast(isa: Isa, format: QFormat, q: &[u8], s: &[half::f16], u: &mut Unpacked) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 checked.
        unsafe { x86::unpack_simd(format, q, s, u) };
        return;
    }
    let _ = isa;
    unpack(format, q, s, u);
}

/// `Σ x[i] * w[i]` where `w` is the dequantized view (`x.len()` = `w.elems()`).
pub fn dot_q(isa: Isa, x: &[f32], w: QView<'_>) -> f32 {
    let blocks = w.blocks().min(x.len() / w.format.block_elems());
    let w = w.blocks_range(0, blocks);
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx2() {
            // SAFETY: `isa.avx2()` checked AVX2, FMA and F16C; lengths are whole blocks of `x`.
            return unsafe {
                match w.format {
                    QFormat::Q8_0 => x86::dot_q8_0(x, w.quants, w.scales),
                    QFormat::Q4_0 => x86::dot_q4_0(x, w.quants, w.scales),
                    QFormat::Q4_1 => x86::dot_q4_1(x, w.quants, w.scales),
                    _ => x86::dot_unpacked(x, w),
                }
            };
        }
    }
    let _ = isa;
    dot_q_scalar(x, w)
}

/// Activations quantized to int8 blocks of 32 (llama.cpp's q8_0 activations):
/// per block `d = max|x| / 127`, `q = round(x / d)`, and `Σ q` for the offset terms.
pub struct XQ8 {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    /// `d * Σ q` per block: the q4_1 minimum's term is `m * dsum`.
    pub dsum: Vec<f32>,
    /// `d * Σ q` per 16 elements (two per block): the offset terms of the formats
    /// whose minimum changes every 16 elements (Q2_K) or 32.
    pub dsum16: Vec<f32>,
    /// One scale for each 256 elements (llama.cpp's q8_K activations, what its
    /// K-quant dots take): `d` repeats over the 8 blocks of a super-block, so
    /// every block loop stays right, and the K-quant dots sum whole super-blocks
    /// in integers before one conversion.
    pub per256: bool,
}

/// The buffers of a dropped [`XQ8`], kept for the next one (no `Drop` of its own).
struct SpareXq8(Vec<i8>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Spare activation buffers (see `Drop for XQ8`), shared by every thread.
static SPARE_XQ8: super::Spares<SpareXq8> = super::Spares::new();

impl SpareXq8 {
    /// Room for `k` activations without growing.
    fn fits(&self, k: usize) -> bool {
        let blocks = k / QK;
        self.0.capacity() >= blocks * QK && self.1.capacity() >= blocks && self.2.capacity() >= blocks && self.3.capacity() >= 2 * blocks
    }
}

/// `count` spare activation buffers for rows of up to `k` elements.
pub(super) fn reserve_spares(count: usize, k: usize) {
    let blocks = k.div_ceil(QK);
    SPARE_XQ8.ensure(
        count,
        |s| s.fits(blocks * QK),
        || {
            SpareXq8(
                Vec::with_capacity(blocks * QK),
                Vec::with_capacity(blocks),
                Vec::with_capacity(blocks),
                Vec::with_capacity(2 * blocks),
            )
        },
    );
}

/// A quantized activation vector goes back to the shared spares when dropped,
/// so quantizing the next one (every projection of a decode step) reuses its
/// buffers instead of allocating.
impl Drop for XQ8 {
    fn drop(&mut self) {
        if self.q.capacity() == 0 {
            return;
        }
        SPARE_XQ8.give(SpareXq8(
            std::mem::take(&mut self.q),
            std::mem::take(&mut self.d),
            std::mem::take(&mut self.dsum),
            std::mem::take(&mut self.dsum16),
        ));
    }
}

impl XQ8 {
    /// `x` as int8 blocks of 32, each with its own scale.
    pub fn quantize(x: &[f32]) -> XQ8 {
        XQ8::quantize_as(x, false)
    }

    /// `x` as int8 codes with one scale per 256 elements (when `x` holds whole
    /// super-blocks; else as [`XQ8::quantize`]).
    pub fn quantize_k(x: &[f32]) -> XQ8 {
        XQ8::quantize_as(x, x.len().is_multiple_of(QK_K))
    }

    fn quantize_as(x: &[f32], per256: bool) -> XQ8 {
        let blocks = x.len() / QK;
        let SpareXq8(q, d, dsum, dsum16) =
            SPARE_XQ8.take(|s| s.fits(x.len()), |s| s.0.capacity()).unwrap_or(SpareXq8(Vec::new(), Vec::new(), Vec::new(), Vec::new()));
        let mut out = XQ8 { q, d, dsum, dsum16, per256 };
        out.q.clear();
        out.q.resize(blocks * QK, 0);
        for (v, n) in [(&mut out.d, blocks), (&mut out.dsum, blocks), (&mut out.dsum16, 2 * blocks)] {
            v.clear();
            v.resize(n, 0.0);
        }
        #[cfg(target_arch = "x86_64")]
        let simd = Isa::best().avx2();
        let mut shared = 0f32;
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let qb = &mut out.q[b * QK..(b + 1) * QK];
            // The super-block's largest magnitude, once per 8 blocks.
            if per256 && b % 8 == 0 {
                shared = x[b * QK..(b + 8) * QK].iter().fold(0f32, |m, v| m.max(v.abs()));
            }
            let amax = if per256 { Some(shared) } else { None };
            #[cfg(target_arch = "x86_64")]
            let (d, s) = if simd {
                // SAFETY: AVX2 checked; 32 values in, 32 codes out.
                unsafe { x86::quantize_block(xb, qb, amax) }
            } else {
                quantize_block(xb, qb, amax)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let (d, s) = quantize_block(xb, qb, amax);
            out.d[b] = d;
            out.dsum[b] = d * (s[0] + s[1]) as f32;
            out.dsum16[2 * b] = d * s[0] as f32;
            out.dsum16[2 * b + 1] = d * s[1] as f32;
        }
        out
    }
}

/// One block of 32 activations to int8 codes (`d = max|x| / 127`, codes rounded
/// to nearest, ties to even, as the SIMD conversion does): the scale and the
/// codes' sums over each half. `amax`: the largest magnitude of a wider group
/// the scale is shared with (else the block's own).
fn quantize_block(xb: &[f32], q: &mut [i8], amax: Option<f32>) -> (f32, [i32; 2]) {
    let amax = amax.unwrap_or_else(|| xb.iter().fold(0f32, |m, v| m.max(v.abs())));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut s = [0i32; 2];
    for (j, (q, &v)) in q.iter_mut().zip(xb).enumerate() {
        *q = (v * id).round_ties_even() as i8;
        s[j / GROUP] += *q as i32;
    }
    (d, s)
}

/// `Σ x[i] * w[i]` with `x` as int8 blocks: integer dot products per block, scaled
/// by both blocks' scales (and the q4 offsets through `Σ q`).
pub fn dot_q_i8(isa: Isa, x: &XQ8, w: QView<'_>) -> f32 {
    let per = w.format.block_elems() / QK;
    let blocks = w.blocks().min(x.d.len() / per);
    let w = w.blocks_range(0, blocks);
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx2() {
            // SAFETY: `isa.avx2()` checked AVX2, FMA and F16C; `x` holds `blocks` blocks.
            return unsafe {
                match (direct_i8(w.format), isa.vnni()) {
                    // One activation scale per super-block: whole super-blocks summed
                    // in integers (llama.cpp's q4_K x q8_K).
                    (false, true) if x.per256 && w.format == QFormat::Q4_K => x86::kq8_vnni::dot_q4k(w.quants, w.scales, x),
                    (false, true) if x.per256 && w.format == QFormat::Q6_K => x86::kq8_vnni::dot_q6k(w.quants, w.scales, x),
                    (false, false) if x.per256 && w.format == QFormat::Q4_K => x86::kq8_avx2::dot_q4k(w.quants, w.scales, x),
                    (false, false) if x.per256 && w.format == QFormat::Q6_K => x86::kq8_avx2::dot_q6k(w.quants, w.scales, x),
                    // SAFETY (vnni): `isa.vnni()` checked AVX-512F/BW/VL/VNNI too.
                    (true, true) => x86::vnni::dot_i8(w.format, w.quants, w.scales, x),
                    (true, false) => x86::avx2::dot_i8(w.format, w.quants, w.scales, x),
                    (false, _) => x86::dot_i8_unpacked(x, w),
                }
            };
        }
    }
    let _ = isa;
    let mut s = 0f32;
    let mut u = Unpacked::default();
    for b in 0..blocks {
        let (q, sc) = w.block(b);
        unpack(w.format, q, sc, &mut u);
        for g in 0..w.format.block_elems() / GROUP {
            let xb = (b * per) + g / 2;
            let xq = &x.q[(b * per) * QK + g * GROUP..][..GROUP];
            let dot: i32 = u.vals[g * GROUP..(g + 1) * GROUP].iter().zip(xq).map(|(&a, &c)| a as i32 * c as i32).sum();
            s += u.scale[g] * x.d[xb] * dot as f32 + u.off[g] * x.dsum16[2 * xb + g % 2];
        }
    }
    s
}

/// Whether int8 dots with `format` weights take activations with one scale per
/// 256 ([`XQ8::quantize_k`]): Q4_K and Q6_K on a CPU with AVX2.
pub fn per256_dots(format: QFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    return matches!(format, QFormat::Q4_K | QFormat::Q6_K) && Isa::best().avx2();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = format;
        false
    }
}

/// A decode activation vector as a kernel's `act_bits` asks: f32, or int8 blocks.
pub enum ActVec<'a> {
    F32(&'a [f32]),
    I8(XQ8),
}

impl<'a> ActVec<'a> {
    /// `x` for dots with weights of `format`: with `act_bits 8`, int8 blocks, with
    /// one scale per super-block for the K-quants whose dots sum super-blocks in
    /// integers on x86 (as llama.cpp quantizes their activations, q8_K).
    pub fn new(x: &'a [f32], params: &Params, format: QFormat) -> Result<ActVec<'a>, KernelError> {
        Ok(if param(params, "act_bits")? == 8 {
            ActVec::I8(if per256_dots(format) { XQ8::quantize_k(x) } else { XQ8::quantize(x) })
        } else {
            ActVec::F32(x)
        })
    }
    #[inline]
    pub fn dot(&self, isa: Isa, w: QView<'_>) -> f32 {
        match self {
            ActVec::F32(x) => dot_q(isa, x, w),
            ActVec::I8(x) => dot_q_i8(isa, x, w),
        }
    }
    /// Rows `first..first + y.len()` of `w` (`k` columns) dotted with this vector
    /// into `y`; with `four`, int8 activations take four rows per pass on AVX2.
    pub fn rows(&self, isa: Isa, w: QView<'_>, k: usize, first: usize, y: &mut [f32], four: bool) {
        if let Layout::X8 { .. } = w.layout {
            // 8 rows a pass straight from the records, whichever the activations.
            match self {
                ActVec::I8(x) => super::qx8::rows_x8(isa, x, w, first, y),
                ActVec::F32(x) => super::qx8::rows_x8_f32(isa, x, w, first, y),
            }
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = four;
        #[cfg(target_arch = "x86_64")]
        if let ActVec::I8(x) = self
            && four
            && isa.avx2()
            && x.d.len() * QK >= k
            && direct_i8(w.format)
        {
            let mut i = 0;
            while i + 4 <= y.len() {
                let r: [QView<'_>; 4] = std::array::from_fn(|j| qrow(w, first + i + j, k));
                // SAFETY: AVX2/FMA/F16C checked; each row holds k / 32 blocks, as x does (or more).
                let (q, s) = (r.map(|v| v.quants), r.map(|v| v.scales));
                // SAFETY (vnni): `isa.vnni()` checked AVX-512F/BW/VL/VNNI too.
                let out =
                    unsafe { if isa.vnni() { x86::vnni::dot_i8_x4(w.format, q, s, x) } else { x86::avx2::dot_i8_x4(w.format, q, s, x) } };
                y[i..i + 4].copy_from_slice(&out);
                i += 4;
            }
            for (j, out) in y[i..].iter_mut().enumerate() {
                *out = self.dot(isa, qrow(w, first + i + j, k));
            }
            return;
        }
        for (i, out) in y.iter_mut().enumerate() {
            *out = self.dot(isa, qrow(w, first + i, k));
        }
    }
}

/// Portable block-by-block dot product.
pub fn dot_q_scalar(x: &[f32], w: QView<'_>) -> f32 {
    let be = w.format.block_elems();
    let mut tmp = [0f32; QK_K];
    let mut s = 0f32;
    for b in 0..w.blocks() {
        let (q, sc) = w.block(b);
        dequantize_block(w.format, q, sc, &mut tmp[..be]);
        s += super::dot::dot_f32_scalar(&x[b * be..(b + 1) * be], &tmp[..be]);
    }
    s
}

/// Row `r` (of `k` columns) of `w` dequantized into `out`, whatever its layout.
pub fn dequantize_row(isa: Isa, w: QView<'_>, r: usize, k: usize, out: &mut [f32]) {
    let Layout::X8 { bpr } = w.layout else { return dequantize(isa, qrow(w, r, k), out) };
    for (c, o) in out.chunks_exact_mut(w.format.block_elems()).take(bpr).enumerate() {
        w.with_block(r * bpr + c, |q, s| dequantize(isa, QView { format: w.format, quants: q, scales: s, layout: Layout::Rows }, o));
    }
}

/// Dequantizes a view into `out` (SIMD where available).
pub fn dequantize(isa: Isa, w: QView<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx2() {
            let be = w.format.block_elems();
            let blocks = w.blocks().min(out.len() / be);
            let w = w.blocks_range(0, blocks);
            // SAFETY: as in `dot_q`; `out` holds `blocks * block_elems` values.
            unsafe {
                if four_row_path(w.format) {
                    x86::dequantize(w.format, w.quants, w.scales, &mut out[..blocks * be])
                } else {
                    x86::dequantize_unpacked(w, &mut out[..blocks * be])
                }
            };
            return;
        }
    }
    let _ = isa;
    w.dequantize_into(out);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{GROUP, QFormat, QK, QView, Unpacked};

    use crate::kernels::cpu::dot::x86::hsum256 as hsum;

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
        let (lo, hi) = (_mm256_castsi256_si128(raw), _mm256_extracti128_si256(raw, 1));
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))),
        ]
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
        [
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
        ]
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

    /// The direct int8 loops (the formats of `direct_i8`), stamped out once per
    /// instruction set: `$sdot` dots signed weights with int8 activations, `$udot`
    /// unsigned ones (formats with a minimum), each into 8 f32 lanes; everything
    /// else is shared. `avx2`: `maddubs` + `madd` (llama.cpp's sign trick);
    /// `vnni`: AVX-512 VNNI's `vpdpbusd` on 256-bit registers (one instruction for
    /// the 32 products and their sums by four, no 16-bit intermediate).
    macro_rules! int8_loops {
        ($name:ident, $feat:literal, $sdot:ident, $udot:ident) => {
            pub mod $name {
                use super::*;

                /// Block `b`'s integer dot product with `x` (f32 lanes to be summed) and the
                /// weight scale.
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn block_i8(format: QFormat, q: &[u8], s: &[f16], x: &crate::kernels::cpu::XQ8, b: usize) -> (__m256, f32) {
                    // SAFETY: the caller keeps b below the block count of `q`, `s` and `x`.
                    unsafe { (block_dot_i8(format, q.as_ptr(), x.q.as_ptr(), b), h(s[if has_min(format) { 2 * b } else { b }])) }
                }

                /// Block `b`'s integer dot product of the quants at `q` with the int8
                /// activations at `xq` (f32 lanes to be summed), unscaled.
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn block_dot_i8(format: QFormat, q: *const u8, xq: *const i8, b: usize) -> __m256 {
                    // SAFETY: the caller keeps b below the block count of both.
                    unsafe { block_dot_xv(format, q, _mm256_loadu_si256(xq.add(32 * b) as *const __m256i), b) }
                }

                /// [`block_dot_i8`] with block `b`'s activations already loaded (`xv`), so
                /// several rows share one load.
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn block_dot_xv(format: QFormat, q: *const u8, xv: __m256i, b: usize) -> __m256 {
                    // SAFETY: the caller keeps b below the block count of `q`.
                    unsafe {
                        match format {
                            QFormat::Q8_0 => $sdot(_mm256_loadu_si256(q.add(32 * b) as *const __m256i), xv),
                            // The nibbles as unsigned weights (no sign trick); their -8
                            // enters as a minimum of -8d through Σx (`x.dsum`), as Q4_1's does.
                            QFormat::Q4_0 => $udot(nibbles(q.add(16 * b)), xv),
                            // Unsigned nibbles times int8 x; the minimum m enters through Σx (`x.dsum`).
                            QFormat::Q4_1 => $udot(nibbles(q.add(16 * b)), xv),
                            // Five-bit values (high bits from qh): signed for Q5_0 and, through
                            // the non-linear table, IQ4_NL; unsigned with a minimum for Q5_1.
                            QFormat::Q5_0 | QFormat::IQ4_NL => {
                                let qb = format.quant_bytes();
                                $sdot(vals32(format, std::slice::from_raw_parts(q.add(qb * b), qb)), xv)
                            }
                            QFormat::Q5_1 => $udot(vals32(format, std::slice::from_raw_parts(q.add(20 * b), 20)), xv),
                            _ => unreachable!("block_dot_i8 serves the formats of `direct_i8`"),
                        }
                    }
                }

                /// # Safety
                /// AVX2, FMA and F16C available; `q` holds whole blocks, `s` their scales and
                /// `x` at least as many blocks.
                #[target_feature(enable = $feat)]
                pub unsafe fn dot_i8(format: QFormat, q: &[u8], s: &[f16], x: &crate::kernels::cpu::XQ8) -> f32 {
                    // One loop per format (the match is resolved outside the loop), two blocks
                    // per step into two accumulators so the FMA chains overlap.
                    #[inline]
                    #[target_feature(enable = $feat)]
                    unsafe fn run<const F: u8>(q: &[u8], s: &[f16], x: &crate::kernels::cpu::XQ8) -> f32 {
                        let format = I8_FORMATS[F as usize];
                        let blocks = q.len() / format.quant_bytes();
                        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                        let mut mins = _mm256_setzero_ps();
                        let (sp, xd, xs) = (s.as_ptr() as *const __m128i, x.d.as_ptr(), x.dsum.as_ptr());
                        let mut comb = [0f32; 8];
                        let mut b = 0;
                        // SAFETY (every pointer read and block_i8 call): b + 8 <= blocks, the
                        // block count of q, s (one f16 a block, two for Q4_1) and x.
                        unsafe {
                            // Eight blocks a step: their weight scales widened in one F16C
                            // conversion and multiplied by the activation scales in one vector
                            // (Q4_1: the minima times Σx accumulate as a vector too), then each
                            // block's integer dot scaled by a broadcast from `comb`.
                            let pf = crate::kernels::cpu::prefetch_bytes();
                            let qb8 = 8 * format.quant_bytes();
                            while b + 8 <= blocks {
                                prefetch(q.as_ptr().wrapping_add(b * format.quant_bytes()), pf, qb8);
                                scales8(format, sp, xd, xs, b, &mut comb, &mut mins);
                                let mut j = 0;
                                while j < 8 {
                                    let p0 = block_dot_i8(format, q.as_ptr(), x.q.as_ptr(), b + j);
                                    let p1 = block_dot_i8(format, q.as_ptr(), x.q.as_ptr(), b + j + 1);
                                    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&comb[j]), p0, a0);
                                    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&comb[j + 1]), p1, a1);
                                    j += 2;
                                }
                                b += 8;
                            }
                        }
                        let mut m0 = hsum(mins);
                        // SAFETY: b < blocks, as above.
                        unsafe {
                            while b < blocks {
                                let (p0, d0) = block_i8(format, q, s, x, b);
                                a0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x.d[b]), p0, a0);
                                m0 += block_min(format, s, b, d0) * x.dsum[b];
                                b += 1;
                            }
                        }
                        hsum(_mm256_add_ps(a0, a1)) + m0
                    }
                    // SAFETY: as the caller's contract.
                    unsafe { by_format!(format, run(q, s, x)) }
                }

                /// Four rows at once: [`dot_i8`] of `x` with each of `q[r]`/`s[r]` (the same
                /// block count), every activation block loaded once for the four.
                ///
                /// # Safety
                /// As [`dot_i8`], for each row.
                #[target_feature(enable = $feat)]
                pub unsafe fn dot_i8_x4(format: QFormat, q: [&[u8]; 4], s: [&[f16]; 4], x: &crate::kernels::cpu::XQ8) -> [f32; 4] {
                    #[inline]
                    #[target_feature(enable = $feat)]
                    unsafe fn run<const F: u8>(q: [&[u8]; 4], s: [&[f16]; 4], x: &crate::kernels::cpu::XQ8) -> [f32; 4] {
                        let format = I8_FORMATS[F as usize];
                        let blocks = q[0].len() / format.quant_bytes();
                        let mut acc = [_mm256_setzero_ps(); 4];
                        let mut m = [0f32; 4];
                        let mut mins = [_mm256_setzero_ps(); 4];
                        let mut comb = [[0f32; 8]; 4];
                        let (xd, xs, xq) = (x.d.as_ptr(), x.dsum.as_ptr(), x.q.as_ptr());
                        let mut b = 0;
                        // SAFETY: b + 8 <= blocks, the block count of every row and of x.
                        unsafe {
                            // Eight blocks a step, as in `dot_i8`; each activation block is
                            // loaded once for the four rows.
                            let pf = crate::kernels::cpu::prefetch_bytes();
                            let qb8 = 8 * format.quant_bytes();
                            while b + 8 <= blocks {
                                for qr in &q {
                                    prefetch(qr.as_ptr().wrapping_add(b * format.quant_bytes()), pf, qb8);
                                }
                                for r in 0..4 {
                                    scales8(format, s[r].as_ptr() as *const __m128i, xd, xs, b, &mut comb[r], &mut mins[r]);
                                }
                                for j in 0..8 {
                                    let xv = _mm256_loadu_si256(xq.add(32 * (b + j)) as *const __m256i);
                                    for ((a, qr), cr) in acc.iter_mut().zip(&q).zip(&comb) {
                                        let p = block_dot_xv(format, qr.as_ptr(), xv, b + j);
                                        *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&cr[j]), p, *a);
                                    }
                                }
                                b += 8;
                            }
                        }
                        for r in 0..4 {
                            m[r] = hsum(mins[r]);
                        }
                        for b in b..blocks {
                            let xd = x.d[b];
                            for r in 0..4 {
                                // SAFETY: b < blocks, the block count of every row and of x.
                                let (p, d) = unsafe { block_i8(format, q[r], s[r], x, b) };
                                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd), p, acc[r]);
                                m[r] += block_min(format, s[r], b, d) * x.dsum[b];
                            }
                        }
                        [hsum(acc[0]) + m[0], hsum(acc[1]) + m[1], hsum(acc[2]) + m[2], hsum(acc[3]) + m[3]]
                    }
                    // SAFETY: as the caller's contract.
                    unsafe { by_format!(format, run(q, s, x)) }
                }
            }
        };
    }

    int8_loops!(avx2, "avx2,fma,f16c", dot_s8, dot_u8);
    int8_loops!(vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dot_s8_vnni, dot_u8_vnni);

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
    /// ([`XQ8::per256`](super::XQ8)), as llama.cpp's q4_K/q6_K x q8_K: the codes
    /// times the int8 activations by `maddubs` (pairs into 16 bits), times the
    /// sub-block scales into 32-bit lanes by `$dpw`, a whole super-block summed in
    /// integers, then one conversion and one multiply by `d · d_x`. The offsets
    /// (Q4_K's minima, Q6_K's -32) go through the activation sums in f32.
    macro_rules! kq8_loops {
        ($name:ident, $feat:literal, $dpw:ident) => {
            pub mod $name {
                use std::arch::x86_64::*;

                use half::f16;

                use super::super::XQ8;
                use super::{h, hsum, prefetch, $dpw};
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
                            mins =
                                _mm256_fmadd_ps(_mm256_mul_ps(mn, _mm256_set1_ps(dmin)), _mm256_loadu_ps(x.dsum.as_ptr().add(8 * b)), mins);
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
                                let sc =
                                    _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(if half == 0 { sc8 } else { _mm_srli_si128::<8>(sc8) }));
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

    /// Prefetches into L1 the `len` bytes `ahead` bytes past `p`, a line at a
    /// time (none when `ahead` is 0). The address may lie past the end of the
    /// row or of the allocation: a prefetch never faults, and a task's next row
    /// follows its current one.
    #[inline]
    #[target_feature(enable = "sse")]
    fn prefetch(p: *const u8, ahead: usize, len: usize) {
        if ahead == 0 {
            return;
        }
        let p = p.wrapping_add(ahead);
        let mut o = 0;
        while o < len {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8);
            o += 64;
        }
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
    /// [`super::quantize_block`] with AVX2: the same codes (conversion rounds to
    /// nearest, ties to even), scale and half sums.
    ///
    /// # Safety
    /// AVX2 available; `xb` and `q` hold 32 values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_block(xb: &[f32], q: &mut [i8], amax: Option<f32>) -> (f32, [i32; 2]) {
        assert!(xb.len() >= 32 && q.len() >= 32);
        // SAFETY: 32 readable floats and 32 writable bytes (asserted).
        unsafe {
            let p = xb.as_ptr();
            let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
            let sign = _mm256_set1_ps(-0.0);
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = amax.unwrap_or_else(|| _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2))));
            let d = amax / 127.0;
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
            (d, sums)
        }
    }

    /// Blocks `b..b + 8` of one row: their weight scales (`sp`: the row's f16
    /// headers as 16-byte words) widened by one F16C conversion and multiplied by
    /// the activation scales `xd` into `comb`; for formats with a minimum (and
    /// Q4_0, whose nibbles the int8 loops take unsigned: a minimum of -8d), the
    /// minima times the activation sums `xs` added to `mins`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales8(
        format: QFormat,
        sp: *const __m128i,
        xd: *const f32,
        xs: *const f32,
        b: usize,
        comb: &mut [f32; 8],
        mins: &mut __m256,
    ) {
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
    pub(super) fn unpack_simd(format: QFormat, q: &[u8], s: &[f16], u: &mut Unpacked) {
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
}

// ---------------------------------------------------------------------------------
// Row access and the dequantize-once prefill step
// ---------------------------------------------------------------------------------

pub fn qin<'a>(k: &str, a: &CpuIn<'a>) -> Result<QView<'a>, KernelError> {
    a.quant().ok_or_else(|| KernelError::BufferType { kernel: k.into(), buffer: "w".into(), expected: "a quantized matrix" })
}

/// Row `r` of a `[_, k]` quantized matrix.
#[inline]
pub fn qrow<'a>(w: QView<'a>, r: usize, k: usize) -> QView<'a> {
    let bpr = k / w.format.block_elems();
    w.blocks_range(r * bpr, bpr)
}

thread_local! {
    /// Dequantized weight rows of one pool task.
    static ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and every token: each row dequantized
/// once into L1, then dotted with the tokens `tile` at a time. Returns `[count][m]`.
#[allow(clippy::too_many_arguments)]
pub fn rows_times_tokens(isa: Isa, x: &[f32], m: usize, k: usize, w: QView<'_>, r0: usize, count: usize, tile: usize) -> Vec<f32> {
    let mut out = vec![0f32; count * m];
    with_scratch(&ROWS, count * k, |buf| {
        for i in 0..count {
            dequantize_row(isa, w, r0 + i, k, &mut buf[i * k..(i + 1) * k]);
        }
        for t0 in (0..m).step_by(tile.max(1)) {
            for i in 0..count {
                let wr = &buf[i * k..(i + 1) * k];
                for t in t0..(t0 + tile).min(m) {
                    out[i * m + t] = dot_f32(isa, &x[t * k..(t + 1) * k], wr);
                }
            }
        }
    });
    out
}

/// Runs `f(r0, count)` for blocks of `grain` weight rows of `n` in parallel; each
/// returns its rows' outputs for every token as `[count][m]`.
pub fn par_row_blocks(n: usize, grain: usize, f: impl Fn(usize, usize) -> Vec<f32> + Sync + Send) -> Vec<(usize, usize, Vec<f32>)> {
    let mut parts: Vec<(usize, usize, Vec<f32>)> =
        (0..n.div_ceil(grain)).map(|c| (c * grain, grain.min(n - c * grain), Vec::new())).collect();
    super::pool::for_chunks_mut(&mut parts, 1, |_, p| p[0].2 = f(p[0].0, p[0].1));
    parts
}

/// Writes the `[count][m]` row blocks of [`par_row_blocks`] into the token-major
/// `y[m, n]`, one token row per pool task (each gathers its column of every
/// block; serially this transpose was 6% of a 1B-shaped Q8_0 prefill).
pub fn scatter_row_blocks(parts: Vec<(usize, usize, Vec<f32>)>, m: usize, n: usize, y: &mut [f32]) {
    super::pool::for_chunks_mut(&mut y[..m * n], n, |t, row| {
        for (r0, count, part) in &parts {
            for (i, o) in row[*r0..*r0 + *count].iter_mut().enumerate() {
                *o = part[i * m + t];
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::QMatrix;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        super::super::testdata::signed(n, seed)
    }

    #[test]
    fn simd_and_scalar_block_dots_agree_with_dequantized_dots() {
        let (rows, k) = (5, 256 * 3);
        let x = data(k, 1);
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, rows, k, &data(rows * k, 2)).unwrap();
            let deq = m.dequantize();
            for r in 0..rows {
                let want: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                for isa in [Isa::Scalar, Isa::best()] {
                    let got = dot_q(isa, &x, qrow(m.view(), r, k));
                    assert!((got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "{f} {isa:?} row {r}: {got} vs {want}");
                }
                let mut out = vec![0f32; k];
                dequantize(Isa::best(), qrow(m.view(), r, k), &mut out);
                for (a, b) in out.iter().zip(&deq[r * k..(r + 1) * k]) {
                    // q4_1's q * d + m is one fused rounding in SIMD, two in scalar.
                    assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{f} SIMD dequantize row {r}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn simd_activation_quantization_gives_the_scalar_codes() {
        // Random blocks, a block of exact ties (x/d = k + 0.5) and a zero block.
        let mut blocks: Vec<Vec<f32>> = (0..20).map(|i| data(32, 100 + i)).collect();
        blocks.push((0..32).map(|j| if j == 0 { 127.0 } else { (j as f32 - 16.0) + 0.5 }).collect());
        blocks.push(vec![0.0; 32]);
        for (n, xb) in blocks.iter().enumerate() {
            let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
            let want = quantize_block(xb, &mut a, None);
            #[cfg(target_arch = "x86_64")]
            if Isa::best().avx2() {
                // SAFETY: AVX2 checked.
                let got = unsafe { x86::quantize_block(xb, &mut b, None) };
                assert_eq!((got, b), (want, a), "block {n}");
            }
            let _ = &mut b;
        }
    }

    #[test]
    fn int8_block_dots_of_the_32_element_formats_take_eight_blocks_a_step_and_a_tail() {
        // 11 blocks: one step of eight blocks (vector scales) and a tail of three.
        let k = 32 * 11;
        let x = data(k, 7);
        let xq = XQ8::quantize(&x);
        for f in QFormat::ALL.into_iter().filter(|&f| direct_i8(f)) {
            let m = QMatrix::quantize(f, 5, k, &data(5 * k, 8)).unwrap();
            let mut four = vec![0f32; 5];
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::best(), m.view(), k, 0, &mut four, true);
            for (r, &fr) in four.iter().enumerate() {
                let s = dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k));
                let v = dot_q_i8(Isa::best(), &xq, qrow(m.view(), r, k));
                assert!((s - v).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r}: scalar {s} vs SIMD {v}");
                assert!((fr - v).abs() <= 1e-5 * (1.0 + v.abs()), "{f} row {r}: four-row {fr} vs one-row {v}");
            }
        }
    }

    #[test]
    fn vnni_int8_dots_equal_the_avx2_ones_bit_for_bit() {
        // The same integer sums by four (vpdpbusd against maddubs + madd), so the
        // same floats; one row, four rows, a tail, and Q8_0 codes of -128 and 127.
        if !Isa::best().vnni() {
            eprintln!("SKIPPED: this CPU has no AVX-512 VNNI (the AVX2 dots serve); nothing to compare");
            return;
        }
        let k = 32 * 11;
        let x = data(k, 9);
        let xq = XQ8::quantize(&x);
        for f in QFormat::ALL.into_iter().filter(|&f| direct_i8(f)) {
            let mut m = QMatrix::quantize(f, 6, k, &data(6 * k, 10)).unwrap();
            if f == QFormat::Q8_0 {
                for (i, q) in m.quants.iter_mut().enumerate().take(64) {
                    *q = if i % 2 == 0 { 0x80 } else { 0x7f };
                }
            }
            let (mut v4, mut a4) = (vec![0f32; 6], vec![0f32; 6]);
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::best(), m.view(), k, 0, &mut v4, true);
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::Simd256, m.view(), k, 0, &mut a4, true);
            assert_eq!(v4, a4, "{f}: four-row pass");
            for r in 0..6 {
                let v = dot_q_i8(Isa::best(), &xq, qrow(m.view(), r, k));
                let a = dot_q_i8(Isa::Simd256, &xq, qrow(m.view(), r, k));
                let s = dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k));
                assert_eq!(v.to_bits(), a.to_bits(), "{f} row {r}: vnni {v} avx2 {a}");
                assert!((v - s).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r}: vnni {v} scalar {s}");
            }
        }
        // The K-quant dots on one scale per super-block: vpdpwssd against madd + add.
        let k = 256 * 3;
        let x = data(k, 11);
        let xk = XQ8::quantize_k(&x);
        for f in [QFormat::Q4_K, QFormat::Q6_K] {
            let m = QMatrix::quantize(f, 4, k, &data(4 * k, 12)).unwrap();
            for r in 0..4 {
                let v = dot_q_i8(Isa::best(), &xk, qrow(m.view(), r, k));
                let a = dot_q_i8(Isa::Simd256, &xk, qrow(m.view(), r, k));
                assert_eq!(v.to_bits(), a.to_bits(), "{f} row {r} (per 256): vnni {v} avx2 {a}");
            }
        }
    }

    #[test]
    fn int8_activation_dots_agree_scalar_simd_and_stay_close() {
        let (rows, k) = (6, 256 * 2);
        let x = data(k, 5);
        // Both activation forms: a scale per 32, and one per 256 (q8_K: what the
        // K-quant dots sum in integers), each against the portable loop.
        for (xq, what) in [(XQ8::quantize(&x), "per 32"), (XQ8::quantize_k(&x), "per 256")] {
            activation_dots_close(&x, &xq, rows, k, what);
        }
        let xk = XQ8::quantize_k(&x);
        assert!(xk.per256 && xk.d.chunks(8).all(|c| c.iter().all(|&d| d == c[0])), "one scale per super-block");
        // The shared scale is the super-block's largest magnitude over 127.
        let amax = x[..256].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(xk.d[0], amax / 127.0);
    }

    fn activation_dots_close(x: &[f32], xq: &XQ8, rows: usize, k: usize, what: &str) {
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, rows, k, &data(rows * k, 6)).unwrap();
            let deq = m.dequantize();
            for r in 0..rows {
                let exact: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                let norm: f64 = (0..k).map(|i| (x[i] as f64 * deq[r * k + i] as f64).abs()).sum();
                let s = dot_q_i8(Isa::Scalar, xq, qrow(m.view(), r, k));
                let v = dot_q_i8(Isa::best(), xq, qrow(m.view(), r, k));
                assert!((s - v).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r} ({what}): scalar {s} vs SIMD {v}");
                // int8 activations: error well under 1% of the absolute sum.
                assert!((v as f64 - exact).abs() <= 1e-2 * norm, "{f} row {r} ({what}): {v} vs {exact} (|sum| {norm})");
            }
            // The four-row pass gives each row's single-row result (rows 1..5: a group
            // of four and a tail); the other formats go row by row.
            let mut y = vec![0f32; rows - 1];
            let again = if xq.per256 { XQ8::quantize_k(x) } else { XQ8::quantize(x) };
            ActVec::I8(again).rows(Isa::best(), m.view(), k, 1, &mut y, true);
            for (i, &v) in y.iter().enumerate() {
                let one = dot_q_i8(Isa::best(), xq, qrow(m.view(), i + 1, k));
                assert!((v - one).abs() <= 1e-5 * (1.0 + one.abs()), "{f} row {}: four-row {v} vs one-row {one}", i + 1);
            }
        }
    }
}
