#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["numpy==2.4.6"]
# ///
"""A Hugging Face model directory of random weights in a real model's shape, with
a tokenizer, for serving benchmarks where no published file can travel (a lent
GPU machine takes 64 MiB of files a call and reaches no network): `config.json`,
`model.safetensors` (F16, written here without the safetensors package) and
`tokenizer.json`, the test fixture's byte-level BPE (320 tokens) padded with
unused tokens to the shape's vocabulary, so the embedding and the LM head have
the real size. The text is meaningless; the work per token is the real model's.

    python3 tools/make_serve_model.py --shape smollm2-135m --out target/serve-models/smollm2-135m
    python3 tools/make_serve_model.py --shape llama-3.2-1b --out target/serve-models/llama-1b
    ktune serve --model-dir target/serve-models/llama-1b --weight-dtype q4_k ...

Only numpy (the device image's own), nothing to install there.
"""

import argparse
import json
import struct
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests/fixtures/smollm2-tiny-bf16/tokenizer.json"

# layers, hidden, ffn, heads, kv_heads, head_dim, vocab, rope theta
SHAPES = {
    "smollm2-135m": (30, 576, 1536, 9, 3, 64, 49152, 100000.0),
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 64, 128256, 500000.0),
}


def tensors(shape, rng):
    layers, hidden, ffn, heads, kv, hd, vocab, _ = shape

    def w(*dims):
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    yield "model.embed_tokens.weight", w(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", np.ones(hidden, np.float16)
        yield p + "self_attn.q_proj.weight", w(heads * hd, hidden)
        yield p + "self_attn.k_proj.weight", w(kv * hd, hidden)
        yield p + "self_attn.v_proj.weight", w(kv * hd, hidden)
        yield p + "self_attn.o_proj.weight", w(hidden, heads * hd)
        yield p + "post_attention_layernorm.weight", np.ones(hidden, np.float16)
        yield p + "mlp.gate_proj.weight", w(ffn, hidden)
        yield p + "mlp.up_proj.weight", w(ffn, hidden)
        yield p + "mlp.down_proj.weight", w(hidden, ffn)
    yield "model.norm.weight", np.ones(hidden, np.float16)


def write_safetensors(path, named):
    header, offset, arrays = {}, 0, []
    for name, a in named:
        n = a.nbytes
        header[name] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [offset, offset + n]}
        offset += n
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in arrays:
            f.write(np.ascontiguousarray(a).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shape = SHAPES[a.shape]
    layers, hidden, ffn, heads, kv, hd, vocab, theta = shape
    a.out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": theta,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }
    (a.out / "config.json").write_text(json.dumps(config, indent=2))
    tok = json.loads(TOKENIZER.read_text())
    v = tok["model"]["vocab"]
    for i in range(len(v), vocab):
        v[f"<unused_{i}>"] = i
    (a.out / "tokenizer.json").write_text(json.dumps(tok))
    write_safetensors(a.out / "model.safetensors", tensors(shape, np.random.default_rng(a.seed)))
    print(f"{a.out}: {a.shape}, {layers} layers, vocab {vocab}")


if __name__ == "__main__":
    main()
