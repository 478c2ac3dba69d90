//! What a request answers does not depend on what the generator's KV cache held:
//! a prompt that shares a prefix with the last one (a chat template's head, an
//! earlier turn with its answer, the same prompt again) gives the logits and
//! tokens it gives on an empty cache, bit for bit, on the CPU. The decode
//! kernels compute a token in other arithmetic than the prefill kernels (int8
//! activations round differently downstream; on SmolLM2-135M Q4_1 the last
//! prompt token's logits moved by 2.7% of their scale), so the generator reuses
//! only positions a prefill computed and never leaves one token to a pass.

use ktune::generate::{Generator, GeneratorSettings, Limits, Output, ProfileChoice};
use ktune::kernels::DType;
use ktune::kernels::sample::SamplerParams;
use ktune::plan::Fusion;
use ktune::session::{ModelSettings, ModelSource};

use crate::common::{fixture, gguf_dir, ktune, read_json, tempdir};

fn open(chunk: usize) -> Generator {
    let s = GeneratorSettings {
        model: ModelSettings {
            source: ModelSource::Gguf(gguf_dir().join("smollm2-tiny-q8_0.gguf")),
            mmproj: None,
            layers: None,
            weight_dtype: None,
            seed: 0,
            trusted_shaders: false,
        },
        choice: ProfileChoice {
            profile: None,
            no_profile: true,
            strict_device: false,
            kv_dtype: DType::F32,
            fusion: Fusion::ALL,
            batch: true,
            decode_chain: None,
        },
        context: Some(256),
        prefill_chunk: chunk,
        chat_template: Some(fixture("chat_templates/smollm2.jinja")),
        command: "serve",
        template_required: false,
    };
    Generator::open(Some("cpu"), &s).expect("the fixture opens")
}

/// Greedy ids after `prompt`, and the logits the prompt's last token gave.
fn answer(g: &mut Generator, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let limits = Limits { max_tokens: 6, stop: Vec::new(), ignore_eos: true };
    let mut sink = |_: &str| true;
    let c = g.complete(prompt, SamplerParams::GREEDY, Output { limits: &limits, cancel: None, stream: &mut sink }).expect("completes");
    (c.decoded.generated, g.prompt_logits().expect("the prompt's logits").to_vec())
}

#[test]
fn a_request_answers_alike_whatever_the_cache_held() {
    let mut fresh = open(512);
    let mut warm = open(512);
    // A chunk of 3 cuts every prompt into passes (never one of a single token).
    let mut chunked = open(3);
    let hello = warm.render(&[("user", "hello")]).unwrap();
    let other = warm.render(&[("user", "what is the capital of France?")]).unwrap();
    let (first, _) = answer(&mut fresh, &hello);
    let said = warm.tokenizer.decode(&first).unwrap();
    // A chat's second turn: the first turn and its answer as the prefix.
    let second = warm.render(&[("user", "hello"), ("assistant", &said), ("user", "and then?")]).unwrap();
    let plain = warm.encode("Once upon a time", false).unwrap();
    let single = vec![plain[0]];
    let order = [&hello, &other, &hello, &second, &plain, &hello, &second, &single, &plain, &other, &second];
    for (i, prompt) in order.into_iter().enumerate() {
        fresh.reset();
        let want = answer(&mut fresh, prompt);
        let got = answer(&mut warm, prompt);
        assert_eq!(got.0, want.0, "request {i}: the ids differ from an empty cache's");
        let moved = got.1.iter().zip(&want.1).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(moved, 0, "request {i}: {moved} logits differ from an empty cache's");
        let split = answer(&mut chunked, prompt);
        assert_eq!(split.0, want.0, "request {i}: the ids differ in passes of 3");
        assert!(split.1.iter().zip(&want.1).all(|(a, b)| a.to_bits() == b.to_bits()), "request {i}: the logits differ in passes of 3");
    }
}

/// The last prompt token's logits (`run --dump-logits`) of `tokens` prefilled in
/// passes of `chunk` on the CPU.
fn last_logits(model: &str, tokens: &[String], chunk: usize) -> Vec<u32> {
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    let out = ktune()
        .args(["run", "--device", "cpu", "--gguf"])
        .arg(gguf_dir().join(model))
        .args(["--tokens", &tokens.join(","), "--max-tokens", "1", "--format", "json", "--prefill-chunk", &chunk.to_string()])
        .arg("--dump-logits")
        .arg(&dump)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = read_json(&dump);
    let last = d["logits"].as_array().and_then(|l| l.last()).and_then(|l| l.as_array()).expect("logits");
    last.iter().map(|v| (v.as_f64().expect("f64") as f32).to_bits()).collect()
}

/// A prompt cut into passes anywhere gives the logits of one pass, bit for bit:
/// Gemma 3's sliding windows (8 positions in the fixture) and a global layer,
/// longer than one key tile of the tiled prefill attention (64), whose tiles
/// start at multiples of the tile from key 0 wherever a pass starts; and every
/// pass of two tokens or more (a pass of one runs the decode kernels).
#[test]
fn a_prompt_gives_the_same_logits_however_it_is_cut_into_passes() {
    let tokens: Vec<String> = (0..150).map(|i| (3 + (i * 37) % 200).to_string()).collect();
    for model in ["gemma3-tiny-q8_0.gguf", "smollm2-tiny-q8_0.gguf"] {
        let whole = last_logits(model, &tokens, 512);
        for chunk in [149, 37, 5, 2] {
            let moved = last_logits(model, &tokens, chunk).iter().zip(&whole).filter(|(a, b)| a != b).count();
            assert_eq!(moved, 0, "{model}: passes of {chunk}: {moved} logits differ from one pass's");
        }
    }
}
