//! [`Weights`]: a model's tensors by Hugging Face name, from memory-mapped
//! safetensors files (one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`; F32, F16 or BF16), a memory-mapped GGUF file
//! (F32, F16, BF16 and the block formats of [`QFormat`]; names mapped and llama.cpp's converter
//! undone, see [`super::gguf_model`]) or synthetic (deterministic pseudo-random
//! values with the model's shapes, generated on request).
//!
//! Nothing is converted or copied until a tensor is asked for, in f32 or f16
//! (quantized tensors dequantized) or in a block-quantized format
//! ([`Weights::load_quant`]: a GGUF file's blocks as they are when the format
//! matches): a runtime that wants f16 weights never holds an f32 copy of the model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use rayon::prelude::*;
use serde::Serialize;

use super::bytes::WeightFile;
use super::config::{Dtype, ModelConfig};
use super::gguf::{GgufFile, Stored, decode};
use super::gguf_model::{GgufConfig, Transform, gguf_config, hf_name};
use super::stfile::{Elem, Entry, PAR_CHUNK, StFile, decode_le};
use super::{ModelError, Result};
use crate::kernels::convert::splitmix;
use crate::kernels::quant::{QFormat, QMatrix, QuantError};

/// A model read from one GGUF file.
#[derive(Debug)]
pub struct GgufModel {
    pub config: ModelConfig,
    /// `{arch}.*` metadata keys ktune did not read.
    pub ignored_keys: Vec<String>,
    pub weights: Weights,
    /// The file (its tokenizer metadata).
    pub file: Arc<GgufFile>,
}

/// What is known about one tensor without reading it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorMeta {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorMeta {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Where a tensor lives.
#[derive(Clone, Debug)]
enum Slot {
    /// In `files[file]`, entry `entry`.
    File { file: usize, entry: Entry },
    /// Generated: what kind of values, and the per-tensor stream key.
    Synthetic { kind: SynthKind, key: u64, shape: Vec<usize> },
    /// Tensor `tensor` of GGUF file `file`, served in Hugging Face shape after `tf`.
    Gguf { file: usize, tensor: usize, tf: Transform, shape: Vec<usize> },
}

impl Slot {
    fn shape(&self) -> &[usize] {
        match self {
            Slot::File { entry, .. } => &entry.shape,
            Slot::Synthetic { shape, .. } | Slot::Gguf { shape, .. } => shape,
        }
    }

    /// Rows `first..first + rows` of this `[total, cols]` tensor (its leading
    /// dimensions flattened: a GGUF file's `[experts, rows, cols]`), read in place
    /// (None: not a tensor of `total` rows stored as it is served).
    fn rows(&self, first: usize, rows: usize, total: usize) -> Option<Slot> {
        let flat = |shape: &[usize]| match shape {
            [lead @ .., cols] if !lead.is_empty() => Some((lead.iter().product::<usize>(), *cols)),
            _ => None,
        };
        match self {
            Slot::File { file, entry } => {
                let (Some((t, cols)), Ok(dtype)) = (flat(&entry.shape), &entry.dtype) else { return None };
                let row = cols * dtype.size();
                (t == total).then(|| Slot::File {
                    file: *file,
                    entry: Entry {
                        dtype: entry.dtype.clone(),
                        shape: vec![rows, cols],
                        start: entry.start + first * row,
                        end: entry.start + (first + rows) * row,
                    },
                })
            }
            Slot::Gguf { file, tensor, tf: Transform::None, shape } => match flat(shape) {
                Some((t, cols)) if t == total => {
                    Some(Slot::Gguf { file: *file, tensor: *tensor, tf: Transform::Rows { first }, shape: vec![rows, cols] })
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// What synthetic values a tensor gets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SynthKind {
    /// Uniform with standard deviation 0.02 (projections, embeddings).
    Matrix,
    /// Uniform around `center` with half-width 0.05 (norm gains: 1, or 0 for (1 + w) norms).
    Norm { center: f32 },
    /// Uniform with half-width 0.02.
    Bias,
}

/// A model's weights. Cheap to share (`Send + Sync`); reads never mutate.
#[derive(Debug)]
pub struct Weights {
    files: Vec<StFile>,
    /// GGUF files (a text model, and the vision projector `--mmproj` pairs with it).
    gguf: Vec<Arc<GgufFile>>,
    tensors: BTreeMap<String, Slot>,
    /// Where the weights came from, for messages.
    origin: String,
}

/// The name ktune uses for a tensor of a Hugging Face checkpoint: a multimodal
/// checkpoint's text model (`language_model.model.*` and `language_model.lm_head.*`
/// as the published Gemma 3 files and transformers 5's `save_pretrained` write it,
/// `model.language_model.*` as transformers 5 names it in memory) under the
/// text-only names (`model.*`, `lm_head.*`); its tower under
/// `vision_tower.vision_model.*` (published files; transformers 5 saves
/// `vision_tower.*`) and its projector under `multi_modal_projector.*`, without
/// the `model.` prefix of the in-memory names; every other name as it is.
pub fn canonical_name(name: &str) -> String {
    const MAP: &[(&str, &str)] = &[
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ];
    let mut n = name.to_string();
    for (from, to) in MAP {
        if let Some(rest) = n.strip_prefix(from) {
            n = format!("{to}{rest}");
            break;
        }
    }
    if let Some(rest) = n.strip_prefix("vision_tower.")
        && !rest.starts_with("vision_model.")
    {
        n = format!("vision_tower.vision_model.{rest}");
    }
    n
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io { path: path.to_path_buf(), source }
}

impl Weights {
    /// Loads the weights of a Hugging Face model directory: `model.safetensors.index.json`
    /// (sharded) if present, else `model.safetensors`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Weights> {
        let dir = dir.as_ref();
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        if index.is_file() {
            Weights::load_sharded(&index)
        } else if single.is_file() {
            Weights::from_files(&[single])
        } else {
            Err(ModelError::NoWeights { dir: dir.to_path_buf() })
        }
    }

    /// Loads the shards an index file lists (in its directory); every tensor is
    /// taken from the shard the index names, and must be there.
    pub fn load_sharded(index: &Path) -> Result<Weights> {
        let text = std::fs::read_to_string(index).map_err(io(index))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|source| ModelError::Json { path: index.to_path_buf(), source })?;
        let bad = |msg: String| ModelError::File { path: index.to_path_buf(), msg };
        let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(bad("no `weight_map` object".into()));
        };
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shard_names: Vec<&str> = Vec::new();
        let mut wanted: Vec<(&str, &str)> = Vec::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str() else { return Err(bad(format!("`weight_map.{tensor}` is not a file name"))) };
            // Shards are plain file names next to the index, never paths elsewhere.
            let plain = Path::new(file).file_name().is_some_and(|n| n == file) && file != "." && file != "..";
            if !plain {
                return Err(bad(format!("shard name `{file}` (for `{tensor}`) is not a plain file name")));
            }
            if !shard_names.contains(&file) {
                shard_names.push(file);
            }
            wanted.push((tensor, file));
        }
        if shard_names.is_empty() {
            return Err(bad("`weight_map` is empty".into()));
        }
        let files = shard_names.iter().map(|f| StFile::open(&dir.join(f))).collect::<Result<Vec<_>>>()?;
        let mut tensors = BTreeMap::new();
        for (tensor, file) in wanted {
            let i = shard_names.iter().position(|f| *f == file).unwrap_or(0);
            let Some(entry) = files[i].tensors.get(tensor) else {
                return Err(bad(format!("`{tensor}` should be in {file}, which does not hold it")));
            };
            tensors.insert(canonical_name(tensor), Slot::File { file: i, entry: entry.clone() });
        }
        Ok(Weights { files, gguf: Vec::new(), tensors, origin: index.display().to_string() })
    }

    /// Loads safetensors files; a tensor name found in two of them is an error.
    pub fn from_files(paths: &[PathBuf]) -> Result<Weights> {
        let files = paths.iter().map(|p| StFile::open(p)).collect::<Result<Vec<_>>>()?;
        let mut tensors = BTreeMap::new();
        for (i, f) in files.iter().enumerate() {
            for (name, entry) in &f.tensors {
                if tensors.insert(canonical_name(name), Slot::File { file: i, entry: entry.clone() }).is_some() {
                    return Err(ModelError::File { path: f.path.clone(), msg: format!("tensor `{name}` is also in another file") });
                }
            }
        }
        let origin = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        Ok(Weights { files, gguf: Vec::new(), tensors, origin })
    }

    /// Opens a GGUF file: the model config from its metadata and its tensors
    /// under Hugging Face names (see [`super::gguf_model`]). Tensors ktune does not
    /// know are kept under their GGUF names (listed by [`Weights::unused`]).
    pub fn load_gguf(path: impl AsRef<Path>) -> Result<GgufModel> {
        Weights::from_gguf(GgufFile::open(path.as_ref())?)
    }

    /// [`Weights::load_gguf`] of a GGUF image in memory (`label` names it in messages).
    pub fn gguf_from_bytes(label: &Path, bytes: Vec<u8>) -> Result<GgufModel> {
        Weights::from_gguf(GgufFile::parse(label, bytes)?)
    }

    /// One safetensors image in memory (`label` names it in messages), checked as a file is.
    pub fn safetensors_from_bytes(label: &Path, bytes: Vec<u8>) -> Result<Weights> {
        let f = StFile::parse(label, bytes)?;
        let tensors = f.tensors.iter().map(|(name, entry)| (canonical_name(name), Slot::File { file: 0, entry: entry.clone() })).collect();
        Ok(Weights { files: vec![f], gguf: Vec::new(), tensors, origin: label.display().to_string() })
    }

    fn from_gguf(file: GgufFile) -> Result<GgufModel> {
        let file = Arc::new(file);
        let path = file.path.clone();
        let path = path.as_path();
        let GgufConfig { config, ignored_keys } = gguf_config(&file)?;
        let mut tensors = BTreeMap::new();
        for (i, t) in file.tensors.iter().enumerate() {
            if ["rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"].contains(&t.name.as_str()) {
                continue; // folded into the config's RoPE scaling
            }
            let (name, tf) = hf_name(&config, &t.name).unwrap_or_else(|| (t.name.clone(), Transform::None));
            let shape = t.shape();
            if let Transform::Unpermute { heads } = tf
                && (heads == 0 || !shape[0].is_multiple_of(2 * heads))
            {
                return Err(ModelError::File {
                    path: path.to_path_buf(),
                    msg: format!("tensor `{}` has {} rows, not a whole number of {heads} heads of RoPE pairs", t.name, shape[0]),
                });
            }
            if tensors.insert(name.clone(), Slot::Gguf { file: 0, tensor: i, tf, shape }).is_some() {
                return Err(ModelError::File { path: path.to_path_buf(), msg: format!("two tensors map to `{name}`") });
            }
        }
        let mut weights = Weights { files: Vec::new(), gguf: vec![file.clone()], tensors, origin: path.display().to_string() };
        weights.split_stacked(&config)?;
        Ok(GgufModel { config, ignored_keys, weights, file })
    }

    /// Adds the tensors of a second GGUF file (a vision projector, `--mmproj`),
    /// each under the name `map` gives it (and its transform); the names `map`
    /// refuses are returned (tensors left out). A name already present is an error.
    pub fn add_gguf(&mut self, file: Arc<GgufFile>, map: impl Fn(&str) -> Option<(String, Transform)>) -> Result<Vec<String>> {
        let index = self.gguf.len();
        let mut skipped = Vec::new();
        for (i, t) in file.tensors.iter().enumerate() {
            let Some((name, tf)) = map(&t.name) else {
                skipped.push(t.name.clone());
                continue;
            };
            if self.tensors.contains_key(&name) {
                return Err(ModelError::File {
                    path: file.path.clone(),
                    msg: format!("tensor `{}` maps to `{name}`, which the model already has", t.name),
                });
            }
            self.tensors.insert(name, Slot::Gguf { file: index, tensor: i, tf, shape: t.shape() });
        }
        self.origin = format!("{}, {}", self.origin, file.path.display());
        self.gguf.push(file);
        Ok(skipped)
    }

    /// Deterministic pseudo-random weights with the shapes of `config` (values a
    /// function of `seed`, the tensor name and the element index only, so any part
    /// can be generated alone, in any order, on any number of threads). Projections
    /// and embeddings are uniform with standard deviation 0.02, norm gains near 1
    /// (near 0 for (1 + w) norms), biases small. Nothing is generated until asked for.
    pub fn synthetic(config: &ModelConfig, seed: u64) -> Weights {
        let tensors = config
            .tensor_shapes()
            .into_iter()
            .map(|(name, shape)| {
                let kind = if name.ends_with(".bias") {
                    SynthKind::Bias
                } else if name.ends_with("norm.weight") {
                    SynthKind::Norm { center: if config.norm_unit_offset { 0.0 } else { 1.0 } }
                } else {
                    SynthKind::Matrix
                };
                let key = splitmix(seed ^ fnv1a(name.as_bytes()));
                (name, Slot::Synthetic { kind, key, shape })
            })
            .collect();
        Weights { files: Vec::new(), gguf: Vec::new(), tensors, origin: format!("synthetic (seed {seed})") }
    }

    /// [`Weights::synthetic`] weights plus the vision tower's and projector's
    /// (LayerNorm gains near 1, the projector's `(1 + w)` norm gain near 0,
    /// biases small, the rest as projections).
    pub fn with_synthetic_vision(mut self, vision: &super::VisionConfig, seed: u64) -> Weights {
        for (name, shape) in vision.tensor_shapes() {
            let kind = if name.ends_with(".bias") {
                SynthKind::Bias
            } else if name.ends_with("mm_soft_emb_norm.weight") {
                SynthKind::Norm { center: 0.0 }
            } else if name.contains("layer_norm") || name.contains("post_layernorm") {
                SynthKind::Norm { center: 1.0 }
            } else {
                SynthKind::Matrix
            };
            let key = splitmix(seed ^ fnv1a(name.as_bytes()));
            self.tensors.insert(name, Slot::Synthetic { kind, key, shape });
        }
        self
    }

    /// Where the weights came from (files or "synthetic (seed N)").
    pub fn origin(&self) -> &str {
        &self.origin
    }

    pub fn is_synthetic(&self) -> bool {
        self.files.is_empty() && self.gguf.is_empty()
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn slot(&self, name: &str) -> Result<&Slot> {
        self.tensors.get(name).ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), count: self.tensors.len() })
    }

    /// Dtype (as stored; F32 for synthetic) and shape of `name`.
    pub fn meta(&self, name: &str) -> Result<TensorMeta> {
        match self.slot(name)? {
            Slot::File { entry, .. } => match &entry.dtype {
                Ok(d) => Ok(TensorMeta { dtype: *d, shape: entry.shape.clone() }),
                Err(d) => Err(ModelError::Dtype { name: name.to_string(), dtype: d.clone() }),
            },
            Slot::Synthetic { shape, .. } => Ok(TensorMeta { dtype: Dtype::F32, shape: shape.clone() }),
            Slot::Gguf { shape, .. } => {
                let dtype = match self.stored(name)? {
                    Stored::F32 | Stored::Quant(_) => Dtype::F32,
                    Stored::F16 => Dtype::F16,
                    Stored::BF16 => Dtype::BF16,
                };
                Ok(TensorMeta { dtype, shape: shape.clone() })
            }
        }
    }

    /// How `name` is stored: a float type, or a block-quantized format (GGUF).
    /// Synthetic tensors are F32. A type ktune cannot read is an error naming it.
    pub fn stored(&self, name: &str) -> Result<Stored> {
        match self.slot(name)? {
            Slot::File { entry, .. } => match &entry.dtype {
                Ok(Dtype::F32) => Ok(Stored::F32),
                Ok(Dtype::F16) => Ok(Stored::F16),
                Ok(Dtype::BF16) => Ok(Stored::BF16),
                Err(d) => Err(ModelError::Dtype { name: name.to_string(), dtype: d.clone() }),
            },
            Slot::Synthetic { .. } => Ok(Stored::F32),
            Slot::Gguf { file, tensor, .. } => {
                let f = self.gguf_file(*file)?;
                f.stored(&f.tensors[*tensor])
            }
        }
    }

    fn gguf_file(&self, file: usize) -> Result<&GgufFile> {
        self.gguf.get(file).map(|f| f.as_ref()).ok_or_else(|| ModelError::Invalid("a GGUF tensor without its file".into()))
    }

    /// The storage most projection matrices (`*_proj.weight`) have: what a GGUF
    /// file was quantized to (its embedding and norms are often kept wider).
    pub fn matmul_storage(&self) -> Option<Stored> {
        let mut counts: Vec<(Stored, usize)> = Vec::new();
        for name in self.names().filter(|n| n.ends_with("_proj.weight")) {
            if let Ok(s) = self.stored(name) {
                match counts.iter_mut().find(|(k, _)| *k == s) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((s, 1)),
                }
            }
        }
        counts.into_iter().max_by_key(|(_, c)| *c).map(|(s, _)| s)
    }

    /// Checks that `name` has shape `shape`.
    pub fn check_shape(&self, name: &str, shape: &[usize]) -> Result<TensorMeta> {
        let meta = self.meta(name)?;
        if meta.shape != shape {
            return Err(ModelError::Shape { name: name.to_string(), expected: shape.to_vec(), found: meta.shape });
        }
        Ok(meta)
    }

    /// Fits the tensors to `config`: stacked experts and a family's fused
    /// projections split ([`Weights::split_stacked`]), then every tensor checked
    /// ([`Weights::check_config`]).
    pub fn fit_config(&mut self, config: &ModelConfig) -> Result<()> {
        self.split_stacked(config)?;
        self.check_config(config)
    }

    /// Serves a family's fused projections ([`Family::fused_projections`](super::family::Family::fused_projections):
    /// Phi-3's `qkv_proj` and `gate_up_proj`) under the separate names, each a row
    /// view of the one tensor (Q, K, V rows; gate rows, then up rows). A layer
    /// without them is left to [`Weights::check_config`] to name what is missing.
    fn split_fused(&mut self, config: &ModelConfig) -> Result<()> {
        if !config.architecture.family().fused_projections {
            return Ok(());
        }
        let (q, kv, inter) = (config.q_dim(), config.kv_dim(), config.dims.intermediate_size);
        for l in 0..config.dims.num_layers {
            let name = |n: &str| format!("model.layers.{l}.{n}");
            let qkv = [("self_attn.q_proj.weight", q), ("self_attn.k_proj.weight", kv), ("self_attn.v_proj.weight", kv)];
            let gate_up = [("mlp.gate_proj.weight", inter), ("mlp.up_proj.weight", inter)];
            for (fused, parts) in [("self_attn.qkv_proj.weight", &qkv[..]), ("mlp.gate_up_proj.weight", &gate_up[..])] {
                let Some(slot) = self.tensors.remove(&name(fused)) else { continue };
                let total: usize = parts.iter().map(|(_, rows)| rows).sum();
                let mut first = 0;
                for (part, rows) in parts {
                    let view = slot.rows(first, *rows, total).ok_or_else(|| ModelError::Shape {
                        name: name(fused),
                        expected: vec![total, config.dims.hidden_size],
                        found: slot.shape().to_vec(),
                    })?;
                    self.tensors.insert(name(part), view);
                    first += rows;
                }
            }
        }
        Ok(())
    }

    /// Serves what a file stores stacked under the names the rest of ktune reads:
    /// a mixture of experts' per-expert projections ([`Weights::split_experts`])
    /// and a family's fused projections ([`Weights::split_fused`]).
    fn split_stacked(&mut self, config: &ModelConfig) -> Result<()> {
        self.split_experts(config)?;
        self.split_fused(config)
    }

    /// Serves a mixture of experts' stacked projections (a GGUF file's
    /// `ffn_{gate,up,down}_exps`, `[experts, rows, cols]`) under each expert's
    /// Hugging Face name, expert `e`'s rows a view of the one tensor.
    fn split_experts(&mut self, config: &ModelConfig) -> Result<()> {
        for l in 0..config.dims.num_layers {
            let Some(m) = config.moe_layer(l) else { continue };
            let h = config.dims.hidden_size;
            for (proj, rows) in [("gate_proj", m.expert_ff), ("up_proj", m.expert_ff), ("down_proj", h)] {
                let stacked = format!("model.layers.{l}.mlp.experts.{proj}.weight");
                let Some(slot) = self.tensors.remove(&stacked) else { continue };
                for e in 0..m.experts {
                    let view = slot.rows(e * rows, rows, m.experts * rows).ok_or_else(|| ModelError::Shape {
                        name: stacked.clone(),
                        expected: vec![m.experts, rows, if proj == "down_proj" { m.expert_ff } else { h }],
                        found: slot.shape().to_vec(),
                    })?;
                    self.tensors.insert(format!("model.layers.{l}.mlp.experts.{e}.{proj}.weight"), view);
                }
            }
        }
        Ok(())
    }

    /// Checks every tensor `config` needs (name and shape), reporting all problems
    /// at once. Extra tensors are allowed (a tied checkpoint may still carry `lm_head.weight`).
    pub fn check_config(&self, config: &ModelConfig) -> Result<()> {
        self.check_tensors("config", config.dims.num_layers, config.tensor_shapes())
    }

    /// Checks every tensor of a vision tower and projector (name and shape),
    /// reporting all problems at once (a projector whose output width is not the
    /// text model's among them), as [`Weights::check_config`] checks a text model's.
    pub fn check_vision(&self, vision: &super::VisionConfig) -> Result<()> {
        self.check_tensors("vision config", vision.num_layers, vision.tensor_shapes())
    }

    /// The one shape check of both: each of `shapes` present with its shape; a
    /// `what` of more `layers` than the weights have tensors is refused before
    /// millions of missing tensors are listed.
    fn check_tensors(&self, what: &str, layers: usize, shapes: Vec<(String, Vec<usize>)>) -> Result<()> {
        if layers > self.tensors.len() {
            return Err(ModelError::Mismatch {
                problems: vec![format!("the {what} has {layers} layers, the weights only {} tensors", self.tensors.len())],
            });
        }
        let mut problems = Vec::new();
        for (name, shape) in shapes {
            match self.check_shape(&name, &shape) {
                Ok(_) => {}
                Err(ModelError::MissingTensor { .. }) => problems.push(format!("missing `{name}` {shape:?}")),
                Err(e) => problems.push(e.to_string()),
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(ModelError::Mismatch { problems }) }
    }

    /// Names present that `config` does not use.
    pub fn unused(&self, config: &ModelConfig) -> Vec<&str> {
        let used: BTreeSet<String> = config.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        self.names().filter(|n| !used.contains(*n)).collect()
    }

    /// `name` as f32 values (row-major), after checking its shape is `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.values(name, shape)
    }

    /// `name` as f16 values (row-major, rounded to nearest), after checking its shape.
    pub fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<f16>> {
        self.values(name, shape)
    }

    fn values<T: Elem>(&self, name: &str, shape: &[usize]) -> Result<Vec<T>> {
        let meta = self.check_shape(name, shape)?;
        let mut out = vec![T::from_f32(0.0); meta.numel()];
        self.read_range(name, 0, &mut out)?;
        Ok(out)
    }

    /// The whole of `name` into `out` (whose length must be the element count) as
    /// f32 or f16.
    pub fn read_into<T: Elem>(&self, name: &str, out: &mut [T]) -> Result<()> {
        self.check_len(name, out.len())?;
        self.read_range(name, 0, out)
    }

    fn check_len(&self, name: &str, got: usize) -> Result<()> {
        let want = self.meta(name)?.numel();
        if want != got {
            return Err(ModelError::Buffer { name: name.to_string(), want, got });
        }
        Ok(())
    }

    /// Row `row` of 2-D tensor `name` as f32 (the embedding lookup).
    pub fn row_f32(&self, name: &str, row: usize) -> Result<Vec<f32>> {
        let meta = self.meta(name)?;
        let [rows, cols] = meta.shape[..] else {
            return Err(ModelError::Shape { name: name.to_string(), expected: vec![0, 0], found: meta.shape });
        };
        if row >= rows {
            return Err(ModelError::Row { name: name.to_string(), row, rows });
        }
        let mut out = vec![0f32; cols];
        self.read_range(name, row * cols, &mut out)?;
        Ok(out)
    }

    /// [`Weights::row_f32`] into `out` (`out.len()` must be the row length), with
    /// no allocation: the embedding lookup of a decode step.
    pub fn row_f32_into(&self, name: &str, row: usize, out: &mut [f32]) -> Result<()> {
        let shape = self.slot(name)?.shape();
        let &[rows, cols] = shape else {
            return Err(ModelError::Shape { name: name.to_string(), expected: vec![0, 0], found: shape.to_vec() });
        };
        if row >= rows {
            return Err(ModelError::Row { name: name.to_string(), row, rows });
        }
        if out.len() != cols {
            return Err(ModelError::Shape { name: name.to_string(), expected: vec![rows, out.len()], found: shape.to_vec() });
        }
        self.read_range(name, row * cols, out)
    }

    /// Elements `start..start + out.len()` of `name` (flattened) as f32 or f16.
    pub fn read_range<T: Elem>(&self, name: &str, start: usize, out: &mut [T]) -> Result<()> {
        match self.slot(name)? {
            Slot::File { file, entry } => {
                let (dtype, bytes) = self.file_bytes(name, *file, entry, start, out.len())?;
                decode_le(dtype, bytes, out);
            }
            Slot::Synthetic { kind, key, shape } => {
                check_range(name, shape, start, out.len())?;
                synth(*kind, *key, start, out);
            }
            Slot::Gguf { file, tensor, tf, shape } => {
                check_range(name, shape, start, out.len())?;
                // Decoded row by row to f32 (the block formats' native output).
                if let Some(out) = T::as_f32(out) {
                    return self.gguf_range(*file, *tensor, *tf, start, out);
                }
                let mut tmp = vec![0f32; out.len()];
                self.gguf_range(*file, *tensor, *tf, start, &mut tmp)?;
                out.par_chunks_mut(PAR_CHUNK).zip(tmp.par_chunks(PAR_CHUNK)).for_each(|(o, v)| T::from_f32_slice(v, o));
            }
        }
        Ok(())
    }

    /// Elements `start..start + out.len()` (checked) of GGUF tensor `tensor` in
    /// Hugging Face order, decoded to f32 row by row (in parallel for whole rows).
    fn gguf_range(&self, file: usize, tensor: usize, tf: Transform, start: usize, out: &mut [f32]) -> Result<()> {
        let f = self.gguf_file(file)?;
        let t = &f.tensors[tensor];
        let kind = f.stored(t)?;
        let (cols, rows, rb) = (t.cols(), t.rows(), t.row_bytes());
        let data = f.data(t);
        let row_src = |r: usize| {
            let s = tf.source_row(r, rows) * rb;
            &data[s..s + rb]
        };
        if start.is_multiple_of(cols) && out.len() == cols {
            // One row (an embedding lookup): on this thread.
            decode(kind, row_src(start / cols), out);
        } else if start.is_multiple_of(cols) && out.len().is_multiple_of(cols) {
            let first = start / cols;
            out.par_chunks_mut(cols).enumerate().for_each(|(i, o)| decode(kind, row_src(first + i), o));
        } else {
            let mut row = vec![0f32; cols];
            let mut done = 0;
            while done < out.len() {
                let at = start + done;
                let (r, c) = (at / cols, at % cols);
                decode(kind, row_src(r), &mut row);
                let n = (cols - c).min(out.len() - done);
                out[done..done + n].copy_from_slice(&row[c..c + n]);
                done += n;
            }
        }
        if tf == Transform::MinusOne {
            out.iter_mut().for_each(|v| *v -= 1.0);
        }
        Ok(())
    }

    fn file_bytes(&self, name: &str, file: usize, entry: &Entry, start: usize, len: usize) -> Result<(Dtype, &[u8])> {
        let dtype = entry.dtype.clone().map_err(|d| ModelError::Dtype { name: name.to_string(), dtype: d })?;
        check_range(name, &entry.shape, start, len)?;
        let bytes = self.files[file].bytes(entry);
        let sz = dtype.size();
        bytes.get(start * sz..(start + len) * sz).map(|b| (dtype, b)).ok_or_else(|| ModelError::File {
            path: self.files[file].path.clone(),
            msg: format!("tensor `{name}`: its bytes do not match its shape"),
        })
    }

    /// The 2-D tensor `name` (`[rows, cols]`, a Linear weight) in block format
    /// `format`: a GGUF file's blocks as stored when they are in `format`, else the
    /// float values quantized on load (ggml's reference rounding, rows in
    /// parallel). `cols` must be a multiple of 32.
    pub fn load_quant(&self, name: &str, format: QFormat) -> Result<QMatrix> {
        let rows = self.dims2(name)?.0;
        self.load_quant_rows(name, format, 0, rows)
    }

    /// Rows `r0..r0 + count` of the 2-D tensor `name` block-quantized to `format`
    /// (one block of an LM head split to fit a GPU binding).
    pub fn load_quant_rows(&self, name: &str, format: QFormat, r0: usize, count: usize) -> Result<QMatrix> {
        let (rows, cols) = self.dims2(name)?;
        if r0.checked_add(count).is_none_or(|e| e > rows) {
            return Err(ModelError::Row { name: name.to_string(), row: r0.saturating_add(count), rows });
        }
        let quant = |e| ModelError::Quant { name: name.to_string(), source: e };
        if cols == 0 || !cols.is_multiple_of(format.block_elems()) {
            return Err(quant(QuantError::Cols { format, cols }));
        }
        // A GGUF file's blocks as stored when they are already in `format` (rows
        // reordered if the converter permuted them): no requantization.
        if let Slot::Gguf { file, tensor, tf, .. } = self.slot(name)?
            && *tf != Transform::MinusOne
            && self.stored(name)? == Stored::Quant(format)
        {
            let f = self.gguf_file(*file)?;
            let t = &f.tensors[*tensor];
            let (data, rb) = (f.data(t), t.row_bytes());
            let mut bytes = Vec::with_capacity(count * rb);
            for r in r0..r0 + count {
                let src = tf.source_row(r, rows);
                let row = data
                    .get(src * rb..(src + 1) * rb)
                    .ok_or_else(|| ModelError::Invalid(format!("tensor `{name}`: row {src} is outside its data")))?;
                bytes.extend_from_slice(row);
            }
            return QMatrix::from_ggml(format, count, cols, &bytes).map_err(quant);
        }
        // About 1 MiB of f32 per task.
        let per = ((1 << 18) / cols).max(1);
        let parts = (0..count.div_ceil(per))
            .into_par_iter()
            .map(|c| {
                let (a, n) = (r0 + c * per, per.min(count - c * per));
                let mut v = vec![0f32; n * cols];
                self.read_range(name, a * cols, &mut v)?;
                QMatrix::quantize(format, n, cols, &v).map_err(quant)
            })
            .collect::<Result<Vec<_>>>()?;
        if parts.is_empty() {
            return Ok(QMatrix { format, rows: 0, cols, quants: Vec::new(), scales: Vec::new(), layout: Default::default() });
        }
        QMatrix::concat_rows(&parts).map_err(quant)
    }

    fn dims2(&self, name: &str) -> Result<(usize, usize)> {
        let meta = self.meta(name)?;
        match meta.shape[..] {
            [rows, cols] => Ok((rows, cols)),
            _ => Err(ModelError::Shape { name: name.to_string(), expected: vec![0, 0], found: meta.shape }),
        }
    }

    /// Bytes the tensors take as stored (for synthetic weights: as f32).
    pub fn stored_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|s| match s {
                Slot::File { entry, .. } => (entry.end - entry.start) as u64,
                Slot::Synthetic { shape, .. } => 4 * shape.iter().product::<usize>() as u64,
                Slot::Gguf { file, tensor, .. } => self.gguf.get(*file).map_or(0, |f| {
                    let t = &f.tensors[*tensor];
                    (t.end - t.start) as u64
                }),
            })
            .sum()
    }
}

fn check_range(name: &str, shape: &[usize], start: usize, len: usize) -> Result<()> {
    let numel: usize = shape.iter().product();
    if start.checked_add(len).is_none_or(|end| end > numel) {
        return Err(ModelError::Buffer { name: format!("{name}[{start}..]"), want: numel.saturating_sub(start), got: len });
    }
    Ok(())
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01B3))
}

/// Fills `out` with elements `start..` of a synthetic tensor, in parallel for large ranges.
fn synth<T: Elem>(kind: SynthKind, key: u64, start: usize, out: &mut [T]) {
    // Uniform on [-a, a] has standard deviation a / sqrt(3).
    let (center, half) = match kind {
        SynthKind::Matrix => (0.0, 0.02 * 3f32.sqrt()),
        SynthKind::Norm { center } => (center, 0.05),
        SynthKind::Bias => (0.0, 0.02),
    };
    let fill = |offset: usize, o: &mut [T]| T::uniform(key, (start + offset) as u64, center, half, o);
    if out.len() <= PAR_CHUNK {
        fill(0, out);
    } else {
        out.par_chunks_mut(PAR_CHUNK).enumerate().for_each(|(c, o)| fill(c * PAR_CHUNK, o));
    }
}
