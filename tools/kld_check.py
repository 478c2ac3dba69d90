#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["numpy>=1.26"]
# ///
"""Recomputes `ktune eval`'s divergence from two saved logits files, in numpy:
the reference's (`ktune eval --exact --save-logits REF`) and the model's
(`ktune eval ... --save-logits TEST`), both of the same text, --ctx and --chunks.

    tools/kld_check.py REF TEST [--json]

Prints KL(reference || model) per position (mean, median, 99th percentile, max,
numpy's linear-interpolation percentiles), top-1 agreement and the relative RMS
error of the row-centred log-probabilities, as `ktune eval --reference REF`
reports them for the model; with f32 files the figures agree to rounding of the
sums' order. The file format is described in src/eval/logits_file.rs (a 40-byte
header: magic KTLOGPRB, version 1, value type 0 f32 / 1 f16, vocab, ctx, first
scored position, chunks, positions; the token ids; the rows). numpy is the only
dependency (tools/requirements.txt pins it).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

MAGIC = b"KTLOGPRB"
HEADER = 40


class Fail(Exception):
    """A file that is not a usable logits file, or two that do not pair."""


def load(path):
    """(header dict, tokens, rows as a memory map [positions, vocab])."""
    raw = np.fromfile(path, dtype=np.uint8, count=HEADER)
    if raw.size < HEADER or raw[:8].tobytes() != MAGIC:
        raise Fail(f"{path}: not a ktune logits file (no KTLOGPRB header)")
    u32 = raw[8:32].view("<u4")
    version, dtype, vocab, ctx, first, chunks = (int(v) for v in u32)
    positions = int(raw[32:40].view("<u8")[0])
    if version != 1:
        raise Fail(f"{path}: format version {version}, this script reads 1")
    if dtype not in (0, 1):
        raise Fail(f"{path}: value type {dtype} is unknown (0 f32, 1 f16)")
    if positions != chunks * (ctx - 1 - first):
        raise Fail(f"{path}: header says {positions} positions, its chunks hold {chunks * (ctx - 1 - first)}")
    vt = np.dtype("<f4") if dtype == 0 else np.dtype("<f2")
    want = HEADER + 4 * chunks * ctx + positions * vocab * vt.itemsize
    size = Path(path).stat().st_size
    if size != want:
        raise Fail(f"{path}: {size} bytes, its header needs {want} (truncated?)")
    tokens = np.fromfile(path, dtype="<u4", count=chunks * ctx, offset=HEADER)
    rows = np.memmap(path, dtype=vt, mode="r", offset=HEADER + 4 * chunks * ctx, shape=(positions, vocab))
    head = {"dtype": "f32" if dtype == 0 else "f16", "vocab": vocab, "ctx": ctx, "first": first, "chunks": chunks, "positions": positions}
    return head, tokens, rows


def divergence(ref_rows, test_rows, block=256):
    """The statistics of `ktune eval` over paired rows, in float64."""
    kld, same, err_sq, ref_sq = [], 0, 0.0, 0.0
    for s in range(0, ref_rows.shape[0], block):
        r = np.asarray(ref_rows[s:s + block], dtype=np.float64)
        m = np.asarray(test_rows[s:s + block], dtype=np.float64)
        kld.append((np.exp(r) * (r - m)).sum(axis=1))
        same += int((r.argmax(axis=1) == m.argmax(axis=1)).sum())
        cr = r - r.mean(axis=1, keepdims=True)
        cm = m - m.mean(axis=1, keepdims=True)
        err_sq += float(((cm - cr) ** 2).sum())
        ref_sq += float((cr ** 2).sum())
    k = np.concatenate(kld)
    return {
        "kld_mean": float(k.mean()),
        "kld_median": float(np.percentile(k, 50)),
        "kld_p99": float(np.percentile(k, 99)),
        "kld_max": float(k.max()),
        "top1_agreement_pct": 100.0 * same / k.size,
        "rel_rms_logit_error": float(np.sqrt(err_sq / ref_sq)) if ref_sq > 0 else 0.0,
        "positions": int(k.size),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", help="the reference's logits file")
    ap.add_argument("model", help="the evaluated model's logits file")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    try:
        (hr, tr, rr), (hm, tm, rm) = load(args.reference), load(args.model)
        for key in ("vocab", "ctx", "first"):
            if hr[key] != hm[key]:
                raise Fail(f"the files differ in {key}: {hr[key]} vs {hm[key]}")
        n = min(hr["chunks"], hm["chunks"])
        if not np.array_equal(tr[: n * hr["ctx"]], tm[: n * hm["ctx"]]):
            raise Fail("the files were saved from different tokens (another text or tokenizer)")
        rows = n * (hr["ctx"] - 1 - hr["first"])
        d = divergence(rr[:rows], rm[:rows])
    except (Fail, OSError) as e:
        print(f"kld_check: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"reference {args.reference} ({hr['dtype']}), model {args.model} ({hm['dtype']}), {n} chunks of {hr['ctx']}")
        for k, v in d.items():
            print(f"  {k:<20} {v:.6g}" if isinstance(v, float) else f"  {k:<20} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
