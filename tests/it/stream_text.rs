//! The text a generation streams, a piece as each id comes ([`Stepper::keep`],
//! which decodes only the ids since the last whole piece), is the text of all
//! its ids decoded at once, piece by piece and in the end, for every kind of
//! vocabulary the fixtures hold: byte-level BPE (a `tokenizer.json` and GGUF
//! metadata) and SentencePiece with byte fallback, with and without the
//! space prefix; over real text (characters cut between tokens) and over
//! arbitrary ids (special tokens, stray bytes that are no character).

use crate::common::fixtures_dir;
use ktune::generate::{Limits, Stepper};
use ktune::model::gguf::GgufFile;
use ktune::model::{Tokenizer, WeightFile};

fn tokenizers() -> Vec<(String, Tokenizer)> {
    let dir = fixtures_dir();
    let mut v = vec![(
        "smollm2 tokenizer.json".to_string(),
        Tokenizer::from_file(dir.join("smollm2-tiny-bf16/tokenizer.json")).expect("tokenizer"),
    )];
    for gguf in [
        "spm/llama.gguf",
        "spm/llama-noprefix.gguf",
        "spm/gemma3.gguf",
        "gguf/qwen3-tiny-f32.gguf",
        "gguf/phi4-tiny-f32.gguf",
        "gguf/mistral-tiny-f32.gguf",
        "gguf/smollm2-tiny-q8_0.gguf",
    ] {
        let f = GgufFile::open(&dir.join(gguf)).expect("fixture opens");
        v.push((gguf.to_string(), Tokenizer::from_gguf(&f).expect("tokenizer builds")));
    }
    v
}

/// `ids` kept one at a time: the streamed pieces, joined, and the final text.
fn stream(tok: &Tokenizer, ids: &[u32], stop: &[&str]) -> (String, String) {
    let limits = Limits { max_tokens: ids.len(), stop: stop.iter().map(|s| s.to_string()).collect(), ignore_eos: true };
    let mut st = Stepper::new(&limits);
    let mut out = String::new();
    for &id in ids {
        let on = st.keep(id, Some(tok), &[], None, &mut |p| {
            out.push_str(p);
            true
        });
        if !on {
            break;
        }
    }
    let (_, _, text) = st
        .finish(Some(tok), &mut |p| {
            out.push_str(p);
            true
        })
        .expect("finishes");
    (out, text.expect("a tokenizer gives a text"))
}

#[test]
fn streamed_text_is_the_text_of_all_ids() {
    let text = "The kernel reads 42 weights in the café. 東京の天気は晴れ 🚀🚀 naïve\n\n  x  déjà-vu, Ωmega; end.";
    for (name, tok) in tokenizers() {
        let n = tok.vocab_size() as u64;
        let mut cases = vec![tok.encode(text).expect("encodes")];
        // Arbitrary ids (a fixed xorshift): special tokens, byte pieces that
        // make no character, words.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in [1, 7, 64, 300] {
            cases.push(
                (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % n) as u32
                    })
                    .collect(),
            );
        }
        for ids in &cases {
            let whole = tok.decode(ids).expect("decodes");
            let (streamed, last) = stream(&tok, ids, &[]);
            assert_eq!(last, whole, "{name}: the final text of {ids:?}");
            assert_eq!(streamed, whole, "{name}: the streamed pieces of {ids:?}");
            // A stop string cuts both where it first appears.
            if let Some(stop) = whole.get(whole.len() / 2..whole.len() / 2 + 3).filter(|s| !s.trim().is_empty()) {
                let (streamed, last) = stream(&tok, ids, &[stop]);
                let cut = &whole[..whole.find(stop).expect("in the text")];
                assert_eq!((streamed.as_str(), last.as_str()), (cut, cut), "{name}: stop {stop:?} in {ids:?}");
            }
        }
    }
}
