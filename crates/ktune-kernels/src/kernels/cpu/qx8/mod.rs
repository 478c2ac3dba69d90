//! Decode dots over repacked weights ([`Layout::X8`]): 8 rows at a time,
//! one 32-bit lane per row, so a super-block column of the 8 rows costs 64
//! `vpdpbusd` (or `maddubs` + `madd` on AVX2) against broadcast activations, the
//! sub-block scales applied to the 8 rows' integer sums at once, and no
//! per-row scale unpacking, conversion or horizontal sum: about a third of the
//! instructions of the one-row dots ([`super::qdot`]), which keep Q4_K decode
//! compute-bound on a 2-core machine. The activations are the q8_K form
//! ([`XQ8::quantize_k`](super::XQ8::quantize_k), one scale per 256); the
//! portable loop also takes one scale per 32.
//!
//! Every variant computes the same thing in the same order: per column, the
//! integer sum `Σ_j sc_j Σ q·x` of each row, converted once and multiplied by
//! `d · d_x`; the minima's term `Σ_j mn_j · dsum_j` in f32, times `dmin`; so the
//! SIMD and portable results agree to the last bit (tests below).
//!
//! Q4_0, Q8_0 and IQ4_NL (32-element blocks, the activations with a scale per
//! 32) go the same way, a block column of the 8 rows at a time: Q4_0's unsigned
//! nibbles in 8 `vpdpbusd`, its `-8` through the activations' block sums
//! (`-8 d Σx`, as the row int8 dots take it); Q8_0's signed codes and IQ4_NL's
//! table values (one `vpshufb` a load) by llama.cpp's sign trick (`|w|` times
//! `x` with `w`'s sign); per block, each row's integer sum converted once and
//! multiplied by `d · d_x` in 8 lanes.
//!
//! Q6_K (one super-block column of the 8 rows a record) rebuilds each vector of
//! 6-bit codes from a run of low nibbles and a run of high bit pairs, sums each
//! 16-element group in integers (`vpdpbusd`), times the 8 rows' int8 scales of
//! the group (`vpmulld`), into the column's integer sum; its `-32` through the
//! activations' sums per 16 (`-32 Σ_g sc_g dsum16_g`, in f32), as the row dot
//! takes it.
//!
//! With f32 activations (`act_bits` 32) the same records go through
//! [`rows_x8_f32`]: per 32-byte load, byte `l` of each 32-bit lane (one row's
//! code, sign-extended by two shifts; Q4_0's nibbles less 8 and IQ4_NL's table
//! values first, bytewise) converted to f32 and multiplied by the broadcast
//! activation of its element, 8 FMA chains a block (4 bytes × the load's two
//! halves), the chains summed in a fixed tree and scaled by the 8 rows' `d` in
//! 8 lanes (Q4_K: by `d · sc_j` per sub-block, the minima through the
//! activations' sub-block sums `Σx`, as the int8 loop takes them). No block is
//! gathered back; the portable loop keeps the same chains in the same order,
//! so both agree to the last bit (tests below).

use std::cell::RefCell;

use half::f16;

use super::{Isa, XQ8, with_scratch};
use crate::kernels::quant::block::{Codes, X8};
use crate::kernels::quant::{
    IQ4_LEVELS, Layout, QK, QView, X8_BYTES, X8_K6_BYTES, X8_ROWS, x8_k6_code, x8_k6_scale, x8_record_bytes, x8_row_codes, x8_scale_min,
};

/// Rows `first..first + y.len()` of the [`Layout::X8`] matrix `w` dotted with
/// `x` into `y`: whole groups of 8 rows (two at a time where [`two_groups`]),
/// a partial group at either end computed whole into a stack buffer.
pub fn rows_x8(isa: Isa, x: &XQ8, w: QView<'_>, first: usize, y: &mut [f32]) {
    let Layout::X8 { bpr } = w.layout else { return };
    groups(first, y.len(), two_groups(isa, w, x.per256), |g, n, r, hi| {
        let [out] = group(isa, [x], w, bpr, g, n);
        y[r - first..hi - first].copy_from_slice(&out[r - g * X8_ROWS..hi - g * X8_ROWS]);
    });
}

/// `f(g, n, r, hi)` for each group `g` of 8 rows that rows `first..first +
/// count` reach (with `two`, groups `g` and `g + 1` together, `n` = 2, where
/// both are whole), with the rows `r..hi` of the `n` groups they hold
/// (partial groups at either end).
#[inline(always)]
fn groups(first: usize, count: usize, two: bool, mut f: impl FnMut(usize, usize, usize, usize)) {
    let end = first + count;
    let mut r = first;
    while r < end {
        let g = r / X8_ROWS;
        let n = if two && r == g * X8_ROWS && r + 2 * X8_ROWS <= end { 2 } else { 1 };
        let hi = ((g + n) * X8_ROWS).min(end);
        f(g, n, r, hi);
        r = hi;
    }
}

/// Whether the loops over `w`'s records take two groups of 8 rows at a time
/// with activations with one scale per 256 (`per256`): Q4_K's on AVX-512 VNNI
/// (each group's lanes in one half of a 512-bit vector, as a 256-bit one holds
/// them: the same bits, half the instructions; `batch_gemm q4_k --shape 1b`:
/// 8 tokens 1.21x, 4 1.07x, one 1.08x, docs/serve.md). Not Q6_K's: its loop
/// measured no faster two groups at a time (8 tokens 49.0, 49.8 ms against
/// 38.7, 40.7 one at a time; other arrangements of its offsets' sums within
/// the machine's spread), and neither its multiplies nor its decode bound it
/// at 8 tokens (both replaced in trials, docs/serve.md).
fn two_groups(isa: Isa, w: QView<'_>, per256: bool) -> bool {
    isa.vnni() && w.format.ops().cpu.x8 == Some(X8::K4) && per256
}

/// Tokens whose dots one pass over a group's records computes
/// ([`rows_x8_tokens`]) on AVX2 without VNNI: their accumulators and the
/// decoded codes fill its 16 vector registers.
pub const X8_TOKENS: usize = 4;

/// Tokens a pass over a group's records computes on AVX-512 VNNI
/// ([`tokens_a_pass`]), every X8 format: the loops keep one integer sum and
/// one or two running sums a token (Q4_K past 4 tokens its low codes' sums,
/// then its high ones', in one set of registers), so the codes (Q6_K's each
/// rebuilt from a run of low nibbles and one of high bit pairs, the nibble
/// formats' split) are decoded once for 8 tokens.
pub const X8_VNNI_TOKENS: usize = 8;

/// Tokens a pass over a group of records of the X8 layout `x8` (a format's
/// [`X8`], None for rows) computes on `isa`.
pub fn tokens_a_pass(isa: Isa, x8: Option<X8>) -> usize {
    match x8 {
        Some(_) if isa.vnni() => X8_VNNI_TOKENS,
        _ => X8_TOKENS,
    }
}

/// Rows `first..first + count` of the [`Layout::X8`] matrix `w` dotted with
/// the activations `x(t)` of each token `t < m`, into `out` token-major (`[m][count]`):
/// a group of 8 rows at a time, its records read and decoded once for up to
/// [`tokens_a_pass`] tokens (from memory for the first tokens, from L1 for the
/// rest). Every token's dots are computed as [`rows_x8`] computes them for it
/// alone, bit for bit (a decode batch's token gets its lone decode's values).
pub fn rows_x8_tokens<'a>(isa: Isa, m: usize, x: impl Fn(usize) -> &'a XQ8, w: QView<'_>, first: usize, count: usize, out: &mut [f32]) {
    let Layout::X8 { bpr } = w.layout else { return };
    assert!(out.len() >= m * count, "{} outputs for {m} tokens of {count} rows", out.len());
    let per_pass = tokens_a_pass(isa, w.format.ops().cpu.x8);
    let two = two_groups(isa, w, (0..m).all(|t| x(t).per256));
    groups(first, count, two, |g, n, r, hi| {
        let lo = g * X8_ROWS;
        let mut put = |t0: usize, dots: &[[f32; 16]]| {
            for (j, d) in dots.iter().enumerate() {
                out[(t0 + j) * count + r - first..][..hi - r].copy_from_slice(&d[r - lo..hi - lo]);
            }
        };
        for t0 in (0..m).step_by(per_pass) {
            macro_rules! pass {
                ($($n:literal)*) => {
                    match (m - t0).min(per_pass) {
                        $($n => put(t0, &group(isa, std::array::from_fn::<_, $n, _>(|j| x(t0 + j)), w, bpr, g, n)),)*
                        _ => unreachable!("1 to {X8_VNNI_TOKENS} tokens a pass"),
                    }
                };
            }
            pass!(1 2 3 4 5 6 7 8);
        }
    });
}

/// The dot products of rows `8 g..8 (g + n)` (one group of 8, or two where
/// [`two_groups`]) with each of the tokens `xs`: row `8 g + i` in lane `i`.
/// Two groups go to the loop of two groups a pass; any other loop takes one,
/// so two groups asked of it go through the portable loops, a group at a time.
#[inline]
fn group<const T: usize>(isa: Isa, xs: [&XQ8; T], w: QView<'_>, bpr: usize, g: usize, n: usize) -> [[f32; 16]; T] {
    let (rb, ns) = (x8_record_bytes(w.format), w.format.scales_per_block() * X8_ROWS);
    let rec = &w.quants[g * bpr * rb..(g + n) * bpr * rb];
    let sc = &w.scales[g * bpr * ns..(g + n) * bpr * ns];
    let x8 = w.format.ops().cpu.x8;
    #[cfg(target_arch = "x86_64")]
    if let Some(X8::Codes32(codes)) = x8
        && n == 1
        && isa.avx2()
        && xs.iter().all(|x| x.q.len() >= bpr * QK && x.d.len() >= bpr && x.dsum.len() >= bpr)
    {
        // SAFETY: AVX2/FMA/F16C checked (VNNI too for `vnni`); `rec`, `sc` hold
        // `bpr` records, each `x` as many blocks (checked above).
        return widen(unsafe {
            match (codes, isa.vnni()) {
                (Codes::Nibbles, true) => x86::vnni::group32::<0, T>(rec, sc, xs, bpr),
                (Codes::Bytes, true) => x86::vnni::group32::<1, T>(rec, sc, xs, bpr),
                (Codes::Levels, true) => x86::vnni::group32::<2, T>(rec, sc, xs, bpr),
                (Codes::Nibbles, false) => x86::avx2::group32::<0, T>(rec, sc, xs, bpr),
                (Codes::Bytes, false) => x86::avx2::group32::<1, T>(rec, sc, xs, bpr),
                (Codes::Levels, false) => x86::avx2::group32::<2, T>(rec, sc, xs, bpr),
            }
        });
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && xs.iter().all(|x| x.per256 && x.q.len() >= bpr * 256 && x.d.len() >= 8 * bpr && x.dsum.len() >= 8 * bpr) {
        use x86::{Avx2Lanes, VnniLanes, Wide};
        // SAFETY: AVX2/FMA/F16C checked (AVX-512 VNNI too for `vnni` and two
        // groups: `two_groups`); `rec`, `sc` hold `n` groups of `bpr` records,
        // each `x` as many super-blocks (checked above).
        unsafe {
            match (x8, isa.vnni(), n) {
                (Some(X8::K4), true, 2) => return x86::vnni::group::<Wide, T>(rec, sc, xs, bpr),
                (Some(X8::K4), true, 1) => return x86::vnni::group::<VnniLanes, T>(rec, sc, xs, bpr),
                (Some(X8::K4), false, 1) => return x86::avx2::group::<Avx2Lanes, T>(rec, sc, xs, bpr),
                (Some(X8::K6), vnni, 1) if xs.iter().all(|x| x.dsum16.len() >= 16 * bpr) => {
                    return if vnni {
                        x86::vnni::group_k6::<VnniLanes, T>(rec, sc, xs, bpr)
                    } else {
                        x86::avx2::group_k6::<Avx2Lanes, T>(rec, sc, xs, bpr)
                    };
                }
                _ => {}
            }
        }
    }
    let _ = isa;
    // The portable loops, a group at a time.
    let mut out = [[0f32; 16]; T];
    for i in 0..n {
        let (rec, sc) = (&rec[i * bpr * rb..(i + 1) * bpr * rb], &sc[i * bpr * ns..(i + 1) * bpr * ns]);
        for (o, x) in out.iter_mut().zip(xs) {
            let dots = match x8 {
                Some(X8::Codes32(codes)) => group32_portable(codes, rb, rec, sc, x, bpr),
                Some(X8::K6) => group_k6_portable(rec, sc, x, bpr),
                _ => group_portable(rec, sc, x, bpr),
            };
            o[i * X8_ROWS..(i + 1) * X8_ROWS].copy_from_slice(&dots);
        }
    }
    out
}

/// One group's dots of each token in the first 8 lanes of 16.
#[cfg(target_arch = "x86_64")]
fn widen<const T: usize>(dots: [[f32; X8_ROWS]; T]) -> [[f32; 16]; T] {
    dots.map(|d| std::array::from_fn(|i| if i < X8_ROWS { d[i] } else { 0.0 }))
}

/// The portable loop: `x` with one scale per 256 or per 32.
fn group_portable(rec: &[u8], sc: &[f16], x: &XQ8, bpr: usize) -> [f32; X8_ROWS] {
    let mut acc = [0f32; X8_ROWS];
    let mut accm = [0f32; X8_ROWS];
    for c in 0..bpr {
        let r = &rec[c * X8_BYTES..(c + 1) * X8_BYTES];
        let s = &sc[c * 2 * X8_ROWS..(c + 1) * 2 * X8_ROWS];
        let xq = &x.q[256 * c..256 * (c + 1)];
        for i in 0..X8_ROWS {
            // Per sub-block integer sums (code byte l of pair p: element 64p + l low, 64p + 32 + l high).
            let mut sub = [0i32; 8];
            for p in 0..4 {
                for (l, v) in x8_row_codes(r, i, p).into_iter().enumerate() {
                    sub[2 * p] += (v & 0x0f) as i32 * xq[64 * p + l] as i32;
                    sub[2 * p + 1] += (v >> 4) as i32 * xq[64 * p + 32 + l] as i32;
                }
            }
            let (d, dmin) = (s[i].to_f32(), s[X8_ROWS + i].to_f32());
            let sm: [(u8, u8); 8] = std::array::from_fn(|j| x8_scale_min(r, i, j));
            let ms = sm.iter().zip(&x.dsum[8 * c..8 * c + 8]).fold(0f32, |ms, (&(_, m), &ds)| (m as f32).mul_add(ds, ms));
            if x.per256 {
                let isum: i32 = sub.iter().zip(&sm).map(|(s, &(sc, _))| s * sc as i32).sum();
                acc[i] = (isum as f32).mul_add(d * x.d[8 * c], acc[i]);
            } else {
                for ((s, &(sc, _)), &dx) in sub.iter().zip(&sm).zip(&x.d[8 * c..8 * c + 8]) {
                    acc[i] = ((s * sc as i32) as f32).mul_add(d * dx, acc[i]);
                }
            }
            accm[i] = ms.mul_add(dmin, accm[i]);
        }
    }
    std::array::from_fn(|i| acc[i] - accm[i])
}

/// The portable loop of Q6_K (`x` with one scale per 256 or per 32): per
/// super-block column and row, each 16-element group's integer sum of the
/// unsigned codes times the activations, times the group's int8 scale, summed in
/// integers (per 256, or per 32 with the activations' scales); the `-32` as
/// `Σ_g sc_g · dsum16_g` in f32 (groups in order), times `d`, subtracted times 32
/// at the end.
fn group_k6_portable(rec: &[u8], sc: &[f16], x: &XQ8, bpr: usize) -> [f32; X8_ROWS] {
    let mut acc = [0f32; X8_ROWS];
    let mut accm = [0f32; X8_ROWS];
    for c in 0..bpr {
        let r = &rec[c * X8_K6_BYTES..(c + 1) * X8_K6_BYTES];
        let xq = &x.q[256 * c..256 * (c + 1)];
        for i in 0..X8_ROWS {
            let d = sc[X8_ROWS * c + i].to_f32();
            let scaled: [i32; 16] = std::array::from_fn(|g| {
                let s: i32 = (16 * g..16 * g + 16).map(|e| x8_k6_code(r, i, e) as i32 * xq[e] as i32).sum();
                s * x8_k6_scale(r, i, g) as i32
            });
            if x.per256 {
                let isum: i32 = scaled.iter().sum();
                acc[i] = (isum as f32).mul_add(d * x.d[8 * c], acc[i]);
            } else {
                for b in 0..8 {
                    acc[i] = ((scaled[2 * b] + scaled[2 * b + 1]) as f32).mul_add(d * x.d[8 * c + b], acc[i]);
                }
            }
            let off = (0..16).fold(0f32, |o, g| (x8_k6_scale(r, i, g) as f32).mul_add(x.dsum16[16 * c + g], o));
            accm[i] = off.mul_add(d, accm[i]);
        }
    }
    std::array::from_fn(|i| (-32f32).mul_add(accm[i], acc[i]))
}

/// The portable loop of the 32-element formats (`x`: a scale per 32, or per 256
/// repeated over its blocks).
fn group32_portable(codes: Codes, rb: usize, rec: &[u8], sc: &[f16], x: &XQ8, bpr: usize) -> [f32; X8_ROWS] {
    let mut acc = [0f32; X8_ROWS];
    let mut accm = [0f32; X8_ROWS];
    let val = |n: u8| if codes == Codes::Levels { IQ4_LEVELS[n as usize] as i32 } else { n as i32 };
    for c in 0..bpr {
        let r = &rec[c * rb..(c + 1) * rb];
        let xq = &x.q[QK * c..QK * (c + 1)];
        for i in 0..X8_ROWS {
            let mut isum = 0i32;
            if codes == Codes::Bytes {
                for t in 0..8 {
                    for l in 0..4 {
                        isum += r[32 * t + 4 * i + l] as i8 as i32 * xq[4 * t + l] as i32;
                    }
                }
            } else {
                // Byte l of a row's 16: element l (low nibble) and l + 16 (high).
                for t in 0..4 {
                    for l in 0..4 {
                        let v = r[32 * t + 4 * i + l];
                        isum += val(v & 0x0f) * xq[4 * t + l] as i32 + val(v >> 4) * xq[16 + 4 * t + l] as i32;
                    }
                }
            }
            let d = sc[X8_ROWS * c + i].to_f32();
            acc[i] = (isum as f32).mul_add(d * x.d[c], acc[i]);
            if codes == Codes::Nibbles {
                accm[i] = d.mul_add(x.dsum[c], accm[i]);
            }
        }
    }
    std::array::from_fn(|i| (-8f32).mul_add(accm[i], acc[i]))
}

const _: () = assert!(QK * 8 == 256);

thread_local! {
    /// Q4_K's activation sums per 32 (`Σx` of each sub-block) for one call of
    /// [`rows_x8_f32`], shared by its groups, where a row is longer than
    /// [`STACK_SUMS`] sub-blocks.
    static SUB_SUMS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Rows `first..first + y.len()` of the [`Layout::X8`] matrix `w` dotted with
/// the f32 activations `x` (at least a row's `bpr` blocks) into `y`, 8 rows a
/// pass straight from the records (partial groups as [`rows_x8`] computes them).
pub fn rows_x8_f32(isa: Isa, x: &[f32], w: QView<'_>, first: usize, y: &mut [f32]) {
    let Layout::X8 { bpr } = w.layout else { return };
    let be = w.format.block_elems();
    assert!(x.len() >= bpr * be, "{} activations for rows of {} {} blocks", x.len(), bpr, w.format);
    let x = &x[..bpr * be];
    let run = |sums: &[f32], y: &mut [f32]| {
        let end = first + y.len();
        let mut r = first;
        while r < end {
            let g = r / X8_ROWS;
            let (lo, hi) = (g * X8_ROWS, ((g + 1) * X8_ROWS).min(end));
            let out = group_f32(isa, x, sums, w, bpr, g);
            y[r - first..hi - first].copy_from_slice(&out[r - lo..hi - lo]);
            r = hi;
        }
    };
    if w.format.ops().cpu.x8 != Some(X8::K4) {
        return run(&[], y);
    }
    // On the stack for rows of up to STACK_SUMS * 32 values (no allocation on any
    // worker), else in the thread's scratch.
    let n = x.len() / QK;
    if n <= STACK_SUMS {
        let mut sums = [0f32; STACK_SUMS];
        sub_block_sums(x, &mut sums[..n]);
        run(&sums[..n], y)
    } else {
        with_scratch(&SUB_SUMS, n, |sums| {
            sub_block_sums(x, sums);
            run(sums, y)
        })
    }
}

/// Q4_K sub-block sums [`rows_x8_f32`] keeps on the stack: rows of up to 32768
/// values (128 super-blocks; Gemma 3 27B's longest is 21504).
const STACK_SUMS: usize = 1024;

/// `Σx` of each 32 consecutive activations, in order.
fn sub_block_sums(x: &[f32], out: &mut [f32]) {
    for (o, xb) in out.iter_mut().zip(x.chunks_exact(QK)) {
        *o = xb.iter().sum();
    }
}

/// The 8 f32-activation dot products of rows `8 g..8 g + 8` (`sums`: Q4_K's
/// [`sub_block_sums`]).
#[inline]
fn group_f32(isa: Isa, x: &[f32], sums: &[f32], w: QView<'_>, bpr: usize, g: usize) -> [f32; X8_ROWS] {
    let Some(kind) = w.format.ops().cpu.x8 else { unreachable!("{}: a repacked view of a format without a repacked layout", w.format) };
    let (rb, ns) = (x8_record_bytes(w.format), w.format.scales_per_block() * X8_ROWS);
    let rec = &w.quants[g * bpr * rb..(g + 1) * bpr * rb];
    let sc = &w.scales[g * bpr * ns..(g + 1) * bpr * ns];
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA/F16C checked (AVX-512F/BW/VL too for `vnni`, whose
        // feature set includes them); `rec`, `sc` hold `bpr` records, `x` a row's
        // activations, `sums` (Q4_K) one per 32 of them (the callees assert).
        return unsafe {
            match (kind, isa.vnni()) {
                (X8::K4, true) => x86::f32_avx512::group_k(rec, sc, x, sums, bpr),
                (X8::K6, true) => x86::f32_avx512::group_k6(rec, sc, x, bpr),
                (X8::K6, false) => x86::f32_avx2::group_k6(rec, sc, x, bpr),
                (X8::Codes32(Codes::Nibbles), true) => x86::f32_avx512::group32::<0>(rec, sc, x, bpr),
                (X8::Codes32(Codes::Bytes), true) => x86::f32_avx512::group32::<1>(rec, sc, x, bpr),
                (X8::Codes32(Codes::Levels), true) => x86::f32_avx512::group32::<2>(rec, sc, x, bpr),
                (X8::K4, false) => x86::f32_avx2::group_k(rec, sc, x, sums, bpr),
                (X8::Codes32(Codes::Nibbles), false) => x86::f32_avx2::group32::<0>(rec, sc, x, bpr),
                (X8::Codes32(Codes::Bytes), false) => x86::f32_avx2::group32::<1>(rec, sc, x, bpr),
                (X8::Codes32(Codes::Levels), false) => x86::f32_avx2::group32::<2>(rec, sc, x, bpr),
            }
        };
    }
    let _ = isa;
    match kind {
        X8::K4 => group_k_f32_portable(rec, sc, x, sums, bpr),
        X8::K6 => group_k6_f32_portable(rec, sc, x, bpr),
        X8::Codes32(codes) => group32_f32_portable(codes, rb, rec, sc, x, bpr),
    }
}

/// The sum of 8 FMA chains in the order the SIMD loops add them.
#[inline]
fn chains(a: [f32; 4], b: [f32; 4]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((b[0] + b[1]) + (b[2] + b[3]))
}

/// The portable f32 loop of the 32-element formats: per block column and row,
/// chains `a[l]` and `b[l]` over the four steps (step `s`: Q8_0's loads `2 s`
/// and `2 s + 1`, elements `8 s + l` and `8 s + 4 + l`; Q4_0's and IQ4_NL's load
/// `s`, its low nibbles elements `4 s + l`, its high ones `16 + 4 s + l`).
fn group32_f32_portable(codes: Codes, rb: usize, rec: &[u8], sc: &[f16], x: &[f32], bpr: usize) -> [f32; X8_ROWS] {
    let val = |n: u8| if codes == Codes::Levels { IQ4_LEVELS[n as usize] as f32 } else { (n as i32 - 8) as f32 };
    let mut acc = [0f32; X8_ROWS];
    for c in 0..bpr {
        let r = &rec[c * rb..(c + 1) * rb];
        let xb = &x[QK * c..QK * (c + 1)];
        for (i, acc) in acc.iter_mut().enumerate() {
            let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
            for s in 0..4 {
                for l in 0..4 {
                    let (va, vb, ea, eb) = if codes == Codes::Bytes {
                        (r[64 * s + 4 * i + l] as i8 as f32, r[64 * s + 32 + 4 * i + l] as i8 as f32, 8 * s + l, 8 * s + 4 + l)
                    } else {
                        let v = r[32 * s + 4 * i + l];
                        (val(v & 0x0f), val(v >> 4), 4 * s + l, 16 + 4 * s + l)
                    };
                    a[l] = va.mul_add(xb[ea], a[l]);
                    b[l] = vb.mul_add(xb[eb], b[l]);
                }
            }
            *acc = chains(a, b).mul_add(sc[X8_ROWS * c + i].to_f32(), *acc);
        }
    }
    acc
}

/// The portable f32 loop of Q4_K: per super-block column, row and sub-block
/// pair `p`, chains over the pair's 8 loads (load `s`: low nibbles elements
/// `64 p + 4 s + l` of sub-block `2 p`, high ones `64 p + 32 + 4 s + l` of
/// `2 p + 1`), each sub-block's sum times `d · sc_j`; the minima's
/// `Σ_j mn_j Σx_j` times `dmin`, subtracted at the end.
fn group_k_f32_portable(rec: &[u8], sc: &[f16], x: &[f32], sums: &[f32], bpr: usize) -> [f32; X8_ROWS] {
    let mut acc = [0f32; X8_ROWS];
    let mut accm = [0f32; X8_ROWS];
    for c in 0..bpr {
        let r = &rec[c * X8_BYTES..(c + 1) * X8_BYTES];
        let s16 = &sc[c * 2 * X8_ROWS..(c + 1) * 2 * X8_ROWS];
        let xb = &x[256 * c..256 * (c + 1)];
        for i in 0..X8_ROWS {
            let (d, dmin) = (s16[i].to_f32(), s16[X8_ROWS + i].to_f32());
            for p in 0..4 {
                let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
                for s in 0..8 {
                    for l in 0..4 {
                        let v = r[128 + 32 * (8 * p + s) + 4 * i + l];
                        a[l] = ((v & 0x0f) as f32).mul_add(xb[64 * p + 4 * s + l], a[l]);
                        b[l] = ((v >> 4) as f32).mul_add(xb[64 * p + 32 + 4 * s + l], b[l]);
                    }
                }
                let ((sl, _), (sh, _)) = (x8_scale_min(r, i, 2 * p), x8_scale_min(r, i, 2 * p + 1));
                let (sa, sb) = ((a[0] + a[1]) + (a[2] + a[3]), (b[0] + b[1]) + (b[2] + b[3]));
                acc[i] = sa.mul_add(d * sl as f32, acc[i]);
                acc[i] = sb.mul_add(d * sh as f32, acc[i]);
            }
            let ms = (0..8).fold(0f32, |ms, j| (x8_scale_min(r, i, j).1 as f32).mul_add(sums[8 * c + j], ms));
            accm[i] = ms.mul_add(dmin, accm[i]);
        }
    }
    std::array::from_fn(|i| acc[i] - accm[i])
}

/// The portable f32 loop of Q6_K: per super-block column, row, half `h` and
/// quarter `q` of its runs, for each of the four 16-element groups the runs
/// `4 q..4 q + 4` reach (`s = 0..4`: elements `128 h + 32 s + 16 q..`), chains
/// `ch[s][l]` over the 4 runs of `(code - 32) · x`, summed as
/// `(ch0 + ch1) + (ch2 + ch3)` and times `d · sc_g` (`g = 8 h + 2 s + q`), as
/// the SIMD loops add them.
fn group_k6_f32_portable(rec: &[u8], sc: &[f16], x: &[f32], bpr: usize) -> [f32; X8_ROWS] {
    let mut acc = [0f32; X8_ROWS];
    for c in 0..bpr {
        let r = &rec[c * X8_K6_BYTES..(c + 1) * X8_K6_BYTES];
        let xb = &x[256 * c..256 * (c + 1)];
        for (i, acc) in acc.iter_mut().enumerate() {
            let d = sc[X8_ROWS * c + i].to_f32();
            for h in 0..2 {
                for q in 0..2 {
                    let mut ch = [[0f32; 4]; 4];
                    for t in 4 * q..4 * q + 4 {
                        for (s, ch) in ch.iter_mut().enumerate() {
                            for (l, ch) in ch.iter_mut().enumerate() {
                                let e = 128 * h + 32 * s + 4 * t + l;
                                *ch = ((x8_k6_code(r, i, e) as i32 - 32) as f32).mul_add(xb[e], *ch);
                            }
                        }
                    }
                    for (s, ch) in ch.iter().enumerate() {
                        let sum = (ch[0] + ch[1]) + (ch[2] + ch[3]);
                        *acc = sum.mul_add(d * x8_k6_scale(r, i, 8 * h + 2 * s + q) as f32, *acc);
                    }
                }
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::qdot::{ActVec, dot_q_i8};
    use crate::kernels::cpu::qrow;
    use crate::kernels::cpu::testdata::signed as data;
    use crate::kernels::quant::{QFormat, QMatrix};

    /// The portable loop's dots `portable` of every row of `v` within 1e-4 of
    /// the row dots `want`, and [`rows_x8`] at every ISA, over ranges with
    /// partial groups at either end and two whole groups together, the
    /// portable values bit for bit.
    fn near_the_row_dots_and_simd_as_portable(xq: &XQ8, v: QView<'_>, portable: &[f32], want: &[f32], what: &str) {
        for (r, (p, w)) in portable.iter().zip(want).enumerate() {
            assert!((p - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what} row {r}: {p} vs the row dot {w}");
        }
        let rows = portable.len();
        for isa in [Isa::Scalar, Isa::Simd256, Isa::best()] {
            for (first, len) in [(0, rows), (3, 13), (8, 8), (17, 7), (8, 16)] {
                let mut y = vec![0f32; len];
                rows_x8(isa, xq, v, first, &mut y);
                assert_eq!(y, portable[first..first + len], "{what} {isa:?}: SIMD and portable bit for bit");
            }
        }
    }

    /// What the decode kernels call ([`ActVec::rows`] over the X8 view `v`)
    /// within 1e-4 of the vector's dot with each row of the same matrix in
    /// rows (`rows`, `k` columns).
    fn decode_vector_rows_near_its_row_dots(act: &ActVec<'_>, v: QView<'_>, rows: QView<'_>, k: usize, what: &str) {
        let n = rows.quants.len() / (k / rows.format.block_elems() * rows.format.quant_bytes());
        let mut y = vec![0f32; n];
        act.rows(Isa::best(), v, k, 0, &mut y, false);
        for (r, &y) in y.iter().enumerate() {
            let w = act.dot(Isa::best(), qrow(rows, r, k));
            assert!((y - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what} row {r}: {y} vs {w}");
        }
    }

    /// A token among others gets its lone values bit for bit
    /// ([`rows_x8_tokens`] against [`rows_x8`], 1 to 10 tokens: one pass or
    /// two, at every ISA) over the X8 view `v` of `k` columns (24 rows), rows
    /// 5..22 and 5..24 (partial groups at either end, or two whole groups
    /// after one partial: the K-quants' two groups a pass on AVX-512 VNNI);
    /// activations per 256 where the format's blocks are, else per 32.
    fn tokens_among_others_as_alone(v: QView<'_>, k: usize, what: &str) {
        let per256 = v.format.block_elems() == 256;
        let xs: Vec<XQ8> =
            (0..10).map(|t| if per256 { XQ8::quantize_k(&data(k, 50 + t)) } else { XQ8::quantize(&data(k, 50 + t)) }).collect();
        for isa in [Isa::Scalar, Isa::Simd256, Isa::best()] {
            for (m, (first, count)) in (1..=xs.len()).flat_map(|m| [(m, (5, 17)), (m, (5, 19))]) {
                let mut out = vec![0f32; m * count];
                rows_x8_tokens(isa, m, |t| &xs[t], v, first, count, &mut out);
                for (t, x) in xs[..m].iter().enumerate() {
                    let mut alone = vec![0f32; count];
                    rows_x8(isa, x, v, first, &mut alone);
                    assert_eq!(out[t * count..(t + 1) * count], alone, "{what} {isa:?}: token {t} of {m}");
                }
            }
        }
    }

    #[test]
    fn x8_dots_agree_simd_and_portable_match_the_row_dots_and_batch_as_alone() {
        let (rows, k) = (24, 768);
        let m = QMatrix::quantize(QFormat::Q4_K, rows, k, &data(rows * k, 3)).unwrap();
        let x8 = m.repack_x8();
        let xv = data(k, 9);
        for per256 in [true, false] {
            let xq = if per256 { XQ8::quantize_k(&xv) } else { XQ8::quantize(&xv) };
            let mut want = vec![0f32; rows];
            for (r, o) in want.iter_mut().enumerate() {
                *o = dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k));
            }
            for isa in [Isa::Scalar, Isa::Simd256, Isa::best()] {
                // Unaligned ranges: partial groups at both ends.
                for (first, len) in [(0, rows), (3, 13), (8, 8), (17, 7), (8, 16)] {
                    let mut y = vec![0f32; len];
                    rows_x8(isa, &xq, x8.view(), first, &mut y);
                    for (i, &v) in y.iter().enumerate() {
                        let w = want[first + i];
                        assert!((v - w).abs() <= 1e-4 * (1.0 + w.abs()), "{isa:?} per256 {per256} row {}: {v} vs {w}", first + i);
                    }
                    let mut p = vec![0f32; len];
                    for (i, o) in p.iter_mut().enumerate() {
                        let r = first + i;
                        let g = r / X8_ROWS;
                        let Layout::X8 { bpr } = x8.layout else { unreachable!() };
                        let v = x8.view();
                        let rec = &v.quants[g * bpr * X8_BYTES..(g + 1) * bpr * X8_BYTES];
                        let sc = &v.scales[g * bpr * 16..(g + 1) * bpr * 16];
                        *o = group_portable(rec, sc, &xq, bpr)[r % X8_ROWS];
                    }
                    if per256 {
                        assert_eq!(y, p, "{isa:?}: SIMD and portable bit for bit");
                    }
                }
            }
            tokens_among_others_as_alone(x8.view(), k, "Q4_K");
            // Through the decode activation vector, as the kernels call it.
            let act = ActVec::I8(xq);
            let mut y = vec![0f32; rows];
            act.rows(Isa::best(), x8.view(), k, 0, &mut y, false);
            for (v, w) in y.iter().zip(&want) {
                assert!((v - w).abs() <= 1e-4 * (1.0 + w.abs()));
            }
        }
    }
    /// Q6_K's records: the portable loop within 1e-4 of the row dot with one
    /// activation scale per 256 and per 32; SIMD and portable bit for bit over
    /// partial groups at either end; a token among others gets its lone values
    /// bit for bit ([`rows_x8_tokens`], 1 to 10 tokens: one pass or two); and
    /// the decode's
    /// activation vector takes the loop.
    #[test]
    fn x8_q6k_dots_agree_simd_and_portable_match_the_row_dots_and_batch_as_alone() {
        let (rows, k) = (24, 768);
        let m = QMatrix::quantize(QFormat::Q6_K, rows, k, &data(rows * k, 41)).unwrap();
        let x8 = m.repack_x8();
        let Layout::X8 { bpr } = x8.layout else { panic!("Q6_K not repacked") };
        let v = x8.view();
        for per256 in [true, false] {
            let xv = data(k, 43);
            let xq = if per256 { XQ8::quantize_k(&xv) } else { XQ8::quantize(&xv) };
            let want: Vec<f32> = (0..rows).map(|r| dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k))).collect();
            let portable: Vec<f32> = (0..rows)
                .map(|r| {
                    let g = r / X8_ROWS;
                    let rec = &v.quants[g * bpr * X8_K6_BYTES..(g + 1) * bpr * X8_K6_BYTES];
                    group_k6_portable(rec, &v.scales[g * bpr * X8_ROWS..], &xq, bpr)[r % X8_ROWS]
                })
                .collect();
            near_the_row_dots_and_simd_as_portable(&xq, v, &portable, &want, &format!("Q6_K per256 {per256}"));
        }
        tokens_among_others_as_alone(v, k, "Q6_K");
        let xv = data(k, 44);
        decode_vector_rows_near_its_row_dots(&ActVec::I8(XQ8::quantize_k(&xv)), v, m.view(), k, "Q6_K");
    }

    #[test]
    fn x8_dots_of_the_32_element_formats_agree_simd_and_portable_match_the_row_dots_and_batch_as_alone() {
        let (rows, k) = (24, 320);
        let xv = data(k, 4);
        let xq = XQ8::quantize(&xv);
        for format in [QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL] {
            let m = QMatrix::quantize(format, rows, k, &data(rows * k, 6)).unwrap();
            let x8 = m.repack_x8();
            let Layout::X8 { bpr } = x8.layout else { panic!("{format} not repacked") };
            let (v, rb) = (x8.view(), x8_record_bytes(format));
            let want: Vec<f32> = (0..rows).map(|r| dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k))).collect();
            let portable: Vec<f32> = (0..rows)
                .map(|r| {
                    let g = r / X8_ROWS;
                    let (rec, sc) = (&v.quants[g * bpr * rb..(g + 1) * bpr * rb], &v.scales[g * bpr * 8..(g + 1) * bpr * 8]);
                    let Some(X8::Codes32(codes)) = format.ops().cpu.x8 else { panic!("{format}: not a 32-element X8 layout") };
                    group32_portable(codes, rb, rec, sc, &xq, bpr)[r % X8_ROWS]
                })
                .collect();
            near_the_row_dots_and_simd_as_portable(&xq, v, &portable, &want, &format.to_string());
            tokens_among_others_as_alone(v, k, &format.to_string());
            // Through the decode activation vectors, as the kernels call them.
            for act in [ActVec::I8(XQ8::quantize(&xv)), ActVec::F32(&xv)] {
                decode_vector_rows_near_its_row_dots(&act, v, m.view(), k, &format.to_string());
            }
        }
    }
    /// f32 activations over X8 records ([`rows_x8_f32`]): SIMD and portable loops
    /// bit for bit, within the parity checks' tolerance of the f64 dot with the
    /// dequantized weights, for every repacked format and partial groups at either
    /// end; and what the decode kernels call (`ActVec::F32` rows over an X8 view)
    /// is this loop, bit for bit, not a block-by-block gather.
    #[test]
    fn x8_f32_dots_agree_simd_and_portable_match_the_f64_dots_and_serve_the_f32_activation_vector() {
        use crate::kernels::quant::REPACKABLE;
        let (rows, k) = (24, 512);
        let xv = data(k, 21);
        for format in REPACKABLE {
            let m = QMatrix::quantize(format, rows, k, &data(rows * k, 22)).unwrap();
            let x8 = m.repack_x8();
            assert!(matches!(x8.layout, Layout::X8 { .. }), "{format} not repacked");
            let deq = m.dequantize();
            let exact: Vec<f64> = (0..rows).map(|r| (0..k).map(|i| xv[i] as f64 * deq[r * k + i] as f64).sum()).collect();
            let scale = exact.iter().fold(0f64, |a, v| a.max(v.abs()));
            let mut portable = vec![0f32; rows];
            rows_x8_f32(Isa::Scalar, &xv, x8.view(), 0, &mut portable);
            for (r, (&p, &e)) in portable.iter().zip(&exact).enumerate() {
                assert!((p as f64 - e).abs() <= 5e-4 * scale, "{format} row {r}: {p} vs f64 {e} (scale {scale})");
            }
            for isa in [Isa::Scalar, Isa::Simd256, Isa::best()] {
                for (first, len) in [(0, rows), (3, 13), (8, 8), (17, 7)] {
                    let mut y = vec![0f32; len];
                    rows_x8_f32(isa, &xv, x8.view(), first, &mut y);
                    assert_eq!(y, portable[first..first + len], "{format} {isa:?} rows {first}..: SIMD and portable bit for bit");
                }
            }
            let mut y = vec![0f32; rows];
            ActVec::F32(&xv).rows(Isa::best(), x8.view(), k, 0, &mut y, false);
            let mut want = vec![0f32; rows];
            rows_x8_f32(Isa::best(), &xv, x8.view(), 0, &mut want);
            assert_eq!(y, want, "{format}: ActVec::F32 over X8 records takes the 8-row loop");
        }
    }

    /// Q4_K rows longer than the stack's sub-block sums take the scratch buffer,
    /// with the same results: portable and SIMD bit for bit, close to the f64 dot.
    #[test]
    fn x8_f32_q4k_rows_past_the_stack_sums_take_the_scratch() {
        let (rows, k) = (8, STACK_SUMS * QK + 256);
        let xv = data(k, 31);
        let m = QMatrix::quantize(QFormat::Q4_K, rows, k, &data(rows * k, 32)).unwrap();
        let x8 = m.repack_x8();
        let deq = m.dequantize();
        let exact: Vec<f64> = (0..rows).map(|r| (0..k).map(|i| xv[i] as f64 * deq[r * k + i] as f64).sum()).collect();
        let scale = exact.iter().fold(0f64, |a, v| a.max(v.abs()));
        let (mut p, mut v) = (vec![0f32; rows], vec![0f32; rows]);
        rows_x8_f32(Isa::Scalar, &xv, x8.view(), 0, &mut p);
        rows_x8_f32(Isa::best(), &xv, x8.view(), 0, &mut v);
        assert_eq!(p, v, "SIMD and portable bit for bit");
        for (r, (&p, &e)) in p.iter().zip(&exact).enumerate() {
            assert!((p as f64 - e).abs() <= 5e-4 * scale, "row {r}: {p} vs f64 {e} (scale {scale})");
        }
    }
}
