//! `ktune tune`: the search, in stages. `space`: the plan builder gives every
//! slot's shapes for each fusion choice, one race per slot with its valid
//! variants. `race`: each slot's variants are gated by correctness, raced at those
//! shapes (interleaved rounds, robust statistics, early drops) and refined by
//! coordinate descent. [`e2e`]: the most promising complete combinations (fusions
//! and execution flags included) are timed end to end through the runtime against
//! its own default, and for a multimodal model one image per request through the
//! vision tower with the raced vision kernels against the default ones. The profile is then assembled from the results
//! ([`crate::profile::build`]). One deadline bounds it all; finished slot races are
//! saved as they come so an interrupted tune resumes.

pub mod cache;
pub mod e2e;
pub mod kbench;
mod limits;
pub mod measure;
pub(crate) mod race;
pub(crate) mod space;
pub mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::device::{Device, DeviceCaps};
use crate::gpu::GpuCtx;
use crate::kernels::{self, DType};
use crate::model::ModelConfig;
use crate::runtime::{RuntimeError, TensorStore};
use cache::Cache;
use measure::Strategy;

pub use crate::progress::{Progress, Silent};
pub use e2e::e2e_sample;
pub use limits::{cpu_read_bandwidth, device_read_bandwidth};

/// Relative difference under which two times count as a tie.
const TIE: f64 = 0.01;

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Cache(#[from] cache::CacheError),
    #[error("{0}")]
    Invalid(String),
}

/// Options that change what a tune finds (all part of the cache key).
#[derive(Clone, Debug, Serialize)]
pub struct TuneOptions {
    pub budget: Duration,
    pub strategy: Strategy,
    pub prefill_tokens: usize,
    pub context: usize,
    /// Decode tokens per prompt the end-to-end score assumes.
    pub decode_tokens: usize,
    pub weight_dtype: DType,
    /// Matrices a GGUF file keeps in other formats than `weight_dtype` (see
    /// [`PlanOptions::matrix_formats`](crate::plan::PlanOptions::matrix_formats)).
    pub matrix_formats: std::collections::BTreeMap<String, DType>,
    pub kv_dtype: DType,
    pub seed: u64,
    /// `--gpu-l2-bytes`: the GPU L2 the slot races' input copies overflow (None:
    /// the estimate for the adapter; see [`measure::Rotation`]).
    pub gpu_l2_bytes: Option<u64>,
    /// `--trusted-shaders`: shader modules without runtime bounds checks (recorded
    /// as the profile's `execution.trustedShaders`).
    pub trusted_shaders: bool,
    /// The model's vision tower, whose ops race as the `vision` regime (None: a
    /// text-only model, or `--no-vision`).
    pub vision: Option<crate::model::VisionConfig>,
}

impl TuneOptions {
    /// The options that change how a slot is measured, for the cache keys.
    pub fn measurement_key(&self) -> String {
        format!("l2={:?}|trusted={}", self.gpu_l2_bytes, self.trusted_shaders)
    }

    /// The storage types of a file's matrices besides the weight type (and the
    /// types the other slots run in): their races choose per format.
    pub fn extra_formats(&self) -> std::collections::BTreeSet<DType> {
        let own = [self.weight_dtype, self.kv_dtype, self.weight_dtype.float_storage(), DType::F32];
        self.matrix_formats.values().copied().filter(|d| !own.contains(d)).collect()
    }
}

/// Revision of the search itself: part of every cache key, so a tuner that searches
/// differently does not return or resume what an older one found.
/// (`rotate-1`: GPU races rotate input copies past the adapter's L2.)
const SEARCH_REVISION: &str = "descent-1-rotate-1";

/// The model's identity for profile lookup: sha256 of its configuration and of
/// the storage format of every matrix that is not in the weight dtype (written to
/// a profile's `tuning.model_hash`; `run` and `bench` use a cached profile only
/// for the same hash).
pub fn model_hash(cfg: &ModelConfig, matrix_formats: &std::collections::BTreeMap<String, DType>) -> String {
    let cfg_json = serde_json::to_string(cfg).unwrap_or_default();
    let formats: String = matrix_formats.iter().map(|(t, d)| format!("|{t}={d}")).collect();
    crate::hash::sha256_parts::<&[&str]>(&[&cfg_json, &formats])
}

/// Cache key of a tune: device, model config, kernel set, version, options.
pub fn cache_key(device: &Device, model: &str, cfg: &ModelConfig, o: &TuneOptions) -> String {
    let cfg_json = serde_json::to_string(cfg).unwrap_or_default();
    // A file's mixed matrix formats change the plan (and every slot's race).
    let mut formats: String = o.matrix_formats.iter().map(|(t, d)| format!("|{t}={d}")).collect();
    // The vision races are part of a tune of a tower (none without one: older keys
    // hold). A GPU's tunes raced the tower only later: its own tag keeps an earlier
    // GPU tune of the same tower (no vision races) from answering.
    if let Some(v) = &o.vision {
        // The end-to-end stage times the image since `-e2e`: a tune of the tower
        // from before (no image in its end-to-end record) does not answer.
        let tag = if matches!(device, Device::Cpu(_)) { "vision-e2e" } else { "vision-wgsl-e2e" };
        formats.push_str(&format!("|{tag}={}", serde_json::to_string(v).unwrap_or_default()));
    }
    let opts = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}{}",
        o.budget.as_secs_f64(),
        o.strategy.name(),
        o.prefill_tokens,
        o.context,
        o.decode_tokens,
        o.weight_dtype,
        o.kv_dtype,
        o.seed,
        o.measurement_key(),
        formats
    );
    let ks = kernels::kernel_set_hash();
    crate::hash::sha256_parts::<&[&str]>(&[&device.fingerprint(), model, &cfg_json, &ks, env!("CARGO_PKG_VERSION"), SEARCH_REVISION, &opts])
}

/// Everything a tune needs about the model and device.
pub struct Target<'a> {
    pub model: &'a str,
    pub config: &'a ModelConfig,
    pub store: Arc<dyn TensorStore>,
    pub device: &'a Device,
    pub ctx: Option<Arc<GpuCtx>>,
    /// The model's weights as the vision tower reads them, for the end-to-end
    /// stage's image (needed with [`TuneOptions::vision`]; None: text only).
    pub vision_weights: Option<Arc<crate::model::Weights>>,
}

/// The result of a tune: what `finish` made of the findings (the profile document)
/// and a summary for the report.
pub struct TuneResult<D> {
    pub doc: D,
    pub resumed_slots: usize,
}

/// What the stages of one tune found, for the profile ([`crate::profile::build`]).
#[derive(Clone, Copy)]
pub(crate) struct Findings<'a> {
    pub target: &'a Target<'a>,
    pub options: &'a TuneOptions,
    pub caps: &'a DeviceCaps,
    /// Read bandwidth (GB/s) and how it was measured.
    pub limits: (f64, &'static str),
    /// How the slot races kept the caches out of their timings.
    pub rotation: &'a measure::Rotation,
    pub space: &'a space::Space,
    pub races: &'a race::Races,
    pub e2e: &'a e2e::EndToEnd,
    /// Seconds the whole tune took.
    pub used_s: f64,
}

/// Runs the whole search and hands its findings to `finish` (the profile builder,
/// [`crate::profile::build::profile_doc`]: the tuner measures, the profile module
/// writes). `cache` keeps finished races as they come; with `resume` races already
/// there are reused (an interrupted tune resumes; --force re-measures).
pub(crate) fn tune<D>(
    t: &Target<'_>,
    o: &TuneOptions,
    cache: Option<&Cache>,
    resume: bool,
    progress: &dyn Progress,
    finish: impl FnOnce(&Findings<'_>) -> D,
) -> Result<TuneResult<D>, TuneError> {
    let start = Instant::now();
    let deadline = start + o.budget;
    let slot_deadline = start + o.budget.mul_f64(0.65);
    if o.prefill_tokens == 0 || o.context <= o.prefill_tokens {
        return Err(TuneError::Invalid(format!(
            "--context ({}) must exceed --prefill-tokens ({}) and both be positive",
            o.context, o.prefill_tokens
        )));
    }
    let caps = DeviceCaps::from(t.device);
    let limits = limits::measure(t);
    let rotation = measure::Rotation::for_device(t.device, o.gpu_l2_bytes);
    let space = space::survey(t, o, &caps, progress)?;
    let races = race::run_all(t, o, &space, cache, resume, slot_deadline, progress)?;
    let e2e = e2e::run(t, o, &caps, &space, &races, deadline, progress)?;
    let findings = Findings {
        target: t,
        options: o,
        caps: &caps,
        limits,
        rotation: &rotation,
        space: &space,
        races: &races,
        e2e: &e2e,
        used_s: start.elapsed().as_secs_f64(),
    };
    Ok(TuneResult { doc: finish(&findings), resumed_slots: races.resumed })
}
