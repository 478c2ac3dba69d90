//! Block-quantized weight formats, bit-compatible with ggml/llama.cpp: the
//! 32-element blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL, and the 256-element
//! super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS; and the split layout the
//! quantized kernels read (a `quants` byte buffer and a `scales` buffer, bound
//! side by side).
//!
//! A ggml block is a byte record; its f16 header fields (`d`, and `m` or `dmin`,
//! and IQ4_XS's u16 `scales_h`) sit at fixed offsets ([`QFormat::header`]). The
//! split layout moves those 16-bit fields into `scales` (one to two per block)
//! and keeps every other byte of the block, in on-disk order, in `quants`
//! ([`QFormat::quant_bytes`], always a multiple of 4): GPU kernels read both as
//! `array<u32>` without unaligned access (the GPU buffer pads Q3_K, Q4_K and Q5_K
//! blocks to whole 16-byte words, [`QFormat::gpu_quant_bytes`]), CPU kernels read
//! the same bytes.
//! [`QMatrix::from_ggml`] and [`QMatrix::to_ggml`] convert from and to the
//! on-disk block stream losslessly. How each format's bytes become values:
//! [`decode`] (bit-identical to `gguf.quants.dequantize`); how floats become
//! blocks: [`encode`]. The formats themselves (names, ggml ids, block geometry,
//! and [`DType`] around them) are one list: [`formats`]. (The block-size rule of
//! every block-format kernel, k in whole blocks, is the kernels' contract's:
//! [`crate::kernels::contract::check_blocks`].)

pub mod block;
mod decode;
mod encode;
pub mod formats;
mod repack;
pub mod stack;

pub use decode::{GROUP, IQ4_LEVELS, Unpacked, dequantize_block, scale_min_k4, scales_mins_k4, unpack, unpack_scales, unpack_vals};
pub use encode::quantize_block;
pub use formats::{DType, QFormat};
pub use repack::{
    DEFAULT_REPACK_MAX_ROW, REPACKABLE, X8_BYTES, X8_K6_BYTES, X8_ROWS, default_repack, pack_scales_mins_k4, x8_k6_code, x8_k6_scale,
    x8_record_bytes, x8_row_codes, x8_row_runs, x8_scale_min,
};
pub use stack::{QStack, RowFormats, StackLayout};

use half::f16;

/// Elements per block of the 32-element formats (and per activation block of the
/// int8 dot paths).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants and IQ4_XS.
pub const QK_K: usize = 256;

impl QFormat {
    /// The ggml type id (GGUF tensor info `type`).
    pub fn ggml_type(self) -> u32 {
        self.ops().layout.ggml
    }
    pub fn from_ggml_type(t: u32) -> Option<QFormat> {
        QFormat::ALL.into_iter().find(|f| f.ggml_type() == t)
    }
    /// Elements per block (32, or 256 for the super-block formats).
    #[inline]
    pub fn block_elems(self) -> usize {
        self.ops().layout.elems
    }
    /// Bytes of one block on disk (ggml layout).
    #[inline]
    pub fn block_bytes(self) -> usize {
        self.ops().layout.bytes
    }
    /// Byte offsets in a disk block of the 16-bit fields that go to `scales`.
    #[inline]
    pub fn header(self) -> &'static [usize] {
        self.ops().layout.header
    }
    /// Quantized bytes per block in [`QMatrix::quants`] (a multiple of 4).
    #[inline]
    pub fn quant_bytes(self) -> usize {
        self.block_bytes() - 2 * self.scales_per_block()
    }
    /// Quantized bytes per block in the GPU layout ([`QFormat::layout`],
    /// [`QFormat::gpu_block`]): the [`QFormat::quant_bytes`] grown to a multiple of
    /// 16 where that costs at most 4 bytes (Q3_K 108 → 112, Q4_K 140 → 144, Q5_K
    /// 172 → 176), so a block's code segments start 16-byte aligned and a shader
    /// reads them with `vec4<u32>` loads; the others as they are (already whole
    /// 16-byte words, or Q5_0/Q5_1's 20 and IQ4_XS's 132, which would grow by 60%
    /// and 9%).
    pub fn gpu_quant_bytes(self) -> usize {
        let q = self.quant_bytes();
        let padded = q.div_ceil(16) * 16;
        if padded - q <= 4 { padded } else { q }
    }
    /// One block's quantized bytes (`src`, [`QFormat::quant_bytes`]) in the GPU
    /// layout (`dst`, [`QFormat::gpu_quant_bytes`]), the format's
    /// [`BlockFormat::gpu_block`](block::BlockFormat::gpu_block): Q4_K and Q5_K's
    /// 12 packed 6-bit scale bytes become 16 (the 8 sub-block scales then the 8
    /// minima a byte each), so their `qh` / `qs` start at byte 16; the others'
    /// bytes as they are, zeros after (Q3_K: 4).
    pub fn gpu_block(self, src: &[u8], dst: &mut [u8]) {
        (self.ops().gpu_block)(&src[..self.quant_bytes()], dst)
    }
    /// 16-bit values per block in [`QMatrix::scales`] (`d`; `d, m`; `d, dmin`; IQ4_XS `d, scales_h`).
    #[inline]
    pub fn scales_per_block(self) -> usize {
        self.header().len()
    }
    /// Whether values carry an additive per-group offset (`m`, `dmin`).
    #[inline]
    pub fn has_offset(self) -> bool {
        self.ops().layout.offset
    }
    /// Bits per weight including the scales.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_elems() as f64
    }
    /// Bytes of `n` elements on disk; `None` unless `n` is a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_elems()).then(|| n / self.block_elems() * self.block_bytes())
    }
    /// The format llama.cpp's quantizer uses instead of this one for a row of
    /// `cols` elements that is not whole super-blocks (`llama-quant.cpp`: Q4_K →
    /// Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K / Q3_K / IQ4_XS → IQ4_NL); itself when
    /// the row is whole blocks.
    pub fn for_row(self, cols: usize) -> QFormat {
        if cols.is_multiple_of(self.block_elems()) {
            return self;
        }
        self.ops().row_fallback.unwrap_or(self)
    }
    /// Blocks of `n` elements (a partial block counts whole).
    pub fn blocks_for(self, n: usize) -> usize {
        n.div_ceil(self.block_elems())
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
        QFormat::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            let names: Vec<_> = QFormat::ALL.iter().map(|f| f.name()).collect();
            format!("unknown quantized format `{s}` (allowed: {})", names.join(", "))
        })
    }
}

/// Alignment of the scales region in the single-buffer GPU layout: a storage
/// binding offset must be a multiple of the adapter's
/// `min_storage_buffer_offset_alignment`, which WebGPU caps at 256.
pub const SCALES_ALIGN: usize = 256;

/// Where the regions of a quantized matrix of `blocks` blocks lie in one buffer:
/// the quants from byte 0 ([`QFormat::gpu_quant_bytes`] a block), the f16 scales from `scales_offset` (a multiple of
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
        let quants = blocks * self.gpu_quant_bytes();
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
    /// The order of the blocks ([`Layout::X8`]: repacked, read through
    /// [`QView::with_block`] or the dedicated dots).
    pub layout: Layout,
}

/// How a matrix's blocks lie in `quants` and `scales`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Row after row, each row's blocks in order (the on-disk order).
    #[default]
    Rows,
    /// Q4_K, Q4_0, Q8_0 or IQ4_NL repacked for the CPU's decode dots (int8 or f32 activations)
    /// (llama.cpp's `REPACK` idea, in a layout of ours): 8 rows interleaved per
    /// block column, their header fields side by side (Q4_K: unpacked 6-bit scales
    /// and minima too), the codes of the 8 rows in 4-byte runs so one 32-byte load
    /// holds 4 code bytes of each row (the `repack` module's docs); rows of `bpr`
    /// blocks.
    X8 { bpr: usize },
}

impl<'a> QView<'a> {
    pub fn blocks(&self) -> usize {
        let qb = if self.layout == Layout::Rows { self.format.quant_bytes() } else { x8_record_bytes(self.format) / X8_ROWS };
        (self.quants.len() / qb).min(self.scales.len() / self.format.scales_per_block())
    }
    /// Elements the view holds (whole blocks).
    pub fn elems(&self) -> usize {
        self.blocks() * self.format.block_elems()
    }
    /// Quantized bytes and scales of block `b` (of the [`Layout::Rows`] order:
    /// a repacked view is read through [`QView::with_block`]).
    #[inline]
    pub fn block(&self, b: usize) -> (&'a [u8], &'a [f16]) {
        debug_assert_eq!(self.layout, Layout::Rows, "a repacked matrix read block by block");
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        (&self.quants[b * qb..(b + 1) * qb], &self.scales[b * ns..(b + 1) * ns])
    }
    /// Blocks `b0..b0 + count` (a row is `cols / block_elems` consecutive blocks).
    #[inline]
    pub fn blocks_range(&self, b0: usize, count: usize) -> QView<'a> {
        debug_assert_eq!(self.layout, Layout::Rows, "a repacked matrix sliced by blocks");
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        QView {
            format: self.format,
            quants: &self.quants[b0 * qb..(b0 + count) * qb],
            scales: &self.scales[b0 * ns..(b0 + count) * ns],
            layout: Layout::Rows,
        }
    }
    /// Element `i` (flattened, row-major), dequantized.
    pub fn get(&self, i: usize) -> f32 {
        let be = self.format.block_elems();
        let mut out = [0f32; QK_K];
        self.with_block(i / be, |q, s| dequantize_block(self.format, q, s, &mut out[..be]));
        out[i % be]
    }
    /// Dequantizes every block of the view into `out` (`elems()` values, row-major).
    pub fn dequantize_into(&self, out: &mut [f32]) {
        let be = self.format.block_elems();
        for (b, o) in out.chunks_exact_mut(be).take(self.blocks()).enumerate() {
            self.with_block(b, |q, s| dequantize_block(self.format, q, s, o));
        }
    }
    /// `f(quants, scales)` of block `b` (numbered row after row) in the row-major
    /// split form whatever the layout: a repacked block is gathered into stack
    /// copies first.
    #[inline]
    pub fn with_block<R>(&self, b: usize, f: impl FnOnce(&[u8], &[f16]) -> R) -> R {
        match self.layout {
            Layout::Rows => {
                let (q, s) = self.block(b);
                f(q, s)
            }
            Layout::X8 { bpr } => {
                let (q, s) = repack::gather_x8(self, b / bpr, b % bpr, bpr);
                f(&q[..self.format.quant_bytes()], &s[..self.format.scales_per_block()])
            }
        }
    }
}

/// A `rows × cols` row-major matrix (a Hugging Face Linear weight, `[out, in]`)
/// in a block format, split into quantized bytes and scales.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub format: QFormat,
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols / 32` blocks of [`QFormat::quant_bytes`] bytes, row-major.
    pub quants: Vec<u8>,
    /// `rows * cols / 32` blocks of [`QFormat::scales_per_block`] f16 values.
    pub scales: Vec<f16>,
    /// The order of the blocks in `quants` and `scales`.
    pub layout: Layout,
}

/// Equal blocks: the 16-bit header fields compare by their bits (IQ4_XS keeps a
/// bit field there, which may read as a NaN f16).
impl PartialEq for QMatrix {
    fn eq(&self, o: &QMatrix) -> bool {
        (self.format, self.rows, self.cols, self.layout, &self.quants) == (o.format, o.rows, o.cols, o.layout, &o.quants)
            && self.scales.iter().map(|s| s.to_bits()).eq(o.scales.iter().map(|s| s.to_bits()))
    }
}

/// Why a block stream cannot be a [`QMatrix`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{format} needs rows of a multiple of {} elements, got {cols} columns", format.block_elems())]
    Cols { format: QFormat, cols: usize },
    #[error("{format} data for {rows}x{cols} must be {expected} bytes, got {got}")]
    Len { format: QFormat, rows: usize, cols: usize, expected: usize, got: usize },
    #[error("quantized rows: {0}")]
    Concat(String),
}

impl QMatrix {
    /// Backs the quants and the scales with huge pages where the system offers
    /// them ([`crate::kernels::memory::huge_pages`]).
    pub fn huge_pages(&self) {
        crate::kernels::memory::huge_pages(&self.quants);
        crate::kernels::memory::huge_pages(&self.scales);
    }

    /// A copy in memory marked for huge pages before it is written
    /// ([`crate::kernels::memory::huge_vec`]).
    pub fn huge_clone(&self) -> QMatrix {
        use crate::kernels::memory::huge_copy;
        QMatrix { quants: huge_copy(&self.quants), scales: huge_copy(&self.scales), ..*self }
    }

    pub fn blocks(&self) -> usize {
        self.rows * self.blocks_per_row()
    }
    pub fn blocks_per_row(&self) -> usize {
        self.cols / self.format.block_elems()
    }
    /// Bytes the kernels read (quants and scales).
    pub fn bytes(&self) -> usize {
        self.quants.len() + self.scales.len() * 2
    }

    fn check_shape(format: QFormat, rows: usize, cols: usize) -> Result<usize, QuantError> {
        let be = format.block_elems();
        if !cols.is_multiple_of(be) || cols == 0 {
            return Err(QuantError::Cols { format, cols });
        }
        rows.checked_mul(cols / be).ok_or(QuantError::Len { format, rows, cols, expected: usize::MAX, got: 0 })
    }

    pub fn view(&self) -> QView<'_> {
        QView { format: self.format, quants: &self.quants, scales: &self.scales, layout: self.layout }
    }

    /// The single-buffer GPU layout ([`QFormat::layout`]): quants (each block's
    /// [`QFormat::gpu_block`]), zero padding, scales (little-endian f16), zero padding.
    pub fn gpu_bytes(&self) -> Vec<u8> {
        if self.layout != Layout::Rows {
            return self.to_rows().gpu_bytes();
        }
        let l = self.format.layout(self.blocks());
        let mut out = vec![0u8; l.total];
        let (qb, gb) = (self.format.quant_bytes(), self.format.gpu_quant_bytes());
        for (src, dst) in self.quants.chunks_exact(qb).zip(out[..l.quants].chunks_exact_mut(gb)) {
            self.format.gpu_block(src, dst);
        }
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
        use crate::kernels::memory::huge_vec;
        let (quants, scales) = (parts.iter().map(|p| p.quants.len()).sum(), parts.iter().map(|p| p.scales.len()).sum());
        let mut out = QMatrix {
            format: first.format,
            rows: 0,
            cols: first.cols,
            quants: huge_vec(quants),
            scales: huge_vec(scales),
            layout: Layout::Rows,
        };
        for p in parts {
            if p.layout != Layout::Rows {
                return Err(QuantError::Concat(format!("a repacked {} matrix cannot be concatenated", p.format)));
            }
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

    /// Multiplies row `r`'s values by `factor(r)` through its blocks' scale and
    /// offset fields (`d`, and `m` / `dmin` where values carry an offset; IQ4_XS's
    /// second header field is a bit field and stays), each rounded to f16 once:
    /// a family's multiplier folded into a weight at load (see `RowScale` in
    /// ktune's model config). The quantized codes are untouched.
    pub fn scale_rows(&mut self, factor: impl Fn(usize) -> f32) {
        if self.layout != Layout::Rows {
            *self = self.to_rows();
        }
        let layout = self.format.ops().layout;
        let (per_block, linear) = (self.format.scales_per_block(), if layout.offset { 2 } else { 1 });
        let bpr = self.blocks_per_row().max(1);
        for (b, s) in self.scales.chunks_exact_mut(per_block).enumerate() {
            let f = factor(b / bpr);
            if f != 1.0 {
                s[..linear].iter_mut().for_each(|v| *v = f16::from_f32(v.to_f32() * f));
            }
        }
    }

    /// Rows `r0..r0 + count` as a matrix of their own (an LM-head block).
    pub fn slice_rows(&self, r0: usize, count: usize) -> Result<QMatrix, QuantError> {
        if self.layout != Layout::Rows {
            return self.to_rows().slice_rows(r0, count);
        }
        if r0.checked_add(count).is_none_or(|e| e > self.rows) {
            return Err(QuantError::Concat(format!("rows {r0}..{} of a {}-row matrix", r0.saturating_add(count), self.rows)));
        }
        let v = self.view().blocks_range(r0 * self.blocks_per_row(), count * self.blocks_per_row());
        Ok(QMatrix {
            format: self.format,
            rows: count,
            cols: self.cols,
            quants: v.quants.to_vec(),
            scales: v.scales.to_vec(),
            layout: Layout::Rows,
        })
    }

    /// Splits a ggml block stream (as stored in GGUF) into quants and scales.
    pub fn from_ggml(format: QFormat, rows: usize, cols: usize, data: &[u8]) -> Result<QMatrix, QuantError> {
        let blocks = Self::check_shape(format, rows, cols)?;
        let bb = format.block_bytes();
        let expected = blocks.saturating_mul(bb);
        if data.len() != expected {
            return Err(QuantError::Len { format, rows, cols, expected, got: data.len() });
        }
        let (qb, header) = (format.quant_bytes(), format.header());
        let mut quants = crate::kernels::memory::huge_vec(blocks * qb);
        let mut scales = crate::kernels::memory::huge_vec(blocks * header.len());
        for block in data.chunks_exact(bb) {
            split_block(header, block, &mut quants, &mut scales);
        }
        Ok(QMatrix { format, rows, cols, quants, scales, layout: Layout::Rows })
    }

    /// The ggml block stream (inverse of [`QMatrix::from_ggml`]).
    pub fn to_ggml(&self) -> Vec<u8> {
        if self.layout != Layout::Rows {
            return self.to_rows().to_ggml();
        }
        let (qb, header) = (self.format.quant_bytes(), self.format.header());
        let ns = header.len();
        let mut out = Vec::with_capacity(self.blocks() * self.format.block_bytes());
        for b in 0..self.blocks() {
            let (q, s) = (&self.quants[b * qb..(b + 1) * qb], &self.scales[b * ns..(b + 1) * ns]);
            let (mut at, mut qi) = (0, 0);
            for (&o, v) in header.iter().zip(s) {
                out.extend_from_slice(&q[qi..qi + o - at]);
                qi += o - at;
                out.extend_from_slice(&v.to_le_bytes());
                at = o + 2;
            }
            out.extend_from_slice(&q[qi..]);
        }
        out
    }

    /// Quantizes row-major f32 values: ggml's reference quantizers for the
    /// 32-element formats, a round-to-nearest quantizer for the others ([`encode`]).
    pub fn quantize(format: QFormat, rows: usize, cols: usize, x: &[f32]) -> Result<QMatrix, QuantError> {
        let blocks = Self::check_shape(format, rows, cols)?;
        let be = format.block_elems();
        if x.len() != blocks * be {
            return Err(QuantError::Len { format, rows, cols, expected: rows.saturating_mul(cols), got: x.len() });
        }
        let (qb, ns) = (format.quant_bytes(), format.scales_per_block());
        use crate::kernels::memory::huge_filled;
        let (mut quants, mut scales) = (huge_filled(blocks * qb, 0u8), huge_filled(blocks * ns, f16::ZERO));
        // Blocks are independent: in parallel, 64 at a time at least (an LM head's
        // 1.5M super-blocks took seconds on one core).
        use rayon::prelude::*;
        quants
            .par_chunks_mut(qb)
            .zip(scales.par_chunks_mut(ns))
            .zip(x.par_chunks_exact(be))
            .with_min_len(64)
            .for_each(|((q, s), xb)| quantize_block(format, xb, q, s));
        Ok(QMatrix { format, rows, cols, quants, scales, layout: Layout::Rows })
    }

    /// Dequantizes block `b` into `block_elems` values.
    #[inline]
    pub fn dequantize_block(&self, b: usize, out: &mut [f32]) {
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        dequantize_block(self.format, &self.quants[b * qb..(b + 1) * qb], &self.scales[b * ns..(b + 1) * ns], out);
    }

    /// Dequantizes row `r` into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let bpr = self.blocks_per_row();
        let be = self.format.block_elems();
        for (j, o) in out[..self.cols].chunks_exact_mut(be).enumerate() {
            self.dequantize_block(r * bpr + j, o);
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

/// Appends one disk block's bytes to `quants` and its 16-bit header fields (at
/// the offsets `header`) to `scales`.
pub fn split_block(header: &[usize], block: &[u8], quants: &mut Vec<u8>, scales: &mut Vec<f16>) {
    let mut at = 0;
    for &o in header {
        quants.extend_from_slice(&block[at..o]);
        scales.push(f16::from_le_bytes([block[o], block[o + 1]]));
        at = o + 2;
    }
    quants.extend_from_slice(&block[at..]);
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
            let m = QMatrix::quantize(f, 3, 512, &data(1536, 1)).unwrap();
            let raw = m.to_ggml();
            assert_eq!(raw.len(), f.bytes_for(1536).unwrap());
            assert_eq!(QMatrix::from_ggml(f, 3, 512, &raw).unwrap(), m, "{f}");
            // Header fields land where ggml keeps them: every header offset holds
            // the block's scale bytes.
            for (b, block) in raw.chunks_exact(f.block_bytes()).enumerate() {
                for (h, &o) in f.header().iter().enumerate() {
                    assert_eq!(&block[o..o + 2], &m.scales[b * f.scales_per_block() + h].to_le_bytes(), "{f} block {b}");
                }
            }
        }
    }

    /// Scaling rows through the header fields scales every value of the row (up
    /// to the f16 rounding of `d` and the offset), in every format; a repacked
    /// matrix is scaled in row order.
    #[test]
    fn scale_rows_scales_each_rows_values() {
        let factors = [0.5f32, 1.0, 0.22, 1.19];
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, 4, 512, &data(2048, 3)).unwrap();
            let before = m.dequantize();
            let mut scaled = m.clone();
            scaled.scale_rows(|r| factors[r]);
            let after = scaled.dequantize();
            assert_eq!(scaled.quants, m.quants, "{f}: the codes stay");
            for r in 0..4 {
                let (b, a) = (&before[r * 512..(r + 1) * 512], &after[r * 512..(r + 1) * 512]);
                let top = b.iter().fold(0f32, |t, v| t.max(v.abs()));
                for (x, y) in b.iter().zip(a) {
                    assert!((x * factors[r] - y).abs() <= 2e-3 * top, "{f} row {r}: {x} x {} vs {y}", factors[r]);
                }
            }
        }
    }

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let x = data(32 * 40, 7);
        for f in [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1] {
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
    fn super_block_formats_quantize_close_to_the_input() {
        // Round-to-nearest with 6-bit (Q2_K: 4-bit) sub-block scales: the error
        // stays a fraction of the block's range, per format's levels.
        let x = data(256 * 8, 11);
        for (f, levels) in [
            (QFormat::Q5_0, 32.0),
            (QFormat::Q5_1, 32.0),
            (QFormat::IQ4_NL, 8.0),
            (QFormat::Q2_K, 2.0),
            (QFormat::Q3_K, 4.0),
            (QFormat::Q4_K, 8.0),
            (QFormat::Q5_K, 16.0),
            (QFormat::Q6_K, 32.0),
            (QFormat::IQ4_XS, 8.0),
        ] {
            let m = QMatrix::quantize(f, 8, 256, &x).unwrap();
            let y = m.dequantize();
            let err = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            // Inputs span [-0.1, 0.1].
            assert!(err <= 0.2 / levels * 1.2, "{f}: max error {err}");
            let rms = (x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / x.len() as f32).sqrt();
            assert!(rms <= 0.2 / levels / 2.5, "{f}: rms error {rms}");
        }
    }

    #[test]
    fn gpu_layout_puts_scales_at_an_aligned_offset() {
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, 5, 512, &data(2560, 3)).unwrap();
            let l = f.layout(m.blocks());
            let bytes = m.gpu_bytes();
            assert_eq!(bytes.len(), l.total);
            assert_eq!(l.scales_offset % SCALES_ALIGN, 0);
            assert!(l.scales_offset >= l.quants);
            // every block's bytes: Q4_K / Q5_K's scales and minima unpacked to a
            // byte each, the others' as they are and zeros after
            let (qb, gb) = (f.quant_bytes(), f.gpu_quant_bytes());
            assert!(gb >= qb && gb - qb <= 4, "{f}");
            assert_eq!(l.quants, m.blocks() * gb);
            for b in 0..m.blocks() {
                let (src, dst) = (&m.quants[b * qb..][..qb], &bytes[b * gb..][..gb]);
                if matches!(f, QFormat::Q4_K | QFormat::Q5_K) {
                    for g in 0..8 {
                        assert_eq!((dst[g], dst[8 + g]), scale_min_k4(g, &src[..12]), "{f} block {b} sub-block {g}");
                    }
                    assert_eq!(&dst[16..], &src[12..], "{f} block {b}");
                } else {
                    assert_eq!(&dst[..qb], src, "{f} block {b}");
                    assert!(dst[qb..].iter().all(|&x| x == 0), "{f} block {b}");
                }
            }
            let s0 = f16::from_le_bytes([bytes[l.scales_offset], bytes[l.scales_offset + 1]]);
            assert_eq!(s0, m.scales[0]);
            assert_eq!(crate::kernels::DType::from(f).bytes_for(2560), l.total as u64);
            assert_eq!(f.quant_bytes() % 4, 0, "{f}: quant words must be whole u32s");
        }
        // the formats whose code segments the shaders read 16 bytes at a time
        for f in [
            QFormat::Q8_0,
            QFormat::Q4_0,
            QFormat::Q4_1,
            QFormat::Q2_K,
            QFormat::Q3_K,
            QFormat::Q4_K,
            QFormat::Q5_K,
            QFormat::Q6_K,
            QFormat::IQ4_NL,
        ] {
            assert_eq!(f.gpu_quant_bytes() % 16, 0, "{f}");
        }
    }

    #[test]
    fn concat_and_slice_rows_are_block_wise() {
        let x = data(7 * 256, 9);
        for f in QFormat::ALL {
            let a = QMatrix::quantize(f, 3, 256, &x[..768]).unwrap();
            let b = QMatrix::quantize(f, 4, 256, &x[768..]).unwrap();
            let all = QMatrix::quantize(f, 7, 256, &x).unwrap();
            assert_eq!(QMatrix::concat_rows(&[a.clone(), b.clone()]).unwrap(), all);
            assert_eq!(all.slice_rows(3, 4).unwrap(), b);
            assert!(all.slice_rows(5, 3).is_err());
            let other = QMatrix::quantize(f, 1, 512, &x[..512]).unwrap();
            assert!(QMatrix::concat_rows(&[a, other]).is_err());
        }
    }

    #[test]
    fn bad_shapes_and_lengths_are_errors() {
        assert!(matches!(QMatrix::from_ggml(QFormat::Q8_0, 1, 33, &[0; 34]), Err(QuantError::Cols { .. })));
        assert!(matches!(QMatrix::from_ggml(QFormat::Q4_1, 2, 32, &[0; 20]), Err(QuantError::Len { .. })));
        assert!(QMatrix::from_ggml(QFormat::Q4_0, usize::MAX / 2, 64, &[0; 18]).is_err());
        assert!(matches!(QMatrix::from_ggml(QFormat::Q4_K, 1, 128, &[0; 72]), Err(QuantError::Cols { .. })));
        assert!(matches!(QMatrix::from_ggml(QFormat::Q6_K, 1, 256, &[0; 209]), Err(QuantError::Len { .. })));
        assert!("q7_0".parse::<QFormat>().is_err());
        assert_eq!("Q4_K".parse::<QFormat>(), Ok(QFormat::Q4_K));
        assert_eq!("Q4_1".parse::<QFormat>(), Ok(QFormat::Q4_1));
    }
}
