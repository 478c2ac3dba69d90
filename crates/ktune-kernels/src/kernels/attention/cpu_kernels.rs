//! The CPU attention kernels: a call's operands ([`Kv`]), the online-softmax row
//! and score rows they share, prefill by (token, head) rows or by key tiles per
//! (token block, KV head), decode by heads or by split-KV partials merged per head.

use super::shape::{Paged, PagedSeq, Shape, shape_or_invalid};
use crate::device::CpuCaps;
use crate::kernels::contract::{CpuArgs, CpuIn, KernelDef, KernelError, Params, param};
use crate::kernels::cpu;
use crate::kernels::cpu::{Isa, Row, axpy_row, row, sub_row};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;

/// What every CPU attention kernel starts from: the checked shape, the ISA level,
/// the caches and the queries.
fn cpu_call<'a>(kd: &KernelDef, prob: &Problem, params: &Params, a: &CpuArgs<'a>) -> Result<(Shape, Isa, Kv<'a>, &'a [f32]), KernelError> {
    let s = shape_or_invalid(kd, prob)?;
    Ok((s, Isa::of(params)?, Kv { k: a.ins[1], v: a.ins[2], s, table: None }, a.ins[0].f32()))
}

pub(super) fn check_cpu(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    whole_blocks(Shape::checked(prob)?.d, dtype)?;
    Isa::param_available(param(params, "isa")?)
}

pub(super) fn check_paged_cpu(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    whole_blocks(Paged::checked(prob)?.d, dtype)?;
    Isa::param_available(param(params, "isa")?)
}

/// The cache types the CPU kernels read: f32, f16, and q8_0 blocks (llama.cpp's
/// `-ctk q8_0 -ctv q8_0`).
pub(super) const KV_TYPES: &[DType] = &[DType::F32, DType::F16, DType::Q8_0];

/// A q8_0 cache holds each cached row (`head_dim` values) in whole blocks of 32.
fn whole_blocks(head_dim: usize, dtype: DType) -> Result<(), String> {
    if dtype == DType::Q8_0 && !head_dim.is_multiple_of(cpu::Q8_BLOCK) {
        return Err(format!(
            "a q8_0 KV cache keeps each row in blocks of {}; head_dim = {head_dim} is not a multiple (use an f16 or f32 cache)",
            cpu::Q8_BLOCK
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// CPU orchestration

#[inline]
fn scale_in_place(y: &mut [f32], c: f32) {
    for v in y {
        *v *= c;
    }
}

/// Cache operands of one call: a head-major cache, or a paged pool's blocks
/// through one sequence's table (`(blocks, page)`, [`Problem::AttentionPaged`]).
#[derive(Clone, Copy)]
struct Kv<'a> {
    k: CpuIn<'a>,
    v: CpuIn<'a>,
    s: Shape,
    table: Option<(&'a [f32], usize)>,
}

impl<'a> Kv<'a> {
    /// Cache row of key `j` of KV head `kh`.
    fn row_of(&self, kh: usize, j: usize) -> usize {
        match self.table {
            None => self.s.row_of(kh, j),
            Some((t, page)) => (t[j / page] as usize * self.s.kv_heads + kh) * page + j % page,
        }
    }
    /// The end of the run of consecutive cache rows key `j` starts (its block's).
    fn run_end(&self, j: usize) -> usize {
        self.table.map_or(usize::MAX, |(_, page)| (j / page + 1) * page)
    }
    fn k(&self, kh: usize, j: usize) -> Row<'a> {
        row(self.k, self.row_of(kh, j), self.s.d)
    }
    fn v(&self, kh: usize, j: usize) -> Row<'a> {
        row(self.v, self.row_of(kh, j), self.s.d)
    }
    /// Whether the cache holds q8_0 blocks.
    fn q8(&self) -> bool {
        matches!(self.k, CpuIn::Q(_))
    }
    /// Keys or values `lo..hi` of KV head `kh` widened to f32 into `out` (a
    /// q8_0 cache's exactly), row after row.
    fn widen(&self, isa: Isa, keys: bool, kh: usize, (lo, hi): (usize, usize), out: &mut Vec<f32>) {
        let d = self.s.d;
        out.resize((hi - lo) * d, 0.0);
        for (j, o) in (lo..hi).zip(out.chunks_exact_mut(d)) {
            cpu::widen_row(isa, if keys { self.k(kh, j) } else { self.v(kh, j) }, o);
        }
    }
    /// `o = Σ_j w[j - lo] * V[j]` over keys `lo..hi` of KV head `kh`, for
    /// each query head of `w`'s rows (of `hi - lo` weights) into `o`'s (of
    /// `d`): over each run of consecutive cache rows, every head's sums at
    /// once ([`cpu::weighted_rows_heads`]: a row widened once for them all;
    /// the later runs continuing the sums), the bits of one
    /// [`cpu::weighted_rows`] a head over all the keys.
    fn weighted_values(&self, isa: Isa, kh: usize, (lo, hi): (usize, usize), w: &[f32], o: &mut [f32]) {
        let (d, n) = (self.s.d, hi - lo);
        let heads = w.len() / n.max(1);
        let mut j = lo;
        while j < hi {
            let end = self.run_end(j).min(hi);
            let rows = sub_row(self.v, self.row_of(kh, j), d, 0, (end - j) * d);
            cpu::weighted_rows_heads(isa, &w[j - lo..], n, rows, &mut o[..heads * d], d, j != lo);
            j = end;
        }
    }
}

/// One query row with a per-key online softmax: the accumulator is rescaled only
/// when the running maximum grows.
fn attend_online(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, (lo, hi): (usize, usize), o: &mut [f32]) {
    o.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0f32;
    for j in lo..hi {
        let sc = cpu::dot(isa, q, kv.k(kh, j)) * kv.s.scale;
        if sc > m {
            let c = (m - sc).exp();
            if l > 0.0 {
                scale_in_place(o, c);
                l *= c;
            }
            m = sc;
        }
        let pj = (sc - m).exp();
        l += pj;
        axpy_row(isa, pj, kv.v(kh, j), o);
    }
    scale_in_place(o, 1.0 / l);
}

/// Scores `scale * q · K[j]` for `j` in `lo..lo + out.len()`, four K rows per
/// microkernel call from `lo` when `four` (through a paged table too: the
/// same groups of four, so the same bits as a head-major cache's).
fn scores_into(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, lo: usize, four: bool, out: &mut [f32]) {
    if four {
        let d = kv.s.d;
        // Whole groups of four within a run of consecutive rows in one call (a
        // head-major cache: one run); a group across two blocks (a window's
        // first key off the groups of four) gathered; the rest one row a call.
        let mut c = 0;
        while c + 4 <= out.len() {
            let j = lo + c;
            let whole = (kv.run_end(j) - j).min(out.len() - c) / 4 * 4;
            if whole > 0 {
                cpu::dot_rows(isa, q, sub_row(kv.k, kv.row_of(kh, j), d, 0, whole * d), &mut out[c..c + whole]);
                c += whole;
            } else {
                out[c..c + 4].copy_from_slice(&cpu::dot4(isa, q, [kv.k(kh, j), kv.k(kh, j + 1), kv.k(kh, j + 2), kv.k(kh, j + 3)]));
                c += 4;
            }
        }
        for (c, o) in out.iter_mut().enumerate().skip(c) {
            *o = cpu::dot(isa, q, kv.k(kh, lo + c));
        }
        out.iter_mut().for_each(|o| *o *= kv.s.scale);
        return;
    }
    for (c, o) in out.iter_mut().enumerate() {
        *o = cpu::dot(isa, q, kv.k(kh, lo + c)) * kv.s.scale;
    }
}

/// One query row with an exact two-pass softmax: every score into `sc` (one per
/// key), the softmax, then the weighted values.
#[allow(clippy::too_many_arguments)]
fn attend_two_pass(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, keys: (usize, usize), four: bool, sc: &mut [f32], o: &mut [f32]) {
    scores_into(isa, kv, q, kh, keys.0, four, sc);
    crate::kernels::act::softmax_in_place(isa, sc);
    kv.weighted_values(isa, kh, keys, sc, o);
}

/// The query heads of KV head `kh` (its GQA group, `q` their rows side by
/// side) of one decode token, each as [`attend_two_pass`] computes it alone:
/// the same microkernel calls on the same rows, so the same bits, but a run of
/// cache rows at a time for the whole group (each block's keys scored for every
/// head, then its values added into every head), so a paged cache's keys and
/// values come from memory once a group instead of once a head. `sc` holds
/// the group's score rows (`group * keys` floats), `o` its outputs. Where the
/// runs would cut [`scores_into`]'s groups of four (a window from a key off
/// them, blocks of a length not a multiple of four), head after head as alone.
#[allow(clippy::too_many_arguments)]
fn attend_group_two_pass(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, keys: (usize, usize), four: bool, sc: &mut [f32], o: &mut [f32]) {
    let (d, g_n, (lo, hi)) = (kv.s.d, kv.s.group(), keys);
    let n = hi - lo;
    let aligned = !four || (lo.is_multiple_of(4) && kv.table.is_none_or(|(_, page)| page.is_multiple_of(4)));
    if !aligned {
        for g in 0..g_n {
            attend_two_pass(isa, kv, &q[g * d..][..d], kh, keys, four, &mut sc[g * n..][..n], &mut o[g * d..][..d]);
        }
        return;
    }
    let mut j = lo;
    while j < hi {
        let end = kv.run_end(j).min(hi);
        for g in 0..g_n {
            scores_into(isa, kv, &q[g * d..][..d], kh, j, four, &mut sc[g * n + j - lo..g * n + end - lo]);
        }
        j = end;
    }
    for g in 0..g_n {
        crate::kernels::act::softmax_in_place(isa, &mut sc[g * n..][..n]);
    }
    kv.weighted_values(isa, kh, keys, &sc[..g_n * n], &mut o[..g_n * d]);
}

/// Turns scores into `exp(s - max)` in place; returns `(max, sum)`.
fn exp_row(sc: &mut [f32]) -> (f32, f32) {
    let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0.0;
    for v in sc.iter_mut() {
        *v = (*v - m).exp();
        l += *v;
    }
    (m, l)
}

// ---------------------------------------------------------------------------
// CPU: prefill

pub(super) fn run_prefill_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let d = s.d;
    let out = &mut a.outs[0][..s.tokens * s.heads * d];
    cpu::pool::for_chunks_mut(out, d * grain, |ci, chunk| {
        for (ri, o) in chunk.chunks_mut(d).enumerate() {
            let r = ci * grain + ri;
            let (i, h) = (r / s.heads, r % s.heads);
            attend_online(isa, &kv, &q[r * d..][..d], h / s.group(), s.range(i), o);
        }
    });
    Ok(())
}

/// `block` tokens starting at `i0`, all query heads of KV head `kh`, over key tiles of
/// `bkv` rows: scores of every row for the tile first (materialised), then one
/// rescale per row and the P·V update with each V row shared by all rows.
/// Returns the outputs, row `(token, g)` at `(t * group + g) * d`.
fn prefill_block(isa: Isa, kv: &Kv<'_>, q: &[f32], i0: usize, block: usize, kh: usize, bkv: usize) -> Vec<f32> {
    let s = kv.s;
    let (g_n, d) = (s.group(), s.d);
    let rows = block * g_n;
    let mut acc = vec![0.0f32; rows * d];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut sc = vec![0.0f32; rows * bkv];
    // A q8_0 cache's tile widened to f32 once for all the block's rows (each
    // value is exact in f32, so the values' sums are those of the blocks read
    // in place; the scores those of f32 keys).
    let (q8, mut kt, mut vt) = (kv.q8(), Vec::new(), Vec::new());
    // Tiles start at multiples of `bkv` from key 0, wherever the pass or the
    // block begins: a query row's online softmax then sees the same tiles (the
    // same rescales, the same sums) however the prompt was cut into passes.
    let klo = s.range(i0).0 / bkv * bkv;
    let khi = s.range(i0 + block - 1).1;
    let mut t0 = klo;
    while t0 < khi {
        let t1 = (t0 + bkv).min(khi);
        let n = t1 - t0;
        if q8 {
            kv.widen(isa, true, kh, (t0, t1), &mut kt);
            kv.widen(isa, false, kh, (t0, t1), &mut vt);
        }
        for t in 0..block {
            let (lo, hi) = s.range(i0 + t);
            let (a, b) = (lo.max(t0), hi.min(t1));
            for g in 0..g_n {
                let r = t * g_n + g;
                let srow = &mut sc[r * bkv..][..n];
                srow.fill(0.0);
                if a >= b {
                    continue;
                }
                let h = kh * g_n + g;
                let qr = &q[((i0 + t) * s.heads + h) * d..][..d];
                if q8 {
                    let out = &mut srow[a - t0..b - t0];
                    cpu::dot_rows(isa, qr, Row::F32(&kt[(a - t0) * d..(b - t0) * d]), out);
                    out.iter_mut().for_each(|o| *o *= s.scale);
                } else {
                    scores_into(isa, kv, qr, kh, a, true, &mut srow[a - t0..b - t0]);
                }
                let mt = srow[a - t0..b - t0].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mn = m[r].max(mt);
                let c = (m[r] - mn).exp();
                if l[r] > 0.0 {
                    scale_in_place(&mut acc[r * d..][..d], c);
                    l[r] *= c;
                }
                m[r] = mn;
                for v in srow[a - t0..b - t0].iter_mut() {
                    *v = (*v - mn).exp();
                    l[r] += *v;
                }
            }
        }
        for c in 0..n {
            let vr = if q8 { Row::F32(&vt[c * d..][..d]) } else { kv.v(kh, t0 + c) };
            for r in 0..rows {
                let pr = sc[r * bkv + c];
                if pr != 0.0 {
                    axpy_row(isa, pr, vr, &mut acc[r * d..][..d]);
                }
            }
        }
        t0 = t1;
    }
    for r in 0..rows {
        scale_in_place(&mut acc[r * d..][..d], 1.0 / l[r]);
    }
    acc
}

pub(super) fn run_prefill_tiled(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let bq = (param(params, "block_q")? as usize).max(1);
    let bkv = (param(params, "block_kv")? as usize).max(1);
    let (g_n, d) = (s.group(), s.d);
    let tasks: Vec<(usize, usize)> = (0..s.tokens.div_ceil(bq)).flat_map(|b| (0..s.kv_heads).map(move |kh| (b, kh))).collect();
    let mut blocks: Vec<(usize, usize, usize, Vec<f32>)> =
        tasks.iter().map(|&(b, kh)| (b * bq, bq.min(s.tokens - b * bq), kh, Vec::new())).collect();
    cpu::pool::for_chunks_mut(&mut blocks, 1, |_, t| {
        let (i0, block, kh, acc) = &mut t[0];
        *acc = prefill_block(isa, &kv, q, *i0, *block, *kh, bkv);
    });
    let out = &mut a.outs[0];
    for (i0, block, kh, acc) in blocks {
        put_block(out, s.heads * d, g_n * d, (i0, block, kh), &acc);
    }
    Ok(())
}

/// A [`prefill_block`]'s outputs (`block` tokens from token `i0`, the `gd`
/// floats a token of KV head `kh`'s query heads) into `out`'s rows of `row`
/// floats (every head of a token).
fn put_block(out: &mut [f32], row: usize, gd: usize, (i0, block, kh): (usize, usize, usize), acc: &[f32]) {
    for t in 0..block {
        let dst = (i0 + t) * row + kh * gd;
        out[dst..dst + gd].copy_from_slice(&acc[t * gd..][..gd]);
    }
}

// ---------------------------------------------------------------------------
// CPU: a paged batch

/// Every sequence of a paged batch as the runtime's defaults run it alone: a
/// decode token (one query) as `attention_decode_heads_cpu` does (the exact
/// two-pass softmax, four K rows a call; a task per KV head, its query heads a
/// block at a time: [`attend_group_two_pass`]), a prefill chunk
/// as `attention_prefill_tiled_cpu` does (tasks of `block_q` queries and a KV
/// head over key tiles of `block_kv`); the keys read through the sequence's
/// table, the values a block at a time. Each sequence's outputs do not depend on
/// the others in the batch, and are the bits of those kernels over a head-major
/// cache holding the same rows.
pub(super) fn run_paged(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (p, isa, seqs) = paged_call(kd, prob, params, &a)?;
    let bq = (param(params, "block_q")? as usize).max(1);
    let bkv = (param(params, "block_kv")? as usize).max(1);
    let q = a.ins[0].f32();
    let (g_n, d, hd) = (p.group(), p.d, p.heads * p.d);
    // The outputs of every (token, KV head): its group's query heads side by
    // side, `g_n * d` floats, each task writing its own in place.
    let mut pieces: Vec<Option<&mut [f32]>> = a.outs[0][..p.tokens * hd].chunks_mut(g_n * d).map(Some).collect();
    let mut take = |t: usize, kh: usize| pieces.get_mut(t * p.kv_heads + kh).and_then(Option::take);
    // (sequence, first query, queries, KV head (a decode token's: its group of
    // query heads), the outputs of its queries)
    type Task<'o> = (usize, usize, usize, usize, smallvec::SmallVec<[&'o mut [f32]; 1]>);
    let blocks: usize = seqs.iter().map(|sq| sq.s.tokens.div_ceil(if sq.s.tokens == 1 { 1 } else { bq })).sum();
    let mut tasks: Vec<Task<'_>> = Vec::with_capacity(blocks * p.kv_heads);
    for (si, sq) in seqs.iter().enumerate() {
        for i0 in (0..sq.s.tokens).step_by(if sq.s.tokens == 1 { 1 } else { bq }) {
            let block = bq.min(sq.s.tokens - i0);
            for kh in 0..p.kv_heads {
                let outs: Option<smallvec::SmallVec<_>> = (0..block).map(|t| take(sq.t0 + i0 + t, kh)).collect();
                let outs =
                    outs.ok_or_else(|| KernelError::Invalid { kernel: kd.id.to_string(), reason: "the table's sequences overlap".into() })?;
                tasks.push((si, i0, block, kh, outs));
            }
        }
    }
    let pools = (a.ins[1], a.ins[2]);
    cpu::pool::for_chunks_mut(&mut tasks, 1, |_, t| {
        let (si, i0, block, head, outs) = &mut t[0];
        let sq = &seqs[*si];
        let kv = paged_kv(pools, &p, sq);
        if sq.s.tokens == 1 {
            let keys = sq.s.range(0);
            let q = &q[(sq.t0 * p.heads + *head * g_n) * d..][..g_n * d];
            PAGED_SCORES.with(|sc| {
                let mut sc = sc.borrow_mut();
                let need = sc.len().max(g_n * (keys.1 - keys.0));
                sc.resize(need, 0.0);
                attend_group_two_pass(isa, &kv, q, *head, keys, true, &mut sc, outs[0]);
            });
        } else {
            let acc = prefill_block(isa, &kv, &q[sq.t0 * hd..], *i0, *block, *head, bkv);
            for (o, acc) in outs.iter_mut().zip(acc.chunks_exact(g_n * d)) {
                o.copy_from_slice(acc);
            }
        }
    });
    Ok(())
}

thread_local! {
    /// A paged decode token's score rows (its group's), held by each pool worker.
    static PAGED_SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Every (query row, head) of a paged batch as `attention_prefill_cpu` runs a
/// call's: pool tasks of `rows_per_task` rows, a per-key online softmax each.
pub(super) fn run_paged_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (p, isa, seqs) = paged_call(kd, prob, params, &a)?;
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let (d, q) = (p.d, a.ins[0].f32());
    // The sequence of each query row.
    let of_row: Vec<usize> = seqs.iter().enumerate().flat_map(|(si, sq)| std::iter::repeat_n(si, sq.s.tokens)).collect();
    let a = &mut a;
    let ins = (a.ins[1], a.ins[2]);
    let out = &mut a.outs[0][..p.tokens * p.heads * d];
    cpu::pool::for_chunks_mut(out, d * grain, |ci, chunk| {
        for (ri, o) in chunk.chunks_mut(d).enumerate() {
            let r = ci * grain + ri;
            let (t, h) = (r / p.heads, r % p.heads);
            let sq = &seqs[of_row[t]];
            attend_online(isa, &paged_kv(ins, &p, sq), &q[r * d..][..d], h / p.group(), sq.s.range(t - sq.t0), o);
        }
    });
    Ok(())
}

/// What both paged kernels start from: the checked batch, the ISA level and the
/// sequences its table describes (a table the pool cannot serve is `Invalid`).
fn paged_call<'a>(
    kd: &KernelDef,
    prob: &Problem,
    params: &Params,
    a: &CpuArgs<'a>,
) -> Result<(Paged, Isa, Vec<PagedSeq<'a>>), KernelError> {
    if prob.op() != kd.op {
        return Err(crate::kernels::contract::wrong_op(kd, prob));
    }
    let invalid = |reason: String| KernelError::Invalid { kernel: kd.id.to_string(), reason };
    let p = Paged::checked(prob).map_err(invalid)?;
    let isa = Isa::of(params)?;
    let seqs = p.sequences(a.ins[3].f32()).map_err(invalid)?;
    Ok((p, isa, seqs))
}

/// A sequence's K/V: the pools through its table.
fn paged_kv<'a>((k, v): (CpuIn<'a>, CpuIn<'a>), p: &Paged, sq: &PagedSeq<'a>) -> Kv<'a> {
    Kv { k, v, s: sq.s, table: Some((sq.table, p.page)) }
}

// ---------------------------------------------------------------------------
// CPU: decode

thread_local! {
    /// Every query head's score row (decode), held by the calling thread and
    /// reused across calls: the pool's workers get their rows from it, so which
    /// worker runs which head never decides whether a call allocates.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(super) fn run_decode_heads(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let four = param(params, "keys_per_call")? == 4;
    let d = s.d;
    let (lo, hi) = s.range(0);
    let n = hi - lo; // at least the query's own key
    cpu::with_scratch_cap(&SCORES, s.heads * n, s.heads * s.kv_cap, |scores| {
        cpu::pool::for_chunks_mut2(&mut a.outs[0][..s.heads * d], d, scores, n, |h, o, sc| {
            attend_two_pass(isa, &kv, &q[h * d..][..d], h / s.group(), (lo, hi), four, sc, o);
        })
    });
    Ok(())
}

thread_local! {
    /// Split-KV decode: every split's partial softmax states and score rows, held
    /// by the calling thread and sized for the cache once.
    static SPLIT_PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static SPLIT_SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keys `a..b` of KV head `kh` for all the query heads of its group: each K row is
/// scored against every query of the group, each V row accumulated into all of
/// them. `parts` gets per query head `[max, sum, acc[d]]`; `sc` holds the group's
/// score rows (`g_n * (b - a)` floats at least).
#[allow(clippy::too_many_arguments)]
fn split_partials(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, a: usize, b: usize, parts: &mut [f32], sc: &mut [f32]) {
    let s = kv.s;
    let (g_n, d, n) = (s.group(), s.d, b - a);
    for c in 0..n {
        let kr = kv.k(kh, a + c);
        for g in 0..g_n {
            sc[g * n + c] = cpu::dot(isa, &q[(kh * g_n + g) * d..][..d], kr) * s.scale;
        }
    }
    for (row, part) in sc[..g_n * n].chunks_mut(n).zip(parts.chunks_mut(d + 2)) {
        let (m, l) = exp_row(row);
        part[0] = m;
        part[1] = l;
        part[2..].fill(0.0);
    }
    for c in 0..n {
        let vr = kv.v(kh, a + c);
        for (g, part) in parts.chunks_mut(d + 2).enumerate() {
            axpy_row(isa, sc[g * n + c], vr, &mut part[2..]);
        }
    }
}

pub(super) fn run_decode_splitkv(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let chunk = (param(params, "chunk")? as usize).max(1);
    let (g_n, d) = (s.group(), s.d);
    let (lo, hi) = s.range(0);
    let splits = (hi - lo).div_ceil(chunk);
    let most = s.kv_heads * s.kv_cap.div_ceil(chunk);
    let (per_part, per_sc) = (g_n * (d + 2), g_n * chunk.min(hi - lo));
    // parts[(kh * splits + c) * per_part ..]: query head g's [max, sum, acc]
    cpu::with_scratch_cap(&SPLIT_PARTS, s.kv_heads * splits * per_part, most * per_part, |parts| {
        cpu::with_scratch_cap(&SPLIT_SCORES, s.kv_heads * splits * per_sc, most * g_n * chunk, |scores| {
            cpu::pool::for_chunks_mut2(parts, per_part, scores, per_sc, |t, p, sc| {
                let (kh, c) = (t / splits, t % splits);
                let a0 = lo + c * chunk;
                split_partials(isa, &kv, q, kh, a0, (a0 + chunk).min(hi), p, sc);
            });
        });
        let parts = &*parts;
        cpu::pool::for_chunks_mut(&mut a.outs[0][..s.heads * d], d, |h, o| {
            let (kh, g) = (h / g_n, h % g_n);
            let mine = |c: usize| &parts[(kh * splits + c) * per_part + g * (d + 2)..][..d + 2];
            let mx = (0..splits).map(|c| mine(c)[0]).fold(f32::NEG_INFINITY, f32::max);
            o.fill(0.0);
            let mut l = 0.0;
            for c in 0..splits {
                let p = mine(c);
                let w = (p[0] - mx).exp();
                l += w * p[1];
                cpu::axpy(isa, w, &p[2..], o);
            }
            scale_in_place(o, 1.0 / l);
        });
    });
    Ok(())
}
