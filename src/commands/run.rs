//! `ktune run`: a model (built-in shapes with synthetic weights, a Hugging Face
//! directory or a GGUF file) executed on one device with the kernels a profile selects (`--profile`,
//! else the cached profile `tune` wrote for this device and model: `profile::lookup`)
//! or the runtime's defaults: prefill, greedy decode with the KV cache, throughput, time
//! per slot, and optionally the logits as JSON. Each token is chosen by the
//! sampler (`kernels::sample`): greedy by default, else temperature / top-k /
//! top-p / min-p with `--seed`, and an optional repeat penalty; the prompt's
//! next token on the host from the prefill's logits, the decoded ones by
//! `Engine::decode_chain` (on a GPU picked there, K steps chained a submit:
//! `--decode-chain`, else the profile's `execution.decodeChain`). With a model directory's
//! `tokenizer.json` or a GGUF file's tokenizer the prompt can be text
//! (`--prompt`, with `--chat` rendered as one user turn of the model's chat
//! template) and the generated ids are decoded to text, streamed to a sink as
//! they are produced. Generation stops at the first end-of-sequence id (the
//! config's, and under `--chat` the vocabulary's end-of-turn token) unless
//! `--ignore-eos`. With `--image` a multimodal model (a Gemma 3 directory, or a
//! GGUF text model with its `--mmproj` vision projector) runs the image through
//! its vision tower first; the soft tokens replace the prompt's image tokens.

use std::path::Path;
use std::time::Instant;

use crate::generate::{self, GeneratorSettings, Passes, Prepared, RunSettings, Source};
use crate::kernels::sample::{Sampler, SamplerParams};
use crate::model::{Stored, Tokenizer, VisionConfig};
use crate::plan::Slot;
use crate::report::{RunReport, SlotRow};
use crate::runtime::Engine;
use crate::session::{self, LoadedModel, ModelSettings, ModelSource, gguf_storage};
use crate::{Error, Result};

pub fn run(selector: Option<&str>, args: &RunSettings) -> Result<RunReport> {
    run_streaming(selector, args, &mut |_| {})
}

/// [`run`], handing the generated text to `stream` piece by piece as tokens are
/// produced (when there is a tokenizer; a piece ending in an incomplete UTF-8
/// character waits for the next token).
pub fn run_streaming(selector: Option<&str>, args: &RunSettings, stream: &mut dyn FnMut(&str)) -> Result<RunReport> {
    // Flags were checked when they became settings; the model source before
    // anything heavy is built.
    let (sampling, s) = (args.sampler, &args.generator);
    generate::check_source(&s.model)?;
    // --dump-logits is written after the run: refused now if it cannot be (a
    // directory, a FIFO, a missing folder, one of the files read here).
    let model_files = s.model.input_files();
    let mut inputs: Vec<(&str, &Path)> = model_files.iter().map(|(f, p)| (*f, p.as_path())).collect();
    inputs.extend(s.choice.profile.as_deref().map(|p| ("--profile", p)));
    inputs.extend(s.chat_template.as_deref().map(|p| ("--chat-template", p)));
    inputs.extend(args.image.as_deref().map(|p| ("--image", p)));
    if let Some(p) = &args.dump_logits {
        crate::atomic::check_output(p, &inputs)?;
    }
    let mut warnings = Vec::new();
    // A GGUF file's tokenizer lives in the file: the model loads first then.
    let needed = args.prompt.is_some().then_some(("--prompt", "give the prompt as token ids with --tokens 1,2,3"));
    let mut source = Source::open(&s.model, needed, &mut warnings)?;
    // With --image the model must be multimodal: read its config before the prompt
    // (the processor's expansion of `<start_of_image>` needs the image tokens).
    let vision = match (&args.image, source.gguf().and_then(|m| m.vision.as_ref())) {
        (Some(_), Some(v)) => Some(v.clone()),
        (Some(path), None) => Some(image_config(&s.model, path)?),
        (None, _) => None,
    };
    let prompt = prompt_ids(args, s, &source, vision.as_ref())?;
    // A profile is read and validated before the model is loaded.
    let profile = s.choice.read()?;
    let device = session::pick_device(selector)?;
    let tokenizer = source.tokenizer.take();
    let m = source.model(&s.model)?;
    warnings.extend(m.warnings.iter().cloned());
    check_vocabulary(&prompt, &m, tokenizer.as_ref().filter(|_| args.prompt.is_some()))?;
    // The image: its pixels (bad files refused before the engine is built; the
    // tower runs once the device and the profile's choices are known).
    let image = match (&args.image, vision) {
        (Some(path), Some(v)) => Some(load_image(path, v, &prompt)?),
        _ => None,
    };
    let context = run_context(args, s.context, prompt.len(), m.config.max_position_embeddings)?;
    let passes = Passes {
        context,
        context_flag: if s.context.is_some() { "--context" } else { "--max-tokens" },
        prefill_tokens: prompt.len(),
        max_tokens: prompt.len().min(s.prefill_chunk.max(1)),
        all_logits: args.dump_logits.is_some(),
        batch_rows: Some(0),
    };
    // Without --profile (or --no-profile): the best cached profile for this device,
    // model, weights and KV cache (profile::lookup).
    let mut p = s.choice.prepare(profile, &device, &s.model, &m, passes, &mut warnings)?;
    let soft_tokens = match image {
        Some(image) => Some(run_tower(image, &m, &p, &mut warnings)?),
        None => None,
    };
    if args.causal_image {
        p.engine.image_attention = crate::runtime::ImageAttention::Causal;
    }
    let input = Input { prompt, tokenizer, sampling };
    let ran = generate_text(args, &mut p, &m, &input, soft_tokens, stream)?;
    if let Some(path) = &args.dump_logits {
        let json = serde_json::json!({ "tokens": input.prompt, "logits": ran.prefill_logits, "generated": ran.decoded.generated });
        crate::atomic::write_output(path, &inputs, &serde_json::to_vec(&json)?)?;
    }
    warnings.extend(p.engine.warnings());
    report(args, &device, &m, &p, input, ran, warnings)
}

/// The prompt's ids: `--prompt` encoded (its image token expanded for `vision`;
/// with `--chat` as one user turn of the chat template), else `--tokens`.
fn prompt_ids(args: &RunSettings, s: &GeneratorSettings, source: &Source, vision: Option<&VisionConfig>) -> Result<Vec<u32>> {
    let (text, tok) = match (&args.prompt, &source.tokenizer) {
        (Some(text), Some(tok)) => (text, tok),
        // Source::open fails when --prompt has no tokenizer to use.
        (Some(_), None) => return Err(Error::Usage("--prompt needs the model's tokenizer.json".into())),
        (None, _) if args.tokens.is_empty() => {
            return Err(Error::Usage(
                "give the prompt as --tokens 1,2,3, or as --prompt TEXT with a model directory that has a tokenizer.json or a GGUF file"
                    .into(),
            ));
        }
        (None, _) => return Ok(args.tokens.clone()),
    };
    let text = match vision {
        Some(v) => expand_image_prompt(text, tok, v)?,
        None => text.clone(),
    };
    let ids = if args.chat {
        // As apply_chat_template(tokenize=True): the template writes the special
        // tokens it wants (a BOS among them), the post-processor adds none.
        let template = generate::chat_template(source.gguf(), &s.model, s.chat_template.as_deref(), "--chat")?;
        tok.encode_with(&template.render_user(&text)?, false)?
    } else {
        tok.encode(&text)?
    };
    if ids.is_empty() {
        return Err(Error::Usage(format!("--prompt {text:?} encodes to no tokens; give a longer prompt")));
    }
    Ok(ids)
}

/// Every prompt id inside `m`'s vocabulary (`tokenizer`: the one that encoded
/// `--prompt`, named when it does not match the model).
fn check_vocabulary(prompt: &[u32], m: &LoadedModel, tokenizer: Option<&Tokenizer>) -> Result<()> {
    let vocab = m.config.dims.vocab_size;
    match prompt.iter().find(|&&t| t as usize >= vocab) {
        None => Ok(()),
        Some(&bad) => {
            let from = tokenizer.map_or(String::new(), |t| format!(" ({} does not match the model)", t.path().display()));
            Err(Error::Usage(format!("token id {bad} is outside the vocabulary (size {vocab}){from}")))
        }
    }
}

/// An image for the vision tower: its file, the tower's config and its pixels.
struct Image<'a> {
    path: &'a Path,
    vision: VisionConfig,
    pixels: Vec<f32>,
}

/// The `--image` file decoded, once the prompt holds the image tokens one image takes.
fn load_image<'a>(path: &'a Path, v: VisionConfig, prompt: &[u32]) -> Result<Image<'a>> {
    let count = prompt.iter().filter(|&&t| t == v.image_token_id).count();
    if count != v.mm_tokens_per_image {
        return Err(Error::Usage(format!(
            "the prompt holds {count} image tokens (id {}); one image needs exactly {}: start-of-image {}, the image token {} \
             {} times, end-of-image {} (as transformers' processor expands it; with --prompt write <start_of_image> once)",
            v.image_token_id, v.mm_tokens_per_image, v.boi_token_id, v.image_token_id, v.mm_tokens_per_image, v.eoi_token_id
        )));
    }
    let pixels = crate::runtime::image::load_image(path, v.image_size)?;
    Ok(Image { path, vision: v, pixels })
}

/// The image through the tower and projector on the engine's device, each op
/// with the selection's `vision` choice (else the device's default); the note
/// names the kernels that ran. Returns the image token's id and its soft tokens.
fn run_tower(image: Image<'_>, m: &LoadedModel, p: &Prepared, warnings: &mut Vec<String>) -> Result<(u32, Vec<f32>)> {
    let Image { path, vision: v, pixels } = image;
    let selection = &p.engine.plan.selection;
    let t0 = Instant::now();
    let (out, used, on) = match &p.ctx {
        Some(ctx) => {
            let t = crate::runtime::vision_gpu::VisionGpu::new(&v, &m.weights, ctx.clone())?.with_selection(selection)?;
            (t.encode(&pixels)?, t.kernels()?, "GPU")
        }
        None => {
            let t = crate::runtime::vision::VisionEngine::new(&v, &m.weights)?.with_selection(selection)?;
            (t.encode(&pixels)?, t.kernels()?, "CPU")
        }
    };
    let used: Vec<String> = used.iter().map(|(slot, k)| format!("{} {k}", slot.name())).collect();
    warnings.push(format!(
        "image {}: {} patches through the vision tower in {:.3} s ({on}), {} soft tokens; kernels: {}",
        path.display(),
        v.num_patches(),
        t0.elapsed().as_secs_f64(),
        v.mm_tokens_per_image,
        used.join(", ")
    ));
    Ok((v.image_token_id, out.tokens))
}

/// What a run generates from.
struct Input {
    prompt: Vec<u32>,
    tokenizer: Option<Tokenizer>,
    sampling: SamplerParams,
}

/// What a run produced.
struct Ran {
    prefill_seconds: f64,
    /// Every prompt position's logits (with `--dump-logits`).
    prefill_logits: Vec<Vec<f32>>,
    decoded: generate::Decoded,
}

/// Prefill (timed; on a GPU the pass is also profiled per step), the first
/// token sampled from its last logits, then the decode loop streaming text.
fn generate_text(
    args: &RunSettings,
    p: &mut Prepared,
    m: &LoadedModel,
    input: &Input,
    soft_tokens: Option<(u32, Vec<f32>)>,
    stream: &mut dyn FnMut(&str),
) -> Result<Ran> {
    let (engine, prompt, tokenizer) = (&mut p.engine, input.prompt.as_slice(), input.tokenizer.as_ref());
    engine.profile_next();
    let t0 = Instant::now();
    let rows = match soft_tokens {
        Some((id, rows)) => engine.forward_with_soft_tokens(prompt, id, rows)?,
        None => engine.forward(prompt)?,
    };
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let prefill_logits = if args.dump_logits.is_some() { rows.clone() } else { Vec::new() };
    let mut sampler = Sampler::new(input.sampling);
    let first = sampler.sample(rows.last().map(Vec::as_slice).unwrap_or(&[]));
    // The ids that end generation: the config's EOS ids, and under --chat the
    // vocabulary's end-of-turn token (Gemma, ChatML, Llama 3).
    let stop_ids = generate::stop_ids(m, tokenizer, args.chat);
    let limits = generate::Limits { max_tokens: args.max_tokens, stop: Vec::new(), ignore_eos: args.ignore_eos };
    let mut stream = |t: &str| {
        stream(t);
        true
    };
    let out = generate::Output { limits: &limits, cancel: None, stream: &mut stream };
    let decoded = generate::decode(engine, &mut sampler, first, tokenizer, &stop_ids, p.chain, out)?;
    Ok(Ran { prefill_seconds, prefill_logits, decoded })
}

/// The report of a run: the device, model and settings, the throughput, the
/// time per slot and the kernels.
fn report(
    args: &RunSettings,
    device: &crate::device::Device,
    m: &LoadedModel,
    p: &Prepared,
    input: Input,
    ran: Ran,
    warnings: Vec<String>,
) -> Result<RunReport> {
    let (Input { prompt, tokenizer, sampling }, Ran { prefill_seconds, decoded, .. }) = (input, ran);
    let generate::Decoded { generated, stop_reason, text, decode_tokens, decode_seconds, steps } = decoded;
    let engine = &p.engine;
    let exec = &p.exec;
    let gpu = engine.is_gpu();
    let mut other_formats = std::collections::BTreeMap::new();
    for d in engine.plan.options.matrix_formats.values() {
        *other_formats.entry(*d).or_insert(0usize) += 1;
    }
    let decode_tps = if decode_seconds > 0.0 { decode_tokens as f64 / decode_seconds } else { 0.0 };
    let weight_bytes = engine.plan.decode_read_bytes();
    Ok(RunReport {
        device: device.name(),
        backend: device.backend_name(),
        fingerprint: device.fingerprint(),
        model: m.name.clone(),
        weights: m.weights.origin().to_string(),
        profile: p.label.clone(),
        weight_dtype: exec.weight_dtype,
        other_formats,
        weight_storage: gguf_storage(m).map(|s| match s {
            Stored::F32 => "f32".to_string(),
            Stored::F16 => "f16".to_string(),
            Stored::BF16 => "bf16".to_string(),
            Stored::Quant(q) => q.name().to_string(),
        }),
        kv_dtype: exec.kv_dtype,
        fusion: exec.fusion,
        batch_commands: exec.batch,
        decode_chain: gpu.then_some(p.chain),
        layers: m.config.dims.num_layers,
        prompt: args.prompt.clone(),
        prompt_tokens: prompt.len(),
        prefill_seconds,
        prefill_tokens_per_sec: prompt.len() as f64 / prefill_seconds.max(1e-12),
        decode_tokens,
        decode_seconds,
        decode_tokens_per_sec: decode_tps,
        weight_bytes,
        decode_gbps: weight_bytes as f64 * decode_tps / 1e9,
        generated,
        stop_reason,
        chat: args.chat,
        text,
        tokenizer: tokenizer.map(|t| t.path().display().to_string()),
        prompt_ids: prompt,
        sampling,
        dispatches_per_layer: engine.dispatches_per_layer,
        decode_counters: engine.decode_counters(),
        slots: slot_rows(engine, steps),
        step_timing: engine.step_timing(),
        profiled_step_gpu_ms: engine.profiled_step_gpu_seconds.map(|s| s * 1e3),
        kernels: kernel_summary(engine)?,
        warnings,
    })
}

/// Time per slot, slowest decode first: prefill milliseconds, and decode
/// milliseconds per token (GPU decode times come from one profiled step, CPU
/// ones from every one of the `steps` decode steps, the first included).
fn slot_rows(engine: &Engine, steps: usize) -> Vec<SlotRow> {
    let per_tok = |s: f64| if steps > 0 { s * 1e3 / steps as f64 } else { 0.0 };
    let gpu = engine.is_gpu();
    let mut slots: Vec<SlotRow> = Slot::ALL
        .iter()
        .filter_map(|&s| {
            let p = engine.prefill_times.seconds.get(&s).copied();
            let d = engine.decode_times.seconds.get(&s).copied();
            if p.is_none() && d.is_none() {
                return None;
            }
            let d_ms = if gpu { d.unwrap_or(0.0) * 1e3 } else { per_tok(d.unwrap_or(0.0)) };
            Some(SlotRow { slot: s, prefill_ms: p.unwrap_or(0.0) * 1e3, decode_ms_per_token: d_ms })
        })
        .collect();
    slots.sort_by(|a, b| b.decode_ms_per_token.total_cmp(&a.decode_ms_per_token));
    slots
}

/// The KV cache's context: `--context`, which must leave room for `--max-tokens`
/// after the prompt, else the prompt and `--max-tokens` (`max_position`, the
/// model's, only words the message of a sum past any context).
fn run_context(args: &RunSettings, context: Option<usize>, prompt: usize, max_position: usize) -> Result<usize> {
    let left = |c: usize| c.saturating_sub(prompt);
    let need = prompt.checked_add(args.max_tokens).ok_or_else(|| {
        Error::Usage(format!(
            "--max-tokens {}: past any context; the model holds {max_position} positions, {} after the {prompt}-token prompt",
            args.max_tokens,
            left(max_position)
        ))
    })?;
    match context {
        Some(c) if c < need => Err(Error::Usage(format!(
            "--max-tokens {}: the context (--context {c}) leaves room for {} tokens after the {prompt}-token prompt; \
             give --max-tokens {} or less, or a larger --context",
            args.max_tokens,
            left(c),
            left(c)
        ))),
        Some(c) => Ok(c),
        None if need > max_position => Err(Error::Usage(format!(
            "--max-tokens {}: the {prompt}-token prompt and {} new tokens are past the model's {max_position} positions \
             (max_position_embeddings); give --max-tokens {} or less",
            args.max_tokens,
            args.max_tokens,
            left(max_position)
        ))),
        None => Ok(need),
    }
}

/// The vision config of the `--model-dir` a `--image` run needs.
fn image_config(settings: &ModelSettings, path: &Path) -> Result<VisionConfig> {
    let ModelSource::Dir(dir) = &settings.source else {
        return Err(Error::Usage(format!(
            "--image {}: images need a multimodal model: a directory (--model-dir with a Gemma3ForConditionalGeneration config), \
             or a GGUF text model with its vision projector (--gguf TEXT.gguf --mmproj MMPROJ.gguf)",
            path.display()
        )));
    };
    let cfg = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg).map_err(|source| crate::model::ModelError::Io { path: cfg.clone(), source })?;
    match crate::model::ModelConfig::parse_config_json(&text, &cfg)?.vision {
        Some(v) => Ok(v),
        None => Err(Error::Usage(format!("--image: {} is a text-only model (no vision_config)", cfg.display()))),
    }
}

/// The prompt with its one `<start_of_image>` expanded as Gemma 3's processor
/// expands it: `"\n\n<start_of_image>" + "<image_soft_token>" x mm_tokens_per_image
/// + "<end_of_image>\n\n"` (the tokens' spellings from the tokenizer).
fn expand_image_prompt(text: &str, tok: &Tokenizer, v: &VisionConfig) -> Result<String> {
    let name = |id: u32| {
        tok.id_to_token(id).ok_or_else(|| Error::Usage(format!("the tokenizer has no token for id {id} (the config's image tokens)")))
    };
    let (boi, image, eoi) = (name(v.boi_token_id)?, name(v.image_token_id)?, name(v.eoi_token_id)?);
    let count = text.matches(boi.as_str()).count();
    if count != 1 {
        return Err(Error::Usage(format!("--prompt holds {boi} {count} times; write it once, where the image goes")));
    }
    let full = format!("\n\n{boi}{}{eoi}\n\n", image.repeat(v.mm_tokens_per_image));
    Ok(text.replacen(boi.as_str(), &full, 1))
}

/// Which kernel serves each slot (layer 0, prefill and decode).
fn kernel_summary(engine: &Engine) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let plan = &engine.plan;
    let t = plan.options.max_tokens;
    let mut passes = vec![plan.steps(1, 0)?];
    if t > 1 {
        passes.push(plan.steps(t, 0)?);
    }
    for steps in passes {
        for s in steps.iter().filter(|s| s.layer.is_none_or(|l| l == 0)) {
            if let crate::plan::StepKind::Kernel { kernel, params, .. } = &s.kind {
                let key = format!("{} ({})", s.slot, kernel.op);
                let val = if params.is_empty() {
                    kernel.id.to_string()
                } else {
                    format!("{} {}", kernel.id, params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
                };
                if !out.iter().any(|(k, v): &(String, String)| k == &key && v == &val) {
                    out.push((key, val));
                }
            }
        }
    }
    Ok(out)
}
