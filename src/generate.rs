//! Text generation shared by `run`, `chat` and `serve`: a model source opened
//! ([`Source`]: its files checked, a GGUF file loaded first, the tokenizer) and
//! its chat template; one [`ProfileChoice::prepare`] from the loaded model to a
//! warmed engine: the kernel selection (`--profile`, else the cached profile
//! [`profile::lookup`] finds for this device and model, which `bench` measures
//! too, else the runtime's defaults), the engine with its pool and decode chain;
//! and the decode loop: ids from [`Engine::decode_chain`] turned into
//! text pieces streamed as they come (a cut UTF-8 character and text that may be
//! the start of a stop string held back), ending at an end-of-sequence id, a stop
//! string, the token limit, or a cancel flag checked every token. A
//! [`Generator`] holds one warmed engine for many prompts (chat turns, server
//! requests) and keeps its KV cache between them: a prompt that extends the last
//! one prefills only its new tokens, and the same prompt again samples from the
//! logits its prefill left (feeding its last token again would be a one-token
//! pass, whose arithmetic differs from the prefill's: the same request would
//! answer differently the second time).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::device::{Device, DeviceCaps};
use crate::gpu::GpuCtx;
use crate::kernels::DType;
use crate::kernels::sample::{SampleError, Sampler, SamplerParams};
use crate::model::{ChatTemplate, END_OF_TURN_TOKENS, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, Tokenizer};
use crate::plan::{Fusion, Selection};
use crate::profile::{ExecSettings, Profile, lookup};
use crate::report::StopReason;
use crate::runtime::Engine;
use crate::session::{self, Engines, LoadedModel, ModelSettings, ModelSource, load_gguf};
use crate::{Error, Result};

/// The sampler's parameters checked, a bad one a usage error naming its flag.
pub fn check_sampling(p: &SamplerParams) -> Result<()> {
    p.validate().map_err(|e| match e {
        SampleError::Param { name, value, rule } => Error::Usage(format!("--{} {value}: must be {rule}", name.replace('_', "-"))),
        other => Error::Usage(other.to_string()),
    })
}

/// Parses `--fusion`.
pub fn parse_fusion(s: &str) -> Result<Fusion> {
    match s {
        "all" => return Ok(Fusion::ALL),
        "none" => return Ok(Fusion::NONE),
        _ => {}
    }
    let mut f = Fusion::NONE;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some(flag) = Fusion::flag(part) else {
            let names: Vec<&str> = Fusion::FLAGS.iter().map(|f| f.name).collect();
            return Err(Error::Usage(format!("unknown fusion `{part}` (allowed: all, none, or a list of {})", names.join(", "))));
        };
        (flag.set)(&mut f, true);
    }
    Ok(f)
}

/// How a profile is chosen and what the runtime does without one (the engine
/// flags of `run`, `chat` and `serve`), and the GPU's decode chain.
#[derive(Clone, Debug)]
pub struct ProfileChoice {
    /// `--profile FILE`, read and validated before the model loads.
    pub profile: Option<PathBuf>,
    pub no_profile: bool,
    pub strict_device: bool,
    pub kv_dtype: DType,
    /// Without a profile: the fusions and GPU batching.
    pub fusion: Fusion,
    pub batch: bool,
    /// `--decode-chain`: GPU decode steps a submit, over the profile's.
    pub decode_chain: Option<u32>,
}

/// The kernels and execution settings an engine runs with, and where they came from.
pub struct Chosen {
    pub selection: Selection,
    pub exec: ExecSettings,
    /// The profile's file or cache label (None: the runtime's defaults).
    pub label: Option<String>,
}

/// What the passes of a generating engine hold.
#[derive(Clone, Copy, Debug)]
pub struct Passes {
    /// The KV cache's positions, and the flag that set them (for messages).
    pub context: usize,
    pub context_flag: &'static str,
    /// The prompt's length a cached profile is looked up for.
    pub prefill_tokens: usize,
    /// Most tokens of one prefill pass.
    pub max_tokens: usize,
    /// Every position's logits, not only the last.
    pub all_logits: bool,
    /// Sequences a decode batch holds (`serve --parallel`; 0 or 1: none; None:
    /// the profile's, [`Selection::serve_rows`](crate::plan::Selection::serve_rows)).
    pub batch_rows: Option<usize>,
}

/// A warmed engine with what it was chosen and built with.
pub struct Prepared {
    pub engine: Engine,
    /// The GPU context it runs on (None: the CPU), its shader modules as the
    /// execution asks.
    pub ctx: Option<Arc<GpuCtx>>,
    pub exec: ExecSettings,
    /// The profile's file or cache label (None: the runtime's defaults).
    pub label: Option<String>,
    /// GPU decode steps a submit ([`session::decode_chain`]).
    pub chain: usize,
}

impl ProfileChoice {
    /// No cached profile: the runtime's defaults (every fusion, batching, an f32
    /// KV cache), or the `--profile` a caller sets over it.
    pub fn uncached() -> ProfileChoice {
        ProfileChoice {
            profile: None,
            no_profile: true,
            strict_device: false,
            kv_dtype: DType::F32,
            fusion: Fusion::ALL,
            batch: true,
            decode_chain: None,
        }
    }

    /// The profile `--profile` names, read before anything heavy is built.
    pub fn read(&self) -> Result<Option<Profile>> {
        Ok(match &self.profile {
            Some(p) => Some(Profile::load(p)?),
            None => None,
        })
    }

    /// The engine that generates with `m` on `device`: the context checked
    /// against the model and the device; the kernels and execution settings of
    /// `profile` (as [`ProfileChoice::read`] read it), else of the best cached
    /// profile for this device, model, weights, KV cache, prefill length and
    /// context, else the runtime's defaults ([`ProfileChoice::choose`]); the
    /// plan's `passes`, built and warmed ([`Engines::build`]); its decode chain.
    /// Warnings are added to `warnings`.
    pub fn prepare(
        &self,
        profile: Option<Profile>,
        device: &Device,
        settings: &ModelSettings,
        m: &LoadedModel,
        passes: Passes,
        warnings: &mut Vec<String>,
    ) -> Result<Prepared> {
        let batches = passes.batch_rows.is_some_and(|r| r >= 2);
        session::check_context(&m.config, passes.context, self.kv_dtype, device, passes.context_flag)?;
        let Chosen { selection, mut exec, label } =
            self.choose(profile.as_ref(), device, settings, m, passes.prefill_tokens, passes.context, batches, warnings)?;
        if let Some(want) = settings.weight_dtype
            && want != exec.weight_dtype
        {
            return Err(Error::Usage(format!(
                "--weight-dtype {want} does not match the profile, which was tuned for {} weights (execution.weightDtype); \
                 its kernels and timings are for that storage type: tune a profile with --weight-dtype {want}, or drop the flag",
                exec.weight_dtype
            )));
        }
        let rows = passes.batch_rows.unwrap_or_else(|| selection.serve_rows()).min(passes.max_tokens);
        if rows >= 2 {
            // An engine of several sequences loads its matrices in the layouts
            // the profile gives a server (`serve.cpuRepack`), else in the
            // runtime's default for one (not the lone decode's layouts: on a
            // VNNI CPU a long-row model's plain rows, whose batches decode slower).
            exec.repack = match exec.batch_repack.clone() {
                Some(r) => r,
                None => settings.default_repack(device, m, exec.weight_dtype, true),
            };
        }
        let mut opts = settings.plan_options(m, &exec, passes.max_tokens, passes.context, passes.all_logits).with_batch_rows(rows);
        // Sequences of their own share one paged KV cache, which the fused QKV
        // kernel does not write (nor an image's tokens, which attend to each
        // other: a multimodal model's sequences keep caches of their own, on the
        // CPU only). On a GPU only when asked for (`serve --parallel`): its
        // passes then decode a token each, unchained.
        let asked = passes.batch_rows.is_some_and(|r| r >= 2);
        let paged = rows >= 2 && m.vision.is_none() && (matches!(device, Device::Cpu(_)) || asked);
        if paged {
            opts.fusion.qkv_rope_cache = false;
        }
        let ctx = session::open_device(device, exec.trusted_shaders)?;
        // One engine: its weights need no memo to share them.
        let mut engine = Engines::of(m, ctx.clone(), None).build(opts, selection, &exec)?;
        if paged {
            // Room for every row's sequence and the generator's own, each a whole
            // context (`serve --kv-tokens` sizes it again).
            warnings.extend(engine.enable_paged((rows + 1) * passes.context, rows + 1)?);
        }
        let chain = session::decode_chain(self.decode_chain, &exec);
        Ok(Prepared { engine, ctx, exec, label, chain })
    }

    /// What an engine runs: the kernels and execution settings of `profile` (as
    /// [`ProfileChoice::read`] read it; labelled with its file), else of the best
    /// cached profile for a prefill of `prefill_tokens` and a context of
    /// `context` (unless `no_profile`; labelled with its cache label), else the
    /// runtime's defaults ([`ProfileChoice::defaults`], no label; `batches`: for
    /// an engine that decodes several sequences a pass). The lookup's warnings
    /// and the profile's are added to `warnings`.
    #[allow(clippy::too_many_arguments)]
    pub fn choose(
        &self,
        profile: Option<&Profile>,
        device: &Device,
        settings: &ModelSettings,
        m: &LoadedModel,
        prefill_tokens: usize,
        context: usize,
        batches: bool,
        warnings: &mut Vec<String>,
    ) -> Result<Chosen> {
        let chosen = match profile {
            Some(p) => {
                let (selection, exec, w) = settings.resolve(p, device, m)?;
                warnings.extend(w);
                Some(Chosen { selection, exec, label: self.profile.as_ref().map(|p| p.display().to_string()) })
            }
            None if self.no_profile => None,
            None => {
                // The best cached profile (`lookup::find`: this device, model,
                // weights and KV cache, the prefill and context), resolved.
                let weight_dtype = settings.weight_dtype(m);
                let want = lookup::Want {
                    model: &settings.profile_name(m),
                    model_hash: settings.model_hash(m, weight_dtype),
                    weight_dtype,
                    kv_dtype: self.kv_dtype,
                    prefill_tokens,
                    context,
                    strict_device: self.strict_device,
                };
                let found = lookup::find(device, &want)?;
                warnings.extend(found.warnings);
                match found.found {
                    None => None,
                    Some(f) => {
                        let (selection, exec, mut w) = settings.resolve(&f.profile, device, m)?;
                        if f.by_class {
                            // The lookup's warning names both devices.
                            w.retain(|x| !x.contains("was tuned on another device"));
                        }
                        warnings.extend(w);
                        Some(Chosen { selection, exec, label: Some(f.label) })
                    }
                }
            }
        };
        let chosen = chosen.unwrap_or_else(|| self.defaults(device, settings, m, settings.weight_dtype(m), batches));
        // A profile's own KV cache type (execution.kvCacheDtype) checked as the flag's.
        let what = if chosen.label.is_some() { "the profile's execution.kvCacheDtype" } else { "--kv-dtype" };
        session::check_kv_dtype(&m.config, chosen.exec.kv_dtype, what)?;
        Ok(chosen)
    }

    /// The runtime's defaults on `device` for `weight_dtype` weights, with this
    /// choice's KV cache, batching and fusions (`batches`: for an engine that
    /// decodes several sequences a pass, `serve --parallel`).
    pub fn defaults(&self, device: &Device, settings: &ModelSettings, m: &LoadedModel, weight_dtype: DType, batches: bool) -> Chosen {
        Chosen {
            selection: Selection::runtime(DeviceCaps::from(device)),
            exec: settings.execution(device, m, weight_dtype, self.kv_dtype, self.batch, self.fusion, batches),
            label: None,
        }
    }
}

/// A model source opened for generation before the device is picked: a GGUF
/// file's model loaded already (its tokenizer is in the file, and its vision
/// projector's image tokens come from that vocabulary), and the tokenizer.
pub struct Source {
    gguf: Option<LoadedModel>,
    pub tokenizer: Option<Tokenizer>,
}

impl Source {
    /// Opens the source of `settings`: the files it names checked, a GGUF
    /// file's model loaded (with its `--mmproj`), the tokenizer. `needed` (the
    /// flag that needs a tokenizer, and what to do instead): without one, an
    /// error; otherwise a tokenizer that cannot be read costs only the decoded
    /// text (a warning).
    pub fn open(settings: &ModelSettings, needed: Option<(&str, &str)>, warnings: &mut Vec<String>) -> Result<Source> {
        let gguf = match (&settings.source, &settings.mmproj) {
            (ModelSource::Gguf(p), Some(mm)) => Some(session::load_gguf_mmproj(p, mm, settings.layers)?),
            (ModelSource::Gguf(p), None) => Some(load_gguf(p, settings.layers)?),
            _ => None,
        };
        let tokenizer = match &gguf {
            Some(m) => gguf_tokenizer(m, needed.is_some(), warnings)?,
            None => dir_tokenizer(settings, needed, warnings)?,
        };
        Ok(Source { gguf, tokenizer })
    }

    /// The GGUF file's model, for its tokenizer metadata and chat template.
    pub fn gguf(&self) -> Option<&LoadedModel> {
        self.gguf.as_ref()
    }

    /// The model: the GGUF file's, else the source's loaded now (cut to `--layers`).
    pub fn model(self, settings: &ModelSettings) -> Result<LoadedModel> {
        match self.gguf {
            Some(m) => Ok(m),
            None => Ok(settings.load_text()?),
        }
    }
}

/// The files a model source names checked before anything is read: `--gguf` a
/// regular file, `--mmproj` only with `--gguf` (clap's `requires` cannot name a
/// member of the model-source group) and a regular file.
pub fn check_source(settings: &ModelSettings) -> Result<()> {
    if let ModelSource::Gguf(p) = &settings.source {
        session::input_file("--gguf", p)?;
    }
    match (&settings.mmproj, &settings.source) {
        (Some(p), ModelSource::Builtin(_) | ModelSource::Dir(_)) => Err(session::mmproj_without_gguf(p).into()),
        (Some(p), ModelSource::Gguf(_)) => Ok(session::input_file("--mmproj", p)?),
        (None, _) => Ok(()),
    }
}

/// The GGUF file's tokenizer. `needed` (text in or out is the point): an error
/// when it cannot be built; otherwise that only costs the decoded text (a warning).
pub fn gguf_tokenizer(m: &LoadedModel, needed: bool, warnings: &mut Vec<String>) -> Result<Option<Tokenizer>> {
    let Some(file) = &m.gguf else { return Ok(None) };
    match Tokenizer::from_gguf(file) {
        Ok(t) => Ok(Some(t)),
        Err(e) if needed => Err(e.into()),
        Err(e) => {
            warnings.push(format!("no text output: {e}"));
            Ok(None)
        }
    }
}

/// The model directory's tokenizer, if it has one. `needed` (the flag that needs
/// it, and what to do instead): without a directory or a `tokenizer.json` in it,
/// that is a usage error; else a tokenizer that cannot be read only costs the
/// decoded text (a warning).
pub fn dir_tokenizer(settings: &ModelSettings, needed: Option<(&str, &str)>, warnings: &mut Vec<String>) -> Result<Option<Tokenizer>> {
    let dir = match &settings.source {
        ModelSource::Dir(dir) => dir,
        source => {
            if let Some((flag, instead)) = needed {
                let name = match source {
                    ModelSource::Builtin(name) => name.as_str(),
                    _ => "?",
                };
                let real = crate::model::builtin_repo(name).map_or(String::new(), |r| {
                    format!(", or run the published model instead of the synthetic weights: --hf {r}:{}", crate::model::hub::DEFAULT_QUANT)
                });
                return Err(Error::Usage(format!(
                    "{flag} needs a {TOKENIZER_FILE}, and the built-in model `{name}` (synthetic weights) has none; {instead}{real}"
                )));
            }
            return Ok(None);
        }
    };
    let path = dir.join(TOKENIZER_FILE);
    if !path.is_file() {
        if let Some((flag, instead)) = needed {
            return Err(Error::Usage(format!("{flag} needs the model's tokenizer, and {} does not exist; {instead}", path.display())));
        }
        return Ok(None);
    }
    match Tokenizer::from_file(&path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if needed.is_some() => Err(e.into()),
        Err(e) => {
            warnings.push(format!("no text output: {e}"));
            Ok(None)
        }
    }
}

/// The chat template: `file` (`--chat-template`), else the GGUF file's, else the
/// model directory's `tokenizer_config.json`'s. Without one, a usage error
/// (`flag` names the command's use of it).
pub fn chat_template(gguf: Option<&LoadedModel>, settings: &ModelSettings, file: Option<&Path>, flag: &str) -> Result<ChatTemplate> {
    let model_dir = match &settings.source {
        ModelSource::Dir(dir) => Some(dir),
        _ => None,
    };
    if let Some(path) = file {
        let gguf_file = gguf.and_then(|m| m.gguf.as_ref());
        let from_dir = match model_dir {
            Some(dir) => ChatTemplate::from_dir(dir)?.map(|t| (t.bos_token, t.eos_token)),
            None => None,
        };
        let (bos, eos) = gguf_file.map(|f| ChatTemplate::gguf_specials(f)).or(from_dir).unwrap_or((None, None));
        return Ok(ChatTemplate::from_file(path, bos, eos)?);
    }
    let (found, place) = match (gguf.and_then(|m| m.gguf.as_ref()), model_dir) {
        (Some(file), _) => (ChatTemplate::from_gguf(file)?, format!("{} (no `tokenizer.chat_template`)", file.path.display())),
        (None, Some(dir)) => (ChatTemplate::from_dir(dir)?, format!("{} (no `chat_template` in {TOKENIZER_CONFIG_FILE})", dir.display())),
        (None, None) => (None, "a built-in model".to_string()),
    };
    found.ok_or_else(|| {
        Error::Usage(format!(
            "{flag}: the model has no chat template: {place}; give one with --chat-template FILE.jinja{}",
            if flag == "--chat" { ", or use --prompt without --chat (the text as it is)" } else { "" }
        ))
    })
}

/// The ids that end generation: the config's end-of-sequence ids and, for chat
/// prompts, the vocabulary's end-of-turn tokens (Gemma, ChatML, Llama 3).
pub fn stop_ids(m: &LoadedModel, tokenizer: Option<&Tokenizer>, chat: bool) -> Vec<u32> {
    let mut ids = m.config.eos_token_ids.clone();
    if chat && let Some(tok) = tokenizer {
        ids.extend(END_OF_TURN_TOKENS.iter().filter_map(|t| tok.token_to_id(t)));
    }
    ids
}

/// When one generation ends, besides an end-of-sequence id.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    pub max_tokens: usize,
    /// Texts that end generation where they first appear (not part of the text).
    pub stop: Vec<String>,
    /// Go on past end-of-sequence ids (`--ignore-eos`).
    pub ignore_eos: bool,
}

/// What one decode produced.
#[derive(Clone, Debug)]
pub struct Decoded {
    /// Every id handed over, the stopping one included.
    pub generated: Vec<u32>,
    pub stop_reason: StopReason,
    /// The text (with a tokenizer), cut before a stop string.
    pub text: Option<String>,
    /// Tokens and seconds of the timed decode steps (the first step, which
    /// compiles the decode schedule, not counted).
    pub decode_tokens: usize,
    pub decode_seconds: f64,
    /// Every decode step (the first included).
    pub steps: usize,
}

/// The text of the ids so far, and how much of it went out.
#[derive(Default)]
struct TextSink {
    stop: Vec<String>,
    streamed: usize,
    /// Where a stop string was found (the text ends there).
    cut: Option<usize>,
    /// The text of the ids so far that later ids do not change ([`TextSink::grow`]).
    text: String,
    /// The ids from `window` on are decoded again with each new id: those
    /// before `read` gave `window_text`, the text's tail; those from `read`
    /// on have given no whole text yet.
    window: usize,
    read: usize,
    window_text: String,
    /// The tokenizer rewrote text a later id should only have extended: the
    /// whole ids are decoded with each new one from then on.
    whole: bool,
}

impl TextSink {
    fn new(stop: Vec<String>) -> TextSink {
        TextSink { stop, ..TextSink::default() }
    }

    /// The text of `generated` (the ids so far; the last one new) into
    /// `text`; false when the new id completes no text yet (a character cut
    /// between tokens, a run of byte pieces not yet ended). Decodes only a
    /// window, as `tokenizers`' `DecodeStream` does: the ids that gave the
    /// last whole piece and those after them (a decoder's first-token rules
    /// then apply alike to the window with and without the new ids, and the
    /// new text is what they add). Decoding every id again with each new one
    /// cost `O(n)` a token, a whole sequence `O(n²)` on the engine's thread
    /// while the pool waited. A tokenizer whose window's text does not begin
    /// with the window's earlier text (one that rewrites text behind it) is
    /// decoded whole from then on, as before.
    fn grow(&mut self, tok: &Tokenizer, generated: &[u32]) -> Result<bool> {
        // A run of byte-fallback pieces may still turn into U+FFFDs (all of it,
        // what looked whole included) until an id of another kind ends it.
        if generated.last().is_some_and(|&id| tok.is_byte_piece(id)) {
            return Ok(false);
        }
        if self.whole {
            self.text = tok.decode(generated)?;
            return Ok(!self.text.ends_with('\u{FFFD}'));
        }
        let now = tok.decode(&generated[self.window.min(generated.len())..])?;
        if now.len() <= self.window_text.len() || now.ends_with('\u{FFFD}') {
            return Ok(false);
        }
        if !now.starts_with(&self.window_text) {
            self.whole = true;
            return self.grow(tok, generated);
        }
        self.text.push_str(&now[self.window_text.len()..]);
        (self.window, self.read) = (self.read, generated.len());
        self.window_text = tok.decode(&generated[self.window..self.read])?;
        Ok(true)
    }

    /// Streams what of `generated`'s text is final: not a cut character, not text
    /// a later token may rewrite, not the start of a stop string. Returns false
    /// when a stop string appeared or `stream` refused the piece.
    fn push(&mut self, tokenizer: Option<&Tokenizer>, generated: &[u32], stream: &mut dyn FnMut(&str) -> bool) -> Result<bool> {
        let Some(tok) = tokenizer else { return Ok(true) };
        if !self.grow(tok, generated)? {
            return Ok(true);
        }
        let text = std::mem::take(&mut self.text);
        let on = self.scan(&text, stream);
        self.text = text;
        Ok(on)
    }

    /// [`TextSink::push`]'s look at the text so far.
    fn scan(&mut self, text: &str, stream: &mut dyn FnMut(&str) -> bool) -> bool {
        if text.len() < self.streamed || !text.is_char_boundary(self.streamed) {
            return true;
        }
        // A stop string anywhere past what went out (it may start inside held text).
        let from = text.floor_char_boundary(self.streamed.saturating_sub(self.stop.iter().map(String::len).max().unwrap_or(0)));
        if let Some(at) = self.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i)).min() {
            let at = at.max(self.streamed);
            self.cut = Some(at);
            self.emit(text, at, stream);
            return false;
        }
        // Hold back a suffix that is the start of a stop string.
        let held = self
            .stop
            .iter()
            .filter_map(|s| (1..s.len()).rev().find(|&n| s.is_char_boundary(n) && text.ends_with(&s[..n])))
            .max()
            .unwrap_or(0);
        let end = text.floor_char_boundary(text.len() - held).max(self.streamed);
        self.emit(text, end, stream)
    }

    fn emit(&mut self, text: &str, end: usize, stream: &mut dyn FnMut(&str) -> bool) -> bool {
        if end > self.streamed {
            let ok = stream(&text[self.streamed..end]);
            self.streamed = end;
            return ok;
        }
        true
    }

    /// The whole text, the held-back rest streamed (a character still cut at the end goes out as it is).
    fn finish(&mut self, tokenizer: Option<&Tokenizer>, generated: &[u32], stream: &mut dyn FnMut(&str) -> bool) -> Result<Option<String>> {
        let Some(tok) = tokenizer else { return Ok(None) };
        let mut text = tok.decode(generated)?;
        if let Some(at) = self.cut {
            text.truncate(at);
        } else if text.len() > self.streamed && text.is_char_boundary(self.streamed) {
            stream(&text[self.streamed..]);
        }
        Ok(Some(text))
    }
}

/// One generation's ids as they come ([`Stepper::keep`]): kept, their text
/// streamed, and whether generation goes on (an end-of-sequence id, a stop
/// string, the token limit, a cancel). [`decode`] feeds it from a decode chain,
/// `serve`'s sequences a step at a time.
pub struct Stepper {
    sink: TextSink,
    pub generated: Vec<u32>,
    pub stop_reason: StopReason,
    failed: Option<Error>,
    max_tokens: usize,
    ignore_eos: bool,
}

impl Stepper {
    pub fn new(limits: &Limits) -> Stepper {
        Stepper {
            sink: TextSink::new(limits.stop.clone()),
            generated: Vec::new(),
            stop_reason: StopReason::MaxTokens,
            failed: None,
            max_tokens: limits.max_tokens,
            ignore_eos: limits.ignore_eos,
        }
    }

    /// Keeps `id`, streams its text; whether generation goes on.
    pub fn keep(
        &mut self,
        id: u32,
        tokenizer: Option<&Tokenizer>,
        stop_ids: &[u32],
        cancel: Option<&AtomicBool>,
        stream: &mut dyn FnMut(&str) -> bool,
    ) -> bool {
        self.generated.push(id);
        match self.sink.push(tokenizer, &self.generated, stream) {
            Ok(true) => {}
            Ok(false) => {
                self.stop_reason = if self.sink.cut.is_some() { StopReason::Stop } else { StopReason::Cancelled };
                return false;
            }
            Err(e) => {
                self.failed = Some(e);
                return false;
            }
        }
        if !self.ignore_eos && stop_ids.contains(&id) {
            self.stop_reason = StopReason::Eos;
            return false;
        }
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            self.stop_reason = StopReason::Cancelled;
            return false;
        }
        self.generated.len() < self.max_tokens
    }

    /// The ids, why they ended and the text (the held-back rest streamed); the
    /// error a piece of text met, if one did.
    pub fn finish(
        mut self,
        tokenizer: Option<&Tokenizer>,
        stream: &mut dyn FnMut(&str) -> bool,
    ) -> Result<(Vec<u32>, StopReason, Option<String>)> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let text = self.sink.finish(tokenizer, &self.generated, stream)?;
        Ok((self.generated, self.stop_reason, text))
    }
}

/// Where a decode's text goes and what ends it: the [`Limits`], a flag another
/// thread may set to cancel, and the stream each text piece is handed to (which
/// returns false to cancel).
pub struct Output<'a> {
    pub limits: &'a Limits,
    pub cancel: Option<&'a AtomicBool>,
    pub stream: &'a mut dyn FnMut(&str) -> bool,
}

/// Decodes from `first` (sampled from the prompt's last logits, not yet fed):
/// each id kept, its text streamed to `out.stream`, until an id of `stop_ids`
/// (unless `limits.ignore_eos`), a stop string, `limits.max_tokens`, or a cancel.
/// `k`: decode steps chained a submit on a GPU.
pub fn decode(
    engine: &mut Engine,
    sampler: &mut Sampler,
    first: u32,
    tokenizer: Option<&Tokenizer>,
    stop_ids: &[u32],
    k: usize,
    out: Output<'_>,
) -> Result<Decoded> {
    let Output { limits, cancel, stream } = out;
    let mut st = Stepper::new(limits);
    // Decode, timed from the first step's id: that step compiles the decode
    // schedule and on a GPU is the profiled one, so it is not counted.
    let mut timed: Option<(Instant, usize)> = None;
    let mut decode_seconds = 0.0;
    if limits.max_tokens > 0 && st.keep(first, tokenizer, stop_ids, cancel, stream) {
        engine.profile_next();
        engine.decode_chain(first, limits.max_tokens - 1, k, sampler, |id| {
            let t = timed.get_or_insert_with(|| (Instant::now(), 0));
            t.1 += 1;
            decode_seconds = t.0.elapsed().as_secs_f64();
            st.keep(id, tokenizer, stop_ids, cancel, stream)
        })?;
    }
    let (generated, stop_reason, text) = st.finish(tokenizer, stream)?;
    Ok(Decoded {
        generated,
        stop_reason,
        text,
        decode_tokens: timed.map_or(0, |(_, n)| n.saturating_sub(1)),
        decode_seconds,
        steps: timed.map_or(0, |(_, n)| n),
    })
}

/// What `run` generates from: the generator, the sampler (checked), the prompt
/// (ids, or text given as a chat turn or not), how many tokens, an image, and where
/// the logits go (`cli.rs` converts `run`'s flags into it whole).
#[derive(Debug)]
pub struct RunSettings {
    pub generator: GeneratorSettings,
    pub sampler: crate::kernels::sample::SamplerParams,
    pub ignore_eos: bool,
    /// `--tokens` (empty: `--prompt`).
    pub tokens: Vec<u32>,
    pub prompt: Option<String>,
    /// `--prompt` as one user turn of the chat template.
    pub chat: bool,
    pub max_tokens: usize,
    pub dump_logits: Option<PathBuf>,
    pub image: Option<PathBuf>,
    /// The image's tokens attend causally (not to the whole image).
    pub causal_image: bool,
}

/// What generation is built from (the flags `run`, `chat` and `serve` share;
/// `command`, `template_required` and the context's default are a
/// [`Generator`]'s).
#[derive(Clone, Debug)]
pub struct GeneratorSettings {
    pub model: ModelSettings,
    pub choice: ProfileChoice,
    /// The KV cache's positions (None: the model's, at most [`DEFAULT_CONTEXT`]).
    pub context: Option<usize>,
    pub prefill_chunk: usize,
    pub chat_template: Option<PathBuf>,
    /// The command (for messages).
    pub command: &'static str,
    /// Without a chat template: an error (chat), or a generator that renders no
    /// messages (serve: its completions need none).
    pub template_required: bool,
    /// Sequences decoded at once (`serve --parallel`; 1: one; None: the
    /// profile's batch sizes say, else one).
    pub parallel: Option<usize>,
}

/// The context a generator sizes its KV cache for without `--context`.
pub const DEFAULT_CONTEXT: usize = 4096;

/// What turns a request's text or chat turns into its prompt's tokens: a
/// [`Generator`]'s tokenizer and chat template, which a server clones so that
/// its requests are tokenized on their own threads (a megabyte of text is a
/// good part of a second of tokenizing, which on the engine's thread held up
/// every sequence it was decoding).
#[derive(Clone)]
pub struct Prompter {
    pub tokenizer: Tokenizer,
    /// The chat template, or why there is none.
    template: std::result::Result<ChatTemplate, String>,
}

impl Prompter {
    /// The chat template's prompt for `turns` (`(role, content)`), as tokens.
    pub fn render(&self, turns: &[(&str, &str)]) -> Result<Vec<u32>> {
        let t = self.template.as_ref().map_err(|e| Error::Usage(e.clone()))?;
        self.encode(&t.render_messages(turns)?, true)
    }

    /// `text` as tokens, special tokens written by the text itself (a rendered
    /// chat template) when `template`, else as the tokenizer's post-processor adds them.
    pub fn encode(&self, text: &str, template: bool) -> Result<Vec<u32>> {
        Ok(if template { self.tokenizer.encode_with(text, false)? } else { self.tokenizer.encode(text)? })
    }
}

/// One completion of a [`Generator`].
#[derive(Clone, Debug)]
pub struct Completion {
    pub decoded: Decoded,
    pub prompt_tokens: usize,
    /// Prompt tokens prefilled (the rest were in the KV cache already).
    pub prefilled: usize,
    pub prefill_seconds: f64,
}

/// A sequence of a [`Generator`] while another runs: its KV cache, the ids it
/// holds and its last prompt's logits ([`Generator::swap_slot`]).
pub struct Slot {
    kv: crate::runtime::SeqKv,
    cached: Vec<u32>,
    prefilled: usize,
    prompt_logits: Option<(usize, Vec<f32>)>,
}

impl Slot {
    /// The ids its KV cache holds.
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// Positions its KV cache was written up to (what it holds of memory).
    pub fn kv_written(&self) -> usize {
        self.kv.written()
    }

    /// Its KV cache (what it holds of a paged cache's blocks: [`SeqKv::claim`]).
    pub fn kv(&self) -> &crate::runtime::SeqKv {
        &self.kv
    }

    /// Empties it, its KV memory handed back.
    pub fn release(&mut self) {
        self.kv.release();
        self.cached.clear();
        self.prefilled = 0;
        self.prompt_logits = None;
    }
}

/// A generation [`Generator::start`]ed and going a step at a time.
pub struct Running {
    prompt: Vec<u32>,
    prefilled: usize,
    prefill_seconds: f64,
    sampler: Sampler,
    stepper: Stepper,
    /// The last id kept (fed at the next step).
    next: u32,
    going: bool,
    decode_start: Instant,
    steps: usize,
    /// Prompt tokens computed so far, and how many a step may add.
    at: usize,
    budget: usize,
    /// Its prompt not yet all computed (no id sampled yet).
    prefilling: bool,
}

impl Running {
    /// Whether it goes on (its prompt still being prefilled, or no end met yet).
    pub fn going(&self) -> bool {
        self.prefilling || self.going
    }

    /// Whether its prompt is still being prefilled (it decodes after).
    pub fn prefilling(&self) -> bool {
        self.prefilling
    }

    /// Its prompt.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Its prompt's tokens in the KV cache so far (computed or reused).
    pub fn computed(&self) -> usize {
        self.at
    }

    /// Ids generated so far.
    pub fn generated(&self) -> usize {
        self.stepper.generated.len()
    }
}

/// A warmed engine with its tokenizer and chat template, for many prompts.
pub struct Generator {
    pub engine: Engine,
    /// The tokenizer and the chat template (a server clones it for its
    /// requests' threads).
    pub prompter: Prompter,
    /// End-of-sequence and end-of-turn ids.
    pub stop_ids: Vec<u32>,
    /// The model's name (its file stem for a GGUF file).
    pub model: String,
    pub device: String,
    pub profile: Option<String>,
    pub context: usize,
    /// GPU decode steps a submit.
    pub chain: usize,
    pub warnings: Vec<String>,
    /// The ids in the KV cache, in order (its first `engine.pos`).
    cached: Vec<u32>,
    /// How many of the cached positions a prefill computed (a prompt's tokens,
    /// in passes of two tokens or more): the ones a later prompt may reuse. The
    /// generated tokens after them were computed one a step by the decode
    /// kernels, whose arithmetic differs (int8 activations round differently
    /// downstream), so a prompt that repeats them computes them again, as it
    /// would on an empty cache.
    prefilled: usize,
    /// The last prompt's length and the logits its last token gave, for a
    /// repeat of that prompt.
    prompt_logits: Option<(usize, Vec<f32>)>,
}

impl Generator {
    /// Loads the model on the device `selector` names and builds its engine with
    /// the chosen profile's kernels.
    pub fn open(selector: Option<&str>, s: &GeneratorSettings) -> Result<Generator> {
        if let Some(p) = &s.model.mmproj {
            return Err(Error::Usage(format!("--mmproj {}: {} takes no images; drop the flag", p.display(), s.command)));
        }
        check_source(&s.model)?;
        let mut warnings = Vec::new();
        let instead = "give a model with a tokenizer (--gguf FILE, or --model-dir DIR with a tokenizer.json)";
        let mut source = Source::open(&s.model, Some((s.command, instead)), &mut warnings)?;
        let profile = s.choice.read()?;
        let device = session::pick_device(selector)?;
        let Some(tokenizer) = source.tokenizer.take() else {
            return Err(Error::Usage(format!("{} needs the model's tokenizer", s.command)));
        };
        let template = match chat_template(source.gguf(), &s.model, s.chat_template.as_deref(), s.command) {
            Ok(t) => Ok(t),
            Err(e) if !s.template_required => {
                warnings.push(format!("{e}: chat messages are refused"));
                Err(e.to_string())
            }
            Err(e) => return Err(e),
        };
        let m = source.model(&s.model)?;
        warnings.extend(m.warnings.iter().cloned());
        let max_position = m.config.max_position_embeddings;
        let context = s.context.unwrap_or(max_position.min(DEFAULT_CONTEXT));
        if context < 2 || context > max_position {
            return Err(Error::Usage(format!(
                "--context {context}: must be 2 to the model's {max_position} positions (max_position_embeddings)"
            )));
        }
        let chunk = s.prefill_chunk.clamp(1, context);
        let passes = Passes {
            context,
            context_flag: "--context",
            prefill_tokens: chunk,
            max_tokens: chunk,
            all_logits: false,
            batch_rows: s.parallel.map(|p| p.min(chunk)),
        };
        let p = s.choice.prepare(profile, &device, &s.model, &m, passes, &mut warnings)?;
        warnings.extend(p.engine.warnings());
        Ok(Generator {
            engine: p.engine,
            stop_ids: stop_ids(&m, Some(&tokenizer), true),
            prompter: Prompter { tokenizer, template },
            model: match &s.model.source {
                ModelSource::Gguf(path) => path.file_stem().map_or_else(|| m.name.clone(), |f| f.to_string_lossy().into_owned()),
                _ => m.name.clone(),
            },
            device: device.name(),
            profile: p.label,
            context,
            chain: p.chain,
            warnings,
            cached: Vec::new(),
            prefilled: 0,
            prompt_logits: None,
        })
    }

    /// Tokens left for generation after a prompt of `prompt` tokens.
    pub fn room(&self, prompt: usize) -> usize {
        self.context.saturating_sub(prompt)
    }

    /// Forgets the KV cache.
    pub fn reset(&mut self) {
        self.cached.clear();
        self.prefilled = 0;
        self.prompt_logits = None;
        self.engine.reset();
    }

    /// Generates after `prompt`: the prompt's tokens past what the KV cache holds
    /// of it are prefilled, then [`decode`] with `params` into `out` (its
    /// `max_tokens` cut to the context left).
    pub fn complete(&mut self, prompt: &[u32], params: SamplerParams, out: Output<'_>) -> Result<Completion> {
        let Output { limits, cancel, stream } = out;
        let (limits, same) = self.prefill(prompt, limits)?;
        let t0 = Instant::now();
        let mut sampler = Sampler::new(params);
        let result = self.prompt_first(prompt, same, &mut sampler).and_then(|first| {
            let prefill_seconds = t0.elapsed().as_secs_f64();
            let out = Output { limits: &limits, cancel, stream };
            let decoded = decode(&mut self.engine, &mut sampler, first, Some(&self.prompter.tokenizer), &self.stop_ids, self.chain, out)?;
            Ok((prefill_seconds, decoded))
        });
        match result {
            Ok((prefill_seconds, decoded)) => {
                self.settle(prompt, &decoded.generated);
                Ok(Completion { decoded, prompt_tokens: prompt.len(), prefilled: prompt.len() - same, prefill_seconds })
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    /// A prompt checked and its reused prefix chosen: the limits cut to the
    /// context left and how many of its tokens the KV cache holds (the engine
    /// moved there).
    fn prefill(&mut self, prompt: &[u32], limits: &Limits) -> Result<(Limits, usize)> {
        if prompt.is_empty() {
            return Err(Error::Usage("the prompt encodes to no tokens".into()));
        }
        if prompt.len() >= self.context {
            return Err(Error::Usage(format!(
                "the prompt is {} tokens and the context holds {}: shorten it, or raise --context",
                prompt.len(),
                self.context
            )));
        }
        let vocab = self.engine.plan.config.dims.vocab_size;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Usage(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        // Reuse the cached prefix a prefill computed: the same prompt again takes
        // the logits its prefill left; otherwise at least the last two prompt
        // tokens are fed again (a prompt of one token: that one), for the last
        // one's logits from a pass of the prefill kernels, as on an empty cache
        // ([`crate::runtime::prefill_passes`]): what a request answers does not
        // depend on what the cache held.
        let common = self.cached.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let repeat = common == prompt.len() && self.prompt_logits.as_ref().is_some_and(|(n, _)| *n == prompt.len());
        let same = if repeat { prompt.len() } else { common.min(self.prefilled).min(prompt.len().saturating_sub(2)) };
        if !repeat {
            self.prompt_logits = None;
        }
        self.engine.pos = same;
        self.cached.truncate(same);
        let mut limits = limits.clone();
        limits.max_tokens = limits.max_tokens.min(self.room(prompt.len()));
        Ok((limits, same))
    }

    /// The prompt's tokens past `same` run (or the logits a repeat's prefill
    /// left, kept for a repeat): the first id `sampler` picks from its last
    /// token's logits.
    fn prompt_first(&mut self, prompt: &[u32], same: usize, sampler: &mut Sampler) -> Result<u32> {
        if self.prompt_logits.is_none() {
            let last = self.engine.forward(&prompt[same..])?.pop().unwrap_or_default();
            self.prompt_logits = Some((prompt.len(), last));
        }
        Ok(sampler.sample(self.prompt_logits.as_ref().map(|(_, l)| l.as_slice()).unwrap_or_default()))
    }

    /// What the KV cache holds after a generation from `prompt`.
    fn settle(&mut self, prompt: &[u32], generated: &[u32]) {
        let pos = self.engine.pos;
        self.cached = prompt.iter().chain(generated).copied().take(pos).collect();
        // A prompt of one token ran the decode kernels.
        self.prefilled = if prompt.len() >= 2 { prompt.len() } else { 0 };
    }

    /// The most sequences one decode batch holds ([`Generator::advance_batch`]).
    pub fn batch_rows(&self) -> usize {
        self.engine.plan.options.batch_rows
    }

    /// A sequence of its own ([`Generator::swap_slot`]), its KV cache empty
    /// (CPU engines).
    pub fn new_slot(&self) -> Result<Slot> {
        Ok(Slot { kv: self.engine.new_sequence()?, cached: Vec::new(), prefilled: 0, prompt_logits: None })
    }

    /// How many tokens of `prompt` `slot`'s cache holds that a prefill computed
    /// (what a request may reuse from it, [`Generator::start`]'s rule).
    pub fn reusable(slot: &Slot, prompt: &[u32]) -> usize {
        slot.cached.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(slot.prefilled)
    }

    /// `dst` given the first `n` tokens `src` holds (computed by a prefill:
    /// at most [`Generator::reusable`]), copied, not computed again: a system
    /// prompt one sequence prefilled serves the next that starts with it.
    pub fn share_prefix(&self, dst: &mut Slot, src: &Slot, n: usize) -> Result<()> {
        let n = n.min(src.prefilled).min(src.cached.len());
        self.engine.copy_prefix(&mut dst.kv, &src.kv, n)?;
        dst.cached = src.cached[..n].to_vec();
        dst.prefilled = n;
        dst.prompt_logits = None;
        Ok(())
    }

    /// Swaps the sequence the generator runs (its KV cache, the ids it holds and
    /// the last prompt's logits) with `slot`'s: many sequences share the engine,
    /// each swapped in for its step.
    pub fn swap_slot(&mut self, slot: &mut Slot) -> Result<()> {
        self.engine.swap_sequence(&mut slot.kv)?;
        std::mem::swap(&mut self.cached, &mut slot.cached);
        std::mem::swap(&mut self.prefilled, &mut slot.prefilled);
        std::mem::swap(&mut self.prompt_logits, &mut slot.prompt_logits);
        Ok(())
    }

    /// Starts a generation a step at a time ([`Generator::advance`]): the prompt
    /// past its reused prefix prefilled, `budget` tokens a step (the first chunk
    /// now: a long prompt does not hold other sequences up for all of it), then
    /// the first id sampled and kept, as [`Generator::complete`] does; `stream`
    /// gets its text. The chunks never leave one token alone, and the prefill's
    /// values do not depend on where a chunk ends: the same logits as one pass.
    pub fn start(
        &mut self,
        prompt: &[u32],
        params: SamplerParams,
        limits: &Limits,
        budget: usize,
        stream: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Running> {
        let mut run = self.start_later(prompt, params, limits, budget)?;
        self.prefill_step(&mut run, stream)?;
        Ok(run)
    }

    /// [`Generator::start`] with nothing computed yet: its prompt's first chunk
    /// waits for the next step ([`Generator::advance`], or a batch step that
    /// runs it in the others' decode pass, [`Generator::advance_batch`]; a
    /// repeat of the last prompt samples from its kept logits there).
    pub fn start_later(&mut self, prompt: &[u32], params: SamplerParams, limits: &Limits, budget: usize) -> Result<Running> {
        let (limits, same) = self.prefill(prompt, limits)?;
        let run = Running {
            prompt: prompt.to_vec(),
            prefilled: prompt.len() - same,
            prefill_seconds: 0.0,
            sampler: Sampler::new(params),
            stepper: Stepper::new(&limits),
            next: 0,
            going: true,
            decode_start: Instant::now(),
            steps: 0,
            // A repeat's logits are kept: nothing to prefill.
            at: if self.prompt_logits.is_some() { prompt.len() } else { same },
            budget: budget.max(2),
            prefilling: true,
        };
        Ok(run)
    }

    /// The tokens `run`'s next prefill step computes: from `run.at`, at most its
    /// budget, never one left alone after them.
    fn next_chunk(run: &Running) -> usize {
        Self::chunk_within(run, usize::MAX)
    }

    /// [`Generator::next_chunk`] within `cap` tokens.
    fn chunk_within(run: &Running, cap: usize) -> usize {
        let left = run.prompt.len() - run.at;
        let n = run.budget.min(left).min(cap);
        if left - n == 1 { n - 1 } else { n }
    }

    /// `run`'s prompt all computed and `first` its first id: kept (its text to
    /// `stream`), and its decode begins.
    fn first_kept(tokenizer: &Tokenizer, stop_ids: &[u32], run: &mut Running, first: u32, stream: &mut dyn FnMut(&str) -> bool) {
        run.at = run.prompt.len();
        run.prefilling = false;
        run.next = first;
        run.going = run.stepper.max_tokens > 0 && run.stepper.keep(first, Some(tokenizer), stop_ids, None, stream);
        run.decode_start = Instant::now();
    }

    /// Up to `run.budget` more of its prompt's tokens (never one left alone);
    /// at the prompt's end the first id sampled and kept, and the cache holds
    /// the prompt (its positions shareable while the generation decodes).
    fn prefill_step(&mut self, run: &mut Running, stream: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        let t0 = Instant::now();
        let len = run.prompt.len();
        let (left, n) = (len - run.at, Self::next_chunk(run));
        let done = if n < left {
            self.engine.forward(&run.prompt[run.at..run.at + n]).map(|_| None).map_err(Error::from)
        } else {
            self.prompt_first(&run.prompt, run.at, &mut run.sampler).map(Some)
        };
        run.prefill_seconds += t0.elapsed().as_secs_f64();
        let first = match done {
            Ok(first) => first,
            Err(e) => {
                self.reset();
                return Err(e);
            }
        };
        run.at += n;
        if let Some(first) = first {
            Self::first_kept(&self.prompter.tokenizer, &self.stop_ids, run, first, stream);
            self.cached = run.prompt.clone();
            self.prefilled = if len >= 2 { len } else { 0 };
        }
        Ok(())
    }

    /// One decode step of `run` (the generator's sequence must be its own):
    /// its last id fed, the next sampled and kept; whether it goes on. The same
    /// ids as [`Generator::complete`] gives on the CPU.
    pub fn advance(&mut self, run: &mut Running, stream: &mut dyn FnMut(&str) -> bool) -> Result<bool> {
        if run.prefilling {
            self.prefill_step(run, stream)?;
            return Ok(run.prefilling || run.going);
        }
        if !run.going {
            return Ok(false);
        }
        let id = match self.engine.decode_step(run.next) {
            Ok(logits) => run.sampler.sample(logits),
            Err(e) => {
                self.reset();
                return Err(e.into());
            }
        };
        run.steps += 1;
        run.next = id;
        run.going = run.stepper.keep(id, Some(&self.prompter.tokenizer), &self.stop_ids, None, stream);
        Ok(run.going)
    }

    /// One decode step of several sequences at once ([`Engine::decode_batch`],
    /// CPU): each slot's generation fed its last id and its next sampled from
    /// its own row of logits and kept, its text to `stream(i, piece)`. The slots
    /// stay out of the generator. On an error every slot's cache is emptied.
    /// Fewer slots than the selection's `min_batch` take lone steps instead
    /// ([`Generator::advance`] a slot at a time). Generations whose prompts are
    /// still being prefilled take their next chunks in the same pass
    /// ([`Engine::batch_pass`]) where the KV cache is paged and one decodes: in
    /// their order, while the pass's chunk tokens stay within the first one's
    /// budget, its sequences within the batch rows and its rows within the
    /// plan's tokens; one past those waits for a later step, one that cannot
    /// join a pass (a chunk of one token, a repeat's kept logits, no decoding
    /// sequence, no paged cache) takes a step alone. A chunk's values are a
    /// prefill's.
    pub fn advance_batch(
        &mut self,
        slots: &mut [&mut Slot],
        runs: &mut [&mut Running],
        stream: &mut dyn FnMut(usize, &str) -> bool,
    ) -> Result<()> {
        let decoding = runs.iter().filter(|r| !r.prefilling).count();
        let joins = self.engine.kv_blocks().is_some() && decoding >= 1;
        let (most, max_rows) = (self.batch_rows(), self.engine.plan.options.max_tokens);
        // A prefilling generation that cannot join a pass steps alone; one that
        // can but finds no room waits.
        let alone = |r: &Running| !joins || r.at == r.prompt.len() || Self::next_chunk(r) < 2;
        // (run, tokens) of the chunks in the pass.
        let mut chunks: Vec<(usize, usize)> = Vec::new();
        let (mut seqs, mut rows, mut budget) = (decoding, decoding, None);
        for i in (0..runs.len()).filter(|&i| runs[i].prefilling && !alone(runs[i])) {
            let r = &*runs[i];
            let left = budget.unwrap_or(r.budget);
            let n = Self::chunk_within(r, left.min(max_rows.saturating_sub(rows)));
            if n < 2 || seqs >= most {
                continue;
            }
            chunks.push((i, n));
            (seqs, rows, budget) = (seqs + 1, rows + n, Some(left - n));
        }
        let chunk_of = |i: usize| chunks.iter().find(|c| c.0 == i).map(|c| c.1);
        let lone: Vec<usize> = (0..runs.len())
            .filter(|&i| {
                if runs[i].prefilling {
                    return alone(runs[i]);
                }
                // Fewer than the profile's `serve.minBatch`: lone steps were faster.
                decoding + chunks.len() < 2 || (chunks.is_empty() && decoding < self.engine.plan.selection.min_batch)
            })
            .collect();
        for &i in &lone {
            self.swap_slot(slots[i])?;
            let step = self.advance(runs[i], &mut |t| stream(i, t));
            self.swap_slot(slots[i])?;
            if let Err(e) = step {
                slots.iter_mut().for_each(|s| s.release());
                return Err(e);
            }
        }
        // The pass: the decoding sequences and the chunks, in the caller's order.
        let order: Vec<usize> = (0..runs.len()).filter(|&i| !lone.contains(&i) && (chunk_of(i).is_some() || !runs[i].prefilling)).collect();
        if order.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let feeds: Vec<&[u32]> = order
            .iter()
            .map(|&i| match chunk_of(i) {
                Some(n) => &runs[i].prompt[runs[i].at..runs[i].at + n],
                None => std::slice::from_ref(&runs[i].next),
            })
            .collect();
        let vocab = self.engine.plan.config.dims.vocab_size;
        let mut kvs: Vec<&mut crate::runtime::SeqKv> = Vec::with_capacity(order.len());
        {
            let mut all: Vec<Option<&mut crate::runtime::SeqKv>> = slots.iter_mut().map(|s| Some(&mut s.kv)).collect();
            kvs.extend(order.iter().filter_map(|&i| all[i].take()));
        }
        let logits = match self.engine.batch_pass(&mut kvs, &feeds) {
            Ok(l) => l,
            Err(e) => {
                slots.iter_mut().for_each(|s| s.release());
                return Err(e.into());
            }
        };
        // Every row that samples (a decoding sequence, a prompt whose last chunk
        // this was) samples on the pool, a row a task: each sampler is its own
        // sequence's, so the order changes nothing (8 rows' argmax of SmolLM2's
        // 49152 logits were a hundredth of the pass, the pool's workers idle).
        let mut picks: Vec<(usize, &mut Sampler, u32)> = Vec::with_capacity(order.len());
        for (row, (i, run)) in runs.iter_mut().enumerate().filter(|(i, _)| order.contains(i)).enumerate() {
            if chunk_of(i).is_none_or(|n| run.at + n >= run.prompt.len()) {
                picks.push((row, &mut run.sampler, 0));
            }
        }
        crate::kernels::cpu::pool::for_chunks_mut(&mut picks, 1, |_, p| {
            let (row, sampler, id) = &mut p[0];
            *id = sampler.sample(&logits[*row * vocab..(*row + 1) * vocab]);
        });
        let mut ids: smallvec::SmallVec<[Option<u32>; 16]> = smallvec::smallvec![None; order.len()];
        for (row, _, id) in picks {
            ids[row] = Some(id);
        }
        let unsampled = |row: usize| crate::runtime::RuntimeError::Internal(format!("a batch pass's row {row} was not sampled"));
        for (row, &i) in order.iter().enumerate() {
            let row_logits = &logits[row * vocab..(row + 1) * vocab];
            let run = &mut *runs[i];
            if let Some(n) = chunk_of(i) {
                run.prefill_seconds += t0.elapsed().as_secs_f64();
                run.at += n;
                if run.at < run.prompt.len() {
                    continue;
                }
                // Its prompt's last token: the first id, as a lone prefill samples it.
                let len = run.prompt.len();
                let first = ids[row].ok_or_else(|| unsampled(row))?;
                let slot = &mut *slots[i];
                slot.prompt_logits = Some((len, row_logits.to_vec()));
                slot.cached = run.prompt.clone();
                slot.prefilled = if len >= 2 { len } else { 0 };
                Self::first_kept(&self.prompter.tokenizer, &self.stop_ids, run, first, &mut |t| stream(i, t));
                continue;
            }
            let id = ids[row].ok_or_else(|| unsampled(row))?;
            run.steps += 1;
            run.next = id;
            run.going = run.stepper.keep(id, Some(&self.prompter.tokenizer), &self.stop_ids, None, &mut |t| stream(i, t));
        }
        Ok(())
    }

    /// Ends `run` (cancelled when it was still going): its completion, and what
    /// the KV cache holds after it.
    pub fn end(&mut self, mut run: Running, stream: &mut dyn FnMut(&str) -> bool) -> Result<Completion> {
        if run.going {
            run.stepper.stop_reason = StopReason::Cancelled;
        }
        let decode_seconds = run.decode_start.elapsed().as_secs_f64();
        let unfinished = run.prefilling;
        let (generated, stop_reason, text) = match run.stepper.finish(Some(&self.prompter.tokenizer), stream) {
            Ok(r) => r,
            Err(e) => {
                self.reset();
                return Err(e);
            }
        };
        if unfinished {
            // Left while its prompt was prefilled: the cache holds what was.
            let pos = self.engine.pos.min(run.prompt.len());
            self.cached = run.prompt[..pos].to_vec();
            self.prefilled = pos;
        } else {
            self.settle(&run.prompt, &generated);
        }
        let decoded = Decoded { generated, stop_reason, text, decode_tokens: run.steps, decode_seconds, steps: run.steps };
        Ok(Completion { decoded, prompt_tokens: run.prompt.len(), prefilled: run.prefilled, prefill_seconds: run.prefill_seconds })
    }

    /// The logits the last prompt's last token gave (before any sampling
    /// penalty); None before a completion.
    pub fn prompt_logits(&self) -> Option<&[f32]> {
        self.prompt_logits.as_ref().map(|(_, l)| l.as_slice())
    }

    /// Tokens in the KV cache.
    pub fn cached_tokens(&self) -> usize {
        self.cached.len()
    }
}
