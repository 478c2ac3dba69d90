//! The vision path against Hugging Face transformers: the tiny random
//! `Gemma3ForConditionalGeneration` of tests/fixtures/gemma3-vision-tiny (made by
//! tools/make_vision_fixture.py) with its image, the image processor's pixels,
//! the tower's last hidden state, the projected soft tokens, the logits of a
//! prompt holding the image and the greedy continuation: with the image tokens
//! attending to each other (`tt_*`: transformers given the `token_type_ids` of
//! Gemma 3's processor, the runtime's default) and causally (without them).
//!
//! Checked on the CPU: pixels as the processor computes them (exactly for an
//! image of the tower's size, within resampling differences for one that is
//! resized), features and soft tokens within 1e-4 of their scale with every
//! kernel of every vision op, logits within 1e-3 of their scale (the runtime
//! tests' tolerance) and identical greedy tokens; `ktune run --image` end to end;
//! bad images and mismatched prompts exit 2 with the reason.

use std::path::Path;

use crate::common::vision::{self, dir, expected, floats, image_prompt, load};
use crate::common::{fixture, ids, ktune_in, logit_rows, read_json, rel_err, tempdir};
use ktune::kernels::Backend;
use ktune::plan::Fusion;
use ktune::runtime::image::load_image;
use ktune::runtime::vision::VisionEngine;
use ktune::runtime::{Engine, ImageAttention, RuntimeError, prefill_passes};
use ktune::session::{LoadedModel, load_model};
use ktune::testing::test_gpu;

#[test]
fn multimodal_config_and_weights_load() {
    let m = load();
    let v = m.vision.as_ref().expect("a vision config");
    assert_eq!((v.hidden_size, v.intermediate_size, v.num_layers, v.num_heads), (32, 64, 2, 2));
    assert_eq!((v.image_size, v.patch_size, v.num_patches(), v.mm_tokens_per_image, v.pool_kernel()), (32, 8, 16, 4, 2));
    assert_eq!((v.image_token_id, v.boi_token_id, v.eoi_token_id, v.text_hidden_size), (250, 251, 252, 64));
    // The text model's weights (saved as language_model.model.*) under the text names.
    assert_eq!((m.config.dims.num_layers, m.config.dims.hidden_size, m.config.dims.vocab_size), (2, 64, 256));
    assert!(m.weights.contains("model.layers.1.mlp.down_proj.weight"));
    assert!(m.weights.contains("vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight"));
}

#[test]
fn pixels_match_the_image_processor() {
    let exp = expected();
    let got = load_image(&dir().join("image.png"), 32).expect("image.png");
    let want = floats(&exp["pixel_values"]);
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert_eq!(got.len(), want.len());
    assert!(worst < 1e-6, "image.png (no resize): max difference {worst}");
    // RGBA 45x37: composited over white and resized (bilinear) by PIL; the
    // image crate's triangle filter differs by at most two 8-bit steps (one
    // step is 2/255 after normalization).
    let got = load_image(&dir().join("image_odd.png"), 32).expect("image_odd.png");
    let want = floats(&exp["pixel_values_odd"]);
    let diffs: Vec<f32> = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
    let worst = diffs.iter().cloned().fold(0f32, f32::max);
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    eprintln!("image_odd.png: max difference {worst}, mean {mean}");
    assert!(worst <= 2.0 * 2.0 / 255.0 && mean <= 0.5 * 2.0 / 255.0, "image_odd.png: max {worst}, mean {mean}");
}

/// The tower and projector with the default kernels, then with each CPU kernel
/// of each vision op forced in turn.
#[test]
fn tower_and_projector_match_transformers_with_every_kernel() {
    let m = load();
    let v = m.vision.as_ref().expect("vision");
    let (_, failures) = vision::tower_runs(|| VisionEngine::new(v, &m.weights).expect("tower"), Backend::Cpu);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn text_engine(m: &LoadedModel, tokens: usize, context: usize, chunk: usize, fusion: Fusion) -> Engine {
    vision::text_engine(m, tokens, context, chunk, fusion, None)
}

/// The soft tokens of the fixture's image.
fn soft_tokens(m: &LoadedModel) -> Vec<f32> {
    let v = m.vision.as_ref().expect("vision");
    let pixels = load_image(&dir().join("image.png"), v.image_size).expect("image");
    VisionEngine::new(v, &m.weights).expect("tower").encode(&pixels).expect("encode").tokens
}

/// With the image tokens attending to each other (the runtime's default, as
/// Gemma 3's processor asks through `token_type_ids`): every position's logits
/// and the greedy continuation match transformers given those `token_type_ids`,
/// prefilled at once and in passes the engine cuts around the image (a pass of 7
/// tokens would split it, one of 3 cannot hold it); the causal logits differ.
#[test]
fn bidirectional_image_attention_matches_transformers_token_type_ids() {
    let m = load();
    let exp = expected();
    let tokens = ids(&exp["tokens"]);
    let want_logits = logit_rows(&exp["tt_logits"]);
    let want_ids = ids(&exp["tt_generated"]);
    assert_ne!(want_logits, logit_rows(&exp["logits"]));
    let soft = soft_tokens(&m);
    let mut failures = Vec::new();
    for (fusion, chunk) in [(Fusion::NONE, 64), (Fusion::ALL, 64), (Fusion::ALL, 7), (Fusion::NONE, 4)] {
        let mut e = text_engine(&m, tokens.len(), tokens.len() + want_ids.len(), chunk, fusion);
        assert_eq!(e.image_attention, ImageAttention::Bidirectional, "the default");
        let (rows, got) = image_prompt(&mut e, &m, &tokens, &soft, want_ids.len());
        // A call returns its last pass's rows (every row with one pass).
        let err = rel_err(&rows, &want_logits[want_logits.len() - rows.len()..]);
        eprintln!("bidirectional, fusion {fusion:?} chunk {chunk}: logits err {err:.2e} of scale ({} rows), ids {got:?}", rows.len());
        if err > 1e-3 || got != want_ids {
            failures.push(format!("{fusion:?} chunk {chunk}: err {err:.2e}, ids {got:?} want {want_ids:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Causal image attention gives transformers' logits without token_type_ids,
    // not these.
    let mut e = text_engine(&m, tokens.len(), tokens.len(), 64, Fusion::NONE);
    e.image_attention = ImageAttention::Causal;
    let (rows, _) = image_prompt(&mut e, &m, &tokens, &soft, 1);
    assert!(rel_err(&rows, &want_logits) > 1e-2, "bidirectional attention must change the logits");
    assert!(rel_err(&rows, &logit_rows(&exp["logits"])) <= 1e-3);
    // An image longer than a pass is refused with the reason.
    let mut e = text_engine(&m, tokens.len(), tokens.len(), 3, Fusion::NONE);
    let v = m.vision.as_ref().expect("vision");
    let err = e.forward_with_soft_tokens(&tokens, v.image_token_id, soft.clone()).unwrap_err();
    assert!(matches!(err, RuntimeError::ImageChunk { tokens: 4, chunk: 3 }), "{err}");
    assert!(err.to_string().contains("--prefill-chunk"), "{err}");
}

/// The same on the GPU (lavapipe here): the WGSL prefill kernel's bidirectional block.
#[test]
fn bidirectional_image_attention_on_the_gpu() {
    let Some(gpu) = test_gpu() else { return };
    let m = load();
    let exp = expected();
    let tokens = ids(&exp["tokens"]);
    let want_logits = logit_rows(&exp["tt_logits"]);
    let want_ids = ids(&exp["tt_generated"]);
    let soft = soft_tokens(&m);
    for chunk in [64, 7] {
        let mut e = vision::text_engine(&m, tokens.len(), tokens.len() + want_ids.len(), chunk, Fusion::ALL, Some(gpu.clone()));
        let (rows, got) = image_prompt(&mut e, &m, &tokens, &soft, want_ids.len());
        let err = rel_err(&rows, &want_logits[want_logits.len() - rows.len()..]);
        eprintln!("GPU bidirectional chunk {chunk}: logits err {err:.2e} of scale ({} rows), ids {got:?}", rows.len());
        assert!(err <= 1e-3 && got == want_ids, "chunk {chunk}: err {err:.2e}, ids {got:?} want {want_ids:?}");
    }
}

/// The passes a prompt is cut into: never through an image, one image a pass.
#[test]
fn prefill_passes_keep_each_image_whole() {
    let img = 9;
    let t = [1, 2, 9, 9, 9, 3, 4, 9, 9, 5];
    assert_eq!(prefill_passes(&t, 4, None).unwrap(), vec![(0, 4, (0, 0)), (4, 8, (0, 0)), (8, 10, (0, 0))]);
    // No pass of one token (the decode kernels' arithmetic): the last takes one
    // from the pass before.
    assert_eq!(prefill_passes(&t, 3, None).unwrap(), vec![(0, 3, (0, 0)), (3, 6, (0, 0)), (6, 8, (0, 0)), (8, 10, (0, 0))]);
    assert_eq!(prefill_passes(&t[..1], 3, None).unwrap(), vec![(0, 1, (0, 0))]);
    assert_eq!(prefill_passes(&t, 4, Some(img)).unwrap(), vec![(0, 2, (0, 0)), (2, 6, (2, 5)), (6, 10, (7, 9))]);
    // Two images that would share a pass get one each.
    assert_eq!(prefill_passes(&t, 64, Some(img)).unwrap(), vec![(0, 7, (2, 5)), (7, 10, (7, 9))]);
    assert_eq!(prefill_passes(&t, 3, Some(img)).unwrap(), vec![(0, 2, (0, 0)), (2, 5, (2, 5)), (5, 7, (0, 0)), (7, 10, (7, 9))]);
    assert!(matches!(prefill_passes(&t, 2, Some(img)), Err(RuntimeError::ImageChunk { tokens: 3, chunk: 2 })));
}

/// The prompt with the image's soft tokens in place of its image tokens, the
/// image attended causally: every position's logits and the greedy continuation
/// (transformers without `token_type_ids`), prefilled at once and in chunks that
/// split the image.
#[test]
fn image_prompt_logits_and_greedy_tokens_match_transformers() {
    let m = load();
    let v = m.vision.as_ref().expect("vision");
    let exp = expected();
    let tokens = ids(&exp["tokens"]);
    let want_logits = logit_rows(&exp["logits"]);
    let pixels = load_image(&dir().join("image.png"), v.image_size).expect("image");
    let soft = VisionEngine::new(v, &m.weights).expect("tower").encode(&pixels).expect("encode").tokens;
    let failures =
        vision::causal_image_prompt_failures(&m, &soft, |fusion, chunk, tokens, context| text_engine(&m, tokens, context, chunk, fusion));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Without the image the prompt's image tokens are plain embeddings: the
    // logits are not transformers' (the check above can fail).
    let mut e = text_engine(&m, tokens.len(), tokens.len(), 64, Fusion::NONE);
    let plain = e.forward(&tokens).expect("prefill");
    // The multimodal head does not soft-cap (transformers' Gemma3ForConditionalGeneration):
    // the expected logits reach past the text config's cap of 2.
    assert!(want_logits.iter().flatten().any(|v| v.abs() > 2.0));
    assert!(rel_err(&plain, &want_logits) > 1e-2, "the image must change the logits");
}

#[test]
fn soft_tokens_must_match_the_image_tokens() {
    let m = load();
    let exp = expected();
    let tokens = ids(&exp["tokens"]);
    let mut e = text_engine(&m, tokens.len(), tokens.len(), 64, Fusion::NONE);
    let err = e.forward_with_soft_tokens(&tokens, 250, vec![0.0; 3 * 64]).unwrap_err().to_string();
    assert!(err.contains("4 image tokens") && err.contains("3 soft tokens"), "{err}");
}

fn run_image(image: &Path, tokens: &[u32], dump: Option<&Path>) -> std::process::Output {
    run_image_with(image, tokens, dump, &[])
}

fn run_image_with(image: &Path, tokens: &[u32], dump: Option<&Path>, extra: &[&str]) -> std::process::Output {
    let cache = tempdir();
    let list: Vec<String> = tokens.iter().map(u32::to_string).collect();
    let mut cmd = ktune_in(cache.path());
    cmd.arg("run").arg("--model-dir").arg(dir()).arg("--image").arg(image);
    cmd.args(["--tokens", &list.join(","), "--max-tokens", "8", "--ignore-eos", "--device", "cpu", "--format", "json"]);
    if let Some(d) = dump {
        cmd.arg("--dump-logits").arg(d);
    }
    cmd.args(extra);
    cmd.output().expect("runs")
}

#[test]
fn run_with_an_image_matches_transformers_end_to_end() {
    let exp = expected();
    let tokens = ids(&exp["tokens"]);
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    // By default the image's tokens attend to each other (the processor's
    // token_type_ids); --causal-image gives transformers' logits without them.
    for (extra, logits, generated) in [(&[][..], "tt_logits", "tt_generated"), (&["--causal-image"][..], "logits", "generated")] {
        let out = run_image_with(&dir().join("image.png"), &tokens, Some(&dump), extra);
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        let d = read_json(&dump);
        assert_eq!(ids(&d["generated"]), ids(&exp[generated]), "greedy ids {extra:?}");
        // The runtime's CPU defaults (the same kernels: f32 weights give no int8 path).
        let err = rel_err(&logit_rows(&d["logits"]), &logit_rows(&exp[logits]));
        assert!(err <= 1e-3, "logits err {err:.2e} {extra:?}");
    }
    // A pass too short for the image is refused with the reason.
    let out = run_image_with(&dir().join("image.png"), &tokens, None, &["--prefill-chunk", "3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--prefill-chunk") && !err.contains("panicked"), "{err}");
}

#[test]
fn bad_images_and_prompts_exit_2_with_the_reason() {
    let exp = expected();
    let tokens = ids(&exp["tokens"]);
    let tmp = tempdir();
    let png = std::fs::read(dir().join("image.png")).expect("png");
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.png", png[..png.len() / 2].to_vec(), "decode"),
        ("empty.png", Vec::new(), "image"),
        ("text.png", b"hello, not an image".to_vec(), "image"),
    ];
    // A valid PNG header claiming 70000 x 70000 pixels: refused from the header.
    let mut huge = png.clone();
    huge[16..20].copy_from_slice(&70_000u32.to_be_bytes());
    huge[20..24].copy_from_slice(&70_000u32.to_be_bytes());
    let crc = crc32(&huge[12..29]);
    huge[29..33].copy_from_slice(&crc.to_be_bytes());
    cases.push(("huge.png", huge, "over the limit"));
    for (name, bytes, why) in cases {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        let out = run_image(&path, &tokens, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(why) && !err.contains("panicked"), "{name}: {err}");
    }
    // A missing file, and a prompt whose image tokens are not one image's.
    let out = run_image(&tmp.path().join("missing.png"), &tokens, None);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let short: Vec<u32> = tokens.iter().copied().filter(|&t| t != 250).chain([250]).collect();
    let out = run_image(&dir().join("image.png"), &short, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("1 image tokens"), "{err}");
    // An image for a text-only model.
    let cache = tempdir();
    let out = ktune_in(cache.path())
        .args(["run", "--model-dir"])
        .arg(fixture("gemma3-tiny"))
        .arg("--image")
        .arg(dir().join("image.png"))
        .args(["--tokens", "2,3,4", "--device", "cpu"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("text-only"), "{err}");
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// The published google/gemma-3-4b-it `config.json` (transformers 4.50: a sparse
/// `text_config` relying on Gemma3TextConfig's defaults, the SigLIP So400m tower):
/// its text model is the built-in `gemma3-4b`, its tower 4096 patches pooled 4x4
/// to 256 tokens.
#[test]
fn published_gemma3_4b_config_parses() {
    let text = r#"{"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
            "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
            "patch_size": 14, "vision_use_head": false}}"#;
    let parsed = ktune::model::ModelConfig::parse_config_json(text, Path::new("config.json")).expect("parses");
    let builtin = ktune::model::builtin("gemma3-4b").expect("built in");
    assert_eq!(parsed.config, builtin, "the text model is the built-in gemma3-4b");
    assert!(parsed.ignored_keys.is_empty(), "{:?}", parsed.ignored_keys);
    let v = parsed.vision.expect("vision");
    assert_eq!((v.num_patches(), v.pool_kernel(), v.head_dim(), v.mm_tokens_per_image), (4096, 4, 72, 256));
    assert_eq!((v.image_token_id, v.boi_token_id, v.eoi_token_id, v.text_hidden_size), (262_144, 255_999, 256_000, 2560));
    // The built-in gemma3-4b has this tower, with synthetic weights of its shapes.
    assert_eq!(ktune::model::builtin_vision("gemma3-4b").as_ref(), Some(&v));
    assert_eq!(ktune::model::builtin_vision("gemma3-1b"), None);
    let m = load_model(Some("gemma3-4b"), None, None, 0).expect("built in");
    assert_eq!(m.vision.as_ref(), Some(&v));
    m.weights.check_vision(&v).expect("the tower's synthetic weights");
    // A vision tower whose patches do not pool to the token count is refused.
    let bad = text.replace("\"mm_tokens_per_image\": 256", "\"mm_tokens_per_image\": 100");
    let err = ktune::model::ModelConfig::parse_config_json(&bad, Path::new("config.json")).unwrap_err().to_string();
    assert!(err.contains("pool evenly"), "{err}");
}
