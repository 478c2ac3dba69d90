//! The decoder families ktune runs, each described once ([`FAMILIES`]): what the
//! family changes in a plain pre-norm decoder (Llama's: RMSNorm before attention
//! and before the MLP, SwiGLU, RoPE on every layer, no biases) and where its files
//! say so. [`ModelConfig::new`](super::ModelConfig::new), the `config.json` reader,
//! the GGUF reader, the tensor names and the plan read these descriptions; none of
//! them names a family.
//!
//! Adding a family: a variant of [`Architecture`], its row here, its built-in
//! shapes in `builtin.rs`, its tokenizer pre-split in `tokenizer.rs` when it is a
//! new one, and its tiny random model in `tools/make_fixtures.py`.

use serde::{Deserialize, Serialize};

/// The decoder families ktune knows how to run; what each one is lives in its row
/// of [`FAMILIES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::Display, strum::EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 3.x, SmolLM2).
    Llama,
    /// `Qwen2ForCausalLM` (Qwen2.5).
    Qwen2,
    /// `Qwen3ForCausalLM` (Qwen3 dense).
    Qwen3,
    /// `MistralForCausalLM` (Mistral 7B, Ministral).
    Mistral,
    /// `SmolLM3ForCausalLM`.
    #[serde(rename = "smollm3")]
    #[strum(serialize = "smollm3")]
    SmolLM3,
    /// `Gemma3ForCausalLM` (text).
    Gemma3,
    /// `Phi3ForCausalLM` (Phi-3, Phi-3.5-mini, Phi-4-mini).
    Phi3,
    /// `GraniteForCausalLM` (IBM Granite 3.x dense).
    Granite,
    /// `Olmo2ForCausalLM` (OLMo 2).
    Olmo2,
    /// `Qwen3MoeForCausalLM` (Qwen3's mixtures of experts: 30B-A3B, 235B-A22B).
    #[serde(rename = "qwen3_moe")]
    #[strum(serialize = "qwen3_moe")]
    Qwen3Moe,
    /// `OlmoeForCausalLM` (OLMoE-1B-7B).
    Olmoe,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The MLP activation (the gate of the gated MLP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum HiddenAct {
    /// x * sigmoid(x) (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU), `gelu_pytorch_tanh` in transformers.
    GeluPytorchTanh,
}

impl HiddenAct {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Where a layer's norms stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norms {
    /// One norm before attention, one before the MLP (Llama).
    Pre,
    /// Also one after attention and one after the MLP, each normalizing the branch
    /// before it is added to the residual stream (Gemma 3).
    Sandwich,
    /// Only the norms after attention and after the MLP, on the branches; the
    /// projections read the residual stream as it is (OLMo 2).
    Post,
}

/// Which layers attend to a sliding window, and where the config says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// None: every layer sees the whole context; `sliding_attention` layers in
    /// `layer_types` and `use_sliding_window: true` are refused.
    Never,
    /// `layer_types`, else `sliding_window_pattern` (every n-th layer global,
    /// default 6), with `sliding_window` as the span (default 4096): Gemma 3.
    Pattern,
    /// Every layer, when `sliding_window` is set (`null` turns it off); `default`
    /// when the key is absent (Mistral: 4096; Phi-3: none).
    EveryLayer { default: Option<usize> },
}

/// One family's description (see the module doc).
#[derive(Debug)]
pub struct Family {
    pub arch: Architecture,
    /// The `architectures[0]` class of its Hugging Face `config.json`.
    pub hf_class: &'static str,
    /// Its `model_type`.
    pub model_type: &'static str,
    /// Its `general.architecture` in GGUF files, when llama.cpp's converter gives
    /// it one of its own (Mistral's files say `llama`).
    pub gguf_arch: Option<&'static str>,
    pub norms: Norms,
    /// `(1 + w)` norm gains instead of `w` (stored as `w + 1` in GGUF files).
    pub unit_offset_norms: bool,
    /// Biases on the Q, K and V projections, always (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of the queries and keys before RoPE: over each head, or with
    /// `qk_norm_projection` over each whole projection (OLMo 2).
    pub qk_norm: bool,
    pub qk_norm_projection: bool,
    /// Embeddings multiplied by sqrt(hidden_size) after the lookup.
    pub scale_embeddings: bool,
    /// The MLP gate's activation when the config names none.
    pub hidden_act: HiddenAct,
    /// The head width when the config gives no `head_dim` (else hidden / heads).
    pub head_dim: Option<usize>,
    /// Defaults of the config class for keys a `config.json` may leave out.
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub rope_theta: f64,
    /// The RoPE base of sliding-window layers, when they have their own.
    pub local_rope_theta: Option<f64>,
    pub window: Window,
    /// Reads `query_pre_attn_scalar` and the logit soft-caps (Gemma).
    pub soft_caps: bool,
    /// Some layers skip RoPE: `no_rope_layers` (1 where RoPE applies) or every
    /// `no_rope_layer_interval`-th layer (default 4) without it (SmolLM3).
    pub nope_layers: bool,
    /// llama.cpp's converter permutes the Q and K rows of its GGUF files for its
    /// interleaved RoPE (undone on load).
    pub gguf_permuted_qk: bool,
    /// Q, K and V are one `qkv_proj` tensor, gate and up one `gate_up_proj` (gate
    /// rows first), in its files (GGUF: `attn_qkv`, and `ffn_up` of twice the
    /// width): served as row views under the separate names (Phi-3).
    pub fused_projections: bool,
    /// Scalar multipliers on the embeddings, attention scores, residual branches
    /// and logits ([`Multipliers`](super::config::Multipliers): Granite).
    pub multipliers: bool,
    /// A mixture of experts in place of the MLP ([`Moe`](super::config::Moe):
    /// Qwen3-MoE, OLMoE), read from `num_experts` (or `num_local_experts`),
    /// `num_experts_per_tok`, `moe_intermediate_size` (else `intermediate_size`),
    /// `norm_topk_prob`, `decoder_sparse_step`, `mlp_only_layers`; GGUF
    /// `expert_count`, `expert_used_count`, `expert_feed_forward_length` (else
    /// `feed_forward_length`), no key saying whether the chosen experts' weights
    /// are renormalised: llama.cpp's graph of the architecture decides, and so
    /// does this.
    pub moe: Option<MoeFamily>,
}

/// What a mixture-of-experts family's GGUF files leave to the architecture.
#[derive(Debug, Clone, Copy)]
pub struct MoeFamily {
    /// The chosen experts' weights renormalised to sum to 1 (llama.cpp's `norm_w`:
    /// Qwen3-MoE yes, OLMoE no).
    pub gguf_norm_top_k: bool,
}

/// The plain pre-norm decoder every family starts from.
const PLAIN: Family = Family {
    arch: Architecture::Llama,
    hf_class: "LlamaForCausalLM",
    model_type: "llama",
    gguf_arch: Some("llama"),
    norms: Norms::Pre,
    unit_offset_norms: false,
    qkv_bias: false,
    qk_norm: false,
    qk_norm_projection: false,
    scale_embeddings: false,
    hidden_act: HiddenAct::Silu,
    head_dim: None,
    max_position_embeddings: 2048,
    tie_word_embeddings: false,
    rope_theta: 10_000.0,
    local_rope_theta: None,
    window: Window::Never,
    soft_caps: false,
    nope_layers: false,
    gguf_permuted_qk: true,
    fused_projections: false,
    multipliers: false,
    moe: None,
};

/// Every family, one row each.
pub const FAMILIES: &[Family] = &[
    // Llama 3.x, SmolLM2.
    PLAIN,
    // Qwen2.5: biases on Q, K and V.
    Family {
        arch: Architecture::Qwen2,
        hf_class: "Qwen2ForCausalLM",
        model_type: "qwen2",
        gguf_arch: Some("qwen2"),
        qkv_bias: true,
        max_position_embeddings: 32_768,
        gguf_permuted_qk: false,
        ..PLAIN
    },
    // Qwen3: no biases, per-head q/k RMSNorm, head_dim of its own (128).
    Family {
        arch: Architecture::Qwen3,
        hf_class: "Qwen3ForCausalLM",
        model_type: "qwen3",
        gguf_arch: Some("qwen3"),
        qk_norm: true,
        head_dim: Some(128),
        max_position_embeddings: 32_768,
        gguf_permuted_qk: false,
        ..PLAIN
    },
    // Mistral 7B, Ministral: a sliding window on every layer when set.
    Family {
        arch: Architecture::Mistral,
        hf_class: "MistralForCausalLM",
        model_type: "mistral",
        gguf_arch: None,
        max_position_embeddings: 131_072,
        window: Window::EveryLayer { default: Some(4096) },
        ..PLAIN
    },
    // SmolLM3: every fourth layer without RoPE.
    Family {
        arch: Architecture::SmolLM3,
        hf_class: "SmolLM3ForCausalLM",
        model_type: "smollm3",
        gguf_arch: Some("smollm3"),
        max_position_embeddings: 32_768,
        tie_word_embeddings: true,
        rope_theta: 2_000_000.0,
        nope_layers: true,
        ..PLAIN
    },
    // Gemma 3 (text): (1 + w) norms around attention and the MLP, per-head q/k
    // norms, GeGLU, sqrt(hidden) embeddings, 5 local : 1 global layers with a RoPE
    // base of their own, soft-caps.
    Family {
        arch: Architecture::Gemma3,
        hf_class: "Gemma3ForCausalLM",
        model_type: "gemma3_text",
        gguf_arch: Some("gemma3"),
        norms: Norms::Sandwich,
        unit_offset_norms: true,
        qk_norm: true,
        scale_embeddings: true,
        hidden_act: HiddenAct::GeluPytorchTanh,
        head_dim: Some(256),
        max_position_embeddings: 131_072,
        tie_word_embeddings: true,
        rope_theta: 1_000_000.0,
        local_rope_theta: Some(10_000.0),
        window: Window::Pattern,
        soft_caps: true,
        gguf_permuted_qk: false,
        ..PLAIN
    },
    // Phi-3 / Phi-4-mini: Q/K/V and gate/up fused in the file, RoPE on part of
    // each head (`partial_rotary_factor`, Phi-4-mini 0.75) with LongRoPE scaling,
    // a sliding window on every layer when set (Phi-3-mini: 2047).
    Family {
        arch: Architecture::Phi3,
        hf_class: "Phi3ForCausalLM",
        model_type: "phi3",
        gguf_arch: Some("phi3"),
        max_position_embeddings: 4096,
        window: Window::EveryLayer { default: None },
        gguf_permuted_qk: false,
        fused_projections: true,
        ..PLAIN
    },
    // Granite 3.x: Llama with four scalar multipliers (embeddings, attention
    // scale, residual branches, logits).
    Family {
        arch: Architecture::Granite,
        hf_class: "GraniteForCausalLM",
        model_type: "granite",
        gguf_arch: Some("granite"),
        tie_word_embeddings: true,
        multipliers: true,
        ..PLAIN
    },
    // OLMo 2: norms after attention and the MLP only (on the branches), q/k
    // RMSNorm over each whole projection.
    Family {
        arch: Architecture::Olmo2,
        hf_class: "Olmo2ForCausalLM",
        model_type: "olmo2",
        gguf_arch: Some("olmo2"),
        norms: Norms::Post,
        qk_norm: true,
        qk_norm_projection: true,
        max_position_embeddings: 2048,
        rope_theta: 500_000.0,
        gguf_permuted_qk: false,
        ..PLAIN
    },
    // Qwen3-MoE: Qwen3's attention, a mixture of experts for the MLP.
    Family {
        arch: Architecture::Qwen3Moe,
        hf_class: "Qwen3MoeForCausalLM",
        model_type: "qwen3_moe",
        gguf_arch: Some("qwen3moe"),
        qk_norm: true,
        head_dim: Some(128),
        max_position_embeddings: 32_768,
        gguf_permuted_qk: false,
        moe: Some(MoeFamily { gguf_norm_top_k: true }),
        ..PLAIN
    },
    // OLMoE: pre-norms, q/k RMSNorm over each whole projection (OLMo 2's), a
    // mixture of experts for the MLP, the chosen experts' weights as the softmax
    // gives them.
    Family {
        arch: Architecture::Olmoe,
        hf_class: "OlmoeForCausalLM",
        model_type: "olmoe",
        gguf_arch: Some("olmoe"),
        qk_norm: true,
        qk_norm_projection: true,
        max_position_embeddings: 4096,
        gguf_permuted_qk: false,
        moe: Some(MoeFamily { gguf_norm_top_k: false }),
        ..PLAIN
    },
];

impl Architecture {
    /// This family's description.
    pub fn family(self) -> &'static Family {
        FAMILIES.iter().find(|f| f.arch == self).expect("every architecture has a row in FAMILIES (checked by a test)")
    }
}

/// SmolLM3's layers without RoPE: every `interval`-th (4 in its config class and
/// in llama.cpp).
pub fn nope_every(layers: usize, interval: usize) -> Vec<usize> {
    (0..layers).filter(|l| (l + 1) % interval.max(1) == 0).collect()
}

/// The family a `config.json`'s class names.
pub fn by_hf_class(class: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.hf_class == class)
}

/// The family a `config.json`'s `model_type` names.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.model_type == model_type)
}

/// The family a GGUF file's `general.architecture` names.
pub fn by_gguf_arch(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.gguf_arch == Some(name))
}

/// The names `field` gives the families that have one, for an error's list.
pub fn names(field: impl Fn(&Family) -> Option<&'static str>) -> String {
    FAMILIES.iter().filter_map(field).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    #[test]
    fn every_architecture_has_one_row_and_its_names_are_unique() {
        for arch in Architecture::iter() {
            assert_eq!(FAMILIES.iter().filter(|f| f.arch == arch).count(), 1, "{arch}");
        }
        for field in [|f: &Family| Some(f.hf_class), |f: &Family| Some(f.model_type), |f: &Family| f.gguf_arch] {
            let mut all: Vec<_> = FAMILIES.iter().filter_map(field).collect();
            let n = all.len();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), n, "{all:?}");
        }
    }
}
