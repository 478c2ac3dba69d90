#!/usr/bin/env python3
"""Decode throughput of block-quantized GGUF models on the CPU: ktune against
llama.cpp (llama-cpp-python) on the same files, in the same run, and against the
memory-bandwidth bound.

    target/venv-py/bin/pip install llama-cpp-python   # the tools venv (tools/requirements.txt) plus llama.cpp's bindings
    target/venv-py/bin/python tools/bench_llamacpp.py            # everything (quiet machine!)
    ... tools/bench_llamacpp.py --check-fixtures   # llama.cpp's greedy tokens on tests/fixtures/gguf/*
    ... tools/bench_llamacpp.py --shapes smollm2-135m --qtypes q8_0 --runs 1 --tune-budget 20s   # quick check

Steps, all results under --out (default target/bench-llamacpp/):

 1. Model files: a llama-architecture GGUF per shape and block type, random
    weights (normal, std 0.02), written with the `gguf` package's GGUFWriter as
    convert_hf_to_gguf.py writes Llama (Q/K rows permuted for RoPE, norms F32,
    matrices and the tied embedding in the block type, gguf.quants.quantize =
    ggml's reference rounding). The byte-level BPE tokenizer of the smollm2
    fixture is padded to the vocabulary so that llama.cpp loads the file; the
    benchmark feeds token ids. Reused when present.
 2. Read bandwidth: the membw probe of crates/ktune-bench/benches/kernels.rs (criterion median of a
    parallel SIMD dot over 512 MiB).
 3. `ktune tune --gguf FILE --device cpu` (--tune-budget; prefill/decode shaped
    like the benchmark's request), unless --tune-budget 0.
 4. Interleaved, --runs times: `ktune run --gguf FILE` with the runtime's
    default kernels, with the tuned profile, and llama.cpp (Llama(...,
    n_threads=THREADS), greedy generate from the same ids). llama.cpp's decode
    rate is taken from its own performance counters (t_eval_ms over n_eval: the
    single-token evaluations), ktune's from its JSON report (decode time over
    decoded tokens).

Bound = read bandwidth / weight bytes read per decoded token (ktune's report:
every matrix as stored plus the LM head; the same file for both engines).
Prints a table (`=llama`: how many leading generated ids agree with llama.cpp's;
random weights make near-ties, and llama.cpp's int8 activations break them its
own way) and writes summary.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

SHAPES = {
    # hidden, layers, intermediate, heads, kv heads, vocab, rope theta
    "smollm2-135m": dict(hidden=576, layers=30, inter=1536, heads=9, kv=3, vocab=49152, theta=10000.0),
    "llama-3.2-1b": dict(hidden=2048, layers=16, inter=8192, heads=32, kv=8, vocab=128256, theta=500000.0),
}


def permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_model(path, shape, qname):
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFWriter, TokenType
    from gguf.quants import quantize

    qtype = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1}[qname]
    s = SHAPES[shape]
    h, hd = s["hidden"], s["hidden"] // s["heads"]
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_name(f"{shape}-random-{qname}")
    w.add_block_count(s["layers"])
    w.add_context_length(2048)
    w.add_embedding_length(h)
    w.add_feed_forward_length(s["inter"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    w.add_rope_freq_base(s["theta"])
    w.add_rope_dimension_count(hd)
    w.add_key_length(hd)
    w.add_file_type(int(qtype))
    # The smollm2 fixture's byte-level BPE, padded to the vocabulary.
    t = json.loads((ROOT / "tests/fixtures/smollm2-tiny-bf16/tokenizer.json").read_text())
    vocab = t["model"]["vocab"]
    tokens = [None] * (max(vocab.values()) + 1)
    for tok, i in vocab.items():
        tokens[i] = tok
    tokens += [f"<pad_{i}>" for i in range(len(tokens), s["vocab"])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.NORMAL] * len(tokens))
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)

    def add_q(name, a):
        q = quantize(a, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    add_q("token_embd.weight", mat(s["vocab"], h))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    nq, nkv = s["heads"] * hd, s["kv"] * hd
    for layer in range(s["layers"]):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(h, np.float32))
        add_q(p + "attn_q.weight", permute(mat(nq, h), s["heads"]))
        add_q(p + "attn_k.weight", permute(mat(nkv, h), s["kv"]))
        add_q(p + "attn_v.weight", mat(nkv, h))
        add_q(p + "attn_output.weight", mat(h, nq))
        add_q(p + "ffn_gate.weight", mat(s["inter"], h))
        add_q(p + "ffn_up.weight", mat(s["inter"], h))
        add_q(p + "ffn_down.weight", mat(h, s["inter"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_bandwidth(target):
    env = dict(os.environ, KTUNE_BENCH_GPU="0")
    subprocess.run(["cargo", "bench", "--quiet", "--bench", "kernels", "--", "membw/dram"], cwd=ROOT, env=env, check=True,
                   stdout=sys.stderr)
    est = json.loads((target / "criterion/membw/dram_512MiB/new/estimates.json").read_text())
    return (512 << 20) / est["median"]["point_estimate"]  # bytes per ns = GB/s


def ktune_run(ktune, gguf, ids, new_tokens, profile=None):
    cmd = [str(ktune), "run", "--gguf", str(gguf), "--device", "cpu", "--tokens", ",".join(map(str, ids)),
           "--max-tokens", str(new_tokens), "--format", "json"]
    if profile:
        cmd += ["--profile", str(profile)]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r


def llama_run(gguf, ids, new_tokens, threads):
    import llama_cpp
    from llama_cpp import Llama

    m = Llama(model_path=str(gguf), n_ctx=len(ids) + new_tokens + 8, n_threads=threads, n_threads_batch=threads,
              verbose=False)
    llama_cpp.llama_perf_context_reset(m._ctx.ctx)
    out = []
    t0 = time.perf_counter()
    for tok in m.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(tok)
        if len(out) == new_tokens:
            break
    wall = time.perf_counter() - t0
    perf = llama_cpp.llama_perf_context(m._ctx.ctx)
    del m
    return {
        "generated": out,
        "decode_tokens_per_sec": perf.n_eval / (perf.t_eval_ms / 1e3),
        "n_eval": perf.n_eval,
        "prefill_tokens_per_sec": perf.n_p_eval / (perf.t_p_eval_ms / 1e3) if perf.t_p_eval_ms > 0 else None,
        "wall_s": wall,
    }


def check_fixtures(threads):
    """llama.cpp's greedy continuation of each test fixture against the ids the
    tests expect (transformers'); files llama.cpp cannot load (no tokenizer in
    the file) are reported as such. Returns the number of mismatches."""
    from llama_cpp import Llama

    bad = 0
    for f in sorted((ROOT / "tests/fixtures/gguf").glob("*.gguf")):
        want = json.loads(f.with_suffix(".json").read_text())
        try:
            m = Llama(model_path=str(f), n_ctx=64, n_threads=threads, verbose=False)
        except Exception as e:  # llama.cpp refuses files without a vocabulary
            print(f"{f.name}: llama.cpp cannot load it ({e})")
            continue
        got = []
        for tok in m.generate(want["tokens"], temp=0.0, top_k=1, reset=True):
            got.append(tok)
            if len(got) == len(want["generated"]):
                break
        ok = got == want["generated"]
        bad += not ok
        print(f"{f.name}: llama.cpp {'matches' if ok else 'DIFFERS'}: {got} (expected {want['generated']})")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-fixtures", action="store_true", help="only compare llama.cpp with the GGUF test fixtures")
    ap.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--qtypes", default="q8_0,q4_1")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tune-budget", default="3m", help="ktune tune budget per file; 0 skips the tuned profile")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.check_fixtures:
        sys.exit(1 if check_fixtures(a.threads) else 0)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    out = a.out or target / "bench-llamacpp"
    out.mkdir(parents=True, exist_ok=True)
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)

    print("== build (release)", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "ktune"], cwd=ROOT, check=True)
    ktune = target / "release/ktune"
    files = []
    for shape in a.shapes.split(","):
        for q in a.qtypes.split(","):
            f = out / f"{shape}-random-{q}.gguf"
            if not f.exists():
                print(f"== writing {f}", file=sys.stderr)
                write_model(f.with_suffix(".tmp"), shape, q)
                f.with_suffix(".tmp").rename(f)
            files.append((shape, q, f))

    print("== read bandwidth (membw/dram probe)", file=sys.stderr)
    bw = read_bandwidth(target)
    ids = list(range(300, 300 + a.prompt_tokens))

    profiles = {}
    if a.tune_budget != "0":
        for shape, q, f in files:
            prof = out / f"{f.stem}.profile.yaml"
            print(f"== ktune tune --gguf {f.name} --budget {a.tune_budget}", file=sys.stderr)
            subprocess.run([str(ktune), "tune", "--gguf", str(f), "--device", "cpu", "--budget", a.tune_budget,
                            "--prefill-tokens", str(a.prompt_tokens), "--decode-tokens", str(a.new_tokens),
                            "--context", str(max(256, a.prompt_tokens + a.new_tokens + 1)), "-o", str(prof), "--force"],
                           check=True, stdout=subprocess.DEVNULL)
            profiles[f] = prof

    rows = []
    for shape, q, f in files:
        engines = {"ktune default": [], "llama.cpp": []}
        if f in profiles:
            engines["ktune tuned"] = []
        gen = {}
        weight_bytes = None
        for i in range(a.runs):
            for eng in engines:
                print(f"== {f.name} {eng} ({i + 1}/{a.runs})", file=sys.stderr)
                if eng == "llama.cpp":
                    r = llama_run(f, ids, a.new_tokens, a.threads)
                else:
                    r = ktune_run(ktune, f, ids, a.new_tokens, profiles.get(f) if eng == "ktune tuned" else None)
                    weight_bytes = r["weight_bytes"]
                engines[eng].append(r["decode_tokens_per_sec"])
                gen[eng] = r["generated"]
        for eng, v in engines.items():
            rows.append({"shape": shape, "qtype": q, "engine": eng, "decode_tokens_per_sec": statistics.median(v),
                         "runs": v, "weight_bytes": weight_bytes, "generated": gen[eng]})
    for r in rows:
        ref = next(x["generated"] for x in rows if x["shape"] == r["shape"] and x["qtype"] == r["qtype"] and x["engine"] == "llama.cpp")
        r["same_ids_as_llama_cpp"] = sum(1 for _ in __import__("itertools").takewhile(lambda p: p[0] == p[1], zip(r["generated"], ref)))
    for r in rows:
        r["bound_tokens_per_sec"] = bw * 1e9 / r["weight_bytes"]
        r["percent_of_bound"] = 100 * r["decode_tokens_per_sec"] / r["bound_tokens_per_sec"]
    (out / "summary.json").write_text(json.dumps({"read_gbps": bw, "threads": a.threads, "prompt_tokens": a.prompt_tokens,
                                                  "new_tokens": a.new_tokens, "rows": rows}, indent=1) + "\n")
    print(f"read bandwidth (membw probe): {bw:.1f} GB/s; {a.threads} threads; prompt {a.prompt_tokens}, "
          f"{a.new_tokens} new tokens; decode tok/s, median of {a.runs} interleaved runs")
    print(f"{'model':<14} {'type':<5} {'engine':<14} {'tok/s':>8} {'MB/token':>9} {'bound':>8} {'% bound':>8} {'=llama':>6}  runs")
    for r in rows:
        print(f"{r['shape']:<14} {r['qtype']:<5} {r['engine']:<14} {r['decode_tokens_per_sec']:>8.2f} "
              f"{r['weight_bytes'] / 1e6:>9.1f} {r['bound_tokens_per_sec']:>8.2f} {r['percent_of_bound']:>7.1f}% {r['same_ids_as_llama_cpp']:>6}  "
              + " ".join(f"{x:.1f}" for x in r["runs"]))
    print(f"(files in {out})")


if __name__ == "__main__":
    main()
