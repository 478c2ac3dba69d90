//! What `run`, `bench` and `tune` share before any measuring: the device picked by
//! `--device` (and its GPU context when it has one), the settings their shared
//! flags give ([`ModelSettings`]: the model a [`ModelSource`] names (built-in
//! with synthetic weights, a Hugging Face directory, or a GGUF file, with
//! `--mmproj` its vision projector file), the weight storage type it implies, the
//! runtime's default execution settings, a profile's resolved for the model,
//! and the plan options of an execution), and warmed-up engines built from a
//! plan and executing as an execution's settings say ([`Engines`]: GPU batching
//! and shader modules, the CPU pool; [`decode_chain`], the GPU's decode chain).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::device::DeviceError;
use crate::device::{self, Device};
use crate::gpu::GpuCtx;
use crate::gpu::GpuError;
use crate::kernels::DType;
use crate::model::ModelError;
use crate::model::WeightFile;
use crate::model::gguf::GgufFile;
use crate::model::{self, ModelConfig, Stored, Weights};
use crate::plan::{Fusion, Parallel, Plan, PlanOptions, Selection};
use crate::profile::{ExecSettings, Profile, ProfileError};
use crate::runtime::{Engine, RuntimeError, TensorStore, WeightMemo};

/// What can go wrong loading a model source: the files, or options that do not fit
/// it (gathered into the top-level error like every module's; the device selector
/// and the adapter report their own errors).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0}")]
    Usage(String),
}

pub type Result<T, E = SessionError> = std::result::Result<T, E>;

/// Discovers devices and resolves the `--device` selector (validated before any
/// heavy object is built).
pub fn pick_device(selector: Option<&str>) -> Result<Device, DeviceError> {
    let mut devices = device::discover();
    let i = device::select(&devices, selector)?;
    Ok(devices.swap_remove(i))
}

/// Opens `device` for kernels: a wgpu context for a GPU (its shader modules
/// trusted, without runtime bounds checks, with `trusted_shaders`), nothing for
/// the CPU.
pub fn open_device(device: &Device, trusted_shaders: bool) -> Result<Option<Arc<GpuCtx>>, GpuError> {
    Ok(match device {
        Device::Cpu(_) => None,
        Device::Gpu(g) => Some(GpuCtx::open(g)?.with_trusted_shaders(trusted_shaders)),
    })
}

/// A loaded model: its config, name and weights.
pub struct LoadedModel {
    pub name: String,
    pub config: ModelConfig,
    pub weights: Arc<Weights>,
    /// The GGUF file the model came from (its tokenizer metadata).
    pub gguf: Option<Arc<GgufFile>>,
    /// Things worth telling the user (metadata keys ktune did not read).
    pub warnings: Vec<String>,
    /// The vision tower and projector of a multimodal checkpoint (their weights
    /// are in `weights`, checked against it).
    pub vision: Option<model::VisionConfig>,
}

/// Where a model comes from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// A built-in model with deterministic synthetic weights (`--model`).
    Builtin(String),
    /// A Hugging Face model directory (`--model-dir`).
    Dir(PathBuf),
    /// A GGUF file (`--gguf`).
    Gguf(PathBuf),
}

/// What `run`, `bench` and `tune` are given in common (their shared flags,
/// `cli::ModelArgs`, convert into it): the model and how it is loaded and run.
#[derive(Clone, Debug)]
pub struct ModelSettings {
    pub source: ModelSource,
    /// `--mmproj`: the vision projector file of a GGUF text model.
    pub mmproj: Option<PathBuf>,
    /// `--layers`: keep only the first N.
    pub layers: Option<usize>,
    /// `--weight-dtype` (None: as a GGUF file stores each matrix, else f32).
    pub weight_dtype: Option<DType>,
    /// Seed of the synthetic weights.
    pub seed: u64,
    /// `--trusted-shaders`: shader modules without runtime bounds checks.
    pub trusted_shaders: bool,
}

impl ModelSettings {
    /// The files the model is read from, by the flag that names them (a
    /// directory's files one by one): what an output may not replace
    /// ([`crate::atomic`]).
    pub fn input_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        match &self.source {
            ModelSource::Gguf(p) => files.push(("--gguf", p.clone())),
            ModelSource::Dir(d) => {
                let entries = std::fs::read_dir(d).into_iter().flatten().flatten();
                files.extend(entries.map(|e| e.path()).filter(|p| p.is_file()).map(|p| ("--model-dir", p)));
            }
            ModelSource::Builtin(_) => {}
        }
        files.extend(self.mmproj.iter().map(|p| ("--mmproj", p.clone())));
        files
    }

    /// Loads the model with its `--mmproj` vision projector file (which pairs with
    /// `--gguf` only): what `tune` and `bench` load. A missing file or `--mmproj`
    /// without `--gguf` is a usage error naming the fix.
    pub fn load(&self) -> Result<LoadedModel> {
        match (&self.mmproj, &self.source) {
            (Some(mm), ModelSource::Gguf(text)) => {
                input_file("--mmproj", mm)?;
                input_file("--gguf", text)?;
                load_gguf_mmproj(text, mm, self.layers)
            }
            (Some(mm), _) => Err(mmproj_without_gguf(mm)),
            (None, _) => self.load_text(),
        }
    }

    /// Loads the model the source names, without a projector, cut to `--layers`.
    pub fn load_text(&self) -> Result<LoadedModel> {
        match &self.source {
            ModelSource::Gguf(path) => load_gguf(path, self.layers),
            ModelSource::Builtin(name) => load_model(Some(name), None, self.layers, self.seed),
            ModelSource::Dir(dir) => load_model(None, Some(dir), self.layers, self.seed),
        }
    }

    /// The model's name in profiles: its name, with `@Nlayers` when `--layers` cut
    /// it (always for a directory or file, whose configs vary; for a built-in
    /// model only when fewer than its own layers).
    pub fn profile_name(&self, m: &LoadedModel) -> String {
        match self.layers {
            Some(l) if l < m.config.dims.num_layers || !matches!(self.source, ModelSource::Builtin(_)) => format!("{}@{l}layers", m.name),
            _ => m.name.clone(),
        }
    }

    /// The matrix weight type: `--weight-dtype` when given, else what a GGUF
    /// file's projection matrices are stored as, else f32.
    pub fn weight_dtype(&self, m: &LoadedModel) -> DType {
        self.weight_dtype.unwrap_or_else(|| gguf_storage(m).map_or(DType::F32, weight_dtype_for))
    }

    /// The matrices of `m` that run in another type than `weight_dtype` ([`matrix_formats`]).
    pub fn matrix_formats(&self, m: &LoadedModel, weight_dtype: DType) -> BTreeMap<String, DType> {
        matrix_formats(m, weight_dtype, self.weight_dtype)
    }

    /// The model's identity for profile lookup, running in `weight_dtype`
    /// ([`crate::profile::lookup::model_hash`]).
    pub fn model_hash(&self, m: &LoadedModel, weight_dtype: DType) -> String {
        crate::profile::lookup::model_hash(&m.config, &self.matrix_formats(m, weight_dtype))
    }

    /// The execution settings without a profile, the runtime's defaults: the
    /// given weight and KV types, fusions and GPU batching, the pool's defaults,
    /// the default repacking ([`ModelSettings::default_repack`], with
    /// `batches`), `--trusted-shaders`.
    #[allow(clippy::too_many_arguments)]
    pub fn execution(
        &self,
        device: &Device,
        m: &LoadedModel,
        weight_dtype: DType,
        kv_dtype: DType,
        batch: bool,
        fusion: Fusion,
        batches: bool,
    ) -> ExecSettings {
        let repack = self.default_repack(device, m, weight_dtype, batches);
        ExecSettings {
            batch,
            fusion,
            parallel: Parallel::default(),
            kv_dtype,
            weight_dtype,
            threads: 0,
            spin_us: 0,
            prefetch: None,
            repack,
            batch_repack: None,
            trusted_shaders: self.trusted_shaders,
            decode_chain: None,
        }
    }

    /// The block formats an engine of `m` in `weight_dtype` repacks on `device`
    /// when no profile says ([`crate::plan::default_cpu_repack`]; with
    /// `batches`, an engine's that decodes several sequences a pass; none on a
    /// GPU).
    pub fn default_repack(
        &self,
        device: &Device,
        m: &LoadedModel,
        weight_dtype: DType,
        batches: bool,
    ) -> Vec<crate::kernels::quant::QFormat> {
        match device {
            Device::Cpu(_) => crate::plan::default_cpu_repack(
                &m.config,
                std::iter::once(weight_dtype).chain(self.matrix_formats(m, weight_dtype).into_values()),
                batches,
            ),
            Device::Gpu(_) => Vec::new(),
        }
    }

    /// The plan options of `exec` for `m`: passes of up to `max_tokens` tokens, a
    /// KV cache of `context`, every position's logits with `all_logits`.
    pub fn plan_options(&self, m: &LoadedModel, exec: &ExecSettings, max_tokens: usize, context: usize, all_logits: bool) -> PlanOptions {
        PlanOptions::new(exec.weight_dtype, max_tokens, context)
            .with_matrix_formats(self.matrix_formats(m, exec.weight_dtype))
            .with_kv_dtype(exec.kv_dtype)
            .with_all_logits(all_logits)
            .with_fusion(exec.fusion)
            .with_parallel(exec.parallel)
            .with_cpu_repack(exec.repack.clone())
    }

    /// `p`'s selection and execution settings for `m` on `device` (the profile
    /// named as [`ModelSettings::profile_name`] names the model), with its
    /// warnings; `--trusted-shaders` adds trusted shader modules to a profile
    /// tuned without them.
    pub fn resolve(&self, p: &Profile, device: &Device, m: &LoadedModel) -> Result<(Selection, ExecSettings, Vec<String>), ProfileError> {
        let (selection, mut exec, warnings) = p.resolve(device, &self.profile_name(m), m.config.dims.num_layers)?;
        exec.trusted_shaders |= self.trusted_shaders;
        Ok((selection, exec, warnings))
    }
}

/// The file `flag` names must be a regular file: a usage error naming the flag
/// and saying what `path` is instead (missing, a directory, a device).
pub fn input_file(flag: &str, path: &Path) -> Result<()> {
    crate::input::regular_file(path).map(|_| ()).map_err(|e| SessionError::Usage(format!("{flag} {}: {e}", path.display())))
}

/// Memory available to new allocations, bytes (8 GiB when unknown).
pub fn available_memory() -> u64 {
    let Ok(mut sys) = sysinfo::System::new() else { return 8 << 30 };
    sys.refresh_memory_specifics(sysinfo::MemoryRefreshKind::nothing().with_ram());
    match sys.available_memory() {
        0 => 8 << 30,
        b => b,
    }
}

/// Checks a context of `context` positions (what `flag` asked for) against what
/// the model and the device allow: at most the model's
/// `max_position_embeddings`, and a KV cache in `kv` that fits (one layer's
/// cache in one GPU buffer; the whole cache in the CPU's available memory). The
/// usage error names the limit and the largest context that fits.
pub fn check_context(c: &ModelConfig, context: usize, kv: DType, device: &Device, flag: &str) -> Result<()> {
    let usage = |why: String| Err(SessionError::Usage(format!("{flag}: a context of {context} positions {why}")));
    if context == 0 {
        return usage("holds no token; give at least 1".into());
    }
    if context > c.max_position_embeddings {
        return usage(format!("is past the model's {} (max_position_embeddings); give at most that", c.max_position_embeddings));
    }
    check_kv_dtype(c, kv, "--kv-dtype")?;
    let (what, limit, per) = match device::DeviceCaps::from(device) {
        device::DeviceCaps::Gpu(g) => ("one GPU buffer holds", g.max_storage_binding.min(g.max_buffer_size), 1),
        device::DeviceCaps::Cpu(_) => ("memory available is", available_memory(), 2 * c.dims.num_layers as u64),
    };
    // One layer's keys (or values), then as many of them as share the limit.
    let one = crate::plan::kv_cache_bytes(c, context, kv);
    let need = one.and_then(|b| b.checked_mul(per));
    if need.is_none_or(|n| n > limit) {
        let per_position = crate::plan::kv_cache_bytes(c, 1, kv).unwrap_or(u64::MAX).saturating_mul(per).max(1);
        return usage(format!(
            "needs a KV cache of {} MiB in {kv}, and the {what} {} MiB: give at most {} positions",
            need.map_or("more than 2^64 / 2^20".to_string(), |n| (n >> 20).to_string()),
            limit >> 20,
            limit / per_position
        ));
    }
    Ok(())
}

/// A KV cache type this model can hold: q8_0 keeps each cached row
/// (`head_dim` values) in blocks of 32, which the CPU's attention kernels and
/// the WGSL ones that list it read (a GPU's plan takes those). `what` names
/// where it was asked for (the flag, or a profile's `execution.kvCacheDtype`).
pub fn check_kv_dtype(c: &ModelConfig, kv: DType, what: &str) -> Result<()> {
    if kv != DType::Q8_0 {
        return Ok(());
    }
    let (d, block) = (c.dims.head_dim, crate::kernels::cpu::Q8_BLOCK);
    if !d.is_multiple_of(block) {
        return Err(SessionError::Usage(format!(
            "{what} q8_0: a q8_0 KV cache keeps each row in blocks of {block} values, and this model's head_dim is {d}: give \
             --kv-dtype f16"
        )));
    }
    Ok(())
}

/// `--mmproj` given without `--gguf`: a usage error naming the fix.
pub fn mmproj_without_gguf(mm: &Path) -> SessionError {
    SessionError::Usage(format!(
        "--mmproj {}: a vision projector pairs with a GGUF text model: give --gguf TEXT.gguf (a --model-dir \
         checkpoint holds its own vision tower)",
        mm.display()
    ))
}

/// Loads a GGUF file: config from its metadata, weights, checked against each other.
pub fn load_gguf(path: &Path, layers: Option<usize>) -> Result<LoadedModel> {
    let g = Weights::load_gguf(path)?;
    g.weights.check_config(&g.config)?;
    let mut config = g.config;
    if let Some(l) = layers {
        cut_layers(&mut config, l)?;
    }
    let mut warnings = Vec::new();
    if !g.ignored_keys.is_empty() {
        warnings.push(format!("{}: metadata not used: {}", path.display(), g.ignored_keys.join(", ")));
    }
    Ok(LoadedModel { name: path.display().to_string(), config, weights: Arc::new(g.weights), gguf: Some(g.file), warnings, vision: None })
}

/// Loads a text GGUF file with the vision projector file llama.cpp pairs it with
/// (`--mmproj`): the tower's config from the projector's `clip.*` metadata, the
/// image tokens from the text model's vocabulary, the tower's tensors under the
/// canonical vision names ([`model::mmproj`]), checked against the config.
pub fn load_gguf_mmproj(path: &Path, mmproj: &Path, layers: Option<usize>) -> Result<LoadedModel> {
    let mut m = load_gguf(path, layers)?;
    let file = Arc::new(GgufFile::open(mmproj)?);
    let vocab = m.gguf.as_ref().and_then(|g| g.get("tokenizer.ggml.tokens")).and_then(|v| v.as_array());
    let vision = model::mmproj::mmproj_config(&file, &m.config, path, vocab)?;
    let Some(weights) = Arc::get_mut(&mut m.weights) else {
        return Err(SessionError::Usage("the text model's weights are shared before the projector is added".into()));
    };
    let skipped = weights.add_gguf(file, model::mmproj::mmproj_name)?;
    weights.check_vision(&vision)?;
    if !skipped.is_empty() {
        m.warnings.push(format!("{}: tensors not used: {}", mmproj.display(), skipped.join(", ")));
    }
    m.vision = Some(vision);
    Ok(m)
}

/// Loads `--model NAME` (synthetic weights) or `--model-dir DIR`, optionally cut to `layers`.
pub fn load_model(name: Option<&str>, dir: Option<&PathBuf>, layers: Option<usize>, seed: u64) -> Result<LoadedModel> {
    let vision;
    let (name, mut config, weights) = match (name, dir) {
        (Some(n), _) => {
            let mut c = model::builtin(n)?;
            if let Some(l) = layers {
                cut_layers(&mut c, l)?;
            }
            let mut w = Weights::synthetic(&c, seed);
            // A built-in multimodal model has its tower too (synthetic weights).
            vision = model::builtin_vision(n);
            if let Some(v) = &vision {
                w = w.with_synthetic_vision(v, seed);
            }
            (n.to_string(), c, w)
        }
        (None, Some(d)) => {
            let path = d.join("config.json");
            let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
            let parsed = ModelConfig::parse_config_json(&text, &path)?;
            let c = parsed.config;
            let mut w = Weights::load(d)?;
            w.fit_config(&c)?;
            if let Some(v) = &parsed.vision {
                w.check_vision(v)?;
            }
            vision = parsed.vision;
            (d.display().to_string(), c, w)
        }
        (None, None) => return Err(SessionError::Usage("give --model NAME or --model-dir DIR".into())),
    };
    if let (Some(l), Some(_)) = (layers, dir) {
        cut_layers(&mut config, l)?;
    }
    Ok(LoadedModel { name, config, weights: Arc::new(weights), gguf: None, warnings: Vec::new(), vision })
}

/// Keeps the first `l` layers of `c` (`--layers`).
fn cut_layers(c: &mut ModelConfig, l: usize) -> Result<()> {
    if l == 0 || l > c.dims.num_layers {
        return Err(SessionError::Usage(format!("--layers {l}: the model has {} layers", c.dims.num_layers)));
    }
    *c = c.first_layers(l);
    Ok(())
}

/// What a GGUF model's projection matrices are stored as (None for other sources).
pub fn gguf_storage(m: &LoadedModel) -> Option<Stored> {
    m.gguf.as_ref().and_then(|_| m.weights.matmul_storage())
}

/// The matrices that run in another type than `weight_dtype`, each with its own
/// ([`PlanOptions::matrix_formats`]): a GGUF file's matrices stored in other
/// formats (kept as stored unless `flag`, `--weight-dtype`, asks for one type);
/// and, when quantizing on load to a super-block format, the matrices whose rows
/// are not whole super-blocks, in the format llama.cpp's quantizer falls back to
/// ([`QFormat::for_row`](crate::kernels::quant::QFormat::for_row)).
///
/// [`PlanOptions::matrix_formats`]: crate::plan::PlanOptions::matrix_formats
pub fn matrix_formats(m: &LoadedModel, weight_dtype: DType, flag: Option<DType>) -> BTreeMap<String, DType> {
    let matrices = m.weights.names().filter(|n| n.ends_with(".weight")).filter_map(|n| {
        let meta = m.weights.meta(n).ok()?;
        (meta.shape.len() == 2).then(|| (n.to_string(), meta.shape[1]))
    });
    if flag.is_none() && m.gguf.is_some() {
        return matrices
            .filter_map(|(n, _)| Some((n.clone(), weight_dtype_for(m.weights.stored(&n).ok()?))))
            .filter(|&(_, d)| d != weight_dtype)
            .collect();
    }
    let Some(f) = weight_dtype.quant() else { return BTreeMap::new() };
    matrices.map(|(n, cols)| (n, DType::from(f.for_row(cols)))).filter(|&(_, d)| d != weight_dtype).collect()
}

/// The runtime weight type for weights stored as `s` when none is asked for.
pub fn weight_dtype_for(s: Stored) -> DType {
    match s {
        Stored::F16 | Stored::BF16 => DType::F16,
        Stored::F32 => DType::F32,
        // The blocks run as stored (no requantization).
        Stored::Quant(q) => DType::from(q),
    }
}

/// Builds warmed-up engines of one model on one device: the plan for the given
/// options and kernel selection, its prefill pass emitted once up front (a kernel
/// that cannot run fails before any work), the engine, and the GPU programs of
/// both passes compiled (pipeline compilation is never timed).
pub struct Engines<'a> {
    pub model: &'a str,
    pub config: &'a ModelConfig,
    pub store: Arc<dyn TensorStore>,
    /// The GPU context (None: the CPU backend).
    pub ctx: Option<Arc<GpuCtx>>,
    /// CPU engines take their weights from (and add them to) this memo, so several
    /// engines hold one copy; None loads each engine's own.
    pub memo: Option<WeightMemo>,
    /// Also emit the decode pass up front (at the position after a full prefill).
    pub check_decode: bool,
}

impl<'a> Engines<'a> {
    /// Engines of the loaded model `m` on `ctx` (None: the CPU), CPU engines
    /// sharing their weights through `memo` when one is given.
    pub fn of(m: &'a LoadedModel, ctx: Option<Arc<GpuCtx>>, memo: Option<WeightMemo>) -> Engines<'a> {
        Engines { model: &m.name, config: &m.config, store: m.weights.clone(), ctx, memo, check_decode: false }
    }

    /// A warmed-up engine for `opts` and `selection` that executes as `exec`
    /// says: the GPU's one submit per pass (`batch`) and shader modules
    /// (`trusted_shaders`), the CPU pool's threads, spin and prefetch distance.
    pub fn build(&self, opts: PlanOptions, selection: Selection, exec: &ExecSettings) -> Result<Engine, RuntimeError> {
        let tokens = opts.max_tokens;
        let plan = Plan::new(self.model, self.config, opts, selection)?;
        plan.steps(tokens, 0)?;
        if self.check_decode {
            plan.steps(1, tokens)?;
        }
        let store = self.store.clone();
        let mut engine = match (&self.ctx, &self.memo) {
            (Some(ctx), _) => Engine::gpu(plan, store, ctx.with_trusted_shaders(exec.trusted_shaders), exec.batch)?,
            (None, Some(memo)) => Engine::cpu_shared(plan, store, memo)?,
            (None, None) => Engine::cpu(plan, store)?,
        };
        engine.warm_up(tokens)?;
        engine.warm_up(1)?;
        engine.set_cpu_pool(exec.threads, exec.spin_us, exec.prefetch);
        Ok(engine)
    }
}

/// Decode steps a GPU chains per submit: `flag` (`--decode-chain`), else the
/// execution's (a profile's `execution.decodeChain`), else
/// [`DEFAULT_DECODE_CHAIN`](crate::profile::doc::DEFAULT_DECODE_CHAIN).
pub fn decode_chain(flag: Option<u32>, exec: &ExecSettings) -> usize {
    flag.or(exec.decode_chain).unwrap_or(crate::profile::doc::DEFAULT_DECODE_CHAIN) as usize
}
