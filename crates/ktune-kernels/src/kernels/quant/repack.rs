//! Repacked weight layouts: Q4_K, Q4_0, Q8_0, IQ4_NL and Q6_K matrices
//! reordered at load time for the CPU's int8 decode dots ([`Layout::X8`]), as
//! llama.cpp's CPU `REPACK` buffers reorder Q4_0/Q8_0/Q4_K/IQ4_NL rows into
//! interleaved groups, in a layout of ours made for `vpdpbusd`.
//!
//! Rows go in groups of [`X8_ROWS`]; a group's block column `c` (of `bpr` per
//! row) is one record of [`x8_record_bytes`] bytes at `(g * bpr + c) * bytes` in
//! `quants`, and its 8 rows' 16-bit header fields at `(g * bpr + c) * 8 * ns` in
//! `scales` (`ns` fields a block: field `f` of row `i` at `8 f + i`, so one F16C
//! conversion widens a field of the 8 rows into 8 lanes). A group's records are
//! consecutive, so the 8 rows stream front to back together. In every format a
//! record keeps the code bytes in 4-byte runs: run `t` of row `i` (the block's
//! code bytes `4 t..4 t + 4` in the split layout) at `codes + 32 t + 4 i`, so one
//! 32-byte load holds, in 32-bit lane `i`, four code bytes of row `i`, and one
//! `vpdpbusd` against four broadcast activations gives the 8 rows' partial sums
//! side by side.
//!
//! - Q4_K ([`X8_BYTES`] = 1152 bytes a record, one super-block column):
//!   `scales`: `d` of rows 0..8, then `dmin` of rows 0..8; bytes `0..64`: the 6-bit
//!   scale of sub-block `j` of row `i` at `8 j + i`; bytes `64..128`: the 6-bit
//!   minimum at `64 + 8 j + i`; bytes `128..1152`: the 32 runs of the 128 code
//!   bytes (byte `32 p + l` of a row holds elements `64 p + l`, low nibble, and
//!   `64 p + 32 + l`, high), so a load's low nibbles are 4 codes of sub-block
//!   `2 p` and its high ones of `2 p + 1`. The record is 32 bytes larger than the
//!   8 blocks it holds (the scales and minima unpacked from 12 bytes to 16).
//! - Q4_0 and IQ4_NL (128 bytes, one 32-element block column): `scales`: `d` of
//!   rows 0..8; the 4 runs of a row's 16 code bytes (byte `l`: element `l` low
//!   nibble, `l + 16` high): load `t`'s low nibbles are elements `4 t..4 t + 4` of
//!   each row, its high ones `16 + 4 t..`. Q4_0's nibbles stay unsigned (its `-8`
//!   enters through the activations' block sums, as the row int8 dots take it);
//!   IQ4_NL's go through the non-linear table (`vpshufb`) first.
//! - Q8_0 (256 bytes, one block column): `scales`: `d` of rows 0..8; the 8 runs of
//!   a row's 32 signed codes (load `t`: elements `4 t..4 t + 4`).
//! - Q6_K ([`X8_K6_BYTES`] = 1664 bytes, one super-block column, no bytes
//!   added): `scales`: `d` of rows 0..8; bytes `0..128`: the int8 scale of
//!   16-element group `g` of row `i` at `8 g + i`; bytes `128..1664`: the 48 runs
//!   of a row's 192 code bytes in ggml's order (`ql`, 128 bytes, then `qh`, 64),
//!   so for half `h` of the super-block and `t < 8` the runs `16 h + t` and
//!   `16 h + 8 + t` (`ql`) and `32 + 8 h + t` (`qh`) hold elements
//!   `128 h + 32 s + 4 t..+4` of each row for `s = 0..4`: the low nibbles of
//!   the first two and the high nibbles of both, each with its pair of `qh`
//!   bits (bits `2 s`), in 6-bit unsigned codes (the `-32` enters through the
//!   activations' sums per 16).
//!
//! A record of the 32-element formats is one block column and not several: a
//! group's columns lie one after another either way, so grouping 4 or 8 columns
//! into a record would give the same bytes in the same order (the scales live in
//! their own buffer) and only add a column-count condition; one column a record
//! repacks every matrix of whole 8-row groups. The repacks add no bytes there.
//!
//! A dot pays no per-row unpacking, horizontal sum or scale conversion for the
//! layout. The repack is lossless: [`gather_x8`] gives back each block in the
//! split form, bit for bit (tests below).

use half::f16;

use super::block::X8;
use super::{Layout, QFormat, QMatrix, QView, scales_mins_k4};

/// The block formats with a repacked CPU layout (the profile's `execution.cpuRepack`),
/// the formats whose type names an [`X8`] layout, in the order the tuner numbers
/// them (its repack bits).
pub const REPACKABLE: [QFormat; 5] = [QFormat::Q4_K, QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL, QFormat::Q6_K];

/// The longest matrix row (`max(hidden, intermediate)`) at which the runtime
/// repacks Q4_0 without a profile ([`default_repack`]).
pub const DEFAULT_REPACK_MAX_ROW: usize = 1536;

/// The formats a CPU engine repacks when no profile says, by the CPU's
/// instruction set (`avx2`: AVX2 + FMA + F16C; `vnni`: AVX-512 VNNI as well).
///
/// With AVX-512 VNNI: Q4_0 among `formats` into [`Layout::X8`], for a model
/// whose every matrix row is at most [`DEFAULT_REPACK_MAX_ROW`] values long;
/// nothing otherwise. Measured on a 2-core EPYC (Zen 4), `run --no-profile`,
/// 64 + 64 tokens, builds alternated: SmolLM2-135M Q4_0 (rows of 576 and 1536)
/// decodes 13-30% faster with X8 Q4_0 (3 of 3 pairs), the same file with its
/// Q8_0 matrix repacked too no faster, and the SmolLM2 Q8_0 file 3-5% slower
/// with X8 Q8_0 (3 of 3); the Llama-3.2-1B-shaped Q8_0 file (rows of 2048 and
/// 8192) decoded 23% faster in rows than in X8. Q4_K and IQ4_NL stay in rows
/// (X8 Q4_K did not win end to end there). An engine that decodes batches
/// (`batches`: several sequences a pass, `serve --parallel`) repacks every
/// format with an X8 layout among `formats`, whatever the rows' length: its
/// batched decode dots (`gemm_q_dots_cpu` over X8 records) decode each record
/// once for a few tokens and give each its lone decode's values (measured in
/// docs/serve.md: 2 to 6 sequences faster than the int8 GEMM; one token's dots
/// within 2% and the prefill's GEMM no slower over X8 records than over rows).
///
/// With AVX2 and no VNNI (`maddubs` + `madd` for `vpdpbusd`), every format with
/// an X8 layout among `formats` but Q6_K, any row length (Q6_K too in batches;
/// its lone decode over records is not measured on an AVX2-only CPU): the row
/// dots' per-row horizontal sums and scale conversions cost there what the
/// records save. Measured on a 2-core EPYC 7001 (Zen 1, AVX2 only), `run
/// --no-profile`, 64 tokens, three alternated pairs, tok/s: SmolLM2-135M Q4_0
/// 62-67 in rows, 83-106 with X8 Q4_0 (its Q8_0 matrix in X8 too: 95-135);
/// the Q8_0 file 60-62 -> 71-95; the IQ4_NL file 40-62 -> 75-96; the
/// Llama-3.2-1B-shaped Q4_K_M file 11.0-11.6 -> 13.5-14.3 (its Q6_K matrices
/// stay in rows). The tuner's runtime-default combination repacks the same, so
/// a default that wins is recorded as it ran. Nothing without AVX2 (the
/// portable loops over records are no faster than over rows).
pub fn default_repack(avx2: bool, vnni: bool, longest_row: usize, formats: &[QFormat], batches: bool) -> Vec<QFormat> {
    let every = || REPACKABLE.into_iter().filter(|f| formats.contains(f)).collect();
    if !avx2 {
        return Vec::new();
    }
    if batches {
        return every();
    }
    if !vnni {
        return REPACKABLE.into_iter().filter(|f| formats.contains(f) && *f != QFormat::Q6_K).collect();
    }
    if longest_row > DEFAULT_REPACK_MAX_ROW {
        return Vec::new();
    }
    [QFormat::Q4_0].into_iter().filter(|f| formats.contains(f)).collect()
}

/// Rows interleaved in one [`Layout::X8`] record.
pub const X8_ROWS: usize = 8;
/// Bytes of one Q4_K [`Layout::X8`] record in `quants` (8 rows' super-blocks).
pub const X8_BYTES: usize = 1152;
/// Bytes of one Q6_K [`Layout::X8`] record in `quants` (8 rows' super-blocks).
pub const X8_K6_BYTES: usize = 1664;
/// Bytes of the longest repackable block in the split layout (Q6_K's, less
/// `d`: 128 + 64 code bytes, 16 scales).
const MAX_QB: usize = 208;

/// Bytes of one [`Layout::X8`] record of `format` in `quants`: 8 rows' blocks of
/// one column (Q4_K's with its scales and minima unpacked).
pub fn x8_record_bytes(format: QFormat) -> usize {
    if k4(format) { X8_BYTES } else { X8_ROWS * format.quant_bytes() }
}

/// Whether the format's records are [`X8::K4`]'s (scales and minima unpacked).
#[inline]
fn k4(format: QFormat) -> bool {
    format.ops().cpu.x8 == Some(X8::K4)
}

/// Where a block's code bytes lie: their offset in the split form, their count,
/// and the offset of their runs in an X8 record.
fn x8_codes(format: QFormat) -> (usize, usize, usize) {
    match format.ops().cpu.x8 {
        Some(X8::K4) => (12, 128, 128),
        Some(X8::K6) => (0, 192, 128),
        _ => (0, format.quant_bytes(), 0),
    }
}

/// A K-quant block's (split form `q`) 16 header bytes into row `i` of its X8
/// record, side by side with the other rows' (byte `k` at `8 k + i`): Q4_K's
/// six-bit scales and minima unpacked from their 12 bytes, Q6_K's int8 scales
/// as they are. Nothing for the 32-element formats (their header is the f16
/// `d` alone, in `scales`).
fn header_into_record(format: QFormat, q: &[u8], rec: &mut [u8], i: usize) {
    let h: [u8; 16] = match format.ops().cpu.x8 {
        Some(X8::K4) => scales_mins_k4(&q[..12]),
        Some(X8::K6) => std::array::from_fn(|k| q[192 + k]),
        _ => return,
    };
    for (k, v) in h.into_iter().enumerate() {
        rec[8 * k + i] = v;
    }
}

/// [`header_into_record`]'s inverse: row `i`'s header bytes from the record
/// into the split block `q`.
fn header_from_record(format: QFormat, rec: &[u8], i: usize, q: &mut [u8]) {
    let h = || -> [u8; 16] { std::array::from_fn(|k| rec[8 * k + i]) };
    match format.ops().cpu.x8 {
        Some(X8::K4) => q[..12].copy_from_slice(&pack_scales_mins_k4(&h())),
        Some(X8::K6) => q[192..208].copy_from_slice(&h()),
        _ => {}
    }
}

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
    /// Whether [`QMatrix::repack_x8`] applies: a format of [`REPACKABLE`] in rows,
    /// whole groups of 8 rows.
    pub fn can_repack_x8(&self) -> bool {
        self.format.ops().cpu.x8.is_some() && self.layout == Layout::Rows && self.rows.is_multiple_of(X8_ROWS) && self.rows > 0
    }

    /// This matrix in [`Layout::X8`] (itself, cloned, when [`QMatrix::can_repack_x8`] is false).
    pub fn repack_x8(&self) -> QMatrix {
        if !self.can_repack_x8() {
            return self.clone();
        }
        let bpr = self.blocks_per_row();
        let groups = self.rows / X8_ROWS;
        let (qb, ns, rb) = (self.format.quant_bytes(), self.format.scales_per_block(), x8_record_bytes(self.format));
        let (src, len, dst) = x8_codes(self.format);
        use crate::kernels::memory::huge_filled;
        let mut quants = huge_filled(groups * bpr * rb, 0u8);
        let mut scales = huge_filled(groups * bpr * ns * X8_ROWS, f16::ZERO);
        for g in 0..groups {
            for c in 0..bpr {
                let rec = &mut quants[(g * bpr + c) * rb..][..rb];
                let sc = &mut scales[(g * bpr + c) * ns * X8_ROWS..][..ns * X8_ROWS];
                for i in 0..X8_ROWS {
                    let b = (g * X8_ROWS + i) * bpr + c;
                    let q = &self.quants[b * qb..(b + 1) * qb];
                    for f in 0..ns {
                        sc[f * X8_ROWS + i] = self.scales[ns * b + f];
                    }
                    header_into_record(self.format, q, rec, i);
                    for t in 0..len / 4 {
                        let at = dst + 32 * t + 4 * i;
                        rec[at..at + 4].copy_from_slice(&q[src + 4 * t..][..4]);
                    }
                }
            }
        }
        QMatrix { format: self.format, rows: self.rows, cols: self.cols, quants, scales, layout: Layout::X8 { bpr } }
    }

    /// This matrix in the layout a CPU engine that repacks `formats` keeps it
    /// in: X8 records where its format is one of them and
    /// [`QMatrix::can_repack_x8`]; None where it stays as it is.
    pub fn repacked_in(&self, formats: &[QFormat]) -> Option<QMatrix> {
        (formats.contains(&self.format) && self.can_repack_x8()).then(|| self.repack_x8())
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

/// Row `i`'s code bytes from the runs at `at` of an X8 record into `out` (whose
/// length, a multiple of 4, says how many): the split layout's order.
#[inline]
pub fn x8_row_runs(rec: &[u8], i: usize, at: usize, out: &mut [u8]) {
    for (t, o) in out.chunks_exact_mut(4).enumerate() {
        o.copy_from_slice(&rec[at + 32 * t + 4 * i..][..4]);
    }
}

/// Row `i`'s 32 Q4_K code bytes of sub-block pair `p` from an X8 record, in the
/// split layout's order (byte `l`: element `64 p + l` low, `64 p + 32 + l` high).
#[inline]
pub fn x8_row_codes(rec: &[u8], i: usize, p: usize) -> [u8; 32] {
    let mut q = [0u8; 32];
    x8_row_runs(rec, i, 128 + 256 * p, &mut q);
    q
}

/// Row `i`'s 6-bit scale and minimum of sub-block `j` from a Q4_K X8 record.
#[inline]
pub fn x8_scale_min(rec: &[u8], i: usize, j: usize) -> (u8, u8) {
    (rec[8 * j + i], rec[64 + 8 * j + i])
}

/// Row `i`'s 6-bit Q6_K code of element `e` (0..256) from an X8 record.
#[inline]
pub fn x8_k6_code(rec: &[u8], i: usize, e: usize) -> u8 {
    let (h, s, t, l) = (e / 128, e % 128 / 32, e % 32 / 4, e % 4);
    let lo = (rec[128 + 32 * (16 * h + 8 * (s % 2) + t) + 4 * i + l] >> (4 * (s / 2))) & 0x0f;
    let hi = (rec[128 + 32 * (32 + 8 * h + t) + 4 * i + l] >> (2 * s)) & 3;
    lo | (hi << 4)
}

/// Row `i`'s int8 scale of 16-element group `g` from a Q6_K X8 record.
#[inline]
pub fn x8_k6_scale(rec: &[u8], i: usize, g: usize) -> i8 {
    rec[8 * g + i] as i8
}

/// Block `c` of row `r` of a [`Layout::X8`] view in the split form: the quant
/// bytes (the first `quant_bytes` of the array) and the header fields (the first
/// `scales_per_block`).
pub(super) fn gather_x8(w: &QView<'_>, r: usize, c: usize, bpr: usize) -> ([u8; MAX_QB], [f16; 2]) {
    let (g, i) = (r / X8_ROWS, r % X8_ROWS);
    let (ns, rb) = (w.format.scales_per_block(), x8_record_bytes(w.format));
    let rec = &w.quants[(g * bpr + c) * rb..][..rb];
    let sc = &w.scales[(g * bpr + c) * ns * X8_ROWS..][..ns * X8_ROWS];
    let mut q = [0u8; MAX_QB];
    let mut s = [f16::ZERO; 2];
    for (f, o) in s.iter_mut().enumerate().take(ns) {
        *o = sc[f * X8_ROWS + i];
    }
    header_from_record(w.format, rec, i, &mut q);
    let (src, len, at) = x8_codes(w.format);
    x8_row_runs(rec, i, at, &mut q[src..src + len]);
    (q, s)
}

#[cfg(test)]
mod tests {
    /// The tuner's numbered list of repackable formats holds exactly the formats
    /// whose type names a repacked layout.
    #[test]
    fn repackable_lists_the_formats_with_an_x8_layout() {
        use super::{QFormat, REPACKABLE};
        use std::collections::BTreeSet;
        let with_x8: BTreeSet<QFormat> = QFormat::ALL.into_iter().filter(|f| f.ops().cpu.x8.is_some()).collect();
        let listed: BTreeSet<QFormat> = REPACKABLE.iter().copied().collect();
        assert_eq!(listed.len(), REPACKABLE.len(), "a format listed twice");
        assert_eq!(listed, with_x8);
    }

    /// The runtime's default repack: on a VNNI CPU Q4_0 of a short-row model,
    /// nothing for long rows or other formats, an engine decoding batches every
    /// repackable format; with AVX2 alone every repackable format; nothing
    /// without AVX2.
    #[test]
    fn default_repack_follows_the_instruction_set() {
        use super::{DEFAULT_REPACK_MAX_ROW, QFormat, default_repack};
        let all = [QFormat::Q4_K, QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL, QFormat::Q6_K];
        let x8 = vec![QFormat::Q4_K, QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL];
        let x8_all = vec![QFormat::Q4_K, QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL, QFormat::Q6_K];
        assert_eq!(default_repack(true, true, 1536, &all, false), vec![QFormat::Q4_0]);
        assert!(default_repack(true, true, 576, &[QFormat::Q8_0, QFormat::Q6_K], false).is_empty());
        assert!(default_repack(true, true, DEFAULT_REPACK_MAX_ROW + 1, &all, false).is_empty());
        assert!(default_repack(true, true, 8192, &all, false).is_empty());
        assert!(default_repack(true, true, 576, &[QFormat::Q4_K, QFormat::IQ4_NL], false).is_empty());
        // An engine decoding batches: every repackable format present, any row length.
        assert_eq!(
            default_repack(true, true, 8192, &[QFormat::Q6_K, QFormat::Q4_K, QFormat::Q8_0, QFormat::Q4_1], true),
            vec![QFormat::Q4_K, QFormat::Q8_0, QFormat::Q6_K]
        );
        // AVX2 without VNNI: every repackable format present, any row length;
        // Q6_K only in batches.
        assert_eq!(default_repack(true, false, 8192, &all, false), x8);
        assert_eq!(default_repack(true, false, 8192, &all, true), x8_all);
        assert_eq!(default_repack(true, false, 576, &[QFormat::Q6_K, QFormat::Q8_0], false), vec![QFormat::Q8_0]);
        assert_eq!(default_repack(true, false, 576, &[QFormat::Q6_K, QFormat::Q8_0], true), vec![QFormat::Q8_0, QFormat::Q6_K]);
        for batches in [false, true] {
            assert!(default_repack(true, false, 576, &[QFormat::Q5_K, QFormat::Q4_1], batches).is_empty());
            // No AVX2: nothing.
            assert!(default_repack(false, false, 576, &all, batches).is_empty());
        }
    }

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
        // Not 8 rows a group, or a format without a repacked layout: unchanged.
        assert_eq!(q4k(12, 256, 1).repack_x8().layout, Layout::Rows);
        let q5 = QMatrix::quantize(QFormat::Q5_K, 8, 256, &crate::kernels::cpu::testdata::signed(8 * 256, 2)).unwrap();
        assert!(!q5.can_repack_x8());
        assert_eq!(q5.repack_x8(), q5);
    }

    /// Q6_K's records: no bytes added, lossless, the scales side by side and
    /// every element's 6-bit code where [`x8_k6_code`] reads it.
    #[test]
    fn x8_repack_of_q6k_is_lossless_and_reads_each_code() {
        let (rows, cols) = (16, 512);
        let m = QMatrix::quantize(QFormat::Q6_K, rows, cols, &crate::kernels::cpu::testdata::signed(rows * cols, 9)).unwrap();
        let x = m.repack_x8();
        assert_eq!(x.layout, Layout::X8 { bpr: 2 });
        assert_eq!((x.quants.len(), x.scales.len()), (m.quants.len(), m.scales.len()), "no bytes added");
        assert_eq!(x8_record_bytes(QFormat::Q6_K), X8_K6_BYTES);
        assert_eq!(x.to_rows(), m);
        assert_eq!(x.to_ggml(), m.to_ggml());
        let (mut a, mut b) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
        m.view().dequantize_into(&mut a);
        x.view().dequantize_into(&mut b);
        assert_eq!(a, b);
        let mut vals = [0i8; 256];
        for r in 0..rows {
            for c in 0..2 {
                let (g, i) = (r / X8_ROWS, r % X8_ROWS);
                let rec = &x.quants[(g * 2 + c) * X8_K6_BYTES..][..X8_K6_BYTES];
                let (q, _) = m.view().block(r * 2 + c);
                <crate::kernels::quant::block::kquant::BlockQ6K as crate::kernels::quant::block::BlockFormat>::unpack_vals(q, &mut vals);
                for (e, &v) in vals.iter().enumerate() {
                    assert_eq!(x8_k6_code(rec, i, e) as i32 - 32, v as i32, "row {r} column {c} element {e}");
                }
                for grp in 0..16 {
                    assert_eq!(x8_k6_scale(rec, i, grp), q[192 + grp] as i8);
                }
            }
        }
    }

    #[test]
    fn x8_repack_of_the_32_element_formats_is_lossless_and_interleaves_by_runs() {
        for format in [QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL] {
            let (rows, cols) = (16, 96);
            let m = QMatrix::quantize(format, rows, cols, &crate::kernels::cpu::testdata::signed(rows * cols, 5)).unwrap();
            assert!(m.can_repack_x8(), "{format}");
            let x = m.repack_x8();
            let qb = format.quant_bytes();
            assert_eq!(x.layout, Layout::X8 { bpr: 3 }, "{format}");
            assert_eq!((x.quants.len(), x.scales.len()), (m.quants.len(), m.scales.len()), "{format}: no bytes added");
            assert_eq!(x8_record_bytes(format), 8 * qb);
            assert_ne!(x.quants, m.quants, "{format}");
            // Record (group 1, column 2): run t of row i at 32 t + 4 i, the 8 rows' d side by side.
            let rec = &x.quants[(3 + 2) * 8 * qb..][..8 * qb];
            for i in 0..8 {
                let b = (8 + i) * 3 + 2;
                for t in 0..qb / 4 {
                    assert_eq!(rec[32 * t + 4 * i..][..4], m.quants[b * qb + 4 * t..][..4], "{format} row {i} run {t}");
                }
                assert_eq!(x.scales[(3 + 2) * 8 + i].to_bits(), m.scales[b].to_bits());
            }
            assert_eq!(x.to_rows(), m, "{format}");
            assert_eq!(x.to_ggml(), m.to_ggml(), "{format}");
            let (mut a, mut b) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
            m.view().dequantize_into(&mut a);
            x.view().dequantize_into(&mut b);
            assert_eq!(a, b, "{format}");
            assert_eq!(x.view().blocks(), m.blocks());
            assert_eq!(x.view().get(13 * cols + 70), m.view().get(13 * cols + 70));
        }
        // Q8_0's codes go through as they are (signed, -128 included).
        let mut m = QMatrix::quantize(QFormat::Q8_0, 8, 32, &crate::kernels::cpu::testdata::signed(256, 1)).unwrap();
        m.quants[5] = 0x80;
        assert_eq!(m.repack_x8().to_rows(), m);
    }
}
