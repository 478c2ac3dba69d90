//! `ktune eval`: a model's accuracy as it runs on a device. The text (`--file`) is
//! tokenized with the model's tokenizer and scored as llama-perplexity scores it
//! (`crate::eval`): perplexity, and with a reference (`--reference f32`, the CPU's
//! exact path; `--reference-device`, the same model elsewhere; `--reference FILE`,
//! saved logits) the KL divergence, top-1 agreement and logit error at the same
//! positions. What runs is the runtime's defaults on the device, a `--profile`,
//! or with `--exact` the f32 reference itself; `--save-logits` keeps its
//! log-probabilities for a later `--reference FILE`.

use std::time::Instant;

use crate::cli::{EvalArgs, ReferenceArg};
use crate::eval::{self, LogitsReader, LogitsWriter, Path, Reference, Text};
use crate::generate::{ProfileChoice, Source, check_source};
use crate::profile::Profile;
use crate::progress::Progress;
use crate::report::EvalReport;
use crate::runtime::WeightMemo;
use crate::session::{self, Engines};
use crate::{Error, Result};

/// The default tokens per chunk (llama-perplexity's usual `-c 512`).
const DEFAULT_CTX: usize = 512;
/// Most bytes of `--file` (wikitext-2's test split is 1.3 MB).
const MAX_TEXT_BYTES: u64 = 256 << 20;

pub fn run(selector: Option<&str>, args: &EvalArgs, progress: &dyn Progress) -> Result<EvalReport> {
    // Flags and files first, before anything heavy is built.
    let settings = args.model.settings()?;
    if let Some(mm) = &settings.mmproj {
        return Err(Error::Usage(format!("--mmproj {}: eval scores text; leave the vision projector out", mm.display())));
    }
    check_source(&settings)?;
    if args.chunks == Some(0) {
        return Err(Error::Usage("--chunks 0: give at least one chunk".into()));
    }
    // The files this command reads, which --save-logits may not replace.
    let mut inputs: Vec<(&str, &std::path::Path)> = vec![("--file", &args.file)];
    if let Some(ReferenceArg::File(p)) = &args.reference {
        inputs.push(("--reference", p));
    }
    if let Some(p) = &args.profile {
        inputs.push(("--profile", p));
    }
    let model_files = settings.input_files();
    inputs.extend(model_files.iter().map(|(flag, p)| (*flag, p.as_path())));
    if let Some(p) = &args.save_logits {
        crate::atomic::check_output(p, &inputs).map_err(eval::EvalError::from)?;
    }
    let text = crate::input::read_text_limited(&args.file, MAX_TEXT_BYTES, "an evaluation text")
        .map_err(|e| Error::Usage(format!("--file {}: {e}", args.file.display())))?;
    let mut file_ref = match &args.reference {
        Some(ReferenceArg::File(p)) => Some(LogitsReader::open(p)?),
        _ => None,
    };
    let profile = args.profile.as_ref().map(|p| Profile::load(p)).transpose()?;
    let device = session::pick_device(selector)?;
    let reference_device = match (&args.reference, &args.reference_device) {
        (Some(ReferenceArg::F32), _) => Some(session::pick_device(Some("cpu"))?),
        (_, Some(sel)) => Some(session::pick_device(Some(sel))?),
        _ => None,
    };

    // The model and its tokenizer as every generating command opens them.
    let mut warnings = Vec::new();
    let mut source = Source::open(&settings, Some(("eval --file", "give --gguf FILE or --model-dir DIR")), &mut warnings)?;
    let tokenizer = source.tokenizer.take().ok_or_else(|| Error::Usage("eval --file needs the model's tokenizer".into()))?;
    let m = source.model(&settings)?;
    warnings.splice(0..0, m.warnings.iter().cloned());
    let (ids, bos) = eval::tokenize(&tokenizer, &text)?;
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= m.config.dims.vocab_size) {
        return Err(Error::Usage(format!(
            "token id {bad} of the text is outside the model's vocabulary ({}): {} does not match the model",
            m.config.dims.vocab_size,
            tokenizer.path().display()
        )));
    }
    let ctx = args.ctx.unwrap_or(DEFAULT_CTX.min(m.config.max_position_embeddings));
    session::check_context(&m.config, ctx, args.kv_dtype, &device, "--ctx")?;
    let text = Text::chunked(&ids, bos, ctx, args.chunks)?;
    if let Some(r) = &mut file_ref {
        text.check_reference(r, m.config.dims.vocab_size)?;
    }

    // What is evaluated: the exact path, a profile, or the runtime's defaults (a
    // cached profile only when named: eval measures what it is given).
    let weight_dtype = settings.weight_dtype(&m);
    let choice = ProfileChoice { profile: args.profile.clone(), kv_dtype: args.kv_dtype, ..ProfileChoice::uncached() };
    let (evaluated, selection, exec) = if args.exact {
        if !matches!(device, crate::device::Device::Cpu(_)) {
            return Err(Error::Usage("--exact is the CPU's f32 path: give --device cpu".into()));
        }
        let exec = choice.defaults(&device, &settings, &m, weight_dtype, false).exec;
        ("f32 reference (CPU, f32 activations, plain layouts)".to_string(), Path::F32Reference, exec)
    } else {
        let c = choice.choose(profile.as_ref(), &device, &settings, &m, ctx, ctx, false, &mut warnings)?;
        (c.label.unwrap_or_else(|| "runtime defaults".into()), Path::Selected(Box::new(c.selection)), c.exec)
    };
    let ctx_gpu = session::open_device(&device, exec.trusted_shaders)?;
    let build = Engines::of(&m, ctx_gpu, Some(WeightMemo::default()));
    let mut engine = eval::scoring_engine(&build, &settings, &m, selection, &exec, ctx)?;

    // The reference engine, on its own device (CPU engines share the weights' memo).
    let mut ref_engine = match &reference_device {
        None => None,
        Some(d) => {
            let defaults = choice.defaults(d, &settings, &m, weight_dtype, false);
            let (path, label) = match &args.reference {
                Some(ReferenceArg::F32) => (Path::F32Reference, "f32 (CPU, f32 activations, plain layouts)".to_string()),
                _ => (Path::Selected(Box::new(defaults.selection)), format!("runtime defaults on {}", d.name())),
            };
            let ref_build = Engines { ctx: session::open_device(d, settings.trusted_shaders)?, ..build };
            Some((eval::scoring_engine(&ref_build, &settings, &m, path, &defaults.exec, ctx)?, label))
        }
    };
    let reference_label = match (&ref_engine, &file_ref) {
        (Some((_, l)), _) => Some(l.clone()),
        (None, Some(r)) => Some(format!("{} ({:?} log-probabilities)", r.path.display(), r.header.dtype).to_lowercase()),
        (None, None) => None,
    };
    let reference = match (&mut ref_engine, &mut file_ref) {
        (Some((e, _)), _) => Some(Reference::Engine(e)),
        (None, Some(r)) => Some(Reference::File(r)),
        (None, None) => None,
    };
    let mut writer = match &args.save_logits {
        Some(p) => Some(LogitsWriter::create(p, &inputs, text.header(m.config.dims.vocab_size, args.logits_dtype), &text.chunks)?),
        None => None,
    };

    let t0 = Instant::now();
    let outcome = eval::evaluate(&text, &mut engine, reference, writer.as_mut(), progress)?;
    let seconds = t0.elapsed().as_secs_f64();
    let saved_logits = match writer {
        Some(w) => Some(format!("{} ({:?})", w.finish()?.display(), args.logits_dtype).to_lowercase()),
        None => None,
    };
    warnings.extend(engine.warnings());
    Ok(EvalReport {
        device: device.name(),
        model: m.name.clone(),
        evaluated,
        file: args.file.display().to_string(),
        text_tokens: ids.len(),
        bos,
        ctx,
        chunks: text.chunks.len(),
        first_scored: text.first,
        perplexity: outcome.perplexity,
        reference: reference_label,
        divergence: outcome.divergence,
        saved_logits,
        seconds,
        warnings,
    })
}
