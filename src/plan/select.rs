//! Kernel selection: which variant serves each slot of the plan, per regime and per
//! layer range, and the runtime's own defaults when a profile says nothing (the
//! profile format's fallback to auto-selection).

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use super::{PlanError, Regime};
pub use crate::device::DeviceCaps;
use crate::kernels::cpu::Isa;
pub use crate::kernels::preferred::{preferred, preferred_on};
use crate::kernels::{self, DType, KernelDef, Op, Params, Problem};

/// One place in the plan that needs a kernel, named as in the profile.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, strum::Display, strum::EnumString, strum::IntoStaticStr, strum::VariantArray,
)]
pub enum Slot {
    #[strum(serialize = "attention.prefill")]
    AttentionPrefill,
    #[strum(serialize = "attention.decode")]
    AttentionDecode,
    #[strum(serialize = "matmul.qkv_proj")]
    MatmulQkv,
    #[strum(serialize = "matmul.o_proj")]
    MatmulO,
    #[strum(serialize = "matmul.gate_up")]
    MatmulGateUp,
    #[strum(serialize = "matmul.down_proj")]
    MatmulDown,
    #[strum(serialize = "matmul.lm_head")]
    MatmulLmHead,
    #[strum(serialize = "norm")]
    Norm,
    #[strum(serialize = "rope")]
    Rope,
    #[strum(serialize = "activation")]
    Activation,
    #[strum(serialize = "residual")]
    Residual,
    #[strum(serialize = "fused.qkv_proj")]
    FusedQkv,
    #[strum(serialize = "fused.gate_up")]
    FusedGateUp,
    #[strum(serialize = "fused.qk_norm_rope")]
    QkNormRope,
    #[strum(serialize = "fused.residual_norm")]
    ResidualNorm,
    /// RMSNorm + the projections it feeds, in decode (`Fusion::norm_matmul`).
    #[strum(serialize = "fused.norm_matmul")]
    NormMatmul,
    /// The runtime's own KV-cache write (not tuned).
    #[strum(serialize = "kv_write")]
    KvWrite,
    /// A decode token's split-QKV + RoPE (+ q/k norm) + KV-cache write
    /// (`Fusion::qkv_rope_cache`).
    #[strum(serialize = "fused.qkv_rope_cache")]
    QkvRopeCache,
    /// A mixture of experts' router projection (`[experts, hidden]`).
    #[strum(serialize = "matmul.router")]
    MatmulRouter,
    /// The router's top-k choice ([`Op::MoeRoute`]).
    #[strum(serialize = "moe.route")]
    MoeRoute,
    /// The chosen experts' gate and up projections ([`Op::MoeGateUp`]).
    #[strum(serialize = "moe.gate_up")]
    MoeGateUp,
    /// The chosen experts' down projections, weighted and summed ([`Op::MoeDown`]).
    #[strum(serialize = "moe.down")]
    MoeDown,
    /// The vision tower's patch embedding (regime [`Regime::Vision`], as every
    /// slot below).
    #[strum(serialize = "vision.patch_embed")]
    VisionPatchEmbed,
    /// The tower's bidirectional attention over the patches.
    #[strum(serialize = "vision.attention")]
    VisionAttention,
    /// The tower's Linear layers (bias, GELU epilogue): the MLP's fc1 and fc2 and the
    /// attention's q, k, v and out projections, one op.
    #[strum(serialize = "vision.mlp")]
    VisionMlp,
    /// The tower's LayerNorms that follow no residual add (the first layer's
    /// LayerNorm 1, after the position embedding's add).
    #[strum(serialize = "vision.norm")]
    VisionNorm,
    /// The tower's residual adds fused with the LayerNorm after each (every
    /// layer's LayerNorm 2, the next layer's LayerNorm 1, the post LayerNorm).
    #[strum(serialize = "vision.residual_norm")]
    VisionResidualNorm,
    /// The projector's average pool of the patch grid.
    #[strum(serialize = "vision.pool")]
    VisionPool,
    /// The projector's GEMM to the text model's width.
    #[strum(serialize = "projector")]
    Projector,
}

impl Slot {
    /// Every slot, in declaration order.
    pub const ALL: &'static [Slot] = <Slot as strum::VariantArray>::VARIANTS;

    /// The profile key (as spelled in the YAML).
    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn from_name(s: &str) -> Option<Slot> {
        s.parse().ok()
    }

    /// Whether a kernel of `op` may serve this slot in `regime`: the slot's op, or a
    /// GEMV for lm_head in prefill (only the last position's logits are computed).
    pub fn accepts(self, regime: Regime, op: Op) -> bool {
        self.op(regime) == Some(op) || (self == Slot::MatmulLmHead && regime == Regime::Prefill && op == Op::Gemv)
    }

    /// The slots of the vision tower and projector ([`Regime::Vision`]).
    pub const VISION: &'static [Slot] = &[
        Slot::VisionPatchEmbed,
        Slot::VisionAttention,
        Slot::VisionMlp,
        Slot::VisionNorm,
        Slot::VisionResidualNorm,
        Slot::VisionPool,
        Slot::Projector,
    ];

    /// Whether this is a slot of the vision tower (regime [`Regime::Vision`] only).
    pub fn is_vision(self) -> bool {
        Slot::VISION.contains(&self)
    }

    /// The regimes this slot exists in.
    pub fn regimes(self) -> &'static [Regime] {
        if self.is_vision() { &[Regime::Vision] } else { &[Regime::Prefill, Regime::Decode] }
    }

    /// The op a kernel for this slot computes in `regime` (`None`: not tunable, or
    /// not a regime of the slot), as [`SLOTS`] says.
    pub fn op(self, regime: Regime) -> Option<Op> {
        self.def().ops[regime as usize]
    }

    /// This slot's row of [`SLOTS`].
    pub fn def(self) -> &'static SlotDef {
        &SLOTS[self as usize]
    }
}

/// One row of the slot table ([`SLOTS`]).
pub struct SlotDef {
    pub slot: Slot,
    /// The op a kernel for it computes in each regime, indexed by [`Regime`]
    /// (prefill, decode, vision; None: not a regime of the slot).
    pub ops: [Option<Op>; 3],
    /// The profile's `kernels` entry its kernel is written under (`attention`
    /// holds both attention slots, one per regime); None: not tuned.
    pub entry: Option<&'static str>,
    /// The fusion choice ([`super::FusionFlag::name`]) whose plans have it
    /// (None: it is in the unfused plan).
    pub fusion: Option<&'static str>,
}

/// A text model's slot (prefill and decode); its `slot` is filled in by [`row`].
const fn text(entry: &'static str, prefill: Op, decode: Op, fusion: Option<&'static str>) -> SlotDef {
    SlotDef { slot: Slot::KvWrite, ops: [Some(prefill), Some(decode), None], entry: Some(entry), fusion }
}

/// A vision tower's slot; its `slot` is filled in by [`row`].
const fn tower(entry: &'static str, op: Op) -> SlotDef {
    SlotDef { slot: Slot::KvWrite, ops: [None, None, Some(op)], entry: Some(entry), fusion: None }
}

/// A row of [`SLOTS`].
const fn row(slot: Slot, d: SlotDef) -> SlotDef {
    SlotDef { slot, ..d }
}

/// The slot table: every slot, in [`Slot`]'s order, with its ops, its profile
/// entry and the fusion it belongs to. The profile's `kernels` section (read,
/// written, compared) and the plan's selection iterate it; adding a fused op is
/// its row here (and its `Slot` variant) plus its kernels.
pub const SLOTS: &[SlotDef] = &{
    use Op::*;
    [
        // Each attention slot in both regimes: a one-token prefill runs the decode kernel.
        row(Slot::AttentionPrefill, text("attention", AttentionPrefill, AttentionPrefill, None)),
        row(Slot::AttentionDecode, text("attention", AttentionDecode, AttentionDecode, None)),
        row(Slot::MatmulQkv, text("matmul.qkv_proj", Gemm, Gemv, None)),
        row(Slot::MatmulO, text("matmul.o_proj", Gemm, Gemv, None)),
        row(Slot::MatmulGateUp, text("matmul.gate_up", Gemm, Gemv, None)),
        row(Slot::MatmulDown, text("matmul.down_proj", Gemm, Gemv, None)),
        row(Slot::MatmulLmHead, text("matmul.lm_head", Gemm, Gemv, None)),
        row(Slot::Norm, text("norm", RmsNorm, RmsNorm, None)),
        row(Slot::Rope, text("rope", Rope, Rope, None)),
        row(Slot::Activation, text("activation", GatedAct, GatedAct, None)),
        row(Slot::Residual, text("residual", ResidualAdd, ResidualAdd, None)),
        row(Slot::FusedQkv, text("fused.qkv_proj", QkvProj, QkvProj, Some("qkv"))),
        row(Slot::FusedGateUp, text("fused.gate_up", GateUp, GateUp, Some("gate_up"))),
        row(Slot::QkNormRope, text("fused.qk_norm_rope", QkNormRope, QkNormRope, Some("qk_norm_rope"))),
        row(Slot::ResidualNorm, text("fused.residual_norm", ResidualRmsNorm, ResidualRmsNorm, Some("residual_norm"))),
        row(Slot::NormMatmul, text("fused.norm_matmul", NormGemv, NormGemv, Some("norm_matmul"))),
        row(Slot::KvWrite, SlotDef { slot: Slot::KvWrite, ops: [None; 3], entry: None, fusion: None }),
        row(Slot::QkvRopeCache, text("fused.qkv_rope_cache", QkvRopeCache, QkvRopeCache, Some("qkv_rope_cache"))),
        row(Slot::MatmulRouter, text("matmul.router", Gemm, Gemv, None)),
        row(Slot::MoeRoute, text("moe.route", MoeRoute, MoeRoute, None)),
        row(Slot::MoeGateUp, text("moe.gate_up", MoeGateUp, MoeGateUp, None)),
        row(Slot::MoeDown, text("moe.down", MoeDown, MoeDown, None)),
        row(Slot::VisionPatchEmbed, tower("vision.patch_embed", PatchEmbed)),
        row(Slot::VisionAttention, tower("vision.attention", AttentionFull)),
        row(Slot::VisionMlp, tower("vision.mlp", Linear)),
        row(Slot::VisionNorm, tower("vision.norm", LayerNorm)),
        row(Slot::VisionResidualNorm, tower("vision.residual_norm", ResidualLayerNorm)),
        row(Slot::VisionPool, tower("vision.pool", AvgPool)),
        row(Slot::Projector, tower("vision.projector", Gemm)),
    ]
};

impl Serialize for Slot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

pub fn ser_kernel<S: Serializer>(k: &&'static KernelDef, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.id)
}

/// A variant: a kernel with its parameters.
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    #[serde(serialize_with = "ser_kernel")]
    pub kernel: &'static KernelDef,
    pub params: Params,
}

/// Two choices are the same variant: the same kernel with the same parameters.
impl PartialEq for Choice {
    fn eq(&self, other: &Choice) -> bool {
        self.kernel.id == other.kernel.id && self.params == other.params
    }
}

impl Choice {
    pub fn new(kernel: &'static KernelDef, params: Params) -> Choice {
        Choice { kernel, params }
    }
    pub fn default_of(kernel: &'static KernelDef) -> Choice {
        Choice { kernel, params: kernel.default_params() }
    }
}

/// Key of an explicit choice.
pub type SlotKey = (Slot, Regime);

/// Choices for a range of layers (inclusive).
#[derive(Clone, Debug)]
pub struct LayerOverride {
    pub first: usize,
    pub last: usize,
    pub slots: BTreeMap<SlotKey, Choice>,
}

/// Kernel selection for a device: explicit choices (from a profile or the tuner),
/// per-layer overrides, and the runtime's defaults for everything else.
/// Immutable once built: what a choice had to fall back from comes back with the
/// choice ([`Selection::choose`]) and stays with the compiled step.
#[derive(Clone, Debug)]
pub struct Selection {
    pub device: DeviceCaps,
    pub slots: BTreeMap<SlotKey, Choice>,
    /// Choices for matrices in another storage type than the plan's weight type
    /// (a file's mixed block formats): tried first for a problem of that type.
    pub formats: BTreeMap<(DType, SlotKey), Choice>,
    pub layers: Vec<LayerOverride>,
    /// Defaults for CPU projections on block-format weights: int8 activation
    /// blocks (llama.cpp's q8 activations, about 0.5% error) with the four-row
    /// pass where the format has it, instead of f32 activations (exact against the
    /// dequantized weights). On in [`Selection::runtime`], what `run` and `bench`
    /// use without a profile (the choice the tuner makes on every CPU measured);
    /// off in [`Selection::defaults`], the exact reference tests compare with.
    pub int8_activations: bool,
    /// Choices for decode batches (`serve --parallel`), by the least batch size
    /// each serves (a profile's `serve.batches`, tuned by `tune --serve-batches`):
    /// a batch of `rows` sequences takes the table of the largest size not above
    /// `rows`, and a slot that table leaves out takes the choices above.
    pub batches: BTreeMap<usize, SlotChoices>,
    /// The fewest sequences decoded in one batch pass; fewer decode one at a
    /// time, each through the decode's own kernels (a profile's
    /// `serve.minBatch`: where B lone GEMV steps beat one GEMM pass). At least 2.
    pub min_batch: usize,
}

/// The most rows of a decode batch's pass that take the batched decode dots
/// over X8 records by default ([`Selection::x8_choice`]) where the int8
/// GEMM has its SIMD tiles (AVX-512 VNNI): on a 2-core EPYC (Zen 4,
/// SmolLM2-135M Q4_0) they decode 2 to 6 sequences 6–59% faster than the int8
/// GEMM over its kept panels, 8 as fast, 10 and more slower.
pub const X8_BATCH_ROWS: usize = 8;

/// The most rows of a decode pass over `format`'s X8 records that take the
/// batched decode dots by default on a CPU that lists AMX-INT8 (a Sapphire
/// Rapids-class Xeon core: 512-bit integer multiplies at full width on two
/// ports, where Zen 4 splits them in two), whose int8 GEMM tiles (512 bits
/// wide) outrun the dots' 256-bit lanes sooner: Q4_0 and Q8_0 from 3 rows,
/// IQ4_NL from 6 (its GEMM unpacks the table's levels into the panel, its dots
/// take them with one `vpshufb`). These round the activations per 32 in both.
/// The K-quants keep [`X8_BATCH_ROWS`]: their dots round the activations per
/// 256, as their lone decode does, the GEMM per 32 (with Q6_K's batches of 4
/// through the GEMM, where it is faster, a sequence of the Q4_K_M fixture
/// parted from its lone answer). On a 2-core Xeon of family 6 model 207
/// (`batch_gemm`, SmolLM2-135M's matrices, ms a step, two runs, the GEMM
/// against the dots): Q4_0 at 3 and 8 rows 4.38–4.50 and 6.82–6.85 against
/// 4.72–4.73 and 8.30–8.42, Q8_0 6.49–6.58 and 9.18–9.42 against 7.15–7.57 and
/// 11.59–11.65 (2 rows: a tie); IQ4_NL at 5 and 6 rows 8.55–10.03 and
/// 8.88–9.20 against 7.88–7.93 and 9.26–9.92, at 3 rows 6.94–7.24 against
/// 4.92–5.34 (docs/serve.md).
fn x8_batch_rows_wide(format: kernels::quant::QFormat) -> usize {
    use kernels::quant::QFormat;
    match format {
        QFormat::Q4_0 | QFormat::Q8_0 => 2,
        QFormat::IQ4_NL => 5,
        _ => X8_BATCH_ROWS,
    }
}

/// The most rows of a decode batch's pass over `dtype`'s X8 records that take
/// the batched decode dots by default on this CPU: [`X8_BATCH_ROWS`] where
/// the int8 GEMM has its SIMD tiles (fewer for some formats on a CPU that lists
/// AMX-INT8: `x8_batch_rows_wide`), every pass elsewhere. Without them (AVX2
/// alone) a pass of more rows would take the f32 panel GEMM, which
/// dequantizes its weights every pass for a few tokens: on a 2-core EPYC 7001 (Zen 1, AVX2 only; SmolLM2-135M Q4_0,
/// `batch_decode_timing`) 16 sequences decoded 30.6 tok/s through it against
/// 174.5 through the dots (8: 168.3), and 32 sequences 61.4 against 154.9;
/// there a decode pass takes the dots over plain rows too (docs/serve.md).
pub fn x8_batch_rows(dtype: DType) -> usize {
    if !kernels::cpu::qgemm::i8_gemm_simd(Isa::best()) {
        return usize::MAX;
    }
    match dtype.quant() {
        Some(f) if kernels::cpu::features().amx_int8 => x8_batch_rows_wide(f),
        _ => X8_BATCH_ROWS,
    }
}

/// One kernel step of a pass, as [`Selection::pass_choice`] chooses for it.
#[derive(Clone, Copy)]
pub struct PassStep<'a> {
    /// The sequences of a decode batch (None: a lone sequence's pass).
    pub batch: Option<usize>,
    pub key: SlotKey,
    pub layer: Option<usize>,
    pub problem: &'a Problem,
    pub dtype: DType,
    /// A pass of decode tokens only (no prompt's chunk).
    pub decode_only: bool,
    /// The engine keeps the step's weight in X8 records.
    pub x8: bool,
}

/// Kernel choices as a selection holds them: by slot, and by (format, slot)
/// for a file's other matrix formats ([`Selection::slots`],
/// [`Selection::formats`]); a race's winners, one batch size's table
/// ([`Selection::batches`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlotChoices {
    pub slots: BTreeMap<SlotKey, Choice>,
    pub formats: BTreeMap<(DType, SlotKey), Choice>,
}

impl SlotChoices {
    /// `c` for `key` in storage type `dtype`: by (format, slot) when `dtype` is
    /// one of a file's other matrix formats (`extra`), else by slot.
    pub fn insert(&mut self, dtype: DType, key: SlotKey, c: Choice, extra: &std::collections::BTreeSet<DType>) {
        if extra.contains(&dtype) {
            self.formats.insert((dtype, key), c);
        } else {
            self.slots.insert(key, c);
        }
    }

    /// Whether no slot has a choice here.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.formats.is_empty()
    }
}

impl Selection {
    /// Runtime defaults only.
    pub fn defaults(device: DeviceCaps) -> Selection {
        Selection {
            device,
            slots: BTreeMap::new(),
            formats: BTreeMap::new(),
            layers: Vec::new(),
            int8_activations: false,
            batches: BTreeMap::new(),
            min_batch: 2,
        }
    }

    /// The sequences a server runs at once by this selection's batch sizes:
    /// the largest size with a table, or below `min_batch` (tuned: lone steps
    /// won there); 1 without either (`serve` without `--parallel`).
    pub fn serve_rows(&self) -> usize {
        let tabled = self.batches.keys().max().copied().unwrap_or(1);
        tabled.max(self.min_batch.saturating_sub(1)).max(1)
    }

    /// The choice for `key` in a decode batch of `rows` sequences that the
    /// batch tables ([`Selection::batches`]) make and that can run `problem`
    /// (None: the regime's own choice serves).
    pub fn batch_choice(&self, rows: usize, key: SlotKey, problem: &Problem, dtype: DType) -> Option<Choice> {
        let (_, table) = self.batches.range(..=rows).next_back()?;
        let c = table.formats.get(&(dtype, key)).or_else(|| table.slots.get(&key))?;
        self.runs(c, problem, dtype).then(|| c.clone())
    }

    /// Whether `c` is a kernel of `problem`'s op that can run it here.
    fn runs(&self, c: &Choice, problem: &Problem, dtype: DType) -> bool {
        c.kernel.op == problem.op() && c.kernel.check(self.device.caps(), problem, dtype, &c.params).is_ok()
    }

    /// The kernel of a block-format matrix on the CPU, where no batch table
    /// names one, in a pass of decode tokens only (`decode_only`) or with a
    /// prompt's rows; `x8`: the engine keeps the matrix in X8 records. The
    /// batched decode dots (`gemm_q_dots_cpu`, `gate_up_q_dots_cpu`), which
    /// read each weight row once for a few tokens and give each token its lone
    /// decode's values, bit for bit: for a decode pass of up to
    /// [`x8_batch_rows`] rows over X8 records; where the int8 GEMM has no SIMD
    /// tiles (AVX2 alone), for every pass over a block format, in X8 records
    /// or plain rows (Q4_1, Q5_K, ..., which have no X8 layout, or formats not
    /// repacked): a decode pass of any rows, and with the runtime's int8
    /// activations a prompt's rows (whole or in chunks) where this selection
    /// does not choose for the slot. The f32
    /// panel GEMM there dequantizes every weight every pass and sums in
    /// another order; through the dots a prompt gets the decode's arithmetic
    /// however it is cut (its activations rounded per block as llama.cpp's:
    /// per 32, per 256 for the K-quants). None otherwise (the regime's own
    /// choice serves). Measured in docs/serve.md.
    pub fn x8_choice(
        &self,
        key: SlotKey,
        layer: Option<usize>,
        problem: &Problem,
        dtype: DType,
        decode_only: bool,
        x8: bool,
    ) -> Option<Choice> {
        let decode = decode_only && (x8 || self.no_int8_tiles(dtype));
        let prompt = self.no_int8_tiles(dtype) && self.int8_activations && !self.chooses(key, layer, problem, dtype);
        if !decode && !prompt {
            return None;
        }
        let id = match *problem {
            Problem::Gemm { m, .. } if m <= x8_batch_rows(dtype) => "gemm_q_dots_cpu",
            Problem::GateUp { rows, .. } if rows <= x8_batch_rows(dtype) => "gate_up_q_dots_cpu",
            _ => return None,
        };
        self.default_choice_of(id, problem, dtype)
    }

    /// The kernel of a mixture's block-format experts on a CPU whose int8 GEMM
    /// has no SIMD tiles (AVX2 alone), where no batch table names one and this
    /// selection does not choose for the slot: the gathered kernel
    /// (`moe_gate_up_cpu`, `moe_down_cpu`) with the runtime's int8 activations
    /// for a pass of any rows, as a lone decode token takes it. Each token then
    /// gets its lone decode's arithmetic in a decode batch, a prompt's chunk or
    /// a whole prompt; the grouped kernel there would be the f32 one, which
    /// dequantizes every expert it reads into f32 panels every pass and sums in
    /// another order (a batch's ids parted from the lone decode's). None
    /// otherwise (the regime's own choice serves). Measured in docs/serve.md.
    pub fn experts_choice(&self, key: SlotKey, layer: Option<usize>, problem: &Problem, dtype: DType) -> Option<Choice> {
        let id = match *problem {
            Problem::MoeGateUp { rows, .. } if rows > 1 => "moe_gate_up_cpu",
            Problem::MoeDown { rows, .. } if rows > 1 => "moe_down_cpu",
            _ => return None,
        };
        if !self.no_int8_tiles(dtype) || !self.int8_activations || self.chooses(key, layer, problem, dtype) {
            return None;
        }
        self.default_choice_of(id, problem, dtype)
    }

    /// Whether a `dtype` matrix on this device is a block format on a CPU
    /// whose int8 GEMM has no SIMD tiles (AVX2 alone): there every pass over it
    /// takes the decode's kernels by default ([`Selection::x8_choice`],
    /// [`Selection::experts_choice`]).
    fn no_int8_tiles(&self, dtype: DType) -> bool {
        matches!(self.device, DeviceCaps::Cpu(_)) && dtype.is_quant() && !kernels::cpu::qgemm::i8_gemm_simd(Isa::best())
    }

    /// `id` with the first of its default parameter sets that runs `problem`.
    fn default_choice_of(&self, id: &str, problem: &Problem, dtype: DType) -> Option<Choice> {
        let k = kernels::find(id).ok()?;
        let caps = self.device.caps();
        self.default_params(k, dtype).into_iter().find(|p| k.check(caps, problem, dtype, p).is_ok()).map(|p| Choice::new(k, p))
    }

    /// Whether a choice of this selection's own (by format, by layer or by slot)
    /// serves `problem` at `key`, rather than the runtime's default.
    fn chooses(&self, key: SlotKey, layer: Option<usize>, problem: &Problem, dtype: DType) -> bool {
        let runs = |c: &&Choice| self.runs(c, problem, dtype);
        self.formats.get(&(dtype, key)).filter(runs).is_some() || self.explicit(key, layer).filter(runs).is_some()
    }

    /// The runtime's defaults as `run` and `bench` use them: [`Selection::defaults`]
    /// with int8 activations for CPU projections on block-format weights.
    pub fn runtime(device: DeviceCaps) -> Selection {
        let int8 = matches!(device, DeviceCaps::Cpu(_));
        Selection { int8_activations: int8, ..Selection::defaults(device) }
    }

    /// The parameter sets a default choice of `k` tries, best first: with
    /// `int8_activations`, `act_bits 8` (and `rows_per_pass 4` on a CPU without
    /// AVX-512 VNNI) on block formats, then the kernel's own defaults; where
    /// AMX runs, each first with `amx 2` (the int8 GEMMs' AMX tiles where
    /// they pay: [`kernels::cpu::qgemm::AMX_TOKENS`]).
    fn default_params(&self, k: &KernelDef, dtype: DType) -> Vec<Params> {
        let base = k.default_params();
        // A kernel that only has int8 activations is not a default of the exact
        // selection.
        if !self.int8_activations && dtype.is_quant() && base.get("act_bits") == Some(&8) {
            return Vec::new();
        }
        // Each set as the values it sets over the kernel's defaults.
        let mut sets: Vec<Vec<(&str, u32)>> = Vec::new();
        if self.int8_activations && dtype.is_quant() && base.contains_key("act_bits") {
            // The four-row pass won on AVX2 (q4_1 +38% single-threaded); with
            // AVX-512 VNNI one row a pass wins end to end (SmolLM2-135M decode on a
            // 2-core EPYC: Q4_0 +13%, Q4_1 +12%, Q8_0 +19% with `rows_per_pass 1`).
            if base.contains_key("rows_per_pass") && !Isa::best().vnni() {
                sets.push(vec![("act_bits", 8), ("rows_per_pass", 4)]);
            }
            sets.push(vec![("act_bits", 8)]);
        }
        sets.push(Vec::new());
        // Where AMX runs, the int8 GEMMs' AMX tiles where they pay (`amx` 2:
        // Q4_K's and Q4_1's panels of long rows from 14 tokens, the VNNI tiles
        // elsewhere; the same bits), each set first with them.
        if base.contains_key("amx") && kernels::cpu::qgemm::amx_granted() {
            sets = sets.into_iter().flat_map(|s| [[&s[..], &[("amx", 2)]].concat(), s]).collect();
        }
        sets.iter().map(|s| k.params_with(s)).collect()
    }

    fn explicit(&self, key: SlotKey, layer: Option<usize>) -> Option<&Choice> {
        if let Some(l) = layer {
            for o in self.layers.iter().rev() {
                if (o.first..=o.last).contains(&l)
                    && let Some(c) = o.slots.get(&key)
                {
                    return Some(c);
                }
            }
        }
        self.slots.get(&key)
    }

    /// The kernel of step `s` of a pass: in a decode batch the batch tables'
    /// choice ([`Selection::batch_choice`]), then, on the CPU, the batched dots
    /// of a pass of decode tokens only ([`Selection::x8_choice`]) and a
    /// mixture's gathered kernels ([`Selection::experts_choice`]), else the
    /// regime's own choice ([`Selection::choose_noting`], with its warning).
    pub fn pass_choice(&self, s: &PassStep<'_>) -> Result<(Choice, Option<String>), PlanError> {
        let PassStep { batch, key, layer, problem, dtype, decode_only, x8 } = *s;
        let table = batch.and_then(|rows| self.batch_choice(rows, key, problem, dtype));
        let x8 = || self.x8_choice(key, layer, problem, dtype, decode_only, x8);
        let experts = || self.experts_choice(key, layer, problem, dtype);
        match table.or_else(x8).or_else(experts) {
            Some(c) => Ok((c, None)),
            None => self.choose_noting(key.0, key.1, layer, problem, dtype),
        }
    }

    /// The variant serving `slot` for `problem`: the explicit choice when it can run
    /// the problem, else the default (with a warning when an explicit one was set).
    pub fn choose(&self, slot: Slot, regime: Regime, layer: Option<usize>, problem: &Problem, dtype: DType) -> Result<Choice, PlanError> {
        self.choose_noting(slot, regime, layer, problem, dtype).map(|(c, _)| c)
    }

    /// [`Selection::choose`], with the warning when an explicit choice could not
    /// run the problem and the default serves instead.
    pub fn choose_noting(
        &self,
        slot: Slot,
        regime: Regime,
        layer: Option<usize>,
        problem: &Problem,
        dtype: DType,
    ) -> Result<(Choice, Option<String>), PlanError> {
        let want = problem.op();
        if let Some(c) = self.formats.get(&(dtype, (slot, regime))).filter(|c| self.runs(c, problem, dtype)) {
            return Ok((c.clone(), None));
        }
        // An explicit choice of another op (a GEMV chosen for lm_head, whose prefill
        // pass is a GEMM when every position's logits are wanted) does not apply.
        let mut warning = None;
        if let Some(c) = self.explicit((slot, regime), layer).filter(|c| c.kernel.op == want) {
            match c.kernel.check(self.device.caps(), problem, dtype, &c.params) {
                Ok(()) => return Ok((c.clone(), None)),
                Err(why) => {
                    warning = Some(format!(
                        "slot `{slot}` layer {}: `{}` cannot run {} ({why}); using the default",
                        layer.map_or("-".to_string(), |l| l.to_string()),
                        c.kernel.id,
                        problem.describe()
                    ));
                }
            }
        }
        Ok((self.default_choice(slot, regime, problem, dtype)?, warning))
    }

    /// The runtime's own pick: preferred kernels first, then the rest of the op's
    /// kernels for this backend, each with default parameters, then any parameters.
    pub fn default_choice(&self, slot: Slot, regime: Regime, problem: &Problem, dtype: DType) -> Result<Choice, PlanError> {
        let op = problem.op();
        let backend = self.device.backend();
        let caps = self.device.caps();
        let mut cands: Vec<&'static KernelDef> =
            preferred_on(problem, &self.device).iter().filter_map(|id| kernels::find(id).ok()).filter(|k| k.op == op).collect();
        for k in kernels::for_op(op).filter(|k| k.backend() == backend) {
            if !cands.iter().any(|c| c.id == k.id) {
                cands.push(k);
            }
        }
        let mut last_why = format!("no {} kernel computes {op}", backend.name());
        for k in &cands {
            for params in self.default_params(k, dtype) {
                match k.check(caps, problem, dtype, &params) {
                    Ok(()) => return Ok(Choice::new(k, params)),
                    Err(why) => last_why = format!("{}: {why}", k.id),
                }
            }
        }
        for k in &cands {
            if let Some(params) = k.all_params().into_iter().find(|p| k.check(caps, problem, dtype, p).is_ok()) {
                return Ok(Choice::new(k, params));
            }
        }
        Err(PlanError::NoKernel {
            slot: slot.name().into(),
            regime: regime.name(),
            backend: backend.name(),
            problem: format!("{} ({dtype})", problem.describe()),
            why: last_why,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GpuCaps;
    use crate::kernels::Caps;

    /// Without a profile, a hardware GPU gets the attention kernels measured
    /// fastest on one (stream decode, flash2 prefill) and a software adapter
    /// lavapipe's (the subgroup variants); where the first cannot run the shape,
    /// the next serves.
    #[test]
    fn default_attention_follows_the_kind_of_gpu() {
        // The H200's limits (Vulkan); lavapipe's differ, but only the kind matters here.
        let hw = GpuCaps {
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            max_workgroup_storage: 49152,
            max_invocations_per_workgroup: 1024,
            max_workgroup_size: [1024, 1024, 64],
            ..crate::testing::typical_gpu_caps()
        };
        let sw = GpuCaps { software: true, ..hw.clone() };
        let decode = Problem::AttentionDecode { kv_len: 300, kv_cap: 1024, heads: 32, kv_heads: 8, head_dim: 64, window: 0, scale: 0.125 };
        let prefill = Problem::AttentionPrefill {
            tokens: 64,
            kv_len: 64,
            kv_cap: 1024,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            window: 0,
            scale: 0.125,
            bidi_start: 0,
            bidi_end: 0,
        };
        let pick = |caps: &GpuCaps, p: &Problem, slot: Slot, regime: Regime| {
            Selection::runtime(DeviceCaps::Gpu(caps.clone())).default_choice(slot, regime, p, DType::F32).expect("a kernel").kernel.id
        };
        assert_eq!(pick(&hw, &decode, Slot::AttentionDecode, Regime::Decode), "attention_decode_stream");
        assert_eq!(pick(&sw, &decode, Slot::AttentionDecode, Regime::Decode), "attention_decode_splitkv_sg");
        assert_eq!(pick(&hw, &prefill, Slot::AttentionPrefill, Regime::Prefill), "attention_prefill_flash2");
        assert_eq!(pick(&sw, &prefill, Slot::AttentionPrefill, Regime::Prefill), "attention_prefill_flash2_sg");
        // A head wider than stream's largest workgroup: another kernel serves.
        let wide = Problem::AttentionDecode { kv_len: 30, kv_cap: 64, heads: 2, kv_heads: 2, head_dim: 2048, window: 0, scale: 0.1 };
        let k = crate::kernels::find("attention_decode_stream").expect("registered");
        assert!(k.check(Caps::Gpu(&hw), &wide, DType::F32, &k.default_params()).is_err());
        let serving =
            Selection::runtime(DeviceCaps::Gpu(hw.clone())).default_choice(Slot::AttentionDecode, Regime::Decode, &wide, DType::F32);
        assert!(serving.is_ok_and(|c| c.kernel.id != "attention_decode_stream"));
    }

    /// The slot table has a row per slot in [`Slot`]'s order with ops in the
    /// regimes the slot has (none for the untuned KV write), and each fusion
    /// choice has its one slot (no slot names an unknown fusion).
    /// A CPU's default int8 GEMM takes AMX's tiles where they pay (`amx` 2)
    /// where AMX runs, the VNNI tiles (`amx` 0) elsewhere; the float formats
    /// are not its to take.
    #[test]
    fn the_default_int8_gemm_takes_amx_where_it_runs() {
        let sel = Selection::runtime(DeviceCaps::Cpu(crate::device::CpuCaps::detect()));
        let p = Problem::Gemm { m: 16, n: 64, k: 256 };
        let c = sel.default_choice(Slot::MatmulO, Regime::Prefill, &p, DType::from(kernels::quant::QFormat::Q4_K)).expect("a kernel");
        if !kernels::cpu::qgemm::i8_gemm_simd(Isa::best()) {
            eprintln!("the_default_int8_gemm_takes_amx_where_it_runs: no AVX-512 VNNI here, no int8 GEMM by default ({})", c.kernel.id);
            return;
        }
        assert_eq!(c.kernel.id, "gemm_q_i8_cpu");
        let amx = kernels::cpu::qgemm::amx_granted();
        assert_eq!(c.params.get("amx"), Some(&if amx { 2 } else { 0 }), "AMX granted: {amx}");
        let f = sel.default_choice(Slot::MatmulO, Regime::Prefill, &p, DType::F32).expect("a kernel");
        assert!(!f.params.contains_key("amx"), "{}", f.kernel.id);
    }

    #[test]
    fn the_slot_table_has_every_slot_in_order_and_each_fusion_its_slot() {
        use crate::plan::Fusion;
        assert_eq!(SLOTS.len(), Slot::ALL.len());
        for (d, &s) in SLOTS.iter().zip(Slot::ALL) {
            assert_eq!(d.slot, s);
            for r in [Regime::Prefill, Regime::Decode, Regime::Vision] {
                assert_eq!(s.op(r).is_some(), s.regimes().contains(&r) && d.entry.is_some(), "{s} {r:?}");
            }
        }
        for f in &Fusion::FLAGS {
            assert_eq!(SLOTS.iter().filter(|d| d.fusion == Some(f.name)).count(), 1, "{}", f.name);
        }
        assert!(SLOTS.iter().all(|d| d.fusion.is_none_or(|n| Fusion::flag(n).is_some())));
    }

    /// The profile keys, in declaration order: renaming a variant must not change
    /// what profiles and reports spell.
    #[test]
    fn slot_names_are_the_profile_keys_and_parse_back() {
        let names: Vec<&str> = Slot::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "attention.prefill",
                "attention.decode",
                "matmul.qkv_proj",
                "matmul.o_proj",
                "matmul.gate_up",
                "matmul.down_proj",
                "matmul.lm_head",
                "norm",
                "rope",
                "activation",
                "residual",
                "fused.qkv_proj",
                "fused.gate_up",
                "fused.qk_norm_rope",
                "fused.residual_norm",
                "fused.norm_matmul",
                "kv_write",
                "fused.qkv_rope_cache",
                "matmul.router",
                "moe.route",
                "moe.gate_up",
                "moe.down",
                "vision.patch_embed",
                "vision.attention",
                "vision.mlp",
                "vision.norm",
                "vision.residual_norm",
                "vision.pool",
                "projector",
            ]
        );
        for &s in Slot::ALL {
            assert_eq!(Slot::from_name(s.name()), Some(s));
            assert_eq!(s.to_string(), s.name());
            assert_eq!(serde_json::to_string(&s).expect("serializes"), format!("\"{}\"", s.name()));
        }
        assert_eq!(Slot::from_name("matmul"), None);
    }
}
