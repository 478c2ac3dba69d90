//! Profile bundles: tuned profiles that travel between machines, as CubeCL ships
//! pre-warmed autotune caches keyed by device. A bundle is a zstd-compressed tar
//! (`.tar.zst`) holding `ktune-bundle.json` (the manifest: format version, and per
//! profile its cache key, file, sha256, model, device and class, kernel set and
//! measured end-to-end time) and `profiles/<key>.yaml`.
//!
//! Reading never unpacks to disk: the bundle is decompressed once, as a stream,
//! and its entries are read into memory by name, everything bounded by what a
//! bundle `profiles export` writes could hold: the decompressed total, each
//! entry's size, a name's length (GNU long names included), the number of
//! entries and of manifest profiles; a name twice (in the tar or the manifest)
//! is refused, and the limit hit is named. Every profile is checked against the
//! manifest's checksum and loaded with this build's validation (schema, kernel
//! ids and parameters); what fails is skipped with its reason (names and reasons
//! from the bundle shortened, so a hostile one cannot print megabytes). One
//! tuned with another kernel set whose choices all still validate is taken,
//! marked stale (it loses any conflict to a current one, and `run` warns when it
//! uses it).
//!
//! The profiles shipped in the repository's `profiles/` are built into the binary
//! ([`shipped`]), a bundle `profiles import --shipped` reads.
//!
//! Two profiles under one key (the same device, model, options and kernel set)
//! are a conflict: the one with the shorter measured end-to-end time (prefill
//! plus decode of its own workload) wins; equal times, the smaller content hash,
//! so every machine resolves a merge the same way.

use std::collections::{BTreeMap, BTreeSet};
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
/// Most bytes one bundle entry may hold once decompressed: a profile's limit.
const MAX_ENTRY: u64 = super::MAX_PROFILE_BYTES;
/// Most bytes a whole bundle may hold once decompressed.
const MAX_TOTAL: u64 = 256 << 20;
/// Most profiles one manifest may list.
pub const MAX_PROFILES: usize = 4096;
/// Most entries one bundle's tar may hold (each profile and the manifest, and
/// room for directories a repacking tool adds).
const MAX_ENTRIES: usize = 2 * MAX_PROFILES + 16;
/// Longest entry name, in bytes (a GNU long name, or a pax header, included).
const MAX_NAME: u64 = 4096;
/// Most characters of a name or key from a bundle an outcome repeats.
const SHOWN: usize = 200;
/// Most characters of a reason (a validation error may list the valid kernels).
const REASON_SHOWN: usize = 2000;

/// `s` from a bundle, shortened for outcomes and messages.
fn shown(s: &str) -> String {
    crate::text::shorten(s, SHOWN).into_owned()
}

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
    /// Tuned with another kernel set than this build's (its choices all still
    /// validate; one that does not is refused).
    pub stale: bool,
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
        let stale = t.kernel_set != kernels::kernel_set_hash();
        Ok(Item { key: key.to_lowercase(), sha256: crate::hash::sha256_hex(&text), text, doc: p.doc, origin, stale })
    }

    /// Why a stale profile is taken anyway, for the outcome.
    fn stale_note(&self) -> String {
        let t = self.doc.tuning.clone().unwrap_or_default();
        format!(
            "tuned with another kernel set (ktune {}, {}…; this build {}…): every choice still validates, `run` uses it with a warning; re-tune for this build",
            shown(&t.ktune_version),
            crate::text::prefix(&t.kernel_set, 8),
            crate::text::prefix(&kernels::kernel_set_hash(), 8)
        )
    }

    pub fn e2e_seconds(&self) -> Option<f64> {
        let s = super::lookup::e2e_seconds(&self.doc);
        s.is_finite().then_some(s)
    }

    /// Whether `self` beats `other` under the same key: one of this build's kernel
    /// set over a stale one, then the shorter measured end-to-end time, then the
    /// smaller content hash.
    pub fn beats(&self, other: &Item) -> bool {
        if self.stale != other.stale {
            return !self.stale;
        }
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
            model: shown(&item.doc.model),
            device: shown(&t.device_name),
            origin: item.origin.clone(),
            action: "added".into(),
            reason: String::new(),
        };
        if item.stale {
            out.reason = item.stale_note();
        }
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
            let stale = std::mem::take(&mut out.reason);
            out.reason = if stale.is_empty() { format!("better: {why}") } else { format!("better: {why}; {stale}") };
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
        // ruzstd compresses at its one implemented level (about zstd's level 1):
        // a profile bundle is a few kB of YAML.
        Ok(ruzstd::encoding::compress_to_vec(raw.as_slice(), ruzstd::encoding::CompressionLevel::Fastest))
    }
}

/// The profiles of the repository's `profiles/`, built in (file name, text).
const SHIPPED: &[(&str, &str)] = &[
    ("gemma3-1b-cpu-epyc-2core.yaml", include_str!("../../profiles/gemma3-1b-cpu-epyc-2core.yaml")),
    ("gemma3-4b-cpu-epyc-2core.yaml", include_str!("../../profiles/gemma3-4b-cpu-epyc-2core.yaml")),
    ("llama-3.2-1b-cpu-epyc-2core.yaml", include_str!("../../profiles/llama-3.2-1b-cpu-epyc-2core.yaml")),
    ("llama-3.2-3b-cpu-epyc-2core.yaml", include_str!("../../profiles/llama-3.2-3b-cpu-epyc-2core.yaml")),
];

/// The shipped profiles as bundle items (keyed by the sha256 of their text), and
/// a `skipped` outcome for any this build cannot load.
pub fn shipped() -> (Vec<Item>, Vec<Outcome>) {
    let mut items = Vec::new();
    let mut skipped = Vec::new();
    for (name, text) in SHIPPED {
        let origin = format!("shipped:profiles/{name}");
        match Item::new(&crate::hash::sha256_hex(text), text.to_string(), origin.clone()) {
            Ok(i) => items.push(i),
            Err(reason) => skipped.push(Outcome {
                key: crate::hash::sha256_hex(text),
                model: String::new(),
                device: String::new(),
                origin,
                action: "skipped".into(),
                reason,
            }),
        }
    }
    (items, skipped)
}

/// A reader that fails once more than `left` bytes have come through it, and
/// remembers that it did (the error a tar reader returns may not say why).
struct Capped<R> {
    inner: R,
    left: u64,
    hit: bool,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.hit = true;
            return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, "past the decompressed size limit"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A bundle's plain files by name, and the entries that are not plain files
/// (links, directories, devices) with what they are.
type Entries = (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>);

/// Reads the entries of a bundle's tar stream (see the module docs for the
/// limits); `Err` says what is wrong.
fn entries(ar: &mut tar::Archive<impl Read>) -> Result<Entries, String> {
    let damaged = |e: std::io::Error| format!("not a complete zstd-compressed tar: damaged or truncated ({e})");
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut others: BTreeMap<String, String> = BTreeMap::new();
    let mut long_name: Option<String> = None;
    // Raw: GNU long names and pax headers come as entries, read here within bounds.
    for (i, e) in ar.entries().map_err(damaged)?.raw(true).enumerate() {
        if i >= MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} entries, more than a bundle of {MAX_PROFILES} profiles holds"));
        }
        let mut e = e.map_err(damaged)?;
        let ty = e.header().entry_type();
        let size = e.size();
        let header = ty.is_gnu_longname() || ty.is_gnu_longlink() || ty.is_pax_local_extensions() || ty.is_pax_global_extensions();
        if header {
            if size > MAX_NAME {
                return Err(format!("an extended name header of {size} bytes, more than the {MAX_NAME} a bundle entry's name may take"));
            }
            let mut bytes = Vec::with_capacity(size as usize);
            e.read_to_end(&mut bytes).map_err(damaged)?;
            if ty.is_gnu_longname() {
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                long_name = Some(String::from_utf8_lossy(&bytes[..end]).into_owned());
            }
            continue;
        }
        let name = long_name.take().unwrap_or_else(|| String::from_utf8_lossy(&e.path_bytes()).into_owned());
        if files.contains_key(&name) || others.contains_key(&name) {
            return Err(format!("entry {} appears twice: a bundle holds each file once", shown(&name)));
        }
        if !ty.is_file() {
            let what = if ty.is_symlink() || ty.is_hard_link() {
                "a link"
            } else if ty.is_dir() {
                "a directory"
            } else {
                "a special file"
            };
            others.insert(name, format!("{what}, not a plain file"));
            continue;
        }
        if size > MAX_ENTRY {
            return Err(format!("entry {} holds {size} bytes, more than the {MAX_ENTRY} a profile may", shown(&name)));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        e.read_to_end(&mut bytes).map_err(damaged)?;
        files.insert(name, bytes);
    }
    Ok((files, others))
}

/// Reads a bundle: the profiles that validate, and an outcome `skipped` (with the
/// reason) for each that does not. A file that is not a bundle, or one past a
/// limit, is an error.
pub fn read(path: &Path) -> Result<(Vec<Item>, Vec<Outcome>), BundleError> {
    let io = |source: std::io::Error| BundleError::Io { path: path.to_path_buf(), source };
    crate::input::regular_file(path).map_err(io)?;
    let file = std::fs::File::open(path).map_err(io)?;
    read_from(path, std::io::BufReader::new(file))
}

/// [`read`] of a bundle's bytes from `source` (a file, or an image in memory when
/// fuzzing); `path` only names it in outcomes and messages.
pub fn read_from(path: &Path, source: impl Read) -> Result<(Vec<Item>, Vec<Outcome>), BundleError> {
    let bad = |message: String| BundleError::Bad { path: path.to_path_buf(), message };
    let written_by = "bundles are written by `ktune profiles export`";
    let dec = ruzstd::decoding::StreamingDecoder::new(source).map_err(|e| bad(format!("not a zstd stream ({e}); {written_by}")))?;
    let mut ar = tar::Archive::new(Capped { inner: dec, left: MAX_TOTAL, hit: false });
    let read = entries(&mut ar);
    if ar.into_inner().hit {
        return Err(bad(format!(
            "decompresses to more than {} MiB, the most a bundle may hold; {written_by} (a few kB per profile)",
            MAX_TOTAL >> 20
        )));
    }
    let (files, others) = read.map_err(|e| bad(format!("{e}; {written_by}")))?;
    let manifest: Manifest = match files.get(MANIFEST) {
        Some(m) => serde_json::from_slice(m).map_err(|e| bad(format!("{MANIFEST}: {e}")))?,
        None => return Err(bad(format!("no {MANIFEST}: not a ktune bundle (write one with `ktune profiles export`)"))),
    };
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(bad(format!(
            "{MANIFEST} is format `{}` version {}; this ktune reads `{FORMAT}` version {VERSION}",
            shown(&manifest.format),
            manifest.version
        )));
    }
    if manifest.profiles.len() > MAX_PROFILES {
        return Err(bad(format!("{MANIFEST} lists {} profiles, more than the {MAX_PROFILES} a bundle may hold", manifest.profiles.len())));
    }
    let (mut keys, mut names) = (BTreeSet::new(), BTreeSet::new());
    for m in &manifest.profiles {
        if !keys.insert(m.key.as_str()) || !names.insert(m.file.as_str()) {
            return Err(bad(format!(
                "{MANIFEST} lists key {} or file {} twice: a bundle holds each profile once",
                shown(&m.key),
                shown(&m.file)
            )));
        }
    }
    let mut items = Vec::new();
    let mut skipped = Vec::new();
    for m in &manifest.profiles {
        let origin = format!("{}:{}", path.display(), shown(&m.file));
        let skip = |reason: String| Outcome {
            key: shown(&m.key),
            model: shown(&m.model),
            device: shown(&m.device_name),
            origin: origin.clone(),
            action: "skipped".into(),
            reason: crate::text::shorten(&reason, REASON_SHOWN).into_owned(),
        };
        let Some(bytes) = files.get(&m.file) else {
            let why = match others.get(&m.file) {
                Some(what) => format!("{} is {what}", shown(&m.file)),
                None => format!("{} is listed but missing", shown(&m.file)),
            };
            skipped.push(skip(why));
            continue;
        };
        if crate::hash::sha256_hex(bytes) != m.sha256 {
            skipped.push(skip("checksum mismatch: the file is not what the manifest lists".into()));
            continue;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            skipped.push(skip("not UTF-8 text".into()));
            continue;
        };
        match Item::new(&m.key, text.to_string(), origin.clone()) {
            Ok(item) => items.push(item),
            Err(why) => skipped.push(skip(why)),
        }
    }
    Ok((items, skipped))
}

/// Why nothing could be taken from bundles: each skipped profile with its reason
/// (the first few, then how many more), for the error that ends an import or a
/// merge that found none to use.
pub fn nothing_usable(skipped: &[Outcome]) -> String {
    const LISTED: usize = 8;
    if skipped.is_empty() {
        return "the bundles list no profile".into();
    }
    let mut lines: Vec<String> = skipped.iter().take(LISTED).map(|o| format!("{}: {}", o.origin, o.reason)).collect();
    if skipped.len() > LISTED {
        lines.push(format!("and {} more", skipped.len() - LISTED));
    }
    format!("every profile of the bundles was skipped: {}", lines.join("; "))
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
    fn every_file_of_profiles_is_built_in_and_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("profiles/")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        on_disk.sort();
        let built_in: Vec<String> = SHIPPED.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(built_in, on_disk, "add new files of profiles/ to SHIPPED");
        let (items, skipped) = shipped();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(items.len(), SHIPPED.len());
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
        // A profile of another kernel set is taken, marked stale, and loses to a
        // current one under the same key whatever their times.
        let other = items[0].text.replace(&kernels::kernel_set_hash(), &"0".repeat(64));
        let stale = Item::new(&items[0].key, other, "old.yaml".into()).expect("still validates");
        assert!(stale.stale && !items[0].stale);
        let mut set = Set::default();
        assert!(set.add(stale.clone()).reason.contains("another kernel set"));
        assert_eq!(set.add(items[0].clone()).action, "replaced");
        assert_eq!(set.add(stale).action, "kept");
        // A profile that does not load is refused with the reason.
        let broken = items[0].text.replace("version: 1", "version: 3");
        assert!(Item::new(&"d".repeat(64), broken, "x".into()).expect_err("refused").contains("version"));
    }
}
