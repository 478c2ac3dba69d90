//! `ktune profiles list|show|path|clear` and `ktune diff-profiles`.

use std::path::{Path, PathBuf};

use crate::atomic::Inputs;
use crate::cli::{DiffArgs, ProfilesAction};
use crate::error::ExitCode;
use crate::profile::Profile;
use crate::profile::bundle::{self, Item, Outcome, Set};
use crate::profile::cache::{self, Cache};
use crate::profile::diff::{DiffOut, diff, diff_sets};
use crate::report::{BundleReport, ProfileRow, ProfilesReport};
use crate::tuner::TuneError;
use crate::{Error, Result};

fn open() -> Result<Cache> {
    Cache::open().map_err(|e| Error::from(TuneError::from(e)))
}

/// A profile file path, or a cached profile by key prefix or name.
fn find(cache: &Cache, what: &str) -> Result<PathBuf> {
    crate::profile::lookup::find_file_or_cached(cache, what).map_err(Error::Usage)
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
        ProfilesAction::Export { model, output, .. } => export(model.as_deref(), output),
        ProfilesAction::Import { bundles, shipped, .. } => import(bundles, *shipped),
        ProfilesAction::Merge { bundles, output, .. } => merge(bundles, output),
        ProfilesAction::Clear => {
            let c = open()?;
            let n = c.clear().map_err(TuneError::from)?;
            Ok(ProfilesReport::Text(format!("removed {n} cached files from {}", c.root.display())))
        }
    }
}

/// The cached profiles that validate with this build, as bundle items (the others
/// as `skipped` outcomes).
fn cached_items(c: &Cache, model: Option<&str>) -> Result<(Vec<Item>, Vec<Outcome>)> {
    let mut items = Vec::new();
    let mut skipped = Vec::new();
    for (key, path) in c.profiles().map_err(TuneError::from)? {
        let Ok(text) = crate::profile::read_text(&path) else { continue };
        let origin = path.display().to_string();
        if let Some(m) = model {
            // Filter on the document's model before validating it.
            let doc_model = serde_saphyr::from_str::<crate::profile::ProfileDoc>(&text).map(|d| d.model).unwrap_or_default();
            // The name, or a directory's or file's last component, with or without `@Nlayers`.
            let name = doc_model.split('@').next().unwrap_or_default();
            let base = name.rsplit(['/', '\\']).next().unwrap_or_default();
            if doc_model != m && name != m && base != m && base.strip_suffix(".gguf") != Some(m) {
                continue;
            }
        }
        match Item::new(&key, text, origin.clone()) {
            Ok(i) => items.push(i),
            Err(reason) => {
                skipped.push(Outcome { key, model: String::new(), device: String::new(), origin, action: "skipped".into(), reason })
            }
        }
    }
    Ok((items, skipped))
}

/// Writes `set` as the bundle `output` (whole or not at all; none of the files
/// read, `inputs`) and reports it: `action` (export, merge) with what became of
/// each profile.
fn write_bundle(set: &Set, output: &Path, inputs: &Inputs<'_>, action: &'static str, profiles: Vec<Outcome>) -> Result<ProfilesReport> {
    let bytes = set.to_bundle().map_err(|e| Error::Usage(format!("writing bundle {}: {e}", output.display())))?;
    crate::atomic::write_output(output, inputs, &bytes)?;
    Ok(ProfilesReport::Bundle(BundleReport { action, written: Some(output.to_path_buf()), count: set.items.len(), profiles }))
}

fn export(model: Option<&str>, output: &Path) -> Result<ProfilesReport> {
    let c = open()?;
    let (items, mut outcomes) = cached_items(&c, model)?;
    if items.is_empty() {
        let of = model.map(|m| format!(" of model `{m}`")).unwrap_or_default();
        return Err(Error::Usage(format!(
            "no cached profile{of} to export from {} (`ktune profiles list` shows the cache; `ktune tune` fills it)",
            c.root.display()
        )));
    }
    // The cached profiles read: -o may not name one of them.
    let origins: Vec<PathBuf> = items.iter().map(|i| PathBuf::from(&i.origin)).collect();
    let inputs: Vec<(&str, &Path)> = origins.iter().map(|p| ("the cached profile", p.as_path())).collect();
    let mut set = Set::default();
    for i in items {
        outcomes.push(set.add(i));
    }
    write_bundle(&set, output, &inputs, "export", outcomes)
}

/// Reads every bundle once, all before anything changes: their usable profiles
/// and the skipped ones; an error when the bundles hold no usable profile at
/// all (naming what was skipped and why).
fn read_bundles(paths: &[PathBuf]) -> Result<(Vec<Item>, Vec<Outcome>)> {
    let (mut items, mut skipped) = (Vec::new(), Vec::new());
    for p in paths {
        let (i, s) = bundle::read(p)?;
        items.extend(i);
        skipped.extend(s);
    }
    if items.is_empty() && !paths.is_empty() {
        return Err(Error::Usage(format!("nothing to take: {}", bundle::nothing_usable(&skipped))));
    }
    Ok((items, skipped))
}

/// Adds a bundle's usable `items` to `set`, and what became of each (and of the
/// `skipped` ones) to `outcomes`; the keys added or replaced to `taken`.
fn add_items(items: Vec<bundle::Item>, skipped: Vec<Outcome>, set: &mut Set, outcomes: &mut Vec<Outcome>, taken: &mut Vec<String>) {
    outcomes.extend(skipped);
    for i in items {
        let o = set.add(i);
        if o.action == "added" || o.action == "replaced" {
            taken.push(o.key.clone());
        }
        outcomes.push(o);
    }
}

fn import(paths: &[PathBuf], with_shipped: bool) -> Result<ProfilesReport> {
    // Every bundle is read and checked before the cache changes.
    let (items, skipped) = read_bundles(paths)?;
    let c = open()?;
    let (existing, _) = cached_items(&c, None)?;
    let mut set = Set::default();
    for i in existing {
        set.add(i);
    }
    let mut outcomes = Vec::new();
    let mut taken = Vec::new();
    add_items(items, skipped, &mut set, &mut outcomes, &mut taken);
    if with_shipped {
        let (items, skipped) = bundle::shipped();
        add_items(items, skipped, &mut set, &mut outcomes, &mut taken);
    }
    let mut written = std::collections::BTreeSet::new();
    for key in &taken {
        if !written.insert(key.clone()) {
            continue;
        }
        let item = &set.items[key];
        let path = c.profile_path(key);
        // The tune lock of the key: an import never races a tune writing it.
        let _lock = c.lock(key, || {}).map_err(TuneError::from)?;
        crate::atomic::write_atomic(&path, item.text.as_bytes()).map_err(|e| {
            let done = written.len() - 1;
            Error::Usage(format!(
                "cannot write {}: {e}{}; {done} of the import's {} profiles were written before it",
                path.display(),
                crate::atomic::write_hint(&e),
                taken.iter().collect::<std::collections::BTreeSet<_>>().len()
            ))
        })?;
    }
    // A key replaced twice within the import is written once, as its final winner.
    Ok(ProfilesReport::Bundle(BundleReport { action: "import", written: None, count: written.len(), profiles: outcomes }))
}

fn merge(paths: &[PathBuf], output: &Path) -> Result<ProfilesReport> {
    let mut set = Set::default();
    let mut outcomes = Vec::new();
    let (items, skipped) = read_bundles(paths)?;
    add_items(items, skipped, &mut set, &mut outcomes, &mut Vec::new());
    let inputs: Vec<(&str, &Path)> = paths.iter().map(|p| ("the bundle", p.as_path())).collect();
    write_bundle(&set, output, &inputs, "merge", outcomes)
}

/// Whether `path` is a bundle (zstd magic) rather than a profile (YAML text).
fn is_bundle(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    // Not opened unless a regular file: opening a FIFO would wait for a writer.
    crate::input::regular_file(path).is_ok()
        && std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
        && magic == [0x28, 0xb5, 0x2f, 0xfd]
}

/// The profiles of a bundle (those this build can read), or the one profile of a file.
fn profile_set(path: &Path) -> Result<Vec<Profile>> {
    if !is_bundle(path) {
        return Ok(vec![Profile::load(path)?]);
    }
    let (items, _) = bundle::read(path)?;
    items.into_iter().map(|i| Profile::from_str(&i.text, &i.origin).map_err(Error::from)).collect()
}

/// The comparison, and `Differences` on a regression (or with `--fail-on-change`
/// on any changed choice). Bundles are compared pair by pair (model, device class).
pub fn diff_profiles(args: &DiffArgs) -> Result<(DiffOut, ExitCode)> {
    let threshold = args.threshold;
    let r = if is_bundle(&args.a) || is_bundle(&args.b) {
        let (a, b) = (profile_set(&args.a)?, profile_set(&args.b)?);
        DiffOut::Sets(diff_sets(&args.a.display().to_string(), &a, &args.b.display().to_string(), &b, threshold)?)
    } else {
        DiffOut::One(diff(&Profile::load(&args.a)?, &Profile::load(&args.b)?, threshold)?)
    };
    let code = if r.regressed() || (args.fail_on_change && r.changed()) { ExitCode::Differences } else { ExitCode::Success };
    Ok((r, code))
}
