//! Accuracy as numbers: what `ktune eval` measures and `bench --kld` reuses. A
//! text's tokens cut into chunks as llama-perplexity cuts them ([`Text`]), each
//! chunk run from a fresh KV cache with every position's logits, the second half
//! of each chunk scored ([`evaluate`]): perplexity, and against a reference run
//! (an engine of the same model elsewhere: another device, or the CPU's exact
//! path, [`f32_reference`]; or a saved logits file, [`logits_file`]) the KL
//! divergence, top-1 agreement and logit error ([`metrics`]). Engines for scoring
//! are built here too ([`scoring_engine`]), so the command and `bench` score alike.

pub mod logits_file;
pub mod metrics;

use std::path::PathBuf;

pub use logits_file::{Header, LogitsDtype, LogitsReader, LogitsWriter};
pub use metrics::{Divergence, Perplexity};

use crate::device::{CpuCaps, DeviceCaps};
use crate::kernels::DType;
use crate::model::{ModelError, Tokenizer};
use crate::plan::{PlanOptions, Selection};
use crate::profile::ExecSettings;
use crate::progress::Progress;
use crate::runtime::{Engine, RuntimeError};
use crate::session::{Engines, LoadedModel, ModelSettings};
use metrics::{DivergenceSum, NllSum, log_softmax};

/// What can go wrong evaluating: the text, the reference file, the run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A logits file that cannot be read as one (truncated, foreign, another version).
    #[error("logits file {}: {msg}", path.display())]
    LogitsFile { path: PathBuf, msg: String },
    /// A logits file that does not fit this evaluation (another text, context or vocabulary).
    #[error("--reference {}: {msg}", path.display())]
    Mismatch { path: PathBuf, msg: String },
    /// A file the user named that cannot be written there (`--save-logits`).
    #[error(transparent)]
    Write(#[from] crate::atomic::WriteError),
    #[error("{0}")]
    Usage(String),
    #[error("chunk {chunk}, position {pos}: {who} logits hold a NaN or an infinity")]
    NonFinite { who: &'static str, chunk: usize, pos: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("internal error: {0}")]
    Internal(String),
}

/// A text as the model reads it for scoring: chunks of `ctx` token ids, each run
/// from an empty KV cache; in each, the rows at positions `first ..= ctx − 2` are
/// scored (the row at position p predicts the token at p + 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Text {
    pub ctx: usize,
    pub first: usize,
    pub chunks: Vec<Vec<u32>>,
}

impl Text {
    /// `ids` as llama-perplexity cuts them: whole chunks of `ctx` (at most
    /// `limit`), the first token of each replaced by `bos` when the vocabulary
    /// adds one, the second half of each (from `ctx / 2`) scored.
    pub fn chunked(ids: &[u32], bos: Option<u32>, ctx: usize, limit: Option<usize>) -> Result<Text, EvalError> {
        if ctx < 4 {
            return Err(EvalError::Usage(format!("--ctx {ctx}: a chunk needs at least 4 tokens")));
        }
        let whole = ids.len() / ctx;
        if whole == 0 {
            return Err(EvalError::Usage(format!(
                "the text is {} tokens, shorter than one chunk of --ctx {ctx}: give a longer text or a smaller --ctx",
                ids.len()
            )));
        }
        let n = limit.map_or(whole, |l| l.min(whole));
        let chunks = ids
            .chunks_exact(ctx)
            .take(n)
            .map(|c| {
                let mut c = c.to_vec();
                if let Some(b) = bos {
                    c[0] = b;
                }
                c
            })
            .collect();
        Ok(Text { ctx, first: ctx / 2, chunks })
    }

    /// One chunk, `ids`, scored from position `first` (`bench --kld`'s prompt).
    pub fn single(ids: Vec<u32>, first: usize) -> Text {
        Text { ctx: ids.len(), first, chunks: vec![ids] }
    }

    /// Scored rows per chunk.
    pub fn rows_per_chunk(&self) -> usize {
        self.ctx.saturating_sub(1 + self.first)
    }

    /// Scored rows in all.
    pub fn positions(&self) -> usize {
        self.chunks.len() * self.rows_per_chunk()
    }

    /// The header of a logits file of this text's rows.
    pub fn header(&self, vocab: usize, dtype: LogitsDtype) -> Header {
        Header { dtype, vocab, ctx: self.ctx, first: self.first, chunks: self.chunks.len() }
    }

    /// Whether `file` holds the rows of this text for a model of `vocab` tokens
    /// (it may hold more chunks than are scored: the first ones are used). Reads
    /// the file's token ids a chunk at a time.
    pub fn check_reference<R: std::io::Read + std::io::Seek>(&self, file: &mut LogitsReader<R>, vocab: usize) -> Result<(), EvalError> {
        let h = file.header.clone();
        let bad = |msg: String| EvalError::Mismatch { path: file.path.clone(), msg };
        if h.vocab != vocab {
            return Err(bad(format!(
                "saved with a vocabulary of {}, the model has {vocab}: a reference must share the tokenizer",
                h.vocab
            )));
        }
        if (h.ctx, h.first) != (self.ctx, self.first) {
            return Err(bad(format!(
                "saved with --ctx {} (scored from {}), this run uses --ctx {}: give the same --ctx",
                h.ctx, h.first, self.ctx
            )));
        }
        if h.chunks < self.chunks.len() {
            return Err(bad(format!(
                "holds {} chunks, this run scores {}: give --chunks {} or save the reference with more",
                h.chunks,
                self.chunks.len(),
                h.chunks
            )));
        }
        let mut theirs = Vec::new();
        for (c, mine) in self.chunks.iter().enumerate() {
            file.next_tokens(&mut theirs)?;
            if let Some(i) = mine.iter().zip(&theirs).position(|(a, b)| a != b) {
                return Err(EvalError::Mismatch {
                    path: file.path.clone(),
                    msg: format!(
                        "its tokens differ from this run's at chunk {c} position {i} ({} vs {}): it was saved from another text or tokenizer",
                        theirs[i], mine[i]
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Bytes of text encoded at once ([`tokenize`]): the `tokenizers` crate holds
/// ~170 bytes per byte of the text it encodes (its normalized strings with a
/// byte alignment each, every token's string and offsets), so a 4 MB text
/// encoded whole peaked at 800 MB, and the 256 MB `--file` limit would have
/// needed ~45 GB.
pub const TOKENIZE_WINDOW: usize = 256 << 10;
/// Bytes past each cut encoded on both sides of it to check the cut changes nothing.
pub const TOKENIZE_MARGIN: usize = 8 << 10;

/// `text` encoded as llama-perplexity encodes it (the special tokens the
/// vocabulary adds, a BOS first where it adds one), and that BOS id, which then
/// also starts every chunk. A long text is encoded a window at a time
/// ([`encode_windowed`]), to the same ids.
pub fn tokenize(tok: &Tokenizer, text: &str) -> Result<(Vec<u32>, Option<u32>), EvalError> {
    let ids = encode_windowed(tok, text, TOKENIZE_WINDOW, TOKENIZE_MARGIN)?;
    // The BOS the post-processor adds: a probe with and without the special tokens.
    let (with, without) = (tok.encode_with("a", true)?, tok.encode_with("a", false)?);
    let bos = (with.len() > without.len() && with[1..].starts_with(&without)).then(|| with[0]);
    Ok((ids, bos))
}

/// `tok.encode_with(text, true)`, in memory proportional to `window` rather than
/// to the text: the text cut near every `window` bytes, each piece encoded
/// alone (the special tokens the post-processor adds put around the whole). A
/// cut is kept only where it changes nothing: the piece before it encoded with
/// `margin` bytes past the cut must end with exactly the ids of those `margin`
/// bytes encoded alone (so no token spans the cut, the tokens before it do not
/// depend on what follows, and the text after it encodes from the cut as it
/// does joined: a prefix space, a merge across). Cuts are tried at a space or a
/// line end; where none of a few holds, the text is encoded whole.
pub fn encode_windowed(tok: &Tokenizer, text: &str, window: usize, margin: usize) -> Result<Vec<u32>, EvalError> {
    Ok(windows(tok, text, window, margin)?.0)
}

/// [`encode_windowed`], and how many cuts it made.
fn windows(tok: &Tokenizer, text: &str, window: usize, margin: usize) -> Result<(Vec<u32>, usize), EvalError> {
    let whole = |tok: &Tokenizer| -> Result<(Vec<u32>, usize), EvalError> { Ok((tok.encode_with(text, true)?, 0)) };
    if text.len() <= window + margin {
        return whole(tok);
    }
    // What the post-processor puts around a text: a probe.
    let (with, without) = (tok.encode_with("a", true)?, tok.encode_with("a", false)?);
    let Some(at) = (0..=with.len().saturating_sub(without.len())).find(|&i| with[i..].starts_with(&without)) else {
        return whole(tok);
    };
    let (prefix, suffix) = (&with[..at], &with[at + without.len()..]);
    let mut ids = prefix.to_vec();
    let (mut pos, mut made) = (0, 0);
    while text.len() - pos > window + margin {
        let mut cut = None;
        for c in cuts(text, pos + window, margin) {
            let end = floor_char(text, c + margin);
            let (piece, after) = (tok.encode_with(&text[pos..end], false)?, tok.encode_with(&text[c..end], false)?);
            if !after.is_empty() && piece.len() > after.len() && piece.ends_with(&after) {
                ids.extend_from_slice(&piece[..piece.len() - after.len()]);
                cut = Some(c);
                break;
            }
        }
        match cut {
            Some(c) => (pos, made) = (c, made + 1),
            None => return whole(tok),
        }
    }
    ids.extend(tok.encode_with(&text[pos..], false)?);
    ids.extend_from_slice(suffix);
    Ok((ids, made))
}

/// Where to try cutting `text` near `at` (before `at + margin / 2`): before a
/// space that follows a character that is not one, after a line end followed by
/// one that is not; else at character boundaries.
fn cuts(text: &str, at: usize, margin: usize) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let stop = (at + margin / 2).min(text.len());
    let mut i = floor_char(text, at);
    while i < stop && out.len() < 6 {
        let prev = bytes[i - 1];
        let nice = (bytes[i] == b' ' && !prev.is_ascii_whitespace()) || (prev == b'\n' && !bytes[i].is_ascii_whitespace());
        if nice {
            out.push(i);
            i += margin / 16;
        }
        i += 1;
        while i < text.len() && !text.is_char_boundary(i) {
            i += 1;
        }
    }
    if out.is_empty() {
        out.extend((0..4).map(|k| floor_char(text, at + k * 97)).filter(|&c| c > 0 && c < text.len()));
    }
    out
}

/// The largest character boundary of `text` at or before `i` (its length past it).
fn floor_char(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Where the reference's log-probabilities come from.
pub enum Reference<'a> {
    /// An engine of the same model, run on the same chunks in step.
    Engine(&'a mut Engine),
    /// A saved logits file, checked against the text ([`Text::check_reference`]).
    File(&'a mut LogitsReader),
}

/// What [`evaluate`] measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub perplexity: Perplexity,
    pub divergence: Option<Divergence>,
}

/// Scores `text` on `engine` (built with every position's logits,
/// [`scoring_engine`]): each chunk from an empty KV cache, in passes of the
/// plan's prompt size; each scored row's log-probabilities go to the perplexity,
/// to `save` when given, and against `reference`'s row at the same position.
/// `progress` sees one step per chunk.
pub fn evaluate(
    text: &Text,
    engine: &mut Engine,
    mut reference: Option<Reference<'_>>,
    mut save: Option<&mut LogitsWriter>,
    progress: &dyn Progress,
) -> Result<Outcome, EvalError> {
    let pass = engine.plan.options.max_tokens.max(1);
    if !engine.plan.options.all_logits || engine.plan.options.context < text.ctx {
        return Err(EvalError::Internal("the scoring engine needs every position's logits and a context of a chunk".into()));
    }
    let mut nll = NllSum::default();
    let mut div = DivergenceSum::default();
    let (mut lp, mut lp_ref) = (Vec::new(), Vec::new());
    progress.phase("", text.chunks.len() as u64);
    for (c, chunk) in text.chunks.iter().enumerate() {
        engine.reset();
        if let Some(Reference::Engine(r)) = &mut reference {
            r.reset();
        }
        // The last token's row predicts nothing: it is not run.
        let run_len = chunk.len() - 1;
        let mut start = 0;
        while start < run_len {
            let end = (start + pass).min(run_len);
            let rows = forward(engine, &chunk[start..end])?;
            let ref_rows = match &mut reference {
                Some(Reference::Engine(r)) => Some(forward(r, &chunk[start..end])?),
                _ => None,
            };
            for p in start.max(text.first)..end {
                let i = p - start;
                if !log_softmax(&rows[i], &mut lp) {
                    return Err(EvalError::NonFinite { who: "the model's", chunk: c, pos: p });
                }
                nll.add(&lp, chunk[p + 1]);
                if let Some(w) = save.as_deref_mut() {
                    w.row(&lp)?;
                }
                match (&mut reference, &ref_rows) {
                    (Some(Reference::File(f)), _) => f.next_row(&mut lp_ref)?,
                    (Some(Reference::Engine(_)), Some(r)) => {
                        if !log_softmax(&r[i], &mut lp_ref) {
                            return Err(EvalError::NonFinite { who: "the reference's", chunk: c, pos: p });
                        }
                    }
                    _ => continue,
                }
                div.add(&lp_ref, &lp);
            }
            start = end;
        }
        progress.tick();
    }
    progress.done();
    Ok(Outcome { perplexity: nll.finish(), divergence: reference.is_some().then(|| div.finish()) })
}

/// One pass of `tokens` at the engine's position: a row per token.
fn forward(engine: &mut Engine, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EvalError> {
    let rows = engine.forward(tokens)?;
    if rows.len() != tokens.len() {
        return Err(EvalError::Internal(format!("{} logits rows for a pass of {} tokens", rows.len(), tokens.len())));
    }
    Ok(rows)
}

/// Tokens per pass of a scoring engine: a chunk at once, as long as the pass's
/// logits (`tokens × vocab` floats) stay near 128 MiB.
pub fn pass_tokens(ctx: usize, vocab: usize) -> usize {
    ctx.min((32 << 20) / vocab.max(1)).clamp(1, ctx.max(1))
}

/// What a scoring engine runs.
pub enum Path {
    /// This selection, with the execution's layouts and KV cache.
    Selected(Box<Selection>),
    /// The f32 reference ([`f32_reference`]).
    F32Reference,
}

/// `opts` for scoring chunks of `ctx` tokens: every position's logits, passes of
/// [`pass_tokens`], a KV cache of a chunk.
pub fn scoring_options(mut opts: PlanOptions, ctx: usize, vocab: usize) -> PlanOptions {
    opts.all_logits = true;
    opts.max_tokens = pass_tokens(ctx, vocab);
    opts.context = ctx;
    opts
}

/// The f32 reference: `opts` with the weights in their plain layouts (no
/// repacking) and an f32 KV cache, and the CPU's exact defaults
/// ([`Selection::defaults`]: f32 activations), so that every product is exact
/// against the dequantized weights. Run on the CPU.
pub fn f32_reference(mut opts: PlanOptions) -> (PlanOptions, Selection) {
    opts.cpu_repack.clear();
    opts.kv_dtype = DType::F32;
    (opts, Selection::defaults(DeviceCaps::Cpu(CpuCaps::detect())))
}

/// A warmed engine that scores chunks of `ctx` ([`scoring_options`]): `path`
/// with `exec`'s plan options, executing as `exec` says ([`Engines::build`]).
pub fn scoring_engine(
    build: &Engines<'_>,
    settings: &ModelSettings,
    m: &LoadedModel,
    path: Path,
    exec: &ExecSettings,
    ctx: usize,
) -> Result<Engine, EvalError> {
    let opts = scoring_options(settings.plan_options(m, exec, 1, ctx, true), ctx, m.config.dims.vocab_size);
    let (opts, selection) = match path {
        Path::Selected(s) => (opts, *s),
        Path::F32Reference => f32_reference(opts),
    };
    Ok(build.build(opts, selection, exec)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WeightFile;

    #[test]
    fn chunks_take_a_bos_each_and_score_their_second_half() {
        let ids: Vec<u32> = (10..31).collect();
        let t = Text::chunked(&ids, Some(1), 8, None).expect("chunks");
        assert_eq!(t.chunks, vec![vec![1, 11, 12, 13, 14, 15, 16, 17], vec![1, 19, 20, 21, 22, 23, 24, 25]]);
        assert_eq!((t.first, t.rows_per_chunk(), t.positions()), (4, 3, 6));
        let t = Text::chunked(&ids, None, 8, Some(1)).expect("chunks");
        assert_eq!(t.chunks, vec![(10..18).collect::<Vec<u32>>()]);
        assert!(Text::chunked(&ids, None, 32, None).is_err());
    }

    /// Windowed encoding gives the ids of the whole text, for each kind of
    /// tokenizer the fixtures hold (byte-level BPE with the GPT-2, SmolLM, Llama 3
    /// and Qwen 2 splits; SentencePiece with a BOS, Gemma's).
    #[test]
    fn a_text_encoded_by_windows_gives_the_ids_encoded_whole() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let base = std::fs::read_to_string(root.join("tests/data/eval.txt")).expect("text");
        // Line ends, runs of spaces, digits, multi-byte characters across the cuts.
        let text = format!("{base}\n\n  12345 — naïve 漢字 🦀  x\n").repeat(24);
        let mut seen = 0;
        for f in [
            "gguf/smollm2-tiny-q8_0.gguf",
            "gguf/qwen2-tiny-q8_0.gguf",
            "gguf/llama-k-q4_k_m.gguf",
            "gguf/gemma3-tiny-q8_0.gguf",
            "spm/llama.gguf",
            "spm/llama-noprefix.gguf",
            "spm/gemma3.gguf",
        ] {
            let path = root.join("tests/fixtures").join(f);
            let Ok(file) = crate::model::gguf::GgufFile::open(&path) else { continue };
            let Ok(tok) = Tokenizer::from_gguf(&file) else { continue };
            let whole = tok.encode_with(&text, true).expect("encode");
            for (window, margin) in [(4096, 512), (1000, 300), (20_000, 2048)] {
                let (got, cuts) = windows(&tok, &text, window, margin).expect("encode");
                assert!(got == whole, "{f}, window {window}: {} ids windowed, {} whole", got.len(), whole.len());
                assert!(cuts >= text.len() / (window + margin) / 2, "{f}, window {window}: only {cuts} cuts held");
            }
            seen += 1;
        }
        assert!(seen >= 4, "only {seen} tokenizer fixtures found");
    }

    #[test]
    fn a_pass_holds_a_chunk_unless_the_vocabulary_is_large() {
        assert_eq!(pass_tokens(512, 49152), 512);
        assert_eq!(pass_tokens(512, 262144), 128);
        assert_eq!(pass_tokens(64, 256), 64);
    }
}
