//! Decode steps chained on the GPU (`Engine::decode_chain`, `--decode-chain`,
//! `execution.decodeChain`) on the test GPU (lavapipe in CI; skipped loudly
//! without one): the same greedy ids for K = 1 and K = 8 as the CPU's, the GPU
//! sampler's ids equal to the CPU sampler's over the GPU's own logits (the LM
//! head whole and split in blocks, Gemma's softcap, an untied head), a stop mid-chain that keeps
//! exactly the ids before it and leaves the KV cache as if the discarded steps
//! never ran, `run` stopping exactly at `--max-tokens` and at an EOS mid-chain,
//! and the flag's and the profile field's bounds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{fixture, gpu_index, ids, ktune_in, read_json, tempdir};
use ktune::gpu::GpuCtx;
use ktune::kernels::DType;
use ktune::kernels::sample::{Sampler, SamplerParams};
use ktune::plan::select::DeviceCaps;
use ktune::plan::{Fusion, Plan, PlanOptions, Selection};
use ktune::runtime::{Engine, TensorStore};
use ktune::session::load_model;
use ktune::testing::test_gpu;

/// Decode steps each check runs.
const STEPS: usize = 12;

/// The sampled chain's parameters, the penalty on so the history is in play.
const SAMPLED: SamplerParams =
    SamplerParams { temperature: 0.8, top_k: 40, top_p: 0.9, min_p: 0.0, repeat_penalty: 1.3, repeat_last_n: 64, seed: 7 };

/// An engine of fixture `dir` (its prompt from `expected.json`) on `gpu` (None:
/// the CPU), every fusion on, or planned unfused with a storage binding limit of
/// `limit` bytes when given (the LM head split in blocks).
pub(crate) fn engine(dir: &Path, gpu: Option<&Arc<GpuCtx>>, limit: Option<u64>) -> (Engine, Vec<u32>) {
    let m = load_model(None, Some(&dir.to_path_buf()), None, 0).expect("fixture loads");
    let prompt = ids(&read_json(dir.join("expected.json"))["tokens"]);
    // Unfused under a binding limit (the fused weights are larger than the head).
    let fusion = if limit.is_some() { Fusion::NONE } else { Fusion::ALL };
    let opts = PlanOptions::new(DType::F32, prompt.len(), prompt.len() + 2 * STEPS).with_fusion(fusion);
    let caps = match gpu {
        Some(g) => {
            let mut caps = g.caps.clone();
            if let Some(l) = limit {
                caps.max_storage_binding = l;
            }
            DeviceCaps::Gpu(caps)
        }
        None => DeviceCaps::Cpu(ktune::device::CpuCaps::detect()),
    };
    let plan = Plan::new("fixture", &m.config, opts, Selection::runtime(caps)).expect("plan");
    assert!(limit.is_none() || plan.lm_head.len() > 1, "{}: the LM head is split", dir.display());
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let e = match gpu {
        Some(g) => Engine::gpu(plan, store, g.clone(), true).expect("GPU engine"),
        None => Engine::cpu(plan, store).expect("CPU engine"),
    };
    (e, prompt)
}

/// Prefill from an empty cache; the prompt's next id by `sampler`.
pub(crate) fn prefill(e: &mut Engine, prompt: &[u32], sampler: &mut Sampler) -> u32 {
    e.reset();
    let rows = e.forward(prompt).expect("prefill");
    sampler.sample(rows.last().expect("a row"))
}

/// `steps` ids decoded in chains of `k` after the prefill, with `params`.
fn chained(e: &mut Engine, prompt: &[u32], params: SamplerParams, steps: usize, k: usize) -> Vec<u32> {
    let mut s = Sampler::new(params);
    let first = prefill(e, prompt, &mut s);
    let mut out = Vec::new();
    let n = e
        .decode_chain(first, steps, k, &mut s, |id| {
            out.push(id);
            true
        })
        .expect("decode");
    assert_eq!((n, e.pos), (steps, prompt.len() + steps), "every step kept, the position past them");
    out
}

/// The fixtures the sampler and greedy checks run: (name, LM-head binding
/// limit). Qwen2's head is untied: the host writes each step's row, so every
/// step runs alone.
fn cases() -> [(&'static str, Option<u64>); 4] {
    // 32 KiB: below the head, above every other unfused buffer (runtime_hf's limit).
    [("llama3-tiny", None), ("gemma3-tiny", None), ("gemma3-tiny", Some(32 << 10)), ("qwen2-tiny-sharded", None)]
}

#[test]
fn greedy_ids_are_the_same_for_every_chain_and_the_cpus() {
    let Some(gpu) = test_gpu() else { return };
    for (name, limit) in cases() {
        let dir = fixture(name);
        let (mut cpu, prompt) = engine(&dir, None, None);
        let want = chained(&mut cpu, &prompt, SamplerParams::GREEDY, STEPS, 1);
        let (mut e, _) = engine(&dir, Some(&gpu), limit);
        for k in [1, 8] {
            assert_eq!(chained(&mut e, &prompt, SamplerParams::GREEDY, STEPS, k), want, "{name} (limit {limit:?}), K = {k}");
        }
    }
}

#[test]
fn sampled_ids_match_the_cpu_sampler_over_the_gpus_logits() {
    let Some(gpu) = test_gpu() else { return };
    for (name, limit) in cases() {
        let dir = fixture(name);
        let (mut e, prompt) = engine(&dir, Some(&gpu), limit);
        // The reference: the GPU's logits read back, the CPU's sampler over them.
        let mut s = Sampler::new(SAMPLED);
        let mut next = prefill(&mut e, &prompt, &mut s);
        let mut want = Vec::new();
        for _ in 0..STEPS {
            next = s.sample(e.decode_step(next).expect("decode"));
            want.push(next);
        }
        let greedy = chained(&mut e, &prompt, SamplerParams::GREEDY, STEPS, 1);
        assert_ne!(want, greedy, "{name}: the draw is not the argmax");
        for k in [1, 8] {
            // A fresh engine: its counters are the chain's alone.
            let (mut e, _) = engine(&dir, Some(&gpu), limit);
            assert_eq!(chained(&mut e, &prompt, SAMPLED, STEPS, k), want, "{name} (limit {limit:?}), K = {k}");
            let g = e.decode_counters().and_then(|c| c.gpu).expect("GPU counters");
            assert!(g.read_back_bytes <= 8.0, "{name}, K = {k}: the id alone comes back, not the logits: {g:?}");
        }
    }
}

/// A stop at the third id of a chain of 8 keeps those three ids and the
/// position after their steps; decoding on from there gives what an
/// uninterrupted run gives (the discarded steps' KV rows are overwritten before
/// anything reads them).
#[test]
fn a_stop_mid_chain_keeps_the_ids_before_it_and_the_cache_as_if_never_run() {
    let Some(gpu) = test_gpu() else { return };
    let (mut e, prompt) = engine(&fixture("llama3-tiny"), Some(&gpu), None);
    let full = chained(&mut e, &prompt, SAMPLED, STEPS, 8);
    let mut s = Sampler::new(SAMPLED);
    let first = prefill(&mut e, &prompt, &mut s);
    let mut got = Vec::new();
    let n = e
        .decode_chain(first, STEPS, 8, &mut s, |id| {
            got.push(id);
            got.len() < 3
        })
        .expect("decode");
    assert_eq!((n, &got[..]), (3, &full[..3]), "exactly the ids up to the stop");
    assert_eq!(e.pos, prompt.len() + 3, "the position of the last kept step");
    let n = e
        .decode_chain(got[2], STEPS - 3, 8, &mut s, |id| {
            got.push(id);
            true
        })
        .expect("decode on");
    assert_eq!((n, got), (STEPS - 3, full), "decoding on after the stop");
    // Past the KV capacity: the ids that fit, then the error.
    let room = e.plan.options.context - e.pos;
    let mut more = 0;
    let r = e.decode_chain(1, room + 5, 8, &mut s, |_| {
        more += 1;
        true
    });
    assert!(r.is_err() && more == room, "{more} ids of {room}, then {r:?}");
}

/// `ktune run` of the tiny Llama fixture in `dir` on `device` with `extra` flags, as JSON.
fn run(cache: &Path, dir: &Path, device: &str, extra: &[&str]) -> serde_json::Value {
    let o = ktune_in(cache)
        .args(["run", "--device", device, "--no-profile", "--model-dir"])
        .arg(dir)
        .args(["--tokens", "1,2,3", "--format", "json"])
        .args(extra)
        .output()
        .expect("runs");
    assert!(o.status.success(), "run {extra:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

#[test]
fn run_stops_exactly_at_max_tokens_and_at_an_eos_mid_chain() {
    let cache = tempdir();
    let Some(dev) = gpu_index(cache.path(), "decode chain") else { return };
    let model = fixture("llama3-tiny");
    let full = ids(&run(cache.path(), &model, &dev, &["--max-tokens", "12", "--ignore-eos", "--decode-chain", "8"])["generated"]);
    assert_eq!(full.len(), 12);
    let r = run(cache.path(), &model, &dev, &["--max-tokens", "5", "--ignore-eos", "--decode-chain", "8"]);
    assert_eq!(ids(&r["generated"]), full[..5], "exactly 5 tokens");
    assert_eq!((r["stop_reason"].as_str(), r["decode_tokens"].as_u64()), (Some("max_tokens"), Some(3)), "timed: the steps after the first");
    // The fixture with its EOS id made the one greedy emits at step 4 or later
    // (not before): generation stops there, mid-chain.
    let at = (4..full.len()).find(|&i| !full[..i].contains(&full[i])).expect("a new id after step 3");
    let dir = tempdir();
    for f in ["model.safetensors", "expected.json"] {
        std::fs::copy(model.join(f), dir.path().join(f)).expect("copies");
    }
    let mut config = read_json(model.join("config.json"));
    config["eos_token_id"] = full[at].into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("writes");
    let r = run(cache.path(), dir.path(), &dev, &["--max-tokens", "12", "--decode-chain", "8"]);
    assert_eq!(ids(&r["generated"]), full[..=at], "stopped at the EOS");
    assert_eq!(r["stop_reason"], "eos");
}

#[test]
fn the_chain_flag_and_profile_field_are_bounded_and_old_profiles_load() {
    let cache = tempdir();
    for bad in ["0", "65", "x"] {
        let o = ktune_in(cache.path())
            .args(["run", "--device", "cpu", "--no-profile", "--model-dir"])
            .arg(fixture("llama3-tiny"))
            .args(["--tokens", "1,2,3", "--decode-chain", bad])
            .output()
            .expect("runs");
        assert_eq!(o.status.code(), Some(2), "--decode-chain {bad}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("--decode-chain"), "the message names the flag");
    }
    let old: PathBuf = fixture("profiles/a.yaml");
    let text = std::fs::read_to_string(&old).expect("reads");
    assert!(!text.contains("decodeChain"), "a profile from before the field");
    let p = ktune::profile::Profile::load(&old).expect("an old profile loads");
    assert_eq!(p.doc.execution.decode_chain, None, "absent: the runtime's default");
    let dir = tempdir();
    for (k, ok) in [(16, true), (0, false), (65, false)] {
        let path = dir.path().join(format!("chain{k}.yaml"));
        std::fs::write(&path, text.replace("  batchCommands: true\n", &format!("  batchCommands: true\n  decodeChain: {k}\n")))
            .expect("writes");
        match ktune::profile::Profile::load(&path) {
            Ok(p) => assert!(ok && p.doc.execution.decode_chain == Some(k), "decodeChain {k} loaded"),
            Err(e) => assert!(!ok && e.to_string().contains("decodeChain"), "decodeChain {k}: {e}"),
        }
    }
}
