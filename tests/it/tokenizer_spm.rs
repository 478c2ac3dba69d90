//! SentencePiece vocabularies from GGUF metadata (`tokenizer.ggml.model =
//! "llama"`): ktune encodes and decodes the fixtures in tests/fixtures/spm/ as
//! transformers does (tools/make_spm_gguf.py wrote the expected ids), with byte
//! fallback, both prefix-space settings and control tokens; metadata whose sizes
//! disagree is an error naming the problem, never a panic.

use std::path::Path;

use crate::common::fixtures_dir;
use ktune::model::gguf::{Array, GgufFile, Value};
use ktune::model::{Tokenizer, WeightFile};
use serde_json::Value as Json;

fn open(name: &str) -> GgufFile {
    GgufFile::open(&fixtures_dir().join("spm").join(format!("{name}.gguf"))).expect("fixture opens")
}

fn expected(name: &str) -> Json {
    let text = std::fs::read_to_string(fixtures_dir().join("spm").join(format!("{name}.json"))).expect("expected ids");
    serde_json::from_str(&text).expect("json")
}

fn check_cases(name: &str) {
    let tok = Tokenizer::from_gguf(&open(name)).expect("tokenizer builds");
    let exp = expected(name);
    assert_eq!(tok.vocab_size() as u64, exp["vocab_size"].as_u64().unwrap(), "{name}: vocabulary size");
    for case in exp["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tok.encode(text).expect("encodes");
        assert_eq!(got, want, "{name}: ids of {text:?}");
        let decoded = tok.decode(&got).expect("decodes");
        assert_eq!(decoded, case["decoded"].as_str().unwrap(), "{name}: decoding the ids of {text:?}");
    }
}

#[test]
fn gemma3_vocabulary_matches_transformers() {
    check_cases("gemma3");
}

#[test]
fn llama_vocabulary_with_space_prefix_matches_transformers() {
    check_cases("llama");
}

#[test]
fn llama_vocabulary_without_space_prefix_matches_transformers() {
    check_cases("llama-noprefix");
}

#[test]
fn byte_fallback_and_prefix_behaviour() {
    let gemma = Tokenizer::from_gguf(&open("gemma3")).unwrap();
    // A character outside the vocabulary is its UTF-8 bytes.
    let ids = gemma.encode_with("🦀", false).unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| gemma.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces, ["<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"]);
    assert_eq!(gemma.decode(&ids).unwrap(), "🦀");
    // A cut character decodes to U+FFFD until its last byte arrives.
    assert!(gemma.decode(&ids[..2]).unwrap().ends_with('\u{FFFD}'));
    // Without a prefix space the first word has no "▁"; with one it does.
    let first = |t: &Tokenizer, text: &str| t.id_to_token(t.encode_with(text, false).unwrap()[0]).unwrap();
    assert!(!first(&gemma, "the").starts_with('\u{2581}'));
    let llama = Tokenizer::from_gguf(&open("llama")).unwrap();
    assert!(first(&llama, "the").starts_with('\u{2581}'));
    let plain = Tokenizer::from_gguf(&open("llama-noprefix")).unwrap();
    assert!(!first(&plain, "the").starts_with('\u{2581}'));
    // Special tokens in the text are matched whole; BOS only once when the text writes it.
    let bos = gemma.token_to_id("<bos>").unwrap();
    let ids = gemma.encode_with("<bos><start_of_turn>user", false).unwrap();
    assert_eq!(ids[..2], [bos, gemma.token_to_id("<start_of_turn>").unwrap()]);
    assert_eq!(ids.iter().filter(|&&i| i == bos).count(), 1);
}

/// A GGUF image with `meta` and, optionally, a `token_embd.weight` of `rows` × 4 F32.
fn gguf_bytes(meta: &[(String, Value)], embd_rows: Option<usize>) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn ty(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }
    fn value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.extend(x.to_le_bytes()),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::Str(s) => string(out, s),
            Value::Array(a) => {
                out.extend(a.elem_type().to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                a.values().for_each(|x| value(out, &x));
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
        }
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((embd_rows.is_some() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        string(&mut out, k);
        out.extend(ty(v).to_le_bytes());
        value(&mut out, v);
    }
    if let Some(rows) = embd_rows {
        string(&mut out, "token_embd.weight");
        out.extend(2u32.to_le_bytes());
        out.extend(4u64.to_le_bytes());
        out.extend((rows as u64).to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.resize(out.len().next_multiple_of(32), 0);
        out.resize(out.len() + rows * 16, 0);
    }
    out
}

/// The gemma3 fixture's metadata with `edit` applied, as a tokenizer (or its error).
fn edited(edit: impl FnOnce(&mut Vec<(String, Value)>), embd_rows: Option<usize>) -> Result<Tokenizer, String> {
    let mut meta = open("gemma3").meta.clone();
    edit(&mut meta);
    let f = GgufFile::parse(Path::new("edited.gguf"), gguf_bytes(&meta, embd_rows)).map_err(|e| e.to_string())?;
    Tokenizer::from_gguf(&f).map_err(|e| e.to_string())
}

/// `v`, an array, with its elements edited by `f`.
fn edit_array(v: &mut Value, f: impl FnOnce(&mut Vec<Value>)) {
    if let Value::Array(a) = v {
        let mut values: Vec<Value> = a.values().collect();
        f(&mut values);
        *a = Array::from_values(values).expect("elements of one type");
    }
}

fn set(meta: &mut [(String, Value)], key: &str, f: impl FnOnce(&mut Value)) {
    f(&mut meta.iter_mut().find(|(k, _)| k == key).expect("key present").1);
}

#[test]
fn the_writer_round_trips() {
    let n = open("gemma3").get("tokenizer.ggml.tokens").and_then(Value::as_array).unwrap().len();
    edited(|_| {}, None).expect("unchanged metadata");
    edited(|_| {}, Some(n)).expect("embedding rows equal to the vocabulary");
}

#[test]
fn inconsistent_vocabularies_are_errors() {
    let n = open("gemma3").get("tokenizer.ggml.tokens").and_then(Value::as_array).unwrap().len();
    let cases: Vec<(&str, Result<Tokenizer, String>)> = vec![
        ("`tokenizer.ggml.scores` has", edited(|m| set(m, "tokenizer.ggml.scores", |v| edit_array(v, |a| _ = a.pop())), None)),
        (
            "`tokenizer.ggml.token_type` has",
            edited(|m| set(m, "tokenizer.ggml.token_type", |v| edit_array(v, |a| a.push(Value::I32(1)))), None),
        ),
        ("`tokenizer.ggml.bos_token_id` is 9999", edited(|m| set(m, "tokenizer.ggml.bos_token_id", |v| *v = Value::U32(9999)), None)),
        (
            "`tokenizer.ggml.unknown_token_id` is",
            edited(|m| set(m, "tokenizer.ggml.unknown_token_id", |v| *v = Value::U32(n as u32)), None),
        ),
        ("embedding `token_embd.weight` has", edited(|_| {}, Some(n + 2))),
        ("`tokenizer.ggml.add_bos_token` is true but there is no", edited(|m| m.retain(|(k, _)| k != "tokenizer.ggml.bos_token_id"), None)),
        (
            "`tokenizer.ggml.scores` must be an array of numbers",
            edited(|m| set(m, "tokenizer.ggml.scores", |v| *v = Value::Str("x".into())), None),
        ),
    ];
    for (want, got) in cases {
        match got {
            Ok(_) => panic!("expected an error containing {want:?}, the tokenizer built"),
            Err(e) => assert!(e.contains(want), "error {e:?} does not contain {want:?}"),
        }
    }
}

/// The published chat templates (tests/fixtures/chat_templates/) render one user
/// turn as transformers' `apply_chat_template` does (today's date in Llama 3.2's
/// written DATE on both sides).
#[test]
fn chat_templates_render_as_transformers() {
    use ktune::model::ChatTemplate;
    let dir = fixtures_dir().join("chat_templates");
    let exp: Json = serde_json::from_str(&std::fs::read_to_string(dir.join("rendered.json")).unwrap()).unwrap();
    let date = regex::Regex::new("Today Date: [^\n]*").unwrap();
    let exp = exp.as_object().unwrap();
    assert_eq!(exp.len(), 4, "gemma3, llama3.2, qwen2.5, smollm2");
    for (file, e) in exp {
        let t = ChatTemplate {
            source: std::fs::read_to_string(dir.join(file)).unwrap(),
            bos_token: e["bos_token"].as_str().map(str::to_string),
            eos_token: e["eos_token"].as_str().map(str::to_string),
            path: dir.join(file),
        };
        let got = t.render_user(e["prompt"].as_str().unwrap()).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(date.replace_all(&got, "Today Date: DATE"), e["text"].as_str().unwrap(), "{file}");
    }
}

/// The Gemma 3 fixture's own template, encoded as `apply_chat_template(tokenize=True)`:
/// the BOS the template writes is the only one.
#[test]
fn gguf_chat_template_encodes_as_transformers() {
    use ktune::model::ChatTemplate;
    let f = open("gemma3");
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let t = ChatTemplate::from_gguf(&f).unwrap().expect("the fixture has a template");
    assert_eq!(t.bos_token.as_deref(), Some("<bos>"));
    let chat = &expected("gemma3")["chat"];
    let text = t.render_user(chat["prompt"].as_str().unwrap()).unwrap();
    assert_eq!(text, chat["text"].as_str().unwrap());
    let want: Vec<u32> = chat["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(tok.encode_with(&text, false).unwrap(), want);
    assert!(ChatTemplate::from_gguf(&open("llama")).unwrap().is_none());
}
