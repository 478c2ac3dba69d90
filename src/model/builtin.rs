//! Built-in configs of published models, with the shapes of their Hugging Face
//! `config.json` (for `tune --model NAME` and `run --model NAME` without files).

use super::config::{Architecture, Dims, LayerKind, ModelConfig, Moe, Multipliers, RopeScaling};
use super::{ModelError, Result, VisionConfig};

/// Names accepted by [`builtin`], with the checkpoint each one mirrors and the
/// published GGUF repository of its instruct model on the Hugging Face Hub (what
/// `--hf NAME` downloads).
const MODELS: [(&str, &str, &str); 17] = [
    ("gemma3-1b", "google/gemma-3-1b-it", "ggml-org/gemma-3-1b-it-GGUF"),
    ("gemma3-4b", "google/gemma-3-4b-it (text model and SigLIP vision tower)", "ggml-org/gemma-3-4b-it-GGUF"),
    ("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "bartowski/Llama-3.2-1B-Instruct-GGUF"),
    ("llama-3.2-3b", "meta-llama/Llama-3.2-3B", "bartowski/Llama-3.2-3B-Instruct-GGUF"),
    ("llama-3.1-8b", "meta-llama/Llama-3.1-8B", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct-GGUF"),
    ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct-GGUF"),
    ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M", "bartowski/SmolLM2-135M-Instruct-GGUF"),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B-GGUF"),
    ("qwen3-1.7b", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B-GGUF"),
    ("qwen3-4b", "Qwen/Qwen3-4B", "Qwen/Qwen3-4B-GGUF"),
    ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-GGUF"),
    ("smollm3-3b", "HuggingFaceTB/SmolLM3-3B", "ggml-org/SmolLM3-3B-GGUF"),
    ("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", "bartowski/Mistral-7B-Instruct-v0.3-GGUF"),
    ("phi-4-mini", "microsoft/Phi-4-mini-instruct", "bartowski/microsoft_Phi-4-mini-instruct-GGUF"),
    ("granite-3.3-2b", "ibm-granite/granite-3.3-2b-instruct", "ibm-granite/granite-3.3-2b-instruct-GGUF"),
    ("olmo2-1b", "allenai/OLMo-2-0425-1B-Instruct", "allenai/OLMo-2-0425-1B-Instruct-GGUF"),
];

/// The published GGUF repository of the built-in model `name` (case-insensitive).
pub fn builtin_repo(name: &str) -> Option<&'static str> {
    MODELS.iter().find(|(n, _, _)| n.eq_ignore_ascii_case(name)).map(|(_, _, r)| *r)
}

/// The names of the built-in models.
pub fn builtin_names() -> Vec<&'static str> {
    MODELS.iter().map(|(n, _, _)| *n).collect()
}

/// The vision tower and projector of the built-in model `name`, if it has one:
/// gemma3-4b's SigLIP So400m tower (896 px images, 14 px patches, 27 layers of
/// width 1152) pooled 4x4 to 256 soft tokens, as its published `config.json`.
pub fn builtin_vision(name: &str) -> Option<VisionConfig> {
    match name.to_ascii_lowercase().as_str() {
        "gemma3-4b" => Some(VisionConfig {
            hidden_size: 1152,
            intermediate_size: 4304,
            num_layers: 27,
            num_heads: 16,
            num_channels: 3,
            image_size: 896,
            patch_size: 14,
            layer_norm_eps: 1e-6,
            mm_tokens_per_image: 256,
            image_token_id: 262_144,
            boi_token_id: 255_999,
            eoi_token_id: 256_000,
            text_hidden_size: 2560,
        }),
        _ => None,
    }
}

/// The built-in config called `name` (case-insensitive).
pub fn builtin(name: &str) -> Result<ModelConfig> {
    let cfg = match name.to_ascii_lowercase().as_str() {
        "gemma3-1b" => gemma3(1152, 6912, 26, 4, 1, 262_144, 512, 32_768, None),
        "gemma3-4b" => gemma3(2560, 10_240, 34, 8, 4, 262_208, 1024, 131_072, Some(RopeScaling::Linear { factor: 8.0 })),
        "llama-3.2-1b" => llama32(2048, 16, 32, 64),
        "llama-3.2-3b" => llama32(3072, 28, 24, 128),
        "llama-3.1-8b" => ModelConfig { tie_word_embeddings: false, ..llama3(dims(128_256, 4096, 14_336, 32, 32, 8, 128), 8.0) },
        "qwen2.5-0.5b" => qwen25(896, 4864, 24, 14),
        "qwen2.5-1.5b" => qwen25(1536, 8960, 28, 12),
        "smollm2-135m" => ModelConfig {
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            max_position_embeddings: 8192,
            // <|endoftext|> (base); <|im_start|> / <|im_end|> are 1 and 2 in the instruct model.
            bos_token_id: Some(0),
            eos_token_ids: vec![0, 2],
            ..ModelConfig::new(Architecture::Llama, dims(49_152, 576, 1536, 30, 9, 3, 64))
        },
        "qwen3-0.6b" => qwen3(1024, 3072, 28, 16),
        "qwen3-1.7b" => qwen3(2048, 6144, 28, 16),
        "qwen3-4b" => qwen3(2560, 9728, 36, 32),
        // 128 experts of width 768 on every layer, 8 a token (3.3B of 30.5B read).
        "qwen3-30b-a3b" => ModelConfig {
            tie_word_embeddings: false,
            moe: Some(Moe { experts: 128, top_k: 8, expert_ff: 768, norm_top_k: true, dense_layers: Vec::new() }),
            ..qwen(Architecture::Qwen3Moe, dims(151_936, 2048, 6144, 48, 32, 4, 128), 40_960)
        },
        "smollm3-3b" => ModelConfig {
            rope_theta: 5_000_000.0,
            max_position_embeddings: 65_536,
            nope_layers: super::family::nope_every(36, 4),
            // <|im_end|>.
            eos_token_ids: vec![128_012],
            ..ModelConfig::new(Architecture::SmolLM3, dims(128_256, 2048, 11_008, 36, 16, 4, 128))
        },
        "mistral-7b" => ModelConfig {
            rms_norm_eps: 1e-5,
            rope_theta: 1_000_000.0,
            max_position_embeddings: 32_768,
            tie_word_embeddings: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            ..ModelConfig::new(Architecture::Mistral, dims(32_768, 4096, 14_336, 32, 32, 8, 128))
        },
        // RoPE on 96 of each head's 128 dims. Its LongRoPE factors (48 pairs a
        // context length) are left out: they change frequencies, not a shape or a
        // kernel, and synthetic weights have no output to keep.
        "phi-4-mini" => ModelConfig {
            rms_norm_eps: 1e-5,
            max_position_embeddings: 131_072,
            rope_dim: Some(96),
            // <|endoftext|>; <|end|> ends a turn.
            bos_token_id: Some(199_999),
            eos_token_ids: vec![199_999, 200_020],
            ..ModelConfig::new(Architecture::Phi3, dims(200_064, 3072, 8192, 32, 24, 8, 128))
        },
        // Llama 3.2 1B's layer shapes, 40 of them, and Granite's multipliers.
        "granite-3.3-2b" => ModelConfig {
            rms_norm_eps: 1e-5,
            rope_theta: 10_000_000.0,
            max_position_embeddings: 131_072,
            multipliers: Some(Multipliers { embedding: 12.0, attention: 0.015625, residual: 0.22, logits_scaling: 8.0 }),
            // <|end_of_text|>.
            bos_token_id: Some(0),
            eos_token_ids: vec![0],
            ..ModelConfig::new(Architecture::Granite, dims(49_159, 2048, 8192, 40, 32, 8, 64))
        },
        "olmo2-1b" => ModelConfig {
            rope_theta: 500_000.0,
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            // <|endoftext|>.
            bos_token_id: Some(100_257),
            eos_token_ids: vec![100_257],
            ..ModelConfig::new(Architecture::Olmo2, dims(100_352, 2048, 8192, 16, 16, 16, 128))
        },
        _ => return Err(ModelError::UnknownModel { name: name.to_string(), known: known() }),
    };
    Ok(cfg)
}

/// A published model's dimensions in the order its config lists them: vocabulary,
/// hidden width, MLP width, layers, query heads, key/value heads, head width.
fn dims(vocab: usize, hidden: usize, inter: usize, layers: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Dims {
    Dims {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
    }
}

fn known() -> String {
    MODELS.iter().map(|(n, hf, _)| format!("{n} ({hf})")).collect::<Vec<_>>().join(", ")
}

/// Gemma 3 text models: head_dim 256, 5 local layers then 1 global, local RoPE
/// base 10 000, global 1 000 000, query_pre_attn_scalar 256.
#[allow(clippy::too_many_arguments)]
fn gemma3(
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    vocab: usize,
    window: usize,
    max_pos: usize,
    scaling: Option<RopeScaling>,
) -> ModelConfig {
    let dims = dims(vocab, hidden, inter, layers, heads, kv_heads, 256);
    ModelConfig {
        rope_theta: 1_000_000.0,
        rope_local_base_freq: Some(10_000.0),
        rope_scaling: scaling,
        max_position_embeddings: max_pos,
        sliding_window: Some(window),
        layer_types: gemma3_pattern(layers, 6),
        query_pre_attn_scalar: Some(256.0),
        bos_token_id: Some(2),
        // <eos> and <end_of_turn>.
        eos_token_ids: vec![1, 106],
        ..ModelConfig::new(Architecture::Gemma3, dims)
    }
}

/// Gemma 3's `sliding_window_pattern`: every `pattern`-th layer is global.
pub(super) fn gemma3_pattern(layers: usize, pattern: usize) -> Vec<LayerKind> {
    (0..layers).map(|i| if pattern > 0 && (i + 1) % pattern == 0 { LayerKind::Global } else { LayerKind::Local }).collect()
}

/// Llama 3.2: intermediate 8192, 8 KV heads, tied embeddings, and what every
/// Llama 3.x shares ([`llama3`]) with its RoPE scaled by 32.
fn llama32(hidden: usize, layers: usize, heads: usize, head_dim: usize) -> ModelConfig {
    let dims = Dims {
        vocab_size: 128_256,
        hidden_size: hidden,
        intermediate_size: 8192,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: 8,
        head_dim,
    };
    llama3(dims, 32.0)
}

/// Llama 3.x: RoPE 500 000 with llama3 scaling (`factor`, 1, 4, 8192), 131 072
/// positions, vocabulary 128 256, its special tokens.
fn llama3(dims: Dims, factor: f64) -> ModelConfig {
    ModelConfig {
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        max_position_embeddings: 131_072,
        // <|begin_of_text|>; <|end_of_text|>, <|eom_id|>, <|eot_id|>.
        bos_token_id: Some(128_000),
        eos_token_ids: vec![128_001, 128_008, 128_009],
        ..ModelConfig::new(Architecture::Llama, dims)
    }
}

/// Qwen2.5: 2 KV heads, head_dim 64 or 128 (hidden / heads), biases on Q/K/V,
/// 32 768 positions, and what every Qwen shares ([`qwen`]).
fn qwen25(hidden: usize, inter: usize, layers: usize, heads: usize) -> ModelConfig {
    qwen(Architecture::Qwen2, dims(151_936, hidden, inter, layers, heads, 2, hidden / heads), 32_768)
}

/// Qwen3 (dense): 8 KV heads of width 128 (not hidden / heads), per-head q/k
/// norms, no biases, 40 960 positions, and what every Qwen shares ([`qwen`]).
fn qwen3(hidden: usize, inter: usize, layers: usize, heads: usize) -> ModelConfig {
    qwen(Architecture::Qwen3, dims(151_936, hidden, inter, layers, heads, 8, 128), 40_960)
}

/// The Qwen family's shared traits: RoPE 1 000 000, tied embeddings (the small
/// models), vocabulary 151 936 and its special tokens.
fn qwen(arch: Architecture, dims: Dims, max_pos: usize) -> ModelConfig {
    ModelConfig {
        rope_theta: 1_000_000.0,
        max_position_embeddings: max_pos,
        // <|endoftext|>; <|im_end|> ends a chat turn.
        bos_token_id: Some(151_643),
        eos_token_ids: vec![151_643, 151_645],
        ..ModelConfig::new(arch, dims)
    }
}
