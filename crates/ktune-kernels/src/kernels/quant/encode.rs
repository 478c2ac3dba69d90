//! How floats become blocks ([`quantize_block`]). Q8_0, Q4_0, Q4_1, Q5_0 and
//! Q5_1 round exactly as ggml's reference quantizers (`quantize_row_*_ref`; a
//! test compares the bytes with the `gguf` package's). The super-block formats and
//! IQ4 get a plain round-to-nearest quantizer (range per group, 6/4-bit scales
//! relative to the block's largest): valid blocks that decode as ggml's do, used
//! for test data and for `--weight-dtype` on float models; ggml's own quantizers
//! search scales (`make_qkx2_quants`) and are slightly more accurate. Published
//! files keep their blocks as stored.

use half::f16;

use super::QFormat;
use super::decode::{GROUP, IQ4_LEVELS};

/// Quantizes one block of `format.block_elems()` values into its quant bytes `q`
/// and 16-bit header fields `s`.
pub fn quantize_block(format: QFormat, x: &[f32], q: &mut [u8], s: &mut [f16]) {
    debug_assert_eq!(x.len(), format.block_elems());
    match format {
        QFormat::Q8_0 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            s[0] = f16::from_f32(d);
            for (qj, &v) in q.iter_mut().zip(x) {
                // roundf: half away from zero.
                *qj = (v * id).round() as i8 as u8;
            }
        }
        QFormat::Q4_0 | QFormat::Q5_0 => {
            let max = signed_max(x);
            let levels = if format == QFormat::Q4_0 { 8.0 } else { 16.0 };
            let d = max / -levels;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            s[0] = f16::from_f32(d);
            let top = 2 * levels as i32 - 1;
            let v: Vec<u8> = x.iter().map(|&e| ((e * id + levels + 0.5) as i32).min(top) as u8).collect();
            pack_32(format, &v, q);
        }
        QFormat::Q4_1 | QFormat::Q5_1 => {
            let (min, max) = x.iter().fold((f32::MAX, -f32::MAX), |(a, b), &v| (a.min(v), b.max(v)));
            let top = if format == QFormat::Q4_1 { 15 } else { 31 };
            let d = (max - min) / top as f32;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            s[0] = f16::from_f32(d);
            s[1] = f16::from_f32(min);
            let v: Vec<u8> = x.iter().map(|&e| (((e - min) * id + 0.5) as i32).min(top) as u8).collect();
            pack_32(format, &v, q);
        }
        QFormat::IQ4_NL => {
            let d = signed_max(x) / IQ4_LEVELS[0] as f32;
            s[0] = f16::from_f32(d);
            let d = s[0].to_f32();
            let v: Vec<u8> = x.iter().map(|&e| nearest_level(e, d)).collect();
            pack_32(format, &v, q);
        }
        QFormat::Q4_K | QFormat::Q5_K => quantize_q45k(format, x, q, s),
        QFormat::Q2_K => quantize_q2k(x, q, s),
        QFormat::Q3_K => quantize_q3k(x, q, s),
        QFormat::Q6_K => quantize_q6k(x, q, s),
        QFormat::IQ4_XS => quantize_iq4xs(x, q, s),
    }
}

/// The value of largest magnitude, with its sign (the first of equal magnitudes).
fn signed_max(x: &[f32]) -> f32 {
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
fn nearest_level(x: f32, d: f32) -> u8 {
    if d == 0.0 {
        return 8;
    }
    let t = x / d;
    (0..16).min_by(|&a, &b| (IQ4_LEVELS[a] as f32 - t).abs().total_cmp(&(IQ4_LEVELS[b] as f32 - t).abs())).unwrap_or(0) as u8
}

/// Packs 32 element codes of a 32-element format: nibbles (element j low,
/// j + 16 high), and for Q5 the fifth bits into `qh` first.
fn pack_32(format: QFormat, v: &[u8], q: &mut [u8]) {
    let five = matches!(format, QFormat::Q5_0 | QFormat::Q5_1);
    let qs = if five {
        let qh = v.iter().enumerate().fold(0u32, |h, (j, &c)| h | (((c as u32 >> 4) & 1) << j));
        q[..4].copy_from_slice(&qh.to_le_bytes());
        &mut q[4..20]
    } else {
        &mut q[..16]
    };
    for j in 0..16 {
        qs[j] = (v[j] & 0x0f) | ((v[j + 16] & 0x0f) << 4);
    }
}

/// `round(v / step)` clamped to `0..=top` (0 when the step is 0).
fn code(v: f32, step: f32, lo: i32, top: i32) -> i32 {
    if step == 0.0 { 0.max(lo) } else { ((v / step).round() as i32).clamp(lo, top) }
}

/// Q4_K / Q5_K: per 32-element sub-block `x = d*sc*q - dmin*m`, q in 0..=15 (31).
fn quantize_q45k(format: QFormat, x: &[f32], q: &mut [u8], s: &mut [f16]) {
    let top = if format == QFormat::Q4_K { 15 } else { 31 };
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
    let (qh, qs) = if format == QFormat::Q5_K { q[12..172].split_at_mut(32) } else { q[12..140].split_at_mut(0) };
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

/// Groups with a minimum (Q2_K, Q4_K, Q5_K: `x = d*sc*q - dmin*m`): per group of
/// `x.len() / G` values, the step for `levels` steps from its minimum (at most 0)
/// to its maximum, and that minimum negated; the super-block scales `d` and
/// `dmin` (stored in `s[0]`, `s[1]`, returned as stored) for codes of up to
/// `code_max`; and each group's scale and minimum codes.
fn range_scales<const G: usize>(x: &[f32], levels: i32, code_max: i32, s: &mut [f16]) -> (f32, f32, [u8; G], [u8; G]) {
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
fn signed_scales<const G: usize>(x: &[f32], top: f32, lo: i32, hi: i32, s: &mut [f16]) -> (f32, [i32; G]) {
    let n = x.len() / G;
    let scale: [f32; G] = std::array::from_fn(|g| signed_max(&x[n * g..n * (g + 1)]) / -top);
    let amax = scale.iter().fold(0f32, |m, &v| m.max(v.abs()));
    s[0] = f16::from_f32(amax / hi as f32);
    let d = s[0].to_f32();
    (d, std::array::from_fn(|g| code(scale[g], d, lo, hi)))
}

/// Q2_K: per 16 elements `x = d*(sc&15)*q - dmin*(sc>>4)`, q in 0..=3.
fn quantize_q2k(x: &[f32], q: &mut [u8], s: &mut [f16]) {
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

/// Q3_K: per 16 elements `x = d*(sc-32)*q`, q in -4..=3, signed 6-bit scales.
fn quantize_q3k(x: &[f32], q: &mut [u8], s: &mut [f16]) {
    let (d, sc) = signed_scales::<16>(x, 4.0, -32, 31, s);
    let (hmask, rest) = q.split_at_mut(32);
    let (qs, scales) = rest.split_at_mut(64);
    hmask.fill(0);
    qs.fill(0);
    scales[..12].fill(0);
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

/// Q6_K: per 16 elements `x = d*sc*q`, q in -32..=31, int8 scales.
fn quantize_q6k(x: &[f32], q: &mut [u8], s: &mut [f16]) {
    let (d, sc) = signed_scales::<16>(x, 32.0, -128, 127, s);
    let (ql, rest) = q.split_at_mut(128);
    let (qh, scales) = rest.split_at_mut(64);
    ql.fill(0);
    qh.fill(0);
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

/// IQ4_XS: per 32 elements `x = d*(ls-32)*level[q]`, 6-bit scales.
fn quantize_iq4xs(x: &[f32], q: &mut [u8], s: &mut [f16]) {
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
