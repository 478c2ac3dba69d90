//! A profile from a tune's results: the winning combination's kernel choices and
//! execution switches, the device requirements of the chosen variants, and the
//! `tuning` provenance (fingerprint, versions, timing method, the space, every
//! slot race with its candidates and rejections, end-to-end times against the
//! runtime's default with the decision's reason and head to head, a multimodal
//! model's image time per request).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::doc::{self as pd, Candidate, Combination, DeviceReq, SchedulingDoc, SlotTuning, Throughput, Tuning};
use super::{ExecSettings, FORMAT_VERSION, ProfileDoc, kernels_doc_with_formats};
use crate::device::Device;
use crate::kernels::{self, Backend, DType, Impl, Problem};
use crate::plan::select::{Choice, SlotChoices, SlotKey};
use crate::stats::{Stats, summarize};

/// What a finished tune found, as plain data: the tuner fills it, this module
/// writes it as a profile ([`profile_doc`]). The tuner measures and chooses; the
/// profile records.
pub struct TuneRecord<'a> {
    /// The model's profile name.
    pub model: &'a str,
    /// The device tuned on.
    pub device: &'a Device,
    /// The backend the chosen kernels run on.
    pub backend: Backend,
    /// [`model_hash`](super::lookup::model_hash) of the model as tuned.
    pub model_hash: String,
    /// The winning combination's execution settings.
    pub exec: ExecSettings,
    /// The winner's explicit kernel choices by slot (race winners, or the
    /// default's own picks; the vision slots' where they were kept)...
    pub choices: BTreeMap<SlotKey, Choice>,
    /// ...and by (format, slot) for a file's other matrix formats.
    pub formats: BTreeMap<(DType, SlotKey), Choice>,
    /// The decode batch regimes' winners, by batch size (`serve.batches`)...
    pub batches: BTreeMap<usize, SlotChoices>,
    /// ...and each size's end-to-end check...
    pub batch_times: &'a [pd::BatchEndToEnd],
    /// ...and the fewest sequences worth a batch pass (`serve.minBatch`).
    pub min_batch: Option<usize>,
    /// Every problem a chosen slot runs at, with its storage type (the winner's
    /// steps, the vision races' shapes): the device requirements follow from them.
    pub problems: Vec<(SlotKey, Problem, DType)>,
    /// Every slot race in the order of the search, with the bytes and flops of
    /// one sample over its shapes.
    pub races: Vec<(&'a RaceResult, (f64, f64))>,
    /// How the races kept the caches out of their timings.
    pub measurement: pd::Measurement,
    /// Read bandwidth (GB/s) and how it was measured.
    pub limits: (f64, &'static str),
    pub strategy: &'static str,
    pub seed: u64,
    pub budget_s: f64,
    pub prefill_tokens: usize,
    pub context: usize,
    pub decode_tokens: usize,
    pub space: pd::SpaceSummary,
    /// The combinations timed end to end, the runtime's default first.
    pub combinations: Vec<CombinationRecord<'a>>,
    /// The accuracy budget the combinations met (mean KL divergence, nats).
    pub max_kld: Option<f64>,
    /// The winning combination...
    pub best: usize,
    /// ...and why it won, or why the default stayed.
    pub reason: &'a str,
    /// The stage winner's head to head against the default, where one ran.
    pub head_to_head: Option<&'a HeadToHead>,
    /// A multimodal model's image per request (None: text only, or `--no-vision`).
    pub vision: Option<&'a VisionTimes>,
    /// The layers timed end to end and the model's, when fewer than all.
    pub timed_layers: Option<(usize, usize)>,
    /// Seconds the whole tune took.
    pub used_s: f64,
}

/// One combination timed end to end.
pub struct CombinationRecord<'a> {
    pub label: String,
    /// Predicted seconds (NaN for the default, which has no prediction).
    pub predicted_s: f64,
    /// Prefill seconds, one per sample.
    pub prefill: &'a [f64],
    /// Median decode seconds per token, one per sample.
    pub decode: &'a [f64],
    /// Mean KL divergence from the f32 reference on the accuracy prompts (None: not measured).
    pub kld: Option<f64>,
    /// Why the accuracy budget refused it (None: within the budget).
    pub refused: Option<String>,
}

/// A finished slot race: what the tuner caches (`<cache>/slots/`) and the
/// profile records (`tuning.slots`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RaceResult {
    pub slot: String,
    pub regime: String,
    pub problem: String,
    pub count: usize,
    pub winner: usize,
    pub cands: Vec<CandRecord>,
    pub rejected: Vec<(String, String)>,
    /// Per-shape medians of every measured candidate (seconds), by shape description.
    pub shape_medians: Vec<BTreeMap<String, f64>>,
    pub timestamps: bool,
    /// Per shape, the input copies the executions rotated through.
    #[serde(default)]
    pub copies: Vec<usize>,
}

/// One candidate of a race, as timed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CandRecord {
    pub kernel: String,
    pub params: kernels::Params,
    pub stats: Stats,
    pub status: String,
}

impl RaceResult {
    /// The winner as a kernel choice (None when nothing was timed).
    pub fn winner_choice(&self) -> Option<Choice> {
        let c = self.cands.get(self.winner).filter(|c| c.stats.n > 0)?;
        kernels::find(&c.kernel).ok().map(|k| Choice::new(k, c.params.clone()))
    }
}

/// One image through the vision tower and projector per round, with the raced
/// vision winners and with the runtime's default vision kernels.
pub struct VisionTimes {
    /// The image's side, pixels (a synthetic image).
    pub image_size: usize,
    /// Seconds per image, one per round, with the raced winners.
    pub tuned: Vec<f64>,
    /// Seconds per image, one per round, with the runtime's defaults.
    pub default: Vec<f64>,
    /// Whether the raced vision winners stay in the profile (else its vision
    /// slots are left to the runtime's defaults).
    pub kept: bool,
    /// Why they were kept or not.
    pub reason: String,
}

/// The end-to-end stage's winner against the runtime's default again, two
/// engines alone: one request's seconds per round of each.
pub struct HeadToHead {
    /// The winner's label.
    pub combination: String,
    pub default: Vec<f64>,
    pub tuned: Vec<f64>,
    /// Whether it confirmed the winner (else the default stayed).
    pub confirmed: bool,
}

/// Median and 95% interval of `x` seconds, in ms (zeros when empty).
fn ms(x: &[f64]) -> (f64, [f64; 2]) {
    let s = summarize(x);
    if s.n == 0 { (0.0, [0.0; 2]) } else { (s.median * 1e3, [s.ci[0] * 1e3, s.ci[1] * 1e3]) }
}

/// The index of the runtime's default among [`TuneRecord::combinations`].
const DEFAULT_COMBINATION: usize = 0;

/// The profile document of a finished tune.
pub fn profile_doc(r: &TuneRecord<'_>) -> ProfileDoc {
    let TuneRecord { device, exec, choices, formats, combinations, best, .. } = r;
    let (limit_gbps, limit_src) = r.limits;
    let thr = |c: &CombinationRecord| throughput(r.prefill_tokens, &summarize(c.prefill), &summarize(c.decode));
    // Device requirements of the chosen variants, at the problems they run.
    let mut req =
        DeviceReq { backend: Some(pd::At::new(r.backend.name().to_string())), vendor: Some(device.vendor()), ..DeviceReq::default() };
    for (key, p, d) in &r.problems {
        if let Some(c) = choices.get(key)
            && let Impl::Wgsl(w) = &c.kernel.imp
        {
            req.requires_f16 |= (w.needs_f16)(*d);
            req.requires_subgroups |= w.needs_subgroups;
            req.min_shared_memory = req.min_shared_memory.max((w.shared_memory)(p, *d, &c.params).unwrap_or_default());
        }
    }
    let (execution, parallel) = exec.to_doc();

    let slots: Vec<SlotTuning> = r
        .races
        .iter()
        .map(|&(res, w)| {
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
                copies: res.copies.iter().copied().max(),
                candidates: cands,
                rejected: rejected_doc(&res.rejected),
            }
        })
        .collect();
    let timing = if r.races.iter().any(|(res, _)| res.timestamps) { "gpu-timestamps" } else { "wall-clock" };
    let tuning = Tuning {
        fingerprint: device.fingerprint(),
        device_name: device.name(),
        ktune_version: env!("CARGO_PKG_VERSION").into(),
        kernel_set: kernels::kernel_set_hash(),
        device_class: Some(device.class()),
        model_hash: Some(r.model_hash.clone()),
        timing: format!("{timing} (slots); wall-clock (end to end)"),
        measurement: Some(r.measurement.clone()),
        date: utc_now(),
        strategy: r.strategy.into(),
        seed: r.seed,
        budget_s: r.budget_s,
        used_s: r.used_s,
        prefill_tokens: r.prefill_tokens,
        context: r.context,
        limits: pd::Limits { read_gbps: limit_gbps, read_source: limit_src.into() },
        space: r.space.clone(),
        slots,
        end_to_end: pd::EndToEnd {
            prefill_tokens: r.prefill_tokens,
            decode_tokens: r.decode_tokens,
            tuned: thr(&combinations[*best]),
            default: thr(&combinations[DEFAULT_COMBINATION]),
            max_kld: r.max_kld,
            timed_layers: r.timed_layers.map(|(timed, of)| pd::TimedLayers { timed, of }),
            combinations: combinations
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.prefill.is_empty())
                .map(|(i, c)| Combination {
                    label: c.label.clone(),
                    predicted_ms: if c.predicted_s.is_finite() { c.predicted_s * 1e3 } else { 0.0 },
                    result: thr(c),
                    chosen: i == *best,
                    kld: c.kld,
                    refused: c.refused.clone(),
                })
                .collect(),
            decision: Some(r.reason.to_string()),
            head_to_head: r.head_to_head.map(|h| {
                let ((tuned_ms, tuned_ci_ms), (default_ms, default_ci_ms)) = (ms(&h.tuned), ms(&h.default));
                pd::HeadToHead {
                    combination: h.combination.clone(),
                    rounds: h.default.len().min(h.tuned.len()),
                    tuned_ms,
                    tuned_ci_ms,
                    default_ms,
                    default_ci_ms,
                    confirmed: h.confirmed,
                }
            }),
            batches: r.batch_times.to_vec(),
            vision: r.vision.map(|v| {
                // Median and interval, ms (zeros for a choice that never ran).
                let ((tuned_ms, tuned_ci_ms), (default_ms, default_ci_ms)) = (ms(&v.tuned), ms(&v.default));
                pd::VisionEndToEnd {
                    image: format!("synthetic {0}x{0}", v.image_size),
                    rounds: v.default.len(),
                    tuned_ms,
                    tuned_ci_ms,
                    default_ms,
                    default_ci_ms,
                    kept: v.kept,
                    reason: v.reason.clone(),
                }
            }),
        },
    };
    ProfileDoc {
        name: format!("{}-{}-{}", r.model, device.vendor(), crate::text::prefix(&device.fingerprint(), 8)),
        model: r.model.into(),
        version: pd::At::new(FORMAT_VERSION),
        device: req,
        kernels: kernels_doc_with_formats(choices, formats),
        execution,
        parallel,
        layers: BTreeMap::new(),
        scheduling: SchedulingDoc::default(),
        serve: pd::ServeDoc {
            min_batch: r.min_batch,
            cpu_repack: r.exec.batch_repack.as_ref().map(|v| v.iter().map(|f| f.name().to_string()).collect()),
            batches: r
                .batches
                .iter()
                .map(|(rows, t)| (rows.to_string(), pd::At::new(kernels_doc_with_formats(&t.slots, &t.formats))))
                .collect(),
        },
        tuning: Some(tuning),
    }
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

/// The current UTC time, RFC 3339 to the second (`2026-01-31T12:34:56Z`).
fn utc_now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The variants a race rejected, as the profile records them: each one that
/// failed (its reason), and of those that shared one reason past
/// [`REJECTED_PER_REASON`] (the variants a short race did not reach: on a GPU
/// thousands a slot) the first ones and a count of the rest, so a profile stays
/// within what its reader takes.
fn rejected_doc(rejected: &[(String, String)]) -> Vec<pd::Rejected> {
    let mut out: Vec<pd::Rejected> = Vec::new();
    let mut per_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for (v, why) in rejected {
        let n = per_reason.entry(why.as_str()).or_default();
        *n += 1;
        if *n <= REJECTED_PER_REASON {
            out.push(pd::Rejected { variant: v.clone(), reason: why.clone() });
        }
    }
    for (why, n) in per_reason.into_iter().filter(|(_, n)| *n > REJECTED_PER_REASON) {
        out.push(pd::Rejected { variant: format!("{} more", n - REJECTED_PER_REASON), reason: why.to_string() });
    }
    out
}

/// Variants a slot's profile entry lists for one reason of rejection.
const REJECTED_PER_REASON: usize = 16;

#[cfg(test)]
mod tests {
    /// The profile's `tuning.date`: RFC 3339 in UTC to the second, as before.
    #[test]
    fn dates_are_utc_to_the_second() {
        let d = super::utc_now();
        assert_eq!(d.len(), 20, "{d}");
        let b = d.as_bytes();
        assert!(b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':' && b[19] == b'Z', "{d}");
        assert!(d.starts_with("20"), "{d}");
    }

    /// A race's rejections as the profile lists them: every failure with its
    /// reason, and past 16 of one reason (the variants a short GPU race did not
    /// reach, thousands of them) a count of the rest.
    #[test]
    fn a_profile_lists_sixteen_rejections_of_a_reason_and_counts_the_rest() {
        let mut rejected: Vec<(String, String)> = (0..40).map(|i| (format!("v{i}"), "not reached".to_string())).collect();
        rejected.push(("bad".into(), "failed its check".into()));
        let doc = super::rejected_doc(&rejected);
        assert_eq!(doc.len(), 16 + 1 + 1);
        assert_eq!(doc.iter().filter(|r| r.reason == "not reached").count(), 17);
        assert!(doc.iter().any(|r| r.variant == "bad" && r.reason == "failed its check"));
        assert!(doc.iter().any(|r| r.variant == "24 more" && r.reason == "not reached"));
    }
}
