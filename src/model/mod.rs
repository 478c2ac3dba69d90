//! Models: what a transformer decoder looks like (its [`ModelConfig`], built in for
//! the published models, read from a Hugging Face `config.json` or from a GGUF
//! file's metadata) and its weights ([`Weights`], memory-mapped safetensors or
//! GGUF, or deterministic synthetic values).
//!
//! The families covered (Llama 3.x and SmolLM2, Qwen2.5, Qwen3, Mistral, SmolLM3,
//! Gemma 3 with the SigLIP vision tower of its multimodal checkpoints:
//! [`VisionConfig`]) are each described once, in [`family::FAMILIES`]. Everything the plan and the runtime need to know about a model
//! is a field or a method of [`ModelConfig`]; tensors are named as in the Hugging
//! Face checkpoints ([`ModelConfig::tensor_shapes`]). A directory's `tokenizer.json`,
//! when there is one, or a GGUF file's `tokenizer.ggml.*` metadata, turns text
//! into ids and back ([`Tokenizer`]); its chat template ([`ChatTemplate`]) turns a
//! prompt into a chat turn.

mod builtin;
mod bytes;
mod chat;
mod config;
pub mod family;
pub mod gguf;
mod gguf_model;
mod hf;
pub mod hub;
pub mod mmproj;
mod stfile;
mod tokenizer;
pub mod vision;
mod weights;

use std::path::PathBuf;

pub use builtin::{builtin, builtin_names, builtin_repo, builtin_vision};
pub use bytes::WeightFile;
pub use chat::{ChatTemplate, END_OF_TURN_TOKENS, TOKENIZER_CONFIG_FILE};
pub use config::{Architecture, Dims, Dtype, HiddenAct, LayerKind, ModelConfig, Moe, Multipliers, RopeScaling, RowScale};
pub use gguf::Stored;
pub use gguf_model::{GgufConfig, Transform, gguf_config};
pub use hf::ParsedConfig;
pub use tokenizer::{TOKENIZER_FILE, Tokenizer};
pub use vision::VisionConfig;
pub use weights::{GgufModel, TensorMeta, Weights};

/// Errors of the model layer: configs, weight files, tensor lookups.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model `{name}`; built-in models: {known}")]
    UnknownModel { name: String, known: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not valid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    #[error("{}: {what} is not supported", path.display())]
    Unsupported { path: PathBuf, what: String },
    #[error("inconsistent model config: {0}")]
    Invalid(String),
    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },
    #[error("{}: no weights: expected model.safetensors or model.safetensors.index.json", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("tensor `{name}` not found in the weights ({count} tensors present)")]
    MissingTensor { name: String, count: usize },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape { name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("tensor `{name}` has dtype {dtype}; only F32, F16 and BF16 can be read")]
    Dtype { name: String, dtype: String },
    #[error("tensor `{name}`: row {row} is out of range ({rows} rows)")]
    Row { name: String, row: usize, rows: usize },
    #[error("output buffer for tensor `{name}` holds {got} values, the tensor has {want}")]
    Buffer { name: String, want: usize, got: usize },
    #[error("{}: {msg}", path.display())]
    Tokenizer { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Chat { path: PathBuf, msg: String },
    #[error("tensor `{name}` cannot be quantized: {source}")]
    Quant { name: String, source: crate::kernels::quant::QuantError },
    #[error(transparent)]
    Hub(#[from] hub::HubError),
    #[error("the weights do not match the config:\n  {}", problems.join("\n  "))]
    Mismatch { problems: Vec<String> },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
