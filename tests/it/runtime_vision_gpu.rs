//! The vision path on a GPU (lavapipe in CI) against Hugging Face transformers:
//! the tiny `Gemma3ForConditionalGeneration` of tests/fixtures/gemma3-vision-tiny
//! (tools/make_vision_fixture.py). The tower and projector run with the vision
//! ops' WGSL kernels ([`VisionGpu`]), the text model on the GPU engine; checked at
//! the CPU test's tolerances (tests/runtime_vision.rs): features and soft tokens
//! within 1e-4 of their scale with every WGSL kernel of every vision op, logits
//! within 1e-3 and identical greedy tokens; and `ktune run --image` on the GPU,
//! with the WGSL defaults and with a profile's `kernels.vision` choices.
//! Without an adapter these tests skip loudly, unless KTUNE_REQUIRE_GPU=1.

use crate::common::vision::{self, dir, expected, load};
use crate::common::{gpu_index, ids, ktune_in, logit_rows, read_json, rel_err, tempdir};
use ktune::kernels::{self, Backend, DType};
use ktune::plan::select::DeviceCaps;
use ktune::plan::{Choice, Regime, Selection, Slot};
use ktune::runtime::image::load_image;
use ktune::runtime::vision::VisionEngine;
use ktune::runtime::vision_gpu::VisionGpu;
use ktune::testing::test_gpu;

/// The tower and projector on the GPU with the default kernels, then with each
/// WGSL kernel of each vision op (and of LayerNorm) forced in turn; and the GPU's
/// features against the CPU engine's.
#[test]
fn gpu_tower_and_projector_match_transformers_with_every_kernel() {
    let Some(gpu) = test_gpu() else { return };
    let m = load();
    let v = m.vision.as_ref().expect("vision");
    let tower = || VisionGpu::new(v, &m.weights, gpu.clone()).expect("tower on the GPU");
    let (runs, failures) = vision::tower_runs(tower, Backend::Wgsl);
    assert!(failures.is_empty(), "on {}:\n{}", gpu.name, failures.join("\n"));
    let pixels = vision::tower_expected().pixels;
    // the same image on the CPU engine: the two devices agree
    let cpu = VisionEngine::new(v, &m.weights).expect("tower").encode(&pixels).expect("encode");
    let out = runs[0].1.encode(&pixels).expect("encode");
    let (df, dp) = (vision::rel(&out.features, &cpu.features), vision::rel(&out.tokens, &cpu.tokens));
    assert!(df <= 1e-4 && dp <= 1e-4, "GPU vs CPU: features {df:.2e}, projected {dp:.2e}");
    // a wrong-sized image is refused, not read past
    let err = runs[0].1.encode(&pixels[1..]).unwrap_err().to_string();
    assert!(err.contains("pixel values"), "{err}");
}

/// Tower, projector and text model all on the GPU: the prompt with the image's
/// soft tokens, every position's logits and the greedy continuation, prefilled
/// at once and in chunks that split the image (causal image attention, as the
/// fixture's `logits` were computed).
#[test]
fn gpu_image_prompt_logits_and_greedy_tokens_match_transformers() {
    let Some(gpu) = test_gpu() else { return };
    let m = load();
    let v = m.vision.as_ref().expect("vision");
    let pixels = load_image(&dir().join("image.png"), v.image_size).expect("image");
    let soft = VisionGpu::new(v, &m.weights, gpu.clone()).expect("tower").encode(&pixels).expect("encode").tokens;
    let failures = vision::causal_image_prompt_failures(&m, &soft, |fusion, chunk, tokens, context| {
        let e = vision::text_engine(&m, tokens, context, chunk, fusion, Some(gpu.clone()));
        assert!(e.is_gpu());
        e
    });
    assert!(failures.is_empty(), "on {}:\n{}", gpu.name, failures.join("\n"));
}

/// `ktune run --image` on the GPU adapter: the tower runs there (its note says
/// so), the logits and greedy ids are transformers'.
#[test]
fn run_with_an_image_on_the_gpu_matches_transformers_end_to_end() {
    let cache = tempdir();
    let Some(index) = gpu_index(cache.path(), "run --image") else { return };
    let exp = expected();
    let tokens: Vec<String> = ids(&exp["tokens"]).iter().map(u32::to_string).collect();
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    let out = ktune_in(cache.path())
        .arg("run")
        .arg("--model-dir")
        .arg(dir())
        .arg("--image")
        .arg(dir().join("image.png"))
        .args(["--tokens", &tokens.join(","), "--max-tokens", "8", "--ignore-eos", "--device", &index, "--format", "json"])
        .arg("--dump-logits")
        .arg(&dump)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("(GPU)") || stderr.contains("(GPU)"), "the tower did not run on the GPU: {stdout} {stderr}");
    let d = read_json(&dump);
    // `run --image` attends bidirectionally inside the image by default: transformers
    // given the processor's token_type_ids (`tt_*`).
    assert_eq!(ids(&d["generated"]), ids(&exp["tt_generated"]), "greedy ids");
    let err = rel_err(&logit_rows(&d["logits"]), &logit_rows(&exp["tt_logits"]));
    assert!(err <= 1e-3, "logits err {err:.2e}");
}

/// A selection's vision choices (kernel and parameters) run on the GPU tower:
/// non-default kernels give transformers' soft tokens and `kernels()` names
/// them; a CPU kernel, or one of another op, is refused naming the slot, the
/// kernel and the reason.
#[test]
fn gpu_tower_takes_a_selections_vision_kernels_and_refuses_bad_ones() {
    let Some(gpu) = test_gpu() else { return };
    let m = load();
    let v = m.vision.as_ref().expect("vision");
    let want = vision::tower_expected();
    let tower = || VisionGpu::new(v, &m.weights, gpu.clone()).expect("tower on the GPU");
    let choose = |slot: Slot, id: &str, params: &[(&str, u32)]| {
        let k = kernels::find(id).expect("a kernel");
        let mut p = k.default_params();
        for (name, value) in params {
            p.insert((*name).to_string(), *value);
        }
        ((slot, Regime::Vision), Choice::new(k, p))
    };
    let mut sel = Selection::defaults(DeviceCaps::Gpu(gpu.caps.clone()));
    sel.slots.extend([
        choose(Slot::VisionPatchEmbed, "patch_embed_direct", &[]),
        choose(Slot::VisionAttention, "attention_full_rows", &[("workgroup_size", 32)]),
        choose(Slot::VisionPool, "avg_pool_separable", &[]),
    ]);
    let forced = tower().with_selection(&sel).expect("valid choices");
    let names: Vec<String> = forced.kernels().expect("kernels").iter().map(|(s, k)| format!("{} {k}", s.name())).collect();
    for want in [
        "vision.patch_embed patch_embed_direct",
        "vision.attention attention_full_rows(workgroup_size=32)",
        "vision.pool avg_pool_separable",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let defaults: Vec<String> = tower().kernels().expect("kernels").iter().map(|(s, k)| format!("{} {k}", s.name())).collect();
    assert_ne!(names, defaults, "the selection changed the tower's kernels");
    let out = forced.encode(&want.pixels).expect("encode");
    let err = vision::rel(&out.tokens, &want.projected);
    assert!(err <= 1e-4, "soft tokens with {names:?}: err {err:.2e} of scale");
    // A CPU kernel, and a kernel of another op, are refused before anything runs.
    let mut cpu = sel.clone();
    cpu.slots.extend([choose(Slot::VisionAttention, "attention_full_rows_cpu", &[])]);
    let e = tower().with_selection(&cpu).err().expect("a CPU kernel is refused").to_string();
    assert!(e.contains("vision.attention") && e.contains("attention_full_rows_cpu") && e.contains("a cpu kernel"), "{e}");
    let mut other = sel.clone();
    other.slots.insert(
        (Slot::VisionPool, Regime::Vision),
        Choice::new(kernels::find("layer_norm_wg").expect("k"), kernels::find("layer_norm_wg").expect("k").default_params()),
    );
    let e = tower().with_selection(&other).err().expect("another op is refused").to_string();
    assert!(e.contains("vision.pool") && e.contains("computes layer_norm"), "{e}");
}

/// `ktune run --image --profile` on the GPU: the profile's `kernels.vision`
/// choices run (the run's note names them) and give transformers' greedy ids; a
/// CPU kernel in the GPU profile, and a variant this adapter cannot run at the
/// tower's shapes (the tiled Linear with 128x128 tiles: 36 KiB of workgroup
/// memory), are exit 2 naming the kernel and the reason.
#[test]
fn run_with_an_image_on_the_gpu_honours_the_profiles_vision_kernels() {
    let cache = tempdir();
    let Some(index) = gpu_index(cache.path(), "run --image --profile") else { return };
    let exp = expected();
    let tokens: Vec<String> = ids(&exp["tokens"]).iter().map(u32::to_string).collect();
    let tmp = tempdir();
    let profile = |name: &str, vision: &str| {
        let p = tmp.path().join(name);
        std::fs::write(
            &p,
            format!("name: v\nmodel: gemma3-vision-tiny\nversion: 1\ndevice:\n  backend: wgsl\nkernels:\n  vision:\n{vision}"),
        )
        .expect("write");
        p
    };
    let run = |p: &std::path::Path| {
        ktune_in(cache.path())
            .arg("run")
            .arg("--model-dir")
            .arg(dir())
            .arg("--image")
            .arg(dir().join("image.png"))
            .arg("--profile")
            .arg(p)
            .args(["--tokens", &tokens.join(","), "--max-tokens", "8", "--ignore-eos", "--device", &index, "--format", "json"])
            .output()
            .expect("runs")
    };
    let good = profile(
        "good.yaml",
        "    patch_embed: patch_embed_direct\n    attention: {kernel: attention_full_rows, params: {workgroup_size: 32}}\n",
    );
    let o = run(&good);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "stderr: {stderr}");
    let both = format!("{stdout}{stderr}");
    assert!(both.contains("(GPU)"), "the tower did not run on the GPU: {both}");
    for want in ["vision.patch_embed patch_embed_direct", "vision.attention attention_full_rows(workgroup_size=32)"] {
        assert!(both.contains(want), "the run names {want}: {both}");
    }
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(ids(&r["generated"]), ids(&exp["tt_generated"]), "greedy ids");
    // A CPU kernel in a GPU profile: refused at load, with its position.
    let o = run(&profile("cpu.yaml", "    attention: attention_full_rows_cpu\n"));
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("cpu.yaml:") && e.contains("attention_full_rows_cpu") && e.contains("cpu kernel"), "{e}");
    // A variant checked against this adapter at the tower's shapes: exit 2 with
    // the check's reason where it is invalid, transformers' ids where it is not.
    let tiles = [("reg_m", 8), ("reg_n", 8), ("tile_k", 32), ("tile_m", 128), ("tile_n", 128)];
    let k = kernels::find("linear_tiled").expect("linear_tiled");
    let mut params = k.default_params();
    for (n, x) in tiles {
        params.insert(n.into(), x);
    }
    // After the test devices opened (the driver's environment is set then).
    let _ = ktune::testing::test_gpu();
    let devices = ktune::device::discover();
    let caps = DeviceCaps::from(&devices[index.parse::<usize>().expect("an index")]);
    let v = load().vision.expect("vision");
    let why = ktune::plan::vision::slot_problems(&v)
        .iter()
        .filter(|(s, ..)| *s == Slot::VisionMlp)
        .find_map(|(_, p, _)| k.check(caps.caps(), p, DType::F32, &params).err());
    let o = run(&profile(
        "tiles.yaml",
        "    mlp: {kernel: linear_tiled, params: {reg_m: 8, reg_n: 8, tile_k: 32, tile_m: 128, tile_n: 128}}\n",
    ));
    let e = String::from_utf8_lossy(&o.stderr);
    match why {
        Some(why) => {
            assert_eq!(o.status.code(), Some(2), "{e}");
            assert!(e.contains("vision.mlp") && e.contains("linear_tiled") && e.contains(&why), "{why}: {e}");
        }
        None => {
            assert!(o.status.success(), "{e}");
            let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
            assert_eq!(ids(&r["generated"]), ids(&exp["tt_generated"]), "greedy ids with 128x128 tiles");
        }
    }
}
