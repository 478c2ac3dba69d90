//! Row blocks of one matrix, each in its own block format: the fused Q/K/V or
//! gate/up weight of a file that stores its parts differently (a published Q4_K_M
//! keeps some layers' `attn_v` in Q6_K or Q8_0 beside Q4_K or Q5_0 queries and
//! keys). A fused kernel that takes per-operand formats reads such a stack in one
//! dispatch: [`RowFormats`] is what its problem says of the weight, [`QStack`] the
//! host's copy, [`StackLayout`] the one GPU buffer both agree on.
//!
//! The GPU layout keeps the single-buffer layout of [`QFormat::layout`] (all quants,
//! then the 256-byte aligned scales) and gives each part a *base block*: the part's
//! blocks are numbered from it in both regions, so a shader reaches block `b` of
//! part `s` as block `base_s + b` of the part's format (`wq[(base_s + b) * qwpb]`,
//! `ws[(base_s + b) * qspb]`), exactly as it reaches a uniform matrix's blocks. A
//! base is the first block of its format past the end of the part before in both
//! regions, so the parts never overlap (the gap is at most one block of each).

use half::f16;
use serde::Serialize;

use super::{QFormat, QMatrix, QuantError, SCALES_ALIGN};

/// The most row blocks a stack holds (Q, K, V).
pub const MAX_PARTS: usize = 3;

/// The formats of a stacked weight's row blocks, in row order: `(rows, format)`
/// for each of its 2 or 3 parts (a problem's description of per-operand formats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowFormats {
    parts: [(u32, QFormat); MAX_PARTS],
    len: u8,
}

impl RowFormats {
    /// The parts' `(rows, format)`: 2 or 3 of them, each with rows, not all of one
    /// format (None otherwise: a uniform weight needs no stack).
    pub fn new(parts: &[(usize, QFormat)]) -> Option<RowFormats> {
        if !(2..=MAX_PARTS).contains(&parts.len()) || parts.iter().any(|&(r, _)| r == 0 || u32::try_from(r).is_err()) {
            return None;
        }
        if parts.iter().all(|p| p.1 == parts[0].1) {
            return None;
        }
        let mut out = RowFormats { parts: [(0, parts[0].1); MAX_PARTS], len: parts.len() as u8 };
        for (o, &(r, f)) in out.parts.iter_mut().zip(parts) {
            *o = (r as u32, f);
        }
        Some(out)
    }

    /// `(rows, format)` of each part.
    pub fn parts(&self) -> &[(u32, QFormat)] {
        &self.parts[..self.len as usize]
    }

    /// Rows of all parts.
    pub fn rows(&self) -> usize {
        self.parts().iter().map(|p| p.0 as usize).sum()
    }

    /// The largest block of the parts' formats: k must be a multiple of it.
    pub fn block_elems(&self) -> usize {
        self.parts().iter().map(|p| p.1.block_elems()).max().unwrap_or(1)
    }

    /// "q5_0 x1024 + q5_0 x256 + q8_0 x256".
    pub fn describe(&self) -> String {
        self.parts().iter().map(|(r, f)| format!("{f} x{r}")).collect::<Vec<_>>().join(" + ")
    }

    /// The GPU buffer of the stack with rows of `cols` elements.
    pub fn layout(&self, cols: usize) -> StackLayout {
        let (mut words, mut fields, mut row0) = (0usize, 0usize, 0usize);
        let mut segments = Vec::with_capacity(self.len as usize);
        for &(rows, format) in self.parts() {
            let (qwpb, qspb) = (format.gpu_quant_bytes() / 4, format.scales_per_block());
            let base = words.div_ceil(qwpb).max(fields.div_ceil(qspb));
            let blocks = rows as usize * (cols / format.block_elems());
            segments.push(Segment { row0, rows: rows as usize, format, base_block: base });
            words = (base + blocks) * qwpb;
            fields = (base + blocks) * qspb;
            row0 += rows as usize;
        }
        let quants = (words * 4).max(16).div_ceil(16) * 16;
        let scales_offset = quants.div_ceil(SCALES_ALIGN) * SCALES_ALIGN;
        let scales = (fields * 2).div_ceil(4) * 4;
        StackLayout { segments, quants, scales_offset, scales, total: scales_offset + scales.max(4).div_ceil(16) * 16 }
    }
}

/// As its description ("q5_0 x1024 + q5_0 x256 + q8_0 x256").
impl Serialize for RowFormats {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for RowFormats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// One part of a [`StackLayout`]: its rows and the block its blocks count from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub row0: usize,
    pub rows: usize,
    pub format: QFormat,
    pub base_block: usize,
}

/// A stack's GPU buffer: quants at 0, scales at `scales_offset` (256-byte
/// aligned), as a uniform matrix's ([`super::QLayout`]), each part's blocks from its
/// segment's base block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackLayout {
    pub segments: Vec<Segment>,
    /// Bytes of the quants region (a multiple of 16).
    pub quants: usize,
    pub scales_offset: usize,
    /// Bytes of the scales region (a multiple of 4).
    pub scales: usize,
    /// Bytes of the buffer (a multiple of 16).
    pub total: usize,
}

/// A matrix stacked from row blocks in different block formats (all with the
/// same columns, row-major blocks).
#[derive(Clone, Debug, PartialEq)]
pub struct QStack {
    pub parts: Vec<QMatrix>,
}

impl QStack {
    /// Stacks `parts` (2 or 3 matrices of one column count, not all of one format;
    /// repacked ones gathered back to rows).
    pub fn new(parts: Vec<QMatrix>) -> Result<QStack, QuantError> {
        let cols = parts.first().map_or(0, |p| p.cols);
        if let Some(p) = parts.iter().find(|p| p.cols != cols) {
            return Err(QuantError::Concat(format!("{} {}x{} cannot follow rows of {cols} columns", p.format, p.rows, p.cols)));
        }
        let parts: Vec<QMatrix> = parts.into_iter().map(|p| if p.layout == super::Layout::Rows { p } else { p.to_rows() }).collect();
        let stack = QStack { parts };
        stack.formats().ok_or_else(|| QuantError::Concat("a stack needs 2 or 3 row blocks of more than one format".into()))?;
        Ok(stack)
    }

    /// The parts' formats (always Some for a stack made by [`QStack::new`]).
    pub fn formats(&self) -> Option<RowFormats> {
        RowFormats::new(&self.parts.iter().map(|p| (p.rows, p.format)).collect::<Vec<_>>())
    }

    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    pub fn cols(&self) -> usize {
        self.parts.first().map_or(0, |p| p.cols)
    }

    /// Bytes the kernels read (every part's quants and scales).
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(QMatrix::bytes).sum()
    }

    /// Every element, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        self.parts.iter().flat_map(QMatrix::dequantize).collect()
    }

    /// The GPU buffer ([`RowFormats::layout`]): each part's blocks in its format's
    /// GPU block from its base block, then the scales.
    pub fn gpu_bytes(&self) -> Vec<u8> {
        let Some(formats) = self.formats() else { return Vec::new() };
        let l = formats.layout(self.cols());
        let mut out = vec![0u8; l.total];
        for (p, seg) in self.parts.iter().zip(&l.segments) {
            let (qb, gb, spb) = (p.format.quant_bytes(), p.format.gpu_quant_bytes(), p.format.scales_per_block());
            let dst = &mut out[seg.base_block * gb..][..p.blocks() * gb];
            for (src, dst) in p.quants.chunks_exact(qb).zip(dst.chunks_exact_mut(gb)) {
                p.format.gpu_block(src, dst);
            }
            let at = l.scales_offset + 2 * seg.base_block * spb;
            for (i, s) in p.scales.iter().enumerate() {
                out[at + 2 * i..][..2].copy_from_slice(&f16::to_le_bytes(*s));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(format: QFormat, rows: usize, cols: usize, seed: f32) -> QMatrix {
        let v: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        QMatrix::quantize(format, rows, cols, &v).unwrap()
    }

    /// Each part's blocks lie whole in both regions from its base, none overlaps
    /// another, and the bytes there are the part's own GPU layout.
    #[test]
    fn parts_keep_their_own_blocks() {
        let cols = 512;
        for fmts in [
            [QFormat::Q5_0, QFormat::Q5_0, QFormat::Q8_0],
            [QFormat::Q4_K, QFormat::Q4_K, QFormat::Q6_K],
            [QFormat::Q6_K, QFormat::Q4_0, QFormat::Q4_K],
        ] {
            let parts: Vec<QMatrix> = fmts.iter().zip([8, 3, 3]).enumerate().map(|(i, (&f, r))| matrix(f, r, cols, i as f32)).collect();
            let stack = QStack::new(parts.clone()).unwrap();
            let l = stack.formats().unwrap().layout(cols);
            let bytes = stack.gpu_bytes();
            assert_eq!(bytes.len(), l.total);
            assert_eq!(l.scales_offset % SCALES_ALIGN, 0);
            let mut spans: Vec<(usize, usize)> = Vec::new();
            for (p, seg) in parts.iter().zip(&l.segments) {
                let own = p.gpu_bytes();
                let pl = p.format.layout(p.blocks());
                let q = seg.base_block * p.format.gpu_quant_bytes();
                assert_eq!(&bytes[q..][..p.blocks() * p.format.gpu_quant_bytes()], &own[..p.blocks() * p.format.gpu_quant_bytes()]);
                let s = l.scales_offset + 2 * seg.base_block * p.format.scales_per_block();
                let sl = 2 * p.blocks() * p.format.scales_per_block();
                assert_eq!(&bytes[s..][..sl], &own[pl.scales_offset..][..sl]);
                assert!(q + p.blocks() * p.format.gpu_quant_bytes() <= l.quants);
                spans.push((q, q + p.blocks() * p.format.gpu_quant_bytes()));
            }
            spans.windows(2).for_each(|w| assert!(w[0].1 <= w[1].0, "{fmts:?}: {spans:?}"));
            assert_eq!(stack.dequantize(), parts.iter().flat_map(QMatrix::dequantize).collect::<Vec<_>>());
        }
    }

    #[test]
    fn uniform_parts_are_no_stack() {
        assert!(RowFormats::new(&[(4, QFormat::Q4_K), (2, QFormat::Q4_K)]).is_none());
        assert!(RowFormats::new(&[(4, QFormat::Q4_K)]).is_none());
        assert!(RowFormats::new(&[(4, QFormat::Q4_K), (0, QFormat::Q6_K)]).is_none());
        let f = RowFormats::new(&[(4, QFormat::Q4_K), (2, QFormat::Q6_K)]).unwrap();
        assert_eq!((f.rows(), f.block_elems(), f.describe().as_str()), (6, 256, "q4_k x4 + q6_k x2"));
        assert!(QStack::new(vec![matrix(QFormat::Q8_0, 2, 64, 0.0), matrix(QFormat::Q8_0, 2, 64, 1.0)]).is_err());
        assert!(QStack::new(vec![matrix(QFormat::Q8_0, 2, 64, 0.0), matrix(QFormat::Q4_0, 2, 32, 1.0)]).is_err());
    }
}
