//! GGUF files against Hugging Face transformers loading the same files: tiny
//! random llama (SmolLM2), qwen2 and gemma3 models in F32, F16, BF16, Q8_0, Q4_0
//! and Q4_1 (tests/fixtures/gguf/, made by tools/make_gguf.py the way llama.cpp's
//! converter writes them: Q/K rows permuted, Gemma norms + 1), and a llama with
//! 256-element rows quantized by llama.cpp's own llama-quantize to Q4_K_M, Q5_K_M,
//! Q6_K, Q2_K, Q3_K_M, Q5_1, IQ4_NL and IQ4_XS (llama-k-*.gguf, made by
//! tools/make_kquant_gguf.py: each file mixes formats per tensor). Each file runs
//! with the weight types the CLI picks from it (every matrix on the block kernels
//! of its own format, blocks as stored) and dequantized to f32. Checked on the CPU and on the test
//! GPU (lavapipe in CI): max |error| <= 1e-3 of the logits' scale, identical
//! greedy tokens (on the GPU chosen there by `Engine::decode_next`, the decode
//! tokens embedded there from the tied table). Then the CLI: `--prompt` through
//! the file's tokenizer, the JSON report, streamed text, and hostile or unsupported files (exit 2).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{gguf_dir as dir, gguf_fixtures as files, ids, read_json, tempdir};
use assert_cmd::Command;
use ktune::device::CpuCaps;
use ktune::kernels::DType;
use ktune::kernels::quant::{QFormat, QMatrix};
use ktune::model::{Stored, Weights};
use ktune::plan::select::DeviceCaps;
use ktune::plan::{Fusion, Plan, PlanOptions, Selection};
use ktune::runtime::{Engine, TensorStore, argmax};
use ktune::session::{LoadedModel, load_gguf, matrix_formats, weight_dtype_for};
use ktune::testing::test_gpu;

fn expected(gguf: &Path) -> serde_json::Value {
    read_json(gguf.with_extension("json"))
}

enum Dev {
    Cpu,
    Gpu(Arc<ktune::gpu::GpuCtx>),
}

/// Runs a fixture: (max abs error / scale, greedy ids, expected ids).
fn run(path: &Path, dev: &Dev, fusion: Fusion, weights: Option<DType>, chunk: usize) -> (f64, Vec<u32>, Vec<u32>) {
    let (rel, got, want, _) = run_with(path, dev, fusion, weights, chunk, &[], false, false);
    (rel, got, want)
}

/// [`run`] with the CPU's repacked formats (`execution.cpuRepack`) and, with
/// `runtime`, the runtime's own selection (int8 activations for the block
/// formats) instead of the exact defaults; with `split_head` on a GPU, a binding
/// limit below the LM head's bytes, so that the head is cut in blocks; also
/// returns the logits.
#[allow(clippy::too_many_arguments)]
fn run_with(
    path: &Path,
    dev: &Dev,
    fusion: Fusion,
    weights: Option<DType>,
    chunk: usize,
    repack: &[QFormat],
    runtime: bool,
    split_head: bool,
) -> (f64, Vec<u32>, Vec<u32>, Vec<Vec<f32>>) {
    let m = load_gguf(path, None).expect("fixture loads");
    let exp = expected(path);
    let tokens = ids(&exp["tokens"]);
    let want = ids(&exp["generated"]);
    let logits = crate::common::logit_rows(&exp["logits"]);
    let opts = options(&m, fusion, weights, chunk.min(tokens.len()), tokens.len() + want.len(), repack);
    let caps = match dev {
        Dev::Cpu => DeviceCaps::Cpu(CpuCaps::detect()),
        Dev::Gpu(g) => DeviceCaps::Gpu(g.caps.clone()),
    };
    let mut caps = caps;
    if split_head && let DeviceCaps::Gpu(g) = &mut caps {
        // Every other buffer's size, or half the head's when larger: below the head's.
        let whole = Plan::new("fixture", &m.config, opts.clone(), Selection::defaults(DeviceCaps::Gpu(g.clone()))).expect("plan");
        let head = whole.lm_head[0].weight;
        let others = whole.buffers.iter().enumerate().filter(|(i, _)| *i != head).map(|(_, b)| b.bytes()).max().unwrap_or(0);
        g.max_storage_binding = others.max(whole.buffers[head].bytes() / 2);
    }
    let sel = if runtime { Selection::runtime(caps) } else { Selection::defaults(caps) };
    let plan = Plan::new("fixture", &m.config, opts, sel).expect("plan");
    assert!(!split_head || plan.lm_head.len() > 1, "{}: the LM head is split", path.display());
    let store: Arc<dyn TensorStore> = m.weights.clone();
    let mut e = match dev {
        Dev::Cpu => Engine::cpu(plan, store).expect("engine"),
        Dev::Gpu(g) => Engine::gpu(plan, store, g.clone(), true).expect("engine"),
    };
    // A tied table is the LM head's buffers: decode embeds on the GPU, unless
    // the head rounds the table (BF16 stored, f16 in the head).
    let rounded = m.weights.stored("model.embed_tokens.weight").is_ok_and(|s| matches!(s, Stored::BF16)) && weights != Some(DType::F32);
    let on_gpu = matches!(dev, Dev::Gpu(_)) && m.config.tie_word_embeddings && !rounded;
    assert_eq!(e.embeds_on_gpu(), on_gpu, "{}: embedding on the GPU", path.display());
    let mut rows = Vec::new();
    for c in tokens.chunks(chunk) {
        rows.extend(e.forward(c).expect("prefill"));
    }
    assert_eq!(rows.len(), logits.len());
    for (got, want) in rows.iter().zip(&logits) {
        assert_eq!(got.len(), want.len(), "{}: vocabulary size", path.display());
    }
    let rel = crate::common::rel_err(&rows, &logits);
    let mut next = argmax(rows.last().expect("rows"));
    let mut got = vec![];
    for i in 0..want.len() {
        got.push(next);
        if i + 1 < want.len() {
            // On the GPU the greedy id is chosen there (Engine::decode_next, 4
            // bytes read back); on the CPU from the decode step's logits.
            if matches!(dev, Dev::Gpu(_)) {
                next = e.decode_next(next).expect("decode");
                continue;
            }
            let row = e.forward(&[next]).expect("decode").remove(0);
            next = argmax(&row);
            rows.push(row);
        }
    }
    (rel, got, want, rows)
}

/// The plan options of a test run: the file's own weight types (as the CLI picks
/// them) unless `weights` says one, an f32 cache, every logit.
fn options(m: &LoadedModel, fusion: Fusion, weights: Option<DType>, max_tokens: usize, context: usize, repack: &[QFormat]) -> PlanOptions {
    let weight_dtype = weights.unwrap_or_else(|| weight_dtype_for(m.weights.matmul_storage().expect("projections")));
    PlanOptions::new(weight_dtype, max_tokens, context)
        .with_matrix_formats(matrix_formats(m, weight_dtype, weights))
        .with_all_logits(true)
        .with_fusion(fusion)
        .with_cpu_repack(repack.to_vec())
}

/// A file whose projections mix f16 (and BF16, served as f16) with five block
/// formats, one a matrix (the fuzz seed `tiny-llama.gguf`, tools/fuzz_seeds.py):
/// decode with every fusion gives the unfused plan's logits, on the CPU and the
/// test GPU. Before, the plan refused it (`buffer L0.post_attn_ln (f32 as f16)`):
/// a norm folded into an f16 projection read its f32 gain as f16.
#[test]
fn projections_mixing_f16_and_block_formats_decode() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/gguf/tiny-llama.gguf");
    let m = load_gguf(&path, None).expect("seed loads");
    let formats: std::collections::BTreeSet<String> =
        m.weights.names().filter_map(|n| m.weights.stored(n).ok()).map(|s| format!("{s:?}")).collect();
    assert!(formats.len() >= 6, "{formats:?}");
    let mut devs = vec![("cpu", Dev::Cpu)];
    devs.extend(test_gpu().map(|g| ("gpu", Dev::Gpu(g))));
    for (what, dev) in &devs {
        let rows = |fusion| {
            let opts = options(&m, fusion, None, 4, 8, &[]);
            let caps = match dev {
                Dev::Cpu => DeviceCaps::Cpu(CpuCaps::detect()),
                Dev::Gpu(g) => DeviceCaps::Gpu(g.caps.clone()),
            };
            let plan = Plan::new("seed", &m.config, opts, Selection::defaults(caps)).expect("plan");
            let store: Arc<dyn TensorStore> = m.weights.clone();
            let mut e = match dev {
                Dev::Cpu => Engine::cpu(plan, store).expect("engine"),
                Dev::Gpu(g) => Engine::gpu(plan, store, g.clone(), true).expect("engine"),
            };
            let mut rows = e.forward(&[1, 6, 9, 12]).expect("prefill");
            for t in [7, 8, 15] {
                rows.extend(e.forward(&[t]).expect("decode"));
            }
            rows
        };
        let (fused, unfused) = (rows(Fusion::ALL), rows(Fusion::NONE));
        let rel = crate::common::rel_err(&fused, &unfused);
        assert!(rel < 1e-4, "{what}: fused decode differs from unfused by {rel:.2e} of the scale");
    }
}

/// The llama-quantize K-quant mixes store some layers' values in another format
/// than their queries and keys (Q4_K_M: Q6_K `attn_v` in some layers; Q3_K_M: Q5_K
/// in all): on the GPU those layers' fused Q/K/V is a stack of per-operand
/// formats, which the decode chain's norm-fused projection reads in one
/// dispatch, so a mixed layer decodes in the dispatches of a uniform one; the
/// decode logits are the unfused plan's within 1e-4 of the scale.
///
/// Also a Qwen2 model (Q/K/V biases) requantized at load to Q4_0 with Q8_0 values:
/// the stack's split adds the fused biases.
#[test]
fn gpu_mixed_qkv_layers_decode_as_one_stacked_projection() {
    let Some(gpu) = test_gpu() else { return };
    for name in ["llama-k-q4_k_m.gguf", "llama-k-q3_k_m.gguf", "qwen2-tiny-f32.gguf"] {
        let path = dir().join(name);
        let m = load_gguf(&path, None).expect("fixture loads");
        let biased = name.starts_with("qwen2");
        let plan = |fusion| {
            let mut opts = options(&m, fusion, biased.then_some(DType::Q4_0), 4, 8, &[]);
            if biased {
                let mut formats = opts.matrix_formats.clone();
                for l in 0..m.config.dims.num_layers {
                    formats.insert(format!("model.layers.{l}.self_attn.v_proj.weight"), DType::Q8_0);
                }
                opts = opts.with_matrix_formats(formats);
            }
            Plan::new("mixed", &m.config, opts, Selection::defaults(DeviceCaps::Gpu(gpu.caps.clone()))).expect("plan")
        };
        let fused = plan(Fusion::ALL);
        let stacked: Vec<&str> = fused.buffers.iter().filter(|b| b.formats.is_some()).map(|b| b.name.as_str()).collect();
        assert!(stacked.iter().any(|n| n.ends_with(".wqkv")), "{name}: no stacked Q/K/V in {stacked:?}");
        // Every layer's decode steps: as many as any other layer's.
        let steps = fused.steps(1, 4).expect("decode steps");
        let per_layer: Vec<usize> = (0..m.config.dims.num_layers).map(|l| steps.iter().filter(|s| s.layer == Some(l)).count()).collect();
        let reads_stack =
            steps.iter().any(|s| matches!(&s.kind, ktune::plan::StepKind::Kernel { problem, .. } if problem.formats().is_some()));
        assert!(reads_stack, "{name}: no decode step reads the stack");
        assert!(per_layer[1..].iter().all(|&n| n == per_layer[1]), "{name}: decode steps per layer {per_layer:?}");
        let rows = |p: Plan| {
            let mut e = Engine::gpu(p, m.weights.clone(), gpu.clone(), true).expect("engine");
            let mut rows = e.forward(&[1, 6, 9, 12]).expect("prefill");
            for t in [7, 8, 15] {
                rows.extend(e.forward(&[t]).expect("decode"));
            }
            rows
        };
        let rel = crate::common::rel_err(&rows(fused), &rows(plan(Fusion::NONE)));
        assert!(rel < 1e-4, "{name}: stacked decode differs from unfused by {rel:.2e} of the scale");
    }
}

/// Q4_K matrices repacked at load (`execution.cpuRepack: [q4_k]`, 8-row records)
/// on the llama-quantize Q4_K_M fixture, whose Q4_K matrices all have whole 8-row
/// groups: with the exact selection (f32 activations, blocks gathered back) it
/// matches transformers as the stored layout does; with the runtime's int8
/// selection (the 8-row decode dots, prefill from the records) every prompt and
/// decode logit matches the stored layout's within 1e-4 of the scale, same ids.
#[test]
fn cpu_repacked_q4k_matches_transformers_and_the_stored_layout() {
    let path = files().into_iter().find(|p| p.to_string_lossy().ends_with("llama-k-q4_k_m.gguf")).expect("the Q4_K_M fixture");
    let repack = [QFormat::Q4_K];
    let (rel, got, want, _) = run_with(&path, &Dev::Cpu, Fusion::ALL, None, 64, &repack, false, false);
    assert!(rel <= 1e-3 && got == want, "repacked, exact selection: rel err {rel:.2e}, ids {got:?} want {want:?}");
    for (fusion, chunk) in [(Fusion::ALL, 64), (Fusion::NONE, 3)] {
        let (_, ids_rows, _, rows) = run_with(&path, &Dev::Cpu, fusion, None, chunk, &[], true, false);
        let (_, ids_x8, _, x8) = run_with(&path, &Dev::Cpu, fusion, None, chunk, &repack, true, false);
        let e = crate::common::rel_err(&x8, &rows);
        assert!(e <= 1e-4, "{fusion:?} chunk {chunk}: repacked vs stored rel err {e:.2e}");
        assert_eq!(ids_x8, ids_rows, "{fusion:?} chunk {chunk}");
    }
}

/// The weight type the CLI picks from the file, fused, the whole prompt at once;
/// and f32 weights, unfused, the prompt in chunks of 7.
const FILE_FUSED: (Fusion, Option<DType>, usize) = (Fusion::ALL, None, 64);
const F32_CHUNKED: (Fusion, Option<DType>, usize) = (Fusion::NONE, Some(DType::F32), 7);

fn check(dev: Dev, what: &str, files: Vec<PathBuf>, variants: &[(Fusion, Option<DType>, usize)]) {
    let mut failures = Vec::new();
    for path in files {
        let name = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        for &(fusion, weights, chunk) in variants {
            let (rel, got, want) = run(&path, &dev, fusion, weights, chunk);
            eprintln!("{what} {name} fusion={fusion:?} weights={weights:?} chunk={chunk}: max err {rel:.2e} of scale, ids {got:?}");
            if rel > 1e-3 || got != want {
                failures.push(format!("{name} {fusion:?} {weights:?} chunk {chunk}: rel err {rel:.2e}, ids {got:?} want {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
}

#[test]
fn cpu_gguf_matches_transformers() {
    check(Dev::Cpu, "cpu", files(), &[FILE_FUSED, F32_CHUNKED]);
}

// The GPU's two variants as two tests, run side by side.
#[test]
fn gpu_gguf_matches_transformers() {
    let Some(gpu) = test_gpu() else { return };
    check(Dev::Gpu(gpu), "gpu", files(), &[FILE_FUSED]);
}

/// The f32 weights in chunks, one file of each model: the formats of one model
/// differ only in the loader's dequantization to f32 (checked for every file on
/// the CPU), and the GPU then runs the same f32 kernels on them.
#[test]
fn gpu_gguf_f32_in_chunks_matches_transformers() {
    let Some(gpu) = test_gpu() else { return };
    let mut models = std::collections::BTreeSet::new();
    let one_each: Vec<_> = files().into_iter().filter(|p| models.insert(model_of(p))).collect();
    assert!(one_each.len() >= 7, "{one_each:?}");
    check(Dev::Gpu(gpu), "gpu", one_each, &[F32_CHUNKED]);
}

/// The model a fixture file holds: its name without the format (`llama-k-q6_k`:
/// `llama-k`).
fn model_of(path: &Path) -> String {
    let stem = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    stem.rsplit_once('-').map_or(stem.clone(), |(m, _)| m.to_string())
}

/// An LM head cut in blocks (a small binding limit): the decode tokens'
/// embedding is looked up in the block holding the token and the argmax is
/// combined over the blocks, on tied fixtures in f16, f32 and block formats;
/// the greedy ids are transformers'.
#[test]
fn gpu_decode_over_a_split_lm_head_matches_transformers() {
    let Some(gpu) = test_gpu() else { return };
    let mut seen = 0;
    for path in files() {
        let name = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        if !["smollm2-tiny-f16", "qwen2-tiny-f32", "smollm2-tiny-q8_0", "smollm2-tiny-q4_1"].contains(&name.as_str()) {
            continue;
        }
        seen += 1;
        let (rel, got, want, _) = run_with(&path, &Dev::Gpu(gpu.clone()), Fusion::ALL, None, 64, &[], false, true);
        assert!(rel <= 1e-3 && got == want, "{name}: rel err {rel:.2e}, ids {got:?} want {want:?}");
    }
    assert_eq!(seen, 4, "the four fixtures are there");
}

/// The config read from metadata is what transformers built (as recorded by make_gguf.py).
#[test]
fn configs_match_what_transformers_built() {
    for path in files() {
        let m = load_gguf(&path, None).expect("loads");
        let c = &m.config;
        let exp = &expected(&path)["config"];
        assert_eq!(c.dims.num_layers as u64, exp["num_hidden_layers"].as_u64().expect("layers"), "{}", path.display());
        // (null when transformers derives it from hidden_size / heads)
        if let Some(hd) = exp["head_dim"].as_u64() {
            assert_eq!(c.dims.head_dim as u64, hd, "{}", path.display());
        }
        assert_eq!(c.tie_word_embeddings, exp["tie_word_embeddings"].as_bool().expect("tie"));
        if let Some(types) = exp["layer_types"].as_array() {
            let got: Vec<&str> =
                c.layer_types.iter().map(|k| if k.name() == "local" { "sliding_attention" } else { "full_attention" }).collect();
            let want: Vec<&str> = types.iter().map(|t| t.as_str().expect("type")).collect();
            assert_eq!(got, want, "{}", path.display());
            assert_eq!(c.sliding_window.map(|w| w as u64), exp["sliding_window"].as_u64());
            assert_eq!(c.query_pre_attn_scalar, exp["query_pre_attn_scalar"].as_f64());
        }
        // (1 where the layer rotates q and k: SmolLM3's every fourth is 0)
        if let Some(rope) = exp["no_rope_layers"].as_array() {
            let want: Vec<usize> = rope.iter().enumerate().filter(|(_, r)| r.as_u64() == Some(0)).map(|(l, _)| l).collect();
            assert_eq!(c.nope_layers, want, "{}", path.display());
        }
    }
}

/// `load_quant` hands out the file's blocks when the format matches (Q/K rows
/// un-permuted), and they decode to exactly the f32 values the float path serves;
/// another format, or a float source, is quantized from the f32 values.
#[test]
fn load_quant_serves_the_files_blocks() {
    for (file, format) in [("smollm2-tiny-q8_0", QFormat::Q8_0), ("smollm2-tiny-q4_0", QFormat::Q4_0), ("smollm2-tiny-q4_1", QFormat::Q4_1)]
    {
        let path = dir().join(format!("{file}.gguf"));
        let g = Weights::load_gguf(&path).expect("loads");
        let w = &g.weights;
        assert_eq!(w.matmul_storage(), Some(Stored::Quant(format)));
        for name in
            ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight", "model.layers.2.mlp.down_proj.weight"]
        {
            let meta = w.meta(name).expect("meta");
            let q = w.load_quant(name, format).expect("quant");
            assert_eq!((q.rows, q.cols), (meta.shape[0], meta.shape[1]));
            let f = w.f32(name, &meta.shape).expect("f32");
            assert_eq!(q.dequantize(), f, "{file} {name}: blocks and f32 path differ");
            // The other formats: quantized from the dequantized values.
            for other in QFormat::ALL.into_iter().filter(|o| *o != format && q.cols.is_multiple_of(o.block_elems())) {
                let r = w.load_quant(name, other).expect("requantized");
                assert_eq!(r, QMatrix::quantize(other, q.rows, q.cols, &f).expect("quantize"));
            }
        }
        // K of layer 1 really was permuted on disk: the raw blocks differ from the served ones.
        let t = g.file.tensor("blk.1.attn_k.weight").expect("attn_k");
        let raw = QMatrix::from_ggml(format, 16, 64, g.file.data(t)).expect("raw");
        assert_ne!(raw, w.load_quant("model.layers.1.self_attn.k_proj.weight", format).expect("q"));
    }
    // A float source (safetensors) is quantized with QMatrix::quantize.
    let st = Weights::load(crate::common::fixture("llama3-tiny")).expect("fixture");
    let name = "model.layers.0.mlp.up_proj.weight";
    let f = st.f32(name, &[128, 64]).expect("f32");
    assert_eq!(st.load_quant(name, QFormat::Q4_1).expect("q"), QMatrix::quantize(QFormat::Q4_1, 128, 64, &f).expect("quantize"));
}

/// Gemma norms are stored as 1 + w and served as w.
#[test]
fn gemma_norms_are_served_minus_one() {
    let g = Weights::load_gguf(dir().join("gemma3-tiny-f16.gguf")).expect("loads");
    let t = g.file.tensor("blk.0.attn_norm.weight").expect("norm");
    let stored: Vec<f32> = g.file.data(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let served = g.weights.f32("model.layers.0.input_layernorm.weight", &[64]).expect("norm");
    for (s, v) in stored.iter().zip(&served) {
        assert_eq!(*v, *s - 1.0);
    }
}

/// The binary on the CPU.
fn ktune() -> Command {
    let mut c = crate::common::ktune();
    c.arg("--device").arg("cpu");
    c
}

/// `--prompt` through the file's tokenizer: the ids transformers' tokenizer gives,
/// the greedy continuation transformers generated, its text, in the JSON report.
#[test]
fn cli_prompt_through_the_gguf_tokenizer() {
    for file in ["smollm2-tiny-q8_0", "smollm2-tiny-bf16"] {
        let path = dir().join(format!("{file}.gguf"));
        let exp = &expected(&path)["tokenizer"];
        let prompt = exp["prompt"].as_str().expect("prompt");
        let out = ktune()
            .args(["run", "--gguf"])
            .arg(&path)
            .args(["--prompt", prompt, "--max-tokens", "8", "--format", "json"])
            .output()
            .expect("runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
        assert_eq!(ids(&r["prompt_ids"]), ids(&exp["prompt_ids"]), "{file}: prompt ids");
        let (got, want) = (ids(&r["generated"]), ids(&exp["generated"]));
        if got == want {
            assert_eq!(r["text"], exp["text"], "{file}: text");
        } else {
            greedy_up_to_a_near_tie(&path, &ids(&exp["prompt_ids"]), &got, &want);
        }
        assert_eq!(r["weight_storage"], file.rsplit('-').next().expect("type"));
    }
}

/// The runtime's default computes block-format projections with int8
/// activations (as llama.cpp does), so on a tiny random model a greedy step may
/// pick another token where two logits nearly tie: `got` must equal `want` up to
/// the first difference, and there the logits ktune computes for that context
/// must put the two tokens within int8-activation error of each other (2% of the
/// logits' scale).
fn greedy_up_to_a_near_tie(path: &Path, prompt: &[u32], got: &[u32], want: &[u32]) {
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    assert!(i < got.len() && i < want.len(), "{}: generated {got:?}, expected {want:?}", path.display());
    let context: Vec<String> = prompt.iter().chain(&want[..i]).map(|t| t.to_string()).collect();
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    let out = ktune()
        .args(["run", "--gguf"])
        .arg(path)
        .args(["--tokens", &context.join(","), "--max-tokens", "1", "--format", "json", "--dump-logits"])
        .arg(&dump)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = read_json(&dump);
    assert_eq!(ids(&d["generated"]), [got[i]], "the same choice from the same context");
    let last: Vec<f64> = d["logits"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(|l| l.as_array())
        .expect("logits")
        .iter()
        .map(|v| v.as_f64().expect("f64"))
        .collect();
    let scale = last.iter().fold(0f64, |m, v| m.max(v.abs()));
    let gap = (last[got[i] as usize] - last[want[i] as usize]).abs();
    assert!(
        gap <= 0.02 * scale,
        "{}: step {i} chose {} over the expected {} by {gap} (logit scale {scale}): not a near-tie",
        path.display(),
        got[i],
        want[i]
    );
}

/// Table format streams the text before the report.
#[test]
fn cli_streams_the_text() {
    let path = dir().join("smollm2-tiny-f16.gguf");
    let out = ktune()
        .args(["run", "--gguf"])
        .arg(&path)
        .args(["--prompt", "The kernel reads 42 weights in the café.", "--max-tokens", "8"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    let first = s.lines().next().expect("a line");
    assert!(first.starts_with("output:   "), "{s}");
    assert!(s.contains("stored f16") || s.contains("weights f16"), "{s}");
}

/// Damaged, unsupported and conflicting inputs: exit 2 with a message naming the problem.
#[test]
fn cli_bad_gguf_inputs_exit_2() {
    let tmp = tempdir();
    let good = std::fs::read(dir().join("qwen2-tiny-q8_0.gguf")).expect("read");
    let cut = tmp.path().join("cut.gguf");
    std::fs::write(&cut, &good[..good.len() - 100]).expect("write");
    let junk = tmp.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").expect("write");
    // general.architecture = "qwen2" -> "qwen9" (same length).
    let mut arch = good.clone();
    let at = arch.windows(5).position(|w| w == b"qwen2").expect("arch string");
    arch[at + 4] = b'9';
    let other = tmp.path().join("arch.gguf");
    std::fs::write(&other, &arch).expect("write");
    for (path, want) in [(&cut, "past the end of the file"), (&junk, "not a GGUF file"), (&other, "GGUF architecture `qwen9`")] {
        let out = ktune().args(["run", "--gguf"]).arg(path).args(["--tokens", "1,2"]).output().expect("runs");
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{}: {err}", path.display());
    }
    // A file without a tokenizer cannot take --prompt.
    let out = ktune().args(["run", "--gguf"]).arg(dir().join("qwen2-tiny-f32.gguf")).args(["--prompt", "hi"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokenizer.ggml.model"), "{}", String::from_utf8_lossy(&out.stderr));
    // --gguf is exclusive with --model.
    let out = ktune().args(["run", "--model", "smollm2-135m", "--gguf"]).arg(&cut).args(["--tokens", "1"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

/// `find` replaced by `with` (same length) in a fixture's bytes: the load fails naming `want`.
fn edited_fails(file: &str, find: &[u8], with: &[u8], want: &str) {
    let mut bytes = std::fs::read(dir().join(file)).expect("read");
    let at = bytes.windows(find.len()).position(|w| w == find).unwrap_or_else(|| panic!("{file} has {find:?}"));
    bytes[at..at + with.len()].copy_from_slice(with);
    let e = Weights::gguf_from_bytes(Path::new(file), bytes).expect_err("must fail").to_string();
    assert!(e.contains(want), "{file}: {e}");
}

/// Metadata ktune needs and does not find, or values it does not implement: errors naming the key.
#[test]
fn metadata_errors_name_the_key() {
    edited_fails("smollm2-tiny-q8_0.gguf", b"llama.block_count", b"llama.block_coun_", "missing metadata `llama.block_count`");
    edited_fails("qwen2-tiny-f32.gguf", b"qwen2.context_length", b"qwen2.context_lengtX", "missing metadata `qwen2.context_length`");
    edited_fails("gemma3-tiny-q8_0.gguf", b"linear", b"yarnXX", "`gemma3.rope.scaling.type: yarnXX`");
    edited_fails(
        "gemma3-tiny-q8_0.gguf",
        b"gemma3.attention.sliding_window",
        b"gemma3.attention.sliding_windoX",
        "gemma3.attention.sliding_window",
    );
    // A quantized tensor with a type ktune cannot decode: named when the config check reads it.
    let mut bytes = std::fs::read(dir().join("smollm2-tiny-q8_0.gguf")).expect("read");
    let name = b"blk.0.ffn_down.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).expect("tensor info");
    // name, n_dims (u32), 2 dims (u64 each), then the type: Q8_0 (8) -> Q6_K (14) is not a whole number of
    // 256-element blocks in a 128-wide row, so the reader rejects it naming the tensor.
    let ty = at + name.len() + 4 + 16;
    bytes[ty..ty + 4].copy_from_slice(&14u32.to_le_bytes());
    let e = Weights::gguf_from_bytes(Path::new("q6k"), bytes).expect_err("Q6_K rows").to_string();
    assert!(e.contains("blk.0.ffn_down.weight") && e.contains("Q6_K"), "{e}");
}

/// `tune --gguf` runs the tuner on the file's model (a short budget).
#[test]
fn cli_tune_takes_a_gguf_file() {
    let tmp = tempdir();
    let out = ktune()
        .env("KTUNE_CACHE_DIR", tmp.path())
        .args(["tune", "--gguf"])
        .arg(dir().join("qwen2-tiny-q8_0.gguf"))
        .args(["--budget", "3s", "--prefill-tokens", "8", "--context", "32", "--decode-tokens", "4", "--format", "json", "-o"])
        .arg(tmp.path().join("p.yaml"))
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(r["model"].as_str().expect("model").ends_with("qwen2-tiny-q8_0.gguf"), "{r}");
    assert!(tmp.path().join("p.yaml").is_file());
}

/// Generation stops at the first end-of-sequence id (the report says why), unless
/// `--ignore-eos`: the Gemma 3 fixture greedily repeats id 68, made its EOS here.
#[test]
fn cli_stops_at_eos_unless_ignored() {
    let tmp = tempdir();
    let mut bytes = std::fs::read(dir().join("gemma3-tiny-f16.gguf")).expect("read");
    let key = b"tokenizer.ggml.eos_token_id";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the fixture has an EOS id") + key.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "a uint32");
    bytes[at + 4..at + 8].copy_from_slice(&68u32.to_le_bytes());
    let path = tmp.path().join("eos68.gguf");
    std::fs::write(&path, bytes).expect("write");
    let exp = expected(&dir().join("gemma3-tiny-f16.gguf"));
    assert_eq!(ids(&exp["generated"])[0], 68, "the fixture's first greedy id");
    let tokens: Vec<String> = ids(&exp["tokens"]).iter().map(u32::to_string).collect();
    let report = |extra: &[&str]| -> serde_json::Value {
        let out = ktune()
            .args(["run", "--device", "cpu", "--gguf"])
            .arg(&path)
            .args(["--tokens", &tokens.join(","), "--max-tokens", "5", "--format", "json"])
            .args(extra)
            .output()
            .expect("runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("json report")
    };
    let r = report(&[]);
    assert_eq!(ids(&r["generated"]), [68]);
    assert_eq!(r["stop_reason"], "eos");
    assert_eq!(r["decode_tokens"], 0);
    let r = report(&["--ignore-eos"]);
    assert_eq!(ids(&r["generated"]), ids(&exp["generated"])[..5]);
    assert_eq!(r["stop_reason"], "max_tokens");
}

/// `--chat` without a chat template in the file: exit 2, saying so.
#[test]
fn cli_chat_without_a_template_exits_2() {
    let out = ktune()
        .args(["run", "--device", "cpu", "--gguf"])
        .arg(dir().join("smollm2-tiny-q8_0.gguf"))
        .args(["--prompt", "hello", "--chat"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no chat template") && err.contains("without --chat"), "{err}");
}

/// `--chat-template FILE` supplies a template the file lacks: the prompt is
/// rendered through it (the report's prompt text carries its turn markers); a
/// missing template file is exit 2 naming it.
#[test]
fn cli_chat_template_file_serves_a_file_without_one() {
    let template = crate::common::fixture("chat_templates/smollm2.jinja");
    let out = ktune()
        .args(["run", "--device", "cpu", "--gguf"])
        .arg(dir().join("smollm2-tiny-q8_0.gguf"))
        .args(["--prompt", "hello", "--chat", "--max-tokens", "2", "--format", "json", "--chat-template"])
        .arg(&template)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["chat"], true);
    let plain = ktune()
        .args(["run", "--device", "cpu", "--gguf"])
        .arg(dir().join("smollm2-tiny-q8_0.gguf"))
        .args(["--prompt", "hello", "--max-tokens", "2", "--format", "json"])
        .output()
        .expect("runs");
    let p: serde_json::Value = serde_json::from_slice(&plain.stdout).expect("JSON");
    // The template adds its system turn and markers around the prompt.
    let n = |v: &serde_json::Value| v["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(n(&v) > n(&p) + 5, "{} vs {} prompt tokens", n(&v), n(&p));
    let out = ktune()
        .args(["run", "--device", "cpu", "--gguf"])
        .arg(dir().join("smollm2-tiny-q8_0.gguf"))
        .args(["--prompt", "hello", "--chat", "--chat-template", "/nonexistent/t.jinja"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/t.jinja"));
}

/// Each file's tokenizer (its `tokenizer.ggml.pre` pre-split: llama-bpe, qwen2,
/// gpt-4o, refact, dbrx, smollm, …) gives llama.cpp's own ids for strings with
/// digits, spaces, tabs, newlines, contractions and accents
/// (`llama_tokenize.json`, recorded by tools/record_gguf_tokens.py).
#[test]
fn gguf_tokenizers_give_llama_cpps_ids() {
    let doc = read_json(dir().join("llama_tokenize.json"));
    let strings: Vec<&str> = doc["strings"].as_array().expect("strings").iter().map(|s| s.as_str().expect("a string")).collect();
    let files = doc["files"].as_object().expect("files");
    assert!(files.len() >= 10, "{} files", files.len());
    let mut failures = Vec::new();
    for (name, want) in files {
        let f =
            <ktune::model::gguf::GgufFile as ktune::model::WeightFile>::open(&dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tok = ktune::model::Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (s, want) in strings.iter().zip(want.as_array().expect("ids per string")) {
            let got = tok.encode_with(s, false).unwrap_or_else(|e| panic!("{name}: {e}"));
            if serde_json::json!(got) != *want {
                failures.push(format!("{name} {s:?}: ktune {got:?}, llama.cpp {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
