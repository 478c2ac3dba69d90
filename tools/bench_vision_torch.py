#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.15.0",
#     "transformers==5.23.0",
#     "safetensors==0.8.0",
#     "numpy==2.4.6",
#     "pillow",
# ]
# ///
"""Times the Gemma 3 vision path per image, PyTorch eager against `ktune run --image`,
on the same machine with the same shapes: gemma3-4b's SigLIP So400m tower (896 px,
patch 14: 4096 patches, width 1152, 27 layers, 16 heads) and its projector (4x4
average pool to 256 tokens, (1 + w) RMSNorm, GEMM to width 2560).

A random Gemma3ForConditionalGeneration with that tower and projector (and a tiny
text model: its vocabulary and layers do not enter the timing) is saved to a
directory; PyTorch times `get_image_features` (f32, eager attention, --threads
threads, the median of --runs after a warm-up); ktune runs the directory with
`--image` and the prompt's image tokens (its CPU defaults, no profile), and
reports the tower's time it prints (the median of --runs runs; ktune's kernels
use every core: pin both to the same cores, e.g. `taskset -c 0,1`, to compare
with --threads 2).

    uv run tools/bench_vision_torch.py --ktune target/release/ktune
    python3 tools/bench_vision_torch.py --layers 4 --ktune target/release/ktune   # quicker

Prints one line per engine: seconds per image and the tower's GFLOP/s.

Measured (2-core EPYC with AVX-512, shared and loaded, `taskset -c 0,1`, --layers 1,
4096 patches, ~209 GFLOP): torch 2.15.0 eager 5.5-6.3 s (33-38 GFLOP/s); ktune
before attention_full_flash_cpu and the vision CPU preference lists 30-35 s (the
per-query attention_full_rows_cpu was the default: 27 s at 2.8 GFLOP/s), after
2.8-3.0 s (69-74 GFLOP/s).
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

IMAGE_TOKEN, BOI, EOI = 300, 301, 302


def config(layers, image_size):
    text = dict(
        vocab_size=512,
        hidden_size=2560,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        sliding_window=1024,
        layer_types=["full_attention"],
        max_position_embeddings=4096,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_channels=3,
        image_size=image_size,
        patch_size=14,
        layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
        vision_use_head=False,
    )
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=256,
        image_token_index=IMAGE_TOKEN,
        boi_token_index=BOI,
        eoi_token_index=EOI,
    )


def tower_flops(layers, image_size):
    n = (image_size // 14) ** 2
    h, i = 1152, 4304
    per_layer = 2 * n * h * (4 * h + 2 * i) + 4 * n * n * h
    return 2 * n * h * 3 * 14 * 14 + layers * per_layer + 2 * 256 * 2560 * h


def median_time(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=27, help="tower layers (27: the full So400m tower)")
    ap.add_argument("--image-size", type=int, default=896, help="a multiple of 14 whose patch grid pools to 16x16")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch threads")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ktune", default="target/release/ktune", help="the ktune binary ('' to skip it)")
    ap.add_argument("--keep", help="write the model directory here (kept) instead of a temporary one")
    a = ap.parse_args()
    side = a.image_size // 14
    if a.image_size % 14 or side % 16:
        sys.exit(f"--image-size {a.image_size}: the {side}x{side} patch grid must pool evenly to 16x16 tokens")
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = Gemma3ForConditionalGeneration._from_config(config(a.layers, a.image_size), attn_implementation="eager", dtype=torch.float32).eval()
    gflop = tower_flops(a.layers, a.image_size) / 1e9
    pixels = torch.randn(1, 3, a.image_size, a.image_size)
    with torch.no_grad():
        t = median_time(lambda: model.model.get_image_features(pixels), a.runs)
    print(f"torch {torch.__version__} eager, {torch.get_num_threads()} threads: {t:.3f} s per image ({gflop / t:.1f} GFLOP/s; {a.layers} layers, {side * side} patches)")
    if not a.ktune:
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        img = out / "image.png"
        rng = np.random.default_rng(0)
        Image.fromarray(rng.integers(0, 256, (a.image_size, a.image_size, 3), dtype=np.uint8), "RGB").save(img)
        tokens = [2, BOI] + [IMAGE_TOKEN] * 256 + [EOI, 10]
        cmd = [a.ktune, "run", "--device", "cpu", "--no-profile", "--model-dir", str(out), "--image", str(img),
               "--tokens", ",".join(map(str, tokens)), "--max-tokens", "1", "--format", "json"]
        times = []
        for _ in range(a.runs):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"ktune failed ({r.returncode}): {r.stderr.strip()}")
            m = re.search(r"vision tower in ([0-9.]+) s", r.stdout + r.stderr)
            if not m:
                sys.exit(f"no tower time in ktune's output: {r.stdout[:400]} {r.stderr[:400]}")
            times.append(float(m.group(1)))
        t = statistics.median(times)
        print(f"ktune (CPU defaults): {t:.3f} s per image ({gflop / t:.1f} GFLOP/s); runs {json.dumps(times)}")


if __name__ == "__main__":
    main()
