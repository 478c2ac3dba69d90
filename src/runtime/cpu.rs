//! The CPU executor: plan buffers as host vectors, kernel steps through the CPU
//! kernels of the registry, parallel groups (q/k/v, gate/up) run concurrently on
//! the kernels' thread pool (`kernels::cpu::pool`), and the runtime's own data
//! movement (QKV split, bias, KV-cache write).

use std::time::Instant;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::{RuntimeError, SlotTimes};
use crate::kernels::memory::huge_pages;
use crate::kernels::quant::{QFormat, QMatrix, QStack, quantize_block};
use crate::kernels::{CpuArgs, CpuIn, DType};
use crate::plan::{BufId, Plan, Plumb, Step, StepKind};

/// One host buffer in its storage type.
#[derive(Clone)]
pub enum HostBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// A block-quantized weight matrix.
    Q(QMatrix),
    /// A weight stacked from row blocks in different block formats (per-operand
    /// formats: a fused projection whose parts the file stores differently).
    Stack(QStack),
    /// A weight shared with other engines of the same model (read only).
    Shared(std::sync::Arc<HostBuf>),
}

impl HostBuf {
    /// Backs this buffer's memory with huge pages where the system offers them
    /// ([`huge_pages`]): a decode step streams every weight once.
    pub(crate) fn back_with_huge_pages(&self) {
        match self {
            HostBuf::F32(v) => huge_pages(v),
            HostBuf::F16(v) => huge_pages(v),
            HostBuf::Q(m) => m.huge_pages(),
            HostBuf::Stack(st) => st.parts.iter().for_each(QMatrix::huge_pages),
            HostBuf::Shared(b) => b.back_with_huge_pages(),
        }
    }

    /// This buffer, elements `first..` of a tensor, with the tensor's rows
    /// multiplied by `scale` (a family's multiplier folded in at load; a shared
    /// buffer is copied first).
    pub fn scaled(self, first: usize, scale: &crate::model::RowScale) -> HostBuf {
        match self {
            HostBuf::F32(mut v) => {
                v.iter_mut().enumerate().for_each(|(i, x)| *x *= scale.of_elem(first + i));
                HostBuf::F32(v)
            }
            HostBuf::F16(mut v) => {
                v.iter_mut().enumerate().for_each(|(i, x)| *x = f16::from_f32(x.to_f32() * scale.of_elem(first + i)));
                HostBuf::F16(v)
            }
            HostBuf::Q(mut m) => {
                let r0 = first / m.cols.max(1);
                m.scale_rows(|r| scale.of(r0 + r));
                HostBuf::Q(m)
            }
            HostBuf::Stack(mut st) => {
                let mut r0 = first / st.cols().max(1);
                for m in &mut st.parts {
                    m.scale_rows(|r| scale.of(r0 + r));
                    r0 += m.rows;
                }
                HostBuf::Stack(st)
            }
            HostBuf::Shared(b) => std::sync::Arc::unwrap_or_clone(b).scaled(first, scale),
        }
    }

    /// Sets a float buffer to zeros, its whole pages handed back to the system
    /// until written again ([`crate::kernels::memory::release_zeroed`]); other
    /// kinds are left as they are (a KV cache is f32, f16 or q8_0 blocks,
    /// whose codes and scales are released alike).
    pub fn release_zeroed(&mut self) {
        match self {
            HostBuf::F32(v) => crate::kernels::memory::release_zeroed(v),
            HostBuf::F16(v) => crate::kernels::memory::release_zeroed(v),
            HostBuf::Q(m) => {
                crate::kernels::memory::release_zeroed(&mut m.quants);
                crate::kernels::memory::release_zeroed(&mut m.scales);
            }
            _ => {}
        }
    }

    /// A zeroed buffer (a quantized one as all-zero blocks, one block a row).
    pub fn zeros(dtype: DType, len: usize) -> HostBuf {
        match (dtype, dtype.quant()) {
            (_, Some(format)) => {
                let blocks = format.blocks_for(len);
                HostBuf::Q(QMatrix {
                    format,
                    rows: blocks,
                    cols: format.block_elems(),
                    quants: vec![0; blocks * format.quant_bytes()],
                    scales: vec![f16::ZERO; blocks * format.scales_per_block()],
                    layout: Default::default(),
                })
            }
            (DType::F16, _) => HostBuf::F16(vec![f16::ZERO; len]),
            _ => HostBuf::F32(vec![0.0; len]),
        }
    }
    fn as_in(&self) -> CpuIn<'_> {
        match self {
            HostBuf::F32(v) => CpuIn::F32(v),
            HostBuf::F16(v) => CpuIn::F16(v),
            HostBuf::Q(m) => CpuIn::Q(m.view()),
            HostBuf::Stack(st) => CpuIn::Stack(st),
            HostBuf::Shared(b) => b.as_in(),
        }
    }
    /// Elements (a quantized matrix: rows x cols).
    pub fn len(&self) -> usize {
        match self {
            HostBuf::F32(v) => v.len(),
            HostBuf::F16(v) => v.len(),
            HostBuf::Q(m) => m.rows * m.cols,
            HostBuf::Stack(st) => st.rows() * st.cols(),
            HostBuf::Shared(b) => b.len(),
        }
    }
    /// The bytes of a GPU buffer holding this (a quantized matrix in its
    /// single-buffer layout).
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            HostBuf::F32(v) => bytemuck::cast_slice(&v).to_vec(),
            HostBuf::F16(v) => bytemuck::cast_slice::<f16, u8>(&v).to_vec(),
            HostBuf::Q(m) => m.gpu_bytes(),
            HostBuf::Stack(st) => st.gpu_bytes(),
            HostBuf::Shared(b) => std::sync::Arc::unwrap_or_clone(b).into_bytes(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// This buffer's own values (a shared one copied unless this was its last holder).
    pub fn owned(self) -> HostBuf {
        match self {
            HostBuf::Shared(b) => std::sync::Arc::unwrap_or_clone(b).owned(),
            b => b,
        }
    }
    /// This buffer behind one shared pointer (a shared one is not wrapped again).
    pub fn into_arc(self) -> std::sync::Arc<HostBuf> {
        match self {
            HostBuf::Shared(b) => b,
            b => std::sync::Arc::new(b),
        }
    }
}

/// Buffers of a plan on the host.
pub struct CpuExec {
    pub bufs: Vec<HostBuf>,
    /// A paged KV cache in the plan's cache buffers (None: each buffer one
    /// sequence's head-major cache).
    pub paged: Option<Paged>,
}

/// A paged KV cache on the executor ([`super::Engine::enable_paged`]): the plan's
/// cache buffers hold a pool of blocks (`[blocks, kv_heads, page, head_dim]`
/// each), and the pass's sequences are the rows of `pages` (each `[q_len,
/// kv_len, its blocks…]` as f32, [`Problem::AttentionPaged`]'s table), which the
/// KV writes follow and the attention steps read through `kernel`, one call for
/// every sequence of the pass.
pub struct Paged {
    pub blocks: usize,
    /// The plan's cache buffers (the pools).
    pub caches: Vec<BufId>,
    pub kernel: &'static crate::kernels::KernelDef,
    pub params: crate::kernels::Params,
    /// This pass's sequences' table rows.
    pub tables: super::kv_pool::PassTables,
}

impl Paged {
    /// Where the row of position `p` of KV head `h` lies in a pool of `kv_heads`
    /// heads of `d`, for the pass's sequence `s`.
    fn row_at(&self, s: usize, h: usize, p: usize, kv_heads: usize, d: usize) -> usize {
        let page = self.tables.page;
        ((self.tables.table(s)[p / page] as usize * kv_heads + h) * page + p % page) * d
    }
}

fn f32s<'a>(bufs: &'a [HostBuf], id: BufId, what: &str) -> Result<&'a [f32], RuntimeError> {
    let b = match bufs.get(id) {
        Some(HostBuf::Shared(b)) => Some(&**b),
        other => other,
    };
    match b {
        Some(HostBuf::F32(v)) => Ok(v),
        _ => Err(RuntimeError::Internal(format!("{what}: buffer {id} is not an f32 buffer"))),
    }
}

fn f32s_mut<'a>(bufs: &'a mut [HostBuf], id: BufId, what: &str) -> Result<&'a mut Vec<f32>, RuntimeError> {
    match bufs.get_mut(id) {
        Some(HostBuf::F32(v)) => Ok(v),
        _ => Err(RuntimeError::Internal(format!("{what}: buffer {id} is not an f32 buffer"))),
    }
}

/// A kernel step's output buffers, taken out of the executor while it runs.
type Taken = smallvec::SmallVec<[(BufId, Vec<f32>); 4]>;

/// One row of a decode batch's position-dependent kernels (one job): its rows
/// of each step's outputs and how its calls went.
type RowJob<'a> = (smallvec::SmallVec<[smallvec::SmallVec<[&'a mut [f32]; 2]>; 2]>, Result<(), RuntimeError>);

/// An f32 buffer's values, through a shared weight.
fn f32_of(b: &HostBuf) -> Option<&[f32]> {
    match b {
        HostBuf::F32(v) => Some(v),
        HostBuf::Shared(b) => f32_of(b),
        _ => None,
    }
}

/// Buffer `a` mutably and buffer `b` shared (two different buffers).
fn two<'a>(bufs: &'a mut [HostBuf], a: BufId, b: BufId, what: &str) -> Result<(&'a mut HostBuf, &'a HostBuf), RuntimeError> {
    if a == b || a >= bufs.len() || b >= bufs.len() {
        return Err(RuntimeError::Internal(format!("{what}: buffers {a} and {b} must be two different buffers")));
    }
    Ok(if a < b {
        let (lo, hi) = bufs.split_at_mut(b);
        (&mut lo[a], &hi[0])
    } else {
        let (lo, hi) = bufs.split_at_mut(a);
        (&mut hi[0], &lo[b])
    })
}

/// Runs a kernel step on `bufs` (its inputs) and `outs` (its taken outputs);
/// with a paged KV cache an attention step is the paged kernel's call over the
/// pass's sequences (the step's inputs and the table).
fn call(bufs: &[HostBuf], paged: Option<&Paged>, step: &Step, outs: &mut Taken) -> Result<(), RuntimeError> {
    let StepKind::Kernel { kernel, params, problem, .. } = &step.kind else { return Ok(()) };
    let mut ins: crate::kernels::contract::CpuIns<'_> = step.reads().map(|b| bufs[b].as_in()).collect();
    let paged_problem = match paged {
        Some(pg) => pg.tables.problem(problem)?,
        None => None,
    };
    let (kernel, problem, params) = match (paged, &paged_problem) {
        (Some(pg), Some(p)) => {
            ins.push(CpuIn::F32(&pg.tables.pages));
            (pg.kernel, p, &pg.params)
        }
        _ => (*kernel, problem, params),
    };
    let args = CpuArgs { ins, outs: outs.iter_mut().map(|(_, v)| v.as_mut_slice()).collect() };
    kernel.run_cpu_planned(problem, params, args).map_err(|e| RuntimeError::Kernel {
        slot: step.slot.name().into(),
        layer: step.layer,
        source: Box::new(e),
    })
}

impl CpuExec {
    /// Host buffers for `plan`, weights filled by `fill(buffer index, decl)`.
    pub fn new(plan: &Plan, mut fill: impl FnMut(usize) -> Result<Option<HostBuf>, RuntimeError>) -> Result<CpuExec, RuntimeError> {
        let mut bufs = Vec::with_capacity(plan.buffers.len());
        for (i, b) in plan.buffers.iter().enumerate() {
            let hb = match fill(i)? {
                Some(h) => {
                    if h.len() != b.len {
                        return Err(RuntimeError::Internal(format!(
                            "buffer `{}` filled with {} elements, expected {}",
                            b.name,
                            h.len(),
                            b.len
                        )));
                    }
                    h
                }
                None => match &b.constant {
                    Some(c) => HostBuf::F32(c.clone()),
                    None => HostBuf::zeros(b.dtype, b.len),
                },
            };
            bufs.push(hb);
        }
        for (hb, b) in bufs.iter().zip(&plan.buffers) {
            if b.role == crate::plan::BufRole::Weight {
                hb.back_with_huge_pages();
            }
        }
        Ok(CpuExec { bufs, paged: None })
    }

    /// Runs `steps` in order, timing each slot. Allocates nothing: kernel calls
    /// are built in inline vectors from the steps' precomputed output masks, and
    /// run without the per-call check (the plan checked the bindings).
    pub fn run(&mut self, steps: &[Step], times: &mut SlotTimes) -> Result<(), RuntimeError> {
        let mut i = 0;
        while i < steps.len() {
            // A parallel group: consecutive kernel steps sharing a group number.
            let mut j = i + 1;
            if let Some(g) = steps[i].group {
                while j < steps.len() && steps[j].group == Some(g) {
                    j += 1;
                }
            }
            let t0 = Instant::now();
            if j - i > 1 {
                self.run_group(&steps[i..j])?;
            } else {
                self.run_one(&steps[i])?;
            }
            let dt = t0.elapsed().as_secs_f64();
            let n = (j - i) as f64;
            for s in &steps[i..j] {
                times.add(s.slot, dt / n);
            }
            i = j;
        }
        Ok(())
    }

    /// Takes a kernel step's output buffers out of `bufs` (left empty, no
    /// allocation) in binding order.
    fn take_outs(&mut self, step: &Step) -> Result<Taken, RuntimeError> {
        let mut outs = Taken::new();
        if let StepKind::Kernel { kernel, .. } = &step.kind {
            for b in step.writes() {
                outs.push((b, std::mem::take(f32s_mut(&mut self.bufs, b, kernel.id)?)));
            }
        }
        Ok(outs)
    }

    fn put_back(&mut self, outs: Taken) {
        for (b, v) in outs {
            self.bufs[b] = HostBuf::F32(v);
        }
    }

    fn run_one(&mut self, step: &Step) -> Result<(), RuntimeError> {
        match &step.kind {
            StepKind::Kernel { .. } => {
                let mut outs = self.take_outs(step)?;
                let res = call(&self.bufs, self.paged.as_ref(), step, &mut outs);
                self.put_back(outs);
                res
            }
            StepKind::Plumb(p) => self.plumb(p),
        }
    }

    /// Independent kernels run concurrently; each writes its own outputs.
    fn run_group(&mut self, steps: &[Step]) -> Result<(), RuntimeError> {
        if steps.iter().any(|s| !matches!(s.kind, StepKind::Kernel { .. })) {
            for s in steps {
                self.run_one(s)?;
            }
            return Ok(());
        }
        let mut jobs: smallvec::SmallVec<[(Taken, Result<(), RuntimeError>); 4]> = smallvec::SmallVec::new();
        for step in steps {
            jobs.push((self.take_outs(step)?, Ok(())));
        }
        {
            // One pool task per kernel; each kernel's own parallel loop then runs
            // inline on its task's thread, which sees the caller's kept GEMM
            // panels too (else an engine of decode batches packs the panels of
            // its parallel projections every pass).
            use crate::kernels::cpu::qgemm::{active_panels, with_panels};
            let (bufs, paged, kept) = (&self.bufs, self.paged.as_ref(), active_panels());
            crate::kernels::cpu::pool::for_chunks_mut(&mut jobs, 1, |i, job| {
                let (outs, res) = &mut job[0];
                *res = match &kept {
                    Some(p) => with_panels(p, || call(bufs, paged, &steps[i], outs)),
                    None => call(bufs, paged, &steps[i], outs),
                };
            });
        }
        let mut first_err = Ok(());
        for (outs, res) in jobs {
            self.put_back(outs);
            if first_err.is_ok() {
                first_err = res;
            }
        }
        first_err
    }

    fn plumb(&mut self, p: &Plumb) -> Result<(), RuntimeError> {
        match *p {
            Plumb::SplitQkv { src, bias, q, k, v, tokens, nq, nkv } => {
                let w = nq + 2 * nkv;
                let mut taken = [q, k, v].map(|id| f32s_mut(&mut self.bufs, id, "split_qkv").map(std::mem::take));
                let res: Result<(), RuntimeError> = (|| {
                    let s = f32s(&self.bufs, src, "split_qkv")?;
                    let b = match bias {
                        Some(b) => Some(f32s(&self.bufs, b, "split_qkv bias")?),
                        None => None,
                    };
                    let [Ok(tq), Ok(tk), Ok(tv)] = &mut taken else { return Ok(()) };
                    // The tokens' rows on the pool, a token a task (a decode batch's
                    // rows: a copy on the engine's thread alone was a hundredth
                    // of a SmolLM2 8-sequence pass).
                    let mut rows: smallvec::SmallVec<[[&mut [f32]; 3]; 16]> = tq
                        .chunks_mut(nq)
                        .zip(tk.chunks_mut(nkv))
                        .zip(tv.chunks_mut(nkv))
                        .take(tokens)
                        .map(|((q, k), v)| [q, k, v])
                        .collect();
                    if rows.len() < tokens || s.len() < tokens * w {
                        return Err(RuntimeError::Internal(format!("split_qkv: buffers hold fewer than {tokens} rows")));
                    }
                    crate::kernels::cpu::pool::for_chunks_mut(&mut rows, 1, |t, parts| {
                        let row = &s[t * w..(t + 1) * w];
                        for (dst, (off, n)) in parts[0].iter_mut().zip([(0usize, nq), (nq, nkv), (nq + nkv, nkv)]) {
                            dst.copy_from_slice(&row[off..off + n]);
                            if let Some(b) = b {
                                for (d, bb) in dst.iter_mut().zip(&b[off..off + n]) {
                                    *d += bb;
                                }
                            }
                        }
                    });
                    Ok(())
                })();
                for (id, vv) in [q, k, v].into_iter().zip(taken) {
                    self.bufs[id] = HostBuf::F32(vv?);
                }
                res?;
            }
            Plumb::BiasAdd { buf, bias, rows, n } => {
                let (y, b) = two(&mut self.bufs, buf, bias, "bias_add")?;
                let (HostBuf::F32(y), Some(b)) = (y, f32_of(b)) else {
                    return Err(RuntimeError::Internal("bias_add: buffers are not f32".into()));
                };
                for r in 0..rows {
                    for (d, bb) in y[r * n..(r + 1) * n].iter_mut().zip(b) {
                        *d += bb;
                    }
                }
            }
            Plumb::KvWrite { k, v, k_cache, v_cache, tokens, kv_heads, head_dim, kv_cap, pos0 } => {
                for (src, dst) in [(k, k_cache), (v, v_cache)] {
                    let (cache, s) = two(&mut self.bufs, dst, src, "kv_write")?;
                    let Some(s) = f32_of(s) else {
                        return Err(RuntimeError::Internal("kv_write: the new keys/values are not f32".into()));
                    };
                    match &self.paged {
                        // The pass's one sequence (a prefill chunk or a lone decode step).
                        Some(pg) => kv_write(cache, s, tokens, kv_heads, head_dim, |h, t| pg.row_at(0, h, pos0 + t, kv_heads, head_dim))?,
                        None => kv_write(cache, s, tokens, kv_heads, head_dim, |h, t| (h * kv_cap + pos0 + t) * head_dim)?,
                    }
                }
            }
            Plumb::Copy { src, src_off, dst, dst_off, len } => {
                let (d, s) = two(&mut self.bufs, dst, src, "copy")?;
                let (HostBuf::F32(d), Some(s)) = (d, f32_of(s)) else {
                    return Err(RuntimeError::Internal("copy: buffers are not f32".into()));
                };
                d[dst_off..dst_off + len].copy_from_slice(&s[src_off..src_off + len]);
            }
        }
        Ok(())
    }

    /// Runs a batch pass's `steps` ([`Plan::pass_steps`] over the rows of
    /// `seqs`, `counts[s]` consecutive rows of sequence `s` in their order: a
    /// decode batch's one token each, or a prompt's chunk too): every step over
    /// all rows at once, but the position-dependent ones
    /// ([`Plan::position_dependent`]), which run a sequence at a time: moved to
    /// its rows at its position, reading and writing those rows' activations
    /// (`widths[buffer]`: an activation's floats a token, 0 for other buffers)
    /// and the sequence's KV cache, swapped in for the call.
    pub fn run_rows(
        &mut self,
        steps: &[Step],
        seqs: &mut [&mut super::SeqKv],
        counts: &[usize],
        widths: &[usize],
        times: &mut SlotTimes,
    ) -> Result<(), RuntimeError> {
        if counts.len() != seqs.len() {
            return Err(RuntimeError::Internal(format!("{} row counts for {} sequences", counts.len(), seqs.len())));
        }
        let mut i = 0;
        while i < steps.len() {
            let step = &steps[i];
            if !self.by_rows(step)? {
                // A parallel group runs as in a pass of its own.
                let mut j = i + 1;
                if let Some(g) = step.group {
                    while j < steps.len() && steps[j].group == Some(g) && !Plan::position_dependent(&steps[j]) {
                        j += 1;
                    }
                }
                self.run(&steps[i..j], times)?;
                i = j;
                continue;
            }
            // Position-dependent kernels that follow it and share no buffer
            // with it or each other but what they read (q's and k's RoPE) run in
            // its job, each sequence's steps in order on its task.
            let mut j = i + 1;
            while j < steps.len() && self.joins_row_job(&steps[i..j], &steps[j])? {
                j += 1;
            }
            let t0 = Instant::now();
            self.run_rows_of(&steps[i..j], seqs, counts, widths)?;
            let share = t0.elapsed().as_secs_f64() / (j - i) as f64;
            steps[i..j].iter().for_each(|s| times.add(s.slot, share));
            i = j;
        }
        Ok(())
    }

    /// Whether a batch pass runs `step` a sequence at a time: a
    /// position-dependent step, but for attention over a paged KV cache (one
    /// call over every row's sequence).
    fn by_rows(&self, step: &Step) -> Result<bool, RuntimeError> {
        let paged_attention = match (&self.paged, &step.kind) {
            (Some(pg), StepKind::Kernel { problem, .. }) => pg.tables.problem(problem)?.is_some(),
            _ => false,
        };
        Ok(Plan::position_dependent(step) && !paged_attention)
    }

    /// Whether the position-dependent kernel `next` may run in the row job of
    /// `run` (kernels each): not a paged attention step (one call over every
    /// sequence), and no buffer that one of them writes is read or written by
    /// another (their outputs are taken out of the executor while the job
    /// runs, so none may be another's input).
    fn joins_row_job(&self, run: &[Step], next: &Step) -> Result<bool, RuntimeError> {
        let kernel = |s: &Step| matches!(s.kind, StepKind::Kernel { .. });
        // (A KV write's run ends before the paged attention step after it is
        // asked for its paged problem.)
        if !kernel(next) || !run.iter().all(kernel) || !self.by_rows(next)? {
            return Ok(false);
        }
        // A buffer one writes that the other binds at all (reads or writes).
        let touches = |a: &Step, b: &Step| a.writes().any(|w| b.reads().chain(b.writes()).any(|x| x == w));
        Ok(run.iter().all(|s| !touches(next, s) && !touches(s, next)))
    }

    /// A position-dependent step of a batch pass (a KV write alone, or a `run`
    /// of kernels that [`CpuExec::joins_row_job`] let share a job), each
    /// sequence's rows (`counts`) as its tokens from its position over its
    /// cache: a KV write sequence by sequence, the kernels' sequences side by
    /// side on the pool (a sequence's steps in order on its task, each one's
    /// own parallel loop inline there).
    fn run_rows_of(
        &mut self,
        run: &[Step],
        seqs: &mut [&mut super::SeqKv],
        counts: &[usize],
        widths: &[usize],
    ) -> Result<(), RuntimeError> {
        let step = &run[0];
        // Sequence r's first row.
        let firsts: smallvec::SmallVec<[usize; 16]> = counts.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
        let cache_of = |seq: &super::SeqKv, id: BufId| seq.bufs.binary_search_by_key(&id, |(b, _)| *b).ok();
        let StepKind::Kernel { .. } = &step.kind else {
            let StepKind::Plumb(Plumb::KvWrite { k, v, k_cache, v_cache, kv_heads, head_dim, kv_cap, .. }) = &step.kind else {
                return Err(RuntimeError::Internal("a decode batch's row step is not a KV write".into()));
            };
            let (kv_heads, head_dim, kv_cap) = (*kv_heads, *head_dim, *kv_cap);
            for (r, seq) in seqs.iter_mut().enumerate() {
                let n = counts[r];
                for (src, dst) in [(*k, *k_cache), (*v, *v_cache)] {
                    let o = firsts[r] * widths.get(src).copied().unwrap_or(0);
                    let pos = seq.pos;
                    if let Some(pg) = &self.paged {
                        // Sequence r's blocks (the pass's table row r).
                        let (cache, s) = two(&mut self.bufs, dst, src, "kv_write")?;
                        let Some(s) = f32_of(s) else {
                            return Err(RuntimeError::Internal("kv_write: the new keys/values are not f32".into()));
                        };
                        kv_write(cache, &s[o..], n, kv_heads, head_dim, |h, t| pg.row_at(r, h, pos + t, kv_heads, head_dim))?;
                        continue;
                    }
                    let s = f32s(&self.bufs, src, "kv_write")?;
                    let Some(at) = cache_of(seq, dst) else {
                        return Err(RuntimeError::Internal(format!("kv_write: buffer {dst} is no sequence's cache")));
                    };
                    kv_write(&mut seq.bufs[at].1, &s[o..], n, kv_heads, head_dim, |h, t| (h * kv_cap + pos + t) * head_dim)?;
                }
            }
            return Ok(());
        };
        let rows: usize = counts.iter().sum();
        // Every step's outputs taken, each cut into its sequences' rows.
        let mut taken: smallvec::SmallVec<[Taken; 2]> = smallvec::SmallVec::new();
        for s in run {
            match self.take_outs(s) {
                Ok(outs) => taken.push(outs),
                Err(e) => {
                    taken.into_iter().for_each(|outs| self.put_back(outs));
                    return Err(e);
                }
            }
        }
        let mut jobs: Vec<RowJob<'_>> = (0..seqs.len()).map(|_| (smallvec::SmallVec::new(), Ok(()))).collect();
        let mut split = Ok(());
        'steps: for (s, outs) in run.iter().zip(taken.iter_mut()) {
            // Step s's outputs, each sequence's rows of each.
            let mut cut: Vec<smallvec::SmallVec<[&mut [f32]; 2]>> = (0..seqs.len()).map(|_| smallvec::SmallVec::new()).collect();
            for (id, v) in outs.iter_mut() {
                let w = widths.get(*id).copied().unwrap_or(0);
                if w == 0 || v.len() < rows * w {
                    split = Err(RuntimeError::Internal(format!("`{}`: output buffer {id} has no row per token", s.slot.name())));
                    break 'steps;
                }
                let mut rest = &mut v[..rows * w];
                for (mine, &n) in cut.iter_mut().zip(counts) {
                    let (rows_of, tail) = std::mem::take(&mut rest).split_at_mut(n * w);
                    mine.push(rows_of);
                    rest = tail;
                }
            }
            jobs.iter_mut().zip(cut).for_each(|(job, mine)| job.0.push(mine));
        }
        if split.is_ok() {
            let (bufs, seqs) = (&self.bufs, &*seqs);
            crate::kernels::cpu::pool::for_chunks_mut(&mut jobs, 1, |r, job| {
                let (steps_outs, res) = &mut job[0];
                let seq = &seqs[r];
                for (step, outs) in run.iter().zip(steps_outs.iter_mut()) {
                    let StepKind::Kernel { kernel, params, problem, .. } = &step.kind else { continue };
                    let problem = at_position(problem, seq.pos, counts[r]);
                    let ins = step
                        .reads()
                        .map(|b| match cache_of(seq, b) {
                            Some(at) => seq.bufs[at].1.as_in(),
                            None => match bufs[b].as_in() {
                                CpuIn::F32(v) => CpuIn::F32(&v[(firsts[r] * widths.get(b).copied().unwrap_or(0)).min(v.len())..]),
                                other => other,
                            },
                        })
                        .collect();
                    let args = CpuArgs { ins, outs: outs.iter_mut().map(|o| &mut **o).collect() };
                    *res = kernel.run_cpu_planned(&problem, params, args).map_err(|e| RuntimeError::Kernel {
                        slot: step.slot.name().into(),
                        layer: step.layer,
                        source: Box::new(e),
                    });
                    if res.is_err() {
                        return;
                    }
                }
            });
        }
        let first = jobs.into_iter().map(|(_, r)| r).find(Result::is_err).unwrap_or(Ok(()));
        taken.into_iter().for_each(|outs| self.put_back(outs));
        split.and(first)
    }

    /// Readies the paged KV cache for a pass over `seqs` (each its table, its
    /// position and the tokens the pass feeds it; [`PassTables::page_in`](super::kv_pool::PassTables::page_in)),
    /// the rows of the blocks copied on write copied here.
    pub fn page_in(&mut self, pool: &super::kv_pool::KvPool, seqs: &mut [(&mut Vec<u32>, usize, usize)]) -> Result<(), RuntimeError> {
        let Some(pg) = self.paged.as_mut() else {
            return Err(RuntimeError::Internal("page_in: the KV cache is not paged".into()));
        };
        pg.tables.page_in(pool, seqs)?;
        let copies = std::mem::take(&mut pg.tables.copies);
        for &(from, to) in &copies {
            self.copy_block(from as usize, to as usize)?;
        }
        if let Some(pg) = self.paged.as_mut() {
            pg.tables.copies = copies;
        }
        Ok(())
    }

    /// Block `from`'s rows of every pool copied into block `to`.
    fn copy_block(&mut self, from: usize, to: usize) -> Result<(), RuntimeError> {
        let Some(pg) = &self.paged else { return Ok(()) };
        for &id in &pg.caches {
            let per = self.bufs[id].len() / pg.blocks.max(1);
            let (a, b) = (from * per, to * per);
            match &mut self.bufs[id] {
                HostBuf::F32(v) => v.copy_within(a..a + per, b),
                HostBuf::F16(v) => v.copy_within(a..a + per, b),
                HostBuf::Q(m) => {
                    // Blocks of whole rows: a block's elements are whole q8_0 blocks.
                    let (be, qb, ns) = (m.format.block_elems(), m.format.quant_bytes(), m.format.scales_per_block());
                    let (a, b, per) = (a / be, b / be, per / be);
                    m.quants.copy_within(a * qb..(a + per) * qb, b * qb);
                    m.scales.copy_within(a * ns..(a + per) * ns, b * ns);
                }
                _ => return Err(RuntimeError::Internal("a KV cache is f32, f16 or q8_0".into())),
            }
        }
        Ok(())
    }

    /// Writes `data` into an f32 buffer at offset 0.
    pub fn write(&mut self, id: BufId, data: &[f32]) -> Result<(), RuntimeError> {
        let b = f32s_mut(&mut self.bufs, id, "write")?;
        b[..data.len()].copy_from_slice(data);
        Ok(())
    }

    /// The first `len` elements of an f32 buffer.
    pub fn read(&self, id: BufId, len: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(f32s(&self.bufs, id, "read")?[..len].to_vec())
    }

    /// The first `len` elements of an f32 buffer, borrowed.
    pub fn view(&self, id: BufId, len: usize) -> Result<&[f32], RuntimeError> {
        Ok(&f32s(&self.bufs, id, "read")?[..len])
    }

    /// [`CpuExec::view`], mutably.
    pub fn view_mut(&mut self, id: BufId, len: usize) -> Result<&mut [f32], RuntimeError> {
        Ok(&mut f32s_mut(&mut self.bufs, id, "read")?[..len])
    }
}

/// A position-dependent problem moved to `n` tokens from `pos` (a batch pass's
/// sequence: a decode token, or a prompt's chunk where the problem takes one).
fn at_position(p: &crate::kernels::Problem, pos: usize, n: usize) -> crate::kernels::Problem {
    use crate::kernels::Problem;
    let mut p = p.clone();
    match &mut p {
        Problem::Rope { tokens, pos0, .. } | Problem::QkNormRope { tokens, pos0, .. } => (*tokens, *pos0) = (n, pos),
        Problem::QkvRopeCache { pos0, .. } => *pos0 = pos,
        Problem::AttentionPrefill { tokens, kv_len, bidi_start, bidi_end, .. } => {
            (*tokens, *kv_len, *bidi_start, *bidi_end) = (n, pos + n, 0, 0)
        }
        Problem::AttentionDecode { kv_len, .. } => *kv_len = pos + 1,
        _ => {}
    }
    p
}

/// `tokens` rows of new keys or values `s` (`[tokens, kv_heads, head_dim]`) into
/// a cache, the row of token `t` of KV head `h` at element `at(h, t)` (the
/// head-major cache's `(h * kv_cap + pos0 + t) * head_dim`, or a paged pool's
/// through the sequence's table).
fn kv_write(
    cache: &mut HostBuf,
    s: &[f32],
    tokens: usize,
    kv_heads: usize,
    head_dim: usize,
    at: impl Fn(usize, usize) -> usize,
) -> Result<(), RuntimeError> {
    let write = |h: usize, t: usize| (at(h, t), (t * kv_heads + h) * head_dim);
    match cache {
        HostBuf::F32(c) => {
            for t in 0..tokens {
                for h in 0..kv_heads {
                    let (d, o) = write(h, t);
                    c[d..d + head_dim].copy_from_slice(&s[o..o + head_dim]);
                }
            }
        }
        // q8_0: each row (whole blocks: the attention kernels' check) quantized
        // as ggml's reference quantizer does, into the blocks from element `d`.
        HostBuf::Q(c) if c.format == QFormat::Q8_0 && head_dim.is_multiple_of(c.format.block_elems()) => {
            let (qb, be, ns) = (c.format.quant_bytes(), c.format.block_elems(), c.format.scales_per_block());
            for t in 0..tokens {
                for h in 0..kv_heads {
                    let (d, o) = write(h, t);
                    for (i, x) in s[o..o + head_dim].chunks_exact(be).enumerate() {
                        let b = d / be + i;
                        quantize_block(c.format, x, &mut c.quants[b * qb..(b + 1) * qb], &mut c.scales[b * ns..(b + 1) * ns]);
                    }
                }
            }
        }
        HostBuf::Q(_) | HostBuf::Stack(_) | HostBuf::Shared(_) => {
            return Err(RuntimeError::Internal("kv_write: a KV cache is f32, f16 or q8_0 rows of whole blocks, never shared".into()));
        }
        HostBuf::F16(c) => {
            for t in 0..tokens {
                for h in 0..kv_heads {
                    let (d, o) = write(h, t);
                    // A row at a time (F16C where the CPU has it; the same
                    // round-to-nearest-even as `f16::from_f32`).
                    c[d..d + head_dim].convert_from_f32_slice(&s[o..o + head_dim]);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f16 cache's rows are written a row at a time (F16C where the CPU has
    /// it) with the bits `f16::from_f32` gives each value: ties to even,
    /// subnormals, overflow to infinity, NaN kept a NaN.
    #[test]
    fn an_f16_cache_row_is_each_value_rounded_alone() {
        let (tokens, kv_heads, head_dim) = (2, 3, 40);
        let n = tokens * kv_heads * head_dim;
        let special = [0.0, -0.0, 1.0 + f32::EPSILON * 2048.0, 65504.0, 65520.0, 1e6, -1e6, 6e-8, 3e-8, 1e-40, f32::NAN];
        let s: Vec<f32> =
            (0..n).map(|i| special.get(i % 17).copied().unwrap_or((i as f32 * 0.7311).sin() * 10f32.powi(i as i32 % 9 - 4))).collect();
        let (cap, pos0) = (5, 1);
        let mut cache = HostBuf::F16(vec![f16::ZERO; kv_heads * cap * head_dim]);
        kv_write(&mut cache, &s, tokens, kv_heads, head_dim, |h, t| (h * cap + pos0 + t) * head_dim).expect("written");
        let HostBuf::F16(c) = &cache else { unreachable!() };
        for t in 0..tokens {
            for h in 0..kv_heads {
                for i in 0..head_dim {
                    let (want, got) = (f16::from_f32(s[(t * kv_heads + h) * head_dim + i]), c[(h * cap + pos0 + t) * head_dim + i]);
                    assert!(want.to_bits() == got.to_bits() || want.is_nan() && got.is_nan(), "t {t} h {h} i {i}: {want} against {got}");
                }
            }
        }
        // Rows no token reached stay as they were.
        assert!((0..kv_heads).all(|h| c[h * cap * head_dim..][..head_dim].iter().all(|v| v.to_bits() == 0)));
    }
}
