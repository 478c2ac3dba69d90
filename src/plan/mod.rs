//! The execution plan: named buffers with roles and sizes (the layout,
//! computed once for the largest batch of tokens), and the steps of a forward pass
//! that bind kernel buffers to them, for prefill (many tokens) and decode (one).
//!
//! One builder serves the runtime and the tuner: what the tuner measures is what
//! `run` executes. The plan records which kernel variant serves each slot in each
//! layer; fusion choices ([`Fusion`]) change which steps exist (`norm_matmul` only
//! in decode: the RMSNorms that feed projections become their prologue). A fusion
//! whose parts a file stores in different block formats (a published Q4_K_M's
//! Q6_K values beside Q4_K queries) is, on a GPU, also a stacked weight of
//! per-operand formats, which the decode chain's norm-fused projection reads in
//! one dispatch; the other passes read its parts.

pub mod select;
pub mod vision;

use std::collections::BTreeMap;

use serde::Serialize;

pub use select::{Choice, Selection, Slot};

use crate::kernels::{Activation, DType, KernelDef, NormResidual, Op, Problem, RopeLayout, RowFormats};
use crate::model::{LayerKind, ModelConfig, RopeScaling};

/// Errors building a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("slot `{slot}` ({regime}): no {backend} kernel is valid for {problem}: {why}")]
    NoKernel { slot: String, regime: &'static str, backend: &'static str, problem: String, why: String },
    #[error("slot `{slot}` layer {layer}: kernel `{kernel}` cannot run {problem}: {why}")]
    Invalid { slot: String, layer: String, kernel: String, problem: String, why: String },
    #[error("kernel `{kernel}` computes {got}, but slot `{slot}` needs {want}")]
    WrongOp { slot: String, kernel: String, got: Op, want: Op },
    #[error("{0} tokens do not fit: the plan was laid out for at most {1} (prefill) and a context of {2}")]
    TooManyTokens(usize, usize, usize),
    #[error("buffer `{name}` is bound as {bound_len} elements but laid out with {len}")]
    Shape { name: String, bound_len: usize, len: usize },
    #[error("{0}")]
    Unsupported(String),
}

/// Prefill (a prompt, many tokens) or decode (one token, long context): the two
/// regimes of the text model, with different winners; and the vision tower's
/// own (one image through the tower and projector: the `vision.*` slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    Prefill,
    Decode,
    Vision,
}

impl Regime {
    pub fn name(self) -> &'static str {
        match self {
            Regime::Prefill => "prefill",
            Regime::Decode => "decode",
            Regime::Vision => "vision",
        }
    }
}

/// Whole-plan switches that change which ops exist (the fused ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Fusion {
    /// Q, K and V from one concatenated weight (one GEMV in decode; one GEMM and a
    /// split in prefill).
    pub qkv: bool,
    /// Gate and up from one concatenated weight with the activation in the epilogue.
    pub gate_up: bool,
    /// Per-head RMSNorm + RoPE in one kernel (models with q/k norm: Gemma 3).
    pub qk_norm_rope: bool,
    /// Residual add + the following RMSNorm in one kernel: a residual + RMSNorm
    /// kernel, or in decode with `norm_matmul`, whose norms are the prologues of
    /// the projections they feed, that projection itself ([`Problem::NormGemv`]
    /// with a residual: the fused QKV, the fused gate/up, the LM head; Gemma 3's
    /// post-attention and post-FFN norms of the added branch folded in too), so
    /// the residual stream goes through no add of its own.
    pub residual_norm: bool,
    /// Decode only: an RMSNorm whose output feeds projections runs as their prologue
    /// ([`Problem::NormGemv`]): the layer's input norm with Q/K/V (one GEMV over the
    /// concatenated weight with `qkv`), the MLP's input norm with gate and up (with
    /// `gate_up` one GEMV over the concatenated weight, the activation in its
    /// epilogue), and the final norm with the LM head. Without `residual_norm` the
    /// residual add before such a norm runs alone.
    pub norm_matmul: bool,
    /// Decode with `qkv` and `norm_matmul`: the fused QKV projection's row split,
    /// rotated (q/k-normed first on models with q/k norm) and written into the KV
    /// cache by one kernel ([`Problem::QkvRopeCache`]) instead of a split, two RoPE
    /// (or q/k norm + RoPE) kernels and two cache writes. Models with a QKV bias,
    /// and engines without a kernel for the cache's type (the CPU's f16 cache),
    /// run the unfused steps.
    pub qkv_rope_cache: bool,
}

impl Fusion {
    pub const NONE: Fusion =
        Fusion { qkv: false, gate_up: false, qk_norm_rope: false, residual_norm: false, norm_matmul: false, qkv_rope_cache: false };
    pub const ALL: Fusion =
        Fusion { qkv: true, gate_up: true, qk_norm_rope: true, residual_norm: true, norm_matmul: true, qkv_rope_cache: true };

    /// The fusion choices, one switch each: `--fusion`, the tuner's combinations
    /// and labels, and `diff-profiles` iterate them; each one's slot is in
    /// [`select::SLOTS`] (its `fusion`).
    pub const FLAGS: [FusionFlag; 6] = [
        FusionFlag { name: "qkv", profile_key: "fusedQkv", on: |f| f.qkv, set: |f, v| f.qkv = v },
        FusionFlag { name: "gate_up", profile_key: "fusedGateUp", on: |f| f.gate_up, set: |f, v| f.gate_up = v },
        FusionFlag { name: "qk_norm_rope", profile_key: "fusedQkNormRope", on: |f| f.qk_norm_rope, set: |f, v| f.qk_norm_rope = v },
        FusionFlag { name: "residual_norm", profile_key: "fusedResidualNorm", on: |f| f.residual_norm, set: |f, v| f.residual_norm = v },
        FusionFlag { name: "norm_matmul", profile_key: "fusedNormMatmul", on: |f| f.norm_matmul, set: |f, v| f.norm_matmul = v },
        FusionFlag { name: "qkv_rope_cache", profile_key: "fusedQkvRopeCache", on: |f| f.qkv_rope_cache, set: |f, v| f.qkv_rope_cache = v },
    ];

    /// The fusion choice named `name` (as `--fusion` spells it).
    pub fn flag(name: &str) -> Option<&'static FusionFlag> {
        Fusion::FLAGS.iter().find(|f| f.name == name)
    }

    /// The choices this one turns on, in [`Fusion::FLAGS`] order.
    pub fn on(self) -> impl Iterator<Item = &'static FusionFlag> {
        Fusion::FLAGS.iter().filter(move |f| (f.on)(&self))
    }

    /// Every combination that changes the plan (the tuner's fusion space): the
    /// decode-chain fusions only where the fusions they build on are on.
    pub fn all_combinations() -> Vec<Fusion> {
        (0..1u32 << Fusion::FLAGS.len())
            .map(|b| {
                let mut f = Fusion::NONE;
                for (j, flag) in Fusion::FLAGS.iter().enumerate() {
                    (flag.set)(&mut f, b & (1 << j) != 0);
                }
                f
            })
            .filter(|f| !f.qkv_rope_cache || (f.qkv && f.norm_matmul))
            .collect()
    }
}

/// One fusion choice of [`Fusion::FLAGS`].
pub struct FusionFlag {
    /// As `--fusion` and the slot table spell it; the tuner's labels say `fused_<name>`.
    pub name: &'static str,
    /// Its key under the profile's `execution`.
    pub profile_key: &'static str,
    /// Whether a [`Fusion`] has it on.
    pub on: fn(&Fusion) -> bool,
    /// Turns it on or off.
    pub set: fn(&mut Fusion, bool),
}

/// Role of a laid-out buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BufRole {
    /// Model weights, uploaded once.
    Weight,
    /// Activations, sized for the largest batch of tokens.
    Activation,
    /// Per-layer KV cache, sized for the context.
    Cache,
    /// Constants computed from the config (RoPE frequencies).
    Constant,
}

/// Where a weight buffer's contents come from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum WeightSource {
    /// One tensor by its Hugging Face name.
    Tensor(String),
    /// Tensors concatenated along the rows (fused Q/K/V or gate/up).
    Concat(Vec<String>),
    /// The buffer's length of elements of one tensor (flattened) from element
    /// `start`: a block of rows (one part of an LM head split to fit a GPU binding).
    Slice { tensor: String, start: usize },
}

/// One named buffer of the layout.
#[derive(Clone, Debug, Serialize)]
pub struct BufferDecl {
    pub name: String,
    pub role: BufRole,
    pub dtype: DType,
    /// Elements.
    pub len: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<WeightSource>,
    /// A weight stacked from row blocks in different block formats (`dtype` is
    /// the first block's): the per-operand formats of a fused projection whose
    /// parts a file stores differently ([`Plan::stacked_weight`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub formats: Option<RowFormats>,
    /// RoPE frequencies for constants.
    #[serde(skip)]
    pub constant: Option<Vec<f32>>,
}

impl BufferDecl {
    pub fn bytes(&self) -> u64 {
        match self.formats {
            Some(f) => {
                let cols = self.len / f.rows().max(1);
                f.parts().iter().map(|&(rows, q)| DType::from(q).bytes_for(rows as usize * cols)).sum()
            }
            None => self.dtype.bytes_for(self.len),
        }
    }
}

/// Index of a buffer in [`Plan::buffers`].
pub type BufId = usize;

/// Runtime-owned data movement that is not a tuned kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum Plumb {
    /// Rows of `[tokens, nq + 2 nkv]` split into `q[tokens, nq]`, `k`, `v[tokens, nkv]`,
    /// adding the bias when there is one.
    SplitQkv { src: BufId, bias: Option<BufId>, q: BufId, k: BufId, v: BufId, tokens: usize, nq: usize, nkv: usize },
    /// `buf[r, j] += bias[j]` in place.
    BiasAdd { buf: BufId, bias: BufId, rows: usize, n: usize },
    /// `k[tokens, kv_heads, head_dim]` and `v` into the head-major caches at `pos0..`.
    KvWrite {
        k: BufId,
        v: BufId,
        k_cache: BufId,
        v_cache: BufId,
        tokens: usize,
        kv_heads: usize,
        head_dim: usize,
        kv_cap: usize,
        pos0: usize,
    },
    /// `len` f32 elements from `src[src_off..]` to `dst[dst_off..]`.
    Copy { src: BufId, src_off: usize, dst: BufId, dst_off: usize, len: usize },
}

/// What a step does.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Kernel {
        #[serde(serialize_with = "select::ser_kernel")]
        kernel: &'static KernelDef,
        params: crate::kernels::Params,
        dtype: DType,
        problem: Problem,
        /// Buffers in the problem's binding order.
        binds: Vec<BufId>,
        /// Bit i set: `binds[i]` is an output (computed once with the plan's
        /// shape check, so an executor needs no per-call buffer list).
        #[serde(skip)]
        outputs: u32,
    },
    Plumb(Plumb),
}

/// One step of a forward pass.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub slot: Slot,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<usize>,
    /// Steps with the same group number are independent of each other (the profile's
    /// parallel groups: q/k/v, gate/up) and may run concurrently.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    pub kind: StepKind,
    /// The explicit choice for this step could not run it and the default serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl Step {
    /// A kernel step's bound buffers that it reads, in binding order (none
    /// for a plumbing step).
    pub fn reads(&self) -> impl Iterator<Item = BufId> + '_ {
        self.binds_where(false)
    }

    /// A kernel step's bound buffers that it writes (its `outputs`), in
    /// binding order (none for a plumbing step).
    pub fn writes(&self) -> impl Iterator<Item = BufId> + '_ {
        self.binds_where(true)
    }

    fn binds_where(&self, written: bool) -> impl Iterator<Item = BufId> + '_ {
        let (binds, outputs): (&[BufId], u32) = match &self.kind {
            StepKind::Kernel { binds, outputs, .. } => (binds, *outputs),
            StepKind::Plumb(_) => (&[], 0),
        };
        binds.iter().enumerate().filter(move |(i, _)| (outputs & (1 << i) != 0) == written).map(|(_, &b)| b)
    }
}

/// Options that shape the layout.
#[derive(Clone, Debug, Serialize)]
pub struct PlanOptions {
    /// Storage type of the weights.
    pub weight_dtype: DType,
    /// Matrices (by Hugging Face tensor name) kept in another storage type than
    /// `weight_dtype`: a GGUF file's mixed formats (a `Q4_K_M` file holds Q4_K,
    /// Q6_K, Q5_0 and Q8_0 tensors), each run on kernels for its own format. A
    /// fused weight (Q/K/V, gate/up) is fused only where its parts share one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub matrix_formats: BTreeMap<String, DType>,
    /// Storage type of the KV cache.
    pub kv_dtype: DType,
    /// Most tokens one prefill call processes.
    pub max_tokens: usize,
    /// Context length the KV cache holds.
    pub context: usize,
    /// Compute the logits of every prompt position (for `--dump-logits`), not only the last.
    pub all_logits: bool,
    /// Rows of logits a decode batch reads ([`Plan::batch_steps`]: `serve
    /// --parallel`'s sequences in one pass); 0 or 1: none.
    #[serde(skip_serializing_if = "is_zero_rows")]
    pub batch_rows: usize,
    pub fusion: Fusion,
    /// Parallel groups (the profile's `parallel`): q/k/v and gate/up run concurrently.
    pub parallel: Parallel,
    /// CPU: the block formats whose matrices a CPU engine repacks at load for its
    /// decode dots (the profile's `execution.cpuRepack`: Q4_K, Q4_0, Q8_0, IQ4_NL, Q6_K, into
    /// [`Layout::X8`](crate::kernels::quant::Layout::X8), matrices of whole groups
    /// of 8 rows). GPU engines ignore it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cpu_repack: Vec<crate::kernels::quant::QFormat>,
}

/// Elements of one layer's key (or value) cache of `c` for `context` positions
/// (None when the count overflows).
fn kv_cache_len(c: &ModelConfig, context: usize) -> Option<usize> {
    c.kv_dim().checked_mul(context).filter(|&n| n <= isize::MAX as usize / 8)
}

/// Bytes of one layer's key (or value) cache of `c` for `context` positions in
/// `kv` (None when it overflows): what a context costs, checked before one is
/// laid out.
pub fn kv_cache_bytes(c: &ModelConfig, context: usize, kv: DType) -> Option<u64> {
    kv_cache_len(c, context).map(|n| kv.bytes_for(n))
}

/// The block formats a CPU engine repacks when no profile says, for a model of
/// config `c` whose matrices come in `dtypes`
/// ([`crate::kernels::quant::default_repack`]: Q4_0 of short-row models on
/// AVX-512 VNNI, every format with an X8 layout with AVX2 alone or, on VNNI,
/// with `batches`, an engine decoding several sequences a pass). What `run`/`bench` use without a profile
/// and the tuner's runtime-default combination (`serve --parallel`: with
/// `batches`).
pub fn default_cpu_repack(c: &ModelConfig, dtypes: impl IntoIterator<Item = DType>, batches: bool) -> Vec<crate::kernels::quant::QFormat> {
    let formats: Vec<_> = dtypes.into_iter().filter_map(|d| d.quant()).collect();
    let isa = crate::kernels::cpu::Isa::best();
    crate::kernels::quant::default_repack(isa.avx2(), isa.vnni(), c.dims.hidden_size.max(c.dims.intermediate_size), &formats, batches)
}

fn is_zero_rows(n: &usize) -> bool {
    *n == 0
}

impl PlanOptions {
    /// Passes of up to `max_tokens` tokens over a KV cache of `context`
    /// positions, every matrix in `weight_dtype`: the common form, with an f32
    /// KV cache, the last position's logits, every fusion ([`Fusion::ALL`]), no
    /// parallel groups and no CPU repacking (the `with_` methods change one).
    pub fn new(weight_dtype: DType, max_tokens: usize, context: usize) -> PlanOptions {
        PlanOptions {
            weight_dtype,
            matrix_formats: BTreeMap::new(),
            kv_dtype: DType::F32,
            max_tokens,
            context,
            all_logits: false,
            batch_rows: 0,
            fusion: Fusion::ALL,
            parallel: Parallel::default(),
            cpu_repack: Vec::new(),
        }
    }

    /// These options with fusions `fusion`.
    pub fn with_fusion(self, fusion: Fusion) -> PlanOptions {
        PlanOptions { fusion, ..self }
    }

    /// These options with parallel groups `parallel`.
    pub fn with_parallel(self, parallel: Parallel) -> PlanOptions {
        PlanOptions { parallel, ..self }
    }

    /// These options with a KV cache in `kv_dtype`.
    pub fn with_kv_dtype(self, kv_dtype: DType) -> PlanOptions {
        PlanOptions { kv_dtype, ..self }
    }

    /// These options with every position's logits (`all_logits`).
    pub fn with_all_logits(self, all_logits: bool) -> PlanOptions {
        PlanOptions { all_logits, ..self }
    }

    /// These options with decode batches of up to `batch_rows` sequences.
    pub fn with_batch_rows(self, batch_rows: usize) -> PlanOptions {
        PlanOptions { batch_rows, ..self }
    }

    /// These options with the matrices of `matrix_formats` in their own types.
    pub fn with_matrix_formats(self, matrix_formats: BTreeMap<String, DType>) -> PlanOptions {
        PlanOptions { matrix_formats, ..self }
    }

    /// These options with the CPU repacking `cpu_repack`.
    pub fn with_cpu_repack(self, cpu_repack: Vec<crate::kernels::quant::QFormat>) -> PlanOptions {
        PlanOptions { cpu_repack, ..self }
    }

    /// The storage type of matrix `tensor`: its own when the file keeps it in
    /// another format ([`PlanOptions::matrix_formats`]), else `weight_dtype`.
    pub fn matrix_dtype(&self, tensor: &str) -> DType {
        self.matrix_formats.get(tensor).copied().unwrap_or(self.weight_dtype)
    }
}

/// Which independent projections form a parallel group (run concurrently on the
/// CPU; on the GPU they share a pass with no barrier between them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Parallel {
    pub qkv: bool,
    pub ffn: bool,
}

impl Default for Parallel {
    fn default() -> Parallel {
        Parallel { qkv: true, ffn: true }
    }
}

/// A model's plan: layout plus the kernel selection used to emit steps.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub model: String,
    pub options: PlanOptions,
    pub buffers: Vec<BufferDecl>,
    #[serde(skip)]
    pub config: ModelConfig,
    #[serde(skip)]
    pub selection: Selection,
    #[serde(skip)]
    names: BTreeMap<String, BufId>,
    /// The residual stream's two ping-pong buffers; the embedding goes into `x[0]`.
    #[serde(skip)]
    pub x: [BufId; 2],
    /// The LM head, in blocks of vocabulary rows (one block unless the whole head
    /// or its logits would exceed the device's largest storage binding).
    #[serde(skip)]
    pub lm_head: Vec<LmBlock>,
}

/// One block of the LM head: vocabulary rows `start..start + rows`, their weights,
/// and where their logits land (`[logit rows, rows]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LmBlock {
    pub start: usize,
    pub rows: usize,
    pub weight: BufId,
    pub logits: BufId,
}

/// Per-layer weight names.
struct LayerW {
    input_ln: BufId,
    post_attn_ln: BufId,
    pre_ff_ln: Option<BufId>,
    post_ff_ln: Option<BufId>,
    q_norm: Option<BufId>,
    k_norm: Option<BufId>,
    wq: Option<BufId>,
    wk: Option<BufId>,
    wv: Option<BufId>,
    wqkv: Option<BufId>,
    bq: Option<BufId>,
    bk: Option<BufId>,
    bv: Option<BufId>,
    bqkv: Option<BufId>,
    wo: BufId,
    wg: Option<BufId>,
    wu: Option<BufId>,
    wgu: Option<BufId>,
    wd: BufId,
    /// A mixture of experts' router, every expert's gate and up rows, every
    /// expert's down rows.
    moe: Option<[BufId; 3]>,
    k_cache: BufId,
    v_cache: BufId,
}

impl Plan {
    /// Whether the weight of `problem` (a projection's GEMM or the gate/up
    /// pair's) in `dtype` is kept in X8 records by a CPU engine of this plan:
    /// its format repacked ([`PlanOptions::cpu_repack`]) and its rows whole
    /// groups of 8, as the load repacks it.
    pub fn x8_weight(&self, problem: &Problem, dtype: DType) -> bool {
        let rows = match *problem {
            Problem::Gemm { n, .. } => n,
            Problem::GateUp { n, .. } => 2 * n,
            _ => return false,
        };
        matches!(self.selection.device, crate::device::DeviceCaps::Cpu(_))
            && dtype.quant().is_some_and(|f| self.options.cpu_repack.contains(&f) && f.ops().cpu.x8.is_some())
            && rows > 0
            && rows.is_multiple_of(crate::kernels::quant::X8_ROWS)
    }

    /// Lays out buffers for `cfg` under `opts`; `selection` picks kernels when steps are emitted.
    pub fn new(model: &str, cfg: &ModelConfig, opts: PlanOptions, selection: Selection) -> Result<Plan, PlanError> {
        if opts.max_tokens == 0 || opts.context == 0 || opts.max_tokens > opts.context {
            return Err(PlanError::Unsupported(format!(
                "prefill tokens ({}) must be between 1 and the context ({})",
                opts.max_tokens, opts.context
            )));
        }
        if kv_cache_len(cfg, opts.context).is_none() {
            return Err(PlanError::Unsupported(format!(
                "a context of {} positions: its KV cache size overflows; give a context the model holds (at most {})",
                opts.context, cfg.max_position_embeddings
            )));
        }
        let mut plan = Plan {
            model: model.to_string(),
            options: opts,
            buffers: Vec::new(),
            config: cfg.clone(),
            selection,
            names: BTreeMap::new(),
            x: [0, 0],
            lm_head: Vec::new(),
        };
        plan.layout()?;
        Ok(plan)
    }

    fn add(&mut self, name: String, role: BufRole, dtype: DType, len: usize, source: Option<WeightSource>) -> BufId {
        let id = self.buffers.len();
        self.names.insert(name.clone(), id);
        self.buffers.push(BufferDecl { name, role, dtype, len, source, formats: None, constant: None });
        id
    }

    fn act(&mut self, name: &str, len: usize) -> BufId {
        self.add(name.to_string(), BufRole::Activation, DType::F32, len.max(1), None)
    }

    fn weight(&mut self, name: String, len: usize, src: &str) -> BufId {
        let d = self.options.matrix_dtype(src);
        self.add(name, BufRole::Weight, d, len, Some(WeightSource::Tensor(src.to_string())))
    }

    /// A fused weight of `parts` when they share one storage type and the whole
    /// fits one binding of the device, with room for a quantized buffer's
    /// alignment padding (None: keep them apart, each bound on its own).
    fn fused_weight(&mut self, name: String, len: usize, parts: Vec<String>) -> Option<BufId> {
        let d = self.options.matrix_dtype(&parts[0]);
        let fits = d.bytes_for(len).saturating_add(512) <= self.binding_limit();
        (fits && parts.iter().all(|p| self.options.matrix_dtype(p) == d))
            .then(|| self.add(name, BufRole::Weight, d, len, Some(WeightSource::Concat(parts))))
    }

    /// Where the `(tensor, rows)` parts of a fusion (rows of `cols` columns) are
    /// stored in different block formats: a weight stacked from them in their own
    /// formats, which the decode chain's norm-fused projection reads in one
    /// dispatch (per-operand formats); the plan lays out the parts as well, for the
    /// passes whose kernels read one format. Only on a GPU, where a dispatch
    /// costs what the CPU's function call does not, and only with the norm fused
    /// into the projections (the one consumer); None otherwise.
    fn stacked_weight(&mut self, name: String, parts: &[(String, usize)], cols: usize) -> Option<BufId> {
        let gpu = matches!(self.selection.device, select::DeviceCaps::Gpu(_));
        if !gpu || !self.options.fusion.norm_matmul {
            return None;
        }
        let formats: Option<Vec<_>> = parts.iter().map(|(p, rows)| Some((*rows, self.options.matrix_dtype(p).quant()?))).collect();
        let formats = RowFormats::new(&formats?)?;
        // Only where a kernel of the device reads it (a gate/up with its activation).
        let c = &self.config;
        let act = (parts.len() == 2).then_some(if c.is_gelu() { Activation::GeluTanh } else { Activation::Silu });
        let n = if act.is_some() { formats.rows() / 2 } else { formats.rows() };
        let (eps, unit_offset) = (c.norm_eps() as f32, c.norm_unit_offset);
        let p = Problem::NormGemv { n, k: cols, eps, unit_offset, residual: NormResidual::None, act, formats: Some(formats) };
        let first = DType::from(formats.parts()[0].1);
        self.selection.choose(Slot::NormMatmul, Regime::Decode, None, &p, first).ok()?;
        let decl = BufferDecl {
            name,
            role: BufRole::Weight,
            dtype: first,
            len: formats.rows() * cols,
            source: Some(WeightSource::Concat(parts.iter().map(|(p, _)| p.clone()).collect())),
            formats: Some(formats),
            constant: None,
        };
        // It must fit one binding, with room for the layout's alignment padding.
        if decl.bytes().saturating_add(1024) > self.binding_limit() {
            return None;
        }
        let id = self.buffers.len();
        self.names.insert(decl.name.clone(), id);
        self.buffers.push(decl);
        Some(id)
    }

    /// Whether buffer `b` is a stacked weight of per-operand formats.
    fn stacked(&self, b: BufId) -> bool {
        self.buffers.get(b).is_some_and(|d| d.formats.is_some())
    }

    /// Norm gains: in the weight dtype, or f32 when the matrices are quantized.
    fn norm_weight(&mut self, name: String, len: usize, src: &str) -> BufId {
        let d = self.options.weight_dtype.float_storage();
        self.add(name, BufRole::Weight, d, len, Some(WeightSource::Tensor(src.to_string())))
    }

    /// Biases and other small f32 weights.
    fn weight_f32(&mut self, name: String, len: usize, src: WeightSource) -> BufId {
        self.add(name, BufRole::Weight, DType::F32, len, Some(src))
    }

    /// A buffer by name.
    pub fn buffer(&self, name: &str) -> Option<BufId> {
        self.names.get(name).copied()
    }

    fn layout(&mut self) -> Result<(), PlanError> {
        let c = self.config.clone();
        let t = self.options.max_tokens;
        let (h, nq, nkv, inter) = (c.dims.hidden_size, c.q_dim(), c.kv_dim(), c.dims.intermediate_size);
        self.x = [self.act("x0", t * h), self.act("x1", t * h)];
        for (name, len) in [
            ("xn", t * h),
            ("q", t * nq),
            ("k", t * nkv),
            ("v", t * nkv),
            ("qn", t * nq),
            ("kn", t * nkv),
            ("qr", t * nq),
            ("kr", t * nkv),
            ("attn", t * nq),
            ("o", t * h),
            ("on", t * h),
            ("gate", t * inter),
            ("up", t * inter),
            ("act", t * inter),
            ("d", t * h),
            ("dn", t * h),
            ("last", h * self.options.batch_rows.clamp(1, t)),
        ] {
            self.act(name, len);
        }
        if let Some(m) = &c.moe {
            // The router's logits and route, and each token's experts' activations.
            self.act("router_logits", t * m.experts);
            self.act("route", t * m.experts);
            self.act("expert_act", t * m.top_k * m.expert_ff);
        }
        if self.options.fusion.qkv {
            self.act("qkv", t * (nq + 2 * nkv));
        }
        // RoPE frequencies, one table per base, and zeros for the layers without
        // RoPE (SmolLM3): a rotation by angle 0 leaves q and k as they are, so every
        // RoPE kernel (fused or not) serves them.
        let context = self.options.context;
        let mut tables: Vec<(&str, Vec<f32>)> = [LayerKind::Global, LayerKind::Local].map(|k| (k.name(), inv_freq(&c, k, context))).into();
        if !c.nope_layers.is_empty() {
            tables.push((NO_ROPE, vec![0.0; c.rot_dim() / 2]));
        }
        for (name, f) in tables {
            let id = self.add(format!("inv_freq_{name}"), BufRole::Constant, DType::F32, f.len(), None);
            self.buffers[id].constant = Some(f);
        }
        for l in 0..c.dims.num_layers {
            self.layer_weights(l, &c)?;
        }
        self.norm_weight("final_norm".into(), h, "model.norm.weight");
        let head = if c.tie_word_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
        let w = self.options.matrix_dtype(head);
        let logit_rows = if self.options.all_logits { t } else { self.options.batch_rows.clamp(1, t) };
        // A quantized block's buffer adds up to 272 bytes of alignment padding.
        let limit = if w.is_quant() { self.binding_limit().saturating_sub(512) } else { self.binding_limit() };
        let blocks = lm_head_blocks_bytes(c.dims.vocab_size, w.bytes_for(h), logit_rows, limit);
        for (i, &(start, rows)) in blocks.iter().enumerate() {
            let (weight, logits) = if blocks.len() == 1 {
                let src = WeightSource::Tensor(head.into());
                (self.add("lm_head".into(), BufRole::Weight, w, rows * h, Some(src)), self.act("logits", logit_rows * rows))
            } else {
                let src = WeightSource::Slice { tensor: head.into(), start: start * h };
                let weight = self.add(format!("lm_head.{i}"), BufRole::Weight, w, rows * h, Some(src));
                (weight, self.act(&format!("logits.{i}"), logit_rows * rows))
            };
            self.lm_head.push(LmBlock { start, rows, weight, logits });
        }
        Ok(())
    }

    /// Bytes one bound buffer may hold on the plan's device (unlimited on the CPU).
    fn binding_limit(&self) -> u64 {
        match &self.selection.device {
            select::DeviceCaps::Gpu(g) => g.max_storage_binding.min(g.max_buffer_size),
            select::DeviceCaps::Cpu(_) => u64::MAX,
        }
    }

    fn layer_weights(&mut self, l: usize, c: &ModelConfig) -> Result<(), PlanError> {
        let (h, hd, nq, nkv, inter) = (c.dims.hidden_size, c.dims.head_dim, c.q_dim(), c.kv_dim(), c.dims.intermediate_size);
        let p = |s: &str| format!("model.layers.{l}.{s}");
        if c.pre_norms() {
            self.norm_weight(format!("L{l}.input_ln"), h, &p("input_layernorm.weight"));
        }
        self.norm_weight(format!("L{l}.post_attn_ln"), h, &p("post_attention_layernorm.weight"));
        if c.sandwich_norms() {
            self.norm_weight(format!("L{l}.pre_ff_ln"), h, &p("pre_feedforward_layernorm.weight"));
        }
        if c.branch_norms() {
            self.norm_weight(format!("L{l}.post_ff_ln"), h, &p("post_feedforward_layernorm.weight"));
        }
        if c.qk_norm {
            let (qn, kn) = if c.qk_norm_projection() { (nq, nkv) } else { (hd, hd) };
            self.norm_weight(format!("L{l}.q_norm"), qn, &p("self_attn.q_norm.weight"));
            self.norm_weight(format!("L{l}.k_norm"), kn, &p("self_attn.k_norm.weight"));
        }
        let names = ["q_proj", "k_proj", "v_proj"].map(|s| p(&format!("self_attn.{s}.weight")));
        let fused_qkv = self.options.fusion.qkv && self.fused_weight(format!("L{l}.wqkv"), (nq + 2 * nkv) * h, names.to_vec()).is_some();
        let stacked_qkv = self.options.fusion.qkv && !fused_qkv && {
            let parts = [(names[0].clone(), nq), (names[1].clone(), nkv), (names[2].clone(), nkv)];
            self.stacked_weight(format!("L{l}.wqkv"), &parts, h).is_some()
        };
        // The fused biases serve a fused weight and a stack alike (the split adds them).
        if (fused_qkv || stacked_qkv) && c.attention_bias {
            let b = ["q_proj", "k_proj", "v_proj"].map(|s| p(&format!("self_attn.{s}.bias"))).to_vec();
            self.weight_f32(format!("L{l}.bqkv"), nq + 2 * nkv, WeightSource::Concat(b));
        }
        if !fused_qkv {
            self.weight(format!("L{l}.wq"), nq * h, &names[0]);
            self.weight(format!("L{l}.wk"), nkv * h, &names[1]);
            self.weight(format!("L{l}.wv"), nkv * h, &names[2]);
            if c.attention_bias {
                self.weight_f32(format!("L{l}.bq"), nq, WeightSource::Tensor(p("self_attn.q_proj.bias")));
                self.weight_f32(format!("L{l}.bk"), nkv, WeightSource::Tensor(p("self_attn.k_proj.bias")));
                self.weight_f32(format!("L{l}.bv"), nkv, WeightSource::Tensor(p("self_attn.v_proj.bias")));
            }
        }
        self.weight(format!("L{l}.wo"), h * nq, &p("self_attn.o_proj.weight"));
        if let Some(m) = c.moe_layer(l) {
            self.expert_weights(l, m, h)?;
        } else {
            let gu = vec![p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")];
            if !(self.options.fusion.gate_up && self.fused_weight(format!("L{l}.wgu"), 2 * inter * h, gu.clone()).is_some()) {
                if self.options.fusion.gate_up {
                    self.stacked_weight(format!("L{l}.wgu"), &[(gu[0].clone(), inter), (gu[1].clone(), inter)], h);
                }
                self.weight(format!("L{l}.wg"), inter * h, &p("mlp.gate_proj.weight"));
                self.weight(format!("L{l}.wu"), inter * h, &p("mlp.up_proj.weight"));
            }
            self.weight(format!("L{l}.wd"), h * inter, &p("mlp.down_proj.weight"));
        }
        let kv = self.options.kv_dtype;
        // Checked in `Plan::new`.
        let cache = kv_cache_len(c, self.options.context).unwrap_or(0);
        self.add(format!("L{l}.k_cache"), BufRole::Cache, kv, cache, None);
        self.add(format!("L{l}.v_cache"), BufRole::Cache, kv, cache, None);
        Ok(())
    }

    /// Layer `l`'s mixture of experts: the router, and every expert's gate then up
    /// rows as one matrix and every expert's down rows as another (the kernels
    /// pick each token's experts' rows out of them).
    fn expert_weights(&mut self, l: usize, m: &crate::model::Moe, h: usize) -> Result<(), PlanError> {
        let p = |s: &str| format!("model.layers.{l}.mlp.{s}");
        let (e, ff) = (m.experts, m.expert_ff);
        // The router stays f32 whatever the matrices' format (as llama.cpp's
        // converter keeps it): the experts a token gets hang on its logits' order.
        self.weight_f32(format!("L{l}.wr"), e * h, WeightSource::Tensor(p("gate.weight")));
        let ex = |proj: &str| (0..e).map(|i| p(&format!("experts.{i}.{proj}.weight"))).collect::<Vec<_>>();
        let gate_up = [ex("gate_proj"), ex("up_proj")].concat();
        for (name, len, parts) in [("wgu_exps", 2 * e * ff * h, gate_up), ("wd_exps", e * h * ff, ex("down_proj"))] {
            self.fused_weight(format!("L{l}.{name}"), len, parts).ok_or_else(|| {
                PlanError::Unsupported(format!(
                    "layer {l}'s experts: their {} matrices are not all in one storage type, or together exceed one binding of the \
                     device ({} bytes); run on the CPU",
                    if name == "wd_exps" { "down" } else { "gate and up" },
                    self.binding_limit()
                ))
            })?;
        }
        Ok(())
    }

    fn lw(&self, l: usize) -> LayerW {
        let g = |s: &str| self.buffer(&format!("L{l}.{s}"));
        let must = |s: &str| g(s).unwrap_or(usize::MAX);
        LayerW {
            input_ln: must("input_ln"),
            post_attn_ln: must("post_attn_ln"),
            pre_ff_ln: g("pre_ff_ln"),
            post_ff_ln: g("post_ff_ln"),
            q_norm: g("q_norm"),
            k_norm: g("k_norm"),
            wq: g("wq"),
            wk: g("wk"),
            wv: g("wv"),
            wqkv: g("wqkv"),
            bq: g("bq"),
            bk: g("bk"),
            bv: g("bv"),
            bqkv: g("bqkv"),
            wo: must("wo"),
            wg: g("wg"),
            wu: g("wu"),
            wgu: g("wgu"),
            wd: must("wd"),
            moe: g("wr").map(|wr| [wr, must("wgu_exps"), must("wd_exps")]),
            k_cache: must("k_cache"),
            v_cache: must("v_cache"),
        }
    }

    /// The storage type of buffer `b` (f32 for an id the plan does not hold).
    pub fn dtype_of(&self, b: BufId) -> DType {
        self.buffers.get(b).map_or(DType::F32, |d| d.dtype)
    }

    /// Whether every projection a norm gain feeds stores its floats in the gains'
    /// type: [`Problem::NormGemv`] reads its gain in its weight's float type, so a
    /// file that mixes f16 and block-quantized projections (an f16 `ffn_up` in a
    /// Q8_0 file, a Q4_0 embedding as the head of an f16 one) runs its norms as
    /// separate steps rather than folded into those projections.
    fn gains_match_projections(&self) -> bool {
        let gain = self.options.weight_dtype.float_storage();
        let layers = (0..self.config.dims.num_layers).flat_map(|l| {
            let w = self.lw(l);
            [w.wq, w.wk, w.wv, w.wqkv, w.wg, w.wu, w.wgu].into_iter().flatten()
        });
        layers.chain(self.lm_head.iter().map(|b| b.weight)).all(|w| self.dtype_of(w).float_storage() == gain)
    }

    fn id(&self, name: &str) -> BufId {
        self.names.get(name).copied().unwrap_or(usize::MAX)
    }

    /// Total bytes of the weight buffers (what a decode step must read at least once).
    pub fn weight_bytes(&self) -> u64 {
        self.buffers.iter().filter(|b| b.role == BufRole::Weight).map(BufferDecl::bytes).sum()
    }

    /// Weight bytes a decode step reads: every weight buffer of the plan but, of a
    /// mixture of experts, the `top_k` experts' share of its expert matrices. The
    /// embedding table is not one (the runtime copies a token's row outside the
    /// plan) unless it is also the LM head, which reads all of it.
    pub fn decode_read_bytes(&self) -> u64 {
        // A stacked weight's parts are what prefill reads; decode reads the stack.
        let shadowed: u64 = (0..self.config.dims.num_layers)
            .flat_map(|l| {
                let w = self.lw(l);
                let qkv = w.wqkv.filter(|&b| self.stacked(b)).map(|_| [w.wq, w.wk, w.wv]);
                let gu = w.wgu.filter(|&b| self.stacked(b)).map(|_| [w.wg, w.wu, None]);
                qkv.into_iter().chain(gu).flatten().flatten()
            })
            .map(|b| self.buffers[b].bytes())
            .sum();
        let idle: u64 = (0..self.config.dims.num_layers)
            .filter_map(|l| Some((self.config.moe_layer(l)?, self.lw(l).moe?)))
            .map(|(m, [_, gu, d])| {
                let bytes = self.buffers[gu].bytes() + self.buffers[d].bytes();
                bytes / m.experts as u64 * (m.experts - m.top_k.min(m.experts)) as u64
            })
            .sum();
        self.weight_bytes() - idle - shadowed
    }

    /// Steps of one forward pass over `tokens` tokens at positions `pos0..pos0+tokens`.
    /// The embedding of those tokens must already be in `x[0]`; logits land in the
    /// [`Plan::lm_head`] blocks' buffers (every row when `all_logits` and prefill,
    /// else the last).
    /// Moves steps built by [`Plan::steps`] for `tokens` tokens to position
    /// `pos0` in place (RoPE positions, attention lengths, KV-cache writes): a
    /// compiled schedule replayed for the next token without rebuilding it.
    /// Returns false when a moved attention step's kernel can no longer run its
    /// problem (rebuild with [`Plan::steps`] then, which chooses again).
    pub fn rebase(&self, steps: &mut [Step], tokens: usize, pos0: usize) -> Result<bool, PlanError> {
        let o = &self.options;
        if tokens == 0 || tokens > o.max_tokens || pos0 + tokens > o.context {
            return Err(PlanError::TooManyTokens(pos0 + tokens, o.max_tokens, o.context));
        }
        let caps = self.selection.device.caps();
        for s in steps {
            match &mut s.kind {
                StepKind::Kernel { kernel, params, dtype, problem, .. } => match problem {
                    Problem::Rope { pos0: p, .. } | Problem::QkNormRope { pos0: p, .. } | Problem::QkvRopeCache { pos0: p, .. } => {
                        *p = pos0
                    }
                    Problem::AttentionDecode { kv_len, .. } => {
                        *kv_len = pos0 + tokens;
                        if kernel.check(caps, problem, *dtype, params).is_err() {
                            return Ok(false);
                        }
                    }
                    // The moved pass is causal until [`Plan::set_bidirectional`] says otherwise.
                    Problem::AttentionPrefill { kv_len, bidi_start, bidi_end, .. } => {
                        (*kv_len, *bidi_start, *bidi_end) = (pos0 + tokens, 0, 0);
                        if kernel.check(caps, problem, *dtype, params).is_err() {
                            return Ok(false);
                        }
                    }
                    _ => {}
                },
                StepKind::Plumb(Plumb::KvWrite { pos0: p, .. }) => *p = pos0,
                StepKind::Plumb(_) => {}
            }
        }
        Ok(true)
    }

    /// Makes the prefill attention of `steps` (a pass built by [`Plan::steps`] or moved
    /// by [`Plan::rebase`]) attend bidirectionally within the positions `block`
    /// (`[start, end)`, inside the pass; `start == end`: causal again): Gemma 3's
    /// image tokens, as its processor's `token_type_ids` ask. Every other step is
    /// unchanged. Returns false when a kernel cannot run the changed problem.
    pub fn set_bidirectional(&self, steps: &mut [Step], block: (usize, usize)) -> Result<bool, PlanError> {
        let caps = self.selection.device.caps();
        for s in steps {
            if let StepKind::Kernel { kernel, params, dtype, problem, .. } = &mut s.kind
                && let Problem::AttentionPrefill { bidi_start, bidi_end, .. } = problem
            {
                if (*bidi_start, *bidi_end) == block {
                    continue;
                }
                (*bidi_start, *bidi_end) = block;
                if kernel.check(caps, problem, *dtype, params).is_err() {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    pub fn steps(&self, tokens: usize, pos0: usize) -> Result<Vec<Step>, PlanError> {
        let o = &self.options;
        if tokens == 0 || tokens > o.max_tokens || pos0 + tokens > o.context {
            return Err(PlanError::TooManyTokens(pos0 + tokens, o.max_tokens, o.context));
        }
        let regime = if tokens == 1 { Regime::Decode } else { Regime::Prefill };
        let mut e = Emitter { plan: self, regime, steps: Vec::new(), group: 0, all_rows: false, heads: Vec::new(), batch: None };
        e.forward(tokens, pos0)?;
        Ok(e.steps)
    }

    /// Steps of one decode pass over `rows` sequences (2 up to `batch_rows`), a
    /// token each: the prefill's steps over `rows` tokens, every row's logits
    /// read. The steps that depend on a token's position or sequence (RoPE, the
    /// KV-cache write, attention) are built for position 0; the executor runs
    /// them a row at a time, each at its own sequence's position over its own
    /// cache ([`Plan::position_dependent`]).
    pub fn batch_steps(&self, rows: usize) -> Result<Vec<Step>, PlanError> {
        self.pass_steps(&vec![1; rows])
    }

    /// Steps of one pass over several sequences, `counts[s]` consecutive rows of
    /// sequence `s` (one for a decode token, more for a prompt's chunk; 2 up
    /// to `batch_rows` sequences, `max_tokens` rows in all), the logits read for
    /// each sequence's last row only: [`Plan::batch_steps`] when every count is
    /// one, else the rows gathered into `last` before the LM head. Built as
    /// [`Plan::batch_steps`] builds (the prefill's kernels, or the selection's
    /// table for the pass's rows), the executor moving the position-dependent
    /// steps to each sequence's rows.
    pub fn pass_steps(&self, counts: &[usize]) -> Result<Vec<Step>, PlanError> {
        let o = &self.options;
        let (seqs, rows) = (counts.len(), counts.iter().sum::<usize>());
        let most = o.batch_rows.min(o.max_tokens);
        if seqs < 2 || seqs > most || counts.contains(&0) {
            return Err(PlanError::TooManyTokens(seqs, most, o.context));
        }
        if rows > o.max_tokens || rows > o.context {
            return Err(PlanError::TooManyTokens(rows, o.max_tokens, o.context));
        }
        // The last rows' runs (first row, rows): none to gather when every row is one.
        let mut heads: Vec<(usize, usize)> = Vec::new();
        if rows > seqs {
            let mut end = 0;
            for &n in counts {
                end += n;
                match heads.last_mut() {
                    Some((r0, k)) if *r0 + *k == end - 1 => *k += 1,
                    _ => heads.push((end - 1, 1)),
                }
            }
        }
        let mut e = Emitter { plan: self, regime: Regime::Prefill, steps: Vec::new(), group: 0, all_rows: true, heads, batch: Some(rows) };
        e.forward(rows, 0)?;
        Ok(e.steps)
    }

    /// Whether `step` depends on where its tokens stand (their positions, their
    /// sequence's KV cache): what a decode batch runs a row at a time.
    pub fn position_dependent(step: &Step) -> bool {
        match &step.kind {
            StepKind::Kernel { problem, .. } => matches!(
                problem,
                Problem::Rope { .. }
                    | Problem::QkNormRope { .. }
                    | Problem::QkvRopeCache { .. }
                    | Problem::AttentionPrefill { .. }
                    | Problem::AttentionDecode { .. }
            ),
            StepKind::Plumb(p) => matches!(p, Plumb::KvWrite { .. }),
        }
    }
}

/// The LM head's blocks of vocabulary rows `(start, rows)`: as few as keep each
/// block's weights (`hidden` × `dtype_size` bytes a row) and its logits (`logit_rows`
/// f32 a row) within `limit` bytes, of equal size (a multiple of 64 rows where that
/// fits) but for the last.
pub fn lm_head_blocks(vocab: usize, hidden: usize, dtype_size: usize, logit_rows: usize, limit: u64) -> Vec<(usize, usize)> {
    lm_head_blocks_bytes(vocab, (hidden * dtype_size) as u64, logit_rows, limit)
}

/// [`lm_head_blocks`] with the bytes of one row of weights given (block-quantized
/// rows are not a whole number of bytes per element).
pub fn lm_head_blocks_bytes(vocab: usize, weight_row_bytes: u64, logit_rows: usize, limit: u64) -> Vec<(usize, usize)> {
    let row_bytes = weight_row_bytes.max(logit_rows as u64 * 4).max(1);
    let most = usize::try_from(limit / row_bytes).unwrap_or(usize::MAX).max(1);
    if vocab <= most {
        return vec![(0, vocab)];
    }
    let count = vocab.div_ceil(most);
    let even = vocab.div_ceil(count);
    let rows = if even.next_multiple_of(64) <= most { even.next_multiple_of(64) } else { even };
    (0..vocab).step_by(rows).map(|s| (s, rows.min(vocab - s))).collect()
}

/// The name of the frequency table of the layers without RoPE (all zeros).
const NO_ROPE: &str = "none";

/// RoPE inverse frequencies for one kind of layer: the local base without scaling
/// on sliding-window layers (Gemma 3), the global base with the configured scaling
/// (LongRoPE's factors chosen by the `context` the plan holds), one per rotated pair.
pub fn inv_freq(c: &ModelConfig, kind: LayerKind, context: usize) -> Vec<f32> {
    let rot = c.rot_dim();
    let (theta, scaling) = (c.rope_theta_for(kind), c.rope_scaling_for(kind).cloned());
    let base: Vec<f64> = (0..rot / 2).map(|i| 1.0 / theta.powf(2.0 * i as f64 / rot as f64)).collect();
    let scaled: Vec<f64> = match scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let old = original_max_position_embeddings as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        Some(RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, .. }) => {
            let ext = if context > original_max_position_embeddings { long_factor } else { short_factor };
            base.iter().zip(ext).map(|(f, e)| f / e).collect()
        }
    };
    scaled.into_iter().map(|f| f as f32).collect()
}

/// A residual add not yet done (the decode chain, [`Fusion::residual_norm`] with
/// `norm_matmul`): the branch to add to the residual stream, the gain of the
/// branch's own norm (Gemma 3's post-attention / post-FFN norm), and where the sum
/// goes.
#[derive(Clone, Copy)]
struct Pending {
    branch: BufId,
    gain: Option<BufId>,
    h: BufId,
}

impl Pending {
    /// The prologue that adds it.
    fn residual(self) -> NormResidual {
        if self.gain.is_some() { NormResidual::Normed } else { NormResidual::Add }
    }
}

/// What the blocks of one forward pass share: its shape, the fusions in force,
/// and the residual stream's state between blocks.
struct Pass {
    t: usize,
    pos0: usize,
    /// Norms folded into the projections they feed (decode, [`Fusion::norm_matmul`]).
    nm: bool,
    /// Residual adds left pending for the next norm-fused projection's prologue.
    fold: bool,
    act: Activation,
    /// Which of `plan.x` holds the residual stream.
    cur: usize,
    /// `xn` already holds the next layer's input norm.
    normed: bool,
    pending: Option<Pending>,
}

struct Emitter<'a> {
    plan: &'a Plan,
    regime: Regime,
    steps: Vec<Step>,
    group: u32,
    /// Every row's logits (a decode batch), whatever `all_logits` says.
    all_rows: bool,
    /// With `all_rows`: the runs of rows (first, count) whose logits are read,
    /// gathered in order before the LM head (a prompt's chunk reads its last
    /// row's only); empty: every row's.
    heads: Vec<(usize, usize)>,
    /// A decode batch's sequences: the selection's batch tables come first
    /// ([`Selection::batch_choice`]).
    batch: Option<usize>,
}

impl Emitter<'_> {
    fn kernel(&mut self, slot: Slot, layer: Option<usize>, problem: Problem, binds: Vec<BufId>, dtype: DType) -> Result<(), PlanError> {
        self.kernel_in(slot, layer, None, problem, binds, dtype)
    }

    fn kernel_in(
        &mut self,
        slot: Slot,
        layer: Option<usize>,
        group: Option<u32>,
        problem: Problem,
        binds: Vec<BufId>,
        dtype: DType,
    ) -> Result<(), PlanError> {
        // The batch tables first; then, in a pass of decode tokens only, the
        // batched dots (over X8 records; over any block format's rows where the
        // int8 GEMM has no SIMD tiles), each token's
        // lone decode's arithmetic (a prompt's chunk keeps the prefill's GEMM, as
        // its whole prompt computes it in one pass, where that GEMM has int8 SIMD
        // tiles: `Selection::x8_choice` says when). The LM head of a pass with a
        // chunk reads one row a sequence, gathered (`heads` taken by then): the
        // dots too, as a lone prefill's last row takes the decode's GEMV.
        let decode_only = self.batch.is_some() && self.heads.is_empty();
        let x8 = self.plan.x8_weight(&problem, dtype);
        let step = select::PassStep { batch: self.batch, key: (slot, self.regime), layer, problem: &problem, dtype, decode_only, x8 };
        let (choice, warning) = self.plan.selection.pass_choice(&step)?;
        // Every bound buffer must hold what the problem addresses (the plan's shape
        // check: what lets an executor skip the per-call check).
        let specs = problem.buffers(dtype);
        if specs.len() != binds.len() || specs.len() > 32 {
            return Err(PlanError::Unsupported(format!(
                "{} buffers bound for {} ({} expected)",
                binds.len(),
                problem.describe(),
                specs.len()
            )));
        }
        let outputs = specs.iter().enumerate().filter(|(_, s)| s.is_output()).fold(0u32, |m, (i, _)| m | (1 << i));
        for (spec, &b) in specs.iter().zip(&binds) {
            let decl = &self.plan.buffers[b];
            // A stacked weight only where the problem reads its per-operand formats.
            if decl.formats.is_some() && decl.formats != problem.formats() {
                return Err(PlanError::Unsupported(format!(
                    "`{}` stacks per-operand formats ({}) that {} does not read",
                    decl.name,
                    decl.formats.map(|f| f.describe()).unwrap_or_default(),
                    problem.describe()
                )));
            }
            if decl.len < spec.len() || decl.dtype != spec.dtype {
                return Err(PlanError::Shape {
                    name: format!("{} ({} as {})", decl.name, decl.dtype, spec.dtype),
                    bound_len: spec.len(),
                    len: decl.len,
                });
            }
        }
        self.steps.push(Step {
            slot,
            layer,
            group,
            kind: StepKind::Kernel { kernel: choice.kernel, params: choice.params, dtype, problem, binds, outputs },
            warning,
        });
        Ok(())
    }

    fn plumb(&mut self, slot: Slot, layer: Option<usize>, p: Plumb) {
        self.steps.push(Step { slot, layer, group: None, kind: StepKind::Plumb(p), warning: None });
    }

    fn next_group(&mut self) -> u32 {
        self.group += 1;
        self.group
    }

    /// A projection `y[t, n] = x[t, k] · w[n, k]ᵀ`: GEMV in decode, GEMM in prefill.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &mut self,
        slot: Slot,
        l: Option<usize>,
        group: Option<u32>,
        t: usize,
        n: usize,
        k: usize,
        bufs: [BufId; 3],
    ) -> Result<(), PlanError> {
        let p = if t == 1 { Problem::Gemv { n, k } } else { Problem::Gemm { m: t, n, k } };
        self.kernel_in(slot, l, group, p, bufs.to_vec(), self.plan.dtype_of(bufs[1]))
    }

    /// One token's `y[n] = w[n, k] · rmsnorm(x) * g` (decode): `bufs` are x (the
    /// residual stream), the norm gain g, the weight w and y.
    fn norm_gemv(&mut self, l: Option<usize>, group: Option<u32>, n: usize, k: usize, bufs: [BufId; 4]) -> Result<(), PlanError> {
        self.norm_gemv_chain(l, group, n, k, bufs, None, None)
    }

    /// [`Emitter::norm_gemv`] with the decode chain's prologue and epilogue: the
    /// residual `pending` (its branch, and its own norm's gain on Gemma 3) added to
    /// x first, the sum written to `pending`'s `h`; with `act`, w the fused gate/up
    /// and y the activation product.
    #[allow(clippy::too_many_arguments)]
    fn norm_gemv_chain(
        &mut self,
        l: Option<usize>,
        group: Option<u32>,
        n: usize,
        k: usize,
        [x, g, w, y]: [BufId; 4],
        pending: Option<Pending>,
        act: Option<Activation>,
    ) -> Result<(), PlanError> {
        let p = self.chain_problem(n, k, w, pending.map_or(NormResidual::None, Pending::residual), act);
        let mut binds = vec![x];
        binds.extend(pending.iter().flat_map(|p| std::iter::once(p.branch).chain(p.gain)));
        binds.extend([g, w, y]);
        binds.extend(pending.map(|p| p.h));
        self.kernel_in(Slot::NormMatmul, l, group, p, binds, self.plan.dtype_of(w))
    }

    /// The [`Problem::NormGemv`] of [`Emitter::norm_gemv_chain`].
    fn chain_problem(&self, n: usize, k: usize, w: BufId, residual: NormResidual, act: Option<Activation>) -> Problem {
        let c = &self.plan.config;
        let formats = self.plan.buffers.get(w).and_then(|d| d.formats);
        Problem::NormGemv { n, k, eps: c.norm_eps() as f32, unit_offset: c.norm_unit_offset, residual, act, formats }
    }

    /// Whether a kernel of this engine runs the norm-fused projection `n` x `k` over
    /// weight `w` with that residual prologue and activation (the WGSL ones without
    /// subgroups run the plain form only: the plan keeps the separate steps there).
    fn chain_runs(&self, l: Option<usize>, n: usize, k: usize, w: BufId, residual: NormResidual, act: Option<Activation>) -> bool {
        let p = self.chain_problem(n, k, w, residual, act);
        self.plan.selection.choose(Slot::NormMatmul, self.regime, l, &p, self.plan.dtype_of(w)).is_ok()
    }

    /// Adds a pending residual to `x` into its `h` as separate steps (its branch
    /// normed into `scratch` first on Gemma 3), for a consumer that cannot take it
    /// as its prologue.
    fn add_pending(&mut self, l: Option<usize>, x: BufId, p: Pending, scratch: BufId) -> Result<(), PlanError> {
        let h = self.plan.config.dims.hidden_size;
        let branch = match p.gain {
            Some(g) => {
                self.rms(l, 1, h, p.branch, g, scratch)?;
                scratch
            }
            None => p.branch,
        };
        self.kernel(Slot::Residual, l, Problem::ResidualAdd { n: h }, vec![x, branch, p.h], DType::F32)
    }

    /// What a block's projections read: the normed stream `xn`, or the stream `x`
    /// itself where the family has no norm before them (OLMo 2).
    fn projection_input(&self, x: BufId) -> BufId {
        if self.plan.config.pre_norms() { self.plan.id("xn") } else { x }
    }

    /// RMSNorm of `rows` rows of `dim` over the residual stream with the stream's
    /// eps ([`ModelConfig::norm_eps`](crate::model::ModelConfig::norm_eps); also
    /// Gemma 3's norms over a branch, where the two are equal).
    fn rms(&mut self, l: Option<usize>, rows: usize, dim: usize, x: BufId, w: BufId, y: BufId) -> Result<(), PlanError> {
        let eps = self.plan.config.norm_eps() as f32;
        self.rms_eps(l, rows, dim, eps, [x, w, y])
    }

    /// RMSNorm with its own eps (per-head q/k norms: the config's).
    fn rms_eps(&mut self, l: Option<usize>, rows: usize, dim: usize, eps: f32, [x, w, y]: [BufId; 3]) -> Result<(), PlanError> {
        let c = &self.plan.config;
        let p = Problem::RmsNorm { rows, dim, eps, unit_offset: c.norm_unit_offset };
        self.kernel(Slot::Norm, l, p, vec![x, w, y], self.plan.options.weight_dtype.float_storage())
    }

    /// The steps of one pass over `t` tokens at position `pos0`: each layer's
    /// projections, q/k norm + RoPE and KV write, attention and MLP, then the LM head.
    fn forward(&mut self, t: usize, pos0: usize) -> Result<(), PlanError> {
        let (c, f) = (&self.plan.config, self.plan.options.fusion);
        // Decode folds the norms that feed projections into them (see `Fusion::norm_matmul`).
        // (OLMo 2's projections read the stream itself: no norm to fold.)
        let nm = f.norm_matmul && t == 1 && c.pre_norms() && self.plan.gains_match_projections();
        let mut s = Pass {
            t,
            pos0,
            nm,
            // Decode with `residual_norm`: the residual add (and Gemma 3's norm of the
            // added branch) waits to be the next norm-fused projection's prologue.
            fold: nm && f.residual_norm,
            act: if c.is_gelu() { Activation::GeluTanh } else { Activation::Silu },
            cur: 0,
            normed: false,
            pending: None,
        };
        for l in 0..c.dims.num_layers {
            let w = self.plan.lw(l);
            if !self.qkv_block(&mut s, l, &w)? {
                self.rope_block(&s, l, &w)?;
            }
            self.attention_block(&s, l, &w)?;
            self.mlp_block(&mut s, l, &w)?;
        }
        self.head_block(&mut s)
    }

    /// Layer `l`'s RoPE frequencies (its kind's: local or global).
    fn inv_freq(&self, l: usize) -> BufId {
        let c = &self.plan.config;
        let table = if c.layer_has_rope(l) { c.layer_kind(l).name() } else { NO_ROPE };
        self.plan.id(&format!("inv_freq_{table}"))
    }

    /// Layer `l`'s input norm (unless folded or already done) and Q, K, V
    /// projections; true when the decode QKV kernel also rotated q and k and wrote
    /// the KV cache ([`Fusion::qkv_rope_cache`]).
    fn qkv_block(&mut self, s: &mut Pass, l: usize, w: &LayerW) -> Result<bool, PlanError> {
        let plan = self.plan;
        let (c, f, t, nm) = (&plan.config, plan.options.fusion, s.t, s.nm);
        let (h, nq, nkv) = (c.dims.hidden_size, c.q_dim(), c.kv_dim());
        let id = |n: &str| plan.id(n);
        let (xn, q, k, v) = (id("xn"), id("q"), id("k"), id("v"));
        // A layer whose parts differ in storage type runs them unfused, but in the
        // norm-fused decode projection where a kernel takes per-operand formats.
        let li = Some(l);
        let wqkv = w.wqkv.unwrap_or(usize::MAX);
        let fused_qkv = f.qkv
            && w.wqkv.is_some()
            && (!plan.stacked(wqkv) || nm && self.chain_runs(li, nq + 2 * nkv, h, wqkv, NormResidual::None, None));
        let qkv_folds = nm && fused_qkv && s.pending.is_some_and(|p| self.chain_runs(li, nq + 2 * nkv, h, wqkv, p.residual(), None));
        if let Some(p) = s.pending.take_if(|_| !qkv_folds) {
            self.add_pending(li, plan.x[s.cur], p, id("dn"))?;
            s.cur = 1 - s.cur;
        }
        let x = plan.x[s.cur];
        if !s.normed && !nm && c.pre_norms() {
            self.rms(li, t, h, x, w.input_ln, xn)?;
        }
        let xn = self.projection_input(x);
        let get = |b: Option<BufId>| b.unwrap_or(usize::MAX);
        let separate = [(q, w.wq, w.bq, nq), (k, w.wk, w.bk, nkv), (v, w.wv, w.bv, nkv)];
        if nm && fused_qkv {
            let qkv = id("qkv");
            let p = s.pending.take();
            self.norm_gemv_chain(li, None, nq + 2 * nkv, h, [x, w.input_ln, wqkv, qkv], p, None)?;
            if p.is_some() {
                s.cur = 1 - s.cur;
            }
            // Its q/k norm is per head.
            let fits = f.qkv_rope_cache && w.bqkv.is_none() && !c.qk_norm_projection();
            let rotated = fits && self.qkv_rope_cache(l, w, s.pos0, qkv, self.inv_freq(l))?;
            if !rotated {
                self.plumb(Slot::NormMatmul, li, Plumb::SplitQkv { src: qkv, bias: w.bqkv, q, k, v, tokens: 1, nq, nkv });
            }
            return Ok(rotated);
        }
        if fused_qkv && !nm {
            let bias = w.bqkv;
            if t == 1 {
                let p = Problem::QkvProj { k: h, nq, nkv, bias: bias.is_some() };
                let mut b = vec![xn, wqkv];
                b.extend(bias);
                b.extend([q, k, v]);
                self.kernel(Slot::FusedQkv, li, p, b, plan.dtype_of(wqkv))?;
            } else {
                let qkv = id("qkv");
                self.matmul(Slot::MatmulQkv, li, None, t, nq + 2 * nkv, h, [xn, wqkv, qkv])?;
                self.plumb(Slot::MatmulQkv, li, Plumb::SplitQkv { src: qkv, bias, q, k, v, tokens: t, nq, nkv });
            }
            return Ok(false);
        }
        // Three projections (one parallel group when the plan asks for it), each with its bias.
        let g = if plan.options.parallel.qkv { Some(self.next_group()) } else { None };
        let slot = if nm { Slot::NormMatmul } else { Slot::MatmulQkv };
        for (out, weight, _, n) in separate {
            if nm {
                self.norm_gemv(li, g, n, h, [x, w.input_ln, get(weight), out])?;
            } else {
                self.matmul(Slot::MatmulQkv, li, g, t, n, h, [xn, get(weight), out])?;
            }
        }
        for (buf, _, bias, n) in separate {
            if let Some(bias) = bias {
                self.plumb(slot, li, Plumb::BiasAdd { buf, bias, rows: t, n });
            }
        }
        Ok(false)
    }

    /// Layer `l`'s q/k norm and RoPE (fused or as separate steps) and its KV write.
    fn rope_block(&mut self, s: &Pass, l: usize, w: &LayerW) -> Result<(), PlanError> {
        let plan = self.plan;
        let (c, t, pos0, li) = (&plan.config, s.t, s.pos0, Some(l));
        let hd = c.dims.head_dim;
        let id = |n: &str| plan.id(n);
        let (q, k, v, qn, kn, qr, kr) = (id("q"), id("k"), id("v"), id("qn"), id("kn"), id("qr"), id("kr"));
        let freq = self.inv_freq(l);
        let layout = RopeLayout::Half;
        let rot_dim = c.rot_dim();
        let rope = |heads| Problem::Rope { tokens: t, heads, head_dim: hd, rot_dim, pos0, layout };
        for (src, dst, normed_buf, heads, nw) in [(q, qr, qn, c.dims.num_heads, w.q_norm), (k, kr, kn, c.dims.num_kv_heads, w.k_norm)] {
            match nw {
                Some(nw) if c.qk_norm_projection() => {
                    self.rms_eps(li, t, heads * hd, c.rms_norm_eps as f32, [src, nw, normed_buf])?;
                    self.kernel(Slot::Rope, li, rope(heads), vec![normed_buf, freq, dst], DType::F32)?;
                }
                Some(nw) if plan.options.fusion.qk_norm_rope => {
                    let (eps, unit_offset) = (c.rms_norm_eps as f32, c.norm_unit_offset);
                    let p = Problem::QkNormRope { tokens: t, heads, head_dim: hd, rot_dim, pos0, layout, eps, unit_offset };
                    self.kernel(Slot::QkNormRope, li, p, vec![src, nw, freq, dst], plan.options.weight_dtype.float_storage())?;
                }
                Some(nw) => {
                    self.rms_eps(li, t * heads, hd, c.rms_norm_eps as f32, [src, nw, normed_buf])?;
                    self.kernel(Slot::Rope, li, rope(heads), vec![normed_buf, freq, dst], DType::F32)?;
                }
                None => self.kernel(Slot::Rope, li, rope(heads), vec![src, freq, dst], DType::F32)?,
            }
        }
        let (k_cache, v_cache, kv_heads, kv_cap) = (w.k_cache, w.v_cache, c.dims.num_kv_heads, plan.options.context);
        self.plumb(Slot::KvWrite, li, Plumb::KvWrite { k: kr, v, k_cache, v_cache, tokens: t, kv_heads, head_dim: hd, kv_cap, pos0 });
        Ok(())
    }

    /// Layer `l`'s attention over its KV cache (decode or prefill) and the o-projection.
    fn attention_block(&mut self, s: &Pass, l: usize, w: &LayerW) -> Result<(), PlanError> {
        let plan = self.plan;
        let c = &plan.config;
        let (t, hd, kv_cap) = (s.t, c.dims.head_dim, plan.options.context);
        let window = c.layer_sliding_window(l).unwrap_or(0);
        let scale = c.layer_attention_scale(l) as f32;
        let kv_len = s.pos0 + t;
        let (heads, kv_heads) = (c.dims.num_heads, c.dims.num_kv_heads);
        let (p, slot) = if t == 1 || self.all_rows {
            // A decode batch's rows each attend as a lone decode step does (its
            // executor moves the problem to each row's position).
            let kv_len = if self.all_rows { 1 } else { kv_len };
            (Problem::AttentionDecode { kv_len, kv_cap, heads, kv_heads, head_dim: hd, window, scale }, Slot::AttentionDecode)
        } else {
            let p = Problem::AttentionPrefill {
                tokens: t,
                kv_len,
                kv_cap,
                heads,
                kv_heads,
                head_dim: hd,
                window,
                scale,
                bidi_start: 0,
                bidi_end: 0,
            };
            (p, Slot::AttentionPrefill)
        };
        let (qr, attn, o) = (plan.id("qr"), plan.id("attn"), plan.id("o"));
        let regime = self.regime;
        if slot == Slot::AttentionDecode {
            self.regime = Regime::Decode;
        }
        let chosen = self.kernel(slot, Some(l), p, vec![qr, w.k_cache, w.v_cache, attn], plan.options.kv_dtype);
        self.regime = regime;
        chosen?;
        self.matmul(Slot::MatmulO, Some(l), None, t, c.dims.hidden_size, c.q_dim(), [attn, w.wo, o])
    }

    /// Layer `l`'s first residual (+ the MLP's input norm, or left pending for the
    /// MLP's prologue), gate/up and activation, down projection and second residual
    /// (+ the next layer's input norm, or left pending).
    fn mlp_block(&mut self, s: &mut Pass, l: usize, w: &LayerW) -> Result<(), PlanError> {
        let plan = self.plan;
        let (c, t, nm, li) = (&plan.config, s.t, s.nm, Some(l));
        let (h, inter, eps) = (c.dims.hidden_size, c.dims.intermediate_size, c.norm_eps() as f32);
        let id = |n: &str| plan.id(n);
        let (xn, o, on, gate, up, act, d, dn) = (id("xn"), id("o"), id("on"), id("gate"), id("up"), id("act"), id("d"), id("dn"));
        // Sandwich norms (Gemma 3): each branch normalized before its residual add
        // (OLMo 2 too, and no norm before the MLP).
        let (sandwich, branch, pre) = (c.sandwich_norms(), c.branch_norms(), c.pre_norms());
        let (x, other) = (plan.x[s.cur], plan.x[1 - s.cur]);
        let mlp_norm = if sandwich { w.pre_ff_ln.unwrap_or(usize::MAX) } else { w.post_attn_ln };
        // The fused gate/up as a norm-fused projection (with the residual in its
        // prologue when folding), where this engine has a kernel for it; a gate/up
        // of per-operand formats only so (the other passes read its parts).
        let wgu = w.wgu.unwrap_or(usize::MAX);
        let gu_nm =
            nm && plan.options.fusion.gate_up && w.wgu.is_some() && self.chain_runs(li, inter, h, wgu, NormResidual::None, Some(s.act));
        let fused_gu = plan.options.fusion.gate_up && w.wgu.is_some() && (gu_nm || !plan.stacked(wgu));
        let post = if sandwich { NormResidual::Normed } else { NormResidual::Add };
        let gu_folds = gu_nm && s.fold && self.chain_runs(li, inter, h, wgu, post, Some(s.act));
        if s.fold {
            s.pending = Some(Pending { branch: o, gain: sandwich.then_some(w.post_attn_ln), h: other });
        } else {
            let r1 = if branch {
                self.rms(li, t, h, o, w.post_attn_ln, on)?;
                on
            } else {
                o
            };
            self.residual_norm(li, t, h, eps, x, r1, mlp_norm, other, xn, !pre || (nm && (gu_nm || !fused_gu)))?;
            s.cur = 1 - s.cur;
        }
        if let Some(p) = s.pending.take_if(|_| !gu_folds) {
            self.add_pending(li, plan.x[s.cur], p, on)?;
            s.cur = 1 - s.cur;
        }
        let x = plan.x[s.cur];
        let xn = self.projection_input(x);
        if let (Some(m), Some(ws)) = (c.moe_layer(l), w.moe) {
            // The norm went with the residual add only when nothing folds it.
            if pre && (nm || s.fold) {
                self.rms(li, t, h, x, mlp_norm, xn)?;
            }
            self.experts(li, t, m, xn, ws, s.act, d)?;
        } else if gu_nm {
            let p = s.pending.take();
            self.norm_gemv_chain(li, None, inter, h, [x, mlp_norm, wgu, act], p, Some(s.act))?;
            if p.is_some() {
                s.cur = 1 - s.cur;
            }
        } else if fused_gu {
            if s.fold {
                // The residual went through a separate add: the norm too.
                self.rms(li, t, h, x, mlp_norm, xn)?;
            }
            let p = Problem::GateUp { rows: t, n: inter, k: h, act: s.act };
            self.kernel(Slot::FusedGateUp, li, p, vec![xn, wgu, act], plan.dtype_of(wgu))?;
        } else {
            let g = if plan.options.parallel.ffn { Some(self.next_group()) } else { None };
            for (weight, out) in [(w.wg, gate), (w.wu, up)] {
                let weight = weight.unwrap_or(usize::MAX);
                if nm {
                    self.norm_gemv(li, g, inter, h, [x, mlp_norm, weight, out])?;
                } else {
                    self.matmul(Slot::MatmulGateUp, li, g, t, inter, h, [xn, weight, out])?;
                }
            }
            let p = Problem::GatedAct { rows: t, dim: inter, act: s.act };
            self.kernel(Slot::Activation, li, p, vec![gate, up, act], DType::F32)?;
        }
        let (x, other) = (plan.x[s.cur], plan.x[1 - s.cur]);
        if w.moe.is_none() {
            self.matmul(Slot::MatmulDown, li, None, t, h, inter, [act, w.wd, d])?;
        }
        if s.fold {
            s.pending = Some(Pending { branch: d, gain: if sandwich { w.post_ff_ln } else { None }, h: other });
            return Ok(());
        }
        let r2 = if branch {
            self.rms(li, t, h, d, w.post_ff_ln.unwrap_or(usize::MAX), dn)?;
            dn
        } else {
            d
        };
        // Residual 2 (+ the next layer's input norm, or the final norm).
        let last = l + 1 == c.dims.num_layers;
        let next_norm = if last { id("final_norm") } else { plan.lw(l + 1).input_ln };
        let add_only = nm || (!pre && !last);
        self.residual_norm(li, t, h, eps, x, r2, next_norm, other, id("xn"), add_only)?;
        s.cur = 1 - s.cur;
        s.normed = !add_only;
        Ok(())
    }

    /// A mixture of experts over the normed rows `xn` into `out`: the router's
    /// projection and top-k choice, then only the chosen experts' gate/up and down
    /// projections, the down ones weighted by the route and summed.
    #[allow(clippy::too_many_arguments)]
    fn experts(
        &mut self,
        li: Option<usize>,
        t: usize,
        m: &crate::model::Moe,
        xn: BufId,
        ws: [BufId; 3],
        act: Activation,
        out: BufId,
    ) -> Result<(), PlanError> {
        let plan = self.plan;
        let h = plan.config.dims.hidden_size;
        let (experts, top_k, ff) = (m.experts, m.top_k, m.expert_ff);
        let (logits, route, hidden) = (plan.id("router_logits"), plan.id("route"), plan.id("expert_act"));
        let [wr, wgu, wd] = ws;
        self.matmul(Slot::MatmulRouter, li, None, t, experts, h, [xn, wr, logits])?;
        let p = Problem::MoeRoute { rows: t, experts, top_k, norm: m.norm_top_k };
        self.kernel(Slot::MoeRoute, li, p, vec![logits, route], DType::F32)?;
        let p = Problem::MoeGateUp { rows: t, experts, top_k, n: ff, k: h, act };
        self.kernel(Slot::MoeGateUp, li, p, vec![xn, route, wgu, hidden], plan.dtype_of(wgu))?;
        let p = Problem::MoeDown { rows: t, experts, top_k, n: h, k: ff };
        self.kernel(Slot::MoeDown, li, p, vec![hidden, route, wd, out], plan.dtype_of(wd))
    }

    /// The LM head over the final-normed rows, block by block (on decode with
    /// folded norms each block adds a pending residual in its prologue, all writing
    /// the same sum); a prefill without `all_logits` heads its last row only.
    fn head_block(&mut self, s: &mut Pass) -> Result<(), PlanError> {
        let plan = self.plan;
        let (h, t, xn) = (plan.config.dims.hidden_size, s.t, plan.id("xn"));
        if s.nm {
            let head_folds =
                s.pending.is_some_and(|p| plan.lm_head.iter().all(|b| self.chain_runs(None, b.rows, h, b.weight, p.residual(), None)));
            if let Some(p) = s.pending.take_if(|_| !head_folds) {
                self.add_pending(None, plan.x[s.cur], p, plan.id("dn"))?;
                s.cur = 1 - s.cur;
            }
            for b in &plan.lm_head {
                let bufs = [plan.x[s.cur], plan.id("final_norm"), b.weight, b.logits];
                self.norm_gemv_chain(None, None, b.rows, h, bufs, s.pending, None)?;
            }
            return Ok(());
        }
        let (rows, src) = if t > 1 && self.all_rows && !self.heads.is_empty() {
            let (last, mut n) = (plan.id("last"), 0);
            for (r0, k) in std::mem::take(&mut self.heads) {
                self.plumb(Slot::MatmulLmHead, None, Plumb::Copy { src: xn, src_off: r0 * h, dst: last, dst_off: n * h, len: k * h });
                n += k;
            }
            (n, last)
        } else if t > 1 && (plan.options.all_logits || self.all_rows) {
            (t, xn)
        } else if t > 1 {
            let last = plan.id("last");
            self.plumb(Slot::MatmulLmHead, None, Plumb::Copy { src: xn, src_off: (t - 1) * h, dst: last, dst_off: 0, len: h });
            (1, last)
        } else {
            (1, xn)
        };
        for b in &plan.lm_head {
            self.matmul(Slot::MatmulLmHead, None, None, rows, b.rows, h, [src, b.weight, b.logits])?;
        }
        Ok(())
    }

    /// Layer `l`'s decode QKV row `qkv` split, (q/k-normed and) rotated into `qr`
    /// and the KV cache in one kernel ([`Fusion::qkv_rope_cache`]); false (nothing
    /// emitted) when no kernel of this engine can run it (the CPU's f16 cache).
    fn qkv_rope_cache(&mut self, l: usize, w: &LayerW, pos0: usize, qkv: BufId, freq: BufId) -> Result<bool, PlanError> {
        let plan = self.plan;
        let c = &plan.config;
        let norm = w.q_norm.zip(w.k_norm);
        let p = Problem::QkvRopeCache {
            heads: c.dims.num_heads,
            kv_heads: c.dims.num_kv_heads,
            head_dim: c.dims.head_dim,
            rot_dim: c.rot_dim(),
            pos0,
            kv_cap: plan.options.context,
            layout: RopeLayout::Half,
            norm: norm.is_some(),
            eps: c.rms_norm_eps as f32,
            unit_offset: c.norm_unit_offset,
            gain: plan.options.weight_dtype.float_storage(),
        };
        let kv = plan.options.kv_dtype;
        if plan.selection.choose(Slot::QkvRopeCache, self.regime, Some(l), &p, kv).is_err() {
            return Ok(false);
        }
        let mut binds = vec![qkv];
        binds.extend(norm.map(|(qn, kn)| [qn, kn]).into_iter().flatten());
        binds.extend([freq, plan.id("qr"), w.k_cache, w.v_cache]);
        self.kernel(Slot::QkvRopeCache, Some(l), p, binds, kv)?;
        Ok(true)
    }

    /// `h = x + r` into `h_out`, then `y = rmsnorm(h) * w` into `y`: one fused kernel
    /// or a residual add and a norm. With `norm_in_matmul` the norm is the prologue of
    /// the projections that consume it ([`Emitter::norm_gemv`]): only the add runs.
    #[allow(clippy::too_many_arguments)]
    fn residual_norm(
        &mut self,
        l: Option<usize>,
        t: usize,
        dim: usize,
        eps: f32,
        x: BufId,
        r: BufId,
        w: BufId,
        h_out: BufId,
        y: BufId,
        norm_in_matmul: bool,
    ) -> Result<(), PlanError> {
        let c = &self.plan.config;
        if norm_in_matmul {
            self.kernel(Slot::Residual, l, Problem::ResidualAdd { n: t * dim }, vec![x, r, h_out], DType::F32)
        } else if self.plan.options.fusion.residual_norm {
            let p = Problem::ResidualRmsNorm { rows: t, dim, eps, unit_offset: c.norm_unit_offset };
            self.kernel(Slot::ResidualNorm, l, p, vec![x, r, w, h_out, y], self.plan.options.weight_dtype.float_storage())
        } else {
            self.kernel(Slot::Residual, l, Problem::ResidualAdd { n: t * dim }, vec![x, r, h_out], DType::F32)?;
            self.rms(l, t, dim, h_out, w, y)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default fusions' decode layer on a GPU with and without subgroups: with
    /// them a Llama layer and a Gemma 3 layer are norm-fused projections with the
    /// residual adds folded in (no add, no norm, no RoPE step of their own); without
    /// them (whose WGSL norm-fused kernels run the plain form only) the plan keeps
    /// the separate adds and norms and still builds.
    #[test]
    fn decode_chain_folds_where_a_kernel_runs_it() {
        for name in ["llama-3.2-1b", "gemma3-1b"] {
            let c = crate::model::builtin(name).expect("built-in model");
            for subgroups in [true, false] {
                let caps = crate::device::GpuCaps { subgroups, ..crate::testing::typical_gpu_caps() };
                let opts = PlanOptions::new(DType::F16, 4, 64).with_kv_dtype(DType::F16);
                let plan = Plan::new(name, &c, opts, Selection::runtime(select::DeviceCaps::Gpu(caps))).expect("plan");
                let steps = plan.steps(1, 7).expect("decode steps");
                let layer: Vec<Slot> = steps.iter().filter(|s| s.layer == Some(1)).map(|s| s.slot).collect();
                let unfolded = [Slot::Residual, Slot::Norm, Slot::ResidualNorm, Slot::Rope, Slot::QkNormRope, Slot::KvWrite];
                let kept = layer.iter().filter(|s| unfolded.contains(s)).count();
                if subgroups {
                    assert_eq!(kept, 0, "{name}: {layer:?}");
                    assert_eq!(layer.iter().filter(|&&s| s == Slot::NormMatmul).count(), 2, "{name}: {layer:?}");
                } else {
                    assert!(kept > 0, "{name} without subgroups: {layer:?}");
                }
            }
        }
    }

    /// Blocks cover the vocabulary in order, without gaps or overlaps, each within the limit.
    fn check(vocab: usize, hidden: usize, size: usize, rows: usize, limit: u64) -> Vec<(usize, usize)> {
        let b = lm_head_blocks(vocab, hidden, size, rows, limit);
        let mut next = 0;
        for &(start, n) in &b {
            assert_eq!(start, next, "{b:?}");
            assert!(n > 0);
            assert!(((n * hidden * size) as u64) <= limit || n == 1, "weights of {n} rows over {limit}: {b:?}");
            assert!(((n * rows * 4) as u64) <= limit || n == 1, "logits of {n} rows over {limit}: {b:?}");
            next += n;
        }
        assert_eq!(next, vocab, "{b:?}");
        b
    }

    #[test]
    fn lm_head_fits_in_one_block_when_it_can() {
        assert_eq!(check(49_152, 576, 4, 1, 128 << 20), vec![(0, 49_152)]);
        assert_eq!(check(262_144, 1152, 2, 1, u64::MAX), vec![(0, 262_144)]);
    }

    #[test]
    fn large_lm_heads_split_into_even_blocks_of_64_rows() {
        // Gemma 3 1B at f16 under lavapipe's 128 MiB binding: 576 MiB, 5 blocks.
        let b = check(262_144, 1152, 2, 1, 128 << 20);
        assert_eq!(b.len(), 5);
        assert!(b[..4].iter().all(|&(_, n)| n % 64 == 0 && n == b[0].1), "{b:?}");
        // Gemma 3 4B's odd vocabulary at f32.
        let b = check(262_208, 2560, 4, 1, 128 << 20);
        assert_eq!(b.len(), 21);
        // Many prompt rows of logits bound the block, not the weights.
        let b = check(262_144, 64, 4, 512, 128 << 20);
        assert!(b.len() >= 4, "{b:?}");
    }

    #[test]
    fn tiny_limits_still_make_progress() {
        check(100, 64, 4, 1, 1);
        check(1000, 16, 2, 3, 4096);
    }
}
