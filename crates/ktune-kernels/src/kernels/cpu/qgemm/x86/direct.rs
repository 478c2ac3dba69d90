//! Packing without the staging rows: each 32 elements of the 16 rows of a row
//! block come from the weight's bytes straight into registers (Q8_0 codes with
//! the sign bit flipped, `+ 128`; Q4_0 / Q4_1 nibbles split; Q5_0 / Q5_1 nibbles
//! with their fifth bits from a byte mask of `qh`), then one
//! [`transpose_store`]. The panel is the one [`Panel::pack_staged`] writes, bit
//! for bit (tested; Q5_0 / Q5_1 as their 5-bit codes where the staged path has
//! `v + 128`, the same values), at one pass over the weights instead of three (unpack,
//! stage, transpose). Single thread, 256 x 2048 weights times 64 tokens
//! (`examples`-style timing of `rows_times_tokens_i8`, alternating builds):
//! Q8_0 157 -> 218 GOPS, Q4_0 205 -> 220.

use std::arch::x86_64::*;

use super::super::{Panel, QFormat, QK, QView, RB, X8_ROWS};
use super::transpose_store;

/// # Safety
/// AVX-512F/BW available; `p` sized for `rows` rows of `k` ([`Panel::pack`]);
/// `w` in rows of blocks ([`super::super::direct()`]) holding rows `r0..r0 + rows` of `k`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub unsafe fn pack(p: &mut Panel, w: QView<'_>, r0: usize, rows: usize, k: usize) {
    let format = w.format;
    let qb = format.quant_bytes();
    let per_row = k / QK;
    // The codes plus the bias the format's type names are unsigned bytes.
    p.bias = format.ops().cpu.panel.direct.map_or(0, i32::from);
    let (bias, offset) = (p.bias as f32, format.has_offset());
    assert!(w.quants.len() >= (r0 + rows) * per_row * qb && w.scales.len() >= (r0 + rows) * per_row * format.scales_per_block());
    // Scales and offsets, one per block of 32 (these formats' scale group).
    for blk in 0..p.blocks {
        for lane in 0..RB {
            let i = blk * RB + lane;
            for b in 0..per_row {
                let j = (blk * per_row + b) * RB + lane;
                (p.scale[j], p.off[j]) = if i >= rows {
                    (0.0, 0.0)
                } else {
                    let s = w.block((r0 + i) * per_row + b).1;
                    let d = s[0].to_f32();
                    // Q4_1, Q5_1: their minimum (and no bias); the others -bias · d.
                    if offset { (d, s[1].to_f32()) } else { (d, -bias * d) }
                };
            }
        }
    }
    let base = w.quants.as_ptr();
    let m4 = _mm_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(-128);
    for blk in 0..p.blocks {
        for c in 0..k / QK {
            // Elements 32c.. of row `lane` of the block as 32 unsigned bytes.
            let row = |lane: usize| -> __m256i {
                let i = blk * RB + lane;
                if i >= rows {
                    return _mm256_setzero_si256();
                }
                let r = r0 + i;
                // SAFETY: block (r, c) of w (asserted above); each read stays
                // inside that block's quant bytes.
                unsafe {
                    let blk = base.add((r * per_row + c) * qb);
                    match format {
                        QFormat::Q8_0 => _mm256_xor_si256(_mm256_loadu_si256(blk as *const __m256i), flip),
                        QFormat::Q4_0 | QFormat::Q4_1 => nibbles(blk, m4),
                        _ => {
                            // Q5_0 / Q5_1: `qh` (bit e: element e's fifth bit), then the nibbles.
                            let qh = (blk as *const u32).read_unaligned();
                            _mm256_or_si256(nibbles(blk.add(4), m4), _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)))
                        }
                    }
                }
            };
            let z: [__m512i; 8] = std::array::from_fn(|i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(i)), row(i + 8)));
            // SAFETY: 512 bytes of the panel's block `blk` at elements 32c.
            unsafe { transpose_store(z, p.vals.as_mut_ptr().add(blk * k * RB + RB * QK * c)) };
        }
    }
}

/// [`pack`] from Q4_0 / Q8_0 [`Layout::X8`](crate::kernels::quant::Layout::X8) records: a
/// record's run `t` is 4 code bytes of each of its 8 rows side by side, so two
/// records (rows 0..8 and 8..16 of a row block) give the panel's run of the 16
/// rows by two 32-byte loads, no transpose (Q4_0: runs `t` and `t + 4` from
/// the low and high nibbles; Q8_0: the sign bit flipped).
///
/// # Safety
/// AVX-512F/BW available; `p` sized for `rows` rows of `k`; `w` X8 with
/// `k / 32` records a group, holding rows `r0..r0 + rows` (`r0` a multiple of 8).
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub unsafe fn pack_x8(p: &mut Panel, w: QView<'_>, r0: usize, rows: usize, k: usize) {
    let format = w.format;
    let bpr = k / QK;
    let rec = crate::kernels::quant::x8_record_bytes(format);
    let g0 = r0 / X8_ROWS;
    let groups_here = rows.div_ceil(X8_ROWS);
    assert!(w.quants.len() >= (g0 + groups_here) * bpr * rec && w.scales.len() >= (g0 + groups_here) * bpr * X8_ROWS);
    p.bias = format.ops().cpu.panel.direct.map_or(0, i32::from);
    let off_k = p.bias as f32;
    let base = w.quants.as_ptr();
    let m4 = _mm512_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(-128);
    for blk in 0..p.blocks {
        // The two 8-row groups of this row block (the second may lie past `rows`).
        let ga = 2 * blk;
        let has_b = 2 * blk + 1 < groups_here;
        for c in 0..bpr {
            for lane in 0..RB {
                let (gi, i) = (ga + lane / X8_ROWS, lane % X8_ROWS);
                let j = (blk * bpr + c) * RB + lane;
                (p.scale[j], p.off[j]) = if blk * RB + lane < rows {
                    let d = w.scales[((g0 + gi) * bpr + c) * X8_ROWS + i].to_f32();
                    (d, -off_k * d)
                } else {
                    (0.0, 0.0)
                };
            }
            // SAFETY: records (g0 + ga, c) and (g0 + ga + 1, c) lie inside
            // `quants` (asserted; the second only when it exists); 512 panel
            // bytes of block `blk` at group c.
            unsafe {
                let ra = base.add(((g0 + ga) * bpr + c) * rec);
                let rb = base.add(((g0 + ga + 1) * bpr + c) * rec);
                let dst = p.vals.as_mut_ptr().add(blk * k * RB + RB * QK * c);
                // Run t of both groups (Q8_0: sign bits flipped); rows past the
                // last group are zeros, as the staged packing leaves them.
                let run = |t: usize| -> __m512i {
                    let q8 = format == QFormat::Q8_0;
                    let load = |r: *const u8| {
                        let v = _mm256_loadu_si256(r.add(32 * t) as *const __m256i);
                        if q8 { _mm256_xor_si256(v, flip) } else { v }
                    };
                    let b = if has_b { load(rb) } else { _mm256_setzero_si256() };
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load(ra)), b)
                };
                if format == QFormat::Q8_0 {
                    for t in 0..8 {
                        _mm512_storeu_si512(dst.add(64 * t) as *mut _, run(t));
                    }
                } else {
                    for t in 0..4 {
                        let v = run(t);
                        _mm512_storeu_si512(dst.add(64 * t) as *mut _, _mm512_and_si512(v, m4));
                        _mm512_storeu_si512(dst.add(64 * (t + 4)) as *mut _, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
                    }
                }
            }
        }
    }
}

/// 16 bytes of nibbles at `q` as 32 values: elements 0..16 from the low
/// nibbles, 16..32 from the high (Q4_0, Q4_1, and the low bits of Q5_0, Q5_1).
///
/// # Safety
/// AVX2 available; `q` readable for 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles(q: *const u8, m4: __m128i) -> __m256i {
    // SAFETY: the caller's bounds.
    let q = unsafe { _mm_loadu_si128(q as *const __m128i) };
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m4), _mm_and_si128(q, m4))
}
