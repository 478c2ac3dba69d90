//! Whole-tensor element conversions a model load runs over every weight: little-
//! endian f32 / f16 / bf16 file bytes, or f32 values, into the f32 or f16 buffers
//! the runtime reads ([`Elem`]), and the synthetic weights' deterministic fill
//! ([`Elem::uniform`]). Each method is compiled here, for both element types, so
//! the per-element loops are optimized wherever the caller is built (the root
//! crate's tests build it at opt-level 0). The callers split large tensors into
//! parallel chunks; these loops are one chunk's.

use half::{bf16, f16};

/// An element type weights are read as: f32, or f16 (F32 and BF16 sources rounded
/// to nearest, F16 copied).
pub trait Elem: Copy + Send + Sync + 'static {
    fn from_f32(v: f32) -> Self;
    /// `out` itself when `Self` is f32 (lets f32 reads skip a staging copy).
    fn as_f32(out: &mut [Self]) -> Option<&mut [f32]>;
    /// `out[i] = src[i]`, converted.
    fn from_f32_slice(src: &[f32], out: &mut [Self]);
    /// `out[i]` from the little-endian f32 at `src[4i..]`.
    fn from_le_f32(src: &[u8], out: &mut [Self]);
    /// `out[i]` from the little-endian f16 at `src[2i..]`.
    fn from_le_f16(src: &[u8], out: &mut [Self]);
    /// `out[i]` from the little-endian bf16 at `src[2i..]`.
    fn from_le_bf16(src: &[u8], out: &mut [Self]);
    /// `out[j] = center + half · unit(key, start + j)`: elements `start..` of the
    /// synthetic stream `key`, uniform on `[center - half, center + half)`.
    fn uniform(key: u64, start: u64, center: f32, half: f32, out: &mut [Self]);
}

macro_rules! elem {
    ($t:ty, $from_f32:expr, |$o:ident| $as_f32:expr, |$src:ident, $out:ident| $from_f32_slice:expr) => {
        impl Elem for $t {
            #[inline]
            fn from_f32(v: f32) -> $t {
                $from_f32(v)
            }
            #[inline]
            fn as_f32($o: &mut [$t]) -> Option<&mut [f32]> {
                $as_f32
            }
            fn from_f32_slice(src: &[f32], out: &mut [$t]) {
                let n = src.len().min(out.len());
                let ($src, $out) = (&src[..n], &mut out[..n]);
                $from_f32_slice
            }
            fn from_le_f32(src: &[u8], out: &mut [$t]) {
                staged(out, |i, o| {
                    o.iter_mut()
                        .zip(src.get(4 * i..).unwrap_or(&[]).chunks_exact(4))
                        .for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                });
            }
            fn from_le_f16(src: &[u8], out: &mut [$t]) {
                let one = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]);
                out.iter_mut().zip(src.chunks_exact(2)).for_each(|(o, b)| *o = <$t as FromF16>::from_f16(one(b)));
            }
            fn from_le_bf16(src: &[u8], out: &mut [$t]) {
                staged(out, |i, o| {
                    o.iter_mut()
                        .zip(src.get(2 * i..).unwrap_or(&[]).chunks_exact(2))
                        .for_each(|(o, b)| *o = bf16::from_le_bytes([b[0], b[1]]).to_f32())
                });
            }
            fn uniform(key: u64, start: u64, center: f32, half: f32, out: &mut [$t]) {
                staged(out, |i, o| o.iter_mut().enumerate().for_each(|(j, v)| *v = center + half * unit(key, start + (i + j) as u64)));
            }
        }
    };
}

/// Fills `out` through f32 values: `fill(i, chunk)` writes those of elements
/// `i..i + chunk.len()`, in place for an f32 `out`, else into a staging buffer
/// of 256 that [`Elem::from_f32_slice`] converts (for f16 with the CPU's vector
/// conversion: one `f16::from_f32` an element was a tenth of a synthetic model's
/// CPU-and-GPU comparison).
#[inline]
fn staged<T: Elem>(out: &mut [T], mut fill: impl FnMut(usize, &mut [f32])) {
    if let Some(o) = T::as_f32(out) {
        fill(0, o);
        return;
    }
    let mut buf = [0f32; 256];
    for (c, o) in out.chunks_mut(buf.len()).enumerate() {
        let b = &mut buf[..o.len()];
        fill(c * 256, b);
        T::from_f32_slice(b, o);
    }
}

/// An f16 as `Self`: widened for f32, copied for f16 (no round trip through f32).
trait FromF16 {
    fn from_f16(v: f16) -> Self;
}

impl FromF16 for f32 {
    #[inline]
    fn from_f16(v: f16) -> f32 {
        v.to_f32()
    }
}

impl FromF16 for f16 {
    #[inline]
    fn from_f16(v: f16) -> f16 {
        v
    }
}

elem!(f32, |v: f32| v, |out| Some(out), |src, out| out.copy_from_slice(src));
elem!(f16, f16::from_f32, |_out| None, |src, out| half::slice::HalfFloatSliceExt::convert_from_f32_slice(out, src));

/// SplitMix64's finalizer: a strong 64-bit mix.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1) for element `i` of the stream `key`.
#[inline]
fn unit(key: u64, i: u64) -> f32 {
    let z = splitmix(key ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03));
    ((z >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each source decodes to its value in both element types; the synthetic
    /// stream is a function of (key, index) only, within its range, the same in
    /// f32 and (rounded) f16.
    #[test]
    fn conversions_and_the_synthetic_stream() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let le32: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let le16: Vec<u8> = vals.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let le_b16: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
        let mut out = [0f32; 4];
        for (decode, src) in [(f32::from_le_f32 as fn(&[u8], &mut [f32]), &le32), (f32::from_le_f16, &le16)] {
            decode(src, &mut out);
            assert_eq!(out, vals);
        }
        f32::from_le_bf16(&le_b16, &mut out);
        assert_eq!(out, vals.map(|v| bf16::from_f32(v).to_f32()));
        let mut h = [f16::ZERO; 4];
        f16::from_le_f32(&le32, &mut h);
        assert_eq!(h, vals.map(f16::from_f32));
        f16::from_f32_slice(&vals, &mut h);
        assert_eq!(h, vals.map(f16::from_f32));

        let (mut a, mut b, mut c) = ([0f32; 64], [0f32; 16], [f16::ZERO; 64]);
        f32::uniform(7, 0, 1.0, 0.05, &mut a);
        f32::uniform(7, 48, 1.0, 0.05, &mut b);
        f16::uniform(7, 0, 1.0, 0.05, &mut c);
        assert_eq!(&a[48..], &b[..]);
        assert!(a.iter().all(|v| (0.95..1.05).contains(v)), "{a:?}");
        assert_eq!(c, a.map(f16::from_f32));
        assert!(a.windows(2).any(|w| w[0] != w[1]));
        f32::uniform(8, 0, 1.0, 0.05, &mut b);
        assert_ne!(&a[..16], &b[..]);
    }
}
