//! Single-threaded SIMD microkernels on f32 activations and f32 or f16 weight rows:
//! dot products one row or four at a time (the activation vector loaded once for
//! four rows), two activation rows by four weight rows, `axpy`, and the fused
//! add + sum of squares and scale-by-gain passes of the norm kernels.
//!
//! Every path accumulates in f32 with several independent accumulators. Each x86
//! microkernel is written once, generic over the weight element ([`Weight`]: an f32
//! load or an f16 load widened by F16C), so f32 and f16 rows run the same code.

use half::f16;

use super::Isa;
use super::lanes::{Elem, Lanes, isa_dispatch};

/// A row of weights or cached keys/values in one storage type: f32, f16, or
/// q8_0 blocks (a quantized KV cache's rows).
#[derive(Clone, Copy)]
pub enum Row<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8(Q8Row<'a>),
}

/// Elements in q8_0 blocks: 32 signed codes and one half scale a block,
/// element `i` being `d[i / 32] * q[i]` (ggml's `block_q8_0`, its fields apart).
#[derive(Clone, Copy)]
pub struct Q8Row<'a> {
    pub q: &'a [i8],
    pub d: &'a [f16],
}

/// Elements a q8_0 block holds.
pub const Q8_BLOCK: usize = 32;

impl<'a> Q8Row<'a> {
    /// Elements `lo..hi`, `lo` a block's first ([`Row::slice`]).
    pub fn slice(self, lo: usize, hi: usize) -> Q8Row<'a> {
        Q8Row { q: &self.q[lo..hi], d: &self.d[lo / Q8_BLOCK..hi.div_ceil(Q8_BLOCK)] }
    }
}

impl<'a> Row<'a> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Row::F32(w) => w.len(),
            Row::F16(w) => w.len(),
            Row::Q8(w) => w.q.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Elements `lo..hi` (a q8_0 row's from a block's first element: `lo` a
    /// multiple of [`Q8_BLOCK`], as every row of a cache of whole blocks starts).
    pub fn slice(self, lo: usize, hi: usize) -> Row<'a> {
        match self {
            Row::F32(w) => Row::F32(&w[lo..hi]),
            Row::F16(w) => Row::F16(&w[lo..hi]),
            Row::Q8(w) => Row::Q8(w.slice(lo, hi)),
        }
    }
}

impl<'a> From<&'a [f32]> for Row<'a> {
    fn from(v: &'a [f32]) -> Row<'a> {
        Row::F32(v)
    }
}

impl<'a> From<&'a [f16]> for Row<'a> {
    fn from(v: &'a [f16]) -> Row<'a> {
        Row::F16(v)
    }
}

/// `$e` with `$w` bound to the f32 or the f16 slice of a [`Row`] (one generic body
/// for both storage types). A q8_0 row (a KV cache's) does nothing: the float
/// kernels this serves (norm gains) never get one, the registry checks dtypes;
/// kernels that read cached rows use [`with_elems!`].
macro_rules! with_row {
    ($row:expr, |$w:ident| $e:expr) => {
        match $row {
            $crate::kernels::cpu::Row::F32($w) => $e,
            $crate::kernels::cpu::Row::F16($w) => $e,
            $crate::kernels::cpu::Row::Q8(_) => {}
        }
    };
}
pub(crate) use with_row;

/// `$e` with `$a` and `$b` bound to the slices of two rows of the same storage type
/// (the registry checks both against the variant's dtype; mixed rows do nothing).
macro_rules! with_row_pair {
    ($ra:expr, $rb:expr, |$a:ident, $b:ident| $e:expr) => {
        match ($ra, $rb) {
            ($crate::kernels::cpu::Row::F32($a), $crate::kernels::cpu::Row::F32($b)) => $e,
            ($crate::kernels::cpu::Row::F16($a), $crate::kernels::cpu::Row::F16($b)) => $e,
            _ => {}
        }
    };
}
pub(crate) use with_row_pair;

/// `$e` with `$w` bound to a [`Row`]'s elements as an [`Elems`] (a slice of f32
/// or f16, or q8_0 blocks): one generic body for every storage type.
macro_rules! with_elems {
    ($row:expr, |$w:ident| $e:expr) => {
        match $row {
            $crate::kernels::cpu::Row::F32($w) => $e,
            $crate::kernels::cpu::Row::F16($w) => $e,
            $crate::kernels::cpu::Row::Q8($w) => $e,
        }
    };
}

/// A row's elements as lanes: `N` at a time from any element a multiple of `N`
/// (a q8_0 vector never straddles two blocks: `N` divides 32), or one at a time.
pub trait Elems: Copy {
    /// Elements `i..i + L::N` widened to f32.
    fn at<L: Lanes>(self, l: L, i: usize) -> L::V;
    /// Element `i`.
    fn get(self, i: usize) -> f32;
    /// Elements.
    fn count(self) -> usize;
}

impl<W: Elem> Elems for &[W] {
    #[inline(always)]
    fn at<L: Lanes>(self, l: L, i: usize) -> L::V {
        W::load(l, &self[i..])
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        self[i].f32()
    }
    #[inline(always)]
    fn count(self) -> usize {
        self.len()
    }
}

impl Elems for Q8Row<'_> {
    #[inline(always)]
    fn at<L: Lanes>(self, l: L, i: usize) -> L::V {
        l.mul(l.splat_f16(self.d[i / Q8_BLOCK]), l.load_i8(&self.q[i..]))
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        self.d[i / Q8_BLOCK].to_f32() * f32::from(self.q[i])
    }
    #[inline(always)]
    fn count(self) -> usize {
        self.q.len()
    }
}

/// A weight element the SIMD microkernels load (f32, or f16 widened on load).
#[cfg(target_arch = "x86_64")]
pub trait Weight: Elem + x86::Load {}
/// A weight element the SIMD microkernels load (f32, or f16 widened on load).
#[cfg(not(target_arch = "x86_64"))]
pub trait Weight: Elem {}
impl Weight for f32 {}
impl Weight for f16 {}

/// `Σ x[i] * w[i]` over `x.len()` elements.
#[inline]
pub fn dot(isa: Isa, x: &[f32], w: Row<'_>) -> f32 {
    match w {
        Row::F32(w) => dot_f32(isa, x, w),
        Row::F16(w) => dot_f16(isa, x, w),
        Row::Q8(w) => dot_q8(isa, x, w),
    }
}

/// `Σ x[i] * w[i]` over a q8_0 row: per block `d * Σ x[i] * q[i]` (the codes
/// widened to f32, the block's sum in lanes, then scaled into the row's lanes).
pub fn dot_q8(isa: Isa, x: &[f32], w: Q8Row<'_>) -> f32 {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: Q8Row<'_> = w) -> f32 {
        let mut out = [0.0f32];
        dot_q8_k(l, x, [w], &mut out);
        out[0]
    })
}

/// Four q8_0 dot products sharing `x` (each `x` vector loaded once for the four
/// rows), each as [`dot_q8`] computes it alone.
pub fn dot4_q8(isa: Isa, x: &[f32], w: [Q8Row<'_>; 4]) -> [f32; 4] {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: [Q8Row<'_>; 4] = w) -> [f32; 4] {
        let mut out = [0.0f32; 4];
        dot_q8_k(l, x, w, &mut out);
        out
    })
}

/// [`dot_rows`] over q8_0 rows in one call of the ISA's function (a decode's
/// keys: 64 values a row, where a call per four rows cost more than its sums):
/// [`dot4_q8`]'s values on each four rows, [`dot_q8`]'s on the rest.
fn dot_rows_q8(isa: Isa, x: &[f32], w: Q8Row<'_>, out: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, w: Q8Row<'_> = w, out: &mut [f32] = out) -> () {
        let n = x.len();
        let row = |c: usize| w.slice(c * n, (c + 1) * n);
        let mut c = 0;
        while c + 4 <= out.len() {
            let mut four = [0.0f32; 4];
            dot_q8_k(l, x, [row(c), row(c + 1), row(c + 2), row(c + 3)], &mut four);
            out[c..c + 4].copy_from_slice(&four);
            c += 4;
        }
        while c < out.len() {
            let mut one = [0.0f32];
            dot_q8_k(l, x, [row(c)], &mut one);
            out[c] = one[0];
            c += 1;
        }
    })
}

/// `R` q8_0 dot products sharing `x`: a row's blocks each summed in lanes and
/// added to the row's lanes times the block's scale (one conversion of the
/// scale a block, not one a vector); elements past the whole blocks one by one.
/// A row's value does not depend on `R`.
#[inline(always)]
fn dot_q8_k<L: Lanes, const R: usize>(l: L, x: &[f32], w: [Q8Row<'_>; R], out: &mut [f32; R]) {
    let n = w.iter().fold(x.len(), |m, r| m.min(r.q.len()));
    let blocks = n / Q8_BLOCK;
    let mut acc = [l.splat(0.0); R];
    for b in 0..blocks {
        let base = b * Q8_BLOCK;
        let mut t = [l.splat(0.0); R];
        let mut c = 0;
        while c < Q8_BLOCK {
            let xv = l.load(&x[base + c..]);
            for (t, r) in t.iter_mut().zip(&w) {
                *t = l.fma(xv, l.load_i8(&r.q[base + c..]), *t);
            }
            c += L::N;
        }
        for ((a, t), r) in acc.iter_mut().zip(t).zip(&w) {
            *a = l.fma(l.splat_f16(r.d[b]), t, *a);
        }
    }
    // A loop, not a closure (`array::from_fn`): a closure does not take the
    // target features, and `hsum` would stay a call (see `Lanes`).
    for ((o, a), r) in out.iter_mut().zip(acc).zip(&w) {
        let mut s = l.hsum(a);
        for (i, xi) in x[..n].iter().enumerate().skip(blocks * Q8_BLOCK) {
            s += xi * r.get(i);
        }
        *o = s;
    }
}

/// Four dot products sharing `x`.
#[inline]
pub fn dot4(isa: Isa, x: &[f32], w: [Row<'_>; 4]) -> [f32; 4] {
    match w {
        [Row::F32(a), Row::F32(b), Row::F32(c), Row::F32(d)] => dot4_f32(isa, x, [a, b, c, d]),
        [Row::F16(a), Row::F16(b), Row::F16(c), Row::F16(d)] => dot4_f16(isa, x, [a, b, c, d]),
        [Row::Q8(a), Row::Q8(b), Row::Q8(c), Row::Q8(d)] => dot4_q8(isa, x, [a, b, c, d]),
        _ => [dot(isa, x, w[0]), dot(isa, x, w[1]), dot(isa, x, w[2]), dot(isa, x, w[3])],
    }
}

/// `out[c] = x · w_c` over `out.len()` rows of `w` (`x.len()` elements each,
/// back to back: a cache's consecutive keys of one head): the bits of [`dot4`]
/// on each four rows from the first and [`dot`] on the rest, in one call.
pub fn dot_rows(isa: Isa, x: &[f32], w: Row<'_>, out: &mut [f32]) {
    let n = x.len();
    let rows = out.len().min(w.len().checked_div(n).unwrap_or(out.len()));
    let out = &mut out[..rows];
    if let Row::Q8(w) = w {
        return dot_rows_q8(isa, x, w, out);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (both arms): `Isa::from_param`/`best` only yield levels the CPU
        // reports; `w` holds `rows` rows of `n`.
        match (isa, w) {
            (Isa::Avx512, Row::F32(w)) => return unsafe { x86::dot_rows_avx512(x, &w[..rows * n], out) },
            (Isa::Avx512, Row::F16(w)) => return unsafe { x86::dot_rows_avx512(x, &w[..rows * n], out) },
            (Isa::Simd256, Row::F32(w)) => return unsafe { x86::dot_rows_avx2(x, &w[..rows * n], out) },
            (Isa::Simd256, Row::F16(w)) => return unsafe { x86::dot_rows_avx2(x, &w[..rows * n], out) },
            _ => {}
        }
    }
    let row = |c: usize| w.slice(c * n, (c + 1) * n);
    let mut c = 0;
    while c + 4 <= rows {
        out[c..c + 4].copy_from_slice(&dot4(isa, x, [row(c), row(c + 1), row(c + 2), row(c + 3)]));
        c += 4;
    }
    for (c, o) in out.iter_mut().enumerate().skip(c) {
        *o = dot(isa, x, row(c));
    }
}

pub fn dot_f32(isa: Isa, x: &[f32], w: &[f32]) -> f32 {
    #[cfg(target_arch = "aarch64")]
    if isa != Isa::Scalar {
        let n = x.len().min(w.len());
        // SAFETY: NEON is reported by the CPU (checked in `Isa::best`).
        return unsafe { arm::dot_f32_neon(&x[..n], &w[..n]) };
    }
    dot_w(isa, x, w)
}

pub fn dot_f16(isa: Isa, x: &[f32], w: &[f16]) -> f32 {
    dot_w(isa, x, w)
}

fn dot_w<W: Weight>(isa: Isa, x: &[f32], w: &[W]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (the AVX2 level includes FMA and F16C).
        Isa::Simd256 => unsafe { x86::dot_avx2(x, w) },
        _ => dot_scalar(x, w),
    }
}

pub fn dot4_f32(isa: Isa, x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
    dot4_w(isa, x, w, dot_f32)
}

pub fn dot4_f16(isa: Isa, x: &[f32], w: [&[f16]; 4]) -> [f32; 4] {
    dot4_w(isa, x, w, dot_f16)
}

fn dot4_w<W: Weight>(isa: Isa, x: &[f32], w: [&[W]; 4], one: fn(Isa, &[f32], &[W]) -> f32) -> [f32; 4] {
    let n = w.iter().fold(x.len(), |m, r| m.min(r.len()));
    let x = &x[..n];
    let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::from_param`/`best` only yield levels the CPU reports.
        Isa::Avx512 => unsafe { x86::dot4_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Simd256 => unsafe { x86::dot4_avx2(x, w) },
        _ => w.map(|r| one(isa, x, r)),
    }
}

/// `y[i] += a * x[i]`.
pub fn axpy(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    axpy_row(isa, a, Row::F32(x), y)
}

/// `y += a * x` for a row of any storage type (one FMA per lane on the SIMD levels).
#[inline]
pub fn axpy_row(isa: Isa, a: f32, x: Row<'_>, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (a: f32 = a, x: Row<'_> = x, y: &mut [f32] = y) -> () {
        with_elems!(x, |x| axpy_k(l, a, x, y))
    })
}

#[inline(always)]
fn axpy_k<L: Lanes, R: Elems>(l: L, a: f32, x: R, y: &mut [f32]) {
    let n = x.count().min(y.len());
    let y = &mut y[..n];
    let av = l.splat(a);
    let mut ys = y.chunks_exact_mut(L::N);
    for (c, yc) in (&mut ys).enumerate() {
        let v = l.fma(av, x.at(l, c * L::N), l.load(yc));
        l.store(yc, v);
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o += a * x.get(t + i);
    }
}

/// `out = x` widened to f32 (a q8_0 row exactly: a half scale times an 8-bit
/// code is an f32), `x.len()` elements.
pub fn widen_row(isa: Isa, x: Row<'_>, out: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: Row<'_> = x, out: &mut [f32] = out) -> () {
        with_elems!(x, |x| widen_k(l, x, out))
    })
}

#[inline(always)]
fn widen_k<L: Lanes, R: Elems>(l: L, x: R, out: &mut [f32]) {
    let n = x.count().min(out.len());
    let full = n - n % L::N;
    for (c, o) in out[..full].chunks_exact_mut(L::N).enumerate() {
        l.store(o, x.at(l, c * L::N));
    }
    for (i, o) in out[..n].iter_mut().enumerate().skip(full) {
        *o = x.get(i);
    }
}

/// `o = Σ_r w[r] * v_r` over the rows `v_r` of `v` (`w.len()` rows of `o.len()`
/// elements, back to back: a cache's consecutive keys of one head): the same
/// per-element FMA chain as `o.fill(0)` and then [`axpy_row`] a row at a time,
/// so the same bits, but one call for all the rows and each block of `o` kept
/// in registers across them (a decode's softmax-weighted values).
pub fn weighted_rows(isa: Isa, w: &[f32], v: Row<'_>, o: &mut [f32]) {
    isa_dispatch!(isa, |l| (w: &[f32] = w, v: Row<'_> = v, o: &mut [f32] = o) -> () {
        with_elems!(v, |v| weighted_heads_k(l, w, w.len(), v, o, o.len(), false))
    })
}

/// `o += Σ_r w[r] * v_r`: [`weighted_rows`] continuing each element's FMA chain
/// from `o`, so rows given in several calls (a paged cache's blocks) give the
/// bits of one call over them all.
pub fn weighted_rows_add(isa: Isa, w: &[f32], v: Row<'_>, o: &mut [f32]) {
    isa_dispatch!(isa, |l| (w: &[f32] = w, v: Row<'_> = v, o: &mut [f32] = o) -> () {
        with_elems!(v, |v| weighted_heads_k(l, w, w.len(), v, o, o.len(), true))
    })
}

/// [`weighted_rows`] (`add`: [`weighted_rows_add`]) of several heads over the
/// same rows: head `h`'s weights `w[h * stride..][..rows]`, its outputs
/// `o[h * d..][..d]`, `d` the rows' width. Each row's vectors are loaded
/// (widened) once for up to four heads; every head's element keeps the FMA
/// chain of its own call, so the bits of a call a head.
pub fn weighted_rows_heads(isa: Isa, w: &[f32], stride: usize, v: Row<'_>, o: &mut [f32], d: usize, add: bool) {
    isa_dispatch!(isa, |l| (w: &[f32] = w, stride: usize = stride, v: Row<'_> = v, o: &mut [f32] = o, d: usize = d, add: bool = add) -> () {
        with_elems!(v, |v| weighted_heads_k(l, w, stride, v, o, d, add))
    })
}

/// What [`weighted_heads_cols`] reads: head `g`'s weights `w[g * stride..][..rows]`
/// over the rows of `v` (`d` elements each), continuing `o` when `add`.
#[derive(Clone, Copy)]
struct Weighted<'a, R> {
    w: &'a [f32],
    stride: usize,
    rows: usize,
    v: R,
    d: usize,
    add: bool,
}

/// The weighted sums of [`weighted_rows_heads`] (one head: [`weighted_rows`]),
/// up to four heads and four vector columns a pass over the rows; the
/// columns past the whole vectors one element at a time.
#[inline(always)]
fn weighted_heads_k<L: Lanes, R: Elems>(l: L, w: &[f32], stride: usize, v: R, o: &mut [f32], d: usize, add: bool) {
    if d == 0 {
        return;
    }
    let heads = o.len() / d;
    let rows = (v.count() / d).min(stride);
    let full = d - d % L::N;
    let mut h = 0;
    while h < heads {
        let n = (heads - h).min(4);
        let s = Weighted { w: &w[h * stride..], stride, rows, v, d, add };
        let os = &mut o[h * d..(h + n) * d];
        let mut c0 = 0;
        while c0 < full {
            c0 = match n {
                1 => weighted_heads_step::<L, R, 1>(l, s, c0, full, os),
                2 => weighted_heads_step::<L, R, 2>(l, s, c0, full, os),
                3 => weighted_heads_step::<L, R, 3>(l, s, c0, full, os),
                _ => weighted_heads_step::<L, R, 4>(l, s, c0, full, os),
            };
        }
        for (g, o) in os.chunks_exact_mut(d).enumerate() {
            let w = &s.w[g * stride..][..rows];
            for (i, oi) in o[full..].iter_mut().enumerate() {
                let mut acc = if add { *oi } else { 0.0 };
                for (r, &a) in w.iter().enumerate() {
                    acc += a * v.get(r * d + full + i);
                }
                *oi = acc;
            }
        }
        h += n;
    }
}

/// The next pass of `H` heads from column `c0`: as many vector columns as
/// remain before `full`, up to four.
#[inline(always)]
fn weighted_heads_step<L: Lanes, R: Elems, const H: usize>(l: L, s: Weighted<'_, R>, c0: usize, full: usize, o: &mut [f32]) -> usize {
    match (full - c0) / L::N {
        1 => weighted_heads_cols::<L, R, H, 1>(l, s, c0, o),
        2 => weighted_heads_cols::<L, R, H, 2>(l, s, c0, o),
        3 => weighted_heads_cols::<L, R, H, 3>(l, s, c0, o),
        _ => weighted_heads_cols::<L, R, H, 4>(l, s, c0, o),
    }
}

/// Vector columns `c0..c0 + B * L::N` of `H` heads: per row, the row's `B`
/// vectors widened once and added into each head's chains (each element's
/// chain that of its head alone); returns the next column.
#[inline(always)]
fn weighted_heads_cols<L: Lanes, R: Elems, const H: usize, const B: usize>(l: L, s: Weighted<'_, R>, c0: usize, o: &mut [f32]) -> usize {
    let d = s.d;
    let mut acc = [[l.splat(0.0); B]; H];
    if s.add {
        for (g, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = l.load(&o[g * d + c0 + j * L::N..]);
            }
        }
    }
    for r in 0..s.rows {
        let mut x = [l.splat(0.0); B];
        for (j, x) in x.iter_mut().enumerate() {
            *x = s.v.at(l, r * d + c0 + j * L::N);
        }
        for (g, acc) in acc.iter_mut().enumerate() {
            let a = l.splat(s.w[g * s.stride + r]);
            for (acc, &x) in acc.iter_mut().zip(&x) {
                *acc = l.fma(a, x, *acc);
            }
        }
    }
    for (g, acc) in acc.into_iter().enumerate() {
        for (j, acc) in acc.into_iter().enumerate() {
            l.store(&mut o[g * d + c0 + j * L::N..], acc);
        }
    }
    c0 + B * L::N
}

/// Portable dot product: eight interleaved accumulators.
pub fn dot_scalar<W: Elem>(x: &[f32], w: &[W]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += x[c * 8 + l] * w[c * 8 + l].f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..x.len() {
        s += x[i] * w[i].f32();
    }
    s
}

pub fn dot_f32_scalar(x: &[f32], w: &[f32]) -> f32 {
    dot_scalar(x, w)
}

/// `h = x + r`; returns `Σ h²`. `Isa::Simd256` and `Isa::Avx512` both take the
/// AVX2+FMA path on x86 (memory-bound); other targets use portable loops.
pub fn add_sumsq(isa: Isa, x: &[f32], r: &[f32], h: &mut [f32]) -> f32 {
    let n = x.len().min(r.len()).min(h.len());
    let (x, r, h) = (&x[..n], &r[..n], &mut h[..n]);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 and FMA are reported by the CPU; slices have equal length n.
        return unsafe { x86::add_sumsq(x, r, h) };
    }
    let _ = isa;
    let mut acc = [0f32; 8];
    let body = n / 8 * 8;
    for ((hc, xc), rc) in h[..body].chunks_exact_mut(8).zip(x.chunks_exact(8)).zip(r.chunks_exact(8)) {
        for (l, a) in acc.iter_mut().enumerate() {
            let v = xc[l] + rc[l];
            hc[l] = v;
            *a += v * v;
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in body..n {
        let v = x[i] + r[i];
        h[i] = v;
        s += v * v;
    }
    s
}

/// `dst[i] = src[i] * s * g[i]` (AVX2+FMA on x86 at any SIMD level).
pub fn scale_mul(isa: Isa, src: &[f32], s: f32, g: &[f32], dst: &mut [f32]) {
    let n = src.len().min(g.len()).min(dst.len());
    let (src, g, dst) = (&src[..n], &g[..n], &mut dst[..n]);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 and FMA are reported by the CPU; slices have equal length n.
        unsafe { x86::scale_mul(src, s, g, dst) };
        return;
    }
    let _ = isa;
    for ((d, v), w) in dst.iter_mut().zip(src).zip(g) {
        *d = v * s * w;
    }
}

/// Dot products of two activation rows with four weight rows: `[[x0·w_r], [x1·w_r]]`
/// (AVX2+FMA on x86 at any SIMD level: register-limited at 2x4).
pub fn dot2x4(isa: Isa, x0: &[f32], x1: &[f32], w: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let n = w.iter().fold(x0.len().min(x1.len()), |m, r| m.min(r.len()));
    let w = [&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]];
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 and FMA are reported by the CPU; all six slices have length >= n.
        return unsafe { x86::dot2x4(&x0[..n], &x1[..n], w) };
    }
    [dot4_f32(isa, &x0[..n], w), dot4_f32(isa, &x1[..n], w)]
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(target_arch = "aarch64")]
mod arm;

#[cfg(test)]
mod tests {
    use super::super::testdata;
    use super::*;

    /// The many-row calls give the bits of the row-at-a-time calls they
    /// replace: [`weighted_rows`] the axpy chain, [`dot_rows`] [`dot4`] on each
    /// four rows and [`dot`] on the rest; at every ISA, row width (whole
    /// vectors, a remainder, less than a vector), row count and storage type.
    #[test]
    fn many_row_calls_are_the_row_calls_bit_for_bit() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for d in [1, 7, 16, 32, 64, 72, 80, 96, 129] {
            for n in [0, 1, 5, 8, 11, 33] {
                let (w, x) = (testdata::signed(n, d as u64), testdata::signed(d, 3 + d as u64));
                let v = testdata::signed(n * d, 7 + d as u64);
                let vh: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                let vq = q8(&v);
                for isa in [Isa::Scalar, Isa::from_param(2), Isa::best()] {
                    // q8_0 rows where a row is whole blocks (a KV cache's).
                    let q8_rows = d.is_multiple_of(Q8_BLOCK).then(|| Row::Q8(q8_row(&vq)));
                    for rows in [Row::F32(&v), Row::F16(&vh)].into_iter().chain(q8_rows) {
                        let row = |r: usize| rows.slice(r * d, (r + 1) * d);
                        let mut chain = vec![0.0f32; d];
                        for (r, &a) in w.iter().enumerate() {
                            axpy_row(isa, a, row(r), &mut chain);
                        }
                        let mut one = vec![f32::NAN; d];
                        weighted_rows(isa, &w, rows, &mut one);
                        assert_eq!(bits(&one), bits(&chain), "weighted_rows {isa:?} d={d} n={n}");
                        let mut each = Vec::new();
                        while each.len() + 4 <= n {
                            let c = each.len();
                            each.extend(dot4(isa, &x, [row(c), row(c + 1), row(c + 2), row(c + 3)]));
                        }
                        while each.len() < n {
                            each.push(dot(isa, &x, row(each.len())));
                        }
                        let mut dots = vec![f32::NAN; n];
                        dot_rows(isa, &x, rows, &mut dots);
                        assert_eq!(bits(&dots), bits(&each), "dot_rows {isa:?} d={d} n={n}");
                        // Three heads over the same rows: each its own call's bits.
                        let ws: Vec<f32> = (0..3).flat_map(|h| w.iter().map(move |&a| a * (h as f32 + 0.5))).collect();
                        let mut heads = vec![f32::NAN; 3 * d];
                        let mut alone = vec![f32::NAN; 3 * d];
                        for (h, o) in alone.chunks_exact_mut(d).enumerate() {
                            weighted_rows(isa, &ws[h * n..(h + 1) * n], rows, o);
                        }
                        weighted_rows_heads(isa, &ws, n, rows, &mut heads, d, false);
                        assert_eq!(bits(&heads), bits(&alone), "weighted_rows_heads {isa:?} d={d} n={n}");
                        for (h, o) in alone.chunks_exact_mut(d).enumerate() {
                            weighted_rows_add(isa, &ws[h * n..(h + 1) * n], rows, o);
                        }
                        weighted_rows_heads(isa, &ws, n, rows, &mut heads, d, true);
                        assert_eq!(bits(&heads), bits(&alone), "weighted_rows_heads add {isa:?} d={d} n={n}");
                        // Rows in two calls (a paged cache's blocks) continue the chains.
                        let cut = n / 2;
                        let mut two = vec![f32::NAN; d];
                        weighted_rows(isa, &w[..cut], rows.slice(0, cut * d), &mut two);
                        weighted_rows_add(isa, &w[cut..], rows.slice(cut * d, n * d), &mut two);
                        assert_eq!(bits(&two), bits(&one), "weighted_rows_add {isa:?} d={d} n={n}");
                    }
                }
            }
        }
    }

    /// `v` (whole blocks of 32) quantized to q8_0.
    fn q8(v: &[f32]) -> crate::kernels::quant::QMatrix {
        let n = v.len() / Q8_BLOCK * Q8_BLOCK;
        crate::kernels::quant::QMatrix::quantize(crate::kernels::quant::QFormat::Q8_0, n / Q8_BLOCK, Q8_BLOCK, &v[..n])
            .expect("whole blocks")
    }

    fn q8_row(m: &crate::kernels::quant::QMatrix) -> Q8Row<'_> {
        Q8Row { q: bytemuck::cast_slice(&m.quants), d: &m.scales }
    }

    /// A q8_0 row reads as its dequantized values: dots, axpy and weighted sums
    /// against f64 over `QMatrix::dequantize`'s values, at every ISA.
    #[test]
    fn q8_rows_read_as_their_dequantized_values() {
        for blocks in [1, 2, 3, 8, 9] {
            let n = blocks * Q8_BLOCK;
            let (x, w) = (testdata::signed(n, 40 + n as u64), testdata::signed(3 * n, 41 + n as u64));
            let m = q8(&w);
            let deq = m.dequantize();
            let row = Row::Q8(q8_row(&m));
            let exact: f64 = x.iter().zip(&deq).map(|(a, b)| *a as f64 * *b as f64).sum();
            for isa in [Isa::Scalar, Isa::from_param(2), Isa::best()] {
                let tol = 1e-5 * n as f64;
                assert!((dot(isa, &x, row.slice(0, n)) as f64 - exact).abs() < tol, "dot q8 {isa:?} n={n}");
                let mut y = x.clone();
                axpy_row(isa, 0.5, row.slice(0, n), &mut y);
                for i in 0..n {
                    assert!((y[i] - (x[i] + 0.5 * deq[i])).abs() < 1e-6, "axpy q8 {isa:?} n={n}");
                }
                let a = [0.25f32, -0.5, 2.0];
                let mut o = vec![0.0; n];
                weighted_rows(isa, &a, row, &mut o);
                for i in 0..n {
                    let want: f64 = (0..3).map(|r| a[r] as f64 * deq[r * n + i] as f64).sum();
                    assert!((o[i] as f64 - want).abs() < 1e-5, "weighted q8 {isa:?} n={n}");
                }
            }
        }
    }

    #[test]
    fn every_isa_matches_f64_dot_at_odd_lengths() {
        for n in [0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 1153] {
            let (x, w) = (testdata::signed(n, 2 * n as u64), testdata::signed(n, 2 * n as u64 + 1));
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let exact: f64 = x.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum();
            let exact_h: f64 = x.iter().zip(&wh).map(|(a, b)| *a as f64 * b.to_f64()).sum();
            for isa in [Isa::Scalar, Isa::from_param(2), Isa::best()] {
                let tol = 1e-5 * (n as f64).max(1.0);
                assert!((dot_f32(isa, &x, &w) as f64 - exact).abs() < tol, "f32 {isa:?} n={n}");
                assert!((dot_f16(isa, &x, &wh) as f64 - exact_h).abs() < tol, "f16 {isa:?} n={n}");
                let four = dot4_f32(isa, &x, [&w, &w, &w, &w]);
                let four_h = dot4_f16(isa, &x, [&wh, &wh, &wh, &wh]);
                for r in 0..4 {
                    assert!((four[r] as f64 - exact).abs() < tol, "dot4 f32 {isa:?} n={n}");
                    assert!((four_h[r] as f64 - exact_h).abs() < tol, "dot4 f16 {isa:?} n={n}");
                }
                let mut y = x.clone();
                axpy(isa, 0.5, &w, &mut y);
                for i in 0..n {
                    assert!((y[i] - (x[i] + 0.5 * w[i])).abs() < 1e-6);
                }
                let mut yh = x.clone();
                axpy_row(isa, 0.5, Row::F16(&wh), &mut yh);
                for i in 0..n {
                    assert!((yh[i] - (x[i] + 0.5 * wh[i].to_f32())).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn fused_microkernels_agree_across_isas() {
        let n = 67;
        let (x, r) = (testdata::signed(n, 1), testdata::signed(n, 2));
        let ws: Vec<Vec<f32>> = (0..4).map(|s| testdata::uniform(n, 3 + s, -0.2, 0.2)).collect();
        for v in super::super::ISA_VALUES {
            let isa = Isa::from_param(*v);
            let mut h = vec![0f32; n];
            let ss = add_sumsq(isa, &x, &r, &mut h);
            let want: f64 = x.iter().zip(&r).map(|(a, b)| ((a + b) as f64).powi(2)).sum();
            assert!((ss as f64 - want).abs() < 1e-4 * want.max(1.0));
            let mut y = vec![0f32; n];
            scale_mul(isa, &h, 0.5, &x, &mut y);
            for i in 0..n {
                assert!((y[i] - h[i] * 0.5 * x[i]).abs() < 1e-6);
            }
            let d = dot2x4(isa, &x, &r, [&ws[0], &ws[1], &ws[2], &ws[3]]);
            for (t, xt) in [&x, &r].iter().enumerate() {
                for (j, wr) in ws.iter().enumerate() {
                    let want: f64 = xt.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((d[t][j] as f64 - want).abs() < 1e-4, "isa {v} token {t} row {j}");
                }
            }
        }
    }
}
