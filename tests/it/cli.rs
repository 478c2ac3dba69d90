//! The binary, run as a user runs it: output shape, exit codes, error messages.

use crate::common::{fixture, ktune};
use predicates::prelude::*;

#[test]
fn list_devices_always_shows_the_cpu() {
    ktune().arg("list-devices").assert().success().stdout(predicate::str::contains("cpu"));
}

#[test]
fn list_devices_json_has_a_stable_fingerprint() {
    let run = || {
        let out = ktune().args(["list-devices", "--format", "json"]).output().expect("runs");
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
        v
    };
    let (a, b) = (run(), run());
    let fps = |v: &serde_json::Value| -> Vec<String> {
        v["devices"]
            .as_array()
            .expect("devices array")
            .iter()
            .map(|d| d["fingerprint"].as_str().expect("fingerprint").to_string())
            .collect()
    };
    let fa = fps(&a);
    assert!(!fa.is_empty());
    assert!(fa.iter().all(|f| f.len() == 64), "full sha256 in JSON: {fa:?}");
    assert_eq!(fa, fps(&b), "same machine, same fingerprints");
}

#[test]
fn unknown_device_selector_is_exit_2_listing_devices() {
    ktune()
        .args(["kernels", "--device", "no-such-device-xyz"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no-such-device-xyz"))
        .stderr(predicate::str::contains("cpu"));
}

#[test]
fn kernels_lists_every_registered_kernel() {
    let out = ktune().args(["kernels", "--device", "cpu", "--format", "json"]).output().expect("runs");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let ids: Vec<&str> = v["kernels"].as_array().expect("kernels").iter().map(|k| k["id"].as_str().expect("id")).collect();
    for k in ktune::kernels::registry() {
        assert!(ids.contains(&k.id), "{} missing from `ktune kernels`", k.id);
    }
}

#[test]
fn kernels_verify_on_cpu_passes() {
    ktune().args(["kernels", "--device", "cpu", "--verify", "--op", "gemv"]).assert().success();
}

#[test]
fn unknown_kernel_is_exit_2_naming_known_ones() {
    ktune()
        .args(["kernels", "--device", "cpu", "--kernel", "gemv_nonexistent"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gemv_nonexistent"))
        .stderr(predicate::str::contains("gemv_rows_cpu"));
}

/// `--prompt` text through the fixture's tokenizer.json (tools/make_tokenizer.py):
/// the prompt ids, the greedy ids and their text are what the Python tokenizer
/// and transformers give.
#[test]
fn run_prompt_is_encoded_and_output_decoded_like_the_python_tokenizer() {
    let dir = fixture("smollm2-tiny-bf16");
    let exp = crate::common::read_json(dir.join("tokenizer_expected.json"));
    let prompt = exp["prompt"].as_str().expect("prompt");
    let max_tokens = exp["max_tokens"].as_u64().expect("max_tokens").to_string();
    let out = ktune()
        .arg("run")
        .arg("--model-dir")
        .arg(&dir)
        .args(["--prompt", prompt, "--max-tokens", &max_tokens, "--device", "cpu", "--format", "json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(r["prompt"], exp["prompt"]);
    assert_eq!(r["prompt_ids"], exp["prompt_ids"], "prompt encoding");
    assert_eq!(r["prompt_tokens"].as_u64(), exp["prompt_ids"].as_array().map(|a| a.len() as u64));
    assert_eq!(r["generated"], exp["generated"], "greedy ids");
    assert_eq!(r["text"], exp["text"], "decoded text");
    assert!(r["tokenizer"].as_str().is_some_and(|p| p.ends_with("tokenizer.json")));
}

/// The table shows the prompt and the text too; `--tokens` also gets text out.
#[test]
fn run_with_tokens_decodes_text_when_there_is_a_tokenizer() {
    let dir = fixture("smollm2-tiny-bf16");
    let out = ktune()
        .arg("run")
        .arg("--model-dir")
        .arg(&dir)
        .args(["--tokens", "318,311,272", "--max-tokens", "2", "--device", "cpu"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("text:"), "{s}");
    ktune()
        .arg("run")
        .arg("--model-dir")
        .arg(&dir)
        .args(["--prompt", "The kernel", "--max-tokens", "2", "--device", "cpu"])
        .assert()
        .success()
        .stdout(predicate::str::contains("prompt:   \"The kernel\"").and(predicate::str::contains("text:")));
}

#[test]
fn run_prompt_without_tokenizer_json_is_exit_2_suggesting_tokens() {
    ktune()
        .arg("run")
        .arg("--model-dir")
        .arg(fixture("llama3-tiny"))
        .args(["--prompt", "hello", "--device", "cpu"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("tokenizer.json").and(predicate::str::contains("does not exist")))
        .stderr(predicate::str::contains("--tokens"));
    ktune()
        .args(["run", "--model", "smollm2-135m", "--prompt", "hello", "--device", "cpu"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("tokenizer.json").and(predicate::str::contains("--tokens")));
}

#[test]
fn run_prompt_and_tokens_are_mutually_exclusive() {
    ktune()
        .arg("run")
        .arg("--model-dir")
        .arg(fixture("smollm2-tiny-bf16"))
        .args(["--prompt", "hello", "--tokens", "1,2", "--device", "cpu"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--prompt").and(predicate::str::contains("--tokens")));
}

/// `--kv-dtype q8_0` runs where a q8_0 cache can be held and read (a head_dim
/// of whole blocks of 32, on the CPU and on a GPU); elsewhere, and for a block
/// format the KV cache does not take, exit 2 naming the problem and the fix, no
/// panic.
#[test]
fn a_q8_0_kv_cache_runs_on_the_cpu_and_the_gpu_and_is_refused_where_it_cannot() {
    use crate::common::{gguf_dir, gpu_index, ktune_in, tempdir};
    let cache = tempdir();
    let run = |model: &str, device: &str, kv: &str| {
        ktune_in(cache.path())
            .args(["run", "--device", device, "--gguf"])
            .arg(gguf_dir().join(model))
            .args(["--tokens", "5,6,7", "--max-tokens", "4", "--ignore-eos", "--kv-dtype", kv, "--format", "json"])
            .output()
            .expect("runs")
    };
    let refused = |o: std::process::Output, want: &[&str]| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(want.iter().all(|w| err.contains(w)), "{want:?} in: {err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    let runs = |device: &str| {
        let ok = run("qwen3-tiny-q8_0.gguf", device, "q8_0");
        assert!(ok.status.success(), "{device}: {}", String::from_utf8_lossy(&ok.stderr));
        let v: serde_json::Value = serde_json::from_slice(&ok.stdout).expect("JSON");
        assert_eq!(v["kv_dtype"], "q8_0", "{device}: {v}");
    };
    runs("cpu");
    refused(run("smollm2-tiny-q8_0.gguf", "cpu", "q8_0"), &["head_dim is 16", "--kv-dtype f16"]);
    refused(run("qwen3-tiny-q8_0.gguf", "cpu", "q4_0"), &["f32, f16 or q8_0"]);
    if let Some(gpu) = gpu_index(cache.path(), "q8_0 KV cache") {
        runs(&gpu);
        refused(run("smollm2-tiny-q8_0.gguf", &gpu, "q8_0"), &["head_dim is 16", "--kv-dtype f16"]);
    }
}
