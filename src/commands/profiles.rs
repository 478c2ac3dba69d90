//! `ktune profiles list|show|path|clear` and `ktune diff-profiles`.

use std::path::{Path, PathBuf};

use crate::cli::{DiffArgs, ProfilesAction};
use crate::error::ExitCode;
use crate::profile::Profile;
use crate::profile::diff::{DiffReport, diff};
use crate::report::{ProfileRow, ProfilesReport};
use crate::tuner::cache::Cache;
use crate::tuner::{TuneError, cache};
use crate::{Error, Result};

fn open() -> Result<Cache> {
    Cache::open().map_err(|e| Error::from(TuneError::from(e)))
}

/// A profile file path, or a cached profile by key prefix or name.
fn find(cache: &Cache, what: &str) -> Result<PathBuf> {
    let p = Path::new(what);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    let all = cache.profiles().map_err(TuneError::from)?;
    let hits: Vec<&(String, PathBuf)> =
        all.iter().filter(|(k, path)| k.starts_with(what) || Profile::load(path).map(|p| p.doc.name == what).unwrap_or(false)).collect();
    match hits.as_slice() {
        [(_, path)] => Ok(path.clone()),
        [] => Err(Error::Usage(format!("no cached profile or file matches `{what}`; `ktune profiles list` shows the cache"))),
        many => Err(Error::Usage(format!(
            "`{what}` matches {} cached profiles ({}); give a longer key prefix",
            many.len(),
            many.iter().map(|(k, _)| &k[..12]).collect::<Vec<_>>().join(", ")
        ))),
    }
}

pub fn run(action: &ProfilesAction) -> Result<ProfilesReport> {
    match action {
        ProfilesAction::List { .. } => {
            let c = open()?;
            let mut rows = Vec::new();
            for (key, path) in c.profiles().map_err(TuneError::from)? {
                let Ok(p) = Profile::load(&path) else { continue };
                let t = p.doc.tuning.clone().unwrap_or_default();
                rows.push(ProfileRow {
                    key,
                    name: p.doc.name.clone(),
                    model: p.doc.model.clone(),
                    device: t.device_name.clone(),
                    date: t.date.clone(),
                    strategy: t.strategy.clone(),
                    decode_tok_s: t.end_to_end.tuned.decode_tok_s,
                    prefill_tok_s: t.end_to_end.tuned.prefill_tok_s,
                    path,
                });
            }
            Ok(ProfilesReport::List(rows))
        }
        ProfilesAction::Show { profile } => {
            let c = open()?;
            let path = find(&c, profile)?;
            let p = Profile::load(&path)?;
            Ok(ProfilesReport::Text(p.to_yaml()?))
        }
        ProfilesAction::Path { profile } => match profile {
            None => Ok(ProfilesReport::Text(cache::root().map_err(TuneError::from)?.display().to_string())),
            Some(what) => {
                let c = open()?;
                Ok(ProfilesReport::Text(find(&c, what)?.display().to_string()))
            }
        },
        ProfilesAction::Clear => {
            let c = open()?;
            let n = c.clear().map_err(TuneError::from)?;
            Ok(ProfilesReport::Text(format!("removed {n} cached files from {}", c.root.display())))
        }
    }
}

/// Parses `5`, `5%` or `2.5`.
fn parse_pct(s: &str) -> Result<f64> {
    let t = s.trim().trim_end_matches('%');
    t.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| Error::Usage(format!("--threshold `{s}`: give a percentage such as 5 or 5%")))
}

/// The comparison, and `Differences` on a regression (or with `--fail-on-change`
/// on any changed choice).
pub fn diff_profiles(args: &DiffArgs) -> Result<(DiffReport, ExitCode)> {
    let threshold = parse_pct(&args.threshold)?;
    let a = Profile::load(&args.a)?;
    let b = Profile::load(&args.b)?;
    let r = diff(&a, &b, threshold)?;
    let code = if r.regressed || (args.fail_on_change && r.changed) { ExitCode::Differences } else { ExitCode::Success };
    Ok((r, code))
}
