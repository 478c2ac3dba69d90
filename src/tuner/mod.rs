//! `ktune tune`: the search, in stages. `space`: the plan builder gives every
//! slot's shapes for each fusion choice, one race per slot with its valid
//! variants. `race`: each slot's variants are gated by correctness, raced at those
//! shapes (interleaved rounds, robust statistics, early drops) and refined by
//! coordinate descent. [`e2e`]: the most promising complete combinations (fusions
//! and execution flags included) are timed end to end through the runtime against
//! its own default (decided by the paired rule, [`paired`], and said why), and
//! for a multimodal model one image per request through the vision tower with
//! the raced vision kernels against the default ones. The profile is then assembled from the results
//! ([`crate::profile::build`]). One deadline bounds it all; finished slot races are
//! saved as they come so an interrupted tune resumes.

pub mod batches;
pub mod budget;
pub mod e2e;
pub mod kbench;
mod limits;
pub mod measure;
pub(crate) mod paired;
pub(crate) mod race;
pub(crate) mod space;
pub mod warm;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::device::{Device, DeviceCaps};
use crate::gpu::GpuCtx;
use crate::kernels::{self, DType};
use crate::model::ModelConfig;
use crate::plan::Regime;
use crate::plan::select::{Choice, SlotKey};
use crate::profile::build::{CombinationRecord, TuneRecord};
use crate::profile::cache::{self, Cache};
use crate::profile::doc;
use crate::runtime::{RuntimeError, TensorStore};
use measure::Strategy;

pub use crate::progress::{Progress, Silent};
pub use e2e::e2e_sample;
pub use limits::{cpu_read_bandwidth, device_read_bandwidth};

/// Relative difference under which two times count as a tie.
const TIE: f64 = 0.01;

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Cache(#[from] cache::CacheError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
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
    /// `--max-kld`: the KL divergence from the f32 reference above which the
    /// end-to-end stage refuses a combination (None: the runtime default's own
    /// × [`e2e::KLD_BUDGET_FACTOR`], at least [`e2e::KLD_FLOOR`]).
    pub max_kld: Option<f64>,
    /// `--serve-batches`: the decode batch sizes (2 or more sequences) whose
    /// kernels race after the end-to-end stage ([`batches`]; empty: none).
    pub serve_batches: Vec<usize>,
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
/// (`rotate-1`: GPU races rotate input copies past the adapter's L2;
/// `panels-1`: the batch regimes' races keep their GEMMs' packed rows;
/// `first-1`: a race starts from the runtime's default, not the exact one.)
const SEARCH_REVISION: &str = "descent-1-rotate-1-panels-1-first-1";

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
    // An explicit accuracy budget can choose another combination (the default one
    // keeps older keys).
    let opts = match o.max_kld {
        Some(k) => format!("{opts}|max_kld={k:e}"),
        None => opts,
    };
    // Decode batch regimes: a tune with them is another profile (none: older keys hold).
    let opts = if o.serve_batches.is_empty() { opts } else { format!("{opts}|serve_batches={:?}", o.serve_batches) };
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
    /// When the command began: the budget counts from here, the model's load
    /// included ([`budget::Budget`]).
    pub started: Instant,
}

/// The result of a tune: what `finish` made of the findings (the profile document)
/// and a summary for the report.
pub struct TuneResult<D> {
    pub doc: D,
    pub resumed_slots: usize,
    /// How the budget was spent and what was cut to fit it.
    pub budget: budget::BudgetReport,
}

/// Runs the whole search and hands what it found to `finish` as plain data (the
/// profile builder, [`crate::profile::build::profile_doc`]: the tuner measures and
/// chooses, the profile module writes). `cache` keeps finished races as they come;
/// with `resume` races already there are reused (an interrupted tune resumes;
/// --force re-measures).
pub(crate) fn tune<D>(
    t: &Target<'_>,
    o: &TuneOptions,
    cache: Option<&Cache>,
    resume: bool,
    progress: &dyn Progress,
    finish: impl FnOnce(&TuneRecord<'_>) -> D,
) -> Result<TuneResult<D>, TuneError> {
    let budget = budget::Budget::new(t.started, o.budget, "loading the model");
    crate::kernels::memory::take_uncollapsed();
    // The stages bound the move of their buffers to huge pages; lifted at the end.
    struct Unbound;
    impl Drop for Unbound {
        fn drop(&mut self) {
            crate::kernels::memory::collapse_until(None);
        }
    }
    let _unbound = Unbound;
    if o.prefill_tokens == 0 || o.context <= o.prefill_tokens {
        return Err(TuneError::Invalid(format!(
            "--context ({}) must exceed --prefill-tokens ({}) and both be positive",
            o.context, o.prefill_tokens
        )));
    }
    let caps = DeviceCaps::from(t.device);
    let limits = budget.stage("device limits", || limits::measure(t, o.budget));
    let rotation = measure::Rotation::for_device(t.device, o.gpu_l2_bytes);
    let space = budget.stage("search space", || space::survey(t, o, &caps, progress))?;
    if !o.serve_batches.is_empty() {
        budget.reserve(budget::BATCHES_SHARE);
    }
    let races = budget.stage("slot races", || race::run_all(t, o, &space, cache, resume, &budget, &budget::SLOT_RACES, progress))?;
    let e2e = e2e::run(t, o, &caps, &space, &races, &budget, progress)?;
    let chosen = &e2e.combos[e2e.best].0;
    budget.release();
    let batches =
        batches::run(t, o, &caps, (chosen, e2e.decode_seconds()), &e2e.selection(chosen, &caps), cache, resume, &budget, progress)?;
    let found =
        Found { target: t, options: o, caps: &caps, rotation: &rotation, space: &space, races: &races, e2e: &e2e, batches: &batches };
    let record = found.record(limits, t.started.elapsed().as_secs_f64())?;
    let doc = budget.stage("writing the profile", || finish(&record));
    let uncollapsed = crate::kernels::memory::take_uncollapsed();
    if uncollapsed > 0 {
        budget.cut(format!(
            "huge pages: {:.2} GB of inputs and weights left on 4 KiB pages (moving them took longer than the stages' shares): \
             the races and the end-to-end tok/s ran without them, a decode step up to ~10% slower than `run`'s",
            uncollapsed as f64 / 1e9
        ));
    }
    let report = budget.report();
    for cut in &report.cuts {
        progress.note(&format!("to fit the budget: {cut}"));
    }
    Ok(TuneResult { doc, resumed_slots: races.resumed, budget: report })
}

/// What the stages of one tune found.
struct Found<'a> {
    target: &'a Target<'a>,
    options: &'a TuneOptions,
    caps: &'a DeviceCaps,
    /// How the slot races kept the caches out of their timings.
    rotation: &'a measure::Rotation,
    space: &'a space::Space,
    races: &'a race::Races,
    e2e: &'a e2e::EndToEnd,
    /// The decode batch regimes (`--serve-batches`).
    batches: &'a batches::BatchRegimes,
}

impl<'a> Found<'a> {
    /// The plain record of the tune for the profile: the winning combination's
    /// explicit choices (race winners, or the default's own picks; the vision
    /// races' winners where they beat the runtime's default vision kernels end to
    /// end, else those slots are left to the defaults), its execution settings,
    /// where its kernels run, and every race and combination as timed.
    fn record(&self, limits: (f64, &'static str), used_s: f64) -> Result<TuneRecord<'a>, TuneError> {
        let Found { target: t, options: o, caps, rotation, space, races, e2e, batches } = *self;
        let chosen = &e2e.combos[e2e.best].0;
        let chosen_sel = e2e.selection(chosen, caps);
        let mut choices: BTreeMap<SlotKey, Choice> = BTreeMap::new();
        let mut formats: BTreeMap<(DType, SlotKey), Choice> = BTreeMap::new();
        let extra = o.extra_formats();
        // The chosen fusion's steps: one of the races' fusion choices, or the
        // runtime default's (every fusion on, some of which this model has no
        // plan of its own for: `qk_norm_rope` without q/k norm), planned here, so
        // the profile names every slot's kernel whichever combination won.
        let steps = match space.per_fusion.iter().find(|(f, _)| *f == chosen.fusion) {
            Some((_, steps)) => steps.clone(),
            None => space::fusion_steps(t, o, caps, chosen.fusion)?,
        };
        for (key, p, d) in &steps {
            if let Ok(c) = chosen_sel.choose(key.0, key.1, None, p, *d) {
                if extra.contains(d) {
                    formats.entry((*d, *key)).or_insert(c);
                } else {
                    choices.entry(*key).or_insert(c);
                }
            }
        }
        let vision_kept = e2e.vision.as_ref().is_none_or(|v| v.kept);
        for (r, res) in space.races.iter().zip(&races.results) {
            if vision_kept
                && r.key.1 == Regime::Vision
                && let Some(c) = res.winner_choice()
            {
                choices.insert(r.key, c);
            }
        }
        // Where the chosen kernels run: the winner's steps, the vision races' shapes.
        let mut problems = steps;
        for r in space.races.iter().filter(|r| r.key.1 == Regime::Vision) {
            problems.extend(r.shapes.iter().map(|(p, _)| (r.key, p.clone(), r.dtype)));
        }
        // Trusted modules and the decode chain recorded on a GPU (the chain the
        // winner decoded with), where they were raced.
        let mut exec = chosen.exec(o, t.ctx.is_some());
        // The layouts a server's batches were checked over (CPU, with
        // `--serve-batches`): the profile's `serve.cpuRepack`.
        exec.batch_repack = batches.repack.clone();
        Ok(TuneRecord {
            model: t.model,
            device: t.device,
            backend: caps.backend(),
            model_hash: crate::profile::lookup::model_hash(t.config, &o.matrix_formats),
            exec,
            choices,
            formats,
            problems,
            races: races
                .results
                .iter()
                .zip(&space.races)
                .chain(batches.races.iter().map(|(_, r, res)| (res, r)))
                .map(|(res, r)| (res, measure::Workload::describe_work(&r.shapes, r.dtype)))
                .collect(),
            batches: batches.tables.clone(),
            batch_times: &batches.timed,
            min_batch: batches.min_batch,
            measurement: doc::Measurement {
                method: measure::Rotation::METHOD.into(),
                cache_bytes: rotation.cache_bytes,
                cache_source: rotation.cache_source.clone(),
                rotate_bytes: rotation.rotate_bytes,
                max_copies: races.results.iter().flat_map(|r| r.copies.iter().copied()).max().unwrap_or(1),
            },
            limits,
            strategy: o.strategy.name(),
            seed: o.seed,
            budget_s: o.budget.as_secs_f64(),
            prefill_tokens: o.prefill_tokens,
            context: o.context,
            decode_tokens: o.decode_tokens,
            space: doc::SpaceSummary {
                variants: space.variants,
                ruled_out: space.ruled_out.clone(),
                combinations: format!("{:.3e}", space.combinations),
                fusion_choices: space.per_fusion.len(),
            },
            combinations: e2e
                .combos
                .iter()
                .zip(&e2e.samples)
                .zip(e2e.kld.iter().zip(&e2e.refused))
                .map(|(((c, predicted_s), (prefill, decode)), (kld, refused))| CombinationRecord {
                    label: c.label(),
                    predicted_s: *predicted_s,
                    prefill,
                    decode,
                    kld: *kld,
                    refused: refused.clone(),
                })
                .collect(),
            max_kld: Some(e2e.max_kld),
            best: e2e.best,
            reason: &e2e.reason,
            head_to_head: e2e.head_to_head.as_ref(),
            vision: e2e.vision.as_ref(),
            timed_layers: e2e.timed_layers,
            used_s,
        })
    }
}

/// Tune options of the unit tests: f32, 8-token prompts in a context of 32, 8
/// decode tokens, seed 1, within `budget`.
#[cfg(test)]
pub(crate) fn test_options(budget: Duration) -> TuneOptions {
    TuneOptions {
        budget,
        strategy: Strategy::Auto,
        prefill_tokens: 8,
        context: 32,
        decode_tokens: 8,
        weight_dtype: DType::F32,
        matrix_formats: BTreeMap::new(),
        kv_dtype: DType::F32,
        seed: 1,
        gpu_l2_bytes: None,
        trusted_shaders: false,
        vision: None,
        max_kld: None,
        serve_batches: Vec::new(),
    }
}

/// The unit tests' target: SmolLM2-135M's built-in `config` with synthetic
/// weights on the CPU `device`.
#[cfg(test)]
pub(crate) fn test_target<'a>(config: &'a ModelConfig, device: &'a Device) -> Target<'a> {
    let store = Arc::new(crate::model::Weights::synthetic(config, 0));
    Target { model: "smollm2-135m", config, store, device, ctx: None, vision_weights: None, started: Instant::now() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Fusion, Selection};
    use crate::profile::Profile;

    /// A tune whose runtime default wins writes a profile that names the kernel
    /// of every slot the default's plan runs, as `run` picks them without a
    /// profile, and why it won: the profile read back selects what the default
    /// selected, whatever a later build's defaults are. SmolLM2 has no q/k norm,
    /// so the default's plan (every fusion on) is none of the races' fusion
    /// choices: the record plans it itself.
    #[test]
    fn a_profile_whose_default_won_names_every_slot_and_why() {
        let config = crate::model::builtin("smollm2-135m").expect("built-in config");
        let device = Device::Cpu(crate::device::cpu::CpuCaps::detect());
        let t = test_target(&config, &device);
        let o = test_options(Duration::from_secs(1));
        let caps = DeviceCaps::from(&device);
        let space = space::survey(&t, &o, &caps, &Silent).expect("space");
        assert!(!space.per_fusion.iter().any(|(f, _)| *f == Fusion::ALL), "no race plans every fusion of SmolLM2");
        let races = race::Races { results: Vec::new(), resumed: 0 };
        let reason = "the runtime default was the only combination timed and within the accuracy budget: it stays";
        let e2e = e2e::EndToEnd {
            combos: vec![(e2e::Combo::runtime_default(), f64::NAN)],
            samples: vec![(vec![0.1, 0.1], vec![0.01, 0.01])],
            best: 0,
            reason: reason.into(),
            head_to_head: None,
            winners: race::Winners::default(),
            vision: None,
            kld: vec![None],
            refused: vec![None],
            max_kld: 1e-4,
            timed_layers: None,
        };
        let rotation = measure::Rotation::for_device(&device, None);
        let batches = batches::BatchRegimes::default();
        let found =
            Found { target: &t, options: &o, caps: &caps, rotation: &rotation, space: &space, races: &races, e2e: &e2e, batches: &batches };
        let doc = crate::profile::build::profile_doc(&found.record((10.0, "test"), 1.0).expect("record"));
        let e = &doc.tuning.as_ref().expect("tuning").end_to_end;
        assert_eq!(e.decision.as_deref(), Some(reason));
        assert!(e.combinations[0].chosen);
        let p = Profile::from_str(&crate::profile::to_yaml(&doc).expect("yaml"), "p.yaml").expect("loads");
        let (sel, exec, _) = p.resolve(&device, "smollm2-135m", config.dims.num_layers).expect("resolves");
        assert_eq!(exec.fusion, Fusion::ALL);
        let runtime = Selection::runtime(caps.clone());
        let steps = space::fusion_steps(&t, &o, &caps, Fusion::ALL).expect("steps");
        assert!(steps.len() > 10, "{}", steps.len());
        for (key, problem, dtype) in steps.iter().filter(|(k, ..)| k.0.def().entry.is_some()) {
            assert!(sel.slots.contains_key(key), "{key:?} is not named in the profile: {:?}", p.doc.kernels);
            let named = sel.choose(key.0, key.1, None, problem, *dtype).expect("a kernel");
            let own = runtime.choose(key.0, key.1, None, problem, *dtype).expect("a kernel");
            assert_eq!((named.kernel.id, &named.params), (own.kernel.id, &own.params), "{key:?} at {}", problem.describe());
        }
    }
}
