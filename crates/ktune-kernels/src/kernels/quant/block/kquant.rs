//! The K-quant super-block formats, each one type: Q2_K, Q3_K, Q4_K, Q5_K and
//! Q6_K (256 elements, sub-block scales under one or two f16 super-block
//! scales). Their quantizer is a plain round-to-nearest one (range per group,
//! 6/4-bit scales relative to the block's largest): valid blocks that decode as
//! ggml's do; ggml's own quantizers search scales (`make_qkx2_quants`).

use half::f16;

use super::super::decode::scales_q3k;
use super::super::encode::{code, range_scales, signed_scales};
use super::super::{GROUP, QFormat, QK_K, scale_min_k4, scales_mins_k4};
use super::{BlockFormat, CpuKernels, F32Dot, Groups, I8Dot, Layout, Panel, Stage, X8};

/// The kernels of the K-quants without a loop of their own.
const UNPACKED: CpuKernels = CpuKernels {
    f32_dot: F32Dot::Unpacked,
    i8_dot: I8Dot::Unpacked,
    x8: None,
    panel: Panel { direct: None, direct_x8: false, stage: Stage::Unpacked },
};

/// Q2_K / Q3_K values: 2-bit codes four to a byte; Q3_K's (`hmask` first) less 4
/// unless their high bit is set.
fn unpack_q23k(q: &[u8], v: &mut [i8; QK_K], q3: bool) {
    let (hmask, qs) = if q3 { (&q[..32], &q[32..96]) } else { (&q[..0], &q[16..80]) };
    for h in 0..2 {
        for sh in 0..4 {
            let bit = 4 * h + sh;
            for l in 0..32 {
                let low = ((qs[32 * h + l] >> (2 * sh)) & 3) as i8;
                let high = if hmask.is_empty() || (hmask[l] >> bit) & 1 == 1 { 0 } else { 4 };
                v[128 * h + 32 * sh + l] = low - high;
            }
        }
    }
}

/// ggml Q2_K: scales[16], qs[64], `d`, `dmin`; per 16 elements
/// `x = d*(sc&15)*q - dmin*(sc>>4)`, q in 0..=3.
pub struct BlockQ2K;
impl BlockFormat for BlockQ2K {
    const LAYOUT: Layout = Layout { ggml: 10, elems: 256, bytes: 84, header: &[80, 82], offset: true, scale_group: GROUP };
    const ROW_FALLBACK: Option<QFormat> = Some(QFormat::IQ4_NL);
    const CPU: CpuKernels = UNPACKED;
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        unpack_q23k(q, v, false);
    }
    fn unpack_scales(q: &[u8], s: &[f16], sc: &mut Groups, off: &mut Groups) {
        let (d, dmin) = (s[0].to_f32(), s[1].to_f32());
        for (g, &b) in q[..16].iter().enumerate() {
            sc[g] = d * (b & 0x0f) as f32;
            off[g] = -(dmin * (b >> 4) as f32);
        }
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let (d, dmin, sc, mn) = range_scales::<16>(x, 3, 15, s);
        for g in 0..16 {
            q[g] = sc[g] | (mn[g] << 4);
        }
        let qs = &mut q[16..80];
        qs.fill(0);
        for (i, &e) in x.iter().enumerate() {
            let g = i / GROUP;
            let c = code(e + dmin * mn[g] as f32, d * sc[g] as f32, 0, 3) as u8;
            let (h, sh, l) = (i / 128, (i % 128) / 32, i % 32);
            qs[32 * h + l] |= c << (2 * sh);
        }
    }
}

/// ggml Q3_K: hmask[32], qs[64], scales[12], `d`; per 16 elements
/// `x = d*(sc-32)*q`, q in -4..=3, signed 6-bit scales.
pub struct BlockQ3K;
impl BlockFormat for BlockQ3K {
    const LAYOUT: Layout = Layout { ggml: 11, elems: 256, bytes: 110, header: &[108], offset: false, scale_group: GROUP };
    const ROW_FALLBACK: Option<QFormat> = Some(QFormat::IQ4_NL);
    const CPU: CpuKernels = UNPACKED;
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        unpack_q23k(q, v, true);
    }
    fn unpack_scales(q: &[u8], s: &[f16], sc: &mut Groups, _: &mut Groups) {
        let d = s[0].to_f32();
        for (g, &k) in scales_q3k(&q[96..108]).iter().enumerate() {
            sc[g] = d * k as f32;
        }
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let (d, sc) = signed_scales::<16>(x, 4.0, -32, 31, s);
        q.fill(0);
        let (hmask, rest) = q.split_at_mut(32);
        let (qs, scales) = rest.split_at_mut(64);
        for (i, &k) in sc.iter().enumerate() {
            let u = (k + 32) as u8;
            if i < 8 {
                scales[i] |= u & 0x0f;
            } else {
                scales[i - 8] |= (u & 0x0f) << 4;
            }
            scales[8 + i % 4] |= ((u >> 4) & 3) << (2 * (i / 4));
        }
        for i in 0..256 {
            let c = (code(x[i], d * sc[i / GROUP] as f32, -4, 3) + 4) as u8;
            let (h, sh, l) = (i / 128, (i % 128) / 32, i % 32);
            qs[32 * h + l] |= (c & 3) << (2 * sh);
            hmask[l] |= (c >> 2) << (4 * h + sh);
        }
    }
}

/// ggml Q4_K: `d`, `dmin`, scales[12], qs[128]; per 32 elements
/// `x = d*sc*q - dmin*m`, q in 0..=15.
pub type BlockQ4K = BlockQ45K<false>;

/// ggml Q5_K: `d`, `dmin`, scales[12], qh[32], qs[128]; as Q4_K with a fifth bit,
/// q in 0..=31.
pub type BlockQ5K = BlockQ45K<true>;

/// Q4_K and Q5_K (`Q5`), one layout but for Q5_K's `qh`: per 32-element sub-block
/// a 6-bit scale and minimum packed in 12 bytes, the nibbles two sub-blocks per 32
/// bytes (and with `qh` each element's fifth bit).
pub struct BlockQ45K<const Q5: bool>;

impl<const Q5: bool> BlockFormat for BlockQ45K<Q5> {
    const LAYOUT: Layout = Layout {
        ggml: if Q5 { 13 } else { 12 },
        elems: 256,
        bytes: if Q5 { 176 } else { 144 },
        header: &[0, 2],
        offset: true,
        scale_group: 32,
    };
    const ROW_FALLBACK: Option<QFormat> = Some(if Q5 { QFormat::Q5_1 } else { QFormat::Q5_0 });
    const CPU: CpuKernels = if Q5 {
        UNPACKED
    } else {
        CpuKernels {
            f32_dot: F32Dot::Unpacked,
            i8_dot: I8Dot::SuperQ4K,
            x8: Some(X8::K4),
            panel: Panel { direct: None, direct_x8: false, stage: Stage::K4Nibbles },
        }
    };
    /// Nibbles (and with `qh` a fifth bit), two sub-blocks per 32 bytes.
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        let (qh, qs) = if Q5 { (&q[12..44], &q[44..172]) } else { (&q[..0], &q[12..140]) };
        for g in 0..8 {
            let (j, t) = (g / 2, g % 2);
            for l in 0..32 {
                let high = if qh.is_empty() { 0 } else { ((qh[l] >> g) & 1) << 4 };
                v[32 * g + l] = (((qs[32 * j + l] >> (4 * t)) & 0x0f) | high) as i8;
            }
        }
    }
    /// `d` times each sub-block's 6-bit scale, `-dmin` times its minimum.
    fn unpack_scales(q: &[u8], s: &[f16], sc: &mut Groups, off: &mut Groups) {
        let (d, dmin) = (s[0].to_f32(), s[1].to_f32());
        for g in 0..8 {
            let (k, m) = scale_min_k4(g, &q[..12]);
            let (dl, ml) = (d * k as f32, dmin * m as f32);
            sc[2 * g..2 * g + 2].fill(dl);
            off[2 * g..2 * g + 2].fill(-ml);
        }
    }
    /// Per 32-element sub-block `x = d*sc*q - dmin*m`, q in 0..=15 (31).
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let top = if Q5 { 31 } else { 15 };
        let (d, dmin, sc, mn) = range_scales::<8>(x, top, 63, s);
        let packed = &mut q[..12];
        for j in 0..4 {
            packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            packed[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
        }
        let codes: Vec<u8> = (0..256)
            .map(|i| {
                let g = i / 32;
                code(x[i] + dmin * mn[g] as f32, d * sc[g] as f32, 0, top) as u8
            })
            .collect();
        let (qh, qs) = if Q5 { q[12..172].split_at_mut(32) } else { q[12..140].split_at_mut(0) };
        qh.fill(0);
        for g in 0..8 {
            let (j, t) = (g / 2, g % 2);
            for l in 0..32 {
                let c = codes[32 * g + l];
                if t == 0 {
                    qs[32 * j + l] = c & 0x0f;
                } else {
                    qs[32 * j + l] |= (c & 0x0f) << 4;
                }
                if !qh.is_empty() {
                    qh[l] |= ((c >> 4) & 1) << g;
                }
            }
        }
    }
    /// The 12 packed 6-bit scale bytes become 16, the 8 sub-block scales then the
    /// 8 minima a byte each ([`scales_mins_k4`], unpacked once here instead of per
    /// dot in every shader), so `qh` / `qs` start at byte 16.
    fn gpu_block(src: &[u8], dst: &mut [u8]) {
        dst[..16].copy_from_slice(&scales_mins_k4(&src[..12]));
        dst[16..].copy_from_slice(&src[12..]);
    }
}

/// ggml Q6_K: ql[128], qh[64], scales[16], `d`; per 16 elements `x = d*sc*q`, q in
/// -32..=31, int8 scales.
pub struct BlockQ6K;
impl BlockFormat for BlockQ6K {
    const LAYOUT: Layout = Layout { ggml: 14, elems: 256, bytes: 210, header: &[208], offset: false, scale_group: GROUP };
    const ROW_FALLBACK: Option<QFormat> = Some(QFormat::Q8_0);
    const CPU: CpuKernels = CpuKernels { i8_dot: I8Dot::SuperQ6K, x8: Some(X8::K6), ..UNPACKED };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
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
    fn unpack_scales(q: &[u8], s: &[f16], sc: &mut Groups, _: &mut Groups) {
        let d = s[0].to_f32();
        for (g, &b) in q[192..208].iter().enumerate() {
            sc[g] = d * b as i8 as f32;
        }
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let (d, sc) = signed_scales::<16>(x, 32.0, -128, 127, s);
        q.fill(0);
        let (ql, rest) = q.split_at_mut(128);
        let (qh, scales) = rest.split_at_mut(64);
        for g in 0..16 {
            scales[g] = sc[g] as i8 as u8;
        }
        for i in 0..256 {
            let c = (code(x[i], d * sc[i / GROUP] as f32, -32, 31) + 32) as u8;
            let (h, sh, l) = (i / 128, (i % 128) / 32, i % 32);
            let (cc, t) = (sh % 2, sh / 2);
            ql[64 * h + 32 * cc + l] |= (c & 0x0f) << (4 * t);
            qh[32 * h + l] |= (c >> 4) << (2 * sh);
        }
    }
}
