//! [`Tokenizer`]: a model directory's Hugging Face `tokenizer.json` (text to
//! token ids and back), read with the `tokenizers` crate built without C code
//! (its regexes through fancy-regex).
//!
//! Encoding adds the special tokens the file's post-processor asks for (a BOS
//! for Llama 3, none for SmolLM2), as `transformers` does by default; decoding
//! drops special tokens, as a chat front end shows generated text.

use std::path::{Path, PathBuf};

use super::{ModelError, Result};

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
