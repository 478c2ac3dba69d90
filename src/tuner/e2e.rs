//! The end-to-end stage of a tune: the most promising complete combinations
//! (fusion choices by the time the race winners predict for them, execution flags,
//! and the runtime's own default) are built into engines and timed through the
//! runtime, interleaved when memory allows, within what is left of the budget,
//! each warmed by one untimed sample first; a combination replaces the default
//! only by the paired rule ([`super::paired`]) and again head to head, and the
//! decision comes with its reason. The stage runs as named steps ([`run`]). A multimodal
//! model's request also holds one image: a synthetic image at the tower's input
//! size is timed through the vision tower and projector with the raced vision
//! kernels and with the runtime's defaults (interleaved rounds), the raced ones
//! kept only if they beat the defaults by the paired rule the combinations meet,
//! and the image's time is part of every request's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::{ACCURACY_SHARE, Budget, TIMING_SHARE};
use super::measure::Strategy;
use super::paired::{self, Paired, Recorded};
use super::race::{Races, Winners};
use super::space::{Space, plan_options};
use super::{Progress, TIE, Target, TuneError, TuneOptions};
use crate::device::DeviceCaps;
use crate::eval::{self, Reference, Text};
use crate::kernels::sample::{Sampler, SamplerParams};
use crate::plan::{Fusion, Parallel, Plan, PlanOptions, Regime, Selection};
use crate::profile::ExecSettings;
use crate::profile::build::{HeadToHead, VisionTimes};
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

    /// The runtime's own default (what `run` does without a profile): every
    /// fusion, its own kernels.
    pub fn runtime_default() -> Combo {
        Combo { default: true, ..Combo::raced(Fusion::ALL, Parallel::default(), true) }
    }

    /// The formats [`Combo::repack`] names.
    pub fn repack_formats(&self) -> Vec<crate::kernels::quant::QFormat> {
        crate::kernels::quant::REPACKABLE.iter().enumerate().filter(|(j, _)| (self.repack >> j) & 1 == 1).map(|(_, &f)| f).collect()
    }

    /// The plan options of this combination for a model tuned with `o`: its
    /// fusions and parallel groups, and on a CPU the weight layouts its profile
    /// makes the runtime load ([`Combo::repack`]; none: the plan's own), so an
    /// engine timed for it runs the kernels over the records it will run them on.
    pub fn plan_options(&self, o: &TuneOptions) -> PlanOptions {
        let mut opts = plan_options(o, self.fusion, self.parallel);
        if self.repack != 0 {
            opts.cpu_repack = self.repack_formats();
        }
        opts
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
            batch_repack: None,
            trusted_shaders: o.trusted_shaders && gpu,
            decode_chain: gpu.then(|| self.decode_chain() as u32),
        }
    }

    pub fn label(&self) -> String {
        if self.default {
            return "runtime default".into();
        }
        let parts: Vec<String> = self.fusion.on().map(|f| format!("fused_{}", f.name)).collect();
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
    /// Why it won (or why the default stayed), in words.
    pub reason: String,
    /// The head to head of the stage's winner against the default (None where
    /// the default won the stage, or the timing ran one engine at a time).
    pub head_to_head: Option<HeadToHead>,
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

impl EndToEnd {
    /// The winning combination's decode seconds a token on the whole model (the
    /// median of its samples, scaled from the layers timed to the model's);
    /// None where it has no sample.
    pub fn decode_seconds(&self) -> Option<f64> {
        let s = crate::stats::summarize(&self.samples.get(self.best)?.1).median;
        let (timed, all) = self.timed_layers.unwrap_or((1, 1));
        (s.is_finite() && s > 0.0).then(|| s * all as f64 / timed.max(1) as f64)
    }
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
    let mut combos: Vec<(Combo, f64)> = vec![(Combo::runtime_default(), f64::NAN)];
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
        && let Some((f, pred)) = predicted.iter().max_by_key(|(f, _)| f.on().count())
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
pub(crate) fn repack_bits(formats: &[crate::kernels::quant::QFormat]) -> u8 {
    crate::kernels::quant::REPACKABLE.iter().enumerate().filter(|(_, f)| formats.contains(f)).fold(0, |bits, (j, _)| bits | (1 << j))
}

/// One request's time per sample: prefill, `decode_tokens` × the per-token decode
/// and `image_s` (a multimodal model's one image through the default vision
/// kernels, the same for every combination; 0 for a text-only model): the
/// end-to-end score.
fn request_times((prefill, decode): &(Vec<f64>, Vec<f64>), decode_tokens: usize, image_s: f64) -> Vec<f64> {
    prefill.iter().zip(decode).map(|(p, d)| p + decode_tokens as f64 * d + image_s).collect()
}

/// Whether the raced vision winners (`tuned`, seconds per image per round) stay
/// against the runtime's default vision kernels (`default`, the same rounds):
/// as the head to head of the combinations decides, by the paired rule with
/// the medians the profile records (`end_to_end.vision`) agreeing
/// ([`Recorded::beats`]); with the reason.
fn vision_verdict(tuned: &[f64], default: &[f64]) -> (bool, String) {
    let r = Recorded::of(tuned, default);
    let figures = format!("{:.4} against {:.4} ms an image (medians)", r.tuned_ms, r.default_ms);
    if r.beats() {
        return (true, format!("the raced vision kernels beat the runtime's defaults: {}, {figures}", r.paired.how()));
    }
    let why = r.why_not("their median image");
    (false, format!("the raced vision kernels did not beat the runtime's defaults end to end ({why}; {figures}): the defaults stay"))
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

/// Rounds of the timing and of the head to head as a rule; more, up to
/// [`MAX_ROUNDS`], only while a decision is open ([`Paired::open`]) and they fit.
const E2E_ROUNDS: usize = 5;
/// The most rounds the timing and the head to head run to settle a decision.
const MAX_ROUNDS: usize = 12;

/// Times the combinations until `deadline` and picks the best, in named steps:
/// the image (a multimodal model, [`time_image`]), the stage's plan from the
/// default's first build and sample ([`Stage::plan`]), the timing
/// ([`Stage::time_interleaved`] or [`Stage::time_one_at_a_time`]: every
/// combination warmed by one untimed sample first, as the default's first
/// sample warms it), the accuracy check ([`Stage::accuracy`]) and the decision
/// with its head to head and its reason ([`Stage::decide`]).
pub(crate) fn run(
    t: &Target<'_>,
    o: &TuneOptions,
    caps: &DeviceCaps,
    space: &Space,
    races: &Races,
    budget: &Budget,
    progress: &dyn Progress,
) -> Result<EndToEnd, TuneError> {
    let winners = races.winners(space, &o.extra_formats());
    let vision = time_image(t, o, caps, space, races, &winners, budget, progress)?;
    // The default's median, or the races' estimate where the image was not timed.
    let image_s = vision.as_ref().map_or(0.0, |v| summarize(if v.default.is_empty() { &v.tuned } else { &v.default }).median);
    let gpu = t.ctx.is_some();
    let mut combos = combinations(o, &predicted(o, space, races), gpu);
    if !gpu {
        // The runtime default repacks what `run` without a profile does.
        let dtypes = std::iter::once(o.weight_dtype).chain(o.matrix_formats.values().copied());
        combos[0].0.repack = repack_bits(&crate::plan::default_cpu_repack(t.config, dtypes, false));
    }
    let timing_end = budget.share(TIMING_SHARE);
    // Every engine of the stage loads (quantizes, converts) the model's weights
    // once between them: the block formats and the float types the plan stores.
    let floats: Vec<_> = std::iter::once(o.weight_dtype).chain(o.matrix_formats.values().copied()).filter(|d| !d.is_quant()).collect();
    let once = Arc::new(LoadOnce::new(t.store.clone(), &floats));
    let store: Arc<dyn TensorStore> = once.clone();
    let t = &Target { store, ctx: t.ctx.clone(), vision_weights: t.vision_weights.clone(), ..*t };
    let TimedModel { config, weight_bytes, reference } = timed_model(t, o, caps, Budget::until(timing_end), budget)?;
    let timed_layers = (config.dims.num_layers < t.config.dims.num_layers).then_some((config.dims.num_layers, t.config.dims.num_layers));
    let t = &Target { config: &config, store: t.store.clone(), ctx: t.ctx.clone(), vision_weights: t.vision_weights.clone(), ..*t };
    let mut stage = Stage {
        t,
        o,
        caps,
        winners: &winners,
        budget,
        progress,
        prompt: (0..o.prefill_tokens).map(|i| ((i * 7919 + 13) % t.config.dims.vocab_size) as u32).collect(),
        image_s,
        deadline: budget.deadline(),
        timing_end,
        interleave: !gpu && weight_bytes.saturating_mul(2) < crate::session::available_memory() / 5 * 2,
        cost: Cost::default(),
    };
    // CPU engines share their weights (a WeightMemo): the fused layouts (QKV, gate/up)
    // add at most one more copy of those matrices.
    let shared = stage.engines();
    let timing_start = Instant::now();
    let first = stage.plan(&combos[0].0, &shared, &once, weight_bytes, reference);
    let timed = if stage.interleave {
        stage.time_interleaved(&mut combos, &shared, first)
    } else {
        stage.time_one_at_a_time(&mut combos, &shared, first)
    };
    // The timed engines' weights go before the accuracy check builds its own (the
    // f32 reference of Gemma 3 1B built in 11 s beside them, most of it the kernel
    // finding fresh pages, against 3 s for the default's build).
    drop(shared);
    budget.record("end to end: timing", timing_start);
    if let Some(lost) = t.ctx.as_ref().and_then(|c| c.lost()) {
        return Err(lost.into());
    }
    for (i, e) in timed.errors.iter().enumerate() {
        if let Some(e) = e.as_ref().filter(|e| *e != NOT_TIMED) {
            progress.note(&format!("combination `{}` failed end to end: {e}", combos[i].0.label()));
        }
    }
    let scored = stage.accuracy(&combos, &timed)?;
    let decision = stage.decide(&combos, &timed, &scored)?;
    progress.note(&format!("end to end: {}", decision.reason));
    Ok(EndToEnd {
        combos,
        samples: timed.samples,
        best: decision.best,
        reason: decision.reason,
        head_to_head: decision.head_to_head,
        winners,
        vision,
        kld: scored.kld,
        refused: scored.refused,
        max_kld: scored.max_kld,
        timed_layers,
    })
}

/// A multimodal model's image first, within a quarter of what is left; its
/// default time joins every combination's request time (None: text only).
#[allow(clippy::too_many_arguments)]
fn time_image(
    t: &Target<'_>,
    o: &TuneOptions,
    caps: &DeviceCaps,
    space: &Space,
    races: &Races,
    winners: &Winners,
    budget: &Budget,
    progress: &dyn Progress,
) -> Result<Option<VisionTimes>, TuneError> {
    let Some(v) = &o.vision else { return Ok(None) };
    let (since, end) = (Instant::now(), budget.share(0.25));
    let times = time_vision(t, v, caps, winners, estimated_image_s(space, races), end, progress)?;
    budget.record("end to end: one image", since);
    if !times.default.is_empty() {
        progress.note(&format!(
            "end to end, one image per request: {:.3} ms raced vision kernels, {:.3} ms default (medians); {}",
            summarize(&times.tuned).median * 1e3,
            summarize(&times.default).median * 1e3,
            times.reason
        ));
    }
    Ok(Some(times))
}

/// The timing's estimates, from the default's first build and sample ([`Stage::plan`]).
#[derive(Default)]
struct Cost {
    /// A later build's seconds.
    later: LaterBuild,
    /// A sample's seconds (a warm-up costs one).
    sample_s: f64,
    /// The decode steps a sample keeps when the budget cuts them (None: all).
    steps_cap: Option<usize>,
    /// The accuracy check's f32 reference build, estimated seconds.
    reference_est: f64,
}

/// The end-to-end stage of one tune: what every step reads.
struct Stage<'a> {
    t: &'a Target<'a>,
    o: &'a TuneOptions,
    caps: &'a DeviceCaps,
    winners: &'a Winners,
    budget: &'a Budget,
    progress: &'a dyn Progress,
    prompt: Vec<u32>,
    /// A multimodal model's image per request, seconds (0: text only).
    image_s: f64,
    deadline: Instant,
    /// The end of the timing's own share.
    timing_end: Instant,
    /// The combinations' engines are held at once and timed in interleaved rounds
    /// (the CPU, where two copies of the weights fit memory); else one at a time.
    interleave: bool,
    cost: Cost,
}

/// Per combination: prefill seconds and decode seconds per token, one pair per
/// sample, and why it failed (or was not timed).
struct Timed {
    samples: Vec<(Vec<f64>, Vec<f64>)>,
    errors: Vec<Option<String>>,
}

/// The accuracy check's outcome: per combination its divergence and why the
/// budget refused it, and the budget.
struct Scored {
    kld: Vec<Option<f64>>,
    refused: Vec<Option<String>>,
    max_kld: f64,
}

/// The stage's choice and why, with the head to head that confirmed or overturned it.
struct Decision {
    best: usize,
    reason: String,
    head_to_head: Option<HeadToHead>,
}

impl<'a> Stage<'a> {
    /// A builder of the stage's engines (CPU weights shared through one memo).
    fn engines(&self) -> Engines<'a> {
        let t = self.t;
        Engines {
            model: t.model,
            config: t.config,
            store: t.store.clone(),
            ctx: t.ctx.clone(),
            memo: Some(WeightMemo::default()),
            check_decode: true,
        }
    }

    fn options_for(&self, c: &Combo) -> PlanOptions {
        let mut opts = c.plan_options(self.o);
        // The prompt, the untimed first decode step and the timed ones.
        opts.context = opts.context.max(self.o.prefill_tokens + 1 + sample_steps(c.decode_chain()));
        opts
    }

    fn build(&self, b: &Engines<'_>, c: &Combo) -> Result<Engine, RuntimeError> {
        b.build(self.options_for(c), selection_for(c, self.caps, self.winners), &c.exec(self.o, self.t.ctx.is_some()))
    }

    /// One sample of `c` on its engine.
    fn sample(&self, e: &mut Engine, c: &Combo) -> Result<(f64, f64), RuntimeError> {
        let k = c.decode_chain();
        e2e_sample(e, &self.prompt, sample_steps(k).min(self.cost.steps_cap.unwrap_or(usize::MAX)), k)
    }

    /// One request's seconds from a sample.
    fn request(&self, (p, d): (f64, f64)) -> f64 {
        p + self.o.decode_tokens as f64 * d + self.image_s
    }

    /// The head to head's seconds after the timing: two builds, a warm-up and its rounds
    /// (interleaved timing only).
    fn confirm_cost(&self) -> f64 {
        let c = &self.cost;
        if self.interleave { 2.0 * c.later.s + 2.0 * (CONFIRM_ROUNDS + 1) as f64 * c.sample_s } else { 0.0 }
    }

    /// The end of the timing of `n` combinations: past its share into what the
    /// stages after it would not use (the accuracy check: the reference's build
    /// with half to spare, then each combination a build and two evaluations,
    /// about two samples; and, interleaved, the head to head).
    fn timing_end_for(&self, n: usize) -> Instant {
        let c = &self.cost;
        let after = 1.5 * c.reference_est + n as f64 * (c.later.s + 2.0 * c.sample_s) + self.confirm_cost();
        self.deadline.checked_sub(Duration::from_secs_f64(after)).map_or(self.timing_end, |end| end.max(self.timing_end))
    }

    /// The plan of the timing from the default's own build and first sample
    /// (its warm-up): a later build's and a sample's estimated seconds, the
    /// decode steps a sample keeps where two combinations of two rounds would not
    /// fit, the accuracy check's reference build. Returns the default's engine.
    fn plan(
        &mut self,
        default: &Combo,
        shared: &Engines<'_>,
        once: &LoadOnce,
        weight_bytes: u64,
        reference: Option<(f64, f64)>,
    ) -> Result<Engine, RuntimeError> {
        let start = Instant::now();
        let loaded_before = once.fresh_seconds();
        let mut first = self.build(shared, default);
        let build_s = start.elapsed().as_secs_f64();
        // A later build copies, concatenates or repacks what the first loaded: until
        // one is measured, what the first spent on anything but loading, half again
        // (a concatenation copies twice).
        let loading_s = once.fresh_seconds() - loaded_before;
        self.cost.later = LaterBuild { s: 1.5 * (build_s - loading_s).max(0.1 * build_s), measured: false };
        if let Ok(e) = first.as_mut() {
            let k = default.decode_chain();
            let t0 = Instant::now();
            if let Ok((p, d)) = e2e_sample(e, &self.prompt, sample_steps(k), k) {
                self.cost.sample_s = t0.elapsed().as_secs_f64();
                // Two combinations of two rounds: one more build, its warm-up and four samples.
                let per_sample = (Budget::until(self.timing_end) - self.cost.later.s) / 5.0;
                if per_sample < self.cost.sample_s && d > 0.0 {
                    let steps = (((per_sample - p) / d).floor().max(0.0) as usize).max(MIN_SAMPLE_STEPS);
                    if steps < sample_steps(k) {
                        self.cost.steps_cap = Some(steps);
                        self.cost.sample_s = p + steps as f64 * d;
                        self.budget.cut(format!("end to end: {steps} decode steps a sample instead of {}", sample_steps(k)));
                    }
                }
            }
        }
        // The reference's build: at least what the default's spent outside loading
        // (most of it the kernel finding fresh pages) scaled by their bytes.
        self.cost.reference_est = match reference {
            Some((bytes, rate)) => (BUILD_OVERHEAD * bytes / rate).max((build_s - loading_s) * bytes / weight_bytes.max(1) as f64),
            None => 2.0 * build_s,
        };
        self.progress.note(&format!(
            "end to end: the default built in {build_s:.1} s ({loading_s:.1} s of it loading the weights), a sample {:.2} s; estimated: a later build {:.1} s, the accuracy check's f32 reference {:.1} s",
            self.cost.sample_s, self.cost.later.s, self.cost.reference_est
        ));
        first
    }

    /// The cut that says how many of `all` combinations the timing kept.
    fn cut_to(&self, n: usize, all: usize) {
        self.budget.cut(match n {
            1 => format!("end to end: 1 of {all} combinations, the runtime default alone (a second build and its samples do not fit)"),
            _ => format!("end to end: {n} of {all} combinations (the default and the best predicted first)"),
        });
    }

    /// Builds the default (`first`, from [`Stage::plan`]) and each other
    /// combination while its build, its warm-up and two rounds of every built
    /// one's samples fit; drops the rest of `combos`. Each engine but the
    /// default's, which its first sample warmed, runs one untimed sample.
    fn build_and_warm(
        &mut self,
        combos: &mut Vec<(Combo, f64)>,
        shared: &Engines<'_>,
        first: Result<Engine, RuntimeError>,
    ) -> Vec<Result<Engine, String>> {
        let all = combos.len();
        self.progress.phase(&format!("end to end: {all} combinations, interleaved"), all as u64);
        let mut engines = vec![first.map_err(|e| e.to_string())];
        self.progress.tick();
        for (i, (c, _)) in combos.iter().enumerate().skip(1) {
            let sample_s = self.cost.sample_s;
            if Budget::until(self.timing_end_for(i + 1)) < self.cost.later.s + sample_s + 2.0 * (i + 1) as f64 * sample_s {
                break;
            }
            let t0 = Instant::now();
            let built = self.build(shared, c);
            self.cost.later.note(t0);
            engines.push(built.and_then(|mut e| self.sample(&mut e, c).map(|_| e)).map_err(|e| e.to_string()));
            self.progress.tick();
        }
        if engines.len() < all {
            combos.truncate(engines.len());
            self.cut_to(engines.len(), all);
        }
        engines
    }

    /// The timing with every engine held: [`E2E_ROUNDS`] rounds (two at least,
    /// more while they fit), each timing every combination once in a fixed
    /// pseudo-random rotation; past them, up to [`MAX_ROUNDS`] while a
    /// combination's decision against the default is open and they fit.
    fn time_interleaved(&mut self, combos: &mut Vec<(Combo, f64)>, shared: &Engines<'_>, first: Result<Engine, RuntimeError>) -> Timed {
        let built = self.build_and_warm(combos, shared, first);
        let n = combos.len();
        let mut errors: Vec<Option<String>> = built.iter().map(|b| b.as_ref().err().cloned()).collect();
        let mut engines: Vec<Option<Engine>> = built.into_iter().map(Result::ok).collect();
        let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); n];
        let min_rounds = if n > 1 { 2 } else { 1 };
        let score = |s: &(Vec<f64>, Vec<f64>)| request_times(s, self.o.decode_tokens, self.image_s);
        let mut rng_state = self.o.seed;
        let mut round_time = Duration::ZERO;
        for round in 0..MAX_ROUNDS {
            // The minimum rounds always; more only while another fits in the budget.
            if round >= min_rounds && Instant::now() + round_time > self.timing_end_for(n) {
                break;
            }
            let open = || (1..n).any(|i| engines[i].is_some() && Paired::of(&score(&samples[i]), &score(&samples[0])).open(MAX_ROUNDS));
            if round >= E2E_ROUNDS && (engines[0].is_none() || !open()) {
                break;
            }
            let round_start = Instant::now();
            rng_state = rng_state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let off = (rng_state >> 33) as usize % n.max(1);
            for j in 0..n {
                let i = (j + off) % n;
                let Some(e) = engines[i].as_mut() else { continue };
                match self.sample(e, &combos[i].0) {
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
            round_time = round_start.elapsed();
            // Racing (auto): after three rounds, a combination every sample of which is
            // slower than every sample of the current leader stops being timed; its
            // samples stay for the report. Exhaustive and halving time all to the end.
            if self.o.strategy == Strategy::Auto && round >= 2 {
                let alive: Vec<usize> = (0..n).filter(|&i| engines[i].is_some()).collect();
                let median = |i: usize| summarize(&score(&samples[i])).median;
                if let Some(lead) = alive.iter().copied().min_by(|&a, &b| median(a).total_cmp(&median(b))) {
                    let lead_max = score(&samples[lead]).iter().copied().fold(f64::MIN, f64::max);
                    for &i in &alive {
                        if i != lead && score(&samples[i]).iter().copied().fold(f64::MAX, f64::min) > lead_max {
                            engines[i] = None;
                        }
                    }
                }
                if engines.iter().filter(|e| e.is_some()).count() <= 1 {
                    break;
                }
            }
        }
        self.progress.done();
        Timed { samples, errors }
    }

    /// The timing one engine at a time (the model is too large to hold several
    /// copies): the default and the best predicted combination always, the rest
    /// while one more fits; each built, warmed by one untimed sample (the
    /// default's was its first), then timed for its rounds.
    fn time_one_at_a_time(&mut self, combos: &mut Vec<(Combo, f64)>, shared: &Engines<'_>, first: Result<Engine, RuntimeError>) -> Timed {
        let all = combos.len();
        // One engine at a time, each a later build, its warm-up and its samples.
        let each = self.cost.later.s + 3.0 * self.cost.sample_s;
        let n = (1..=all).rev().find(|&n| (n - 1) as f64 * each <= Budget::until(self.timing_end_for(n))).unwrap_or(1);
        if n < all {
            combos.truncate(n);
            self.cut_to(n, all);
        }
        self.progress.phase(&format!("end to end: {n} combinations"), n as u64);
        let min_rounds = if n > 1 { 2 } else { 1 };
        let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); n];
        let mut errors: Vec<Option<String>> = vec![None; n];
        let mut first = Some(first);
        let (mut combo_time, mut skipped) = (Duration::ZERO, 0);
        for (i, (c, _)) in combos.iter().enumerate() {
            if i > 1 && Instant::now() + combo_time > self.timing_end_for(n) {
                errors[i] = Some(NOT_TIMED.into());
                skipped += 1;
                continue;
            }
            let combo_start = Instant::now();
            let built = match first.take() {
                Some(e) => e,
                None => {
                    let e = self.build(shared, c).and_then(|mut e| self.sample(&mut e, c).map(|_| e));
                    self.cost.later.note(combo_start);
                    e
                }
            };
            match built {
                Ok(mut e) => {
                    let mut sample_time = Duration::ZERO;
                    for round in 0..E2E_ROUNDS {
                        if round >= min_rounds && Instant::now() + sample_time > self.timing_end_for(n) {
                            break;
                        }
                        let t0 = Instant::now();
                        match self.sample(&mut e, c) {
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
            self.progress.tick();
        }
        self.progress.done();
        if skipped > 0 {
            self.budget.cut(format!("end to end: {} of {} combinations timed", n - skipped, n));
        }
        Timed { samples, errors }
    }

    /// The accuracy budget: each combination that ran against the CPU's f32
    /// reference on fixed prompts; one above the budget is out of the choice.
    /// Scored in the order of their timing, the default first, then the fastest,
    /// while one more fits the accuracy check's share (past it into what the head
    /// to head would not use). A faster one not scored is out of the choice.
    fn accuracy(&self, combos: &[(Combo, f64)], timed: &Timed) -> Result<Scored, TuneError> {
        let (o, Timed { samples, errors }) = (self.o, timed);
        let accuracy_start = Instant::now();
        let median = |i: usize| summarize(&request_times(&samples[i], o.decode_tokens, self.image_s)).median;
        let mut order: Vec<usize> = (1..combos.len()).filter(|&i| errors[i].is_none() && !samples[i].0.is_empty()).collect();
        order.sort_by(|&a, &b| median(a).total_cmp(&median(b)));
        order.insert(0, 0);
        let faster = if errors[0].is_none() { order.iter().filter(|&&i| i > 0 && median(i) < median(0)).count() } else { order.len() - 1 };
        let setup = |c: &Combo| (self.options_for(c), selection_for(c, self.caps, self.winners));
        let confirm_from = self.deadline.checked_sub(Duration::from_secs_f64(self.confirm_cost())).unwrap_or(self.deadline);
        let rebuild_s = self.cost.later.s;
        let which = Scoring { order: &order, end: self.budget.share(ACCURACY_SHARE).max(confirm_from), rebuild_s };
        // The check (the f32 reference's build, then a combination's build and the
        // two evaluations each) runs only when the reference, with half its estimate
        // to spare, and the default's engine fit; a faster combination left unscored
        // leaves the default.
        let kld = if Budget::until(which.end) < 1.5 * self.cost.reference_est + rebuild_s + 2.0 * self.cost.sample_s {
            vec![None; combos.len()]
        } else {
            divergences(self.t, o, combos, errors, &which, &setup, self.progress)?
        };
        self.budget.record("end to end: accuracy", accuracy_start);
        let unscored = order.iter().filter(|&&i| kld[i].is_none()).count();
        if unscored > 0 {
            self.budget.cut(format!(
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
                self.progress.note(&format!("combination `{}` refused: {r}", combos[i].0.label()));
            }
        }
        Ok(Scored { kld, refused, max_kld })
    }

    /// The decision: interleaved, by the paired rule over the rounds
    /// ([`paired::pick`]), a winner other than the default then confirmed head to
    /// head ([`Stage::head_to_head`]); one engine at a time, by median request
    /// time (ties to the default). With the reason in words.
    fn decide(&self, combos: &[(Combo, f64)], timed: &Timed, scored: &Scored) -> Result<Decision, TuneError> {
        let out = |i: usize| timed.errors[i].is_some() || scored.refused[i].is_some();
        // Each round's request times of the combinations that ran within the budget (none for the others).
        let times: Vec<Vec<f64>> = (0..combos.len())
            .map(|i| if out(i) { Vec::new() } else { request_times(&timed.samples[i], self.o.decode_tokens, self.image_s) })
            .collect();
        let labels: Vec<String> = combos.iter().map(|(c, _)| c.label()).collect();
        let paired = if self.interleave && timed.errors[0].is_none() { paired::pick(&times) } else { None };
        let (best, reason) = match paired {
            Some((0, p)) => (0, paired::default_stays(&p, &labels)),
            Some((b, p)) => (
                b,
                format!(
                    "`{}` beat the runtime default in the interleaved rounds: {}",
                    labels[b],
                    p[b].map(|p| p.how()).unwrap_or_default()
                ),
            ),
            None => {
                let scores: Vec<Stats> = times.iter().map(|t| if t.is_empty() { Stats::default() } else { summarize(t) }).collect();
                let Some(b) = pick(&scores, TIE) else {
                    return Err(TuneError::Invalid("no combination ran end to end; see the notes above".into()));
                };
                let how = if self.interleave {
                    "the runtime default failed"
                } else {
                    "one engine at a time: the model's copies do not fit memory together"
                };
                (
                    b,
                    format!(
                        "`{}` had the lowest median request time, {:.1} ms ({how}; within {:.0}% the earlier combination, the default first, stays)",
                        labels[b],
                        scores[b].median * 1e3,
                        TIE * 100.0
                    ),
                )
            }
        };
        if best == 0 || !self.interleave {
            return Ok(Decision { best, reason, head_to_head: None });
        }
        Ok(self.head_to_head(combos, best, reason))
    }

    /// A winner other than the default meets it again head to head: two engines
    /// alone (every other engine and weight copy of the stage dropped), each
    /// warmed by one untimed sample, alternating first and second, by the same
    /// rule. The stage's many engines share one process's memory and caches,
    /// which can favour one layout over another (a repacked combination won every
    /// round of the stage, then lost 20% in `ktune bench`). Its rounds are
    /// [`CONFIRM_ROUNDS`] or what fits the rest of the budget after two builds,
    /// and past them, up to [`MAX_ROUNDS`], while the decision is open; under two,
    /// the gain is not confirmed and the default stays.
    fn head_to_head(&self, combos: &[(Combo, f64)], best: usize, stage_reason: String) -> Decision {
        let label = combos[best].0.label();
        let c = &self.cost;
        let fits = Budget::fit(Budget::until(self.deadline) - 2.0 * c.later.s - 2.0 * c.sample_s, 2.0 * c.sample_s, CONFIRM_ROUNDS, 0);
        if fits < 2 {
            self.budget.cut(format!("head to head: not run; `{label}` was not confirmed against the runtime default, which stays"));
            let reason = format!("{stage_reason}; but two rounds head to head did not fit the budget to confirm it: the default stays");
            return Decision { best: 0, reason, head_to_head: None };
        }
        if fits < CONFIRM_ROUNDS {
            self.budget.cut(format!("head to head: {fits} of {CONFIRM_ROUNDS} rounds"));
        }
        let confirm_start = Instant::now();
        let fresh = self.engines();
        let pair = [&combos[0].0, &combos[best].0];
        let warm = |c: &Combo| self.build(&fresh, c).and_then(|mut e| self.sample(&mut e, c).map(|_| e));
        let (Ok(d), Ok(b)) = (warm(pair[0]), warm(pair[1])) else {
            self.budget.record("end to end: head to head", confirm_start);
            return Decision { best, reason: format!("{stage_reason} (the head to head's engines failed to build)"), head_to_head: None };
        };
        let mut engines = [d, b];
        self.progress.phase(&format!("end to end: `{label}` against the default, head to head"), fits as u64);
        let mut t: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut round_time = Duration::ZERO;
        for round in 0..MAX_ROUNDS {
            let open = Paired::of(&t[1], &t[0]).open(MAX_ROUNDS);
            if round >= fits && (fits < CONFIRM_ROUNDS || !open || Instant::now() + round_time > self.deadline) {
                break;
            }
            let start = Instant::now();
            for i in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                if let Ok(s) = self.sample(&mut engines[i], pair[i]) {
                    t[i].push(self.request(s));
                }
            }
            round_time = start.elapsed();
            self.progress.tick();
        }
        self.progress.done();
        self.budget.record("end to end: head to head", confirm_start);
        let [default, tuned] = t;
        // The rounds' pairs decide, and the medians the report shows must agree.
        let r = Recorded::of(&tuned, &default);
        let figures = format!("request {:.1} vs {:.1} ms (medians)", r.tuned_ms, r.default_ms);
        let confirmed = default.len() == tuned.len() && r.beats();
        let reason = if confirmed {
            format!("{stage_reason}; confirmed head to head: {}, {figures}", r.paired.how())
        } else {
            let why = r.why_not("its median request");
            format!("{stage_reason}; but head to head it did not beat the runtime default ({why}; {figures}): the default stays")
        };
        Decision {
            best: if confirmed { best } else { 0 },
            reason,
            head_to_head: Some(HeadToHead { combination: label, default, tuned, confirmed }),
        }
    }
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
    let n = t.config.dims.num_layers;
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
#[derive(Default)]
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
    let vocab = t.config.dims.vocab_size;
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
        assert!(sets(&[DType::F16, DType::Q5_K]).is_empty());
        // A Q4_K_M file: each of its two repackable formats, then both.
        assert_eq!(sets(&[DType::Q4_K, DType::Q6_K]), vec![vec![QFormat::Q4_K], vec![QFormat::Q6_K], vec![QFormat::Q4_K, QFormat::Q6_K]]);
        assert_eq!(
            sets(&[DType::Q4_0, DType::Q8_0, DType::Q5_K, DType::Q4_0]),
            vec![vec![QFormat::Q4_0], vec![QFormat::Q8_0], vec![QFormat::Q4_0, QFormat::Q8_0]]
        );
        let c = Combo { repack: repack_choices(&[DType::IQ4_NL, DType::Q4_K])[2], ..Combo::raced(Fusion::NONE, Parallel::default(), true) };
        assert!(c.label().ends_with("repacked q4_k,iq4_nl"), "{}", c.label());
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
        let space = |races: Vec<RaceDef>| Space {
            races,
            per_fusion: Vec::new(),
            variants: 0,
            ruled_out: Default::default(),
            combinations: 0.0,
            holding: Default::default(),
        };
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
        assert!(why.contains("5 of 5 rounds") && why.contains("10.0%"), "{why}");
        let lucky: Vec<f64> = [1.0, 1.3, 0.95, 1.2, 0.8].iter().map(|m| 0.02 * m).collect();
        let (kept, why) = vision_verdict(&lucky, &default);
        assert!(!kept && why.contains("under the 2% margin") && why.contains("the defaults stay"), "{why}");
        let slight: Vec<f64> = default.iter().map(|d| 0.99 * d).collect();
        let (kept, why) = vision_verdict(&slight, &default);
        assert!(!kept && why.contains("1.0% is under the 2% margin"), "{why}");
        let mostly: Vec<f64> = default.iter().enumerate().map(|(i, d)| if i == 2 { 1.05 * d } else { 0.9 * d }).collect();
        let (kept, why) = vision_verdict(&mostly, &default);
        assert!(!kept && why.contains("in 4 of 5 rounds only"), "{why}");
        let (kept, why) = vision_verdict(&steady[..1], &default[..1]);
        assert!(!kept && why.contains("two are needed"), "{why}");
        // Rounds the raced kernels missed (they failed) count as not shared.
        assert!(vision_verdict(&steady[..3], &default).0, "three shared rounds, all faster");
        // Faster in every round, but the medians the profile records (each
        // series' after its outliers are dropped: the default's three slow
        // rounds are, the raced kernels' are not) do not say so: the defaults
        // stay, as they do head to head.
        let default = [1.10, 3.18, 3.25, 1.02, 1.06, 1.04, 3.21];
        let tuned = [1.06, 2.64, 2.31, 0.83, 0.63, 0.78, 2.63];
        assert!(Paired::of(&tuned, &default).beats());
        let (kept, why) = vision_verdict(&tuned, &default);
        assert!(!kept && why.contains("faster in 7 of 7 rounds") && why.contains("but their median image is not faster"), "{why}");
        assert!(why.contains("1060.0000 against 1050.0000 ms an image (medians)"), "{why}");
    }

    /// One image per request joins every combination's request time alike.
    #[test]
    fn a_request_holds_prefill_decode_and_one_image() {
        let s = (vec![0.1, 0.2], vec![0.01, 0.02]);
        assert_eq!(request_times(&s, 10, 0.0), vec![0.1 + 10.0 * 0.01, 0.2 + 10.0 * 0.02]);
        assert_eq!(request_times(&s, 10, 0.5), vec![0.1 + 10.0 * 0.01 + 0.5, 0.2 + 10.0 * 0.02 + 0.5]);
    }
}
