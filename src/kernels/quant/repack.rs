//! Repacked weight layouts: a Q4_K matrix reordered at load time for the CPU's
//! int8 decode dots ([`Layout::X8`]), as llama.cpp's CPU `REPACK` buffers
//! reorder Q4_0/Q4_K rows into interleaved groups, in a layout of ours made for
//! `vpdpbusd`.
//!
//! Rows go in groups of [`X8_ROWS`]; a group's super-block column `c` (of `bpr`
//! per row) is one record of [`X8_BYTES`] bytes at `(g * bpr + c) * X8_BYTES` in
//! `quants`, and 16 f16 values at `(g * bpr + c) * 16` in `scales`:
//! - `scales`: `d` of rows 0..8, then `dmin` of rows 0..8;
//! - bytes `0..64`: the 6-bit scale of sub-block `j` of row `i` at `8 j + i`;
//! - bytes `64..128`: the 6-bit minimum of sub-block `j` of row `i` at `64 + 8 j + i`;
//! - bytes `128..1152`: the codes. Q4_K keeps in byte `32 p + l` of a row the codes
//!   of elements `64 p + l` (low nibble) and `64 p + 32 + l` (high nibble); the
//!   record puts the 4 bytes `32 p + 4 t ..` of row `i` at `128 + 32 (8 p + t) + 4 i`,
//!   so one 32-byte load holds, in 32-bit lane `i`, four codes of row `i` (low
//!   nibbles: sub-block `2 p`, high: `2 p + 1`), and one `vpdpbusd` against four
//!   broadcast activations gives the 8 rows' partial sums side by side.
//!
//! The record is 32 bytes larger than the 8 blocks it holds (the scales and minima
//! unpacked from 12 bytes to 16); a dot pays no per-row unpacking, horizontal sum
//! or scale conversion for it. The repack is lossless: [`gather_x8`] gives back
//! each block in the split form, bit for bit (tests below).

use half::f16;

use super::{Layout, QFormat, QMatrix, QView, scales_mins_k4};

/// The block formats with a repacked CPU layout (the profile's `execution.cpuRepack`).
pub const REPACKABLE: [QFormat; 1] = [QFormat::Q4_K];

/// Rows interleaved in one [`Layout::X8`] record.
pub const X8_ROWS: usize = 8;
/// Bytes of one [`Layout::X8`] record in `quants` (8 rows' super-blocks).
pub const X8_BYTES: usize = 1152;
/// Bytes of a Q4_K block in the split layout (less `d`, `dmin`): 12 scale bytes, 128 code bytes.
const Q4K_QB: usize = 140;

/// The 12 packed scale bytes of a Q4_K block from its eight 6-bit scales (bytes
/// 0..8) and minima (8..16): the inverse of [`scales_mins_k4`].
pub fn pack_scales_mins_k4(sm: &[u8; 16]) -> [u8; 12] {
    let (sc, mn) = (&sm[..8], &sm[8..]);
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
    }
    q
}

impl QMatrix {
    /// Whether [`QMatrix::repack_x8`] applies: Q4_K in rows, whole groups of 8 rows.
    pub fn can_repack_x8(&self) -> bool {
        self.format == QFormat::Q4_K && self.layout == Layout::Rows && self.rows.is_multiple_of(X8_ROWS) && self.rows > 0
    }

    /// This matrix in [`Layout::X8`] (itself, cloned, when [`QMatrix::can_repack_x8`] is false).
    pub fn repack_x8(&self) -> QMatrix {
        if !self.can_repack_x8() {
            return self.clone();
        }
        let bpr = self.blocks_per_row();
        let groups = self.rows / X8_ROWS;
        let mut quants = vec![0u8; groups * bpr * X8_BYTES];
        let mut scales = vec![f16::ZERO; groups * bpr * 2 * X8_ROWS];
        for g in 0..groups {
            for c in 0..bpr {
                let rec = &mut quants[(g * bpr + c) * X8_BYTES..][..X8_BYTES];
                let sc = &mut scales[(g * bpr + c) * 2 * X8_ROWS..][..2 * X8_ROWS];
                for i in 0..X8_ROWS {
                    let b = (g * X8_ROWS + i) * bpr + c;
                    let q = &self.quants[b * Q4K_QB..(b + 1) * Q4K_QB];
                    (sc[i], sc[X8_ROWS + i]) = (self.scales[2 * b], self.scales[2 * b + 1]);
                    let sm = scales_mins_k4(&q[..12]);
                    for j in 0..8 {
                        rec[8 * j + i] = sm[j];
                        rec[64 + 8 * j + i] = sm[8 + j];
                    }
                    for p in 0..4 {
                        for t in 0..8 {
                            let dst = 128 + 32 * (8 * p + t) + 4 * i;
                            rec[dst..dst + 4].copy_from_slice(&q[12 + 32 * p + 4 * t..][..4]);
                        }
                    }
                }
            }
        }
        QMatrix { format: self.format, rows: self.rows, cols: self.cols, quants, scales, layout: Layout::X8 { bpr } }
    }

    /// This matrix in [`Layout::Rows`] (a clone when it already is).
    pub fn to_rows(&self) -> QMatrix {
        if self.layout == Layout::Rows {
            return self.clone();
        }
        let v = self.view();
        let (qb, ns) = (self.format.quant_bytes(), self.format.scales_per_block());
        let mut quants = Vec::with_capacity(self.blocks() * qb);
        let mut scales = Vec::with_capacity(self.blocks() * ns);
        for b in 0..self.blocks() {
            v.with_block(b, |q, s| {
                quants.extend_from_slice(q);
                scales.extend_from_slice(s);
            });
        }
        QMatrix { format: self.format, rows: self.rows, cols: self.cols, quants, scales, layout: Layout::Rows }
    }
}

/// Row `i`'s 32 Q4_K code bytes of sub-block pair `p` from an X8 record, in the
/// split layout's order (byte `l`: element `64 p + l` low, `64 p + 32 + l` high).
#[inline]
pub fn x8_row_codes(rec: &[u8], i: usize, p: usize) -> [u8; 32] {
    let mut q = [0u8; 32];
    for t in 0..8 {
        q[4 * t..4 * t + 4].copy_from_slice(&rec[128 + 32 * (8 * p + t) + 4 * i..][..4]);
    }
    q
}

/// Row `i`'s 6-bit scale and minimum of sub-block `j` from an X8 record.
#[inline]
pub fn x8_scale_min(rec: &[u8], i: usize, j: usize) -> (u8, u8) {
    (rec[8 * j + i], rec[64 + 8 * j + i])
}

/// Block `c` of row `r` of a [`Layout::X8`] view in the split form (140 quant
/// bytes; `d`, `dmin`).
pub(super) fn gather_x8(w: &QView<'_>, r: usize, c: usize, bpr: usize) -> ([u8; Q4K_QB], [f16; 2]) {
    let (g, i) = (r / X8_ROWS, r % X8_ROWS);
    let rec = &w.quants[(g * bpr + c) * X8_BYTES..][..X8_BYTES];
    let sc = &w.scales[(g * bpr + c) * 2 * X8_ROWS..][..2 * X8_ROWS];
    let mut sm = [0u8; 16];
    for j in 0..8 {
        (sm[j], sm[8 + j]) = x8_scale_min(rec, i, j);
    }
    let mut q = [0u8; Q4K_QB];
    q[..12].copy_from_slice(&pack_scales_mins_k4(&sm));
    for p in 0..4 {
        q[12 + 32 * p..][..32].copy_from_slice(&x8_row_codes(rec, i, p));
    }
    (q, [sc[i], sc[X8_ROWS + i]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q4k(rows: usize, cols: usize, seed: u64) -> QMatrix {
        QMatrix::quantize(QFormat::Q4_K, rows, cols, &crate::kernels::cpu::testdata::signed(rows * cols, seed)).unwrap()
    }

    #[test]
    fn packed_scales_round_trip_every_value() {
        // Every 6-bit value in every position, against ggml's unpacking.
        for v in 0..64u8 {
            for pos in 0..16 {
                let mut sm: [u8; 16] = std::array::from_fn(|i| ((i as u8 * 7) + v) & 63);
                sm[pos] = v;
                assert_eq!(scales_mins_k4(&pack_scales_mins_k4(&sm)), sm);
            }
        }
    }

    #[test]
    fn x8_repack_is_lossless_and_other_matrices_stay_rows() {
        let m = q4k(24, 512, 7);
        let x = m.repack_x8();
        assert_eq!(x.layout, Layout::X8 { bpr: 2 });
        assert_eq!(x.quants.len(), 3 * 2 * X8_BYTES);
        assert_ne!(x.quants, m.quants);
        assert_eq!(x.to_rows(), m);
        assert_eq!(x.to_ggml(), m.to_ggml());
        let (mut a, mut b) = (vec![0f32; 24 * 512], vec![0f32; 24 * 512]);
        m.view().dequantize_into(&mut a);
        x.view().dequantize_into(&mut b);
        assert_eq!(a, b);
        assert_eq!(x.view().get(5 * 512 + 300), m.view().get(5 * 512 + 300));
        // Not 8 rows a group, or not Q4_K: unchanged.
        assert_eq!(q4k(12, 256, 1).repack_x8().layout, Layout::Rows);
        let q8 = QMatrix::quantize(QFormat::Q8_0, 8, 64, &[0.5; 512]).unwrap();
        assert_eq!(q8.repack_x8(), q8);
    }
}
