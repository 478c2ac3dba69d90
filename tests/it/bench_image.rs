//! `ktune bench --image`: every entry's image through the vision tower and
//! projector, timed each round beside prefill and decode (on the CPU with the
//! multimodal fixture tests/fixtures/gemma3-vision-tiny and its GGUF pair, and on
//! a GPU adapter, which skips loudly without one unless KTUNE_REQUIRE_GPU=1); a
//! model without a tower, and an unreadable image, are exit 2 before anything is
//! measured.

use crate::common::{fixture, gpu_index, ktune_in as ktune, tempdir};
use predicates::prelude::*;

/// A CPU profile forcing two non-default vision kernels.
const PROFILE: &str = "name: v\nmodel: gemma3-vision-tiny\nversion: 1\ndevice:\n  backend: cpu\nkernels:\n  vision:\n    \
    patch_embed: patch_embed_direct_cpu\n    attention: attention_full_rows_cpu\n";

fn bench(cache: &std::path::Path, source: &[&std::ffi::OsStr], extra: &[&str]) -> std::process::Output {
    bench_on(cache, "cpu", source, extra)
}

fn bench_on(cache: &std::path::Path, device: &str, source: &[&std::ffi::OsStr], extra: &[&str]) -> std::process::Output {
    ktune(cache)
        .args(["bench", "--device", device])
        .args(source)
        .arg("--image")
        .arg(fixture("gemma3-vision-tiny/image.png"))
        .args(["--rounds", "3", "--prefill-tokens", "8", "--decode-tokens", "2"])
        .args(extra)
        .output()
        .expect("runs")
}

/// The vision figures of every entry: positive milliseconds per image from one
/// sample per round, the ratio to the first entry, the kernels that ran.
fn check_vision(r: &serde_json::Value, entries: usize) {
    let e = r["entries"].as_array().expect("entries");
    assert_eq!(e.len(), entries, "{r}");
    assert!(r["image"].as_str().is_some_and(|p| p.ends_with("image.png")), "{}", r["image"]);
    for x in e {
        let v = &x["vision"];
        assert!(v["ms"]["median"].as_f64().is_some_and(|m| m > 0.0), "{}: {v}", x["name"]);
        let samples = v["samples_s"].as_array().expect("samples");
        assert_eq!(samples.len(), 3, "one sample per round: {v}");
        assert!(samples.iter().all(|s| s.as_f64().is_some_and(|s| s > 0.0)), "{v}");
        assert!(v["ratio_to_first"]["median"].as_f64().is_some_and(|q| q > 0.0), "{v}");
        assert_eq!(
            v["kernels"].as_array().expect("kernels").len(),
            ktune::plan::select::Slot::VISION.len(),
            "one kernel per vision slot: {v}"
        );
        // prefill and decode are still measured
        assert!(x["prefill_tok_s"]["median"].as_f64().is_some_and(|t| t > 0.0), "{x}");
    }
    assert_eq!(e[0]["vision"]["ratio_to_first"]["median"].as_f64(), Some(1.0), "the first entry against itself");
}

#[test]
fn bench_with_an_image_times_every_entrys_vision_tower() {
    let tmp = tempdir();
    let cache = tmp.path().join("cache");
    let profile = tmp.path().join("vision.yaml");
    std::fs::write(&profile, PROFILE).expect("write");
    let dir = fixture("gemma3-vision-tiny");
    let src = [std::ffi::OsStr::new("--model-dir"), dir.as_os_str()];
    let o = bench(&cache, &src, &["--profile", profile.to_str().expect("utf-8"), "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    check_vision(&r, 2);
    // The profile's vision kernels ran for its entry, the defaults for the default.
    let kernels = |i: usize| -> Vec<String> {
        r["entries"][i]["vision"]["kernels"].as_array().expect("kernels").iter().map(|k| k.as_str().expect("str").to_string()).collect()
    };
    let (forced, default) = (kernels(0), kernels(1));
    assert!(forced.contains(&"vision.attention attention_full_rows_cpu".to_string()), "{forced:?}");
    assert!(forced.contains(&"vision.patch_embed patch_embed_direct_cpu".to_string()), "{forced:?}");
    assert!(!default.contains(&"vision.attention attention_full_rows_cpu".to_string()), "{default:?}");
    assert_eq!(r["entries"][1]["name"], "default");
    // The table has the vision columns and names each entry's kernels.
    let o = bench(&cache, &src, &["--profile", profile.to_str().expect("utf-8")]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(table.contains("vision ms/image") && table.contains("vision time / first"), "{table}");
    assert!(table.contains("default vision kernels: vision.patch_embed"), "{table}");
}

/// On a GPU adapter the entries' towers run their WGSL kernels: a wgsl profile's
/// vision choices for its entry, the WGSL defaults for the default.
#[test]
fn bench_with_an_image_on_the_gpu_times_the_wgsl_towers() {
    let tmp = tempdir();
    let cache = tmp.path().join("cache");
    let Some(dev) = gpu_index(&cache, "bench --image") else { return };
    let profile = tmp.path().join("gpu.yaml");
    std::fs::write(
        &profile,
        PROFILE.replace("backend: cpu", "backend: wgsl").replace("_direct_cpu", "_direct").replace("_rows_cpu", "_rows"),
    )
    .expect("write");
    let dir = fixture("gemma3-vision-tiny");
    let src = [std::ffi::OsStr::new("--model-dir"), dir.as_os_str()];
    let o = bench_on(&cache, &dev, &src, &["--profile", profile.to_str().expect("utf-8"), "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    check_vision(&r, 2);
    let kernels = |i: usize| r["entries"][i]["vision"]["kernels"].to_string();
    assert!(kernels(0).contains("vision.attention attention_full_rows\"") && kernels(0).contains("patch_embed_direct\""), "{}", kernels(0));
    assert!(!kernels(1).contains("_cpu") && !kernels(1).contains("attention_full_rows"), "{}", kernels(1));
}

/// The GGUF pair (`--gguf TEXT --mmproj MMPROJ`): the projector file's tower.
#[test]
fn bench_with_an_image_runs_a_gguf_pairs_tower() {
    let tmp = tempdir();
    let pair = fixture("gemma3-vision-gguf");
    let (text, mmproj) = (pair.join("text.gguf"), pair.join("mmproj.gguf"));
    let src = [std::ffi::OsStr::new("--gguf"), text.as_os_str(), std::ffi::OsStr::new("--mmproj"), mmproj.as_os_str()];
    let o = bench(tmp.path(), &src, &["--no-profile", "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_vision(&serde_json::from_slice(&o.stdout).expect("JSON"), 1);
}

#[test]
fn bench_with_an_image_refuses_a_model_without_a_tower_and_a_bad_image() {
    let tmp = tempdir();
    let llama = fixture("llama3-tiny");
    ktune(tmp.path())
        .args(["bench", "--device", "cpu", "--model-dir"])
        .arg(&llama)
        .arg("--image")
        .arg(fixture("gemma3-vision-tiny/image.png"))
        .args(["--rounds", "3"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("has no vision tower").and(predicate::str::contains("multimodal model")));
    let bad = tmp.path().join("not-an-image.png");
    std::fs::write(&bad, b"plain text, not a PNG").expect("write");
    ktune(tmp.path())
        .args(["bench", "--device", "cpu", "--model-dir"])
        .arg(fixture("gemma3-vision-tiny"))
        .arg("--image")
        .arg(&bad)
        .args(["--rounds", "3"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not-an-image.png"));
    // --mmproj pairs with --gguf only.
    ktune(tmp.path())
        .args(["bench", "--device", "cpu", "--model-dir"])
        .arg(fixture("gemma3-vision-tiny"))
        .arg("--image")
        .arg(fixture("gemma3-vision-tiny/image.png"))
        .arg("--mmproj")
        .arg(fixture("gemma3-vision-gguf/mmproj.gguf"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--gguf TEXT.gguf"));
}
