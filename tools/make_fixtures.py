#!/usr/bin/env python3
"""Builds the tiny random models in tests/fixtures/ and their expected outputs.

Each fixture is a directory in Hugging Face layout (config.json + safetensors)
plus expected.json, computed by transformers in float32 with eager attention:

    tokens            the prompt (20 ids)
    logits            logits at every prompt position, [20][vocab]
    generated         8 greedy ids continuing the prompt (generate(do_sample=False),
                      KV cache, end-of-sequence ignored)
    generated_logits  the logits each of those 8 ids was picked from, [8][vocab]
    tensor_checks     per tensor of the saved files, under the files' names: sum,
                      first and last stored value
    router_margin     (MoE fixtures) the smallest gap, over every token and layer of
                      every forward above, between the k-th and (k+1)-th largest
                      router probability (f32 softmax of the `mlp.gate` logits, k =
                      num_experts_per_tok): at least ROUTER_MIN_MARGIN, so a runtime
                      computing in f32 picks the same experts as torch

Norm gains and biases are randomized (transformers initializes them to 1/0),
so a runtime that ignores or misapplies them fails the comparison.

Needs torch, transformers and safetensors from PyPI:

    python3 -m venv /tmp/fx && /tmp/fx/bin/pip install torch transformers safetensors
    /tmp/fx/bin/python tools/make_fixtures.py            # writes tests/fixtures/
    /tmp/fx/bin/python tools/make_fixtures.py --check    # recomputes, compares, writes nothing
    /tmp/fx/bin/python tools/make_tokenizer.py           # then the tokenizer of smollm2-tiny-bf16

The weights depend on torch's random generator, so rerunning with another torch
version may produce different (equally valid) fixtures.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

PROMPT_LEN = 20
NEW_TOKENS = 8
# Standard deviation of the random projections: large enough that greedy
# generation does not just repeat a token, and that the top two logits of every
# generated step are at least 0.01 apart (checked below).
INIT_STD = 0.15
MIN_MARGIN = 0.01
# MoE fixtures: the gap between the last chosen and the first unchosen expert's
# router probability, at every token of every layer (checked below).
ROUTER_MIN_MARGIN = 1e-3
# Made by tools/make_tokenizer.py, kept when a fixture is rewritten.
KEEP = ("tokenizer.json", "tokenizer_expected.json")

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    initializer_range=INIT_STD,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def fixtures():
    """(name, model class, config, storage: f32 | bf16 | sharded, seed, what it exercises, tweaks)."""
    return [
        (
            "llama3-tiny",
            LlamaForCausalLM,
            LlamaConfig(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                head_dim=16,
                vocab_size=256,
                rms_norm_eps=1e-5,
                max_position_embeddings=131072,
                tie_word_embeddings=True,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 32.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            ),
            "f32",
            11,
            "Llama 3.2: llama3 RoPE scaling (head_dim 16 puts frequencies in all three bands), GQA 4:2, tied",
            {},
        ),
        (
            "smollm2-tiny-bf16",
            LlamaForCausalLM,
            LlamaConfig(
                **COMMON,
                num_hidden_layers=3,
                num_key_value_heads=1,
                head_dim=16,
                vocab_size=320,
                rms_norm_eps=1e-5,
                max_position_embeddings=8192,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            ),
            "bf16",
            12,
            "SmolLM2: Llama without RoPE scaling, GQA 4:1, tied, weights stored as bf16 "
            "(expected outputs computed in f32 from the bf16 values)",
            {},
        ),
        (
            "qwen2-tiny-sharded",
            Qwen2ForCausalLM,
            Qwen2Config(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                head_dim=16,
                vocab_size=384,
                rms_norm_eps=1e-6,
                max_position_embeddings=32768,
                tie_word_embeddings=False,
                use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            "sharded",
            13,
            "Qwen2.5: Q/K/V biases, untied lm_head, saved in several shards with an index",
            {},
        ),
        (
            "qwen3-tiny",
            Qwen3ForCausalLM,
            Qwen3Config(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                head_dim=32,
                vocab_size=288,
                rms_norm_eps=1e-6,
                max_position_embeddings=40960,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            "f32",
            15,
            "Qwen3: per-head q/k RMSNorm before RoPE, no biases, head_dim 32 (q_dim 128 != hidden 64), GQA 4:2, untied",
            {},
        ),
        (
            "qwen3moe-tiny",
            Qwen3MoeForCausalLM,
            Qwen3MoeConfig(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                head_dim=16,
                vocab_size=288,
                rms_norm_eps=1e-6,
                max_position_embeddings=40960,
                tie_word_embeddings=False,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            "f32",
            # (also chosen so that the Q8_0 GGUF of tools/make_family_gguf.py keeps
            # router margins >= 1e-3 and greedy margins >= MIN_MARGIN)
            59,
            "Qwen3-MoE (Qwen3-30B-A3B): every layer a sparse MoE block (no dense MLP, no shared expert), 8 experts "
            "of intermediate size 32, router softmax over the 8 then top-2 renormalised to sum 1 (norm_topk_prob), "
            "experts stored one by one (mlp.experts.E.{gate,up,down}_proj), per-head q/k RMSNorm, head_dim 16, "
            "GQA 4:2, untied",
            {},
        ),
        (
            "olmoe-tiny",
            OlmoeForCausalLM,
            OlmoeConfig(
                **{**COMMON, "intermediate_size": 32},
                num_hidden_layers=2,
                # No GQA: llama.cpp's OLMoE loader wants attn_k_norm of n_embd (the whole
                # K projection without GQA) and refuses a GGUF with fewer KV heads.
                num_key_value_heads=4,
                vocab_size=288,
                rms_norm_eps=1e-5,
                max_position_embeddings=4096,
                tie_word_embeddings=False,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=False,
                clip_qkv=None,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            "f32",
            69,
            "OLMoE (OLMoE-1B-7B): every layer a sparse MoE block (no shared expert), 8 experts of intermediate "
            "size 32 (the config's intermediate_size), router softmax over the 8 then top-2 NOT renormalised "
            "(norm_topk_prob false), experts stored one by one (mlp.experts.E.{gate,up,down}_proj), q/k RMSNorm "
            "over the whole projection (q_norm [64], k_norm [64]) before the split into heads, head_dim 16, "
            "no GQA (4 KV heads, as OLMoE-1B-7B and llama.cpp's loader), untied",
            {},
        ),
        (
            "mistral-tiny",
            MistralForCausalLM,
            MistralConfig(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=1,
                head_dim=16,
                vocab_size=256,
                rms_norm_eps=1e-5,
                max_position_embeddings=32768,
                tie_word_embeddings=False,
                sliding_window=8,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            "f32",
            19,
            "Mistral: a sliding window of 8 < 20-token prompt on every layer, GQA 4:1, untied",
            {},
        ),
        (
            "phi3-tiny",
            Phi3ForCausalLM,
            Phi3Config(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                vocab_size=256,
                rms_norm_eps=1e-5,
                max_position_embeddings=32,
                original_max_position_embeddings=8,
                tie_word_embeddings=False,
                sliding_window=12,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0],
                    "long_factor": [1.5, 2.5, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0],
                },
            ),
            "f32",
            25,
            "Phi-3 / Phi-3.5-mini: fused qkv_proj and gate_up_proj, LongRoPE (the 28-token run exceeds the "
            "original context of 8: long factors, attention factor sqrt(1 + ln 4 / ln 8)), a sliding window of "
            "12 < 20-token prompt on every layer, GQA 4:2, untied",
            {},
        ),
        (
            "phi4-tiny",
            Phi3ForCausalLM,
            Phi3Config(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=1,
                vocab_size=256,
                rms_norm_eps=1e-5,
                max_position_embeddings=32,
                original_max_position_embeddings=8,
                tie_word_embeddings=True,
                sliding_window=None,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                    "short_factor": [1.0, 1.5, 2.5, 4.0],
                    "long_factor": [2.0, 4.0, 12.0, 32.0],
                },
            ),
            "f32",
            28,
            "Phi-4-mini: RoPE on 8 of each head's 16 dims (partial_rotary_factor 0.5) with LongRoPE (the "
            "28-token run exceeds the original context of 8: long factors, and the attention factor "
            "sqrt(1 + ln 4 / ln 8) on the rotated dims only), GQA 4:1, tied",
            {},
        ),
        (
            "granite-tiny",
            GraniteForCausalLM,
            GraniteConfig(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                vocab_size=256,
                rms_norm_eps=1e-5,
                max_position_embeddings=4096,
                tie_word_embeddings=True,
                embedding_multiplier=0.5,
                attention_multiplier=0.2,
                residual_multiplier=1.7,
                logits_scaling=2.5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0},
            ),
            "f32",
            27,
            "Granite 3: embedding multiplier 0.5, attention scale 0.2 (not 16^-1/2), residual branches x1.7, "
            "logits / 2.5, GQA 4:2, tied",
            {},
        ),
        (
            "olmo2-tiny",
            Olmo2ForCausalLM,
            Olmo2Config(
                **COMMON,
                num_hidden_layers=2,
                num_key_value_heads=2,
                vocab_size=256,
                rms_norm_eps=1e-6,
                max_position_embeddings=4096,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            ),
            "f32",
            30,
            "OLMo 2: no norm before attention or the MLP, RMSNorm on each branch before its residual add, "
            "q/k RMSNorm over the whole projection (gains of 64 and 32), GQA 4:2, untied",
            {},
        ),
        (
            "smollm3-tiny",
            SmolLM3ForCausalLM,
            SmolLM3Config(
                **COMMON,
                num_hidden_layers=4,
                num_key_value_heads=2,
                head_dim=16,
                vocab_size=320,
                rms_norm_eps=1e-6,
                max_position_embeddings=65536,
                tie_word_embeddings=True,
                no_rope_layer_interval=4,
                rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
            ),
            "f32",
            24,
            "SmolLM3: layer 3 (every fourth) without RoPE, GQA 4:2, tied",
            {},
        ),
        (
            "gemma3-tiny",
            Gemma3ForCausalLM,
            Gemma3TextConfig(
                **{**COMMON, "initializer_range": 0.25, "bos_token_id": 2, "eos_token_id": 1},
                num_hidden_layers=4,
                num_key_value_heads=1,
                head_dim=32,
                vocab_size=256,
                rms_norm_eps=1e-6,
                max_position_embeddings=131072,
                tie_word_embeddings=True,
                hidden_activation="gelu_pytorch_tanh",
                sliding_window=8,
                layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                query_pre_attn_scalar=24,
                final_logit_softcapping=2.0,
                attn_logit_softcapping=None,
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            ),
            "f32",
            14,
            "Gemma 3: sliding window 8 < 20-token prompt on layers 0, 1, 3 (local RoPE base 1e4), global layer 2 "
            "(1e6, linear scaling 8), head_dim 32 (q_dim 128 != hidden 64), query_pre_attn_scalar 24, QK-norm, "
            "(1 + w) norms, sandwich norms, GeGLU, sqrt(hidden) embedding scale, final_logit_softcapping 2 "
            "(the largest logits are well into the tanh's bend)",
            # The sqrt(hidden) scale would let the embedding swamp the layers (greedy
            # output repeats a token): small embeddings, and a final-norm gain near 5
            # to bring the logits back up to where the soft cap bends them.
            {"init_std": 0.25, "embed_std": 0.02, "final_norm_gain": 5.0},
        ),
    ]


def randomize_norms_and_biases(model, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.15)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def is_moe(config):
    return bool(getattr(config, "num_experts_per_tok", 0))


def build(cls, config, storage, seed, tweaks):
    torch.manual_seed(seed)
    # MoE: transformers' reference loop over the experts (not grouped_mm).
    moe = {"experts_implementation": "eager"} if is_moe(config) else {}
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32, **moe).eval()
    randomize_norms_and_biases(model, seed)
    with torch.no_grad():
        if "embed_std" in tweaks:
            model.model.embed_tokens.weight.mul_(tweaks["embed_std"] / tweaks["init_std"])
        if "final_norm_gain" in tweaks:
            # (1 + w) norm: a gain g is w = g - 1.
            model.model.norm.weight.add_(tweaks["final_norm_gain"] - 1.0)
    if storage == "bf16":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model


def g7(x):
    return float(f"{x:.7g}")


def router_hooks(model, config):
    """Hooks every MoE layer's router (`mlp.gate`); returns the list its logits
    ([tokens, experts], one entry per call) are appended to, and the hooks."""
    seen = []
    if not is_moe(config):
        return seen, []

    def hook(_module, _inputs, out):
        seen.append((out[0] if isinstance(out, tuple) else out).detach().reshape(-1, config.num_experts))

    hooks = [
        layer.mlp.gate.register_forward_hook(hook)
        for layer in model.model.layers
        if hasattr(layer.mlp, "experts")
    ]
    if not hooks:
        sys.exit("an MoE config without any router to hook")
    return seen, hooks


def router_margin(seen, k):
    """The smallest gap between the k-th and (k+1)-th largest router probability."""
    margin = float("inf")
    for logits in seen:
        probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        margin = min(margin, float((probs[:, k - 1] - probs[:, k]).min()))
    return margin


def expected(model, config, seed):
    vocab = config.vocab_size
    g = torch.Generator().manual_seed(seed + 2000)
    tokens = torch.randint(3, vocab, (1, PROMPT_LEN), generator=g)
    gen_cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
    )
    # No end-of-sequence: generation runs the full NEW_TOKENS, picking raw argmaxes.
    model.generation_config.eos_token_id = None
    # Every router call of the prompt forward, the cached greedy steps and the
    # uncached recomputations below.
    routed, hooks = router_hooks(model, config)
    with torch.no_grad():
        logits = model(tokens).logits[0]
        out = model.generate(
            tokens,
            attention_mask=torch.ones_like(tokens),
            generation_config=gen_cfg,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
        )
        generated = out.sequences[0, PROMPT_LEN:].tolist()
        gen_logits = torch.stack([l[0] for l in out.logits])
        # The same continuation without a KV cache: full recomputation at each step.
        seq = tokens
        for step in range(NEW_TOKENS):
            nxt = int(model(seq).logits[0, -1].argmax())
            if nxt != generated[step]:
                sys.exit(f"greedy decode with and without KV cache disagree at step {step}: {generated} vs {nxt}")
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    for h in hooks:
        h.remove()
    assert len(generated) == NEW_TOKENS
    top2 = gen_logits.topk(2, dim=1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    if margin < MIN_MARGIN:
        sys.exit(f"greedy choice too close to call (top-2 margin {margin:.4f}): change the seed or the init")
    out = {
        "tokens": tokens[0].tolist(),
        "logits": [[g7(v) for v in row] for row in logits.tolist()],
        "generated": generated,
        "generated_logits": [[g7(v) for v in row] for row in gen_logits.tolist()],
    }
    record_router_margin(out, routed, config, "change the seed or the init")
    return out


def record_router_margin(out, routed, config, advice):
    """For an MoE model (router logits `routed` seen): its router margin into
    `out`, or an exit when it is under ROUTER_MIN_MARGIN."""
    if not routed:
        return
    margin = router_margin(routed, config.num_experts_per_tok)
    if margin < ROUTER_MIN_MARGIN:
        sys.exit(f"expert choice too close to call (router margin {margin:.2e}): {advice}")
    out["router_margin"] = g7(margin)


def tensor_checks(out_dir):
    """Per tensor of the saved files: [sum, first, last] of the stored values (as
    float64), under the files' names (transformers may store tensors otherwise
    than it holds them: Qwen3-MoE's experts one by one, fused in memory)."""
    from safetensors.torch import load_file

    state = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        state.update(load_file(f))
    return {
        k: [float(v.double().sum()), float(v.flatten()[0]), float(v.flatten()[-1])]
        for k, v in sorted(state.items())
    }


def save(model, storage, out_dir):
    if storage == "bf16":
        model.to(torch.bfloat16).save_pretrained(out_dir)
        model.to(torch.float32)
    elif storage == "sharded":
        model.save_pretrained(out_dir, max_shard_size="150KB")
    else:
        model.save_pretrained(out_dir)
    # Only weights and config: drop generation_config.json and anything else.
    keep = {"config.json", "model.safetensors", "model.safetensors.index.json"}
    for f in out_dir.iterdir():
        if f.name not in keep and not (f.name.startswith("model-") and f.name.endswith(".safetensors")):
            f.unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--check", action="store_true", help="recompute and compare with the files, write nothing")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these fixtures only (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    root = Path(args.out)
    failures = 0
    for name, cls, config, storage, seed, about, tweaks in fixtures():
        if args.only and name not in args.only:
            continue
        model = build(cls, config, storage, seed, tweaks)
        exp = expected(model, config, seed)
        exp = {
            "about": about,
            "storage": storage,
            "sliding_window_rule": "on local layers a query at position i sees keys j with i - sliding_window < j <= i",
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "eos_ignored": True,
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
            **exp,
        }
        d = root / name
        if args.check:
            old = json.loads((d / "expected.json").read_text())
            worst = max(
                abs(a - b) for ra, rb in zip(old["logits"], exp["logits"]) for a, b in zip(ra, rb)
            )
            same = old["tokens"] == exp["tokens"] and old["generated"] == exp["generated"] and worst < 1e-4
            print(f"{name}: {'ok' if same else 'DIFFERENT'} (worst logit difference {worst:.2e})")
            failures += not same
            continue
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            save(model, storage, tmp)
            # For checking a loader's names and dtype conversions against torch's.
            exp["tensor_checks"] = tensor_checks(tmp)
            # Files made by tools/make_tokenizer.py stay (rerun it afterwards: its
            # expected ids depend on these weights).
            for keep in KEEP:
                if (d / keep).exists():
                    shutil.copy2(d / keep, tmp / keep)
            if d.exists():
                shutil.rmtree(d)
            shutil.copytree(tmp, d)
        (d / "expected.json").write_text(json.dumps(exp, separators=(",", ":")) + "\n")
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"{name}: {size / 1024:.0f} KiB, {sorted(f.name for f in d.iterdir())}, generated {exp['generated']}")
        if size >= 1 << 20:
            sys.exit(f"{name} is {size} bytes, over the 1 MiB budget")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
