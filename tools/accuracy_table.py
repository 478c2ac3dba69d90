#!/usr/bin/env python3
"""KL divergence of ktune's CPU runtime default and of llama.cpp's CPU backend,
each against the f32 reference of the same GGUF file, on the same text, context
and scored positions: a table per file.

The f32 reference of a quantized file is the same weights dequantized, with f32
math: `llama-quantize --allow-requantize FILE F32` writes them (checked here
against gguf-py's dequantization of one tensor of each block format, bit for
bit), and both engines run that file for their reference.

- llama.cpp: `llama-perplexity -c CTX --chunks N --kl-divergence-base` on the F32
  file saves the reference log-probabilities (and the text's tokens), then
  `--kl-divergence` on the quantized file prints its KL divergence (mean, median,
  99th percentile), top-1 agreement ("Same top p") and RMS Δp, parsed here.
- ktune: the same tokens (those the base file holds, chunk for chunk, BOS first
  where the vocabulary adds one, as llama-perplexity does), `ktune --device cpu
  run --no-profile --dump-logits` on the quantized file (the runtime default:
  int8 activations where it picks them) and on the F32 file (f32 activations and
  weights); the same statistics over the same positions (the second half of each
  chunk, as llama-perplexity scores them), in f64.
- Cross-check: ktune's F32 run against llama.cpp's saved reference (the KL
  divergence of the two references, llama-perplexity's formula on its uint16
  log-probabilities): the two engines' f32 paths agree when it is ~1e-5 or less.

    tools/accuracy_table.py REAL/SmolLM2-135M-Instruct.Q4_0.gguf ... \\
        --text REAL/eval.txt --ktune target/release/ktune --llamacpp-build DIR

The F32 files, the reference logits and each run's output go to --work
(default: `accuracy/` beside the first file); what is there is reused. Needs
tools/requirements.txt (numpy, gguf).
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np


class Fail(Exception):
    """A bad input or a failed tool run: the message names it and the fix."""


def run(cmd, log=None):
    """Runs `cmd`; its output goes to `log` (and is returned); a failure raises Fail."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    out = p.stdout + p.stderr
    if log is not None:
        Path(log).write_text(out)
    if p.returncode != 0:
        tail = "\n".join(out.splitlines()[-15:])
        raise Fail(f"{cmd[0]} exited with {p.returncode}:\n{tail}")
    return out


def f32_file(src, work, tools):
    """The F32 copy of `src` (llama-quantize's dequantization)."""
    out = work / (src.stem + ".f32.gguf")
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        run([tools / "llama-quantize", "--allow-requantize", src, tmp, "F32"], work / (src.stem + ".f32.log"))
        tmp.rename(out)
    return out


def check_dequant(src, f32):
    """Each block format of `src`: its first tensor dequantized by gguf-py and as
    the F32 file holds it. Returns {format: max |difference|}."""
    from gguf import GGUFReader
    from gguf.constants import GGMLQuantizationType as T
    from gguf.quants import dequantize

    q, r = GGUFReader(src), GGUFReader(f32)
    ref = {t.name: t for t in r.tensors}
    seen = {}
    for t in q.tensors:
        if t.tensor_type in (T.F32, T.F16, T.BF16) or t.tensor_type.name in seen:
            continue
        a = dequantize(t.data, t.tensor_type).reshape(-1)
        b = np.asarray(ref[t.name].data, dtype=np.float32).reshape(-1)
        seen[t.tensor_type.name] = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
    return seen


def vocab_bos(src):
    """(adds BOS, BOS id) from the file's tokenizer metadata."""
    from gguf import GGUFReader

    rd = GGUFReader(src)

    def field(name):
        f = rd.fields.get(name)
        return None if f is None else f.parts[f.data[0]][0]

    add = field("tokenizer.ggml.add_bos_token")
    bos = field("tokenizer.ggml.bos_token_id")
    return bool(add) if add is not None else False, None if bos is None else int(bos)


def read_base(path):
    """llama-perplexity's --kl-divergence-base file: (n_ctx, n_vocab, tokens
    [chunks][n_ctx], log-probabilities [chunks][n_ctx - 1 - n_ctx / 2][n_vocab])."""
    raw = Path(path).read_bytes()
    if raw[:8] != b"_logits_":
        raise Fail(f"{path} is not a llama-perplexity logits file (delete it to have it rewritten)")
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw[8:20], dtype=np.int32)
    o = 20
    tokens = np.frombuffer(raw[o : o + 4 * n_ctx * n_chunk], dtype=np.int32).reshape(n_chunk, n_ctx)
    o += 4 * n_ctx * n_chunk
    nv = 2 * ((n_vocab + 1) // 2) + 4
    npos = n_ctx - 1 - n_ctx // 2
    want = o + 2 * nv * npos * n_chunk
    if len(raw) != want:
        raise Fail(f"{path}: {len(raw)} bytes, expected {want} for {n_chunk} chunks of {n_ctx} (a truncated file: delete it)")
    rows = np.frombuffer(raw[o:], dtype=np.uint16).reshape(n_chunk, npos, nv)
    head = rows[:, :, :4].copy().view(np.float32)  # scale, min log-prob
    logp = head[:, :, :1] * rows[:, :, 4 : 4 + n_vocab].astype(np.float32) + head[:, :, 1:2]
    return int(n_ctx), int(n_vocab), tokens, logp


def llama_stats(out):
    """The statistics llama-perplexity --kl-divergence prints."""

    def num(pat):
        m = re.search(pat, out)
        if not m:
            raise Fail(f"llama-perplexity printed no `{pat}` line")
        return float(m.group(1))

    return {
        "kld_mean": num(r"Mean\s+KLD:\s+(-?[\d.]+)"),
        "kld_median": num(r"Median\s+KLD:\s+(-?[\d.]+)"),
        "kld_p99": num(r"99\.0%\s+KLD:\s+(-?[\d.]+)"),
        "top1": num(r"Same top p:\s+([\d.]+)") / 100,
        "rms_dp": num(r"RMS Δp\s*:\s+([\d.]+)") / 100,
    }


def ktune_logits(ktune, model, tokens, rows, out, profile=None):
    """The logits of `tokens` at positions `rows` (a slice) from `ktune run` on the
    CPU (the runtime default, or `profile`'s kernels), `[n][vocab]`, kept in `out`
    (.npy) for the next call."""
    if out.exists():
        return np.load(out)
    dump = out.with_suffix(".json")
    run(
        [ktune, "--device", "cpu", "run", *(["--profile", profile] if profile else ["--no-profile"]), "--gguf", model, "--max-tokens", "1", "--prefill-chunk", len(tokens),
         "--tokens", ",".join(map(str, tokens)), "--dump-logits", dump],
        out.with_suffix(".log"),
    )
    text = dump.read_bytes()
    dump.unlink()
    i = text.index(b'"logits":')
    j = text.index(b"]]", i)
    # One pass over the numbers' text (Gemma's 262144 logits a position make
    # gigabytes of it): brackets out, commas parsed by numpy's text reader.
    flat = np.fromstring(text[i + 10 : j].translate(None, b"[]"), dtype=np.float32, sep=",")
    logits = flat.reshape(len(tokens), -1)[rows]
    np.save(out.with_suffix(".tmp.npy"), logits)
    out.with_suffix(".tmp.npy").rename(out)
    return logits


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def stats(ref, new, nxt):
    """KL(ref || new) per position and the table's statistics (`ref`, `new`:
    log-probabilities `[n][vocab]`; `nxt`: the text's next token per position)."""
    p = np.exp(ref)
    kld = (p * (ref - new)).sum(axis=-1)
    rows = np.arange(len(nxt))
    dp = np.exp(new[rows, nxt]) - p[rows, nxt]
    return kld, {
        "kld_mean": float(kld.mean()),
        "kld_median": float(np.median(kld)),
        "kld_p99": float(np.percentile(kld, 99)),
        "top1": float((ref.argmax(-1) == new.argmax(-1)).mean()),
        "rms_dp": float(np.sqrt((dp**2).mean())),
    }


def llama_kld(base, new):
    """llama-perplexity's KL divergence of `new` (log-probabilities) against its
    saved reference `base`: terms with a reference log-probability under -16 left out."""
    keep = base > -16
    return (np.where(keep, np.exp(base) * (base - new), 0.0)).sum(axis=-1)


def measure(src, args, work):
    tools = Path(args.llamacpp_build) / "bin"
    name = src.stem
    f32 = f32_file(src, work, tools)
    dq = check_dequant(src, f32) if args.check_dequant else {}
    base = work / f"{name}.c{args.ctx}x{args.chunks}.kld"
    if not base.exists():
        run([tools / "llama-perplexity", "-m", f32, "-f", args.text, "-c", args.ctx, "--chunks", args.chunks,
             "--kl-divergence-base", base.with_suffix(".tmp")], base.with_suffix(".base.log"))
        base.with_suffix(".tmp").rename(base)
    out = run([tools / "llama-perplexity", "-m", src, "-f", args.text, "-c", args.ctx, "--chunks", args.chunks,
               "--kl-divergence-base", base, "--kl-divergence"], base.with_suffix(".llama.log"))
    llama = llama_stats(out)

    n_ctx, n_vocab, tokens, base_logp = read_base(base)
    add_bos, bos = vocab_bos(src)
    first = n_ctx // 2
    refs, news, nxts, cross = [], [], [], []
    for c, toks in enumerate(tokens):
        toks = [int(t) for t in toks]
        if add_bos and bos is not None:
            toks[0] = bos
        rows = slice(first, n_ctx - 1)
        lr = ktune_logits(args.ktune, f32, toks, rows, work / f"{name}.c{args.ctx}.{c}.f32.npy")
        lq = ktune_logits(args.ktune, src, toks, rows, work / f"{name}.c{args.ctx}.{c}.{args.label}.npy", args.profile)
        if lr.shape[1] != n_vocab:
            raise Fail(f"{src}: ktune's vocabulary is {lr.shape[1]}, llama.cpp's {n_vocab}")
        r, q = log_softmax(lr), log_softmax(lq)
        cross.append(llama_kld(base_logp[c], r))
        refs.append(r)
        news.append(q)
        nxts.append(np.array(toks[first + 1 : n_ctx]))
    _, kt = stats(np.concatenate(refs), np.concatenate(news), np.concatenate(nxts))
    return {"file": src.name, "llama": llama, "ktune": kt, "cross_kld": float(np.concatenate(cross).mean()), "dequant": dq}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="quantized GGUF files")
    ap.add_argument("--text", required=True, type=Path, help="text to score (at least 2 x ctx tokens)")
    ap.add_argument("--ktune", required=True, type=Path, help="the ktune binary")
    ap.add_argument("--llamacpp-build", required=True, type=Path, help="llama.cpp build directory (bin/llama-quantize, bin/llama-perplexity)")
    ap.add_argument("--work", type=Path, help="where the F32 files, reference logits and runs go (default: accuracy/ beside the first file)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--check-dequant", action="store_true", help="compare one tensor of each format with gguf-py's dequantization")
    ap.add_argument("--profile", type=Path, help="run the quantized files with this profile's kernels instead of the runtime default")
    ap.add_argument("--label", default="ktune", help="names the quantized runs' saved logits (a new binary: a new label)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    args = ap.parse_args()
    for f in [*args.files, args.text, args.ktune]:
        if not f.exists():
            raise Fail(f"{f}: no such file")
    for t in ("llama-quantize", "llama-perplexity"):
        if not (args.llamacpp_build / "bin" / t).exists():
            raise Fail(f"{args.llamacpp_build}/bin/{t} is missing: build it with tools/build_llamacpp.sh")
    work = args.work or args.files[0].parent / "accuracy"
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    hdr = f"{'file':<38} {'llama KLD':>10} {'p99':>8} {'top-1':>7} {'ktune KLD':>10} {'p99':>8} {'top-1':>7} {'ref×ref KLD':>11}"
    print(hdr)
    for f in args.files:
        r = measure(f, args, work)
        rows.append(r)
        la, kt = r["llama"], r["ktune"]
        print(
            f"{r['file']:<38} {la['kld_mean']:>10.6f} {la['kld_p99']:>8.4f} {la['top1']:>7.2%} "
            f"{kt['kld_mean']:>10.6f} {kt['kld_p99']:>8.4f} {kt['top1']:>7.2%} {r['cross_kld']:>11.2e}",
            flush=True,
        )
        if r["dequant"]:
            print("    dequantization (gguf-py vs F32 file, max |diff|): " + ", ".join(f"{k} {v:g}" for k, v in r["dequant"].items()))
    if args.json:
        args.json.write_text(json.dumps({"ctx": args.ctx, "chunks": args.chunks, "text": str(args.text), "files": rows}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
