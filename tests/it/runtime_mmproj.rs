//! A multimodal Gemma 3 as llama.cpp ships it: a text GGUF and its vision
//! projector (`mmproj`), both written by llama.cpp's own converter from the tiny
//! random checkpoint of tests/fixtures/gemma3-vision-tiny
//! (tools/make_mmproj_fixture.py, tests/fixtures/gemma3-vision-gguf), checked
//! (the projector in f32, and in f16 as published projector files hold it)
//! against the numbers the Hugging Face directory is checked against
//! (`vision_expected.json`, transformers): the vision config read from `clip.*`
//! metadata and the text vocabulary, the tower's features and soft tokens, and
//! `ktune run --gguf --mmproj --image` end to end on the CPU (and on the GPU
//! adapter, lavapipe here); bad pairs and bad files exit 2 with the reason.

use std::path::Path;

use crate::common::vision::{dir, expected, gguf_pair, load, load_gguf_pair};
use crate::common::{fixture, gpu_index, ids, ktune_in, logit_rows, read_json, rel_err, tempdir};
use ktune::runtime::image::load_image;
use ktune::runtime::vision::VisionEngine;

fn rel(got: &[f32], want: &[f32]) -> f64 {
    rel_err(&[got.to_vec()], &[want.to_vec()])
}

/// The pair's vision config is the checkpoint's (image tokens from the text
/// vocabulary, pooling from `clip.vision.projector.scale_factor`), and the
/// tower's tensors hold the checkpoint's values under the canonical names (the
/// soft-embedding norm's `1 + w` undone; the input projection, which the
/// converter keeps in f16, within f16 rounding).
#[test]
fn gguf_pair_config_and_weights_match_the_checkpoint() {
    let m = load_gguf_pair();
    let hf = load();
    let v = m.vision.as_ref().expect("vision");
    let mut want = hf.vision.clone().expect("vision");
    // The file holds the epsilon as float32.
    assert_eq!(v.layer_norm_eps, want.layer_norm_eps as f32 as f64);
    want.layer_norm_eps = v.layer_norm_eps;
    assert_eq!(v, &want, "the vision config");
    for (name, shape) in v.tensor_shapes() {
        let (a, b) = (m.weights.f32(&name, &shape).expect(&name), hf.weights.f32(&name, &shape).expect(&name));
        let tol = if name.ends_with("mm_input_projection_weight") { 1e-3 } else { 1e-6 };
        let err = rel(&a, &b);
        assert!(err <= tol, "{name}: err {err:.2e} of scale");
    }
    // Without `clip.vision.projector.scale_factor` (the published Gemma 3 files,
    // whose pooling is clip.cpp's default) the pool is 4 patches per side: the
    // same file with the key renamed in place pools the 4 x 4 patches to 1 token.
    let (text, mmproj) = gguf_pair();
    let mut bytes = std::fs::read(&mmproj).expect("mmproj");
    let key = b"clip.vision.projector.scale_factor";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the key");
    bytes[at + key.len() - 1] = b'X';
    let tmp = tempdir();
    let renamed = tmp.path().join("default-pool.gguf");
    std::fs::write(&renamed, bytes).expect("write");
    let d = ktune::session::load_gguf_mmproj(&text, &renamed, None).expect("loads");
    let dv = d.vision.as_ref().expect("vision");
    assert_eq!((dv.pool_kernel(), dv.mm_tokens_per_image), (4, 1));
    // Gemma's (1 + w) soft-embedding norm stored as 1 + w by the converter.
    assert!(m.weights.f32("multi_modal_projector.mm_soft_emb_norm.weight", &[32]).expect("norm").iter().any(|&x| x.abs() < 0.5));
}

/// Tower and projector from the mmproj file against transformers: the features
/// as from the checkpoint (f32 in the file), the soft tokens within the f16
/// rounding of the input projection; from the f16 file, both within f16 rounding.
#[test]
fn gguf_tower_and_projector_match_transformers() {
    let (text, mmproj) = gguf_pair();
    let exp = expected();
    let features: Vec<f32> = logit_rows(&exp["features"]).concat();
    let projected: Vec<f32> = logit_rows(&exp["projected"]).concat();
    for (file, tol_features, tol_projected) in [(mmproj.clone(), 1e-4, 2e-3), (mmproj.with_file_name("mmproj-f16.gguf"), 2e-3, 2e-3)] {
        let m = ktune::session::load_gguf_mmproj(&text, &file, None).expect("loads");
        let v = m.vision.as_ref().expect("vision");
        let pixels = load_image(&dir().join("image.png"), v.image_size).expect("image");
        let out = VisionEngine::new(v, &m.weights).expect("tower").encode(&pixels).expect("encode");
        let (ef, ep) = (rel(&out.features, &features), rel(&out.tokens, &projected));
        eprintln!("{}: features err {ef:.2e}, projected err {ep:.2e} of scale", file.display());
        assert!(ef <= tol_features, "{}: features err {ef:.2e}", file.display());
        assert!(ep <= tol_projected, "{}: projected err {ep:.2e}", file.display());
    }
}

fn run_pair(text: &Path, mmproj: &Path, image: &Path, extra: &[&str], dump: Option<&Path>) -> std::process::Output {
    let cache = tempdir();
    let tokens: Vec<String> = ids(&expected()["tokens"]).iter().map(u32::to_string).collect();
    let mut cmd = ktune_in(cache.path());
    cmd.arg("run").arg("--gguf").arg(text).arg("--mmproj").arg(mmproj).arg("--image").arg(image);
    cmd.args(["--tokens", &tokens.join(","), "--max-tokens", "8", "--ignore-eos", "--format", "json"]);
    if let Some(d) = dump {
        cmd.arg("--dump-logits").arg(d);
    }
    cmd.args(extra);
    cmd.output().expect("runs")
}

/// `ktune run --gguf text.gguf --mmproj mmproj.gguf --image image.png` gives
/// transformers' logits (the runtime tests' tolerance) and greedy ids, with the
/// image's tokens attending to each other (the default, transformers given the
/// processor's token_type_ids) and causally (--causal-image).
#[test]
fn run_gguf_pair_matches_transformers_end_to_end() {
    let (text, mmproj) = gguf_pair();
    let f16 = mmproj.with_file_name("mmproj-f16.gguf");
    let exp = expected();
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    for (file, extra, logits, generated) in [
        (&mmproj, &["--device", "cpu"][..], "tt_logits", "tt_generated"),
        (&mmproj, &["--device", "cpu", "--causal-image"][..], "logits", "generated"),
        // The tower's matrices in f16, as the published projector files hold them.
        (&f16, &["--device", "cpu"][..], "tt_logits", "tt_generated"),
    ] {
        let out = run_pair(&text, file, &dir().join("image.png"), extra, Some(&dump));
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        let d = read_json(&dump);
        assert_eq!(ids(&d["generated"]), ids(&exp[generated]), "greedy ids {} {extra:?}", file.display());
        let err = rel_err(&logit_rows(&d["logits"]), &logit_rows(&exp[logits]));
        eprintln!("{} {extra:?}: logits err {err:.2e} of scale", file.display());
        assert!(err <= 1e-3, "{} logits err {err:.2e} {extra:?}", file.display());
    }
}

/// The same on the GPU adapter: the tower runs there (`vision_gpu`, the weights
/// from the mmproj file under the same names).
#[test]
fn run_gguf_pair_on_the_gpu_matches_transformers() {
    let cache = tempdir();
    let Some(index) = gpu_index(cache.path(), "run --gguf --mmproj") else { return };
    let (text, mmproj) = gguf_pair();
    let exp = expected();
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    for file in [mmproj.clone(), mmproj.with_file_name("mmproj-f16.gguf")] {
        let out = run_pair(&text, &file, &dir().join("image.png"), &["--device", &index], Some(&dump));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "stderr: {stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("(GPU)") || stderr.contains("(GPU)"), "the tower did not run on the GPU: {stdout} {stderr}");
        let d = read_json(&dump);
        assert_eq!(ids(&d["generated"]), ids(&exp["tt_generated"]), "greedy ids {}", file.display());
        let err = rel_err(&logit_rows(&d["logits"]), &logit_rows(&exp["tt_logits"]));
        eprintln!("GPU {}: logits err {err:.2e} of scale", file.display());
        assert!(err <= 1e-3, "{}: logits err {err:.2e}", file.display());
    }
}

fn assert_exit_2(out: &std::process::Output, why: &[&str], case: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{case}: {err}");
    assert!(!err.contains("panicked"), "{case}: {err}");
    for w in why {
        assert!(err.contains(w), "{case}: `{w}` not in: {err}");
    }
}

/// `--mmproj` needs `--gguf` and `--image`; a file that is not an mmproj (not
/// GGUF, truncated, a text model), another projector type and a projector for a
/// text model of another width exit 2 with the reason.
#[test]
fn bad_mmproj_use_exits_2_with_the_reason() {
    let (text, mmproj) = gguf_pair();
    let image = dir().join("image.png");
    let tmp = tempdir();
    let cache = tempdir();
    // `ktune run` on the CPU with these arguments before a two-token prompt.
    let run = |args: &[&std::ffi::OsStr]| {
        ktune_in(cache.path()).arg("run").args(args).args(["--tokens", "2,3", "--device", "cpu"]).output().expect("runs")
    };
    let (model_dir, flag_gguf, flag_mm, flag_image) = (dir(), "--gguf".as_ref(), "--mmproj".as_ref(), "--image".as_ref());
    // Without --gguf (a model directory instead), and without --image.
    let out = run(&["--model-dir".as_ref(), model_dir.as_os_str(), flag_mm, mmproj.as_os_str(), flag_image, image.as_os_str()]);
    assert_exit_2(&out, &["--gguf"], "no --gguf");
    let out = run(&[flag_gguf, text.as_os_str(), flag_mm, mmproj.as_os_str()]);
    assert_exit_2(&out, &["--image"], "no --image");
    // An image for a GGUF text model without its projector.
    let out = run(&[flag_gguf, text.as_os_str(), flag_image, image.as_os_str()]);
    assert_exit_2(&out, &["--mmproj"], "no --mmproj");
    // Not a GGUF file, a truncated one, a missing one, the text model itself.
    let bytes = std::fs::read(&mmproj).expect("mmproj");
    let truncated = tmp.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let header_only = tmp.path().join("header.gguf");
    std::fs::write(&header_only, &bytes[..200]).expect("write");
    for (file, why) in [
        (image.clone(), "GGUF"),
        (truncated, "truncated.gguf"),
        (header_only, "header.gguf"),
        (tmp.path().join("missing.gguf"), "no such file"),
        (text.clone(), "give it with --gguf"),
    ] {
        let out = run_pair(&text, &file, &image, &["--device", "cpu"], None);
        assert_exit_2(&out, &[why], &file.display().to_string());
    }
    // Another projector type: the same file with `clip.projector_type` llama4
    // (the string's bytes replaced in place, same length).
    let at = bytes.windows(6).position(|w| w == b"gemma3").expect("the projector type's value");
    let mut other = bytes.clone();
    other[at..at + 6].copy_from_slice(b"llama4");
    let other_path = tmp.path().join("llama4.gguf");
    std::fs::write(&other_path, other).expect("write");
    let out = run_pair(&text, &other_path, &image, &["--device", "cpu"], None);
    assert_exit_2(&out, &["llama4", "supported: gemma3"], "projector type");
    // A text model of the right width without the image tokens (a text-only Gemma 3).
    let text_only = fixture("gguf/gemma3-tiny-f16.gguf");
    let out = run_pair(&text_only, &mmproj, &image, &["--device", "cpu"], None);
    assert_exit_2(&out, &["<image_soft_token>", "gemma3-tiny-f16.gguf"], "no image tokens");
    // A projector for another text model: llama-k-q6_k.gguf is 256 wide.
    let wide = fixture("gguf/llama-k-q6_k.gguf");
    let out = run_pair(&wide, &mmproj, &image, &["--device", "cpu"], None);
    assert_exit_2(&out, &["width 64", "hidden size 256", "same checkpoint"], "width");
}

/// With --prompt the text GGUF's tokenizer encodes the prompt and its one
/// `<start_of_image>` becomes the processor's expansion: the image's tokens in
/// the vocabulary's ids.
#[test]
fn prompt_text_expands_the_image_with_the_gguf_vocabulary() {
    let (text, mmproj) = gguf_pair();
    let cache = tempdir();
    let out = ktune_in(cache.path())
        .arg("run")
        .arg("--gguf")
        .arg(&text)
        .arg("--mmproj")
        .arg(&mmproj)
        .arg("--image")
        .arg(dir().join("image.png"))
        .args(["--prompt", "The kernel <start_of_image> reads", "--max-tokens", "2", "--device", "cpu", "--format", "json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let prompt = ids(&report["prompt_ids"]);
    let at = prompt.iter().position(|&t| t == 251).expect("<start_of_image>");
    assert_eq!(prompt[at..at + 6], [251, 250, 250, 250, 250, 252], "{prompt:?}");
    assert_eq!(prompt.iter().filter(|&&t| t == 250).count(), 4, "{prompt:?}");
}
