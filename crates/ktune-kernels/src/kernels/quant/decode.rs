//! How each block format's bytes become values: [`unpack`] turns one block (in
//! the split layout: quant bytes and 16-bit header fields) into small integers
//! with one scale and one offset per 16 elements, `x = scale * v + offset`; every
//! format fits that shape (a 32-element block is two groups with the same scale).
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

/// The integer values of one block ([`Unpacked::vals`]).
pub fn unpack_vals(format: QFormat, q: &[u8], v: &mut [i8; QK_K]) {
    match format {
        QFormat::Q8_0 => {
            for (o, &b) in v[..32].iter_mut().zip(q) {
                *o = b as i8;
            }
        }
        QFormat::Q4_0 | QFormat::Q4_1 | QFormat::IQ4_NL => {
            for j in 0..16 {
                let (lo, hi) = (q[j] & 0x0f, q[j] >> 4);
                (v[j], v[j + 16]) = match format {
                    QFormat::Q4_0 => (lo as i8 - 8, hi as i8 - 8),
                    QFormat::Q4_1 => (lo as i8, hi as i8),
                    _ => (IQ4_LEVELS[lo as usize], IQ4_LEVELS[hi as usize]),
                };
            }
        }
        QFormat::Q5_0 | QFormat::Q5_1 => {
            let qh = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
            let qs = &q[4..20];
            let bias = if format == QFormat::Q5_0 { 16 } else { 0 };
            for j in 0..16 {
                let h0 = (((qh >> j) & 1) << 4) as u8;
                let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                v[j] = ((qs[j] & 0x0f) | h0) as i8 - bias;
                v[j + 16] = ((qs[j] >> 4) | h1) as i8 - bias;
            }
        }
        QFormat::Q2_K | QFormat::Q3_K => {
            let (hmask, qs) = if format == QFormat::Q3_K { (&q[..32], &q[32..96]) } else { (&q[..0], &q[16..80]) };
            for h in 0..2 {
                for sh in 0..4 {
                    let bit = 4 * h + sh;
                    for l in 0..32 {
                        let low = ((qs[32 * h + l] >> (2 * sh)) & 3) as i8;
                        // Q3_K: the offset is 4 unless the high bit is set.
                        let high = if hmask.is_empty() || (hmask[l] >> bit) & 1 == 1 { 0 } else { 4 };
                        v[128 * h + 32 * sh + l] = low - high;
                    }
                }
            }
        }
        QFormat::Q4_K | QFormat::Q5_K => {
            let (qh, qs) = if format == QFormat::Q5_K { (&q[12..44], &q[44..172]) } else { (&q[..0], &q[12..140]) };
            for g in 0..8 {
                let (j, t) = (g / 2, g % 2);
                for l in 0..32 {
                    let high = if qh.is_empty() { 0 } else { ((qh[l] >> g) & 1) << 4 };
                    v[32 * g + l] = (((qs[32 * j + l] >> (4 * t)) & 0x0f) | high) as i8;
                }
            }
        }
        QFormat::Q6_K => {
            let (ql, qh) = (&q[..128], &q[128..192]);
            for h in 0..2 {
                for sh in 0..4 {
                    let (c, t) = (sh % 2, sh / 2);
                    for l in 0..32 {
                        let lo = (ql[64 * h + 32 * c + l] >> (4 * t)) & 0x0f;
                        let hi = (qh[32 * h + l] >> (2 * sh)) & 3;
                        v[128 * h + 32 * sh + l] = (lo | (hi << 4)) as i8 - 32;
                    }
                }
            }
        }
        QFormat::IQ4_XS => {
            let qs = &q[4..132];
            for ib in 0..8 {
                for j in 0..16 {
                    let b = qs[16 * ib + j];
                    v[32 * ib + j] = IQ4_LEVELS[(b & 0x0f) as usize];
                    v[32 * ib + 16 + j] = IQ4_LEVELS[(b >> 4) as usize];
                }
            }
        }
    }
}

/// The per-16-element scales and offsets of one block ([`Unpacked::scale`], [`Unpacked::off`]).
pub fn unpack_scales(format: QFormat, q: &[u8], s: &[f16], sc: &mut [f32; QK_K / GROUP], off: &mut [f32; QK_K / GROUP]) {
    let d = s[0].to_f32();
    match format {
        // The 32-element formats: one scale (and offset) for both groups.
        QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q5_1 | QFormat::IQ4_NL => {
            sc[..2].fill(d);
            off[..2].fill(if format.has_offset() { s[1].to_f32() } else { 0.0 });
        }
        QFormat::Q2_K => {
            let dmin = s[1].to_f32();
            for (g, &b) in q[..16].iter().enumerate() {
                sc[g] = d * (b & 0x0f) as f32;
                off[g] = -(dmin * (b >> 4) as f32);
            }
        }
        QFormat::Q3_K => {
            for (g, &k) in scales_q3k(&q[96..108]).iter().enumerate() {
                sc[g] = d * k as f32;
            }
        }
        QFormat::Q4_K | QFormat::Q5_K => {
            let dmin = s[1].to_f32();
            for g in 0..8 {
                let (k, m) = scale_min_k4(g, &q[..12]);
                let (dl, ml) = (d * k as f32, dmin * m as f32);
                sc[2 * g..2 * g + 2].fill(dl);
                off[2 * g..2 * g + 2].fill(-ml);
            }
        }
        QFormat::Q6_K => {
            for (g, &b) in q[192..208].iter().enumerate() {
                sc[g] = d * b as i8 as f32;
            }
        }
        QFormat::IQ4_XS => {
            let scales_h = s[1].to_bits();
            for ib in 0..8 {
                let dl = d * (scale_iq4xs(ib, &q[..4], scales_h) - 32) as f32;
                sc[2 * ib..2 * ib + 2].fill(dl);
            }
        }
    }
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
