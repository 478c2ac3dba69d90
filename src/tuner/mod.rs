//! `ktune tune`: the search. The plan builder gives every slot's shapes for each
//! fusion choice; each slot's valid variants are gated by correctness, raced at
//! those shapes (interleaved rounds, robust statistics, early drops), and the most
//! promising complete combinations (fusions and execution flags included) are timed
//! end to end through the runtime against its own default. One deadline bounds it
//! all; finished slot races are saved as they come so an interrupted tune resumes.

pub mod cache;
pub mod measure;
pub mod stats;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::gpu::GpuCtx;
use crate::kernels::problem::test_problems;
use crate::kernels::verify::{Runner as CheckRunner, check_one};
use crate::kernels::{self, DType, Impl, KernelDef, Problem};
use crate::model::ModelConfig;
use crate::plan::select::{Choice, DeviceCaps, SlotKey};
use crate::plan::{Fusion, Parallel, Plan, PlanOptions, Regime, Selection, StepKind};
use crate::profile::doc::{self as pd, Candidate, Combination, DeviceReq, SchedulingDoc, SlotTuning, Throughput, Tuning};
use crate::profile::{ExecSettings, FORMAT_VERSION, ProfileDoc, kernels_doc, variant_doc};
use crate::runtime::{Engine, RuntimeError, TensorStore, WeightMemo, argmax};
use cache::Cache;
use measure::{Cand, FULL_SAMPLES, Runner, Strategy, Workload, race};
use stats::{Stats, pick, summarize};

/// Relative difference under which two times count as a tie.
const TIE: f64 = 0.01;
/// Decode steps timed per end-to-end sample.
const E2E_DECODE_STEPS: usize = 8;

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
    pub kv_dtype: DType,
    pub seed: u64,
}

/// What the caller sees of the search as it goes (implemented with progress bars in
/// `output`; tests pass a silent one).
pub trait Progress {
    fn phase(&self, _msg: &str, _len: u64) {}
    fn tick(&self) {}
    fn note(&self, _msg: &str) {}
    fn done(&self) {}
}

pub struct Silent;
impl Progress for Silent {}

/// Revision of the search itself: part of every cache key, so a tuner that searches
/// differently does not return or resume what an older one found.
const SEARCH_REVISION: &str = "descent-1";

/// Cache key of a tune: device, model config, kernel set, version, options.
pub fn cache_key(device: &Device, model: &str, cfg: &ModelConfig, o: &TuneOptions) -> String {
    let cfg_json = serde_json::to_string(cfg).unwrap_or_default();
    let opts = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}",
        o.budget.as_secs_f64(),
        o.strategy.name(),
        o.prefill_tokens,
        o.context,
        o.decode_tokens,
        o.weight_dtype,
        o.kv_dtype,
        o.seed
    );
    let ks = kernels::kernel_set_hash();
    cache::sha256_of(&[&device.fingerprint(), model, &cfg_json, &ks, env!("CARGO_PKG_VERSION"), SEARCH_REVISION, &opts])
}

/// One slot race: the union of the slot's shapes over every fusion choice.
struct RaceDef {
    key: SlotKey,
    dtype: DType,
    shapes: Vec<(Problem, usize)>,
}

/// A finished race, as cached and as reported.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RaceResult {
    slot: String,
    regime: String,
    problem: String,
    count: usize,
    winner: usize,
    cands: Vec<CandRecord>,
    rejected: Vec<(String, String)>,
    /// Per-shape medians of every measured candidate (seconds), by shape description.
    shape_medians: Vec<BTreeMap<String, f64>>,
    timestamps: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct CandRecord {
    kernel: String,
    params: kernels::Params,
    stats: Stats,
    status: String,
}

/// The end-to-end combination space.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Combo {
    fusion: Fusion,
    parallel: Parallel,
    batch: bool,
    /// The runtime's own default selection instead of the race winners.
    default: bool,
}

impl Combo {
    fn label(&self) -> String {
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
        ] {
            if on {
                parts.push(name);
            }
        }
        let mut s = if parts.is_empty() { "unfused".to_string() } else { parts.join("+") };
        s.push_str(if self.parallel.qkv { " parallel" } else { " sequential" });
        s.push_str(if self.batch { " batch" } else { " per-kernel-submit" });
        s
    }
}

/// The result of a tune: the profile document and a summary for the report.
pub struct TuneResult {
    pub doc: ProfileDoc,
    pub resumed_slots: usize,
}

fn throughput(prefill_tokens: usize, prefill: &Stats, decode: &Stats) -> Throughput {
    Throughput {
        prefill_tok_s: prefill_tokens as f64 / prefill.median,
        decode_tok_s: 1.0 / decode.median,
        prefill_ms: prefill.median * 1e3,
        prefill_ci_ms: [prefill.ci[0] * 1e3, prefill.ci[1] * 1e3],
        decode_ms: decode.median * 1e3,
        decode_ci_ms: [decode.ci[0] * 1e3, decode.ci[1] * 1e3],
    }
}

/// Fusion choices that change the plan of `cfg`.
fn fusions(cfg: &ModelConfig) -> Vec<Fusion> {
    Fusion::all_combinations().into_iter().filter(|f| cfg.qk_norm || !f.qk_norm_rope).collect()
}

/// Read bandwidth of this CPU (both cores), GB/s: a parallel sum over 256 MiB.
pub fn cpu_read_bandwidth() -> f64 {
    use rayon::prelude::*;
    let v: Vec<f32> = vec![1.0; 64 << 20];
    let isa = kernels::cpu::Isa::best();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        // The SIMD dot of each chunk with itself: every byte comes from memory once
        // (the second operand hits L1), at the widest vectors the CPU has.
        let s: f32 = v.par_chunks(1 << 14).map(|c| kernels::cpu::dot_f32(isa, c, c)).sum();
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (v.len() * 4) as f64 / best / 1e9
}

/// Copy bandwidth of a GPU (bytes read per second during a buffer-to-buffer copy), GB/s.
fn gpu_copy_bandwidth(ctx: &GpuCtx) -> f64 {
    let bytes: u64 = (64u64 << 20).min(ctx.caps.max_buffer_size / 2);
    let a = ctx.storage("bw a", bytes);
    let b = ctx.storage("bw b", bytes);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("bw") });
        enc.copy_buffer_to_buffer(&a, 0, &b, 0, bytes);
        ctx.queue.submit([enc.finish()]);
        if ctx.wait().is_err() {
            return 0.0;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

/// Everything a tune needs about the model and device.
pub struct Target<'a> {
    pub model: &'a str,
    pub config: &'a ModelConfig,
    pub store: Arc<dyn TensorStore>,
    pub device: &'a Device,
    pub ctx: Option<Arc<GpuCtx>>,
}

fn caps_of(device: &Device) -> DeviceCaps {
    match device {
        Device::Cpu(c) => DeviceCaps::Cpu(c.clone()),
        Device::Gpu(g) => DeviceCaps::Gpu(g.caps.clone()),
    }
}

fn plan_options(o: &TuneOptions, fusion: Fusion, parallel: Parallel) -> PlanOptions {
    PlanOptions {
        weight_dtype: o.weight_dtype,
        kv_dtype: o.kv_dtype,
        max_tokens: o.prefill_tokens,
        context: o.context,
        all_logits: false,
        fusion,
        parallel,
    }
}

/// Kernel steps of both regimes of a plan: (slot, regime, problem, dtype). Decode
/// steps are taken at the KV length the scored request sees on average (the prompt
/// plus half the decoded tokens, within the context): attention kernels trade places
/// with the cache length (split-KV wins at thousands of keys, one task per head at
/// tens), so racing them at the full context would pick for a request nobody runs.
fn kernel_steps(plan: &Plan, o: &TuneOptions) -> Result<KernelSteps, TuneError> {
    let mut out = Vec::new();
    let decode_pos = (o.prefill_tokens + o.decode_tokens / 2).min(o.context - 1);
    for (regime, t, pos) in [(Regime::Prefill, o.prefill_tokens, 0), (Regime::Decode, 1, decode_pos)] {
        for s in plan.steps(t, pos)? {
            if let StepKind::Kernel { problem, dtype, .. } = s.kind {
                out.push(((s.slot, regime), problem, dtype));
            }
        }
    }
    Ok(out)
}

/// The space: one race per (slot, regime, dtype) with the union of its shapes, and
/// per fusion choice the kernel steps its plan emits.
/// The kernel steps of both regimes: (slot, regime, problem, dtype).
type KernelSteps = Vec<(SlotKey, Problem, DType)>;
/// Slot races, and per fusion choice the steps its plan emits.
type Space = (Vec<RaceDef>, Vec<(Fusion, KernelSteps)>);

fn build_space(t: &Target<'_>, o: &TuneOptions) -> Result<Space, TuneError> {
    let mut races: Vec<RaceDef> = Vec::new();
    let mut per_fusion = Vec::new();
    for f in fusions(t.config) {
        let plan = Plan::new(t.model, t.config, plan_options(o, f, Parallel::default()), Selection::defaults(caps_of(t.device)))?;
        let steps = kernel_steps(&plan, o)?;
        let mut counts: BTreeMap<(SlotKey, String), (Problem, DType, usize)> = BTreeMap::new();
        for (key, p, d) in &steps {
            counts.entry((*key, p.describe())).or_insert((p.clone(), *d, 0)).2 += 1;
        }
        for ((key, _), (p, d, n)) in counts {
            let r = match races.iter_mut().find(|r| r.key == key && r.dtype == d) {
                Some(r) => r,
                None => {
                    races.push(RaceDef { key, dtype: d, shapes: Vec::new() });
                    races.last_mut().expect("just pushed")
                }
            };
            match r.shapes.iter_mut().find(|(q, _)| q.describe() == p.describe()) {
                Some(s) => s.1 = s.1.max(n),
                None => r.shapes.push((p, n)),
            }
        }
        per_fusion.push((f, steps));
    }
    races.sort_by_key(|r| (r.key.1, r.key.0));
    Ok((races, per_fusion))
}

/// The parameter sets a strategy starts from for `k`. Exhaustive and random search the full
/// product; auto and halving an axis sweep around the defaults (each parameter
/// through all its values, the others at their defaults) to start from, which keeps
/// large spaces (gemm_blocked_cpu: 375 block-size combinations) within a few
/// minutes; [`descent_candidates`] then walks from the best of it.
fn param_space(k: &KernelDef, strategy: Strategy) -> Vec<kernels::Params> {
    kernels::verify::param_sweep(k, matches!(strategy, Strategy::Exhaustive | Strategy::Random))
}

/// The variants generated for one race, each once; the rejected ones with the
/// reason (invalid on a shape, failed the gate, not reached within the budget).
#[derive(Default)]
struct Generated {
    seen: BTreeSet<(&'static str, kernels::Params)>,
    rejected: Vec<(String, String)>,
}

impl Generated {
    /// `params` of `k` as a candidate when it was not generated before and is valid
    /// on every shape of `r` (otherwise the reason is recorded). `isa` stays at 0
    /// (the best instruction set the CPU has: the other values force scalar or
    /// narrower paths for verification and are never faster).
    fn offer(&mut self, k: &'static KernelDef, params: kernels::Params, r: &RaceDef, caps: &DeviceCaps) -> Option<Cand> {
        if params.get("isa").is_some_and(|i| *i != 0) || !self.seen.insert((k.id, params.clone())) {
            return None;
        }
        match r.shapes.iter().find_map(|(p, _)| k.check(caps.caps(), p, r.dtype, &params).err()) {
            None => Some(Cand { kernel: k, params }),
            Some(why) => {
                self.rejected.push((pd::VariantDoc { kernel: k.id.into(), params }.to_string(), why));
                None
            }
        }
    }
}

/// Candidates of a race: every variant of the op valid on every shape, the
/// runtime's default first (the tie rule prefers earlier candidates), then
/// registry order; the rest with the reason they were ruled out.
fn candidates(r: &RaceDef, caps: &DeviceCaps, strategy: Strategy) -> (Vec<Cand>, Generated) {
    let op = r.shapes[0].0.op();
    let mut valid = Vec::new();
    let mut pool = Generated::default();
    let sel = Selection::defaults(caps.clone());
    let default = sel.default_choice(r.key.0, r.key.1, &r.shapes[0].0, r.dtype).ok();
    for k in kernels::for_op(op).filter(|k| k.backend() == caps.backend()) {
        valid.extend(param_space(k, strategy).into_iter().filter_map(|params| pool.offer(k, params, r, caps)));
    }
    if let Some(d) = default {
        match valid.iter().position(|c| c.kernel.id == d.kernel.id && c.params == d.params) {
            Some(i) => {
                let c = valid.remove(i);
                valid.insert(0, c);
            }
            None => {
                pool.seen.insert((d.kernel.id, d.params.clone()));
                valid.insert(0, Cand { kernel: d.kernel, params: d.params });
            }
        }
    }
    (valid, pool)
}

/// Correctness gate of one variant: the parity check on the op's test shapes it
/// accepts, and on the real shape when that is cheap to reference.
fn gate(c: &Cand, r: &RaceDef, caps: &DeviceCaps, ctx: Option<&GpuCtx>, seed: u64) -> Result<(), String> {
    let runner = match ctx {
        Some(g) => CheckRunner::Gpu(g),
        None => CheckRunner::Cpu,
    };
    let op = r.shapes[0].0.op();
    let mut probs: Vec<Problem> =
        test_problems(op).into_iter().filter(|p| c.kernel.check(caps.caps(), p, r.dtype, &c.params).is_ok()).take(2).collect();
    if let Some((p, _)) = r.shapes.iter().min_by(|a, b| a.0.flops().total_cmp(&b.0.flops()))
        && p.flops() < 5e7
    {
        probs.push(p.clone());
    }
    if probs.is_empty() {
        return Err("no test shape this variant accepts: cannot check it".into());
    }
    for p in &probs {
        let chk = check_one(&runner, c.kernel, p, r.dtype, &c.params, seed);
        if !chk.passed {
            return Err(match chk.error {
                Some(e) => format!("failed the parity check on {}: {e}", chk.problem),
                None => format!("failed the parity check on {}: relative error {:.2e} > {:.0e}", chk.problem, chk.rel_err, chk.tolerance),
            });
        }
    }
    Ok(())
}

fn race_cache_key(t: &Target<'_>, r: &RaceDef, o: &TuneOptions) -> String {
    let shapes: Vec<String> = r.shapes.iter().map(|(p, n)| format!("{}x{n}", p.describe())).collect();
    cache::sha256_of(&[
        &t.device.fingerprint(),
        &cache::op_hash(r.shapes[0].0.op()),
        r.key.0.name(),
        r.key.1.name(),
        r.dtype.name(),
        &shapes.join(";"),
        o.strategy.name(),
        &o.seed.to_string(),
        SEARCH_REVISION,
    ])
}

/// Coordinate-descent steps after the axis sweep (auto and halving).
const DESCENT_STEPS: usize = 4;
/// A kernel's best candidate is a descent centre when its median is within this
/// factor of the race's best.
const DESCENT_WITHIN: f64 = 1.25;
/// Gates `cands` in order (the default first), pushing those that fail, and those
/// past the deadline, to `rejected`. With `first_free` the first candidate is gated
/// even past the deadline (a race needs one).
#[allow(clippy::too_many_arguments)]
fn gate_all(
    cands: Vec<Cand>,
    r: &RaceDef,
    caps: &DeviceCaps,
    t: &Target<'_>,
    o: &TuneOptions,
    deadline: Instant,
    gates: &mut GateCache,
    rejected: &mut Vec<(String, String)>,
    first_free: bool,
) -> Vec<Cand> {
    let mut passed = Vec::new();
    for c in cands {
        let name = variant_doc(&Choice::new(c.kernel, c.params.clone())).to_string();
        if !(first_free && passed.is_empty()) && Instant::now() > deadline {
            rejected.push((name, "not reached within the budget".into()));
            continue;
        }
        let key = (c.kernel.id.to_string(), format!("{:?}", c.params), r.dtype);
        let verdict = gates.entry(key).or_insert_with(|| gate(&c, r, caps, t.ctx.as_deref(), o.seed)).clone();
        match verdict {
            Ok(()) => passed.push(c),
            Err(why) => rejected.push((name, why)),
        }
    }
    passed
}

/// One coordinate-descent step over the parameters. The axis sweep moves each
/// parameter with the others at their defaults, so it misses optima where two
/// parameters move together (a 16-row tile wants 8×8 registers, not the default
/// 4×4). Each kernel whose best candidate so far is within [`DESCENT_WITHIN`] of
/// the race's best becomes a centre: proposed are the centre with every parameter at
/// the best value seen along its axis, then every set one axis away from the
/// centre, those not yet generated and valid on every shape.
/// `timed` holds every candidate timed so far with its median.
fn descent_candidates(timed: &[(&Cand, f64)], r: &RaceDef, caps: &DeviceCaps, pool: &mut Generated) -> Vec<Cand> {
    let Some(best) = timed.iter().map(|t| t.1).min_by(f64::total_cmp) else { return Vec::new() };
    let mut centres: BTreeMap<&'static str, (&Cand, f64)> = BTreeMap::new();
    for &(c, m) in timed {
        let e = centres.entry(c.kernel.id).or_insert((c, m));
        if m < e.1 {
            *e = (c, m);
        }
    }
    let mut out = Vec::new();
    for (c, m) in centres.into_values() {
        if m > best * DESCENT_WITHIN {
            continue;
        }
        let k = c.kernel;
        let mut combined = c.params.clone();
        for spec in k.params {
            let along = timed
                .iter()
                .filter(|(x, _)| x.kernel.id == k.id && x.params.iter().all(|(n, v)| n == spec.name || c.params.get(n) == Some(v)));
            if let Some((x, xm)) = along.min_by(|a, b| a.1.total_cmp(&b.1))
                && *xm < m
                && let Some(&v) = x.params.get(spec.name)
            {
                combined.insert(spec.name.to_string(), v);
            }
        }
        let next = std::iter::once(combined).chain(kernels::verify::axis_neighbours(k, &c.params));
        out.extend(next.filter_map(|params| pool.offer(k, params, r, caps)));
    }
    out
}

/// Gate verdicts by (kernel, params, dtype), shared by the races of one tune.
type GateCache = BTreeMap<(String, String, DType), Result<(), String>>;

fn run_race(t: &Target<'_>, r: &RaceDef, o: &TuneOptions, deadline: Instant, gates: &mut GateCache, progress: &dyn Progress) -> RaceResult {
    let caps = caps_of(t.device);
    let (mut cands, mut pool) = candidates(r, &caps, o.strategy);
    if o.strategy == Strategy::Random && cands.len() > 8 {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(o.seed);
        let first = cands.remove(0);
        cands.shuffle(&mut rng);
        cands.truncate(7);
        cands.insert(0, first);
    }
    let passed = gate_all(cands, r, &caps, t, o, deadline, gates, &mut pool.rejected, true);
    let w = Workload::new(r.shapes.clone(), r.dtype, t.ctx.clone(), o.seed, rotate_bytes(t.device));
    let mut runners: Vec<Runner> = passed.into_iter().map(|c| Runner::new(c, &w)).collect();
    let n = runners.len() as u64;
    progress.phase(&format!("{} ({}) {} candidates", r.key.0, r.key.1.name(), n), n * FULL_SAMPLES as u64);
    race(&mut runners, &w, o.strategy, deadline, o.seed, 0, |_| progress.tick());
    if matches!(o.strategy, Strategy::Auto | Strategy::Halving) {
        for step in 1..=DESCENT_STEPS {
            if Instant::now() > deadline {
                break;
            }
            let timed: Vec<(&Cand, f64)> =
                runners.iter().filter(|x| x.error.is_none() && !x.samples.is_empty()).map(|x| (&x.cand, x.stats().median)).collect();
            let next = descent_candidates(&timed, r, &caps, &mut pool);
            let passed = gate_all(next, r, &caps, t, o, deadline, gates, &mut pool.rejected, false);
            if passed.is_empty() {
                break;
            }
            let n = passed.len() as u64;
            runners.extend(passed.into_iter().map(|c| Runner::new(c, &w)));
            progress.phase(&format!("{} ({}) descent {step}: {n} more candidates", r.key.0, r.key.1.name()), n * FULL_SAMPLES as u64);
            race(&mut runners, &w, o.strategy, deadline, o.seed + step as u64, step * measure::rounds(o.strategy).len(), |_| {
                progress.tick()
            });
        }
    }
    let stats: Vec<Stats> = runners.iter().map(|x| if x.error.is_some() { Stats::default() } else { x.stats() }).collect();
    // Only the survivors compete for the win: a candidate dropped after one noisy
    // sample must not win on it.
    let finalists: Vec<Stats> =
        runners.iter().zip(&stats).map(|(x, s)| if x.dropped.is_some() { Stats::default() } else { s.clone() }).collect();
    let winner = pick(&finalists, TIE).or_else(|| pick(&stats, TIE)).unwrap_or(0);
    let mut cands = Vec::new();
    let mut shape_medians = Vec::new();
    for (i, x) in runners.iter().enumerate() {
        if let Some(e) = &x.error {
            pool.rejected
                .push((variant_doc(&Choice::new(x.cand.kernel, x.cand.params.clone())).to_string(), format!("failed while timing: {e}")));
        }
        let status = match (&x.error, x.dropped) {
            (Some(_), _) => "error".to_string(),
            (None, Some(round)) => format!("dropped@{round}"),
            (None, None) if i == winner => "chosen".to_string(),
            (None, None) => "measured".to_string(),
        };
        cands.push(CandRecord { kernel: x.cand.kernel.id.into(), params: x.cand.params.clone(), stats: stats[i].clone(), status });
        shape_medians.push(x.shape_medians(&w));
    }
    let desc = if r.shapes.len() == 1 { r.shapes[0].0.describe() } else { format!("{} shapes", r.shapes.len()) };
    RaceResult {
        slot: r.key.0.name().into(),
        regime: r.key.1.name().into(),
        problem: desc,
        count: r.shapes.iter().map(|s| s.1).sum(),
        winner,
        cands,
        rejected: pool.rejected,
        shape_medians,
        timestamps: runners.first().is_some_and(|x| x.timestamps),
    }
}

impl RaceResult {
    fn winner_choice(&self) -> Option<Choice> {
        let c = self.cands.get(self.winner).filter(|c| c.stats.n > 0)?;
        kernels::find(&c.kernel).ok().map(|k| Choice::new(k, c.params.clone()))
    }
}

/// One end-to-end sample: prefill of the prompt from an empty cache, then `steps`
/// greedy decode steps; (prefill seconds, median seconds per decoded token).
pub fn e2e_sample(engine: &mut Engine, prompt: &[u32], steps: usize) -> Result<(f64, f64), RuntimeError> {
    engine.reset();
    let t0 = Instant::now();
    let rows = engine.forward(prompt)?;
    let prefill = t0.elapsed().as_secs_f64();
    let mut next = argmax(rows.last().map(Vec::as_slice).unwrap_or(&[]));
    let mut ts = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let r = engine.forward(&[next])?;
        ts.push(t.elapsed().as_secs_f64());
        next = argmax(&r[0]);
    }
    Ok((prefill, summarize(&ts).median))
}

fn build_engine(t: &Target<'_>, o: &TuneOptions, combo: &Combo, sel: Selection, memo: &WeightMemo) -> Result<Engine, TuneError> {
    let mut opts = plan_options(o, combo.fusion, combo.parallel);
    opts.context = opts.context.max(o.prefill_tokens + E2E_DECODE_STEPS + 1);
    let plan = Plan::new(t.model, t.config, opts, sel)?;
    plan.steps(o.prefill_tokens, 0)?;
    plan.steps(1, o.prefill_tokens)?;
    let mut e = match &t.ctx {
        Some(ctx) => Engine::gpu(plan, t.store.clone(), ctx.clone(), combo.batch)?,
        None => Engine::cpu_shared(plan, t.store.clone(), memo)?,
    };
    e.warm_up(o.prefill_tokens)?;
    e.warm_up(1)?;
    Ok(e)
}

/// Bytes of input copies a CPU slot race cycles through: twice the last-level
/// cache (64 MiB when the size is unknown), so every execution reads from memory as
/// a layer of the model pass does.
fn rotate_bytes(device: &Device) -> usize {
    match device {
        Device::Cpu(c) if c.cache_l3 > 0 => 2 * c.cache_l3 as usize,
        Device::Cpu(c) if c.cache_l2 > 0 => 4 * c.cache_l2 as usize,
        _ => 64 << 20,
    }
}

fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("MemAvailable:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30)
}

/// Runs the whole search. `cache` keeps finished races as they come; with `resume`
/// races already there are reused (an interrupted tune resumes; --force re-measures).
pub fn tune(
    t: &Target<'_>,
    o: &TuneOptions,
    cache: Option<&Cache>,
    resume: bool,
    progress: &dyn Progress,
) -> Result<TuneResult, TuneError> {
    let start = Instant::now();
    let deadline = start + o.budget;
    let slot_deadline = start + o.budget.mul_f64(0.65);
    if o.prefill_tokens == 0 || o.context <= o.prefill_tokens {
        return Err(TuneError::Invalid(format!(
            "--context ({}) must exceed --prefill-tokens ({}) and both be positive",
            o.context, o.prefill_tokens
        )));
    }
    let caps = caps_of(t.device);
    let (limit_gbps, limit_src) = match &t.ctx {
        None => (cpu_read_bandwidth(), "measured: parallel read of 256 MiB"),
        Some(ctx) => (gpu_copy_bandwidth(ctx), "measured: 64 MiB buffer copy (bytes read per second)"),
    };
    let (races, per_fusion) = build_space(t, o)?;

    // Space summary.
    let mut ruled_out: BTreeMap<String, usize> = BTreeMap::new();
    let mut n_valid: BTreeMap<SlotKey, usize> = BTreeMap::new();
    let mut variants = 0;
    for r in &races {
        let (c, pool) = candidates(r, &caps, o.strategy);
        variants += c.len();
        *n_valid.entry(r.key).or_default() += c.len();
        for (_, why) in pool.rejected {
            *ruled_out.entry(why).or_default() += 1;
        }
    }
    let flag_choices: f64 = if t.ctx.is_some() { 4.0 } else { 2.0 };
    let mut combos_total: f64 = 0.0;
    for (_, steps) in &per_fusion {
        let mut keys: Vec<SlotKey> = steps.iter().map(|s| s.0).collect();
        keys.sort();
        keys.dedup();
        let prod: f64 = keys.iter().map(|k| n_valid.get(k).copied().unwrap_or(1).max(1) as f64).product();
        combos_total += prod * flag_choices;
    }
    let mut reasons: Vec<(&String, &usize)> = ruled_out.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    for (why, n) in reasons.iter().take(4) {
        progress.note(&format!("ruled out {n}×: {why}"));
    }
    progress.note(&format!(
        "{} slot races, {variants} valid variants, {} ruled out by device limits or shapes; {combos_total:.3e} complete combinations over {} fusion choices",
        races.len(),
        ruled_out.values().sum::<usize>(),
        per_fusion.len()
    ));

    // Slot races, resumed from the cache where already done.
    let mut results: Vec<RaceResult> = Vec::new();
    let mut resumed = 0;
    let mut gates = GateCache::new();
    for (i, r) in races.iter().enumerate() {
        let key = race_cache_key(t, r, o);
        if let Some(done) = cache.filter(|_| resume).and_then(|c| c.get::<RaceResult>("slots", &key)) {
            resumed += 1;
            results.push(done);
            continue;
        }
        // Share what is left of the slot budget evenly over the races still to run.
        let left = slot_deadline.saturating_duration_since(Instant::now());
        let share = left / (races.len() - i) as u32;
        let res = run_race(t, r, o, Instant::now() + share, &mut gates, progress);
        if let Some(c) = cache {
            c.put("slots", &key, &res)?;
        }
        results.push(res);
    }
    progress.done();

    let mut winners: BTreeMap<SlotKey, Choice> = BTreeMap::new();
    for (r, res) in races.iter().zip(&results) {
        if let Some(c) = res.winner_choice() {
            winners.insert(r.key, c);
        }
    }
    // Predicted time of each fusion choice from the per-shape medians of the winners.
    let shape_time = |key: SlotKey, p: &Problem| -> f64 {
        races
            .iter()
            .zip(&results)
            .find(|(r, _)| r.key == key)
            .and_then(|(_, res)| res.shape_medians.get(res.winner).and_then(|m| m.get(&p.describe())).copied())
            .unwrap_or(0.0)
    };
    let mut predicted: Vec<(Fusion, f64)> = per_fusion
        .iter()
        .map(|(f, steps)| {
            let mut tot = 0.0;
            for (key, p, _) in steps {
                let w = if key.1 == Regime::Decode { o.decode_tokens as f64 } else { 1.0 };
                tot += w * shape_time(*key, p);
            }
            (*f, tot)
        })
        .collect();
    predicted.sort_by(|a, b| a.1.total_cmp(&b.1));

    // End-to-end combinations.
    let gpu = t.ctx.is_some();
    // The runtime's own default (what `run` does without a profile) goes first: it is
    // raced alongside, and wins ties (a profile is only worth its differences).
    let mut combos: Vec<(Combo, f64)> =
        vec![(Combo { fusion: Fusion::ALL, parallel: Parallel::default(), batch: true, default: true }, f64::NAN)];
    let par_on = Parallel::default();
    let par_off = Parallel { qkv: false, ffn: false };
    let exhaustive_e2e = matches!(o.strategy, Strategy::Exhaustive | Strategy::Halving);
    let top = if exhaustive_e2e { predicted.len() } else { 3.min(predicted.len()) };
    for (f, pred) in predicted.iter().take(top) {
        combos.push((Combo { fusion: *f, parallel: par_on, batch: true, default: false }, *pred));
        if exhaustive_e2e {
            combos.push((Combo { fusion: *f, parallel: par_off, batch: true, default: false }, *pred));
            if gpu {
                combos.push((Combo { fusion: *f, parallel: par_on, batch: false, default: false }, *pred));
                combos.push((Combo { fusion: *f, parallel: par_off, batch: false, default: false }, *pred));
            }
        }
    }
    if !exhaustive_e2e && let Some((f, pred)) = predicted.first() {
        combos.push((Combo { fusion: *f, parallel: par_off, batch: true, default: false }, *pred));
        if gpu {
            combos.push((Combo { fusion: *f, parallel: par_on, batch: false, default: false }, *pred));
        }
    }

    let prompt: Vec<u32> = (0..o.prefill_tokens).map(|i| ((i * 7919 + 13) % t.config.vocab_size) as u32).collect();
    let weight_bytes = {
        let plan = Plan::new(t.model, t.config, plan_options(o, Fusion::NONE, par_on), Selection::defaults(caps.clone()))?;
        plan.weight_bytes()
    };
    // CPU engines share their weights (a WeightMemo): the fused layouts (QKV, gate/up)
    // add at most one more copy of those matrices.
    let memo = WeightMemo::default();
    let interleave = !gpu && weight_bytes.saturating_mul(2) < available_memory() / 5 * 2;
    progress
        .phase(&format!("end to end: {} combinations{}", combos.len(), if interleave { ", interleaved" } else { "" }), combos.len() as u64);
    let e2e_rounds = 5;
    let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); combos.len()];
    let mut errors: Vec<Option<String>> = vec![None; combos.len()];
    let selection_for = |c: &Combo| -> Selection {
        let mut sel = Selection::defaults(caps.clone());
        if !c.default {
            sel.slots = winners.clone();
        }
        sel
    };
    let mut rng_state = o.seed;
    if interleave {
        let mut engines: Vec<Option<Engine>> = Vec::new();
        for (i, (c, _)) in combos.iter().enumerate() {
            match build_engine(t, o, c, selection_for(c), &memo) {
                Ok(e) => engines.push(Some(e)),
                Err(e) => {
                    errors[i] = Some(e.to_string());
                    engines.push(None);
                }
            }
            progress.tick();
        }
        let mut round_time = Duration::ZERO;
        for round in 0..e2e_rounds {
            // Two rounds always; more only while another fits in the budget.
            if round >= 2 && Instant::now() + round_time > deadline {
                break;
            }
            let round_start = Instant::now();
            // A fixed pseudo-random rotation per round.
            rng_state = rng_state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let off = (rng_state >> 33) as usize % combos.len().max(1);
            for j in 0..combos.len() {
                let i = (j + off) % combos.len();
                if let Some(e) = engines[i].as_mut() {
                    match e2e_sample(e, &prompt, E2E_DECODE_STEPS) {
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
                let score = |i: usize| -> Vec<f64> {
                    samples[i].0.iter().zip(&samples[i].1).map(|(p, d)| p + o.decode_tokens as f64 * d).collect()
                };
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
        for (i, (c, _)) in combos.iter().enumerate() {
            // The default and the best predicted combination always; the rest while
            // one more fits in the budget.
            if i > 1 && Instant::now() + combo_time > deadline {
                continue;
            }
            let combo_start = Instant::now();
            match build_engine(t, o, c, selection_for(c), &memo) {
                Ok(mut e) => {
                    let mut sample_time = Duration::ZERO;
                    for round in 0..e2e_rounds {
                        if round >= 2 && Instant::now() + sample_time > deadline {
                            break;
                        }
                        let t0 = Instant::now();
                        match e2e_sample(&mut e, &prompt, E2E_DECODE_STEPS) {
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
            combo_time = combo_time.max(combo_start.elapsed());
            progress.tick();
        }
    }
    progress.done();
    for (i, e) in errors.iter().enumerate() {
        if let Some(e) = e {
            progress.note(&format!("combination `{}` failed end to end: {e}", combos[i].0.label()));
        }
    }

    // Score: prefill + decode_tokens × per-token decode (one request's time).
    let score = |i: usize| -> Stats {
        let (p, d) = &samples[i];
        let s: Vec<f64> = p.iter().zip(d).map(|(p, d)| p + o.decode_tokens as f64 * d).collect();
        summarize(&s)
    };
    let scores: Vec<Stats> = (0..combos.len()).map(|i| if errors[i].is_some() { Stats::default() } else { score(i) }).collect();
    let Some(best) = pick(&scores, TIE) else {
        return Err(TuneError::Invalid("no combination ran end to end; see the notes above".into()));
    };
    let thr = |i: usize| throughput(o.prefill_tokens, &summarize(&samples[i].0), &summarize(&samples[i].1));
    let default_i = 0;
    let chosen = &combos[best].0;
    let chosen_sel = selection_for(chosen);

    // The explicit choices of the winner: race winners, or the default's own picks.
    let mut final_choices: BTreeMap<SlotKey, Choice> = BTreeMap::new();
    let (_, steps) = per_fusion.iter().find(|(f, _)| *f == chosen.fusion).cloned().unwrap_or((chosen.fusion, Vec::new()));
    for (key, p, d) in &steps {
        if let Ok(c) = chosen_sel.choose(key.0, key.1, None, p, *d) {
            final_choices.entry(*key).or_insert(c);
        }
    }
    // Device requirements of the chosen variants.
    let mut req = DeviceReq {
        backend: Some(pd::At::new(caps.backend().name().to_string())),
        vendor: Some(t.device.vendor()),
        ..DeviceReq::default()
    };
    for (key, p, d) in &steps {
        if let Some(c) = final_choices.get(key)
            && let Impl::Wgsl(w) = &c.kernel.imp
        {
            req.requires_f16 |= (w.needs_f16)(*d);
            req.requires_subgroups |= w.needs_subgroups;
            req.min_shared_memory = req.min_shared_memory.max((w.shared_memory)(p, *d, &c.params).unwrap_or_default());
        }
    }
    let exec = ExecSettings {
        batch: chosen.batch,
        fusion: chosen.fusion,
        parallel: chosen.parallel,
        kv_dtype: o.kv_dtype,
        weight_dtype: o.weight_dtype,
    };
    let (execution, parallel) = exec.to_doc();

    let slots: Vec<SlotTuning> = results
        .iter()
        .zip(&races)
        .map(|(res, r)| {
            let w = Workload::describe_work(&r.shapes, r.dtype);
            let cands = res
                .cands
                .iter()
                .filter(|c| c.stats.n > 0)
                .map(|c| {
                    let s = &c.stats;
                    let gbps = w.0 / s.median / 1e9;
                    Candidate {
                        variant: pd::VariantDoc { kernel: c.kernel.clone(), params: c.params.clone() },
                        median_us: s.median * 1e6,
                        ci_us: [s.ci[0] * 1e6, s.ci[1] * 1e6],
                        mad_us: s.mad * 1e6,
                        samples: s.n,
                        outliers: s.outliers,
                        gbps,
                        gflops: w.1 / s.median / 1e9,
                        pct_of_bandwidth: if limit_gbps > 0.0 { gbps / limit_gbps * 100.0 } else { 0.0 },
                        status: c.status.clone(),
                    }
                })
                .collect();
            SlotTuning {
                slot: res.slot.clone(),
                regime: res.regime.clone(),
                problem: res.problem.clone(),
                count: res.count,
                chosen: res
                    .cands
                    .get(res.winner)
                    .map(|c| pd::VariantDoc { kernel: c.kernel.clone(), params: c.params.clone() }.to_string())
                    .unwrap_or_default(),
                candidates: cands,
                rejected: res.rejected.iter().map(|(v, why)| pd::Rejected { variant: v.clone(), reason: why.clone() }).collect(),
            }
        })
        .collect();
    let timing = if results.iter().any(|r| r.timestamps) { "gpu-timestamps" } else { "wall-clock" };
    let tuning = Tuning {
        fingerprint: t.device.fingerprint(),
        device_name: t.device.name(),
        ktune_version: env!("CARGO_PKG_VERSION").into(),
        kernel_set: kernels::kernel_set_hash(),
        timing: format!("{timing} (slots); wall-clock (end to end)"),
        date: utc_now(),
        strategy: o.strategy.name().into(),
        seed: o.seed,
        budget_s: o.budget.as_secs_f64(),
        used_s: start.elapsed().as_secs_f64(),
        prefill_tokens: o.prefill_tokens,
        context: o.context,
        limits: pd::Limits { read_gbps: limit_gbps, read_source: limit_src.into() },
        space: pd::SpaceSummary { variants, ruled_out, combinations: format!("{combos_total:.3e}"), fusion_choices: per_fusion.len() },
        slots,
        end_to_end: pd::EndToEnd {
            prefill_tokens: o.prefill_tokens,
            decode_tokens: o.decode_tokens,
            tuned: thr(best),
            default: thr(default_i),
            combinations: combos
                .iter()
                .enumerate()
                .filter(|(i, _)| !samples[*i].0.is_empty())
                .map(|(i, (c, pred))| Combination {
                    label: c.label(),
                    predicted_ms: if pred.is_finite() { pred * 1e3 } else { 0.0 },
                    result: thr(i),
                    chosen: i == best,
                })
                .collect(),
        },
    };
    let doc = ProfileDoc {
        name: format!("{}-{}-{}", t.model, t.device.vendor(), &t.device.fingerprint()[..8]),
        model: t.model.into(),
        version: pd::At::new(FORMAT_VERSION),
        device: req,
        kernels: kernels_doc(&final_choices),
        execution,
        parallel,
        layers: BTreeMap::new(),
        scheduling: SchedulingDoc::default(),
        tuning: Some(tuning),
    };
    Ok(TuneResult { doc, resumed_slots: resumed })
}

impl Workload {
    /// Bytes and flops of one composite sample of `shapes`.
    pub fn describe_work(shapes: &[(Problem, usize)], dtype: DType) -> (f64, f64) {
        shapes.iter().fold((0.0, 0.0), |(b, f), (p, n)| (b + p.min_bytes(dtype) * *n as f64, f + p.flops() * *n as f64))
    }
}

impl Runner {
    /// Median seconds per shape (by description), from the per-shape samples.
    fn shape_medians(&self, w: &Workload) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for (i, (p, _)) in w.shapes.iter().enumerate() {
            if let Some(s) = self.shape_samples.get(i) {
                m.insert(p.describe(), summarize(s).median);
            }
        }
        m
    }
}

/// Current UTC time, RFC 3339 (seconds).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuCaps;
    use crate::kernels::{Op, param};

    /// A landscape where two parameters only pay together: moving `mc` alone helps
    /// a little, moving `kc` alone hurts, both together win by far. The axis sweep
    /// cannot reach the optimum; the descent must, within its steps.
    #[test]
    fn descent_finds_an_optimum_two_axes_away() {
        let k = kernels::find("gemm_blocked_cpu").expect("gemm_blocked_cpu registered");
        let caps = DeviceCaps::Cpu(CpuCaps::detect());
        let prob = test_problems(Op::Gemm).into_iter().max_by_key(|p| p.describe().len()).expect("a gemm test shape");
        let r = RaceDef { key: (crate::plan::select::Slot::MatmulQkv, Regime::Prefill), dtype: DType::F32, shapes: vec![(prob, 1)] };
        let cost = |q: &kernels::Params| -> f64 {
            let (mc, kc, nc) = (param(q, "mc").unwrap_or(0), param(q, "kc").unwrap_or(0), param(q, "nc").unwrap_or(0));
            let mut c = 10.0 + (nc as f64 - 256.0).abs() / 1000.0;
            match (mc == 192, kc == 128) {
                (true, true) => c = 1.0,
                (true, false) => c -= 1.0,
                (false, true) => c += 2.0,
                _ => {}
            }
            c
        };
        let (sweep, mut pool) = candidates(&r, &caps, Strategy::Auto);
        let blocked = sweep.iter().filter(|c| c.kernel.id == k.id).count();
        assert!(blocked > 5, "the sweep of {} is valid on the test shape: {blocked} sets", k.id);
        assert!(sweep.iter().all(|c| cost(&c.params) > 1.0), "the axis sweep alone already holds the optimum");
        let mut all = sweep;
        for _ in 0..DESCENT_STEPS {
            let timed: Vec<(&Cand, f64)> = all.iter().map(|c| (c, cost(&c.params))).collect();
            let next = descent_candidates(&timed, &r, &caps, &mut pool);
            if next.is_empty() {
                break;
            }
            all.extend(next);
        }
        let best = all.iter().map(|c| cost(&c.params)).fold(f64::INFINITY, f64::min);
        assert_eq!(best, 1.0, "descent stopped at {best}; proposed {} sets", all.len());
        // Nothing is proposed twice.
        let mut uniq: Vec<String> = all.iter().map(|c| format!("{:?}", c.params)).collect();
        let n = uniq.len();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), n);
    }
}
