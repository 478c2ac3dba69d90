//! `ktune bench`: end-to-end throughput of one or more profiles and of the
//! runtime's default, measured in one process on one device. Every entry gets its
//! own engine (built and warmed up before anything is timed); rounds visit the
//! entries in a rotating order so drift hits all alike, and each entry is compared
//! with the first one round by round (paired ratios), which cancels the slow swings
//! of a shared machine that separate processes run minutes apart cannot.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use super::run::{default_weight_dtype, gguf_storage, load_source, open_device, parse_dtype};
use crate::cli::BenchArgs;
use crate::plan::{Fusion, Parallel, Plan, PlanOptions, Selection};
use crate::profile::{ExecSettings, Profile};
use crate::runtime::{Engine, TensorStore, WeightMemo};
use crate::tuner::e2e_sample;
use crate::tuner::stats::summarize;
use crate::{Error, Result};

/// A median with its 95% confidence interval.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    pub median: f64,
    pub ci: [f64; 2],
}

impl Estimate {
    fn of(v: &[f64]) -> Estimate {
        let s = summarize(v);
        Estimate { median: s.median, ci: s.ci }
    }
}

#[derive(Debug, Serialize)]
pub struct BenchEntry {
    /// `default`, or the profile's path.
    pub name: String,
    pub prefill_tok_s: Estimate,
    pub decode_tok_s: Estimate,
    /// Throughput change against the first entry, percent, from per-round ratios.
    pub prefill_vs_first_pct: Estimate,
    pub decode_vs_first_pct: Estimate,
    /// Raw per-round samples: prefill seconds, median seconds per decoded token.
    pub prefill_s: Vec<f64>,
    pub decode_s: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub model: String,
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub rounds: usize,
    pub entries: Vec<BenchEntry>,
    pub warnings: Vec<String>,
}

pub fn run(selector: Option<&str>, args: &BenchArgs) -> Result<BenchReport> {
    if args.rounds < 3 {
        return Err(Error::Usage(format!("--rounds {}: at least 3 rounds are needed for an interval", args.rounds)));
    }
    if args.prefill_tokens == 0 || args.decode_tokens == 0 {
        return Err(Error::Usage("--prefill-tokens and --decode-tokens must be positive".into()));
    }
    if args.profile.is_empty() && args.no_default {
        return Err(Error::Usage("nothing to measure: give --profile FILE or drop --no-default".into()));
    }
    let weight_flag = args.weight_dtype.as_deref().map(|s| parse_dtype(s, "--weight-dtype")).transpose()?;
    // Profiles are read and validated before the model is loaded.
    let profiles: Vec<(PathBuf, Profile)> =
        args.profile.iter().map(|p| Profile::load(p).map(|x| (p.clone(), x))).collect::<std::result::Result<_, _>>()?;
    let device = super::pick_device(selector)?;
    let m = load_source(&args.source, args.layers, args.seed)?;
    let mut warnings = m.warnings.clone();
    let (caps, ctx) = open_device(&device)?;
    let c = &m.config;

    // (name, selection, execution) of every entry: the profiles in order, then the default.
    let mut setups: Vec<(String, Selection, ExecSettings)> = Vec::new();
    for (path, p) in &profiles {
        let (sel, exec, w) = p.resolve(&device, &m.name, c.num_layers)?;
        warnings.extend(w.into_iter().map(|w| format!("{}: {w}", path.display())));
        setups.push((path.display().to_string(), sel, exec));
    }
    if !args.no_default {
        // The default runs the weights the profiles were tuned for (else the flag or the file's type).
        let weight_dtype = match (weight_flag, setups.first()) {
            (None, Some((_, _, e))) => e.weight_dtype,
            _ => default_weight_dtype(weight_flag, gguf_storage(&m)),
        };
        let exec = ExecSettings {
            batch: true,
            fusion: Fusion::ALL,
            parallel: Parallel::default(),
            kv_dtype: crate::kernels::DType::F32,
            weight_dtype,
        };
        setups.push(("default".into(), Selection::defaults(caps.clone()), exec));
    }

    let context = args.prefill_tokens + args.decode_tokens + 1;
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let mut engines = Vec::new();
    let memo = WeightMemo::default();
    for (name, sel, exec) in setups {
        let opts = PlanOptions {
            weight_dtype: exec.weight_dtype,
            kv_dtype: exec.kv_dtype,
            max_tokens: args.prefill_tokens,
            context,
            all_logits: false,
            fusion: exec.fusion,
            parallel: exec.parallel,
        };
        let plan = Plan::new(&m.name, c, opts, sel)?;
        plan.steps(args.prefill_tokens, 0)?;
        let mut e = match &ctx {
            Some(ctx) => Engine::gpu(plan, store.clone(), ctx.clone(), exec.batch)?,
            None => Engine::cpu_shared(plan, store.clone(), &memo)?,
        };
        e.warm_up(args.prefill_tokens)?;
        e.warm_up(1)?;
        engines.push((name, e));
    }

    let prompt: Vec<u32> = (0..args.prefill_tokens).map(|i| ((i * 7919 + 13) % c.vocab_size) as u32).collect();
    let n = engines.len();
    let mut prefill = vec![Vec::new(); n];
    let mut decode = vec![Vec::new(); n];
    let pb = crate::output::progress((args.rounds * n) as u64, "bench");
    for round in 0..args.rounds {
        for j in 0..n {
            let i = (j + round) % n;
            let (p, d) = e2e_sample(&mut engines[i].1, &prompt, args.decode_tokens)?;
            prefill[i].push(p);
            decode[i].push(d);
            if let Some(pb) = &pb {
                pb.inc(1);
            }
        }
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }

    let tput = |tokens: f64, secs: &[f64]| -> Vec<f64> { secs.iter().map(|s| tokens / s).collect() };
    let vs_first = |mine: &[f64], first: &[f64]| -> Vec<f64> { mine.iter().zip(first).map(|(m, f)| (f / m - 1.0) * 100.0).collect() };
    let entries = engines
        .iter()
        .enumerate()
        .map(|(i, (name, _))| BenchEntry {
            name: name.clone(),
            prefill_tok_s: Estimate::of(&tput(args.prefill_tokens as f64, &prefill[i])),
            decode_tok_s: Estimate::of(&tput(1.0, &decode[i])),
            prefill_vs_first_pct: Estimate::of(&vs_first(&prefill[i], &prefill[0])),
            decode_vs_first_pct: Estimate::of(&vs_first(&decode[i], &decode[0])),
            prefill_s: prefill[i].clone(),
            decode_s: decode[i].clone(),
        })
        .collect();
    Ok(BenchReport {
        device: device.name(),
        model: m.name.clone(),
        prefill_tokens: args.prefill_tokens,
        decode_tokens: args.decode_tokens,
        rounds: args.rounds,
        entries,
        warnings,
    })
}
