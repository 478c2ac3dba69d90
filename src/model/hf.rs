//! Reads a Hugging Face `config.json` (as written by transformers 4.x: `rope_theta`,
//! `rope_scaling`, `rope_local_base_freq`, `sliding_window_pattern`; and 5.x:
//! `rope_parameters`, `layer_types`) into a [`ModelConfig`], for
//! `LlamaForCausalLM`, `Qwen2ForCausalLM` and `Gemma3ForCausalLM`, and
//! `Gemma3ForConditionalGeneration` (its `text_config` as a Gemma 3 text model, its
//! `vision_config` as a [`VisionConfig`]). Anything that
//! would change the computation in a way the runtime does not implement is an
//! error naming the field and its value; keys that do not matter are listed in
//! [`ParsedConfig::ignored_keys`].

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value};

use super::builtin::gemma3_pattern;
use super::config::{Architecture, Dims, HiddenAct, LayerKind, ModelConfig, Moe, Multipliers, RopeScaling};
use super::family::{self, Family, Window};
use super::vision::VisionConfig;
use super::{ModelError, Result};

/// A config read from `config.json`, with the keys that were not used.
#[derive(Clone, Debug)]
pub struct ParsedConfig {
    pub config: ModelConfig,
    /// Keys present in the file that ktune neither uses nor knows to be irrelevant
    /// (sorted). Worth a warning: a newer transformers may have added something.
    pub ignored_keys: Vec<String>,
    /// The vision tower and projector of a multimodal checkpoint
    /// (`Gemma3ForConditionalGeneration`), whose text model is `config`.
    pub vision: Option<VisionConfig>,
}

/// `Gemma3TextConfig`'s defaults: a multimodal checkpoint's `text_config` holds
/// only the values that differ from them (transformers saves a diff).
const GEMMA3_TEXT_DEFAULTS: &[(&str, f64)] = &[
    ("vocab_size", 262_208.0),
    ("hidden_size", 2304.0),
    ("intermediate_size", 9216.0),
    ("num_hidden_layers", 26.0),
    ("num_attention_heads", 8.0),
    ("num_key_value_heads", 4.0),
    ("head_dim", 256.0),
    ("max_position_embeddings", 131_072.0),
    ("rms_norm_eps", 1e-6),
    ("bos_token_id", 2.0),
    ("eos_token_id", 1.0),
    ("query_pre_attn_scalar", 256.0),
    ("sliding_window", 4096.0),
];

/// `SiglipVisionConfig`'s defaults (likewise a diff in `vision_config`).
const SIGLIP_DEFAULTS: &[(&str, f64)] = &[
    ("hidden_size", 768.0),
    ("intermediate_size", 3072.0),
    ("num_hidden_layers", 12.0),
    ("num_attention_heads", 12.0),
    ("num_channels", 3.0),
    ("image_size", 224.0),
    ("patch_size", 16.0),
    ("layer_norm_eps", 1e-6),
];

/// `Gemma3Config`'s defaults for the image tokens.
const GEMMA3_MM_DEFAULTS: &[(&str, f64)] =
    &[("mm_tokens_per_image", 256.0), ("image_token_index", 262_144.0), ("boi_token_index", 255_999.0), ("eoi_token_index", 256_000.0)];

/// Keys of the multimodal wrapper that do not affect inference, beside [`IRRELEVANT`].
const MM_IRRELEVANT: &[&str] = &["text_config", "vision_config", "image_token_id", "boi_token_id", "eoi_token_id"];

/// Vision-config keys that do not change the computation of a SigLIP tower
/// without a pooling head.
const VISION_IRRELEVANT: &[&str] = &[
    "model_type",
    "attention_dropout",
    "dtype",
    "torch_dtype",
    "vision_use_head",
    "_name_or_path",
    "architectures",
    "transformers_version",
    "initializer_range",
    "id2label",
    "label2id",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "chunk_size_feed_forward",
    "problem_type",
    "is_encoder_decoder",
    "tokenizer_class",
];

fn with_defaults(obj: Option<&Value>, defaults: &[(&str, f64)]) -> Map<String, Value> {
    let mut m = match obj {
        Some(Value::Object(o)) => o.clone(),
        _ => Map::new(),
    };
    for (k, v) in defaults {
        if !m.contains_key(*k) {
            let n = serde_json::Number::from_f64(*v).map(Value::Number).unwrap_or(Value::Null);
            let n = if v.fract() == 0.0 { Value::from(*v as u64) } else { n };
            m.insert(k.to_string(), n);
        }
    }
    m
}

/// More layers than any published decoder has (per-layer tables are sized by it).
const MAX_LAYERS: usize = 10_000;

/// Keys that do not affect inference (training, bookkeeping, generation defaults).
const IRRELEVANT: &[&str] = &[
    "_name_or_path",
    "_attn_implementation_autoset",
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    // A mixture of experts' training loss (Qwen3-MoE).
    "router_aux_loss_coef",
    "output_router_logits",
    // Phi-3's dropouts (training only).
    "embd_pdrop",
    "resid_pdrop",
    "pad_token_id",
    "pretraining_tp",
    "max_window_layers",
    "cache_implementation",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "tie_word_embeddings",
    "id2label",
    "label2id",
    "sliding_window",
    "use_sliding_window",
    "tokenizer_class",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "problem_type",
    "vision_config",
    "quantization_config",
    "is_llama_config",
];

impl ModelConfig {
    /// Reads `path` (a `config.json`); see [`ModelConfig::parse_config_json`].
    pub fn from_config_json(path: impl AsRef<Path>) -> Result<ModelConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        Ok(ModelConfig::parse_config_json(&text, path)?.config)
    }

    /// Parses the text of a `config.json`; `path` only names it in errors.
    pub fn parse_config_json(text: &str, path: &Path) -> Result<ParsedConfig> {
        let value: Value = serde_json::from_str(text).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })?;
        let Value::Object(map) = value else {
            return Err(ModelError::Config { path: path.to_path_buf(), msg: "expected a JSON object at the top level".into() });
        };
        if is_multimodal(&map) {
            return parse_multimodal(&map, path);
        }
        let mut r = Reader { map: &map, path, used: BTreeSet::new() };
        let config = r.config()?;
        config.validate().map_err(|e| ModelError::Config { path: path.to_path_buf(), msg: e.to_string() })?;
        let ignored_keys = map.keys().filter(|k| !r.used.contains(k.as_str()) && !IRRELEVANT.contains(&k.as_str())).cloned().collect();
        Ok(ParsedConfig { config, ignored_keys, vision: None })
    }
}

/// `Gemma3ForConditionalGeneration` (or `model_type: gemma3`).
fn is_multimodal(map: &Map<String, Value>) -> bool {
    let class = map.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
    class == Some("Gemma3ForConditionalGeneration") || map.get("model_type").and_then(Value::as_str) == Some("gemma3")
}

/// A multimodal Gemma 3 config: the text model from `text_config` (Gemma 3
/// text defaults for what it leaves out), the tower from `vision_config`, the
/// image tokens and end-of-sequence ids from the top level.
fn parse_multimodal(map: &Map<String, Value>, path: &Path) -> Result<ParsedConfig> {
    let err = |msg: String| ModelError::Config { path: path.to_path_buf(), msg };
    if let Some(t) = map.get("model_type").and_then(Value::as_str)
        && t != "gemma3"
    {
        return Err(err(format!("`architectures` says Gemma3ForConditionalGeneration but `model_type` says {t} (expected gemma3)")));
    }
    for key in ["text_config", "vision_config"] {
        if let Some(v) = map.get(key).filter(|v| !v.is_null() && !v.is_object()) {
            return Err(err(format!("`{key}` must be an object, got {}", describe(v))));
        }
    }
    let mut text = with_defaults(map.get("text_config"), GEMMA3_TEXT_DEFAULTS);
    text.remove("architectures");
    match text.get("model_type").and_then(Value::as_str) {
        None | Some("gemma3_text") => {
            text.insert("model_type".into(), Value::from("gemma3_text"));
        }
        Some(other) => {
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                what: format!("text_config.model_type `{other}` in a Gemma 3 multimodal config"),
            });
        }
    }
    // The top level's end-of-sequence ids (the chat's end of turn among them) win.
    for key in ["eos_token_id", "bos_token_id"] {
        if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
            text.insert(key.into(), v.clone());
        }
    }
    let mut r = Reader { map: &text, path, used: BTreeSet::new() };
    let mut config = r.config()?;
    // Gemma3ForConditionalGeneration's head never soft-caps its logits (only
    // Gemma3ForCausalLM reads `final_logit_softcapping`; the published Gemma 3
    // configs leave it null anyway).
    config.final_logit_softcapping = None;
    config.validate().map_err(|e| err(e.to_string()))?;
    let mut ignored: Vec<String> = text
        .keys()
        .filter(|k| !r.used.contains(k.as_str()) && !IRRELEVANT.contains(&k.as_str()))
        .map(|k| format!("text_config.{k}"))
        .collect();

    let vis = with_defaults(map.get("vision_config"), SIGLIP_DEFAULTS);
    let mut vr = Reader { map: &vis, path, used: BTreeSet::new() };
    if let Some(model_type) = vr.str_opt("model_type")?
        && model_type != "siglip_vision_model"
    {
        return Err(ModelError::Unsupported {
            path: path.to_path_buf(),
            what: format!("vision_config.model_type `{model_type}` (supported: siglip_vision_model)"),
        });
    }
    let act = vr.str_opt("hidden_act")?.unwrap_or("gelu_pytorch_tanh");
    if !matches!(act, "gelu_pytorch_tanh" | "gelu_new") {
        return Err(ModelError::Unsupported {
            path: path.to_path_buf(),
            what: format!("vision_config.hidden_act `{act}` (supported: gelu_pytorch_tanh)"),
        });
    }
    // Gemma 3 reads the last hidden state: a pooling head, if any, is never used.
    vr.bool_opt("vision_use_head")?;
    let top = with_defaults(Some(&Value::Object(map.clone())), GEMMA3_MM_DEFAULTS);
    let mut tr = Reader { map: &top, path, used: BTreeSet::new() };
    let token = |tr: &mut Reader<'_>, key: &str, alias: &str| -> Result<u32> {
        let v = match tr.usize_opt(alias)? {
            Some(v) => v,
            None => tr.usize_req(key)?,
        };
        u32::try_from(v).map_err(|_| err(format!("`{key}` {v} is not a token id")))
    };
    let vision = VisionConfig {
        hidden_size: vr.usize_req("hidden_size")?,
        intermediate_size: vr.usize_req("intermediate_size")?,
        num_layers: vr.usize_req("num_hidden_layers")?,
        num_heads: vr.usize_req("num_attention_heads")?,
        num_channels: vr.usize_req("num_channels")?,
        image_size: vr.usize_req("image_size")?,
        patch_size: vr.usize_req("patch_size")?,
        layer_norm_eps: vr.f64_opt("layer_norm_eps")?.unwrap_or(1e-6),
        mm_tokens_per_image: tr.usize_req("mm_tokens_per_image")?,
        image_token_id: token(&mut tr, "image_token_index", "image_token_id")?,
        boi_token_id: token(&mut tr, "boi_token_index", "boi_token_id")?,
        eoi_token_id: token(&mut tr, "eoi_token_index", "eoi_token_id")?,
        text_hidden_size: config.dims.hidden_size,
    };
    vision.validate(config.dims.vocab_size).map_err(|e| err(e.to_string()))?;
    ignored.extend(
        vis.keys()
            .filter(|k| !vr.used.contains(k.as_str()) && !VISION_IRRELEVANT.contains(&k.as_str()))
            .map(|k| format!("vision_config.{k}")),
    );
    ignored.extend(
        map.keys()
            .filter(|k| {
                !tr.used.contains(k.as_str())
                    && !IRRELEVANT.contains(&k.as_str())
                    && !MM_IRRELEVANT.contains(&k.as_str())
                    && !["eos_token_id", "bos_token_id"].contains(&k.as_str())
            })
            .cloned(),
    );
    ignored.sort();
    Ok(ParsedConfig { config, ignored_keys: ignored, vision: Some(vision) })
}

/// Typed access to the top-level object, remembering which keys were read.
struct Reader<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
    used: BTreeSet<String>,
}

fn describe(v: &Value) -> String {
    crate::text::shorten(&v.to_string(), 60).into_owned()
}

impl<'a> Reader<'a> {
    fn config_err(&self, msg: String) -> ModelError {
        ModelError::Config { path: self.path.to_path_buf(), msg }
    }

    fn unsupported(&self, what: String) -> ModelError {
        ModelError::Unsupported { path: self.path.to_path_buf(), what }
    }

    /// The value of `key`, None when absent or null.
    fn get(&mut self, key: &str) -> Option<&'a Value> {
        self.used.insert(key.to_string());
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// `key` read by `read` (`None` when absent); a value of another type is an error
    /// naming `what` was expected.
    fn typed<T>(&mut self, key: &str, what: &str, read: impl Fn(&'a Value) -> Option<T>) -> Result<Option<T>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        read(v).map(Some).ok_or_else(|| self.config_err(format!("`{key}` must be {what}, got {}", describe(v))))
    }

    fn usize_opt(&mut self, key: &str) -> Result<Option<usize>> {
        self.typed(key, "a non-negative integer", as_usize)
    }

    fn usize_req(&mut self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.config_err(format!("missing `{key}`")))
    }

    fn f64_opt(&mut self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", Value::as_f64)
    }

    fn bool_opt(&mut self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "true or false", Value::as_bool)
    }

    fn str_opt(&mut self, key: &str) -> Result<Option<&'a str>> {
        self.typed(key, "a string", Value::as_str)
    }

    /// `architectures[0]`, checked against `model_type`.
    fn architecture(&mut self) -> Result<Architecture> {
        let class = match self.get("architectures") {
            None => None,
            Some(Value::Array(a)) if a.len() == 1 => a[0].as_str(),
            Some(v) => return Err(self.config_err(format!("`architectures` must list one class name, got {}", describe(v)))),
        };
        let model_type = self.str_opt("model_type")?;
        let from_class = match class {
            None => None,
            Some(c) => Some(
                family::by_hf_class(c)
                    .ok_or_else(|| self.unsupported(format!("architecture `{c}` (supported: {})", family::names(|f| Some(f.hf_class)))))?,
            ),
        };
        let from_type = match model_type {
            None => None,
            Some(t) => Some(
                family::by_model_type(t)
                    .ok_or_else(|| self.unsupported(format!("model_type `{t}` (supported: {})", family::names(|f| Some(f.model_type)))))?,
            ),
        };
        match (from_class, from_type) {
            (Some(a), Some(b)) if a.arch != b.arch => Err(self.config_err(format!(
                "`architectures` says {} but `model_type` says {}",
                a.hf_class,
                model_type.unwrap_or_default()
            ))),
            (Some(a), _) | (None, Some(a)) => Ok(a.arch),
            (None, None) => Err(self.config_err("neither `architectures` nor `model_type` is given".into())),
        }
    }

    fn config(&mut self) -> Result<ModelConfig> {
        let arch = self.architecture()?;
        let f = arch.family();
        let vocab_size = self.usize_req("vocab_size")?;
        let hidden_size = self.usize_req("hidden_size")?;
        let intermediate_size = self.usize_req("intermediate_size")?;
        let num_layers = self.usize_req("num_hidden_layers")?;
        if num_layers > MAX_LAYERS {
            return Err(self.config_err(format!("`num_hidden_layers` is {num_layers}, more than {MAX_LAYERS}: not a real model")));
        }
        let num_heads = self.usize_req("num_attention_heads")?;
        let num_kv_heads = self.usize_opt("num_key_value_heads")?.unwrap_or(num_heads);
        if num_heads == 0 || hidden_size == 0 {
            return Err(self.config_err("`num_attention_heads` and `hidden_size` must be above 0".into()));
        }
        let head_dim = match (self.usize_opt("head_dim")?, f.head_dim) {
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) if hidden_size % num_heads == 0 => hidden_size / num_heads,
            (None, None) => {
                return Err(self.config_err(format!(
                    "no `head_dim`, and hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_heads})"
                )));
            }
        };
        let rms_norm_eps = self.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
        let max_position_embeddings = self.usize_opt("max_position_embeddings")?.unwrap_or(f.max_position_embeddings);
        let tie_word_embeddings = self.bool_opt("tie_word_embeddings")?.unwrap_or(f.tie_word_embeddings);
        let hidden_act = self.hidden_act(f.hidden_act)?;

        // Attention variants.
        if self.bool_opt("mlp_bias")? == Some(true) {
            return Err(self.unsupported("`mlp_bias: true` (biases on the MLP projections)".into()));
        }
        // Qwen2 always has Q/K/V biases and no O bias (set by the family; the key
        // does not exist); the others none.
        if !f.qkv_bias && self.bool_opt("attention_bias")? == Some(true) {
            return Err(self.unsupported("`attention_bias: true` (it adds a bias to o_proj too)".into()));
        }
        // transformers: int(head_dim * partial_rotary_factor).
        let rope_dim = self.partial_rotary_factor()?.map(|f| (head_dim as f64 * f) as usize);
        if self.bool_opt("use_mrope")? == Some(true) {
            return Err(self.unsupported("`use_mrope: true` (multimodal RoPE)".into()));
        }
        if self.bool_opt("rope_interleaved")? == Some(true) {
            return Err(self.unsupported("`rope_interleaved: true` (RoPE on adjacent pairs; ktune rotates halves)".into()));
        }
        if self.bool_opt("use_bidirectional_attention")? == Some(true) {
            return Err(self.unsupported("`use_bidirectional_attention: true` (an encoder, not a decoder)".into()));
        }
        // OLMo's and OLMoE's option (null in the published configs).
        if self.get("clip_qkv").is_some_and(|v| !v.is_null()) {
            return Err(self.unsupported("`clip_qkv` (Q, K and V clamped after the projections)".into()));
        }
        let (final_logit_softcapping, attn_logit_softcapping, query_pre_attn_scalar) = if f.soft_caps {
            (
                self.f64_opt("final_logit_softcapping")?,
                self.f64_opt("attn_logit_softcapping")?,
                Some(self.f64_opt("query_pre_attn_scalar")?.unwrap_or(256.0)),
            )
        } else {
            (None, None, None)
        };

        let keys = ["embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"];
        let multipliers = f.multipliers.then(|| Multipliers::read(keys, |k| self.f64_opt(k))).transpose()?;

        // Which layers are local, and their window.
        let (layer_types, sliding_window) = self.windows(f, num_layers)?;
        let nope_layers = if f.nope_layers { self.nope_layers(num_layers)? } else { Vec::new() };

        let moe = self.moe(f, num_layers)?;
        let (rope_theta, rope_local_base_freq, rope_scaling) = self.rope(f, max_position_embeddings)?;
        let bos_token_id = self.token("bos_token_id")?.and_then(|v| v.first().copied());
        let eos_token_ids = self.token("eos_token_id")?.unwrap_or_default();

        let dims = Dims { vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim };
        Ok(ModelConfig {
            rms_norm_eps,
            rope_theta,
            rope_local_base_freq,
            rope_scaling,
            rope_dim,
            max_position_embeddings,
            tie_word_embeddings,
            hidden_act,
            sliding_window,
            layer_types,
            nope_layers,
            query_pre_attn_scalar,
            final_logit_softcapping,
            attn_logit_softcapping,
            multipliers,
            moe,
            bos_token_id,
            eos_token_ids,
            ..ModelConfig::new(arch, dims)
        })
    }

    /// The mixture of experts of a family that has one (a config of another family
    /// that names experts is refused: it would load as a dense model).
    fn moe(&mut self, f: &Family, layers: usize) -> Result<Option<Moe>> {
        let experts = match self.usize_opt("num_experts")? {
            Some(n) => Some(n),
            None => self.usize_opt("num_local_experts")?,
        };
        if f.moe.is_none() {
            return match experts {
                Some(n) if n > 0 => Err(self.unsupported(format!("{n} experts for {} (a mixture of experts)", f.hf_class))),
                _ => Ok(None),
            };
        }
        let experts = experts.ok_or_else(|| self.config_err("missing `num_experts`".into()))?;
        let top_k = self.usize_req("num_experts_per_tok")?;
        // OLMoE's experts are `intermediate_size` wide (it has no dense MLP).
        let expert_ff = match self.usize_opt("moe_intermediate_size")? {
            Some(w) => w,
            None => self.usize_req("intermediate_size")?,
        };
        // Qwen3MoeConfig's defaults.
        let norm_top_k = self.bool_opt("norm_topk_prob")?.unwrap_or(false);
        let step = self.usize_opt("decoder_sparse_step")?.unwrap_or(1);
        let only: Vec<usize> = match self.get("mlp_only_layers") {
            None => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|l| l as usize)
                        .ok_or_else(|| self.config_err(format!("`mlp_only_layers` entries must be layer numbers, got {}", describe(v))))
                })
                .collect::<Result<_>>()?,
            Some(v) => return Err(self.config_err(format!("`mlp_only_layers` must list layer numbers, got {}", describe(v)))),
        };
        if step == 0 {
            return Err(self.config_err("`decoder_sparse_step` is 0".into()));
        }
        let dense_layers = (0..layers).filter(|l| only.contains(l) || (l + 1) % step != 0).collect();
        Ok(Some(Moe { experts, top_k, expert_ff, norm_top_k, dense_layers }))
    }

    /// Each layer's kind and the window of the local ones, as the family reads them
    /// ([`Window`]).
    fn windows(&mut self, f: &Family, layers: usize) -> Result<(Vec<LayerKind>, Option<usize>)> {
        if f.window != Window::Pattern && self.bool_opt("use_sliding_window")? == Some(true) {
            return Err(
                self.unsupported(format!("`use_sliding_window: true` for {} (sliding-window attention on upper layers)", f.hf_class))
            );
        }
        let (types, window) = match f.window {
            Window::Pattern => (self.layer_types(f, layers)?, Some(self.usize_opt("sliding_window")?.unwrap_or(4096))),
            // The family's default when absent (MistralConfig's: 4096); `null` turns it off.
            Window::EveryLayer { default } => {
                let absent = !self.map.contains_key("sliding_window");
                let window = if absent { default } else { self.usize_opt("sliding_window")? };
                let kind = if window.is_some() { LayerKind::Local } else { LayerKind::Global };
                (vec![kind; layers], window)
            }
            Window::Never => (self.layer_types(f, layers)?, None),
        };
        let has_local = types.contains(&LayerKind::Local);
        if has_local && f.window == Window::Never {
            return Err(self.unsupported(format!("sliding_attention layers in a {} model", f.hf_class)));
        }
        Ok((types, window.filter(|_| has_local)))
    }

    /// The layers without RoPE: `no_rope_layers` (one entry per layer, 1 where RoPE
    /// applies), else every `no_rope_layer_interval`-th layer (default 4).
    fn nope_layers(&mut self, layers: usize) -> Result<Vec<usize>> {
        let interval = self.usize_opt("no_rope_layer_interval")?.unwrap_or(4);
        match self.get("no_rope_layers") {
            Some(Value::Array(a)) if a.len() == layers => a
                .iter()
                .enumerate()
                .filter_map(|(l, v)| match v.as_u64() {
                    Some(0) => Some(Ok(l)),
                    Some(1) => None,
                    _ => Some(Err(self.config_err(format!("`no_rope_layers` entries must be 0 or 1, got {}", describe(v))))),
                })
                .collect(),
            Some(v) => Err(self.config_err(format!("`no_rope_layers` must list 0 or 1 for each of {layers} layers, got {}", describe(v)))),
            None if interval == 0 => Err(self.config_err("`no_rope_layer_interval` is 0".into())),
            None => Ok(family::nope_every(layers, interval)),
        }
    }

    fn hidden_act(&mut self, default: HiddenAct) -> Result<HiddenAct> {
        // Gemma's key is `hidden_activation` (transformers 4.x); accept either.
        let (key, name) = match (self.str_opt("hidden_activation")?, self.str_opt("hidden_act")?) {
            (Some(a), _) => ("hidden_activation", Some(a)),
            (None, b) => ("hidden_act", b),
        };
        match name {
            None => Ok(default),
            Some("silu" | "swish") => Ok(HiddenAct::Silu),
            Some("gelu_pytorch_tanh" | "gelu_new") => Ok(HiddenAct::GeluPytorchTanh),
            Some(other) => Err(self.unsupported(format!("`{key}: {other}` (supported: silu, gelu_pytorch_tanh)"))),
        }
    }

    /// `layer_types` (transformers 5 and late 4.x), else Gemma 3's
    /// `sliding_window_pattern` (default 6), else all global.
    fn layer_types(&mut self, f: &Family, layers: usize) -> Result<Vec<LayerKind>> {
        let pattern = self.usize_opt("sliding_window_pattern")?;
        let private_pattern = self.usize_opt("_sliding_window_pattern")?;
        match self.get("layer_types") {
            Some(Value::Array(a)) => {
                if a.len() != layers {
                    return Err(self.config_err(format!("`layer_types` has {} entries for {layers} layers", a.len())));
                }
                a.iter()
                    .map(|v| match v.as_str() {
                        Some("full_attention") => Ok(LayerKind::Global),
                        Some("sliding_attention") => Ok(LayerKind::Local),
                        Some(other) => Err(self.unsupported(format!("layer type `{other}` in `layer_types`"))),
                        None => Err(self.config_err(format!("`layer_types` entries must be strings, got {}", describe(v)))),
                    })
                    .collect()
            }
            Some(v) => Err(self.config_err(format!("`layer_types` must be a list, got {}", describe(v)))),
            None if f.window == Window::Pattern => {
                let p = pattern.or(private_pattern).unwrap_or(6);
                if p == 0 {
                    return Err(self.config_err("`sliding_window_pattern` is 0".into()));
                }
                Ok(gemma3_pattern(layers, p))
            }
            None => Ok(vec![LayerKind::Global; layers]),
        }
    }

    /// (global theta, local theta, global scaling) from `rope_parameters`
    /// (transformers 5: flat, or one entry per layer type) or from `rope_theta`,
    /// `rope_local_base_freq` and `rope_scaling` (4.x).
    /// `partial_rotary_factor`, at the top (transformers 4) or in
    /// `rope_parameters` (5); None for 1 (the whole head).
    fn partial_rotary_factor(&mut self) -> Result<Option<f64>> {
        let top = self.f64_opt("partial_rotary_factor")?;
        let nested = match self.get("rope_parameters") {
            Some(Value::Object(p)) => match p.get("partial_rotary_factor") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    Some(v.as_f64().ok_or_else(|| self.config_err("`rope_parameters.partial_rotary_factor` must be a number".into()))?)
                }
            },
            _ => None,
        };
        match top.or(nested) {
            Some(f) if !(f > 0.0 && f <= 1.0) => Err(self.config_err(format!("`partial_rotary_factor` ({f}) must be in (0, 1]"))),
            f => Ok(f.filter(|&f| f != 1.0)),
        }
    }

    fn rope(&mut self, f: &Family, max_position_embeddings: usize) -> Result<(f64, Option<f64>, Option<RopeScaling>)> {
        let ctx = RopeContext { max_position_embeddings, original: self.usize_opt("original_max_position_embeddings")? };
        let theta = self.f64_opt("rope_theta")?;
        let local = self.f64_opt("rope_local_base_freq")?;
        let scaling = self.get("rope_scaling");
        let params = self.get("rope_parameters");
        let default_theta = f.rope_theta;
        let default_local = f.local_rope_theta.map(|d| local.unwrap_or(d));
        match params {
            Some(Value::Object(p)) if p.contains_key("full_attention") || p.contains_key("sliding_attention") => {
                let (g_theta, g_scaling) = match p.get("full_attention") {
                    Some(v) => self.rope_entry(v, "rope_parameters.full_attention", ctx)?,
                    None => (None, None),
                };
                let (l_theta, l_scaling) = match p.get("sliding_attention") {
                    Some(v) => self.rope_entry(v, "rope_parameters.sliding_attention", ctx)?,
                    None => (None, None),
                };
                if l_scaling.is_some() {
                    return Err(self.unsupported("RoPE scaling on sliding_attention layers".into()));
                }
                let local = if f.local_rope_theta.is_some() { l_theta.or(default_local) } else { None };
                Ok((g_theta.or(theta).unwrap_or(default_theta), local, g_scaling))
            }
            Some(v @ Value::Object(_)) => {
                let (t, s) = self.rope_entry(v, "rope_parameters", ctx)?;
                Ok((t.or(theta).unwrap_or(default_theta), default_local, s))
            }
            Some(v) => Err(self.config_err(format!("`rope_parameters` must be an object, got {}", describe(v)))),
            None => {
                let s = match scaling {
                    Some(v) => self.rope_entry(v, "rope_scaling", ctx)?.1,
                    None => None,
                };
                Ok((theta.unwrap_or(default_theta), default_local, s))
            }
        }
    }

    /// One RoPE description: `{"rope_type": ..., "rope_theta": ..., factors}`.
    fn rope_entry(&self, v: &Value, key: &str, ctx: RopeContext) -> Result<(Option<f64>, Option<RopeScaling>)> {
        let Value::Object(o) = v else {
            return Err(self.config_err(format!("`{key}` must be an object, got {}", describe(v))));
        };
        let theta = match o.get("rope_theta") {
            None | Some(Value::Null) => None,
            Some(t) => Some(t.as_f64().ok_or_else(|| self.config_err(format!("`{key}.rope_theta` must be a number")))?),
        };
        let num = |name: &str| -> Result<f64> {
            o.get(name).and_then(Value::as_f64).ok_or_else(|| self.config_err(format!("`{key}` needs a numeric `{name}`")))
        };
        let kind = o.get("rope_type").or_else(|| o.get("type")).and_then(Value::as_str).unwrap_or("default");
        let scaling = match kind {
            "default" => None,
            "linear" => Some(RopeScaling::Linear { factor: num("factor")? }),
            "llama3" => Some(RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: o
                    .get("original_max_position_embeddings")
                    .and_then(as_usize)
                    .ok_or_else(|| self.config_err(format!("`{key}` needs an integer `original_max_position_embeddings`")))?,
            }),
            "longrope" => Some(self.longrope(o, key, ctx)?),
            other => return Err(self.unsupported(format!("`{key}` type `{other}` (supported: default, linear, llama3, longrope)"))),
        };
        Ok((theta, scaling))
    }

    /// LongRoPE's factors (one per rotated pair; their count is checked with the
    /// config), its original context (in the entry, else at the top of the config,
    /// else `max_position_embeddings`) and its attention factor (given, else the
    /// default for the entry's `factor`, else for `max_position_embeddings /
    /// original`), as transformers 5 reads them.
    fn longrope(&self, o: &serde_json::Map<String, Value>, key: &str, ctx: RopeContext) -> Result<RopeScaling> {
        let factors = |name: &str| -> Result<Vec<f64>> {
            o.get(name)
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                .ok_or_else(|| self.config_err(format!("`{key}` needs a list of numbers `{name}`")))
        };
        let number = |name: &str| -> Result<Option<f64>> {
            match o.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| self.config_err(format!("`{key}.{name}` must be a number"))),
            }
        };
        let original = match o.get("original_max_position_embeddings") {
            None | Some(Value::Null) => ctx.original.unwrap_or(ctx.max_position_embeddings),
            Some(v) => {
                as_usize(v).ok_or_else(|| self.config_err(format!("`{key}.original_max_position_embeddings` must be an integer")))?
            }
        };
        let attention_factor = match number("attention_factor")? {
            Some(a) => a,
            None => {
                let s = number("factor")?.unwrap_or(ctx.max_position_embeddings as f64 / original.max(1) as f64);
                RopeScaling::longrope_attention_factor(s, original)
            }
        };
        Ok(RopeScaling::LongRope {
            short_factor: factors("short_factor")?,
            long_factor: factors("long_factor")?,
            original_max_position_embeddings: original,
            attention_factor,
        })
    }

    /// A token id or a list of them.
    fn token(&mut self, key: &str) -> Result<Option<Vec<u32>>> {
        let bad = |s: &Self, v: &Value| s.config_err(format!("`{key}` must be a token id or a list of them, got {}", describe(v)));
        match self.get(key) {
            None => Ok(None),
            Some(v @ Value::Array(a)) => a
                .iter()
                .map(|t| as_usize(t).and_then(|t| u32::try_from(t).ok()).ok_or_else(|| bad(self, v)))
                .collect::<Result<_>>()
                .map(Some),
            Some(v) => as_usize(v).and_then(|t| u32::try_from(t).ok()).map(|t| Some(vec![t])).ok_or_else(|| bad(self, v)),
        }
    }
}

/// What a RoPE entry may read from the rest of the config.
#[derive(Clone, Copy)]
struct RopeContext {
    max_position_embeddings: usize,
    /// `original_max_position_embeddings` at the top of the config (Phi-3).
    original: Option<usize>,
}

/// A non-negative integer (also written as `8.0`).
fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    let f = v.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f < 9.0e15).then_some(f as usize)
}
