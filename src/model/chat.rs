//! [`ChatTemplate`]: a model's chat template (the GGUF `tokenizer.chat_template`
//! string, or `chat_template` in a Hugging Face directory's
//! `tokenizer_config.json`) rendered with minijinja the way transformers'
//! `apply_chat_template` renders it: `trim_blocks` and `lstrip_blocks`, Python
//! string methods (`.strip()`, `.startswith()`, … through minijinja-contrib's
//! pycompat), `raise_exception`, `strftime_now`, `tojson`, and the vocabulary's
//! `bos_token` / `eos_token` as variables.
//!
//! `ktune run --chat` renders `--prompt` as one user turn with
//! `add_generation_prompt = true`. The rendered text is encoded without the
//! tokenizer's post-processor (as `apply_chat_template(tokenize=True)` does), so a
//! template that writes the BOS itself gets exactly one.
//!
//! A template comes with the model file, so rendering is bounded: at most
//! [`FUEL`] minijinja instructions and [`MAX_RENDERED`] bytes of output, each an
//! error naming the limit. With fuel on, minijinja also checks the estimated size
//! of a repetition's or concatenation's result against the fuel left before it
//! builds it, so a template cannot grow strings without bound either.

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde_json::Value as Json;

use super::gguf::{GgufFile, Value};
use super::{ModelError, Result};

/// The file a Hugging Face model directory keeps its chat template (and special
/// token names) in.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// Tokens that end a chat turn in the published templates (Gemma, ChatML,
/// Llama 3): generation under `--chat` stops at any of them the vocabulary has.
pub const END_OF_TURN_TOKENS: [&str; 3] = ["<end_of_turn>", "<|im_end|>", "<|eot_id|>"];

/// Most bytes of a `--chat-template` file (the published templates are a few kB).
const MAX_TEMPLATE_BYTES: u64 = 1 << 20;
/// Most instructions one rendering may run: a published template renders a
/// turn in a few hundred, and nested loops over `range()` must not hang a run.
const FUEL: u64 = 1_000_000;
/// Most bytes a rendering may produce (a prompt longer than any context).
const MAX_RENDERED: usize = 8 << 20;

/// The rendered text, refusing to grow past [`MAX_RENDERED`].
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED {
            let msg = format!("the rendered text passes {} MiB, more than any context holds", MAX_RENDERED >> 20);
            return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, msg));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A chat template and the special-token texts it renders with.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    pub source: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Where it was read from, for messages.
    pub path: PathBuf,
}

impl ChatTemplate {
    /// The template of a GGUF file (`tokenizer.chat_template`), BOS/EOS spelled as
    /// its vocabulary spells them; `Ok(None)` without a template.
    pub fn from_gguf(f: &GgufFile) -> Result<Option<ChatTemplate>> {
        let err = |msg: String| ModelError::Chat { path: f.path.clone(), msg };
        let Some(v) = f.get("tokenizer.chat_template") else { return Ok(None) };
        let source = v.as_str().ok_or_else(|| err(format!("`tokenizer.chat_template` must be a string, got {}", v.type_name())))?;
        let (bos_token, eos_token) = Self::gguf_specials(f);
        Ok(Some(ChatTemplate { source: source.to_string(), bos_token, eos_token, path: f.path.clone() }))
    }

    /// The BOS and EOS token texts of a GGUF file's vocabulary.
    pub fn gguf_specials(f: &GgufFile) -> (Option<String>, Option<String>) {
        let tokens = f.get("tokenizer.ggml.tokens").and_then(Value::as_array);
        let token = |key: &str| -> Option<String> {
            let id = f.get(key)?.as_u64()?;
            tokens?.str_at(usize::try_from(id).ok()?).map(str::to_string)
        };
        (token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"))
    }

    /// A template from a Jinja file (`--chat-template`), with the model's BOS and
    /// EOS token texts.
    pub fn from_file(path: &Path, bos_token: Option<String>, eos_token: Option<String>) -> Result<ChatTemplate> {
        let source = crate::input::read_text_limited(path, MAX_TEMPLATE_BYTES, "a chat template")
            .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        Ok(ChatTemplate { source, bos_token, eos_token, path: path.to_path_buf() })
    }

    /// The template of a model directory's `tokenizer_config.json` (a string, or
    /// the `default` entry of a list of named templates); `Ok(None)` when there is
    /// no such file or it has no template.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let path = dir.join(TOKENIZER_CONFIG_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let bytes = std::fs::read(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let doc: Json = serde_json::from_slice(&bytes).map_err(|source| ModelError::Json { path: path.clone(), source })?;
        let source = match &doc["chat_template"] {
            Json::Null => return Ok(None),
            Json::String(s) => s.clone(),
            Json::Array(named) => {
                let default = named.iter().find(|t| t["name"] == "default").and_then(|t| t["template"].as_str());
                match default {
                    Some(s) => s.to_string(),
                    None => {
                        return Err(ModelError::Chat { path, msg: "`chat_template` lists templates but none named `default`".into() });
                    }
                }
            }
            other => return Err(ModelError::Chat { path, msg: format!("`chat_template` must be a string, got {other}") }),
        };
        // A special token is a string or an AddedToken object with its `content`.
        let token = |key: &str| match &doc[key] {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
            _ => None,
        };
        Ok(Some(ChatTemplate { source, bos_token: token("bos_token"), eos_token: token("eos_token"), path }))
    }

    /// `prompt` as one user turn, followed by the assistant's generation prompt.
    pub fn render_user(&self, prompt: &str) -> Result<String> {
        self.render_messages(&[("user", prompt)])
    }

    /// A conversation of `(role, content)` turns (`system`, `user`, `assistant`),
    /// followed by the assistant's generation prompt.
    pub fn render_messages(&self, turns: &[(&str, &str)]) -> Result<String> {
        let messages: Vec<minijinja::Value> = turns.iter().map(|&(role, content)| context! { role => role, content => content }).collect();
        self.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        })
    }

    fn render(&self, ctx: minijinja::Value) -> Result<String> {
        let err = |e: JinjaError| {
            let mut msg = format!("the chat template does not render: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            ModelError::Chat { path: self.path.clone(), msg }
        };
        let mut env = Environment::new();
        // As transformers' sandboxed Jinja environment.
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.map_err(err)?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, format!("the template raised: {msg}")))
        });
        env.add_function("strftime_now", |format: String| -> Result<String, JinjaError> {
            jiff::fmt::strtime::format(&format, &jiff::ZonedDateTime::now())
                .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("strftime_now({format:?}): {e}")))
        });
        env.set_fuel(Some(FUEL));
        env.add_template("chat", &self.source).map_err(err)?;
        let mut out = Capped(Vec::new());
        env.get_template("chat").and_then(|t| t.render_captured_to(ctx, &mut out).map(drop)).map_err(err)?;
        // minijinja writes whole strings, so the bytes are UTF-8.
        Ok(String::from_utf8_lossy(&out.0).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate { source: source.into(), bos_token: Some("<s>".into()), eos_token: None, path: "t".into() }
    }

    #[test]
    fn python_string_methods_and_loop_controls() {
        let t = template(
            "{{ bos_token }}{% for m in messages %}{% if m.content.startswith('  ') %}{{ m.content.strip() }}{% break %}{% endif %}{% endfor %}",
        );
        assert_eq!(t.render_user("  hi  ").unwrap(), "<s>hi");
    }

    /// Nested loops over `range()` (10^10 iterations), a loop of long strings
    /// (80 GB of output) and a string doubled to 900 MB: errors naming the limit,
    /// not a hang or memory without bound (the `chat` fuzz target's time and
    /// memory limits rely on these).
    #[test]
    fn a_template_that_would_hang_or_grow_without_bound_is_refused() {
        let e = template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").render_user("x").unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        let e = template("{% for i in range(100000) %}{{ 'abcdefgh' * 100000 }}{% endfor %}").render_user("x").unwrap_err();
        assert!(e.to_string().contains("MiB"), "{e}");
        // A 900 kB string doubled ten times (900 MB): refused before it is built.
        let doubled = format!("{{% set a = 'x' * 900000 %}}{}{{{{ a|length }}}}", "{% set a = a ~ a %}".repeat(10));
        let e = template(&doubled).render_user("x").unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let e = template("{{ raise_exception('roles must alternate') }}").render_user("x").unwrap_err().to_string();
        assert!(e.contains("roles must alternate"), "{e}");
    }
}
