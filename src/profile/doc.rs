//! The profile document: the profile YAML's keys as serde types (also the JSON Schema
//! `ktune schema` prints), plus the `tuning` provenance section. Values that later
//! validation may reject carry their source position ([`At`]).

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value with the line and column it was read from (0 when built in code).
#[derive(Clone, Debug, PartialEq)]
pub struct At<T> {
    pub value: T,
    pub line: u64,
    pub column: u64,
}

impl<T> At<T> {
    pub fn new(value: T) -> At<T> {
        At { value, line: 0, column: 0 }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        Ok(At { value: s.value, line: s.referenced.line(), column: s.referenced.column() })
    }
}

impl<T: Serialize> Serialize for At<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<T: JsonSchema> JsonSchema for At<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(g)
    }
    fn inline_schema() -> bool {
        T::inline_schema()
    }
}

/// A kernel profile, as written on disk.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileDoc {
    /// Free-form profile name.
    pub name: String,
    /// The model the profile was tuned for (a built-in name or the model directory's name).
    pub model: String,
    /// Format version: 1.
    pub version: At<u32>,
    /// What the device must have for this profile to run.
    #[serde(default)]
    pub device: DeviceReq,
    /// The kernel serving each slot.
    #[serde(default)]
    pub kernels: KernelsDoc,
    /// Whole-plan execution switches.
    #[serde(default)]
    pub execution: ExecutionDoc,
    /// Independent operations run concurrently: `qkv_projections` and/or `ffn_projections`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parallel: BTreeMap<String, At<Vec<String>>>,
    /// Per-layer overrides: keys are inclusive layer ranges (`0-5`) or single layers (`7`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub layers: BTreeMap<String, At<KernelsDoc>>,
    /// Scheduling hints for the parallel groups.
    #[serde(default)]
    pub scheduling: SchedulingDoc,
    /// Serving many sequences at once (`serve --parallel`): kernel choices per
    /// decode batch size (written by `ktune tune --serve-batches`).
    #[serde(default, skip_serializing_if = "ServeDoc::is_empty")]
    pub serve: ServeDoc,
    /// Where the numbers came from (written by `ktune tune`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
}

/// The `serve` section: kernel choices for decode batches of many sequences.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServeDoc {
    /// The fewest sequences `serve --parallel` decodes in one batch pass; fewer
    /// decode one at a time with the decode's kernels (absent: 2, every batch
    /// of two or more in one pass). `tune --serve-batches` writes it where
    /// lone steps were faster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_batch: Option<usize>,
    /// Keys: batch sizes (2 or more sequences); values: kernel choices as in
    /// `kernels` for a decode batch of at least that many sequences (a batch
    /// takes the largest size not above its own; a slot left out takes
    /// `kernels`). A batch runs its projections as GEMMs over its tokens (the
    /// prefill's kernels) and its attention a sequence at a time (the decode's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub batches: BTreeMap<String, At<KernelsDoc>>,
    /// CPU: block formats whose matrices a server of several sequences
    /// (`serve --parallel`) repacks at load, as `execution.cpuRepack` says for
    /// one sequence (`tune --serve-batches` writes the layouts its batch
    /// tables were checked over; an empty list: every matrix as stored);
    /// absent: the runtime's default for a server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_repack: Option<Vec<String>>,
}

impl ServeDoc {
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.min_batch.is_none() && self.cpu_repack.is_none()
    }
}

/// Batch sizes a `serve.batches` key may name.
pub const BATCH_SIZES: std::ops::RangeInclusive<usize> = 2..=4096;

/// Device requirements.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceReq {
    /// `cpu` for CPU kernels, `wgsl` for GPU kernels (any wgpu adapter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<At<String>>,
    /// apple, nvidia, amd, intel, arm, qualcomm, mesa (software), ...; a mismatch warns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Workgroup storage bytes the chosen kernels need.
    #[serde(default)]
    pub min_shared_memory: u64,
    #[serde(default)]
    pub requires_f16: bool,
    #[serde(default)]
    pub requires_subgroups: bool,
}

/// Kernel choices. Each entry is a variant id (`gemv_subgroup`), a variant with
/// parameters (`{kernel: gemv_subgroup, params: {wg: 128}}`), or one of those per
/// regime (`{prefill: ..., decode: ...}`). A plain entry serves every regime whose op
/// the kernel computes (a GEMM id serves prefill, a GEMV id decode).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelsDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<At<Entry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul: Option<MatmulDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<At<Entry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<At<Entry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope: Option<At<Entry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual: Option<At<Entry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused: Option<FusedDoc>,
    /// A mixture of experts' kernels (absent: the runtime's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeDoc>,
    /// The vision tower's and projector's kernels (a multimodal model's image
    /// path; regime `vision`). Absent, or a slot left out: the runtime's defaults.
    /// Only in the top-level `kernels`, not per layer or per format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionDoc>,
    /// Choices for the matrices a file keeps in another block format than
    /// `execution.weightDtype` (a `Q4_K_M` file's Q6_K and Q5_0 tensors), by format
    /// name (`q6_k: {matmul: {down_proj: ...}}`); a slot not listed there uses the
    /// entry above.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub formats: BTreeMap<String, KernelsDoc>,
}

impl KernelsDoc {
    /// The entry at `path` (a slot table entry, [`crate::plan::select::SlotDef::entry`],
    /// or `matmul.default`): None for another path, or where its section
    /// (`matmul`, `fused`, `vision`) is absent and not `make`.
    pub fn entry_mut(&mut self, path: &str, make: bool) -> Option<&mut Option<At<Entry>>> {
        fn section<T: Default>(s: &mut Option<T>, make: bool) -> Option<&mut T> {
            if make { Some(s.get_or_insert_with(T::default)) } else { s.as_mut() }
        }
        let (head, tail) = path.split_once('.').unwrap_or((path, ""));
        Some(match (head, tail) {
            ("attention", "") => &mut self.attention,
            ("norm", "") => &mut self.norm,
            ("activation", "") => &mut self.activation,
            ("rope", "") => &mut self.rope,
            ("residual", "") => &mut self.residual,
            ("matmul", key) => section(&mut self.matmul, make)?.entry_mut(key)?,
            ("fused", key) => section(&mut self.fused, make)?.entry_mut(key)?,
            ("moe", key) => section(&mut self.moe, make)?.entry_mut(key)?,
            ("vision", key) => section(&mut self.vision, make)?.entry_mut(key)?,
            _ => return None,
        })
    }
}

/// A section of slot entries (`kernels.matmul`, `.fused`, `.vision`) from its
/// slots' names: the struct, each field an entry left out when absent, and
/// `entry_mut`, the field a key names.
macro_rules! entry_section {
    ($(#[$meta:meta])* $name:ident { $($(#[$field_meta:meta])* $field:ident,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[$field_meta])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<At<Entry>>,
            )*
        }

        impl $name {
            /// The entry of the slot `key` names (a field's name); None for another key.
            pub fn entry_mut(&mut self, key: &str) -> Option<&mut Option<At<Entry>>> {
                match key {
                    $(stringify!($field) => Some(&mut self.$field),)*
                    _ => None,
                }
            }
        }
    };
}

entry_section! {
    MatmulDoc {
        /// Every projection not listed below.
        default,
        qkv_proj,
        o_proj,
        gate_up,
        down_proj,
        lm_head,
        /// A mixture of experts' router projection.
        router,
    }
}

entry_section! {
    /// A mixture of experts' kernels (`kernels.moe`).
    MoeDoc {
        /// The router's top-k choice.
        route,
        /// The chosen experts' gate and up projections.
        gate_up,
        /// The chosen experts' down projections, weighted and summed.
        down,
    }
}

entry_section! {
    FusedDoc {
        qkv_proj,
        gate_up,
        qk_norm_rope,
        residual_norm,
        /// RMSNorm folded into the decode projections it feeds (`norm_gemv_*` kernels).
        norm_matmul,
        /// Split-QKV + RoPE (+ q/k norm) + KV-cache write in one decode kernel.
        qkv_rope_cache,
    }
}

entry_section! {
    /// The vision slots: one variant each (they have one regime).
    VisionDoc {
        /// The patch embedding (`vision.patch_embed`: a patch_embed kernel).
        patch_embed,
        /// The tower's bidirectional attention (`vision.attention`: an attention_full kernel).
        attention,
        /// The tower's Linear layers, MLP and attention projections (`vision.mlp`: a linear kernel).
        mlp,
        /// The tower's LayerNorms after no residual add (`vision.norm`: a layer_norm kernel).
        norm,
        /// The tower's residual adds fused with the LayerNorm after each
        /// (`vision.residual_norm`: a residual_layer_norm kernel; absent in older profiles).
        residual_norm,
        /// The projector's average pool (`vision.pool`: an avg_pool kernel).
        pool,
        /// The projector's GEMM to the text width (`projector`: a gemm kernel).
        projector,
    }
}

/// A kernel id with its parameters (unlisted parameters take their defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VariantDoc {
    pub kernel: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, u32>,
}

impl VariantDoc {
    pub fn id(kernel: &str) -> VariantDoc {
        VariantDoc { kernel: kernel.into(), params: BTreeMap::new() }
    }
}

impl fmt::Display for VariantDoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::kernels::variant_label(&self.kernel, &self.params))
    }
}

/// One slot's entry: one variant, or one per regime.
#[derive(Clone, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(untagged)]
pub enum Entry {
    One(#[schemars(with = "VariantSchema")] VariantDoc),
    PerRegime {
        #[schemars(with = "Option<VariantSchema>")]
        prefill: Option<VariantDoc>,
        #[schemars(with = "Option<VariantSchema>")]
        decode: Option<VariantDoc>,
    },
}

/// A variant id, or an id with parameters.
#[derive(JsonSchema)]
#[schemars(untagged)]
#[allow(dead_code)]
enum VariantSchema {
    Id(String),
    WithParams(VariantDoc),
}

fn variant_out<S: Serializer>(v: &VariantDoc, s: S) -> Result<S::Ok, S::Error> {
    if v.params.is_empty() { s.serialize_str(&v.kernel) } else { v.serialize(s) }
}

impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct V<'a>(&'a VariantDoc);
        impl Serialize for V<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                variant_out(self.0, s)
            }
        }
        match self {
            Entry::One(v) => variant_out(v, s),
            Entry::PerRegime { prefill, decode } => {
                let mut m = s.serialize_map(None)?;
                if let Some(p) = prefill {
                    m.serialize_entry("prefill", &V(p))?;
                }
                if let Some(d) = decode {
                    m.serialize_entry("decode", &V(d))?;
                }
                m.end()
            }
        }
    }
}

/// A variant written as an id or as `{kernel, params}`.
struct VariantIn(VariantDoc);

impl<'de> Deserialize<'de> for VariantIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Vis;
        impl<'de> Visitor<'de> for Vis {
            type Value = VariantIn;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a kernel id or {kernel: ID, params: {...}}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<VariantIn, E> {
                Ok(VariantIn(VariantDoc::id(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<VariantIn, A::Error> {
                VariantDoc::deserialize(de::value::MapAccessDeserializer::new(map)).map(VariantIn)
            }
        }
        d.deserialize_any(Vis)
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Vis;
        impl<'de> Visitor<'de> for Vis {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a kernel id, {kernel: ID, params: {...}}, or {prefill: ..., decode: ...}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Entry, E> {
                Ok(Entry::One(VariantDoc::id(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
                let mut kernel: Option<String> = None;
                let mut params: Option<BTreeMap<String, u32>> = None;
                let mut prefill = None;
                let mut decode = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "kernel" => kernel = Some(map.next_value()?),
                        "params" => params = Some(map.next_value()?),
                        "prefill" => prefill = Some(map.next_value::<VariantIn>()?.0),
                        "decode" => decode = Some(map.next_value::<VariantIn>()?.0),
                        other => {
                            return Err(de::Error::unknown_field(other, &["kernel", "params", "prefill", "decode"]));
                        }
                    }
                }
                match (kernel, prefill.is_some() || decode.is_some()) {
                    (Some(_), true) => Err(de::Error::custom("give either `kernel` (with `params`) or `prefill`/`decode`, not both")),
                    (Some(k), false) => Ok(Entry::One(VariantDoc { kernel: k, params: params.unwrap_or_default() })),
                    (None, true) if params.is_some() => {
                        Err(de::Error::custom("`params` belongs inside `prefill: {kernel, params}` or `decode: {kernel, params}`"))
                    }
                    (None, true) => Ok(Entry::PerRegime { prefill, decode }),
                    (None, false) => Err(de::Error::missing_field("kernel")),
                }
            }
        }
        d.deserialize_any(Vis)
    }
}

/// Storage type names in the profile: [`DType`](crate::kernels::DType)'s, its
/// schema an enum of [`DType::ALL`](crate::kernels::DType::ALL)'s names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StorageDtype(pub crate::kernels::DType);

impl Default for StorageDtype {
    fn default() -> StorageDtype {
        StorageDtype(crate::kernels::DType::F32)
    }
}

impl JsonSchema for StorageDtype {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StorageDtype".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = crate::kernels::DType::ALL.iter().map(|d| d.name()).collect();
        schemars::json_schema!({ "description": "Storage type names in the profile.", "type": "string", "enum": names })
    }
}

impl StorageDtype {
    pub fn dtype(self) -> crate::kernels::DType {
        self.0
    }
    pub fn from_dtype(d: crate::kernels::DType) -> StorageDtype {
        StorageDtype(d)
    }
}

fn yes() -> bool {
    true
}

/// Execution switches (the profile's `execution` section).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecutionDoc {
    /// GPU: one command buffer and one submit per forward pass (false: one per kernel).
    #[serde(default = "yes")]
    pub batch_commands: bool,
    /// Storage type of the KV cache.
    #[serde(default)]
    pub kv_cache_dtype: StorageDtype,
    /// Storage type of the weights the profile was tuned for.
    #[serde(default)]
    pub weight_dtype: StorageDtype,
    /// Gate and up from one weight, activation in the epilogue.
    #[serde(default)]
    pub fused_gate_up: bool,
    /// Q, K, V from one weight.
    #[serde(default)]
    pub fused_qkv: bool,
    /// Per-head q/k RMSNorm + RoPE in one kernel (models with q/k norm).
    #[serde(default)]
    pub fused_qk_norm_rope: bool,
    /// Residual add + the next RMSNorm in one kernel.
    #[serde(default)]
    pub fused_residual_norm: bool,
    /// Decode: RMSNorm as the prologue of the projections it feeds (Q/K/V, gate/up
    /// unless fused, the LM head).
    #[serde(default)]
    pub fused_norm_matmul: bool,
    /// Decode: the fused QKV row split, rotated (q/k-normed) and written into the
    /// KV cache by one kernel (with `fusedQkv` and `fusedNormMatmul`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub fused_qkv_rope_cache: bool,
    /// CPU: threads the kernels run on (the tuned thread count; absent or 0: all
    /// the process may use; more than the machine has: all of them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_threads: u32,
    /// CPU: how long idle workers of the kernels' pool spin between kernels
    /// before they park, in microseconds (the tuned value; absent or 0: the
    /// pool's default, 2000).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_spin_us: u32,
    /// CPU: how far ahead (bytes) the int8 decode dots prefetch the weight rows
    /// they stream (the tuned value; 0: no prefetch; absent: the runtime's
    /// default, 2048; at most 65536).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_prefetch_bytes: Option<u32>,
    /// CPU: block formats whose matrices are repacked at load for the decode
    /// dots (today `q4_k`: 8 rows interleaved, the `X8` layout); absent or empty:
    /// every matrix as stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_repack: Vec<String>,
    /// GPU: shader modules built without wgpu's runtime bounds checks
    /// (`create_shader_module_trusted`, unchecked), as the profile was tuned
    /// (`tune --trusted-shaders`); absent: checked modules.
    #[serde(default, skip_serializing_if = "is_false")]
    pub trusted_shaders: bool,
    /// GPU: decode steps chained in one submit (the token picked on the GPU,
    /// the next chain submitted before the host reads the last one's ids): the
    /// tuned value, 1 to [`MAX_CHAIN`]; absent (older profiles, CPU ones): the runtime's
    /// default, [`DEFAULT_DECODE_CHAIN`]. The CPU ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_CHAIN))]
    pub decode_chain: Option<u32>,
}

/// Decode steps chained per submit when neither a profile nor `--decode-chain`
/// says.
pub const DEFAULT_DECODE_CHAIN: u32 = 8;

/// The most decode steps one chain records: the largest `decodeChain` a profile
/// or `--decode-chain` may give, and the slots of the runtime's id buffer.
pub const MAX_CHAIN: usize = 64;

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Default for ExecutionDoc {
    fn default() -> ExecutionDoc {
        ExecutionDoc {
            batch_commands: true,
            kv_cache_dtype: StorageDtype::default(),
            weight_dtype: StorageDtype::default(),
            fused_gate_up: false,
            fused_qkv: false,
            fused_qk_norm_rope: false,
            fused_residual_norm: false,
            fused_norm_matmul: false,
            fused_qkv_rope_cache: false,
            cpu_threads: 0,
            cpu_spin_us: 0,
            cpu_prefetch_bytes: None,
            cpu_repack: Vec::new(),
            trusted_shaders: false,
            decode_chain: None,
        }
    }
}

fn three() -> u32 {
    3
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SchedulingDoc {
    /// Most kernels of a parallel group in flight at once (1 runs groups sequentially).
    #[serde(default = "three")]
    pub max_parallel_kernels: u32,
    /// Ordering points: `after` a parallel group, `before` an op (attention, activation, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub barriers: Vec<At<Barrier>>,
}

impl Default for SchedulingDoc {
    fn default() -> SchedulingDoc {
        SchedulingDoc { max_parallel_kernels: 3, barriers: Vec::new() }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Barrier {
    pub after: String,
    pub before: String,
}

/// Provenance of a tuned profile.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    /// Full sha256 fingerprint of the device.
    pub fingerprint: String,
    pub device_name: String,
    pub ktune_version: String,
    /// Hash of the kernel set (shader sources and registry).
    pub kernel_set: String,
    /// The device's class (vendor, family, backend, driver major; CPU: ISA and
    /// cores): a profile of the same class serves a device without its own.
    /// Absent in profiles written before classes existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class: Option<crate::device::DeviceClass>,
    /// sha256 of the model's configuration and its matrices' storage formats: a
    /// cached profile is used only for the same model (absent in older profiles:
    /// the model name decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_hash: Option<String>,
    /// `gpu-timestamps` or `wall-clock`.
    pub timing: String,
    /// How the slot races kept their inputs out of the caches (absent in
    /// profiles written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurement: Option<Measurement>,
    /// UTC, RFC 3339.
    pub date: String,
    pub strategy: String,
    pub seed: u64,
    pub budget_s: f64,
    pub used_s: f64,
    pub prefill_tokens: usize,
    pub context: usize,
    /// Device limits the achieved figures are compared with.
    pub limits: Limits,
    pub space: SpaceSummary,
    /// Per slot, regime and shape: the candidates measured and those rejected.
    pub slots: Vec<SlotTuning>,
    pub end_to_end: EndToEnd,
}

/// How the slot races timed memory rather than cache (`tuning.measurement`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// `rotate`: consecutive executions of a kernel read distinct copies of its
    /// inputs (weights included), together `rotate_bytes`, so none finds them in
    /// the cache the previous one filled.
    pub method: String,
    /// The cache the copies overflow, bytes (GPU: L2; CPU: the last-level cache).
    pub cache_bytes: u64,
    /// Where `cache_bytes` comes from: an estimate per vendor and class, the
    /// host's caches, or `--gpu-l2-bytes`.
    pub cache_source: String,
    /// Bytes of input copies each shape's executions cycle through.
    pub rotate_bytes: u64,
    /// Most copies any slot's shape rotated through (1: its inputs alone exceed
    /// `rotate_bytes`).
    pub max_copies: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Measured (CPU) or assumed read bandwidth, GB/s.
    pub read_gbps: f64,
    /// Where the bandwidth figure came from.
    pub read_source: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpaceSummary {
    /// Variants valid for at least one slot.
    pub variants: usize,
    /// Variants ruled out, by reason.
    pub ruled_out: BTreeMap<String, usize>,
    /// Complete combinations (variants per slot, fusion choices, execution flags), as a decimal string.
    pub combinations: String,
    pub fusion_choices: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlotTuning {
    pub slot: String,
    pub regime: String,
    /// The shape measured (one per distinct problem of the slot).
    pub problem: String,
    /// Dispatches of this shape per forward pass.
    pub count: usize,
    pub chosen: String,
    /// Input copies the executions of this shape rotated through (absent in
    /// older profiles; see `tuning.measurement`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<usize>,
    pub candidates: Vec<Candidate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<Rejected>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    pub variant: VariantDoc,
    pub median_us: f64,
    /// 95% confidence interval of the median.
    pub ci_us: [f64; 2],
    /// Median absolute deviation.
    pub mad_us: f64,
    pub samples: usize,
    pub outliers: usize,
    pub gbps: f64,
    pub gflops: f64,
    /// Achieved bandwidth against `limits.read_gbps`.
    pub pct_of_bandwidth: f64,
    /// `measured`, or the round it was dropped in (`dropped@2`).
    pub status: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rejected {
    pub variant: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EndToEnd {
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub tuned: Throughput,
    pub default: Throughput,
    /// The accuracy budget: the mean KL divergence from the CPU's f32 reference
    /// above which a combination was refused (absent in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kld: Option<f64>,
    /// The stage ran on the model's first `timed` of `of` layers (a build of the
    /// whole model did not fit the budget): the tok/s here are those layers'
    /// (absent: the whole model was timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_layers: Option<TimedLayers>,
    /// Every complete combination timed end to end.
    pub combinations: Vec<Combination>,
    /// Why the chosen combination won, or why the runtime default stayed
    /// (absent in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// The end-to-end winner timed again against the runtime default, the two
    /// engines alone (absent where the default won the interleaved rounds, the
    /// combinations were timed one at a time, and in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_to_head: Option<HeadToHead>,
    /// A multimodal model's one image per request through the vision tower and
    /// projector, with the raced vision kernels and with the runtime's defaults
    /// (absent for a text-only model, with `--no-vision`, and in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionEndToEnd>,
    /// Each decode batch size of `serve.batches` (`tune --serve-batches`): one
    /// step of the whole model's batch with the raced kernels, without them and
    /// as lone steps, interleaved on one engine (absent without batch regimes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<BatchEndToEnd>,
}

/// One decode batch size timed end to end (`tuning.end_to_end.batches`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchEndToEnd {
    /// Sequences decoded together.
    pub sequences: usize,
    /// Interleaved rounds, each a few steps with each choice.
    pub rounds: usize,
    /// Median ms of one batch step with the raced kernels...
    pub tuned_ms: f64,
    /// ...and without them: with the next smaller size's table, else the
    /// prefill's kernels (what the size takes if its own is dropped)...
    pub default_ms: f64,
    /// ...and as many lone decode steps, one a sequence...
    #[serde(default)]
    pub lone_ms: f64,
    /// ...and, where a smaller size's table would reach this size, with the
    /// plan's own (prefill) kernels as this size's table: kept as the size's
    /// table where they beat what it would inherit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_ms: Option<f64>,
    /// Whether the plan's own kernels became this size's table.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_kept: bool,
    /// ...and, where they differ from the plan's own, with the runtime's
    /// default kernels as this size's table (what a server without a profile
    /// runs): kept as the size's table where they beat every other arm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock_ms: Option<f64>,
    /// Whether the runtime's default kernels became this size's table.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stock_kept: bool,
    /// Whether the raced kernels stayed in `serve.batches` (not slower).
    pub kept: bool,
}

/// The end-to-end winner against the runtime default, head to head
/// (`tuning.end_to_end.head_to_head`): one request's time, ms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeadToHead {
    /// The winner's label, as in `combinations`.
    pub combination: String,
    /// Rounds timed (each times both once, alternating which goes first).
    pub rounds: usize,
    /// Median ms per request with the winner, with its 95% confidence interval.
    pub tuned_ms: f64,
    pub tuned_ci_ms: [f64; 2],
    /// Median ms per request with the runtime default.
    pub default_ms: f64,
    pub default_ci_ms: [f64; 2],
    /// Whether it confirmed the winner (else the default stayed).
    pub confirmed: bool,
}

/// The layers an end-to-end stage timed, of the model's (`tuning.end_to_end.timed_layers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimedLayers {
    pub timed: usize,
    pub of: usize,
}

/// The vision part of the end-to-end score: one image per request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VisionEndToEnd {
    /// The image timed (`synthetic 896x896`: deterministic pixels at the tower's input size).
    pub image: String,
    /// Interleaved rounds timed (each times both choices once).
    pub rounds: usize,
    /// Median ms per image with the raced vision winners, with its 95% confidence interval.
    pub tuned_ms: f64,
    pub tuned_ci_ms: [f64; 2],
    /// Median ms per image with the runtime's default vision kernels.
    pub default_ms: f64,
    pub default_ci_ms: [f64; 2],
    /// Whether the raced vision winners are this profile's `kernels.vision`
    /// (else the slots are left out: the runtime's defaults).
    pub kept: bool,
    /// Why they were kept or not.
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Throughput {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Median prefill time, ms, with its 95% confidence interval.
    pub prefill_ms: f64,
    pub prefill_ci_ms: [f64; 2],
    /// Median time per decoded token, ms, with its 95% confidence interval.
    pub decode_ms: f64,
    pub decode_ci_ms: [f64; 2],
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Combination {
    /// Fusions and flags, e.g. `fused_qkv+fused_gate_up batch`.
    pub label: String,
    pub predicted_ms: f64,
    pub result: Throughput,
    pub chosen: bool,
    /// Mean KL divergence (nats per token) from the CPU's f32 reference on the
    /// end-to-end stage's accuracy prompts (absent: not measured, or an older profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kld: Option<f64>,
    /// Why the accuracy budget (`max_kld`) refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}
