//! `diff-profiles`: what changed between two profiles (kernel and parameter choices
//! per slot, execution switches) and how the measured times moved, each delta set
//! against its noise, so CI can tell a regression from jitter.

use std::collections::BTreeMap;

use serde::Serialize;

use super::doc::{SlotTuning, Throughput};
use super::{Profile, ProfileError, entries};

/// A choice that differs.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// `attention.decode`, `matmul.qkv_proj (prefill)`, `layers 0-5: attention`,
    /// `serve.batches 8: norm (prefill)`, `execution.batchCommands`, `serve.cpuRepack`, ...
    pub what: String,
    pub old: String,
    pub new: String,
}

/// A time that moved.
#[derive(Clone, Debug, Serialize)]
pub struct TimeDelta {
    pub what: String,
    pub old: f64,
    pub new: f64,
    pub unit: &'static str,
    /// Change in cost: positive is slower.
    pub delta_pct: f64,
    /// Relative half-widths of both confidence intervals together.
    pub noise_pct: f64,
    pub regressed: bool,
    pub improved: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub a: String,
    pub b: String,
    pub threshold_pct: f64,
    pub changes: Vec<Change>,
    pub slots: Vec<TimeDelta>,
    pub end_to_end: Vec<TimeDelta>,
    /// A profile without a `tuning` section has no times to compare.
    pub notes: Vec<String>,
    pub changed: bool,
    pub regressed: bool,
}

fn entry_map(p: &Profile) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut add = |prefix: &str, k: &super::KernelsDoc| {
        for (path, at, _) in entries(k) {
            let key = format!("{prefix}{path}");
            match &at.value {
                super::Entry::One(v) => {
                    m.insert(key, v.to_string());
                }
                super::Entry::PerRegime { prefill, decode } => {
                    if let Some(v) = prefill {
                        m.insert(format!("{key} (prefill)"), v.to_string());
                    }
                    if let Some(v) = decode {
                        m.insert(format!("{key} (decode)"), v.to_string());
                    }
                }
            }
        }
    };
    add("", &p.doc.kernels);
    for (range, k) in &p.doc.layers {
        add(&format!("layers {range}: "), &k.value);
    }
    for (rows, k) in &p.doc.serve.batches {
        add(&format!("serve.batches {rows}: "), &k.value);
    }
    let e = &p.doc.execution;
    for (k, v) in [
        ("execution.batchCommands", e.batch_commands.to_string()),
        ("execution.kvCacheDtype", format!("{:?}", e.kv_cache_dtype).to_lowercase()),
        ("execution.weightDtype", format!("{:?}", e.weight_dtype).to_lowercase()),
        ("scheduling.maxParallelKernels", p.doc.scheduling.max_parallel_kernels.to_string()),
        ("execution.cpuThreads", e.cpu_threads.to_string()),
        ("execution.cpuSpinUs", e.cpu_spin_us.to_string()),
        ("execution.cpuPrefetchBytes", or_default(e.cpu_prefetch_bytes.map(|b| b.to_string()))),
        ("execution.cpuRepack", formats(&e.cpu_repack)),
        ("execution.trustedShaders", e.trusted_shaders.to_string()),
        ("execution.decodeChain", or_default(e.decode_chain.map(|k| k.to_string()))),
        ("serve.minBatch", or_default(p.doc.serve.min_batch.map(|m| m.to_string()))),
        ("serve.cpuRepack", or_default(p.doc.serve.cpu_repack.as_deref().map(formats))),
    ] {
        m.insert(k.to_string(), v);
    }
    let fusion = e.fusion();
    for f in &crate::plan::Fusion::FLAGS {
        m.insert(format!("execution.{}", f.profile_key), (f.on)(&fusion).to_string());
    }
    for name in p.doc.parallel.keys() {
        m.insert(format!("parallel.{name}"), "on".into());
    }
    m
}

/// A setting a profile leaves to the runtime, as a choice reads.
fn or_default(v: Option<String>) -> String {
    v.unwrap_or_else(|| "the runtime's default".into())
}

/// A list of block formats (`cpuRepack`) as a choice reads.
fn formats(f: &[String]) -> String {
    if f.is_empty() { "none".into() } else { f.join(", ") }
}

/// Compares a cost (smaller is better) with its confidence intervals.
fn delta(what: String, old: (f64, [f64; 2]), new: (f64, [f64; 2]), unit: &'static str, threshold_pct: f64) -> TimeDelta {
    let rel = |(m, ci): (f64, [f64; 2])| if m > 0.0 { (ci[1] - ci[0]) / 2.0 / m * 100.0 } else { 0.0 };
    let noise = rel(old) + rel(new);
    let d = if old.0 > 0.0 { (new.0 - old.0) / old.0 * 100.0 } else { 0.0 };
    // Beyond the threshold and beyond the noise: the intervals do not overlap.
    let regressed = d > threshold_pct && d > noise && new.1[0] > old.1[1];
    let improved = -d > threshold_pct && -d > noise && new.1[1] < old.1[0];
    TimeDelta { what, old: old.0, new: new.0, unit, delta_pct: d, noise_pct: noise, regressed, improved }
}

fn slot_key(s: &SlotTuning) -> String {
    format!("{} ({}) {}", s.slot, s.regime, s.problem)
}

fn chosen_time(s: &SlotTuning) -> Option<(f64, [f64; 2])> {
    s.candidates.iter().find(|c| c.variant.to_string() == s.chosen).map(|c| (c.median_us, c.ci_us))
}

fn e2e(t: &Throughput) -> [(&'static str, (f64, [f64; 2])); 2] {
    [("prefill", (t.prefill_ms, t.prefill_ci_ms)), ("decode (per token)", (t.decode_ms, t.decode_ci_ms))]
}

/// How finely a recorded divergence tells two paths apart (nats): the f32
/// reference's own rounding against another f32 path is about 1e-6, and kernels
/// that differ only in their rounding stay within this; it is the divergence's
/// interval in a comparison, so that a change between two near-exact paths is
/// noise, not a regression.
const KLD_RESOLUTION: f64 = 5e-5;

/// The chosen combination's divergence from the f32 reference (`kld`), in
/// millinats with its resolution interval; None when the tune did not measure it.
fn chosen_kld(t: &super::doc::Tuning) -> Option<(f64, [f64; 2])> {
    let k = t.end_to_end.combinations.iter().find(|c| c.chosen)?.kld?;
    Some((k * 1e3, [(k - KLD_RESOLUTION).max(0.0) * 1e3, (k + KLD_RESOLUTION) * 1e3]))
}

/// Compares `a` (the reference) with `b`.
pub fn diff(a: &Profile, b: &Profile, threshold_pct: f64) -> Result<DiffReport, ProfileError> {
    if !(threshold_pct.is_finite() && threshold_pct >= 0.0) {
        return Err(ProfileError::Invalid { path: "--threshold".into(), message: format!("{threshold_pct} is not a percentage ≥ 0") });
    }
    let (ma, mb) = (entry_map(a), entry_map(b));
    let mut changes = Vec::new();
    let keys: std::collections::BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
    for k in keys {
        let (o, n) = (ma.get(k), mb.get(k));
        if o != n {
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(runtime default)".into());
            changes.push(Change { what: k.clone(), old: show(o), new: show(n) });
        }
    }
    let mut notes = Vec::new();
    let mut slots = Vec::new();
    let mut end_to_end = Vec::new();
    match (&a.doc.tuning, &b.doc.tuning) {
        (Some(ta), Some(tb)) => {
            if ta.fingerprint != tb.fingerprint {
                notes.push("the profiles were tuned on different devices or drivers: times are not comparable like for like".into());
            }
            let old: BTreeMap<String, &SlotTuning> = ta.slots.iter().map(|s| (slot_key(s), s)).collect();
            for s in &tb.slots {
                if let (Some(o), Some(nt)) = (old.get(&slot_key(s)), chosen_time(s))
                    && let Some(ot) = chosen_time(o)
                {
                    slots.push(delta(slot_key(s), ot, nt, "us", threshold_pct));
                }
            }
            for ((name, o), (_, n)) in e2e(&ta.end_to_end.tuned).into_iter().zip(e2e(&tb.end_to_end.tuned)) {
                end_to_end.push(delta(name.to_string(), o, n, "ms", threshold_pct));
            }
            // Accuracy is a cost like time: more divergence beyond its resolution regresses.
            if let (Some(o), Some(n)) = (chosen_kld(ta), chosen_kld(tb)) {
                end_to_end.push(delta("accuracy (KL divergence from the f32 reference)".into(), o, n, "mnat/token", threshold_pct));
            }
        }
        _ => notes.push("a profile has no `tuning` section: only choices are compared".into()),
    }
    let regressed = slots.iter().chain(&end_to_end).any(|d| d.regressed);
    Ok(DiffReport {
        a: a.origin.clone(),
        b: b.origin.clone(),
        threshold_pct,
        changed: !changes.is_empty(),
        changes,
        slots,
        end_to_end,
        notes,
        regressed,
    })
}

/// One (model, device) of a set diff.
#[derive(Clone, Debug, Serialize)]
pub struct PairDiff {
    pub model: String,
    /// The device class (or the device, for a profile without one).
    pub device: String,
    /// `regressed`, `improved`, `changed`, `unchanged`, `added` (only in the new
    /// set) or `removed` (only in the reference).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<DiffReport>,
}

/// `diff-profiles` over bundles (or a bundle and a profile): the profiles paired
/// by model and device class, each pair compared as two profiles are.
#[derive(Clone, Debug, Serialize)]
pub struct SetDiff {
    pub a: String,
    pub b: String,
    pub threshold_pct: f64,
    pub pairs: Vec<PairDiff>,
    pub regressions: usize,
    pub improvements: usize,
    pub changed: usize,
    pub unchanged: usize,
    pub added: usize,
    pub removed: usize,
    pub regressed: bool,
    /// Anything but `unchanged` pairs.
    pub any_change: bool,
}

/// Two profiles, or two sets of them.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum DiffOut {
    One(DiffReport),
    Sets(SetDiff),
}

impl DiffOut {
    pub fn regressed(&self) -> bool {
        match self {
            DiffOut::One(d) => d.regressed,
            DiffOut::Sets(s) => s.regressed,
        }
    }
    pub fn changed(&self) -> bool {
        match self {
            DiffOut::One(d) => d.changed,
            DiffOut::Sets(s) => s.any_change,
        }
    }
}

/// The pairing key of a profile: its model and its device class (the
/// fingerprint's device for a profile without a class).
fn pair_key(p: &Profile) -> (String, String) {
    let device = match &p.doc.tuning {
        Some(t) => match &t.device_class {
            Some(c) => c.to_string(),
            None => format!("{} ({}…)", t.device_name, crate::text::prefix(&t.fingerprint, 12)),
        },
        None => p.doc.device.backend.as_ref().map(|b| b.value.clone()).unwrap_or_else(|| "any device".into()),
    };
    (p.doc.model.clone(), device)
}

/// Per key, the profile with the best measured end-to-end time.
fn by_pair(set: &[Profile]) -> BTreeMap<(String, String), &Profile> {
    let mut m: BTreeMap<(String, String), &Profile> = BTreeMap::new();
    for p in set {
        let e = super::lookup::e2e_seconds(&p.doc);
        m.entry(pair_key(p))
            .and_modify(|q| {
                if e < super::lookup::e2e_seconds(&q.doc) {
                    *q = p
                }
            })
            .or_insert(p);
    }
    m
}

/// Compares the reference set `a` with `b`, pair by pair.
pub fn diff_sets(a_name: &str, a: &[Profile], b_name: &str, b: &[Profile], threshold_pct: f64) -> Result<SetDiff, ProfileError> {
    let (ma, mb) = (by_pair(a), by_pair(b));
    let keys: std::collections::BTreeSet<&(String, String)> = ma.keys().chain(mb.keys()).collect();
    let mut pairs = Vec::new();
    for k in keys {
        let (model, device) = k.clone();
        let pair = match (ma.get(k), mb.get(k)) {
            (Some(x), Some(y)) => {
                let d = diff(x, y, threshold_pct)?;
                let status = if d.regressed {
                    "regressed"
                } else if d.end_to_end.iter().chain(&d.slots).any(|t| t.improved) {
                    "improved"
                } else if d.changed {
                    "changed"
                } else {
                    "unchanged"
                };
                PairDiff { model, device, status, diff: Some(d) }
            }
            (None, Some(_)) => PairDiff { model, device, status: "added", diff: None },
            _ => PairDiff { model, device, status: "removed", diff: None },
        };
        pairs.push(pair);
    }
    let count = |s: &str| pairs.iter().filter(|p| p.status == s).count();
    let (regressions, improvements, changed, unchanged, added, removed) =
        (count("regressed"), count("improved"), count("changed"), count("unchanged"), count("added"), count("removed"));
    Ok(SetDiff {
        a: a_name.into(),
        b: b_name.into(),
        threshold_pct,
        regressed: regressions > 0,
        any_change: unchanged < pairs.len(),
        pairs,
        regressions,
        improvements,
        changed,
        unchanged,
        added,
        removed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::doc::{Combination, EndToEnd, Tuning};
    use crate::profile::{ProfileDoc, to_yaml};

    /// A tuned profile whose chosen combination diverged by `kld` nats.
    fn with_kld(kld: f64) -> Profile {
        let mut doc: ProfileDoc = serde_saphyr::from_str("name: p\nmodel: m\nversion: 1\ndevice:\n  backend: cpu\n").expect("parses");
        let chosen = Combination { label: "c".into(), chosen: true, kld: Some(kld), ..Default::default() };
        doc.tuning = Some(Tuning {
            fingerprint: "f".repeat(64),
            kernel_set: crate::kernels::kernel_set_hash(),
            end_to_end: EndToEnd { combinations: vec![chosen], ..Default::default() },
            ..Default::default()
        });
        Profile::from_str(&to_yaml(&doc).expect("yaml"), "p.yaml").expect("loads")
    }

    fn accuracy(d: &DiffReport) -> &TimeDelta {
        d.end_to_end.iter().find(|t| t.what.starts_with("accuracy")).expect("an accuracy row")
    }

    #[test]
    fn more_divergence_regresses_like_more_time_beyond_its_resolution() {
        let d = diff(&with_kld(3e-3), &with_kld(4e-3), 5.0).expect("diffs");
        assert!(accuracy(&d).regressed && d.regressed, "{:?}", accuracy(&d));
        let d = diff(&with_kld(4e-3), &with_kld(3e-3), 5.0).expect("diffs");
        assert!(accuracy(&d).improved && !d.regressed, "{:?}", accuracy(&d));
        // Two near-exact paths: a doubling within the resolution is noise.
        let d = diff(&with_kld(1e-6), &with_kld(2e-6), 5.0).expect("diffs");
        assert!(!accuracy(&d).regressed, "{:?}", accuracy(&d));
    }
}
