#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["gguf==0.19.0", "numpy==2.4.6"]
# ///
"""A Llama-3.2-1B-shaped GGUF file with random weights, for speed comparisons
with llama.cpp on a model whose matrices are large (decode reads ~1.3 GB a token
in Q8_0, so it is bound by memory bandwidth, not by per-kernel overheads as the
135M files are).

Shape of meta-llama/Llama-3.2-1B: 16 layers, hidden 2048, MLP 8192, 32 query
heads and 8 KV heads of 64, RoPE theta 500000, RMSNorm eps 1e-5, embeddings tied
to the LM head, a vocabulary of 128256. The tokenizer is SmolLM2's (copied from
a SmolLM2 GGUF file's `tokenizer.ggml.*` metadata, byte-level BPE) padded with
unused tokens to 128256 so that the embedding and LM head have the real size.
The weights are random normal (std 0.02, norms 1): the text is meaningless, the
work per token is the real model's. Written F16, then quantized with llama.cpp's
`llama-quantize` (same build as the benchmark's llama-bench) to each requested
type; the F16 file is removed afterwards unless --keep-f16.

    python3 -m venv target/venv-py && target/venv-py/bin/pip install gguf==0.19.0 numpy==2.4.6
    target/venv-py/bin/python tools/make_1b_gguf.py --tokenizer target/real/SmolLM2-135M-Instruct.Q4_1.gguf
    # -> target/real/llama-3.2-1b-shaped.{Q8_0,Q4_K_M}.gguf
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 16, 2048, 8192, 32, 8, 64, 128256


def field(reader, key):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="a SmolLM2 (byte-level BPE) GGUF file to take the tokenizer from")
    ap.add_argument("--out-dir", default=str(ROOT / "target/real"))
    ap.add_argument("--types", nargs="*", default=["Q8_0", "Q4_K_M"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-f16", action="store_true")
    ap.add_argument("--llama-quantize", default=str(Path(os.environ.get("LLAMACPP_BUILD", ROOT / "target/llama.cpp-build")) / "bin/llama-quantize"))
    ap.add_argument("--quantize-threads", type=int, help="llama-quantize's thread count (default: its own, every core)")
    # A smaller shape of the same architecture, for dry runs of the scripts that use
    # these files (tools/device_gpu.sh's decode step); the defaults are Llama 3.2 1B.
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--ffn", type=int, default=FFN)
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--kv-heads", type=int, default=KV_HEADS)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--stem", default="llama-3.2-1b-shaped", help="file names: STEM.TYPE.gguf")
    a = ap.parse_args()
    layers, hidden, ffn, heads, kv_heads, head_dim, vocab = a.layers, a.hidden, a.ffn, a.heads, a.kv_heads, a.hidden // a.heads, a.vocab
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f16 = out / f"{a.stem}.F16.gguf"
    todo = [t for t in a.types if not (out / f"{a.stem}.{t}.gguf").exists()]
    if not todo:
        print("all present")
        return
    if not f16.exists():
        src = gguf.GGUFReader(a.tokenizer)
        tokens = list(field(src, "tokenizer.ggml.tokens"))
        types = list(field(src, "tokenizer.ggml.token_type"))
        merges = list(field(src, "tokenizer.ggml.merges"))
        if field(src, "tokenizer.ggml.model") != "gpt2" or len(tokens) > vocab:
            sys.exit(f"{a.tokenizer}: expected a byte-level BPE (gpt2) tokenizer of at most {vocab} tokens")
        pad = vocab - len(tokens)
        tokens += [f"<unused_{i}>" for i in range(pad)]
        types += [int(gguf.TokenType.UNUSED)] * pad
        w = gguf.GGUFWriter(str(f16) + ".tmp", "llama")
        w.add_name("Llama-3.2-1B-shaped (random weights)")
        w.add_context_length(131072)
        w.add_embedding_length(hidden)
        w.add_block_count(layers)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(500000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(vocab)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(field(src, "tokenizer.ggml.pre") or "smollm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        for key, add in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id), ("tokenizer.ggml.eos_token_id", w.add_eos_token_id)):
            v = field(src, key)
            if v is not None:
                add(int(v))
        rng = np.random.default_rng(a.seed)

        def mat(rows, cols):
            return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

        ones = np.ones(hidden, dtype=np.float32)
        w.add_tensor("token_embd.weight", mat(vocab, hidden))
        w.add_tensor("output_norm.weight", ones)
        for i in range(layers):
            b = f"blk.{i}"
            w.add_tensor(f"{b}.attn_norm.weight", ones)
            w.add_tensor(f"{b}.attn_q.weight", mat(heads * head_dim, hidden))
            w.add_tensor(f"{b}.attn_k.weight", mat(kv_heads * head_dim, hidden))
            w.add_tensor(f"{b}.attn_v.weight", mat(kv_heads * head_dim, hidden))
            w.add_tensor(f"{b}.attn_output.weight", mat(hidden, heads * head_dim))
            w.add_tensor(f"{b}.ffn_norm.weight", ones)
            w.add_tensor(f"{b}.ffn_gate.weight", mat(ffn, hidden))
            w.add_tensor(f"{b}.ffn_up.weight", mat(ffn, hidden))
            w.add_tensor(f"{b}.ffn_down.weight", mat(hidden, ffn))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(str(f16) + ".tmp", f16)
        print(f"wrote {f16}")
    for t in todo:
        dst = out / f"{a.stem}.{t}.gguf"
        cmd = [a.llama_quantize, str(f16), str(dst) + ".tmp", t] + ([str(a.quantize_threads)] if a.quantize_threads else [])
        subprocess.run(cmd, check=True, capture_output=True)
        os.replace(str(dst) + ".tmp", dst)
        print(f"wrote {dst}")
    if not a.keep_f16:
        f16.unlink()


if __name__ == "__main__":
    main()
