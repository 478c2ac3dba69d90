//! A profile from a tune's results: the winning combination's kernel choices and
//! execution switches, the device requirements of the chosen variants, and the
//! `tuning` provenance (fingerprint, versions, timing method, the space, every
//! slot race with its candidates and rejections, end-to-end times against the
//! runtime's default, a multimodal model's image time per request).

use std::collections::BTreeMap;

use super::doc::{self as pd, Candidate, Combination, DeviceReq, SchedulingDoc, SlotTuning, Throughput, Tuning};
use super::{ExecSettings, FORMAT_VERSION, ProfileDoc, kernels_doc_with_formats};
use crate::kernels::{self, Impl};
use crate::plan::select::{Choice, SlotKey};
use crate::tuner::Findings;
use crate::tuner::e2e::EndToEnd;
use crate::tuner::measure::Workload;
use crate::tuner::stats::{Stats, summarize};

/// The profile document of a finished tune.
pub(crate) fn profile_doc(f: &Findings<'_>) -> ProfileDoc {
    let Findings { target: t, options: o, caps, limits, rotation, space, races, e2e, used_s } = *f;
    let (limit_gbps, limit_src) = limits;
    let EndToEnd { combos, samples, best, .. } = e2e;
    let best = *best;
    let thr = |i: usize| throughput(o.prefill_tokens, &summarize(&samples[i].0), &summarize(&samples[i].1));
    let default_i = EndToEnd::DEFAULT;
    let chosen = &combos[best].0;
    let chosen_sel = e2e.selection(chosen, caps);

    // The explicit choices of the winner: race winners, or the default's own picks.
    let mut final_choices: BTreeMap<SlotKey, Choice> = BTreeMap::new();
    let mut final_formats: BTreeMap<(kernels::DType, SlotKey), Choice> = BTreeMap::new();
    let extra = o.extra_formats();
    let (_, steps) = space.per_fusion.iter().find(|(f, _)| *f == chosen.fusion).cloned().unwrap_or((chosen.fusion, Vec::new()));
    for (key, p, d) in &steps {
        if let Ok(c) = chosen_sel.choose(key.0, key.1, None, p, *d) {
            if extra.contains(d) {
                final_formats.entry((*d, *key)).or_insert(c);
            } else {
                final_choices.entry(*key).or_insert(c);
            }
        }
    }
    // The vision regime's race winners, where they beat the runtime's default
    // vision kernels end to end (else the slots are left to the defaults).
    let vision_kept = e2e.vision.as_ref().is_none_or(|v| v.kept);
    for (r, res) in space.races.iter().zip(&races.results) {
        if vision_kept
            && r.key.1 == crate::plan::Regime::Vision
            && let Some(c) = res.winner_choice()
        {
            final_choices.insert(r.key, c);
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
    // The vision winners' requirements, at the tower's shapes (their races').
    for r in space.races.iter().filter(|r| r.key.1 == crate::plan::Regime::Vision) {
        if let Some(c) = final_choices.get(&r.key)
            && let Impl::Wgsl(w) = &c.kernel.imp
        {
            req.requires_f16 |= (w.needs_f16)(r.dtype);
            req.requires_subgroups |= w.needs_subgroups;
            for (p, _) in &r.shapes {
                req.min_shared_memory = req.min_shared_memory.max((w.shared_memory)(p, r.dtype, &c.params).unwrap_or_default());
            }
        }
    }
    let exec = ExecSettings {
        batch: chosen.batch,
        fusion: chosen.fusion,
        parallel: chosen.parallel,
        kv_dtype: o.kv_dtype,
        weight_dtype: o.weight_dtype,
        threads: chosen.threads,
        spin_us: chosen.spin_us,
        prefetch: chosen.prefetch,
        repack: chosen.repack_formats(),
        trusted_shaders: o.trusted_shaders && t.ctx.is_some(),
    };
    let (execution, parallel) = exec.to_doc();

    let slots: Vec<SlotTuning> = races
        .results
        .iter()
        .zip(&space.races)
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
                copies: res.copies.iter().copied().max(),
                candidates: cands,
                rejected: res.rejected.iter().map(|(v, why)| pd::Rejected { variant: v.clone(), reason: why.clone() }).collect(),
            }
        })
        .collect();
    let timing = if races.results.iter().any(|r| r.timestamps) { "gpu-timestamps" } else { "wall-clock" };
    let tuning = Tuning {
        fingerprint: t.device.fingerprint(),
        device_name: t.device.name(),
        ktune_version: env!("CARGO_PKG_VERSION").into(),
        kernel_set: kernels::kernel_set_hash(),
        device_class: Some(t.device.class()),
        model_hash: Some(crate::tuner::model_hash(t.config, &o.matrix_formats)),
        timing: format!("{timing} (slots); wall-clock (end to end)"),
        measurement: Some(pd::Measurement {
            method: crate::tuner::measure::Rotation::METHOD.into(),
            cache_bytes: rotation.cache_bytes,
            cache_source: rotation.cache_source.clone(),
            rotate_bytes: rotation.rotate_bytes,
            max_copies: races.results.iter().flat_map(|r| r.copies.iter().copied()).max().unwrap_or(1),
        }),
        date: utc_now(),
        strategy: o.strategy.name().into(),
        seed: o.seed,
        budget_s: o.budget.as_secs_f64(),
        used_s,
        prefill_tokens: o.prefill_tokens,
        context: o.context,
        limits: pd::Limits { read_gbps: limit_gbps, read_source: limit_src.into() },
        space: pd::SpaceSummary {
            variants: space.variants,
            ruled_out: space.ruled_out.clone(),
            combinations: format!("{:.3e}", space.combinations),
            fusion_choices: space.per_fusion.len(),
        },
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
            vision: e2e.vision.as_ref().map(|v| {
                // Median and interval, ms (zeros for a choice that never ran).
                let ms = |x: &[f64]| -> (f64, [f64; 2]) {
                    let s = summarize(x);
                    if s.n == 0 { (0.0, [0.0; 2]) } else { (s.median * 1e3, [s.ci[0] * 1e3, s.ci[1] * 1e3]) }
                };
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
        name: format!("{}-{}-{}", t.model, t.device.vendor(), &t.device.fingerprint()[..8]),
        model: t.model.into(),
        version: pd::At::new(FORMAT_VERSION),
        device: req,
        kernels: kernels_doc_with_formats(&final_choices, &final_formats),
        execution,
        parallel,
        layers: BTreeMap::new(),
        scheduling: SchedulingDoc::default(),
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
}
