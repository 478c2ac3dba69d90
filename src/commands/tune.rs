//! `ktune tune`: resolve the model and device, return the cached profile when there
//! is one (unless --force), else run the tuner under the cache lock and write the
//! profile atomically to the cache (and to -o, a file the user named:
//! [`crate::atomic::write_output`], checked before the tuning starts).

use std::sync::Arc;
use std::time::Duration;

use crate::cli::TuneArgs;
use crate::profile::cache::Cache;
use crate::profile::{self, Profile, ProfileDoc};
use crate::progress::Progress;
use crate::report::TuneReport;
use crate::runtime::TensorStore;
use crate::session;
use crate::tuner::measure::Strategy;
use crate::tuner::{self, Target, TuneOptions};
use crate::{Error, Result};

/// Parses a duration: `90`, `90s`, `2m`, `1h30m`, `1.5m` (see [`crate::cli::duration`]).
pub fn parse_duration(s: &str) -> Result<Duration> {
    crate::cli::duration(s).map_err(|e| Error::Usage(format!("--budget {e}")))
}

/// Where `--report` puts the HTML report of the profile at `yaml`: the same name
/// with `.html` (`.report.html` when the profile itself ends in `.html`).
pub fn html_beside(yaml: &std::path::Path) -> std::path::PathBuf {
    if yaml.extension().is_some_and(|e| e == "html") { yaml.with_extension("report.html") } else { yaml.with_extension("html") }
}

pub fn run(selector: Option<&str>, args: &TuneArgs, progress: &dyn Progress) -> Result<TuneReport> {
    // The budget counts from here: the model's load is part of it.
    let started = std::time::Instant::now();
    // Flags first, before anything heavy.
    let budget = parse_duration(&args.budget)?;
    let strategy = Strategy::parse(&args.strategy)
        .ok_or_else(|| Error::Usage(format!("--strategy `{}`: allowed are auto, exhaustive, halving, random", args.strategy)))?;
    let settings = args.model.settings()?;
    let kv_dtype = args.kv_dtype;
    if args.prefill_tokens == 0 || args.context <= args.prefill_tokens {
        return Err(Error::Usage(format!(
            "--context ({}) must be larger than --prefill-tokens ({}), which must be positive",
            args.context, args.prefill_tokens
        )));
    }
    // -o is written after the tuning: refused now if it cannot be (a directory,
    // a FIFO, a missing folder, the model's own file) rather than after the budget.
    let inputs = settings.input_files();
    let inputs: Vec<(&str, &std::path::Path)> = inputs.iter().map(|(f, p)| (*f, p.as_path())).collect();
    if let Some(out) = &args.output {
        crate::atomic::check_output(out, &inputs)?;
        if args.report {
            crate::atomic::check_output(&html_beside(out), &inputs)?;
        }
    }
    let device = session::pick_device(selector)?;
    if matches!(device, crate::device::Device::Cpu(_)) && args.gpu_l2_bytes.is_some() {
        return Err(Error::Usage(
            "--gpu-l2-bytes applies to GPU devices; on the CPU the races rotate past its measured last-level cache".into(),
        ));
    }
    let m = settings.load()?;
    session::check_context(&m.config, args.context, kv_dtype, &device, "--context")?;
    let weight_dtype = settings.weight_dtype(&m);
    let name = settings.profile_name(&m);
    let opts = TuneOptions {
        budget,
        strategy,
        prefill_tokens: args.prefill_tokens,
        context: args.context,
        decode_tokens: args.decode_tokens,
        weight_dtype,
        matrix_formats: settings.matrix_formats(&m, weight_dtype),
        kv_dtype,
        seed: settings.seed,
        gpu_l2_bytes: args.gpu_l2_bytes,
        trusted_shaders: settings.trusted_shaders && !matches!(device, crate::device::Device::Cpu(_)),
        vision: if args.no_vision { None } else { m.vision.clone() },
        max_kld: args.max_kld,
        serve_batches: args.serve_batches.as_ref().map_or(Vec::new(), |b| b.0.iter().copied().filter(|&b| b >= 2).collect()),
    };
    let key = tuner::cache_key(&device, &name, &m.config, &opts);
    let cache = Cache::open().map_err(tuner::TuneError::from)?;
    let path = cache.profile_path(&key);
    let finish = |doc: ProfileDoc, cached: bool, resumed: usize, budget: Option<tuner::budget::BudgetReport>| -> Result<TuneReport> {
        if let Some(out) = &args.output {
            crate::atomic::write_output(out, &inputs, profile::to_yaml(&doc)?.as_bytes())?;
        }
        Ok(TuneReport {
            model: name.clone(),
            device: device.name(),
            key: key.clone(),
            path: path.clone(),
            output: args.output.clone(),
            cached,
            resumed_slots: resumed,
            budget,
            reports: if args.report { std::iter::once(&path).chain(&args.output).map(|p| html_beside(p)).collect() } else { Vec::new() },
            profile: doc,
        })
    };
    let cached = || -> Option<ProfileDoc> {
        if args.force {
            return None;
        }
        Profile::load(&path).ok().map(|p| p.doc)
    };
    if let Some(doc) = cached() {
        return finish(doc, true, 0, None);
    }
    let _lock = cache
        .lock(&key, || progress.note("another ktune tune of this model and device is running; waiting for it"))
        .map_err(tuner::TuneError::from)?;
    if let Some(doc) = cached() {
        return finish(doc, true, 0, None);
    }
    let ctx = session::open_device(&device, opts.trusted_shaders)?;
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let vision_weights = opts.vision.as_ref().map(|_| m.weights.clone());
    let target = Target { model: &name, config: &m.config, store, device: &device, ctx, vision_weights, started };
    let res = tuner::tune(&target, &opts, Some(&cache), !args.force, progress, profile::build::profile_doc)
        .map_err(|e| Error::Usage(format!("tuning failed: {e}")))?;
    let text = profile::to_yaml(&res.doc)?;
    // The written profile must load back (round trip), or nothing is cached.
    Profile::from_str(&text, &path.display().to_string())?;
    profile::write_atomic(&path, &text)?;
    finish(res.doc, false, res.resumed_slots, Some(res.budget))
}
