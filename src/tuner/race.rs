//! The slot races, the second stage of a tune: each race's candidates are gated by
//! correctness (the parity check against the CPU reference), timed at the race's
//! shapes (interleaved rounds, robust statistics, early drops), and walked by
//! coordinate descent from the best of the axis sweep (auto, halving). Finished
//! races are cached as they come, so an interrupted tune resumes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::measure::{self, Cand, Deadline, FULL_SAMPLES, Holding, Rotation, Runner, Strategy, Workload, race};
use super::space::{Generated, RaceDef, Space, candidates};
use super::{Progress, SEARCH_REVISION, TIE, Target, TuneError, TuneOptions};
use crate::device::DeviceCaps;
use crate::gpu::GpuCtx;
use crate::kernels::problem::test_problems;
use crate::kernels::verify::{InputMemo, Runner as CheckRunner, check_one};
use crate::kernels::{self, DType, Problem};
use crate::plan::select::SlotKey;
use crate::profile::build::{CandRecord, RaceResult};
use crate::profile::cache::{self, Cache};
use crate::stats::{Stats, pick, summarize};

/// The races of a tune, in the order of [`Space::races`].
pub(crate) struct Races {
    pub results: Vec<RaceResult>,
    /// How many came from the cache.
    pub resumed: usize,
}

/// Race winners as a selection holds them.
pub type Winners = crate::plan::select::SlotChoices;

impl Races {
    /// The winner of every race that has one: by slot, and by (format, slot) for
    /// the races of a file's other matrix formats (`extra`).
    pub fn winners(&self, space: &Space, extra: &std::collections::BTreeSet<DType>) -> Winners {
        let mut w = Winners::default();
        for (r, res) in space.races.iter().zip(&self.results) {
            if let Some(c) = res.winner_choice() {
                w.insert(r.dtype, r.key, c, extra);
            }
        }
        w
    }

    /// The winner's median on shape `p` of the race `key` (seconds; 0 when unknown).
    pub fn shape_time(&self, space: &Space, key: SlotKey, p: &Problem) -> f64 {
        space
            .races
            .iter()
            .zip(&self.results)
            .find(|(r, _)| r.key == key)
            .and_then(|(_, res)| res.shape_medians.get(res.winner).and_then(|m| m.get(&p.describe())).copied())
            .unwrap_or(0.0)
    }
}

/// Runs every race of `space` until the races' share of what is left of the
/// budget (`shares.full`, the slot stage's [`super::budget::RACES_SHARE`]: the
/// slot deadline; past `shares.limit` no race starts), sharing what is left of the
/// time evenly over the races still to run (each race's [`Deadline::share`]: past
/// its share plus a quarter, a race prepares and samples nothing more but its
/// first candidate). `cache` keeps finished races as they come; with `resume`
/// races already there are reused.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_all(
    t: &Target<'_>,
    o: &TuneOptions,
    space: &Space,
    cache: Option<&Cache>,
    resume: bool,
    budget: &super::budget::Budget,
    shares: &super::budget::RaceShares,
    progress: &dyn Progress,
) -> Result<Races, TuneError> {
    let slot_deadline = budget.share(shares.full);
    let races_limit = budget.share(shares.limit);
    let races = &space.races;
    let mut results: Vec<RaceResult> = Vec::new();
    let mut resumed = 0;
    let mut gates = GateCache::new();
    // Large inputs (an LM head's weight) drawn once for every race binding them.
    let memo = InputMemo::new(MEMO_MIN_BYTES);
    // The best rate (flop/s) a finished race's winner reached on this device: what
    // a vision race's first candidate is estimated at before it starts.
    let mut rate: Option<f64> = None;
    // Races with candidates (a slot without any has nothing to cut), and those of
    // them the budget left out.
    let caps = DeviceCaps::from(t.device);
    let raceable = races.iter().filter(|r| !candidates(r, &caps, o.strategy).0.is_empty()).count();
    let mut skipped = 0;
    // The races run so far and their time; those started within the slot
    // deadline that reached only part of their candidates, and how many they
    // left.
    let (mut ran, mut spent, mut first_only) = (0u32, Duration::ZERO, 0);
    let (mut short, mut unreached) = (0, 0);
    for (i, r) in races.iter().enumerate() {
        let key = race_cache_key(t, r, o, space);
        if let Some(done) = cache.filter(|_| resume).and_then(|c| c.get::<RaceResult>("slots", &key)) {
            resumed += 1;
            rate = best_rate(rate, r, &done);
            results.push(done);
            continue;
        }
        // Past the races' share of the budget a race measures its first
        // candidate alone; on the CPU, where the mean time of the races run so
        // far would carry it past the races' limit, it is not run (its slot keeps
        // the runtime's default kernels; not cached: a resumed tune with a larger
        // budget races it). A GPU tune still races every slot (its first
        // candidate at least).
        let mean = if ran > 0 { spent / ran } else { Duration::ZERO };
        if t.ctx.is_none() && Instant::now() + mean >= races_limit {
            let res = unraced(t, r, o, "past the slot races' share of the budget");
            skipped += usize::from(left_out(&res));
            results.push(res);
            continue;
        }
        // Share what is left of the slot budget evenly over the races still to run.
        let left = slot_deadline.saturating_duration_since(Instant::now());
        let share = left / (races.len() - i) as u32;
        if let Some(why) = unaffordable(r, rate, share, races_limit.saturating_duration_since(Instant::now())) {
            progress.note(&format!(
                "{} ({}) not raced: {why}; {} keeps the runtime's default for it (a larger --budget races it)",
                r.key.0,
                r.key.1.name(),
                if r.key.1 == crate::plan::Regime::Vision { "the tower" } else { "the model" }
            ));
            // Not cached: a resumed tune with a larger budget races it.
            let res = unraced(t, r, o, &why);
            skipped += usize::from(left_out(&res));
            results.push(res);
            continue;
        }
        let race_start = Instant::now();
        first_only += usize::from(race_start >= slot_deadline);
        let res = run_race(t, r, o, Deadline::share(share), &mut gates, (&memo, &space.holding), progress);
        spent += race_start.elapsed();
        ran += 1;
        let cut_short = res.rejected.iter().filter(|(_, why)| why == NOT_REACHED).count();
        if cut_short > 0 && race_start < slot_deadline {
            (short, unreached) = (short + 1, unreached + cut_short);
        }
        // A lost device fails every candidate from here on: stop, caching nothing of it.
        if let Some(lost) = t.ctx.as_ref().and_then(|c| c.lost()) {
            return Err(lost.into());
        }
        if let Some(c) = cache {
            c.put("slots", &key, &res)?;
        }
        rate = best_rate(rate, r, &res);
        results.push(res);
    }
    progress.done();
    let name = shares.name;
    if short > 0 {
        budget.cut(format!(
            "{name}: {short} of {raceable} timed part of their candidates ({unreached} not reached within their shares; a larger --budget times them)"
        ));
    }
    if first_only > 0 {
        budget.cut(format!("{name}: {first_only} of {raceable} measured their first candidate alone"));
    }
    if skipped > 0 {
        budget.cut(format!(
            "{name}: {} of {} raced; the other {skipped} slots keep the runtime's default kernels",
            raceable - skipped,
            raceable
        ));
    }
    Ok(Races { results, resumed })
}

/// Inputs of at least this many bytes are drawn once for all the slot races.
const MEMO_MIN_BYTES: usize = 16 << 20;

/// A first candidate the budget always measures, however little is left (as every
/// race measures its first): below this estimate a vision race runs.
const ALWAYS_AFFORDABLE_S: f64 = 2.0;

/// The faster of `rate` and the rate (flop/s of one weighted pass) of `res`'s winner.
fn best_rate(rate: Option<f64>, r: &RaceDef, res: &RaceResult) -> Option<f64> {
    let flops: f64 = r.shapes.iter().map(|(p, n)| p.flops() * *n as f64).sum();
    let mine = res.cands.get(res.winner).filter(|c| c.stats.n > 0 && c.stats.median > 0.0).map(|c| flops / c.stats.median);
    match (rate, mine.filter(|x| x.is_finite() && *x > 0.0)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Why a race cannot start within its time: its first candidate (a warm-up and
/// one sample, each one execution of every shape) estimated at the best rate a
/// finished race reached on this device (`rate`), past [`ALWAYS_AFFORDABLE_S`]
/// and past, for a vision race, its hard deadline (a quarter over its `share`),
/// for a text race a quarter over all that is `left` of the races' time (a text
/// race may take others' shares: their slots then keep the defaults too). A slot
/// without a winner keeps the runtime's default (the profile leaves it out).
/// Large towers on slow adapters (SigLIP's 4096 patches on a software
/// rasterizer: a minute per attention layer), or a large vocabulary's LM head
/// over the prompt on two cores, would otherwise spend many times the budget on
/// one sample.
fn unaffordable(r: &RaceDef, rate: Option<f64>, share: Duration, left: Duration) -> Option<String> {
    let rate = rate?;
    let flops: f64 = r.shapes.iter().map(|(p, _)| p.flops()).sum();
    let est = 2.0 * flops / rate;
    let within = if r.key.1 == crate::plan::Regime::Vision { share } else { left };
    let allowed = within.as_secs_f64() * 1.25;
    (est > allowed.max(ALWAYS_AFFORDABLE_S)).then(|| {
        format!(
            "its first candidate would take about {est:.1} s ({:.1} GFLOP at the best {:.2} GFLOP/s a race reached here), its time in the budget is {allowed:.1} s",
            2.0 * flops / 1e9,
            rate / 1e9
        )
    })
}

/// Whether `res` is a race the budget left out: a candidate of it not reached
/// for a reason ([`unraced`]).
fn left_out(res: &RaceResult) -> bool {
    res.rejected.iter().any(|(_, why)| why.strip_prefix(NOT_REACHED).is_some_and(|w| w.starts_with(": ")))
}

/// The record of a race that did not run: every candidate not reached, for `why`.
fn unraced(t: &Target<'_>, r: &RaceDef, o: &TuneOptions, why: &str) -> RaceResult {
    let caps = DeviceCaps::from(t.device);
    let (cands, mut pool) = candidates(r, &caps, o.strategy);
    pool.rejected.extend(cands.iter().map(|c| (c.kernel.label(&c.params), format!("{NOT_REACHED}: {why}"))));
    RaceResult {
        slot: r.key.0.name().into(),
        regime: r.key.1.name().into(),
        problem: if r.shapes.len() == 1 { r.shapes[0].0.describe() } else { format!("{} shapes", r.shapes.len()) },
        count: r.shapes.iter().map(|s| s.1).sum(),
        winner: 0,
        cands: Vec::new(),
        rejected: pool.rejected,
        shape_medians: Vec::new(),
        timestamps: false,
        copies: Vec::new(),
    }
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

/// The cache key of race `r` of `space`: the device, the op's kernels, the
/// slot, regime, storage type and shapes, the search and its measurement, and
/// how the inputs are held where it is not the slot races' way (the batch
/// regimes' kept panels and X8 records: a race timed over plain rows is not
/// resumed for one over the server's layouts).
fn race_cache_key(t: &Target<'_>, r: &RaceDef, o: &TuneOptions, space: &Space) -> String {
    let shapes: Vec<String> = r.shapes.iter().map(|(p, n)| format!("{}x{n}", p.describe())).collect();
    let mut parts = vec![
        t.device.fingerprint(),
        cache::op_hash(r.shapes[0].0.op()),
        r.key.0.name().to_string(),
        r.key.1.name().to_string(),
        r.dtype.name().to_string(),
        shapes.join(";"),
        o.strategy.name().to_string(),
        o.seed.to_string(),
        o.measurement_key(),
        SEARCH_REVISION.to_string(),
    ];
    parts.extend(space.holding.key());
    crate::hash::sha256_parts(&parts)
}

/// Coordinate-descent steps after the axis sweep (auto and halving).
pub(crate) const DESCENT_STEPS: usize = 4;
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
        let name = c.kernel.label(&c.params);
        if !(first_free && passed.is_empty()) && Instant::now() > deadline {
            rejected.push((name, NOT_REACHED.into()));
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
pub(crate) fn descent_candidates(timed: &[(&Cand, f64)], r: &RaceDef, caps: &DeviceCaps, pool: &mut Generated) -> Vec<Cand> {
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

/// A candidate whose execution once warm ([`Runner::exec_s`]) takes this many
/// times the fastest one's is not raced.
const TOO_SLOW: f64 = 8.0;
/// ... when its warm-up took at least this long (seconds): below it, one run says
/// little (first-call costs, scheduling) and sampling is cheap anyway.
const TOO_SLOW_MIN_S: f64 = 0.05;

/// Runners for `cands` (each warmed up once per shape) while `deadline` is not
/// exhausted; with `first_free` the first is prepared in any case (a race needs
/// one), and the fastest warm-up so far still fits before its hard stop. The
/// rest are rejected as not reached, and those whose execution once warm took
/// [`TOO_SLOW`] times the fastest's (the per-query attention at a tower's 4096
/// patches: 30x the flash kernel, tens of seconds a run) as too slow to race,
/// without the samples that would cost the race its share (their warm-up past
/// [`TOO_SLOW_MIN_S`]; the warm-up itself is not compared: where packed rows
/// are kept it packs them, once, as a server does). A kernel one of whose
/// parameter sets was too slow that way has its other sets rejected unprepared
/// ([`SlowKernels`]): an LM head's f32 panel kernel took a second each to warm
/// up, 18x the int8 GEMM once warm, and its four sets left a batch race's
/// samples to its first candidate alone.
fn prepare(cands: Vec<Cand>, w: &Workload, deadline: Deadline, rejected: &mut Vec<(String, String)>, first_free: bool) -> Vec<Runner> {
    let mut out: Vec<Runner> = Vec::new();
    let (mut best, mut best_exec) = (f64::INFINITY, f64::INFINITY);
    let mut slow = SlowKernels::default();
    for c in cands {
        // Exhausted, or would be before even the fastest warm-up so far is over.
        let fits = || deadline.hard.is_none_or(|h| best.is_infinite() || Instant::now() + Duration::from_secs_f64(best) <= h);
        if !(first_free && out.is_empty()) && (deadline.exhausted() || !fits()) {
            rejected.push((c.kernel.label(&c.params), NOT_REACHED.into()));
            continue;
        }
        if let Some(why) = slow.sibling(c.kernel.id, best_exec) {
            rejected.push((c.kernel.label(&c.params), why));
            continue;
        }
        let r = Runner::new(c, w);
        if r.error.is_none() {
            best = best.min(r.warm_up);
            best_exec = best_exec.min(r.exec_s);
            slow.note(r.cand.kernel.id, r.warm_up, r.exec_s, best_exec);
        }
        out.push(r);
    }
    out.retain(|x| {
        let slow = x.error.is_none() && too_slow(x.warm_up, x.exec_s, best_exec);
        if slow {
            rejected.push((
                x.cand.kernel.label(&x.cand.params),
                format!("too slow to race: {:.3} ms an execution once warm, {:.0}x the fastest", x.exec_s * 1e3, x.exec_s / best_exec),
            ));
        }
        !slow
    });
    out
}

/// Whether a candidate that warmed up in `warm_up` seconds and runs in
/// `exec_s` once warm is too slow to race beside one of `best_exec`.
fn too_slow(warm_up: f64, exec_s: f64, best_exec: f64) -> bool {
    warm_up >= TOO_SLOW_MIN_S && exec_s > TOO_SLOW * best_exec
}

/// The kernels a race's preparation found [`too_slow`] in one parameter set,
/// with that set's execution time once warm.
#[derive(Default)]
struct SlowKernels(Vec<(&'static str, f64)>);

impl SlowKernels {
    /// Records kernel `id` when a set of it that warmed up in `warm_up` and
    /// runs in `exec_s` is too slow beside `best_exec`.
    fn note(&mut self, id: &'static str, warm_up: f64, exec_s: f64, best_exec: f64) {
        if too_slow(warm_up, exec_s, best_exec) && !self.0.iter().any(|(k, _)| *k == id) {
            self.0.push((id, exec_s));
        }
    }

    /// Why another parameter set of kernel `id` is not prepared: one of its
    /// sets ran more than [`TOO_SLOW`] times `best_exec` (the fastest so far).
    fn sibling(&self, id: &str, best_exec: f64) -> Option<String> {
        let &(_, exec) = self.0.iter().find(|(k, _)| *k == id)?;
        (exec > TOO_SLOW * best_exec).then(|| {
            format!(
                "too slow to race: another parameter set of {id} ran {:.3} ms an execution once warm, {:.0}x the fastest (not prepared)",
                exec * 1e3,
                exec / best_exec
            )
        })
    }
}

/// Not prepared, or prepared and never sampled, before the race's deadline.
const NOT_REACHED: &str = "not reached within the budget";

/// Runs one race within `deadline`: gates, prepares (a warm-up run per shape) and
/// samples candidates while its time lasts; those it did not reach are rejected
/// as such, so the race's cost is bounded by its share of the budget whatever a
/// sample costs (but its first candidate's).
/// One slot's race; `(memo, holding)`: the inputs drawn once for every race,
/// and how the race holds its inputs ([`Space::holding`]).
fn run_race(
    t: &Target<'_>,
    r: &RaceDef,
    o: &TuneOptions,
    deadline: Deadline,
    gates: &mut GateCache,
    (memo, holding): (&InputMemo, &Holding),
    progress: &dyn Progress,
) -> RaceResult {
    let caps = DeviceCaps::from(t.device);
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
    let passed = gate_all(cands, r, &caps, t, o, deadline.soft, gates, &mut pool.rejected, true);
    let rotate = Rotation::for_device(t.device, o.gpu_l2_bytes).rotate_bytes;
    // The inputs move to huge pages within half the race's share at most (past
    // it they stay on 4 KiB pages, for every candidate alike).
    let now = Instant::now();
    kernels::memory::collapse_until(Some(now + deadline.soft.saturating_duration_since(now) / 2));
    let mut w =
        Workload::with_memo(r.shapes.clone(), r.dtype, t.ctx.clone(), o.seed, usize::try_from(rotate).unwrap_or(usize::MAX), Some(memo));
    w.hold(holding);
    let mut runners = prepare(passed, &w, deadline, &mut pool.rejected, true);
    let n = runners.len() as u64;
    progress.phase(&format!("{} ({}) {} candidates", r.key.0, r.key.1.name(), n), n * FULL_SAMPLES as u64);
    race(&mut runners, &w, o.strategy, deadline, o.seed, 0, |_| progress.tick());
    if matches!(o.strategy, Strategy::Auto | Strategy::Halving) {
        for step in 1..=DESCENT_STEPS {
            if deadline.passed() {
                break;
            }
            let timed: Vec<(&Cand, f64)> =
                runners.iter().filter(|x| x.error.is_none() && !x.samples.is_empty()).map(|x| (&x.cand, x.stats().median)).collect();
            let next = descent_candidates(&timed, r, &caps, &mut pool);
            let passed = gate_all(next, r, &caps, t, o, deadline.soft, gates, &mut pool.rejected, false);
            let passed = prepare(passed, &w, deadline, &mut pool.rejected, false);
            if passed.is_empty() {
                break;
            }
            let n = passed.len() as u64;
            runners.extend(passed);
            progress.phase(&format!("{} ({}) descent {step}: {n} more candidates", r.key.0, r.key.1.name()), n * FULL_SAMPLES as u64);
            race(&mut runners, &w, o.strategy, deadline, o.seed + step as u64, step * measure::rounds(o.strategy).len(), |_| {
                progress.tick()
            });
        }
    }
    // Prepared but never sampled (the race's time ran out first): not reached.
    runners.retain(|x| {
        let unreached = x.error.is_none() && x.samples.is_empty();
        if unreached {
            pool.rejected.push((x.cand.kernel.label(&x.cand.params), NOT_REACHED.into()));
        }
        !unreached
    });
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
            pool.rejected.push((x.cand.kernel.label(&x.cand.params), format!("failed while timing: {e}")));
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
        copies: (0..w.shapes.len()).map(|i| w.copies(i)).collect(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuCaps;
    use crate::kernels::{Op, param};
    use crate::plan::Regime;

    /// A batch regime's race (packed rows kept) weighs its candidates by what
    /// an execution costs once warm, not by the warm-up, which packs the int8
    /// GEMM's rows for every input copy once (as a server packs them once): at
    /// two sequences of a gate/up-sized Q4_0 matrix its warm-up is many times
    /// the decode dots' (which pack nothing) while an execution costs about as
    /// much. Ruled out as too slow by its warm-up, the race had left a table
    /// of SmolLM2-135M's batch of 2 an f32 kernel 7x slower end to end.
    #[test]
    fn a_kept_panel_warm_up_does_not_rule_a_candidate_out() {
        let p = Problem::Gemm { m: 2, n: 3072, k: 576 };
        let cand = |id: &str| {
            let k = kernels::find(id).expect("registered");
            Cand { kernel: k, params: k.default_params() }
        };
        // Copies enough for the warm-up to count (every copy packed once).
        let mut w = Workload::new(vec![(p, 1)], DType::Q4_0, None, 5, 256 << 20);
        w.keep_panels();
        let far = Deadline { soft: Instant::now() + Duration::from_secs(3600), hard: None };
        let mut rejected = Vec::new();
        let runners = prepare(vec![cand("gemm_q_dots_cpu"), cand("gemm_q_i8_cpu")], &w, far, &mut rejected, true);
        assert!(rejected.is_empty(), "{rejected:?}");
        let ids: Vec<&str> = runners.iter().map(|r| r.cand.kernel.id).collect();
        assert_eq!(ids, ["gemm_q_dots_cpu", "gemm_q_i8_cpu"]);
        let (dots, gemm) = (&runners[0], &runners[1]);
        assert!(dots.error.is_none() && gemm.error.is_none(), "{:?} {:?}", dots.error, gemm.error);
        assert!(gemm.exec_s > 0.0 && gemm.exec_s < gemm.warm_up, "{} s an execution, {} s the warm-up", gemm.exec_s, gemm.warm_up);
    }

    /// A kernel found too slow in one parameter set has its other sets
    /// rejected before they are prepared (each warm-up may cost a second),
    /// naming the set's time; other kernels, and a kernel whose set was
    /// slow but not [`TOO_SLOW`] times the fastest, are prepared.
    #[test]
    fn a_kernel_too_slow_in_one_set_is_not_prepared_in_others() {
        let mut slow = SlowKernels::default();
        let best = 0.0014;
        slow.note("gemm_q_i8_cpu", 0.7, best, best);
        slow.note("gemm_q_panel_cpu", 0.85, 0.0254, best);
        // Slow but cheap to warm up: one run says little, so it is not judged.
        slow.note("gemm_q_dots_cpu", 0.01, 0.05, best);
        let why = slow.sibling("gemm_q_panel_cpu", best).expect("the panel kernel's other sets are left out");
        assert!(why.contains("25.400 ms") && why.contains("18x"), "{why}");
        assert_eq!(slow.sibling("gemm_q_i8_cpu", best), None);
        assert_eq!(slow.sibling("gemm_q_dots_cpu", best), None);
        // Judged against the fastest so far when the sibling comes.
        assert_eq!(slow.sibling("gemm_q_panel_cpu", 0.004), None, "6x a slower best is raced");
    }

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

    /// A CPU race over block-format weights (a decode batch's projection, 8
    /// rows of Q4_0) starts from what runs without a profile, the runtime's
    /// int8-activation default, then the exact selection's f32 one: a race
    /// the budget cuts to one candidate times the kernel a server would run
    /// anyway (it timed the f32 one, 4 to 6 times slower on a 1B model's
    /// projections, and its table lost to the default end to end).
    #[test]
    fn a_race_starts_from_the_runtimes_default_then_the_exact_one() {
        use crate::plan::Selection;
        use crate::plan::select::Slot;
        let caps = DeviceCaps::Cpu(CpuCaps::detect());
        let r = RaceDef {
            key: (Slot::MatmulQkv, Regime::Prefill),
            dtype: DType::Q4_0,
            shapes: vec![(Problem::Gemm { m: 8, n: 192, k: 256 }, 2)],
        };
        let (cands, _) = candidates(&r, &caps, Strategy::Auto);
        let default = |sel: Selection| sel.default_choice(r.key.0, r.key.1, &r.shapes[0].0, r.dtype).expect("a default");
        let (runtime, exact) = (default(Selection::runtime(caps.clone())), default(Selection::defaults(caps.clone())));
        let label = |c: &Cand| c.kernel.label(&c.params);
        assert_ne!(runtime.kernel.label(&runtime.params), exact.kernel.label(&exact.params), "int8 against f32 activations");
        assert_eq!(label(&cands[0]), runtime.kernel.label(&runtime.params));
        assert_eq!(label(&cands[1]), exact.kernel.label(&exact.params));
        assert_eq!(cands.iter().filter(|c| label(c) == label(&cands[0])).count(), 1, "listed once");
    }

    /// A race whose time runs out after its gate (the gate's parity checks are
    /// cheap; preparing a candidate warms it up at the real shapes, and a sample
    /// times them: seconds each for the vision tower's ops) prepares and samples
    /// its first candidate (the runtime's default) once and nothing else: every
    /// other variant is rejected as not reached. A race that ignored its budget
    /// past the gate would warm up and time all of them. No clock decides the
    /// verdict: the hard stop is past before the race starts, the soft one an hour
    /// away (so the gate runs every candidate).
    #[test]
    fn a_race_past_its_budget_measures_only_its_first_candidate() {
        use crate::plan::select::Slot;
        let config = crate::model::builtin("smollm2-135m").expect("built-in config");
        let device = crate::device::Device::Cpu(CpuCaps::detect());
        let t = crate::tuner::test_target(&config, &device);
        let o = crate::tuner::test_options(Duration::from_millis(1));
        let caps = DeviceCaps::from(&device);
        // A tiny tower's attention (64 patches, 2 heads of 16), as the vision regime races it.
        let r = RaceDef {
            key: (Slot::VisionAttention, Regime::Vision),
            dtype: DType::F32,
            shapes: vec![(Problem::AttentionFull { tokens: 64, heads: 2, head_dim: 16, scale: 0.25 }, 2)],
        };
        let (all, _) = candidates(&r, &caps, Strategy::Auto);
        assert!(all.len() > 3, "the op has several candidates: {}", all.len());
        let spent = Deadline { soft: Instant::now() + Duration::from_secs(3600), hard: Some(Instant::now()) };
        let res = run_race(&t, &r, &o, spent, &mut GateCache::new(), (&InputMemo::new(0), &Holding::default()), &crate::progress::Silent);
        assert_eq!(res.cands.len(), 1, "only the first candidate is measured: {:?}", res.cands);
        assert_eq!(res.cands[0].kernel, all[0].kernel.id, "the runtime's default");
        assert_eq!(res.cands[0].stats.n, 1, "one sample: {:?}", res.cands[0].stats);
        let unreached = res.rejected.iter().filter(|(_, why)| why == NOT_REACHED).count();
        assert_eq!(unreached, all.len() - 1, "{:?}", res.rejected);
    }

    /// A race whose first candidate, at the best rate measured so far, would
    /// overrun the always-affordable floor and its time (a vision race: its share;
    /// a text race: all that is left of the races' time) is not started; cheap
    /// races, and any race before a rate is known, are.
    #[test]
    fn a_race_past_its_budget_by_estimate_is_not_started() {
        use crate::plan::select::Slot;
        let big = Problem::Linear { m: 4096, n: 4304, k: 1152, gelu: true };
        let race =
            |slot: Slot, regime: Regime, p: &Problem| RaceDef { key: (slot, regime), dtype: DType::F32, shapes: vec![(p.clone(), 27)] };
        let vision = race(Slot::VisionMlp, Regime::Vision, &big);
        let gflops = |g: f64| Some(g * 1e9);
        let s = Duration::from_secs;
        // 2 x 40.6 GFLOP at 5 GFLOP/s: about 16 s, over a 1 s share (whatever is left).
        let why = unaffordable(&vision, gflops(5.0), s(1), s(100)).expect("not started");
        assert!(why.contains("16.") && why.contains("5.00 GFLOP/s"), "{why}");
        // Its share covers it; a fast device; no rate yet: started.
        assert_eq!(unaffordable(&vision, gflops(5.0), s(20), s(20)), None);
        assert_eq!(unaffordable(&vision, gflops(500.0), Duration::ZERO, Duration::ZERO), None);
        assert_eq!(unaffordable(&vision, None, Duration::ZERO, Duration::ZERO), None);
        // A text race: measured against all that is left of the races' time.
        let text = race(Slot::MatmulGateUp, Regime::Prefill, &Problem::Gemm { m: 4096, n: 4304, k: 1152 });
        assert_eq!(unaffordable(&text, gflops(5.0), s(1), s(100)), None, "the races' time covers it");
        assert!(unaffordable(&text, gflops(5.0), s(1), s(5)).is_some(), "16 s of 5 s left");
        // A tiny tower's op: under the floor, started whatever the share.
        let tiny = race(Slot::VisionMlp, Regime::Vision, &Problem::Linear { m: 16, n: 64, k: 32, gelu: true });
        assert_eq!(unaffordable(&tiny, gflops(0.1), Duration::ZERO, Duration::ZERO), None);
    }

    /// The race itself: past the hard deadline only a race without any sample gets
    /// one (its first candidate), where the soft rule alone (`bench-kernels`) gives
    /// every prepared candidate its one sample.
    #[test]
    fn past_the_hard_deadline_a_race_samples_one_candidate_once() {
        let caps = DeviceCaps::Cpu(CpuCaps::detect());
        let p = Problem::AttentionFull { tokens: 16, heads: 2, head_dim: 16, scale: 0.25 };
        let r = RaceDef { key: (crate::plan::select::Slot::VisionAttention, Regime::Vision), dtype: DType::F32, shapes: vec![(p, 1)] };
        let (cands, _) = candidates(&r, &caps, Strategy::Auto);
        let w = Workload::new(r.shapes.clone(), DType::F32, None, 1, 1 << 16);
        let sampled = |deadline: Deadline| -> Vec<usize> {
            let mut runners: Vec<Runner> = cands.iter().take(4).map(|c| Runner::new(c.clone(), &w)).collect();
            race(&mut runners, &w, Strategy::Auto, deadline, 1, 0, |_| {});
            runners.iter().map(|x| x.samples.len()).collect()
        };
        let now = Instant::now();
        let hard = sampled(Deadline { soft: now, hard: Some(now) });
        assert_eq!((hard.iter().sum::<usize>(), hard.iter().filter(|&&n| n > 0).count()), (1, 1), "{hard:?}");
        assert_eq!(sampled(Deadline::soft(now)), vec![1; 4], "the soft rule: one sample each");
    }
}
