//! [`Tokenizer`]: a model directory's Hugging Face `tokenizer.json` (text to
//! token ids and back), read with the `tokenizers` crate built without C code
//! (its regexes through fancy-regex); or the tokenizer a GGUF file describes in
//! its `tokenizer.ggml.*` metadata ([`Tokenizer::from_gguf`]: byte-level BPE,
//! `tokenizer.ggml.model = "gpt2"`, with the pre-tokenizer `tokenizer.ggml.pre`
//! names, as llama.cpp splits text for it).
//!
//! Encoding adds the special tokens the file's post-processor asks for (a BOS
//! for Llama 3, none for SmolLM2), as `transformers` does by default; decoding
//! drops special tokens, as a chat front end shows generated text.

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

/// The file name a Hugging Face model directory keeps its tokenizer in.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
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
        // Read first so a missing file is an I/O error that names it.
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
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
            Some("llama") => {
                return Err(err("a SentencePiece tokenizer (`tokenizer.ggml.model = \"llama\"`, Gemma and Llama 2) is not supported yet: give the prompt as token ids with --tokens".into()));
            }
            Some(other) => {
                return Err(err(format!(
                    "tokenizer model `{other}` is not supported (only gpt2, byte-level BPE): give the prompt as token ids with --tokens"
                )));
            }
            None => {
                return Err(err(
                    "no tokenizer in the file (`tokenizer.ggml.model` is missing): give the prompt as token ids with --tokens".into(),
                ));
            }
        }
        let strings = |key: &str| -> Result<Vec<&str>> {
            let Some(v) = f.get(key) else { return Err(err(format!("`{key}` is missing"))) };
            let a = v.as_array().ok_or_else(|| err(format!("`{key}` must be an array of strings")))?;
            a.iter().map(|s| s.as_str().ok_or_else(|| err(format!("`{key}` must be an array of strings")))).collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = match f.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(a) if a.len() == tokens.len() => a.iter().map(|t| t.as_u64().unwrap_or(1)).collect(),
            Some(a) => return Err(err(format!("`tokenizer.ggml.token_type` has {} entries for {} tokens", a.len(), tokens.len()))),
            None => vec![1; tokens.len()],
        };
        let pre = f.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
        let split = match pre {
            "default" | "gpt2" | "gpt-2" => GPT2_SPLIT,
            "smollm" => GPT2_SPLIT,
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" => Some(LLAMA3_SPLIT),
            "qwen2" | "deepseek-r1-qwen" => Some(QWEN2_SPLIT),
            other => {
                return Err(err(format!(
                    "pre-tokenizer `{other}` (`tokenizer.ggml.pre`) is not supported (known: default, gpt2, smollm, llama-bpe, qwen2): give the prompt as token ids with --tokens"
                )));
            }
        };
        let mut pre_tokenizers = Vec::new();
        if pre == "smollm" {
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
        for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
            vocab.insert(t.to_string(), json!(i));
            // 3: control (special), 4: user-defined (kept whole, not special).
            if *ty == 3 || *ty == 4 {
                added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": *ty == 3}));
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
        let id = |key: &str| f.get(key).and_then(Value::as_u64).filter(|&t| (t as usize) < tokens.len());
        let add_bos = f.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(false);
        let post = match (add_bos, id("tokenizer.ggml.bos_token_id")) {
            (true, Some(bos)) => {
                let b = tokens[bos as usize];
                json!({
                    "type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {b: {"id": b, "ids": [bos], "tokens": [b]}}
                })
            }
            (true, None) => {
                return Err(err("`tokenizer.ggml.add_bos_token` is true but there is no valid `tokenizer.ggml.bos_token_id`".into()));
            }
            (false, _) => json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}),
        };
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
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| ModelError::Tokenizer { path: self.path.clone(), msg: format!("encoding the prompt failed: {e}") })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens left out. Bytes that are not valid UTF-8
    /// (a multi-byte character cut between tokens) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| ModelError::Tokenizer { path: self.path.clone(), msg: format!("decoding ids {ids:?} failed: {e}") })
    }
}
