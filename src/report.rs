//! The values commands return: plain serializable data, one type per command.
//! Commands fill them; `output` renders them (`--format table|json|markdown`).

use std::path::PathBuf;

use serde::Serialize;

use crate::device::DeviceSummary;
use crate::kernels::verify::KernelVerdict;
use crate::kernels::{DType, ParamSpec};
use crate::plan::{Fusion, Slot};
use crate::profile::ProfileDoc;

/// `ktune list-devices`.
#[derive(Debug, Serialize)]
pub struct DevicesReport {
    pub devices: Vec<DeviceSummary>,
    /// Index `--device` picks when not given.
    pub default_index: usize,
}

#[derive(Debug, Serialize)]
pub struct ValidityRow {
    pub dtype: DType,
    pub valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct KernelRow {
    pub id: &'static str,
    pub op: &'static str,
    pub backend: &'static str,
    pub dtypes: Vec<DType>,
    pub params: Vec<ParamSpec>,
    pub summary: &'static str,
    /// Validity on the device with default parameters, per dtype, for the op's test shapes.
    pub validity: Vec<ValidityRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<KernelVerdict>,
}

/// `ktune kernels [--verify]`.
#[derive(Debug, Serialize)]
pub struct KernelsReport {
    pub device: String,
    pub backend: String,
    pub fingerprint: String,
    pub kernel_set_hash: String,
    pub verified: bool,
    pub kernels: Vec<KernelRow>,
}

impl KernelsReport {
    pub fn failed(&self) -> bool {
        self.kernels.iter().any(|k| k.verify.as_ref().is_some_and(|v| v.failed > 0))
    }
    pub fn checks(&self) -> (usize, usize) {
        self.kernels.iter().filter_map(|k| k.verify.as_ref()).fold((0, 0), |(c, f), v| (c + v.checks, f + v.failed))
    }
}

#[derive(Debug, Serialize)]
pub struct SlotRow {
    pub slot: Slot,
    /// Milliseconds in the prefill pass.
    pub prefill_ms: f64,
    /// Milliseconds per decoded token.
    pub decode_ms_per_token: f64,
}

/// Why `run` stopped generating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum StopReason {
    /// `--max-tokens` were generated.
    MaxTokens,
    /// An end-of-sequence or end-of-turn token was generated (it is the last id).
    Eos,
    /// A stop string appeared (`chat`, `serve`: the text ends before it).
    Stop,
    /// Cancelled: Ctrl-C in `chat`, a client gone or a shutdown in `serve`.
    Cancelled,
}

/// `ktune run`.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub device: String,
    pub backend: String,
    pub fingerprint: String,
    pub model: String,
    pub weights: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub weight_dtype: DType,
    /// How the file stores most projection matrices (`q8_0`, `f16`, …), for a GGUF file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_storage: Option<String>,
    /// Matrices running in another type than `weight_dtype` (a file's mixed block
    /// formats, or rows that are not whole super-blocks), counted per type.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub other_formats: std::collections::BTreeMap<DType, usize>,
    pub kv_dtype: DType,
    pub fusion: Fusion,
    pub batch_commands: bool,
    /// GPU: decode steps chained per submit (`--decode-chain`, else the
    /// profile's `execution.decodeChain`, else the default); null on the CPU.
    pub decode_chain: Option<usize>,
    pub layers: usize,
    /// The `--prompt` text, when the prompt was given as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The prompt's token ids (`--tokens`, or `--prompt` encoded).
    pub prompt_ids: Vec<u32>,
    pub prompt_tokens: usize,
    pub prefill_seconds: f64,
    pub prefill_tokens_per_sec: f64,
    pub decode_tokens: usize,
    pub decode_seconds: f64,
    pub decode_tokens_per_sec: f64,
    /// Weight bytes read per decoded token and the bandwidth that implies.
    pub weight_bytes: u64,
    pub decode_gbps: f64,
    pub generated: Vec<u32>,
    /// Why generation stopped.
    pub stop_reason: StopReason,
    /// The prompt was rendered with the model's chat template (`--chat`).
    pub chat: bool,
    /// The generated ids decoded (special tokens left out), when there is a tokenizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The tokenizer used (a tokenizer.json, or the GGUF file), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// How each token was chosen (temperature 0: greedy).
    pub sampling: crate::kernels::sample::SamplerParams,
    pub dispatches_per_layer: usize,
    /// Per decode token: host µs by phase and, on a GPU, dispatches, passes,
    /// submits, queue writes, objects created, waits and bytes read back (null
    /// before a decode step after the first).
    pub decode_counters: Option<crate::runtime::counters::DecodeCounters>,
    /// Per-slot times (GPU: timestamp queries of one profiled pass of each kind).
    pub slots: Vec<SlotRow>,
    /// How a GPU's slot times were taken: `inside_pass` (timestamps between the
    /// dispatches of the passes an unprofiled pass runs) or `pass_per_step` (a
    /// pass per step); null on the CPU (the host's clock around each step) and
    /// on adapters without timestamp queries.
    pub step_timing: Option<crate::runtime::StepTiming>,
    /// The profiled decode step's own GPU time, ms (its first pass's start to
    /// its pick's end; `inside_pass` only): its slots' decode times add up to at
    /// most this, the rest being the GPU's time between dispatches.
    pub profiled_step_gpu_ms: Option<f64>,
    pub kernels: Vec<(String, String)>,
    pub warnings: Vec<String>,
}

/// `ktune tune`.
#[derive(Debug, Serialize)]
pub struct TuneReport {
    pub model: String,
    pub device: String,
    pub key: String,
    /// The cached profile.
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<PathBuf>,
    /// Served from the cache without tuning.
    pub cached: bool,
    /// Slot races reused from an earlier, interrupted or differently-budgeted run.
    pub resumed_slots: usize,
    /// HTML reports to write beside the profile (`--report`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reports: Vec<PathBuf>,
    /// How this run spent its `--budget` and what it cut to fit (None: served
    /// from the cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::tuner::budget::BudgetReport>,
    pub profile: ProfileDoc,
}

/// A median with its 95% confidence interval.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    pub median: f64,
    pub ci: [f64; 2],
}

#[derive(Debug, Serialize)]
pub struct BenchEntry {
    /// `default`, or the profile's path.
    pub name: String,
    pub prefill_tok_s: Estimate,
    pub decode_tok_s: Estimate,
    /// Throughput change against the first entry, percent, from per-round ratios.
    pub prefill_vs_first_pct: Estimate,
    pub decode_vs_first_pct: Estimate,
    /// Bytes of weights a decode step reads (the plan's weight buffers).
    pub decode_read_bytes: u64,
    /// Decode against the read-bandwidth bound (`read_gbps` of the same round over
    /// `decode_read_bytes` per token), percent, from per-round ratios.
    pub decode_pct_of_bound: Estimate,
    /// Raw per-round samples: prefill seconds, median seconds per decoded token.
    pub prefill_s: Vec<f64>,
    pub decode_s: Vec<f64>,
    /// Per decode token over every round: host µs by phase and, on a GPU, what
    /// the device's context did (see `RunReport::decode_counters`).
    pub decode_counters: Option<crate::runtime::counters::DecodeCounters>,
    /// With `--image`: the image through the vision tower and projector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionBench>,
    /// With `--kld`: the entry against the CPU's f32 reference on the prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<crate::eval::Divergence>,
}

/// One entry's image through the vision tower and projector (`bench --image`).
#[derive(Debug, Serialize)]
pub struct VisionBench {
    /// Milliseconds per image (median, 95% CI).
    pub ms: Estimate,
    /// This entry's time over the first entry's, from per-round ratios (below 1:
    /// faster than the first).
    pub ratio_to_first: Estimate,
    /// The kernel (and its non-default parameters) of each vision slot, as `slot kernel`.
    pub kernels: Vec<String>,
    /// Raw per-round samples, seconds.
    pub samples_s: Vec<f64>,
}

/// `ktune bench`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub model: String,
    /// The model's decoder layers (what the table's dispatches a layer divide by).
    pub layers: usize,
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub rounds: usize,
    /// The device's read bandwidth, GB/s, measured once per round between the
    /// entries' samples (the machine's bound drifts with its load).
    pub read_gbps: Estimate,
    /// How `read_gbps` was measured.
    pub read_source: String,
    /// `--image`: the image each round also runs through every entry's vision tower.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub entries: Vec<BenchEntry>,
    pub warnings: Vec<String>,
}

/// `ktune eval`: a model's perplexity over a text, and its divergence from a reference.
#[derive(Debug, Serialize)]
pub struct EvalReport {
    pub device: String,
    pub model: String,
    /// What ran: `runtime defaults`, `f32 reference (exact CPU path)`, or the profile's path.
    pub evaluated: String,
    /// The text file, its token count, and the BOS that starts every chunk (if the vocabulary adds one).
    pub file: String,
    pub text_tokens: usize,
    pub bos: Option<u32>,
    pub ctx: usize,
    pub chunks: usize,
    /// The first scored position of each chunk.
    pub first_scored: usize,
    pub perplexity: crate::eval::Perplexity,
    /// What the divergence is measured against (`--reference`, `--reference-device`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divergence: Option<crate::eval::Divergence>,
    /// `--save-logits`: the file written, and how it stores the log-probabilities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_logits: Option<String>,
    pub seconds: f64,
    pub warnings: Vec<String>,
}

/// `ktune bench-kernels`: each WGSL family's best variant at model shapes,
/// against the adapter's limits measured in the same run.
#[derive(Debug, Serialize)]
pub struct KernelBenchReport {
    pub device: String,
    pub backend: String,
    /// `gpu-timestamps` or `wall-clock`.
    pub timing: String,
    pub trusted_shaders: bool,
    /// How the races kept their inputs out of the L2 (`rotate`: copies of twice
    /// it), as a profile records it.
    pub measurement: crate::profile::doc::Measurement,
    /// The FMA load that ran before the limits (the GPU's clocks brought up).
    pub warm_up: crate::tuner::warm::WarmUp,
    /// Copy bandwidth (read + write) and f32 FMA peak, measured in this run.
    pub limits: crate::tuner::kbench::Peaks,
    pub quick: bool,
    pub prefill_tokens: usize,
    pub context: usize,
    pub rows: Vec<KernelBenchRow>,
    /// Shapes no WGSL variant accepts on this adapter, with the model.
    pub skipped: Vec<String>,
    /// Shapes whose every variant failed to build or run, with the first failure.
    pub errors: Vec<String>,
}

/// One shape's best variant.
#[derive(Debug, Serialize)]
pub struct KernelBenchRow {
    pub model: String,
    /// Where the shape sits in the forward pass.
    pub what: String,
    pub op: String,
    pub problem: String,
    pub dtype: DType,
    /// The winner, `kernel{param=value,...}`.
    pub kernel: String,
    /// Variants raced.
    pub candidates: usize,
    /// Input copies the executions rotated through.
    pub copies: usize,
    pub median_us: f64,
    /// Minimum bytes moved (inputs once, outputs once) per second.
    pub gbps: f64,
    pub gflops: f64,
    /// `gbps` against the copy kernel's bandwidth.
    pub pct_of_bandwidth: f64,
    /// `gflops` against the FMA kernel's peak.
    pub pct_of_peak_flops: f64,
    /// The winner's parity check: `passed`, or why it failed.
    pub check: String,
    /// Every variant that produced a time, fastest first: `kernel{params}`,
    /// median µs and GB/s (what a new adapter's figures need to tell kernel
    /// designs apart, not only the winner).
    pub variants: Vec<VariantTime>,
}

/// One raced variant of a `bench-kernels` row.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VariantTime {
    pub kernel: String,
    pub median_us: f64,
    pub gbps: f64,
}

impl KernelBenchReport {
    /// Whether a winner failed its parity check, or a shape had no variant that ran.
    pub fn failed(&self) -> bool {
        !self.errors.is_empty() || self.rows.iter().any(|r| r.check != "passed")
    }
}

/// One cached profile (`ktune profiles list`).
#[derive(Debug, Serialize)]
pub struct ProfileRow {
    pub key: String,
    pub name: String,
    pub model: String,
    pub device: String,
    pub date: String,
    pub strategy: String,
    pub decode_tok_s: f64,
    pub prefill_tok_s: f64,
    pub path: PathBuf,
}

/// `ktune profiles …`: the cached profiles (`list`), or a text (`show`, `path`, `clear`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ProfilesReport {
    List(Vec<ProfileRow>),
    Text(String),
    Bundle(BundleReport),
}

/// `ktune profiles export|import|merge`: what became of each profile, and the
/// bundle written (export, merge).
#[derive(Debug, Serialize)]
pub struct BundleReport {
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written: Option<PathBuf>,
    /// Profiles in the written bundle, or added and replaced in the cache.
    pub count: usize,
    pub profiles: Vec<crate::profile::bundle::Outcome>,
}

/// `ktune schema`: the profile format's JSON Schema.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct SchemaReport(pub serde_json::Value);

/// One profile of a `ktune report`.
#[derive(Debug, Serialize)]
pub struct ReportedProfile {
    /// The file it was read from.
    pub origin: String,
    /// Its kernel choices, flattened: (`matmul.qkv_proj (decode)`, `gemv_dot4_cpu(rows_per_task=64)`).
    pub choices: Vec<(String, String)>,
    pub profile: ProfileDoc,
}

/// `ktune report` (and `tune --report`): the profiles to draw and each later
/// profile compared with the first; `output` draws the HTML page.
#[derive(Debug, Serialize)]
pub struct HtmlReport {
    /// The HTML file.
    pub output: PathBuf,
    pub ktune_version: String,
    pub profiles: Vec<ReportedProfile>,
    /// `diff(first, other)` for every later profile.
    pub diffs: Vec<crate::profile::diff::DiffReport>,
}

/// `ktune completions` and `ktune man`: text for stdout, or the files written.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratedReport {
    Text(String),
    Files(Vec<PathBuf>),
}
