//! The decode chain's fusions on a GPU adapter (lavapipe here; skipped loudly
//! without one unless KTUNE_REQUIRE_GPU=1): with the runtime's default fusions a
//! decode token runs at most 7 dispatches a layer on a Llama-architecture model
//! (norm + QKV; split + RoPE + KV write; attention (two with split-K); o-proj;
//! residual + norm + gate/up + activation; down) and at most 8 on Gemma 3 (its
//! q/k norm and post-norms folded into the same kernels), and the greedy ids are
//! those of the unfused CPU run with the f32 and the f16 KV cache; the logits of
//! every prompt and decode row those of the unfused CPU plan.

use std::path::Path;

use ktune::device::CpuCaps;
use ktune::kernels::DType;
use ktune::plan::Fusion;
use ktune::plan::select::DeviceCaps;
use ktune::session::load_model;
use ktune::testing::test_gpu;

use crate::common::{fixture, gpu_index, ktune_in, rel_err, tempdir};
use crate::runtime_quant::logits;

/// `ktune run` of 6 tokens after a 3-token prompt, its JSON report.
fn run(cache: &Path, model: &str, device: &str, fusion: &str, kv: &str) -> serde_json::Value {
    let o = ktune_in(cache)
        .args(["run", "--device", device, "--no-profile", "--model-dir"])
        .arg(fixture(model))
        .args(["--tokens", "1,2,3", "--max-tokens", "6", "--ignore-eos", "--fusion", fusion, "--kv-dtype", kv, "--format", "json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "run {model} on {device} ({fusion}): {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

fn per_layer(r: &serde_json::Value) -> f64 {
    r["dispatches_per_layer"].as_f64().unwrap_or_else(|| panic!("no dispatches per layer in {r}"))
}

#[test]
fn decode_layers_fit_the_dispatch_budget_and_keep_the_cpus_logits() {
    let cache = tempdir();
    let Some(dev) = gpu_index(cache.path(), "decode fusion") else { return };
    for (model, budget) in [("llama3-tiny", 7.0), ("gemma3-tiny", 8.0)] {
        for kv in ["f32", "f16"] {
            let fused = run(cache.path(), model, &dev, "all", kv);
            let unfused = run(cache.path(), model, &dev, "none", kv);
            let cpu = run(cache.path(), model, "cpu", "none", kv);
            assert!(per_layer(&fused) <= budget, "{model} ({kv} cache): {} dispatches a layer, budget {budget}", per_layer(&fused));
            // The unfused steps are still there to race against.
            assert!(
                per_layer(&unfused) > per_layer(&fused) + 4.0,
                "{model}: unfused {} vs fused {}",
                per_layer(&unfused),
                per_layer(&fused)
            );
            assert_eq!(fused["generated"], cpu["generated"], "{model} ({kv} cache): greedy ids");
            assert_eq!(unfused["generated"], cpu["generated"], "{model} ({kv} cache): greedy ids unfused");
        }
        // Every prompt row and greedy decode step's logits (the library's engines).
        let Some(gpu) = test_gpu() else { return };
        let dir = fixture(model);
        let m = load_model(None, Some(&dir), None, 0).expect("fixture loads");
        let want = logits(&dir, DeviceCaps::Cpu(CpuCaps::detect()), None, DType::F32, Fusion::NONE, m.weights.clone());
        let got = logits(&dir, DeviceCaps::Gpu(gpu.caps.clone()), Some(gpu), DType::F32, Fusion::ALL, m.weights.clone());
        let e = rel_err(&got, &want);
        assert!(e < 1e-4, "{model}: fused GPU logits against the unfused CPU's: rel err {e:.2e}");
    }
}
