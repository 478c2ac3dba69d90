//! The decode-batch regimes of a tune (`tune --serve-batches`), after the
//! end-to-end stage: a server's decode batch runs one token of each of its
//! sequences through the prefill's ops (its matrices as GEMMs over the batch's
//! rows, [`Plan::batch_steps`]), and which kernel is fastest there changes with
//! the number of rows (a few rows are nearly a GEMV, sixteen nearly a prompt).
//! For each batch size the winning combination's batch plan gives its
//! row-independent kernel steps (projections, norms, activations; attention and
//! RoPE run a sequence at a time, as its decode does); each slot's kernels race
//! at those shapes as the slot races do (gated by parity, cached, within the
//! budget); then one engine of the winning combination times each batch
//! size's whole decode step with the winners and with the prefill's choices,
//! interleaved, and a size keeps its winners only where its step is not
//! slower. The kept winners are the profile's `serve.batches`, which the
//! runtime takes for a batch of at least that many sequences.

use std::collections::BTreeMap;

use super::e2e::Combo;
use super::race::{self, Races};
use super::space::{self, RaceDef, Space, candidates};
use super::{Progress, Target, TuneError, TuneOptions};
use crate::device::DeviceCaps;
use crate::kernels::{DType, Problem};
use crate::plan::select::{BatchChoices, SlotKey};
use crate::plan::{Fusion, Parallel, Plan, Regime, Selection, StepKind};
use crate::profile::build::RaceResult;
use crate::profile::doc::BatchEndToEnd;

/// What the stage found: per batch size its winners (those the end-to-end
/// check kept), every race with its batch size and each size's end-to-end
/// times (for the profile's record).
#[derive(Default)]
pub(crate) struct BatchRegimes {
    pub tables: BTreeMap<usize, BatchChoices>,
    pub races: Vec<(usize, RaceDef, RaceResult)>,
    pub timed: Vec<BatchEndToEnd>,
}

/// Interleaved rounds of the end-to-end check, each [`CHECK_STEPS`] timed batch
/// steps with the winners and as many with the prefill's choices.
const CHECK_ROUNDS: usize = 3;
const CHECK_STEPS: usize = 4;

/// The races of the batch sizes `o.serve_batches` (each 2 or more) for the
/// plan of `fusion` under `sel` (the winning combination's): per batch size,
/// one race per (slot, storage type) over the shapes of its row-independent
/// kernel steps.
pub(crate) fn races(t: &Target<'_>, o: &TuneOptions, fusion: Fusion, sel: &Selection) -> Result<Vec<(usize, RaceDef)>, TuneError> {
    let Some(&most) = o.serve_batches.iter().max() else { return Ok(Vec::new()) };
    let options = space::plan_options(o, fusion, Parallel::default()).with_batch_rows(most);
    let plan = Plan::new(t.model, t.config, options, sel.clone())?;
    let mut out: Vec<(usize, RaceDef)> = Vec::new();
    for &rows in &o.serve_batches {
        let mut counts: BTreeMap<(SlotKey, DType, String), (Problem, usize)> = BTreeMap::new();
        for s in plan.batch_steps(rows)? {
            if Plan::position_dependent(&s) {
                continue;
            }
            if let StepKind::Kernel { problem, dtype, .. } = s.kind {
                counts.entry(((s.slot, Regime::Prefill), dtype, problem.describe())).or_insert((problem, 0)).1 += 1;
            }
        }
        let mut mine: Vec<RaceDef> = Vec::new();
        for ((key, dtype, _), (p, n)) in counts {
            match mine.iter_mut().find(|r| r.key == key && r.dtype == dtype) {
                Some(r) => r.shapes.push((p, n)),
                None => mine.push(RaceDef { key, dtype, shapes: vec![(p, n)] }),
            }
        }
        out.extend(mine.into_iter().map(|r| (rows, r)));
    }
    Ok(out)
}

/// Runs the stage: nothing without `--serve-batches`; on a GPU it says why it
/// does not run (decode batches run on the CPU).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    t: &Target<'_>,
    o: &TuneOptions,
    caps: &DeviceCaps,
    chosen: &Combo,
    sel: &Selection,
    cache: Option<&crate::profile::cache::Cache>,
    resume: bool,
    budget: &super::budget::Budget,
    progress: &dyn Progress,
) -> Result<BatchRegimes, TuneError> {
    if o.serve_batches.is_empty() {
        return Ok(BatchRegimes::default());
    }
    if !matches!(caps, DeviceCaps::Cpu(_)) {
        budget.cut("decode batch regimes: not raced (`serve --parallel` batches run on the CPU only)".into());
        return Ok(BatchRegimes::default());
    }
    let defs = budget.stage("batch regimes: plans", || races(t, o, chosen.fusion, sel))?;
    let (sizes, defs): (Vec<usize>, Vec<RaceDef>) = defs.into_iter().unzip();
    let variants = defs.iter().map(|r| candidates(r, caps, o.strategy).0.len()).sum();
    let space = Space { races: defs, per_fusion: Vec::new(), variants, ruled_out: BTreeMap::new(), combinations: 0.0 };
    let Races { results, .. } = budget.stage("batch regimes: races", || race::run_all(t, o, &space, cache, resume, budget, progress))?;
    let extra = o.extra_formats();
    let mut found = BatchRegimes::default();
    for ((rows, r), mut res) in sizes.into_iter().zip(space.races).zip(results) {
        res.regime = format!("batch {rows}");
        if let Some(c) = res.winner_choice() {
            let table = found.tables.entry(rows).or_default();
            if extra.contains(&r.dtype) {
                table.formats.insert((r.dtype, r.key), c);
            } else {
                table.slots.insert(r.key, c);
            }
        }
        found.races.push((rows, r, res));
    }
    if found.tables.is_empty() {
        return Ok(found);
    }
    let end = budget.share(0.9);
    budget.stage("batch regimes: end to end", || check(t, o, chosen, sel, &mut found, end))?;
    Ok(found)
}

/// The end-to-end check: one engine of the winning combination; per batch size
/// fresh sequences, and [`CHECK_ROUNDS`] rounds of a step each way untimed (a
/// switch plans the batch anew) and [`CHECK_STEPS`] timed, the order alternating;
/// a size whose median step with its winners is slower than with the prefill's
/// choices (past a tie, [`super::TIE`]) loses its table. Rounds stop at `end` (a size not timed keeps its
/// race winners, and the budget says so).
fn check(
    t: &Target<'_>,
    o: &TuneOptions,
    chosen: &Combo,
    sel: &Selection,
    found: &mut BatchRegimes,
    end: std::time::Instant,
) -> Result<(), TuneError> {
    let sizes: Vec<usize> = found.tables.keys().copied().collect();
    let most = sizes.iter().copied().max().unwrap_or(2);
    let mut options = space::plan_options(o, chosen.fusion, chosen.parallel).with_batch_rows(most);
    options.context = options.context.max(2 * CHECK_ROUNDS * (CHECK_STEPS + 1) + 1);
    let engines =
        crate::session::Engines { model: t.model, config: t.config, store: t.store.clone(), ctx: None, memo: None, check_decode: false };
    let mut e = engines.build(options, sel.clone(), &chosen.exec(o, false))?;
    let tables = found.tables.clone();
    let vocab = t.config.dims.vocab_size.max(1);
    for rows in sizes {
        let mut seqs: Vec<_> = (0..rows).map(|_| e.new_sequence()).collect::<Result<_, _>>()?;
        let tokens: Vec<u32> = (0..rows).map(|i| ((7 * i + 3) % vocab) as u32).collect();
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for round in 0..CHECK_ROUNDS {
            if std::time::Instant::now() >= end {
                break;
            }
            for tuned in if round % 2 == 0 { [true, false] } else { [false, true] } {
                e.set_batch_choices(if tuned { tables.clone() } else { BTreeMap::new() });
                let mut refs: Vec<&mut crate::runtime::SeqKv> = seqs.iter_mut().collect();
                e.decode_batch(&mut refs, &tokens)?;
                let t0 = std::time::Instant::now();
                for _ in 0..CHECK_STEPS {
                    e.decode_batch(&mut refs, &tokens)?;
                }
                let step = t0.elapsed().as_secs_f64() / CHECK_STEPS as f64;
                if tuned { on.push(step) } else { off.push(step) }
            }
        }
        if on.is_empty() {
            continue;
        }
        let (tuned_ms, default_ms) = (median(&on) * 1e3, median(&off) * 1e3);
        // Within a tie the raced winners stay (they won their slots' races).
        let kept = tuned_ms <= default_ms * (1.0 + super::TIE);
        if !kept {
            found.tables.remove(&rows);
        }
        found.timed.push(BatchEndToEnd { sequences: rows, rounds: on.len(), tuned_ms, default_ms, kept });
        drop(seqs);
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
