//! `ktune bench`: end-to-end throughput of one or more profiles and of the
//! runtime's default, measured in one process on one device. Every entry gets its
//! own engine (built and warmed up before anything is timed); rounds visit the
//! entries in a rotating order so drift hits all alike, and each entry is compared
//! with the first one round by round (paired ratios), which cancels the slow swings
//! of a shared machine that separate processes run minutes apart cannot. With
//! `--image` each round also runs the image through the vision tower and
//! projector once per entry (one tower on the device, switched to the entry's
//! `vision` choices), timed beside prefill and decode.

use std::path::PathBuf;

use crate::cli::BenchArgs;
use crate::device::Device;
use crate::eval::{self, Path, Reference, Text};
use crate::generate::ProfileChoice;
use crate::gpu::GpuCtx;
use crate::kernels::DType;
use crate::model::VisionConfig;
use crate::plan::{Fusion, Selection};
use crate::profile::{ExecSettings, Profile};
use crate::progress::{Progress, Silent};
use crate::report::{BenchEntry, BenchReport, Estimate, VisionBench};
use crate::runtime::tower::Tower;
use crate::runtime::{Engine, WeightMemo};
use crate::session::{self, Engines, LoadedModel, ModelSettings};
use crate::stats::summarize;
use crate::tuner;
use crate::tuner::e2e_sample;
use crate::{Error, Result};

/// The median of `v` with its 95% confidence interval.
fn estimate(v: &[f64]) -> Estimate {
    let s = summarize(v);
    Estimate { median: s.median, ci: s.ci }
}

/// One entry measured: its name (a profile's path or cache label, `default`),
/// its kernels and execution settings.
struct Setup {
    name: String,
    selection: Selection,
    exec: ExecSettings,
}

/// `--image`: its file, the tower's config and the decoded pixels.
type Image = (PathBuf, VisionConfig, Vec<f32>);

/// Measures every entry; `progress` sees one step per sample.
pub fn run(selector: Option<&str>, args: &BenchArgs, progress: &dyn Progress) -> Result<BenchReport> {
    let context = check(args)?;
    let settings = args.model.settings()?;
    // Profiles are read and validated before the model is loaded.
    let profiles: Vec<(PathBuf, Profile)> =
        args.profile.iter().map(|p| Profile::load(p).map(|x| (p.clone(), x))).collect::<std::result::Result<_, _>>()?;
    let device = session::pick_device(selector)?;
    let m = settings.load()?;
    session::check_context(&m.config, context, DType::F32, &device, "--prefill-tokens + --decode-tokens")?;
    let image = image(args, &m)?;
    let mut warnings = m.warnings.clone();
    let ctx = session::open_device(&device, false)?;
    let setups = setups(args, &settings, &device, &m, &profiles, context, &mut warnings)?;
    // CPU engines share one copy of the weights.
    let build = Engines::of(&m, ctx.clone(), Some(WeightMemo::default()));
    let mut engines = Vec::new();
    for e in &setups {
        let opts = settings.plan_options(&m, &e.exec, args.prefill_tokens, context, false);
        engines.push(build.build(opts, e.selection.clone(), &e.exec)?);
    }
    let mut tower = match &image {
        None => None,
        Some((_, v, pixels)) => Some(tower(v, pixels, &m, ctx.clone(), &setups)?),
    };
    let prompt: Vec<u32> = (0..args.prefill_tokens).map(|i| ((i * 7919 + 13) % m.config.dims.vocab_size) as u32).collect();
    let vision = tower.as_mut().zip(image.as_ref()).map(|((t, _), (_, _, pixels))| (t, pixels.as_slice()));
    let samples = measure(args, &prompt, &setups, &mut engines, vision, ctx.as_deref(), progress)?;
    // --kld: each entry, with every position's logits, against the CPU's f32
    // reference of the same weights on the prompt (every position but the last).
    let accuracy = if args.kld {
        let cpu_build = Engines { ctx: None, ..build };
        kld(&cpu_build, ctx.as_ref(), &settings, &m, &setups, &prompt, progress)?
    } else {
        vec![None; engines.len()]
    };
    let kernels = tower.map(|(_, kernels)| kernels);
    let entries = entries(args, &setups, &engines, &samples, kernels.as_deref(), accuracy);
    Ok(BenchReport {
        device: device.name(),
        model: m.name.clone(),
        layers: m.config.dims.num_layers,
        prefill_tokens: args.prefill_tokens,
        decode_tokens: args.decode_tokens,
        rounds: args.rounds,
        read_gbps: estimate(&samples.read_gbps),
        read_source: samples.read_source.into(),
        image: image.as_ref().map(|(p, _, _)| p.display().to_string()),
        entries,
        warnings,
    })
}

/// The flags checked; the context the KV cache holds: the prompt, the decode
/// steps and the one after them.
fn check(args: &BenchArgs) -> Result<usize> {
    if args.rounds < 3 {
        return Err(Error::Usage(format!("--rounds {}: at least 3 rounds are needed for an interval", args.rounds)));
    }
    if args.prefill_tokens == 0 || args.decode_tokens == 0 {
        return Err(Error::Usage("--prefill-tokens and --decode-tokens must be positive".into()));
    }
    args.prefill_tokens.checked_add(args.decode_tokens).and_then(|n| n.checked_add(1)).ok_or_else(|| {
        Error::Usage(format!("--prefill-tokens {} and --decode-tokens {}: past any context", args.prefill_tokens, args.decode_tokens))
    })
}

/// `--image`: the model must have a tower, the image must decode (both before
/// any engine is built).
fn image(args: &BenchArgs, m: &LoadedModel) -> Result<Option<Image>> {
    match (&args.image, &m.vision) {
        (None, _) => Ok(None),
        (Some(path), None) => Err(Error::Usage(format!(
            "--image {}: {} has no vision tower; images need a multimodal model (a Gemma3ForConditionalGeneration \
             directory, the built-in gemma3-4b, or --gguf TEXT.gguf --mmproj MMPROJ.gguf)",
            path.display(),
            m.name
        ))),
        (Some(path), Some(v)) => Ok(Some((path.clone(), v.clone(), crate::runtime::image::load_image(path, v.image_size)?))),
    }
}

/// The entries: the profiles in order (else the cached profile `run` would
/// use, by the same rules), then the runtime's default.
fn setups(
    args: &BenchArgs,
    settings: &ModelSettings,
    device: &Device,
    m: &LoadedModel,
    profiles: &[(PathBuf, Profile)],
    context: usize,
    warnings: &mut Vec<String>,
) -> Result<Vec<Setup>> {
    let mut setups = Vec::new();
    // Each entry chosen as every generating command chooses (an f32 KV cache,
    // every fusion and GPU batching where the runtime's defaults serve).
    let choice = |profile: Option<&PathBuf>| ProfileChoice {
        profile: profile.cloned(),
        no_profile: false,
        strict_device: args.strict_device,
        kv_dtype: DType::F32,
        fusion: Fusion::ALL,
        batch: true,
        decode_chain: None,
    };
    for (path, p) in profiles {
        let mut w = Vec::new();
        let c = choice(Some(path)).choose(Some(p), device, settings, m, args.prefill_tokens, context, false, &mut w)?;
        warnings.extend(w.into_iter().map(|w| format!("{}: {w}", path.display())));
        setups.push(Setup { name: path.display().to_string(), selection: c.selection, exec: c.exec });
    }
    if profiles.is_empty() && !args.no_profile {
        let c = choice(None).choose(None, device, settings, m, args.prefill_tokens, context, false, warnings)?;
        // Unlabelled, the choice fell to the runtime's defaults: the `default` entry.
        if let Some(name) = c.label {
            setups.push(Setup { name, selection: c.selection, exec: c.exec });
        }
    }
    if !args.no_default {
        // The default runs the weights the profiles were tuned for (else the flag or the file's type).
        let weight_dtype = match (settings.weight_dtype, setups.first()) {
            (None, Some(first)) => first.exec.weight_dtype,
            _ => settings.weight_dtype(m),
        };
        let c = choice(None).defaults(device, settings, m, weight_dtype, false);
        setups.push(Setup { name: "default".into(), selection: c.selection, exec: c.exec });
    }
    if setups.is_empty() {
        return Err(Error::Usage(
            "nothing to measure: no --profile and no cached profile for this device and model; give --profile FILE, tune first, or drop --no-default"
                .into(),
        ));
    }
    Ok(setups)
}

/// One tower on the device; each entry's `vision` choices checked, and each
/// entry's kernels run once (GPU pipelines compiled) before anything is timed.
/// Returns the tower and each entry's kernels.
fn tower(
    v: &VisionConfig,
    pixels: &[f32],
    m: &LoadedModel,
    ctx: Option<std::sync::Arc<GpuCtx>>,
    setups: &[Setup],
) -> Result<(Tower, Vec<Vec<String>>)> {
    let mut t = Tower::new(v, &m.weights, ctx)?;
    let mut kernels = Vec::new();
    for e in setups {
        t.select(&e.selection).map_err(|err| Error::Usage(format!("{}: {err}", e.name)))?;
        t.encode(pixels)?;
        kernels.push(t.kernels()?);
    }
    Ok((t, kernels))
}

/// Every entry's samples, and the device's read bandwidth of each round.
struct Samples {
    /// Per entry: prefill seconds, seconds per decoded token, seconds per image.
    prefill: Vec<Vec<f64>>,
    decode: Vec<Vec<f64>>,
    vision: Vec<Vec<f64>>,
    read_gbps: Vec<f64>,
    read_source: &'static str,
}

/// The rounds: each visits every entry once, in a rotating order (with
/// `vision`, the tower and the image's pixels, the image too).
fn measure(
    args: &BenchArgs,
    prompt: &[u32],
    setups: &[Setup],
    engines: &mut [Engine],
    mut vision: Option<(&mut Tower, &[f32])>,
    ctx: Option<&GpuCtx>,
    progress: &dyn Progress,
) -> Result<Samples> {
    let n = engines.len();
    let mut s = Samples {
        prefill: vec![Vec::new(); n],
        decode: vec![Vec::new(); n],
        vision: vec![Vec::new(); n],
        read_gbps: Vec::new(),
        read_source: "",
    };
    progress.phase("", (args.rounds * n) as u64);
    for round in 0..args.rounds {
        let (bw, src) = tuner::device_read_bandwidth(ctx);
        s.read_gbps.push(bw);
        s.read_source = src;
        for j in 0..n {
            let i = (j + round) % n;
            let k = session::decode_chain(None, &setups[i].exec);
            let (p, d) = e2e_sample(&mut engines[i], prompt, args.decode_tokens, k)?;
            s.prefill[i].push(p);
            s.decode[i].push(d);
            if let Some((t, pixels)) = vision.as_mut() {
                s.vision[i].push(t.sample(&setups[i].selection, pixels)?);
            }
            progress.tick();
        }
    }
    progress.done();
    Ok(s)
}

/// Each entry's divergence from the CPU's f32 reference on `prompt`: one
/// reference per weight type the entries run (usually one); a GPU entry gets its
/// own engine on the device (`ctx`), a CPU one shares the weights of `cpu_build`.
fn kld(
    cpu_build: &Engines<'_>,
    ctx: Option<&std::sync::Arc<GpuCtx>>,
    settings: &ModelSettings,
    m: &LoadedModel,
    setups: &[Setup],
    prompt: &[u32],
    progress: &dyn Progress,
) -> Result<Vec<Option<eval::Divergence>>> {
    let cpu = session::pick_device(Some("cpu"))?;
    let text = Text::single(prompt.to_vec(), 0);
    let gpu_build = ctx.map(|g| Engines::of(m, Some(g.clone()), None));
    let mut references: Vec<(DType, Engine)> = Vec::new();
    let mut out = Vec::new();
    for e in setups {
        progress.phase(&format!("kld {}", e.name), 1);
        let dtype = e.exec.weight_dtype;
        let r = match references.iter().position(|(d, _)| *d == dtype) {
            Some(r) => r,
            None => {
                let rexec = settings.execution(&cpu, m, dtype, DType::F32, true, Fusion::ALL, false);
                references.push((dtype, eval::scoring_engine(cpu_build, settings, m, Path::F32Reference, &rexec, text.ctx)?));
                references.len() - 1
            }
        };
        let build = gpu_build.as_ref().unwrap_or(cpu_build);
        let mut engine = eval::scoring_engine(build, settings, m, Path::Selected(Box::new(e.selection.clone())), &e.exec, text.ctx)?;
        let o = eval::evaluate(&text, &mut engine, Some(Reference::Engine(&mut references[r].1)), None, &Silent)?;
        out.push(o.divergence);
        progress.tick();
    }
    progress.done();
    Ok(out)
}

/// The report's entries: throughput, its change against the first entry and
/// against the read-bandwidth bound, round by round.
fn entries(
    args: &BenchArgs,
    setups: &[Setup],
    engines: &[Engine],
    s: &Samples,
    kernels: Option<&[Vec<String>]>,
    accuracy: Vec<Option<eval::Divergence>>,
) -> Vec<BenchEntry> {
    let tput = |tokens: f64, secs: &[f64]| -> Vec<f64> { secs.iter().map(|s| tokens / s).collect() };
    let pct_of_bound = |bytes: u64, secs: &[f64]| -> Vec<f64> {
        secs.iter().zip(&s.read_gbps).map(|(s, bw)| 100.0 * bytes as f64 / s / (bw * 1e9)).collect()
    };
    let vs_first = |mine: &[f64], first: &[f64]| -> Vec<f64> { mine.iter().zip(first).map(|(m, f)| (f / m - 1.0) * 100.0).collect() };
    let (prefill, decode, vision) = (&s.prefill, &s.decode, &s.vision);
    setups
        .iter()
        .zip(engines)
        .zip(accuracy)
        .enumerate()
        .map(|(i, ((e, engine), accuracy))| BenchEntry {
            name: e.name.clone(),
            decode_read_bytes: engine.plan.decode_read_bytes(),
            decode_pct_of_bound: estimate(&pct_of_bound(engine.plan.decode_read_bytes(), &decode[i])),
            prefill_tok_s: estimate(&tput(args.prefill_tokens as f64, &prefill[i])),
            decode_tok_s: estimate(&tput(1.0, &decode[i])),
            prefill_vs_first_pct: estimate(&vs_first(&prefill[i], &prefill[0])),
            decode_vs_first_pct: estimate(&vs_first(&decode[i], &decode[0])),
            prefill_s: prefill[i].clone(),
            decode_s: decode[i].clone(),
            decode_counters: engine.decode_counters(),
            vision: kernels.map(|kernels| VisionBench {
                ms: estimate(&vision[i].iter().map(|s| s * 1e3).collect::<Vec<_>>()),
                ratio_to_first: estimate(&vision[i].iter().zip(&vision[0]).map(|(m, f)| m / f).collect::<Vec<_>>()),
                kernels: kernels[i].clone(),
                samples_s: vision[i].clone(),
            }),
            accuracy,
        })
        .collect()
}
