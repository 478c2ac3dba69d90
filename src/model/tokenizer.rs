//! [`Tokenizer`]: a model directory's Hugging Face `tokenizer.json` (text to
//! token ids and back), read with the `tokenizers` crate built without C code
//! (its regexes through fancy-regex); or the tokenizer a GGUF file describes in
//! its `tokenizer.ggml.*` metadata ([`Tokenizer::from_gguf`]: byte-level BPE,
//! `tokenizer.ggml.model = "gpt2"`, with the pre-tokenizer `tokenizer.ggml.pre`
//! names, as llama.cpp splits text for it; or SentencePiece, `model = "llama"`
//! (Gemma, Llama 2), built as transformers builds it from a GGUF file: a BPE with
//! byte fallback whose merges are recovered from the vocabulary, ordered by score,
//! or by position for Gemma).
//!
//! Where transformers (5.23) and llama.cpp disagree, the file means what
//! llama.cpp does: `tokenizer.ggml.add_space_prefix = false` is honoured for
//! every architecture (transformers prepends "▁" to a llama-architecture file's
//! text regardless).
//!
//! Encoding adds the special tokens the file's post-processor asks for (a BOS
//! for Llama 3, none for SmolLM2), as `transformers` does by default; decoding
//! drops special tokens, as a chat front end shows generated text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

use super::gguf::{GgufFile, Value};
use super::{ModelError, Result};

/// GPT-2's split (the byte-level pre-tokenizer's own regex, `use_regex: true`).
const GPT2_SPLIT: Option<&str> = None;
/// Llama 3's split (llama.cpp `llama-bpe`).
const LLAMA3_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's split: digits one by one.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's split (tiktoken's `o200k_base`, llama.cpp `gpt-4o`: Phi-4-mini):
/// letters split at case changes, contractions kept on their word.
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// The file name a Hugging Face model directory keeps its tokenizer in.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// A loaded `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

/// GGUF token types (`tokenizer.ggml.token_type`, llama.cpp's `llama_token_type`).
const NORMAL: i64 = 1;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// The vocabulary every GGUF tokenizer has: tokens and their types, checked
/// against each other and against the embedding rows.
struct GgufVocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<i64>,
}

impl<'a> GgufVocab<'a> {
    fn read(f: &'a GgufFile) -> Result<GgufVocab<'a>> {
        let err = |msg: String| ModelError::Tokenizer { path: f.path.clone(), msg };
        let tokens = strings(f, "tokenizer.ggml.tokens")?;
        if tokens.is_empty() {
            return Err(err("`tokenizer.ggml.tokens` is empty".into()));
        }
        let types: Vec<i64> = match f.get("tokenizer.ggml.token_type") {
            None => vec![NORMAL; tokens.len()],
            Some(v) => {
                let a = v.as_array().ok_or_else(|| err("`tokenizer.ggml.token_type` must be an array of integers".into()))?;
                if a.len() != tokens.len() {
                    return Err(err(format!("`tokenizer.ggml.token_type` has {} entries for {} tokens", a.len(), tokens.len())));
                }
                a.numbers()
                    .and_then(|n| n.into_iter().map(|x| (x.fract() == 0.0).then_some(x as i64)).collect::<Option<_>>())
                    .ok_or_else(|| err("`tokenizer.ggml.token_type` must be an array of integers".into()))?
            }
        };
        if let Some(e) = f.tensor("token_embd.weight") {
            let rows = e.shape()[0];
            if rows != tokens.len() {
                return Err(err(format!(
                    "the vocabulary has {} tokens (`tokenizer.ggml.tokens`) but the embedding `token_embd.weight` has {rows} rows",
                    tokens.len()
                )));
            }
        }
        Ok(GgufVocab { tokens, types })
    }

    /// Token id `key`: None when absent, an error when out of range or not an integer.
    fn id(&self, f: &GgufFile, key: &str) -> Result<Option<u32>> {
        let Some(v) = f.get(key) else { return Ok(None) };
        match v.as_u64().and_then(|t| u32::try_from(t).ok()) {
            Some(t) if (t as usize) < self.tokens.len() => Ok(Some(t)),
            _ => Err(ModelError::Tokenizer {
                path: f.path.clone(),
                msg: format!("`{key}` is {}, not a token id of the {}-token vocabulary", v.describe(), self.tokens.len()),
            }),
        }
    }

    /// The post-processor: BOS before (`add_bos_token`, default `bos_default`),
    /// EOS after (`add_eos_token`), or None.
    fn post_processor(&self, f: &GgufFile, bos_default: bool) -> Result<Option<Json>> {
        let err = |msg: String| ModelError::Tokenizer { path: f.path.clone(), msg };
        let flag = |key: &str, default: bool| match f.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| err(format!("`{key}` must be a bool, got {}", v.describe()))),
        };
        let add_bos = flag("tokenizer.ggml.add_bos_token", bos_default)?;
        let add_eos = flag("tokenizer.ggml.add_eos_token", false)?;
        let special = |add: bool, key: &str, flag: &str| -> Result<Option<(u32, &str)>> {
            if !add {
                return Ok(None);
            }
            match self.id(f, key)? {
                Some(id) => Ok(Some((id, self.tokens[id as usize]))),
                None => Err(err(format!("`{flag}` is true but there is no `{key}`"))),
            }
        };
        let bos = special(add_bos, "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token")?;
        let eos = special(add_eos, "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_eos_token")?;
        if bos.is_none() && eos.is_none() {
            return Ok(None);
        }
        let piece = |t: &str| json!({"SpecialToken": {"id": t, "type_id": 0}});
        let mut single = Vec::new();
        let mut specials = serde_json::Map::new();
        if let Some((id, t)) = bos {
            single.push(piece(t));
            specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
        }
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        if let Some((id, t)) = eos {
            single.push(piece(t));
            specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
        }
        let mut pair = single.clone();
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        Ok(Some(json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})))
    }
}

/// An array of strings under `key`.
fn strings<'a>(f: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let err = |msg: String| ModelError::Tokenizer { path: f.path.clone(), msg };
    let Some(v) = f.get(key) else { return Err(err(format!("`{key}` is missing"))) };
    let strs = v.as_array().and_then(|a| a.strs()).ok_or_else(|| err(format!("`{key}` must be an array of strings")))?;
    Ok(strs.collect())
}

/// SentencePiece merges recovered from a vocabulary as transformers'
/// `generate_merges(vocab, vocab_scores)` does: every split of every token into
/// two tokens of the vocabulary, best merged token first (`rank`: higher is
/// better), ties by the longer left piece, then the longer right piece, then the
/// order the tokens come in (and within a token, the ids of its two pieces).
/// `ids` maps a token to its id (the last one, for a token listed twice).
fn sentencepiece_merges<'t>(order: &[&'t str], ids: &HashMap<&str, u32>, rank: &dyn Fn(&str) -> f64) -> Vec<(&'t str, &'t str)> {
    struct M<'t> {
        score: f64,
        left_len: usize,
        right_len: usize,
        l: &'t str,
        r: &'t str,
    }
    let mut merges: Vec<M<'t>> = Vec::new();
    for &tok in order {
        let score = rank(tok);
        let start = merges.len();
        for (i, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(i);
            if ids.contains_key(l) && ids.contains_key(r) {
                merges.push(M { score, left_len: l.chars().count(), right_len: r.chars().count(), l, r });
            }
        }
        merges[start..].sort_by_key(|m| (ids[m.l], ids[m.r]));
    }
    // Stable: equal keys keep the order above (Python's sorted(reverse=True) too).
    merges.sort_by(|a, b| b.score.total_cmp(&a.score).then(b.left_len.cmp(&a.left_len)).then(b.right_len.cmp(&a.right_len)));
    merges.into_iter().map(|m| (m.l, m.r)).collect()
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("path", &self.path).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Reads a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        // Read first so a missing file is an I/O error that names it (the
        // published ones are up to ~35 MB).
        let bytes = crate::input::read_limited(path, 1 << 30, "a tokenizer.json")
            .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| ModelError::Tokenizer { path: path.to_path_buf(), msg: format!("not a usable tokenizer.json: {e}") })?;
        Ok(Tokenizer { inner, path: path.to_path_buf() })
    }

    /// The tokenizer a GGUF file describes (`tokenizer.ggml.*`): byte-level BPE
    /// (`model = "gpt2"`) from its tokens and merges, split as `pre` says
    /// (llama-bpe / llama3, qwen2, smollm, gpt2 / default), control tokens kept
    /// whole as special tokens, a BOS prepended when `add_bos_token` says so.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        let err = |msg: String| ModelError::Tokenizer { path: f.path.clone(), msg };
        let model = f.get("tokenizer.ggml.model").and_then(Value::as_str);
        match model {
            Some("gpt2") => {}
            Some("llama") => return Tokenizer::sentencepiece(f),
            Some(other) => {
                return Err(err(format!(
                    "tokenizer model `{other}` is not supported (gpt2, byte-level BPE, and llama, SentencePiece): give the prompt as token ids with --tokens"
                )));
            }
            None => {
                return Err(err(
                    "no tokenizer in the file (`tokenizer.ggml.model` is missing): give the prompt as token ids with --tokens".into(),
                ));
            }
        }
        let vocab_meta = GgufVocab::read(f)?;
        let (tokens, types) = (&vocab_meta.tokens, &vocab_meta.types);
        let merges = strings(f, "tokenizer.ggml.merges")?;
        let pre = f.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
        let split = match pre {
            "default" | "gpt2" | "gpt-2" | "olmo" | "mpt" => GPT2_SPLIT,
            // Digits one by one, then GPT-2's split (llama.cpp groups these).
            "smollm" | "refact" | "starcoder" => GPT2_SPLIT,
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" => Some(LLAMA3_SPLIT),
            "qwen2" | "deepseek-r1-qwen" => Some(QWEN2_SPLIT),
            "gpt-4o" => Some(GPT4O_SPLIT),
            other => {
                return Err(err(format!(
                    "pre-tokenizer `{other}` (`tokenizer.ggml.pre`) is not supported (known: default, gpt2, olmo, smollm, refact, starcoder, llama-bpe, dbrx, qwen2, gpt-4o): give the prompt as token ids with --tokens"
                )));
            }
        };
        let mut pre_tokenizers = Vec::new();
        if matches!(pre, "smollm" | "refact" | "starcoder") {
            pre_tokenizers.push(json!({"type": "Digits", "individual_digits": true}));
        }
        match split {
            Some(re) => {
                pre_tokenizers.push(json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}));
                pre_tokenizers.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
            }
            None => pre_tokenizers.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})),
        }
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (i, (t, &ty)) in tokens.iter().zip(types).enumerate() {
            vocab.insert(t.to_string(), json!(i));
            // 3: control (special), 4: user-defined (kept whole, not special).
            if ty == CONTROL || ty == USER_DEFINED {
                added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": ty == CONTROL}));
            }
        }
        if vocab.len() != tokens.len() {
            return Err(err("`tokenizer.ggml.tokens` lists a token twice".into()));
        }
        let merges: Vec<Json> = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| json!([a, b]))
                    .ok_or_else(|| err(format!("merge `{m}` is not two tokens separated by a space")))
            })
            .collect::<Result<_>>()?;
        for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
            vocab_meta.id(f, key)?;
        }
        let post = vocab_meta
            .post_processor(f, false)?
            .unwrap_or_else(|| json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}));
        let doc = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": if pre.starts_with("qwen2") { json!({"type": "NFC"}) } else { Json::Null },
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": split == Some(LLAMA3_SPLIT),
                "vocab": vocab, "merges": merges
            }
        });
        let bytes = serde_json::to_vec(&doc).map_err(|e| err(e.to_string()))?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| err(format!("its tokenizer metadata does not make a tokenizer: {e}")))?;
        Ok(Tokenizer { inner, path: f.path.clone() })
    }

    /// A SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`) as transformers
    /// builds it from a GGUF file: a BPE with byte fallback over the tokens, its
    /// merges recovered from the vocabulary (best first: by `tokenizer.ggml.scores`,
    /// or for Gemma by position, with Gemma's runs of spaces spelled "▁"); spaces
    /// become "▁", with one prepended to the text when `add_space_prefix` says so
    /// (default true, as llama.cpp); control tokens and the BOS/EOS/UNK/PAD tokens
    /// are special, user-defined ones kept whole; a BOS added unless
    /// `add_bos_token` is false.
    fn sentencepiece(f: &GgufFile) -> Result<Tokenizer> {
        let err = |msg: String| ModelError::Tokenizer { path: f.path.clone(), msg };
        let meta = GgufVocab::read(f)?;
        let n = meta.tokens.len();
        let gemma = f.get("general.architecture").and_then(Value::as_str).is_some_and(|a| a.starts_with("gemma"));
        let scores: Vec<f64> = match f.get("tokenizer.ggml.scores") {
            Some(v) => {
                let a = v.as_array().ok_or_else(|| err("`tokenizer.ggml.scores` must be an array of numbers".into()))?;
                if a.len() != n {
                    return Err(err(format!("`tokenizer.ggml.scores` has {} entries for {n} tokens", a.len())));
                }
                a.numbers().ok_or_else(|| err("`tokenizer.ggml.scores` must be an array of numbers".into()))?
            }
            // Gemma's merges follow the token order, not the scores.
            None if gemma => Vec::new(),
            None => return Err(err("`tokenizer.ggml.scores` is missing: a SentencePiece vocabulary needs its scores".into())),
        };
        // Gemma files store a token of several spaces as spaces; its merges spell them "▁".
        let respelled: Vec<String> = meta
            .tokens
            .iter()
            .map(|t| if gemma && t.contains(' ') && t.trim().is_empty() { "\u{2581}".repeat(t.chars().count()) } else { t.to_string() })
            .collect();
        let tokens: Vec<&str> = respelled.iter().map(String::as_str).collect();
        // A token listed twice keeps its last id and its first place (a Python dict).
        let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
        let mut order = Vec::with_capacity(n);
        let mut score_of: HashMap<&str, f64> = HashMap::new();
        for (i, &t) in tokens.iter().enumerate() {
            if ids.insert(t, i as u32).is_none() {
                order.push(t);
            }
            if !gemma {
                score_of.insert(t, scores[i]);
            }
        }
        let position: HashMap<&str, f64> =
            if gemma { tokens.iter().enumerate().map(|(i, &t)| (t, -(i as f64))).collect() } else { HashMap::new() };
        let rank = |t: &str| if gemma { position[t] } else { score_of[t] };
        let merges: Vec<(String, String)> =
            sentencepiece_merges(&order, &ids, &rank).into_iter().map(|(l, r)| (l.to_string(), r.to_string())).collect();

        let unk = meta.id(f, "tokenizer.ggml.unknown_token_id")?;
        let mut builder = tokenizers::models::bpe::BPE::builder()
            .vocab_and_merges(ids.iter().map(|(&t, &i)| (t.to_string(), i)).collect::<tokenizers::models::bpe::Vocab>(), merges)
            .fuse_unk(true)
            .byte_fallback(true);
        // transformers' GemmaTokenizer names its unknown token; LlamaTokenizer does not.
        if gemma && let Some(u) = unk {
            builder = builder.unk_token(tokens[u as usize].to_string());
        }
        let bpe = builder.build().map_err(|e| err(format!("its vocabulary does not make a BPE model: {e}")))?;

        let prefix = match f.get("tokenizer.ggml.add_space_prefix") {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| err(format!("`tokenizer.ggml.add_space_prefix` must be a bool, got {}", v.describe())))?,
        };
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if prefix {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        let pre = json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": if prefix { "first" } else { "never" }, "split": false});
        let parse = |what: &str, v: Json| err(format!("building the {what}: {v}"));
        let pre: tokenizers::PreTokenizerWrapper = serde_json::from_value(pre.clone()).map_err(|_| parse("pre-tokenizer", pre))?;
        let dec = json!({"type": "Sequence", "decoders": decoders});
        let dec: tokenizers::DecoderWrapper = serde_json::from_value(dec.clone()).map_err(|_| parse("decoder", dec))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre));
        inner.with_decoder(Some(dec));
        if let Some(post) = meta.post_processor(f, true)? {
            let pp: tokenizers::PostProcessorWrapper = serde_json::from_value(post.clone()).map_err(|_| parse("post-processor", post))?;
            inner.with_post_processor(Some(pp));
        }
        // Special: control tokens and the named BOS/EOS/UNK/PAD; kept whole: user-defined ones.
        let mut special = vec![false; n];
        for (i, &ty) in meta.types.iter().enumerate() {
            special[i] = ty == CONTROL;
        }
        for key in ["bos", "eos", "unknown", "padding"] {
            if let Some(id) = meta.id(f, &format!("tokenizer.ggml.{key}_token_id"))? {
                special[id as usize] = true;
            }
        }
        let added = |want_special: bool| {
            (0..n)
                .filter(|&i| if want_special { special[i] } else { !special[i] && meta.types[i] == USER_DEFINED })
                .map(|i| tokenizers::AddedToken::from(tokens[i].to_string(), want_special).normalized(false))
                .collect::<Vec<_>>()
        };
        inner.add_special_tokens(added(true)).map_err(|e| err(format!("adding its special tokens: {e}")))?;
        inner.add_tokens(added(false)).map_err(|e| err(format!("adding its user-defined tokens: {e}")))?;
        Ok(Tokenizer { inner, path: f.path.clone() })
    }

    /// The tokenizer of a model directory: `Ok(None)` when it has no `tokenizer.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<Tokenizer>> {
        let path = dir.as_ref().join(TOKENIZER_FILE);
        if !path.exists() {
            return Ok(None);
        }
        Tokenizer::from_file(path).map(Some)
    }

    /// Where the tokenizer was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens the tokenizer knows, added (special) tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text`, with the special tokens the post-processor adds.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// The ids of `text`; the post-processor's special tokens (a BOS) only with
    /// `add_special`. Special tokens written in the text are matched either way
    /// (a rendered chat template that starts with the BOS text gets one BOS).
    pub fn encode_with(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| ModelError::Tokenizer { path: self.path.clone(), msg: format!("encoding the prompt failed: {e}") })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The id of a token of the vocabulary (added tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text of token `id` as the vocabulary spells it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether token `id` is one byte of byte fallback (a piece `<0xNN>`): a
    /// run of them decodes together, each to U+FFFD when the run is no UTF-8,
    /// so the text of a run is known only once it ends.
    pub fn is_byte_piece(&self, id: u32) -> bool {
        self.inner.id_to_token(id).is_some_and(|p| {
            let b = p.as_bytes();
            b.len() == 6 && b.starts_with(b"<0x") && b[5] == b'>' && b[3..5].iter().all(u8::is_ascii_hexdigit)
        })
    }

    /// The text of `ids`, special tokens left out. Bytes that are not valid UTF-8
    /// (a multi-byte character cut between tokens) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| ModelError::Tokenizer { path: self.path.clone(), msg: format!("decoding ids {ids:?} failed: {e}") })
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

    /// The pieces of tiktoken's `o200k_base` split: words cut where case turns
    /// lower-to-upper, a contraction kept on its word, digits in threes, a newline
    /// run alone, spaces before a word left to that word but one.
    #[test]
    fn the_gpt4o_split_cuts_as_o200k_does() {
        let split = Split::new(SplitPattern::Regex(super::GPT4O_SPLIT.into()), SplitDelimiterBehavior::Isolated, false).expect("regex");
        let mut s = PreTokenizedString::from("HelloWorld it's 12345 ABCdef\n\n  x");
        split.pre_tokenize(&mut s).expect("splits");
        let pieces: Vec<String> =
            s.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(p, _, _)| p.to_string()).collect();
        assert_eq!(pieces, ["Hello", "World", " it's", " ", "123", "45", " ABCdef", "\n\n", " ", " x"]);
    }
}
