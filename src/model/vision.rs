//! The vision side of a multimodal checkpoint (`Gemma3ForConditionalGeneration`):
//! the SigLIP tower's shapes ([`VisionConfig`], from `vision_config`), the
//! projector's pooling and the prompt's image tokens, and the tensors of the
//! tower and the projector ([`VisionModule`]: their names as transformers names
//! them, their shapes), the one table both weight sources are read and checked by.

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

/// A module of the tower or the projector that holds weights: a weight tensor,
/// most with a bias of the weight's first dimension beside it. The one table of
/// the tower's tensors: their canonical names and shapes
/// ([`VisionConfig::tensor_shapes`]), the vision plan's weight buffers
/// (`plan::vision`) and the mmproj file's names (`mmproj::mmproj_name`) all
/// come from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionModule {
    /// The patch embedding, a convolution `[hidden, channels, patch, patch]`.
    PatchEmbedding,
    /// `[patches, hidden]`, no bias.
    PositionEmbedding,
    /// A module of encoder layer `.0`.
    Layer(usize, LayerModule),
    /// The LayerNorm after the last layer.
    PostLayerNorm,
    /// The projector's `(1 + w)` RMSNorm gain, no bias.
    SoftEmbNorm,
    /// The projector's `[vision hidden, text hidden]` parameter, no bias.
    InputProjection,
}

/// A module of one encoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerModule {
    LayerNorm1,
    LayerNorm2,
    Q,
    K,
    V,
    Out,
    Fc1,
    Fc2,
}

impl LayerModule {
    /// In the checkpoint's order.
    pub const ALL: [LayerModule; 8] = [
        LayerModule::LayerNorm1,
        LayerModule::LayerNorm2,
        LayerModule::Q,
        LayerModule::K,
        LayerModule::V,
        LayerModule::Out,
        LayerModule::Fc1,
        LayerModule::Fc2,
    ];

    /// Its name inside the layer, as transformers names it.
    fn hf(self) -> &'static str {
        match self {
            LayerModule::LayerNorm1 => "layer_norm1",
            LayerModule::LayerNorm2 => "layer_norm2",
            LayerModule::Q => "self_attn.q_proj",
            LayerModule::K => "self_attn.k_proj",
            LayerModule::V => "self_attn.v_proj",
            LayerModule::Out => "self_attn.out_proj",
            LayerModule::Fc1 => "mlp.fc1",
            LayerModule::Fc2 => "mlp.fc2",
        }
    }
}

impl VisionModule {
    /// The module's name, its tensors' names less `.weight` / `.bias`.
    fn base(self) -> String {
        match self {
            VisionModule::PatchEmbedding => format!("{TOWER}.embeddings.patch_embedding"),
            VisionModule::PositionEmbedding => format!("{TOWER}.embeddings.position_embedding"),
            VisionModule::Layer(l, part) => format!("{TOWER}.encoder.layers.{l}.{}", part.hf()),
            VisionModule::PostLayerNorm => format!("{TOWER}.post_layernorm"),
            VisionModule::SoftEmbNorm => format!("{PROJECTOR}.mm_soft_emb_norm"),
            VisionModule::InputProjection => format!("{PROJECTOR}.mm_input_projection"),
        }
    }

    /// The canonical name of its weight (the input projection is a bare
    /// parameter, `mm_input_projection_weight`).
    pub fn weight(self) -> String {
        match self {
            VisionModule::InputProjection => format!("{}_weight", self.base()),
            _ => format!("{}.weight", self.base()),
        }
    }

    /// The canonical name of its bias, None for a module without one.
    pub fn bias(self) -> Option<String> {
        match self {
            VisionModule::PositionEmbedding | VisionModule::SoftEmbNorm | VisionModule::InputProjection => None,
            _ => Some(format!("{}.bias", self.base())),
        }
    }

    /// The shape of its weight as stored (a Linear's `[out, in]`).
    pub fn shape(self, c: &VisionConfig) -> Vec<usize> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        match self {
            VisionModule::PatchEmbedding => vec![h, c.num_channels, c.patch_size, c.patch_size],
            VisionModule::PositionEmbedding => vec![c.num_patches(), h],
            VisionModule::Layer(_, LayerModule::Fc1) => vec![i, h],
            VisionModule::Layer(_, LayerModule::Fc2) => vec![h, i],
            VisionModule::Layer(_, LayerModule::Q | LayerModule::K | LayerModule::V | LayerModule::Out) => vec![h, h],
            VisionModule::Layer(_, LayerModule::LayerNorm1 | LayerModule::LayerNorm2)
            | VisionModule::PostLayerNorm
            | VisionModule::SoftEmbNorm => vec![h],
            VisionModule::InputProjection => vec![h, c.text_hidden_size],
        }
    }
}

impl VisionConfig {
    /// A tower of two layers at width 8 over 16 x 16 images of 4 x 4 patches,
    /// pooled to 4 tokens of width 16: the unit tests' tower.
    #[cfg(test)]
    pub(crate) fn tiny() -> VisionConfig {
        VisionConfig {
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
        }
    }

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

    /// Every module of the tower and the projector that holds weights, in the
    /// checkpoint's order.
    pub fn modules(&self) -> Vec<VisionModule> {
        let mut m = vec![VisionModule::PatchEmbedding, VisionModule::PositionEmbedding];
        m.extend((0..self.num_layers).flat_map(|l| LayerModule::ALL.map(|part| VisionModule::Layer(l, part))));
        m.extend([VisionModule::PostLayerNorm, VisionModule::SoftEmbNorm, VisionModule::InputProjection]);
        m
    }

    /// Every tensor of the tower and the projector with its shape, as transformers
    /// stores them (`mm_input_projection_weight` is `[vision hidden, text hidden]`,
    /// the transpose of a Linear weight): the one list both weight sources (a
    /// checkpoint directory, an mmproj file) are checked against
    /// (`Weights::check_vision`).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut t = Vec::new();
        for m in self.modules() {
            let shape = m.shape(self);
            let out = shape[0];
            t.push((m.weight(), shape));
            if let Some(b) = m.bias() {
                t.push((b, vec![out]));
            }
        }
        t
    }

    /// Checks that the fields agree with each other and with the text model's
    /// vocabulary; the error says which do not.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let mut bad = super::config::zero_fields(&[
            ("vision_config.hidden_size", self.hidden_size),
            ("vision_config.intermediate_size", self.intermediate_size),
            ("vision_config.num_hidden_layers", self.num_layers),
            ("vision_config.num_attention_heads", self.num_heads),
            ("vision_config.num_channels", self.num_channels),
            ("vision_config.image_size", self.image_size),
            ("vision_config.patch_size", self.patch_size),
            ("mm_tokens_per_image", self.mm_tokens_per_image),
        ]);
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
