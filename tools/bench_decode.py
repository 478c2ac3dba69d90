#!/usr/bin/env python3
"""Eager PyTorch decode throughput at the shapes of ktune's built-in models, the
peer `tools/bench_decode.sh` compares `ktune run` against.

For each model: the transformers model built from the published config
(tests/fixtures/hf-configs/) with random weights in float32, eager attention;
a short prompt; greedy `generate` with the KV cache for --new-tokens tokens
(end-of-sequence ignored). Decode time is taken between the first and the last
call of a logits processor (after the prefill's forward, after the last decode
step's), so it is (new tokens - 1) decode steps and no prefill. The median over
--runs runs (after one warm-up) is reported, with every run's value.

    python3 tools/bench_decode.py [--threads 2] [--runs 5] [--new-tokens 32] [--models smollm2-135m,gemma3-1b]

Prints JSON on stdout; progress on stderr. Needs torch and transformers (PyPI).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList

ROOT = Path(__file__).resolve().parent.parent
# ktune's built-in name -> the published config.json it mirrors.
CONFIGS = {
    "smollm2-135m": "smollm2-135m.json",
    "gemma3-1b": "gemma-3-1b-it.json",
    "llama-3.2-1b": "llama-3.2-1b.json",
    "qwen2.5-0.5b": "qwen2.5-0.5b.json",
}


class Clock(LogitsProcessor):
    """Records when each generation step's logits are ready."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def build(name):
    path = ROOT / "tests" / "fixtures" / "hf-configs" / CONFIGS[name]
    d = json.loads(path.read_text())
    d.pop("transformers_version", None)
    d.pop("torch_dtype", None)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
    return model, cfg


def weight_bytes(model):
    """Bytes of the distinct parameters (a tied embedding / LM head counted once): what
    one decode step reads at least once."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def decode_once(model, prompt, new_tokens):
    clock = Clock()
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
        use_cache=True,
    )
    model.generation_config.eos_token_id = None
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gen, logits_processor=LogitsProcessorList([clock]))
    generated = out.shape[1] - prompt.shape[1]
    if generated != new_tokens or len(clock.times) != new_tokens:
        sys.exit(f"generate made {generated} tokens ({len(clock.times)} steps), asked for {new_tokens}")
    prefill = clock.times[0] - t0
    steps = new_tokens - 1
    decode = clock.times[-1] - clock.times[0]
    return prefill, steps / decode if decode > 0 else 0.0, out[0, prompt.shape[1] :].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--models", default="smollm2-135m,gemma3-1b", help=f"comma separated, of {', '.join(CONFIGS)}")
    a = ap.parse_args()
    if a.new_tokens < 2:
        sys.exit("--new-tokens must be at least 2 (one decode step after the prefill's token)")
    torch.set_num_threads(a.threads)
    names = [m.strip() for m in a.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in CONFIGS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {', '.join(CONFIGS)}")
    results = []
    for name in names:
        print(f"{name}: building (random f32 weights)", file=sys.stderr)
        model, cfg = build(name)
        # The same prompt ids as tools/bench_decode.sh gives `ktune run`: 1..N.
        prompt = torch.arange(1, a.prompt_tokens + 1).unsqueeze(0)
        decode_once(model, prompt, min(a.new_tokens, 4))  # warm-up
        runs = []
        for i in range(a.runs):
            prefill, tps, _ = decode_once(model, prompt, a.new_tokens)
            runs.append({"prefill_seconds": prefill, "decode_tokens_per_sec": tps})
            print(f"{name}: run {i + 1}/{a.runs}: {tps:.2f} tokens/s", file=sys.stderr)
        wb = weight_bytes(model)
        tps = statistics.median(r["decode_tokens_per_sec"] for r in runs)
        results.append(
            {
                "model": name,
                "config": CONFIGS[name],
                "architecture": cfg.architectures[0] if cfg.architectures else type(model).__name__,
                "dtype": "f32",
                "attention": "eager",
                "prompt_tokens": a.prompt_tokens,
                "new_tokens": a.new_tokens,
                "decode_steps": a.new_tokens - 1,
                "weight_bytes": wb,
                "decode_tokens_per_sec": tps,
                "decode_gbps": wb * tps / 1e9,
                "runs": runs,
            }
        )
        del model
    out = {
        "engine": "pytorch eager",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "models": results,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
