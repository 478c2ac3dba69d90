//! The vision side of a multimodal checkpoint (`Gemma3ForConditionalGeneration`):
//! the SigLIP tower's shapes ([`VisionConfig`], from `vision_config`), the
//! projector's pooling and the prompt's image tokens, and the tensor names and
//! shapes of the tower and the projector as transformers names them.

use serde::{Deserialize, Serialize};

use super::{ModelError, Result};

/// A SigLIP vision tower and Gemma 3's multimodal projector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_channels: usize,
    /// Side of the square image the tower reads, in pixels.
    pub image_size: usize,
    pub patch_size: usize,
    pub layer_norm_eps: f64,
    /// Soft tokens one image becomes (a square number: the pooled grid).
    pub mm_tokens_per_image: usize,
    /// The placeholder id the projected tokens replace in the prompt.
    pub image_token_id: u32,
    /// `<start_of_image>` and `<end_of_image>`.
    pub boi_token_id: u32,
    pub eoi_token_id: u32,
    /// Width of the text model the projector maps into.
    pub text_hidden_size: usize,
}

/// Names of the tower's tensors (canonical: `vision_tower.vision_model.`).
pub const TOWER: &str = "vision_tower.vision_model";
/// Names of the projector's tensors.
pub const PROJECTOR: &str = "multi_modal_projector";

impl VisionConfig {
    /// Patches along one side of the image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size.max(1)
    }

    /// Patches of one image (the tower's sequence length).
    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }

    /// Pooled tokens along one side.
    pub fn tokens_per_side(&self) -> usize {
        (self.mm_tokens_per_image as f64).sqrt().round() as usize
    }

    /// The pooling window (and stride) of the projector.
    pub fn pool_kernel(&self) -> usize {
        self.patches_per_side() / self.tokens_per_side().max(1)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads.max(1)
    }

    /// Every tensor of the tower and the projector with its shape, as transformers
    /// stores them (`mm_input_projection_weight` is `[vision hidden, text hidden]`,
    /// the transpose of a Linear weight).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, c, p) = (self.hidden_size, self.intermediate_size, self.num_channels, self.patch_size);
        let mut t = vec![
            (format!("{TOWER}.embeddings.patch_embedding.weight"), vec![h, c, p, p]),
            (format!("{TOWER}.embeddings.patch_embedding.bias"), vec![h]),
            (format!("{TOWER}.embeddings.position_embedding.weight"), vec![self.num_patches(), h]),
        ];
        for l in 0..self.num_layers {
            let mut add = |name: &str, shape: Vec<usize>| t.push((format!("{TOWER}.encoder.layers.{l}.{name}"), shape));
            for norm in ["layer_norm1", "layer_norm2"] {
                add(&format!("{norm}.weight"), vec![h]);
                add(&format!("{norm}.bias"), vec![h]);
            }
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                add(&format!("self_attn.{proj}.weight"), vec![h, h]);
                add(&format!("self_attn.{proj}.bias"), vec![h]);
            }
            add("mlp.fc1.weight", vec![i, h]);
            add("mlp.fc1.bias", vec![i]);
            add("mlp.fc2.weight", vec![h, i]);
            add("mlp.fc2.bias", vec![h]);
        }
        t.push((format!("{TOWER}.post_layernorm.weight"), vec![h]));
        t.push((format!("{TOWER}.post_layernorm.bias"), vec![h]));
        t.push((format!("{PROJECTOR}.mm_soft_emb_norm.weight"), vec![h]));
        t.push((format!("{PROJECTOR}.mm_input_projection_weight"), vec![h, self.text_hidden_size]));
        t
    }

    /// Checks that the fields agree with each other and with the text model's
    /// vocabulary; the error says which do not.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let mut bad = Vec::new();
        for (name, v) in [
            ("vision_config.hidden_size", self.hidden_size),
            ("vision_config.intermediate_size", self.intermediate_size),
            ("vision_config.num_hidden_layers", self.num_layers),
            ("vision_config.num_attention_heads", self.num_heads),
            ("vision_config.num_channels", self.num_channels),
            ("vision_config.image_size", self.image_size),
            ("vision_config.patch_size", self.patch_size),
            ("mm_tokens_per_image", self.mm_tokens_per_image),
        ] {
            if v == 0 {
                bad.push(format!("{name} is 0"));
            }
        }
        if bad.is_empty() {
            if !self.image_size.is_multiple_of(self.patch_size) {
                bad.push(format!("image_size {} is not a multiple of patch_size {}", self.image_size, self.patch_size));
            }
            if !self.hidden_size.is_multiple_of(self.num_heads) {
                bad.push(format!("vision hidden_size {} is not a multiple of its {} heads", self.hidden_size, self.num_heads));
            }
            let side = self.tokens_per_side();
            if side * side != self.mm_tokens_per_image {
                bad.push(format!("mm_tokens_per_image {} is not a square number", self.mm_tokens_per_image));
            } else if !self.patches_per_side().is_multiple_of(side) {
                bad.push(format!(
                    "{} patches per side do not pool evenly to {side} tokens per side (mm_tokens_per_image {})",
                    self.patches_per_side(),
                    self.mm_tokens_per_image
                ));
            }
            // Transformers' image processor caps the image at 2^13 pixels per side
            // long before this; a larger tower is not a real model.
            if self.image_size > 8192 || self.num_layers > 1000 {
                bad.push(format!("image_size {} / {} layers is not a real vision tower", self.image_size, self.num_layers));
            }
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            bad.push(format!("vision_config.layer_norm_eps ({}) must be positive", self.layer_norm_eps));
        }
        for (name, t) in
            [("image_token_index", self.image_token_id), ("boi_token_index", self.boi_token_id), ("eoi_token_index", self.eoi_token_id)]
        {
            if t as usize >= vocab_size {
                bad.push(format!("{name} {t} is outside the vocabulary ({vocab_size})"));
            }
        }
        if bad.is_empty() { Ok(()) } else { Err(ModelError::Invalid(bad.join("; "))) }
    }
}
