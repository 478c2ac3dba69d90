//! The AMX tiles of the int8 GEMM: each scale group's integer sums of 16
//! tokens by 16 rows in one tile multiply (`tdpbsud`: the tokens' int8 codes
//! times the panel's unsigned bytes, which are already laid out as AMX reads
//! its second operand: each 64-byte run holds 4 elements of each of the 16
//! rows), then the VNNI tiles' float steps on those sums in the same order,
//! so the same bits as [`super::vnni`]: a group of 32 costs the VNNI tiles 8
//! `vpdpbusd` and 4 float operations a (row block, token), these tiles the
//! float operations (and the bias's add on a biased panel) and a sixteenth of
//! a tile multiply and store, which pays where the tile unit keeps up with the
//! float steps (Q4_K's groups of 32 at 16 tokens and more; docs/serve.md has
//! the figures: a group of 16 costs a whole tile multiply for a quarter of
//! its width).
//!
//! The tile registers are set up once a call (`ldtilecfg`) and given back at
//! its end (`tilerelease`); the instructions are written in `asm!` (Rust's
//! AMX intrinsics are unstable). [`granted`] asks the kernel for the tile
//! state once a process: a CPU that lists AMX where the system does not grant
//! it keeps the VNNI tiles.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::super::{LANE, OutRows, Panel, QK, RB, XPanel};
use super::{Ahead, Groups, store};

/// Tokens a tile multiply takes (the rows of its first operand and result).
const TOKENS: usize = 16;

/// Whether this CPU lists AMX-TILE and AMX-INT8 and the system grants this
/// process their register state (Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM)`),
/// asked once.
pub fn granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        let f = super::super::super::features();
        f.amx_int8 && f.vnni && request_tile_state()
    })
}

/// Asks the kernel for the AMX tile data state (`XFEATURE_XTILEDATA`) for this
/// process: refused where the system does not support or allow it.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a request about this process's register state; no memory is passed.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// A tile configuration (`ldtilecfg`'s 64 bytes, palette 1): tiles 0 and 1
/// the integer sums of `n` tokens by 16 rows (dwords), 2 and 4 the tokens'
/// codes of one scale group (`n` rows of `sg` bytes), 3 and 5 the group's
/// runs of the 16 rows (`sg / 4` runs of 64 bytes); a group uses 0, 2, 3 and
/// the next 1, 4, 5.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    fn new(n: usize, sg: usize) -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        for (tile, rows, bytes) in [(0, n, 64), (1, n, 64), (2, n, sg), (4, n, sg), (3, sg / 4, 64), (5, sg / 4, 64)] {
            c[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(bytes as u16).to_le_bytes());
            c[48 + tile] = rows as u8;
        }
        Config(c)
    }
}

/// Groups whose tile multiplies are issued ahead of the float steps that read
/// their sums: a tile store reaches the cache only once it retires, so sums
/// read one group later wait for the whole group before them.
const AHEAD: usize = 3;

/// One group's integer sums: up to 16 tokens' 16 dwords.
#[repr(C, align(64))]
struct Sums([[i32; RB]; TOKENS]);

/// One group's runs unpacked from nibbles.
#[repr(C, align(64))]
struct Runs([u8; 8 * RB * LANE]);

/// Every (row, token) of `count` rows of the panel from its row block `at`,
/// as [`super::vnni::rows_times_tokens`] writes them (the same bits): a row
/// block by 16 tokens a tile.
///
/// # Safety
/// AVX-512F/BW/VL/VNNI available and [`granted`] true; `p` holds at least
/// `at * 16 + count` rows of `x.k` (in whole blocks of 16); `o.data` holds
/// `count` rows from `o.row` for each of `x.m` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_times_tokens(p: &Panel, at: usize, x: &XPanel, count: usize, mut o: OutRows<'_>, next: &[&[u8]]) {
    let o = &mut o;
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match (p.bias != 0, p.nib, p.sg == QK) {
            (true, false, true) => sweep::<true, false, 8>(p, at, x, count, o, next),
            (false, false, true) => sweep::<false, false, 8>(p, at, x, count, o, next),
            (true, true, true) => sweep::<true, true, 8>(p, at, x, count, o, next),
            (false, true, true) => sweep::<false, true, 8>(p, at, x, count, o, next),
            (true, false, false) => sweep::<true, false, 4>(p, at, x, count, o, next),
            (false, false, false) => sweep::<false, false, 4>(p, at, x, count, o, next),
            (true, true, false) => sweep::<true, true, 4>(p, at, x, count, o, next),
            (false, true, false) => sweep::<false, true, 4>(p, at, x, count, o, next),
        }
    }
}

/// [`rows_times_tokens`] for a panel with (`BIAS`) or without offsets, of
/// bytes or (`NIB`) of two 4-bit values a byte, `RUNS` runs of 4 elements a
/// scale group: the tokens 16 at a time, each time every row block.
///
/// # Safety
/// As [`rows_times_tokens`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn sweep<const BIAS: bool, const NIB: bool, const RUNS: usize>(
    p: &Panel,
    at: usize,
    x: &XPanel,
    count: usize,
    o: &mut OutRows<'_>,
    next: &[&[u8]],
) {
    let m = x.m;
    let blocks = count.div_ceil(RB).min(p.blocks.saturating_sub(at));
    let mut ahead = Ahead::new(next, blocks * m.div_ceil(TOKENS));
    let mut set = 0;
    let mut t = 0;
    while t < m {
        let n = (m - t).min(TOKENS);
        if n != set {
            let cfg = Config::new(n, RUNS * LANE);
            // SAFETY: AMX granted (the caller); `cfg` is a valid palette-1 configuration.
            unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
            set = n;
        }
        for b in 0..blocks {
            // SAFETY: block at + b < p.blocks and tokens t..t + n <= m.
            unsafe {
                if n == TOKENS {
                    tile::<BIAS, NIB, RUNS, true>(p, at + b, x, t, n, (b * RB, count), o, &mut ahead)
                } else {
                    tile::<BIAS, NIB, RUNS, false>(p, at + b, x, t, n, (b * RB, count), o, &mut ahead)
                }
            };
        }
        t += n;
    }
    // SAFETY: gives the tile registers back (configured above).
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Row block `blk` of the panel times tokens `t..t + n` (the tiles configured
/// for `n`), into the call's rows `row..` below `count` of each token. `FULL`:
/// `n` is [`TOKENS`], a constant, so the float steps' 16 accumulators stay in
/// registers (with a count known only at run time they lived on the stack, a
/// load and a store a step).
///
/// # Safety
/// As [`rows_times_tokens`], with the tiles configured for `n` tokens and
/// groups of `RUNS * 4`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const BIAS: bool, const NIB: bool, const RUNS: usize, const FULL: bool>(
    p: &Panel,
    blk: usize,
    x: &XPanel,
    t: usize,
    n: usize,
    (row, count): (usize, usize),
    dst: &mut OutRows<'_>,
    ahead: &mut Ahead<'_>,
) {
    let n = if FULL { TOKENS } else { n };
    let gs = Groups::new(p, x, RUNS * LANE);
    let (sg, groups, isums, vals) = (gs.sg, gs.groups, gs.isums, gs.vals);
    let (xq, m) = (x.by_group(sg).as_ptr(), x.m);
    let mut acc = [_mm512_setzero_ps(); TOKENS];
    let mut ints: [Sums; AHEAD + 1] = std::array::from_fn(|_| Sums([[0; RB]; TOKENS]));
    let mut runs: [Runs; AHEAD + 1] = std::array::from_fn(|_| Runs([0; 8 * RB * LANE]));
    let per_group = ahead.per_group(groups);
    // A group's runs are staged into L1 (unpacked from nibbles, or copied: a
    // tile load from a stream that misses the cache stalls the tile unit)
    // AHEAD groups before its multiply, which a tile load of stores not yet
    // retired would wait for, as the float steps wait for the tile's store; the
    // multiplies AHEAD groups before their float steps.
    let unpacked = AHEAD;
    for step in 0..groups + unpacked + AHEAD {
        if step < groups {
            // SAFETY: group `step` of block blk lies in the panel (as below).
            unsafe {
                if NIB {
                    unpack::<RUNS>(vals.add((blk * groups + step) * RUNS / 2 * RB * LANE), &mut runs[step % (AHEAD + 1)])
                } else {
                    stage::<RUNS>(vals.add((blk * groups + step) * RUNS * RB * LANE), &mut runs[step % (AHEAD + 1)])
                }
            };
        }
        if step >= unpacked && step - unpacked < groups {
            let g = step - unpacked;
            // SAFETY (every read): group g < groups of block blk < p.blocks inside
            // the panel (or unpacked from it); tokens t..t + n and elements
            // g * sg..(g + 1) * sg inside x.
            unsafe {
                let w = runs[g % (AHEAD + 1)].0.as_ptr();
                multiply(g, xq.add((g * m + t) * sg), sg, w);
                // The group before's sums stored only now, behind this group's
                // multiply: a store right after its own multiply waited for it
                // and held up what followed (half the samples of the tile
                // sat on that store).
                if g > 0 {
                    store_sums(g - 1, &mut ints[(g - 1) % (AHEAD + 1)]);
                }
                if g + 1 == groups {
                    store_sums(g, &mut ints[g % (AHEAD + 1)]);
                }
            }
        }
        if step < unpacked + AHEAD {
            continue;
        }
        let g = step - unpacked - AHEAD;
        ahead.issue(per_group);
        let sums_g = &ints[g % (AHEAD + 1)];
        // SAFETY (every read): as above; scales and offsets of group g of block blk.
        unsafe {
            let so = gs.scales::<BIAS>(blk, g);
            for c in 0..n {
                let mut dot = _mm512_load_si512(sums_g.0[c].as_ptr() as *const __m512i);
                if BIAS {
                    dot = _mm512_add_epi32(dot, _mm512_set1_epi32(-p.bias * isums[(t + c) * groups + g]));
                }
                acc[c] = gs.step::<BIAS>(acc[c], dot, so, t + c, g);
            }
        }
    }
    // SAFETY: AVX-512F (the caller's); every store is checked.
    unsafe { store(dst, (row, count), t, &acc[..n]) };
}

/// Group `g`'s integer sums of the tokens' codes at `a` (rows `stride` bytes
/// apart) times the runs at `w` (64 bytes apart), into tile 0 (tiles 2 and 3
/// its operands) for even groups, 1 (4, 5) for odd: a group's multiply need
/// not wait for the store of the one before it ([`store_sums`]).
///
/// # Safety
/// The tiles configured for groups of the panel's size; `a` readable for the
/// tiles' rows, `w` for the group's runs.
#[inline(always)]
unsafe fn multiply(g: usize, a: *const i8, stride: usize, w: *const u8) {
    // One asm block a set of tiles (a tile's number is part of the instruction,
    // not an operand).
    macro_rules! multiply_in {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tilezero tmm", $c),
                concat!("tileloadd tmm", $a, ", [{a} + {k}*1]"),
                concat!("tileloadd tmm", $b, ", [{w} + {s}*1]"),
                concat!("tdpbsud tmm", $c, ", tmm", $a, ", tmm", $b),
                a = in(reg) a, k = in(reg) stride, w = in(reg) w, s = in(reg) RB * LANE,
                options(nostack, readonly),
            )
        };
    }
    // SAFETY: the caller's bounds; the tiles read only there.
    unsafe {
        if g.is_multiple_of(2) {
            multiply_in!("0", "2", "3");
        } else {
            multiply_in!("1", "4", "5");
        }
    }
}

/// Group `g`'s sums ([`multiply`]'s tile 0 or 1) stored into `into`.
///
/// # Safety
/// The tiles configured as for [`multiply`], group `g` multiplied.
#[inline(always)]
unsafe fn store_sums(g: usize, into: &mut Sums) {
    // SAFETY: `into` holds the tile's rows of 64 bytes.
    unsafe {
        if g.is_multiple_of(2) {
            asm!("tilestored [{c} + {s}*1], tmm0", c = in(reg) into.0.as_mut_ptr(), s = in(reg) RB * LANE, options(nostack));
        } else {
            asm!("tilestored [{c} + {s}*1], tmm1", c = in(reg) into.0.as_mut_ptr(), s = in(reg) RB * LANE, options(nostack));
        }
    }
}

/// A nibble panel's group at `src` (`RUNS / 2` runs of 64 bytes, runs 2j and
/// 2j + 1 in the low and high nibbles of the j-th) as `RUNS` runs of bytes.
///
/// # Safety
/// AVX-512F/BW available; `src` readable for `RUNS * 32` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack<const RUNS: usize>(src: *const u8, into: &mut Runs) {
    // SAFETY: the caller's bounds; `into` holds 8 runs.
    unsafe {
        for j in 0..RUNS / 2 {
            let v = _mm512_loadu_si512(src.add(j * RB * LANE) as *const __m512i);
            let lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), _mm512_set1_epi8(0x0F));
            _mm512_store_si512(into.0.as_mut_ptr().add(2 * j * RB * LANE) as *mut __m512i, lo);
            _mm512_store_si512(into.0.as_mut_ptr().add((2 * j + 1) * RB * LANE) as *mut __m512i, hi);
        }
    }
}

/// A byte panel's group at `src` (`RUNS` runs of 64 bytes) copied to `into`.
///
/// # Safety
/// AVX-512F available; `src` readable for `RUNS * 64` bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn stage<const RUNS: usize>(src: *const u8, into: &mut Runs) {
    // SAFETY: the caller's bounds; `into` holds 8 runs.
    unsafe {
        for j in 0..RUNS {
            let v = _mm512_loadu_si512(src.add(j * RB * LANE) as *const __m512i);
            _mm512_store_si512(into.0.as_mut_ptr().add(j * RB * LANE) as *mut __m512i, v);
        }
    }
}
