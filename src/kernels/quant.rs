//! Block-quantized weight formats, bit-compatible with ggml/llama.cpp (Q8_0,
//! Q4_0, Q4_1), and the split layout the quantized kernels read (a
//! `quants` byte buffer and a `scales` buffer, bound side by side).
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

/// Alignment of the scales region in the single-buffer GPU layout: a storage
/// binding offset must be a multiple of the adapter's
/// `min_storage_buffer_offset_alignment`, which WebGPU caps at 256.
pub const SCALES_ALIGN: usize = 256;

/// Where the regions of a quantized matrix of `blocks` blocks lie in one buffer:
/// the quants from byte 0, the f16 scales from `scales_offset` (a multiple of
/// [`SCALES_ALIGN`]), so the buffer binds as two storage bindings (the
/// `matrix` and `scale_bytes` of the profile format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QLayout {
    /// Bytes of quantized data (a multiple of 16).
    pub quants: usize,
    pub scales_offset: usize,
    /// Bytes of scales, rounded up to 4 (whole `u32` words).
    pub scales: usize,
    /// Bytes of the whole buffer (rounded up to 16).
    pub total: usize,
}

impl QFormat {
    /// The single-buffer layout of `blocks` blocks.
    pub fn layout(self, blocks: usize) -> QLayout {
        let quants = blocks * self.quant_bytes();
        let scales_offset = quants.div_ceil(SCALES_ALIGN) * SCALES_ALIGN;
        let scales = (blocks * self.scales_per_block() * 2).div_ceil(4) * 4;
        QLayout { quants, scales_offset, scales, total: scales_offset + scales.max(4).div_ceil(16) * 16 }
    }
}

/// A borrowed quantized matrix (or block range of one): what a CPU kernel reads.
/// The shape comes from the problem; `quants` and `scales` hold whole blocks.
#[derive(Clone, Copy, Debug)]
pub struct QView<'a> {
    pub format: QFormat,
    pub quants: &'a [u8],
    pub scales: &'a [f16],
}

impl<'a> QView<'a> {
    pub fn blocks(&self) -> usize {
        (self.quants.len() / self.format.quant_bytes()).min(self.scales.len() / self.format.scales_per_block())
    }
    /// Elements the view holds (whole blocks).
    pub fn elems(&self) -> usize {
        self.blocks() * QK
    }
    /// Quantized bytes and scales of block `b`.
    #[inline]
    pub fn block(&self, b: usize) -> (&'a [u8], &'a [f16]) {
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        (&self.quants[b * qb..(b + 1) * qb], &self.scales[b * ns..(b + 1) * ns])
    }
    /// Blocks `b0..b0 + count` (a row is `cols / 32` consecutive blocks).
    #[inline]
    pub fn blocks_range(&self, b0: usize, count: usize) -> QView<'a> {
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        QView { format: self.format, quants: &self.quants[b0 * qb..(b0 + count) * qb], scales: &self.scales[b0 * ns..(b0 + count) * ns] }
    }
    /// Element `i` (flattened), dequantized.
    pub fn get(&self, i: usize) -> f32 {
        let mut out = [0f32; QK];
        let (q, s) = self.block(i / QK);
        dequantize_block(self.format, q, s, &mut out);
        out[i % QK]
    }
    /// Dequantizes every block of the view into `out` (`elems()` values).
    pub fn dequantize_into(&self, out: &mut [f32]) {
        let mut tmp = [0f32; QK];
        for (b, o) in out.chunks_exact_mut(QK).take(self.blocks()).enumerate() {
            let (q, s) = self.block(b);
            dequantize_block(self.format, q, s, &mut tmp);
            o.copy_from_slice(&tmp);
        }
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
    #[error("quantized rows: {0}")]
    Concat(String),
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

    pub fn view(&self) -> QView<'_> {
        QView { format: self.format, quants: &self.quants, scales: &self.scales }
    }

    /// The single-buffer GPU layout ([`QFormat::layout`]): quants, zero padding,
    /// scales (little-endian f16), zero padding.
    pub fn gpu_bytes(&self) -> Vec<u8> {
        let l = self.format.layout(self.blocks());
        let mut out = vec![0u8; l.total];
        out[..self.quants.len()].copy_from_slice(&self.quants);
        for (i, s) in self.scales.iter().enumerate() {
            out[l.scales_offset + 2 * i..][..2].copy_from_slice(&s.to_le_bytes());
        }
        out
    }

    /// Stacks matrices with the same format and column count along the rows (the
    /// fused Q/K/V and gate/up weights): block-wise, since rows are whole blocks.
    pub fn concat_rows(parts: &[QMatrix]) -> Result<QMatrix, QuantError> {
        let Some(first) = parts.first() else {
            return Err(QuantError::Concat("nothing to concatenate".into()));
        };
        let mut out = QMatrix { format: first.format, rows: 0, cols: first.cols, quants: Vec::new(), scales: Vec::new() };
        for p in parts {
            if p.format != first.format || p.cols != first.cols {
                return Err(QuantError::Concat(format!(
                    "{} {}x{} cannot follow {} with {} columns",
                    p.format, p.rows, p.cols, first.format, first.cols
                )));
            }
            out.rows += p.rows;
            out.quants.extend_from_slice(&p.quants);
            out.scales.extend_from_slice(&p.scales);
        }
        Ok(out)
    }

    /// Rows `r0..r0 + count` as a matrix of their own (an LM-head block).
    pub fn slice_rows(&self, r0: usize, count: usize) -> Result<QMatrix, QuantError> {
        if r0.checked_add(count).is_none_or(|e| e > self.rows) {
            return Err(QuantError::Concat(format!("rows {r0}..{} of a {}-row matrix", r0.saturating_add(count), self.rows)));
        }
        let v = self.view().blocks_range(r0 * self.blocks_per_row(), count * self.blocks_per_row());
        Ok(QMatrix { format: self.format, rows: count, cols: self.cols, quants: v.quants.to_vec(), scales: v.scales.to_vec() })
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

    fn data(n: usize, seed: u64) -> Vec<f32> {
        crate::kernels::cpu::testdata::uniform(n, seed, -0.1, 0.1)
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
    fn gpu_layout_puts_scales_at_an_aligned_offset() {
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, 5, 96, &data(480, 3)).unwrap();
            let l = f.layout(m.blocks());
            let bytes = m.gpu_bytes();
            assert_eq!(bytes.len(), l.total);
            assert_eq!(l.scales_offset % SCALES_ALIGN, 0);
            assert!(l.scales_offset >= m.quants.len());
            assert_eq!(&bytes[..m.quants.len()], &m.quants[..]);
            let s0 = f16::from_le_bytes([bytes[l.scales_offset], bytes[l.scales_offset + 1]]);
            assert_eq!(s0, m.scales[0]);
            assert_eq!(crate::kernels::DType::from(f).bytes_for(480), l.total as u64);
        }
    }

    #[test]
    fn concat_and_slice_rows_are_block_wise() {
        let x = data(7 * 64, 9);
        for f in QFormat::ALL {
            let a = QMatrix::quantize(f, 3, 64, &x[..192]).unwrap();
            let b = QMatrix::quantize(f, 4, 64, &x[192..]).unwrap();
            let all = QMatrix::quantize(f, 7, 64, &x).unwrap();
            assert_eq!(QMatrix::concat_rows(&[a.clone(), b.clone()]).unwrap(), all);
            assert_eq!(all.slice_rows(3, 4).unwrap(), b);
            assert!(all.slice_rows(5, 3).is_err());
            let other = QMatrix::quantize(f, 1, 32, &x[..32]).unwrap();
            assert!(QMatrix::concat_rows(&[a, other]).is_err());
        }
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
