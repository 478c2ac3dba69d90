//! Executes a plan on a backend: weights loaded into the plan's buffers, the
//! embedding of each token looked up on the host, prefill (a prompt at once) and
//! decode (one token at a time against the KV cache), generation with a sampler
//! ([`Engine::decode_chain`]: on a GPU K steps chained per submit, the token
//! picked there), the time each slot took, and what each decode token cost the
//! host ([`counters`]).

pub mod counters;
pub mod cpu;
pub mod gpu;
pub mod image;
pub mod kv_pool;
pub mod tower;
pub mod vision;
pub mod vision_gpu;

use std::collections::BTreeMap;
use std::sync::Arc;

use half::f16;
use serde::Serialize;

use crate::gpu::GpuCtx;
use crate::kernels::quant::{QMatrix, QStack};
use crate::kernels::sample::{Sampler, SamplerParams, SamplerState};
use crate::kernels::{DType, KernelError};
use crate::plan::{BufId, BufRole, Plan, PlanError, Slot, WeightSource};
use counters::{DecodeCounters, DecodeTally, Lap, Phases};
use cpu::{CpuExec, HostBuf};
use gpu::GpuExec;
pub use gpu::StepTiming;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("slot `{slot}`{}: {source}", layer.map(|l| format!(" layer {l}")).unwrap_or_default())]
    Kernel { slot: String, layer: Option<usize>, source: Box<KernelError> },
    #[error("GPU: {0}")]
    Gpu(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    Token { id: u32, vocab: usize },
    #[error("the prompt holds {tokens} image tokens (id {placeholder}) but the image gives {rows} soft tokens")]
    SoftTokens { placeholder: u32, tokens: usize, rows: usize },
    #[error(
        "an image of {tokens} tokens does not fit a prefill chunk of {chunk} tokens (its tokens attend to each other, so one pass holds them all): raise --prefill-chunk"
    )]
    ImageChunk { tokens: usize, chunk: usize },
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error("context full: {pos} tokens of {context}; raise --context")]
    ContextFull { pos: usize, context: usize },
    #[error(
        "the paged KV cache's {blocks} blocks are all held by sequences: raise --kv-tokens, or serve fewer sequences at once (--parallel)"
    )]
    KvFull { blocks: usize },
    #[error("internal error: {0}")]
    Internal(String),
}

/// Where weights come from: a model file or deterministic synthetic values.
pub trait TensorStore: Send + Sync {
    /// The tensor `name` as `dtype` values, row-major, with `len` elements expected.
    fn load(&self, name: &str, dtype: DType, len: usize) -> Result<HostBuf, RuntimeError>;
    /// Elements `start..start + len` of the tensor `name` (flattened) as `dtype` values.
    fn load_range(&self, name: &str, dtype: DType, start: usize, len: usize) -> Result<HostBuf, RuntimeError>;
    /// Row `row` of a 2-D tensor as f32 (the embedding lookup).
    fn row(&self, name: &str, row: usize, cols: usize) -> Result<Vec<f32>, RuntimeError>;
    /// [`TensorStore::row`] into `out` (`cols` = `out.len()`); a store that can
    /// decode in place overrides it so a decode step allocates nothing.
    fn row_into(&self, name: &str, row: usize, out: &mut [f32]) -> Result<(), RuntimeError> {
        out.copy_from_slice(&self.row(name, row, out.len())?);
        Ok(())
    }
    /// Whether `name` loaded as `dtype` holds exactly the values [`TensorStore::row`]
    /// gives (no rounding, no requantization): then a GPU engine looks the
    /// embedding up in the tied LM head's buffers. Default: not known, false.
    fn exact_as(&self, _name: &str, _dtype: DType) -> bool {
        false
    }
}

/// Accumulated time per slot, in seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SlotTimes {
    pub seconds: BTreeMap<Slot, f64>,
}

impl SlotTimes {
    pub fn add(&mut self, slot: Slot, s: f64) {
        *self.seconds.entry(slot).or_insert(0.0) += s;
    }
    pub fn total(&self) -> f64 {
        self.seconds.values().sum()
    }
}

enum Exec {
    Cpu(Box<CpuExec>),
    Gpu(Box<GpuExec>),
}

impl Exec {
    /// Readies the paged KV cache for a pass over `seqs` (each its table, its
    /// position and the tokens the pass feeds it), on either executor.
    fn page_in(&mut self, pool: &kv_pool::KvPool, seqs: &mut [(&mut Vec<u32>, usize, usize)]) -> Result<(), RuntimeError> {
        match self {
            Exec::Cpu(e) => e.page_in(pool, seqs),
            Exec::Gpu(e) => e.page_in(pool, seqs),
        }
    }
}

/// A model ready to run on one device.
pub struct Engine {
    pub plan: Plan,
    exec: Exec,
    store: Arc<dyn TensorStore>,
    /// Tokens already in the KV cache.
    pub pos: usize,
    /// Per-slot times of the last prefill and of all decode steps so far.
    pub prefill_times: SlotTimes,
    pub decode_times: SlotTimes,
    /// The GPU time of the last profiled decode step, first pass to pick, from
    /// the same timestamps every chained step has (seconds; None before one, and
    /// for a step profiled a pass per step): what its slot times add up to at
    /// most.
    pub profiled_step_gpu_seconds: Option<f64>,
    /// Dispatches (GPU) or kernel steps (CPU) in one layer of a decode step.
    pub dispatches_per_layer: usize,
    /// Compiled schedules: the steps of a pass of `n` tokens (kernel choices,
    /// parameters, bindings resolved once), moved to each call's position by
    /// [`Plan::rebase`] instead of being built again.
    schedules: Vec<(usize, Vec<crate::plan::Step>)>,
    /// Reused per call: the embedded tokens, the last pass's per-slot times and
    /// the logits (`rows` rows of the vocabulary).
    x: Vec<f32>,
    pass_times: SlotTimes,
    logits: Vec<f32>,
    /// CPU: threads the kernels' pool runs this engine's passes on (0: all).
    cpu_threads: usize,
    /// CPU: idle spin of the pool's workers, µs (0: the pool's default).
    cpu_spin_us: u32,
    cpu_prefetch: Option<u32>,
    /// Soft tokens (an image's projected tokens) that replace the embeddings of
    /// a placeholder id during one [`Engine::forward_with_soft_tokens`].
    soft: Option<SoftTokens>,
    /// How the soft tokens of an image attend to each other (the default:
    /// bidirectionally, as Gemma 3's processor asks).
    pub image_attention: ImageAttention,
    /// Host phases and GPU counts of the tallied decode steps ([`counters`]).
    tally: DecodeTally,
    /// The most positions the KV cache held was written up to.
    kv_written: usize,
    /// Compiled batch passes by their sequences' rows ([`Engine::batch_pass`]),
    /// and each buffer's floats a token (activations; 0 for the rest).
    batch_schedules: Vec<(Vec<usize>, Vec<crate::plan::Step>)>,
    /// Decode batch passes run ([`Engine::batch_passes`]); those of them with
    /// prompts' chunks, and the chunks ([`Engine::mixed_passes`]).
    batch_passes: u64,
    mixed_passes: (u64, u64),
    row_widths: Vec<usize>,
    /// The packed rows of the decode batches' int8 GEMMs, kept.
    panels: Option<Arc<crate::kernels::cpu::qgemm::PanelCache>>,
    /// A paged KV cache ([`Engine::enable_paged`]): the pool's blocks and the
    /// table of the sequence the engine holds.
    paged: Option<EnginePaged>,
}

struct EnginePaged {
    pool: kv_pool::KvPool,
    table: Vec<u32>,
}

/// Positions one block of a paged KV cache holds ([`Engine::enable_paged`]):
/// attention reads a block's rows of a head in one call each for its scores
/// and its values, so a sequence of 480 positions is 8 calls of each a head
/// (with blocks of 16 the calls' own cost slowed a lone decode at that length by
/// a tenth: `PARALLEL=8 CLIENTS=1 tools/bench_serve.sh`, docs/serve.md); a
/// sequence leaves at most 63 positions of its last block unused.
pub const KV_PAGE: usize = 64;

/// One sequence's KV cache outside the engine ([`Engine::swap_sequence`]): the
/// plan's cache buffers and the sequence's position, so many sequences share one
/// engine (its weights, its compiled schedules) a step each in turn.
pub struct SeqKv {
    bufs: Vec<(BufId, HostBuf)>,
    /// Tokens in this cache.
    pub pos: usize,
    /// The most positions written since it was made or released.
    written: usize,
    /// With a paged KV cache: its blocks in position order (`bufs` empty), held
    /// in `pool`.
    table: Vec<u32>,
    pool: Option<kv_pool::KvPool>,
}

impl SeqKv {
    /// The most positions this cache was written up to (what it takes of memory).
    pub fn written(&self) -> usize {
        self.written.max(self.pos)
    }

    /// Its part in [`kv_pool::claim`] (a paged sequence's), were it to keep its
    /// first `keep` positions and write up to `end`.
    pub fn claim(&self, keep: usize, end: usize) -> kv_pool::Claim<'_> {
        let pos = keep.min(self.pos);
        kv_pool::Claim { table: &self.table, pos, written: self.written(), end: end.max(pos) }
    }

    /// The part in [`kv_pool::claim`] of a sequence given this one's first `n`
    /// positions ([`Engine::copy_prefix`]) and writing up to `end`.
    pub fn prefix_claim(&self, n: usize, end: usize) -> kv_pool::Claim<'_> {
        let n = n.min(self.written());
        let table = &self.table[..n.div_ceil(KV_PAGE).min(self.table.len())];
        kv_pool::Claim { table, pos: n, written: n, end: end.max(n) }
    }

    /// Empties the cache and hands its memory back: to the system, or its
    /// blocks to the paged cache's pool (a block another sequence shares stays
    /// with it).
    pub fn release(&mut self) {
        for (_, hb) in &mut self.bufs {
            hb.release_zeroed();
        }
        if let Some(pool) = &self.pool {
            pool.release(&self.table);
        }
        self.table.clear();
        self.pos = 0;
        self.written = 0;
    }
}

impl Drop for SeqKv {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.release(&self.table);
        }
    }
}

/// Rows that take the place of a placeholder token's embedding, in order.
struct SoftTokens {
    id: u32,
    rows: Vec<f32>,
    next: usize,
}

/// How the tokens of one image (a run of consecutive placeholders) attend to each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageAttention {
    /// Every token of an image sees every token of that image, later ones
    /// included, besides the causal (or sliding-window) keys: what transformers
    /// computes with the `token_type_ids` Gemma 3's processor returns.
    #[default]
    Bidirectional,
    /// Causal like text: transformers without `token_type_ids`.
    Causal,
}

/// One prefill pass of a prompt: `(start, end, block)`, see [`prefill_passes`].
pub type PrefillPass = (usize, usize, (usize, usize));

/// The passes of a prompt of `tokens`: `(start, end, block)`, at most `chunk`
/// tokens each, where `block` is the run of `image` tokens in the pass (indices in
/// `tokens`; `(0, 0)` for none). With an image id, a pass never splits a run nor
/// holds two (each pass has one bidirectional block); a run longer than `chunk`
/// is an error.
///
/// Without an image, no pass of a prompt of two tokens or more holds one token
/// alone (with a chunk of 2 or more): a pass of one token runs the decode
/// kernels, whose arithmetic differs from the prefill kernels' (int8 rounding
/// then carries the difference to the logits), while the prefill kernels give
/// each token the same values however the prompt is cut into passes. So a
/// prompt's logits do not depend on the chunk, nor on where an earlier call
/// left off (see `Generator::complete`, which never leaves one token to a call).
pub fn prefill_passes(tokens: &[u32], chunk: usize, image: Option<u32>) -> Result<Vec<PrefillPass>, RuntimeError> {
    let chunk = chunk.max(1);
    let Some(id) = image else {
        let mut passes: Vec<PrefillPass> = (0..tokens.len()).step_by(chunk).map(|s| (s, (s + chunk).min(tokens.len()), (0, 0))).collect();
        // A last pass of one token takes the last token of the pass before
        // (which keeps `chunk - 1 >= 1`).
        if chunk >= 2
            && passes.len() >= 2
            && let [.., a, b] = passes.as_mut_slice()
            && b.1 - b.0 == 1
        {
            a.1 -= 1;
            b.0 -= 1;
        }
        return Ok(passes);
    };
    // The runs of image tokens, [start, end).
    let mut runs = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == id {
            let s = i;
            while i < tokens.len() && tokens[i] == id {
                i += 1;
            }
            if i - s > chunk {
                return Err(RuntimeError::ImageChunk { tokens: i - s, chunk });
            }
            runs.push((s, i));
        } else {
            i += 1;
        }
    }
    let mut passes = Vec::new();
    let (mut start, mut r) = (0, 0);
    while start < tokens.len() {
        let mut end = (start + chunk).min(tokens.len());
        let mut block = (0, 0);
        // The first run not wholly before this pass.
        while r < runs.len() && runs[r].1 <= start {
            r += 1;
        }
        if let Some(&(s, e)) = runs.get(r)
            && s < end
        {
            if s > start && e > end {
                // The run would be cut: the pass ends where it starts.
                end = s;
            } else {
                block = (s, e);
                // Stop before the next run, if it begins in this pass.
                if let Some(&(s2, _)) = runs.get(r + 1)
                    && s2 < end
                {
                    end = s2;
                }
            }
        }
        passes.push((start, end, block));
        start = end;
    }
    Ok(passes)
}

/// Hands `ids` to `on_id` in order, each recorded by `sampler`, until it
/// returns false: (ids handed over, whether it stopped).
fn deliver(ids: &[u32], sampler: &mut Sampler, on_id: &mut impl FnMut(u32) -> bool) -> (usize, bool) {
    for (i, &id) in ids.iter().enumerate() {
        sampler.record(id);
        if !on_id(id) {
            return (i + 1, true);
        }
    }
    (ids.len(), false)
}

/// Concatenates `parts` (each row-major with the same column count) along rows,
/// into memory marked for huge pages before it is written (the weights it makes
/// are backed by them). Parts of another kind than the first are left out (the
/// caller's length check names the buffer).
fn concat(parts: Vec<HostBuf>) -> HostBuf {
    fn joined<T: Clone>(all: Vec<Vec<T>>) -> Vec<T> {
        let mut v = crate::kernels::memory::huge_vec(all.iter().map(Vec::len).sum());
        all.iter().for_each(|p| v.extend_from_slice(p));
        v
    }
    let mut parts = parts.into_iter().map(HostBuf::owned).peekable();
    match parts.peek() {
        None => HostBuf::F32(Vec::new()),
        Some(HostBuf::F32(_)) => HostBuf::F32(joined(parts.map_while(|p| if let HostBuf::F32(v) = p { Some(v) } else { None }).collect())),
        Some(HostBuf::F16(_)) => HostBuf::F16(joined(parts.map_while(|p| if let HostBuf::F16(v) = p { Some(v) } else { None }).collect())),
        Some(HostBuf::Q(_)) => {
            let all: Vec<QMatrix> = parts.map_while(|p| if let HostBuf::Q(m) = p { Some(m) } else { None }).collect();
            QMatrix::concat_rows(&all).map_or(HostBuf::F32(Vec::new()), HostBuf::Q)
        }
        Some(_) => parts.next().unwrap_or(HostBuf::F32(Vec::new())),
    }
}

/// Loads buffer `i` of `plan` from `store` (None for activations, caches, constants).
fn load_buffer(plan: &Plan, store: &dyn TensorStore, i: usize) -> Result<Option<HostBuf>, RuntimeError> {
    let b = &plan.buffers[i];
    if b.role != BufRole::Weight {
        return Ok(None);
    }
    let Some(src) = &b.source else { return Ok(None) };
    // A family's multiplier folded into the tensor (`ModelConfig::weight_scale`).
    let scaled = |name: &str, first: usize, hb: HostBuf| match plan.config.weight_scale(name) {
        Some(s) => hb.scaled(first, &s),
        None => hb,
    };
    let hb = match src {
        WeightSource::Tensor(name) => scaled(name, 0, store.load(name, b.dtype, b.len)?),
        WeightSource::Concat(names) if let Some(f) = b.formats => {
            // Per-operand formats: each part loaded in its own format, stacked.
            let cols = b.len / f.rows().max(1);
            let parts = names
                .iter()
                .zip(f.parts())
                .map(|(n, &(rows, q))| match scaled(n, 0, store.load(n, q.into(), rows as usize * cols)?).owned() {
                    HostBuf::Q(m) => Ok(m),
                    _ => Err(RuntimeError::Internal(format!("`{n}` did not load as {q} blocks"))),
                })
                .collect::<Result<Vec<_>, RuntimeError>>()?;
            HostBuf::Stack(QStack::new(parts).map_err(|e| RuntimeError::Internal(format!("`{}`: {e}", b.name)))?)
        }
        WeightSource::Concat(names) => {
            let per = b.len / names.len().max(1);
            let lens = concat_lens(plan, names, b.len, per);
            let parts = names
                .iter()
                .zip(lens)
                .map(|(n, len)| Ok(scaled(n, 0, store.load(n, b.dtype, len)?)))
                .collect::<Result<Vec<_>, RuntimeError>>()?;
            concat(parts)
        }
        WeightSource::Slice { tensor, start } => scaled(tensor, *start, store.load_range(tensor, b.dtype, *start, b.len)?),
    };
    Ok(Some(hb))
}

/// Element counts of the tensors a fused buffer concatenates (Q is larger than K/V).
fn concat_lens(plan: &Plan, names: &[String], total: usize, even: usize) -> Vec<usize> {
    let c = &plan.config;
    if names.len() == 3 {
        let (nq, nkv) = (c.q_dim(), c.kv_dim());
        let per_row = total / (nq + 2 * nkv);
        vec![nq * per_row, nkv * per_row, nkv * per_row]
    } else {
        vec![even; names.len()]
    }
}

/// Weights loaded once and shared by several CPU engines of one model (the tuner's
/// end-to-end combinations, `ktune bench`'s entries): each buffer is keyed by its
/// source, storage type and length, so engines whose plans lay a weight out alike
/// read the same memory, and building another engine costs no reload.
#[derive(Default)]
pub struct WeightMemo {
    bufs: std::sync::Mutex<BTreeMap<String, Arc<HostBuf>>>,
}

impl WeightMemo {
    /// Forgets every weight (engines built from it keep theirs).
    pub fn clear(&self) {
        if let Ok(mut m) = self.bufs.lock() {
            m.clear();
        }
    }
}

/// A store that loads each weight once: a [`TensorStore::load`] as a block
/// format, or as one of the float types it was made to keep, is kept (shared,
/// read only) for the store's life, so the tuner's engines of one model (each
/// combination's layout, the accuracy check's scored engines and f32 reference,
/// the head-to-head pair) copy, concatenate or repack kept rows instead of
/// quantizing or converting the model again (a 3B model to Q4_K: ~20 s on two
/// cores, a copy of its 1.8 GB well under one). Other float loads pass through
/// (an f32 reference of a quantized model would double what is held).
pub struct LoadOnce {
    inner: Arc<dyn TensorStore>,
    /// The float types kept (block formats always are).
    floats: Vec<DType>,
    kept: std::sync::Mutex<BTreeMap<String, Arc<HostBuf>>>,
    /// Nanoseconds spent in the loads that were kept.
    fresh_ns: std::sync::atomic::AtomicU64,
}

impl LoadOnce {
    /// Over `inner`, keeping block formats and the float types in `floats`.
    pub fn new(inner: Arc<dyn TensorStore>, floats: &[DType]) -> LoadOnce {
        LoadOnce { inner, floats: floats.to_vec(), kept: Default::default(), fresh_ns: Default::default() }
    }

    /// Seconds spent so far in the loads that were kept (what a later build of
    /// the same weights does not spend again).
    pub fn fresh_seconds(&self) -> f64 {
        self.fresh_ns.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }
}

impl TensorStore for LoadOnce {
    fn load(&self, name: &str, dtype: DType, len: usize) -> Result<HostBuf, RuntimeError> {
        if dtype.quant().is_none() && !self.floats.contains(&dtype) {
            return self.inner.load(name, dtype, len);
        }
        let key = format!("{name}|{}|{len}", dtype.name());
        if let Some(hit) = self.kept.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(HostBuf::Shared(hit));
        }
        let t0 = std::time::Instant::now();
        let arc = self.inner.load(name, dtype, len)?.into_arc();
        self.fresh_ns.fetch_add(t0.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.kept.lock() {
            m.insert(key, arc.clone());
        }
        Ok(HostBuf::Shared(arc))
    }
    fn load_range(&self, name: &str, dtype: DType, start: usize, len: usize) -> Result<HostBuf, RuntimeError> {
        self.inner.load_range(name, dtype, start, len)
    }
    fn row(&self, name: &str, row: usize, cols: usize) -> Result<Vec<f32>, RuntimeError> {
        self.inner.row(name, row, cols)
    }
    fn row_into(&self, name: &str, row: usize, out: &mut [f32]) -> Result<(), RuntimeError> {
        self.inner.row_into(name, row, out)
    }
    fn exact_as(&self, name: &str, dtype: DType) -> bool {
        self.inner.exact_as(name, dtype)
    }
}

/// A loaded CPU weight in the layout the plan asks for its format
/// ([`PlanOptions::cpu_repack`](crate::plan::PlanOptions::cpu_repack)).
fn repack_cpu(plan: &Plan, b: HostBuf) -> HostBuf {
    let m = match &b {
        HostBuf::Q(m) => m,
        HostBuf::Shared(s) => match &**s {
            HostBuf::Q(m) => m,
            _ => return b,
        },
        _ => return b,
    };
    m.repacked_in(&plan.options.cpu_repack).map_or(b, HostBuf::Q)
}

/// The kernels' shared temporaries sized for one token of `plan`'s model on
/// every pool thread, so no decode step allocates whichever worker runs what.
fn reserve_cpu_spares(plan: &Plan) {
    let c = &plan.config;
    let floats = c
        .dims
        .hidden_size
        .max(c.dims.intermediate_size)
        .max(c.dims.num_heads * c.dims.head_dim)
        .max((c.dims.num_heads + 2 * c.dims.num_kv_heads) * c.dims.head_dim);
    crate::kernels::cpu::reserve_spares(crate::kernels::cpu::pool::pool().threads(), floats);
}

impl Engine {
    /// Builds the buffers of `plan` on the CPU and loads the weights.
    pub fn cpu(plan: Plan, store: Arc<dyn TensorStore>) -> Result<Engine, RuntimeError> {
        reserve_cpu_spares(&plan);
        let exec = CpuExec::new(&plan, |i| Ok(load_buffer(&plan, store.as_ref(), i)?.map(|b| repack_cpu(&plan, b))))?;
        Engine::finish(plan, Exec::Cpu(Box::new(exec)), store)
    }

    /// [`Engine::cpu`] with the weights taken from (and added to) `memo`.
    pub fn cpu_shared(plan: Plan, store: Arc<dyn TensorStore>, memo: &WeightMemo) -> Result<Engine, RuntimeError> {
        reserve_cpu_spares(&plan);
        let exec = CpuExec::new(&plan, |i| {
            let b = &plan.buffers[i];
            let key = format!("{:?}|{}|{:?}|{}|{:?}", b.source, b.dtype.name(), b.formats, b.len, plan.options.cpu_repack);
            if b.role == BufRole::Weight
                && let Ok(m) = memo.bufs.lock()
                && let Some(hit) = m.get(&key)
            {
                return Ok(Some(HostBuf::Shared(hit.clone())));
            }
            Ok(match load_buffer(&plan, store.as_ref(), i)?.map(|b| repack_cpu(&plan, b)) {
                Some(hb) => {
                    let arc = hb.into_arc();
                    if let Ok(mut m) = memo.bufs.lock() {
                        m.insert(key, arc.clone());
                    }
                    Some(HostBuf::Shared(arc))
                }
                None => None,
            })
        })?;
        Engine::finish(plan, Exec::Cpu(Box::new(exec)), store)
    }

    /// Builds the buffers of `plan` on a GPU and uploads the weights.
    pub fn gpu(plan: Plan, store: Arc<dyn TensorStore>, ctx: Arc<GpuCtx>, batch: bool) -> Result<Engine, RuntimeError> {
        // The tied LM head serves the GPU embedding when it holds the table's values exactly.
        let exact = plan.lm_head.first().is_some_and(|b| store.exact_as("model.embed_tokens.weight", plan.buffers[b.weight].dtype));
        let mut exec = GpuExec::new(ctx, &plan, exact, |i| Ok(load_buffer(&plan, store.as_ref(), i)?.map(HostBuf::into_bytes)))?;
        exec.batch = batch;
        Engine::finish(plan, Exec::Gpu(Box::new(exec)), store)
    }

    fn finish(plan: Plan, exec: Exec, store: Arc<dyn TensorStore>) -> Result<Engine, RuntimeError> {
        // Decode batches (CPU) keep the int8 GEMMs' packed rows.
        let panels = (plan.options.batch_rows >= 2 && matches!(exec, Exec::Cpu(_))).then(Default::default);
        Ok(Engine {
            plan,
            exec,
            store,
            pos: 0,
            prefill_times: SlotTimes::default(),
            decode_times: SlotTimes::default(),
            profiled_step_gpu_seconds: None,
            dispatches_per_layer: 0,
            schedules: Vec::new(),
            x: Vec::new(),
            pass_times: SlotTimes::default(),
            logits: Vec::new(),
            cpu_threads: 0,
            cpu_spin_us: 0,
            cpu_prefetch: None,
            soft: None,
            image_attention: ImageAttention::default(),
            tally: DecodeTally::default(),
            kv_written: 0,
            batch_schedules: Vec::new(),
            batch_passes: 0,
            mixed_passes: (0, 0),
            row_widths: Vec::new(),
            panels,
            paged: None,
        })
    }

    /// CPU: run this engine's passes on `threads` of the kernels' pool (0: all;
    /// more than the pool has: all), its idle workers spinning `spin_us` µs
    /// before they park (0: the pool's default, 2 ms), its int8 decode dots
    /// prefetching `prefetch` bytes ahead (None: the default). Set per engine,
    /// applied at each pass, so engines of different profiles in one process keep
    /// their own.
    pub fn set_cpu_pool(&mut self, threads: usize, spin_us: u32, prefetch: Option<u32>) {
        self.cpu_threads = threads;
        self.cpu_spin_us = spin_us;
        self.cpu_prefetch = prefetch;
    }

    /// The compiled steps' warnings (explicit choices that fell back to the
    /// default), each once.
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = Vec::new();
        for m in self.schedules.iter().flat_map(|(_, s)| s).filter_map(|s| s.warning.as_ref()) {
            if !w.contains(m) {
                w.push(m.clone());
            }
        }
        if let Exec::Gpu(g) = &self.exec
            && !g.embeds_on_gpu()
        {
            w.push(
                "decode embeds each token on the host (one row written per token, so no decode steps are chained: the host \
                 waits for each token): the embedding table is not on the GPU (untied from the LM head, whose buffers the GPU \
                 embedding reads, or stored there in another type)"
                    .into(),
            );
        }
        w
    }

    /// Per decode token: host time by phase and, on a GPU, what the device's
    /// context did, averaged over the decode steps after the engine's first (which
    /// compiles the decode schedule), profiled steps left out; None before such a
    /// step.
    pub fn decode_counters(&self) -> Option<DecodeCounters> {
        let mut c = self.tally.per_token()?;
        if let (Some(g), Exec::Gpu(e)) = (c.gpu.as_mut(), &self.exec) {
            g.embedding_on_gpu = e.embeds_on_gpu();
        }
        Some(c)
    }

    /// Forgets the KV cache (the next call starts at position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// A new sequence's KV cache, empty, its memory taken only as positions are
    /// written ([`SeqKv::release`]): a table of the paged cache's blocks, or on
    /// the CPU without one buffers of its own (an unpaged GPU engine's caches
    /// are its device buffers, which its compiled passes bind: refused).
    pub fn new_sequence(&self) -> Result<SeqKv, RuntimeError> {
        if let Some(p) = &self.paged {
            return Ok(SeqKv { bufs: Vec::new(), pos: 0, written: 0, table: Vec::new(), pool: Some(p.pool.clone()) });
        }
        if self.is_gpu() {
            return Err(RuntimeError::Internal("sequences of their own on a GPU need the paged KV cache".into()));
        }
        let bufs = self
            .plan
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.role == BufRole::Cache)
            .map(|(i, b)| {
                let mut hb = HostBuf::zeros(b.dtype, b.len);
                hb.release_zeroed();
                (i, hb)
            })
            .collect();
        Ok(SeqKv { bufs, pos: 0, written: 0, table: Vec::new(), pool: None })
    }

    /// Swaps the engine's KV cache and position with `seq`'s (no copy): the
    /// engine then runs that sequence, and `seq` holds the one it ran. Swapping
    /// back restores both.
    pub fn swap_sequence(&mut self, seq: &mut SeqKv) -> Result<(), RuntimeError> {
        let (engine_hw, seq_hw) = (self.kv_written(), seq.written());
        match &mut self.exec {
            // A paged sequence is its table (below), on either device.
            _ if self.paged.is_some() && seq.bufs.is_empty() => {}
            Exec::Gpu(_) => return Err(RuntimeError::Internal("sequences of their own on a GPU need the paged KV cache".into())),
            Exec::Cpu(e) => swap_bufs(e, seq)?,
        }
        if let Some(p) = &mut self.paged {
            if seq.pool.is_none() {
                return Err(RuntimeError::Internal("a sequence made before the KV cache was paged".into()));
            }
            std::mem::swap(&mut p.table, &mut seq.table);
        }
        std::mem::swap(&mut self.pos, &mut seq.pos);
        // The high-water marks travel with their caches.
        self.kv_written = seq_hw;
        seq.written = engine_hw;
        Ok(())
    }

    /// Makes the KV cache paged: the plan's cache buffers become one pool
    /// of blocks of [`KV_PAGE`] positions, enough for `sequences` tables holding
    /// `positions` positions together (each a partly filled last block) and one
    /// whole context at least (its memory taken as blocks are first written);
    /// every sequence is a table of blocks ([`Engine::new_sequence`]), a prefix
    /// shared between sequences the same blocks, not a copy
    /// ([`Engine::copy_prefix`]), and attention reads each sequence's blocks
    /// through the paged kernel (the op's preferred CPU kernel), every sequence
    /// of a decode batch in one call.
    /// Forgets what the cache held; sequences made before no longer fit. Refused
    /// for a plan that writes the cache in its fused QKV kernel
    /// (`fusedQkvRopeCache`). The pools hold the plan's cache type (f32, f16
    /// or q8_0 blocks). On a GPU every pass then reads its rows' positions and
    /// tables from buffers the host writes ([`gpu::GpuPaged`]), a lone
    /// sequence's too, and decode steps are not chained.
    ///
    /// The paged kernel takes the plan's attention choices where it computes
    /// as they do (`attention_paged_cpu`: a chunk as `attention_prefill_tiled_cpu`
    /// with its `block_q`/`block_kv`, a decode token as
    /// `attention_decode_heads_cpu` with four keys a call; the ISA level of
    /// both), so a paged sequence answers as the plan alone; the returned
    /// notes name every choice it cannot take (a profile's other kernels).
    pub fn enable_paged(&mut self, positions: usize, sequences: usize) -> Result<Vec<String>, RuntimeError> {
        use crate::kernels::{Backend, Caps, Problem};
        if self.plan.options.fusion.qkv_rope_cache {
            return Err(RuntimeError::Internal("a paged KV cache needs the unfused KV write (execution.fusedQkvRopeCache: false)".into()));
        }
        let (page, ctx) = (KV_PAGE, self.plan.options.context.max(1));
        let max_blocks = ctx.div_ceil(page);
        let blocks = (positions.div_ceil(page) + sequences).max(max_blocks);
        let caches: Vec<BufId> = self.plan.buffers.iter().enumerate().filter(|(_, b)| b.role == BufRole::Cache).map(|(i, _)| i).collect();
        let d = &self.plan.config.dims;
        let dims = (d.num_heads.max(1), d.num_kv_heads.max(1), d.head_dim.max(1));
        let max_rows = self.plan.options.max_tokens.max(1);
        // The op's preferred kernel valid here (the list depends on the op alone).
        let probe = Problem::attention_paged((1, max_rows), dims, (page, blocks, max_blocks), 0, 1.0);
        let dtype = caches.first().map_or(crate::kernels::DType::F32, |&id| self.plan.buffers[id].dtype);
        let (backend, gpu_caps) = match &self.exec {
            Exec::Cpu(_) => (Backend::Cpu, None),
            Exec::Gpu(g) => (Backend::Wgsl, Some(g.ctx.caps.clone())),
        };
        let kernel = crate::kernels::preferred::preferred(&probe, backend)
            .iter()
            .filter_map(|id| crate::kernels::find(id).ok())
            .find(|k| gpu_caps.as_ref().is_none_or(|c| k.check(Caps::Gpu(c), &probe, dtype, &k.default_params()).is_ok()))
            .ok_or_else(|| RuntimeError::Internal(format!("no {backend:?} kernel serves paged attention over {dtype} blocks")))?;
        let (params, mut notes) = paged_params(&self.plan, kernel)?;
        match &mut self.exec {
            Exec::Cpu(e) => {
                for &id in &caches {
                    let b = &self.plan.buffers[id];
                    let mut hb = HostBuf::zeros(b.dtype, b.len / ctx * page * blocks);
                    hb.release_zeroed();
                    e.bufs[id] = hb;
                }
                let tables = kv_pool::PassTables::new(page, blocks, max_blocks);
                e.paged = Some(cpu::Paged { blocks, caches, kernel, params, tables });
            }
            Exec::Gpu(g) => {
                let per_position: Vec<usize> = caches.iter().map(|&id| self.plan.buffers[id].len / ctx).collect();
                g.enable_paged(caches, (dtype, &per_position), (page, blocks, max_blocks), max_rows, kernel, params)?;
                notes.push(format!(
                    "on a GPU the paged KV cache runs {} for every sequence's attention (the plan's attention kernels serve no paged pass) and decodes a token a pass (no chained decode steps)",
                    kernel.id
                ));
            }
        }
        self.paged = Some(EnginePaged { pool: kv_pool::KvPool::new(blocks), table: Vec::new() });
        self.pos = 0;
        self.kv_written = 0;
        Ok(notes)
    }

    /// The paged attention kernel and its parameters (None: not paged).
    pub fn paged_attention(&self) -> Option<(&'static str, &crate::kernels::Params)> {
        match &self.exec {
            Exec::Cpu(e) => e.paged.as_ref().map(|p| (p.kernel.id, &p.params)),
            Exec::Gpu(g) => g.paged.as_ref().map(|p| (p.kernel.id, &p.params)),
        }
    }

    /// A paged KV cache's blocks held by some sequence, and in all.
    pub fn kv_blocks(&self) -> Option<(usize, usize)> {
        self.paged.as_ref().map(|p| (p.pool.used(), p.pool.blocks()))
    }

    /// Replaces the selection's decode batch tables ([`Selection::batches`](crate::plan::Selection::batches)):
    /// later batches are planned with these (the tuner's end-to-end check of
    /// each batch size's table against what the size takes without it).
    pub fn set_batch_choices(&mut self, tables: std::collections::BTreeMap<usize, crate::plan::select::SlotChoices>) {
        self.plan.selection.batches = tables;
        self.batch_schedules.clear();
    }

    /// Decode batch passes ([`Engine::decode_batch`], [`Engine::batch_pass`]) this engine ran.
    pub fn batch_passes(&self) -> u64 {
        self.batch_passes
    }

    /// Batch passes that ran prompts' chunks beside decode tokens
    /// ([`Engine::batch_pass`]), and the chunks they ran.
    pub fn mixed_passes(&self) -> (u64, u64) {
        self.mixed_passes
    }

    /// One decode step of many sequences at once: `tokens[r]` fed to `seqs[r]`
    /// at its position, its cache written there; the logits, row `r` for
    /// sequence `r` (borrowed until the next call). Two or more sequences, on the
    /// CPU ([`Plan::batch_steps`] up to the plan's `batch_rows`): the matrices
    /// run once over all the rows (the prefill's kernels, or the selection's
    /// table for this batch size; each weight read once for the batch), RoPE, the KV write and attention a row at a time over its
    /// own sequence's cache. The engine's own cache and position are untouched.
    pub fn decode_batch(&mut self, seqs: &mut [&mut SeqKv], tokens: &[u32]) -> Result<&[f32], RuntimeError> {
        let feeds: smallvec::SmallVec<[&[u32]; 16]> = tokens.iter().map(std::slice::from_ref).collect();
        self.batch_pass(seqs, &feeds)
    }

    /// One pass over many sequences: `feeds[r]` fed to `seqs[r]` from its
    /// position, its cache written there; the logits of each sequence's last
    /// token, row `r` for sequence `r` (borrowed until the next call). A
    /// sequence feeds one token (a decode step) or, with a paged KV cache
    /// ([`Engine::enable_paged`]), a prompt's chunk, which then runs in the same
    /// pass as the others' decode tokens, each weight read once for all
    /// ([`Plan::pass_steps`]; the LM head over each sequence's last row only).
    /// A chunk's tokens take the prefill's kernels (or the selection's table
    /// for the pass's rows) and the paged kernel's chunk attention, the
    /// computation a prefill of that chunk does. [`Engine::decode_batch`] is
    /// this with one token each.
    pub fn batch_pass(&mut self, seqs: &mut [&mut SeqKv], feeds: &[&[u32]]) -> Result<&[f32], RuntimeError> {
        let b = feeds.len();
        if b != seqs.len() {
            return Err(RuntimeError::Internal(format!("{b} feeds for {} sequences", seqs.len())));
        }
        let counts: smallvec::SmallVec<[usize; 16]> = feeds.iter().map(|f| f.len()).collect();
        if counts.contains(&0) {
            return Err(RuntimeError::Internal("a batch pass feeds every sequence a token or more".into()));
        }
        let rows: usize = counts.iter().sum();
        if rows > b && self.paged.is_none() {
            return Err(RuntimeError::Internal("a prompt's chunk in a batch pass needs the paged KV cache".into()));
        }
        let ctx = self.plan.options.context;
        if let Some((s, n)) = seqs.iter().zip(&counts).find(|(s, n)| s.pos + *n > ctx) {
            return Err(RuntimeError::ContextFull { pos: s.pos + n, context: ctx });
        }
        if self.is_gpu() && self.paged.is_none() {
            return Err(RuntimeError::Internal("a decode batch on a GPU needs the paged KV cache".into()));
        }
        self.batch_passes += 1;
        let chunks = counts.iter().filter(|&&n| n > 1).count() as u64;
        self.mixed_passes.0 += (chunks > 0) as u64;
        self.mixed_passes.1 += chunks;
        let tokens: smallvec::SmallVec<[u32; 64]> = feeds.iter().flat_map(|f| f.iter().copied()).collect();
        self.embed(&tokens)?;
        let si = match self.batch_schedules.iter().position(|(n, _)| n[..] == counts[..]) {
            Some(i) => i,
            None => {
                // The passes with chunks stay compiled until too many are.
                if self.batch_schedules.len() >= 64 {
                    self.batch_schedules.retain(|(n, _)| n.iter().all(|&c| c == 1));
                    // A GPU's programs of the passes no schedule keeps go with them.
                    if let Exec::Gpu(g) = &mut self.exec {
                        let kept: Vec<usize> = self.batch_schedules.iter().map(|(n, _)| gpu::BATCH_KEY + n.iter().sum::<usize>()).collect();
                        g.forget(|key| key >= gpu::BATCH_KEY && !kept.contains(&key));
                    }
                }
                self.batch_schedules.push((counts.to_vec(), self.plan.pass_steps(&counts)?));
                self.batch_schedules.len() - 1
            }
        };
        if self.row_widths.is_empty() {
            let t = self.plan.options.max_tokens.max(1);
            self.row_widths =
                self.plan.buffers.iter().map(|d| if d.role == BufRole::Activation && d.len % t == 0 { d.len / t } else { 0 }).collect();
        }
        for v in self.pass_times.seconds.values_mut() {
            *v = 0.0;
        }
        let (x0, vocab) = (self.plan.x[0], self.plan.config.dims.vocab_size);
        // One LM-head block of every row on the CPU: the pass's logits are read
        // where the head wrote them (a copy of 8 rows of SmolLM2's 49152 was a
        // seventieth of its 8-sequence pass, the pool's workers idle meanwhile).
        let in_place = match (&self.exec, &self.plan.lm_head[..]) {
            (Exec::Cpu(_), [blk]) => blk.rows == vocab,
            _ => false,
        };
        if !in_place {
            self.logits.resize(b * vocab, 0.0);
        }
        if let Some(p) = &self.paged {
            let mut table: Vec<(&mut Vec<u32>, usize, usize)> =
                seqs.iter_mut().zip(&counts).map(|(s, &n)| (&mut s.table, s.pos, n)).collect();
            self.exec.page_in(&p.pool, &mut table)?;
        }
        match &mut self.exec {
            Exec::Cpu(e) => {
                cpu_pool(self.cpu_threads, self.cpu_spin_us, self.cpu_prefetch);
                e.write(x0, &self.x)?;
                // The int8 GEMMs keep their packed rows across batches (this engine's own
                // weights, for its life): at a few tokens unpacking costs more than the
                // arithmetic.
                let panels = self.panels.get_or_insert_with(Default::default).clone();
                crate::kernels::cpu::qgemm::with_panels(&panels, || {
                    e.run_rows(&self.batch_schedules[si].1, seqs, &counts, &self.row_widths, &mut self.pass_times)
                })?;
                for blk in self.plan.lm_head.iter().filter(|_| !in_place) {
                    scatter(&mut self.logits, e.view(blk.logits, b * blk.rows)?, blk.start, blk.rows, vocab);
                }
            }
            Exec::Gpu(e) => {
                // Every step over all rows: RoPE and the KV write read each row's
                // position and block, attention each sequence's table (page_in).
                e.write(x0, &self.x);
                let reads: Vec<(BufId, usize)> = self.plan.lm_head.iter().map(|blk| (blk.logits, b * blk.rows)).collect();
                let mut phases = Phases::default();
                let pass = gpu::Pass { tokens: rows, key: gpu::BATCH_KEY + rows, pos0: 0, token: None };
                let parts = e.run(pass, &self.batch_schedules[si].1, &mut self.pass_times, &reads, &mut phases)?;
                for (blk, part) in self.plan.lm_head.iter().zip(&parts) {
                    scatter(&mut self.logits, part, blk.start, blk.rows, vocab);
                }
            }
        }
        for (s, n) in seqs.iter_mut().zip(&counts) {
            s.pos += n;
            s.written = s.written.max(s.pos);
        }
        let cap = self.plan.config.final_logit_softcapping;
        if let (Exec::Cpu(e), true) = (&mut self.exec, in_place) {
            let logits = e.view_mut(self.plan.lm_head[0].logits, b * vocab)?;
            softcap(logits, cap);
            return Ok(logits);
        }
        softcap(&mut self.logits, cap);
        Ok(&self.logits)
    }

    /// `dst`'s cache given `src`'s first `n` positions (every layer's keys and
    /// values copied, nothing recomputed): a prefix one sequence computed
    /// shared with another. `dst` then holds `n` tokens.
    pub fn copy_prefix(&self, dst: &mut SeqKv, src: &SeqKv, n: usize) -> Result<(), RuntimeError> {
        let (heads, cap) = (self.plan.config.dims.num_kv_heads.max(1), self.plan.options.context);
        if n > src.written() || n > cap || dst.bufs.len() != src.bufs.len() {
            return Err(RuntimeError::Internal(format!("a prefix of {n} positions from a cache holding {}", src.written())));
        }
        if let Some(p) = &self.paged {
            // Paged: the prefix's blocks held by both tables, nothing copied; the
            // first write into a shared block copies it (`CpuExec::page_in`).
            let blocks = n.div_ceil(KV_PAGE);
            if src.table.len() < blocks || dst.pool.is_none() {
                return Err(RuntimeError::Internal(format!("a prefix of {n} positions from a table of {} blocks", src.table.len())));
            }
            dst.release();
            dst.table.extend_from_slice(&src.table[..blocks]);
            p.pool.retain(&dst.table);
            dst.pos = n;
            dst.written = n;
            return Ok(());
        }
        for ((a, d), (b, s)) in dst.bufs.iter_mut().zip(&src.bufs) {
            if a != b {
                return Err(RuntimeError::Internal("two sequences of different engines".into()));
            }
            let per = d.len() / heads; // one head's kv_cap positions
            let row = per / cap.max(1);
            match (d, s) {
                (HostBuf::F32(d), HostBuf::F32(s)) => {
                    for h in 0..heads {
                        d[h * per..h * per + n * row].copy_from_slice(&s[h * per..h * per + n * row]);
                    }
                }
                (HostBuf::F16(d), HostBuf::F16(s)) => {
                    for h in 0..heads {
                        d[h * per..h * per + n * row].copy_from_slice(&s[h * per..h * per + n * row]);
                    }
                }
                _ => return Err(RuntimeError::Internal("a KV cache is f32 or f16".into())),
            }
        }
        dst.pos = n;
        dst.written = dst.written.max(n);
        Ok(())
    }

    /// Per-slot times of the last pass (a prefill chunk, a decode step, a
    /// decode batch).
    pub fn last_pass_times(&self) -> &SlotTimes {
        &self.pass_times
    }

    /// The most positions the KV cache the engine holds was written up to since
    /// it was made or released (what it takes of memory, page by page).
    pub fn kv_written(&self) -> usize {
        self.kv_written.max(self.pos)
    }

    /// Asks the GPU backend to time every step of the next forward pass.
    pub fn profile_next(&mut self) {
        if let Exec::Gpu(g) = &mut self.exec {
            g.profile = true;
        }
    }

    /// How a GPU engine's profiled passes time their steps (None on the CPU,
    /// whose slot times are the host's clock around each step, and on an adapter
    /// without timestamp queries, which profiles nothing).
    pub fn step_timing(&self) -> Option<StepTiming> {
        match &self.exec {
            Exec::Gpu(g) if g.ctx.caps.timestamp_query => Some(g.timing()),
            _ => None,
        }
    }

    /// Asks a GPU engine to profile a pass per step even where the adapter
    /// writes timestamps inside passes (`false`: the best method again), e.g.
    /// to compare the two methods; nothing on the CPU.
    pub fn set_pass_per_step(&mut self, on: bool) {
        if let Exec::Gpu(g) = &mut self.exec {
            g.step_timing = if on { StepTiming::PassPerStep } else { StepTiming::best(&g.ctx.caps) };
        }
    }

    /// Builds the GPU programs (and compiles their pipelines) of a pass of `tokens`
    /// tokens at the current position, so that timing does not include it.
    pub fn warm_up(&mut self, tokens: usize) -> Result<(), RuntimeError> {
        if let Exec::Gpu(g) = &mut self.exec {
            let pos = self.pos.min(self.plan.options.context.saturating_sub(tokens));
            let steps = self.plan.steps(tokens, pos)?;
            g.prepare(tokens, &steps)?;
        }
        Ok(())
    }

    /// Whether a GPU engine looks a decode token's embedding up on the GPU
    /// (the table tied to the LM head's buffers); false on the CPU.
    pub fn embeds_on_gpu(&self) -> bool {
        matches!(&self.exec, Exec::Gpu(g) if g.embeds_on_gpu())
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.exec, Exec::Gpu(_))
    }

    /// The tokens' scaled embedding rows into `self.x` (reused).
    fn embed(&mut self, tokens: &[u32]) -> Result<(), RuntimeError> {
        let c = &self.plan.config;
        let h = c.dims.hidden_size;
        let scale = c.embedding_scale() as f32;
        self.x.resize(tokens.len() * h, 0.0);
        for (&t, out) in tokens.iter().zip(self.x.chunks_mut(h)) {
            // A placeholder takes the next soft token as it is (not scaled), as
            // transformers' masked_scatter of the image features does.
            if let Some(s) = &mut self.soft
                && t == s.id
            {
                let Some(row) = s.rows.get(s.next * h..(s.next + 1) * h) else {
                    return Err(RuntimeError::Internal(format!("more placeholder tokens {} than soft tokens", s.id)));
                };
                out.copy_from_slice(row);
                s.next += 1;
                continue;
            }
            if t as usize >= c.dims.vocab_size {
                return Err(RuntimeError::Token { id: t, vocab: c.dims.vocab_size });
            }
            self.store.row_into("model.embed_tokens.weight", t as usize, out)?;
            out.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }

    /// The compiled schedule of a pass of `t` tokens at `pos`: built on first use,
    /// then moved to `pos` in place (rebuilt only when a kernel can no longer run
    /// the moved problem).
    fn schedule(&mut self, t: usize, pos: usize) -> Result<usize, RuntimeError> {
        if let Some(i) = self.schedules.iter().position(|(n, _)| *n == t) {
            if self.plan.rebase(&mut self.schedules[i].1, t, pos)? {
                return Ok(i);
            }
            self.schedules[i].1 = self.plan.steps(t, pos)?;
            return Ok(i);
        }
        // Decode, and the few prefill sizes a caller uses, stay compiled.
        if self.schedules.len() >= 4 {
            self.schedules.remove(1.min(self.schedules.len() - 1));
        }
        self.schedules.push((t, self.plan.steps(t, pos)?));
        Ok(self.schedules.len() - 1)
    }

    /// One decode step: `token` at the current position; the logits, borrowed
    /// from the engine (valid until the next call). On the CPU it allocates
    /// nothing once the first step has compiled its schedule.
    pub fn decode_step(&mut self, token: u32) -> Result<&[f32], RuntimeError> {
        let ctx = self.plan.options.context;
        if self.pos + 1 > ctx {
            return Err(RuntimeError::ContextFull { pos: self.pos + 1, context: ctx });
        }
        self.forward_chunk(&[token], (0, 0))?;
        Ok(&self.logits)
    }

    /// One greedy decode step: `token` at the current position; the next token
    /// ([`argmax`] of the logits): [`Engine::decode_chain`] of one step (on the
    /// GPU the argmax runs there and only the id is read back, the engine's
    /// logits left as they were).
    pub fn decode_next(&mut self, token: u32) -> Result<u32, RuntimeError> {
        let mut greedy = Sampler::new(SamplerParams::GREEDY);
        let mut next = 0;
        self.decode_chain(token, 1, 1, &mut greedy, |id| {
            next = id;
            true
        })?;
        Ok(next)
    }

    /// Decodes up to `max` tokens from `first` (fed at the current position),
    /// each picked by `sampler` (whose state records them) and handed to `on_id`,
    /// which returns false to stop there; returns how many were handed over, and
    /// the engine's position moves past the steps that produced them (the last id
    /// is not fed: pass it as the next call's `first`). On the CPU one token a
    /// step from the host's logits. On a GPU the steps run in chains of `k`
    /// ([`GpuExec::submit_chain`]: the token picked there, 4 bytes read back a
    /// token and 4 a chain, its GPU time), the next chain submitted before the host reads the last one's ids,
    /// so the host waits once a chain; ids past a stop are discarded, their steps
    /// having written KV rows only past the kept length, which the next steps
    /// overwrite before attention reads them. A chain never runs past the KV
    /// capacity: with less room than `max`, the ids that fit are handed over, then
    /// [`RuntimeError::ContextFull`]. The first decode step of an engine (it
    /// compiles the schedule) and a profiled step ([`Engine::profile_next`]) run
    /// alone, untallied; without the GPU embedding every step runs alone (the host
    /// writes its row). The same ids for every `k`.
    pub fn decode_chain(
        &mut self,
        first: u32,
        max: usize,
        k: usize,
        sampler: &mut Sampler,
        mut on_id: impl FnMut(u32) -> bool,
    ) -> Result<usize, RuntimeError> {
        let ctx = self.plan.options.context;
        if max == 0 {
            return Ok(0);
        }
        if self.pos + 1 > ctx {
            return Err(RuntimeError::ContextFull { pos: self.pos + 1, context: ctx });
        }
        let want = max.min(ctx - self.pos);
        let full = |n: usize, pos: usize| {
            if n == want && want < max { Err(RuntimeError::ContextFull { pos: pos + 1, context: ctx }) } else { Ok(n) }
        };
        // The CPU, and a GPU's paged cache (whose passes read the positions the
        // host writes): a step at a time, sampled on the host.
        if !self.is_gpu() || self.paged.is_some() {
            let mut token = first;
            for n in 1..=want {
                let id = sampler.sample(self.decode_step(token)?);
                if !on_id(id) {
                    return Ok(n);
                }
                token = id;
            }
            return full(want, self.pos);
        }
        if first as usize >= self.plan.config.dims.vocab_size {
            return Err(RuntimeError::Token { id: first, vocab: self.plan.config.dims.vocab_size });
        }
        let rule = if sampler.is_argmax() { gpu::PickRule::Argmax } else { gpu::PickRule::Sample(*sampler.params()) };
        let picks: Vec<gpu::PickBlock> = self.plan.lm_head.iter().map(|b| (b.logits, b.rows, b.start)).collect();
        let cap = self.plan.config.final_logit_softcapping.unwrap_or(0.0).max(0.0) as f32;
        let chained = self.embeds_on_gpu();
        let mut done = 0usize;
        let mut token = first;
        let mut start = true;
        let mut stopped = false;
        // Alone and untallied: the engine's first decode step, a profiled one.
        let alone = |e: &Engine| !e.decode_compiled() || matches!(&e.exec, Exec::Gpu(g) if g.profiles_next());
        while done < want && !stopped && (alone(self) || !chained) {
            let mut phases = Phases::default();
            let counts0 = self.gpu_counts();
            let tally = !alone(self);
            let profiled = matches!(&self.exec, Exec::Gpu(g) if g.profiles_next());
            let p = self.submit_chain(token, done, 1, start.then_some(&sampler.state), rule, &picks, cap, &mut phases)?;
            start = false;
            let c = self.finish_chain(p, &mut phases)?;
            let (n, stop) = deliver(&c.ids, sampler, &mut on_id);
            done += n;
            stopped = stop;
            token = c.ids[0];
            if profiled {
                self.profiled_step_gpu_seconds = c.gpu_seconds;
            }
            if tally {
                let counts = self.gpu_counts().zip(counts0).map(|(a, b)| a.since(&b));
                self.tally.add(1, &phases, counts);
                if let Some(s) = c.gpu_seconds {
                    self.tally.add_gpu_time(1, 1, s);
                }
            }
        }
        if done < want && !stopped {
            // Chained: the next chain is submitted before this one's ids are read.
            let mut phases = Phases::default();
            let counts0 = self.gpu_counts();
            let first_done = done;
            let mut submitted = done;
            let mut pending = std::collections::VecDeque::with_capacity(gpu::RING);
            loop {
                while submitted < want && pending.len() < gpu::RING {
                    let n = k.clamp(1, crate::profile::doc::MAX_CHAIN).min(want - submitted);
                    let st = start.then_some(&sampler.state);
                    pending.push_back(self.submit_chain(token, submitted, n, st, rule, &picks, cap, &mut phases)?);
                    start = false;
                    submitted += n;
                }
                let Some(p) = pending.pop_front() else { break };
                let c = self.finish_chain(p, &mut phases)?;
                let (n, stop) = deliver(&c.ids, sampler, &mut on_id);
                if let Some(s) = c.gpu_seconds {
                    self.tally.add_gpu_time(n as u64, c.ids.len() as u64, s);
                }
                done += n;
                if stop || done >= want {
                    stopped = stop;
                    break;
                }
            }
            let counts = self.gpu_counts().zip(counts0).map(|(a, b)| a.since(&b));
            self.tally.add((done - first_done) as u64, &phases, counts);
        }
        self.pos += done;
        if stopped { Ok(done) } else { full(done, self.pos) }
    }

    /// Whether the decode schedule is compiled (a decode step has run): the next
    /// decode step is then tallied and chained.
    pub fn decode_compiled(&self) -> bool {
        self.schedules.iter().any(|(n, _)| *n == 1)
    }

    /// The GPU context's counts so far (None on the CPU).
    fn gpu_counts(&self) -> Option<crate::gpu::GpuCounts> {
        match &self.exec {
            Exec::Gpu(g) => Some(g.ctx.counters.snapshot()),
            Exec::Cpu(_) => None,
        }
    }

    /// Submits a chain of `k` decode steps starting `offset` steps past the
    /// engine's position (its schedule moved to the chain's last position), from
    /// `token` written by the host when `state` is given or the GPU does not
    /// embed (the host then writes its row; `k` is 1).
    #[allow(clippy::too_many_arguments)]
    fn submit_chain(
        &mut self,
        token: u32,
        offset: usize,
        k: usize,
        state: Option<&SamplerState>,
        rule: gpu::PickRule,
        picks: &[gpu::PickBlock],
        cap: f32,
        phases: &mut Phases,
    ) -> Result<gpu::Pending, RuntimeError> {
        let mut lap = Lap::start();
        let pos = self.pos + offset;
        let host_row = !self.embeds_on_gpu();
        if host_row {
            self.embed(&[token])?;
        }
        let si = self.schedule(1, pos + k - 1)?;
        let x0 = self.plan.x[0];
        let Exec::Gpu(e) = &mut self.exec else { return Err(RuntimeError::Internal("a decode chain on the CPU".into())) };
        if host_row {
            e.write(x0, &self.x);
        }
        let start = (state.is_some() || host_row).then_some(gpu::ChainStart { pos, token, sampler: state });
        phases.prepare += lap.lap();
        let steps = &self.schedules[si].1;
        let p = e.submit_chain(steps, start, k, rule, picks, cap, phases)?;
        self.dispatches_per_layer = e.dispatches(1, steps, 0);
        Ok(p)
    }

    /// The ids of a chain [`Engine::submit_chain`] submitted, and its GPU time; a
    /// profiled step's per-slot times are added to the decode times.
    fn finish_chain(&mut self, p: gpu::Pending, phases: &mut Phases) -> Result<gpu::ChainIds, RuntimeError> {
        let Some(si) = self.schedules.iter().position(|(n, _)| *n == 1) else {
            return Err(RuntimeError::Internal("a decode chain without its schedule".into()));
        };
        let Exec::Gpu(e) = &mut self.exec else { return Err(RuntimeError::Internal("a decode chain on the CPU".into())) };
        e.finish_chain(p, &self.schedules[si].1, &mut self.decode_times, phases)
    }

    /// Runs `tokens` through the model at the current position (a prefill when
    /// more than one, a decode step when one) and returns the logits: one row per
    /// token when the plan keeps every row, else the last row.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        let ctx = self.plan.options.context;
        if self.pos + tokens.len() > ctx {
            return Err(RuntimeError::ContextFull { pos: self.pos + tokens.len(), context: ctx });
        }
        let image = self.soft.as_ref().filter(|_| self.image_attention == ImageAttention::Bidirectional).map(|s| s.id);
        // The passes' blocks are indices into `tokens`: positions from where the call starts.
        let pos0 = self.pos;
        for (start, end, (bs, be)) in prefill_passes(tokens, self.plan.options.max_tokens, image)? {
            let block = if bs < be { (pos0 + bs, pos0 + be) } else { (0, 0) };
            self.forward_chunk(&tokens[start..end], block)?;
        }
        Ok(self.logits.chunks(self.plan.config.dims.vocab_size.max(1)).map(<[f32]>::to_vec).collect())
    }

    /// [`Engine::forward`] with the embedding of every `placeholder` token replaced,
    /// in order, by the next row of `rows` (`[count, hidden]`: an image's projected
    /// soft tokens), exactly as many rows as the tokens hold placeholders. Each run
    /// of placeholders is one image: with [`ImageAttention::Bidirectional`] (the
    /// engine's `image_attention`) its tokens attend to each other, so a run must
    /// be whole in one call (and fit one prefill pass); the passes are cut so that
    /// none splits a run.
    pub fn forward_with_soft_tokens(&mut self, tokens: &[u32], placeholder: u32, rows: Vec<f32>) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let h = self.plan.config.dims.hidden_size.max(1);
        let count = tokens.iter().filter(|&&t| t == placeholder).count();
        if rows.len() != count * h {
            return Err(RuntimeError::SoftTokens { placeholder, tokens: count, rows: rows.len() / h });
        }
        self.soft = Some(SoftTokens { id: placeholder, rows, next: 0 });
        let out = self.forward(tokens);
        self.soft = None;
        out
    }

    /// Runs one chunk; its logits land in `self.logits` (softcapped). `block`: the
    /// positions `[start, end)` within it attended bidirectionally (`(0, 0)`: none).
    fn forward_chunk(&mut self, tokens: &[u32], block: (usize, usize)) -> Result<(), RuntimeError> {
        let t = tokens.len();
        let decode = t == 1;
        // Tallied: a decode step whose schedule is compiled, not profiled.
        let tallied = decode && self.schedules.iter().any(|(n, _)| *n == 1) && !matches!(&self.exec, Exec::Gpu(g) if g.profiles_next());
        let counts0 = self.gpu_counts();
        let mut phases = Phases::default();
        let mut lap = Lap::start();
        // A decode token (no soft tokens in play) is embedded on the GPU when the
        // table is there: its id goes with the position, no row is written.
        let gpu_embed = match &self.exec {
            Exec::Gpu(g) => decode && self.soft.is_none() && g.embeds_on_gpu(),
            Exec::Cpu(_) => false,
        };
        if gpu_embed {
            if tokens[0] as usize >= self.plan.config.dims.vocab_size {
                return Err(RuntimeError::Token { id: tokens[0], vocab: self.plan.config.dims.vocab_size });
            }
        } else {
            self.embed(tokens)?;
        }
        let si = self.schedule(t, self.pos)?;
        // A schedule comes back causal; a pass of one token has no block to widen.
        if t > 1 && block.0 < block.1 && !self.plan.set_bidirectional(&mut self.schedules[si].1, block)? {
            return Err(RuntimeError::Internal(format!("a prefill attention kernel refuses the bidirectional block {block:?}")));
        }
        for v in self.pass_times.seconds.values_mut() {
            *v = 0.0;
        }
        let x0 = self.plan.x[0];
        let vocab = self.plan.config.dims.vocab_size;
        let rows = if t > 1 && self.plan.options.all_logits { t } else { 1 };
        self.logits.resize(rows * vocab, 0.0);
        let steps = &self.schedules[si].1;
        let blocks = &self.plan.lm_head;
        if let Some(p) = &mut self.paged {
            self.exec.page_in(&p.pool, &mut [(&mut p.table, self.pos, t)])?;
        }
        // Each LM-head block's logits are `[rows, block rows]`: one read per block.
        match &mut self.exec {
            Exec::Cpu(e) => {
                cpu_pool(self.cpu_threads, self.cpu_spin_us, self.cpu_prefetch);
                e.write(x0, &self.x)?;
                phases.prepare += lap.lap();
                // The kernels' parallel loops run on the persistent spinning pool
                // (kernels::cpu::pool), whose caller is this thread.
                // An engine of decode batches keeps its GEMMs' packed rows for its
                // prefills too (the same weights).
                match &self.panels {
                    Some(p) if t > 1 => crate::kernels::cpu::qgemm::with_panels(p, || e.run(steps, &mut self.pass_times))?,
                    _ => e.run(steps, &mut self.pass_times)?,
                }
                phases.compute += lap.lap();
                self.dispatches_per_layer = steps.iter().filter(|s| s.layer == Some(0)).count();
                for b in blocks {
                    let part = e.view(b.logits, rows * b.rows)?;
                    scatter(&mut self.logits, part, b.start, b.rows, vocab);
                }
            }
            Exec::Gpu(e) => {
                if !gpu_embed {
                    e.write(x0, &self.x);
                }
                let reads: Vec<(BufId, usize)> = blocks.iter().map(|b| (b.logits, rows * b.rows)).collect();
                phases.prepare += lap.lap();
                let pass = gpu::Pass { tokens: t, key: t, pos0: self.pos, token: gpu_embed.then_some(tokens[0]) };
                let parts = e.run(pass, steps, &mut self.pass_times, &reads, &mut phases)?;
                lap.lap();
                self.dispatches_per_layer = e.dispatches(t, steps, 0);
                for (b, part) in blocks.iter().zip(&parts) {
                    scatter(&mut self.logits, part, b.start, b.rows, vocab);
                }
            }
        }
        self.pos += t;
        if decode {
            for (k, v) in &self.pass_times.seconds {
                if let Some(d) = self.decode_times.seconds.get_mut(k) {
                    *d += v;
                } else {
                    self.decode_times.seconds.insert(*k, *v);
                }
            }
        } else {
            self.prefill_times = self.pass_times.clone();
        }
        softcap(&mut self.logits, self.plan.config.final_logit_softcapping);
        phases.post += lap.lap();
        if tallied {
            let counts = self.gpu_counts().zip(counts0).map(|(a, b)| a.since(&b));
            self.tally.add(1, &phases, counts);
        }
        Ok(())
    }
}

/// Swaps a CPU engine's cache buffers with `seq`'s (no copy).
fn swap_bufs(e: &mut CpuExec, seq: &mut SeqKv) -> Result<(), RuntimeError> {
    for (id, hb) in &mut seq.bufs {
        let Some(mine) = e.bufs.get_mut(*id) else {
            return Err(RuntimeError::Internal(format!("a sequence's cache buffer {id} is not this engine's")));
        };
        std::mem::swap(mine, hb);
    }
    Ok(())
}

/// The CPU pool as an engine runs its passes: `threads` (0: all), idle workers
/// spinning `spin_us` µs (0: the default), int8 dots prefetching `prefetch` bytes.
fn cpu_pool(threads: usize, spin_us: u32, prefetch: Option<u32>) {
    let pool = crate::kernels::cpu::pool::pool();
    pool.set_threads(if threads == 0 { pool.capacity() } else { threads });
    pool.set_spin(if spin_us == 0 { crate::kernels::cpu::pool::DEFAULT_SPIN } else { std::time::Duration::from_micros(spin_us as u64) });
    crate::kernels::cpu::set_prefetch_bytes(prefetch.unwrap_or(crate::kernels::cpu::DEFAULT_PREFETCH));
}

/// Gemma's final logit soft-capping, `c · tanh(v / c)` (None or 0: none).
fn softcap(logits: &mut [f32], cap: Option<f64>) {
    if let Some(c) = cap
        && c > 0.0
    {
        logits.iter_mut().for_each(|v| *v = ((*v as f64 / c).tanh() * c) as f32);
    }
}

/// One LM-head block's `[rows, block_rows]` logits into the `[rows, vocab]` rows.
fn scatter(logits: &mut [f32], part: &[f32], start: usize, block_rows: usize, vocab: usize) {
    if block_rows == vocab {
        logits[..part.len()].copy_from_slice(part);
        return;
    }
    for (r, src) in part.chunks(block_rows.max(1)).enumerate() {
        logits[r * vocab + start..r * vocab + start + block_rows].copy_from_slice(src);
    }
}

/// Greedy decoding: the sampler's one definition (the first maximum).
pub use crate::kernels::sample::argmax;

impl TensorStore for crate::model::Weights {
    fn load(&self, name: &str, dtype: DType, len: usize) -> Result<HostBuf, RuntimeError> {
        let meta = self.meta(name).map_err(|e| RuntimeError::Weights(e.to_string()))?;
        if meta.numel() != len {
            return Err(RuntimeError::Weights(format!("tensor `{name}` has {} elements, the plan expects {len}", meta.numel())));
        }
        let w = |e: crate::model::ModelError| RuntimeError::Weights(e.to_string());
        Ok(match (dtype, dtype.quant()) {
            (_, Some(format)) => HostBuf::Q(self.load_quant(name, format).map_err(w)?),
            (DType::F16, _) => {
                let mut v = crate::kernels::memory::huge_filled(len, f16::ZERO);
                self.read_into(name, &mut v).map_err(w)?;
                HostBuf::F16(v)
            }
            _ => {
                let mut v = crate::kernels::memory::huge_filled(len, 0.0f32);
                self.read_into(name, &mut v).map_err(w)?;
                HostBuf::F32(v)
            }
        })
    }

    fn load_range(&self, name: &str, dtype: DType, start: usize, len: usize) -> Result<HostBuf, RuntimeError> {
        let w = |e: crate::model::ModelError| RuntimeError::Weights(e.to_string());
        Ok(match (dtype, dtype.quant()) {
            (_, Some(format)) => {
                // A block of whole rows of a 2-D tensor.
                let meta = self.meta(name).map_err(w)?;
                let cols = meta.shape.last().copied().unwrap_or(0);
                if cols == 0 || !start.is_multiple_of(cols) || !len.is_multiple_of(cols) {
                    return Err(RuntimeError::Weights(format!(
                        "`{name}`: elements {start}..{} are not whole rows of {cols}, as a quantized slice must be",
                        start + len
                    )));
                }
                HostBuf::Q(self.load_quant_rows(name, format, start / cols, len / cols).map_err(w)?)
            }
            (DType::F16, _) => {
                let mut v = crate::kernels::memory::huge_filled(len, f16::ZERO);
                self.read_range(name, start, &mut v).map_err(w)?;
                HostBuf::F16(v)
            }
            _ => {
                let mut v = crate::kernels::memory::huge_filled(len, 0.0f32);
                self.read_range(name, start, &mut v).map_err(w)?;
                HostBuf::F32(v)
            }
        })
    }

    fn row_into(&self, name: &str, row: usize, out: &mut [f32]) -> Result<(), RuntimeError> {
        self.row_f32_into(name, row, out).map_err(|e| RuntimeError::Weights(e.to_string()))
    }

    fn exact_as(&self, name: &str, dtype: DType) -> bool {
        use crate::model::Stored;
        match self.stored(name) {
            Ok(Stored::F32) => dtype == DType::F32,
            Ok(Stored::F16) => matches!(dtype, DType::F16 | DType::F32),
            Ok(Stored::BF16) => dtype == DType::F32,
            Ok(Stored::Quant(q)) => dtype == DType::F32 || dtype.quant() == Some(q),
            Err(_) => false,
        }
    }

    fn row(&self, name: &str, row: usize, cols: usize) -> Result<Vec<f32>, RuntimeError> {
        let r = self.row_f32(name, row).map_err(|e| RuntimeError::Weights(e.to_string()))?;
        if r.len() != cols {
            return Err(RuntimeError::Weights(format!("row {row} of `{name}` has {} values, expected {cols}", r.len())));
        }
        Ok(r)
    }
}

/// The parameters of `kernel` (the paged attention kernel) that compute as the
/// plan's own attention choices ([`Engine::enable_paged`]), and a note for each
/// choice it cannot take.
fn paged_params(plan: &Plan, kernel: &'static crate::kernels::KernelDef) -> Result<(crate::kernels::Params, Vec<String>), RuntimeError> {
    use crate::plan::{Step, StepKind};
    let mut params = kernel.default_params();
    let mut notes = Vec::new();
    if kernel.id != "attention_paged_cpu" {
        return Ok((params, notes));
    }
    let plan_err = |e: crate::plan::PlanError| RuntimeError::Internal(format!("the plan's attention steps: {e}"));
    // The first layer's choice of each regime (a pass of two tokens, one of one).
    let prefill = if plan.options.max_tokens >= 2 && plan.options.context >= 2 { plan.steps(2, 0).map_err(plan_err)? } else { Vec::new() };
    let decode = plan.steps(1, 0).map_err(plan_err)?;
    let chosen = |steps: &[Step], slot: Slot| {
        steps.iter().find(|s| s.slot == slot).and_then(|s| match &s.kind {
            StepKind::Kernel { kernel, params, .. } => Some((kernel.id, params.clone())),
            StepKind::Plumb(_) => None,
        })
    };
    let mut isa: Option<u32> = None;
    // The plan's choice for `slot` taken when it is `mirrored` with `required`
    // values: its `keys` copied, its ISA level shared by both regimes.
    let mut take = |slot: Slot, mirrored: &str, keys: &[&str], required: &[(&str, u32)], steps: &[Step]| {
        let Some((id, p)) = chosen(steps, slot) else { return };
        if id != mirrored || required.iter().any(|&(k, v)| p.get(k).is_some_and(|&x| x != v)) {
            notes.push(format!(
                "the paged KV cache of `serve --parallel` runs {}, which computes as {mirrored}; the plan's {} choice {id} is not used for its sequences",
                kernel.id,
                slot.name()
            ));
            return;
        }
        for k in keys {
            if let Some(&v) = p.get(*k) {
                params.insert((*k).to_string(), v);
            }
        }
        match (isa, p.get("isa")) {
            (Some(a), Some(&b)) if a != b => notes.push(format!(
                "the paged KV cache runs both regimes at one ISA level (isa={a}); the plan's {} choice asks isa={b}",
                slot.name()
            )),
            (None, Some(&b)) => {
                isa = Some(b);
                params.insert("isa".into(), b);
            }
            _ => {}
        }
    };
    take(Slot::AttentionPrefill, "attention_prefill_tiled_cpu", &["block_q", "block_kv"], &[], &prefill);
    take(Slot::AttentionDecode, "attention_decode_heads_cpu", &[], &[("keys_per_call", 4)], &decode);
    Ok((params, notes))
}
