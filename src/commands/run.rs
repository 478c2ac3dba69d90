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

use std::sync::Arc;
use std::time::Instant;

use crate::cli::RunArgs;
use crate::generate;
use crate::kernels::sample::Sampler;
use crate::model::{Stored, Tokenizer, VisionConfig};
use crate::plan::Slot;
use crate::report::{RunReport, SlotRow};
use crate::runtime::{Engine, TensorStore};
use crate::session::{self, Engines, ModelSettings, ModelSource, gguf_storage, load_gguf, load_gguf_mmproj};
use crate::{Error, Result};

pub fn run(selector: Option<&str>, args: &RunArgs) -> Result<RunReport> {
    run_streaming(selector, args, &mut |_| {})
}

/// [`run`], handing the generated text to `stream` piece by piece as tokens are
/// produced (when there is a tokenizer; a piece ending in an incomplete UTF-8
/// character waits for the next token).
pub fn run_streaming(selector: Option<&str>, args: &RunArgs, stream: &mut dyn FnMut(&str)) -> Result<RunReport> {
    // Validate flags before building anything heavy.
    let choice = args.generate.engine.choice()?;
    let sampling = args.generate.sampler();
    generate::check_sampling(&sampling)?;
    let settings = args.generate.model.settings()?;
    let kv_dtype = args.generate.engine.kv_dtype;
    let mut warnings = Vec::new();
    if let ModelSource::Gguf(p) = &settings.source {
        session::input_file("--gguf", p)?;
    }
    // clap's `requires` cannot name a member of the model-source group: checked here.
    if let (Some(p), ModelSource::Builtin(_) | ModelSource::Dir(_)) = (&settings.mmproj, &settings.source) {
        return Err(session::mmproj_without_gguf(p).into());
    }
    if let Some(p) = &settings.mmproj {
        session::input_file("--mmproj", p)?;
    }
    // --dump-logits is written after the run: refused now if it cannot be (a
    // directory, a FIFO, a missing folder, one of the files read here).
    let model_files = settings.input_files();
    let mut inputs: Vec<(&str, &std::path::Path)> = model_files.iter().map(|(f, p)| (*f, p.as_path())).collect();
    let engine_args = &args.generate.engine;
    inputs.extend(engine_args.profile.as_deref().map(|p| ("--profile", p)));
    inputs.extend(engine_args.chat_template.as_deref().map(|p| ("--chat-template", p)));
    inputs.extend(args.image.as_deref().map(|p| ("--image", p)));
    if let Some(p) = &args.dump_logits {
        crate::atomic::check_output(p, &inputs)?;
    }
    // A GGUF file's tokenizer lives in the file: load the model first then (with
    // its vision projector, whose image tokens come from that vocabulary).
    let gguf_model = match (&settings.source, &settings.mmproj) {
        (ModelSource::Gguf(p), Some(mm)) => Some(load_gguf_mmproj(p, mm, settings.layers)?),
        (ModelSource::Gguf(p), None) => Some(load_gguf(p, settings.layers)?),
        _ => None,
    };
    let tokenizer = match &gguf_model {
        Some(m) => generate::gguf_tokenizer(m, args.prompt.is_some(), &mut warnings)?,
        None => generate::dir_tokenizer(
            &settings,
            args.prompt.is_some().then_some(("--prompt", "give the prompt as token ids with --tokens 1,2,3")),
            &mut warnings,
        )?,
    };
    // With --image the model must be multimodal: read its config before the prompt
    // (the processor's expansion of `<start_of_image>` needs the image tokens).
    let vision = match (&args.image, gguf_model.as_ref().and_then(|m| m.vision.as_ref())) {
        (Some(_), Some(v)) => Some(v.clone()),
        (Some(path), None) => Some(image_config(&settings, path)?),
        (None, _) => None,
    };
    let prompt = match (&args.prompt, &tokenizer) {
        (Some(text), Some(tok)) => {
            let text = match &vision {
                Some(v) => expand_image_prompt(text, tok, v)?,
                None => text.clone(),
            };
            let text = text.as_str();
            let ids = if args.chat {
                // As apply_chat_template(tokenize=True): the template writes the special
                // tokens it wants (a BOS among them), the post-processor adds none.
                let template =
                    generate::chat_template(gguf_model.as_ref(), &settings, args.generate.engine.chat_template.as_deref(), "--chat")?;
                tok.encode_with(&template.render_user(text)?, false)?
            } else {
                tok.encode(text)?
            };
            if ids.is_empty() {
                return Err(Error::Usage(format!("--prompt {text:?} encodes to no tokens; give a longer prompt")));
            }
            ids
        }
        // open_tokenizer fails when --prompt has no tokenizer to use.
        (Some(_), None) => return Err(Error::Usage("--prompt needs the model's tokenizer.json".into())),
        (None, _) if args.tokens.is_empty() => {
            return Err(Error::Usage(
                "give the prompt as --tokens 1,2,3, or as --prompt TEXT with a model directory that has a tokenizer.json or a GGUF file"
                    .into(),
            ));
        }
        (None, _) => args.tokens.clone(),
    };
    // A profile is read and validated before the model is loaded.
    let profile = choice.read()?;
    let device = session::pick_device(selector)?;
    let m = match gguf_model {
        Some(m) => m,
        None => settings.load_text()?,
    };
    warnings.extend(m.warnings.iter().cloned());
    let storage = gguf_storage(&m);
    let c = &m.config;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= c.vocab_size) {
        let from = match &tokenizer {
            Some(t) if args.prompt.is_some() => format!(" ({} does not match the model)", t.path().display()),
            _ => String::new(),
        };
        return Err(Error::Usage(format!("token id {bad} is outside the vocabulary (size {}){from}", c.vocab_size)));
    }
    // The image: its pixels (bad files refused before the tower is built; the
    // tower runs once the device and the profile's choices are known).
    let image_pixels = match (&args.image, &vision) {
        (Some(path), Some(v)) => {
            let count = prompt.iter().filter(|&&t| t == v.image_token_id).count();
            if count != v.mm_tokens_per_image {
                return Err(Error::Usage(format!(
                    "the prompt holds {count} image tokens (id {}); one image needs exactly {}: start-of-image {}, the image token {} \
                     {} times, end-of-image {} (as transformers' processor expands it; with --prompt write <start_of_image> once)",
                    v.image_token_id, v.mm_tokens_per_image, v.boi_token_id, v.image_token_id, v.mm_tokens_per_image, v.eoi_token_id
                )));
            }
            Some((path, v, crate::runtime::image::load_image(path, v.image_size)?))
        }
        _ => None,
    };
    let context = run_context(args, prompt.len(), c.max_position_embeddings)?;
    session::check_context(
        c,
        context,
        kv_dtype,
        &device,
        if args.generate.engine.context.is_some() { "--context" } else { "--max-tokens" },
    )?;
    let max_tokens = prompt.len().min(args.generate.engine.prefill_chunk.max(1));
    // Without --profile (or --no-profile): the best cached profile for this device,
    // model, weights and KV cache (profile::lookup).
    let generate::Chosen { selection, exec, label: profile_label } =
        choice.choose(profile, &device, &settings, &m, prompt.len(), context, &mut warnings)?;
    let opts = settings.plan_options(&m, &exec, max_tokens, context, args.dump_logits.is_some());
    let mut other_formats = std::collections::BTreeMap::new();
    for d in opts.matrix_formats.values() {
        *other_formats.entry(*d).or_insert(0usize) += 1;
    }
    let ctx = session::open_device(&device, exec.trusted_shaders || settings.trusted_shaders)?;
    // The image through the tower and projector on the selected device, each op
    // with the profile's `vision` choice (else the device's default); the note
    // names the kernels that ran.
    let soft_tokens = match image_pixels {
        Some((path, v, pixels)) => {
            let t0 = Instant::now();
            let (out, used, on) = match &ctx {
                Some(ctx) => {
                    let t = crate::runtime::vision_gpu::VisionGpu::new(v, &m.weights, ctx.clone())?.with_selection(&selection)?;
                    (t.encode(&pixels)?, t.kernels()?, "GPU")
                }
                None => {
                    let t = crate::runtime::vision::VisionEngine::new(v, &m.weights)?.with_selection(&selection)?;
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
            Some((v.image_token_id, out.tokens))
        }
        None => None,
    };
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let batch = exec.batch;
    // One engine: its weights need no memo to share them.
    let engines = Engines { model: &m.name, config: c, store, ctx, memo: None, check_decode: false };
    let mut engine = engines.build(opts, selection, batch)?;
    engine.set_cpu_pool(exec.threads, exec.spin_us, exec.prefetch);
    if args.causal_image {
        engine.image_attention = crate::runtime::ImageAttention::Causal;
    }
    let weight_bytes = engine.plan.weight_bytes();
    // Prefill (timed; on a GPU the pass is also profiled per step).
    engine.profile_next();
    let t0 = Instant::now();
    let rows = match soft_tokens {
        Some((id, rows)) => engine.forward_with_soft_tokens(&prompt, id, rows)?,
        None => engine.forward(&prompt)?,
    };
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let prefill_logits = if args.dump_logits.is_some() { rows.clone() } else { Vec::new() };
    let mut sampler = Sampler::new(sampling);
    let first = sampler.sample(rows.last().map(Vec::as_slice).unwrap_or(&[]));
    // The ids that end generation: the config's EOS ids, and under --chat the
    // vocabulary's end-of-turn token (Gemma, ChatML, Llama 3).
    let stop_ids = generate::stop_ids(&m, tokenizer.as_ref(), args.chat);
    let k = args.generate.engine.decode_chain.or(exec.decode_chain).unwrap_or(crate::profile::doc::DEFAULT_DECODE_CHAIN) as usize;
    let limits = generate::Limits { max_tokens: args.max_tokens, stop: Vec::new(), ignore_eos: args.generate.sampling.ignore_eos };
    let decoded = generate::decode(&mut engine, &mut sampler, first, tokenizer.as_ref(), &stop_ids, k, &limits, None, &mut |t| {
        stream(t);
        true
    })?;
    let generate::Decoded { generated, stop_reason, text, decode_tokens, decode_seconds, steps } = decoded;
    if let Some(path) = &args.dump_logits {
        let json = serde_json::json!({ "tokens": prompt, "logits": prefill_logits, "generated": generated });
        crate::atomic::write_output(path, &inputs, &serde_json::to_vec(&json)?)?;
    }
    // The CPU's slot times are over every decode step, the first included.
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
            // GPU decode times come from one profiled step, CPU ones from every step.
            let d_ms = if gpu { d.unwrap_or(0.0) * 1e3 } else { per_tok(d.unwrap_or(0.0)) };
            Some(SlotRow { slot: s, prefill_ms: p.unwrap_or(0.0) * 1e3, decode_ms_per_token: d_ms })
        })
        .collect();
    slots.sort_by(|a, b| b.decode_ms_per_token.total_cmp(&a.decode_ms_per_token));
    let decode_tps = if decode_seconds > 0.0 { decode_tokens as f64 / decode_seconds } else { 0.0 };
    let kernels = kernel_summary(&engine)?;
    warnings.extend(engine.warnings());
    Ok(RunReport {
        device: device.name(),
        backend: device.backend_name(),
        fingerprint: device.fingerprint(),
        model: m.name.clone(),
        weights: m.weights.origin().to_string(),
        profile: profile_label,
        weight_dtype: exec.weight_dtype,
        other_formats,
        weight_storage: storage.map(|s| match s {
            Stored::F32 => "f32".to_string(),
            Stored::F16 => "f16".to_string(),
            Stored::BF16 => "bf16".to_string(),
            Stored::Quant(q) => q.name().to_string(),
        }),
        kv_dtype: exec.kv_dtype,
        fusion: exec.fusion,
        batch_commands: batch,
        decode_chain: gpu.then_some(k),
        layers: c.num_layers,
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
        slots,
        step_timing: engine.step_timing(),
        profiled_step_gpu_ms: engine.profiled_step_gpu_seconds.map(|s| s * 1e3),
        kernels,
        warnings,
    })
}

/// The KV cache's context: `--context`, which must leave room for `--max-tokens`
/// after the prompt, else the prompt and `--max-tokens` (`max_position`, the
/// model's, only words the message of a sum past any context).
fn run_context(args: &RunArgs, prompt: usize, max_position: usize) -> Result<usize> {
    let left = |c: usize| c.saturating_sub(prompt);
    let need = prompt.checked_add(args.max_tokens).ok_or_else(|| {
        Error::Usage(format!(
            "--max-tokens {}: past any context; the model holds {max_position} positions, {} after the {prompt}-token prompt",
            args.max_tokens,
            left(max_position)
        ))
    })?;
    match args.generate.engine.context {
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
fn image_config(settings: &ModelSettings, path: &std::path::Path) -> Result<VisionConfig> {
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
