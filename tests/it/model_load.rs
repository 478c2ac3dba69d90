//! The model layer: every fixture in tests/fixtures/ loads (config and weights, all
//! dtypes and the sharded layout) with the shapes its config implies; built-in
//! configs are self-consistent and match the published config.json files; bad
//! configs and damaged or hostile safetensors files give errors, never panics.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::fixtures_dir;
use ktune::model::{Architecture, Dtype, LayerKind, ModelConfig, ModelError, RopeScaling, Weights, builtin, builtin_names};

/// Fixture model directories (those with a config.json), but the multimodal one
/// (tests/runtime_vision.rs checks it: its tower's tensors are beside the text model's).
fn model_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.join("config.json").is_file() && !p.join("vision_expected.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("model_load-{name}"));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).expect("create scratch dir");
    d
}

fn load(name: &str) -> (ModelConfig, Weights) {
    let dir = fixtures_dir().join(name);
    let cfg = ModelConfig::from_config_json(dir.join("config.json")).unwrap_or_else(|e| panic!("{name}: {e}"));
    let w = Weights::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    (cfg, w)
}

#[test]
fn every_fixture_loads_with_the_shapes_of_its_config() {
    let dirs = model_dirs();
    let names: Vec<String> = dirs.iter().map(|d| d.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        [
            "gemma3-tiny",
            "granite-tiny",
            "llama3-tiny",
            "mistral-tiny",
            "olmo2-tiny",
            "olmoe-tiny",
            "phi3-tiny",
            "phi4-tiny",
            "qwen2-tiny-sharded",
            "qwen3-tiny",
            "qwen3moe-tiny",
            "smollm2-tiny-bf16",
            "smollm3-tiny"
        ]
    );
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let parsed = ModelConfig::parse_config_json(&fs::read_to_string(dir.join("config.json")).unwrap(), &dir.join("config.json"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(parsed.ignored_keys.is_empty(), "{name}: unexpected keys {:?}", parsed.ignored_keys);
        let cfg = parsed.config;
        cfg.validate().unwrap();
        let mut w = Weights::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        w.fit_config(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(w.unused(&cfg).is_empty(), "{name}: unused tensors {:?}", w.unused(&cfg));
        assert_eq!(w.len(), cfg.tensor_shapes().len());
        for (t, shape) in cfg.tensor_shapes() {
            let a = w.f32(&t, &shape).unwrap();
            assert_eq!(a.len(), shape.iter().product::<usize>());
            assert!(a.iter().all(|v| v.is_finite()), "{name}/{t}: non-finite value");
            assert!(a.iter().any(|v| *v != 0.0), "{name}/{t}: all zero");
            let h = w.f16(&t, &shape).unwrap();
            for (x, y) in a.iter().zip(&h) {
                assert!((x - y.to_f32()).abs() <= 1e-3 * x.abs().max(1e-2), "{name}/{t}: f16 {y} far from f32 {x}");
            }
        }
        // The embedding lookup reads the same values as the whole tensor.
        let embed = w.f32("model.embed_tokens.weight", &[cfg.dims.vocab_size, cfg.dims.hidden_size]).unwrap();
        let last = cfg.dims.vocab_size - 1;
        assert_eq!(w.row_f32("model.embed_tokens.weight", last).unwrap(), embed[last * cfg.dims.hidden_size..]);
        // expected.json agrees with the config.
        let exp = crate::common::read_json(dir.join("expected.json"));
        let tokens = exp["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), 20);
        assert!(tokens.iter().all(|t| (t.as_u64().unwrap() as usize) < cfg.dims.vocab_size));
        let logits = exp["logits"].as_array().unwrap();
        assert_eq!(logits.len(), tokens.len());
        assert!(logits.iter().all(|r| r.as_array().unwrap().len() == cfg.dims.vocab_size));
        assert_eq!(exp["generated"].as_array().unwrap().len(), 8);
        assert!(exp["versions"]["transformers"].is_string());
        // The values torch stored, as ktune reads them (bf16 included), under the
        // file's names (Phi-3's fused tensors whole).
        let w = Weights::load(&dir).unwrap();
        let checks = exp["tensor_checks"].as_object().unwrap();
        assert_eq!(checks.len(), w.len(), "{name}");
        for (t, c) in checks {
            let shape = w.meta(t).unwrap().shape;
            let a = w.f32(t, &shape).unwrap();
            let (sum, abs) = a.iter().fold((0f64, 0f64), |(s, m), &v| (s + v as f64, m + (v as f64).abs()));
            let c: Vec<f64> = c.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            assert!((sum - c[0]).abs() <= 1e-9 * abs.max(1.0), "{name}/{t}: sum {sum} vs torch {}", c[0]);
            // serde_json's default float parser may be 1 ulp off in f64; the stored
            // values are f32, so compare them as f32 (still exact).
            assert_eq!((a[0], a[a.len() - 1]), (c[1] as f32, c[2] as f32), "{name}/{t}");
        }
    }
}

#[test]
fn fixture_configs_carry_each_architectures_features() {
    let (c, w) = load("llama3-tiny");
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 })
    );
    assert_eq!((c.rope_theta, c.dims.head_dim, c.dims.num_kv_heads, c.tie_word_embeddings), (500_000.0, 16, 2, true));
    assert_eq!(w.meta("model.norm.weight").unwrap().dtype, Dtype::F32);

    let (c, w) = load("smollm2-tiny-bf16");
    assert_eq!((c.rope_theta, c.rope_scaling.clone(), c.dims.num_kv_heads, c.rms_norm_eps), (100_000.0, None, 1, 1e-5));
    assert_eq!(w.meta("model.embed_tokens.weight").unwrap().dtype, Dtype::BF16);

    let (c, w) = load("qwen2-tiny-sharded");
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias && !c.tie_word_embeddings);
    assert_eq!(w.meta("model.layers.1.self_attn.k_proj.bias").unwrap().shape, [c.kv_dim()]);
    assert!(w.contains("lm_head.weight"));
    assert!(w.origin().ends_with("model.safetensors.index.json"));

    let (c, _) = load("gemma3-tiny");
    assert_eq!(c.architecture, Architecture::Gemma3);
    use LayerKind::{Global, Local};
    assert_eq!(c.layer_types, [Local, Local, Global, Local]);
    assert_eq!(c.sliding_window, Some(8));
    assert_eq!(c.layer_sliding_window(0), Some(8));
    assert_eq!(c.layer_sliding_window(2), None);
    assert_eq!((c.rope_theta, c.rope_local_base_freq), (1_000_000.0, Some(10_000.0)));
    assert_eq!(c.rope_scaling_for(Global), Some(&RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.rope_scaling_for(Local), None);
    assert_eq!(c.rope_theta_for(Local), 10_000.0);
    assert_eq!((c.dims.head_dim, c.q_dim(), c.dims.hidden_size), (32, 128, 64));
    assert_eq!(c.attention_scale(), 1.0 / 24f64.sqrt());
    assert_eq!(c.final_logit_softcapping, Some(2.0));
    assert_eq!(c.attn_logit_softcapping, None);
    assert!(c.qk_norm && c.norm_unit_offset && c.scale_embeddings && c.is_gelu() && c.sandwich_norms());
    assert_eq!(c.embedding_scale(), 8.0);
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(2), vec![1]));

    let (c, _) = load("qwen3-tiny");
    assert_eq!(c.architecture, Architecture::Qwen3);
    assert!(c.qk_norm && !c.attention_bias && !c.norm_unit_offset && !c.sandwich_norms() && !c.tie_word_embeddings);
    assert_eq!((c.dims.head_dim, c.q_dim(), c.dims.hidden_size), (32, 128, 64));
    assert_eq!(c.layer_types, [Global, Global]);

    let (c, _) = load("mistral-tiny");
    assert_eq!(c.architecture, Architecture::Mistral);
    assert_eq!((c.layer_types.clone(), c.sliding_window), (vec![Local, Local], Some(8)));
    // The window's layers share the global RoPE (no base of their own).
    assert_eq!((c.rope_theta_for(Local), c.rope_local_base_freq), (1_000_000.0, None));

    // Phi-3: LongRoPE with the attention factor of a 4x extension over 8 tokens;
    // Q/K/V and gate/up served as row views of the fused tensors.
    let (c, mut w) = load("phi3-tiny");
    assert_eq!((c.architecture, c.sliding_window, c.layer_kind(1)), (Architecture::Phi3, Some(12), LayerKind::Local));
    let Some(RopeScaling::LongRope { original_max_position_embeddings: 8, attention_factor, .. }) = c.rope_scaling else {
        panic!("{:?}", c.rope_scaling)
    };
    assert!((attention_factor - (1.0 + 4f64.ln() / 8f64.ln()).sqrt()).abs() < 1e-12);
    assert_eq!(c.layer_attention_scale(0), 0.25 * attention_factor * attention_factor);
    let fused = w.f32("model.layers.1.self_attn.qkv_proj.weight", &[128, 64]).expect("fused in the file");
    w.fit_config(&c).expect("fits");
    assert!(!w.contains("model.layers.1.self_attn.qkv_proj.weight"));
    assert_eq!(w.f32("model.layers.1.self_attn.k_proj.weight", &[32, 64]).unwrap(), fused[64 * 64..96 * 64]);
    assert_eq!(w.f32("model.layers.1.self_attn.v_proj.weight", &[32, 64]).unwrap(), fused[96 * 64..]);

    let (c, _) = load("smollm3-tiny");
    assert_eq!(c.architecture, Architecture::SmolLM3);
    assert_eq!(c.nope_layers, [3]);
    assert_eq!((0..4).map(|l| c.layer_has_rope(l)).collect::<Vec<_>>(), [true, true, true, false]);
    assert!(c.tie_word_embeddings && !c.qk_norm);
}

/// Published parameter counts (safetensors metadata of the checkpoints).
#[test]
fn builtin_configs_are_consistent_and_have_the_published_sizes() {
    let published = [
        ("gemma3-1b", 999_885_952u64),
        ("gemma3-4b", 3_880_263_168),
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.2-3b", 3_212_749_824),
        ("llama-3.1-8b", 8_030_261_248),
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen2.5-1.5b", 1_543_714_304),
        ("smollm2-135m", 134_515_008),
        // transformers' count of the published configs (meta device)
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-1.7b", 1_720_574_976),
        ("qwen3-4b", 4_022_468_096),
        ("qwen3-30b-a3b", 30_532_122_624),
        ("smollm3-3b", 3_075_098_624),
        ("mistral-7b", 7_248_023_552),
        ("phi-4-mini", 3_836_021_760),
        ("granite-3.3-2b", 2_533_539_840),
        ("olmo2-1b", 1_484_916_736),
    ];
    assert_eq!(builtin_names(), published.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    for (name, params) in published {
        let c = builtin(name).unwrap();
        c.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(c.param_count(), params, "{name}");
        assert_eq!(c.layer_types.len(), c.dims.num_layers);
        assert_eq!(c.dims.num_heads % c.dims.num_kv_heads, 0);
        assert_eq!(c.tensor_shapes().iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum::<u64>(), params);
        // Tied models read the embedding matrix once per token as the LM head (and
        // one row of it as the embedding); untied ones the head and one row of the
        // embedding matrix. A mixture of experts only its top_k experts.
        let (h, embed) = (c.dims.hidden_size as u64, (c.dims.vocab_size * c.dims.hidden_size) as u64);
        let active = c.active_param_count();
        let expect = if c.tie_word_embeddings { active + h } else { active - embed + h };
        assert_eq!(c.weight_bytes_per_token(Dtype::BF16), 2 * expect, "{name}");
        assert_eq!(c.weight_bytes_per_token(ktune::kernels::DType::F32), 4 * expect, "{name}");
        // Round trip through JSON.
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c, "{name}");
    }
    // Qwen3-30B-A3B: "3.3B activated" (8 of 128 experts of 768 on 48 layers).
    assert_eq!(builtin("qwen3-30b-a3b").unwrap().active_param_count(), 3_353_032_704);
    let g = builtin("gemma3-1b").unwrap();
    assert_eq!(g.num_local_layers(), 22);
    assert_eq!((0..26).filter(|&l| g.layer_kind(l) == LayerKind::Global).collect::<Vec<_>>(), [5, 11, 17, 23]);
    assert_eq!(g.attention_scale(), 1.0 / 16.0);
    assert_eq!(builtin("gemma3-4b").unwrap().rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(builtin("qwen2.5-1.5b").unwrap().dims.head_dim, 128);
    assert_eq!(builtin("Llama-3.2-1B").unwrap().attention_scale(), 0.125);
    let err = builtin("gpt2").unwrap_err().to_string();
    assert!(err.contains("gpt2") && err.contains("gemma3-1b") && err.contains("smollm2-135m"), "{err}");
}

#[test]
fn published_config_json_files_match_the_builtins() {
    for (file, name) in [
        ("gemma-3-1b-it.json", "gemma3-1b"),
        ("llama-3.2-1b.json", "llama-3.2-1b"),
        ("qwen2.5-0.5b.json", "qwen2.5-0.5b"),
        ("smollm2-135m.json", "smollm2-135m"),
    ] {
        let path = fixtures_dir().join("hf-configs").join(file);
        let parsed = ModelConfig::parse_config_json(&fs::read_to_string(&path).unwrap(), &path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(parsed.ignored_keys.is_empty(), "{file}: {:?}", parsed.ignored_keys);
        let mut from_file = parsed.config;
        let builtin = builtin(name).unwrap();
        // The built-ins also stop on the chat models' end-of-turn tokens.
        assert!(from_file.eos_token_ids.iter().all(|t| builtin.eos_token_ids.contains(t)), "{file}");
        from_file.eos_token_ids = builtin.eos_token_ids.clone();
        assert_eq!(from_file, builtin, "{file}");
    }
}

fn parse(text: &str) -> Result<ModelConfig, ModelError> {
    ModelConfig::parse_config_json(text, Path::new("config.json")).map(|p| p.config)
}

/// The smallest valid Llama config, with `extra` keys merged in (null removes a key).
fn llama_with(extra: serde_json::Value) -> String {
    let mut v = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0
    });
    for (k, x) in extra.as_object().unwrap() {
        if x.is_null() {
            v.as_object_mut().unwrap().remove(k);
        } else {
            v[k] = x.clone();
        }
    }
    v.to_string()
}

#[test]
fn config_json_variants_parse() {
    let c = parse(&llama_with(serde_json::json!({}))).unwrap();
    assert_eq!((c.dims.head_dim, c.tie_word_embeddings, c.rope_scaling.clone()), (16, false, None));
    // transformers 5: rope_parameters, flat.
    let c = parse(&llama_with(
        serde_json::json!({"rope_theta": null, "rope_parameters": {"rope_type": "linear", "factor": 2, "rope_theta": 5e5}}),
    ))
    .unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling), (5e5, Some(RopeScaling::Linear { factor: 2.0 })));
    // 4.x spelled the type as `type`; `default` means none.
    let c = parse(&llama_with(serde_json::json!({"rope_scaling": {"type": "linear", "factor": 4.0}}))).unwrap();
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));
    let c = parse(&llama_with(serde_json::json!({"rope_scaling": {"rope_type": "default"}}))).unwrap();
    assert_eq!(c.rope_scaling, None);
    // A list of end tokens; integers written as floats.
    let c = parse(&llama_with(serde_json::json!({"eos_token_id": [2, 3], "vocab_size": 256.0}))).unwrap();
    assert_eq!(c.eos_token_ids, [2, 3]);
    // No architectures: model_type decides.
    let c = parse(&llama_with(serde_json::json!({"architectures": null, "model_type": "qwen2"}))).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias);
    // Mistral: MistralConfig's window (4096) on every layer when the key is absent, none when null.
    let c = parse(&llama_with(serde_json::json!({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}))).unwrap();
    assert_eq!((c.num_local_layers(), c.sliding_window), (c.dims.num_layers, Some(4096)));
    let mut v: serde_json::Value =
        serde_json::from_str(&llama_with(serde_json::json!({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}))).unwrap();
    v["sliding_window"] = serde_json::Value::Null;
    let c = parse(&v.to_string()).unwrap();
    assert_eq!((c.num_local_layers(), c.sliding_window), (0, None));
    // SmolLM3: every n-th layer without RoPE when the list is not given.
    let c = parse(&llama_with(
        serde_json::json!({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "no_rope_layer_interval": 2}),
    ))
    .unwrap();
    assert_eq!(c.nope_layers, [1]);
    // Qwen3: head_dim 128 unless given, q/k norms, no biases.
    let c =
        parse(&llama_with(serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": null}))).unwrap();
    assert_eq!((c.dims.head_dim, c.qk_norm, c.attention_bias), (128, true, false));
    // Gemma 3 in the 4.x layout, defaults filled in.
    let g = serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 16, "sliding_window": 8, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "unknown_knob": 3
    });
    let parsed = ModelConfig::parse_config_json(&g.to_string(), Path::new("g.json")).unwrap();
    assert_eq!(parsed.ignored_keys, ["unknown_knob"]);
    let c = parsed.config;
    assert_eq!(c.num_local_layers(), 10);
    assert_eq!((c.layer_kind(5), c.layer_kind(11), c.layer_kind(0)), (LayerKind::Global, LayerKind::Global, LayerKind::Local));
    assert_eq!((c.rope_theta, c.rope_local_base_freq, c.query_pre_attn_scalar), (1e6, Some(1e4), Some(256.0)));
    assert!(c.tie_word_embeddings && c.is_gelu());
}

fn assert_err(text: &str, needles: &[&str]) {
    match parse(text) {
        Ok(c) => panic!("parsed, expected an error mentioning {needles:?}: {c:?}"),
        Err(e) => {
            let msg = e.to_string();
            for n in needles {
                assert!(msg.contains(n), "error `{msg}` does not mention `{n}`");
            }
        }
    }
}

#[test]
fn bad_config_json_gives_errors_naming_the_problem() {
    use serde_json::json;
    assert_err("{", &["config.json", "JSON"]);
    assert_err("[1, 2]", &["object"]);
    assert_err(&llama_with(json!({"hidden_size": null})), &["missing `hidden_size`"]);
    assert_err(&llama_with(json!({"hidden_size": "big"})), &["hidden_size", "\"big\""]);
    assert_err(&llama_with(json!({"hidden_size": -64})), &["hidden_size"]);
    assert_err(&llama_with(json!({"architectures": ["GPTNeoXForCausalLM"]})), &["GPTNeoXForCausalLM", "not supported", "Qwen3ForCausalLM"]);
    assert_err(&llama_with(json!({"architectures": ["Gemma3ForConditionalGeneration"]})), &["Gemma3ForConditionalGeneration"]);
    assert_err(&llama_with(json!({"model_type": "gpt2"})), &["gpt2"]);
    assert_err(&llama_with(json!({"model_type": "qwen2"})), &["LlamaForCausalLM", "qwen2"]);
    assert_err(&llama_with(json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})), &["yarn", "not supported"]);
    assert_err(&llama_with(json!({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})), &["dynamic"]);
    assert_err(&llama_with(json!({"rope_scaling": {"rope_type": "llama3", "factor": 32.0}})), &["low_freq_factor"]);
    assert_err(&llama_with(json!({"rope_scaling": {"rope_type": "linear"}})), &["factor"]);
    assert_err(&llama_with(json!({"hidden_act": "gelu"})), &["hidden_act: gelu"]);
    assert_err(&llama_with(json!({"attention_bias": true})), &["attention_bias"]);
    assert_err(&llama_with(json!({"mlp_bias": true})), &["mlp_bias"]);
    assert_err(&llama_with(json!({"partial_rotary_factor": 1.5})), &["partial_rotary_factor", "(0, 1]"]);
    assert_err(&llama_with(json!({"partial_rotary_factor": 0.1})), &["rope_dim (1)", "even"]);
    let longrope =
        |short: serde_json::Value| json!({"rope_scaling": {"rope_type": "longrope", "short_factor": short, "long_factor": vec![1.0; 8]}});
    assert_err(&llama_with(longrope(json!([1.0, 2.0]))), &["short_factor has 2 values for 8 rotated pairs"]);
    assert_err(&llama_with(longrope(json!("x"))), &["short_factor"]);
    assert_err(&llama_with(longrope(json!(vec![0.0; 8]))), &["short_factor values must be positive"]);
    assert_err(&llama_with(json!({"rope_interleaved": true})), &["rope_interleaved"]);
    assert_err(&llama_with(json!({"layer_types": ["full_attention"]})), &["layer_types", "1 entries for 2 layers"]);
    assert_err(&llama_with(json!({"layer_types": ["full_attention", "chunked_attention"]})), &["chunked_attention"]);
    assert_err(&llama_with(json!({"layer_types": ["full_attention", "sliding_attention"]})), &["sliding_attention", "LlamaForCausalLM"]);
    assert_err(
        &llama_with(json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": true})),
        &["use_sliding_window"],
    );
    assert_err(
        &llama_with(json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": true})),
        &["attention_bias"],
    );
    assert_err(
        &llama_with(json!({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "no_rope_layers": [1, 2]})),
        &["no_rope_layers", "0 or 1"],
    );
    assert_err(
        &llama_with(json!({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "no_rope_layers": [1]})),
        &["no_rope_layers"],
    );
    assert_err(
        &llama_with(json!({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "use_sliding_window": true})),
        &["use_sliding_window"],
    );
    assert_err(&llama_with(json!({"num_key_value_heads": 3})), &["num_kv_heads"]);
    assert_err(&llama_with(json!({"num_attention_heads": 0})), &["num_attention_heads"]);
    assert_err(&llama_with(json!({"rms_norm_eps": 0.0})), &["rms_norm_eps"]);
    assert_err(&llama_with(json!({"eos_token_id": 999})), &["999", "vocabulary"]);
    assert_err(&llama_with(json!({"eos_token_id": "eos"})), &["eos_token_id"]);
    assert_err(&llama_with(json!({"architectures": "LlamaForCausalLM"})), &["architectures"]);
    assert_err(&llama_with(json!({"rope_parameters": [1]})), &["rope_parameters"]);
    let missing = ModelConfig::from_config_json("/nonexistent/config.json").unwrap_err();
    assert!(matches!(missing, ModelError::Io { .. }), "{missing}");
}

/// Copies a fixture into a scratch directory.
fn copy_fixture(name: &str, test: &str) -> PathBuf {
    let dst = scratch(test);
    for e in fs::read_dir(fixtures_dir().join(name)).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst
}

fn load_err(dir: &Path) -> String {
    match Weights::load(dir) {
        Ok(w) => panic!("{} loaded ({} tensors), expected an error", dir.display(), w.len()),
        Err(e) => e.to_string(),
    }
}

/// A safetensors file whose 8-byte length prefix is `n`, followed by `rest`.
fn write_raw(dir: &Path, n: u64, rest: &[u8]) {
    let mut bytes = n.to_le_bytes().to_vec();
    bytes.extend_from_slice(rest);
    fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

#[test]
fn damaged_and_hostile_safetensors_give_errors() {
    // Truncated: the data section is shorter than the header says.
    let dir = copy_fixture("llama3-tiny", "truncated");
    let f = dir.join("model.safetensors");
    let len = fs::metadata(&f).unwrap().len();
    fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len - 100).unwrap();
    assert!(load_err(&dir).contains("truncated"), "{}", load_err(&dir));
    // Truncated inside the header.
    fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(100).unwrap();
    assert!(load_err(&dir).contains("truncated"), "{}", load_err(&dir));

    let dir = scratch("hostile");
    for n in [u64::MAX, 1 << 40, 100_000_001] {
        write_raw(&dir, n, b"{}");
        assert!(load_err(&dir).contains("absurd"), "{n}: {}", load_err(&dir));
    }
    write_raw(&dir, 1000, b"{}");
    assert!(load_err(&dir).contains("header claims 1000 bytes"), "{}", load_err(&dir));
    fs::write(dir.join("model.safetensors"), b"abc").unwrap();
    assert!(load_err(&dir).contains("too short"), "{}", load_err(&dir));
    fs::write(dir.join("model.safetensors"), b"").unwrap();
    assert!(load_err(&dir).contains("too short"), "{}", load_err(&dir));
    write_raw(&dir, 4, b"{{{{");
    assert!(load_err(&dir).contains("bad safetensors header"), "{}", load_err(&dir));
    // Offsets past the end of the data, and offsets that do not match the shape.
    let header = br#"{"w":{"dtype":"F32","shape":[1000000],"data_offsets":[0,4000000]}}"#;
    write_raw(&dir, header.len() as u64, &[header.as_slice(), &[0u8; 16]].concat());
    assert!(load_err(&dir).contains("bad safetensors header"), "{}", load_err(&dir));
    let header = br#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#;
    write_raw(&dir, header.len() as u64, &[header.as_slice(), &[0u8; 16]].concat());
    assert!(load_err(&dir).contains("bad safetensors header"), "{}", load_err(&dir));
    let header = br#"{"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}}"#;
    write_raw(&dir, header.len() as u64, &[header.as_slice(), &[0u8; 16]].concat());
    assert!(load_err(&dir).contains("bad safetensors header"), "{}", load_err(&dir));

    // A readable file with an unsupported dtype: an error only for that tensor.
    let header = br#"{"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"w":{"dtype":"F16","shape":[2,2],"data_offsets":[16,24]}}"#;
    let data: Vec<u8> = [[0u8; 16].as_slice(), &[0x00, 0x3c, 0x00, 0x40, 0x00, 0x42, 0x00, 0x44]].concat();
    write_raw(&dir, header.len() as u64, &[header.as_slice(), &data].concat());
    let w = Weights::load(&dir).unwrap();
    assert_eq!(w.f32("w", &[2, 2]).unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(w.row_f32("w", 1).unwrap(), [3.0, 4.0]);
    let e = w.f32("ids", &[2]).unwrap_err().to_string();
    assert!(e.contains("I64"), "{e}");
    let e = w.f32("w", &[4]).unwrap_err().to_string();
    assert!(e.contains("[2, 2]") && e.contains("[4]"), "{e}");
    let e = w.f32("nope", &[4]).unwrap_err().to_string();
    assert!(e.contains("`nope` not found"), "{e}");
    let e = w.row_f32("w", 2).unwrap_err().to_string();
    assert!(e.contains("row 2"), "{e}");
    let mut small = [0f32; 3];
    assert!(w.read_into("w", &mut small).is_err());
    let mut out = [0f32; 2];
    assert!(w.read_range("w", 3, &mut out).is_err());
    assert!(w.read_range("w", usize::MAX, &mut out).is_err());

    // No weights at all.
    let empty = scratch("empty");
    assert!(load_err(&empty).contains("no weights"), "{}", load_err(&empty));
}

#[test]
fn bad_shard_indexes_give_errors() {
    let dir = copy_fixture("qwen2-tiny-sharded", "index");
    let index = dir.join("model.safetensors.index.json");
    let original = fs::read_to_string(&index).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();

    v["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors".into();
    fs::write(&index, v.to_string()).unwrap();
    assert!(load_err(&dir).contains("not a plain file name"), "{}", load_err(&dir));

    v["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors".into();
    fs::write(&index, v.to_string()).unwrap();
    assert!(load_err(&dir).contains("model-00009-of-00009.safetensors"), "{}", load_err(&dir));

    let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
    let wm = v["weight_map"].as_object_mut().unwrap();
    let shard_of_norm = wm["model.norm.weight"].as_str().unwrap().to_string();
    let other = wm.values().map(|s| s.as_str().unwrap().to_string()).find(|s| *s != shard_of_norm).unwrap();
    wm.insert("model.norm.weight".into(), other.clone().into());
    fs::write(&index, v.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.norm.weight") && e.contains(&other), "{e}");

    fs::write(&index, r#"{"metadata": {}}"#).unwrap();
    assert!(load_err(&dir).contains("weight_map"), "{}", load_err(&dir));
    fs::write(&index, "not json").unwrap();
    assert!(load_err(&dir).contains("JSON"), "{}", load_err(&dir));

    // A tensor the index leaves out is missing, and check_config says so.
    let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
    v["weight_map"].as_object_mut().unwrap().remove("lm_head.weight");
    fs::write(&index, v.to_string()).unwrap();
    let w = Weights::load(&dir).unwrap();
    let cfg = ModelConfig::from_config_json(dir.join("config.json")).unwrap();
    let e = w.check_config(&cfg).unwrap_err().to_string();
    assert!(e.contains("missing `lm_head.weight`"), "{e}");
    // And a config that disagrees on shapes lists every mismatch.
    let mut wider = cfg.clone();
    wider.dims.intermediate_size = 256;
    let e = Weights::load(&dir).unwrap().check_config(&wider).unwrap_err().to_string();
    assert_eq!(e.matches("mlp.").count(), 3 * cfg.dims.num_layers, "{e}");
}

#[test]
fn synthetic_weights_are_deterministic_and_shaped_like_the_model() {
    let cfg = builtin("smollm2-135m").unwrap();
    let w = Weights::synthetic(&cfg, 7);
    assert!(w.is_synthetic());
    w.check_config(&cfg).unwrap();
    let shape = [cfg.dims.vocab_size, cfg.dims.hidden_size];
    let e = w.f32("model.embed_tokens.weight", &shape).unwrap();
    let mean = e.iter().map(|&v| v as f64).sum::<f64>() / e.len() as f64;
    let std = (e.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / e.len() as f64).sqrt();
    assert!(mean.abs() < 1e-4 && (std - 0.02).abs() < 1e-4, "mean {mean} std {std}");
    assert_eq!(w.row_f32("model.embed_tokens.weight", 1234).unwrap(), e[1234 * 576..1235 * 576]);
    assert_eq!(Weights::synthetic(&cfg, 7).f32("model.embed_tokens.weight", &shape).unwrap(), e);
    assert_ne!(Weights::synthetic(&cfg, 8).row_f32("model.embed_tokens.weight", 0).unwrap(), e[..576]);
    // Different tensors of the same shape differ.
    let g = w.f32("model.layers.0.mlp.gate_proj.weight", &[1536, 576]).unwrap();
    let u = w.f32("model.layers.0.mlp.up_proj.weight", &[1536, 576]).unwrap();
    assert_ne!(g, u);
    let h = w.f16("model.layers.0.mlp.gate_proj.weight", &[1536, 576]).unwrap();
    assert!(g.iter().zip(&h).all(|(a, b)| (a - b.to_f32()).abs() < 1e-4));
    let n = w.f32("model.layers.3.input_layernorm.weight", &[576]).unwrap();
    assert!(n.iter().all(|v| (0.95..=1.05).contains(v)));
    // Gemma's (1 + w) norms sit near 0.
    let gcfg = builtin("gemma3-1b").unwrap();
    let gw = Weights::synthetic(&gcfg, 1);
    gw.check_config(&gcfg).unwrap();
    let n = gw.f32("model.layers.0.self_attn.q_norm.weight", &[256]).unwrap();
    assert!(n.iter().all(|v| v.abs() <= 0.05));
    assert!(!gw.contains("lm_head.weight"));
    // Qwen's biases exist and are small.
    let qcfg = builtin("qwen2.5-0.5b").unwrap();
    let qw = Weights::synthetic(&qcfg, 1);
    let b = qw.f32("model.layers.0.self_attn.q_proj.bias", &[896]).unwrap();
    assert!(b.iter().all(|v| v.abs() <= 0.02) && b.iter().any(|v| *v != 0.0));
    assert_eq!(qw.stored_bytes(), 4 * qcfg.param_count());
}

/// A directory without tokenizer.json has no tokenizer; a damaged one is an error
/// naming the file, never a panic.
#[test]
fn tokenizer_json_missing_or_damaged() {
    use ktune::model::Tokenizer;
    assert!(Tokenizer::from_dir(fixtures_dir().join("llama3-tiny")).expect("no error").is_none());
    let tok = Tokenizer::from_dir(fixtures_dir().join("smollm2-tiny-bf16")).expect("loads").expect("present");
    assert_eq!(tok.vocab_size(), 320, "fills the fixture's vocabulary");
    let ids = tok.encode("café 42").expect("encodes");
    assert_eq!(tok.decode(&ids).expect("decodes"), "café 42", "byte-level BPE round-trips");
    let dir = scratch("tokenizer-damaged");
    for bad in ["", "{", "{\"model\": 3}", "[1, 2]"] {
        fs::write(dir.join("tokenizer.json"), bad).unwrap();
        let e = Tokenizer::from_dir(&dir).expect_err(bad).to_string();
        assert!(e.contains("tokenizer.json"), "{bad:?}: {e}");
        assert!(matches!(Tokenizer::from_dir(&dir), Err(ModelError::Tokenizer { .. })));
    }
}
