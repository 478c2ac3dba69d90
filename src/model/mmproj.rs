//! A llama.cpp vision projector file (`mmproj`, as `convert_hf_to_gguf.py --mmproj`
//! writes it and `tools/mtmd/clip.cpp` reads it) for a Gemma 3 text GGUF: its
//! `clip.*` metadata as a [`VisionConfig`], its tensor names mapped onto the
//! canonical vision names (so the tower code runs unchanged), the converter's
//! changes undone.
//!
//! What the converter does (`Gemma3VisionModel`, gguf-py's tensor map `MMPROJ`):
//!
//! - the SigLIP tower's tensors keep their PyTorch shapes (the patch embedding
//!   `[width, channels, patch, patch]`, `mm.input_projection.weight` the
//!   `[vision width, text width]` parameter as transformers holds it; clip.cpp
//!   transposes it at run time);
//! - `mm.soft_emb_norm.weight` is stored as `1 + w` (Gemma's RMSNorm gain), so
//!   [`Transform::MinusOne`] restores the `(1 + w)` form the runtime uses; the
//!   tower's LayerNorms are stored as they are;
//! - the projector's pooling is `clip.vision.projector.scale_factor` patches per
//!   side (written only when not clip.cpp's default, 4: Gemma 3's 64 x 64 patches
//!   pooled to 16 x 16 = 256 tokens).
//!
//! The prompt's image tokens are in neither file: llama.cpp's mtmd writes
//! `<start_of_image>` and `<end_of_image>` as text (tokenized by the text model's
//! vocabulary) and hands the soft tokens over as embeddings, with no id. ktune's
//! prompt holds a placeholder id per soft token, as transformers' processor
//! does: `<image_soft_token>`, looked up in the text GGUF's vocabulary like the
//! other two (the converter copies it from the checkpoint's added tokens; in
//! Gemma 3's checkpoints it is id 262144, inside their 262208-row embedding). A
//! vocabulary without the three tokens is refused with the reason.

use std::path::Path;

use super::gguf::{GgufFile, Value};
use super::gguf_model::Transform;
use super::vision::{PROJECTOR, TOWER, VisionConfig};
use super::{ModelConfig, ModelError, Result};

/// The projector types ktune runs.
pub const SUPPORTED_PROJECTORS: &str = "gemma3";
/// clip.cpp's pooling for Gemma 3 when the file does not say.
const DEFAULT_SCALE_FACTOR: usize = 4;
/// The texts of the image tokens in a Gemma 3 vocabulary.
pub const IMAGE_TOKEN: &str = "<image_soft_token>";
pub const BOI_TOKEN: &str = "<start_of_image>";
pub const EOI_TOKEN: &str = "<end_of_image>";

/// The canonical name of an mmproj tensor and how to undo the converter; None
/// for a tensor the Gemma 3 projector does not use.
pub fn mmproj_name(name: &str) -> Option<(String, Transform)> {
    let plain = |n: String| Some((n, Transform::None));
    match name {
        "v.patch_embd.weight" => return plain(format!("{TOWER}.embeddings.patch_embedding.weight")),
        "v.patch_embd.bias" => return plain(format!("{TOWER}.embeddings.patch_embedding.bias")),
        "v.position_embd.weight" => return plain(format!("{TOWER}.embeddings.position_embedding.weight")),
        "v.post_ln.weight" => return plain(format!("{TOWER}.post_layernorm.weight")),
        "v.post_ln.bias" => return plain(format!("{TOWER}.post_layernorm.bias")),
        "mm.input_projection.weight" => return plain(format!("{PROJECTOR}.mm_input_projection_weight")),
        "mm.soft_emb_norm.weight" => return Some((format!("{PROJECTOR}.mm_soft_emb_norm.weight"), Transform::MinusOne)),
        _ => {}
    }
    let rest = name.strip_prefix("v.blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (base, suffix) = tail.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf = match base {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_out" => "self_attn.out_proj",
        "ln1" => "layer_norm1",
        "ln2" => "layer_norm2",
        "ffn_up" => "mlp.fc1",
        "ffn_down" => "mlp.fc2",
        _ => return None,
    };
    plain(format!("{TOWER}.encoder.layers.{layer}.{hf}.{suffix}"))
}

/// Typed reads of `clip.*` keys with messages naming the file and the key.
struct Clip<'a> {
    f: &'a GgufFile,
}

impl<'a> Clip<'a> {
    fn err(&self, msg: String) -> ModelError {
        ModelError::Config { path: self.f.path.clone(), msg }
    }
    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.f.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|u| usize::try_from(u).ok())
                .map(Some)
                .ok_or_else(|| self.err(format!("`{key}` must be a non-negative integer, got {} ({})", v.describe(), v.type_name()))),
        }
    }
    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(format!("missing metadata `{key}`: not a complete llama.cpp mmproj conversion?")))
    }
    fn floats(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let Some(v) = self.f.get(key) else { return Ok(None) };
        let bad = || self.err(format!("`{key}` must be an array of numbers, got {} ({})", v.describe(), v.type_name()));
        let a = v.as_array().ok_or_else(bad)?;
        a.iter().map(|x| x.as_f64().ok_or_else(bad)).collect::<Result<Vec<_>>>().map(Some)
    }
}

/// The vision config of mmproj file `f` paired with the text model `text` (its
/// vocabulary `vocab`, the text GGUF's `tokenizer.ggml.tokens`): every problem
/// (another projector type, a projector for a text model of another width, an
/// image normalization other than Gemma 3's) is an error naming what to do.
pub fn mmproj_config(f: &GgufFile, text: &ModelConfig, text_path: &Path, vocab: Option<&[Value]>) -> Result<VisionConfig> {
    let c = Clip { f };
    let path = f.path.clone();
    match f.get("general.architecture").map(|v| v.as_str()) {
        Some(Some("clip")) => {}
        Some(Some(other)) => {
            return Err(c.err(format!(
                "`general.architecture` is `{other}`, not `clip`: this is not a vision projector (mmproj) file{}",
                if f.get(&format!("{other}.block_count")).is_some() { " but a text model; give it with --gguf" } else { "" }
            )));
        }
        _ => return Err(c.err("no `general.architecture: clip`: not a llama.cpp vision projector (mmproj) file".into())),
    }
    // clip.cpp: `clip.projector_type`, else the per-modality `clip.vision.projector_type`.
    let proj = f.get("clip.projector_type").or_else(|| f.get("clip.vision.projector_type"));
    let proj = match proj.map(|v| v.as_str()) {
        Some(Some(p)) => p,
        Some(None) => return Err(c.err("`clip.projector_type` must be a string".into())),
        None => return Err(c.err("missing metadata `clip.projector_type`".into())),
    };
    if proj != "gemma3" {
        return Err(ModelError::Unsupported { path, what: format!("projector type `{proj}` (supported: {SUPPORTED_PROJECTORS})") });
    }
    if f.get("clip.has_vision_encoder").and_then(Value::as_bool) != Some(true) {
        return Err(c.err("`clip.has_vision_encoder` is not true: the file has no vision tower".into()));
    }
    let hidden_size = c.usize_req("clip.vision.embedding_length")?;
    let num_heads = c.usize_req("clip.vision.attention.head_count")?;
    let image_size = c.usize_req("clip.vision.image_size")?;
    let patch_size = c.usize_req("clip.vision.patch_size")?;
    let projection_dim = c.usize_req("clip.vision.projection_dim")?;
    if projection_dim != text.hidden_size {
        return Err(c.err(format!(
            "the projector maps into width {projection_dim} (`clip.vision.projection_dim`) but the text model {} has hidden size {}: \
             give the mmproj file made from the same checkpoint as the text model",
            text_path.display(),
            text.hidden_size
        )));
    }
    let layer_norm_eps = match f.get("clip.vision.attention.layer_norm_epsilon") {
        None => 1e-6,
        Some(v) => {
            v.as_f64().ok_or_else(|| c.err(format!("`clip.vision.attention.layer_norm_epsilon` must be a number, got {}", v.describe())))?
        }
    };
    // The image processor's normalization: ktune's image loader is Gemma 3's
    // (mean 0.5, std 0.5 per channel).
    for key in ["clip.vision.image_mean", "clip.vision.image_std"] {
        if let Some(v) = c.floats(key)?
            && (v.len() != 3 || v.iter().any(|x| (x - 0.5).abs() > 1e-6))
        {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!("`{key}` {v:?} (Gemma 3's processor: 0.5 per channel)"),
            });
        }
    }
    let scale = c.usize_opt("clip.vision.projector.scale_factor")?.unwrap_or(DEFAULT_SCALE_FACTOR);
    let per_side = image_size.checked_div(patch_size).unwrap_or(0);
    if scale == 0 || !per_side.is_multiple_of(scale) {
        return Err(c.err(format!("{per_side} patches per side do not pool by `clip.vision.projector.scale_factor` {scale}")));
    }
    let side = per_side / scale;
    let token = |text_tok: &str| -> Result<u32> {
        let found = vocab.and_then(|v| v.iter().position(|t| t.as_str() == Some(text_tok)));
        found.and_then(|i| u32::try_from(i).ok()).ok_or_else(|| ModelError::Config {
            path: text_path.to_path_buf(),
            msg: format!("the vocabulary has no `{text_tok}` token: not a Gemma 3 multimodal text model"),
        })
    };
    let vision = VisionConfig {
        hidden_size,
        intermediate_size: c.usize_req("clip.vision.feed_forward_length")?,
        num_layers: c.usize_req("clip.vision.block_count")?,
        num_heads,
        num_channels: 3,
        image_size,
        patch_size,
        layer_norm_eps,
        mm_tokens_per_image: side * side,
        image_token_id: token(IMAGE_TOKEN)?,
        boi_token_id: token(BOI_TOKEN)?,
        eoi_token_id: token(EOI_TOKEN)?,
        text_hidden_size: text.hidden_size,
    };
    vision.validate(text.vocab_size).map_err(|e| c.err(e.to_string()))?;
    Ok(vision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_the_canonical_vision_names() {
        assert_eq!(mmproj_name("v.blk.3.ffn_up.bias"), Some((format!("{TOWER}.encoder.layers.3.mlp.fc1.bias"), Transform::None)));
        assert_eq!(mmproj_name("mm.soft_emb_norm.weight").map(|n| n.1), Some(Transform::MinusOne));
        assert_eq!(mmproj_name("v.blk.x.ln1.weight"), None);
        assert_eq!(mmproj_name("v.blk.0.attn_qkv.weight"), None);
        // Every canonical tensor of a tower has an mmproj name.
        let v = VisionConfig {
            hidden_size: 8,
            intermediate_size: 16,
            num_layers: 2,
            num_heads: 2,
            num_channels: 3,
            image_size: 16,
            patch_size: 4,
            layer_norm_eps: 1e-6,
            mm_tokens_per_image: 4,
            image_token_id: 5,
            boi_token_id: 6,
            eoi_token_id: 7,
            text_hidden_size: 16,
        };
        let mut names = vec![
            "v.patch_embd.weight".to_string(),
            "v.patch_embd.bias".into(),
            "v.position_embd.weight".into(),
            "v.post_ln.weight".into(),
            "v.post_ln.bias".into(),
            "mm.input_projection.weight".into(),
            "mm.soft_emb_norm.weight".into(),
        ];
        for l in 0..2 {
            for t in ["attn_q", "attn_k", "attn_v", "attn_out", "ln1", "ln2", "ffn_up", "ffn_down"] {
                names.push(format!("v.blk.{l}.{t}.weight"));
                names.push(format!("v.blk.{l}.{t}.bias"));
            }
        }
        let mut mapped: Vec<String> = names.iter().filter_map(|n| mmproj_name(n)).map(|(n, _)| n).collect();
        let mut want: Vec<String> = v.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        mapped.sort();
        want.sort();
        assert_eq!(mapped, want);
    }
}
