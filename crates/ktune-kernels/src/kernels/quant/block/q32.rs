//! The 32-element block formats, each one type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
//! (ggml's reference quantizers, `quantize_row_*_ref`, byte for byte) and IQ4_NL
//! (a round-to-nearest quantizer onto its 16 levels). One scale (and for Q4_1 and
//! Q5_1 one minimum) per block: both 16-element groups of
//! [`Unpacked`](super::super::Unpacked) share it.

use half::f16;

use super::super::encode::{nearest_level, signed_max};
use super::super::{IQ4_LEVELS, QK_K};
use super::{BlockFormat, Codes, CpuKernels, F32Dot, I8Dot, Layout, Panel, Stage, X8};

/// The 32 values of a block of 16 nibble bytes (element j low, j + 16 high), each
/// nibble read through `val`.
fn nibbles(q: &[u8], v: &mut [i8; QK_K], val: impl Fn(u8) -> i8) {
    for j in 0..16 {
        (v[j], v[j + 16]) = (val(q[j] & 0x0f), val(q[j] >> 4));
    }
}

/// The 32 values of a Q5 block (`qh` fifth bits, then 16 nibble bytes), less `bias`.
fn fives(q: &[u8], v: &mut [i8; QK_K], bias: i8) {
    let qh = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
    let qs = &q[4..20];
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as u8;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
        v[j] = ((qs[j] & 0x0f) | h0) as i8 - bias;
        v[j + 16] = ((qs[j] >> 4) | h1) as i8 - bias;
    }
}

/// Packs 32 element codes: nibbles (element j low, j + 16 high), and with `five`
/// the fifth bits into `qh` first.
fn pack_32(five: bool, v: &[u8], q: &mut [u8]) {
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

/// Q4_0 / Q5_0 (ggml): the value of largest magnitude maps to `-levels`, codes in
/// `0..2 levels`.
fn quantize_symmetric(x: &[f32], q: &mut [u8], s: &mut [f16], levels: f32) {
    let d = signed_max(x) / -levels;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    s[0] = f16::from_f32(d);
    let top = 2 * levels as i32 - 1;
    let v: Vec<u8> = x.iter().map(|&e| ((e * id + levels + 0.5) as i32).min(top) as u8).collect();
    pack_32(levels > 8.0, &v, q);
}

/// Q4_1 / Q5_1 (ggml): `top` steps from the block's minimum to its maximum.
fn quantize_range(x: &[f32], q: &mut [u8], s: &mut [f16], top: i32) {
    let (min, max) = x.iter().fold((f32::MAX, -f32::MAX), |(a, b), &v| (a.min(v), b.max(v)));
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    s[0] = f16::from_f32(d);
    s[1] = f16::from_f32(min);
    let v: Vec<u8> = x.iter().map(|&e| (((e - min) * id + 0.5) as i32).min(top) as u8).collect();
    pack_32(top > 15, &v, q);
}

/// ggml Q8_0: `d`, then 32 signed bytes.
pub struct BlockQ8_0;
impl BlockFormat for BlockQ8_0 {
    const LAYOUT: Layout = Layout::block32(8, 34, false);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::Bytes,
        i8_dot: I8Dot::Direct,
        x8: Some(X8::Codes32(Codes::Bytes)),
        panel: Panel { direct: Some(128), direct_x8: true, stage: Stage::Bytes },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        for (o, &b) in v[..32].iter_mut().zip(q) {
            *o = b as i8;
        }
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        s[0] = f16::from_f32(d);
        for (qj, &v) in q.iter_mut().zip(x) {
            // roundf: half away from zero.
            *qj = (v * id).round() as i8 as u8;
        }
    }
}

/// ggml Q4_0: `d`, then 16 nibble bytes, values `q - 8`.
pub struct BlockQ4_0;
impl BlockFormat for BlockQ4_0 {
    const LAYOUT: Layout = Layout::block32(2, 18, false);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::Nibbles,
        i8_dot: I8Dot::Direct,
        x8: Some(X8::Codes32(Codes::Nibbles)),
        panel: Panel { direct: Some(8), direct_x8: true, stage: Stage::Nibbles },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        nibbles(q, v, |n| n as i8 - 8);
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        quantize_symmetric(x, q, s, 8.0);
    }
}

/// ggml Q4_1: `d`, `m`, then 16 nibble bytes, values `d q + m`.
pub struct BlockQ4_1;
impl BlockFormat for BlockQ4_1 {
    const LAYOUT: Layout = Layout::block32(3, 20, true);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::NibblesMin,
        i8_dot: I8Dot::Direct,
        x8: None,
        panel: Panel { direct: Some(0), direct_x8: false, stage: Stage::Nibbles },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        nibbles(q, v, |n| n as i8);
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        quantize_range(x, q, s, 15);
    }
}

/// ggml Q5_0: `d`, then `qh` (32 fifth bits) and 16 nibble bytes, values `q - 16`.
pub struct BlockQ5_0;
impl BlockFormat for BlockQ5_0 {
    const LAYOUT: Layout = Layout::block32(6, 22, false);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::Unpacked,
        i8_dot: I8Dot::Direct,
        x8: None,
        panel: Panel { direct: Some(16), direct_x8: false, stage: Stage::Unpacked },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        fives(q, v, 16);
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        quantize_symmetric(x, q, s, 16.0);
    }
}

/// ggml Q5_1: `d`, `m`, then `qh` and 16 nibble bytes, values `d q + m`.
pub struct BlockQ5_1;
impl BlockFormat for BlockQ5_1 {
    const LAYOUT: Layout = Layout::block32(7, 24, true);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::Unpacked,
        i8_dot: I8Dot::Direct,
        x8: None,
        panel: Panel { direct: Some(0), direct_x8: false, stage: Stage::Unpacked },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        fives(q, v, 0);
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        quantize_range(x, q, s, 31);
    }
}

/// ggml IQ4_NL: `d`, then 16 nibble bytes indexing [`IQ4_LEVELS`].
pub struct BlockIQ4NL;
impl BlockFormat for BlockIQ4NL {
    const LAYOUT: Layout = Layout::block32(20, 18, false);
    const CPU: CpuKernels = CpuKernels {
        f32_dot: F32Dot::Unpacked,
        i8_dot: I8Dot::Direct,
        x8: Some(X8::Codes32(Codes::Levels)),
        panel: Panel { direct: None, direct_x8: false, stage: Stage::Unpacked },
    };
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]) {
        nibbles(q, v, |n| IQ4_LEVELS[n as usize]);
    }
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]) {
        let d = signed_max(x) / IQ4_LEVELS[0] as f32;
        s[0] = f16::from_f32(d);
        let d = s[0].to_f32();
        let v: Vec<u8> = x.iter().map(|&e| nearest_level(e, d)).collect();
        pack_32(false, &v, q);
    }
}
