//! Op problems: the shapes an op is asked to compute, the buffers it binds (ids,
//! roles, symbolic shapes) and the test shapes the parity check runs.
//!
//! Buffer conventions shared by every kernel of an op, CPU and WGSL alike:
//! - buffers are listed in binding order: inputs (role input/weight/cache) first,
//!   then outputs; WGSL binds them at `@group(0) @binding(i)` in this order and
//!   its uniform block right after the last one;
//! - activations are always f32; buffers with role `weight` or `cache` are stored
//!   in the variant's dtype (f32 or f16) and accumulated in f32;
//! - row-major everywhere; the KV cache is head-major `[kv_heads, kv_cap, head_dim]`.

use serde::Serialize;

use super::quant::{DType, QFormat, RowFormats};

/// What a buffer is for (its `role`): decides its dtype and how the
/// runtime lays it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Input,
    Weight,
    Cache,
    Output,
}

/// One buffer an op binds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BufSpec {
    pub id: &'static str,
    pub role: Role,
    /// Symbolic shape, e.g. `["tokens", "hidden"]`.
    pub dims: Vec<&'static str>,
    /// Concrete shape for this problem.
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl BufSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn is_output(&self) -> bool {
        self.role == Role::Output
    }
    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.len())
    }
}

/// Gated activation used by the MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `silu(gate) * up` (Llama, Qwen, SmolLM2).
    Silu,
    /// `gelu_tanh(gate) * up` (Gemma).
    GeluTanh,
}

impl Activation {
    pub fn code(self) -> u32 {
        match self {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
        }
    }
    /// f64 reference of the activation alone.
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
        }
    }
}

/// The residual a [`Problem::NormGemv`] prologue adds to its input before the norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormResidual {
    /// No residual: the input is `x`.
    None,
    /// `x + r`.
    Add,
    /// `x + rmsnorm(r) * g_r` (a norm of the branch before the add: Gemma 3).
    Normed,
}

impl NormResidual {
    pub fn is_none(&self) -> bool {
        *self == NormResidual::None
    }
    /// The code the WGSL kernels read (0, 1, 2).
    pub fn code(self) -> u32 {
        match self {
            NormResidual::None => 0,
            NormResidual::Add => 1,
            NormResidual::Normed => 2,
        }
    }
}

/// Where the rotary pairs live inside a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeLayout {
    /// Hugging Face "rotate half": pair (i, i + rot/2).
    Half,
    /// GPT-J / GGUF interleaved: pair (2i, 2i + 1).
    Interleaved,
}

impl RopeLayout {
    pub fn code(self) -> u32 {
        match self {
            RopeLayout::Half => 0,
            RopeLayout::Interleaved => 1,
        }
    }
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// Keys `[lo, hi)` the query at absolute position `pos` sees: `(pos - window, pos]`
/// (every key up to `pos` when `window == 0`), widened to the whole bidirectional
/// block `[bidi.0, bidi.1)` when `pos` lies in it (transformers' causal or sliding
/// mask OR'ed with the same-image mask). The bounds never decrease with `pos`.
pub fn attention_keys(pos: usize, window: usize, bidi: (usize, usize)) -> (usize, usize) {
    let lo = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
    if pos >= bidi.0 && pos < bidi.1 { (lo.min(bidi.0), bidi.1) } else { (lo, pos + 1) }
}

/// One problem for one op. Field docs give the buffers; see [`Problem::buffers`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Problem {
    /// `y[m,n] = x[m,k] · w[n,k]ᵀ` (a Hugging Face Linear without bias).
    Gemm { m: usize, n: usize, k: usize },
    /// `y[n] = w[n,k] · x[k]`.
    Gemv { n: usize, k: usize },
    /// Causal grouped-query attention for `tokens` new queries at absolute
    /// positions `kv_len - tokens ..kv_len`. `q[tokens,heads,head_dim]`,
    /// `k_cache`/`v_cache[kv_heads,kv_cap,head_dim]` (cache dtype), `out[tokens,heads,head_dim]`.
    /// `window > 0`: query at position p sees keys in `(p - window, p]`.
    /// `bidi_start < bidi_end`: a block of positions attended bidirectionally (Gemma
    /// 3's image tokens with the processor's `token_type_ids`): a query inside it
    /// also sees every key of the block, later ones included; the block lies within
    /// this call's tokens. Equal (0, 0): plain causal attention (not serialized, so
    /// text-only problems read as before). See [`attention_keys`].
    AttentionPrefill {
        tokens: usize,
        kv_len: usize,
        kv_cap: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        window: usize,
        scale: f32,
        #[serde(skip_serializing_if = "is_zero")]
        bidi_start: usize,
        #[serde(skip_serializing_if = "is_zero")]
        bidi_end: usize,
    },
    /// One query at position `kv_len - 1`. `q[heads,head_dim]`, caches as above,
    /// `out[heads,head_dim]`.
    AttentionDecode { kv_len: usize, kv_cap: usize, heads: usize, kv_heads: usize, head_dim: usize, window: usize, scale: f32 },
    /// Causal grouped-query attention of a batch of `seqs` sequences over one
    /// paged KV cache: a pool of `blocks` blocks, each `page` positions of every
    /// KV head (`k_pool`/`v_pool[blocks,kv_heads,page,head_dim]`, cache dtype),
    /// and per sequence a row of `pages[seqs, 2 + max_blocks]` (f32 holding whole
    /// numbers, exact below 2^24): its query count `q_len`, its KV length
    /// `kv_len`, then the pool block of each `page` positions in order (position
    /// `j` at row `j % page` of block `pages[2 + j / page]`; blocks may be shared
    /// between sequences, entries past `kv_len` are never read). Sequence `s`'s
    /// queries are the next `q_len` rows of `q[tokens,heads,head_dim]` (the
    /// `q_len` sum to `tokens`), at positions `kv_len - q_len ..kv_len`, each
    /// seeing keys as [`attention_keys`] says (no bidirectional block); a decode
    /// token is a sequence with `q_len = 1`, a prefill chunk one with more.
    /// `out[tokens,heads,head_dim]`.
    AttentionPaged {
        seqs: usize,
        tokens: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        page: usize,
        blocks: usize,
        max_blocks: usize,
        window: usize,
        scale: f32,
    },
    /// `y = x / sqrt(mean(x²) + eps) * w` (or `* (1 + w)` when `unit_offset`, Gemma).
    /// `x[rows,dim]`, `w[dim]`, `y[rows,dim]`.
    RmsNorm { rows: usize, dim: usize, eps: f32, unit_offset: bool },
    /// `y = (x - mean) / sqrt(var + eps) * w + b`. `x[rows,dim]`, `w[dim]`, `b[dim]`, `y`.
    LayerNorm { rows: usize, dim: usize, eps: f32 },
    /// Rotary embedding of `x[tokens,heads,head_dim]` at positions `pos0..pos0+tokens`,
    /// rotating the first `2 * inv_freq.len()` dims of each head (the rest copied).
    /// `inv_freq[rot_dim/2]` (f32, llama3 scaling already applied, see `rope::inv_freq`).
    Rope { tokens: usize, heads: usize, head_dim: usize, rot_dim: usize, pos0: usize, layout: RopeLayout },
    /// `y = act(gate) * up`. `gate[rows,dim]`, `up[rows,dim]`, `y[rows,dim]`.
    GatedAct { rows: usize, dim: usize, act: Activation },
    /// Row softmax. `x[rows,dim]`, `y[rows,dim]`.
    Softmax { rows: usize, dim: usize },
    /// `y = a + b`. `a[n]`, `b[n]`, `y[n]`.
    ResidualAdd { n: usize },
    /// Fused per-head RMSNorm then RoPE (Gemma 3's q/k norm):
    /// `x[tokens,heads,head_dim]`, `w[head_dim]`, `inv_freq[rot_dim/2]`, `y[tokens,heads,head_dim]`.
    QkNormRope {
        tokens: usize,
        heads: usize,
        head_dim: usize,
        rot_dim: usize,
        pos0: usize,
        layout: RopeLayout,
        eps: f32,
        unit_offset: bool,
    },
    /// Fused gate+up projection with the activation product in the epilogue:
    /// `x[rows,k]`, `w[2n,k]` (gate rows `0..n`, up rows `n..2n`), `y[rows,n] = act(x·w_gᵀ) * (x·w_uᵀ)`.
    GateUp { rows: usize, n: usize, k: usize, act: Activation },
    /// Fused residual add + RMSNorm: `h = x + r`, `y = rmsnorm(h) * w` (or `(1 + w)`).
    /// `x[rows,dim]`, `r[rows,dim]`, `w[dim]`; outputs `h[rows,dim]`, `y[rows,dim]`.
    ResidualRmsNorm { rows: usize, dim: usize, eps: f32, unit_offset: bool },
    /// Fused residual add + LayerNorm with bias (a SigLIP encoder layer's residual
    /// and the norm that follows it): `h = x + r`, `y = (h - mean) / sqrt(var + eps) * w + b`.
    /// `x[rows,dim]`, `r[rows,dim]`, `w[dim]`, `b[dim]`; outputs `h[rows,dim]`, `y[rows,dim]`.
    ResidualLayerNorm { rows: usize, dim: usize, eps: f32 },
    /// Q, K and V of one token in one matrix-vector product over the concatenated
    /// weight `w[nq + 2 nkv, k]`, with an optional bias `b[nq + 2 nkv]` (Qwen):
    /// `x[k]` → `q[nq]`, `k_out[nkv]`, `v_out[nkv]`.
    QkvProj { k: usize, nq: usize, nkv: usize, bias: bool },
    /// Fused RMSNorm prologue + matrix-vector product (decode):
    /// `y[n] = w[n,k] · (x / sqrt(mean(x²) + eps) * g)` (or `* (1 + g)` when
    /// `unit_offset`, Gemma). `x[k]` (the residual stream), `g[k]` (the norm gain,
    /// stored as the plan stores norm gains: f32, or f16 with f16 weights), `w[n,k]`, `y[n]`.
    /// Since `y_r = inv_rms · Σ_c w[r,c] x[c] g[c]`, kernels need no extra pass over `w`.
    ///
    /// With a `residual` (the decoder's residual add folded into the prologue) the
    /// normalized vector is that of `x + r` (`Add`) or `x + rmsnorm(r) * g_r`
    /// (`Normed`: Gemma 3's post-attention / post-FFN norm, same eps and gain
    /// convention), written to the output `h[k]` (the next residual stream): inputs
    /// `x`, `r[k]`, (`g_r[k]`), `g`, `w`; outputs `y`, `h`. With `act` the weight is
    /// the fused gate/up `w[2n,k]` (gate rows `0..n`, up rows `n..2n`) and
    /// `y[n] = act(gate) * up`.
    NormGemv {
        n: usize,
        k: usize,
        eps: f32,
        unit_offset: bool,
        #[serde(skip_serializing_if = "NormResidual::is_none")]
        residual: NormResidual,
        #[serde(skip_serializing_if = "Option::is_none")]
        act: Option<Activation>,
        /// Per-operand formats: the weight is a stack of row blocks in different
        /// block formats (a fused Q/K/V or gate/up of a file that mixes them;
        /// the kernel's dtype is the first block's); None: all of `dtype`.
        #[serde(skip_serializing_if = "Option::is_none")]
        formats: Option<RowFormats>,
    },
    /// One decode token's fused Q/K/V row `qkv[heads + 2 kv_heads, head_dim]` (q heads,
    /// then k heads, then v heads, as the fused QKV projection writes them) split,
    /// q and k per-head RMS-normed when `norm` (Gemma 3's q/k norm: gains `q_norm`,
    /// `k_norm[head_dim]` stored as `gain`, f32 or f16) and rotated at position `pos0`,
    /// the rotated q into `q[heads, head_dim]` and k and v into row `pos0` of the
    /// head-major caches `k_cache`, `v_cache[kv_heads, kv_cap, head_dim]` (the
    /// variant's dtype, f32 or f16; other rows untouched). Buffers: `qkv`, (`q_norm`,
    /// `k_norm` when `norm`), `inv_freq[rot_dim/2]`; outputs `q`, `k_cache`, `v_cache`.
    QkvRopeCache {
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        rot_dim: usize,
        pos0: usize,
        kv_cap: usize,
        layout: RopeLayout,
        norm: bool,
        eps: f32,
        unit_offset: bool,
        gain: DType,
    },
    /// Patch embedding of a vision tower: a 2-D convolution with kernel = stride =
    /// `patch`, no padding (SigLIP's `Conv2d(channels, hidden, patch, patch)`).
    /// `pixels[channels, image, image]`, `w[hidden, channels * patch * patch]` (the
    /// conv weight `[hidden, channels, patch, patch]` flattened), `b[hidden]`;
    /// `y[patches, hidden]` with patches row-major over the `(image / patch)²` grid.
    PatchEmbed { channels: usize, image: usize, patch: usize, hidden: usize },
    /// A Hugging Face Linear with bias, optionally followed by GELU (tanh):
    /// `y[m,n] = act(x[m,k] · w[n,k]ᵀ + b[n])`.
    Linear { m: usize, n: usize, k: usize, gelu: bool },
    /// Bidirectional (non-causal) multi-head attention over one sequence, every
    /// query seeing every key (a vision encoder): `q`, `k`, `v`, `out`
    /// `[tokens, heads, head_dim]`, all f32 activations.
    AttentionFull { tokens: usize, heads: usize, head_dim: usize, scale: f32 },
    /// Average pool of a square grid of tokens: `x[side * side, dim]` (row-major
    /// grid) to `y[(side / kernel)², dim]`, each output the mean of a `kernel x kernel`
    /// window with stride `kernel` (Gemma 3's `AvgPool2d` in the projector).
    AvgPool { side: usize, kernel: usize, dim: usize },
    /// A mixture-of-experts router's choice (Qwen3-MoE, OLMoE): `logits[rows, experts]`
    /// (the router projection's output) to the dense `route[rows, experts]`: each
    /// row's softmax over its experts, kept for its `top_k` largest (ties to the lower
    /// index) and 0 elsewhere, the kept ones divided by their sum when `norm`
    /// (`norm_topk_prob`). A row's experts are its nonzero entries; the expert
    /// kernels read the route, so nothing but floats crosses between them.
    MoeRoute { rows: usize, experts: usize, top_k: usize, norm: bool },
    /// The experts' gate and up projections with the activation product, each token
    /// through its own experts: `x[rows, k]`, `route[rows, experts]`, `w[2 experts n, k]`
    /// (every expert's gate rows `e n .. (e + 1) n`, then every expert's up rows from
    /// `experts n`: the file's gate and up tensors one after the other); slot `j` of
    /// row `t` is the `j`-th expert (ascending) with a nonzero route, and
    /// `h[t, j] = act(x_t · w_gate(e)ᵀ) * (x_t · w_up(e)ᵀ)`, zero for slots past the
    /// row's experts. `h[rows, top_k, n]`.
    MoeGateUp { rows: usize, experts: usize, top_k: usize, n: usize, k: usize, act: Activation },
    /// The experts' down projections summed with their route weights:
    /// `h[rows, top_k, k]` (as [`Problem::MoeGateUp`] writes it), `route[rows, experts]`,
    /// `w[experts n, k]`; `y[t] = Σ_j route[t, e_j] · (w(e_j) · h[t, j])`. `y[rows, n]`.
    MoeDown { rows: usize, experts: usize, top_k: usize, n: usize, k: usize },
}

/// The ops of the kernel set; one per [`Problem`] variant. Names (`gemm`,
/// `attention_prefill`, ...) come from the snake_case of the variant, for serde and
/// strum alike (display, parsing, iteration).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    strum::IntoStaticStr,
    strum::EnumIter,
    strum::EnumString,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Op {
    Gemm,
    Gemv,
    AttentionPrefill,
    AttentionDecode,
    AttentionPaged,
    RmsNorm,
    LayerNorm,
    Rope,
    GatedAct,
    Softmax,
    ResidualAdd,
    QkNormRope,
    GateUp,
    ResidualRmsNorm,
    QkvProj,
    NormGemv,
    PatchEmbed,
    Linear,
    AttentionFull,
    AvgPool,
    ResidualLayerNorm,
    QkvRopeCache,
    MoeRoute,
    MoeGateUp,
    MoeDown,
}

impl Op {
    pub const ALL: [Op; 25] = [
        Op::Gemm,
        Op::Gemv,
        Op::AttentionPrefill,
        Op::AttentionDecode,
        Op::AttentionPaged,
        Op::RmsNorm,
        Op::LayerNorm,
        Op::Rope,
        Op::GatedAct,
        Op::Softmax,
        Op::ResidualAdd,
        Op::QkNormRope,
        Op::GateUp,
        Op::ResidualRmsNorm,
        Op::QkvProj,
        Op::NormGemv,
        Op::PatchEmbed,
        Op::Linear,
        Op::AttentionFull,
        Op::AvgPool,
        Op::ResidualLayerNorm,
        Op::QkvRopeCache,
        Op::MoeRoute,
        Op::MoeGateUp,
        Op::MoeDown,
    ];

    /// Ops with CPU kernels only, which the checks that every op has WGSL kernels
    /// skip. Empty: the vision tower's ops (issue 16) have their WGSL kernels
    /// (`kernels::vision::wgsl`).
    pub const CPU_ONLY: [Op; 0] = [];

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Whether the op has WGSL kernels (every op but [`Op::CPU_ONLY`]).
    pub fn has_wgsl(self) -> bool {
        !Op::CPU_ONLY.contains(&self)
    }
}

fn b(id: &'static str, role: Role, dims: &[&'static str], shape: &[usize], dtype: DType) -> BufSpec {
    BufSpec { id, role, dims: dims.to_vec(), shape: shape.to_vec(), dtype }
}

impl Problem {
    /// A [`Problem::AttentionPaged`] of `seqs` sequences and `tokens` queries,
    /// `(heads, kv_heads, head_dim)`, a pool of `(page, blocks, max_blocks)`.
    pub fn attention_paged(
        (seqs, tokens): (usize, usize),
        (heads, kv_heads, head_dim): (usize, usize, usize),
        (page, blocks, max_blocks): (usize, usize, usize),
        window: usize,
        scale: f32,
    ) -> Problem {
        Problem::AttentionPaged { seqs, tokens, heads, kv_heads, head_dim, page, blocks, max_blocks, window, scale }
    }

    /// A plain [`Problem::NormGemv`]: no residual, no activation.
    pub fn norm_gemv(n: usize, k: usize, eps: f32, unit_offset: bool) -> Problem {
        Problem::NormGemv { n, k, eps, unit_offset, residual: NormResidual::None, act: None, formats: None }
    }

    /// The per-operand formats of the problem's weight, where it is a stack of row
    /// blocks in different block formats ([`Problem::NormGemv`]'s `formats`).
    pub fn formats(&self) -> Option<RowFormats> {
        match *self {
            Problem::NormGemv { formats, .. } => formats,
            _ => None,
        }
    }

    pub fn op(&self) -> Op {
        match self {
            Problem::Gemm { .. } => Op::Gemm,
            Problem::Gemv { .. } => Op::Gemv,
            Problem::AttentionPrefill { .. } => Op::AttentionPrefill,
            Problem::AttentionDecode { .. } => Op::AttentionDecode,
            Problem::AttentionPaged { .. } => Op::AttentionPaged,
            Problem::RmsNorm { .. } => Op::RmsNorm,
            Problem::LayerNorm { .. } => Op::LayerNorm,
            Problem::Rope { .. } => Op::Rope,
            Problem::GatedAct { .. } => Op::GatedAct,
            Problem::Softmax { .. } => Op::Softmax,
            Problem::ResidualAdd { .. } => Op::ResidualAdd,
            Problem::QkNormRope { .. } => Op::QkNormRope,
            Problem::GateUp { .. } => Op::GateUp,
            Problem::ResidualRmsNorm { .. } => Op::ResidualRmsNorm,
            Problem::QkvProj { .. } => Op::QkvProj,
            Problem::NormGemv { .. } => Op::NormGemv,
            Problem::PatchEmbed { .. } => Op::PatchEmbed,
            Problem::Linear { .. } => Op::Linear,
            Problem::AttentionFull { .. } => Op::AttentionFull,
            Problem::AvgPool { .. } => Op::AvgPool,
            Problem::ResidualLayerNorm { .. } => Op::ResidualLayerNorm,
            Problem::QkvRopeCache { .. } => Op::QkvRopeCache,
            Problem::MoeRoute { .. } => Op::MoeRoute,
            Problem::MoeGateUp { .. } => Op::MoeGateUp,
            Problem::MoeDown { .. } => Op::MoeDown,
        }
    }

    /// The buffers this problem binds, in binding order (inputs, then outputs).
    /// `dtype` is the storage type of `weight` and `cache` buffers.
    pub fn buffers(&self, dtype: DType) -> Vec<BufSpec> {
        use Role::*;
        let f = DType::F32;
        let d = dtype;
        match *self {
            Problem::Gemm { m, n, k } => vec![
                b("x", Input, &["m", "k"], &[m, k], f),
                b("w", Weight, &["n", "k"], &[n, k], d),
                b("y", Output, &["m", "n"], &[m, n], f),
            ],
            Problem::Gemv { n, k } => {
                vec![b("x", Input, &["k"], &[k], f), b("w", Weight, &["n", "k"], &[n, k], d), b("y", Output, &["n"], &[n], f)]
            }
            Problem::AttentionPrefill { tokens, kv_cap, heads, kv_heads, head_dim, .. } => vec![
                b("q", Input, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
                b("k_cache", Cache, &["kv_heads", "kv_cap", "head_dim"], &[kv_heads, kv_cap, head_dim], d),
                b("v_cache", Cache, &["kv_heads", "kv_cap", "head_dim"], &[kv_heads, kv_cap, head_dim], d),
                b("out", Output, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
            ],
            Problem::AttentionDecode { kv_cap, heads, kv_heads, head_dim, .. } => vec![
                b("q", Input, &["heads", "head_dim"], &[heads, head_dim], f),
                b("k_cache", Cache, &["kv_heads", "kv_cap", "head_dim"], &[kv_heads, kv_cap, head_dim], d),
                b("v_cache", Cache, &["kv_heads", "kv_cap", "head_dim"], &[kv_heads, kv_cap, head_dim], d),
                b("out", Output, &["heads", "head_dim"], &[heads, head_dim], f),
            ],
            Problem::AttentionPaged { seqs, tokens, heads, kv_heads, head_dim, page, blocks, max_blocks, .. } => {
                let pool = &["blocks", "kv_heads", "page", "head_dim"];
                vec![
                    b("q", Input, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
                    b("k_pool", Cache, pool, &[blocks, kv_heads, page, head_dim], d),
                    b("v_pool", Cache, pool, &[blocks, kv_heads, page, head_dim], d),
                    b("pages", Input, &["seqs", "2+max_blocks"], &[seqs, 2 + max_blocks], f),
                    b("out", Output, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
                ]
            }
            Problem::RmsNorm { rows, dim, .. } => vec![
                b("x", Input, &["rows", "dim"], &[rows, dim], f),
                b("w", Weight, &["dim"], &[dim], d),
                b("y", Output, &["rows", "dim"], &[rows, dim], f),
            ],
            Problem::LayerNorm { rows, dim, .. } => vec![
                b("x", Input, &["rows", "dim"], &[rows, dim], f),
                b("w", Weight, &["dim"], &[dim], d),
                b("b", Weight, &["dim"], &[dim], d),
                b("y", Output, &["rows", "dim"], &[rows, dim], f),
            ],
            Problem::Rope { tokens, heads, head_dim, rot_dim, .. } => vec![
                b("x", Input, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
                b("inv_freq", Input, &["rot_half"], &[rot_dim / 2], f),
                b("y", Output, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
            ],
            Problem::GatedAct { rows, dim, .. } => vec![
                b("gate", Input, &["rows", "dim"], &[rows, dim], f),
                b("up", Input, &["rows", "dim"], &[rows, dim], f),
                b("y", Output, &["rows", "dim"], &[rows, dim], f),
            ],
            Problem::Softmax { rows, dim } => {
                vec![b("x", Input, &["rows", "dim"], &[rows, dim], f), b("y", Output, &["rows", "dim"], &[rows, dim], f)]
            }
            Problem::ResidualAdd { n } => {
                vec![b("a", Input, &["n"], &[n], f), b("b", Input, &["n"], &[n], f), b("y", Output, &["n"], &[n], f)]
            }
            Problem::QkNormRope { tokens, heads, head_dim, rot_dim, .. } => vec![
                b("x", Input, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
                b("w", Weight, &["head_dim"], &[head_dim], d),
                b("inv_freq", Input, &["rot_half"], &[rot_dim / 2], f),
                b("y", Output, &["tokens", "heads", "head_dim"], &[tokens, heads, head_dim], f),
            ],
            Problem::GateUp { rows, n, k, .. } => vec![
                b("x", Input, &["rows", "k"], &[rows, k], f),
                b("w", Weight, &["2n", "k"], &[2 * n, k], d),
                b("y", Output, &["rows", "n"], &[rows, n], f),
            ],
            Problem::ResidualRmsNorm { rows, dim, .. } => vec![
                b("x", Input, &["rows", "dim"], &[rows, dim], f),
                b("r", Input, &["rows", "dim"], &[rows, dim], f),
                b("w", Weight, &["dim"], &[dim], d),
                b("h", Output, &["rows", "dim"], &[rows, dim], f),
                b("y", Output, &["rows", "dim"], &[rows, dim], f),
            ],
            Problem::ResidualLayerNorm { rows, dim, .. } => vec![
                b("x", Input, &["rows", "dim"], &[rows, dim], f),
                b("r", Input, &["rows", "dim"], &[rows, dim], f),
                b("w", Weight, &["dim"], &[dim], d),
                b("b", Weight, &["dim"], &[dim], d),
                b("h", Output, &["rows", "dim"], &[rows, dim], f),
                b("y", Output, &["rows", "dim"], &[rows, dim], f),
            ],
            Problem::QkvProj { k, nq, nkv, bias } => {
                let n = nq + 2 * nkv;
                let mut v = vec![b("x", Input, &["k"], &[k], f), b("w", Weight, &["nq+2nkv", "k"], &[n, k], d)];
                if bias {
                    v.push(b("bias", Weight, &["nq+2nkv"], &[n], f));
                }
                v.push(b("q", Output, &["nq"], &[nq], f));
                v.push(b("k_out", Output, &["nkv"], &[nkv], f));
                v.push(b("v_out", Output, &["nkv"], &[nkv], f));
                v
            }
            Problem::NormGemv { n, k, residual, act, .. } => {
                let g = d.float_storage();
                let mut v = vec![b("x", Input, &["k"], &[k], f)];
                if !residual.is_none() {
                    v.push(b("r", Input, &["k"], &[k], f));
                }
                if residual == NormResidual::Normed {
                    v.push(b("g_r", Weight, &["k"], &[k], g));
                }
                v.push(b("g", Weight, &["k"], &[k], g));
                v.push(if act.is_some() { b("w", Weight, &["2n", "k"], &[2 * n, k], d) } else { b("w", Weight, &["n", "k"], &[n, k], d) });
                v.push(b("y", Output, &["n"], &[n], f));
                if !residual.is_none() {
                    v.push(b("h", Output, &["k"], &[k], f));
                }
                v
            }
            Problem::QkvRopeCache { heads, kv_heads, head_dim, rot_dim, kv_cap, norm, gain, .. } => {
                let cache = &["kv_heads", "kv_cap", "head_dim"];
                let mut v = vec![b("qkv", Input, &["heads+2kv_heads", "head_dim"], &[heads + 2 * kv_heads, head_dim], f)];
                if norm {
                    v.push(b("q_norm", Weight, &["head_dim"], &[head_dim], gain));
                    v.push(b("k_norm", Weight, &["head_dim"], &[head_dim], gain));
                }
                v.push(b("inv_freq", Input, &["rot_half"], &[rot_dim / 2], f));
                v.push(b("q", Output, &["heads", "head_dim"], &[heads, head_dim], f));
                v.push(b("k_cache", Output, cache, &[kv_heads, kv_cap, head_dim], d));
                v.push(b("v_cache", Output, cache, &[kv_heads, kv_cap, head_dim], d));
                v
            }
            Problem::PatchEmbed { channels, image, patch, hidden } => {
                let side = image.checked_div(patch).unwrap_or(0);
                vec![
                    b("pixels", Input, &["channels", "image", "image"], &[channels, image, image], f),
                    b("w", Weight, &["hidden", "channels*patch*patch"], &[hidden, channels * patch * patch], d),
                    b("b", Weight, &["hidden"], &[hidden], d),
                    b("y", Output, &["patches", "hidden"], &[side * side, hidden], f),
                ]
            }
            Problem::Linear { m, n, k, .. } => vec![
                b("x", Input, &["m", "k"], &[m, k], f),
                b("w", Weight, &["n", "k"], &[n, k], d),
                b("b", Weight, &["n"], &[n], d),
                b("y", Output, &["m", "n"], &[m, n], f),
            ],
            Problem::AttentionFull { tokens, heads, head_dim, .. } => {
                let dims = &["tokens", "heads", "head_dim"];
                let shape = &[tokens, heads, head_dim];
                vec![
                    b("q", Input, dims, shape, f),
                    b("k", Input, dims, shape, f),
                    b("v", Input, dims, shape, f),
                    b("out", Output, dims, shape, f),
                ]
            }
            Problem::AvgPool { side, kernel, dim } => {
                let out = side.checked_div(kernel).unwrap_or(0);
                vec![b("x", Input, &["side*side", "dim"], &[side * side, dim], f), b("y", Output, &["pooled", "dim"], &[out * out, dim], f)]
            }
            Problem::MoeRoute { rows, experts, .. } => vec![
                b("logits", Input, &["rows", "experts"], &[rows, experts], f),
                b("route", Output, &["rows", "experts"], &[rows, experts], f),
            ],
            Problem::MoeGateUp { rows, experts, top_k, n, k, .. } => vec![
                b("x", Input, &["rows", "k"], &[rows, k], f),
                b("route", Input, &["rows", "experts"], &[rows, experts], f),
                b("w", Weight, &["2experts*n", "k"], &[2 * experts * n, k], d),
                b("h", Output, &["rows", "top_k", "n"], &[rows, top_k, n], f),
            ],
            Problem::MoeDown { rows, experts, top_k, n, k } => vec![
                b("h", Input, &["rows", "top_k", "k"], &[rows, top_k, k], f),
                b("route", Input, &["rows", "experts"], &[rows, experts], f),
                b("w", Weight, &["experts*n", "k"], &[experts * n, k], d),
                b("y", Output, &["rows", "n"], &[rows, n], f),
            ],
        }
    }

    /// Floating-point operations (multiply and add count as two) this problem does.
    pub fn flops(&self) -> f64 {
        let f = |x: usize| x as f64;
        match *self {
            Problem::Gemm { m, n, k } => 2.0 * f(m) * f(n) * f(k),
            Problem::Gemv { n, k } => 2.0 * f(n) * f(k),
            Problem::AttentionPrefill { tokens, kv_len, heads, head_dim, window, bidi_start, bidi_end, .. } => {
                // causal: each query sees about (past + i) keys
                let past = kv_len.saturating_sub(tokens);
                let mut keys = 0.0;
                for i in 0..tokens {
                    let (lo, hi) = attention_keys(past + i, window, (bidi_start, bidi_end));
                    keys += f(hi - lo);
                }
                4.0 * keys * f(heads) * f(head_dim)
            }
            Problem::AttentionDecode { kv_len, heads, head_dim, window, .. } => {
                let seen = if window > 0 { kv_len.min(window) } else { kv_len };
                4.0 * f(seen) * f(heads) * f(head_dim)
            }
            Problem::AttentionPaged { seqs, tokens, heads, head_dim, page, max_blocks, window, .. } => {
                // Unknown lengths: every sequence's queries as if at the end of a
                // half-full table, a sliding window included.
                let kv = (page * max_blocks / 2).max(tokens.div_ceil(seqs.max(1)));
                let seen = if window > 0 { kv.min(window) } else { kv };
                4.0 * f(seen) * f(tokens) * f(heads) * f(head_dim)
            }
            Problem::RmsNorm { rows, dim, .. } => 4.0 * f(rows) * f(dim),
            Problem::LayerNorm { rows, dim, .. } => 7.0 * f(rows) * f(dim),
            Problem::Rope { tokens, heads, rot_dim, .. } => 3.0 * f(tokens) * f(heads) * f(rot_dim),
            Problem::GatedAct { rows, dim, .. } => 10.0 * f(rows) * f(dim),
            Problem::Softmax { rows, dim } => 5.0 * f(rows) * f(dim),
            Problem::ResidualAdd { n } => f(n),
            Problem::QkNormRope { tokens, heads, head_dim, rot_dim, .. } => f(tokens) * f(heads) * (4.0 * f(head_dim) + 3.0 * f(rot_dim)),
            Problem::GateUp { rows, n, k, .. } => 4.0 * f(rows) * f(n) * f(k) + 10.0 * f(rows) * f(n),
            Problem::ResidualRmsNorm { rows, dim, .. } => 5.0 * f(rows) * f(dim),
            Problem::ResidualLayerNorm { rows, dim, .. } => 8.0 * f(rows) * f(dim),
            Problem::QkvProj { k, nq, nkv, .. } => 2.0 * f(k) * f(nq + 2 * nkv),
            Problem::NormGemv { n, k, act, .. } => {
                let rows = if act.is_some() { 2 * n } else { n };
                2.0 * f(rows) * f(k) + 4.0 * f(k) + if act.is_some() { 10.0 * f(n) } else { 0.0 }
            }
            Problem::QkvRopeCache { heads, kv_heads, head_dim, rot_dim, norm, .. } => {
                f(heads + kv_heads) * (if norm { 4.0 * f(head_dim) } else { 0.0 } + 3.0 * f(rot_dim))
            }
            Problem::PatchEmbed { channels, image, patch, hidden } => {
                let side = image.checked_div(patch).unwrap_or(0);
                2.0 * f(side * side) * f(hidden) * f(channels * patch * patch)
            }
            Problem::Linear { m, n, k, gelu } => 2.0 * f(m) * f(n) * f(k) + if gelu { 10.0 } else { 1.0 } * f(m) * f(n),
            Problem::AttentionFull { tokens, heads, head_dim, .. } => 4.0 * f(tokens) * f(tokens) * f(heads) * f(head_dim),
            Problem::AvgPool { side, dim, .. } => f(side * side) * f(dim),
            Problem::MoeRoute { rows, experts, top_k, .. } => f(rows) * f(experts) * (5.0 + f(top_k)),
            Problem::MoeGateUp { rows, top_k, n, k, .. } => f(rows * top_k) * (4.0 * f(n) * f(k) + 10.0 * f(n)),
            Problem::MoeDown { rows, top_k, n, k, .. } => f(rows * top_k) * 2.0 * f(n) * (f(k) + 1.0),
        }
    }

    /// Bytes an ideal kernel must move: every buffer read once, every output written once.
    /// Attention counts the KV cache rows it can see, not the whole capacity; the
    /// fused KV write the one row it writes.
    pub fn min_bytes(&self, dtype: DType) -> f64 {
        let bufs = self.buffers(dtype);
        match *self {
            Problem::QkvRopeCache { kv_cap, .. } => bufs
                .iter()
                .map(|s| {
                    let bytes = s.bytes() as f64;
                    if s.id.ends_with("_cache") { bytes / kv_cap.max(1) as f64 } else { bytes }
                })
                .sum(),
            Problem::AttentionPrefill { kv_len, kv_cap, .. } | Problem::AttentionDecode { kv_len, kv_cap, .. } => bufs
                .iter()
                .map(|s| {
                    let bytes = s.bytes() as f64;
                    if s.role == Role::Cache { bytes * kv_len as f64 / kv_cap as f64 } else { bytes }
                })
                .sum(),
            // Per sequence half its table's positions (as `flops` counts them).
            Problem::AttentionPaged { seqs, blocks, max_blocks, .. } => bufs
                .iter()
                .map(|s| {
                    let bytes = s.bytes() as f64;
                    if s.role == Role::Cache {
                        bytes * (seqs * max_blocks).div_ceil(2).min(blocks) as f64 / blocks.max(1) as f64
                    } else {
                        bytes
                    }
                })
                .sum(),
            // Only the experts the tokens use are read: at most rows * top_k of them.
            Problem::MoeGateUp { rows, experts, top_k, .. } | Problem::MoeDown { rows, experts, top_k, .. } => bufs
                .iter()
                .map(|s| {
                    let bytes = s.bytes() as f64;
                    if s.role == Role::Weight { bytes * (rows * top_k).min(experts) as f64 / experts.max(1) as f64 } else { bytes }
                })
                .sum(),
            // A stacked weight: each part's rows in its own format.
            Problem::NormGemv { k, formats: Some(f), .. } => bufs
                .iter()
                .map(|s| match s.role {
                    Role::Weight if s.id == "w" => {
                        f.parts().iter().map(|&(r, q)| DType::from(q).bytes_for(r as usize * k)).sum::<u64>() as f64
                    }
                    _ => s.bytes() as f64,
                })
                .sum(),
            _ => bufs.iter().map(|s| s.bytes() as f64).sum(),
        }
    }

    /// Whether the op is limited by memory traffic (GB/s is its figure of merit)
    /// rather than arithmetic (GFLOP/s).
    pub fn is_memory_bound(&self) -> bool {
        match *self {
            Problem::Gemm { m, .. } => m < 8,
            Problem::GateUp { rows, .. } => rows < 8,
            Problem::MoeGateUp { rows, top_k, experts, .. } | Problem::MoeDown { rows, top_k, experts, .. } => rows * top_k < 8 * experts,
            Problem::AttentionPrefill { tokens, .. } | Problem::AttentionFull { tokens, .. } => tokens < 8,
            Problem::AttentionPaged { seqs, tokens, .. } => tokens < 8 * seqs,
            Problem::Linear { m, .. } => m < 8,
            Problem::PatchEmbed { .. } => false,
            _ => true,
        }
    }

    /// Short human form, e.g. `gemv n=1152 k=6912`.
    pub fn describe(&self) -> String {
        let v = serde_json::to_value(self).unwrap_or_default();
        let mut s = self.op().name().to_string();
        if let Some(map) = v.as_object() {
            for (k, val) in map {
                if k == "op" {
                    continue;
                }
                let val = match val {
                    serde_json::Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                s.push_str(&format!(" {k}={val}"));
            }
        }
        s
    }
}

/// Shapes the parity check runs for `op`: small enough for a software adapter,
/// and including sizes that are not multiples of any tile or vector width.
pub fn test_problems(op: Op) -> Vec<Problem> {
    match op {
        Op::Gemm => vec![
            Problem::Gemm { m: 1, n: 7, k: 5 },
            Problem::Gemm { m: 37, n: 53, k: 67 },
            Problem::Gemm { m: 64, n: 64, k: 64 },
            Problem::Gemm { m: 70, n: 96, k: 128 },
            Problem::Gemm { m: 5, n: 130, k: 96 },
            // Whole 32-element blocks (the quantized kernels' rule) but not whole tiles.
            Problem::Gemm { m: 37, n: 53, k: 160 },
            // Whole 256-element super-blocks (the K-quants and IQ4_XS).
            Problem::Gemm { m: 9, n: 37, k: 512 },
        ],
        Op::Gemv => vec![
            Problem::Gemv { n: 1, k: 3 },
            Problem::Gemv { n: 37, k: 67 },
            Problem::Gemv { n: 64, k: 256 },
            Problem::Gemv { n: 129, k: 1000 },
            Problem::Gemv { n: 300, k: 128 },
            // Whole 32-element blocks, rows not a multiple of any workgroup's rows.
            Problem::Gemv { n: 37, k: 160 },
            // Whole 256-element super-blocks (the K-quants), rows as above.
            Problem::Gemv { n: 37, k: 512 },
        ],
        // (tokens, kv_len, kv_cap, heads, kv_heads, head_dim, window, scale, bidi_start, bidi_end)
        Op::AttentionPrefill => [
            (1, 1, 1, 1, 1, 8, 0, 0.35, 0, 0),
            (7, 7, 9, 4, 2, 16, 0, 0.25, 0, 0),
            (37, 37, 40, 4, 1, 64, 0, 0.125, 0, 0),
            (33, 45, 48, 6, 2, 32, 0, 0.18, 0, 0),
            (50, 50, 50, 2, 2, 32, 16, 0.18, 0, 0),
            (20, 70, 72, 8, 2, 128, 24, 0.0884, 0, 0),
            // A bidirectional block (an image's tokens) inside a prefill continuing a
            // cache, without and with a sliding window shorter than the block.
            (33, 45, 48, 6, 2, 32, 0, 0.18, 17, 34),
            (40, 40, 40, 4, 1, 16, 8, 0.25, 5, 25),
        ]
        .map(|(tokens, kv_len, kv_cap, heads, kv_heads, head_dim, window, scale, bidi_start, bidi_end)| Problem::AttentionPrefill {
            tokens,
            kv_len,
            kv_cap,
            heads,
            kv_heads,
            head_dim,
            window,
            scale,
            bidi_start,
            bidi_end,
        })
        .to_vec(),
        Op::AttentionDecode => vec![
            Problem::AttentionDecode { kv_len: 1, kv_cap: 1, heads: 1, kv_heads: 1, head_dim: 8, window: 0, scale: 0.35 },
            Problem::AttentionDecode { kv_len: 37, kv_cap: 40, heads: 4, kv_heads: 2, head_dim: 16, window: 0, scale: 0.25 },
            Problem::AttentionDecode { kv_len: 300, kv_cap: 301, heads: 4, kv_heads: 1, head_dim: 64, window: 0, scale: 0.125 },
            Problem::AttentionDecode { kv_len: 517, kv_cap: 600, heads: 8, kv_heads: 2, head_dim: 128, window: 0, scale: 0.0884 },
            Problem::AttentionDecode { kv_len: 700, kv_cap: 700, heads: 6, kv_heads: 3, head_dim: 32, window: 64, scale: 0.18 },
        ],
        // One decode token; decode tokens of three sequences; decode tokens and
        // prefill chunks mixed; a sliding window across pages; head_dim 128 on small
        // pages (the sequences' lengths and tables: `verify::paged_layout`).
        Op::AttentionPaged => vec![
            Problem::attention_paged((1, 1), (1, 1, 8), (4, 2, 2), 0, 0.35),
            Problem::attention_paged((3, 3), (4, 2, 16), (16, 12, 4), 0, 0.25),
            Problem::attention_paged((4, 21), (4, 1, 64), (16, 40, 8), 0, 0.125),
            Problem::attention_paged((3, 10), (6, 3, 32), (32, 30, 8), 40, 0.18),
            Problem::attention_paged((2, 40), (8, 2, 128), (8, 40, 12), 0, 0.0884),
        ],
        Op::RmsNorm => vec![
            Problem::RmsNorm { rows: 1, dim: 7, eps: 1e-6, unit_offset: false },
            Problem::RmsNorm { rows: 3, dim: 1152, eps: 1e-6, unit_offset: true },
            Problem::RmsNorm { rows: 17, dim: 577, eps: 1e-5, unit_offset: false },
        ],
        Op::LayerNorm => vec![
            Problem::LayerNorm { rows: 1, dim: 7, eps: 1e-5 },
            Problem::LayerNorm { rows: 17, dim: 577, eps: 1e-5 },
            Problem::LayerNorm { rows: 4, dim: 1024, eps: 1e-6 },
        ],
        Op::Rope => vec![
            Problem::Rope { tokens: 1, heads: 1, head_dim: 8, rot_dim: 8, pos0: 0, layout: RopeLayout::Half },
            Problem::Rope { tokens: 5, heads: 3, head_dim: 64, rot_dim: 64, pos0: 17, layout: RopeLayout::Half },
            Problem::Rope { tokens: 7, heads: 4, head_dim: 64, rot_dim: 64, pos0: 3, layout: RopeLayout::Interleaved },
            Problem::Rope { tokens: 3, heads: 2, head_dim: 96, rot_dim: 32, pos0: 1000, layout: RopeLayout::Half },
            Problem::Rope { tokens: 2, heads: 5, head_dim: 128, rot_dim: 128, pos0: 8000, layout: RopeLayout::Interleaved },
        ],
        Op::GatedAct => vec![
            Problem::GatedAct { rows: 1, dim: 5, act: Activation::Silu },
            Problem::GatedAct { rows: 3, dim: 1537, act: Activation::GeluTanh },
            Problem::GatedAct { rows: 7, dim: 256, act: Activation::Silu },
        ],
        Op::Softmax => {
            vec![Problem::Softmax { rows: 1, dim: 1 }, Problem::Softmax { rows: 5, dim: 333 }, Problem::Softmax { rows: 2, dim: 4099 }]
        }
        Op::ResidualAdd => vec![Problem::ResidualAdd { n: 1 }, Problem::ResidualAdd { n: 1155 }, Problem::ResidualAdd { n: 4096 }],
        Op::QkNormRope => vec![
            Problem::QkNormRope {
                tokens: 1,
                heads: 1,
                head_dim: 8,
                rot_dim: 8,
                pos0: 0,
                layout: RopeLayout::Half,
                eps: 1e-6,
                unit_offset: true,
            },
            Problem::QkNormRope {
                tokens: 5,
                heads: 4,
                head_dim: 256,
                rot_dim: 256,
                pos0: 9,
                layout: RopeLayout::Half,
                eps: 1e-6,
                unit_offset: true,
            },
            Problem::QkNormRope {
                tokens: 3,
                heads: 2,
                head_dim: 64,
                rot_dim: 64,
                pos0: 100,
                layout: RopeLayout::Interleaved,
                eps: 1e-5,
                unit_offset: false,
            },
        ],
        Op::GateUp => vec![
            Problem::GateUp { rows: 1, n: 7, k: 5, act: Activation::Silu },
            Problem::GateUp { rows: 1, n: 96, k: 130, act: Activation::GeluTanh },
            Problem::GateUp { rows: 1, n: 300, k: 256, act: Activation::Silu },
            Problem::GateUp { rows: 9, n: 70, k: 64, act: Activation::GeluTanh },
            Problem::GateUp { rows: 33, n: 64, k: 96, act: Activation::Silu },
            Problem::GateUp { rows: 3, n: 37, k: 160, act: Activation::GeluTanh },
            // Several tokens on whole 256-element super-blocks: the prefill kernels'
            // only check for the K-quants (without it the tuner's parity gate could not
            // admit them, and a K-quant model's fused gate/up prefill ran a decode kernel).
            Problem::GateUp { rows: 5, n: 40, k: 512, act: Activation::Silu },
        ],
        Op::ResidualRmsNorm => vec![
            Problem::ResidualRmsNorm { rows: 1, dim: 7, eps: 1e-6, unit_offset: false },
            Problem::ResidualRmsNorm { rows: 5, dim: 1152, eps: 1e-6, unit_offset: true },
            Problem::ResidualRmsNorm { rows: 3, dim: 577, eps: 1e-5, unit_offset: false },
        ],
        Op::ResidualLayerNorm => vec![
            Problem::ResidualLayerNorm { rows: 1, dim: 7, eps: 1e-5 },
            Problem::ResidualLayerNorm { rows: 17, dim: 577, eps: 1e-6 },
            // SigLIP So400m's width.
            Problem::ResidualLayerNorm { rows: 5, dim: 1152, eps: 1e-6 },
        ],
        Op::QkvProj => vec![
            Problem::QkvProj { k: 5, nq: 4, nkv: 2, bias: false },
            Problem::QkvProj { k: 130, nq: 64, nkv: 16, bias: true },
            Problem::QkvProj { k: 256, nq: 256, nkv: 128, bias: false },
            Problem::QkvProj { k: 96, nq: 96, nkv: 32, bias: true },
            Problem::QkvProj { k: 160, nq: 36, nkv: 6, bias: true },
        ],
        Op::NormGemv => vec![
            Problem::norm_gemv(1, 3, 1e-6, false),
            Problem::norm_gemv(37, 67, 1e-5, true),
            Problem::norm_gemv(64, 256, 1e-6, true),
            Problem::norm_gemv(129, 1000, 1e-6, false),
            Problem::norm_gemv(300, 128, 1e-5, false),
            // Whole 32-element blocks, rows not a multiple of any workgroup's rows.
            Problem::norm_gemv(37, 160, 1e-6, true),
            // The decode chain's prologues: a residual added (Llama) or normed and
            // added (Gemma 3), and the fused gate/up with its activation.
            Problem::NormGemv { n: 37, k: 64, eps: 1e-5, unit_offset: false, residual: NormResidual::Add, act: None, formats: None },
            Problem::NormGemv {
                n: 19,
                k: 256,
                eps: 1e-6,
                unit_offset: true,
                residual: NormResidual::Normed,
                act: Some(Activation::GeluTanh),
                formats: None,
            },
            Problem::NormGemv {
                n: 40,
                k: 160,
                eps: 1e-6,
                unit_offset: false,
                residual: NormResidual::Add,
                act: Some(Activation::Silu),
                formats: None,
            },
            // Per-operand formats (a stacked weight, run as its first part's
            // format): a Q4_K_M file's fused Q/K/V (queries and keys Q5_0, values
            // Q8_0; K-quants with Q6_K values) and a gate/up whose halves differ.
            Problem::NormGemv {
                n: 56,
                k: 256,
                eps: 1e-6,
                unit_offset: true,
                residual: NormResidual::Normed,
                act: None,
                formats: RowFormats::new(&[(40, QFormat::Q5_0), (8, QFormat::Q5_0), (8, QFormat::Q8_0)]),
            },
            Problem::NormGemv {
                n: 48,
                k: 512,
                eps: 1e-6,
                unit_offset: false,
                residual: NormResidual::None,
                act: None,
                formats: RowFormats::new(&[(32, QFormat::Q4_K), (8, QFormat::Q4_K), (8, QFormat::Q6_K)]),
            },
            Problem::NormGemv {
                n: 19,
                k: 256,
                eps: 1e-5,
                unit_offset: false,
                residual: NormResidual::Add,
                act: Some(Activation::Silu),
                formats: RowFormats::new(&[(19, QFormat::Q4_K), (19, QFormat::Q6_K)]),
            },
        ],
        Op::QkvRopeCache => {
            let p = |heads, kv_heads, head_dim, rot_dim, pos0, kv_cap, layout, norm, gain| Problem::QkvRopeCache {
                heads,
                kv_heads,
                head_dim,
                rot_dim,
                pos0,
                kv_cap,
                layout,
                norm,
                eps: 1e-6,
                unit_offset: norm,
                gain,
            };
            let f = DType::F32;
            vec![
                // Llama-like (no norm): GQA, the first and a later position.
                p(4, 2, 16, 16, 0, 3, RopeLayout::Half, false, f),
                p(6, 2, 64, 64, 37, 40, RopeLayout::Half, false, f),
                // Partial rotary, interleaved pairs.
                p(3, 1, 32, 16, 5, 9, RopeLayout::Interleaved, false, f),
                // Gemma-like: q/k norm with unit-offset gains, a wide head; f16 gains.
                p(4, 1, 256, 256, 12, 13, RopeLayout::Half, true, f),
                p(2, 2, 32, 32, 3, 4, RopeLayout::Interleaved, true, DType::F16),
            ]
        }
        Op::PatchEmbed => vec![
            Problem::PatchEmbed { channels: 1, image: 12, patch: 4, hidden: 5 },
            Problem::PatchEmbed { channels: 3, image: 32, patch: 8, hidden: 16 },
            // SigLIP's patch of 14 (rows of 14 pixels: no vector width divides them).
            Problem::PatchEmbed { channels: 3, image: 28, patch: 14, hidden: 37 },
        ],
        Op::Linear => vec![
            Problem::Linear { m: 1, n: 7, k: 5, gelu: false },
            Problem::Linear { m: 37, n: 53, k: 67, gelu: true },
            Problem::Linear { m: 16, n: 64, k: 128, gelu: true },
            Problem::Linear { m: 5, n: 130, k: 96, gelu: false },
        ],
        Op::AttentionFull => vec![
            Problem::AttentionFull { tokens: 1, heads: 1, head_dim: 8, scale: 0.35 },
            Problem::AttentionFull { tokens: 16, heads: 2, head_dim: 16, scale: 0.25 },
            Problem::AttentionFull { tokens: 37, heads: 3, head_dim: 24, scale: 0.2 },
            Problem::AttentionFull { tokens: 64, heads: 4, head_dim: 72, scale: 0.118 },
        ],
        Op::AvgPool => vec![
            Problem::AvgPool { side: 5, kernel: 1, dim: 3 },
            Problem::AvgPool { side: 4, kernel: 2, dim: 8 },
            Problem::AvgPool { side: 6, kernel: 3, dim: 5 },
            Problem::AvgPool { side: 8, kernel: 4, dim: 37 },
        ],
        Op::MoeRoute => vec![
            Problem::MoeRoute { rows: 1, experts: 1, top_k: 1, norm: true },
            Problem::MoeRoute { rows: 1, experts: 8, top_k: 2, norm: true },
            Problem::MoeRoute { rows: 7, experts: 60, top_k: 4, norm: false },
            // Qwen3-30B-A3B's router: 128 experts, 8 a token.
            Problem::MoeRoute { rows: 19, experts: 128, top_k: 8, norm: true },
        ],
        // (rows, experts, top_k, n, k): decode (one token) and prefill, k in whole
        // 32-element blocks and in whole super-blocks.
        Op::MoeGateUp => [
            (1, 4, 2, 7, 64, Activation::Silu),
            (1, 8, 2, 40, 256, Activation::Silu),
            (9, 8, 3, 37, 160, Activation::GeluTanh),
            (33, 16, 4, 24, 512, Activation::Silu),
        ]
        .map(|(rows, experts, top_k, n, k, act)| Problem::MoeGateUp { rows, experts, top_k, n, k, act })
        .to_vec(),
        Op::MoeDown => [(1, 4, 2, 64, 32), (1, 8, 2, 96, 256), (9, 8, 3, 37, 160), (33, 16, 4, 40, 512)]
            .map(|(rows, experts, top_k, n, k)| Problem::MoeDown { rows, experts, top_k, n, k })
            .to_vec(),
    }
}
