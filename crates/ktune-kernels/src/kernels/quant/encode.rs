//! How floats become blocks ([`quantize_block`], each format's quantizer in its
//! type, [`super::block`]), and the pieces those quantizers share. Q8_0, Q4_0, Q4_1, Q5_0 and
//! Q5_1 round exactly as ggml's reference quantizers (`quantize_row_*_ref`; a
//! test compares the bytes with the `gguf` package's). The super-block formats and
//! IQ4 get a plain round-to-nearest quantizer (range per group, 6/4-bit scales
//! relative to the block's largest): valid blocks that decode as ggml's do, used
//! for test data and for `--weight-dtype` on float models; ggml's own quantizers
//! search scales (`make_qkx2_quants`) and are slightly more accurate. Published
//! files keep their blocks as stored.

use half::f16;

use super::QFormat;
use super::decode::IQ4_LEVELS;

/// Quantizes one block of `format.block_elems()` values into its quant bytes `q`
/// and 16-bit header fields `s` (the format's
/// [`BlockFormat::quantize`](super::block::BlockFormat::quantize)).
pub fn quantize_block(format: QFormat, x: &[f32], q: &mut [u8], s: &mut [f16]) {
    debug_assert_eq!(x.len(), format.block_elems());
    (format.ops().quantize)(x, q, s)
}

/// The value of largest magnitude, with its sign (the first of equal magnitudes).
pub(super) fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The IQ4 level index nearest `x / d` (0 when `d` is 0).
pub(super) fn nearest_level(x: f32, d: f32) -> u8 {
    if d == 0.0 {
        return 8;
    }
    let t = x / d;
    (0..16).min_by(|&a, &b| (IQ4_LEVELS[a] as f32 - t).abs().total_cmp(&(IQ4_LEVELS[b] as f32 - t).abs())).unwrap_or(0) as u8
}

/// `round(v / step)` clamped to `0..=top` (0 when the step is 0).
pub(super) fn code(v: f32, step: f32, lo: i32, top: i32) -> i32 {
    if step == 0.0 { 0.max(lo) } else { ((v / step).round() as i32).clamp(lo, top) }
}

/// Groups with a minimum (Q2_K, Q4_K, Q5_K: `x = d*sc*q - dmin*m`): per group of
/// `x.len() / G` values, the step for `levels` steps from its minimum (at most 0)
/// to its maximum, and that minimum negated; the super-block scales `d` and
/// `dmin` (stored in `s[0]`, `s[1]`, returned as stored) for codes of up to
/// `code_max`; and each group's scale and minimum codes.
pub(super) fn range_scales<const G: usize>(x: &[f32], levels: i32, code_max: i32, s: &mut [f16]) -> (f32, f32, [u8; G], [u8; G]) {
    let n = x.len() / G;
    let mut scale = [0f32; G];
    let mut min = [0f32; G];
    for (g, b) in x.chunks_exact(n).enumerate() {
        let lo = b.iter().fold(0f32, |m, &v| m.min(v));
        let hi = b.iter().fold(lo, |m, &v| m.max(v));
        scale[g] = (hi - lo) / levels as f32;
        min[g] = -lo;
    }
    let top = |v: &[f32]| v.iter().fold(0f32, |m, &v| m.max(v));
    s[0] = f16::from_f32(top(&scale) / code_max as f32);
    s[1] = f16::from_f32(top(&min) / code_max as f32);
    let (d, dmin) = (s[0].to_f32(), s[1].to_f32());
    let sc = std::array::from_fn(|g| code(scale[g], d, 0, code_max) as u8);
    let mn = std::array::from_fn(|g| code(min[g], dmin, 0, code_max) as u8);
    (d, dmin, sc, mn)
}

/// Symmetric groups (Q3_K, Q6_K, IQ4_XS: `x = d*sc*q`): per group of `x.len() / G`
/// values the scale that maps its value of largest magnitude to `-top`; the
/// super-block scale `d` (stored in `s[0]`, returned as stored) that makes those
/// scales integers in `lo..=hi`; and the integer scales.
pub(super) fn signed_scales<const G: usize>(x: &[f32], top: f32, lo: i32, hi: i32, s: &mut [f16]) -> (f32, [i32; G]) {
    let n = x.len() / G;
    let scale: [f32; G] = std::array::from_fn(|g| signed_max(&x[n * g..n * (g + 1)]) / -top);
    let amax = scale.iter().fold(0f32, |m, &v| m.max(v.abs()));
    s[0] = f16::from_f32(amax / hi as f32);
    let d = s[0].to_f32();
    (d, std::array::from_fn(|g| code(scale[g], d, lo, hi)))
}
