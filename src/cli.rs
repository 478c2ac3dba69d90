//! Command-line definitions (clap derive), and their conversion into the settings
//! types that live outside the parser ([`session::ModelSettings`],
//! [`output::Format`]).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::kernels::DType;
use crate::kernels::sample::SamplerParams;
use crate::output;
use crate::session::{self, ModelSettings, SessionError};

#[derive(Parser, Debug)]
#[command(name = "ktune", version, about = "Auto-tuner for transformer-decoder compute kernels (WGSL and CPU)")]
pub struct Cli {
    /// Device: `cpu`, an index from list-devices, a backend (vulkan, gl, metal, dx12),
    /// part of an adapter name, or a fingerprint prefix. Default: the first hardware
    /// GPU, else the CPU.
    #[arg(long, global = true)]
    pub device: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Every wgpu adapter and the CPU, with capabilities and fingerprints.
    ListDevices(ListDevicesArgs),
    /// The kernel set; with --verify, check each variant against the CPU reference.
    Kernels(KernelsArgs),
    /// Run a model with the kernels a profile selects (or the runtime's defaults).
    Run(Box<RunArgs>),
    /// Chat with a model in the terminal (its chat template, tokens streamed as
    /// they come); with stdin not a terminal, one message a line, each reply
    /// followed by a line `---`.
    Chat(Box<ChatArgs>),
    /// Serve a model over HTTP with the OpenAI API (/v1/chat/completions,
    /// /v1/completions, /v1/models), /health and /metrics; with --parallel N up to
    /// N requests decoded together (continuous batching), the rest queued.
    Serve(Box<ServeArgs>),
    /// Tune a model's kernels on a device and write the profile (cached).
    Tune(TuneArgs),
    /// Cached profiles: list, show, path, clear.
    Profiles(ProfilesArgs),
    /// Compare two profiles: choices, times and their noise (exit 1 on a regression).
    DiffProfiles(DiffArgs),
    /// Measure profiles and the runtime default end to end in one process, interleaved.
    Bench(BenchArgs),
    /// Accuracy of a model as it runs: perplexity over a text (chunked as
    /// llama-perplexity does), and KL divergence, top-1 agreement and logit error
    /// against a reference (the CPU's f32 path, another device, or saved logits).
    Eval(Box<EvalArgs>),
    /// Every WGSL family's best variant at Gemma 3 1B and Llama 3.2 1B shapes on a
    /// GPU adapter: GB/s and GFLOP/s against the adapter's copy bandwidth and FMA
    /// peak, both measured in the same run.
    BenchKernels(BenchKernelsArgs),
    /// Print the JSON Schema of the profile format (for editors).
    Schema,
    /// Draw profiles as one self-contained HTML page: every slot's candidates, a
    /// roofline per device, end to end against the runtime default, and the diff
    /// of each profile with the first.
    Report(ReportArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print ktune's man page (roff), or with -o DIR write one page per subcommand.
    Man(ManArgs),
    /// Download a model from the Hugging Face Hub into its cache (shared with
    /// Python's huggingface_hub) and print its local path.
    Pull(PullArgs),
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// The repository, with the GGUF quant or file and the revision:
    /// REPO[:QUANT_OR_FILE][@REVISION], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M
    /// (default: the largest quant at or below Q4_K_M; a safetensors repository
    /// gives its config, tokenizer and weights). A built-in model's name stands for
    /// its published GGUF repository. Unlike --hf on other commands, which use a
    /// cached revision as it is, pull asks the hub for the revision's current commit.
    #[arg(long, value_name = "REPO[:QUANT_OR_FILE][@REVISION]")]
    pub hf: String,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Profile YAML files, or cached profiles by key prefix or name (`profiles
    /// list`); the first is the reference the others are compared with.
    #[arg(required = true, value_name = "PROFILE")]
    pub profiles: Vec<String>,
    /// The HTML file to write (written whole or not at all).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: std::path::PathBuf,
    /// Slowdown (percent) the comparisons call a regression when it is also beyond the noise.
    #[arg(long, default_value = "5", value_parser = percent)]
    pub threshold: f64,
}

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write `ktune.1` and one page per subcommand (`ktune-tune.1`, ...) into this
    /// directory instead of printing the main page.
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: Option<std::path::PathBuf>,
}

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("mmproj", |a| a.help("With --gguf: the text model's vision projector file (llama.cpp's `mmproj-*.gguf`, projector type gemma3), whose tower the tune races as for a Hugging Face multimodal directory (`run --gguf --mmproj --image` then uses it)")),
    mut_arg("layers", |a| a.help("Keep only the first N layers (quick tunes of large models; recorded in the profile's model name)")),
    mut_arg("weight_dtype", |a| a.help(format!("Storage type of the matrix weights: f32, f16 or a block format ({}: quantized on load; the profile records it). Default f32; with --gguf, each matrix as the file stores it", block_formats()))),
    mut_arg("seed", |a| a.help("Seed of the synthetic weights, the inputs and the search")),
    mut_arg("trusted_shaders", |a| a.help("GPU: tune (and record in the profile's `execution.trustedShaders`, which `run` and `bench` then follow) shader modules built without wgpu's runtime bounds checks (`create_shader_module_trusted`, unchecked; each kernel's host-side check already bounds its accesses)")),
)]
pub struct TuneArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Leave the vision tower's slots (`vision.*`, `projector`) out of the tune of a
    /// multimodal model (they keep the runtime's defaults).
    #[arg(long)]
    pub no_vision: bool,
    /// Time for the whole tune, e.g. 90s, 2m, 1h30m.
    #[arg(long, default_value = "2m")]
    pub budget: String,
    /// Search strategy: auto, exhaustive, halving, random.
    #[arg(long, default_value = "auto")]
    pub strategy: String,
    /// Prompt length the prefill kernels are tuned at.
    #[arg(long, default_value_t = 128)]
    pub prefill_tokens: usize,
    /// Context length (KV cache) the decode kernels are tuned at.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Decode tokens per prompt the end-to-end score assumes.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Storage type of the KV cache: f32, f16, or q8_0 (a head_dim of whole
    /// blocks of 32).
    #[arg(long, default_value = "f32", value_parser = kv_dtype)]
    pub kv_dtype: DType,
    /// Also write the profile here.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    /// Also write an HTML report (`ktune report`) beside the profile: the cached
    /// `<key>.html`, and with -o `<file>.html` beside that file.
    #[arg(long)]
    pub report: bool,
    /// Re-tune even when the cache has this profile.
    #[arg(long)]
    pub force: bool,
    /// The accuracy budget: the end-to-end stage measures each combination's KL
    /// divergence from the CPU's f32 reference (f32 activations, plain layouts) on
    /// fixed prompts and refuses one above this (nats per token). Default: the
    /// runtime default's own divergence × 1.25, at least 1e-4.
    #[arg(long, value_name = "NATS", value_parser = max_kld)]
    pub max_kld: Option<f64>,
    /// Tune for `serve --parallel` too: the kernels of a decode batch raced at
    /// each of these batch sizes (sequences decoded together; 1 is the decode
    /// regime, tuned anyway), the winners written as the profile's
    /// `serve.batches`. Alone: 1,2,4,8,16. On a GPU checked over the paged KV
    /// cache `serve --parallel` makes there.
    #[arg(long, value_name = "SIZES", num_args = 0..=1, require_equals = true, default_missing_value = "1,2,4,8,16", value_parser = batch_sizes)]
    pub serve_batches: Option<BatchSizes>,
    /// GPU: the L2 cache size (bytes; K, M, G suffixes: KiB, MiB, GiB) the slot
    /// races' rotating input copies must overflow (twice it in copies). Default:
    /// an estimate for the adapter's vendor and class.
    #[arg(long, value_name = "BYTES", value_parser = byte_size)]
    pub gpu_l2_bytes: Option<u64>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("mmproj", |a| a.requires("image")),
    mut_arg("weight_dtype", |a| a.help("Weight type of the default entry (default: the first profile's, else as `run`)")),
    mut_arg("trusted_shaders", |a| a.help("GPU: build shader modules without wgpu's runtime bounds checks (`create_shader_module_trusted`, unchecked; each kernel's host-side check already bounds its accesses) for every entry; a profile tuned with them uses them anyway. Faster on drivers that do not bound accesses natively")),
)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A profile to measure (repeatable); the first is the reference of the
    /// comparisons. Without one, the cached profile `run` would use is measured
    /// (when there is one) beside the runtime's default.
    #[arg(long, value_name = "FILE")]
    pub profile: Vec<std::path::PathBuf>,
    /// Do not look for a cached profile (measure only --profile files and the default).
    #[arg(long, conflicts_with = "profile")]
    pub no_profile: bool,
    /// Measure a cached profile only when it was tuned on this very device (exit 2
    /// when the cache has only one of the same class).
    #[arg(long, conflicts_with_all = ["profile", "no_profile"])]
    pub strict_device: bool,
    /// Leave out the runtime's default (measured last otherwise).
    #[arg(long)]
    pub no_default: bool,
    /// Prompt tokens of each prefill.
    #[arg(long, default_value_t = 64)]
    pub prefill_tokens: usize,
    /// Decode steps after each prefill (their median time per token is the decode sample).
    #[arg(long, default_value_t = 16)]
    pub decode_tokens: usize,
    /// Rounds; each times every entry once, in a rotating order.
    #[arg(long, default_value_t = 15)]
    pub rounds: usize,
    /// An image (PNG or JPEG) for a multimodal model: each round also times it
    /// through the vision tower and projector for every entry (the entry's
    /// `kernels.vision` choices, else the device's defaults), reported as
    /// milliseconds per image beside prefill and decode.
    #[arg(long, value_name = "FILE")]
    pub image: Option<std::path::PathBuf>,
    /// Also each entry's accuracy: its KL divergence, top-1 agreement and logit
    /// error against the CPU's f32 reference (f32 activations, plain layouts) on
    /// the benchmark's prompt (every position but the last scored), as `eval`
    /// computes them.
    #[arg(long)]
    pub kld: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// The reference `eval` compares with (`--reference`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReferenceArg {
    /// The CPU with f32 activations and plain weight layouts.
    F32,
    /// A logits file `--save-logits` wrote.
    File(PathBuf),
}

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("mmproj", |a| a.hide(true)),
    mut_arg("layers", |a| a.help("Keep only the first N layers (the figures are then of that cut model)")),
)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (UTF-8), tokenized with the model's tokenizer (the GGUF
    /// file's, or the directory's tokenizer.json) as llama-perplexity does: a BOS
    /// first where the vocabulary adds one.
    #[arg(long, value_name = "FILE")]
    pub file: PathBuf,
    /// Tokens per chunk; each chunk runs from an empty KV cache and its second
    /// half is scored. Default: 512, or the model's context when smaller.
    #[arg(long, value_name = "N")]
    pub ctx: Option<usize>,
    /// Score at most the first N chunks (default: every whole chunk of the text).
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// A profile (YAML) selecting the kernels to evaluate (default: the runtime's
    /// defaults, not a cached profile).
    #[arg(long, value_name = "FILE", conflicts_with = "exact")]
    pub profile: Option<PathBuf>,
    /// Evaluate the f32 reference itself (the CPU with f32 activations and the
    /// weights in their plain layouts): with --save-logits, a reference file for
    /// later runs.
    #[arg(long)]
    pub exact: bool,
    /// Compare with a reference: `f32` (the same model on the CPU with f32
    /// activations and plain layouts) or a logits FILE that --save-logits wrote
    /// (same text, --ctx and vocabulary).
    #[arg(long, value_name = "f32|FILE", value_parser = reference_arg, conflicts_with = "reference_device")]
    pub reference: Option<ReferenceArg>,
    /// Compare with the same model run on this device (the runtime's defaults
    /// there; the selector as --device takes it).
    #[arg(long, value_name = "DEVICE")]
    pub reference_device: Option<String>,
    /// Write the scored positions' log-probabilities (and the tokens) to FILE, a
    /// reference for `--reference FILE` and tools/kld_check.py.
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// How --save-logits stores the log-probabilities: f16 (half the size) or f32
    /// (exact: a reference read back gives the in-process figures bit for bit).
    #[arg(long, default_value = "f16", value_parser = logits_dtype)]
    pub logits_dtype: crate::eval::LogitsDtype,
    /// Storage type of the evaluated engine's KV cache without a profile (f32,
    /// f16 or q8_0, as llama-perplexity's -ctk/-ctv); the f32 reference keeps
    /// an f32 cache.
    #[arg(long, default_value = "f32", value_parser = kv_dtype, conflicts_with_all = ["exact", "profile"])]
    pub kv_dtype: DType,
    /// Same as --format json.
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

impl EvalArgs {
    /// The output format (`--json` or `--format`).
    pub fn output_format(&self) -> Format {
        if self.json { Format::Json } else { self.format }
    }
}

/// `--reference`: `f32`, or a file.
fn reference_arg(s: &str) -> Result<ReferenceArg, String> {
    match s {
        "" => Err("give `f32` or a logits file".into()),
        "f32" => Ok(ReferenceArg::F32),
        path => Ok(ReferenceArg::File(PathBuf::from(path))),
    }
}

/// `--max-kld`: a finite divergence, zero or more.
fn max_kld(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}`: give a KL divergence in nats, 0 or more (e.g. 0.005)")),
    }
}

/// `--serve-batches`' sizes, ascending, each once.
#[derive(Clone, Debug)]
pub struct BatchSizes(pub Vec<usize>);

/// `--serve-batches`: batch sizes, comma separated, each 1 to 4096.
fn batch_sizes(s: &str) -> Result<BatchSizes, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        match part.trim().parse::<usize>() {
            Ok(n) if (1..=*crate::profile::doc::BATCH_SIZES.end()).contains(&n) => v.push(n),
            _ => {
                return Err(format!(
                    "`{part}`: give batch sizes from 1 to {}, comma separated (e.g. 1,2,4,8,16)",
                    crate::profile::doc::BATCH_SIZES.end()
                ));
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    Ok(BatchSizes(v))
}

/// `--logits-dtype`: f32 or f16.
fn logits_dtype(s: &str) -> Result<crate::eval::LogitsDtype, String> {
    s.parse()
}

#[derive(clap::Args, Debug)]
pub struct BenchKernelsArgs {
    /// Built-in models whose shapes are measured, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = ["gemma3-1b".to_string(), "llama-3.2-1b".to_string()])]
    pub models: Vec<String>,
    /// Only these ops, comma separated (gemv, gemm, attention_decode, rms_norm, ...).
    #[arg(long, value_delimiter = ',')]
    pub op: Vec<String>,
    /// Only these kernels race, comma separated ids (`ktune kernels`); the shapes
    /// are those of their ops.
    #[arg(long, value_delimiter = ',')]
    pub kernel: Vec<String>,
    /// Each kernel at its default parameters only (no sweep), 32 prompt tokens
    /// and a 256-token context unless given.
    #[arg(long)]
    pub quick: bool,
    /// Prompt tokens of the prefill shapes (default 128; 32 with --quick).
    #[arg(long)]
    pub prefill_tokens: Option<usize>,
    /// Context (KV length) of the decode attention shape (default 1024; 256 with --quick).
    #[arg(long)]
    pub context: Option<usize>,
    /// Time for all the races together, e.g. 90s, 2m (each shape gets its share;
    /// every variant still gets one sample).
    #[arg(long, default_value = "2m", value_parser = duration)]
    pub budget: std::time::Duration,
    /// The GPU L2 cache size (bytes; K, M, G suffixes: KiB, MiB, GiB) the rotating
    /// input copies must overflow (twice it in copies). Default: an estimate for
    /// the adapter's vendor and class.
    #[arg(long, value_name = "BYTES", value_parser = byte_size)]
    pub gpu_l2_bytes: Option<u64>,
    /// Build shader modules without wgpu's runtime bounds checks
    /// (`create_shader_module_trusted`, unchecked).
    #[arg(long)]
    pub trusted_shaders: bool,
    /// Seed of the inputs and the races.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug)]
pub struct ProfilesArgs {
    #[command(subcommand)]
    pub action: ProfilesAction,
}

#[derive(Subcommand, Debug)]
pub enum ProfilesAction {
    /// Every cached profile.
    List {
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Print a cached profile (by key prefix or name) or a profile file.
    Show { profile: String },
    /// The cache directory, or the path of one cached profile.
    Path { profile: Option<String> },
    /// Remove every cached profile and measurement.
    Clear,
    /// Write the cached profiles (of one model, with --model) to a bundle
    /// (`.tar.zst`) that `profiles import` reads on another machine.
    Export {
        /// Only the profiles of this model: its name as `profiles list` shows it, or
        /// the last component of a model directory or GGUF file (`.gguf` optional).
        #[arg(long)]
        model: Option<String>,
        #[arg(short = 'o', long, value_name = "FILE")]
        output: std::path::PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Add the profiles of bundles to the cache (validated: manifest, checksums,
    /// schema, kernel set); a conflict keeps the better measured end-to-end time.
    Import {
        #[arg(required_unless_present = "shipped", value_name = "BUNDLE")]
        bundles: Vec<std::path::PathBuf>,
        /// Also import the profiles shipped in the repository's `profiles/` (built in).
        #[arg(long)]
        shipped: bool,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Merge bundles into one (conflicts resolved as `import` does).
    Merge {
        #[arg(required = true, value_name = "BUNDLE")]
        bundles: Vec<std::path::PathBuf>,
        #[arg(short = 'o', long, value_name = "FILE")]
        output: std::path::PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    Table,
    Markdown,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The reference profile.
    pub a: std::path::PathBuf,
    /// The new profile.
    pub b: std::path::PathBuf,
    /// Slowdown (percent) that counts as a regression when it is also beyond the noise.
    #[arg(long, default_value = "5", value_parser = percent)]
    pub threshold: f64,
    #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
    pub format: DiffFormat,
    /// Exit 1 when any choice changed, not only on a regression.
    #[arg(long)]
    pub fail_on_change: bool,
}

/// Where a model comes from: one of four flags ([`session::ModelSource`]; `--hf`
/// resolves to the GGUF file or model directory it downloads into the hub cache).
#[derive(clap::Args, Debug, Clone)]
#[group(id = "ModelSource", required = true, multiple = false)]
pub struct ModelSourceArgs {
    /// A built-in model with deterministic synthetic weights (for benchmarking):
    /// gemma3-1b, gemma3-4b, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen2.5-0.5b, qwen2.5-1.5b, smollm2-135m,
    /// qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-30b-a3b, smollm3-3b, mistral-7b, phi-4-mini, granite-3.3-2b, olmo2-1b.
    #[arg(long)]
    pub model: Option<String>,
    /// A Hugging Face model directory (config.json and safetensors weights).
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<std::path::PathBuf>,
    /// A GGUF file (llama.cpp's format; architectures llama, qwen2, qwen3,
    /// qwen3moe, smollm3, gemma3, phi3, granite, olmo2; tensors F32, F16, BF16 and
    /// ggml's block formats Q8_0 … Q6_K, IQ4_NL, IQ4_XS). Its tokenizer serves --prompt.
    #[arg(long, value_name = "FILE")]
    pub gguf: Option<std::path::PathBuf>,
    /// A model on the Hugging Face Hub: REPO[:QUANT_OR_FILE][@REVISION] (e.g.
    /// ggml-org/gemma-3-1b-it-GGUF:Q4_K_M; default the largest quant at or below
    /// Q4_K_M; a safetensors repository gives a model directory; a built-in model's
    /// name stands for its published GGUF repository). Downloaded once into the hub
    /// cache (HF_HOME, HF_HUB_CACHE; shared with Python's huggingface_hub), then used
    /// from there without the network; HF_TOKEN for gated repositories, HF_ENDPOINT,
    /// HF_HUB_OFFLINE=1.
    #[arg(long, value_name = "REPO[:QUANT_OR_FILE][@REVISION]")]
    pub hf: Option<String>,
}

impl ModelSourceArgs {
    /// The source the flags name (clap's group makes it exactly one); `--hf` is
    /// resolved here, downloading what the cache lacks, into the file or directory
    /// it names, so that everything after sees a local `--gguf` or `--model-dir`.
    pub fn source(&self) -> Result<session::ModelSource, SessionError> {
        if let Some(spec) = &self.hf {
            let r = crate::model::hub::Hub::from_env()
                .resolve(
                    &crate::model::hub::HubSpec::parse(spec).map_err(crate::model::ModelError::from)?,
                    false,
                    &output::Bars::download(),
                )
                .map_err(crate::model::ModelError::from)?;
            return Ok(if r.gguf { session::ModelSource::Gguf(r.path) } else { session::ModelSource::Dir(r.path) });
        }
        match (&self.model, &self.model_dir, &self.gguf) {
            (_, _, Some(file)) => Ok(session::ModelSource::Gguf(file.clone())),
            (Some(name), _, None) => Ok(session::ModelSource::Builtin(name.clone())),
            (None, Some(dir), None) => Ok(session::ModelSource::Dir(dir.clone())),
            (None, None, None) => Err(SessionError::Usage("give --model NAME, --model-dir DIR, --gguf FILE or --hf REPO".into())),
        }
    }
}

/// The flags `run`, `bench` and `tune` share: the model, its vision projector, the
/// layers kept, the weights' storage type, the synthetic weights' seed and trusted
/// shader modules. Flattened into each command's arguments; a command words the
/// help of a flag for what it does with it (`mut_arg`), else it reads as here.
/// [`ModelArgs::settings`] converts them into the one settings type.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    pub source: ModelSourceArgs,
    /// With --gguf and --image: the text model's vision projector file (llama.cpp's
    /// `mmproj-*.gguf`, projector type gemma3), the tower the image runs through.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// Keep only the first N layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Storage type of the matrix weights (the help lists the format list's names).
    #[arg(long, value_parser = weight_dtype, help = format!("Storage type of the matrix weights: f32, f16, or a block format ({}: quantized on load). Default f32; with --gguf, each matrix as the file stores it (f16 for F16/BF16). With a profile it must match the dtype the profile was tuned for", block_formats()))]
    pub weight_dtype: Option<DType>,
    /// Seed of the synthetic weights (--model).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// GPU: build shader modules without wgpu's runtime bounds checks
    /// (`create_shader_module_trusted`, unchecked; each kernel's host-side check
    /// already bounds its accesses); a profile tuned
    /// with them uses them anyway. Faster on drivers that do not bound accesses
    /// natively.
    #[arg(long)]
    pub trusted_shaders: bool,
}

impl ModelArgs {
    /// The settings these flags give.
    pub fn settings(&self) -> Result<ModelSettings, SessionError> {
        Ok(ModelSettings {
            source: self.source.source()?,
            mmproj: self.mmproj.clone(),
            layers: self.layers,
            weight_dtype: self.weight_dtype,
            seed: self.seed,
            trusted_shaders: self.trusted_shaders,
        })
    }
}

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("mmproj", |a| a.requires("image").help("With --gguf and --image: the vision projector file that belongs to the GGUF text model (llama.cpp's `mmproj-*.gguf`, from `convert_hf_to_gguf.py --mmproj`; projector type gemma3): the vision tower and projector the image runs through")),
    mut_arg("layers", |a| a.help("Keep only the first N layers (for quick checks on large models)")),
    mut_arg("seed", |a| a.help("Seed of the synthetic weights (--model) and of the sampler (--temperature > 0): the same seed, prompt and flags give the same tokens")),
    mut_arg("chat_template", |a| a.requires("chat").help("With --chat: a Jinja chat template file to use instead of the model's (a file without `tokenizer.chat_template`, or another format of turns)")),
)]
pub struct RunArgs {
    #[command(flatten)]
    pub generate: GenerateArgs,
    /// Prompt token ids, comma separated.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "prompt")]
    pub tokens: Vec<u32>,
    /// Prompt text, encoded with the model directory's tokenizer.json or the GGUF
    /// file's tokenizer (the generated ids are then decoded to text as well, and
    /// streamed as they are produced).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Give --prompt as one user turn of the model's chat template (the GGUF
    /// file's `tokenizer.chat_template`, or `chat_template` in the directory's
    /// tokenizer_config.json), with the assistant's generation prompt after it;
    /// generation also stops at the end-of-turn token.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// Tokens to generate after the prompt (fewer when an end-of-sequence token
    /// comes first).
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Write the prompt's logits (every position) and the generated ids as JSON.
    #[arg(long, value_name = "FILE")]
    pub dump_logits: Option<std::path::PathBuf>,
    /// An image (PNG or JPEG) for a multimodal model (a Gemma3ForConditionalGeneration
    /// directory, or a GGUF file with its --mmproj): run through its vision tower, its projected tokens take the
    /// place of the prompt's image tokens. With --tokens, give the ids expanded as
    /// transformers' processor does (start-of-image, the image token once per
    /// soft token, end-of-image); with --prompt, write `<start_of_image>` where the
    /// image goes.
    #[arg(long, value_name = "FILE")]
    pub image: Option<std::path::PathBuf>,
    /// With --image: the image's tokens attend causally, like text (transformers
    /// without `token_type_ids`), instead of to every token of the image, as
    /// Gemma 3's processor asks (its `token_type_ids`).
    #[arg(long, requires = "image")]
    pub causal_image: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

impl RunArgs {
    /// `run`'s settings: the sampler checked first, then the generator's flags.
    pub fn settings(&self) -> crate::Result<crate::generate::RunSettings> {
        let sampler = self.generate.sampler();
        crate::generate::check_sampling(&sampler)?;
        Ok(crate::generate::RunSettings {
            generator: self.generate.generator("run")?,
            sampler,
            ignore_eos: self.generate.sampling.ignore_eos,
            tokens: self.tokens.clone(),
            prompt: self.prompt.clone(),
            chat: self.chat,
            max_tokens: self.max_tokens,
            dump_logits: self.dump_logits.clone(),
            image: self.image.clone(),
            causal_image: self.causal_image,
        })
    }
}

/// What `run`, `chat` and `serve` generate with: the model source, how its
/// engine is built, and the sampler (each command words the help of a flag with
/// `mut_arg`).
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl GenerateArgs {
    /// The sampler's parameters these flags give (checked by the command).
    pub fn sampler(&self) -> SamplerParams {
        self.sampling.params(self.model.seed)
    }

    /// What generation (`command`: run, chat, serve) is built from (the
    /// engine's flags checked before `--hf` resolves).
    pub fn generator(&self, command: &'static str) -> crate::Result<crate::generate::GeneratorSettings> {
        let e = &self.engine;
        Ok(crate::generate::GeneratorSettings {
            choice: e.choice()?,
            model: self.model.settings()?,
            context: e.context,
            prefill_chunk: e.prefill_chunk,
            chat_template: e.chat_template.clone(),
            command,
            template_required: command == "chat",
            parallel: Some(1),
        })
    }
}

/// How an engine is built: the profile chosen (`--profile`, a cached one, or the
/// runtime's defaults and the flags that shape them), the KV cache, the prefill
/// passes, the GPU decode chain and the chat template (`run`, `chat`, `serve`;
/// a command words the help of a flag for what it does with it).
#[derive(clap::Args, Debug)]
pub struct EngineArgs {
    /// A profile (YAML) selecting the kernels. Without one, the best cached
    /// profile `ktune tune` wrote for this device and model is used (see "Which
    /// cached profile a run uses" in docs/profiles.md), else the runtime's defaults.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<std::path::PathBuf>,
    /// Use the runtime's defaults even when a cached profile fits.
    #[arg(long, conflicts_with = "profile")]
    pub no_profile: bool,
    /// Use only a cached profile tuned on this very device: exit 2 instead of
    /// falling back to one tuned on another device of the same class.
    #[arg(long, conflicts_with_all = ["profile", "no_profile"])]
    pub strict_device: bool,
    /// Context length the KV cache is sized for (default: prompt + max-tokens).
    #[arg(long)]
    pub context: Option<usize>,
    /// Most prompt tokens per prefill pass (longer prompts are processed in chunks).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Storage type of the KV cache: f32, f16, or q8_0 (a head_dim of whole
    /// blocks of 32). Without a profile; a cached profile is used only when it
    /// was tuned with this KV dtype.
    #[arg(long, default_value = "f32", value_parser = kv_dtype)]
    pub kv_dtype: DType,
    /// Fusions (without a profile): `all`, `none`, or a list of qkv, gate_up, qk_norm_rope, residual_norm, norm_matmul, qkv_rope_cache.
    #[arg(long, default_value = "all")]
    pub fusion: String,
    /// One submit per kernel instead of one per pass (GPU prefill and decode
    /// steps whose logits are read; a decode chain stays one submit; without a profile).
    #[arg(long)]
    pub no_batch: bool,
    /// GPU: decode steps chained in one submit, the token picked on the GPU and
    /// the next chain submitted before the host reads the last one's ids
    /// (1 to 64; default: the profile's `execution.decodeChain`, else 8). The
    /// ids are the same for every value.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=crate::profile::doc::MAX_CHAIN as i64))]
    pub decode_chain: Option<u32>,
    /// A Jinja chat template file to use instead of the model's (a file without
    /// `tokenizer.chat_template`, or another format of turns).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<std::path::PathBuf>,
}

/// The sampler's flags (`run`, `chat`, and `serve`'s defaults for requests that
/// do not set them).
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    /// Softmax temperature of the sampler; 0 (the default) is greedy decoding (the
    /// first most likely token). The sampler applies, in llama.cpp's order, the
    /// repeat penalty, top-k, top-p, min-p, the temperature, then draws with --seed.
    #[arg(long, default_value_t = SamplerParams::GREEDY.temperature, value_name = "T")]
    pub temperature: f32,
    /// With --temperature > 0: keep the K most likely tokens (0: off).
    #[arg(long, default_value_t = SamplerParams::GREEDY.top_k, value_name = "K")]
    pub top_k: u32,
    /// With --temperature > 0: keep the most likely tokens holding this share of
    /// the probability, in (0, 1] (1: off).
    #[arg(long, default_value_t = SamplerParams::GREEDY.top_p, value_name = "P")]
    pub top_p: f32,
    /// With --temperature > 0: keep tokens at least this fraction as likely as the
    /// most likely one, in [0, 1] (0: off).
    #[arg(long, default_value_t = SamplerParams::GREEDY.min_p, value_name = "P")]
    pub min_p: f32,
    /// Divide the positive logits (multiply the negative ones) of the ids among the
    /// last --repeat-last-n generated tokens by this, > 0 (1: off; greedy too).
    #[arg(long, default_value_t = SamplerParams::GREEDY.repeat_penalty, value_name = "X")]
    pub repeat_penalty: f32,
    /// How many of the last generated tokens --repeat-penalty looks at (0: off).
    #[arg(long, default_value_t = SamplerParams::GREEDY.repeat_last_n, value_name = "N")]
    pub repeat_last_n: u32,
    /// Generate --max-tokens tokens even past an end-of-sequence or end-of-turn token.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The sampler's parameters these flags give, drawing with `seed`.
    pub fn params(&self, seed: u64) -> SamplerParams {
        SamplerParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        }
    }
}

impl EngineArgs {
    /// How the profile is chosen (the `--fusion` list parsed: a usage error names it).
    pub fn choice(&self) -> crate::Result<crate::generate::ProfileChoice> {
        Ok(crate::generate::ProfileChoice {
            profile: self.profile.clone(),
            no_profile: self.no_profile,
            strict_device: self.strict_device,
            kv_dtype: self.kv_dtype,
            fusion: crate::generate::parse_fusion(&self.fusion)?,
            batch: !self.no_batch,
            decode_chain: self.decode_chain,
        })
    }
}

/// The context a long-lived engine (`chat`, `serve`) sizes its KV cache for.
const CONTEXT_HELP: &str = "Context length the KV cache is sized for (default: the model's max_position_embeddings, at most 4096)";

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("seed", |a| a.help("Seed of the synthetic weights (--model) and of the sampler (--temperature > 0)")),
    mut_arg("context", |a| a.help(CONTEXT_HELP)),
    mut_arg("mmproj", |a| a.hide(true)),
)]
pub struct ChatArgs {
    #[command(flatten)]
    pub generate: GenerateArgs,
    /// The system prompt the conversation starts with (`/system TEXT` changes it).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Most tokens of one reply.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Keep no line-editing history (by default in `chat_history.txt` under the cache directory).
    #[arg(long)]
    pub no_history: bool,
}

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("seed", |a| a.help("Seed of the synthetic weights (--model), and of the sampler for requests without `seed`")),
    mut_arg("context", |a| a.help(CONTEXT_HELP)),
    mut_arg("temperature", |a| a.help("Softmax temperature for requests without `temperature` (0: greedy)")),
    mut_arg("mmproj", |a| a.hide(true)),
)]
pub struct ServeArgs {
    #[command(flatten)]
    pub generate: GenerateArgs,
    /// Address to listen on (loopback by default: give 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the bound address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests that may wait behind the one being served; past it, 429.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub queue: usize,
    /// Requests generated at once: each in a sequence of its own (its KV
    /// cache, taking memory as it grows and kept after its request for the next
    /// one sharing its prefix), all advancing a token a step, so a request that
    /// comes starts at the next step instead of after the others' answers (on a
    /// GPU over one paged KV cache, decode steps not chained). Default on the
    /// CPU: the profile's largest tuned batch size (`tune --serve-batches`:
    /// `serve.batches`, `serve.minBatch`), else 1; on a GPU 1
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// With --parallel: KV-cache positions all sequences together may hold in
    /// memory (each request reserves its prompt and max_tokens; idle sequences'
    /// kept prefixes give theirs back first; a request that does not fit waits
    /// for a running one to end, one larger than the whole gets 400). 0: no limit
    #[arg(long, default_value_t = 0, value_name = "TOKENS")]
    pub kv_tokens: usize,
    /// With --parallel: prompt tokens prefilled between two decode steps (a
    /// long prompt is prefilled in chunks of this many, so the running
    /// sequences go on meanwhile)
    #[arg(long, default_value_t = 64, value_name = "TOKENS")]
    pub step_tokens: usize,
    /// Require `Authorization: Bearer KEY` on /v1/ requests (401 without it).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Largest request body in bytes; past it, 413.
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES")]
    pub max_body: usize,
    /// Tokens generated for a request without `max_tokens`.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// The model id /v1/models lists and responses name (default: the model's name).
    #[arg(long, value_name = "ID")]
    pub model_id: Option<String>,
    /// Connections served at once; past it a new connection gets 503 and is
    /// closed (default: half the soft limit of open files, 16 to 4096).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Seconds a request's head may take to arrive, counted from when the server
    /// waits for it: also how long a kept-alive connection may sit idle.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub header_timeout: u64,
    /// Seconds a request's body may take to arrive once its head has; past it, 408.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub body_timeout: u64,
    /// Seconds SIGINT/SIGTERM leaves the requests in flight to finish before the
    /// rest are dropped and the server exits.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub drain_timeout: u64,
}

#[derive(clap::Args, Debug)]
pub struct ListDevicesArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug)]
pub struct KernelsArgs {
    /// Run the parity check of every variant valid on the device; exit 1 if any fails.
    #[arg(long)]
    pub verify: bool,
    /// Only kernels of this op (e.g. gemv, attention_decode).
    #[arg(long)]
    pub op: Option<String>,
    /// Only this kernel id.
    #[arg(long)]
    pub kernel: Option<String>,
    /// With --verify: every combination of parameter values, not each value once.
    #[arg(long)]
    pub all_params: bool,
    /// With --verify on a GPU: check the variants built as trusted shader modules
    /// (`create_shader_module_trusted`, no runtime bounds checks).
    #[arg(long)]
    pub trusted_shaders: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

impl From<Format> for output::Format {
    fn from(f: Format) -> output::Format {
        match f {
            Format::Table => output::Format::Table,
            Format::Json => output::Format::Json,
        }
    }
}

impl From<DiffFormat> for output::Format {
    fn from(f: DiffFormat) -> output::Format {
        match f {
            DiffFormat::Table => output::Format::Table,
            DiffFormat::Markdown => output::Format::Markdown,
            DiffFormat::Json => output::Format::Json,
        }
    }
}

/// The block formats' names, for the `--weight-dtype` help.
fn block_formats() -> String {
    DType::QUANT.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}

/// `--weight-dtype`: any storage type.
fn weight_dtype(s: &str) -> Result<DType, String> {
    s.parse()
}

/// `--kv-dtype`: f32, f16 or q8_0 (the other block formats are for weights).
fn kv_dtype(s: &str) -> Result<DType, String> {
    let d: DType = s.parse()?;
    if d.is_quant() && d != DType::Q8_0 {
        return Err(format!("the KV cache is stored as f32, f16 or q8_0, not {d}; the other block formats are for --weight-dtype"));
    }
    Ok(d)
}

/// A percentage: `5`, `5%` or `2.5`.
pub fn percent(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%');
    t.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("`{s}` is not a percentage: give one such as 5 or 5%"))
}

/// The longest duration a flag takes, seconds: a week (budgets are minutes to hours).
const MAX_DURATION_S: f64 = 7.0 * 24.0 * 3600.0;

/// A duration: `90`, `90s`, `2m`, `1h30m`, `1.5m`; positive, at most a week.
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("`{s}`: give a duration such as 90s, 2m or 1h30m");
    let within = |secs: f64| {
        if secs > MAX_DURATION_S && secs.is_finite() {
            Err(format!("`{s}`: longer than a week ({MAX_DURATION_S} s), the longest ktune takes"))
        } else if secs > 0.0 && secs.is_finite() {
            Ok(std::time::Duration::from_secs_f64(secs))
        } else {
            Err(bad())
        }
    };
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return within(secs);
    }
    let mut total = 0.0;
    let mut num = String::new();
    for ch in t.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            num.push(ch);
        } else {
            let v: f64 = num.parse().map_err(|_| bad())?;
            num.clear();
            total += v * match ch {
                'h' => 3600.0,
                'm' => 60.0,
                's' => 1.0,
                _ => return Err(bad()),
            };
        }
    }
    if !num.is_empty() {
        return Err(bad());
    }
    within(total)
}

/// A size in bytes: an integer with an optional K, M or G suffix (KiB, MiB, GiB;
/// `KiB`/`MiB`/`GiB`/`KB`/`MB`/`GB` read alike), positive.
pub fn byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!("`{s}` is not a size in bytes: give a positive integer, optionally with K, M or G (e.g. 50M)"));
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("`{s}`: unknown unit `{other}`; allowed are K, M, G (KiB, MiB, GiB)")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{s}` is too large"))?;
    let bytes = n.checked_mul(1u64 << shift).ok_or_else(|| format!("`{s}` is too large"))?;
    if bytes == 0 {
        return Err("the size must be positive".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::{byte_size, duration, percent};

    /// `Duration::from_secs_f64` panics past u64 seconds: `1e30` once crashed `tune --budget`.
    #[test]
    fn durations_refuse_zero_junk_and_the_absurdly_long() {
        assert_eq!(duration("2m"), Ok(std::time::Duration::from_secs(120)));
        assert_eq!(duration("1h30m"), Ok(std::time::Duration::from_secs(5400)));
        for bad in ["0", "-5", "", "1e30", "1e400", "99999999999999999999h", "NaN", "inf", "5x"] {
            assert!(duration(bad).is_err(), "{bad} accepted");
        }
        assert!(duration("8d").is_err() && duration("200h").expect_err("too long").contains("a week"));
    }

    #[test]
    fn percentages_take_an_optional_sign_and_refuse_junk() {
        assert_eq!(percent("5"), Ok(5.0));
        assert_eq!(percent("2.5%"), Ok(2.5));
        for bad in ["five", "-1", "", "inf", "NaN%"] {
            assert!(percent(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn byte_sizes_take_suffixes_and_refuse_zero_negative_and_junk() {
        assert_eq!(byte_size("4096"), Ok(4096));
        assert_eq!(byte_size("50M"), Ok(50 << 20));
        assert_eq!(byte_size("2GiB"), Ok(2 << 30));
        assert_eq!(byte_size("64k"), Ok(64 << 10));
        for bad in ["0", "-5", "", "M", "12X", "99999999999999999999", "18446744073709551615G"] {
            assert!(byte_size(bad).is_err(), "{bad} accepted");
        }
    }
}
