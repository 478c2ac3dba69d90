//! A llama.cpp vision projector file (`mmproj`, as `convert_hf_to_gguf.py --mmproj`
//! writes it and `tools/mtmd/clip.cpp` reads it) for a Gemma 3 text GGUF: its
//! `clip.*` metadata as a [`VisionConfig`] (read by the GGUF metadata reader the
//! text model's config uses, [`MetaReader`]), its tensor names mapped onto the
//! tower's modules ([`VisionModule`], so the tower code runs unchanged), the
//! converter's changes undone.
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

use super::gguf::{Array, GgufFile, MetaReader, Value};
use super::gguf_model::Transform;
use super::vision::{LayerModule, VisionConfig, VisionModule};
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
    let (base, suffix) = name.rsplit_once('.')?;
    let module = match base {
        "v.patch_embd" => VisionModule::PatchEmbedding,
        "v.position_embd" => VisionModule::PositionEmbedding,
        "v.post_ln" => VisionModule::PostLayerNorm,
        "mm.input_projection" => VisionModule::InputProjection,
        "mm.soft_emb_norm" => VisionModule::SoftEmbNorm,
        _ => {
            let (layer, part) = base.strip_prefix("v.blk.")?.split_once('.')?;
            let part = match part {
                "attn_q" => LayerModule::Q,
                "attn_k" => LayerModule::K,
                "attn_v" => LayerModule::V,
                "attn_out" => LayerModule::Out,
                "ln1" => LayerModule::LayerNorm1,
                "ln2" => LayerModule::LayerNorm2,
                "ffn_up" => LayerModule::Fc1,
                "ffn_down" => LayerModule::Fc2,
                _ => return None,
            };
            VisionModule::Layer(layer.parse().ok()?, part)
        }
    };
    let canonical = match suffix {
        "weight" => module.weight(),
        "bias" => module.bias()?,
        _ => return None,
    };
    let tf = if module == VisionModule::SoftEmbNorm { Transform::MinusOne } else { Transform::None };
    Some((canonical, tf))
}

/// The vision config of mmproj file `f` paired with the text model `text` (its
/// vocabulary `vocab`, the text GGUF's `tokenizer.ggml.tokens`): every problem
/// (another projector type, a projector for a text model of another width, an
/// image normalization other than Gemma 3's) is an error naming what to do.
pub fn mmproj_config(f: &GgufFile, text: &ModelConfig, text_path: &Path, vocab: Option<&Array>) -> Result<VisionConfig> {
    let mut c = MetaReader::new(f, "clip");
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
    let proj = match c.str_opt("projector_type")? {
        Some(p) => p,
        None => c.str_opt("vision.projector_type")?.ok_or_else(|| c.err("missing metadata `clip.projector_type`".into()))?,
    };
    if proj != "gemma3" {
        return Err(ModelError::Unsupported { path, what: format!("projector type `{proj}` (supported: {SUPPORTED_PROJECTORS})") });
    }
    if c.get("has_vision_encoder").and_then(Value::as_bool) != Some(true) {
        return Err(c.err("`clip.has_vision_encoder` is not true: the file has no vision tower".into()));
    }
    let hidden_size = c.usize_req("vision.embedding_length")?;
    let num_heads = c.usize_req("vision.attention.head_count")?;
    let image_size = c.usize_req("vision.image_size")?;
    let patch_size = c.usize_req("vision.patch_size")?;
    let projection_dim = c.usize_req("vision.projection_dim")?;
    if projection_dim != text.dims.hidden_size {
        return Err(c.err(format!(
            "the projector maps into width {projection_dim} (`clip.vision.projection_dim`) but the text model {} has hidden size {}: \
             give the mmproj file made from the same checkpoint as the text model",
            text_path.display(),
            text.dims.hidden_size
        )));
    }
    let layer_norm_eps = c.f64_opt("vision.attention.layer_norm_epsilon")?.unwrap_or(1e-6);
    // The image processor's normalization: ktune's image loader is Gemma 3's
    // (mean 0.5, std 0.5 per channel).
    for key in ["vision.image_mean", "vision.image_std"] {
        if let Some(v) = c.f64s_opt(key)?
            && (v.len() != 3 || v.iter().any(|x| (x - 0.5).abs() > 1e-6))
        {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!("`{}` {v:?} (Gemma 3's processor: 0.5 per channel)", c.key(key)),
            });
        }
    }
    let scale = c.usize_opt("vision.projector.scale_factor")?.unwrap_or(DEFAULT_SCALE_FACTOR);
    let per_side = image_size.checked_div(patch_size).unwrap_or(0);
    if scale == 0 || !per_side.is_multiple_of(scale) {
        return Err(c.err(format!("{per_side} patches per side do not pool by `clip.vision.projector.scale_factor` {scale}")));
    }
    let side = per_side / scale;
    let token = |text_tok: &str| -> Result<u32> {
        let found = vocab.and_then(|v| v.strs()?.position(|t| t == text_tok));
        found.and_then(|i| u32::try_from(i).ok()).ok_or_else(|| ModelError::Config {
            path: text_path.to_path_buf(),
            msg: format!("the vocabulary has no `{text_tok}` token: not a Gemma 3 multimodal text model"),
        })
    };
    let vision = VisionConfig {
        hidden_size,
        intermediate_size: c.usize_req("vision.feed_forward_length")?,
        num_layers: c.usize_req("vision.block_count")?,
        num_heads,
        num_channels: 3,
        image_size,
        patch_size,
        layer_norm_eps,
        mm_tokens_per_image: side * side,
        image_token_id: token(IMAGE_TOKEN)?,
        boi_token_id: token(BOI_TOKEN)?,
        eoi_token_id: token(EOI_TOKEN)?,
        text_hidden_size: text.dims.hidden_size,
    };
    vision.validate(text.dims.vocab_size).map_err(|e| c.err(e.to_string()))?;
    Ok(vision)
}

#[cfg(test)]
mod tests {
    use super::super::vision::TOWER;
    use super::*;

    #[test]
    fn names_map_to_the_canonical_vision_names() {
        assert_eq!(mmproj_name("v.blk.3.ffn_up.bias"), Some((format!("{TOWER}.encoder.layers.3.mlp.fc1.bias"), Transform::None)));
        assert_eq!(mmproj_name("mm.soft_emb_norm.weight").map(|n| n.1), Some(Transform::MinusOne));
        assert_eq!(mmproj_name("v.blk.x.ln1.weight"), None);
        assert_eq!(mmproj_name("v.blk.0.attn_qkv.weight"), None);
        // Every canonical tensor of a tower has an mmproj name.
        let v = VisionConfig::tiny();
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
