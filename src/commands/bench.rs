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
use std::sync::Arc;

use crate::cli::BenchArgs;
use crate::device::DeviceCaps;
use crate::eval::{self, Path, Reference, Text};
use crate::plan::{Fusion, Selection};
use crate::profile::{ExecSettings, Profile, lookup};
use crate::progress::{Progress, Silent};
use crate::report::{BenchEntry, BenchReport, Estimate, VisionBench};
use crate::runtime::tower::Tower;
use crate::runtime::{TensorStore, WeightMemo};
use crate::session::{self, Engines};
use crate::stats::summarize;
use crate::tuner;
use crate::tuner::e2e_sample;
use crate::{Error, Result};

/// The median of `v` with its 95% confidence interval.
fn estimate(v: &[f64]) -> Estimate {
    let s = summarize(v);
    Estimate { median: s.median, ci: s.ci }
}

/// Measures every entry; `progress` sees one step per sample.
pub fn run(selector: Option<&str>, args: &BenchArgs, progress: &dyn Progress) -> Result<BenchReport> {
    if args.rounds < 3 {
        return Err(Error::Usage(format!("--rounds {}: at least 3 rounds are needed for an interval", args.rounds)));
    }
    if args.prefill_tokens == 0 || args.decode_tokens == 0 {
        return Err(Error::Usage("--prefill-tokens and --decode-tokens must be positive".into()));
    }
    // The KV cache holds the prompt, the decode steps and the one after them.
    let context = args.prefill_tokens.checked_add(args.decode_tokens).and_then(|n| n.checked_add(1)).ok_or_else(|| {
        Error::Usage(format!("--prefill-tokens {} and --decode-tokens {}: past any context", args.prefill_tokens, args.decode_tokens))
    })?;
    let settings = args.model.settings()?;
    // Profiles are read and validated before the model is loaded.
    let profiles: Vec<(PathBuf, Profile)> =
        args.profile.iter().map(|p| Profile::load(p).map(|x| (p.clone(), x))).collect::<std::result::Result<_, _>>()?;
    let device = session::pick_device(selector)?;
    let m = settings.load()?;
    session::check_context(&m.config, context, crate::kernels::DType::F32, &device, "--prefill-tokens + --decode-tokens")?;
    // --image: the model must have a tower, the image must decode (both before any engine is built).
    let image = match (&args.image, &m.vision) {
        (None, _) => None,
        (Some(path), None) => {
            return Err(Error::Usage(format!(
                "--image {}: {} has no vision tower; images need a multimodal model (a Gemma3ForConditionalGeneration \
                 directory, the built-in gemma3-4b, or --gguf TEXT.gguf --mmproj MMPROJ.gguf)",
                path.display(),
                m.name
            )));
        }
        (Some(path), Some(v)) => Some((path.clone(), v.clone(), crate::runtime::image::load_image(path, v.image_size)?)),
    };
    let mut warnings = m.warnings.clone();
    let caps = DeviceCaps::from(&device);
    let ctx = session::open_device(&device, false)?;
    let c = &m.config;

    // (name, selection, execution) of every entry: the profiles in order, then the default.
    let mut setups: Vec<(String, Selection, ExecSettings)> = Vec::new();
    let profile_name = settings.profile_name(&m);
    for (path, p) in &profiles {
        let (sel, exec, w) = p.resolve(&device, &profile_name, c.num_layers)?;
        warnings.extend(w.into_iter().map(|w| format!("{}: {w}", path.display())));
        setups.push((path.display().to_string(), sel, exec));
    }
    if profiles.is_empty() && !args.no_profile {
        // The cached profile `run` would use (same rules), measured as the first entry.
        let weight_dtype = settings.weight_dtype(&m);
        let want = lookup::Want {
            model: &profile_name,
            model_hash: settings.model_hash(&m, weight_dtype),
            weight_dtype,
            kv_dtype: crate::kernels::DType::F32,
            prefill_tokens: args.prefill_tokens,
            context,
            strict_device: args.strict_device,
        };
        let found = lookup::find(&device, &want)?;
        warnings.extend(found.warnings);
        if let Some(f) = found.found {
            let (sel, exec, mut w) = f.profile.resolve(&device, &profile_name, c.num_layers)?;
            if f.by_class {
                w.retain(|x| !x.contains("was tuned on another device"));
            }
            warnings.extend(w);
            setups.push((f.label, sel, exec));
        }
    }
    if !args.no_default {
        // The default runs the weights the profiles were tuned for (else the flag or the file's type).
        let weight_dtype = match (settings.weight_dtype, setups.first()) {
            (None, Some((_, _, e))) => e.weight_dtype,
            _ => settings.weight_dtype(&m),
        };
        let exec = settings.execution(&device, &m, weight_dtype, crate::kernels::DType::F32, true, Fusion::ALL);
        setups.push(("default".into(), Selection::runtime(caps.clone()), exec));
    }

    if setups.is_empty() {
        return Err(Error::Usage(
            "nothing to measure: no --profile and no cached profile for this device and model; give --profile FILE, tune first, or drop --no-default"
                .into(),
        ));
    }
    let store: Arc<dyn TensorStore> = m.weights.clone();
    // CPU engines share one copy of the weights.
    let mut build = Engines { model: &m.name, config: c, store, ctx: ctx.clone(), memo: Some(WeightMemo::default()), check_decode: false };
    let mut engines = Vec::new();
    // Each entry's selection (for its vision choices) and execution (for `--kld`).
    let selections: Vec<Selection> = setups.iter().map(|s| s.1.clone()).collect();
    let execs: Vec<ExecSettings> = setups.iter().map(|s| s.2.clone()).collect();
    for (name, sel, exec) in setups {
        // Each entry's shader modules as its profile (or the flag) asks.
        build.ctx = ctx.as_ref().map(|g| g.with_trusted_shaders(exec.trusted_shaders || settings.trusted_shaders));
        let opts = settings.plan_options(&m, &exec, args.prefill_tokens, context, false);
        let mut engine = build.build(opts, sel, exec.batch)?;
        engine.set_cpu_pool(exec.threads, exec.spin_us, exec.prefetch);
        engines.push((name, engine));
    }

    // --image: one tower on the device; each entry's choices checked, and each
    // entry's kernels run once (GPU pipelines compiled) before anything is timed.
    let mut tower = match &image {
        None => None,
        Some((_, v, pixels)) => {
            let mut t = Tower::new(v, &m.weights, ctx.clone())?;
            let mut kernels = Vec::new();
            for (sel, (name, _)) in selections.iter().zip(&engines) {
                t.select(sel).map_err(|e| Error::Usage(format!("{name}: {e}")))?;
                t.encode(pixels)?;
                kernels.push(t.kernels()?);
            }
            Some((t, kernels))
        }
    };

    let prompt: Vec<u32> = (0..args.prefill_tokens).map(|i| ((i * 7919 + 13) % c.vocab_size) as u32).collect();
    let n = engines.len();
    let mut prefill = vec![Vec::new(); n];
    let mut decode = vec![Vec::new(); n];
    let mut vision: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut read_gbps = Vec::new();
    let mut read_source = "";
    progress.phase("", (args.rounds * n) as u64);
    for round in 0..args.rounds {
        let (bw, src) = tuner::device_read_bandwidth(ctx.as_deref());
        read_gbps.push(bw);
        read_source = src;
        for j in 0..n {
            let i = (j + round) % n;
            let k = execs[i].decode_chain.unwrap_or(crate::profile::doc::DEFAULT_DECODE_CHAIN) as usize;
            let (p, d) = e2e_sample(&mut engines[i].1, &prompt, args.decode_tokens, k)?;
            prefill[i].push(p);
            decode[i].push(d);
            if let (Some((t, _)), Some((_, _, pixels))) = (tower.as_mut(), &image) {
                vision[i].push(t.sample(&selections[i], pixels)?);
            }
            progress.tick();
        }
    }
    progress.done();

    // --kld: each entry, with every position's logits, against the CPU's f32
    // reference of the same weights on the prompt (every position but the last).
    let accuracy = if args.kld {
        let cpu = session::pick_device(Some("cpu"))?;
        let text = Text::single(prompt.clone(), 0);
        let cpu_build = Engines { ctx: None, ..build };
        let mut references: Vec<(crate::kernels::DType, crate::runtime::Engine)> = Vec::new();
        let mut out = Vec::new();
        for (i, (sel, exec)) in selections.iter().zip(&execs).enumerate() {
            progress.phase(&format!("kld {}", engines[i].0), 1);
            // One reference per weight type the entries run (usually one).
            let r = match references.iter().position(|(d, _)| *d == exec.weight_dtype) {
                Some(r) => r,
                None => {
                    let rexec = settings.execution(&cpu, &m, exec.weight_dtype, crate::kernels::DType::F32, true, Fusion::ALL);
                    references
                        .push((exec.weight_dtype, eval::scoring_engine(&cpu_build, &settings, &m, Path::F32Reference, &rexec, text.ctx)?));
                    references.len() - 1
                }
            };
            // A GPU entry gets its own engine on the device; a CPU one shares the weights.
            let gpu_build = ctx.as_ref().map(|g| Engines {
                ctx: Some(g.with_trusted_shaders(exec.trusted_shaders || settings.trusted_shaders)),
                memo: None,
                store: cpu_build.store.clone(),
                ..cpu_build
            });
            let mut engine =
                eval::scoring_engine(gpu_build.as_ref().unwrap_or(&cpu_build), &settings, &m, Path::Selected(sel.clone()), exec, text.ctx)?;
            let o = eval::evaluate(&text, &mut engine, Some(Reference::Engine(&mut references[r].1)), None, &Silent)?;
            out.push(o.divergence);
            progress.tick();
        }
        progress.done();
        out
    } else {
        vec![None; engines.len()]
    };

    let tput = |tokens: f64, secs: &[f64]| -> Vec<f64> { secs.iter().map(|s| tokens / s).collect() };
    let pct_of_bound = |bytes: u64, secs: &[f64]| -> Vec<f64> {
        secs.iter().zip(&read_gbps).map(|(s, bw)| 100.0 * bytes as f64 / s / (bw * 1e9)).collect()
    };
    let vs_first = |mine: &[f64], first: &[f64]| -> Vec<f64> { mine.iter().zip(first).map(|(m, f)| (f / m - 1.0) * 100.0).collect() };
    let entries = engines
        .iter()
        .enumerate()
        .map(|(i, (name, engine))| BenchEntry {
            name: name.clone(),
            decode_read_bytes: engine.plan.decode_read_bytes(),
            decode_pct_of_bound: estimate(&pct_of_bound(engine.plan.decode_read_bytes(), &decode[i])),
            prefill_tok_s: estimate(&tput(args.prefill_tokens as f64, &prefill[i])),
            decode_tok_s: estimate(&tput(1.0, &decode[i])),
            prefill_vs_first_pct: estimate(&vs_first(&prefill[i], &prefill[0])),
            decode_vs_first_pct: estimate(&vs_first(&decode[i], &decode[0])),
            prefill_s: prefill[i].clone(),
            decode_s: decode[i].clone(),
            decode_counters: engine.decode_counters(),
            vision: tower.as_ref().map(|(_, kernels)| VisionBench {
                ms: estimate(&vision[i].iter().map(|s| s * 1e3).collect::<Vec<_>>()),
                ratio_to_first: estimate(&vision[i].iter().zip(&vision[0]).map(|(m, f)| m / f).collect::<Vec<_>>()),
                kernels: kernels[i].clone(),
                samples_s: vision[i].clone(),
            }),
            accuracy: accuracy[i].clone(),
        })
        .collect();
    Ok(BenchReport {
        device: device.name(),
        model: m.name.clone(),
        prefill_tokens: args.prefill_tokens,
        decode_tokens: args.decode_tokens,
        rounds: args.rounds,
        read_gbps: estimate(&read_gbps),
        read_source: read_source.into(),
        image: image.as_ref().map(|(p, _, _)| p.display().to_string()),
        entries,
        warnings,
    })
}
