//! The x86 side of the int8 GEMM (AVX-512F/BW/VL, VNNI): the 16 x 8 dword
//! transpose every packing path ends in, the direct packing of the 32-element
//! formats from their bytes ([`direct`]) and the `vpdpbusd` tiles ([`vnni`]).

pub mod amx;
pub mod direct;
pub mod vnni;

use std::arch::x86_64::*;

use super::{GROUP, OutRows, Panel, QK, RB, XPanel};

/// 16 rows of 32 bytes (`src`, rows `stride` apart) to 8 runs of 64 bytes: run
/// `r` holds bytes `4r..4r + 4` of each row in turn (a 16 x 8 transpose of dwords:
/// rows i and i + 8 in one register, two 8 x 8 transposes side by side).
///
/// # Safety
/// AVX-512F available; `src` readable for 15 strides plus 32 bytes, `dst` writable
/// for 512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose16x8(src: *const u8, stride: usize, dst: *mut u8) {
    // SAFETY: the caller's bounds.
    unsafe {
        let z: [__m512i; 8] = std::array::from_fn(|i| {
            let a = _mm256_loadu_si256(src.add(i * stride) as *const __m256i);
            let b = _mm256_loadu_si256(src.add((i + 8) * stride) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
        });
        transpose_store(z, dst);
    }
}

/// The transpose of [`transpose16x8`] on rows already in registers: `z[i]` holds
/// row `i` (low 256 bits) and row `i + 8` (high).
///
/// # Safety
/// AVX-512F available; `dst` writable for 512 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_store(z: [__m512i; 8], dst: *mut u8) {
    // SAFETY: the caller's bounds.
    unsafe {
        // t[2p], t[2p + 1]: rows 2p and 2p + 1 interleaved by dwords (low, high
        // pair of each 128-bit lane).
        let t: [__m512i; 8] = std::array::from_fn(|i| {
            let (a, b) = (z[i & !1], z[i | 1]);
            if i % 2 == 0 { _mm512_unpacklo_epi32(a, b) } else { _mm512_unpackhi_epi32(a, b) }
        });
        // u[c] (c < 4): columns c (low 128 of each half) and c + 4 (high) of rows
        // 0..4 | 8..12; u[c + 4] the same of rows 4..8 | 12..16.
        let u: [__m512i; 8] = std::array::from_fn(|i| {
            let (h, c) = (i / 4, i % 4);
            let (a, b) = (t[4 * h + c / 2], t[4 * h + c / 2 + 2]);
            if c % 2 == 0 { _mm512_unpacklo_epi64(a, b) } else { _mm512_unpackhi_epi64(a, b) }
        });
        let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
        let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
        for c in 0..4 {
            _mm512_storeu_si512(dst.add(64 * c) as *mut _, _mm512_permutex2var_epi64(u[c], lo, u[c + 4]));
            _mm512_storeu_si512(dst.add(64 * (c + 4)) as *mut _, _mm512_permutex2var_epi64(u[c], hi, u[c + 4]));
        }
    }
}

/// The lines of the runs to bring into L2, a tile's share at a time, issued a
/// few at each scale group of the tile.
pub(super) struct Ahead<'a> {
    next: &'a [&'a [u8]],
    /// Lines left in all, and a tile's share.
    left: usize,
    per_tile: usize,
    /// The run and the byte within it of the next line.
    run: usize,
    pos: usize,
}

impl<'a> Ahead<'a> {
    pub(super) fn new(next: &'a [&'a [u8]], tiles: usize) -> Ahead<'a> {
        let lines: usize = next.iter().map(|n| n.len().div_ceil(64)).sum();
        Ahead { next, left: lines, per_tile: lines.div_ceil(tiles.max(1)), run: 0, pos: 0 }
    }

    /// Prefetches for each of a tile's `groups` scale groups: its share spread evenly.
    pub(super) fn per_group(&self, groups: usize) -> usize {
        self.per_tile.min(self.left).div_ceil(groups.max(1))
    }

    /// Issues up to `n` prefetches.
    #[inline(always)]
    pub(super) fn issue(&mut self, n: usize) {
        for _ in 0..n.min(self.left) {
            while self.pos >= self.next[self.run].len() {
                (self.run, self.pos) = (self.run + 1, 0);
            }
            // SAFETY: SSE is baseline on x86_64; a prefetch reads nothing (the
            // address is a line of the run's own bytes).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    self.next[self.run].as_ptr().wrapping_add(self.pos) as *const i8
                )
            };
            (self.left, self.pos) = (self.left - 1, self.pos + 64);
        }
    }
}

/// What a tile reads for scale groups of `sg` elements (16 or 32): the
/// panel's values, scales and offsets, and the tokens' block scales, group
/// sums and integer group sums.
pub(super) struct Groups<'a> {
    pub k: usize,
    pub sg: usize,
    pub groups: usize,
    nb: usize,
    /// `Σq` per token and group (a biased panel's correction).
    pub isums: &'a [i32],
    pub vals: *const u8,
    scale: *const f32,
    off: *const f32,
    halves: Option<(*const half::f16, *const half::f16)>,
    xd: *const f32,
    xs: *const f32,
}

impl<'a> Groups<'a> {
    pub(super) fn new(p: &'a Panel, x: &'a XPanel, sg: usize) -> Groups<'a> {
        let groups = x.k / sg;
        Groups {
            k: x.k,
            sg,
            groups,
            nb: x.k / QK,
            isums: if sg == GROUP { &x.isum16 } else { &x.isum },
            vals: p.vals.as_ptr(),
            scale: p.scale.as_ptr(),
            off: p.off.as_ptr(),
            halves: p.halves.as_ref().map(|(s, o)| (s.as_ptr(), o.as_ptr())),
            xd: x.d.as_ptr(),
            xs: x.group_sums(sg).as_ptr(),
        }
    }

    /// The scales and offsets of group `g` of the panel's block `blk` (the
    /// offsets not read where `BIAS`: they are folded into the sums).
    ///
    /// # Safety
    /// AVX-512F available; block `blk` and group `g` inside the panel.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scales<const BIAS: bool>(&self, blk: usize, g: usize) -> (__m512, __m512) {
        let at = (blk * self.groups + g) * RB;
        // SAFETY: the caller's bounds.
        unsafe {
            match self.halves {
                Some((sh, oh)) => {
                    let s = _mm512_cvtph_ps(_mm256_loadu_si256(sh.add(at) as *const __m256i));
                    (s, if BIAS { _mm512_setzero_ps() } else { _mm512_cvtph_ps(_mm256_loadu_si256(oh.add(at) as *const __m256i)) })
                }
                None => (_mm512_loadu_ps(self.scale.add(at)), _mm512_loadu_ps(self.off.add(at))),
            }
        }
    }

    /// One (row block, token) group's float steps: `acc + scale · d · dot`
    /// and, without `BIAS`, `+ off · d · Σq`, in that order (every tile the
    /// same chain: the same bits).
    ///
    /// # Safety
    /// AVX-512F available; `token` and group `g` inside the tokens.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn step<const BIAS: bool>(
        &self,
        acc: __m512,
        dot: __m512i,
        (s, o): (__m512, __m512),
        token: usize,
        g: usize,
    ) -> __m512 {
        // SAFETY: the caller's bounds.
        unsafe {
            let d = _mm512_set1_ps(*self.xd.add(token * self.nb + g * self.sg / QK));
            let a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), d), s, acc);
            if BIAS { a } else { _mm512_fmadd_ps(o, _mm512_set1_ps(*self.xs.add(token * self.groups + g)), a) }
        }
    }
}

/// Writes a row block's sums, `acc[c]` of token `t + c`, into the call's
/// rows `row..` of each token below `count`.
///
/// # Safety
/// AVX-512F available.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store(dst: &mut OutRows<'_>, (row, count): (usize, usize), t: usize, acc: &[__m512]) {
    if row >= count {
        return;
    }
    // The rows below `count` of this block (all 16 but in a last block).
    let keep: __mmask16 = if count - row >= RB { !0 } else { (1u16 << (count - row)) - 1 };
    for (c, &a) in acc.iter().enumerate() {
        let to = (t + c) * dst.stride + dst.row + row;
        assert!(to + (count - row).min(RB) <= dst.data.len());
        // SAFETY: the lanes `keep` selects, `(count - row).min(16)` floats
        // from `to`, lie in `dst.data` (asserted).
        unsafe { _mm512_mask_storeu_ps(dst.data.as_mut_ptr().add(to), keep, a) };
    }
}
