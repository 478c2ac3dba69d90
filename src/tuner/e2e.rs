//! The end-to-end stage of a tune: the most promising complete combinations
//! (fusion choices by the time the race winners predict for them, execution flags,
//! and the runtime's own default) are built into engines and timed through the
//! runtime, interleaved when memory allows, within what is left of the budget;
//! the best by one request's time wins (ties go to the default). A multimodal
//! model's request also holds one image: a synthetic image at the tower's input
//! size is timed through the vision tower and projector with the raced vision
//! kernels and with the runtime's defaults (interleaved rounds), the raced ones
//! kept only if they beat the defaults by the paired rule the combinations meet,
//! and the image's time is part of every request's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::{ACCURACY_SHARE, Budget, TIMING_SHARE};
use super::measure::Strategy;
use super::race::{Races, Winners};
use super::space::{Space, plan_options};
use super::{Progress, TIE, Target, TuneError, TuneOptions};
use crate::device::DeviceCaps;
use crate::eval::{self, Reference, Text};
use crate::kernels::sample::{Sampler, SamplerParams};
use crate::plan::{Fusion, Parallel, Plan, PlanOptions, Regime, Selection};
use crate::profile::ExecSettings;
use crate::profile::build::VisionTimes;
use crate::progress::Silent;
use crate::runtime::tower::{Tower, synthetic_image};
use crate::runtime::{Engine, LoadOnce, RuntimeError, TensorStore, WeightMemo, argmax};
use crate::session::Engines;
use crate::stats::{Stats, pick, summarize};

/// Decode steps timed per end-to-end sample (on a GPU at least two chains:
/// [`sample_steps`]).
pub(crate) const E2E_DECODE_STEPS: usize = 8;

/// The decode chains (steps per submit) the end-to-end stage tries on a GPU
/// for the best predicted combination beside the runtime's default, 8
/// ([`crate::profile::doc::DEFAULT_DECODE_CHAIN`]), which the other
/// combinations run.
pub(crate) const CHAIN_CHOICES: [u32; 3] = [1, 4, 16];
/// Rounds of the head-to-head check of a winner against the default.
const CONFIRM_ROUNDS: usize = 4;
/// The fewest decode steps a sample keeps when the budget cuts them.
const MIN_SAMPLE_STEPS: usize = 2;
/// Why a combination the budget left out has no samples.
const NOT_TIMED: &str = "not timed within the budget";

/// The spin times (µs) the end-to-end stage tries beside the pool's default
/// (2 ms) for the best predicted combination on a CPU.
pub(crate) const SPIN_CHOICES_US: [u32; 2] = [100, 20_000];

/// The prefetch distances (bytes; 0: none) of the int8 decode dots the
/// end-to-end stage tries beside the runtime's default (2048) on a CPU.
pub(crate) const PREFETCH_CHOICES: [u32; 3] = [0, 1024, 4096];

/// The end-to-end combination space.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Combo {
    pub fusion: Fusion,
    pub parallel: Parallel,
    pub batch: bool,
    /// The runtime's own default selection instead of the race winners.
    pub default: bool,
    /// CPU: threads of the kernels' pool (0: all).
    pub threads: usize,
    /// CPU: how long idle pool workers spin before they park, µs (0: the pool's
    /// default, 2 ms).
    pub spin_us: u32,
    /// CPU: the int8 decode dots' prefetch distance, bytes (None: the runtime's
    /// default).
    pub prefetch: Option<u32>,
    /// CPU: the formats repacked at load, a bit per entry of
    /// [`crate::kernels::quant::REPACKABLE`] (0: none).
    pub repack: u8,
    /// GPU: decode steps chained per submit (None: the runtime's default).
    pub chain: Option<u32>,
}

impl Combo {
    /// A combination of the race winners with these switches, on all threads
    /// with the pool's default spin.
    fn raced(fusion: Fusion, parallel: Parallel, batch: bool) -> Combo {
        Combo { fusion, parallel, batch, default: false, threads: 0, spin_us: 0, prefetch: None, repack: 0, chain: None }
    }

    /// The formats [`Combo::repack`] names.
    pub fn repack_formats(&self) -> Vec<crate::kernels::quant::QFormat> {
        crate::kernels::quant::REPACKABLE.iter().enumerate().filter(|(j, _)| (self.repack >> j) & 1 == 1).map(|(_, &f)| f).collect()
    }

    /// The execution settings of this combination, for a model tuned with `o`
    /// (on a GPU when `gpu`: trusted shader modules as `o` asks, and the decode
    /// chain recorded).
    pub fn exec(&self, o: &TuneOptions, gpu: bool) -> ExecSettings {
        ExecSettings {
            batch: self.batch,
            fusion: self.fusion,
            parallel: self.parallel,
            kv_dtype: o.kv_dtype,
            weight_dtype: o.weight_dtype,
            threads: self.threads,
            spin_us: self.spin_us,
            prefetch: self.prefetch,
            repack: self.repack_formats(),
            trusted_shaders: o.trusted_shaders && gpu,
            decode_chain: gpu.then(|| self.decode_chain() as u32),
        }
    }

    pub fn label(&self) -> String {
        if self.default {
            return "runtime default".into();
        }
        let f = self.fusion;
        let mut parts: Vec<&str> = Vec::new();
        for (on, name) in [
            (f.qkv, "fused_qkv"),
            (f.gate_up, "fused_gate_up"),
            (f.qk_norm_rope, "fused_qk_norm_rope"),
            (f.residual_norm, "fused_residual_norm"),
            (f.norm_matmul, "fused_norm_matmul"),
            (f.qkv_rope_cache, "fused_qkv_rope_cache"),
        ] {
            if on {
                parts.push(name);
            }
        }
        let mut s = if parts.is_empty() { "unfused".to_string() } else { parts.join("+") };
        s.push_str(if self.parallel.qkv { " parallel" } else { " sequential" });
        s.push_str(if self.batch { " batch" } else { " per-kernel-submit" });
        if self.threads > 0 {
            s.push_str(&format!(" {} threads", self.threads));
        }
        if self.spin_us > 0 {
            s.push_str(&format!(" spin {} us", self.spin_us));
        }
        if let Some(p) = self.prefetch {
            s.push_str(&format!(" prefetch {p} B"));
        }
        if self.repack != 0 {
            let names: Vec<_> = self.repack_formats().iter().map(|f| f.name()).collect();
            s.push_str(&format!(" repacked {}", names.join(",")));
        }
        if let Some(k) = self.chain {
            s.push_str(&format!(" chain {k}"));
        }
        s
    }

    /// Decode steps chained per submit (the runtime's default unless raced).
    pub fn decode_chain(&self) -> usize {
        self.chain.unwrap_or(crate::profile::doc::DEFAULT_DECODE_CHAIN) as usize
    }
}

/// What the end-to-end stage found.
pub(crate) struct EndToEnd {
    /// The combinations timed, each with its predicted time (NaN for the default,
    /// which is first).
    pub combos: Vec<(Combo, f64)>,
    /// Per combination: prefill seconds and decode seconds per token (a chained run's mean), one
    /// pair per sample.
    pub samples: Vec<(Vec<f64>, Vec<f64>)>,
    /// The winning combination.
    pub best: usize,
    /// The slot race winners (what a non-default combination selects).
    pub winners: Winners,
    /// A multimodal model's image per request (None: text only, or `--no-vision`).
    pub vision: Option<VisionTimes>,
    /// Per combination: its mean KL divergence from the CPU's f32 reference on
    /// the accuracy prompts (None: it failed before), and why the budget refused it.
    pub kld: Vec<Option<f64>>,
    pub refused: Vec<Option<String>>,
    /// The accuracy budget the combinations met ([`kld_budget`]).
    pub max_kld: f64,
    /// The layers timed and the model's, when the stage ran on its first layers
    /// (a build of the whole model did not fit the budget).
    pub timed_layers: Option<(usize, usize)>,
}

/// The accuracy budget over the runtime default's own divergence, without `--max-kld`.
pub const KLD_BUDGET_FACTOR: f64 = 1.25;
/// The least default budget (nats): a default at the f32 reference's own
/// rounding (a GPU's f32 path, ~1e-6) leaves room for other kernels' rounding.
pub const KLD_FLOOR: f64 = 1e-4;
/// The accuracy prompts: this many, of at most [`KLD_PROMPT_TOKENS`] tokens each.
const KLD_PROMPTS: usize = 2;
const KLD_PROMPT_TOKENS: usize = 32;

/// The accuracy budget: `--max-kld`, else the default combination's divergence
/// × [`KLD_BUDGET_FACTOR`], at least [`KLD_FLOOR`].
pub fn kld_budget(max_kld: Option<f64>, default_kld: Option<f64>) -> f64 {
    max_kld.unwrap_or_else(|| default_kld.map_or(KLD_FLOOR, |d| (d * KLD_BUDGET_FACTOR).max(KLD_FLOOR)))
}

impl EndToEnd {
    /// The kernel selection of combination `c`.
    pub fn selection(&self, c: &Combo, caps: &DeviceCaps) -> Selection {
        selection_for(c, caps, &self.winners)
    }
}

fn selection_for(c: &Combo, caps: &DeviceCaps, winners: &Winners) -> Selection {
    let mut sel = Selection::runtime(caps.clone());
    if !c.default {
        sel.slots = winners.slots.clone();
        sel.formats = winners.formats.clone();
    }
    sel
}

/// One end-to-end sample: prefill of the prompt from an empty cache, then
/// `steps` greedy decode steps chained `k` a submit on a GPU (the sampler's
/// argmax taken there, [`Engine::decode_chain`]); (prefill seconds, seconds per
/// decoded token). The engine's first decode step, which compiles the decode
/// schedule, runs alone and is not timed.
pub fn e2e_sample(engine: &mut Engine, prompt: &[u32], steps: usize, k: usize) -> Result<(f64, f64), RuntimeError> {
    engine.reset();
    let t0 = Instant::now();
    let rows = engine.forward(prompt)?;
    let prefill = t0.elapsed().as_secs_f64();
    let mut next = argmax(rows.last().map(Vec::as_slice).unwrap_or(&[]));
    let mut greedy = Sampler::new(SamplerParams::GREEDY);
    if !engine.decode_compiled() {
        engine.decode_chain(next, 1, 1, &mut greedy, |id| {
            next = id;
            true
        })?;
    }
    let t = Instant::now();
    let n = engine.decode_chain(next, steps, k, &mut greedy, |_| true)?;
    Ok((prefill, t.elapsed().as_secs_f64() / n.max(1) as f64))
}

/// Decode steps of an end-to-end sample with chains of `k`: [`E2E_DECODE_STEPS`],
/// or two chains when longer, so a chain's overlap with the next is timed.
pub(crate) fn sample_steps(k: usize) -> usize {
    E2E_DECODE_STEPS.max(2 * k)
}

/// Predicted time of one request per fusion choice (from the per-shape medians
/// of the race winners), fastest first.
fn predicted(o: &TuneOptions, space: &Space, races: &Races) -> Vec<(Fusion, f64)> {
    let mut predicted: Vec<(Fusion, f64)> = space
        .per_fusion
        .iter()
        .map(|(f, steps)| {
            let mut tot = 0.0;
            for (key, p, _) in steps {
                let w = if key.1 == Regime::Decode { o.decode_tokens as f64 } else { 1.0 };
                tot += w * races.shape_time(space, *key, p);
            }
            (*f, tot)
        })
        .collect();
    predicted.sort_by(|a, b| a.1.total_cmp(&b.1));
    predicted
}

/// The combinations to time, each with its predicted time: the runtime's own
/// default (what `run` does without a profile) first, since it is raced alongside
/// and wins ties (a profile is only worth its differences); then the best
/// predicted fusion choices with the execution flags the strategy tries.
fn combinations(o: &TuneOptions, predicted: &[(Fusion, f64)], gpu: bool) -> Vec<(Combo, f64)> {
    combinations_with_threads(o, predicted, gpu, crate::kernels::cpu::pool::pool().capacity())
}

/// [`combinations`] on a CPU of `cpus` threads: the best predicted combination
/// also on fewer threads (powers of two below `cpus`, and `cpus - 1`), since a
/// small model's kernels may run faster on fewer cores than they pay to share.
fn combinations_with_threads(o: &TuneOptions, predicted: &[(Fusion, f64)], gpu: bool, cpus: usize) -> Vec<(Combo, f64)> {
    let mut combos: Vec<(Combo, f64)> = vec![(Combo { default: true, ..Combo::raced(Fusion::ALL, Parallel::default(), true) }, f64::NAN)];
    let par_on = Parallel::default();
    let par_off = Parallel { qkv: false, ffn: false };
    let exhaustive_e2e = matches!(o.strategy, Strategy::Exhaustive | Strategy::Halving);
    let top = if exhaustive_e2e { predicted.len() } else { 3.min(predicted.len()) };
    for (f, pred) in predicted.iter().take(top) {
        combos.push((Combo::raced(*f, par_on, true), *pred));
        if exhaustive_e2e {
            combos.push((Combo::raced(*f, par_off, true), *pred));
            // A submit per kernel (`batchCommands: false`) changes the prefill
            // passes alone: decode chains are one submit whatever the flag says
            // (`GpuExec::batch`), so it is not raced for decode.
            if gpu {
                combos.push((Combo::raced(*f, par_on, false), *pred));
                combos.push((Combo::raced(*f, par_off, false), *pred));
            }
        }
    }
    // The raced kernels with every fusion this model has, as the runtime's default
    // fuses: the races time kernels on warm caches, where a fusion that saves a
    // pass over the activations or a second norm looks worth less than it is.
    if !exhaustive_e2e
        && let Some((f, pred)) = predicted.iter().max_by_key(|(f, _)| fused_count(*f))
        && !predicted.iter().take(top).any(|(g, _)| g == f)
    {
        combos.push((Combo::raced(*f, par_on, true), *pred));
    }
    if !exhaustive_e2e && let Some((f, pred)) = predicted.first() {
        combos.push((Combo::raced(*f, par_off, true), *pred));
        // Per-kernel submits: the prefill's alone (decode chains ignore it).
        if gpu {
            combos.push((Combo::raced(*f, par_on, false), *pred));
        }
    }
    // How many decode steps a submit chains: fewer waits on the host against
    // steps past a stop run for nothing.
    if gpu && let Some((f, pred)) = predicted.first() {
        for k in CHAIN_CHOICES {
            combos.push((Combo { chain: Some(k), ..Combo::raced(*f, par_on, true) }, *pred));
        }
    }
    if !gpu && let Some((f, pred)) = predicted.first() {
        let mut counts: Vec<usize> = (0..).map(|i| 1usize << i).take_while(|&n| n < cpus).collect();
        if cpus > 2 {
            counts.push(cpus - 1);
        }
        counts.dedup();
        for n in counts {
            combos.push((Combo { threads: n, ..Combo::raced(*f, par_on, true) }, *pred));
        }
        // How long idle workers spin between kernels before parking: shorter
        // frees the cores sooner, longer never pays a wake-up inside a pass.
        for spin_us in SPIN_CHOICES_US {
            combos.push((Combo { spin_us, ..Combo::raced(*f, par_on, true) }, *pred));
        }
        // How far ahead the decode dots prefetch the weight rows they stream:
        // what hides the memory latency best depends on the memory system.
        for p in PREFETCH_CHOICES {
            combos.push((Combo { prefetch: Some(p), ..Combo::raced(*f, par_on, true) }, *pred));
        }
        // The repacked weight layouts, per format the model has matrices of (a
        // layout can win on one format's dots and lose on another's), and all of
        // them together where there are several.
        let dtypes: Vec<_> = std::iter::once(o.weight_dtype).chain(o.matrix_formats.values().copied()).collect();
        for repack in repack_choices(&dtypes) {
            combos.push((Combo { repack, ..Combo::raced(*f, par_on, true) }, *pred));
        }
    }
    combos
}

/// The repack sets the end-to-end stage races: one per format of
/// [`crate::kernels::quant::REPACKABLE`] the model's matrices come in (`dtypes`:
/// its weight type and those of the matrices stored otherwise), as [`Combo::repack`]
/// bits, then all of those together where there are two or more.
pub(crate) fn repack_choices(dtypes: &[crate::kernels::DType]) -> Vec<u8> {
    let formats: Vec<_> = dtypes.iter().filter_map(|d| d.quant()).collect();
    let mut out: Vec<u8> = crate::kernels::quant::REPACKABLE.iter().filter(|f| formats.contains(f)).map(|f| repack_bits(&[*f])).collect();
    if out.len() > 1 {
        out.push(repack_bits(&formats));
    }
    out
}

/// [`Combo::repack`] bits of `formats` (the inverse of [`Combo::repack_formats`]).
fn repack_bits(formats: &[crate::kernels::quant::QFormat]) -> u8 {
    crate::kernels::quant::REPACKABLE.iter().enumerate().filter(|(_, f)| formats.contains(f)).fold(0, |bits, (j, _)| bits | (1 << j))
}

/// One request's time per sample: prefill, `decode_tokens` × the per-token decode
/// and `image_s` (a multimodal model's one image through the default vision
/// kernels, the same for every combination; 0 for a text-only model): the
/// end-to-end score.
fn request_times((prefill, decode): &(Vec<f64>, Vec<f64>), decode_tokens: usize, image_s: f64) -> Vec<f64> {
    prefill.iter().zip(decode).map(|(p, d)| p + decode_tokens as f64 * d + image_s).collect()
}

/// How many fusions `f` turns on.
fn fused_count(f: Fusion) -> usize {
    [f.qkv, f.gate_up, f.qk_norm_rope, f.residual_norm, f.norm_matmul, f.qkv_rope_cache].iter().filter(|&&on| on).count()
}

/// A relative gain a combination must show over the runtime's default, as the
/// median of their per-round ratios, to be chosen instead of it (a profile is only
/// worth its differences, and on a shared or throttling machine a run of lucky
/// rounds is worth less than that).
const DEFAULT_MARGIN: f64 = 0.02;

/// The combination to keep when every round timed each one once (interleaved):
/// each one's per-round ratios to the default (index 0; a machine-wide slowdown
/// during one round cancels). A combination qualifies when it was faster than the
/// default in every round it shared with it (at least two; under no difference
/// that happens by chance with odds 1 in 2^rounds) and its median ratio beats
/// the default by [`DEFAULT_MARGIN`]; the lowest median ratio among those wins,
/// else the default stays. None when the default has no samples (the caller then
/// compares medians).
fn pick_paired(scores: &[Vec<f64>]) -> Option<usize> {
    let base = scores.first().filter(|s| !s.is_empty())?;
    let ratio = |s: &Vec<f64>| -> Option<f64> {
        let r: Vec<f64> = s.iter().zip(base).map(|(a, b)| a / b).collect();
        (r.len() >= 2 && r.iter().all(|&x| x < 1.0)).then(|| summarize(&r).median).filter(|&m| m < 1.0 - DEFAULT_MARGIN)
    };
    let best = (1..scores.len()).filter_map(|i| ratio(&scores[i]).map(|m| (i, m))).min_by(|a, b| a.1.total_cmp(&b.1));
    Some(best.map_or(0, |(i, _)| i))
}

/// Whether the raced vision winners (`tuned`, seconds per image per round) stay
/// against the runtime's default vision kernels (`default`, the same rounds): by
/// the rule a combination meets against the default ([`pick_paired`]: faster in
/// every shared round, at least two, and a median gain of [`DEFAULT_MARGIN`]),
/// with the reason.
fn vision_verdict(tuned: &[f64], default: &[f64]) -> (bool, String) {
    let n = tuned.len().min(default.len());
    if n < 2 {
        return (false, format!("{n} round(s) timed, two are needed: the runtime's default vision kernels stay"));
    }
    let ratios: Vec<f64> = tuned.iter().zip(default).map(|(t, d)| t / d).collect();
    let median = summarize(&ratios).median;
    let gain = (1.0 - median) * 100.0;
    if pick_paired(&[default[..n].to_vec(), tuned[..n].to_vec()]) == Some(1) {
        return (true, format!("faster than the runtime's default vision kernels in all {n} rounds, by {gain:.1}% (median)"));
    }
    let slower = ratios.iter().filter(|&&r| r >= 1.0).count();
    let why = if slower > 0 {
        format!("not faster in {slower} of {n} rounds")
    } else {
        format!("a median gain of {gain:.1}% is under the {:.0}% margin", DEFAULT_MARGIN * 100.0)
    };
    (false, format!("the raced vision kernels did not beat the runtime's defaults end to end ({why}): the defaults stay"))
}

/// Times one image (synthetic, at the tower's input size) through the vision
/// tower and projector on the tune's device, with the raced vision winners and
/// with the runtime's defaults: each choice run once first (GPU pipelines
/// compiled), then interleaved rounds alternating which goes first, two always and
/// up to five while another fits before `deadline`.
fn time_vision(
    t: &Target<'_>,
    vision: &crate::model::VisionConfig,
    caps: &DeviceCaps,
    winners: &Winners,
    estimate: Option<f64>,
    deadline: Instant,
    progress: &dyn Progress,
) -> Result<VisionTimes, TuneError> {
    let weights = t.vision_weights.as_ref().ok_or_else(|| TuneError::Invalid("the vision tower's weights were not given".into()))?;
    // Two warm-up encodes and two rounds of both choices at least: a full-size
    // tower on a slow device (SigLIP's 4096 patches: half a minute an image on a
    // 2-core CPU) would take minutes past the budget, so the comparison runs
    // only where the races' own times say it fits; otherwise the raced winners
    // stay as the races chose them, and the request's image is the estimate.
    if let Some(est) = estimate
        && 6.0 * est > deadline.saturating_duration_since(Instant::now()).as_secs_f64().max(MIN_IMAGE_SHARE_S)
    {
        let why = format!(
            "not timed end to end: one image takes about {est:.1} s here (the vision races' winners), and the comparison's \
             6 encodes would pass this stage's share of the budget; the raced winners stay (a larger --budget times it)"
        );
        progress.note(&format!("end to end, one image per request: {why}"));
        return Ok(VisionTimes { image_size: vision.image_size, tuned: vec![est], default: Vec::new(), kept: true, reason: why });
    }
    let pixels = synthetic_image(vision.image_size);
    let default = Selection::runtime(caps.clone());
    let tuned = Selection { slots: winners.slots.clone(), ..Selection::runtime(caps.clone()) };
    let mut tower = Tower::new(vision, weights, t.ctx.clone())?;
    tower.select(&default)?;
    tower.encode(&pixels)?;
    let default_kernels = tower.kernels()?;
    // Raced winners the tower refuses leave the defaults (noted).
    let mut tuned_ok = match tower.select(&tuned).and_then(|_| tower.encode(&pixels).map(|_| ())) {
        Ok(()) => true,
        Err(e) => {
            progress.note(&format!("the raced vision kernels failed on the tower: {e}"));
            false
        }
    };
    let same = tuned_ok && tower.kernels()? == default_kernels;
    let rounds = 5;
    progress.phase("end to end: one image through the vision tower, raced kernels against the default", rounds as u64);
    let (mut ts, mut ds) = (Vec::new(), Vec::new());
    let mut round_time = Duration::ZERO;
    for round in 0..rounds {
        if round >= 2 && Instant::now() + round_time > deadline {
            break;
        }
        let start = Instant::now();
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for is_tuned in order {
            if is_tuned && tuned_ok {
                match tower.sample(&tuned, &pixels) {
                    Ok(s) => ts.push(s),
                    Err(e) => {
                        progress.note(&format!("the raced vision kernels failed on the tower: {e}"));
                        tuned_ok = false;
                    }
                }
            } else if !is_tuned {
                ds.push(tower.sample(&default, &pixels)?);
            }
        }
        round_time = start.elapsed();
        progress.tick();
    }
    progress.done();
    let (kept, reason) = if !tuned_ok {
        (false, "the raced vision kernels failed on the tower: the runtime's defaults stay".to_string())
    } else if same {
        (false, "the raced vision winners are the runtime's default kernels: nothing to keep".to_string())
    } else {
        vision_verdict(&ts, &ds)
    };
    Ok(VisionTimes { image_size: vision.image_size, tuned: ts, default: ds, kept, reason })
}

/// Below this share of the budget (seconds) the image comparison still runs when
/// it fits in it (a tiny tower's image takes milliseconds).
const MIN_IMAGE_SHARE_S: f64 = 2.0;

/// One image's time through the tower and projector, estimated from the vision
/// races: each vision slot's winner median (a sample is one image's executions
/// of the slot's shapes), a slot not raced at the best rate (flop/s) any race's
/// winner reached here. None when no vision race was timed and no rate is known.
fn estimated_image_s(space: &Space, races: &Races) -> Option<f64> {
    let (mut rate, mut known, mut unknown_flops, mut any) = (0.0f64, 0.0, 0.0, false);
    for (r, res) in space.races.iter().zip(&races.results) {
        let flops: f64 = r.shapes.iter().map(|(p, n)| p.flops() * *n as f64).sum();
        let median = res.cands.get(res.winner).map(|c| c.stats.median).filter(|m| m.is_finite() && *m > 0.0);
        if let Some(m) = median
            && flops > 0.0
        {
            rate = rate.max(flops / m);
        }
        if r.key.1 == crate::plan::Regime::Vision {
            any = true;
            match median {
                Some(m) => known += m,
                None => unknown_flops += flops,
            }
        }
    }
    if !any || (unknown_flops > 0.0 && rate <= 0.0) {
        return None;
    }
    Some(known + if unknown_flops > 0.0 { unknown_flops / rate } else { 0.0 })
}

/// Times the combinations until `deadline` and picks the best.
pub(crate) fn run(
    t: &Target<'_>,
    o: &TuneOptions,
    caps: &DeviceCaps,
    space: &Space,
    races: &Races,
    budget: &Budget,
    progress: &dyn Progress,
) -> Result<EndToEnd, TuneError> {
    let deadline = budget.deadline();
    let winners = races.winners(space, &o.extra_formats());
    // A multimodal model's image first, within a quarter of what is left; its
    // default time joins every combination's request time.
    let vision = match &o.vision {
        Some(v) => {
            let (since, end) = (Instant::now(), budget.share(0.25));
            let times = time_vision(t, v, caps, &winners, estimated_image_s(space, races), end, progress)?;
            budget.record("end to end: one image", since);
            Some(times)
        }
        None => None,
    };
    if let Some(v) = vision.as_ref().filter(|v| !v.default.is_empty()) {
        progress.note(&format!(
            "end to end, one image per request: {:.3} ms raced vision kernels, {:.3} ms default (medians); {}",
            summarize(&v.tuned).median * 1e3,
            summarize(&v.default).median * 1e3,
            v.reason
        ));
    }
    // The default's median, or the races' estimate where the image was not timed.
    let image_s = vision.as_ref().map_or(0.0, |v| summarize(if v.default.is_empty() { &v.tuned } else { &v.default }).median);
    let predicted = predicted(o, space, races);
    let gpu = t.ctx.is_some();
    let mut combos = combinations(o, &predicted, gpu);
    if !gpu {
        // The runtime default repacks what `run` without a profile does.
        let dtypes = std::iter::once(o.weight_dtype).chain(o.matrix_formats.values().copied());
        combos[0].0.repack = repack_bits(&crate::plan::default_cpu_repack(t.config, dtypes));
    }

    let prompt: Vec<u32> = (0..o.prefill_tokens).map(|i| ((i * 7919 + 13) % t.config.vocab_size) as u32).collect();
    let timing_end = budget.share(TIMING_SHARE);
    // Every engine of the stage loads (quantizes, converts) the model's weights
    // once between them: the block formats and the float types the plan stores.
    let floats: Vec<_> = std::iter::once(o.weight_dtype).chain(o.matrix_formats.values().copied()).filter(|d| !d.is_quant()).collect();
    let once = Arc::new(LoadOnce::new(t.store.clone(), &floats));
    let store: Arc<dyn TensorStore> = once.clone();
    let t = &Target { store, ctx: t.ctx.clone(), vision_weights: t.vision_weights.clone(), ..*t };
    let TimedModel { config, weight_bytes, reference } = timed_model(t, o, caps, Budget::until(timing_end), budget)?;
    let timed_layers = (config.num_layers < t.config.num_layers).then_some((config.num_layers, t.config.num_layers));
    let t = &Target { config: &config, store: t.store.clone(), ctx: t.ctx.clone(), vision_weights: t.vision_weights.clone(), ..*t };
    // CPU engines share their weights (a WeightMemo): the fused layouts (QKV, gate/up)
    // add at most one more copy of those matrices.
    let builder = || Engines {
        model: t.model,
        config: t.config,
        store: t.store.clone(),
        ctx: t.ctx.clone(),
        memo: Some(WeightMemo::default()),
        check_decode: true,
    };
    let options_for = |c: &Combo| -> PlanOptions {
        let mut opts = plan_options(o, c.fusion, c.parallel);
        // The prompt, the untimed first decode step and the timed ones.
        opts.context = opts.context.max(o.prefill_tokens + 1 + sample_steps(c.decode_chain()));
        if c.repack != 0 {
            opts.cpu_repack = c.repack_formats();
        }
        opts
    };
    let build_with = |b: &Engines<'_>, c: &Combo| -> Result<Engine, RuntimeError> {
        b.build(options_for(c), selection_for(c, caps, &winners), &c.exec(o, gpu))
    };
    let shared = builder();
    let build_engine = |c: &Combo| build_with(&shared, c);
    let interleave = !gpu && weight_bytes.saturating_mul(2) < crate::session::available_memory() / 5 * 2;
    let timing_start = Instant::now();
    // The plan of the timing from the default's own build and first sample: as
    // many combinations (the default and the best predicted first; the default
    // alone when a second does not fit) and decode steps as fit what is left of
    // the stage's share.
    let loaded_before = once.fresh_seconds();
    let mut first = Some(build_engine(&combos[0].0));
    let build_s = timing_start.elapsed().as_secs_f64();
    // A later build copies, concatenates or repacks what the first loaded: until
    // one is measured, what the first spent on anything but loading, half again
    // (a concatenation copies twice).
    let loading_s = once.fresh_seconds() - loaded_before;
    let mut later = LaterBuild { s: 1.5 * (build_s - loading_s).max(0.1 * build_s), measured: false };
    let mut steps_cap = usize::MAX;
    let mut sample_s = 0.0;
    if let Some(Ok(e)) = first.as_mut() {
        let k = combos[0].0.decode_chain();
        let t0 = Instant::now();
        if let Ok((p, d)) = e2e_sample(e, &prompt, sample_steps(k), k) {
            sample_s = t0.elapsed().as_secs_f64();
            // Two combinations of two rounds: one more build and four samples.
            let per_sample = (Budget::until(timing_end) - later.s) / 4.0;
            if per_sample < sample_s && d > 0.0 {
                let steps = (((per_sample - p) / d).floor().max(0.0) as usize).max(MIN_SAMPLE_STEPS);
                if steps < sample_steps(k) {
                    steps_cap = steps;
                    sample_s = p + steps as f64 * d;
                    budget.cut(format!("end to end: {steps} decode steps a sample instead of {}", sample_steps(k)));
                }
            }
        }
    }
    let steps_for = |c: &Combo| sample_steps(c.decode_chain()).min(steps_cap);
    // The timing runs past its share into what the stages after it would not use:
    // for `n` timed combinations and a later build of `later` seconds, the
    // accuracy check (the reference's build with half to spare, then each
    // combination a build and two evaluations, about two samples) and,
    // interleaved, the head to head (two builds and its rounds).
    // The reference's build: at least what the default's spent outside loading
    // (most of it the kernel finding fresh pages) scaled by their bytes.
    let reference_est = match reference {
        Some((bytes, rate)) => (BUILD_OVERHEAD * bytes / rate).max((build_s - loading_s) * bytes / weight_bytes.max(1) as f64),
        None => 2.0 * build_s,
    };
    let share_end = timing_end;
    // The head to head: two builds and its rounds (interleaved timing only).
    let confirm_cost = move |later: f64| if interleave { 2.0 * later + 2.0 * CONFIRM_ROUNDS as f64 * sample_s } else { 0.0 };
    let timing_end_for = move |n: usize, later: f64| -> Instant {
        let after = 1.5 * reference_est + n as f64 * (later + 2.0 * sample_s) + confirm_cost(later);
        deadline.checked_sub(Duration::from_secs_f64(after)).map_or(share_end, |end| end.max(share_end))
    };
    progress.note(&format!(
        "end to end: the default built in {build_s:.1} s ({loading_s:.1} s of it loading the weights), a sample {sample_s:.2} s; estimated: a later build {:.1} s, the accuracy check's f32 reference {reference_est:.1} s",
        later.s
    ));
    let all = combos.len();
    let cut_to = |n: usize| match n {
        1 => format!("end to end: 1 of {all} combinations, the runtime default alone (a second build and its samples do not fit)"),
        _ => format!("end to end: {n} of {all} combinations (the default and the best predicted first)"),
    };
    if !interleave {
        // One engine at a time, each a later build and its samples.
        let each = later.s + 2.0 * sample_s;
        let n = (1..=all).rev().find(|&n| (n - 1) as f64 * each <= Budget::until(timing_end_for(n, later.s))).unwrap_or(1);
        if n < all {
            combos.truncate(n);
            budget.cut(cut_to(n));
        }
    }
    progress
        .phase(&format!("end to end: {} combinations{}", combos.len(), if interleave { ", interleaved" } else { "" }), combos.len() as u64);
    let e2e_rounds = 5;
    // Two rounds at least to compare combinations; the default alone is compared
    // with nothing, and one round records its speed.
    let min_rounds = |n: usize| if n > 1 { 2 } else { 1 };
    let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); combos.len()];
    let mut errors: Vec<Option<String>> = vec![None; combos.len()];
    let mut rng_state = o.seed;
    if interleave {
        let mut engines: Vec<Option<Engine>> = Vec::new();
        // The default always; each other combination while its build and two
        // rounds of every built one's samples fit.
        for (i, (c, _)) in combos.iter().enumerate() {
            if i > 0 && Budget::until(timing_end_for(i + 1, later.s)) < later.s + 2.0 * (i + 1) as f64 * sample_s {
                break;
            }
            let t0 = Instant::now();
            match first.take().unwrap_or_else(|| build_engine(c)) {
                Ok(e) => engines.push(Some(e)),
                Err(e) => {
                    errors[i] = Some(e.to_string());
                    engines.push(None);
                }
            }
            if i > 0 {
                later.note(t0);
            }
            progress.tick();
        }
        let n = engines.len();
        if n < all {
            combos.truncate(n);
            samples.truncate(n);
            errors.truncate(n);
            budget.cut(cut_to(n));
        }
        let mut round_time = Duration::ZERO;
        for round in 0..e2e_rounds {
            // The minimum rounds always; more only while another fits in the budget.
            if round >= min_rounds(combos.len()) && Instant::now() + round_time > timing_end_for(combos.len(), later.s) {
                break;
            }
            let round_start = Instant::now();
            // A fixed pseudo-random rotation per round.
            rng_state = rng_state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let off = (rng_state >> 33) as usize % combos.len().max(1);
            for j in 0..combos.len() {
                let i = (j + off) % combos.len();
                if let Some(e) = engines[i].as_mut() {
                    match e2e_sample(e, &prompt, steps_for(&combos[i].0), combos[i].0.decode_chain()) {
                        Ok((p, d)) => {
                            samples[i].0.push(p);
                            samples[i].1.push(d);
                        }
                        Err(err) => {
                            errors[i] = Some(err.to_string());
                            engines[i] = None;
                        }
                    }
                }
            }
            round_time = round_start.elapsed();
            // Racing (auto): after three rounds, a combination every sample of which is
            // slower than every sample of the current leader stops being timed; its
            // samples stay for the report. Exhaustive and halving time all to the end.
            if o.strategy == Strategy::Auto && round >= 2 {
                let score = |i: usize| request_times(&samples[i], o.decode_tokens, image_s);
                let alive: Vec<usize> = (0..combos.len()).filter(|&i| engines[i].is_some()).collect();
                let lead = alive.iter().copied().min_by(|&a, &b| summarize(&score(a)).median.total_cmp(&summarize(&score(b)).median));
                if let Some(lead) = lead {
                    let lead_max = score(lead).iter().copied().fold(f64::MIN, f64::max);
                    for &i in &alive {
                        if i != lead && score(i).iter().copied().fold(f64::MAX, f64::min) > lead_max {
                            engines[i] = None;
                        }
                    }
                }
                if engines.iter().filter(|e| e.is_some()).count() <= 1 {
                    break;
                }
            }
        }
    } else {
        // One engine at a time (the model is too large to hold several copies).
        let mut combo_time = Duration::ZERO;
        let mut skipped = 0;
        for (i, (c, _)) in combos.iter().enumerate() {
            // The default and the best predicted combination always; the rest while
            // one more fits in the budget.
            if i > 1 && Instant::now() + combo_time > timing_end_for(combos.len(), later.s) {
                errors[i] = Some(NOT_TIMED.into());
                skipped += 1;
                continue;
            }
            let combo_start = Instant::now();
            match first.take().unwrap_or_else(|| build_engine(c)) {
                Ok(mut e) => {
                    if i > 0 {
                        later.note(combo_start);
                    }
                    let mut sample_time = Duration::ZERO;
                    for round in 0..e2e_rounds {
                        if round >= min_rounds(combos.len()) && Instant::now() + sample_time > timing_end_for(combos.len(), later.s) {
                            break;
                        }
                        let t0 = Instant::now();
                        match e2e_sample(&mut e, &prompt, steps_for(c), c.decode_chain()) {
                            Ok((p, d)) => {
                                samples[i].0.push(p);
                                samples[i].1.push(d);
                            }
                            Err(err) => {
                                errors[i] = Some(err.to_string());
                                break;
                            }
                        }
                        sample_time = t0.elapsed();
                    }
                }
                Err(e) => errors[i] = Some(e.to_string()),
            }
            // Its engine is gone: its weights too (the memo would keep every
            // combination's layouts alive).
            if let Some(m) = &shared.memo {
                m.clear();
            }
            combo_time = combo_time.max(combo_start.elapsed());
            progress.tick();
        }
        if skipped > 0 {
            budget.cut(format!("end to end: {} of {} combinations timed", combos.len() - skipped, combos.len()));
        }
    }
    progress.done();
    // The timed engines' weights go before the accuracy check builds its own (the
    // f32 reference of Gemma 3 1B built in 11 s beside them, most of it the kernel
    // finding fresh pages, against 3 s for the default's build).
    drop(first);
    drop(shared);
    budget.record("end to end: timing", timing_start);
    if let Some(lost) = t.ctx.as_ref().and_then(|c| c.lost()) {
        return Err(lost.into());
    }
    for (i, e) in errors.iter().enumerate() {
        if let Some(e) = e.as_ref().filter(|e| *e != NOT_TIMED) {
            progress.note(&format!("combination `{}` failed end to end: {e}", combos[i].0.label()));
        }
    }

    // The accuracy budget: each combination that ran against the CPU's f32
    // reference on fixed prompts; one above the budget is out of the choice.
    // Scored in the order of their timing, the default first, then the fastest,
    // while one more fits the accuracy check's share. A faster one not scored is
    // out of the choice.
    let accuracy_start = Instant::now();
    let median = |i: usize| summarize(&request_times(&samples[i], o.decode_tokens, image_s)).median;
    let mut order: Vec<usize> = (1..combos.len()).filter(|&i| errors[i].is_none() && !samples[i].0.is_empty()).collect();
    order.sort_by(|&a, &b| median(a).total_cmp(&median(b)));
    order.insert(0, 0);
    let faster = if errors[0].is_none() { order.iter().filter(|&&i| i > 0 && median(i) < median(0)).count() } else { order.len() - 1 };
    let setup = |c: &Combo| (options_for(c), selection_for(c, caps, &winners));
    // The check runs past its share into what the head to head would not use.
    let confirm_from = deadline.checked_sub(Duration::from_secs_f64(confirm_cost(later.s))).unwrap_or(deadline);
    let rebuild_s = later.s;
    let which = Scoring { order: &order, end: budget.share(ACCURACY_SHARE).max(confirm_from), rebuild_s };
    // The check (the f32 reference's build, then a combination's build and the
    // two evaluations each) runs only when the reference, with half its estimate
    // to spare, and the default's engine fit; a faster combination left unscored
    // leaves the default.
    let kld = if Budget::until(which.end) < 1.5 * reference_est + rebuild_s + 2.0 * sample_s {
        vec![None; combos.len()]
    } else {
        divergences(t, o, &combos, &errors, &which, &setup, progress)?
    };
    budget.record("end to end: accuracy", accuracy_start);
    let unscored = order.iter().filter(|&&i| kld[i].is_none()).count();
    if unscored > 0 {
        budget.cut(format!(
            "accuracy: {} of {} combinations scored ({faster} timed faster than the default)",
            order.len() - unscored,
            order.len()
        ));
    }
    let max_kld = kld_budget(o.max_kld, kld[0]);
    let refused: Vec<Option<String>> = (0..combos.len())
        .map(|i| match kld[i] {
            None if i > 0 && order[1..=faster].contains(&i) => Some("not scored for accuracy within the budget".into()),
            Some(k) if i > 0 && k > max_kld => Some(format!(
                "KL divergence {k:.3e} from the f32 reference is over the budget {max_kld:.3e} ({})",
                if o.max_kld.is_some() {
                    "--max-kld".to_string()
                } else {
                    format!("the runtime default's {:.3e} × {KLD_BUDGET_FACTOR}, at least {KLD_FLOOR:e}", kld[0].unwrap_or(0.0))
                }
            )),
            _ => None,
        })
        .collect();
    for (i, r) in refused.iter().enumerate() {
        if let Some(r) = r {
            progress.note(&format!("combination `{}` refused: {r}", combos[i].0.label()));
        }
    }
    let out = |i: usize| errors[i].is_some() || refused[i].is_some();
    // Each round's request times of the combinations that ran within the budget (none for the others).
    let times: Vec<Vec<f64>> =
        (0..combos.len()).map(|i| if out(i) { Vec::new() } else { request_times(&samples[i], o.decode_tokens, image_s) }).collect();
    let scores: Vec<Stats> = (0..combos.len()).map(|i| if out(i) { Stats::default() } else { summarize(&times[i]) }).collect();
    let paired = if interleave && errors[0].is_none() { pick_paired(&times) } else { None };
    let Some(mut best) = paired.or_else(|| pick(&scores, TIE)) else {
        return Err(TuneError::Invalid("no combination ran end to end; see the notes above".into()));
    };
    // A winner other than the default meets it again head to head: two engines
    // alone (every other engine and weight copy of the stage dropped), alternating
    // first and second, the same rule. The stage's many engines share one process's
    // memory and caches, which can favour one layout over another (a repacked
    // combination won every round of the stage, then lost 20% in `ktune bench`).
    // Its rounds are what fits the rest of the budget after two builds; under two,
    // the gain is not confirmed and the default stays.
    let confirm_rounds = Budget::fit(Budget::until(deadline) - 2.0 * rebuild_s, 2.0 * sample_s, CONFIRM_ROUNDS, 0);
    if best != 0 && interleave && errors[0].is_none() && confirm_rounds < 2 {
        budget
            .cut(format!("head to head: not run; `{}` was not confirmed against the runtime default, which stays", combos[best].0.label()));
        best = 0;
    }
    if best != 0 && interleave && errors[0].is_none() {
        if confirm_rounds < CONFIRM_ROUNDS {
            budget.cut(format!("head to head: {confirm_rounds} of {CONFIRM_ROUNDS} rounds"));
        }
        let confirm_start = Instant::now();
        let fresh = builder();
        if let (Ok(mut d), Ok(mut b)) = (build_with(&fresh, &combos[0].0), build_with(&fresh, &combos[best].0)) {
            progress.phase(&format!("end to end: `{}` against the default, head to head", combos[best].0.label()), confirm_rounds as u64);
            let mut t: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            for round in 0..confirm_rounds {
                for i in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                    let (e, k) = if i == 0 { (&mut d, combos[0].0.decode_chain()) } else { (&mut b, combos[best].0.decode_chain()) };
                    if let Ok((p, dd)) = e2e_sample(e, &prompt, sample_steps(k).min(steps_cap), k) {
                        t[i].push(p + o.decode_tokens as f64 * dd + image_s);
                    }
                }
                progress.tick();
            }
            progress.done();
            if t[0].len() == t[1].len() && pick_paired(&t) != Some(1) {
                progress.note(&format!(
                    "`{}` did not beat the runtime default head to head (request {:.1} vs {:.1} ms, medians): the default stays",
                    combos[best].0.label(),
                    summarize(&t[1]).median * 1e3,
                    summarize(&t[0]).median * 1e3
                ));
                best = 0;
            }
        }
        budget.record("end to end: head to head", confirm_start);
    }
    Ok(EndToEnd { combos, samples, best, winners, vision, kld, refused, max_kld, timed_layers })
}

/// The build of a stage engine over its one-build share of `left_s` seconds: past
/// it, the whole model is not built.
const BUILD_SHARE: f64 = 0.5;
/// The share of the memory available when the stage begins that its engines may
/// hold at once ([`timed_model`]).
const MEMORY_SHARE: f64 = 0.75;
/// Estimated build seconds over the load rate of one layer's largest weight (the
/// rest of a build: the plan, the LM head's layout, repacking, allocation).
const BUILD_OVERHEAD: f64 = 1.3;

/// The model the stage's engines hold and its plan's weight bytes: the whole model
/// when one build of it fits [`BUILD_SHARE`] of the `left_s` seconds the timing
/// has, else its first layers, as many as fit (one at least), said as a cut. A
/// build is estimated from the bytes of its plan's weights at the rate the store
/// loads the first layer's largest weight as an engine loads it (quantized from
/// the model's values, or read) and moves it to huge pages: a 3B model in Q4_K
/// takes ~20 s to build on two cores, two thirds of a 30 s budget before any
/// sample, and Gemma 3 1B in f32 ~10 s, most of it the move to huge pages.
/// Combinations compare as well on fewer layers (each layer runs the same
/// kernels); the tok/s recorded are those layers' (`tuning.end_to_end.timed_layers`).
/// The probe's weight is kept ([`LoadOnce`]: the first build does not load it
/// again), and loaded once more as f32 (where the plan's is not) to estimate the
/// accuracy check's f32 reference.
fn timed_model(t: &Target<'_>, o: &TuneOptions, caps: &DeviceCaps, left_s: f64, budget: &Budget) -> Result<TimedModel, TuneError> {
    // The build's move to huge pages within its share too
    // ([`crate::kernels::memory::collapse_until`]: a fragmented page cache makes it
    // cost more than the load, and a small probe does not see it); the tune lifts
    // the limit when it ends.
    crate::kernels::memory::collapse_until(Some(Instant::now() + Duration::from_secs_f64(BUILD_SHARE * left_s)));
    let opts = plan_options(o, Fusion::NONE, Parallel::default());
    let plan_of = |c: &crate::model::ModelConfig| Plan::new(t.model, c, opts.clone(), Selection::defaults(caps.clone()));
    let whole = plan_of(t.config)?;
    let unplanned = || TimedModel { config: t.config.clone(), weight_bytes: whole.weight_bytes(), reference: None };
    let n = t.config.num_layers;
    if n <= 1 {
        return Ok(unplanned());
    }
    let probe = whole
        .buffers
        .iter()
        .filter(|b| b.role == crate::plan::BufRole::Weight && b.name.starts_with("L0."))
        .filter_map(|b| match &b.source {
            Some(crate::plan::WeightSource::Tensor(name)) => Some((b, name)),
            _ => None,
        })
        .max_by_key(|(b, _)| b.bytes());
    let Some((decl, name)) = probe else { return Ok(unplanned()) };
    let t0 = Instant::now();
    let Ok(loaded) = t.store.load(name, decl.dtype, decl.len) else { return Ok(unplanned()) };
    if t.ctx.is_none() {
        // A CPU engine moves its weights to huge pages (a copy: most of an f32 build).
        loaded.back_with_huge_pages();
    }
    drop(loaded);
    let rate = decl.bytes() as f64 / t0.elapsed().as_secs_f64().max(1e-6);
    // The accuracy check's f32 reference loads the same tensors as f32 (a
    // conversion where the model's are not, no quantization).
    let f32_rate = if decl.dtype == crate::kernels::DType::F32 {
        rate
    } else {
        let t0 = Instant::now();
        match t.store.load(name, crate::kernels::DType::F32, decl.len) {
            Ok(b) => (b.len() * 4) as f64 / t0.elapsed().as_secs_f64().max(1e-6),
            Err(_) => return Ok(unplanned()),
        }
    };
    // Weight bytes of the first `l` layers' plan (`engine`) and f32 reference,
    // from one layer's and the whole model's (the layers are alike).
    let (ref_opts, ref_sel) = crate::eval::f32_reference(opts.clone());
    let ref_of = |c: &crate::model::ModelConfig| Plan::new(t.model, c, ref_opts.clone(), ref_sel.clone());
    let first = t.config.first_layers(1);
    let (one, all) = (plan_of(&first)?.weight_bytes() as f64, whole.weight_bytes() as f64);
    let (ref_one, ref_all) = (ref_of(&first)?.weight_bytes() as f64, ref_of(t.config)?.weight_bytes() as f64);
    let at = |one: f64, all: f64, l: usize| one + (l - 1) as f64 * (all - one) / (n - 1) as f64;
    let build_s = |l: usize| BUILD_OVERHEAD * at(one, all, l) / rate;
    // What the stage holds in memory at once: the accuracy check's f32 reference
    // (on the CPU) and, on the CPU, a scored engine and the kept weights
    // ([`LoadOnce`]) or a second engine.
    let engines = if t.ctx.is_none() { 2.0 } else { 0.0 };
    let held = |l: usize| at(ref_one, ref_all, l) + engines * at(one, all, l);
    let allowed = BUILD_SHARE * left_s;
    let memory = MEMORY_SHARE * crate::session::available_memory() as f64;
    let fits = |l: usize| build_s(l) <= allowed && held(l) <= memory;
    let layers = (1..=n).rev().find(|&l| fits(l)).unwrap_or(1);
    // A build's move to huge pages gets about as long again as its load (past
    // that, the build would starve the other combinations of their share).
    crate::kernels::memory::collapse_until(Some(Instant::now() + Duration::from_secs_f64(allowed.min(2.0 * build_s(layers)))));
    let reference = Some((at(ref_one, ref_all, layers), f32_rate));
    if layers == n {
        return Ok(TimedModel { config: t.config.clone(), weight_bytes: whole.weight_bytes(), reference });
    }
    let mut why = Vec::new();
    if build_s(n) > allowed {
        why.push(format!(
            "a build of the whole model, about {:.0} s at the {:.2} GB/s this device loads its weights, does not fit the stage's {left_s:.0} s",
            build_s(n),
            rate / 1e9
        ));
    }
    if held(n) > memory {
        why.push(format!(
            "the whole model's engines and its f32 reference, {:.1} GB at once, do not fit {:.1} GB of the memory available",
            held(n) / 1e9,
            memory / 1e9
        ));
    }
    budget.cut(format!(
        "end to end: timed on the first {layers} of {n} layers ({}); the tok/s recorded are those layers'",
        why.join("; and ")
    ));
    let cut = t.config.first_layers(layers);
    let weight_bytes = plan_of(&cut)?.weight_bytes();
    Ok(TimedModel { config: cut, weight_bytes, reference })
}

/// A later engine build's estimated seconds: a guess until one is measured, then
/// the slowest measured.
struct LaterBuild {
    s: f64,
    measured: bool,
}

impl LaterBuild {
    fn note(&mut self, since: Instant) {
        let s = since.elapsed().as_secs_f64();
        self.s = if self.measured { self.s.max(s) } else { s };
        self.measured = true;
    }
}

/// What the end-to-end stage's engines hold ([`timed_model`]).
struct TimedModel {
    config: crate::model::ModelConfig,
    /// The plan's weight bytes.
    weight_bytes: u64,
    /// The accuracy check's f32 reference: its plan's weight bytes and the rate
    /// (bytes a second) the store loaded the probe as f32 (None where no probe ran).
    reference: Option<(f64, f64)>,
}

/// Which combinations the accuracy check scores: `order` (indices, the default
/// first), each while one more fits before `end`; a build of one of them takes
/// about `rebuild_s` seconds.
struct Scoring<'a> {
    order: &'a [usize],
    end: Instant,
    rebuild_s: f64,
}

/// Each combination's mean KL divergence from the CPU's f32 reference
/// ([`eval::f32_reference`]) on [`KLD_PROMPTS`] fixed prompts (every position
/// scored but the last), one scoring engine at a time; None for a combination
/// that failed end to end. `setup` gives a combination's plan options (for
/// scoring) and selection.
fn divergences(
    t: &Target<'_>,
    o: &TuneOptions,
    combos: &[(Combo, f64)],
    errors: &[Option<String>],
    which: &Scoring<'_>,
    setup: &dyn Fn(&Combo) -> (PlanOptions, Selection),
    progress: &dyn Progress,
) -> Result<Vec<Option<f64>>, TuneError> {
    let vocab = t.config.vocab_size;
    let len = KLD_PROMPT_TOKENS.min(o.prefill_tokens).max(2);
    let prompts = (0..KLD_PROMPTS).map(|k| (0..len).map(|i| ((i * 7919 + 13 + k * 104_729) % vocab) as u32).collect()).collect();
    let text = Text { ctx: len, first: 0, chunks: prompts };
    let scoring = |opts: PlanOptions| eval::scoring_options(opts, len, vocab);
    let engines = |ctx| Engines {
        model: t.model,
        config: t.config,
        store: t.store.clone(),
        ctx,
        memo: Some(WeightMemo::default()),
        check_decode: false,
    };
    // Unfused: the reference of an f32 model reads the kept weights ([`LoadOnce`])
    // as they are, where a fused Q/K/V and gate/up would copy most of them.
    let (ref_opts, ref_sel) = eval::f32_reference(scoring(plan_options(o, Fusion::NONE, Parallel::default())));
    let ref_start = Instant::now();
    // On the CPU: the pool's defaults.
    let cpu_default = Combo { threads: 0, spin_us: 0, prefetch: None, ..combos[0].0 };
    let mut reference = engines(None).build(ref_opts, ref_sel, &cpu_default.exec(o, false))?;
    let build = engines(t.ctx.clone());
    let mut out = vec![None; combos.len()];
    let Scoring { order, end, rebuild_s } = *which;
    progress.phase("end to end: accuracy against the f32 reference", order.len() as u64);
    // A scored combination costs a later build and the two evaluations: until one
    // is measured, the build and the reference's build again (an f32 evaluation
    // of the prompts costs well under its build); then the slowest measured. The
    // default too is scored only while that fits.
    let mut each = Duration::from_secs_f64(rebuild_s) + ref_start.elapsed();
    let mut measured = false;
    for &i in order {
        if errors[i].is_some() || Instant::now() + each > end {
            continue;
        }
        let t0 = Instant::now();
        let c = &combos[i].0;
        let (opts, sel) = setup(c);
        let mut e = build.build(scoring(opts), sel, &c.exec(o, t.ctx.is_some()))?;
        let o = eval::evaluate(&text, &mut e, Some(Reference::Engine(&mut reference)), None, &Silent)?;
        out[i] = o.divergence.map(|d| d.kld_mean);
        each = if measured { each.max(t0.elapsed()) } else { t0.elapsed() };
        measured = true;
        progress.tick();
    }
    progress.done();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repack set per repackable format present, and all of them together where
    /// there are several; none for a model without such matrices.
    #[test]
    fn repack_races_one_set_per_format_present_and_their_union() {
        use crate::kernels::DType;
        use crate::kernels::quant::QFormat;
        let sets = |d: &[DType]| -> Vec<Vec<QFormat>> {
            repack_choices(d)
                .into_iter()
                .map(|repack| Combo { repack, ..Combo::raced(Fusion::NONE, Parallel::default(), true) }.repack_formats())
                .collect()
        };
        assert!(sets(&[DType::F16, DType::Q6_K]).is_empty());
        assert_eq!(sets(&[DType::Q4_K, DType::Q6_K]), vec![vec![QFormat::Q4_K]]);
        assert_eq!(
            sets(&[DType::Q4_0, DType::Q8_0, DType::Q6_K, DType::Q4_0]),
            vec![vec![QFormat::Q4_0], vec![QFormat::Q8_0], vec![QFormat::Q4_0, QFormat::Q8_0]]
        );
        let c = Combo { repack: repack_choices(&[DType::IQ4_NL, DType::Q4_K])[2], ..Combo::raced(Fusion::NONE, Parallel::default(), true) };
        assert!(c.label().ends_with("repacked q4_k,iq4_nl"), "{}", c.label());
    }

    /// Rounds whose speed swings by ±25% together for every combination: a
    /// combination 10% faster in every round wins, one that merely had its fast
    /// rounds where the default had slow ones does not, nor one slower in a round,
    /// and a gain under the margin leaves the default.
    #[test]
    fn paired_ratios_pick_a_steady_gain_and_keep_the_default_otherwise() {
        let machine = [1.0, 1.25, 0.8, 1.2, 0.75];
        let default: Vec<f64> = machine.to_vec();
        let steady: Vec<f64> = machine.iter().map(|m| 0.9 * m).collect();
        // Lower median than the default's (0.95 < 1.0), but in each round as slow or slower.
        let lucky = vec![1.0, 1.3, 0.95, 1.2, 0.8];
        assert_eq!(pick_paired(&[default.clone(), lucky.clone(), steady.clone()]), Some(2));
        assert_eq!(pick_paired(&[default.clone(), lucky.clone()]), Some(0), "no steady gain: the default stays");
        let slight: Vec<f64> = machine.iter().map(|m| 0.99 * m).collect();
        assert_eq!(pick_paired(&[default.clone(), slight]), Some(0), "1% is within the margin");
        // Faster by 10% in four rounds, slower in one: not a steady gain.
        let mostly: Vec<f64> = machine.iter().enumerate().map(|(i, m)| if i == 2 { 1.05 * m } else { 0.9 * m }).collect();
        assert_eq!(pick_paired(&[default.clone(), mostly]), Some(0), "one round against it");
        // A combination stopped after three rounds is compared over those rounds.
        assert_eq!(pick_paired(&[default, steady[..3].to_vec()]), Some(1));
        assert_eq!(pick_paired(&[Vec::new(), vec![1.0]]), None, "no default samples: medians decide");
    }

    /// The raced vision kernels stay by the paired rule the combinations meet: a
    /// steady 10% gain through ±25% swings of the machine is kept; a lower median
    /// from lucky rounds, a round against them, a gain under the margin or a
    /// single round leaves the defaults, each with its reason.
    /// One image's estimate from the races: every vision slot's winner median
    /// summed, a slot that was not raced at the best rate any winner reached; no
    /// estimate without a vision race, or with an unraced one and no rate.
    #[test]
    fn an_image_is_estimated_from_the_vision_races() {
        use crate::kernels::{DType, Problem};
        use crate::plan::select::Slot;
        use crate::profile::build::{CandRecord, RaceResult};
        use crate::stats::Stats;
        use crate::tuner::space::RaceDef;
        let def =
            |slot: Slot, regime: Regime, p: Problem, n: usize| RaceDef { key: (slot, regime), dtype: DType::F32, shapes: vec![(p, n)] };
        let res = |median: Option<f64>| RaceResult {
            slot: String::new(),
            regime: String::new(),
            problem: String::new(),
            count: 1,
            winner: 0,
            cands: median
                .map(|m| CandRecord {
                    kernel: String::new(),
                    params: Default::default(),
                    stats: Stats { median: m, n: 3, ..Default::default() },
                    status: String::new(),
                })
                .into_iter()
                .collect(),
            rejected: Vec::new(),
            shape_medians: Vec::new(),
            timestamps: false,
            copies: Vec::new(),
        };
        let gemm = Problem::Gemm { m: 100, n: 100, k: 100 }; // 2 MFLOP
        let lin = Problem::Linear { m: 100, n: 100, k: 100, gelu: false }; // 2 MFLOP
        let space =
            |races: Vec<RaceDef>| Space { races, per_fusion: Vec::new(), variants: 0, ruled_out: Default::default(), combinations: 0.0 };
        let text = || def(Slot::MatmulGateUp, Regime::Prefill, gemm.clone(), 1);
        let mlp = def(Slot::VisionMlp, Regime::Vision, lin.clone(), 3);
        let norm = def(Slot::VisionNorm, Regime::Vision, Problem::LayerNorm { rows: 100, dim: 100, eps: 1e-6 }, 2);
        // Both vision slots raced: their medians summed (the text race is not in an image).
        let s = space(vec![text(), mlp, norm]);
        let r = Races { results: vec![res(Some(1e-3)), res(Some(2e-3)), res(Some(5e-4))], resumed: 0 };
        assert!((estimated_image_s(&s, &r).expect("an estimate") - 2.5e-3).abs() < 1e-12);
        // The MLP not raced: its 6 MFLOP at the best rate, the text race's 2 GFLOP/s.
        let r = Races { results: vec![res(Some(1e-3)), res(None), res(Some(5e-4))], resumed: 0 };
        let want = 3.0 * lin.flops() / (gemm.flops() / 1e-3) + 5e-4;
        assert!((estimated_image_s(&s, &r).expect("an estimate") - want).abs() < 1e-12, "{want}");
        // Nothing timed at all, or no vision race: no estimate.
        let r = Races { results: vec![res(None), res(None), res(None)], resumed: 0 };
        assert_eq!(estimated_image_s(&s, &r), None);
        assert_eq!(estimated_image_s(&space(vec![text()]), &Races { results: vec![res(Some(1e-3))], resumed: 0 }), None);
    }

    #[test]
    fn vision_winners_are_kept_only_on_a_steady_gain_over_the_default() {
        let machine = [1.0, 1.25, 0.8, 1.2, 0.75];
        let default: Vec<f64> = machine.iter().map(|m| 0.02 * m).collect();
        let steady: Vec<f64> = default.iter().map(|d| 0.9 * d).collect();
        let (kept, why) = vision_verdict(&steady, &default);
        assert!(kept, "{why}");
        assert!(why.contains("all 5 rounds") && why.contains("10.0%"), "{why}");
        let lucky: Vec<f64> = [1.0, 1.3, 0.95, 1.2, 0.8].iter().map(|m| 0.02 * m).collect();
        let (kept, why) = vision_verdict(&lucky, &default);
        assert!(!kept && why.contains("not faster in 5 of 5 rounds") && why.contains("the defaults stay"), "{why}");
        let slight: Vec<f64> = default.iter().map(|d| 0.99 * d).collect();
        let (kept, why) = vision_verdict(&slight, &default);
        assert!(!kept && why.contains("1.0% is under the 2% margin"), "{why}");
        let mostly: Vec<f64> = default.iter().enumerate().map(|(i, d)| if i == 2 { 1.05 * d } else { 0.9 * d }).collect();
        let (kept, why) = vision_verdict(&mostly, &default);
        assert!(!kept && why.contains("not faster in 1 of 5 rounds"), "{why}");
        let (kept, why) = vision_verdict(&steady[..1], &default[..1]);
        assert!(!kept && why.contains("two are needed"), "{why}");
        // Rounds the raced kernels missed (they failed) count as not shared.
        assert!(vision_verdict(&steady[..3], &default).0, "three shared rounds, all faster");
    }

    /// One image per request joins every combination's request time alike.
    #[test]
    fn a_request_holds_prefill_decode_and_one_image() {
        let s = (vec![0.1, 0.2], vec![0.01, 0.02]);
        assert_eq!(request_times(&s, 10, 0.0), vec![0.1 + 10.0 * 0.01, 0.2 + 10.0 * 0.02]);
        assert_eq!(request_times(&s, 10, 0.5), vec![0.1 + 10.0 * 0.01 + 0.5, 0.2 + 10.0 * 0.02 + 0.5]);
    }
}
