//! `ktune report`: load the profiles (files, or cached profiles by key prefix or
//! name), flatten each one's kernel choices, and compare every later profile with
//! the first ([`crate::profile::diff::diff`]). The page itself is drawn by
//! `output` and written by `app`; `tune --report` builds the same value for the
//! profile it wrote ([`single`]).

use std::path::{Path, PathBuf};

use crate::cli::ReportArgs;
use crate::profile::cache::Cache;
use crate::profile::diff::diff;
use crate::profile::{KernelsDoc, Profile, ProfileDoc, VariantDoc};
use crate::report::{HtmlReport, ReportedProfile};
use crate::tuner::TuneError;
use crate::{Error, Result};

pub fn run(args: &ReportArgs) -> Result<HtmlReport> {
    // Flags first, before any profile is read.
    let threshold = args.threshold;
    check_output(&args.output)?;
    let mut cache = None;
    let mut loaded = Vec::new();
    for what in &args.profiles {
        let path = find(&mut cache, what)?;
        loaded.push(Profile::load(&path)?);
    }
    let mut diffs = Vec::new();
    if let Some((first, rest)) = loaded.split_first() {
        for p in rest {
            diffs.push(diff(first, p, threshold)?);
        }
    }
    Ok(HtmlReport {
        output: args.output.clone(),
        ktune_version: env!("CARGO_PKG_VERSION").to_string(),
        profiles: loaded.into_iter().map(|p| reported(p.origin, p.doc)).collect(),
        diffs,
    })
}

/// The report of one profile (`tune --report`), to be written to `output`.
pub fn single(origin: &Path, doc: ProfileDoc, output: &Path) -> HtmlReport {
    HtmlReport {
        output: output.to_path_buf(),
        ktune_version: env!("CARGO_PKG_VERSION").to_string(),
        profiles: vec![reported(origin.display().to_string(), doc)],
        diffs: Vec::new(),
    }
}

fn reported(origin: String, doc: ProfileDoc) -> ReportedProfile {
    let mut choices = Vec::new();
    flatten_kernels("", &doc.kernels, &mut choices);
    for (range, k) in &doc.layers {
        flatten_kernels(&format!("layers {range}: "), &k.value, &mut choices);
    }
    ReportedProfile { origin, choices, profile: doc }
}

/// The kernel choices of a `kernels` section as (slot path, variant) rows, in the
/// order the YAML writes them. Walks the serialized form, so every key the format
/// has (formats, fused, ...) is listed without naming them here.
fn flatten_kernels(prefix: &str, k: &KernelsDoc, out: &mut Vec<(String, String)>) {
    fn label(v: &serde_json::Value) -> Option<String> {
        match v {
            serde_json::Value::String(id) => Some(id.clone()),
            serde_json::Value::Object(m) if m.contains_key("kernel") => {
                serde_json::from_value::<VariantDoc>(v.clone()).ok().map(|d| d.to_string())
            }
            _ => None,
        }
    }
    fn walk(path: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
        if let Some(l) = label(v) {
            out.push((path.to_string(), l));
            return;
        }
        let serde_json::Value::Object(m) = v else { return };
        let regimes = !m.is_empty() && m.keys().all(|k| k == "prefill" || k == "decode");
        for (key, sub) in m {
            if regimes {
                if let Some(l) = label(sub) {
                    out.push((format!("{path} ({key})"), l));
                }
            } else {
                let p = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                walk(&p, sub, out);
            }
        }
    }
    if let Ok(v) = serde_json::to_value(k) {
        let start = out.len();
        walk("", &v, out);
        for row in &mut out[start..] {
            row.0 = format!("{prefix}{}", row.0);
        }
    }
}

/// `-o` must name a file, not a directory.
fn check_output(out: &Path) -> Result<()> {
    if out.is_dir() || out.as_os_str().is_empty() {
        return Err(Error::Usage(format!("-o `{}` is a directory; give the HTML file to write, e.g. -o report.html", out.display())));
    }
    crate::atomic::check_output(out, &[])?;
    Ok(())
}

/// A profile file, or a cached profile by key prefix or name (as `profiles show`
/// finds them; the cache is opened only when `what` is not a file).
fn find(cache: &mut Option<Cache>, what: &str) -> Result<PathBuf> {
    let p = Path::new(what);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    let c = match cache {
        Some(c) => c,
        None => cache.insert(Cache::open().map_err(TuneError::from)?),
    };
    crate::profile::lookup::find_file_or_cached(c, what).map_err(Error::Usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_flattened_per_regime_and_with_params() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/profiles/a.yaml")).expect("fixture");
        let p = Profile::from_str(&text, "a.yaml").expect("loads");
        let r = reported(p.origin, p.doc);
        let get = |k: &str| r.choices.iter().find(|(s, _)| s == k).map(|(_, v)| v.as_str());
        assert_eq!(get("attention (prefill)"), Some("attention_prefill_tiled_cpu"));
        assert_eq!(get("attention (decode)"), Some("attention_decode_splitkv_cpu(chunk=256)"));
        assert_eq!(get("matmul.qkv_proj"), Some("gemv_dot4_cpu"));
        assert_eq!(get("norm"), Some("rms_norm_rows_cpu"));
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        assert!(check_output(Path::new(".")).is_err());
        let mut none = None;
        let e = find(&mut none, "/nonexistent/p.yaml").expect_err("no such file");
        assert!(e.to_string().contains("does not exist"), "{e}");
    }
}
