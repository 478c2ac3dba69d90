//! Finding the cached profile `run` and `bench` use when no `--profile` is given.
//!
//! A cached profile (`<cache>/profiles/*.yaml`, written by `tune` or `profiles
//! import`) serves a run when:
//! - **must match**: the model (name — for a file or directory its last path
//!   component — and `tuning.model_hash`: its configuration, layers included,
//!   and every matrix's storage format), the weight dtype
//!   (`execution.weightDtype`), the KV cache dtype, and the kernel backend;
//! - **device**: this device's own fingerprint first; else a profile tuned on a
//!   device of the same class ([`DeviceClass`]), with a warning naming both (or an
//!   error under `--strict-device`);
//! - **may differ**: prompt length and context (the nearest tuned wins: the
//!   smallest sum of |log ratio| of the two), then the better measured end-to-end
//!   time, then the newest, then the key (deterministic).
//!
//! A profile tuned with another kernel set (an older or newer ktune) is used for
//! what still validates ([`Profile::from_str_salvaged`]) with one warning saying
//! to re-tune, or skipped with one warning when nothing can be salvaged.

use std::cmp::Ordering;
use std::path::PathBuf;

use super::cache;
use super::{Profile, ProfileDoc, ProfileError};
use crate::device::{Backend, Device, DeviceCaps, DeviceClass};
use crate::kernels::{self, DType};
use crate::model::ModelConfig;

/// The model's identity for profile lookup: sha256 of its configuration and of
/// the storage format of every matrix that is not in the weight dtype (written to
/// a profile's `tuning.model_hash`; `run` and `bench` use a cached profile only
/// for the same hash).
pub fn model_hash(cfg: &ModelConfig, matrix_formats: &std::collections::BTreeMap<String, DType>) -> String {
    let cfg_json = serde_json::to_string(cfg).unwrap_or_default();
    let formats: String = matrix_formats.iter().map(|(t, d)| format!("|{t}={d}")).collect();
    crate::hash::sha256_parts::<&[&str]>(&[&cfg_json, &formats])
}

/// What the run needs from a cached profile.
pub struct Want<'a> {
    /// The model's profile name (`smollm2-135m`, `model@4layers`).
    pub model: &'a str,
    /// [`model_hash`] of the model as it will run.
    pub model_hash: String,
    pub weight_dtype: DType,
    pub kv_dtype: DType,
    pub prefill_tokens: usize,
    pub context: usize,
    /// Refuse a profile of this device's class tuned on another device.
    pub strict_device: bool,
}

/// A cached profile chosen for a run.
pub struct Cached {
    pub profile: Profile,
    pub key: String,
    pub path: PathBuf,
    /// Tuned on another device of the same class.
    pub by_class: bool,
    /// For the report: `cached 1cc776ff (tuned 2026-11-23, auto, 2m)`.
    pub label: String,
}

/// What the lookup found, and one line per thing the user should know (a class
/// fallback, a changed kernel set, a skipped profile).
pub struct Lookup {
    pub found: Option<Cached>,
    pub warnings: Vec<String>,
}

/// A profile file, or a cached profile by key prefix or `name` (what `profiles
/// show`, `profiles path` and `report` take); `Err` says what to give instead.
pub fn find_file_or_cached(cache: &cache::Cache, what: &str) -> Result<PathBuf, String> {
    let p = std::path::Path::new(what);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if p.exists()
        && let Err(e) = crate::input::regular_file(p)
    {
        return Err(format!("`{what}`: {e}; give a profile YAML file, or a cached profile's key prefix or name"));
    }
    if p.extension().is_some_and(|e| e == "yaml" || e == "yml") || what.contains(std::path::MAIN_SEPARATOR) {
        return Err(format!("profile file `{what}` does not exist; give a profile YAML file, or a cached profile's key prefix or name"));
    }
    let all = cache.profiles().unwrap_or_default();
    let hits: Vec<&(String, PathBuf)> =
        all.iter().filter(|(k, path)| k.starts_with(what) || Profile::load(path).is_ok_and(|p| p.doc.name == what)).collect();
    match hits.as_slice() {
        [(_, path)] => Ok(path.clone()),
        [] => Err(format!("no profile file or cached profile matches `{what}`; `ktune profiles list` shows the cache")),
        many => Err(format!(
            "`{what}` matches {} cached profiles ({}); give a longer key prefix",
            many.len(),
            many.iter().map(|(k, _)| crate::text::prefix(k, 12)).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// `90s`, `2m`, `1h30m`.
fn human_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// End-to-end seconds of the tuned combination for the profile's own workload
/// (infinite when not recorded); timed on the first of the model's layers, scaled
/// to all of them by their count (an overestimate: the embedding and the LM head
/// do not grow with the layers, so a profile timed whole wins a tie).
pub(crate) fn e2e_seconds(d: &ProfileDoc) -> f64 {
    let Some(t) = &d.tuning else { return f64::INFINITY };
    let e = &t.end_to_end;
    let (p, dd) = (e.tuned.prefill_tok_s, e.tuned.decode_tok_s);
    let scale = e.timed_layers.map_or(1.0, |l| l.of.max(1) as f64 / l.timed.max(1) as f64);
    if p > 0.0 && dd > 0.0 { scale * (e.prefill_tokens as f64 / p + e.decode_tokens as f64 / dd) } else { f64::INFINITY }
}

fn ratio_distance(a: usize, b: usize) -> f64 {
    ((a.max(1) as f64) / (b.max(1) as f64)).ln().abs()
}

struct Candidate {
    key: String,
    path: PathBuf,
    text: String,
    doc: ProfileDoc,
    exact: bool,
    distance: f64,
    e2e: f64,
}

/// Whether a profile's model name names this model: equal, or (a file or
/// directory given by path) the same last path component where the model hash
/// (configuration and weight formats) already matched, so `--gguf ./m.gguf` finds
/// what `--gguf /abs/path/m.gguf` tuned.
fn same_model(profile: &str, this: &str, hashed: bool) -> bool {
    fn last(s: &str) -> &str {
        s.rsplit(['/', '\\']).next().unwrap_or(s)
    }
    profile == this || (hashed && last(profile) == last(this))
}

/// Whether `doc` is for this model, weights, KV cache and backend; `Some(exact)`
/// when its device is this one (`true`) or of its class (`false`).
fn matches(doc: &ProfileDoc, want: &Want<'_>, fingerprint: &str, class: &DeviceClass, backend: Backend) -> Option<bool> {
    let t = doc.tuning.as_ref()?;
    let hashed = t.model_hash.as_ref().is_some_and(|h| *h == want.model_hash);
    if !same_model(&doc.model, want.model, hashed)
        || t.model_hash.as_ref().is_some_and(|h| *h != want.model_hash)
        || doc.execution.weight_dtype.dtype() != want.weight_dtype
        || doc.execution.kv_cache_dtype.dtype() != want.kv_dtype
    {
        return None;
    }
    let b = doc.device.backend.as_ref().map(|b| b.value.as_str());
    if b.is_some_and(|b| b != backend.name()) {
        return None;
    }
    if t.fingerprint == fingerprint {
        Some(true)
    } else if t.device_class.as_ref() == Some(class) {
        Some(false)
    } else {
        None
    }
}

/// The best cached profile for `device` and `want`, if any (see the module docs).
/// Errors only under `strict_device` when the cache has a profile of the class but
/// none of this device.
pub fn find(device: &Device, want: &Want<'_>) -> Result<Lookup, ProfileError> {
    let none = || Ok(Lookup { found: None, warnings: Vec::new() });
    let Ok(root) = cache::root() else { return none() };
    let dir = root.join("profiles");
    let Ok(read) = std::fs::read_dir(&dir) else { return none() };
    let mut files: Vec<(String, PathBuf)> = read
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter_map(|p| Some((p.file_stem()?.to_string_lossy().to_string(), p)))
        .collect();
    files.sort();
    let fingerprint = device.fingerprint();
    let class = device.class();
    let backend = DeviceCaps::from(device).backend();
    let mut cands = Vec::new();
    for (key, path) in files {
        let Ok(text) = super::read_text(&path) else { continue };
        // Parsed without validation: a profile of another kernel set is still found.
        let Ok(doc) = serde_saphyr::from_str::<ProfileDoc>(&text) else { continue };
        let Some(exact) = matches(&doc, want, &fingerprint, &class, backend) else { continue };
        let t = doc.tuning.as_ref().expect("matches() requires tuning");
        let distance = ratio_distance(t.prefill_tokens, want.prefill_tokens) + ratio_distance(t.context, want.context);
        let e2e = e2e_seconds(&doc);
        cands.push(Candidate { key, path, text, doc, exact, distance, e2e });
    }
    cands.sort_by(|a, b| {
        b.exact
            .cmp(&a.exact)
            .then(a.distance.partial_cmp(&b.distance).unwrap_or(Ordering::Equal))
            .then(a.e2e.partial_cmp(&b.e2e).unwrap_or(Ordering::Equal))
            .then_with(|| {
                let date = |c: &Candidate| c.doc.tuning.as_ref().map(|t| t.date.clone()).unwrap_or_default();
                date(b).cmp(&date(a))
            })
            .then(a.key.cmp(&b.key))
    });
    let kernel_set = kernels::kernel_set_hash();
    let mut warnings = Vec::new();
    for c in cands {
        let short = crate::text::prefix(&c.key, 8);
        let t = c.doc.tuning.clone().expect("matches() requires tuning");
        let retune = format!("re-tune it with this build (`ktune tune`, model {})", want.model);
        if !c.exact && want.strict_device {
            return Err(ProfileError::NotThisDevice {
                message: format!(
                    "--strict-device: no cached profile of {} was tuned on this device ({}, fingerprint {}…); \
                     cached profile {short} was tuned on {} (fingerprint {}…) of the same class ({class}): \
                     drop --strict-device to use it, or tune here with `ktune tune`",
                    want.model,
                    device.name(),
                    crate::text::prefix(&fingerprint, 12),
                    t.device_name,
                    crate::text::prefix(&t.fingerprint, 12),
                ),
            });
        }
        let origin = c.path.display().to_string();
        let (profile, dropped) = match Profile::from_str_salvaged(&c.text, &origin) {
            Ok(x) => x,
            Err(e) => {
                warnings.push(format!("cached profile {short} no longer loads with this ktune ({e}); skipped it: {retune}"));
                continue;
            }
        };
        if t.kernel_set != kernel_set {
            let what = if dropped.is_empty() {
                "using its choices, which all still validate".to_string()
            } else {
                format!("using what still validates (dropped {}: the runtime picks those)", dropped.join(", "))
            };
            warnings.push(format!(
                "cached profile {short} was tuned with another kernel set (ktune {}, kernel set {}…, this build {}…): {what}; {retune}",
                t.ktune_version,
                crate::text::prefix(&t.kernel_set, 8),
                crate::text::prefix(&kernel_set, 8)
            ));
        }
        if !c.exact {
            warnings.push(format!(
                "no profile of {} was tuned on this device ({}, fingerprint {}…): using cached profile {short} tuned on {} \
                 (fingerprint {}…), a device of the same class ({class}); tune here for this device's own (or --strict-device to refuse)",
                want.model,
                device.name(),
                crate::text::prefix(&fingerprint, 12),
                t.device_name,
                crate::text::prefix(&t.fingerprint, 12),
            ));
        }
        let date = t.date.get(..10).unwrap_or(&t.date);
        let on = if c.exact { String::new() } else { format!(", on {}", t.device_name) };
        let label = format!("cached {short} (tuned {date}, {}, {}{on})", t.strategy, human_duration(t.budget_s));
        let found = Cached { profile, key: c.key, path: c.path, by_class: !c.exact, label };
        return Ok(Lookup { found: Some(found), warnings });
    }
    Ok(Lookup { found: None, warnings })
}

#[cfg(test)]
mod tests {
    use super::{human_duration, same_model};

    #[test]
    fn a_model_file_matches_by_its_name_wherever_it_was_given_from() {
        assert!(same_model("smollm2-135m", "smollm2-135m", false));
        assert!(same_model("/abs/real/m.Q4_0.gguf@4layers", "real/m.Q4_0.gguf@4layers", true));
        assert!(!same_model("/abs/real/m.Q4_0.gguf", "real/m.Q4_0.gguf", false), "only where the model hash matched");
        assert!(!same_model("/abs/real/m.Q4_0.gguf", "real/other.gguf", true));
        assert!(!same_model("/abs/real/m.Q4_0.gguf@4layers", "real/m.Q4_0.gguf", true));
    }

    #[test]
    fn durations_read_as_budgets() {
        assert_eq!(human_duration(120.0), "2m");
        assert_eq!(human_duration(90.0), "1m30s");
        assert_eq!(human_duration(45.0), "45s");
        assert_eq!(human_duration(5400.0), "1h30m");
    }
}
