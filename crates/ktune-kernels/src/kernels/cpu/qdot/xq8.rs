//! Activations quantized to int8 blocks for the block dots ([`XQ8`], llama.cpp's
//! q8_0 activations, or one scale per 256 as its q8_K): the portable block
//! quantizer (the AVX2 and AVX-512 ones in `x86/`), the row quantizer that the
//! int8 GEMM's activation panel shares ([`quantize_row`]), and the spare buffers
//! every decode projection's activation vector reuses.

#[cfg(target_arch = "x86_64")]
use super::{SCALE_STEPS, x86};
use crate::kernels::cpu::{Isa, Spares};
use crate::kernels::quant::{GROUP, QK, QK_K};

/// Activations quantized to int8 blocks of 32 (llama.cpp's q8_0 activations):
/// per block a scale `d` ([`block_scale`]: `max|x| / 127` or a step above it,
/// whichever gives the values back closest), `q = round(x / d)`, and `Σ q` for
/// the offset terms.
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
static SPARE_XQ8: Spares<SpareXq8> = Spares::new();

impl SpareXq8 {
    /// Room for `k` activations without growing.
    fn fits(&self, k: usize) -> bool {
        let blocks = k / QK;
        self.0.capacity() >= blocks * QK && self.1.capacity() >= blocks && self.2.capacity() >= blocks && self.3.capacity() >= 2 * blocks
    }
}

/// `count` spare activation buffers for rows of up to `k` elements.
pub(in crate::kernels::cpu) fn reserve_spares(count: usize, k: usize) {
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
        let (d, dsum, dsum16) = (&mut out.d, &mut out.dsum, &mut out.dsum16);
        quantize_row(&x[..blocks * QK], per256, &mut out.q, |b, db, s| {
            d[b] = db;
            dsum[b] = db * (s[0] + s[1]) as f32;
            dsum16[2 * b] = db * s[0] as f32;
            dsum16[2 * b + 1] = db * s[1] as f32;
        });
        out
    }
}

/// `x` (whole blocks of 32) as int8 codes into `q`, handing each block's index,
/// scale ([`block_scale`]: its own, or with `per256`, `x` then whole
/// super-blocks of 256, its super-block's) and
/// the codes' sums over its two halves to `block`: the one quantizer of
/// [`XQ8`] and of the int8 GEMM's activation panel, which writes its rows in
/// place with it.
pub(in crate::kernels::cpu) fn quantize_row(x: &[f32], per256: bool, q: &mut [i8], mut block: impl FnMut(usize, f32, [i32; 2])) {
    debug_assert!(!per256 || x.len().is_multiple_of(QK_K));
    let isa = Isa::best();
    let mut shared = 0f32;
    // A scale a block: the blocks that go four at a time first.
    let done = if per256 { 0 } else { by_fours(isa, x, q, &mut block) };
    for (b, (xb, qb)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate().skip(done) {
        // The super-block's scale, once per 8 blocks.
        if per256 && b % 8 == 0 {
            shared = super_block_scale(isa, &x[b * QK..(b + 8) * QK]);
        }
        let (d, s) = scale_and_quantize(isa, xb, qb, per256.then_some(shared));
        block(b, d, s);
    }
}

/// With AVX-512, the leading blocks of `x` four a call (the same scales and
/// codes as one at a time: `scale_and_quantize4_avx512`), each handed to
/// `block`; how many it did (0 at other ISAs).
fn by_fours(isa: Isa, x: &[f32], q: &mut [i8], block: &mut impl FnMut(usize, f32, [i32; 2])) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        let mut done = 0;
        for (xs, qs) in x.chunks_exact(4 * QK).zip(q.chunks_exact_mut(4 * QK)) {
            // SAFETY: AVX-512F checked; 128 values in, 128 codes out.
            let (d, s) = unsafe { x86::scale_and_quantize4_avx512(xs, qs) };
            for i in 0..4 {
                block(done + i, d[i], s[i]);
            }
            done += 4;
        }
        return done;
    }
    let _ = (isa, x, q, block);
    0
}

/// The shared scale of a super-block of 256 values ([`block_scale`]).
fn super_block_scale(isa: Isa, xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: AVX-512F checked; 256 values.
        Isa::Avx512 => return unsafe { x86::block_scale_avx512(xs) },
        // SAFETY: AVX2 and FMA checked; 256 values.
        _ if isa.avx2() => return unsafe { x86::block_scale(xs) },
        _ => {}
    }
    let _ = isa;
    block_scale(xs)
}

/// One block of 32 values at `isa`: its scale (`shared`, a super-block's, or its
/// own from [`block_scale`]), codes into `qb` and half sums.
fn scale_and_quantize(isa: Isa, xb: &[f32], qb: &mut [i8], shared: Option<f32>) -> (f32, [i32; 2]) {
    #[cfg(target_arch = "x86_64")]
    match (isa, shared) {
        // SAFETY: AVX-512F checked; 32 values in, 32 codes out.
        (Isa::Avx512, None) => return unsafe { x86::scale_and_quantize_avx512(xb, qb) },
        // SAFETY: as above.
        (Isa::Avx512, Some(d)) => return (d, unsafe { x86::quantize_block_avx512(xb, qb, d) }),
        (_, _) if isa.avx2() => {
            // SAFETY: AVX2 and FMA checked; 32 values in, 32 codes out.
            let d = shared.unwrap_or_else(|| unsafe { x86::block_scale(xb) });
            // SAFETY: as above.
            return (d, unsafe { x86::quantize_block(xb, qb, d) });
        }
        _ => {}
    }
    let _ = isa;
    let d = shared.unwrap_or_else(|| block_scale(xb));
    (d, quantize_block(xb, qb, d))
}

/// The scale of the int8 codes of `xs` (32 values, or 256 sharing one): of
/// `max|x| / 127 · SCALE_STEPS`, the one with the least `Σ (x - d · round(x / d))²`
/// (the first on a tie). The sum runs in 16 lanes, element `i` in lane `i % 16`,
/// one fused multiply-add a term; lane `l` and lane `l + 8` then add into 8,
/// which add up as `((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7))`: what the AVX-512
/// loop does with one register a candidate and the AVX2 loop with two, so all
/// three pick the same scale.
pub(super) fn block_scale(xs: &[f32]) -> f32 {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    // The other steps are above 1: their scales are 0 only when the first is.
    let d = SCALE_STEPS.map(|s| amax / 127.0 * s);
    if d[0] == 0.0 {
        return 0.0;
    }
    let id = d.map(|d| 1.0 / d);
    // One pass: every candidate's error sums side by side.
    let mut l = [[0f32; 16]; 4];
    for (i, &v) in xs.iter().enumerate() {
        for j in 0..4 {
            let e = (-d[j]).mul_add((v * id[j]).round_ties_even(), v);
            l[j][i % 16] = e.mul_add(e, l[j][i % 16]);
        }
    }
    let mut best = (f32::INFINITY, 0f32);
    for (j, l) in l.iter().enumerate() {
        let h: [f32; 8] = std::array::from_fn(|k| l[k] + l[k + 8]);
        let err = ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
        if j == 0 || err < best.0 {
            best = (err, d[j]);
        }
    }
    best.1
}

/// One block of 32 activations to int8 codes at scale `d` (from [`block_scale`]):
/// codes `round(x / d)`, to nearest, ties to even, as the SIMD conversion does;
/// returns the codes' sums over each half.
pub(super) fn quantize_block(xb: &[f32], q: &mut [i8], d: f32) -> [i32; 2] {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut s = [0i32; 2];
    for (j, (q, &v)) in q.iter_mut().zip(xb).enumerate() {
        *q = (v * id).round_ties_even() as i8;
        s[j / GROUP] += *q as i32;
    }
    s
}
