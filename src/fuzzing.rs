//! The fuzz targets: each reader of untrusted input as one function of bytes,
//! run on an image in memory the way the command that reads it runs it. The
//! libFuzzer targets of `fuzz/` (cargo-fuzz), the stable smoke test
//! (`tests/it/fuzz_smoke.rs`) and the proptest mutation suite
//! (`tests/fuzz_readers.rs`) all call these, so each target is described once.
//!
//! A target returns how far its input got (the stage an error stopped it at, or
//! what it finished), for the tests' tallies; it must never panic, hang or
//! allocate far beyond its input. Inputs that carry two or more things (a
//! `config.json` and a safetensors file, a text and a GGUF vocabulary, a
//! template and its prompt, argv) hold them separated by NUL bytes, text parts
//! first: see each function.
//!
//! [`TARGETS`] lists them by the name `fuzz/fuzz_targets/NAME.rs`,
//! `fuzz/seeds/NAME/` and `fuzz/regressions/NAME/` use. `docs/fuzzing.md` says
//! how to run them.

use std::ffi::OsString;
use std::path::Path;
use std::sync::OnceLock;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::device::{CpuCaps, Device};
use crate::eval::LogitsReader;
use crate::eval::metrics::DivergenceSum;
use crate::kernels::quant::QFormat;
use crate::model::WeightFile;
use crate::model::gguf::GgufFile;
use crate::model::{ChatTemplate, ModelConfig, Stored, Tokenizer, Weights, builtin};
use crate::profile::{Profile, bundle};

/// A target: the input in, how far it got out.
pub type Target = fn(&[u8]) -> &'static str;

/// Every target by name, in the order the docs and tools list them.
pub const TARGETS: &[(&str, Target)] = &[
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("profile", profile),
    ("bundle", bundle),
    ("tokenizer", tokenizer),
    ("chat", chat),
    ("cli", cli),
    ("logits", logits),
];

/// `data` cut at its first `n - 1` NUL bytes into `n` parts (the missing ones
/// empty).
fn parts<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&data[..0]; N];
    let mut rest = data;
    for part in out.iter_mut().take(N - 1) {
        match rest.iter().position(|&b| b == 0) {
            Some(i) => {
                *part = &rest[..i];
                rest = &rest[i + 1..];
            }
            None => {
                *part = rest;
                rest = &rest[rest.len()..];
            }
        }
    }
    out[N - 1] = rest;
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `f` on a rayon pool of one thread: the readers' parallel loops then run
/// inline instead of handing each call to worker threads and waiting (a third of
/// the gguf target's time went to that handoff), and one input's work stays on
/// one core, as libFuzzer counts it.
fn one_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    match POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().ok()) {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// A GGUF file as `ktune run --gguf` reads it: header, metadata and tensor
/// infos, the model config from the metadata, the weights checked against it,
/// every tensor read as f32, a row of each, each matrix quantized to Q8_0 and
/// read in its stored block format; then its tokenizer (a text encoded, ids
/// decoded) and its chat template rendered.
pub fn gguf(data: &[u8]) -> &'static str {
    one_thread(|| gguf_model(data))
}

fn gguf_model(data: &[u8]) -> &'static str {
    let Ok(m) = Weights::gguf_from_bytes(Path::new("fuzz.gguf"), data.to_vec()) else { return "rejected" };
    let w = &m.weights;
    let checked = w.check_config(&m.config).is_ok();
    let names: Vec<String> = w.names().map(str::to_string).collect();
    for name in &names {
        let Ok(meta) = w.meta(name) else { continue };
        let _ = w.f32(name, &meta.shape);
        let _ = w.row_f32(name, 0);
        if meta.shape.len() == 2 {
            let _ = w.load_quant(name, QFormat::Q8_0);
            if let Ok(Stored::Quant(f)) = w.stored(name) {
                let _ = w.load_quant(name, f);
            }
        }
    }
    let tokenizer = vocabulary(&m.file, "The kernel reads 42 weights, 漢字 🦀.");
    let _ = template(&m.file, "Hi there");
    match (checked, tokenizer) {
        (true, true) => "loaded, tokenizer built",
        (true, false) => "loaded",
        (false, _) => "parsed, weights do not match the config",
    }
}

/// A GGUF vocabulary turned into a tokenizer, `text` encoded (with and without
/// the special tokens) and decoded, and ids past the vocabulary decoded;
/// whether the tokenizer was built.
///
/// On a thread of its own: the `tokenizers` crate (0.23.2) keeps each BPE
/// instance's word cache in a thread-local map keyed by the instance and never
/// removes a dropped instance's entry (`BPE_LOCAL_CACHE`, models/bpe/model.rs), so
/// building a tokenizer per input on one thread grew the fuzzers by ~1 KB an input
/// (2 GB and an out-of-memory stop after 3.8M inputs); the thread's exit frees it.
/// The CLI builds one tokenizer a process, and `serve` reuses its one (flat over
/// 10,000 encodes).
fn vocabulary(f: &GgufFile, text: &str) -> bool {
    std::thread::scope(|s| match s.spawn(|| vocabulary_here(f, text)).join() {
        Ok(built) => built,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

fn vocabulary_here(f: &GgufFile, text: &str) -> bool {
    let Ok(t) = Tokenizer::from_gguf(f) else { return false };
    for special in [true, false] {
        let ids = t.encode_with(text, special).unwrap_or_default();
        let _ = t.decode(&ids);
    }
    let n = u32::try_from(t.vocab_size()).unwrap_or(u32::MAX);
    let _ = t.decode(&[0, 1, 2, 3, n.saturating_sub(1), n, u32::MAX]);
    let _ = t.id_to_token(n.saturating_sub(1));
    true
}

/// A GGUF file's chat template rendered with `prompt` as the user turn; whether
/// it rendered.
fn template(f: &GgufFile, prompt: &str) -> bool {
    ChatTemplate::from_gguf(f).ok().flatten().is_some_and(|t| t.render_user(prompt).is_ok())
}

/// A Hugging Face model's `config.json` and a safetensors file, NUL between
/// them: the config parsed, the safetensors header and every tensor read (f32
/// and f16), and the tensors checked against the config (as `--model-dir`).
pub fn safetensors(data: &[u8]) -> &'static str {
    one_thread(|| safetensors_model(data))
}

fn safetensors_model(data: &[u8]) -> &'static str {
    let [config, file] = parts::<2>(data);
    let config = ModelConfig::parse_config_json(&text(config), Path::new("config.json")).ok();
    let Ok(mut w) = Weights::safetensors_from_bytes(Path::new("fuzz.safetensors"), file.to_vec()) else {
        return if config.is_some() { "config read, safetensors rejected" } else { "rejected" };
    };
    let names: Vec<String> = w.names().map(str::to_string).collect();
    for name in &names {
        if let Ok(meta) = w.meta(name) {
            let _ = w.f32(name, &meta.shape);
            let _ = w.f16(name, &meta.shape);
        }
    }
    match config {
        Some(c) if w.fit_config(&c.config).is_ok() => "config and weights match",
        Some(_) => "config read, weights do not match it",
        None => "safetensors read",
    }
}

/// The CPU this process runs on, detected once.
fn cpu() -> &'static Device {
    static CPU: OnceLock<Device> = OnceLock::new();
    CPU.get_or_init(|| Device::Cpu(CpuCaps::detect()))
}

/// A profile's YAML as `run --profile` loads it: parsed and validated (strictly,
/// and salvaging unknown kernels as a cached profile is), resolved for this CPU
/// and its model, and written back to YAML that must load again.
pub fn profile(data: &[u8]) -> &'static str {
    let text = text(data);
    let _ = Profile::from_str_salvaged(&text, "fuzz.yaml");
    let Ok(p) = Profile::from_str(&text, "fuzz.yaml") else { return "rejected" };
    let layers = builtin(&p.doc.model).map_or(4, |c| c.dims.num_layers);
    let resolved = p.resolve(cpu(), &p.doc.model, layers).is_ok();
    if let Ok(yaml) = p.to_yaml() {
        assert!(Profile::from_str(&yaml, "written.yaml").is_ok(), "a profile written back does not load:\n{yaml}");
    }
    if resolved { "valid, resolved" } else { "valid" }
}

/// A profile bundle (`.tar.zst`) as `profiles import` reads it: decompressed,
/// its tar entries and manifest read, each profile checked and validated, then
/// merged into one set as the cache merges them.
pub fn bundle(data: &[u8]) -> &'static str {
    let Ok((items, skipped)) = bundle::read_from(Path::new("fuzz.tar.zst"), data) else { return "rejected" };
    let mut set = bundle::Set::default();
    for item in items {
        let _ = set.add(item);
    }
    let _ = bundle::nothing_usable(&skipped);
    if skipped.is_empty() { "read" } else { "read, some skipped" }
}

/// A text, NUL, then a GGUF file holding a vocabulary (`tokenizer.ggml.*`): the
/// tokenizer built from the metadata (SentencePiece or byte-level BPE), the text
/// encoded and decoded, and the file's chat template rendered with the text as
/// the prompt.
pub fn tokenizer(data: &[u8]) -> &'static str {
    let [prompt, file] = parts::<2>(data);
    let prompt = text(prompt);
    let Ok(f) = GgufFile::parse(Path::new("fuzz.gguf"), file.to_vec()) else { return "rejected" };
    let rendered = template(&f, &prompt);
    match (vocabulary(&f, &prompt), rendered) {
        (true, true) => "vocabulary and template",
        (true, false) => "vocabulary",
        (false, _) => "parsed, vocabulary rejected",
    }
}

/// A chat template, its user prompt, the BOS and the EOS token texts, NUL
/// between each: the template rendered as `run --chat` renders it.
pub fn chat(data: &[u8]) -> &'static str {
    let [source, prompt, bos, eos] = parts::<4>(data);
    let t = ChatTemplate { source: text(source), bos_token: Some(text(bos)), eos_token: Some(text(eos)), path: "fuzz.jinja".into() };
    match t.render_user(&text(prompt)) {
        Ok(_) => "rendered",
        Err(_) => "refused",
    }
}

/// A command line, NUL between the arguments (after `ktune`): parsed by clap,
/// its error rendered, and the flags of a model command converted into their
/// settings and checked as the command checks them before loading anything.
pub fn cli(data: &[u8]) -> &'static str {
    cli_checked(data).unwrap_or_else(|refused| refused)
}

/// The flags `run`, `chat` and `serve` share, checked as they check them.
fn generated(g: &crate::cli::GenerateArgs) -> Result<Option<&crate::cli::ModelArgs>, &'static str> {
    if crate::generate::parse_fusion(&g.engine.fusion).is_err() || g.sampler().validate().is_err() {
        return Err("parsed, a flag refused");
    }
    Ok(Some(&g.model))
}

fn cli_checked(data: &[u8]) -> Result<&'static str, &'static str> {
    use std::os::unix::ffi::OsStrExt;
    let argv = std::iter::once(OsString::from("ktune")).chain(data.split(|&b| b == 0).map(|a| std::ffi::OsStr::from_bytes(a).to_owned()));
    let parsed = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.render().to_string();
            return Ok("refused");
        }
    };
    let model = match &parsed.command {
        Command::Run(args) => generated(&args.generate)?,
        Command::Chat(args) => generated(&args.generate)?,
        Command::Serve(args) => generated(&args.generate)?,
        Command::Tune(args) => Some(&args.model),
        Command::Bench(args) => Some(&args.model),
        Command::Eval(args) => {
            let _ = args.output_format();
            Some(&args.model)
        }
        _ => None,
    };
    Ok(match model.map(|m| m.settings()) {
        Some(Ok(_)) => "settings",
        Some(Err(_)) => "parsed, settings refused",
        None => "parsed",
    })
}

/// A saved logits file as `eval --reference FILE` reads it: the header checked
/// (each size within its limit, the length they add up to in checked arithmetic
/// against the input's), every chunk's token ids, then every row, each compared
/// with itself as the divergence is.
pub fn logits(data: &[u8]) -> &'static str {
    let Ok(mut r) = LogitsReader::from_reader(Path::new("fuzz.logits"), std::io::Cursor::new(data), data.len() as u64) else {
        return "rejected";
    };
    let mut ids = Vec::new();
    for _ in 0..r.header.chunks {
        if r.next_tokens(&mut ids).is_err() {
            return "header read, token ids cut";
        }
    }
    let (mut row, mut div) = (Vec::new(), DivergenceSum::default());
    for _ in 0..r.header.positions() {
        if r.next_row(&mut row).is_err() {
            return "token ids read, rows cut";
        }
        div.add(&row, &row);
    }
    let _ = div.finish();
    "read"
}
