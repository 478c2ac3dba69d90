//! How a block format's bytes become values, the shape every format's type
//! ([`super::block`]) fills: [`unpack`] turns one block (in the split layout:
//! quant bytes and 16-bit header fields) into small integers with one scale and
//! one offset per 16 elements, `x = scale * v + offset` (a 32-element block is
//! two groups with the same scale); the scale unpackers the K-quants and IQ4
//! share.
//! [`dequantize_block`] is the reference built on it, bit-identical to ggml's
//! `dequantize_row_*` and the `gguf` package's `gguf.quants.dequantize` (the same
//! f32 products, in the same order, no fused multiply-add). The CPU dot products
//! of the formats without a dedicated SIMD path read the [`Unpacked`] form too.

use half::f16;

use super::{QFormat, QK_K};

/// IQ4_NL / IQ4_XS: the 16 non-linear levels a nibble indexes.
pub const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Elements sharing one scale and offset in [`Unpacked`].
pub const GROUP: usize = 16;

/// One block as small integers: element `i` is `scale[i / 16] * vals[i] + off[i / 16]`
/// (the offset term only for formats with [`QFormat::has_offset`]).
#[derive(Clone, Debug)]
pub struct Unpacked {
    pub vals: [i8; QK_K],
    pub scale: [f32; QK_K / GROUP],
    pub off: [f32; QK_K / GROUP],
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked { vals: [0; QK_K], scale: [0.0; QK_K / GROUP], off: [0.0; QK_K / GROUP] }
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K block's 12
/// packed scale bytes (ggml's `get_scale_min_k4`).
#[inline]
pub fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 { (s[j] & 63, s[j + 4] & 63) } else { ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)) }
}

/// All eight sub-blocks' [`scale_min_k4`] at once: the 6-bit scales in bytes
/// 0..8, the minima in 8..16 (ggml's `utmp` unpacking, four 32-bit words).
#[inline]
pub fn scales_mins_k4(s: &[u8]) -> [u8; 16] {
    const K1: u32 = 0x3f3f3f3f;
    const K2: u32 = 0x0f0f0f0f;
    const K3: u32 = 0x03030303;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let words = [u0 & K1, (u2 & K2) | (((u0 >> 6) & K3) << 4), u1 & K1, ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4)];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The 16 signed 6-bit scales of a Q3_K block's 12 packed scale bytes.
#[inline]
pub fn scales_q3k(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// The 6-bit scale (0..64, to be offset by -32) of sub-block `ib` of an IQ4_XS block.
#[inline]
pub fn scale_iq4xs(ib: usize, scales_l: &[u8], scales_h: u16) -> i32 {
    (((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | ((((scales_h >> (2 * ib)) & 3) as u8) << 4)) as i32
}

/// Unpacks one block (`q` its quant bytes, `s` its 16-bit header fields) into `u`:
/// `format.block_elems()` values and `block_elems / 16` scales and offsets.
pub fn unpack(format: QFormat, q: &[u8], s: &[f16], u: &mut Unpacked) {
    unpack_vals(format, q, &mut u.vals);
    unpack_scales(format, q, s, &mut u.scale, &mut u.off);
}

/// The integer values of one block ([`Unpacked::vals`]): the format's
/// [`BlockFormat::unpack_vals`](super::block::BlockFormat::unpack_vals).
#[inline]
pub fn unpack_vals(format: QFormat, q: &[u8], v: &mut [i8; QK_K]) {
    (format.ops().unpack_vals)(q, v)
}

/// The per-16-element scales and offsets of one block ([`Unpacked::scale`],
/// [`Unpacked::off`]): the format's
/// [`BlockFormat::unpack_scales`](super::block::BlockFormat::unpack_scales).
#[inline]
pub fn unpack_scales(format: QFormat, q: &[u8], s: &[f16], sc: &mut [f32; QK_K / GROUP], off: &mut [f32; QK_K / GROUP]) {
    (format.ops().unpack_scales)(q, s, sc, off)
}

/// Dequantizes one block (`q` its quant bytes, `s` its 16-bit header fields) into
/// `out` (`format.block_elems()` values), bit-identical to ggml.
pub fn dequantize_block(format: QFormat, q: &[u8], s: &[f16], out: &mut [f32]) {
    let mut u = Unpacked::default();
    unpack(format, q, s, &mut u);
    let offset = format.has_offset();
    for (g, (o, v)) in out[..format.block_elems()].chunks_exact_mut(GROUP).zip(u.vals.chunks_exact(GROUP)).enumerate() {
        let (sc, off) = (u.scale[g], u.off[g]);
        for (o, &v) in o.iter_mut().zip(v) {
            // Without an offset, `+ 0.0` would turn a -0.0 into +0.0.
            *o = if offset { sc * v as f32 + off } else { sc * v as f32 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{scale_min_k4, scales_mins_k4};

    #[test]
    fn all_k4_scales_at_once_equal_them_one_by_one() {
        let mut seed = 7u32;
        for _ in 0..200 {
            let s: [u8; 12] = std::array::from_fn(|_| {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                (seed >> 24) as u8
            });
            let all = scales_mins_k4(&s);
            for j in 0..8 {
                assert_eq!((all[j], all[8 + j]), scale_min_k4(j, &s), "sub-block {j} of {s:?}");
            }
        }
    }
}
