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
//! size's whole decode step with the winners, without them (what the size
//! would take instead), with the plan's own kernels where a smaller size's
//! table would reach it, and as lone decode steps, interleaved: a size keeps
//! its winners only where its step is not slower than the better of the
//! other two (its own kernels become its table where they beat what it would
//! inherit), and where lone steps win, batches that small decode alone. The kept winners are the profile's `serve.batches` (and `minBatch`),
//! which the runtime takes for a batch of at least that many sequences.

use std::collections::BTreeMap;

use super::budget::RaceShares;
use super::e2e::Combo;
use super::measure::Holding;
use super::race::{self, Races};
use super::space::{RaceDef, Space, candidates};
use super::{Progress, Target, TuneError, TuneOptions};
use crate::device::DeviceCaps;
use crate::kernels::quant::QFormat;
use crate::kernels::{DType, Problem};
use crate::plan::select::{PassStep, SlotChoices, SlotKey};
use crate::plan::{Parallel, Plan, Regime, Selection, StepKind};
use crate::profile::build::RaceResult;
use crate::profile::doc::BatchEndToEnd;
use crate::stats::{pick, summarize};

/// What the stage found: per batch size its winners (those the end-to-end
/// check kept), every race with its batch size and each size's end-to-end
/// times (for the profile's record).
#[derive(Default)]
pub(crate) struct BatchRegimes {
    pub tables: BTreeMap<usize, SlotChoices>,
    pub races: Vec<(usize, RaceDef, RaceResult)>,
    pub timed: Vec<BatchEndToEnd>,
    /// The fewest sequences a batch pass should hold, where lone steps won at a
    /// measured size (the largest such size and one); None: every batch.
    pub min_batch: Option<usize>,
    /// CPU: the layouts the stage planned the server's matrices in
    /// ([`server_repack`]: the profile's `serve.cpuRepack`); None on a GPU.
    pub repack: Option<Vec<QFormat>>,
}

/// The shares of the stage's time (past the check's reserve, [`check_share`])
/// its races may use in full, and past which none starts
/// ([`race::run_all`]): only the check follows them, which has its reserve,
/// where the slot races leave most of theirs to the end-to-end stage
/// ([`super::budget::RACES_SHARE`]). With the slot races' shares a 4-minute
/// SmolLM2-135M Q4_0 tune ended at 131 s of its 240 with 98 batch candidates
/// "not reached within the budget".
const BATCH_RACES: RaceShares = RaceShares { name: "batch races", full: 0.9, limit: 0.95 };

/// Interleaved rounds of the end-to-end check, each [`CHECK_STEPS`] timed batch
/// steps with the winners, as many without them and as many as lone steps.
const CHECK_ROUNDS: usize = 3;
const CHECK_STEPS: usize = 4;
/// The most arms a size's round times ([`check`]'s `ARMS`).
const CHECK_ARMS: usize = 5;

/// The batch sizes of `--serve-batches` a context of `o.context` positions
/// holds (a batch's sequences are one position each, but every one needs a
/// position to decode at: the sizes below the context).
fn sizes(o: &TuneOptions) -> Vec<usize> {
    o.serve_batches.iter().copied().filter(|&b| b < o.context).collect()
}

/// The layouts a server of several sequences loads its matrices in on this
/// CPU without a profile ([`crate::plan::default_cpu_repack`] with `batches`),
/// which the stage plans its batches over and the profile's `serve.cpuRepack`
/// records, so a server with the profile runs what was checked and its
/// baseline is what a server without it runs (the lone decode's layouts, which
/// the winning combination holds, may be a long-row model's plain rows on
/// AVX-512 VNNI, whose batches decode slower: a 1B Q4_K_M model's served 8
/// clients 8–11% behind no profile); None on a GPU (nothing is repacked).
fn server_repack(t: &Target<'_>, o: &TuneOptions) -> Option<Vec<QFormat>> {
    let dtypes = std::iter::once(o.weight_dtype).chain(o.matrix_formats.values().copied());
    t.device.is_cpu().then(|| crate::plan::default_cpu_repack(t.config, dtypes, true))
}

/// The plan options of a batch plan of `chosen` (its fusions) of up to `most`
/// sequences, with passes of at least `most` tokens, its matrices in the
/// layouts `repack` ([`server_repack`]; None: `chosen`'s own).
fn batch_options(o: &TuneOptions, chosen: &Combo, most: usize, repack: Option<&[QFormat]>) -> crate::plan::PlanOptions {
    let mut options = chosen.plan_options(o).with_batch_rows(most);
    options.max_tokens = options.max_tokens.max(most);
    if let Some(r) = repack {
        options.cpu_repack = r.to_vec();
    }
    options
}

/// The races of the batch sizes `o.serve_batches` (each 2 or more) for the
/// plan of `chosen` (its fusions, the default parallel groups; the server's
/// weight layouts `repack`, [`server_repack`]) under `sel` (its selection): per batch size,
/// one race per (slot, storage type) over the shapes of its row-independent
/// kernel steps.
pub(crate) fn races(
    t: &Target<'_>,
    o: &TuneOptions,
    chosen: &Combo,
    sel: &Selection,
    repack: Option<&[QFormat]>,
) -> Result<Vec<(usize, RaceDef)>, TuneError> {
    let sizes = sizes(o);
    let Some(&most) = sizes.iter().max() else { return Ok(Vec::new()) };
    let grouped = Combo { parallel: Parallel::default(), ..*chosen };
    let plan = Plan::new(t.model, t.config, batch_options(o, &grouped, most, repack), sel.clone())?;
    let mut out: Vec<(usize, RaceDef)> = Vec::new();
    for &rows in &sizes {
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

/// The share of the stage's time kept from its races for the end-to-end
/// check when `left` is what is left: on a CPU, where the check's engine is
/// the weights' load, its time bounded by [`check_bound`] from the winning
/// combination's decode seconds a token `decode_s`, twice that (at least a
/// tenth, at most [`super::budget::BATCH_CHECK_SHARE`]); on a GPU, or without a
/// decode time, [`super::budget::BATCH_CHECK_SHARE`] (the check's engine
/// compiles its pipelines, most of its time on a software adapter). On a
/// 2-core Xeon a 4-minute tune of SmolLM2-135M Q4_0 had kept half its
/// stage (101 s) for a check of 4 s, while its races left most of the LM
/// head's and the fused gate/up's candidates "not reached within the budget".
fn check_share(gpu: bool, sizes: &[usize], decode_s: Option<f64>, left: std::time::Duration) -> f64 {
    let most = super::budget::BATCH_CHECK_SHARE;
    match decode_s.filter(|_| !gpu) {
        Some(s) if !left.is_zero() => (2.0 * check_bound(sizes, s) / left.as_secs_f64()).clamp(0.1, most),
        _ => most,
    }
}

/// A bound on the end-to-end check's seconds from the decode seconds a token
/// `decode_s`: every size's [`CHECK_ROUNDS`] rounds of `CHECK_STEPS + 1` steps
/// in each of its (at most [`CHECK_ARMS`]) arms, each step at most its rows' lone decode
/// steps (the lone arm's; a batch pass costs less).
fn check_bound(sizes: &[usize], decode_s: f64) -> f64 {
    let steps = (CHECK_ROUNDS * (CHECK_STEPS + 1)) as f64;
    sizes.iter().map(|&rows| CHECK_ARMS as f64 * steps * rows as f64 * decode_s).sum()
}

/// Runs the stage: nothing without `--serve-batches`. On a GPU the end-to-end
/// check runs over the paged KV cache that `serve --parallel` makes there.
/// `(chosen, decode_s)`: the winning combination and its decode seconds a
/// token ([`super::e2e::EndToEnd::decode_seconds`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    t: &Target<'_>,
    o: &TuneOptions,
    caps: &DeviceCaps,
    (chosen, decode_s): (&Combo, Option<f64>),
    sel: &Selection,
    cache: Option<&crate::profile::cache::Cache>,
    resume: bool,
    budget: &super::budget::Budget,
    progress: &dyn Progress,
) -> Result<BatchRegimes, TuneError> {
    if o.serve_batches.is_empty() {
        return Ok(BatchRegimes::default());
    }
    let beyond: Vec<String> = o.serve_batches.iter().filter(|&&b| b >= o.context).map(|b| b.to_string()).collect();
    if !beyond.is_empty() {
        budget.cut(format!(
            "decode batch regimes: sizes {} not raced (not below --context {}, the positions a batch's sequences decode at)",
            beyond.join(", "),
            o.context
        ));
    }
    let repack = server_repack(t, o);
    let defs = budget.stage("batch regimes: plans", || races(t, o, chosen, sel, repack.as_deref()))?;
    let gpu = t.ctx.is_some() && !t.device.is_cpu();
    let left = budget.deadline().saturating_duration_since(std::time::Instant::now());
    let check_frac = check_share(gpu, &sizes(o), decode_s, left);
    let (sizes, defs): (Vec<usize>, Vec<RaceDef>) = defs.into_iter().unzip();
    let variants = defs.iter().map(|r| candidates(r, caps, o.strategy).0.len()).sum();
    let space = Space {
        races: defs,
        per_fusion: Vec::new(),
        variants,
        ruled_out: BTreeMap::new(),
        combinations: 0.0,
        holding: Holding::server(repack.clone().unwrap_or_default()),
    };
    budget.reserve(check_frac);
    let races = budget.stage("batch regimes: races", || race::run_all(t, o, &space, cache, resume, budget, &BATCH_RACES, progress));
    budget.release();
    let Races { results, .. } = races?;
    let extra = o.extra_formats();
    let mut found = BatchRegimes { repack, ..BatchRegimes::default() };
    for ((rows, r), mut res) in sizes.into_iter().zip(space.races).zip(results) {
        res.regime = format!("batch {rows}");
        if let Some(c) = res.winner_choice() {
            found.tables.entry(rows).or_default().insert(r.dtype, r.key, c, &extra);
        }
        found.races.push((rows, r, res));
    }
    let end = budget.share(0.9);
    let short = budget.stage("batch regimes: end to end", || check(t, o, chosen, sel, &mut found, end))?;
    if !short.is_empty() {
        budget.cut(format!("batch regimes: sizes timed end to end in fewer rounds: {}", short.join(", ")));
    }
    Ok(found)
}

/// What `sel` runs without batch tables in a decode batch of `rows` of
/// `plan` (its layouts) for the slots raced at that size, as a batch table:
/// the plan's own choices (the tuned selection: its prefill's kernels, the
/// batched dots over X8 records where they are the default), or the runtime's
/// defaults (what a server without a profile runs).
fn choices_of(found: &BatchRegimes, rows: usize, sel: &Selection, plan: &Plan, o: &TuneOptions) -> SlotChoices {
    let extra = o.extra_formats();
    let mut table = SlotChoices::default();
    for (_, r, _) in found.races.iter().filter(|(n, _, _)| *n == rows) {
        if let Some((p, _)) = r.shapes.first()
            && let Ok((c, _)) = sel.pass_choice(&PassStep {
                batch: None,
                key: r.key,
                layer: None,
                problem: p,
                dtype: r.dtype,
                decode_only: true,
                x8: plan.x8_weight(p, r.dtype),
            })
        {
            table.insert(r.dtype, r.key, c, &extra);
        }
    }
    table
}

/// The end-to-end check: one engine of the winning combination over the
/// server's weight layouts (`found.repack`); per batch size fresh sequences
/// and [`CHECK_ROUNDS`] rounds, each timing [`CHECK_STEPS`] steps (after one
/// untimed: a switch plans the batch anew; medians as [`summarize`] gives
/// them) of the batch in each arm, the order rotating; sizes in ascending
/// order. The arms, in the order a tie prefers them: with its winners; without
/// them (what the size would inherit: the next smaller size's table, else the
/// plan's own choices); where a smaller size's table would reach it, the
/// plan's own choices as its table ([`choices_of`] under `sel`); the
/// runtime's defaults as its table (what a server without the profile runs,
/// where they differ from the plan's own); and as lone decode steps, one a
/// sequence. The fastest arm past a tie ([`super::TIE`]; [`pick`]) gives the
/// size's table (none where it is what the size inherits); where lone steps
/// beat it, batches of that size and fewer decode alone (`found.min_batch`).
/// Rounds stop at `end`, each size's at its share of the time left by its
/// rows, after its first (a size timed in fewer rounds is returned, "8 in 1
/// of 3 rounds").
fn check(
    t: &Target<'_>,
    o: &TuneOptions,
    chosen: &Combo,
    sel: &Selection,
    found: &mut BatchRegimes,
    end: std::time::Instant,
) -> Result<Vec<String>, TuneError> {
    /// The arms that decode a batch pass, in the order a tie prefers them.
    #[derive(Clone, Copy, PartialEq)]
    enum Arm {
        Tuned,
        Default,
        Own,
        Stock,
        Lone,
    }
    const ARMS: [Arm; CHECK_ARMS] = [Arm::Tuned, Arm::Default, Arm::Own, Arm::Stock, Arm::Lone];
    let sizes = sizes(o);
    let most = sizes.iter().copied().max().unwrap_or(2);
    let mut options = batch_options(o, chosen, most, found.repack.as_deref());
    // Every arm advances the same sequences.
    options.context = options.context.max(5 * CHECK_ROUNDS * (CHECK_STEPS + 1) + 1);
    // A GPU's sequences share a paged KV cache, which the fused KV write does
    // not write (as `serve --parallel` makes it).
    let gpu = t.ctx.clone().filter(|_| !t.device.is_cpu());
    if gpu.is_some() {
        options.fusion.qkv_rope_cache = false;
    }
    let context = options.context;
    let engines =
        crate::session::Engines { model: t.model, config: t.config, store: t.store.clone(), ctx: gpu, memo: None, check_decode: false };
    let mut e = engines.build(options, sel.clone(), &chosen.exec(o, false))?;
    if e.is_gpu() {
        e.enable_paged((most + 1) * context, most + 1)?;
    }
    let stock_sel = Selection::runtime(sel.device.clone());
    let vocab = t.config.dims.vocab_size.max(1);
    let mut lone_wins = None;
    let mut cuts = Vec::new();
    for (i, &rows) in sizes.iter().enumerate() {
        // This size's share of the time left, by its rows (a round's steps cost
        // about that): a smaller size's rounds do not leave a larger one none.
        let left: usize = sizes[i..].iter().sum();
        let now = std::time::Instant::now();
        let size_end = now + end.saturating_duration_since(now).mul_f64(rows as f64 / left.max(1) as f64);
        // With this size's table, and without it (what a batch of this size
        // takes if it is dropped: the next smaller size's, else the plan's own
        // choices); the smaller sizes' decisions already made.
        let with = found.tables.clone();
        let mut without = with.clone();
        let table = without.remove(&rows).is_some();
        // Where a smaller size's table would reach this size, the plan's own
        // choices as a table of this size too: a smaller size's kernels may be
        // slower here than both (two sequences' dots at eight).
        let own_table = choices_of(found, rows, sel, &e.plan, o);
        let cascades = without.range(..rows).next_back().is_some() && !own_table.is_empty();
        // The runtime's defaults as this size's table, where they are not the
        // plan's own: the baseline of a server without the profile (a tuned
        // prefill GEMM's tiles may be slower at sixteen sequences).
        let stock_table = choices_of(found, rows, &stock_sel, &e.plan, o);
        let stocked = !stock_table.is_empty() && stock_table != own_table;
        let tables_of = |extra: &SlotChoices| {
            let mut t = without.clone();
            t.insert(rows, extra.clone());
            t
        };
        let (own, stock) = (tables_of(&own_table), tables_of(&stock_table));
        let mut seqs: Vec<_> = (0..rows).map(|_| e.new_sequence()).collect::<Result<_, _>>()?;
        let tokens: Vec<u32> = (0..rows).map(|i| ((7 * i + 3) % vocab) as u32).collect();
        let mut times: [Vec<f64>; ARMS.len()] = Default::default();
        let arms: Vec<Arm> = ARMS
            .into_iter()
            .filter(|&a| match a {
                Arm::Tuned => table,
                Arm::Own => cascades,
                Arm::Stock => stocked,
                Arm::Default | Arm::Lone => true,
            })
            .collect();
        for round in 0..CHECK_ROUNDS {
            // One round whatever the time: the engine is built (on a GPU most
            // of the check's cost) and the size's table is kept or dropped on
            // what was measured, not on the races alone.
            if round > 0 && std::time::Instant::now() >= size_end {
                break;
            }
            for k in 0..arms.len() {
                let arm = arms[(round + k) % arms.len()];
                let mut step = |e: &mut crate::runtime::Engine| -> Result<(), TuneError> {
                    if arm == Arm::Lone {
                        for (s, &tok) in seqs.iter_mut().zip(&tokens) {
                            e.swap_sequence(s)?;
                            let r = e.decode_step(tok).map(|_| ());
                            e.swap_sequence(s)?;
                            r?;
                        }
                    } else {
                        let mut refs: Vec<&mut crate::runtime::SeqKv> = seqs.iter_mut().collect();
                        e.decode_batch(&mut refs, &tokens)?;
                    }
                    Ok(())
                };
                match arm {
                    Arm::Tuned => e.set_batch_choices(with.clone()),
                    Arm::Default => e.set_batch_choices(without.clone()),
                    Arm::Own => e.set_batch_choices(own.clone()),
                    Arm::Stock => e.set_batch_choices(stock.clone()),
                    Arm::Lone => {}
                }
                step(&mut e)?;
                let t0 = std::time::Instant::now();
                for _ in 0..CHECK_STEPS {
                    step(&mut e)?;
                }
                times[arm as usize].push(t0.elapsed().as_secs_f64() / CHECK_STEPS as f64);
            }
        }
        if times[Arm::Default as usize].len() < CHECK_ROUNDS {
            cuts.push(format!("{rows} in {} of {CHECK_ROUNDS} rounds", times[Arm::Default as usize].len()));
        }
        let stats = times.each_ref().map(|t| summarize(t));
        // The batch arms only (lone steps are what a batch is weighed against).
        let batch_stats: Vec<_> = stats[..Arm::Lone as usize].to_vec();
        let best = ARMS[pick(&batch_stats, super::TIE).unwrap_or(Arm::Default as usize)];
        found.tables.remove(&rows);
        match best {
            Arm::Tuned => {
                found.tables.insert(rows, with[&rows].clone());
            }
            Arm::Own => {
                found.tables.insert(rows, own_table);
            }
            Arm::Stock => {
                found.tables.insert(rows, stock_table);
            }
            Arm::Default | Arm::Lone => {}
        }
        if !stats[best as usize].ties_with(&stats[Arm::Lone as usize], super::TIE) {
            lone_wins = Some(rows);
        }
        let ms = |a: Arm| stats[a as usize].median * 1e3;
        found.timed.push(BatchEndToEnd {
            sequences: rows,
            rounds: times[Arm::Default as usize].len(),
            tuned_ms: if table { ms(Arm::Tuned) } else { ms(Arm::Default) },
            default_ms: ms(Arm::Default),
            lone_ms: ms(Arm::Lone),
            own_ms: cascades.then(|| ms(Arm::Own)),
            own_kept: best == Arm::Own,
            stock_ms: stocked.then(|| ms(Arm::Stock)),
            stock_kept: best == Arm::Stock,
            kept: best == Arm::Tuned,
        });
    }
    found.min_batch = lone_wins.map(|r| r + 1);
    Ok(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch check times the weight layouts the profile will make the
    /// server load: the server's own (`serve.cpuRepack`, the runtime's default
    /// for several sequences) whatever the winning combination repacks for one
    /// (the check had planned a 1B Q4_K_M model's plain rows, the lone decode's
    /// layout on AVX-512 VNNI, and kept tables that a server without the
    /// profile beat over its X8 records: 8 clients 8–11% behind), and on a GPU
    /// (no server layout) the combination's own. Before that, plain rows
    /// against X8 records had made a served batch of 4 sequences 376 tok/s
    /// against 651 without the tables it kept, on SmolLM2-135M Q4_0.
    /// The check's share of the stage on a CPU follows a bound of its time from
    /// the decode seconds a token (a small model's leaves the races nine tenths),
    /// within a tenth and the flat share; a GPU, or no decode time, keeps the
    /// flat share.
    #[test]
    fn the_batch_check_keeps_what_its_rounds_need() {
        use std::time::Duration;
        let flat = super::super::budget::BATCH_CHECK_SHARE;
        let sizes = [2, 4, 8, 16];
        // 30 rows, 5 arms, 15 steps each: 2250 lone decode steps at most.
        assert!((check_bound(&sizes, 0.004) - 9.0).abs() < 1e-9);
        let left = Duration::from_secs(200);
        assert_eq!(check_share(false, &sizes, Some(0.004), left), 0.1);
        assert!((check_share(false, &sizes, Some(0.008), left) - 0.18).abs() < 1e-9);
        assert_eq!(check_share(false, &sizes, Some(0.05), left), flat);
        assert_eq!(check_share(true, &sizes, Some(0.004), left), flat);
        assert_eq!(check_share(false, &sizes, None, left), flat);
        assert_eq!(check_share(false, &sizes, Some(0.004), Duration::ZERO), flat);
    }

    #[test]
    fn the_batch_check_plans_the_servers_weight_layouts() {
        use crate::kernels::quant::QFormat;
        let o = super::super::test_options(std::time::Duration::from_secs(1));
        let repack = super::super::e2e::repack_bits(&[QFormat::Q4_0, QFormat::Q8_0]);
        let repacked = Combo { repack, ..Combo::runtime_default() };
        let plain = Combo::runtime_default();
        let server = [QFormat::Q4_K, QFormat::Q8_0];
        for c in [&repacked, &plain] {
            let options = batch_options(&o, c, 8, Some(&server));
            assert_eq!(options.cpu_repack, server.to_vec());
            assert!(options.batch_rows >= 8 && options.max_tokens >= 8);
        }
        assert_eq!(batch_options(&o, &repacked, 8, None).cpu_repack, vec![QFormat::Q4_0, QFormat::Q8_0]);
        assert!(batch_options(&o, &plain, 8, None).cpu_repack.is_empty());
    }
}
