//! [`ModelConfig`]: the shapes and the numerical conventions of one decoder model
//! (dimensions, RoPE bases and scaling, norms, attention scale, sliding-window layer
//! pattern, soft-capping, special tokens), its consistency check, and what follows
//! from it: the Hugging Face tensor names and shapes, the parameter count and the
//! bytes of weights one decoded token reads.

use serde::{Deserialize, Serialize};

use super::family::Norms;
pub use super::family::{Architecture, HiddenAct};
use super::{ModelError, Result};
use crate::kernels::DType;

/// Attention span of one layer: the whole context, or a sliding window of the last
/// [`ModelConfig::sliding_window`] positions (Gemma 3's local layers, which also
/// use their own RoPE base and no RoPE scaling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum LayerKind {
    Global,
    Local,
}

impl LayerKind {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// RoPE frequency scaling (applied to global layers only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Every inverse frequency divided by `factor` (Gemma 3 4B and larger).
    Linear { factor: f64 },
    /// Llama 3.1+ scaling: long wavelengths divided by `factor`, short ones kept,
    /// a smooth blend in between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
    /// LongRoPE (Phi-3, Phi-4-mini): each inverse frequency divided by its own
    /// factor, `long_factor` when the context exceeds
    /// `original_max_position_embeddings` (llama.cpp's choice, by the context; in
    /// transformers by the sequence so far), else `short_factor`; cos and sin
    /// multiplied by `attention_factor` (so the scores by its square).
    LongRope { short_factor: Vec<f64>, long_factor: Vec<f64>, original_max_position_embeddings: usize, attention_factor: f64 },
}

impl RopeScaling {
    /// LongRoPE's default attention factor for an extension by `s` over an
    /// `original` context: `sqrt(1 + ln(s) / ln(original))`, 1 when `s <= 1`, as
    /// transformers and llama.cpp's converter compute it.
    pub fn longrope_attention_factor(s: f64, original: usize) -> f64 {
        if s <= 1.0 || original < 2 { 1.0 } else { (1.0 + s.ln() / (original as f64).ln()).sqrt() }
    }
}

/// Granite's four scalar multipliers (`config.json`: `embedding_multiplier`,
/// `attention_multiplier`, `residual_multiplier`, `logits_scaling`; GGUF:
/// `embedding_scale`, `attention.scale`, `residual_scale`, `logit_scale`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Multipliers {
    /// Embeddings are multiplied by it after the lookup.
    pub embedding: f64,
    /// The attention scores' scale (instead of `head_dim^-1/2`).
    pub attention: f64,
    /// Each attention and MLP output is multiplied by it before it joins the
    /// residual stream (the stream is carried divided by it instead:
    /// [`ModelConfig::norm_eps`]).
    pub residual: f64,
    /// The logits are divided by it (folded into the final norm's gain at load).
    pub logits_scaling: f64,
}

impl Multipliers {
    /// Read from a file through `get`, its four keys in the order embedding,
    /// attention, residual, logits; an absent key is 1 (transformers' default).
    pub fn read<E>(
        keys: [&str; 4],
        mut get: impl FnMut(&str) -> std::result::Result<Option<f64>, E>,
    ) -> std::result::Result<Multipliers, E> {
        let mut one = |key| get(key).map(|v| v.unwrap_or(1.0));
        Ok(Multipliers { embedding: one(keys[0])?, attention: one(keys[1])?, residual: one(keys[2])?, logits_scaling: one(keys[3])? })
    }
}

/// A mixture-of-experts MLP: each token's `top_k` of `experts` expert MLPs (SwiGLU
/// of width `expert_ff`), weighted by the router's softmax over them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    pub experts: usize,
    /// Experts per token (`num_experts_per_tok`, GGUF `expert_used_count`).
    pub top_k: usize,
    /// Width of each expert's gate and up projections (`moe_intermediate_size`).
    pub expert_ff: usize,
    /// The chosen experts' weights renormalised to sum to 1 (`norm_topk_prob`).
    pub norm_top_k: bool,
    /// Layers with a dense MLP of `intermediate_size` instead (`mlp_only_layers`,
    /// and those `decoder_sparse_step` passes over), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_layers: Vec<usize>,
}

/// A factor on some rows of a weight, folded into it at load: what a family
/// multiplies a projection's output by where no kernel takes a factor (Granite's
/// logits divisor, LongRoPE's attention factor on the rotated dims of a partial
/// rotary head). Row `r` (of `cols` elements; a 1-D tensor's
/// elements are its rows) is scaled when `r % period` is in `rows`.
#[derive(Clone, Debug, PartialEq)]
pub struct RowScale {
    pub factor: f64,
    pub cols: usize,
    pub period: usize,
    pub rows: std::ops::Range<usize>,
}

impl RowScale {
    /// Every element times `factor`.
    pub fn all(factor: f64) -> RowScale {
        RowScale { factor, cols: 1, period: 1, rows: 0..1 }
    }

    /// The factor of row `r` (1 where the scale does not apply).
    pub fn of(&self, r: usize) -> f32 {
        if self.rows.contains(&(r % self.period.max(1))) { self.factor as f32 } else { 1.0 }
    }

    /// The factor of element `i` of a flattened tensor.
    pub fn of_elem(&self, i: usize) -> f32 {
        self.of(i / self.cols.max(1))
    }
}

/// Storage type of weights (what a file holds, or what a kernel reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Dtype {
    F32,
    F16,
    BF16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Bytes a number of elements take in a storage type: file dtypes and the
/// runtime's (block-quantized ones included).
pub trait ElemBytes {
    fn bytes_for_elems(&self, n: u64) -> u64;
}

impl ElemBytes for Dtype {
    fn bytes_for_elems(&self, n: u64) -> u64 {
        n * self.size() as u64
    }
}

impl ElemBytes for DType {
    fn bytes_for_elems(&self, n: u64) -> u64 {
        match self.quant() {
            // Quants and scales only (the GPU layout's padding is per buffer).
            Some(f) => n.div_ceil(32) * f.block_bytes() as u64,
            None => n * self.size() as u64,
        }
    }
}

/// One decoder model's shapes and conventions. Built in ([`super::builtin`]) or
/// read from a Hugging Face `config.json` ([`ModelConfig::from_config_json`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// The dimensions every decoder has.
    pub dims: Dims,
    pub rms_norm_eps: f64,
    /// RoPE base of global layers.
    pub rope_theta: f64,
    /// RoPE base of local (sliding-window) layers, when it differs (Gemma 3: 10 000).
    pub rope_local_base_freq: Option<f64>,
    /// Scaling of the global layers' RoPE frequencies.
    pub rope_scaling: Option<RopeScaling>,
    /// RoPE on the first `rope_dim` dims of each head only, the rest passed
    /// through (Phi-4-mini: 96 of 128, `partial_rotary_factor` 0.75 in its
    /// config; GGUF `rope.dimension_count`); None: the whole head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_dim: Option<usize>,
    pub max_position_embeddings: usize,
    /// The LM head is the embedding matrix (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    pub hidden_act: HiddenAct,
    /// Biases on the Q, K and V projections (Qwen2); never on O.
    pub attention_bias: bool,
    /// RMSNorm over each query and key head before RoPE (Gemma 3).
    pub qk_norm: bool,
    /// Span of local layers: a query at position i sees keys j with i - window < j <= i.
    pub sliding_window: Option<usize>,
    /// One entry per layer.
    pub layer_types: Vec<LayerKind>,
    /// Layers that skip RoPE (SmolLM3: every fourth), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nope_layers: Vec<usize>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-1/2` instead of
    /// `head_dim^-1/2` (Gemma).
    pub query_pre_attn_scalar: Option<f64>,
    /// logits = cap * tanh(logits / cap).
    pub final_logit_softcapping: Option<f64>,
    /// The same on attention scores before the softmax.
    pub attn_logit_softcapping: Option<f64>,
    /// Embeddings are multiplied by sqrt(hidden_size) (Gemma).
    pub scale_embeddings: bool,
    /// Granite's scalar multipliers (None: all 1, the attention scale from the head width).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipliers: Option<Multipliers>,
    /// A mixture of experts in place of the MLP (Qwen3-MoE); None: a dense MLP on
    /// every layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    /// RMSNorm multiplies by (1 + w) instead of w (Gemma).
    pub norm_unit_offset: bool,
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (base and chat-template ends of the published models).
    pub eos_token_ids: Vec<u32>,
}

/// The dimensions every decoder has, whatever its architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dims {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head (not always `hidden_size / num_heads`: Gemma 3).
    pub head_dim: usize,
}

impl ModelConfig {
    /// This model cut to its first `layers` layers (`--layers`, and the tune's
    /// end-to-end stage when a build of the whole model does not fit its budget).
    pub fn first_layers(&self, layers: usize) -> ModelConfig {
        let mut c = self.clone();
        c.dims.num_layers = layers.min(self.dims.num_layers);
        c.layer_types.truncate(c.dims.num_layers);
        c.nope_layers.retain(|&l| l < c.dims.num_layers);
        c
    }

    /// A model of `arch` with dimensions `d` and its family's fixed traits (norms,
    /// biases, q/k norms, activation, embedding scale: [`Architecture::family`]);
    /// every optional feature off: all layers global and with RoPE, no RoPE scaling,
    /// no soft-capping, tied embeddings, no special tokens. Readers and built-in
    /// configs set what their model has on top (`..ModelConfig::new(..)`).
    pub fn new(arch: Architecture, d: Dims) -> ModelConfig {
        let f = arch.family();
        ModelConfig {
            architecture: arch,
            dims: d,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_local_base_freq: None,
            rope_scaling: None,
            rope_dim: None,
            max_position_embeddings: 2048,
            tie_word_embeddings: true,
            hidden_act: f.hidden_act,
            attention_bias: f.qkv_bias,
            qk_norm: f.qk_norm,
            sliding_window: None,
            layer_types: vec![LayerKind::Global; d.num_layers],
            nope_layers: Vec::new(),
            query_pre_attn_scalar: None,
            final_logit_softcapping: None,
            attn_logit_softcapping: None,
            scale_embeddings: f.scale_embeddings,
            multipliers: None,
            moe: None,
            norm_unit_offset: f.unit_offset_norms,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
        }
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.dims.num_heads * self.dims.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.dims.num_kv_heads * self.dims.head_dim
    }

    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.dims.num_heads / self.dims.num_kv_heads.max(1)
    }

    /// Kind of layer `layer` (global past the last layer).
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        self.layer_types.get(layer).copied().unwrap_or(LayerKind::Global)
    }

    /// How many layers are local (sliding-window).
    pub fn num_local_layers(&self) -> usize {
        self.layer_types.iter().filter(|k| **k == LayerKind::Local).count()
    }

    /// The window of layer `layer`, None when it attends to the whole context.
    pub fn layer_sliding_window(&self, layer: usize) -> Option<usize> {
        match self.layer_kind(layer) {
            LayerKind::Local => self.sliding_window,
            LayerKind::Global => None,
        }
    }

    /// RoPE base for a kind of layer.
    pub fn rope_theta_for(&self, kind: LayerKind) -> f64 {
        match kind {
            LayerKind::Local => self.rope_local_base_freq.unwrap_or(self.rope_theta),
            LayerKind::Global => self.rope_theta,
        }
    }

    /// RoPE scaling for a kind of layer: local layers with a base of their own
    /// (Gemma 3) are never scaled; the others share the global RoPE.
    pub fn rope_scaling_for(&self, kind: LayerKind) -> Option<&RopeScaling> {
        match kind {
            LayerKind::Local if self.rope_local_base_freq.is_some() => None,
            _ => self.rope_scaling.as_ref(),
        }
    }

    /// Whether layer `layer` rotates its queries and keys.
    pub fn layer_has_rope(&self, layer: usize) -> bool {
        !self.nope_layers.contains(&layer)
    }

    /// The factor attention scores are multiplied by: Granite's attention
    /// multiplier, else `query_pre_attn_scalar^-1/2` when set, else
    /// `head_dim^-1/2`. The same for every layer in the supported architectures;
    /// see [`ModelConfig::layer_attention_scale`].
    pub fn attention_scale(&self) -> f64 {
        match self.multipliers {
            Some(m) => m.attention,
            None => 1.0 / self.query_pre_attn_scalar.unwrap_or(self.dims.head_dim as f64).sqrt(),
        }
    }

    /// LongRoPE's attention factor squared on layer `layer`: it scales cos and
    /// sin, so the rotated dims' part of each score by its square (None: no
    /// such factor on this layer).
    fn rope_score_factor(&self, layer: usize) -> Option<f64> {
        match self.rope_scaling_for(self.layer_kind(layer)) {
            Some(RopeScaling::LongRope { attention_factor, .. }) if self.layer_has_rope(layer) && *attention_factor != 1.0 => {
                Some(attention_factor * attention_factor)
            }
            _ => None,
        }
    }

    /// The attention scale of layer `layer`: with every dim rotating, LongRoPE's
    /// factor squared scales the whole score; with RoPE on part of each head it
    /// is folded into the query rows of the rotated dims instead
    /// ([`ModelConfig::weight_scale`]).
    pub fn layer_attention_scale(&self, layer: usize) -> f64 {
        let rope = self.rope_score_factor(layer).filter(|_| self.rot_dim() == self.dims.head_dim);
        self.attention_scale() * rope.unwrap_or(1.0)
    }

    /// The factor a tensor's rows are multiplied by at load (None: as stored):
    /// Granite's logits divisor on the final norm's gain, and LongRoPE's
    /// attention factor squared on the query rows of the rotated dims of a
    /// partial rotary head (Phi-4-mini). Each is exact algebra (the logits, or
    /// the rotated part of each score, scaled); on a block-quantized weight the
    /// scaled block scales round to f16 once.
    pub fn weight_scale(&self, tensor: &str) -> Option<RowScale> {
        if let Some(m) = self.multipliers
            && tensor == "model.norm.weight"
        {
            return Some(RowScale::all(1.0 / m.logits_scaling));
        }
        let rest = tensor.strip_prefix("model.layers.")?;
        let (layer, part) = rest.split_once('.')?;
        let cols = match part {
            "self_attn.q_proj.weight" => self.dims.hidden_size,
            "self_attn.q_proj.bias" => 1,
            _ => return None,
        };
        if self.rot_dim() == self.dims.head_dim {
            return None;
        }
        let factor = self.rope_score_factor(layer.parse().ok()?)?;
        Some(RowScale { factor, cols, period: self.dims.head_dim, rows: 0..self.rot_dim() })
    }

    /// The dims of each head that RoPE rotates.
    pub fn rot_dim(&self) -> usize {
        self.rope_dim.unwrap_or(self.dims.head_dim)
    }

    /// The factor embeddings are multiplied by after the lookup (sqrt(hidden) for
    /// Gemma, computed exactly: transformers rounds it to the weights' dtype, which
    /// for bf16 checkpoints is 34.0 instead of 33.94 for Gemma 3 1B).
    pub fn embedding_scale(&self) -> f64 {
        match self.multipliers {
            // The stream is carried divided by the residual multiplier (`norm_eps`).
            Some(m) => m.embedding / m.residual,
            None if self.scale_embeddings => (self.dims.hidden_size as f64).sqrt(),
            None => 1.0,
        }
    }

    /// The eps of the RMSNorms over the residual stream. Granite multiplies each
    /// attention and MLP output by `m` before adding it to the stream h; the
    /// runtime carries h / m instead (embeddings scaled by `embedding / m`,
    /// branches added as they are), and since every reader of the stream is an
    /// RMSNorm, RMSNorm(h / m) with eps / m² is RMSNorm(h) with eps, exactly:
    /// no kernel takes the multiplier and no weight is rounded for it. (Norms
    /// over heads or over a branch keep `rms_norm_eps`; `validate` refuses a
    /// multiplier with them.)
    pub fn norm_eps(&self) -> f64 {
        let m = self.multipliers.map_or(1.0, |m| m.residual);
        self.rms_norm_eps / (m * m)
    }

    /// The MLP gate uses GELU (tanh) rather than SiLU.
    pub fn is_gelu(&self) -> bool {
        self.hidden_act == HiddenAct::GeluPytorchTanh
    }

    /// Extra norms after attention and around the MLP (Gemma 3: `post_attention_layernorm`
    /// normalizes the attention output, `pre_feedforward_layernorm` the MLP input,
    /// `post_feedforward_layernorm` its output).
    pub fn sandwich_norms(&self) -> bool {
        self.architecture.family().norms == Norms::Sandwich
    }

    /// Norms before attention and before the MLP (all but OLMo 2).
    pub fn pre_norms(&self) -> bool {
        self.architecture.family().norms != Norms::Post
    }

    /// Norms on the attention and MLP branches before their residual adds
    /// (Gemma 3, OLMo 2).
    pub fn branch_norms(&self) -> bool {
        matches!(self.architecture.family().norms, Norms::Sandwich | Norms::Post)
    }

    /// The q/k RMSNorm runs over each head (Qwen3, Gemma 3).
    pub fn qk_norm_per_head(&self) -> bool {
        self.qk_norm && !self.architecture.family().qk_norm_projection
    }

    /// The q/k RMSNorm runs over each whole projection (OLMo 2): gains of
    /// `q_dim` and `kv_dim`.
    pub fn qk_norm_projection(&self) -> bool {
        self.qk_norm && self.architecture.family().qk_norm_projection
    }

    /// Every tensor of the Hugging Face checkpoint with its shape (`[out, in]` for
    /// projections), in layer order.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, hd, q, kv, inter) = (self.dims.hidden_size, self.dims.head_dim, self.q_dim(), self.kv_dim(), self.dims.intermediate_size);
        let mut t = vec![("model.embed_tokens.weight".to_string(), vec![self.dims.vocab_size, h])];
        for l in 0..self.dims.num_layers {
            let mut add = |name: &str, shape: Vec<usize>| t.push((format!("model.layers.{l}.{name}"), shape));
            if self.pre_norms() {
                add("input_layernorm.weight", vec![h]);
            }
            for (p, rows) in [("q", q), ("k", kv), ("v", kv)] {
                add(&format!("self_attn.{p}_proj.weight"), vec![rows, h]);
                if self.attention_bias {
                    add(&format!("self_attn.{p}_proj.bias"), vec![rows]);
                }
            }
            add("self_attn.o_proj.weight", vec![h, q]);
            if self.qk_norm {
                let (qn, kn) = if self.qk_norm_projection() { (q, kv) } else { (hd, hd) };
                add("self_attn.q_norm.weight", vec![qn]);
                add("self_attn.k_norm.weight", vec![kn]);
            }
            // Llama's norm before the MLP; the attention branch's norm where the
            // family has branch norms.
            add("post_attention_layernorm.weight", vec![h]);
            if self.sandwich_norms() {
                add("pre_feedforward_layernorm.weight", vec![h]);
            }
            if self.branch_norms() {
                add("post_feedforward_layernorm.weight", vec![h]);
            }
            match self.moe_layer(l) {
                Some(m) => {
                    add("mlp.gate.weight", vec![m.experts, h]);
                    for e in 0..m.experts {
                        add(&format!("mlp.experts.{e}.gate_proj.weight"), vec![m.expert_ff, h]);
                        add(&format!("mlp.experts.{e}.up_proj.weight"), vec![m.expert_ff, h]);
                        add(&format!("mlp.experts.{e}.down_proj.weight"), vec![h, m.expert_ff]);
                    }
                }
                None => {
                    add("mlp.gate_proj.weight", vec![inter, h]);
                    add("mlp.up_proj.weight", vec![inter, h]);
                    add("mlp.down_proj.weight", vec![h, inter]);
                }
            }
        }
        t.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            t.push(("lm_head.weight".to_string(), vec![self.dims.vocab_size, h]));
        }
        t
    }

    /// Layer `l`'s mixture of experts (None: a dense MLP there).
    pub fn moe_layer(&self, l: usize) -> Option<&Moe> {
        self.moe.as_ref().filter(|m| !m.dense_layers.contains(&l))
    }

    /// Parameters a token reads: every one but the experts it does not route to
    /// (all of them for a dense model).
    pub fn active_param_count(&self) -> u64 {
        self.param_count() - self.idle_expert_params()
    }

    /// Parameters of the experts a token does not route to, in all layers.
    fn idle_expert_params(&self) -> u64 {
        (0..self.dims.num_layers)
            .filter_map(|l| self.moe_layer(l))
            .map(|m| (m.experts.saturating_sub(m.top_k) * 3 * m.expert_ff * self.dims.hidden_size) as u64)
            .sum()
    }

    /// Number of parameters (a tied embedding counted once).
    pub fn param_count(&self) -> u64 {
        self.tensor_shapes().iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum()
    }

    /// Parameters of the transformer layers only (no embedding, final norm or LM head).
    pub fn layer_param_count(&self) -> u64 {
        let embed_and_head = (self.dims.vocab_size * self.dims.hidden_size) as u64 * if self.tie_word_embeddings { 1 } else { 2 };
        self.param_count() - embed_and_head - self.dims.hidden_size as u64
    }

    /// Bytes of weights one decoded token reads when every weight is stored as
    /// `dtype`: every layer tensor (of a mixture of experts, the router and the
    /// `top_k` experts it picks), the final norm and the LM head once each, plus
    /// one embedding row (the rest of an untied embedding matrix is never read).
    pub fn weight_bytes_per_token(&self, dtype: impl ElemBytes) -> u64 {
        let elems = self.layer_param_count() - self.idle_expert_params()
            + self.dims.hidden_size as u64
            + (self.dims.vocab_size * self.dims.hidden_size) as u64
            + self.dims.hidden_size as u64;
        dtype.bytes_for_elems(elems)
    }

    /// Bytes of K and V cache one position of context takes in all layers.
    pub fn kv_cache_bytes_per_position(&self, dtype: impl ElemBytes) -> u64 {
        dtype.bytes_for_elems((2 * self.dims.num_layers * self.kv_dim()) as u64)
    }

    /// Checks that the fields agree with each other; the error says which do not.
    pub fn validate(&self) -> Result<()> {
        let mut bad = zero_fields(&[
            ("vocab_size", self.dims.vocab_size),
            ("hidden_size", self.dims.hidden_size),
            ("intermediate_size", self.dims.intermediate_size),
            ("num_layers", self.dims.num_layers),
            ("num_heads", self.dims.num_heads),
            ("num_kv_heads", self.dims.num_kv_heads),
            ("head_dim", self.dims.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ]);
        if self.dims.num_kv_heads > 0 && !self.dims.num_heads.is_multiple_of(self.dims.num_kv_heads) {
            bad.push(format!("num_heads ({}) is not a multiple of num_kv_heads ({})", self.dims.num_heads, self.dims.num_kv_heads));
        }
        if !self.dims.head_dim.is_multiple_of(2) {
            bad.push(format!("head_dim ({}) is odd: RoPE rotates pairs", self.dims.head_dim));
        }
        if self.layer_types.len() != self.dims.num_layers {
            bad.push(format!("layer_types has {} entries for {} layers", self.layer_types.len(), self.dims.num_layers));
        }
        if let Some(l) = self.nope_layers.iter().find(|&&l| l >= self.dims.num_layers) {
            bad.push(format!("nope_layers names layer {l} of {}", self.dims.num_layers));
        }
        if let Some(m) = &self.moe {
            if m.experts == 0 || m.expert_ff == 0 {
                bad.push(format!("a mixture of {} experts of width {}: both must be above 0", m.experts, m.expert_ff));
            }
            if m.top_k == 0 || m.top_k > m.experts {
                bad.push(format!("{} experts per token of {}: must be 1 to the experts", m.top_k, m.experts));
            }
            if let Some(l) = m.dense_layers.iter().find(|&&l| l >= self.dims.num_layers) {
                bad.push(format!("the dense MLP layers name layer {l} of {}", self.dims.num_layers));
            }
        }
        if self.num_local_layers() > 0 && self.sliding_window.is_none_or(|w| w == 0) {
            bad.push("local layers need a sliding_window above 0".to_string());
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.rms_norm_eps) {
            bad.push(format!("rms_norm_eps ({}) must be positive", self.rms_norm_eps));
        }
        for (name, v) in [("rope_theta", Some(self.rope_theta)), ("rope_local_base_freq", self.rope_local_base_freq)] {
            if let Some(v) = v
                && !(v.is_finite() && v > 1.0)
            {
                bad.push(format!("{name} ({v}) must be above 1"));
            }
        }
        let m = self.multipliers;
        for (name, v) in [
            ("embedding_multiplier", m.map(|m| m.embedding)),
            ("attention_multiplier", m.map(|m| m.attention)),
            ("residual_multiplier", m.map(|m| m.residual)),
            ("logits_scaling", m.map(|m| m.logits_scaling)),
            ("query_pre_attn_scalar", self.query_pre_attn_scalar),
            ("final_logit_softcapping", self.final_logit_softcapping),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
        ] {
            if let Some(v) = v
                && !positive(v)
            {
                bad.push(format!("{name} ({v}) must be positive"));
            }
        }
        if m.is_some_and(|m| m.residual != 1.0) && (self.qk_norm || self.branch_norms()) {
            bad.push("a residual multiplier with q/k norms or norms on the branches (the stream's scale would reach them)".to_string());
        }
        match &self.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) if !positive(*factor) => {
                bad.push(format!("linear rope_scaling factor ({factor}) must be positive"));
            }
            Some(RopeScaling::Linear { .. }) => {}
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
                if !positive(*factor) || !positive(*low_freq_factor) || !positive(*high_freq_factor) {
                    bad.push("llama3 rope_scaling factors must be positive".to_string());
                }
                if low_freq_factor >= high_freq_factor {
                    bad.push(format!(
                        "llama3 rope_scaling: low_freq_factor ({low_freq_factor}) must be below high_freq_factor ({high_freq_factor})"
                    ));
                }
                if *original_max_position_embeddings == 0 {
                    bad.push("llama3 rope_scaling: original_max_position_embeddings is 0".to_string());
                }
            }
            Some(RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, attention_factor }) => {
                let pairs = self.rot_dim() / 2;
                for (name, f) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                    if f.len() != pairs {
                        bad.push(format!("longrope {name} has {} values for {pairs} rotated pairs", f.len()));
                    }
                    if !f.iter().all(|&v| positive(v)) {
                        bad.push(format!("longrope {name} values must be positive"));
                    }
                }
                if *original_max_position_embeddings == 0 {
                    bad.push("longrope original_max_position_embeddings is 0".to_string());
                }
                if !positive(*attention_factor) {
                    bad.push(format!("longrope attention_factor ({attention_factor}) must be positive"));
                }
            }
        }
        if let Some(r) = self.rope_dim
            && !(r >= 2 && r <= self.dims.head_dim && r.is_multiple_of(2))
        {
            bad.push(format!("rope_dim ({r}) must be even, above 0 and at most head_dim ({})", self.dims.head_dim));
        }
        for t in self.bos_token_id.iter().chain(&self.eos_token_ids) {
            if *t as usize >= self.dims.vocab_size {
                bad.push(format!("special token {t} is outside the vocabulary ({})", self.dims.vocab_size));
            }
        }
        if bad.is_empty() { Ok(()) } else { Err(ModelError::Invalid(bad.join("; "))) }
    }
}

/// "NAME is 0" for each of `fields` that is (a config check's first findings).
pub(super) fn zero_fields(fields: &[(&str, usize)]) -> Vec<String> {
    fields.iter().filter(|(_, v)| *v == 0).map(|(name, _)| format!("{name} is 0")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names profiles, reports and GGUF metadata spell (derived by strum).
    #[test]
    fn names_are_the_published_spellings() {
        let arch: Vec<_> = <Architecture as strum::IntoEnumIterator>::iter().map(Architecture::name).collect();
        assert_eq!(arch, ["llama", "qwen2", "qwen3", "mistral", "smollm3", "gemma3", "phi3", "granite", "olmo2", "qwen3_moe", "olmoe"]);
        assert_eq!(Architecture::Gemma3.to_string(), "gemma3");
        assert_eq!([LayerKind::Global.name(), LayerKind::Local.name()], ["global", "local"]);
        assert_eq!([HiddenAct::Silu.name(), HiddenAct::GeluPytorchTanh.name()], ["silu", "gelu_pytorch_tanh"]);
        assert_eq!([Dtype::F32.name(), Dtype::F16.name(), Dtype::BF16.name()], ["f32", "f16", "bf16"]);
        assert_eq!(Dtype::BF16.to_string(), "bf16");
    }
}
