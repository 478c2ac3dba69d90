//! Profiles: load and validate the profile YAML (every error with its line and
//! column), resolve it into the plan's kernel selection and execution options for
//! one device, write it back, build one from a tune's results ([`build`]: plain
//! data the tuner hands over), keep them in the cache ([`cache`]), find the one a
//! run uses ([`lookup`]), and compare two of them ([`diff`]).

pub mod build;
pub mod bundle;
pub mod cache;
pub mod diff;
pub mod doc;
pub mod lookup;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use doc::{At, Entry, ExecutionDoc, KernelsDoc, ProfileDoc, VariantDoc};

use crate::device::Device;
use crate::kernels::{self, Backend, KernelDef, Op};
use crate::plan::select::{Choice, DeviceCaps, LayerOverride, SLOTS, SlotChoices, SlotKey};
use crate::plan::{Fusion, Parallel, Regime, Selection, Slot};

/// The format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Longest spin a profile may ask of idle CPU workers (`execution.cpuSpinUs`), µs.
const MAX_SPIN_US: u32 = 1_000_000;

/// Most bytes a profile file may hold (a tuned profile is a few kB).
pub const MAX_PROFILE_BYTES: u64 = 16 << 20;

/// The text of the profile file `path`: a regular file of at most
/// [`MAX_PROFILE_BYTES`] (a directory or a device is refused saying which).
pub fn read_text(path: &Path) -> Result<String, ProfileError> {
    crate::input::read_text_limited(path, MAX_PROFILE_BYTES, "a profile")
        .map_err(|source| ProfileError::Read { path: path.to_path_buf(), source })
}

/// Parallel groups a profile may declare, with their members (as spelled in the YAML).
pub const PARALLEL_GROUPS: [(&str, &[&str]); 2] = [
    ("qkv_projections", &["matmul:q_proj", "matmul:k_proj", "matmul:v_proj"]),
    ("ffn_projections", &["matmul:gate_proj", "matmul:up_proj"]),
];

/// Ops a barrier's `before` may name.
const BARRIER_TARGETS: &[&str] =
    &["attention", "activation", "silu", "gelu", "o_proj", "down_proj", "rope", "norm", "qk_norm_rope", "residual"];

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read profile {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    At { path: String, line: u64, column: u64, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("profile {path} cannot run on {device}: {message}")]
    Device { path: String, device: String, message: String },
    #[error("{message}")]
    NotThisDevice { message: String },
    #[error("cannot write profile {path}: {source}{}", crate::atomic::write_hint(.source))]
    Write { path: PathBuf, source: std::io::Error },
    #[error("serializing the profile failed: {0}")]
    Serialize(String),
}

/// A loaded, validated profile.
#[derive(Clone, Debug)]
pub struct Profile {
    pub doc: ProfileDoc,
    /// Where it came from (for messages).
    pub origin: String,
}

pub use crate::kernels::quant::REPACKABLE;

/// The runtime switches a profile sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecSettings {
    pub batch: bool,
    pub fusion: Fusion,
    pub parallel: Parallel,
    pub kv_dtype: kernels::DType,
    pub weight_dtype: kernels::DType,
    /// CPU: threads the kernels' pool runs on (0: all of them).
    pub threads: usize,
    /// CPU: how long idle pool workers spin before parking, µs (0: the pool's
    /// default).
    pub spin_us: u32,
    /// CPU: the int8 decode dots' prefetch distance, bytes (None: the
    /// runtime's default, `kernels::cpu::DEFAULT_PREFETCH`; 0: none).
    pub prefetch: Option<u32>,
    /// CPU: the block formats repacked at load ([`PlanOptions::cpu_repack`](crate::plan::PlanOptions::cpu_repack)).
    pub repack: Vec<crate::kernels::quant::QFormat>,
    /// CPU: the block formats an engine of several sequences (`serve
    /// --parallel`) repacks at load instead (the profile's `serve.cpuRepack`;
    /// None: the runtime's default for such an engine).
    pub batch_repack: Option<Vec<crate::kernels::quant::QFormat>>,
    /// GPU: shader modules without runtime bounds checks (`--trusted-shaders`).
    pub trusted_shaders: bool,
    /// GPU: decode steps chained per submit (`execution.decodeChain`; None:
    /// [`doc::DEFAULT_DECODE_CHAIN`]).
    pub decode_chain: Option<u32>,
}

impl ExecSettings {
    pub fn to_doc(&self) -> (ExecutionDoc, BTreeMap<String, At<Vec<String>>>) {
        let e = ExecutionDoc {
            batch_commands: self.batch,
            kv_cache_dtype: doc::StorageDtype::from_dtype(self.kv_dtype),
            weight_dtype: doc::StorageDtype::from_dtype(self.weight_dtype),
            fused_gate_up: self.fusion.gate_up,
            fused_qkv: self.fusion.qkv,
            fused_qk_norm_rope: self.fusion.qk_norm_rope,
            fused_residual_norm: self.fusion.residual_norm,
            fused_norm_matmul: self.fusion.norm_matmul,
            fused_qkv_rope_cache: self.fusion.qkv_rope_cache,
            cpu_threads: self.threads as u32,
            cpu_spin_us: self.spin_us,
            cpu_prefetch_bytes: self.prefetch,
            cpu_repack: self.repack.iter().map(|f| f.name().to_string()).collect(),
            trusted_shaders: self.trusted_shaders,
            decode_chain: self.decode_chain,
        };
        let mut par = BTreeMap::new();
        for (name, members) in PARALLEL_GROUPS {
            let on = if name == "qkv_projections" { self.parallel.qkv } else { self.parallel.ffn };
            if on {
                par.insert(name.to_string(), At::new(members.iter().map(|m| m.to_string()).collect()));
            }
        }
        (e, par)
    }
}

impl ExecutionDoc {
    /// The fusion choices the section turns on.
    pub fn fusion(&self) -> Fusion {
        Fusion {
            qkv: self.fused_qkv,
            gate_up: self.fused_gate_up,
            qk_norm_rope: self.fused_qk_norm_rope,
            residual_norm: self.fused_residual_norm,
            norm_matmul: self.fused_norm_matmul,
            qkv_rope_cache: self.fused_qkv_rope_cache,
        }
    }
}

fn at_err<T>(origin: &str, a: &At<T>, message: String) -> ProfileError {
    if a.line == 0 {
        ProfileError::Invalid { path: origin.to_string(), message }
    } else {
        ProfileError::At { path: origin.to_string(), line: a.line, column: a.column, message }
    }
}

/// The entry every projection takes unless a specific `matmul.*` entry overrides it.
const MATMUL_DEFAULT: &str = "matmul.default";

/// The profile's kernel entries by YAML path with the slots each stands for,
/// from the slot table ([`SLOTS`]): `attention` both attention slots, one per
/// regime; [`MATMUL_DEFAULT`] every projection, before the specific `matmul.*`
/// entries so they override it.
fn entry_paths() -> Vec<(&'static str, Vec<Slot>)> {
    let matmul = |path: &str| path.starts_with("matmul.");
    let mut v: Vec<(&'static str, Vec<Slot>)> = Vec::new();
    for d in SLOTS {
        let Some(path) = d.entry else { continue };
        if matmul(path) && !v.iter().any(|(p, _)| *p == MATMUL_DEFAULT) {
            v.push((MATMUL_DEFAULT, SLOTS.iter().filter(|s| s.entry.is_some_and(matmul)).map(|s| s.slot).collect()));
        }
        match v.iter_mut().find(|(p, _)| *p == path) {
            Some((_, slots)) => slots.push(d.slot),
            None => v.push((path, vec![d.slot])),
        }
    }
    v
}

/// The entries `k` gives, by path, with the slots each stands for.
fn entries(k: &KernelsDoc) -> Vec<(&'static str, At<Entry>, Vec<Slot>)> {
    let mut k = k.clone();
    entry_paths().into_iter().filter_map(|(path, slots)| Some((path, k.entry_mut(path, false)?.take()?, slots))).collect()
}

/// Kernels that may serve `slots` (any regime), for error messages.
fn valid_for(slots: &[Slot], backend: Option<Backend>) -> String {
    let mut ops: Vec<Op> = Vec::new();
    for s in slots {
        for &r in s.regimes() {
            if let Some(op) = s.op(r)
                && !ops.contains(&op)
            {
                ops.push(op);
            }
        }
    }
    let ids: Vec<&str> =
        kernels::registry().iter().filter(|k| ops.contains(&k.op) && backend.is_none_or(|b| k.backend() == b)).map(|k| k.id).collect();
    ids.join(", ")
}

/// Resolves one variant for `slots`: the kernel exists, computes the slot's op in
/// `regime` (or in any regime when `None`), parameters are known and in range.
/// Returns the keys it serves.
fn resolve_variant(
    origin: &str,
    path: &str,
    at: &At<Entry>,
    v: &VariantDoc,
    slots: &[Slot],
    regime: Option<Regime>,
    backend: Option<Backend>,
) -> Result<Vec<(SlotKey, Choice)>, ProfileError> {
    let k: &'static KernelDef = kernels::find(&v.kernel).map_err(|_| {
        at_err(origin, at, format!("`{path}`: unknown kernel `{}`; valid kernels for this slot: {}", v.kernel, valid_for(slots, backend)))
    })?;
    if let Some(b) = backend
        && k.backend() != b
    {
        return Err(at_err(
            origin,
            at,
            format!(
                "`{path}`: `{}` is a {} kernel but the profile is for `{}`; valid kernels for this slot: {}",
                k.id,
                k.backend().name(),
                b.name(),
                valid_for(slots, backend)
            ),
        ));
    }
    let mut params = k.default_params();
    for (name, val) in &v.params {
        params.insert(name.clone(), *val);
    }
    k.check_params(&params).map_err(|why| at_err(origin, at, format!("`{path}`: `{}`: {why}", k.id)))?;
    // A vision entry has one variant: its slots' one regime.
    if regime.is_some() && slots.iter().any(|s| s.is_vision()) {
        return Err(at_err(origin, at, format!("`{path}`: a vision slot has no prefill or decode entries; give one kernel")));
    }
    let regimes: Vec<Regime> =
        regime.map(|r| vec![r]).unwrap_or_else(|| slots.first().map_or(vec![Regime::Prefill, Regime::Decode], |s| s.regimes().to_vec()));
    let mut out = Vec::new();
    for s in slots {
        for r in &regimes {
            let fits = if regime.is_some() { s.accepts(*r, k.op) } else { s.op(*r) == Some(k.op) };
            if fits {
                out.push(((*s, *r), Choice::new(k, params.clone())));
            }
        }
    }
    if out.is_empty() {
        let want: Vec<String> =
            regimes.iter().filter_map(|r| slots.first().and_then(|s| s.op(*r)).map(|op| format!("{op} ({})", r.name()))).collect();
        return Err(at_err(
            origin,
            at,
            format!(
                "`{path}`: `{}` computes {} but this slot takes {}; valid kernels for this slot: {}",
                k.id,
                k.op,
                want.join(" or "),
                valid_for(slots, backend)
            ),
        ));
    }
    Ok(out)
}

fn resolve_kernels(origin: &str, k: &KernelsDoc, backend: Option<Backend>) -> Result<BTreeMap<SlotKey, Choice>, ProfileError> {
    let mut map = BTreeMap::new();
    for (path, at, slots) in entries(k) {
        let at = &at;
        let chosen = match &at.value {
            Entry::One(v) => resolve_variant(origin, path, at, v, &slots, None, backend)?,
            Entry::PerRegime { prefill, decode } => {
                let mut c = Vec::new();
                if let Some(v) = prefill {
                    c.extend(resolve_variant(origin, path, at, v, &slots, Some(Regime::Prefill), backend)?);
                }
                if let Some(v) = decode {
                    c.extend(resolve_variant(origin, path, at, v, &slots, Some(Regime::Decode), backend)?);
                }
                c
            }
        };
        for (key, choice) in chosen {
            map.insert(key, choice);
        }
    }
    Ok(map)
}

/// A profile's list of repacked formats (`execution.cpuRepack`,
/// `serve.cpuRepack`, named `field`) holds only formats with a repacked layout.
fn check_repack(o: &str, field: &str, formats: &[String]) -> Result<(), ProfileError> {
    match formats.iter().find(|f| !REPACKABLE.iter().any(|r| r.name() == f.as_str())) {
        None => Ok(()),
        Some(f) => {
            let allowed: Vec<_> = REPACKABLE.iter().map(|r| r.name()).collect();
            Err(ProfileError::Invalid {
                path: o.into(),
                message: format!("{field} lists `{f}`, which has no repacked layout: list only {} or remove the field", allowed.join(", ")),
            })
        }
    }
}

/// The formats of a checked repack list ([`check_repack`]).
fn repack_formats(formats: &[String]) -> Vec<crate::kernels::quant::QFormat> {
    formats.iter().filter_map(|f| f.parse().ok()).collect()
}

/// The choices of `serve.batches`, by the least batch size each serves: each key
/// a batch size in [`doc::BATCH_SIZES`], each value resolved as `kernels`.
fn resolve_batches(origin: &str, serve: &doc::ServeDoc, backend: Option<Backend>) -> Result<BTreeMap<usize, SlotChoices>, ProfileError> {
    let mut out = BTreeMap::new();
    for (key, k) in &serve.batches {
        let Some(rows) = key.trim().parse::<usize>().ok().filter(|r| doc::BATCH_SIZES.contains(r)) else {
            return Err(at_err(
                origin,
                k,
                format!(
                    "`serve.batches`: `{key}` is not a batch size; key each entry by the least number of sequences ({} to {}) it serves",
                    doc::BATCH_SIZES.start(),
                    doc::BATCH_SIZES.end()
                ),
            ));
        };
        let choices =
            SlotChoices { slots: resolve_kernels(origin, &k.value, backend)?, formats: resolve_formats(origin, &k.value, backend)? };
        if out.insert(rows, choices).is_some() {
            return Err(at_err(origin, k, format!("`serve.batches`: batch size {rows} is given twice (`{key}`); keep one")));
        }
    }
    Ok(out)
}

/// Removes the entries of `k` that do not resolve (an unknown kernel, a parameter
/// value this build does not have), saying which under `prefix` in `dropped`.
fn prune_kernels(origin: &str, prefix: &str, k: &mut KernelsDoc, backend: Option<Backend>, dropped: &mut Vec<String>) {
    for (path, slots) in entry_paths() {
        let Some(entry) = k.entry_mut(path, false) else { continue };
        let Some(at) = entry.as_ref() else { continue };
        let one = match &at.value {
            Entry::One(v) => resolve_variant(origin, path, at, v, &slots, None, backend).map(|_| ()),
            Entry::PerRegime { prefill, decode } => prefill
                .iter()
                .map(|v| (v, Regime::Prefill))
                .chain(decode.iter().map(|v| (v, Regime::Decode)))
                .try_for_each(|(v, r)| resolve_variant(origin, path, at, v, &slots, Some(r), backend).map(|_| ())),
        };
        if one.is_err() {
            dropped.push(format!("{prefix}{path}"));
            *entry = None;
        }
    }
    let names: Vec<String> = k.formats.keys().cloned().collect();
    for name in names {
        let known = name.parse::<kernels::DType>().ok().is_some_and(|d| d.is_quant() || d == kernels::DType::F16);
        match k.formats.get_mut(&name) {
            Some(sub) if known && sub.formats.is_empty() => {
                prune_kernels(origin, &format!("{prefix}formats.{name}."), sub, backend, dropped)
            }
            _ => {
                dropped.push(format!("{prefix}formats.{name}"));
                k.formats.remove(&name);
            }
        }
    }
}

/// Parses `a-b` or `a` into an inclusive range.
fn layer_range(s: &str) -> Option<(usize, usize)> {
    let s = s.trim();
    match s.split_once('-') {
        Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
        None => s.parse().ok().map(|a| (a, a)),
    }
}

impl Profile {
    /// Parses and validates everything that does not depend on a device or model.
    pub fn from_str(text: &str, origin: &str) -> Result<Profile, ProfileError> {
        let doc: ProfileDoc = serde_saphyr::from_str(text).map_err(|e| parse_error(origin, &e))?;
        let p = Profile { doc, origin: origin.to_string() };
        p.validate()?;
        Ok(p)
    }

    /// [`Profile::from_str`] for a profile written by another build of ktune (a
    /// cached one whose kernel set changed): kernel entries this build does not
    /// know (an id, a parameter value) are dropped, so their slots take the
    /// runtime's choice, and named in the returned list; anything else invalid
    /// is still an error.
    pub fn from_str_salvaged(text: &str, origin: &str) -> Result<(Profile, Vec<String>), ProfileError> {
        let doc: ProfileDoc = serde_saphyr::from_str(text).map_err(|e| parse_error(origin, &e))?;
        let mut p = Profile { doc, origin: origin.to_string() };
        if p.validate().is_ok() {
            return Ok((p, Vec::new()));
        }
        let backend = p.backend()?;
        let mut dropped = Vec::new();
        prune_kernels(origin, "kernels.", &mut p.doc.kernels, backend, &mut dropped);
        for (key, layer) in p.doc.layers.iter_mut() {
            prune_kernels(origin, &format!("layers.{key}."), &mut layer.value, backend, &mut dropped);
        }
        for (key, batch) in p.doc.serve.batches.iter_mut() {
            prune_kernels(origin, &format!("serve.batches.{key}."), &mut batch.value, backend, &mut dropped);
        }
        p.validate()?;
        Ok((p, dropped))
    }

    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        Profile::from_str(&read_text(path)?, &path.display().to_string())
    }

    fn backend(&self) -> Result<Option<Backend>, ProfileError> {
        match &self.doc.device.backend {
            None => Ok(None),
            Some(a) => match a.value.as_str() {
                "cpu" => Ok(Some(Backend::Cpu)),
                "wgsl" => Ok(Some(Backend::Wgsl)),
                other => Err(at_err(&self.origin, a, format!("device.backend `{other}` is not `cpu` or `wgsl`"))),
            },
        }
    }

    fn validate(&self) -> Result<(), ProfileError> {
        let d = &self.doc;
        let o = self.origin.as_str();
        if d.version.value != FORMAT_VERSION {
            return Err(at_err(
                o,
                &d.version,
                format!("version {} is not supported (this build reads version {FORMAT_VERSION})", d.version.value),
            ));
        }
        let backend = self.backend()?;
        resolve_kernels(o, &d.kernels, backend)?;
        resolve_formats(o, &d.kernels, backend)?;
        resolve_batches(o, &d.serve, backend)?;
        if let Some(m) = d.serve.min_batch
            && !(2..=*doc::BATCH_SIZES.end() + 1).contains(&m)
        {
            return Err(ProfileError::Invalid {
                path: o.into(),
                message: format!(
                    "serve.minBatch is {m}: give the fewest sequences decoded in one pass, 2 to {} (or remove it)",
                    *doc::BATCH_SIZES.end() + 1
                ),
            });
        }
        for (name, members) in &d.parallel {
            let Some((_, want)) = PARALLEL_GROUPS.iter().find(|(n, _)| n == name) else {
                let known: Vec<&str> = PARALLEL_GROUPS.iter().map(|(n, _)| *n).collect();
                return Err(at_err(o, members, format!("unknown parallel group `{name}` (known: {})", known.join(", "))));
            };
            let mut got: Vec<&str> = members.value.iter().map(String::as_str).collect();
            got.sort_unstable();
            let mut w: Vec<&str> = want.to_vec();
            w.sort_unstable();
            if got != w {
                return Err(at_err(o, members, format!("parallel group `{name}` must list exactly {}", want.join(", "))));
            }
        }
        check_repack(o, "execution.cpuRepack", &d.execution.cpu_repack)?;
        if let Some(r) = &d.serve.cpu_repack {
            check_repack(o, "serve.cpuRepack", r)?;
        }
        if let Some(k) = d.execution.decode_chain
            && !(1..=doc::MAX_CHAIN as u32).contains(&k)
        {
            return Err(ProfileError::Invalid {
                path: o.into(),
                message: format!(
                    "execution.decodeChain {k}: give 1 to {} decode steps per submit, or remove the field for the default ({})",
                    doc::MAX_CHAIN,
                    doc::DEFAULT_DECODE_CHAIN
                ),
            });
        }
        if let Some(b) = d.execution.cpu_prefetch_bytes
            && b > crate::kernels::cpu::MAX_PREFETCH
        {
            return Err(ProfileError::Invalid {
                path: o.into(),
                message: format!(
                    "execution.cpuPrefetchBytes {b} is past the largest prefetch distance, {}: give a value up to that (0 for none) or remove the field for the default",
                    crate::kernels::cpu::MAX_PREFETCH
                ),
            });
        }
        let pool_max = crate::kernels::cpu::pool::MAX_THREADS;
        if d.execution.cpu_threads as usize > pool_max {
            return Err(ProfileError::Invalid {
                path: o.into(),
                message: format!(
                    "execution.cpuThreads {} is more than the CPU pool runs ({pool_max}): give at most that, or 0 for every core",
                    d.execution.cpu_threads
                ),
            });
        }
        if d.execution.cpu_spin_us > MAX_SPIN_US {
            return Err(ProfileError::Invalid {
                path: o.into(),
                message: format!(
                    "execution.cpuSpinUs {} is past {MAX_SPIN_US} (one second of spinning before an idle worker parks): give at most that, or 0 for the default",
                    d.execution.cpu_spin_us
                ),
            });
        }
        if d.scheduling.max_parallel_kernels == 0 {
            return Err(ProfileError::Invalid { path: o.into(), message: "scheduling.maxParallelKernels must be at least 1".into() });
        }
        for b in &d.scheduling.barriers {
            if !d.parallel.contains_key(&b.value.after) {
                return Err(at_err(
                    o,
                    b,
                    format!(
                        "barrier `after: {}` names no parallel group of this profile (declared: {:?})",
                        b.value.after,
                        d.parallel.keys()
                    ),
                ));
            }
            if !BARRIER_TARGETS.contains(&b.value.before.as_str()) {
                return Err(at_err(
                    o,
                    b,
                    format!("barrier `before: {}` is not an op (allowed: {})", b.value.before, BARRIER_TARGETS.join(", ")),
                ));
            }
        }
        let mut ranges: Vec<(usize, usize, &str)> = Vec::new();
        for (key, k) in &d.layers {
            let Some((a, b)) = layer_range(key) else {
                return Err(at_err(o, k, format!("layer range `{key}` is not `N` or `N-M`")));
            };
            if a > b {
                return Err(at_err(o, k, format!("layer range `{key}` runs backwards")));
            }
            if let Some((_, _, other)) = ranges.iter().find(|(x, y, _)| a <= *y && *x <= b) {
                return Err(at_err(o, k, format!("layer range `{key}` overlaps `{other}`")));
            }
            ranges.push((a, b, key));
            if k.value.vision.is_some() {
                return Err(at_err(
                    o,
                    k,
                    format!("layers.{key}: `vision` applies to the whole tower; give it under the top-level `kernels`"),
                ));
            }
            resolve_kernels(o, &k.value, backend)?;
        }
        Ok(())
    }

    /// The selection and switches for `device` running a model of `num_layers`
    /// layers: refuses (error) when the device lacks a requirement; returns warnings
    /// for a fingerprint, vendor or model mismatch.
    pub fn resolve(&self, device: &Device, model: &str, num_layers: usize) -> Result<(Selection, ExecSettings, Vec<String>), ProfileError> {
        let d = &self.doc;
        let o = self.origin.as_str();
        let mut warnings = Vec::new();
        let dev_err = |message: String| ProfileError::Device { path: o.into(), device: device.name(), message };
        let caps = DeviceCaps::from(device);
        let backend = self.backend()?;
        if let Some(b) = backend
            && b != caps.backend()
        {
            return Err(dev_err(format!(
                "the profile holds {} kernels and this device runs {} kernels; pick a {} device with --device or tune this one",
                b.name(),
                caps.backend().name(),
                if b == Backend::Cpu { "cpu" } else { "GPU" }
            )));
        }
        if let DeviceCaps::Gpu(g) = &caps {
            let mut lacks = Vec::new();
            if d.device.requires_f16 && !g.shader_f16 {
                lacks.push("SHADER_F16 (requiresF16: true)".to_string());
            }
            if d.device.requires_subgroups && !g.subgroups {
                lacks.push("subgroups (requiresSubgroups: true)".to_string());
            }
            if d.device.min_shared_memory > g.max_workgroup_storage as u64 {
                lacks.push(format!(
                    "{} bytes of workgroup memory (minSharedMemory; the device has {})",
                    d.device.min_shared_memory, g.max_workgroup_storage
                ));
            }
            if !lacks.is_empty() {
                return Err(dev_err(format!("the device lacks {}", lacks.join(", "))));
            }
        } else if d.device.requires_f16 || d.device.requires_subgroups || d.device.min_shared_memory > 0 {
            return Err(dev_err("the profile requires GPU features (f16 shaders, subgroups or shared memory)".into()));
        }
        if let Some(v) = &d.device.vendor
            && !v.eq_ignore_ascii_case(&device.vendor())
        {
            warnings.push(format!("profile {o} was tuned for vendor `{v}`, this device is `{}`", device.vendor()));
        }
        if let Some(t) = &d.tuning
            && t.fingerprint != device.fingerprint()
        {
            warnings.push(format!(
                "profile {o} was tuned on another device or driver (fingerprint {}…, this one {}…): its choices may not be the fastest here",
                crate::text::prefix(&t.fingerprint, 12),
                crate::text::prefix(&device.fingerprint(), 12)
            ));
        }
        if d.model != model {
            warnings.push(format!("profile {o} was tuned for model `{}`, running `{model}`", d.model));
        }
        let mut sel = Selection::runtime(caps);
        sel.slots = resolve_kernels(o, &d.kernels, backend)?;
        sel.formats = resolve_formats(o, &d.kernels, backend)?;
        for (key, k) in &d.layers {
            let (a, b) = layer_range(key).unwrap_or((0, 0));
            if b >= num_layers {
                return Err(at_err(o, k, format!("layer range `{key}` is past the model's last layer ({})", num_layers.saturating_sub(1))));
            }
            sel.layers.push(LayerOverride { first: a, last: b, slots: resolve_kernels(o, &k.value, backend)? });
        }
        sel.batches = resolve_batches(o, &d.serve, backend)?;
        sel.min_batch = d.serve.min_batch.unwrap_or(2);
        let e = &d.execution;
        let &ExecutionDoc { trusted_shaders, decode_chain, .. } = e;
        let par_on = d.scheduling.max_parallel_kernels > 1;
        let exec = ExecSettings {
            batch: e.batch_commands,
            fusion: e.fusion(),
            parallel: Parallel {
                qkv: par_on && d.parallel.contains_key("qkv_projections"),
                ffn: par_on && d.parallel.contains_key("ffn_projections"),
            },
            kv_dtype: e.kv_cache_dtype.dtype(),
            weight_dtype: e.weight_dtype.dtype(),
            threads: e.cpu_threads as usize,
            spin_us: e.cpu_spin_us,
            prefetch: e.cpu_prefetch_bytes,
            repack: repack_formats(&e.cpu_repack),
            batch_repack: d.serve.cpu_repack.as_deref().map(repack_formats),
            trusted_shaders,
            decode_chain,
        };
        Ok((sel, exec, warnings))
    }

    /// The YAML text.
    pub fn to_yaml(&self) -> Result<String, ProfileError> {
        to_yaml(&self.doc)
    }
}

/// A YAML or schema error: its position and the parser's message without the
/// position (the error gives it separately), in the profile's terms: the
/// parser's limits and a repeated key say what is wrong with the file, never
/// which parser option would allow it.
fn parse_error(origin: &str, e: &serde_saphyr::Error) -> ProfileError {
    let message = yaml_message(e);
    match e.location() {
        Some(l) => ProfileError::At { path: origin.to_string(), line: l.line(), column: l.column(), message },
        None => ProfileError::Invalid { path: origin.to_string(), message },
    }
}

/// The message of a YAML error without its position.
fn yaml_message(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    use serde_saphyr::{Error as E, MessageFormatter};
    let mut inner = e;
    while let E::WithSnippet { error, .. } | E::AliasError { error, .. } = inner {
        inner = error;
    }
    let huge = |what: String| format!("{what}: far more than a profile holds (a few hundred values); not a ktune profile, or damaged");
    // `serde_saphyr::from_str` parses under the default limits.
    let limits = serde_saphyr::Budget::default();
    match inner {
        E::DuplicateMappingKey { key: Some(k), .. } => format!("`{k}` is given twice in one mapping; keep one of them"),
        E::DuplicateMappingKey { key: None, .. } => "a key is given twice in one mapping; keep one of them".into(),
        E::Budget { breach, .. } => match breach {
            B::Nodes { .. } => huge(format!("the document holds more than {} values", limits.max_nodes)),
            B::Events { .. } => huge(format!("the document holds more than {} YAML events", limits.max_events)),
            B::Depth { .. } => huge(format!("the document nests more than {} levels deep", limits.max_depth)),
            B::Documents { .. } => huge(format!("the file holds more than {} YAML documents (a profile is one)", limits.max_documents)),
            B::ScalarBytes { .. } => huge(format!("the document's values hold more than {} bytes", limits.max_total_scalar_bytes)),
            B::InputBytes { .. } => huge("the file holds more bytes than the parser reads".into()),
            B::Aliases { .. } | B::Anchors { .. } | B::AliasAnchorRatio { .. } | B::MergeKeys { .. } => {
                huge("the document repeats anchors and aliases (`&a`, `*a`, `<<`) past the parser's limits".into())
            }
            _ => huge("the document is too large or too deeply nested".into()),
        },
        other => serde_saphyr::UserMessageFormatter.format_message(other).into_owned(),
    }
}

pub fn to_yaml(doc: &ProfileDoc) -> Result<String, ProfileError> {
    let body = serde_saphyr::to_string(doc).map_err(|e| ProfileError::Serialize(e.to_string()))?;
    Ok(format!("# ktune kernel profile; `ktune schema` prints its JSON Schema.\n{body}"))
}

/// Writes `text` to `path` atomically (temp file in the same directory, then rename),
/// so a reader never sees half a profile and a failed write leaves the old one intact.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), ProfileError> {
    crate::atomic::write_atomic(path, text.as_bytes()).map_err(|source| ProfileError::Write { path: path.to_path_buf(), source })
}

/// The profile entry for one choice.
pub fn variant_doc(c: &Choice) -> VariantDoc {
    VariantDoc { kernel: c.kernel.id.to_string(), params: c.kernel.non_default(&c.params) }
}

/// Builds the `kernels` section from explicit per-slot, per-regime choices, an
/// entry per path of the slot table (entries collapse to one variant when both
/// regimes agree or only one regime exists).
pub fn kernels_doc(choices: &BTreeMap<SlotKey, Choice>) -> KernelsDoc {
    let mut doc = KernelsDoc::default();
    for (path, slots) in entry_paths().into_iter().filter(|(p, _)| *p != MATMUL_DEFAULT) {
        let pick = |r: Regime| slots.iter().find_map(|&s| choices.get(&(s, r)).map(|c| (s.op(r), variant_doc(c))));
        let e = match (pick(Regime::Vision), pick(Regime::Prefill), pick(Regime::Decode)) {
            (Some((_, v)), ..) => Entry::One(v),
            (None, None, None) => continue,
            // GEMM for prefill and GEMV for decode: one entry each.
            (None, Some((op_p, p)), Some((op_d, d))) if p == d && op_p == op_d => Entry::One(p),
            (None, p, d) => Entry::PerRegime { prefill: p.map(|x| x.1), decode: d.map(|x| x.1) },
        };
        if let Some(entry) = doc.entry_mut(path, true) {
            *entry = Some(At::new(e));
        }
    }
    doc
}

/// [`kernels_doc`] of the main choices plus, under `formats`, those of a file's
/// other matrix formats.
pub fn kernels_doc_with_formats(choices: &BTreeMap<SlotKey, Choice>, formats: &BTreeMap<(kernels::DType, SlotKey), Choice>) -> KernelsDoc {
    let mut doc = kernels_doc(choices);
    let mut by: BTreeMap<kernels::DType, BTreeMap<SlotKey, Choice>> = BTreeMap::new();
    for ((d, key), c) in formats {
        by.entry(*d).or_default().insert(*key, c.clone());
    }
    doc.formats = by.into_iter().map(|(d, c)| (d.name().to_string(), kernels_doc(&c))).collect();
    doc
}

/// The choices under `kernels.formats`: each key a block format, each value
/// kernel choices as in `kernels`.
fn resolve_formats(
    origin: &str,
    k: &KernelsDoc,
    backend: Option<Backend>,
) -> Result<BTreeMap<(kernels::DType, SlotKey), Choice>, ProfileError> {
    let mut out = BTreeMap::new();
    for (name, sub) in &k.formats {
        let dtype = name.parse::<kernels::DType>().ok().filter(|d| d.is_quant() || *d == kernels::DType::F16).ok_or_else(|| {
            ProfileError::Invalid {
                path: origin.into(),
                message: format!("kernels.formats: `{name}` is not a weight storage format (e.g. q6_k, q5_0, q8_0, f16)"),
            }
        })?;
        if !sub.formats.is_empty() {
            return Err(ProfileError::Invalid {
                path: origin.into(),
                message: format!("kernels.formats.{name} cannot hold `formats` itself"),
            });
        }
        if sub.vision.is_some() {
            return Err(ProfileError::Invalid {
                path: origin.into(),
                message: format!("kernels.formats.{name} cannot hold `vision` (the tower's f32 kernels): give it under `kernels`"),
            });
        }
        for (key, c) in resolve_kernels(origin, sub, backend)? {
            out.insert((dtype, key), c);
        }
    }
    Ok(out)
}

/// JSON Schema of the profile format (for editors).
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(ProfileDoc)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry the slot table names is a field of the profile's `kernels`,
    /// and a choice for every slot in each of its regimes comes back from the
    /// section [`kernels_doc`] writes.
    #[test]
    fn every_slot_table_entry_is_a_kernels_field_and_round_trips() {
        let mut k = KernelsDoc::default();
        for (path, _) in entry_paths() {
            assert!(k.entry_mut(path, true).is_some(), "{path} is no field of `kernels`");
        }
        let mut choices = BTreeMap::new();
        for d in SLOTS {
            // An attention slot is tuned in the regime it is named for.
            let named_for = |r: Regime| match d.slot {
                Slot::AttentionPrefill => r == Regime::Prefill,
                Slot::AttentionDecode => r == Regime::Decode,
                _ => true,
            };
            for r in [Regime::Prefill, Regime::Decode, Regime::Vision].into_iter().filter(|&r| named_for(r)) {
                if let Some(op) = d.slot.op(r) {
                    let kd = kernels::registry().iter().find(|k| k.op == op).unwrap_or_else(|| panic!("no kernel computes {op}"));
                    choices.insert((d.slot, r), Choice::default_of(kd));
                }
            }
        }
        let back = resolve_kernels("t.yaml", &kernels_doc(&choices), None).expect("resolves");
        let ids = |m: &BTreeMap<SlotKey, Choice>| m.iter().map(|(k, c)| (*k, c.kernel.id, c.params.clone())).collect::<Vec<_>>();
        assert_eq!(ids(&back), ids(&choices));
    }

    /// The parser's message comes without its own position prefix (the error
    /// carries line and column separately).
    #[test]
    fn parse_errors_give_the_message_and_its_position_apart() {
        let e = Profile::from_str("name: x\nmodel: m\nversion: 1\nbogus: 3\n", "p.yaml").expect_err("unknown key");
        match e {
            ProfileError::At { line, column, message, .. } => {
                assert_eq!((line, column), (4, 1));
                assert!(message.starts_with("unknown field `bogus`, expected one of name, model"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let e = Profile::from_str("name: x\nmodel: m\nversion: one\n", "p.yaml").expect_err("bad version");
        assert_eq!(e.to_string(), "p.yaml:3:10: invalid u32");
    }
}
