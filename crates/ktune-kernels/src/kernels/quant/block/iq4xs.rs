//! IQ4_XS as one type: 256-element super-blocks of [`IQ4_LEVELS`] nibbles with
//! a 6-bit scale per 32 (low 4 bits in `scales_l`, high 2 in the u16 `scales_h`
//! that sits in the header beside `d`); a round-to-nearest quantizer.

use half::f16;

use super::super::decode::scale_iq4xs;
use super::super::encode::{nearest_level, signed_scales};
use super::super::{IQ4_LEVELS, QFormat, QK_K};
use super::{BlockFormat, CpuKernels, F32Dot, Groups, I8Dot, Layout, Panel, Stage};

/// ggml IQ4_XS: `d`, `scales_h` (u16), scales_l[4], qs[128]; per 32 elements
/// `x = d*(ls-32)*level[q]`.
pub struct BlockIQ4XS;
impl BlockFormat for BlockIQ4XS {
    const LAYOUT: Layout = Layout { ggml: 23, elems: 256, bytes: 136, header: &[0, 2], offset: false, scale_group: 32 };
    const ROW_FALLBACK: Option<QFormat> = Some(QFormat::IQ4_NL);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::Unpacked,
        i8_dot: I8Dot::Unpacked,
        x8: None,
        panel: Panel { direct: None, direct_x8: false, stage: Stage::Unpacked },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        let qs = &q[4..132];
        for ib in 0..8 {
            for j in 0..16 {
                let b = qs[16 * ib + j];
                v[32 * ib + j] = IQ4_LEVELS[(b & 0x0f) as usize];
                v[32 * ib + 16 + j] = IQ4_LEVELS[(b >> 4) as usize];
            }
        }
    }
    fn unpack_scales(q: &[u8], s: &[f16], sc: &mut Groups, _: &mut Groups) {
        let (d, scales_h) = (s[0].to_f32(), s[1].to_bits());
        for ib in 0..8 {
            let dl = d * (scale_iq4xs(ib, &q[..4], scales_h) - 32) as f32;
            sc[2 * ib..2 * ib + 2].fill(dl);
        }
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let (d, sc) = signed_scales::<8>(x, -(IQ4_LEVELS[0] as f32), -32, 31, s);
        let ls = sc.map(|k| k + 32);
        let mut scales_h = 0u16;
        let (scales_l, qs) = q.split_at_mut(4);
        scales_l.fill(0);
        for (ib, &l) in ls.iter().enumerate() {
            scales_l[ib / 2] |= ((l & 0x0f) as u8) << (4 * (ib % 2));
            scales_h |= (((l >> 4) & 3) as u16) << (2 * ib);
        }
        s[1] = f16::from_bits(scales_h);
        for ib in 0..8 {
            let dl = d * (ls[ib] - 32) as f32;
            for j in 0..16 {
                let lo = nearest_level(x[32 * ib + j], dl);
                let hi = nearest_level(x[32 * ib + 16 + j], dl);
                qs[16 * ib + j] = lo | (hi << 4);
            }
        }
    }
}
