#!/usr/bin/env python3
"""Greedy reference output of a real (published) GGUF model from transformers.

transformers loads the GGUF file itself (`from_pretrained(dir, gguf_file=NAME)`:
its own dequantization to float32, Q/K un-permutation, Gemma norm correction),
float32, eager attention, on the CPU, and its tokenizer from the same file.
The prompt is encoded by that tokenizer (`--chat`: wrapped in the file's chat
template as one user message, with the generation prompt). Then N tokens are
decoded greedily one step at a time with the KV cache (end-of-sequence is not a
stop: the N steps always run), recording per step the picked id, the two
largest logits and their gap.

    target/venv-py/bin/python tools/real_gguf_reference.py MODEL.gguf \\
        --prompt "The capital of France is" --max-tokens 16 -o out.json
    target/venv-py/bin/python tools/real_gguf_reference.py MODEL.gguf --chat \\
        --prompt "Write one sentence about the sea." --max-tokens 16 -o chat.json

Output JSON:

    prompt, chat            the text and whether the chat template wrapped it
    chat_template_source    "file" (tokenizer.chat_template) or, for a Gemma
                            file that carries none, "gemma-turns" (the Gemma
                            turn format: <bos><start_of_turn>user\\n...
                            <end_of_turn>\\n<start_of_turn>model\\n)
    prompt_ids              the encoded prompt (special tokens included)
    prompt_text             tokenizer.decode(prompt_ids) (what llama.cpp is fed)
    generated               the greedy ids
    text                    tokenizer.decode(generated, skip_special_tokens=True)
    steps                   per step: id, top2 [[id, logit], [id, logit]], gap
    top2_gaps               the gaps (top1 - top2 logit), one per step
    first_near_tie_step     first step whose gap < NEAR_TIE_REL * max(1, |top1|),
                            or null: past it another engine may fairly differ
    eos_ids, first_eos_step
    config                  the transformers config fields that matter
    transformers, torch, gguf   versions

Gemma 3: transformers' GGUF loader leaves query_pre_attn_scalar at its default
(256) and ignores rope scaling keys; the script checks that the file's
key_length and rope scaling agree with that and stops otherwise (the Gemma 3
270M file does: head_dim 256, no scaling).

Dependencies: tools/requirements.txt (torch, transformers, gguf, sentencepiece,
tokenizers), in the repo's tools venv:

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt
"""

import argparse
import json
import sys
from pathlib import Path

import gguf
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

NEAR_TIE_REL = 1e-3
GEMMA_TURNS = "<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n"


def gguf_meta(path):
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.") or k.endswith(("model", "pre"))}


def load(path):
    meta = gguf_meta(path)
    arch = meta.get("general.architecture")
    if arch == "gemma3":
        kl = meta.get("gemma3.attention.key_length")
        if kl is not None and kl != 256:
            sys.exit(f"{path}: gemma3 key_length {kl}: transformers' GGUF loader would use query_pre_attn_scalar 256")
        if "gemma3.rope.scaling.type" in meta or "gemma3.rope.scaling.factor" in meta:
            sys.exit(f"{path}: rope scaling keys present, which transformers' GGUF loader ignores")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:  # report exactly what transformers refused
        sys.exit(f"transformers {transformers.__version__} cannot load {path} (architecture {arch}): {type(e).__name__}: {e}")
    return model, tok, meta


def encode(tok, meta, text, chat):
    if not chat:
        return tok(text)["input_ids"], None
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids), "file"
    if meta.get("general.architecture") == "gemma3":
        body = GEMMA_TURNS.format(content=text)
        ids = tok(body, add_special_tokens=False)["input_ids"]
        if tok.bos_token_id is not None:
            ids = [tok.bos_token_id] + ids
        return ids, "gemma-turns"
    sys.exit("the file has no chat template (tokenizer.chat_template) and no fallback is known for its architecture")


def greedy(model, ids, n):
    steps = []
    past = None
    inp = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].to(torch.float64)
            v, i = torch.topk(logits, 2)
            nxt = int(i[0])
            steps.append({"id": nxt, "top2": [[int(i[0]), float(v[0])], [int(i[1]), float(v[1])]], "gap": float(v[0] - v[1])})
            inp = torch.tensor([[nxt]])
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.file.resolve()
    model, tok, meta = load(path)
    ids, template = encode(tok, meta, args.prompt, args.chat)
    steps = greedy(model, ids, args.max_tokens)
    gen = [s["id"] for s in steps]
    gaps = [s["gap"] for s in steps]
    near = next((k for k, s in enumerate(steps) if s["gap"] < NEAR_TIE_REL * max(1.0, abs(s["top2"][0][1]))), None)
    eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else tok.eos_token_id
    eos_ids = sorted(set(eos if isinstance(eos, list) else [eos])) if eos is not None else []
    cfg = model.config
    res = {
        "file": path.name,
        "architecture": meta.get("general.architecture"),
        "prompt": args.prompt,
        "chat": args.chat,
        "chat_template_source": template,
        "prompt_ids": ids,
        "prompt_text": tok.decode(ids),
        "generated": gen,
        "text": tok.decode(gen, skip_special_tokens=True),
        "steps": steps,
        "top2_gaps": gaps,
        "near_tie_rel": NEAR_TIE_REL,
        "first_near_tie_step": near,
        "min_gap": min(gaps) if gaps else None,
        "eos_ids": eos_ids,
        "first_eos_step": next((k for k, t in enumerate(gen) if t in eos_ids), None),
        "config": {
            k: getattr(cfg, k, None)
            for k in ("model_type", "num_hidden_layers", "hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads",
                      "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_parameters", "rms_norm_eps",
                      "tie_word_embeddings", "final_logit_softcapping", "attn_logit_softcapping", "vocab_size")
        },
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": __import__("importlib.metadata").metadata.version("gguf"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"{path.name}: prompt {len(ids)} ids, generated {gen}")
    print(f"  text: {res['text']!r}")
    print(f"  min gap {res['min_gap']:.4g}, first near tie: {near}, first eos: {res['first_eos_step']}")


if __name__ == "__main__":
    main()
