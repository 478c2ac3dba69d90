//! Block-quantized weight formats, bit-compatible with ggml/llama.cpp (Q8_0,
//! Q4_0, Q4_1), and the split layout the quantized kernels read (seed 004's
//! policy: a `quants` byte buffer and a `scales` buffer, bound side by side).
//!
//! A ggml block covers 32 consecutive elements of a row:
//! - Q8_0: `f16 d; i8 qs[32]` (34 bytes), `x = qs[j] * d`
//! - Q4_0: `f16 d; u8 qs[16]` (18 bytes), `x[j] = (lo(qs[j]) - 8) * d`, `x[j + 16] = (hi(qs[j]) - 8) * d`
//! - Q4_1: `f16 d; f16 m; u8 qs[16]` (20 bytes), `x[j] = lo(qs[j]) * d + m`, `x[j + 16] = hi(qs[j]) * d + m`
//!
//! [`QMatrix`] keeps the quantized bytes of every block (32 for Q8_0, 16 for the
//! 4-bit formats, nibble order as in ggml) contiguous and 4-byte aligned in
//! `quants`, and the per-block f16 `d` (and `m` for Q4_1, interleaved `d, m`) in
//! `scales`: GPU kernels read both as `array<u32>` without unaligned access, CPU
//! kernels read the same bytes. [`QMatrix::from_ggml`] and [`QMatrix::to_ggml`]
//! convert from and to the on-disk block stream losslessly.

use half::f16;
use serde::{Deserialize, Serialize};

/// Elements per block, for every format here.
pub const QK: usize = 32;

/// A block-quantized storage format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QFormat {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl QFormat {
    pub const ALL: [QFormat; 3] = [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1];

    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4_0 => "q4_0",
            QFormat::Q4_1 => "q4_1",
        }
    }
    /// The ggml type id (GGUF tensor info `type`).
    pub fn ggml_type(self) -> u32 {
        match self {
            QFormat::Q8_0 => 8,
            QFormat::Q4_0 => 2,
            QFormat::Q4_1 => 3,
        }
    }
    pub fn from_ggml_type(t: u32) -> Option<QFormat> {
        QFormat::ALL.into_iter().find(|f| f.ggml_type() == t)
    }
    /// Bytes of one block on disk (ggml layout).
    pub fn block_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 34,
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
        }
    }
    /// Quantized bytes per block in [`QMatrix::quants`].
    pub fn quant_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 32,
            QFormat::Q4_0 | QFormat::Q4_1 => 16,
        }
    }
    /// f16 scale values per block in [`QMatrix::scales`] (`d`, or `d, m`).
    pub fn scales_per_block(self) -> usize {
        match self {
            QFormat::Q8_0 | QFormat::Q4_0 => 1,
            QFormat::Q4_1 => 2,
        }
    }
    /// Bits per weight including the scales.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / QK as f64
    }
    /// Bytes of `n` elements on disk; `None` unless `n` is a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        n.is_multiple_of(QK).then(|| n / QK * self.block_bytes())
    }
}

impl std::fmt::Display for QFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        QFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown quantized format `{s}` (allowed: q8_0, q4_0, q4_1)"))
    }
}

/// A `rows × cols` row-major matrix (a Hugging Face Linear weight, `[out, in]`)
/// in a block format, split into quantized bytes and scales.
#[derive(Clone, Debug, PartialEq)]
pub struct QMatrix {
    pub format: QFormat,
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols / 32` blocks of [`QFormat::quant_bytes`] bytes, row-major.
    pub quants: Vec<u8>,
    /// `rows * cols / 32` blocks of [`QFormat::scales_per_block`] f16 values.
    pub scales: Vec<f16>,
}

/// Why a block stream cannot be a [`QMatrix`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{format} needs rows of a multiple of {QK} elements, got {cols} columns")]
    Cols { format: QFormat, cols: usize },
    #[error("{format} data for {rows}x{cols} must be {expected} bytes, got {got}")]
    Len { format: QFormat, rows: usize, cols: usize, expected: usize, got: usize },
}

impl QMatrix {
    pub fn blocks(&self) -> usize {
        self.rows * self.cols / QK
    }
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }
    /// Bytes the kernels read (quants and scales).
    pub fn bytes(&self) -> usize {
        self.quants.len() + self.scales.len() * 2
    }

    fn check_shape(format: QFormat, rows: usize, cols: usize) -> Result<usize, QuantError> {
        if !cols.is_multiple_of(QK) || cols == 0 {
            return Err(QuantError::Cols { format, cols });
        }
        rows.checked_mul(cols / QK).ok_or(QuantError::Len { format, rows, cols, expected: usize::MAX, got: 0 })
    }

    /// Splits a ggml block stream (as stored in GGUF) into quants and scales.
    pub fn from_ggml(format: QFormat, rows: usize, cols: usize, data: &[u8]) -> Result<QMatrix, QuantError> {
        let blocks = Self::check_shape(format, rows, cols)?;
        let bb = format.block_bytes();
        let expected = blocks.saturating_mul(bb);
        if data.len() != expected {
            return Err(QuantError::Len { format, rows, cols, expected, got: data.len() });
        }
        let (qb, ns) = (format.quant_bytes(), format.scales_per_block());
        let mut quants = Vec::with_capacity(blocks * qb);
        let mut scales = Vec::with_capacity(blocks * ns);
        for block in data.chunks_exact(bb) {
            for s in 0..ns {
                scales.push(f16::from_le_bytes([block[2 * s], block[2 * s + 1]]));
            }
            quants.extend_from_slice(&block[2 * ns..]);
        }
        Ok(QMatrix { format, rows, cols, quants, scales })
    }

    /// The ggml block stream (inverse of [`QMatrix::from_ggml`]).
    pub fn to_ggml(&self) -> Vec<u8> {
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        let mut out = Vec::with_capacity(self.blocks() * self.format.block_bytes());
        for b in 0..self.blocks() {
            for s in &self.scales[b * ns..(b + 1) * ns] {
                out.extend_from_slice(&s.to_le_bytes());
            }
            out.extend_from_slice(&self.quants[b * qb..(b + 1) * qb]);
        }
        out
    }

    /// Quantizes row-major f32 values exactly as ggml's reference quantizers
    /// (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`).
    pub fn quantize(format: QFormat, rows: usize, cols: usize, x: &[f32]) -> Result<QMatrix, QuantError> {
        let blocks = Self::check_shape(format, rows, cols)?;
        if x.len() / QK != blocks || !x.len().is_multiple_of(QK) {
            return Err(QuantError::Len { format, rows, cols, expected: rows.saturating_mul(cols), got: x.len() });
        }
        let (qb, ns) = (format.quant_bytes(), format.scales_per_block());
        let mut quants = vec![0u8; blocks * qb];
        let mut scales = vec![f16::ZERO; blocks * ns];
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let q = &mut quants[b * qb..(b + 1) * qb];
            let s = &mut scales[b * ns..(b + 1) * ns];
            quantize_block(format, xb, q, s);
        }
        Ok(QMatrix { format, rows, cols, quants, scales })
    }

    /// Dequantizes block `b` into 32 values.
    #[inline]
    pub fn dequantize_block(&self, b: usize, out: &mut [f32; QK]) {
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        dequantize_block(self.format, &self.quants[b * qb..(b + 1) * qb], &self.scales[b * ns..(b + 1) * ns], out);
    }

    /// Dequantizes row `r` into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let bpr = self.blocks_per_row();
        let mut tmp = [0f32; QK];
        for j in 0..bpr {
            self.dequantize_block(r * bpr + j, &mut tmp);
            out[j * QK..(j + 1) * QK].copy_from_slice(&tmp);
        }
    }

    /// The whole matrix in f32 (the reference the quantized kernels are checked against).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            self.dequantize_row(r, &mut out[r * self.cols..(r + 1) * self.cols]);
        }
        out
    }
}

/// Quantizes one block of 32 values (ggml reference rounding).
pub fn quantize_block(format: QFormat, x: &[f32], q: &mut [u8], s: &mut [f16]) {
    debug_assert_eq!(x.len(), QK);
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
        QFormat::Q4_0 => {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            s[0] = f16::from_f32(d);
            for j in 0..QK / 2 {
                let x0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
                let x1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
                q[j] = x0 | (x1 << 4);
            }
        }
        QFormat::Q4_1 => {
            let (mut min, mut max) = (f32::MAX, -f32::MAX);
            for &v in x {
                min = min.min(v);
                max = max.max(v);
            }
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            s[0] = f16::from_f32(d);
            s[1] = f16::from_f32(min);
            for j in 0..QK / 2 {
                let x0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
                let x1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
                q[j] = x0 | (x1 << 4);
            }
        }
    }
}

/// Dequantizes one block: `q` its quantized bytes, `s` its f16 scales.
#[inline]
pub fn dequantize_block(format: QFormat, q: &[u8], s: &[f16], out: &mut [f32; QK]) {
    let d = s[0].to_f32();
    match format {
        QFormat::Q8_0 => {
            for (o, &v) in out.iter_mut().zip(q) {
                *o = (v as i8) as f32 * d;
            }
        }
        QFormat::Q4_0 => {
            for j in 0..QK / 2 {
                out[j] = ((q[j] & 0x0f) as i32 - 8) as f32 * d;
                out[j + QK / 2] = ((q[j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        QFormat::Q4_1 => {
            let m = s[1].to_f32();
            for j in 0..QK / 2 {
                out[j] = (q[j] & 0x0f) as f32 * d + m;
                out[j + QK / 2] = (q[j] >> 4) as f32 * d + m;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 0.2
            })
            .collect()
    }

    #[test]
    fn ggml_round_trip_is_lossless() {
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, 3, 64, &data(192, 1)).unwrap();
            let raw = m.to_ggml();
            assert_eq!(raw.len(), f.bytes_for(192).unwrap());
            assert_eq!(QMatrix::from_ggml(f, 3, 64, &raw).unwrap(), m);
        }
    }

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let x = data(32 * 40, 7);
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, 40, 32, &x).unwrap();
            let y = m.dequantize();
            for b in 0..40 {
                let xb = &x[b * 32..(b + 1) * 32];
                let d = m.scales[b * f.scales_per_block()].to_f32().abs();
                // Rounding `d` (and `m`) to f16 adds up to 2^-11 of the value.
                for (a, e) in y[b * 32..(b + 1) * 32].iter().zip(xb) {
                    // Q4_0 maps the largest magnitude to -8 and clamps the other side at +7.
                    let steps = if f == QFormat::Q4_0 { 1.0 } else { 0.5 };
                    let tol = d * steps + e.abs().max(0.1) * 1e-3 + 1e-6;
                    assert!((a - e).abs() <= tol, "{f}: {a} vs {e} (d {d})");
                }
            }
        }
    }

    #[test]
    fn known_blocks_decode_as_ggml_does() {
        // Q8_0: d = 0.5, qs = -3, 4, ...
        let mut raw = f16::from_f32(0.5).to_le_bytes().to_vec();
        raw.extend((0..32).map(|j| ((j as i8) - 16) as u8));
        let m = QMatrix::from_ggml(QFormat::Q8_0, 1, 32, &raw).unwrap();
        assert_eq!(m.dequantize()[0], -8.0);
        assert_eq!(m.dequantize()[31], 7.5);
        // Q4_0: low nibble = element j, high nibble = element j + 16.
        let mut raw = f16::from_f32(2.0).to_le_bytes().to_vec();
        raw.extend([0x9fu8; 16]);
        let y = QMatrix::from_ggml(QFormat::Q4_0, 1, 32, &raw).unwrap().dequantize();
        assert_eq!((y[0], y[16]), ((15 - 8) as f32 * 2.0, (9 - 8) as f32 * 2.0));
        // Q4_1: x = q * d + m.
        let mut raw = f16::from_f32(0.25).to_le_bytes().to_vec();
        raw.extend(f16::from_f32(-1.0).to_le_bytes());
        raw.extend([0x31u8; 16]);
        let y = QMatrix::from_ggml(QFormat::Q4_1, 1, 32, &raw).unwrap().dequantize();
        assert_eq!((y[0], y[16]), (1.0 * 0.25 - 1.0, 3.0 * 0.25 - 1.0));
    }

    #[test]
    fn bad_shapes_and_lengths_are_errors() {
        assert!(matches!(QMatrix::from_ggml(QFormat::Q8_0, 1, 33, &[0; 34]), Err(QuantError::Cols { .. })));
        assert!(matches!(QMatrix::from_ggml(QFormat::Q4_1, 2, 32, &[0; 20]), Err(QuantError::Len { .. })));
        assert!(QMatrix::from_ggml(QFormat::Q4_0, usize::MAX / 2, 64, &[0; 18]).is_err());
        assert!("q5_0".parse::<QFormat>().is_err());
        assert_eq!("Q4_1".parse::<QFormat>(), Ok(QFormat::Q4_1));
    }
}
