//! The x86 side of the int8 GEMM (AVX-512F/BW/VL, VNNI): the 16 x 8 dword
//! transpose every packing path ends in, the direct packing of the 32-element
//! formats from their bytes ([`direct`]) and the `vpdpbusd` tiles ([`vnni`]).

pub mod amx;
pub mod direct;
pub mod vnni;

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
    use std::arch::x86_64::*;
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
unsafe fn transpose_store(z: [std::arch::x86_64::__m512i; 8], dst: *mut u8) {
    use std::arch::x86_64::*;
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
