//! The AVX-512 VNNI tiles of the int8 GEMM: two row blocks (32 rows) x 4 tokens
//! a tile by `vpdpbusd`, a last block alone and the last 1 to 3 tokens together.

use std::arch::x86_64::*;

use super::super::{LANE, OutRows, Panel, QK, RB, XPanel};
use super::{Ahead, Groups, store};

/// Every (row, token) of `count` rows of the panel from its row block `at`:
/// two row blocks (32 rows) × 4 tokens a tile, a last block alone and the last
/// 1 to 3 tokens in one tile; row `i` of token `t` into `o.data[t * o.stride + o.row + i]`.
///
/// # Safety
/// AVX-512F/BW/VL/VNNI available; `p` holds at least `at * 16 + count` rows of
/// `x.k` (in whole blocks of 16); `o.data` holds `count` rows from `o.row` for
/// each of `x.m` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_times_tokens(p: &Panel, at: usize, x: &XPanel, count: usize, mut o: OutRows<'_>, next: &[&[u8]]) {
    let o = &mut o;
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match (p.bias != 0, p.nib) {
            (true, false) => sweep::<true, false>(p, at, x, count, o, next),
            (false, false) => sweep::<false, false>(p, at, x, count, o, next),
            (true, true) => sweep::<true, true>(p, at, x, count, o, next),
            (false, true) => sweep::<false, true>(p, at, x, count, o, next),
        }
    }
}

/// [`rows_times_tokens`] for a panel with (`BIAS`) or without offsets, of
/// bytes or (`NIB`) of two 4-bit values a byte.
///
/// # Safety
/// As [`rows_times_tokens`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn sweep<const BIAS: bool, const NIB: bool>(p: &Panel, at: usize, x: &XPanel, count: usize, o: &mut OutRows<'_>, next: &[&[u8]]) {
    let m = x.m;
    // The blocks of the rows asked for (a kept panel may hold more).
    let blocks = count.div_ceil(RB).min(p.blocks.saturating_sub(at));
    // `next` (runs of bytes to bring into L2) spread over the tiles and, within
    // a tile, over its scale groups: a burst of prefetches fills the line fill
    // buffers and stalls the arithmetic behind them.
    let tiles = blocks.div_ceil(2) * m.div_ceil(4);
    let mut ahead = Ahead::new(next, tiles);
    let mut b = 0;
    while b < blocks {
        let r = if blocks - b >= 2 { 2 } else { 1 };
        let mut t = 0;
        while t < m {
            // 4 tokens a tile, the last 1 to 3 in one tile of their own.
            let n = (m - t).min(4);
            // One tile's form for each number of tokens.
            macro_rules! tiles {
                ($r:literal, $runs:literal) => {
                    match n {
                        4 => tile::<$r, 4, $runs, BIAS, NIB>(p, at, x, b, t, count, o, &mut ahead),
                        3 => tile::<$r, 3, $runs, BIAS, NIB>(p, at, x, b, t, count, o, &mut ahead),
                        2 => tile::<$r, 2, $runs, BIAS, NIB>(p, at, x, b, t, count, o, &mut ahead),
                        _ => tile::<$r, 1, $runs, BIAS, NIB>(p, at, x, b, t, count, o, &mut ahead),
                    }
                };
            }
            // SAFETY: blocks at + b..at + b + r <= at + blocks <= p.blocks and tokens t..t + n <= m.
            unsafe {
                match (r, p.sg == QK) {
                    (2, true) => tiles!(2, 8),
                    (2, false) => tiles!(2, 4),
                    (_, true) => tiles!(1, 8),
                    (_, false) => tiles!(1, 4),
                }
            }
            t += n;
        }
        b += r;
    }
}

/// Row blocks `b..b + R` (of the call's; the panel's `at + b..`) times tokens
/// `t..t + T`; `RUNS` runs of 4 elements per scale group (8: groups of 32, 4:
/// of 16). Writes the call's rows below `count` of each token into `dst` (a
/// register of 16 rows of one token is one store). `BIAS` (the panel's): the offsets are
/// `-bias · scale`, folded into the integer sums' starting value
/// (`scale · d · (Σuq - bias · Σq)`: one multiply-add a group and token
/// fewer per 16 rows). Issues `ahead`'s share of prefetches for this tile a few
/// at each scale group.
// Index loops over the register arrays: each (block, token) pairs two of them.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const T: usize, const RUNS: usize, const BIAS: bool, const NIB: bool>(
    p: &Panel,
    at: usize,
    x: &XPanel,
    b: usize,
    t: usize,
    count: usize,
    dst: &mut OutRows<'_>,
    ahead: &mut Ahead<'_>,
) {
    let gs = Groups::new(p, x, RUNS * LANE);
    let (k, sg, groups, isums, vals) = (gs.k, gs.sg, gs.groups, gs.isums, gs.vals);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let xq = x.q.as_ptr();
    // SAFETY (every read): blocks at + b..at + b + R and groups below `groups`
    // are inside the panel; tokens t..t + T and elements below k inside x (the caller).
    let b = at + b;
    let per_group = ahead.per_group(groups);
    unsafe {
        for g in 0..groups {
            ahead.issue(per_group);
            let mut dot = [[_mm512_setzero_si512(); T]; R];
            if BIAS {
                for c in 0..T {
                    let start = _mm512_set1_epi32(-p.bias * isums[(t + c) * groups + g]);
                    for r in 0..R {
                        dot[r][c] = start;
                    }
                }
            }
            for run in 0..RUNS {
                let mut w = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    w[r] = if NIB {
                        // Runs 2j and 2j + 1 share 64 bytes: low and high nibbles.
                        let v = _mm512_loadu_si512(vals.add((((b + r) * groups + g) * RUNS / 2 + run / 2) * RB * LANE) as *const __m512i);
                        let v = if run % 2 == 0 { v } else { _mm512_srli_epi16::<4>(v) };
                        _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
                    } else {
                        _mm512_loadu_si512(vals.add((((b + r) * groups + g) * RUNS + run) * RB * LANE) as *const __m512i)
                    };
                }
                for c in 0..T {
                    let xv = _mm512_set1_epi32((xq.add((t + c) * k + g * sg + run * LANE) as *const i32).read_unaligned());
                    for r in 0..R {
                        dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], w[r], xv);
                    }
                }
            }
            let mut so = [(_mm512_setzero_ps(), _mm512_setzero_ps()); R];
            for r in 0..R {
                so[r] = gs.scales::<BIAS>(b + r, g);
            }
            for c in 0..T {
                for r in 0..R {
                    acc[r][c] = gs.step::<BIAS>(acc[r][c], dot[r][c], so[r], t + c, g);
                }
            }
        }
    }
    for r in 0..R {
        // The call's row (the panel's block `b` is the call's `b - at`).
        // SAFETY: AVX-512F (the caller's); every store is checked.
        unsafe { store(dst, ((b - at + r) * RB, count), t, &acc[r]) };
    }
}
