//! Profile bundles: tuned profiles that travel between machines, as CubeCL ships
//! pre-warmed autotune caches keyed by device. A bundle is a zstd-compressed tar
//! (`.tar.zst`) holding `ktune-bundle.json` (the manifest: format version, and per
//! profile its cache key, file, sha256, model, device and class, kernel set and
//! measured end-to-end time) and `profiles/<key>.yaml`.
//!
//! Reading never unpacks to disk: entries are read into memory by name (sizes
//! bounded), every profile is checked against the manifest's checksum, loaded
//! with this build's validation (schema, kernel ids and parameters) and its kernel
//! set compared with this build's; what fails is skipped with its reason.
//!
//! Two profiles under one key (the same device, model, options and kernel set)
//! are a conflict: the one with the shorter measured end-to-end time (prefill
//! plus decode of its own workload) wins; equal times, the smaller content hash,
//! so every machine resolves a merge the same way.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Profile, ProfileDoc};
use crate::device::DeviceClass;
use crate::kernels;

/// The manifest's name inside a bundle.
pub const MANIFEST: &str = "ktune-bundle.json";
const FORMAT: &str = "ktune-bundle";
const VERSION: u32 = 1;
/// Most bytes one bundle entry may hold once decompressed.
const MAX_ENTRY: u64 = 16 << 20;
/// Most bytes a whole bundle may hold once decompressed.
const MAX_TOTAL: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("bundle {path}: {message}")]
    Bad { path: PathBuf, message: String },
    #[error("bundle {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The bundle's table of contents.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub ktune_version: String,
    pub kernel_set: String,
    pub profiles: Vec<ManifestEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Cache key (64 hex digits): the file name in the cache.
    pub key: String,
    pub file: String,
    pub sha256: String,
    pub model: String,
    pub device_name: String,
    pub fingerprint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class: Option<DeviceClass>,
    pub kernel_set: String,
    /// Measured end-to-end seconds of the tuned combination (prefill + decode of the
    /// profile's workload); absent when the profile records none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_seconds: Option<f64>,
}

/// One profile of a bundle (or of the cache), with what conflicts are decided on.
#[derive(Clone, Debug)]
pub struct Item {
    pub key: String,
    pub text: String,
    pub doc: ProfileDoc,
    pub sha256: String,
    /// Where it came from, for messages.
    pub origin: String,
}

impl Item {
    /// A profile's text under `key`, validated as this build loads profiles;
    /// `Err` says why it cannot be taken.
    pub fn new(key: &str, text: String, origin: String) -> Result<Item, String> {
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("key `{key}` is not 64 hex digits"));
        }
        let p = Profile::from_str(&text, &origin).map_err(|e| e.to_string())?;
        let Some(t) = &p.doc.tuning else {
            return Err("no `tuning` section: not a tuned profile".into());
        };
        let ks = kernels::kernel_set_hash();
        if t.kernel_set != ks {
            return Err(format!(
                "tuned with another kernel set (ktune {}, {}…; this build {}…): re-tune it with this ktune",
                t.ktune_version,
                &t.kernel_set[..t.kernel_set.len().min(8)],
                &ks[..8]
            ));
        }
        Ok(Item { key: key.to_lowercase(), sha256: crate::hash::sha256_hex(&text), text, doc: p.doc, origin })
    }

    pub fn e2e_seconds(&self) -> Option<f64> {
        let s = super::lookup::e2e_seconds(&self.doc);
        s.is_finite().then_some(s)
    }

    /// Whether `self` beats `other` under the same key: the shorter measured
    /// end-to-end time, then the smaller content hash.
    pub fn beats(&self, other: &Item) -> bool {
        let (a, b) = (self.e2e_seconds().unwrap_or(f64::INFINITY), other.e2e_seconds().unwrap_or(f64::INFINITY));
        if a != b {
            return a < b;
        }
        self.sha256 < other.sha256
    }

    fn entry(&self) -> ManifestEntry {
        let t = self.doc.tuning.clone().unwrap_or_default();
        ManifestEntry {
            key: self.key.clone(),
            file: format!("profiles/{}.yaml", self.key),
            sha256: self.sha256.clone(),
            model: self.doc.model.clone(),
            device_name: t.device_name,
            fingerprint: t.fingerprint,
            device_class: t.device_class,
            kernel_set: t.kernel_set,
            e2e_seconds: self.e2e_seconds(),
        }
    }
}

/// What became of one profile in an import or merge.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub key: String,
    pub model: String,
    pub device: String,
    pub origin: String,
    /// `added`, `replaced` (it beat the one there), `kept` (the one there is
    /// better), `identical`, or `skipped`.
    pub action: String,
    /// Why, for `replaced`, `kept` and `skipped`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Profiles by key, conflicts resolved as they are added.
#[derive(Default)]
pub struct Set {
    pub items: BTreeMap<String, Item>,
}

fn fmt_s(s: Option<f64>) -> String {
    s.map(|s| format!("{s:.4} s")).unwrap_or_else(|| "no time".into())
}

impl Set {
    /// Adds `item`, resolving a conflict with the one under its key.
    pub fn add(&mut self, item: Item) -> Outcome {
        let t = item.doc.tuning.clone().unwrap_or_default();
        let mut out = Outcome {
            key: item.key.clone(),
            model: item.doc.model.clone(),
            device: t.device_name,
            origin: item.origin.clone(),
            action: "added".into(),
            reason: String::new(),
        };
        if let Some(old) = self.items.get(&item.key) {
            if old.sha256 == item.sha256 {
                out.action = "identical".into();
                return out;
            }
            let why = format!("end to end {} against {} ({})", fmt_s(item.e2e_seconds()), fmt_s(old.e2e_seconds()), old.origin);
            if !item.beats(old) {
                out.action = "kept".into();
                out.reason = format!("the one already there is better: {why}");
                return out;
            }
            out.action = "replaced".into();
            out.reason = format!("better: {why}");
        }
        self.items.insert(item.key.clone(), item);
        out
    }

    /// The bundle bytes (`.tar.zst`) of every profile, in key order.
    pub fn to_bundle(&self) -> std::io::Result<Vec<u8>> {
        let manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            ktune_version: env!("CARGO_PKG_VERSION").into(),
            kernel_set: kernels::kernel_set_hash(),
            profiles: self.items.values().map(Item::entry).collect(),
        };
        let json = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
        let mut tar = tar::Builder::new(Vec::new());
        let mut put = |name: &str, bytes: &[u8]| -> std::io::Result<()> {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(0);
            h.set_cksum();
            tar.append_data(&mut h, name, bytes)
        };
        put(MANIFEST, &json)?;
        for item in self.items.values() {
            put(&format!("profiles/{}.yaml", item.key), item.text.as_bytes())?;
        }
        let raw = tar.into_inner()?;
        zstd::encode_all(raw.as_slice(), 19)
    }
}

/// Reads a bundle: the profiles that validate, and an outcome `skipped` (with the
/// reason) for each that does not. A file that is not a bundle is an error.
pub fn read(path: &Path) -> Result<(Vec<Item>, Vec<Outcome>), BundleError> {
    let bad = |message: String| BundleError::Bad { path: path.to_path_buf(), message };
    let file = std::fs::File::open(path).map_err(|source| BundleError::Io { path: path.to_path_buf(), source })?;
    let dec =
        zstd::Decoder::new(file).map_err(|e| bad(format!("not a zstd stream ({e}); bundles are written by `ktune profiles export`")))?;
    let mut ar = tar::Archive::new(dec.take(MAX_TOTAL + 1));
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let damaged = |e: std::io::Error| {
        bad(format!("not a complete zstd-compressed tar: damaged or truncated ({e}); bundles are written by `ktune profiles export`"))
    };
    let entries = ar.entries().map_err(damaged)?;
    for e in entries {
        let mut e = e.map_err(damaged)?;
        let name = e.path().map_err(|e| bad(format!("entry name: {e}")))?.to_string_lossy().to_string();
        if e.size() > MAX_ENTRY {
            return Err(bad(format!("entry {name} holds {} bytes, more than the {} a profile may", e.size(), MAX_ENTRY)));
        }
        let mut bytes = Vec::with_capacity(e.size() as usize);
        e.read_to_end(&mut bytes).map_err(damaged)?;
        files.insert(name, bytes);
    }
    let manifest: Manifest = match files.get(MANIFEST) {
        Some(m) => serde_json::from_slice(m).map_err(|e| bad(format!("{MANIFEST}: {e}")))?,
        None => return Err(bad(format!("no {MANIFEST}: not a ktune bundle (write one with `ktune profiles export`)"))),
    };
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(bad(format!(
            "{MANIFEST} is format `{}` version {}; this ktune reads `{FORMAT}` version {VERSION}",
            manifest.format, manifest.version
        )));
    }
    let mut items = Vec::new();
    let mut skipped = Vec::new();
    for m in &manifest.profiles {
        let origin = format!("{}:{}", path.display(), m.file);
        let skip = |reason: String| Outcome {
            key: m.key.clone(),
            model: m.model.clone(),
            device: m.device_name.clone(),
            origin: origin.clone(),
            action: "skipped".into(),
            reason,
        };
        let Some(bytes) = files.get(&m.file) else {
            skipped.push(skip(format!("{} is listed but missing", m.file)));
            continue;
        };
        if crate::hash::sha256_hex(bytes) != m.sha256 {
            skipped.push(skip("checksum mismatch: the file is not what the manifest lists".into()));
            continue;
        }
        let Ok(text) = String::from_utf8(bytes.clone()) else {
            skipped.push(skip("not UTF-8 text".into()));
            continue;
        };
        match Item::new(&m.key, text, origin.clone()) {
            Ok(item) => items.push(item),
            Err(why) => skipped.push(skip(why)),
        }
    }
    Ok((items, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::doc::{EndToEnd, Throughput, Tuning};

    fn item(key: char, decode_tok_s: f64, name: &str) -> Item {
        let mut doc: ProfileDoc =
            serde_saphyr::from_str(&format!("name: {name}\nmodel: m\nversion: 1\ndevice:\n  backend: cpu\n")).expect("parses");
        doc.tuning = Some(Tuning {
            fingerprint: "f".repeat(64),
            device_name: "cpu".into(),
            kernel_set: kernels::kernel_set_hash(),
            end_to_end: EndToEnd {
                prefill_tokens: 8,
                decode_tokens: 16,
                tuned: Throughput { prefill_tok_s: 80.0, decode_tok_s, ..Default::default() },
                ..Default::default()
            },
            ..Default::default()
        });
        let text = super::super::to_yaml(&doc).expect("yaml");
        Item::new(&key.to_string().repeat(64), text, format!("{name}.yaml")).expect("valid")
    }

    #[test]
    fn conflicts_keep_the_faster_profile_whatever_the_order() {
        let (slow, fast) = (item('a', 10.0, "slow"), item('a', 20.0, "fast"));
        for order in [[slow.clone(), fast.clone()], [fast.clone(), slow.clone()]] {
            let mut set = Set::default();
            let actions: Vec<String> = order.into_iter().map(|i| set.add(i).action).collect();
            assert_eq!(set.items["a".repeat(64).as_str()].doc.name, "fast");
            assert!(actions == ["added", "replaced"] || actions == ["added", "kept"], "{actions:?}");
        }
        // Equal times: the smaller content hash, in either order.
        let (x, y) = (item('b', 10.0, "x"), item('b', 10.0, "y"));
        let want = if x.sha256 < y.sha256 { "x" } else { "y" };
        for order in [[x.clone(), y.clone()], [y, x]] {
            let mut set = Set::default();
            order.into_iter().for_each(|i| _ = set.add(i));
            assert_eq!(set.items["b".repeat(64).as_str()].doc.name, want);
        }
    }

    #[test]
    fn a_bundle_round_trips_and_checks_what_it_holds() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut set = Set::default();
        set.add(item('a', 10.0, "one"));
        set.add(item('c', 12.0, "two"));
        let path = dir.path().join("b.tar.zst");
        std::fs::write(&path, set.to_bundle().expect("bundle")).expect("write");
        let (items, skipped) = read(&path).expect("reads");
        assert!(skipped.is_empty());
        assert_eq!(items.iter().map(|i| i.doc.name.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        // Bad keys never become file names.
        assert!(Item::new("../../etc/passwd", items[0].text.clone(), "x".into()).is_err());
        // A profile of another kernel set is refused with the reason.
        let other = items[0].text.replace(&kernels::kernel_set_hash(), &"0".repeat(64));
        assert!(Item::new(&"d".repeat(64), other, "x".into()).expect_err("refused").contains("kernel set"));
    }
}
