//! The GPU executor: plan buffers as wgpu storage buffers (weights uploaded once),
//! each step's program (pipelines and bind groups) built once and kept. The
//! position lives in one 16-byte buffer ([`crate::gpu::position_words`]) that
//! RoPE, the q/k norm + RoPE, the KV write and decode attention read as a
//! uniform: their programs serve every position, so a decode token after the
//! first rebuilds nothing and creates no GPU object. Its embedding is looked up
//! on the GPU (`shaders/embed.wgsl`, the token id in that buffer) when the table
//! is the tied LM head's buffers (else the host writes the row).
//!
//! Decode steps are chained ([`GpuExec::submit_chain`]): after each step's LM
//! head a [`Picker`] selects the token there (the greedy argmax, [`Selector`], or
//! the seeded sampler, `kernels::sample::gpu`), and `shaders/chain.wgsl`'s
//! `advance` stores the id in the chain's slot and moves the position buffer,
//! bound as storage, to the next step with that id as its token; K steps go in one
//! command buffer and one submit, their ids copied to one of [`RING`] mappable
//! buffers that [`GpuExec::finish_chain`] reads (4 bytes a token, and 4 a chain:
//! its GPU time) while the next chain runs. Prefill, and decode steps whose
//! logits the caller wants, go through [`GpuExec::run`]: one pass, the logits
//! copied to persistent staging buffers.
//! Prefill attention, whose grid follows the pass's keys, is rebuilt as the
//! position moves, reusing the old program's uniform and scratch buffers and bind
//! groups ([`GpuCtx::rebuild`]). With `batch` one command buffer and one submit
//! per pass; without, one submit per step (a chain is always one submit). Host
//! time is split into phases ([`Phases`]); what the executor asks of the device
//! is counted by the context ([`crate::gpu::GpuCounters`]).
//!
//! GPU time: on adapters with timestamp queries every chained step is timed, its
//! first pass's start to its pick's end ([`TokenStamps`], summed on the GPU and
//! read back with the ids). A profiled pass (or a chain of one profiled step)
//! times each step ([`StepTiming`]): where the adapter writes timestamps inside
//! passes, around each step's dispatches in the passes an unprofiled one runs (the
//! same command stream); else each step in a pass of its own.

use std::collections::HashMap;
use std::sync::Arc;

use super::counters::{Lap, Phases};
use super::{RuntimeError, SlotTimes};
use crate::gpu::builtin::{CHAIN, EMBED, RUNTIME_PLUMB as PLUMB, SELECT_ARGMAX, STAMPS};
use crate::gpu::{Bind, GpuCtx, GpuProgram, POSITION_BINDING, grid_2d, groups, position_words};
use crate::kernels::attention::kv_scales_word;
use crate::kernels::sample::gpu::GpuSampler;
use crate::kernels::sample::{SamplerParams, SamplerState};
use crate::kernels::{DType, Params, Problem};
use crate::plan::{BufId, Plan, Plumb, Step, StepKind};
use crate::profile::doc::MAX_CHAIN;

const WG: u32 = 256;

/// Mappable id buffers the chains cycle through: a chain is submitted before the
/// host reads the previous one's ids, so two are in flight at most.
pub const RING: usize = 2;

/// Words of a chain's id buffer: one a step, and the chain's GPU time after the
/// last ([`TokenStamps`]).
const ID_WORDS: usize = MAX_CHAIN + 1;

/// How a profiled pass times its steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepTiming {
    /// Timestamps written between the dispatches of the passes an unprofiled
    /// pass runs (`ComputePass::write_timestamp`, the adapter's
    /// `TIMESTAMP_QUERY_INSIDE_PASSES`): the same command stream, timed.
    InsidePass,
    /// One compute pass per step, timestamps at each pass's start and end: more
    /// passes than an unprofiled pass runs, so the step is timed on its own.
    PassPerStep,
}

impl StepTiming {
    /// The method `caps` allow: inside the passes when the adapter writes
    /// timestamps there, else a pass per step.
    pub fn best(caps: &crate::device::GpuCaps) -> StepTiming {
        if caps.timestamp_inside_passes { StepTiming::InsidePass } else { StepTiming::PassPerStep }
    }
}

/// The GPU time of every chained decode step (on adapters with timestamp
/// queries): each step's first pass writes a timestamp as it begins and its pick
/// pass one as it ends (pass-level writes, so the passes are the unprofiled
/// ones); the chain resolves the pairs and `shaders/stamps.wgsl` sums the spans
/// into the word after the chain's ids, read back with them (4 bytes a chain).
/// Built once with the executor: a chain creates nothing.
struct TokenStamps {
    queries: wgpu::QuerySet,
    /// The resolved pairs, read by `sum`.
    resolved: wgpu::Buffer,
    sum: GpuProgram,
}

impl TokenStamps {
    fn new(ctx: &GpuCtx, position: &wgpu::Buffer, ids: &wgpu::Buffer) -> Result<TokenStamps, RuntimeError> {
        let queries = ctx.query_set("token stamps", 2 * MAX_CHAIN as u32);
        let usage = wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::STORAGE;
        let resolved = ctx.buffer("token stamps", 16 * MAX_CHAIN as u64, usage);
        let pipe = ctx.pipeline(&STAMPS, "sum_spans", &[]).map_err(err)?;
        let entries = [(0, &resolved), (1, ids), (POSITION_BINDING, position)].map(|(i, b)| Bind::Whole(b).entry(i)).to_vec();
        let step = ctx.step_entries("sum_spans".into(), pipe, entries, [1, 1, 1]).map_err(err)?;
        Ok(TokenStamps { queries, resolved, sum: GpuProgram { steps: vec![step], owned: Vec::new() } })
    }

    /// The pass-level writes of step `j`'s first pass (`begin`) or last.
    fn writes(&self, j: usize, begin: bool) -> wgpu::ComputePassTimestampWrites<'_> {
        let (b, e) = if begin { (Some(2 * j as u32), None) } else { (None, Some(2 * j as u32 + 1)) };
        wgpu::ComputePassTimestampWrites { query_set: &self.queries, beginning_of_pass_write_index: b, end_of_pass_write_index: e }
    }
}

/// What a prepared program was built for, the position left out (the programs
/// that depend on it read the position buffer); a step whose signature changes is
/// rebuilt.
#[derive(Clone, PartialEq)]
enum Sig {
    Kernel(&'static str, Params, DType, Problem, Vec<BufId>),
    Plumb(Plumb),
}

/// `problem` without the position its program reads from the position buffer
/// (RoPE's and q/k norm + RoPE's first position, decode attention's KV length).
fn unplaced(problem: &Problem) -> Problem {
    let mut p = problem.clone();
    match &mut p {
        Problem::Rope { pos0, .. } | Problem::QkNormRope { pos0, .. } | Problem::QkvRopeCache { pos0, .. } => *pos0 = 0,
        Problem::AttentionDecode { kv_len, .. } => *kv_len = 0,
        _ => {}
    }
    p
}

/// `plumb` without the position the KV write reads from the position buffer.
fn unplaced_plumb(plumb: &Plumb) -> Plumb {
    let mut p = plumb.clone();
    if let Plumb::KvWrite { pos0, .. } = &mut p {
        *pos0 = 0;
    }
    p
}

impl Sig {
    fn of(step: &Step) -> Sig {
        match &step.kind {
            StepKind::Kernel { kernel, params, dtype, problem, binds, .. } => {
                Sig::Kernel(kernel.id, params.clone(), *dtype, unplaced(problem), binds.clone())
            }
            StepKind::Plumb(p) => Sig::Plumb(unplaced_plumb(p)),
        }
    }

    /// Whether `step` is what this signature was taken of (without building a
    /// signature of it: no allocation).
    fn matches(&self, step: &Step) -> bool {
        match (self, &step.kind) {
            (Sig::Kernel(id, p, d, prob, b), StepKind::Kernel { kernel, params, dtype, problem, binds, .. }) => {
                *id == kernel.id && p == params && d == dtype && b == binds && *prob == unplaced(problem)
            }
            (Sig::Plumb(a), StepKind::Plumb(b)) => *a == unplaced_plumb(b),
            _ => false,
        }
    }

    /// Whether `other` is the same kernel (or plumbing entry) with the same
    /// parameters over the same buffers, whatever the problem's values.
    fn same_program(&self, other: &Sig) -> bool {
        match (self, other) {
            (Sig::Kernel(a, pa, da, _, ba), Sig::Kernel(b, pb, db, _, bb)) => a == b && pa == pb && da == db && ba == bb,
            (Sig::Plumb(a), Sig::Plumb(b)) => std::mem::discriminant(a) == std::mem::discriminant(b),
            _ => false,
        }
    }
}

pub struct GpuExec {
    pub ctx: Arc<GpuCtx>,
    pub bufs: Vec<wgpu::Buffer>,
    /// Byte size of each buffer's contents.
    pub sizes: Vec<u64>,
    progs: HashMap<(usize, usize), (Sig, Option<GpuProgram>)>,
    /// One submit per forward pass of [`GpuExec::run`] (the profile's
    /// `execution.batchCommands`; else one a step). A decode chain is one submit
    /// whatever it says: a submit per step would undo the chaining.
    pub batch: bool,
    /// Time each step with timestamp queries on the next run (or chain of one step).
    pub profile: bool,
    /// How a profiled pass times its steps: [`StepTiming::best`] for the adapter;
    /// [`StepTiming::PassPerStep`] may be asked for where the adapter could do
    /// better (the fallback, compared against the other).
    pub step_timing: StepTiming,
    /// Programs built since creation (pipelines come from the context's cache).
    pub programs_built: usize,
    /// Mappable buffers the reads of [`GpuExec::run`] land in, one per buffer read.
    staging: HashMap<BufId, wgpu::Buffer>,
    /// The pass position (`shaders/position.wgsl`): written by the host once a
    /// pass or chain, advanced by the GPU within a chain (uniform and storage).
    position: wgpu::Buffer,
    /// The token selection of a chain's steps (built on first use, rebuilt when
    /// the rule changes).
    picker: Option<Picker>,
    /// A chain's ids, one slot a step (`MAX_CHAIN` u32s), and the mappable
    /// buffers they are copied to, used in turn (`next_ring`).
    ids: wgpu::Buffer,
    ring: Vec<wgpu::Buffer>,
    next_ring: usize,
    /// A decode token's embedding looked up on the GPU (`shaders/embed.wgsl`)
    /// from the tied LM head's buffers ([`embed_program`]); `None`: the host
    /// writes the row.
    embed: Option<GpuProgram>,
    /// Every chained step's GPU time (None without timestamp queries).
    stamps: Option<TokenStamps>,
    /// A paged KV cache ([`GpuExec::enable_paged`]).
    pub paged: Option<GpuPaged>,
}

/// A paged KV cache on the GPU ([`super::Engine::enable_paged`]): the plan's
/// cache buffers hold a pool of blocks (`[blocks, kv_heads, page, head_dim]`
/// each), every pass is a batch of sequences (one for a lone prefill or decode
/// step), its table rows in `pages` (what the paged attention kernel reads) and
/// each row's position and block in `rows` (what RoPE, the fused q/k norm + RoPE
/// and the KV write read: `shaders/position_rows.wgsl`,
/// `runtime_plumb.wgsl`'s `kv_write_rows_*`), both written by the host a pass.
pub struct GpuPaged {
    /// The plan's cache buffers (the pools).
    pub caches: Vec<BufId>,
    /// The pools' storage type (f32, f16, or q8_0 blocks in a q8_0 matrix's
    /// single-buffer layout: codes, then the scales) and each pool's values a
    /// block.
    pub dtype: DType,
    block_elems: Vec<usize>,
    pub kernel: &'static crate::kernels::KernelDef,
    pub params: Params,
    pub tables: super::kv_pool::PassTables,
    pages: wgpu::Buffer,
    /// `[positions; max_rows][blocks; max_rows]` (u32).
    rows: wgpu::Buffer,
    max_rows: usize,
    /// Scratch of `rows`' words, reused.
    words: Vec<u32>,
    /// One block of the largest pool: a block copied on write goes through it
    /// (a copy within one buffer is not allowed).
    spare: wgpu::Buffer,
}

/// A paged pool of `elems` values stored as `dtype`: its bytes, and its parts
/// (offset, bytes) a block copy copies a share of: the values, and for q8_0
/// blocks their scales (a q8_0 matrix's single-buffer layout,
/// `QMatrix::gpu_bytes`, which `runtime_plumb.wgsl`'s `kv_write_rows_q8` writes
/// and the paged attention kernels read).
fn pool_layout(dtype: DType, elems: usize) -> (u64, [Option<(u64, u64)>; 2]) {
    let total = dtype.bytes_for(elems);
    match dtype.quant() {
        Some(f) => {
            let l = f.layout(f.blocks_for(elems));
            let scales = (elems / f.block_elems() * f.scales_per_block() * 2) as u64;
            (total, [Some((0, l.quants as u64)), Some((l.scales_offset as u64, scales))])
        }
        None => (total, [Some((0, total)), None]),
    }
}

/// The GPU embedding of a decode token: `shaders/embed.wgsl` over the LM head's
/// buffers when they are the embedding table (tied embeddings), in their storage
/// type (f32, f16 or a block format), writing the scaled row into the plan's
/// first hidden state: one step per LM-head block, the block holding the token
/// writes. `None` when the table is not on the GPU (an untied head, or a type
/// the shader does not read), and not called when the head holds other values
/// than the table's (rounded or requantized): the host path, reported by
/// [`GpuExec::embeds_on_gpu`].
fn embed_program(ctx: &GpuCtx, plan: &Plan, bufs: &[wgpu::Buffer], position: &wgpu::Buffer) -> Result<Option<GpuProgram>, RuntimeError> {
    let c = &plan.config;
    let Some(dtype) = plan.lm_head.first().map(|b| plan.buffers[b.weight].dtype) else { return Ok(None) };
    if !c.tie_word_embeddings {
        return Ok(None);
    }
    let x = &bufs[plan.x[0]];
    let (entry, items) = match dtype.quant() {
        Some(fmt) if c.dims.hidden_size.is_multiple_of(fmt.block_elems()) => {
            // Block units, qblock.wgsl's qunits(): 4 values each for q8_0, else 8.
            let units = fmt.block_elems() / if fmt.wgsl_id() == 0 { 4 } else { 8 };
            ("embed_q", c.dims.hidden_size / fmt.block_elems() * units)
        }
        None if dtype == DType::F16 || dtype == DType::F32 => ("embed_f", c.dims.hidden_size),
        _ => return Ok(None),
    };
    let f16 = if dtype == DType::F16 { 1.0 } else { 0.0 };
    let consts = [("WG", WG as f64), ("QFMT", crate::kernels::wgsl::qfmt(dtype)), ("F16", f16)];
    let pipe = ctx.pipeline(&EMBED, entry, &consts).map_err(err)?;
    let mut prog = GpuProgram { steps: Vec::new(), owned: Vec::new() };
    for head in &plan.lm_head {
        let table = &bufs[head.weight];
        let words = [c.dims.hidden_size as u32, (c.embedding_scale() as f32).to_bits(), head.start as u32, head.rows as u32];
        let u = ctx.uniform("embed", &words);
        let binds = match dtype.quant() {
            Some(fmt) => {
                let l = fmt.layout(fmt.blocks_for(head.rows * c.dims.hidden_size));
                vec![
                    Bind::Range(table, 0, l.quants.max(16) as u64),
                    Bind::Range(table, l.scales_offset as u64, l.scales.max(4) as u64),
                    Bind::Whole(x),
                    Bind::Whole(&u),
                ]
            }
            None => vec![Bind::Whole(table), Bind::Whole(x), Bind::Whole(&u)],
        };
        let mut entries: Vec<_> = binds.iter().enumerate().map(|(i, b)| b.entry(i as u32)).collect();
        entries.push((POSITION_BINDING, position.clone(), 0, None));
        prog.steps.push(ctx.step_entries(entry.to_string(), pipe.clone(), entries, grid_2d(groups(items, WG))).map_err(err)?);
        prog.owned.push(u);
    }
    Ok(Some(prog))
}

/// One forward pass of [`GpuExec::run`]: `tokens` rows from position `pos0`
/// (a paged pass's rows read theirs from its rows buffer), a decode step's
/// `token` embedded on the GPU; its programs kept by `key` (the token count, or
/// [`BATCH_KEY`] plus the rows of a batch pass, whose steps differ).
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    pub tokens: usize,
    pub key: usize,
    pub pos0: usize,
    pub token: Option<u32>,
}

/// Where the keys of batch passes' programs start ([`Pass::key`]).
pub const BATCH_KEY: usize = 1 << 24;

/// An LM-head block as the selector reads it: its logits buffer, rows and first
/// vocabulary row.
pub type PickBlock = (BufId, usize, usize);

/// Greedy token selection on the GPU (`shaders/select_argmax.wgsl`): one
/// program per LM-head block writes its argmax (vocabulary index, logit) pair to
/// `out`, and with several blocks one more combines them into the pair after
/// theirs; the final pair's index is the step's token ([`Picker`]).
pub struct Selector {
    progs: Vec<GpuProgram>,
    out: wgpu::Buffer,
    /// Byte offset of the final pair in `out`.
    at: u64,
}

impl Selector {
    /// `blocks`: each LM-head block's logits buffer, rows and first vocabulary
    /// row, in vocabulary order; `cap`: the final logit softcapping (0: none).
    pub fn new(ctx: &GpuCtx, bufs: &[wgpu::Buffer], blocks: &[PickBlock], cap: f32) -> Result<Selector, RuntimeError> {
        let pipe = ctx.pipeline(&SELECT_ARGMAX, "argmax", &[("WG", WG as f64)]).map_err(err)?;
        let n = blocks.len();
        let out = ctx.storage("selected", (8 * (n + 1)) as u64);
        let mut progs = Vec::with_capacity(n + 1);
        for (k, &(logits, rows, start)) in blocks.iter().enumerate() {
            let u = ctx.uniform("select", &[rows as u32, k as u32, cap.to_bits(), start as u32]);
            let step = ctx.step("argmax", pipe.clone(), &[&bufs[logits], &out, &u], [1, 1, 1]).map_err(err)?;
            progs.push(GpuProgram { steps: vec![step], owned: vec![u] });
        }
        let at = if n > 1 {
            let pipe = ctx.pipeline(&SELECT_ARGMAX, "argmax_blocks", &[("WG", WG as f64)]).map_err(err)?;
            let u = ctx.uniform("select blocks", &[n as u32, 0, 0, 0]);
            let entries = vec![(1, out.clone(), 0, None), (2, u.clone(), 0, None)];
            let step = ctx.step_entries("argmax_blocks".into(), pipe, entries, [1, 1, 1]).map_err(err)?;
            progs.push(GpuProgram { steps: vec![step], owned: vec![u] });
            (8 * n) as u64
        } else {
            0
        };
        Ok(Selector { progs, out, at })
    }

    /// The token of the final (index, logit bits) pair: 0 when every logit is NaN
    /// (the rule `chain.wgsl`'s `advance` applies on the GPU).
    #[cfg(test)]
    fn token(pair: &[u32]) -> u32 {
        pair.first().copied().filter(|&i| i != u32::MAX).unwrap_or(0)
    }
}

/// How a chained decode step picks its token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PickRule {
    /// The first maximum of the (softcapped) logits: [`Selector`].
    Argmax,
    /// The seeded sampler (`kernels::sample`) over the softcapped logits, its
    /// step and repeat-penalty history in a state buffer the GPU advances.
    Sample(SamplerParams),
}

/// What ends a chained decode step on the GPU: the selection programs over the
/// LM head's logits buffers, then `chain.wgsl`'s `advance` (the id into the
/// chain's slot, the position buffer to the next step).
pub struct Picker {
    rule: PickRule,
    progs: Vec<GpuProgram>,
    /// The sampler's state buffer (sampling only), written from the host's
    /// sampler at the start of a generation.
    state: Option<wgpu::Buffer>,
    /// Buffers the programs read that nothing else holds (the selection's
    /// output, the gathered row).
    _keep: Vec<wgpu::Buffer>,
}

impl Picker {
    /// The picker of `rule` over the LM head's `blocks` (as [`Selector::new`]
    /// takes them; `cap` the final softcapping), advancing `position` and writing
    /// `ids`. The sampler reads one row of the vocabulary: a head in one block
    /// without softcapping is read in place, else each block is gathered into a
    /// row of its own, softcapped on the way (`chain.wgsl`'s `gather`; f32 `tanh`
    /// on the GPU, where the host's softcap of read-back logits rounds through
    /// f64, so a sampled id may differ from the host's where two tokens' weights
    /// straddle one rounding step).
    fn new(
        ctx: &GpuCtx,
        bufs: &[wgpu::Buffer],
        blocks: &[PickBlock],
        cap: f32,
        rule: PickRule,
        position: &wgpu::Buffer,
        ids: &wgpu::Buffer,
    ) -> Result<Picker, RuntimeError> {
        let (mut progs, state, picked, at, mut keep) = match rule {
            PickRule::Argmax => {
                let sel = Selector::new(ctx, bufs, blocks, cap)?;
                (sel.progs, None, sel.out.clone(), (sel.at / 4) as u32, vec![sel.out])
            }
            PickRule::Sample(params) => {
                let vocab: usize = blocks.iter().map(|b| b.1).sum();
                let mut progs = Vec::new();
                let mut keep = Vec::new();
                let logits = match blocks {
                    [(one, _, _)] if cap == 0.0 => bufs[*one].clone(),
                    _ => {
                        let row = ctx.storage("sample row", 4 * vocab as u64);
                        let pipe = ctx.pipeline(&CHAIN, "gather", &[("WG", WG as f64)]).map_err(err)?;
                        for &(logits, rows, start) in blocks {
                            let u = ctx.uniform("gather", &[rows as u32, start as u32, cap.to_bits(), 0]);
                            let step =
                                ctx.step("gather", pipe.clone(), &[&bufs[logits], &row, &u], grid_2d(groups(rows, WG))).map_err(err)?;
                            progs.push(GpuProgram { steps: vec![step], owned: vec![u] });
                        }
                        keep.push(row.clone());
                        row
                    }
                };
                let s = GpuSampler::new(ctx, &logits, vocab, &params).map_err(err)?;
                progs.push(s.program);
                keep.push(s.out.clone());
                (progs, Some(s.state), s.out, 0, keep)
            }
        };
        let pipe = ctx.pipeline(&CHAIN, "advance", &[]).map_err(err)?;
        let u = ctx.uniform("advance", &[at, 0, 0, 0]);
        let entries = [(0, &picked), (1, position), (2, ids), (3, &u)].map(|(i, b)| Bind::Whole(b).entry(i)).to_vec();
        let step = ctx.step_entries("advance".into(), pipe, entries, [1, 1, 1]).map_err(err)?;
        progs.push(GpuProgram { steps: vec![step], owned: vec![u] });
        keep.push(picked);
        Ok(Picker { rule, progs, state, _keep: keep })
    }
}

/// The start of a chain's first step, written by the host: its position and
/// token, and a sampler's state (the generation so far, as the host's sampler
/// holds it). A chain without one continues where the GPU left the last.
pub struct ChainStart<'a> {
    pub pos: usize,
    pub token: u32,
    pub sampler: Option<&'a SamplerState>,
}

/// A submitted chain whose ids are not read yet ([`GpuExec::finish_chain`]).
pub struct Pending {
    ring: usize,
    steps: usize,
    index: wgpu::SubmissionIndex,
    /// A profiled step's timestamps, resolved in its submit.
    resolve: Option<(wgpu::Buffer, u32)>,
    /// Whether the chain's GPU time follows its ids ([`TokenStamps`]).
    stamped: bool,
}

/// What a chain gave: its ids, in order, and the GPU time of its steps (seconds,
/// from their timestamps; None without them, or for a step profiled a pass per
/// step).
pub struct ChainIds {
    pub ids: Vec<u32>,
    pub gpu_seconds: Option<f64>,
}

fn err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Gpu(e.to_string())
}

impl GpuExec {
    /// Device buffers for `plan`, weights given as bytes by `fill(buffer index)`;
    /// `embed_exact`: the LM head's buffers hold the embedding table's values
    /// exactly (then a tied table is looked up there, [`embed_program`]).
    pub fn new(
        ctx: Arc<GpuCtx>,
        plan: &Plan,
        embed_exact: bool,
        mut fill: impl FnMut(usize) -> Result<Option<Vec<u8>>, RuntimeError>,
    ) -> Result<GpuExec, RuntimeError> {
        // Every buffer is checked against the device's limits before any is made,
        // then made inside out-of-memory and validation scopes.
        for b in &plan.buffers {
            ctx.check_size(&format!("buffer `{}`", b.name), b.bytes(), true).map_err(err)?;
        }
        let (bufs, sizes) = ctx
            .allocating("uploading the model's buffers", || -> Result<_, RuntimeError> {
                let mut bufs = Vec::with_capacity(plan.buffers.len());
                let mut sizes = Vec::with_capacity(plan.buffers.len());
                for (i, b) in plan.buffers.iter().enumerate() {
                    let buf = match fill(i)? {
                        Some(bytes) => ctx.upload(&b.name, &bytes),
                        None => match &b.constant {
                            Some(c) => ctx.upload(&b.name, bytemuck::cast_slice(c)),
                            None => ctx.storage(&b.name, b.bytes()),
                        },
                    };
                    bufs.push(buf);
                    sizes.push(b.bytes());
                }
                Ok((bufs, sizes))
            })
            .map_err(err)??;
        // A uniform to the kernels, storage to a chain's `advance`.
        let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let position = ctx.buffer("position", 16, usage);
        ctx.write(&position, 0, bytemuck::cast_slice(&position_words(0, 0)));
        let embed = if embed_exact { embed_program(&ctx, plan, &bufs, &position)? } else { None };
        let ids = ctx.storage("chain ids", 4 * ID_WORDS as u64);
        let ring = (0..RING).map(|_| ctx.staging(4 * ID_WORDS as u64)).collect();
        let stamps = if ctx.caps.timestamp_query { Some(TokenStamps::new(&ctx, &position, &ids)?) } else { None };
        let step_timing = StepTiming::best(&ctx.caps);
        Ok(GpuExec {
            ctx,
            bufs,
            sizes,
            progs: HashMap::new(),
            batch: true,
            profile: false,
            step_timing,
            programs_built: 0,
            staging: HashMap::new(),
            position,
            picker: None,
            ids,
            ring,
            next_ring: 0,
            embed,
            stamps,
            paged: None,
        })
    }

    /// Makes the cache buffers `caches` pools of `blocks` blocks of `page`
    /// positions (each `per_position` values a position, stored as `dtype`),
    /// read by `kernel` through the tables of passes of at most `max_rows` rows
    /// of sequences holding `max_blocks` blocks each; every program is built
    /// again (they bound the old buffers).
    pub fn enable_paged(
        &mut self,
        caches: Vec<BufId>,
        (dtype, per_position): (DType, &[usize]),
        (page, blocks, max_blocks): (usize, usize, usize),
        max_rows: usize,
        kernel: &'static crate::kernels::KernelDef,
        params: Params,
    ) -> Result<(), RuntimeError> {
        let block_elems: Vec<usize> = per_position.iter().map(|n| n * page).collect();
        let pool_bytes: Vec<u64> = block_elems.iter().map(|&n| pool_layout(dtype, n * blocks).0).collect();
        for (&id, &bytes) in caches.iter().zip(&pool_bytes) {
            self.ctx.check_size(&format!("the paged KV cache's pool of buffer {id}"), bytes, true).map_err(err)?;
        }
        let table_bytes = (max_rows * (2 + max_blocks) * 4) as u64;
        let (pages, rows, spare) = self
            .ctx
            .allocating("the paged KV cache's pools", || {
                for (&id, &bytes) in caches.iter().zip(&pool_bytes) {
                    self.bufs[id] = self.ctx.storage("kv pool", bytes);
                    self.sizes[id] = bytes;
                }
                let block = block_elems.iter().map(|&n| pool_layout(dtype, n).0).max().unwrap_or(0);
                let spare = self.ctx.storage("kv block copy", block);
                (self.ctx.storage("kv pages", table_bytes), self.ctx.storage("kv rows", (2 * max_rows * 4) as u64), spare)
            })
            .map_err(err)?;
        self.progs.clear();
        let tables = super::kv_pool::PassTables::new(page, blocks, max_blocks);
        self.paged = Some(GpuPaged { caches, dtype, block_elems, kernel, params, tables, pages, rows, max_rows, words: Vec::new(), spare });
        Ok(())
    }

    /// Readies a pass over paged sequences ([`PassTables::page_in`](super::kv_pool::PassTables::page_in)):
    /// the blocks copied on write copied on the GPU (a submit ahead of the pass),
    /// the pass's table rows and its rows' positions and blocks written.
    pub fn page_in(&mut self, pool: &super::kv_pool::KvPool, seqs: &mut [(&mut Vec<u32>, usize, usize)]) -> Result<(), RuntimeError> {
        let Some(pg) = self.paged.as_mut() else {
            return Err(RuntimeError::Internal("page_in: the KV cache is not paged".into()));
        };
        let rows: usize = seqs.iter().map(|s| s.2).sum();
        if rows > pg.max_rows || seqs.len() > pg.max_rows {
            return Err(RuntimeError::Internal(format!("a pass of {rows} rows past the {} its tables hold", pg.max_rows)));
        }
        pg.tables.page_in(pool, seqs)?;
        if !pg.tables.copies.is_empty() {
            let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv copies") });
            for (&id, &n) in pg.caches.iter().zip(&pg.block_elems) {
                // A block's bytes in each part of the pool (its codes and its
                // scales for q8_0 blocks).
                let (_, parts) = pool_layout(pg.dtype, n * pg.tables.blocks);
                for (start, per) in parts.into_iter().flatten().map(|(at, len)| (at, len / pg.tables.blocks.max(1) as u64)) {
                    for &(from, to) in &pg.tables.copies {
                        enc.copy_buffer_to_buffer(&self.bufs[id], start + from as u64 * per, &pg.spare, 0, per);
                        enc.copy_buffer_to_buffer(&pg.spare, 0, &self.bufs[id], start + to as u64 * per, per);
                    }
                }
            }
            self.ctx.submit(enc.finish());
        }
        pg.words.clear();
        pg.words.resize(2 * pg.max_rows, 0);
        for (r, (p, b)) in pg.tables.rows().enumerate() {
            pg.words[r] = p as u32;
            pg.words[pg.max_rows + r] = b as u32;
        }
        self.ctx.write(&pg.pages, 0, bytemuck::cast_slice(&pg.tables.pages));
        self.ctx.write(&pg.rows, 0, bytemuck::cast_slice(&pg.words));
        Ok(())
    }

    /// Drops the programs of the passes whose keys `gone` names ([`Pass::key`]).
    pub fn forget(&mut self, gone: impl Fn(usize) -> bool) {
        self.progs.retain(|(key, _), _| !gone(*key));
    }

    /// A paged attention step's signature: the paged kernel over the pass's
    /// sequences (None for any other step, and without a paged cache).
    fn paged_sig(&self, step: &Step) -> Result<Option<Sig>, RuntimeError> {
        let (Some(pg), StepKind::Kernel { problem, binds, .. }) = (&self.paged, &step.kind) else { return Ok(None) };
        // Over the pools' type (the plan's cache type: f32, f16 or q8_0 blocks).
        Ok(pg.tables.problem(problem)?.map(|p| Sig::Kernel(pg.kernel.id, pg.params.clone(), pg.dtype, p, binds.clone())))
    }

    /// Builds (or keeps) the program of every step of this pass.
    pub fn prepare(&mut self, tokens: usize, steps: &[Step]) -> Result<(), RuntimeError> {
        for (i, step) in steps.iter().enumerate() {
            // A paged attention step's signature is the paged kernel's (made
            // here); the others are checked without building one.
            let sig = if let Some(sig) = self.paged_sig(step)? {
                if self.progs.get(&(tokens, i)).is_some_and(|(old, _)| *old == sig) {
                    continue;
                }
                sig
            } else if self.progs.get(&(tokens, i)).is_some_and(|(old, _)| old.matches(step)) {
                continue;
            } else {
                Sig::of(step)
            };
            let old = self.progs.remove(&(tokens, i));
            let build = || -> Result<Option<GpuProgram>, RuntimeError> {
                let failed = |e| RuntimeError::Kernel { slot: step.slot.name().into(), layer: step.layer, source: Box::new(e) };
                match (&step.kind, &sig, &self.paged) {
                    // Paged: attention through the tables, row positions from `rows`.
                    (StepKind::Kernel { kernel, binds, .. }, Sig::Kernel(id, params, dtype, problem, _), Some(pg)) => {
                        let refs: Vec<&wgpu::Buffer> = binds.iter().map(|&b| &self.bufs[b]).collect();
                        let prog = if *id == pg.kernel.id && kernel.id != pg.kernel.id {
                            let [q, k, v, out] = refs[..] else {
                                return Err(RuntimeError::Internal(format!("an attention step binds {} buffers", refs.len())));
                            };
                            pg.kernel.prepare_wgsl(&self.ctx, problem, *dtype, params, &[q, k, v, &pg.pages, out], None)
                        } else if crate::kernels::pass_position(problem).is_some() {
                            kernel.prepare_wgsl(&self.ctx, problem, *dtype, params, &refs, crate::kernels::PassPosition::Rows(&pg.rows))
                        } else {
                            kernel.prepare_wgsl(&self.ctx, problem, *dtype, params, &refs, Some(&self.position))
                        };
                        Ok(Some(prog.map_err(failed)?))
                    }
                    (StepKind::Kernel { kernel, params, dtype, problem, binds, .. }, _, _) => {
                        let refs: Vec<&wgpu::Buffer> = binds.iter().map(|&b| &self.bufs[b]).collect();
                        let prog = kernel.prepare_wgsl(&self.ctx, problem, *dtype, params, &refs, Some(&self.position));
                        Ok(Some(prog.map_err(failed)?))
                    }
                    (StepKind::Plumb(p), _, _) => self.plumb_program(p),
                }
            };
            // The same kernel over the same buffers with other values (prefill
            // attention's keys): its buffers and bind groups carry over.
            let prog = match old {
                Some((old, Some(prog))) if old.same_program(&sig) => self.ctx.rebuild(prog, build)?,
                _ => build()?,
            };
            self.programs_built += 1;
            self.progs.insert((tokens, i), (sig, prog));
        }
        Ok(())
    }

    fn plumb_program(&self, p: &Plumb) -> Result<Option<GpuProgram>, RuntimeError> {
        let ctx = &self.ctx;
        let consts = [("WG", WG as f64)];
        let b = |id: BufId| &self.bufs[id];
        let (entry, words, binds, items): (&str, Vec<u32>, Vec<&wgpu::Buffer>, usize) = match *p {
            Plumb::Copy { .. } => return Ok(None),
            Plumb::SplitQkv { src, bias, q, k, v, tokens, nq, nkv } => (
                "split_qkv",
                vec![tokens as u32, nq as u32, nkv as u32, bias.is_some() as u32, 0],
                vec![b(src), bias.map_or(b(src), b), b(q), b(k), b(v)],
                tokens * (nq + 2 * nkv),
            ),
            Plumb::BiasAdd { buf, bias, rows, n } => ("bias_add", vec![rows as u32, n as u32, 0, 0, 0], vec![b(bias), b(buf)], rows * n),
            Plumb::KvWrite { k, v, k_cache, v_cache, tokens, kv_heads, head_dim, kv_cap, .. } => {
                // Paged: each row at its own position and block (the rows buffer);
                // else at the position buffer's pos0 (the block's last word unread).
                // Invocations a row's value: 1 (f32), 1/2 (f16 pairs), 1/32 (q8_0 blocks).
                let (entry, words, per, position) = match &self.paged {
                    Some(pg) => {
                        let mut words = vec![tokens as u32, kv_heads as u32, head_dim as u32, pg.tables.page as u32, pg.max_rows as u32];
                        let (entry, per) = match pg.dtype {
                            DType::F32 => ("kv_write_rows_f32", 1),
                            DType::F16 => ("kv_write_rows_f16", 2),
                            DType::Q8_0 => {
                                words.push(kv_scales_word(pg.dtype, kv_heads * head_dim * pg.tables.page * pg.tables.blocks));
                                ("kv_write_rows_q8", 32)
                            }
                            t => return Err(RuntimeError::Internal(format!("a paged KV cache of {t} values on a GPU"))),
                        };
                        (entry, words, per, (3, &pg.rows))
                    }
                    None => {
                        // The cache's type by its size (the plan's buffer in its layout).
                        let n = kv_heads * kv_cap * head_dim;
                        let mut words = vec![tokens as u32, kv_heads as u32, head_dim as u32, kv_cap as u32, 0];
                        let (entry, per) = match self.sizes[k_cache] {
                            s if s == (n * 2) as u64 => ("kv_write_f16", 2),
                            s if s == DType::Q8_0.bytes_for(n) => {
                                words.push(kv_scales_word(DType::Q8_0, n));
                                ("kv_write_q8", 32)
                            }
                            _ => ("kv_write_f32", 1),
                        };
                        (entry, words, per, (POSITION_BINDING, &self.position))
                    }
                };
                let items = tokens * kv_heads * head_dim / per;
                let pipe = ctx.pipeline(&PLUMB, entry, &consts).map_err(err)?;
                let mut steps = Vec::new();
                let mut owned = Vec::new();
                for (src, dst) in [(k, k_cache), (v, v_cache)] {
                    let u = ctx.uniform(entry, &words);
                    let entries = [(0, b(src)), (1, b(dst)), (2, &u), position].map(|(i, buf)| (i, buf.clone(), 0, None)).to_vec();
                    steps.push(ctx.step_entries(entry.to_string(), pipe.clone(), entries, grid_2d(groups(items, WG))).map_err(err)?);
                    owned.push(u);
                }
                return Ok(Some(GpuProgram { steps, owned }));
            }
        };
        let pipe = ctx.pipeline(&PLUMB, entry, &consts).map_err(err)?;
        let u = ctx.uniform(entry, &words);
        let mut all = binds;
        all.push(&u);
        let step = ctx.step(entry, pipe, &all, grid_2d(groups(items, WG))).map_err(err)?;
        Ok(Some(GpuProgram { steps: vec![step], owned: vec![u] }))
    }

    /// Runs one forward pass of `pass.tokens` tokens from position `pass.pos0` (written to
    /// the position buffer) and returns the first `len` floats of each buffer of
    /// `reads` (copied to persistent staging buffers in the same submit, one wait
    /// for both); per-step GPU times go to `times` when profiling (timestamp
    /// queries). Its host time is added to `phases` (prepare, encode, submit,
    /// wait, post). With `pass.token` (a decode step, when [`GpuExec::embeds_on_gpu`])
    /// the pass starts with that token's embedding, its id written with the
    /// position (the step's only queue write). The programs are kept by
    /// `pass.key` and the step's index.
    pub fn run(
        &mut self,
        Pass { tokens, key, pos0, token }: Pass,
        steps: &[Step],
        times: &mut SlotTimes,
        reads: &[(BufId, usize)],
        phases: &mut Phases,
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let mut lap = Lap::start();
        self.prepare(key, steps)?;
        let mut words = position_words(pos0, tokens);
        let embed = self.embed.is_some() && token.is_some();
        if embed {
            words[2] = token.unwrap_or(0);
        }
        self.ctx.write(&self.position, 0, bytemuck::cast_slice(&words));
        for &(id, len) in reads {
            if self.staging.get(&id).is_none_or(|b| b.size() < crate::gpu::padded((len * 4) as u64)) {
                self.staging.insert(id, self.ctx.staging((len * 4) as u64));
            }
        }
        phases.prepare += lap.lap();
        let scope = self.ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let qs = self.take_profile(steps.len());
        let mut encoder = None;
        self.record_forward(&mut encoder, key, steps, embed, self.batch, qs.as_ref(), None, phases, &mut lap);
        let resolve = self.resolve(&mut encoder, qs.as_ref(), steps.len());
        if !reads.is_empty() {
            let enc = self.encoder(&mut encoder, "read");
            for &(id, len) in reads {
                let size = crate::gpu::padded((len * 4) as u64).min(self.bufs[id].size());
                enc.copy_buffer_to_buffer(&self.bufs[id], 0, &self.staging[&id], 0, size);
            }
        }
        if let Some(enc) = encoder.take() {
            let cmd = enc.finish();
            phases.encode += lap.lap();
            self.ctx.submit(cmd);
        }
        phases.submit += lap.lap();
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Gpu(format!("validation error running the forward pass: {e}")));
        }
        self.ctx.wait().map_err(err)?;
        phases.wait += lap.lap();
        if let Some(r) = resolve {
            self.read_times(r, steps, times)?;
        }
        let mut out = Vec::with_capacity(reads.len());
        for &(id, len) in reads {
            let bytes = self.ctx.read_mapped(&self.staging[&id], (len * 4) as u64).map_err(err)?;
            out.push(bytemuck::pod_collect_to_vec(&bytes));
        }
        phases.post += lap.lap();
        Ok(out)
    }

    /// Records and submits a chain of `k` decode steps of `steps` (the compiled
    /// schedule of a one-token pass, moved to the chain's last position: the
    /// kernels' checks bound the KV length from above, so its programs serve the
    /// earlier positions): each step embeds the position buffer's token (when
    /// [`GpuExec::embeds_on_gpu`]; else the caller wrote the one step's row),
    /// runs the forward pass and picks the next token by `rule` over `blocks`
    /// (softcap `cap`), which `advance` makes the next step's token; one command
    /// buffer (with `batch`), one submit, the ids copied to the next ring buffer.
    /// `start` (one queue write of 16 bytes, and the sampler's state when
    /// sampling) begins a generation's first chain; without it the chain goes on
    /// from the last. A profiled step (`k` = 1) is timed into `times` by
    /// [`GpuExec::finish_chain`]: with [`StepTiming::InsidePass`] in the passes
    /// and with the [`TokenStamps`] an unprofiled step has (the same command
    /// stream), else a pass per step, without them.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_chain(
        &mut self,
        steps: &[Step],
        start: Option<ChainStart<'_>>,
        k: usize,
        rule: PickRule,
        blocks: &[PickBlock],
        cap: f32,
        phases: &mut Phases,
    ) -> Result<Pending, RuntimeError> {
        let mut lap = Lap::start();
        let k = k.clamp(1, MAX_CHAIN);
        self.prepare(1, steps)?;
        if self.picker.as_ref().is_none_or(|p| p.rule != rule) {
            self.picker = None;
            self.picker = Some(Picker::new(&self.ctx, &self.bufs, blocks, cap, rule, &self.position, &self.ids)?);
        }
        if let Some(st) = start {
            let mut words = position_words(st.pos, 1);
            words[2] = st.token;
            self.ctx.write(&self.position, 0, bytemuck::cast_slice(&words));
            if let (Some(buf), Some(state)) = (self.picker.as_ref().and_then(|p| p.state.as_ref()), st.sampler) {
                self.ctx.write(buf, 0, bytemuck::cast_slice(&state.words()));
            }
        }
        phases.prepare += lap.lap();
        let scope = self.ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let qs = if k == 1 { self.take_profile(steps.len()) } else { None };
        let ring = self.next_ring;
        self.next_ring = (ring + 1) % RING;
        // Each step's span, unless its passes carry a profile's pass-level writes.
        let stamps = self.stamps.as_ref().filter(|_| qs.is_none() || self.timing() == StepTiming::InsidePass);
        let mut encoder = None;
        // A new chain's slots start at 0 (the GPU's position words carry on).
        self.encoder(&mut encoder, "chain").clear_buffer(&self.position, 12, Some(4));
        let embed = self.embed.is_some();
        for j in 0..k {
            let begin = stamps.map(|s| s.writes(j, true));
            self.record_forward(&mut encoder, 1, steps, embed, true, qs.as_ref(), begin, phases, &mut lap);
            let enc = self.encoder(&mut encoder, "pick");
            let mut pass = self.ctx.begin_pass(enc, "pick", stamps.map(|s| s.writes(j, false)));
            for p in self.picker.iter().flat_map(|p| &p.progs) {
                self.ctx.record(&mut pass, p);
            }
        }
        let resolve = self.resolve(&mut encoder, qs.as_ref(), steps.len());
        if let Some(s) = stamps {
            let enc = self.encoder(&mut encoder, "stamps");
            enc.resolve_query_set(&s.queries, 0..2 * k as u32, &s.resolved, 0);
            let mut pass = self.ctx.begin_pass(enc, "stamps", None);
            self.ctx.record(&mut pass, &s.sum);
        }
        let words = k + stamps.is_some() as usize;
        self.encoder(&mut encoder, "ids").copy_buffer_to_buffer(&self.ids, 0, &self.ring[ring], 0, 4 * words as u64);
        let cmd =
            encoder.take().map(wgpu::CommandEncoder::finish).ok_or_else(|| RuntimeError::Internal("a chain recorded nothing".into()))?;
        phases.encode += lap.lap();
        let index = self.ctx.submit(cmd);
        phases.submit += lap.lap();
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Gpu(format!("validation error running a decode chain: {e}")));
        }
        Ok(Pending { ring, steps: k, index, resolve, stamped: stamps.is_some() })
    }

    /// The ids of a submitted chain, in order, and its GPU time: waits for its
    /// submit alone (one host wait; a chain submitted after it keeps running)
    /// and reads 4 bytes a step (and 4 for the time). A profiled step's times go
    /// to `times`.
    pub fn finish_chain(
        &mut self,
        p: Pending,
        steps: &[Step],
        times: &mut SlotTimes,
        phases: &mut Phases,
    ) -> Result<ChainIds, RuntimeError> {
        let mut lap = Lap::start();
        let words = p.steps + p.stamped as usize;
        let bytes = self.ctx.read_mapped_after(&self.ring[p.ring], 4 * words as u64, Some(p.index)).map_err(err)?;
        phases.wait += lap.lap();
        if let Some(r) = p.resolve {
            self.read_times(r, steps, times)?;
        }
        let mut ids = bytemuck::pod_collect_to_vec::<u8, u32>(&bytes);
        let period = self.ctx.queue.get_timestamp_period() as f64;
        let gpu_seconds = if p.stamped { ids.pop().map(|t| f32::from_bits(t) as f64 * period * 1e-9) } else { None };
        phases.post += lap.lap();
        Ok(ChainIds { ids, gpu_seconds })
    }

    /// The command encoder being recorded, begun when there is none.
    fn encoder<'e>(&self, encoder: &'e mut Option<wgpu::CommandEncoder>, label: &str) -> &'e mut wgpu::CommandEncoder {
        encoder.get_or_insert_with(|| self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) }))
    }

    /// A timestamp query set for the `n` steps of the next pass when it is to be
    /// profiled ([`GpuExec::profiles_next`]), the request then served.
    fn take_profile(&mut self, n: usize) -> Option<wgpu::QuerySet> {
        let qs = self.profiles_next().then(|| self.ctx.query_set("ktune steps", (2 * n as u32).max(2)));
        if qs.is_some() {
            self.profile = false;
        }
        qs
    }

    /// Records one forward pass of `steps` into `encoder`, the GPU embedding of
    /// the position buffer's token first with `embed`: consecutive program steps
    /// in one compute pass (without `batch` one step a pass, each submitted at
    /// once: [`GpuExec::batch`], which chains do not follow), copies between passes. When profiling, step `i`'s timestamps go to
    /// queries `2i`, `2i + 1` of `qs` ([`GpuExec::step_timing`]: written around
    /// its dispatches inside the pass, or at the start and end of a pass of its
    /// own). `begin`: the pass-level writes of the first pass begun.
    #[allow(clippy::too_many_arguments)]
    fn record_forward(
        &self,
        encoder: &mut Option<wgpu::CommandEncoder>,
        tokens: usize,
        steps: &[Step],
        embed: bool,
        batch: bool,
        qs: Option<&wgpu::QuerySet>,
        mut begin: Option<wgpu::ComputePassTimestampWrites<'_>>,
        phases: &mut Phases,
        lap: &mut Lap,
    ) {
        let inside = qs.filter(|_| self.timing() == StepTiming::InsidePass);
        let per_pass = qs.filter(|_| self.timing() == StepTiming::PassPerStep);
        if let Some(prog) = self.embed.as_ref().filter(|_| embed) {
            let enc = self.encoder(encoder, "embed");
            let mut pass = self.ctx.begin_pass(enc, "embed", begin.take());
            self.ctx.record(&mut pass, prog);
        }
        let mut i = 0usize;
        // Copies since the last pass: timed inside the next (their queries are
        // written, a span of about 0, as every resolved query must be).
        let mut copies = 0..0;
        while i < steps.len() {
            let enc = self.encoder(encoder, "step");
            if let StepKind::Plumb(Plumb::Copy { src, src_off, dst, dst_off, len }) = steps[i].kind {
                enc.copy_buffer_to_buffer(&self.bufs[src], (src_off * 4) as u64, &self.bufs[dst], (dst_off * 4) as u64, (len * 4) as u64);
                copies = if copies.is_empty() { i..i + 1 } else { copies.start..i + 1 };
                i += 1;
            } else {
                // One pass over consecutive program steps (or one step when profiling a pass per step / not batching).
                let single = per_pass.is_some() || !batch;
                let ts = match per_pass {
                    Some(q) => Some(wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    }),
                    None => begin.take(),
                };
                let mut pass = self.ctx.begin_pass(enc, steps[i].slot.name(), ts);
                if let Some(q) = inside {
                    for c in std::mem::replace(&mut copies, 0..0) {
                        pass.write_timestamp(q, 2 * c as u32);
                        pass.write_timestamp(q, 2 * c as u32 + 1);
                    }
                }
                loop {
                    if let Some((_, Some(prog))) = self.progs.get(&(tokens, i)) {
                        if let Some(q) = inside {
                            pass.write_timestamp(q, 2 * i as u32);
                        }
                        self.ctx.record(&mut pass, prog);
                        if let Some(q) = inside {
                            pass.write_timestamp(q, 2 * i as u32 + 1);
                        }
                    }
                    i += 1;
                    if single || i >= steps.len() || matches!(steps[i].kind, StepKind::Plumb(Plumb::Copy { .. })) {
                        break;
                    }
                }
            }
            if !batch && let Some(enc) = encoder.take() {
                let cmd = enc.finish();
                phases.encode += lap.lap();
                self.ctx.submit(cmd);
                phases.submit += lap.lap();
            }
        }
    }

    /// The profiled pass's timestamps resolved into a new buffer and copied to a
    /// mappable one in `encoder` (read after the pass's submit, adding none).
    fn resolve(&self, encoder: &mut Option<wgpu::CommandEncoder>, qs: Option<&wgpu::QuerySet>, n: usize) -> Option<(wgpu::Buffer, u32)> {
        let q = qs?;
        let n = n as u32;
        let bytes = (16 * n as u64).max(16);
        let usage = wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC;
        let buf = self.ctx.buffer("step timestamps", bytes, usage);
        let staging = self.ctx.staging(bytes);
        let enc = self.encoder(encoder, "resolve");
        enc.resolve_query_set(q, 0..2 * n, &buf, 0);
        enc.copy_buffer_to_buffer(&buf, 0, &staging, 0, bytes);
        Some((staging, n))
    }

    /// Each step's GPU time from a resolved profile (its submit finished) into `times`.
    fn read_times(&self, (staging, n): (wgpu::Buffer, u32), steps: &[Step], times: &mut SlotTimes) -> Result<(), RuntimeError> {
        let bytes = self.ctx.read_mapped(&staging, 16 * n as u64).map_err(err)?;
        let t: &[u64] = bytemuck::cast_slice(&bytes);
        let period = self.ctx.queue.get_timestamp_period() as f64;
        for (k, s) in steps.iter().enumerate() {
            let ns = t[2 * k + 1].saturating_sub(t[2 * k]) as f64 * period;
            times.add(s.slot, ns * 1e-9);
        }
        Ok(())
    }

    /// Whether a decode token's embedding is looked up on the GPU (else the
    /// host writes the row: the table is not on the GPU, untied from the LM head).
    pub fn embeds_on_gpu(&self) -> bool {
        self.embed.is_some()
    }

    /// How a profiled pass is timed: [`GpuExec::step_timing`], a pass per step
    /// where the adapter cannot write timestamps inside a pass.
    pub fn timing(&self) -> StepTiming {
        if self.ctx.caps.timestamp_inside_passes { self.step_timing } else { StepTiming::PassPerStep }
    }

    /// Whether the next [`GpuExec::run`] times each step (asked, and the adapter
    /// has timestamp queries).
    pub fn profiles_next(&self) -> bool {
        self.profile && self.ctx.caps.timestamp_query
    }

    /// GPU dispatches of the prepared steps of layer `l` in the pass of `tokens` tokens.
    pub fn dispatches(&self, tokens: usize, steps: &[Step], layer: usize) -> usize {
        steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.layer == Some(layer))
            .map(|(i, _)| self.progs.get(&(tokens, i)).and_then(|(_, p)| p.as_ref()).map_or(0, GpuProgram::dispatches))
            .sum()
    }

    pub fn write(&self, id: BufId, data: &[f32]) {
        self.ctx.write(&self.bufs[id], 0, bytemuck::cast_slice(data));
    }
}

#[cfg(test)]
mod tests {
    use super::Selector;
    use crate::kernels::{DType, Problem, find};
    use crate::testing::test_gpu;

    /// The GPU's greedy selection picks what the host's `argmax` picks: the
    /// first of equal maxima (across a workgroup's lanes and across LM-head
    /// blocks), NaN never winning, 0 when logit 0 is NaN, -0 equal to +0, and
    /// the softcapped row's first maximum (saturated ties included).
    #[test]
    fn gpu_argmax_agrees_with_the_host_on_ties_and_nans() {
        let Some(gpu) = test_gpu() else { return };
        let n = 1000usize;
        let nan = f32::NAN;
        let ramp: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let mut cases: Vec<(&str, Vec<f32>, f32)> = vec![("ramp", ramp.clone(), 0.0)];
        let mut ties = vec![1.0f32; n];
        ties[700] = 3.0;
        ties[300] = 3.0;
        ties[301] = 3.0;
        cases.push(("ties", ties.clone(), 0.0));
        cases.push(("all equal", vec![2.0; n], 0.0));
        let mut nans = ramp.clone();
        nans.iter_mut().step_by(3).for_each(|v| *v = nan);
        nans[5] = f32::INFINITY;
        cases.push(("nans", nans, 0.0));
        let mut nan0 = ties.clone();
        nan0[0] = nan;
        cases.push(("nan first", nan0, 0.0));
        cases.push(("all nan", vec![nan; n], 0.0));
        let mut zeros = vec![f32::NEG_INFINITY; n];
        zeros[400] = -0.0;
        zeros[200] = 0.0;
        cases.push(("signed zeros", zeros, 0.0));
        cases.push(("all -inf", vec![f32::NEG_INFINITY; n], 0.0));
        // tanh saturates: 1e4 and 2e4 both cap to exactly 30.
        let mut capped = ramp.clone();
        capped[900] = 2e4;
        capped[600] = 1e4;
        cases.push(("softcapped", capped, 30.0));
        for (what, row, cap) in cases {
            let host_row: Vec<f32> =
                if cap > 0.0 { row.iter().map(|&v| ((v as f64 / cap as f64).tanh() * cap as f64) as f32).collect() } else { row.clone() };
            let want = crate::runtime::argmax(&host_row);
            // One block, and the row cut into blocks of 333 rows (own buffers).
            for block in [n, 333] {
                let mut bufs = Vec::new();
                let mut blocks = Vec::new();
                for (k, part) in row.chunks(block).enumerate() {
                    bufs.push(gpu.upload("logits", bytemuck::cast_slice(part)));
                    blocks.push((k, part.len(), k * block));
                }
                let sel = Selector::new(&gpu, &bufs, &blocks, cap).expect("builds");
                let progs: Vec<&crate::gpu::GpuProgram> = sel.progs.iter().collect();
                gpu.run("argmax", &progs).expect("runs");
                let bytes = gpu.read(&sel.out, sel.at + 8).expect("reads");
                let got = Selector::token(&bytemuck::pod_collect_to_vec::<u8, u32>(&bytes[sel.at as usize..]));
                assert_eq!(got, want, "{what}, blocks of {block}");
            }
        }
    }

    /// A program rebuilt for other values of its problem (what prefill attention
    /// gets as the position moves) takes over its predecessor's uniform and
    /// scratch buffers and bind groups (no creation), and computes what a program
    /// built from scratch for those values computes.
    #[test]
    fn a_rebuilt_step_reuses_its_buffers_and_computes_the_same() {
        let Some(gpu) = test_gpu() else { return };
        let k = find("attention_decode_splitkv").expect("registered");
        let params = k.default_params();
        let (heads, kv_heads, d, cap) = (4usize, 2usize, 32usize, 256usize);
        let at = |kv_len| Problem::AttentionDecode { kv_len, kv_cap: cap, heads, kv_heads, head_dim: d, window: 0, scale: 0.2 };
        let data = |n: usize, s: u32| -> Vec<f32> {
            (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ s) % 1000) as f32 / 500.0 - 1.0).collect()
        };
        let q = gpu.upload("q", bytemuck::cast_slice(&data(heads * d, 1)));
        let kc = gpu.upload("k", bytemuck::cast_slice(&data(kv_heads * cap * d, 2)));
        let vc = gpu.upload("v", bytemuck::cast_slice(&data(kv_heads * cap * d, 3)));
        let (out1, out2) = (gpu.storage("out1", (heads * d * 4) as u64), gpu.storage("out2", (heads * d * 4) as u64));
        // 100 and 120 keys: the same number of 256-key splits, so same-size scratch.
        let old = k.prepare_wgsl(&gpu, &at(100), DType::F32, &params, &[&q, &kc, &vc, &out1], None).expect("builds");
        let (old_owned, old_groups): (Vec<wgpu::Buffer>, Vec<wgpu::BindGroup>) =
            (old.owned.clone(), old.steps.iter().map(|s| s.bind_group.clone()).collect());
        let rebuilt =
            gpu.rebuild(old, || k.prepare_wgsl(&gpu, &at(120), DType::F32, &params, &[&q, &kc, &vc, &out1], None)).expect("rebuilds");
        assert_eq!(rebuilt.owned, old_owned, "uniform and scratch buffers carried over");
        assert_eq!(rebuilt.steps.iter().map(|s| s.bind_group.clone()).collect::<Vec<_>>(), old_groups, "bind groups carried over");
        let fresh = k.prepare_wgsl(&gpu, &at(120), DType::F32, &params, &[&q, &kc, &vc, &out2], None).expect("builds");
        assert!(fresh.owned.iter().all(|b| !old_owned.contains(b)), "outside a rebuild, new buffers");
        gpu.run("rebuilt", &[&rebuilt, &fresh]).expect("runs");
        let (a, b) = (gpu.read(&out1, (heads * d * 4) as u64).expect("reads"), gpu.read(&out2, (heads * d * 4) as u64).expect("reads"));
        assert_eq!(a, b, "the rebuilt program computes what a fresh one does");
        assert!(a.iter().any(|&x| x != 0), "an output was written");
    }
}
