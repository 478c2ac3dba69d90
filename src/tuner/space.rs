//! The search space, the first stage of a tune: the plan builder gives every
//! slot's kernel steps for each fusion choice; the steps become one race per
//! (slot, regime, dtype) with the union of its shapes, and each race's candidates
//! are the variants valid on every shape (the rest ruled out with the reason). A
//! model with a vision tower adds the tower's ops as the `vision` regime, at its
//! shapes for one image, with the device's kernels (CPU or WGSL, as the runtime
//! runs the tower there).

use std::collections::{BTreeMap, BTreeSet};

use super::measure::{Cand, Holding, Strategy};
use super::{Progress, Target, TuneError, TuneOptions};
use crate::device::DeviceCaps;
use crate::kernels::{self, DType, KernelDef, Problem};
use crate::model::ModelConfig;
use crate::plan::select::SlotKey;
use crate::plan::{Fusion, Parallel, Plan, PlanOptions, Regime, Selection, StepKind};

/// One slot race: the union of the slot's shapes over every fusion choice.
pub(crate) struct RaceDef {
    pub key: SlotKey,
    pub dtype: DType,
    pub shapes: Vec<(Problem, usize)>,
}

/// The kernel steps of both regimes: (slot, regime, problem, dtype).
pub(crate) type KernelSteps = Vec<(SlotKey, Problem, DType)>;

/// The space: the slot races, per fusion choice the kernel steps its plan emits,
/// and how large it is.
pub(crate) struct Space {
    pub races: Vec<RaceDef>,
    pub per_fusion: PerFusion,
    /// Valid variants over all races.
    pub variants: usize,
    /// Variants ruled out by device limits or shapes, by reason.
    pub ruled_out: BTreeMap<String, usize>,
    /// Complete combinations (variants × fusion choices × execution flags).
    pub combinations: f64,
    /// How the races hold their inputs: plain for the slot races, a server's
    /// way for the batch regimes'.
    pub holding: Holding,
}

/// Fusion choices that change the plan of `cfg`.
fn fusions(cfg: &ModelConfig) -> Vec<Fusion> {
    Fusion::all_combinations().into_iter().filter(|f| cfg.qk_norm_per_head() || !f.qk_norm_rope).collect()
}

pub(crate) fn plan_options(o: &TuneOptions, fusion: Fusion, parallel: Parallel) -> PlanOptions {
    PlanOptions::new(o.weight_dtype, o.prefill_tokens, o.context)
        .with_matrix_formats(o.matrix_formats.clone())
        .with_kv_dtype(o.kv_dtype)
        .with_fusion(fusion)
        .with_parallel(parallel)
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

/// The kernel steps the plan of fusion choice `f` emits ([`kernel_steps`]).
pub(crate) fn fusion_steps(t: &Target<'_>, o: &TuneOptions, caps: &DeviceCaps, f: Fusion) -> Result<KernelSteps, TuneError> {
    let plan = Plan::new(t.model, t.config, plan_options(o, f, Parallel::default()), Selection::defaults(caps.clone()))?;
    kernel_steps(&plan, o)
}

/// Per fusion choice, the kernel steps its plan emits.
pub(crate) type PerFusion = Vec<(Fusion, KernelSteps)>;

/// The slot races and, per fusion choice, the steps its plan emits.
fn races(t: &Target<'_>, o: &TuneOptions, caps: &DeviceCaps) -> Result<(Vec<RaceDef>, PerFusion), TuneError> {
    let mut races: Vec<RaceDef> = Vec::new();
    let mut per_fusion = Vec::new();
    for f in fusions(t.config) {
        let steps = fusion_steps(t, o, caps, f)?;
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
    // The vision tower's ops: a regime of their own, at the tower's shapes, with
    // the device's kernels (the tower runs where the text model runs).
    if let Some(v) = &o.vision {
        for (slot, p, n) in crate::plan::vision::slot_problems(v) {
            let key = (slot, Regime::Vision);
            match races.iter_mut().find(|r| r.key == key) {
                Some(r) => match r.shapes.iter_mut().find(|(q, _)| *q == p) {
                    Some(s) => s.1 += n,
                    None => r.shapes.push((p, n)),
                },
                None => races.push(RaceDef { key, dtype: DType::F32, shapes: vec![(p, n)] }),
            }
        }
    }
    races.sort_by_key(|r| (r.key.1, r.key.0));
    Ok((races, per_fusion))
}

/// Builds the space and tells `progress` how large it is and why variants were
/// ruled out.
pub(crate) fn survey(t: &Target<'_>, o: &TuneOptions, caps: &DeviceCaps, progress: &dyn Progress) -> Result<Space, TuneError> {
    let (races, per_fusion) = races(t, o, caps)?;
    let mut ruled_out: BTreeMap<String, usize> = BTreeMap::new();
    let mut n_valid: BTreeMap<SlotKey, usize> = BTreeMap::new();
    let mut variants = 0;
    for r in &races {
        let (c, pool) = candidates(r, caps, o.strategy);
        variants += c.len();
        *n_valid.entry(r.key).or_default() += c.len();
        for (_, why) in pool.rejected {
            *ruled_out.entry(why).or_default() += 1;
        }
    }
    let flag_choices: f64 = if t.ctx.is_some() { 4.0 } else { 2.0 };
    let mut combinations: f64 = 0.0;
    for (_, steps) in &per_fusion {
        let mut keys: Vec<SlotKey> = steps.iter().map(|s| s.0).collect();
        keys.sort();
        keys.dedup();
        let prod: f64 = keys.iter().map(|k| n_valid.get(k).copied().unwrap_or(1).max(1) as f64).product();
        combinations += prod * flag_choices;
    }
    let mut reasons: Vec<(&String, &usize)> = ruled_out.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    for (why, n) in reasons.iter().take(4) {
        progress.note(&format!("ruled out {n}×: {why}"));
    }
    progress.note(&format!(
        "{} slot races, {variants} valid variants, {} ruled out by device limits or shapes; {combinations:.3e} complete combinations over {} fusion choices",
        races.len(),
        ruled_out.values().sum::<usize>(),
        per_fusion.len()
    ));
    Ok(Space { races, per_fusion, variants, ruled_out, combinations, holding: Holding::default() })
}

/// The parameter sets a strategy starts from for `k`. Exhaustive and random search the full
/// product; auto and halving an axis sweep around the defaults (each parameter
/// through all its values, the others at their defaults) to start from, which keeps
/// large spaces (gemm_blocked_cpu: 375 block-size combinations) within a few
/// minutes; [`super::race::descent_candidates`] then walks from the best of it.
fn param_space(k: &KernelDef, strategy: Strategy) -> Vec<kernels::Params> {
    kernels::verify::param_sweep(k, matches!(strategy, Strategy::Exhaustive | Strategy::Random))
}

/// The variants generated for one race, each once; the rejected ones with the
/// reason (invalid on a shape, failed the gate, not reached within the budget).
#[derive(Default)]
pub(crate) struct Generated {
    pub seen: BTreeSet<(&'static str, kernels::Params)>,
    pub rejected: Vec<(String, String)>,
}

impl Generated {
    /// `params` of `k` as a candidate when it was not generated before and is valid
    /// on every shape of `r` (otherwise the reason is recorded). `isa` stays at 0
    /// (the best instruction set the CPU has: the other values force scalar or
    /// narrower paths for verification and are never faster).
    pub fn offer(&mut self, k: &'static KernelDef, params: kernels::Params, r: &RaceDef, caps: &DeviceCaps) -> Option<Cand> {
        if params.get("isa").is_some_and(|i| *i != 0) || !self.seen.insert((k.id, params.clone())) {
            return None;
        }
        match r.shapes.iter().find_map(|(p, _)| k.check(caps.caps(), p, r.dtype, &params).err()) {
            None => Some(Cand { kernel: k, params }),
            Some(why) => {
                self.rejected.push((kernels::variant_label(k.id, &params), why));
                None
            }
        }
    }
}

/// Candidates of a race: every variant of the op valid on every shape, the
/// runtime's default first ([`Selection::runtime`]: what runs without a
/// profile, int8 activations for a CPU's block-format projections; a race cut
/// by the budget times it at least, and the tie rule, which prefers earlier
/// candidates, keeps it), then the exact selection's ([`Selection::defaults`]:
/// f32 activations) where it differs, then registry order; the rest with the
/// reason they were ruled out.
pub(crate) fn candidates(r: &RaceDef, caps: &DeviceCaps, strategy: Strategy) -> (Vec<Cand>, Generated) {
    let op = r.shapes[0].0.op();
    let mut valid = Vec::new();
    let mut pool = Generated::default();
    let default = |sel: Selection| sel.default_choice(r.key.0, r.key.1, &r.shapes[0].0, r.dtype).ok();
    let (exact, runtime) = (default(Selection::defaults(caps.clone())), default(Selection::runtime(caps.clone())));
    for k in kernels::for_op(op).filter(|k| k.backend() == caps.backend()) {
        valid.extend(param_space(k, strategy).into_iter().filter_map(|params| pool.offer(k, params, r, caps)));
    }
    // The exact one to the front, then the runtime's before it.
    for d in [exact, runtime].into_iter().flatten() {
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
