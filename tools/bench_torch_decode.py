#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["torch>=2.5"]
# ///
"""PyTorch's decode of a Llama-3.2-1B-shaped model (random weights, f16 on a GPU)
with a static KV cache and CUDA graphs: the anchor that `tools/device_gpu.sh`'s
decode step runs on the same card as `ktune bench` (issue 31, section 7).

The model is a small hand-written Llama decoder in the style of PyTorch's own
gpt-fast (the reference for `torch.compile(mode="reduce-overhead")` decoding):
fused QKV and gate+up matrices, RMSNorm in f32, rotate-half RoPE (theta 500000;
Llama 3's frequency rescaling changes only constants, not the work), a static
KV cache written in place at the step's position, SDPA over the whole cache
with a causal mask (grouped-query heads through `enable_gqa`), the LM head
tied to the embedding, and the greedy argmax on the device. It needs only
torch, so it does not depend on transformers' cache API, which changes from
release to release; `--check-hf` loads the same weights into transformers'
`LlamaForCausalLM` and compares the logits, to show it is the same model.

Modes (`--modes`, each measured in the same process, same weights; on CUDA the
default runs `graph` first, so a compile that runs past the step's limit loses
only its own figures: the JSON is rewritten after every mode):
  compile  torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True):
           Inductor's fused kernels replayed as CUDA graphs (gpt-fast's loop:
           the next token is the graph's output, cloned; the position a device
           tensor advanced outside the graph). Also runs on the CPU (no graphs).
  graph    the eager step captured by hand in one torch.cuda.CUDAGraph that also
           feeds its argmax back and advances the position, so a token is one
           graph launch with no host work (CUDA only).
  eager    plain eager PyTorch, one launch per op.
Per round: one prefill of --prefill-tokens tokens (eager, last position's
logits; it also fills the cache), then --decode-tokens decode steps; rounds'
medians. `decode_tok_s` launches tokens back to back with no host sync
(gpt-fast's loop); `decode_tok_s_sync` reads each token's id on the host before
the next step, as an interactive generator would.

    python3 tools/bench_torch_decode.py                         # Llama-3.2-1B shape, f16, CUDA
    python3 tools/bench_torch_decode.py --device cpu --layers 2 --hidden 256 --vocab 4096 --check-hf
Prints one JSON object (also written to --out).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, c, max_len, dtype, device):
        super().__init__()
        h, heads, kv, d, ffn = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"]
        self.heads, self.kv, self.d, self.ffn, self.eps = heads, kv, d, ffn, c["eps"]
        kw = dict(bias=False, dtype=dtype, device=device)
        self.wqkv = nn.Linear(h, (heads + 2 * kv) * d, **kw)
        self.wo = nn.Linear(heads * d, h, **kw)
        self.w13 = nn.Linear(h, 2 * ffn, **kw)
        self.w2 = nn.Linear(ffn, h, **kw)
        self.attn_norm = nn.Parameter(torch.ones(h, dtype=dtype, device=device))
        self.ffn_norm = nn.Parameter(torch.ones(h, dtype=dtype, device=device))
        self.register_buffer("k_cache", torch.zeros(1, kv, max_len, d, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(1, kv, max_len, d, dtype=dtype, device=device))

    def forward(self, x, cos, sin, pos, mask, gqa):
        t = x.shape[1]
        q, k, v = self.wqkv(rms_norm(x, self.attn_norm, self.eps)).split(
            [self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = rope(q.view(1, t, self.heads, self.d).transpose(1, 2), cos, sin)
        k = rope(k.view(1, t, self.kv, self.d).transpose(1, 2), cos, sin)
        v = v.view(1, t, self.kv, self.d).transpose(1, 2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        if gqa:
            o = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        else:
            rep = self.heads // self.kv
            o = F.scaled_dot_product_attention(q, self.k_cache.repeat_interleave(rep, 1),
                                               self.v_cache.repeat_interleave(rep, 1), attn_mask=mask)
        x = x + self.wo(o.transpose(1, 2).reshape(1, t, self.heads * self.d))
        g, u = self.w13(rms_norm(x, self.ffn_norm, self.eps)).split([self.ffn, self.ffn], dim=-1)
        return x + self.w2(F.silu(g) * u)


def rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class Llama(nn.Module):
    def __init__(self, c, max_len, dtype, device):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["hidden"], dtype=dtype, device=device)
        self.layers = nn.ModuleList(Layer(c, max_len, dtype, device) for _ in range(c["layers"]))
        self.norm = nn.Parameter(torch.ones(c["hidden"], dtype=dtype, device=device))
        d = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        f = torch.outer(torch.arange(max_len, dtype=torch.float32, device=device), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype))
        self.register_buffer("sin", emb.sin().to(dtype))
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device=device)))
        self.gqa = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

    def forward(self, tokens, pos):
        """tokens [1, T], pos [T] (positions): the last position's logits [1, vocab]."""
        x = self.embed(tokens)
        cos, sin = self.cos[pos], self.sin[pos]
        mask = self.causal[pos].view(1, 1, tokens.shape[1], -1)
        for layer in self.layers:
            x = layer(x, cos, sin, pos, mask, self.gqa)
        return F.linear(rms_norm(x[:, -1], self.norm, self.c["eps"]), self.embed.weight)


def decode_one_token(model, tok, pos):
    return torch.argmax(model(tok, pos), dim=-1, keepdim=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def check_hf(model, c, dtype, dev):
    """The same weights in transformers' LlamaForCausalLM: logits of a prompt and two steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["ffn"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                      num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"], rms_norm_eps=c["eps"],
                      rope_theta=c["rope_theta"], tie_word_embeddings=True, max_position_embeddings=4096)
    hf = LlamaForCausalLM(cfg).to(device=dev, dtype=dtype).eval()
    h, kv, d, ffn = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["head_dim"], c["ffn"]
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(model.embed.weight)
        hf.model.norm.weight.copy_(model.norm)
        for mine, theirs in zip(model.layers, hf.model.layers):
            w = mine.wqkv.weight
            theirs.self_attn.q_proj.weight.copy_(w[:h])
            theirs.self_attn.k_proj.weight.copy_(w[h:h + kv])
            theirs.self_attn.v_proj.weight.copy_(w[h + kv:])
            theirs.self_attn.o_proj.weight.copy_(mine.wo.weight)
            theirs.mlp.gate_proj.weight.copy_(mine.w13.weight[:ffn])
            theirs.mlp.up_proj.weight.copy_(mine.w13.weight[ffn:])
            theirs.mlp.down_proj.weight.copy_(mine.w2.weight)
            theirs.input_layernorm.weight.copy_(mine.attn_norm)
            theirs.post_attention_layernorm.weight.copy_(mine.ffn_norm)
        ids = torch.randint(0, c["vocab"], (1, 8), generator=torch.Generator().manual_seed(1)).to(dev)
        ref = hf(ids).logits[0].float()
        mine = [model(ids[:, :6], torch.arange(6, device=dev))]
        mine += [model(ids[:, i:i + 1], torch.tensor([i], device=dev)) for i in (6, 7)]
        got = torch.stack([mine[0][0], mine[1][0], mine[2][0]]).float()
        want = ref[[5, 6, 7]]
        err = ((got - want).norm() / want.norm()).item()
    return {"rel_l2_vs_transformers": err, "positions": [5, 6, 7], "argmax_equal": bool((got.argmax(-1) == want.argmax(-1)).all())}


def copy_gbps(dev, dtype):
    if dev.type != "cuda":
        return None
    a = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    best = math.inf
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3)
    return 2 * a.numel() / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["f16", "bf16", "f32"], help="default: f16 on CUDA, f32 on the CPU")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, help="default: 4 x hidden (8192)")
    ap.add_argument("--heads", type=int, help="default: hidden / 64 (32)")
    ap.add_argument("--kv-heads", type=int, help="default: heads / 4 (8)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--prefill-tokens", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=None, help="comma-separated, run in this order: graph, compile, eager (default: graph,compile on CUDA, compile,eager on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-hf", action="store_true", help="compare the logits with transformers' LlamaForCausalLM on the same weights")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()

    dev = torch.device(a.device)
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[a.dtype or ("f16" if dev.type == "cuda" else "f32")]
    heads = a.heads or max(1, a.hidden // 64)
    c = dict(layers=a.layers, hidden=a.hidden, ffn=a.ffn or 4 * a.hidden, heads=heads,
             kv_heads=a.kv_heads or max(1, heads // 4), head_dim=a.head_dim, vocab=a.vocab,
             rope_theta=a.rope_theta, eps=1e-5)
    modes = (a.modes or ("graph,compile" if dev.type == "cuda" else "compile,eager")).split(",")
    P, N = a.prefill_tokens, a.decode_tokens
    max_len = P + N + 8
    torch.manual_seed(a.seed)
    t0 = time.perf_counter()
    with torch.no_grad():
        model = Llama(c, max_len, dtype, dev).eval()
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02)
    matrices = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers") and "norm" not in n)
    bytes_per = torch.finfo(dtype).bits // 8
    res = {
        "engine": "pytorch", "torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""), "shape": c, "prefill_tokens": P, "decode_tokens": N, "rounds": a.rounds,
        "max_len": max_len, "sdpa_enable_gqa": model.gqa, "build_s": time.perf_counter() - t0,
        # what a decode token reads: every layer matrix and the tied LM head
        "decode_read_bytes": (matrices + c["vocab"] * c["hidden"]) * bytes_per,
        "modes": {},
    }
    if dev.type == "cpu":
        res["threads"] = torch.get_num_threads()
    gb = copy_gbps(dev, dtype)
    if gb:
        res["copy_gbps"] = gb
    if a.check_hf:
        try:
            res["check_hf"] = check_hf(model, c, dtype, dev)
        except Exception as e:  # noqa: BLE001 - report, keep measuring
            res["check_hf"] = {"error": f"{type(e).__name__}: {e}"}

    gen = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, c["vocab"], (1, P), generator=gen).to(dev)
    ppos = torch.arange(P, device=dev)

    def prefill():
        sync(dev)
        t = time.perf_counter()
        with torch.no_grad():
            first = decode_one_token(model, prompt, ppos)
        sync(dev)
        return first, time.perf_counter() - t

    for mode in modes:
        r = {}
        try:
            if mode == "graph" and dev.type != "cuda":
                raise RuntimeError("CUDA graphs need a CUDA device")
            t = time.perf_counter()
            if mode == "compile":
                from torch._dynamo.utils import counters
                skips0 = counters["inductor"]["cudagraph_skips"]
                step_fn = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
            elif mode == "eager":
                step_fn = decode_one_token

            if mode in ("compile", "eager"):
                def run_decode(first, host_sync):
                    cur, pos = first.clone(), torch.tensor([P], device=dev)
                    sync(dev)
                    t = time.perf_counter()
                    with torch.no_grad():
                        for _ in range(N):
                            nxt = step_fn(model, cur, pos)
                            cur = nxt.clone()
                            pos += 1
                            if host_sync:
                                cur.item()
                    sync(dev)
                    return time.perf_counter() - t
            else:
                static_tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
                static_pos = torch.tensor([P], device=dev)

                def step():
                    static_tok.copy_(decode_one_token(model, static_tok, static_pos))
                    static_pos.add_(1)

                s = torch.cuda.Stream(dev)
                s.wait_stream(torch.cuda.current_stream(dev))
                with torch.no_grad(), torch.cuda.stream(s):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream(dev).wait_stream(s)
                static_pos.fill_(P)
                graph = torch.cuda.CUDAGraph()
                with torch.no_grad(), torch.cuda.graph(graph):
                    step()

                def run_decode(first, host_sync):
                    static_tok.copy_(first)
                    static_pos.fill_(P)
                    sync(dev)
                    t = time.perf_counter()
                    for _ in range(N):
                        graph.replay()
                        if host_sync:
                            static_tok.item()
                    sync(dev)
                    return time.perf_counter() - t

            # warm-up: compilation, the graphs' recording (reduce-overhead records
            # after its warm-up calls), caches
            first, _ = prefill()
            run_decode(first, False)
            run_decode(first, True)
            r["warmup_s"] = time.perf_counter() - t
            pre, dec, dec_sync = [], [], []
            for _ in range(a.rounds):
                first, tp = prefill()
                pre.append(tp)
                dec.append(run_decode(first, False))
                first, tp = prefill()
                pre.append(tp)
                dec_sync.append(run_decode(first, True))
            r["prefill_tok_s"] = P / statistics.median(pre)
            r["prefill_mode"] = "eager"
            r["decode_tok_s"] = N / statistics.median(dec)
            r["decode_tok_s_sync"] = N / statistics.median(dec_sync)
            r["decode_ms_per_token"] = 1e3 * statistics.median(dec) / N
            r["decode_s"] = dec
            r["decode_sync_s"] = dec_sync
            if gb:
                r["decode_pct_of_copy_bound"] = 100 * r["decode_tok_s"] * res["decode_read_bytes"] / (gb * 1e9)
            if mode == "compile":
                r["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips0
                r["cuda_graphs"] = dev.type == "cuda" and r["cudagraph_skips"] == 0
        except Exception as e:  # noqa: BLE001 - one mode failing must not lose the others
            r["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        res["modes"][mode] = r
        finish(res, modes, a.out)  # after every mode: a run cut short keeps what it measured
        print(f"# {mode}: " + (r.get("error") or f"decode {r['decode_tok_s']:.1f} tok/s (sync {r['decode_tok_s_sync']:.1f}), prefill {r['prefill_tok_s']:.1f} tok/s, warm-up {r['warmup_s']:.1f} s"), file=sys.stderr, flush=True)
    ok = finish(res, modes, a.out)
    print(json.dumps(res, indent=1))
    sys.exit(0 if ok else 1)


def finish(res, modes, out):
    """The best mode's figures at the top level; the JSON to `out`. Returns the modes that measured."""
    ok = [m for m in modes if "decode_tok_s" in res["modes"].get(m, {})]
    if ok:
        best = max(ok, key=lambda m: res["modes"][m]["decode_tok_s"])
        res["best_mode"] = best
        res["decode_tok_s"] = res["modes"][best]["decode_tok_s"]
        res["prefill_tok_s"] = res["modes"][best]["prefill_tok_s"]
    if out:
        with open(out + ".tmp", "w") as f:
            f.write(json.dumps(res, indent=1) + "\n")
        os.replace(out + ".tmp", out)
    return ok


if __name__ == "__main__":
    main()
