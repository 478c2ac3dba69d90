//! The multimodal fixture (`tests/fixtures/gemma3-vision-tiny`) the vision tests
//! share: its directory, transformers' expected values, the loaded model, its
//! text model as an engine (CPU or GPU) and the image prompt's checks both run.

use std::path::PathBuf;
use std::sync::Arc;

use ktune::device::CpuCaps;
use ktune::gpu::GpuCtx;
use ktune::kernels::{self, Backend, DType, Op};
use ktune::plan::select::DeviceCaps;
use ktune::plan::{Fusion, Plan, PlanOptions, Selection};
use ktune::runtime::vision::{TowerBackend, VisionTower};
use ktune::runtime::{Engine, ImageAttention, TensorStore, argmax};
use ktune::session::{LoadedModel, load_model};

use super::{fixture, read_json};

pub fn dir() -> PathBuf {
    fixture("gemma3-vision-tiny")
}

/// `vision_expected.json`: transformers' features, soft tokens, logits and ids.
pub fn expected() -> serde_json::Value {
    read_json(dir().join("vision_expected.json"))
}

pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

pub fn load() -> LoadedModel {
    load_model(None, Some(&dir()), None, 0).expect("the multimodal fixture loads")
}

/// `tests/fixtures/gemma3-vision-gguf`: the same model as llama.cpp's converter
/// writes it, a text GGUF and its vision projector (tools/make_mmproj_fixture.py).
pub fn gguf_pair() -> (PathBuf, PathBuf) {
    let d = fixture("gemma3-vision-gguf");
    (d.join("text.gguf"), d.join("mmproj.gguf"))
}

pub fn load_gguf_pair() -> LoadedModel {
    let (text, mmproj) = gguf_pair();
    ktune::session::load_gguf_mmproj(&text, &mmproj, None).expect("the GGUF pair loads")
}

/// The fixture's text model as an engine on the CPU or on `gpu`: f32 weights and
/// cache, every row's logits, prefill passes of `chunk` tokens, the defaults'
/// kernels (image attention the runtime's default, bidirectional).
pub fn text_engine(m: &LoadedModel, tokens: usize, context: usize, chunk: usize, fusion: Fusion, gpu: Option<Arc<GpuCtx>>) -> Engine {
    let opts = PlanOptions::new(DType::F32, chunk.min(tokens), context).with_all_logits(true).with_fusion(fusion);
    let caps = match &gpu {
        Some(g) => DeviceCaps::Gpu(g.caps.clone()),
        None => DeviceCaps::Cpu(CpuCaps::detect()),
    };
    let plan = Plan::new("fixture", &m.config, opts, Selection::defaults(caps)).expect("plan");
    let store: Arc<dyn TensorStore> = m.weights.clone();
    match gpu {
        Some(g) => Engine::gpu(plan, store, g, true).expect("GPU engine"),
        None => Engine::cpu(plan, store).expect("engine"),
    }
}

/// `new` greedy ids after a prompt whose logits are `rows` (the first is the
/// last row's argmax; each next one a decode step's).
fn greedy(e: &mut Engine, rows: &[Vec<f32>], new: usize) -> Vec<u32> {
    let mut next = argmax(rows.last().expect("rows"));
    let mut got = Vec::new();
    for i in 0..new {
        got.push(next);
        if i + 1 < new {
            next = argmax(&e.forward(&[next]).expect("decode")[0]);
        }
    }
    got
}

/// Prefills the prompt with the image's soft tokens in one call (the engine cuts
/// its passes around the image), then decodes greedily: the prompt's logits and
/// the ids.
pub fn image_prompt(e: &mut Engine, m: &LoadedModel, tokens: &[u32], soft: &[f32], new: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let v = m.vision.as_ref().expect("vision");
    let rows = e.forward_with_soft_tokens(tokens, v.image_token_id, soft.to_vec()).expect("prefill");
    let got = greedy(e, &rows, new);
    (rows, got)
}

/// The prompt with the image's soft tokens in place of its image tokens, the
/// image attended causally, prefilled in one call per `chunk` tokens (each with
/// the soft tokens of its own image tokens: a chunk may split the image), against
/// transformers' logits and greedy ids without `token_type_ids`, with and
/// without fusions, at once and in chunks that split the image. `engine(fusion,
/// chunk, tokens, context)` builds the engine; the failures, one line each.
pub fn causal_image_prompt_failures(m: &LoadedModel, soft: &[f32], engine: impl Fn(Fusion, usize, usize, usize) -> Engine) -> Vec<String> {
    let v = m.vision.as_ref().expect("vision");
    let exp = expected();
    let tokens = super::ids(&exp["tokens"]);
    let want_logits = super::logit_rows(&exp["logits"]);
    let want_ids = super::ids(&exp["generated"]);
    let mut failures = Vec::new();
    for (fusion, chunk) in [(Fusion::NONE, 64), (Fusion::ALL, 64), (Fusion::ALL, 7)] {
        let mut e = engine(fusion, chunk, tokens.len(), tokens.len() + want_ids.len());
        e.image_attention = ImageAttention::Causal;
        let mut rows = Vec::new();
        let mut used = 0;
        for c in tokens.chunks(chunk) {
            let n = c.iter().filter(|&&t| t == v.image_token_id).count() * m.config.dims.hidden_size;
            rows.extend(e.forward_with_soft_tokens(c, v.image_token_id, soft[used..used + n].to_vec()).expect("prefill"));
            used += n;
        }
        let err = super::rel_err(&rows, &want_logits);
        let got = greedy(&mut e, &rows, want_ids.len());
        eprintln!("{} fusion {fusion:?} chunk {chunk}: logits err {err:.2e} of scale, ids {got:?}", if e.is_gpu() { "GPU" } else { "CPU" });
        if err > 1e-3 || got != want_ids {
            failures.push(format!("{fusion:?} chunk {chunk}: err {err:.2e}, ids {got:?} want {want_ids:?}"));
        }
    }
    failures
}

/// transformers' pixel values, tower features and projected soft tokens for the
/// fixture's image.
pub struct TowerExpected {
    pub pixels: Vec<f32>,
    pub features: Vec<f32>,
    pub projected: Vec<f32>,
}

pub fn tower_expected() -> TowerExpected {
    let exp = expected();
    TowerExpected {
        pixels: floats(&exp["pixel_values"]),
        features: super::logit_rows(&exp["features"]).concat(),
        projected: super::logit_rows(&exp["projected"]).concat(),
    }
}

/// Relative error of one flat vector against another, of the latter's scale.
pub fn rel(got: &[f32], want: &[f32]) -> f64 {
    super::rel_err(&[got.to_vec()], &[want.to_vec()])
}

/// The tower `tower()` builds with its default kernels, then with each `backend`
/// kernel of each vision op forced in turn (at least two of each of the five ops
/// and LayerNorm's), each run's features and soft tokens against transformers'
/// within 1e-4 of their scale: the runs, the defaults first, and the failures.
pub fn tower_runs<B: TowerBackend>(tower: impl Fn() -> VisionTower<B>, backend: Backend) -> (Vec<(String, VisionTower<B>)>, Vec<String>) {
    let want = tower_expected();
    let mut runs: Vec<(String, VisionTower<B>)> = vec![("defaults".into(), tower())];
    for op in [Op::PatchEmbed, Op::Linear, Op::AttentionFull, Op::AvgPool, Op::LayerNorm, Op::ResidualLayerNorm] {
        for k in kernels::for_op(op).filter(|k| k.backend() == backend) {
            runs.push((k.id.to_string(), tower().with_kernel(k)));
        }
    }
    let mut failures = Vec::new();
    for (name, t) in &runs {
        let out = t.encode(&want.pixels).expect("encode");
        let (ef, ep) = (rel(&out.features, &want.features), rel(&out.tokens, &want.projected));
        eprintln!("{backend:?} {name}: features err {ef:.2e}, projected err {ep:.2e} of scale");
        if ef > 1e-4 || ep > 1e-4 {
            failures.push(format!("{name}: features {ef:.2e}, projected {ep:.2e}"));
        }
    }
    assert!(runs.len() >= 11, "{} runs", runs.len());
    (runs, failures)
}
