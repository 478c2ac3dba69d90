//! A GGUF file as a model: its metadata mapped onto a [`ModelConfig`] (the
//! architectures of [`family::FAMILIES`], as llama.cpp's `convert_hf_to_gguf.py`
//! writes them)
//! and its tensor names onto the Hugging Face names the plan uses, with the
//! converter's changes undone on load:
//!
//! - `llama`, `smollm3`: the converter permutes the rows of Q and K (`LlamaModel.permute`,
//!   interleaving the two RoPE halves of each head); [`Transform::Unpermute`]
//!   restores Hugging Face's order (a reordering of whole rows, so quantized
//!   rows are reordered as they are).
//! - `gemma3`: the converter stores RMSNorm gains as `1 + w`; the runtime uses
//!   the Gemma `(1 + w)` form, so [`Transform::MinusOne`] subtracts 1 (in f32, as
//!   transformers' GGUF loader does).
//! - `llama` with a `rope_freqs.weight` tensor (Llama 3.1+): the per-frequency
//!   factors are matched against Llama 3 RoPE scaling.
//!
//! Where llama.cpp and transformers' GGUF loader disagree, the file means what
//! llama.cpp computes: Gemma 3 scales attention by `key_length^-1/2` (transformers
//! falls back to its config default `query_pre_attn_scalar = 256`).

use super::config::{Architecture, Dims, LayerKind, ModelConfig, RopeScaling};
use super::family;
use super::gguf::{GgufFile, MetaReader, Value};
use super::{ModelError, Result};
use crate::kernels::reference::{Llama3Scaling, rope_inv_freq};

/// How a stored tensor differs from the Hugging Face tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transform {
    None,
    /// Rows were permuted by llama.cpp's `permute(w, n_head)` with this many heads.
    Unpermute {
        heads: usize,
    },
    /// 1 was added to every value (Gemma norms).
    MinusOne,
    /// Rows `first..` of a fused tensor (Phi-3's `attn_qkv`, its gate/up `ffn_up`),
    /// served as one of its parts.
    Rows {
        first: usize,
    },
}

impl Transform {
    /// The stored row that holds row `r` of the Hugging Face tensor with `rows` rows.
    pub fn source_row(self, r: usize, rows: usize) -> usize {
        match self {
            Transform::Unpermute { heads } if heads > 0 && rows.is_multiple_of(2 * heads) => {
                // Stored [head, i, half] holds Hugging Face [head, half, i].
                let hd = rows / heads;
                let half = hd / 2;
                let (h, rem) = (r / hd, r % hd);
                h * hd + 2 * (rem % half) + rem / half
            }
            Transform::Rows { first } => first + r,
            _ => r,
        }
    }
}

/// A config read from GGUF metadata, with the architecture keys that were not used.
#[derive(Clone, Debug)]
pub struct GgufConfig {
    pub config: ModelConfig,
    /// `{arch}.*` keys present in the file that ktune did not read, in file order.
    pub ignored_keys: Vec<String>,
}

/// The Hugging Face name of GGUF tensor `name` and how to undo the converter, for
/// `arch`; None for tensors that are not weights of the model (`rope_freqs.weight`)
/// or that ktune does not know.
pub fn hf_name(config: &ModelConfig, name: &str) -> Option<(String, Transform)> {
    let family = config.architecture.family();
    let norm_tf = if family.unit_offset_norms { Transform::MinusOne } else { Transform::None };
    let (sandwich, branch) = (config.sandwich_norms(), config.branch_norms());
    let top = match name {
        "token_embd.weight" => Some(("model.embed_tokens.weight".to_string(), Transform::None)),
        "output_norm.weight" => Some(("model.norm.weight".to_string(), norm_tf)),
        "output.weight" => Some(("lm_head.weight".to_string(), Transform::None)),
        _ => None,
    };
    if top.is_some() {
        return top;
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (base, suffix) = tail.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let permuted = family.gguf_permuted_qk;
    let fused = family.fused_projections;
    let (hf, tf) = match base {
        "attn_qkv" if fused => ("self_attn.qkv_proj", Transform::None),
        "ffn_up" if fused => ("mlp.gate_up_proj", Transform::None),
        "attn_norm" => ("input_layernorm", norm_tf),
        "attn_q" if permuted => ("self_attn.q_proj", Transform::Unpermute { heads: config.dims.num_heads }),
        "attn_k" if permuted => ("self_attn.k_proj", Transform::Unpermute { heads: config.dims.num_kv_heads }),
        "attn_q" => ("self_attn.q_proj", Transform::None),
        "attn_k" => ("self_attn.k_proj", Transform::None),
        "attn_v" => ("self_attn.v_proj", Transform::None),
        "attn_output" => ("self_attn.o_proj", Transform::None),
        "attn_q_norm" => ("self_attn.q_norm", norm_tf),
        "attn_k_norm" => ("self_attn.k_norm", norm_tf),
        "post_attention_norm" if branch => ("post_attention_layernorm", norm_tf),
        "ffn_norm" if sandwich => ("pre_feedforward_layernorm", norm_tf),
        "ffn_norm" => ("post_attention_layernorm", norm_tf),
        "post_ffw_norm" if branch => ("post_feedforward_layernorm", norm_tf),
        "ffn_gate_inp" => ("mlp.gate", Transform::None),
        // Every expert's projection in one 3-D tensor, served per expert as row views.
        "ffn_gate_exps" => ("mlp.experts.gate_proj", Transform::None),
        "ffn_up_exps" => ("mlp.experts.up_proj", Transform::None),
        "ffn_down_exps" => ("mlp.experts.down_proj", Transform::None),
        "ffn_gate" => ("mlp.gate_proj", Transform::None),
        "ffn_up" => ("mlp.up_proj", Transform::None),
        "ffn_down" => ("mlp.down_proj", Transform::None),
        _ => return None,
    };
    // Biases of permuted projections are permuted the same way.
    Some((format!("model.layers.{layer}.{hf}.{suffix}"), tf))
}

/// The model config of a GGUF file: its architecture, dimensions, RoPE, Gemma 3's
/// local layers and soft-caps, and special tokens, each read by one step below.
pub fn gguf_config(f: &GgufFile) -> Result<GgufConfig> {
    let (arch, arch_name) = gguf_architecture(f)?;
    let mut m = MetaReader::new(f, arch_name);
    if m.get("attention.causal").and_then(Value::as_bool) == Some(false) {
        return Err(m.unsupported(format!("`{}: false` (an encoder, not a decoder)", m.key("attention.causal"))));
    }
    let dims = gguf_dims(&mut m)?;
    let rms_norm_eps = m
        .f64_opt("attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| m.err(format!("missing metadata `{}`", m.key("attention.layer_norm_rms_epsilon"))))?;
    let max_position_embeddings = m.usize_req("context_length")?;
    let rope_theta = m.f64_opt("rope.freq_base")?.unwrap_or(10_000.0);
    // RoPE on part of each head (Phi-4-mini); checked with the config.
    let rope_dim = m.usize_opt("rope.dimension_count")?.filter(|&r| r != dims.head_dim);
    let rot_dim = rope_dim.unwrap_or(dims.head_dim);
    let rope_scaling = gguf_rope_scaling(&mut m, rope_theta, rot_dim, max_position_embeddings)?;
    let family = arch.family();
    let moe = gguf_moe(&mut m, family)?;
    let gemma = if family.soft_caps { Some(gguf_gemma3(&mut m, &dims)?) } else { None };
    // Qwen2 has Q/K/V biases (set by the family), the others none.
    if !family.qkv_bias && f.tensor("blk.0.attn_q.bias").is_some() {
        return Err(m.unsupported(format!("attention biases in a `{arch_name}` model")));
    }
    let (bos_token_id, eos_token_ids) = gguf_special_tokens(&mut m)?;
    let num_layers = dims.num_layers;
    // llama.cpp: SmolLM3 skips RoPE on every fourth layer (no metadata says so).
    let nope_layers = if family.nope_layers { family::nope_every(num_layers, 4) } else { Vec::new() };
    // A window on every layer where the family has one (Phi-3) and the file sets it.
    let every_layer_window = match family.window {
        family::Window::EveryLayer { .. } => m.usize_opt("attention.sliding_window")?.filter(|&w| w > 0),
        _ => None,
    };
    // llama.cpp's names for Granite's multipliers.
    let keys = ["embedding_scale", "attention.scale", "residual_scale", "logit_scale"];
    let multipliers = family.multipliers.then(|| crate::model::Multipliers::read(keys, |k| m.f64_opt(k))).transpose()?;
    let config = ModelConfig {
        rms_norm_eps,
        rope_theta,
        rope_local_base_freq: gemma.as_ref().map(|g| g.local_theta),
        rope_scaling,
        rope_dim,
        max_position_embeddings,
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        sliding_window: gemma.as_ref().and_then(|g| g.window).or(every_layer_window),
        layer_types: match (&gemma, every_layer_window) {
            (Some(g), _) => g.layer_types.clone(),
            (None, Some(_)) => vec![LayerKind::Local; num_layers],
            (None, None) => vec![LayerKind::Global; num_layers],
        },
        nope_layers,
        query_pre_attn_scalar: gemma.as_ref().map(|g| g.scalar),
        final_logit_softcapping: gemma.as_ref().and_then(|g| g.final_cap),
        attn_logit_softcapping: gemma.as_ref().and_then(|g| g.attn_cap),
        multipliers,
        moe,
        bos_token_id,
        eos_token_ids,
        ..ModelConfig::new(arch, dims)
    };
    config.validate().map_err(|e| m.err(e.to_string()))?;
    Ok(GgufConfig { config, ignored_keys: m.unused() })
}

/// The mixture of experts of a family that has one: `expert_count`,
/// `expert_used_count`, `expert_feed_forward_length` (else the MLP's width),
/// every layer sparse and the chosen experts' weights renormalised as the family's
/// llama.cpp graph does it ([`family::MoeFamily`]); a file of another family that
/// names experts is refused.
fn gguf_moe(m: &mut MetaReader<'_>, family: &family::Family) -> Result<Option<crate::model::config::Moe>> {
    let experts = m.usize_opt("expert_count")?.filter(|&n| n > 0);
    let Some(rule) = family.moe else {
        return match experts {
            Some(_) => Err(m.unsupported(format!("`{}` > 0 (a mixture of experts)", m.key("expert_count")))),
            None => Ok(None),
        };
    };
    let experts = experts.ok_or_else(|| m.err(format!("missing metadata `{}`", m.key("expert_count"))))?;
    let top_k = m.usize_req("expert_used_count")?;
    let expert_ff = match m.usize_opt("expert_feed_forward_length")? {
        Some(w) => w,
        None => m.usize_req("feed_forward_length")?,
    };
    Ok(Some(crate::model::config::Moe { experts, top_k, expert_ff, norm_top_k: rule.gguf_norm_top_k, dense_layers: Vec::new() }))
}

/// The architecture `general.architecture` names (and its name, the prefix of
/// its metadata keys); a split file is refused here, before any of it is read.
fn gguf_architecture(f: &GgufFile) -> Result<(Architecture, &str)> {
    let path = f.path.clone();
    let Some(arch_v) = f.get("general.architecture") else {
        return Err(ModelError::Config { path, msg: "missing metadata `general.architecture`: not a model file?".into() });
    };
    let Some(arch_name) = arch_v.as_str() else {
        return Err(ModelError::Config { path, msg: format!("`general.architecture` must be a string, got {}", arch_v.describe()) });
    };
    let Some(family) = family::by_gguf_arch(arch_name) else {
        let supported = family::names(|f| f.gguf_arch);
        return Err(ModelError::Unsupported { path, what: format!("GGUF architecture `{arch_name}` (supported: {supported})") });
    };
    let arch = family.arch;
    if let Some(n) = f.get("split.count").and_then(Value::as_u64)
        && n > 1
    {
        return Err(ModelError::Unsupported {
            path,
            what: format!("a split GGUF file (part of {n}): merge the parts first with `llama-gguf-split --merge`"),
        });
    }
    Ok((arch, arch_name))
}

/// The dimensions: layers (bounded by the file's tensors), widths, heads and the
/// head width (the key length, equal to the value length and RoPE's width), the
/// vocabulary (its own key, else the token list, else the embedding's rows).
fn gguf_dims(m: &mut MetaReader) -> Result<Dims> {
    let f = m.file();
    let num_layers = m.usize_req("block_count")?;
    // Every layer has several tensors: a count beyond the file's tensors is corrupt
    // (and must not size the per-layer tables built later).
    if num_layers > f.tensors.len() {
        return Err(m.err(format!(
            "`{}` is {num_layers} but the file holds only {} tensors: corrupt metadata",
            m.key("block_count"),
            f.tensors.len()
        )));
    }
    let hidden_size = m.usize_req("embedding_length")?;
    let intermediate_size = m.usize_req("feed_forward_length")?;
    let num_heads = m.usize_req("attention.head_count")?;
    let num_kv_heads = m.usize_opt("attention.head_count_kv")?.unwrap_or(num_heads);
    if num_heads == 0 {
        return Err(m.err(format!("`{}` is 0", m.key("attention.head_count"))));
    }
    let head_dim = match m.usize_opt("attention.key_length")? {
        Some(d) => d,
        None if hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(m.err(format!(
                "no `{}`, and embedding_length ({hidden_size}) is not a multiple of head_count ({num_heads})",
                m.key("attention.key_length")
            )));
        }
    };
    if let Some(v) = m.usize_opt("attention.value_length")?
        && v != head_dim
    {
        return Err(m.unsupported(format!("`{}` ({v}) different from the key length ({head_dim})", m.key("attention.value_length"))));
    }
    let vocab_size = match m.usize_opt("vocab_size")? {
        Some(v) => v,
        None => match (f.get("tokenizer.ggml.tokens").and_then(Value::as_array), f.tensor("token_embd.weight")) {
            (Some(t), _) => t.len(),
            (None, Some(e)) => e.shape()[0],
            (None, None) => return Err(m.err("no vocabulary size: no `vocab_size`, tokens or `token_embd.weight`".into())),
        },
    };
    Ok(Dims { vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim })
}

/// RoPE scaling: linear (`rope.scaling.type`, or the older `rope.scale_linear`),
/// Llama 3.1's frequency factors from the `rope_freqs.weight` tensor, or
/// LongRoPE's from `rope_factors_short.weight` and `rope_factors_long.weight`.
/// `head_dim`: the rotated dims.
fn gguf_rope_scaling(m: &mut MetaReader, rope_theta: f64, head_dim: usize, context: usize) -> Result<Option<RopeScaling>> {
    let f = m.file();
    if let Some(s) = gguf_longrope(m, head_dim, context)? {
        return Ok(Some(s));
    }
    let mut rope_scaling = match m.str_opt("rope.scaling.type")? {
        None | Some("none") => None,
        Some("linear") => {
            let factor = m.f64_opt("rope.scaling.factor")?.ok_or_else(|| {
                m.err(format!("`{}` is linear but `{}` is missing", m.key("rope.scaling.type"), m.key("rope.scaling.factor")))
            })?;
            Some(RopeScaling::Linear { factor })
        }
        Some(other) => return Err(m.unsupported(format!("`{}: {other}` (supported: none, linear)", m.key("rope.scaling.type")))),
    };
    if rope_scaling.is_none()
        && let Some(s) = m.f64_opt("rope.scale_linear")?
        && s != 1.0
    {
        rope_scaling = Some(RopeScaling::Linear { factor: s });
    }
    if let Some(t) = f.tensor("rope_freqs.weight") {
        if rope_scaling.is_some() {
            return Err(m.unsupported("both `rope_freqs.weight` and rope scaling metadata".into()));
        }
        let mut factors = vec![0f32; t.numel()];
        if t.rows() != 1 || factors.len() != head_dim / 2 {
            return Err(m.err(format!("`rope_freqs.weight` has shape {:?}, expected [{}]", t.shape(), head_dim / 2)));
        }
        f.decode_row(t, 0, &mut factors)?;
        rope_scaling = llama3_from_factors(&factors, rope_theta, head_dim).map_err(|e| m.unsupported(e))?;
    }
    Ok(rope_scaling)
}

/// LongRoPE (Phi-3): the factors as `convert_hf_to_gguf.py` writes them (one per
/// rotated pair, f32 tensors), the original context and the attention factor
/// (`rope.scaling.attn_factor`, else the default of `context / original`).
fn gguf_longrope(m: &mut MetaReader, rot_dim: usize, context: usize) -> Result<Option<RopeScaling>> {
    let f = m.file();
    let (Some(long), Some(short)) = (f.tensor("rope_factors_long.weight"), f.tensor("rope_factors_short.weight")) else {
        return Ok(None);
    };
    let read = |t: &crate::model::gguf::GgufTensor, name: &str| -> Result<Vec<f64>> {
        if t.rows() != 1 || t.numel() != rot_dim / 2 {
            return Err(m.err(format!("`{name}` has shape {:?}, expected [{}]", t.shape(), rot_dim / 2)));
        }
        let mut v = vec![0f32; t.numel()];
        f.decode_row(t, 0, &mut v)?;
        Ok(v.into_iter().map(f64::from).collect())
    };
    let (long_factor, short_factor) = (read(long, "rope_factors_long.weight")?, read(short, "rope_factors_short.weight")?);
    let original = m.usize_opt("rope.scaling.original_context_length")?.unwrap_or(context);
    let attention_factor = match m.f64_opt("rope.scaling.attn_factor")? {
        Some(a) => a,
        None => RopeScaling::longrope_attention_factor(context as f64 / original.max(1) as f64, original),
    };
    Ok(Some(RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings: original, attention_factor }))
}

/// What Gemma 3 adds: its local layers and their window and RoPE base, the query
/// scale, the logit soft-caps.
struct Gemma3Meta {
    layer_types: Vec<LayerKind>,
    /// The window, where a layer is local.
    window: Option<usize>,
    local_theta: f64,
    scalar: f64,
    final_cap: Option<f64>,
    attn_cap: Option<f64>,
}

fn gguf_gemma3(m: &mut MetaReader, dims: &Dims) -> Result<Gemma3Meta> {
    let num_layers = dims.num_layers;
    let window = m
        .usize_opt("attention.sliding_window")?
        .ok_or_else(|| m.err(format!("missing metadata `{}` (Gemma 3's local attention window)", m.key("attention.sliding_window"))))?;
    let key = m.key("attention.sliding_window_pattern");
    // llama.cpp: every 6th layer global unless the file says otherwise.
    let layer_types = match m.get("attention.sliding_window_pattern") {
        None => pattern(6, num_layers),
        Some(Value::Array(a)) => {
            if a.len() != num_layers {
                return Err(m.err(format!("`{key}` has {} entries for {num_layers} layers", a.len())));
            }
            let bools = a.bools().ok_or_else(|| m.err(format!("`{key}` must hold bools")))?;
            bools.iter().map(|&local| if local { LayerKind::Local } else { LayerKind::Global }).collect()
        }
        Some(v) => match v.as_u64().and_then(|p| usize::try_from(p).ok()) {
            Some(p) => pattern(p, num_layers),
            None => return Err(m.err(format!("`{key}` must be an integer or a list of bools, got {}", v.describe()))),
        },
    };
    let local_theta = m.f64_opt("rope.freq_base_swa")?.unwrap_or(10_000.0);
    // llama.cpp: Gemma 3 27B (62 layers) scales by (hidden / heads)^-1/2, the others by key_length^-1/2.
    let scalar = if num_layers == 62 { dims.hidden_size / dims.num_heads } else { dims.head_dim };
    let window = layer_types.contains(&LayerKind::Local).then_some(window);
    let (final_cap, attn_cap) = (m.f64_opt("final_logit_softcapping")?, m.f64_opt("attn_logit_softcapping")?);
    Ok(Gemma3Meta { layer_types, window, local_theta, scalar: scalar as f64, final_cap, attn_cap })
}

/// The beginning-of-text token and the stop tokens (end of text, of turn, of
/// message), each once.
fn gguf_special_tokens(m: &mut MetaReader) -> Result<(Option<u32>, Vec<u32>)> {
    let bos_token_id = m.token("tokenizer.ggml.bos_token_id")?;
    let mut eos_token_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(t) = m.token(key)?
            && !eos_token_ids.contains(&t)
        {
            eos_token_ids.push(t);
        }
    }
    Ok((bos_token_id, eos_token_ids))
}

/// Layer kinds for "every `p`-th layer global" (0: all global).
fn pattern(p: usize, layers: usize) -> Vec<LayerKind> {
    (0..layers).map(|i| if p == 0 || (i + 1) % p == 0 { LayerKind::Global } else { LayerKind::Local }).collect()
}

/// Llama 3 RoPE scaling whose per-frequency divisors are `factors` (as
/// `convert_hf_to_gguf.py` writes them to `rope_freqs.weight`), None when every
/// factor is 1.
fn llama3_from_factors(factors: &[f32], theta: f64, head_dim: usize) -> Result<Option<RopeScaling>, String> {
    if factors.iter().all(|&f| f == 1.0) {
        return Ok(None);
    }
    let factor = factors.iter().copied().fold(f32::MIN, f32::max) as f64;
    let plain = rope_inv_freq(theta, head_dim, None);
    // The published Llama 3.1 / 3.2 parameters: low 1, high 4, original context 8192.
    for orig in [8192.0, 4096.0, 2048.0, 16384.0, 32768.0, 131072.0] {
        for (low, high) in [(1.0, 4.0), (1.0, 2.0), (2.0, 4.0)] {
            let s = Llama3Scaling { factor, low_freq_factor: low, high_freq_factor: high, original_max_position_embeddings: orig };
            let scaled = rope_inv_freq(theta, head_dim, Some(s));
            let ok = factors.iter().zip(plain.iter().zip(&scaled)).all(|(&f, (&p, &q))| {
                let want = p as f64 / q as f64;
                (f as f64 - want).abs() <= 1e-3 * want
            });
            if ok {
                return Ok(Some(RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: orig as usize,
                }));
            }
        }
    }
    Err("`rope_freqs.weight` holds RoPE frequency factors that are not Llama 3 scaling".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // permute(w, n_head): w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2).
        let (heads, hd) = (3, 8);
        let rows = heads * hd;
        let permuted: Vec<usize> = (0..rows)
            .map(|g| {
                let (h, rem) = (g / hd, g % hd);
                let (i, s) = (rem / 2, rem % 2);
                h * hd + s * (hd / 2) + i
            })
            .collect();
        let tf = Transform::Unpermute { heads };
        for r in 0..rows {
            assert_eq!(permuted[tf.source_row(r, rows)], r);
        }
    }

    #[test]
    fn llama3_factors_round_trip() {
        let (theta, hd) = (500_000.0, 64);
        let s = Llama3Scaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 };
        let plain = rope_inv_freq(theta, hd, None);
        let scaled = rope_inv_freq(theta, hd, Some(s));
        let factors: Vec<f32> = plain.iter().zip(&scaled).map(|(p, q)| p / q).collect();
        let got = llama3_from_factors(&factors, theta, hd).expect("matches");
        assert_eq!(
            got,
            Some(RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 })
        );
        assert_eq!(llama3_from_factors(&vec![1.0; hd / 2], theta, hd), Ok(None));
        let mut odd = factors.clone();
        odd[0] = 7.0;
        assert!(llama3_from_factors(&odd, theta, hd).is_err());
    }
}
