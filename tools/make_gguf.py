#!/usr/bin/env python3
"""Builds the small GGUF files in tests/fixtures/gguf/ and their expected outputs.

Each file is written with the `gguf` package's GGUFWriter the way llama.cpp's
convert_hf_to_gguf.py writes that architecture:

    llama   Q and K rows permuted for RoPE (LlamaModel.permute)
    gemma3  every `*norm.weight` stored as 1 + w
    all     1-D tensors (norms, biases) kept F32, matrices in the file type
            (quantized with gguf.quants.quantize: ggml's reference quantizers)

from tiny random models (tests/fixtures/smollm2-tiny-bf16 and
qwen2-tiny-sharded, and a new 6-layer Gemma 3 so that llama.cpp's fixed
sliding-window pattern of 6 has a global layer). The smollm2 files carry the
fixture's byte-level BPE tokenizer as `tokenizer.ggml.*` metadata (model gpt2,
pre smollm).

The expected outputs (NAME.json next to NAME.gguf) come from transformers
loading the GGUF file itself (`from_pretrained(dir, gguf_file=...)`: its own
dequantization, un-permutation and norm correction), float32, eager attention:
logits at every prompt position and 8 greedy tokens. For Gemma 3, llama.cpp
scales attention scores by key_length^-1/2 and transformers' GGUF loader leaves
query_pre_attn_scalar at its default (256), and it ignores rope scaling keys:
the config is corrected to what the file means (query_pre_attn_scalar =
head_dim, linear RoPE scaling as written) before the model is built.

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt
    target/venv-py/bin/python tools/make_gguf.py           # writes tests/fixtures/gguf/
    target/venv-py/bin/python tools/make_gguf.py --check   # recomputes expected, compares
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType
from gguf.quants import quantize
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, LlamaForCausalLM, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import COMMON, build  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OUT = FIXTURES / "gguf"
NEW_TOKENS = 8
PROMPT_TEXT = "The kernel reads 42 weights in the café."

QTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1}


def gemma3_model():
    config = Gemma3TextConfig(
        **{**COMMON, "initializer_range": 0.25, "bos_token_id": 2, "eos_token_id": 1},
        num_hidden_layers=6,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=256,
        rms_norm_eps=1e-6,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=8,
        query_pre_attn_scalar=16,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    return build(Gemma3ForCausalLM, config, "f32", 15, {"init_std": 0.25, "embed_std": 0.02, "final_norm_gain": 3.0})


def hf_model(name, cls):
    return cls.from_pretrained(FIXTURES / name, dtype=torch.float32, attn_implementation="eager").eval()


def permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(arch, hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    layer, rest, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    table = dict(GGUF_NAMES)
    if arch == "gemma3":
        table.update(post_attention_layernorm="post_attention_norm", pre_feedforward_layernorm="ffn_norm",
                     post_feedforward_layernorm="post_ffw_norm")
    else:
        table["post_attention_layernorm"] = "ffn_norm"
    return f"blk.{layer}.{table[rest]}.{suffix}"


def add_tokenizer(w, tok_json, bos, eos):
    t = json.loads(tok_json.read_text())
    vocab = t["model"]["vocab"]
    specials = {a["id"]: a for a in t["added_tokens"]}
    tokens = [None] * (max(vocab.values()) + 1)
    for s, i in vocab.items():
        tokens[i] = s
    types = [TokenType.CONTROL if i in specials and specials[i]["special"] else TokenType.NORMAL for i in range(len(tokens))]
    merges = [" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)


def write_gguf(path, arch, model, qtype, tokenizer=None):
    c = model.config
    w = GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(int(qtype) if qtype != QT.F32 else 0)
    rp = c.rope_parameters
    if arch == "gemma3":
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
        w.add_sliding_window(c.sliding_window)
        w.add_rope_freq_base(rp["full_attention"]["rope_theta"])
        if rp["full_attention"].get("rope_type") == "linear":
            w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rp["full_attention"]["factor"])
    else:
        w.add_rope_freq_base(rp["rope_theta"])
        w.add_rope_dimension_count(c.head_dim)
        if arch == "llama":
            w.add_key_length(c.head_dim)
    if tokenizer is not None:
        add_tokenizer(w, tokenizer, c.bos_token_id, c.eos_token_id)
    else:
        w.add_bos_token_id(c.bos_token_id)
        w.add_eos_token_id(c.eos_token_id)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.detach().to(torch.float32).numpy().copy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = permute(a, c.num_attention_heads)
        if arch == "llama" and name.endswith("k_proj.weight"):
            a = permute(a, c.num_key_value_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + 1
        gname = gguf_name(arch, name)
        if a.ndim == 1 or qtype == QT.F32:
            w.add_tensor(gname, a.astype(np.float32))
        elif qtype == QT.F16:
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, quantize(a, qtype), raw_shape=quantize(a, qtype).shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def expected(path, arch, prompt):
    overrides = {}
    if arch == "gemma3":
        overrides = dict(query_pre_attn_scalar=16)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager", **overrides
    ).eval()
    if arch == "gemma3":
        # transformers' GGUF loader ignores the rope scaling keys: rebuild the model
        # from its config with the scaling the file declares, and its loaded weights.
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        rp = cfg["rope_parameters"]
        rp["full_attention"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": rp["full_attention"]["rope_theta"]}
        fixed = Gemma3ForCausalLM(Gemma3TextConfig(**cfg)).eval()
        fixed.load_state_dict(model.state_dict())
        fixed.config._attn_implementation = "eager"
        model = fixed
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(ids).logits[0]
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    gen = out[0, len(prompt):].tolist()
    cfg = model.config
    return {
        "about": f"tools/make_gguf.py: transformers {__import__('transformers').__version__} loading {path.name}",
        "config": {
            k: getattr(cfg, k, None)
            for k in ("num_hidden_layers", "head_dim", "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_parameters", "tie_word_embeddings")
        },
        "tokens": prompt,
        "logits": [[float(f"{v:.6g}") for v in row] for row in logits.tolist()],
        "generated": gen,
    }


def tokenizer_expected(path):
    """The prompt text encoded by transformers' tokenizer from the file, 8 greedy
    tokens continuing it and their text (special tokens skipped)."""
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = tok(PROMPT_TEXT)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    gen = out[0, len(ids):].tolist()
    return {"prompt": PROMPT_TEXT, "prompt_ids": ids, "generated": gen, "text": tok.decode(gen, skip_special_tokens=True)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    smol = hf_model("smollm2-tiny-bf16", LlamaForCausalLM)
    qwen = hf_model("qwen2-tiny-sharded", Qwen2ForCausalLM)
    gemma = gemma3_model()
    tok = FIXTURES / "smollm2-tiny-bf16" / "tokenizer.json"
    plan = [
        ("smollm2-tiny", "llama", smol, ["f16", "bf16", "q8_0", "q4_0", "q4_1"], tok),
        ("qwen2-tiny", "qwen2", qwen, ["f32", "q8_0"], None),
        ("gemma3-tiny", "gemma3", gemma, ["f16", "q8_0"], None),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    bad = []
    for base, arch, model, types, tokenizer in plan:
        prompt = rng.integers(3, model.config.vocab_size, 20).tolist()
        for t in types:
            name = f"{base}-{t}"
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{name}.gguf"
                write_gguf(path, arch, model, QTYPES[t], tokenizer)
                exp = expected(path, arch, prompt)
                if tokenizer is not None:
                    exp["tokenizer"] = tokenizer_expected(path)
                if args.check:
                    old = json.loads((OUT / f"{name}.json").read_text())
                    if old["generated"] != exp["generated"]:
                        bad.append(name)
                    continue
                (OUT / f"{name}.gguf").write_bytes(path.read_bytes())
                (OUT / f"{name}.json").write_text(json.dumps(exp, indent=0) + "\n")
                print(f"{name}: {path.stat().st_size} bytes, generated {exp['generated']}")
    if bad:
        sys.exit(f"expected outputs differ: {bad}")


if __name__ == "__main__":
    main()
